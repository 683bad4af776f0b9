/*
 * m6ctl_export.c — `m6ctl export`, `import` and `plot`: a run's checkpoint
 * to another format and back (client/export.c), and its metrics as a plot
 * (client/plot.c).
 */
#include "client/m6ctl_internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/paths.h"
#include "client/eta.h"
#include "client/export.h"
#include "client/plot.h"
#include "offload/offload.h"
#include "offload/plan_p2r.h"
#include "proto/views.h"
#include "spec/spec.h"

/* ------------------------------------------------------- export, import, plot */

/* The weights of RUN's checkpoint (--step, else the newest), read from
 * the directory m6d names (CheckpointsQuery), with the model of its spec;
 * or of a directory (an argument with a '/': m6ctl import's or export
 * --format safetensors' output). *what: "run 3 step 40" for messages. */
static int export_source_(const char *arg, m6_weights *w, char *what, size_t wlen)
{
    char e[4096 + 512];
    if (strchr(arg, '/')) {
        if (g.export_step >= 0) {
            m6ctl_errf_("export: --step names a checkpoint of a RUN, not of a directory");
            return EXIT_USAGE;
        }
        if (weights_load(w, arg, NULL, e, sizeof e) != 0) {
            m6ctl_errf_("%s", e);
            return EXIT_ERR;
        }
        snprintf(what, wlen, "%s", arg);
        return EXIT_OK;
    }
    M6__RunRef ref;
    if (m6ctl_parse_run_(arg, &ref) < 0) return EXIT_USAGE;
    M6__CheckpointsQuery q = M6__CHECKPOINTS_QUERY__INIT;
    q.run = &ref;
    M6__Response *resp = m6ctl_ask_(M6__REQUEST__BODY_CHECKPOINTS, &q.base);
    if (!resp) return EXIT_ERR;
    const M6__CheckpointList *cl = resp->checkpoints;
    int rc = EXIT_ERR;
    run_spec spec;
    if (!cl) {
        m6ctl_errf_("m6d sent no checkpoint list");
        goto out;
    }
    if (spec_parse(&spec, cl->spec_json, strlen(cl->spec_json), e, sizeof e) != 0) {
        m6ctl_errf_("run %lld's spec does not parse here: %s", (long long)cl->run_id, e);
        goto out;
    }
    const M6__CheckpointEntry *ce = NULL;
    for (size_t i = 0; i < cl->n_checkpoints; i++)
        if (g.export_step < 0 ? (!ce || cl->checkpoints[i]->step > ce->step)
                              : cl->checkpoints[i]->step == g.export_step)
            ce = cl->checkpoints[i];
    if (!ce && cl->n_checkpoints == 0) {
        m6ctl_errf_("run %lld (%s) has no checkpoint yet", (long long)cl->run_id, cl->name);
        goto out;
    }
    if (!ce) {
        char have[512] = "";
        size_t o = 0;
        for (size_t i = 0; i < cl->n_checkpoints && o < sizeof have - 24; i++)
            o += (size_t)snprintf(have + o, sizeof have - o, "%s%lld", i ? ", " : "",
                                  (long long)cl->checkpoints[i]->step);
        m6ctl_errf_("run %lld (%s) has no checkpoint of step %ld (it has: %s)",
              (long long)cl->run_id, cl->name, g.export_step, have);
        goto out;
    }
    if (weights_load(w, ce->path, &spec.model, e, sizeof e) != 0) {
        m6ctl_errf_("run %lld step %lld: %s", (long long)cl->run_id, (long long)ce->step, e);
        goto out;
    }
    snprintf(what, wlen, "run %lld step %lld", (long long)cl->run_id,
             (long long)ce->step);
    rc = EXIT_OK;
out:
    m6__response__free_unpacked(resp, NULL);
    return rc;
}

int cmd_export_(int argc, char **argv)
{
    (void)argc;
    if (!g.out_dir[0]) {
        m6ctl_errf_("export: --out is required");
        return EXIT_USAGE;
    }
    int fmt = strcmp(g.format, "hf-gpt2") == 0 ? 0
            : strcmp(g.format, "safetensors") == 0 ? 1
            : strcmp(g.format, "llmc") == 0 ? 2 : -1;
    if (fmt < 0) {
        m6ctl_errf_("--format: want hf-gpt2, safetensors or llmc, got \"%s\"", g.format);
        return EXIT_USAGE;
    }
    m6_weights w;
    char what[4200], e[8192];
    int rc = export_source_(argv[0], &w, what, sizeof what);
    if (rc != EXIT_OK) return rc;
    int wr = fmt == 0 ? weights_write_hf_gpt2(&w, g.out_dir, g.force, e, sizeof e)
           : fmt == 1 ? weights_write_m6(&w, g.out_dir, g.force, e, sizeof e)
           : weights_write_llmc(&w, g.out_dir, g.force, e, sizeof e);
    if (wr != 0)
        m6ctl_errf_("export of %s: %s", what, e);
    else
        printf("exported %s (%s phase, %d slot%s, %d layers) as %s to %s\n", what,
               w.phase[0] ? w.phase : "?", w.S, w.S == 1 ? "" : "s", w.cfg.n_layer,
               g.format, g.out_dir);
    weights_free(&w);
    return wr == 0 ? EXIT_OK : EXIT_ERR;
}

