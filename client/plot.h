/*
 * plot.h — loss against step as an SVG file (m6ctl plot), written
 * directly: no plotting library.
 */
#ifndef M6_CLIENT_PLOT_H
#define M6_CLIENT_PLOT_H

#include <stddef.h>

/* One run's curves: n rows of (step, train loss, val loss); a NaN loss is
 * no point (val is NaN on steps without an evaluation). */
typedef struct {
    const char *label;     /* legend text: "<id> <name>" */
    size_t n;
    const long *step;
    const double *train, *val;
    long delink_step;      /* first step of the real phase; < 0 none */
} plot_run;

/* Write the SVG of runs to path (through path.tmp-<pid>, renamed): axes
 * with ticks, a legend, per run one <path class="series train"> and, when
 * it has evaluations, one <path class="series val"> (data-run = index),
 * and a dashed <line class="delink" data-step="N"> at each delink step.
 * The plot area's mapping is in the <g id="plot"> element's data-x0,
 * data-x1, data-step-min, data-step-max (x = x0 + (step - min) / (max -
 * min) * (x1 - x0)). 0, or -1 with err (no point at all, a write error). */
int plot_svg_write(const char *path, const plot_run *runs, int nruns,
                   char *err, size_t errlen);

#endif /* M6_CLIENT_PLOT_H */
