/*
 * plot.c — loss curves as SVG (plot.h).
 */
#include "client/plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/durable.h"

enum { W_ = 800, H_ = 480, ML_ = 70, MR_ = 20, MT_ = 30, MB_ = 110 };

/* A colour per run (train solid, val dashed in the same colour). */
static const char *const colours_[] = {
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
    "#8c564b", "#e377c2",
};
#define N_COLOURS (sizeof colours_ / sizeof colours_[0])

/* A "nice" tick step for a span divided in about n parts (1, 2, 5 x 10^k). */
static double tick_step_(double span, int n)
{
    double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* Text with &, <, > escaped. */
static void xml_text_(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

int plot_svg_write(const char *path, const plot_run *runs, int nruns,
                   char *err, size_t errlen)
{
    long smin = 0, smax = 0;
    double lmin = INFINITY, lmax = -INFINITY;
    int any = 0;
    for (int r = 0; r < nruns; r++)
        for (size_t i = 0; i < runs[r].n; i++) {
            double v[2] = {runs[r].train[i], runs[r].val[i]};
            for (int k = 0; k < 2; k++) {
                if (!isfinite(v[k])) continue;
                if (!any || runs[r].step[i] < smin) smin = runs[r].step[i];
                if (!any || runs[r].step[i] > smax) smax = runs[r].step[i];
                any = 1;
                if (v[k] < lmin) lmin = v[k];
                if (v[k] > lmax) lmax = v[k];
            }
        }
    if (!any) {
        snprintf(err, errlen, "no losses to plot: the runs have no finished "
                 "step yet");
        return -1;
    }
    if (smax == smin) smax = smin + 1;
    if (lmax - lmin < 1e-6) { lmin -= 0.5; lmax += 0.5; }
    double ystep = tick_step_(lmax - lmin, 6);
    lmin = floor(lmin / ystep) * ystep;
    lmax = ceil(lmax / ystep) * ystep;
    const double x0 = ML_, x1 = W_ - MR_, y0 = H_ - MB_, y1 = MT_;
#define X_(s) (x0 + ((double)(s) - smin) / (double)(smax - smin) * (x1 - x0))
#define Y_(v) (y0 - ((v) - lmin) / (lmax - lmin) * (y0 - y1))
    char tmp[4200];
    FILE *f = create_temp_file_beside(path, 0644, tmp, sizeof tmp, err, errlen);
    if (!f)
        return -1;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W_, H_, W_, H_);
    fprintf(f, "<g id=\"plot\" data-x0=\"%.3f\" data-x1=\"%.3f\" "
               "data-step-min=\"%ld\" data-step-max=\"%ld\">\n",
            x0, x1, smin, smax);
    /* axes, grid and ticks */
    fprintf(f, "<g class=\"axes\" stroke=\"#444\" fill=\"none\">"
               "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
               "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n",
            x0, y0, x1, y0, x0, y0, x0, y1);
    double xstep = tick_step_((double)(smax - smin), 8);
    if (xstep < 1) xstep = 1;
    fprintf(f, "<g class=\"ticks\" fill=\"#444\">\n");
    for (double s = ceil(smin / xstep) * xstep; s <= smax + 1e-9; s += xstep)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                   "text-anchor=\"middle\">%.0f</text>\n",
                X_(s), y0, X_(s), y1, X_(s), y0 + 16, s);
    for (double v = lmin; v <= lmax + ystep * 1e-6; v += ystep)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                   "text-anchor=\"end\">%g</text>\n",
                x0, Y_(v), x1, Y_(v), x0 - 6, Y_(v) + 4, v);
    fprintf(f, "</g>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
               "step</text>\n<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 16 %.1f)\">loss (nats)</text>\n",
            (x0 + x1) / 2, y0 + 34, (y0 + y1) / 2, (y0 + y1) / 2);
    /* the series */
    for (int r = 0; r < nruns; r++) {
        const char *col = colours_[r % N_COLOURS];
        for (int k = 0; k < 2; k++) {
            const double *v = k ? runs[r].val : runs[r].train;
            int pts = 0;
            for (size_t i = 0; i < runs[r].n; i++)
                if (isfinite(v[i])) pts++;
            if (!pts) continue;
            fprintf(f, "<path class=\"series %s\" data-run=\"%d\" fill=\"none\" "
                       "stroke=\"%s\" stroke-width=\"%s\"%s d=\"",
                    k ? "val" : "train", r, col, k ? "2" : "1.2",
                    k ? " stroke-dasharray=\"6 3\"" : "");
            int first = 1;
            for (size_t i = 0; i < runs[r].n; i++) {
                if (!isfinite(v[i])) continue;
                fprintf(f, "%s%.2f %.2f", first ? "M" : " L", X_(runs[r].step[i]),
                        Y_(v[i]));
                first = 0;
            }
            fprintf(f, "\"/>\n");
        }
        if (runs[r].delink_step >= 0) {
            double x = X_(runs[r].delink_step);
            fprintf(f, "<line class=\"delink\" data-run=\"%d\" data-step=\"%ld\" "
                       "x1=\"%.3f\" y1=\"%.1f\" x2=\"%.3f\" y2=\"%.1f\" "
                       "stroke=\"%s\" stroke-dasharray=\"2 4\"/>\n"
                       "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">delink %ld</text>\n",
                    r, runs[r].delink_step, x, y0, x, y1, col, x + 3,
                    y1 + 12 + 14 * r, col, runs[r].delink_step);
        }
    }
    fprintf(f, "</g>\n<g class=\"legend\">\n");
    for (int r = 0; r < nruns; r++) {
        double ly = y0 + 50 + 16 * (r / 2), lx = x0 + (r % 2) * 360;
        const char *col = colours_[r % N_COLOURS];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"%s\"/><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                   "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" "
                   "stroke-dasharray=\"6 3\"/><text x=\"%.1f\" y=\"%.1f\">",
                lx, ly, lx + 20, ly, col, lx + 24, ly, lx + 44, ly, col,
                lx + 50, ly + 4);
        xml_text_(f, runs[r].label);
        fprintf(f, " (train, val)</text>\n");
    }
    fprintf(f, "</g>\n</svg>\n");
#undef X_
#undef Y_
    int bad = ferror(f);
    if (fclose(f) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