int cmd_import_(int argc, char **argv)
{
    (void)argc;
    if (strcmp(argv[0], "llmc") != 0) {
        m6ctl_errf_("import: want the format llmc, got \"%s\"", argv[0]);
        return EXIT_USAGE;
    }
    if (!g.out_dir[0]) {
        m6ctl_errf_("import: --out is required");
        return EXIT_USAGE;
    }
    m6_weights w;
    char e[8192];
    if (weights_read_llmc(&w, argv[1], e, sizeof e) != 0) {
        m6ctl_errf_("import: %s", e);
        return EXIT_ERR;
    }
    int rc = weights_write_m6(&w, g.out_dir, g.force, e, sizeof e);
    if (rc != 0)
        m6ctl_errf_("import: %s", e);
    else
        printf("imported %s (V %d, T %d, L %d, NH %d, C %d) to %s\n", argv[1],
               w.cfg.vocab_size, w.cfg.seq_len, w.cfg.n_layer, w.cfg.n_head,
               w.cfg.n_embd, g.out_dir);
    weights_free(&w);
    return rc == 0 ? EXIT_OK : EXIT_ERR;
}

/* One run's curve for plot: every metrics row (paged), and its delink. */
typedef struct {
    char label[300];
    long *step;
    double *train, *val;
    size_t n, cap;
} plot_data_;

static int plot_fetch_(const char *arg, plot_data_ *d, long *delink)
{
    M6__Response *resp = m6ctl_run_request_(M6__REQUEST__BODY_STATUS, arg);
    if (!resp) return EXIT_ERR;
    if (!resp->run) {
        m6__response__free_unpacked(resp, NULL);
        m6ctl_errf_("m6d sent no run");
        return EXIT_ERR;
    }
    snprintf(d->label, sizeof d->label, "%lld %s", (long long)resp->run->id,
             resp->run->name);
    *delink = resp->run->delink_step;
    M6__RunRef ref;
    m6__run_ref__init(&ref);
    ref.run_id = resp->run->id;
    m6__response__free_unpacked(resp, NULL);
    int64_t after = 0;
    for (;;) {
        M6__Response *mr = m6ctl_metrics_page_(&ref, after, 0);
        if (!mr) return EXIT_ERR;
        const M6__MetricRows *m = mr->metrics;
        size_t n = m ? m->n_rows : 0;
        if (d->n + n > d->cap) {
            size_t cap = (d->n + n) * 2;
            long *s = realloc(d->step, cap * sizeof *s);
            if (s) d->step = s;
            double *t = realloc(d->train, cap * sizeof *t);
            if (t) d->train = t;
            double *v = realloc(d->val, cap * sizeof *v);
            if (v) d->val = v;
            if (!s || !t || !v) {
                m6__response__free_unpacked(mr, NULL);
                m6ctl_errf_("out of memory");
                return EXIT_ERR;
            }
            d->cap = cap;
        }
        for (size_t i = 0; i < n; i++, d->n++) {
            d->step[d->n] = (long)m->rows[i]->step;
            d->train[d->n] = m->rows[i]->train_loss;
            d->val[d->n] = m->rows[i]->val_loss;
        }
        if (n) after = m->rows[n - 1]->step;
        int more = n && m->more;
        m6__response__free_unpacked(mr, NULL);
        if (!more) break;
    }
    return EXIT_OK;
}

int cmd_plot_(int argc, char **argv)
{
    size_t ol = strlen(g.out_dir);
    if (!ol) {
        m6ctl_errf_("plot: --out FILE.svg is required");
        return EXIT_USAGE;
    }
    if (ol < 4 || strcmp(g.out_dir + ol - 4, ".svg") != 0) {
        m6ctl_errf_("plot: --out must name an .svg file (only SVG is written; "
              "rsvg-convert or a browser turns it into PNG), got \"%s\"", g.out_dir);
        return EXIT_USAGE;
    }
    for (int i = 0; i < argc; i++) {
        M6__RunRef ref;
        if (m6ctl_parse_run_(argv[i], &ref) < 0) return EXIT_USAGE;
    }
    if (argc < 1) return EXIT_USAGE;  /* the table asks for one RUN */
    plot_data_ *d = calloc((size_t)argc, sizeof *d);
    plot_run *pr = calloc((size_t)argc, sizeof *pr);
    int rc = d && pr ? EXIT_OK : EXIT_ERR;
    for (int i = 0; i < argc && rc == EXIT_OK; i++) {
        rc = plot_fetch_(argv[i], &d[i], &pr[i].delink_step);
        pr[i] = (plot_run){d[i].label, d[i].n, d[i].step, d[i].train, d[i].val,
                           pr[i].delink_step};
    }
    char e[4400];
    if (rc == EXIT_OK && plot_svg_write(g.out_dir, pr, argc, e, sizeof e) != 0) {
        m6ctl_errf_("plot: %s", e);
        rc = EXIT_ERR;
    }
    if (rc == EXIT_OK) printf("wrote %s\n", g.out_dir);
    for (int i = 0; d && i < argc; i++) {
        free(d[i].step);
        free(d[i].train);
        free(d[i].val);
    }
    free(d);
    free(pr);
    return rc;
}
