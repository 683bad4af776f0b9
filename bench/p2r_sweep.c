/*
 * p2r_sweep.c — when does Pseudo-to-Real pay? (issue 21) Trains scratch and
 * Pseudo-to-Real over a grid of settings, with the same tokens and seeds,
 * on several corpora, and compares each Pseudo-to-Real run with the
 * scratch run of its corpus and seed:
 *
 *   final_val_ratio  its final validation loss / scratch's (below 1: better)
 *   steps_to_target  the first evaluation step at which its validation loss
 *                    is at most scratch's final one (-1: never)
 *   step_ratio       that step / the step at which scratch first reaches
 *                    its own final loss
 *   wall_ratio       its training wall-clock (evaluation excluded) /
 *                    scratch's
 *
 * The grid (every axis a comma list; defaults: issue 21's grid):
 *   --share-groups 1,2,half   S; "half" is L/2
 *   --pseudo-frac 0.05,0.1,0.2,0.3
 *   --delink-optimizer copy,reset
 *   --rewarm 0,0.05           re-warmup after the delink, share of the steps
 *   --seeds 1,2
 *   --grad-scale sum          pseudo.grad_scale: sum, mean or sum,mean
 *   --pseudo-lr-scale 1       pseudo.lr_scale
 *   --corpora fortunes,foldoc (Debian's fortunes; dict-foldoc's FOLDOC)
 * One process per run (--jobs at a time, one thread each). Every finished
 * run leaves its curve in OUT/curves/ (written through a temporary file and
 * renamed), so a sweep that was interrupted resumes where it stopped: run
 * the same command again; another grid on the same OUT (same shape) trains
 * only its new settings (scratch is shared). OUT/results[-TAG].csv (one row
 * per Pseudo-to-Real run; --tag TAG), OUT/sweep[-TAG]-CORPUS.svg (scratch,
 * the best and the worst setting's curves) are written at the end. The last line is key=value pairs naming the best
 * setting (the lowest final_val_ratio averaged over seeds and corpora).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_util.h"
#include "p2r_run.h"
#include "client/corpus/corpus.h"
#include "client/plot.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

#define P_ "p2r_sweep" /* program name in messages */
#define MAXV 16        /* values per axis */

/* One run of the sweep: scratch when S == 0. */
typedef struct {
    int corpus, seed, S;
    double frac, rewarm;
    int reset;  /* delink.optimizer reset */
    int mean;   /* pseudo.grad_scale mean */
    double lr_scale;  /* pseudo.lr_scale */
} task;

/* A finished run's validation curve (OUT/curves/NAME.csv). */
typedef struct {
    int n;
    long step[4096];
    double val[4096], wall[4096];
    double total_wall;
    long delink_step;
} curve;

typedef struct {
    const char *name, *path;  /* the corpus and what data_prepare reads */
} corpus_src;

static const corpus_src known_corpora_[] = {
    {"fortunes", "/usr/share/games/fortunes"},
    {"foldoc", "/usr/share/dictd/foldoc.dict.dz"},
};

static void die_(const char *msg)
{
    fprintf(stderr, P_ ": %s\n", msg);
    exit(1);
}

/* Parse a comma list of numbers into v (at most MAXV); "half" is half. */
static int list_arg_(const char *name, const char *arg, double *v, double lo,
                     double hi, double half)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == MAXV) {
            fprintf(stderr, P_ ": --%s: at most %d values\n", name, MAXV);
            exit(2);
        }
        if (half > 0 && strcmp(tok, "half") == 0) {
            v[n++] = half;
            continue;
        }
        v[n++] = bench_real_arg(P_, name, tok, lo, hi);
    }
    if (n == 0) {
        fprintf(stderr, P_ ": --%s: want a comma list, got \"%s\"\n", name, arg);
        exit(2);
    }
    return n;
}

/* The setting of a Pseudo-to-Real task, without corpus and seed; the
 * pseudo-phase options only where they are not the defaults (so the names
 * of the runs of a sweep without them stay valid). */
static void setting_name_(const task *k, char *out, size_t len)
{
    char lr[32] = "";
    if (k->lr_scale != 1)
        snprintf(lr, sizeof lr, "-lr%g", k->lr_scale);
    snprintf(out, len, "S%d-f%g-%s-r%g%s%s", k->S, k->frac,
             k->reset ? "reset" : "copy", k->rewarm, k->mean ? "-mean" : "", lr);
}

/* A comma list of the names a and b (at most both) into v: 0 for a, 1 for
 * b; the count. Anything else exits 2 naming --name. */
static int pair_arg_(const char *name, const char *arg, const char *a,
                     const char *b, int v[2])
{
    int n = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", arg);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if ((strcmp(tok, a) && strcmp(tok, b)) || n == 2) {
            n = 0;
            break;
        }
        v[n++] = strcmp(tok, b) == 0;
    }
    if (n == 0) {
        fprintf(stderr, P_ ": --%s: want %s, %s or %s,%s; got \"%s\"\n", name,
                a, b, a, b, arg);
        exit(2);
    }
    return n;
}

static void task_name_(const task *k, const char *const *corpora, char *out,
                       size_t len)
{
    if (k->S == 0)
        snprintf(out, len, "%s-seed%d-scratch", corpora[k->corpus], k->seed);
    else
    {
        int n = snprintf(out, len, "%s-seed%d-", corpora[k->corpus], k->seed);
        setting_name_(k, out + n, len - (size_t)n);
    }
}


static void on_eval_(void *ctx, long step, double val, double wall_s)
{
    fprintf(ctx, "%ld,%.6f,%.3f\n", step, val, wall_s);
}

/* OUT/curves/NAME.csv: where task k's curve is. */
static void curve_path_(char *path, size_t len, const char *out, const task *k,
                        const char *const *corpora)
{
    char name[256];
    task_name_(k, corpora, name, sizeof name);
    snprintf(path, len, "%s/curves/%s.csv", out, name);
}

/* Child: train task k from spec base and write its curve to path. */
static int run_task_(const run_spec *base, const task *k, const char *data,
                     const char *path)
{
    run_spec s = *base;
    snprintf(s.data.train, sizeof s.data.train, "%s/train_*.bin", data);
    snprintf(s.data.val, sizeof s.data.val, "%s/val_*.bin", data);
    s.train.seed = (uint64_t)k->seed;
    s.device.threads = 1;
    if (k->S == 0) {
        s.pseudo.steps = 0;
        s.pseudo.share_groups = s.model.n_layer;
    } else {
        s.pseudo.share_groups = k->S;
        s.pseudo.steps = (long)(k->frac * (double)s.train.steps + 0.5);
        if (s.pseudo.steps < 1)
            s.pseudo.steps = 1;
        s.delink.optimizer = k->reset ? DELINK_OPT_RESET : DELINK_OPT_COPY;
        s.delink.rewarm_steps = (long)(k->rewarm * (double)s.train.steps + 0.5);
        s.pseudo.grad_scale = k->mean ? GRAD_SCALE_MEAN : GRAD_SCALE_SUM;
        s.pseudo.lr_scale = (float)k->lr_scale;
    }
    char tmp[2600];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, P_ ": %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "step,val,wall_s\n");
    double total;
    long delink_step;
    if (p2r_train(P_, &s, on_eval_, f, &total, &delink_step) != 0) {
        fclose(f);
        unlink(tmp);
        return -1;
    }
    fprintf(f, "# total_wall_s=%.3f delink_step=%ld\n", total, delink_step);
    if (fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, path)) {
        fprintf(stderr, P_ ": %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Read a curve file; 0, or -1 when it is absent or not a whole curve. */
static int read_curve_(const char *path, curve *c)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    c->n = 0;
    c->total_wall = NAN;
    c->delink_step = -1;
    int ok = fgets(line, sizeof line, f) && strncmp(line, "step,", 5) == 0;
    while (ok && fgets(line, sizeof line, f)) {
        if (line[0] == '#') {
            ok = sscanf(line, "# total_wall_s=%lf delink_step=%ld",
                        &c->total_wall, &c->delink_step) == 2;
            break;
        }
        if (c->n == 4096 || sscanf(line, "%ld,%lf,%lf", &c->step[c->n],
                                   &c->val[c->n], &c->wall[c->n]) != 3)
            ok = 0;
        else
            c->n++;
    }
    fclose(f);
    return ok && c->n > 0 && !isnan(c->total_wall) ? 0 : -1;
}

/* The first evaluation with val <= target; -1 if never. */
static long reach_(const curve *c, double target)
{
    for (int i = 0; i < c->n; i++)
        if (c->val[i] <= target + 1e-9)
            return c->step[i];
    return -1;
}

static void usage_(void)
{
    printf(
        "usage: p2r_sweep [options]\n"
        "  --out DIR           results, curves, plots, prepared data\n"
        "                      (default /tmp/m6-p2r-sweep); resumable\n"
        "  --corpora LIST      fortunes,foldoc (default both)\n"
        "  --jobs N            runs at a time, one thread each (default: cores)\n"
        "  shape: --layers L (6) --embd C (64) --heads NH (4) --seq T (64)\n"
        "         --batch B (8) --steps N (800) --lr LR (3e-3) --warmup N (24)\n"
        "         --eval-every N (25) --eval-batches N (8)\n"
        "  grid:  --share-groups 1,2,half  --pseudo-frac 0.05,0.1,0.2,0.3\n"
        "         --delink-optimizer copy,reset  --rewarm 0,0.05 (of the steps)\n"
        "         --seeds 1,2  --grad-scale sum[,mean]  --pseudo-lr-scale 1\n"
        "  --tag TAG           results-TAG.csv, sweep-TAG-CORPUS.svg\n");
}

int main(int argc, char **argv)
{
    run_spec s = p2r_default_spec((p2r_defaults){
        .n_embd = 64, .seq_len = 64, .batch = 8, .steps = 800,
        .warmup = 24, .eval_every = 25, .eval_batches = 8});
    const char *out = "/tmp/m6-p2r-sweep", *corpora_arg = "fortunes,foldoc";
    const char *sg_arg = "1,2,half", *frac_arg = "0.05,0.1,0.2,0.3";
    const char *opt_arg = "copy,reset", *rewarm_arg = "0,0.05", *seeds_arg = "1,2";
    const char *gs_arg = "sum", *lrs_arg = "1", *tag = NULL;
    long jobs = sysconf(_SC_NPROCESSORS_ONLN);
    static const struct option opts[] = {
        P2R_TRAIN_OPTIONS, {"out", 1, 0, 'o'}, {"corpora", 1, 0, 'c'},
        {"jobs", 1, 0, 'j'}, {"share-groups", 1, 0, 'S'},
        {"pseudo-frac", 1, 0, 'f'}, {"delink-optimizer", 1, 0, 'O'},
        {"rewarm", 1, 0, 'r'}, {"seeds", 1, 0, 's'}, {"grad-scale", 1, 0, 'g'},
        {"pseudo-lr-scale", 1, 0, 'R'}, {"tag", 1, 0, 'x'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = p2r_next_option(P_, argc, argv, opts, &s)) != -1) {
        switch (o) {
        case 'o': out = optarg; break;
        case 'c': corpora_arg = optarg; break;
        case 'j': jobs = bench_int_arg(P_, "jobs", optarg, 1); break;
        case 'S': sg_arg = optarg; break;
        case 'f': frac_arg = optarg; break;
        case 'O': opt_arg = optarg; break;
        case 'r': rewarm_arg = optarg; break;
        case 's': seeds_arg = optarg; break;
        case 'g': gs_arg = optarg; break;
        case 'R': lrs_arg = optarg; break;
        case 'x':
            tag = optarg;
            if (!*tag || strlen(tag) > 64 || strspn(tag, "abcdefghijklmnopqrstuvwxyz"
                                                       "0123456789_.") != strlen(tag)) {
                fprintf(stderr, P_ ": --tag: want 1-64 of a-z, 0-9, _ and ., got "
                                "\"%s\"\n", tag);
                return 2;
            }
            break;
        default: bench_usage_exit(o, usage_);
        }
    }
    bench_no_operands(P_, argc, argv);
    if (bench_shape_check(P_, &s.model, 1) < 0)
        return 2;
    if (s.train.steps / s.train.eval_every > 4000) {
        fprintf(stderr, P_ ": --steps / --eval-every: at most 4000 evaluations\n");
        return 2;
    }
    const int L = s.model.n_layer;
    double sg[MAXV], frac[MAXV], rewarm[MAXV], seeds[MAXV];
    int nsg = list_arg_("share-groups", sg_arg, sg, 1, L, L / 2 >= 1 ? L / 2 : 1);
    int nfrac = list_arg_("pseudo-frac", frac_arg, frac, 0, 1, 0);
    int nrw = list_arg_("rewarm", rewarm_arg, rewarm, 0, 1, 0);
    int nseed = list_arg_("seeds", seeds_arg, seeds, 0, 1e9, 0);
    double lrs[MAXV];
    int nlrs = list_arg_("pseudo-lr-scale", lrs_arg, lrs, 1e-3, 1e3, 0);
    int gs_mean[2], ngs = pair_arg_("grad-scale", gs_arg, "sum", "mean", gs_mean);
    for (int i = 0; i < nsg; i++)
        if (sg[i] != floor(sg[i]) || sg[i] < 1 || sg[i] >= L) {
            fprintf(stderr, P_ ": --share-groups: want whole numbers in [1, %d) "
                            "(below --layers), got %g\n", L, sg[i]);
            return 2;
        }
    for (int i = 0; i < nfrac; i++)
        if (frac[i] <= 0 || frac[i] >= 1) {
            fprintf(stderr, P_ ": --pseudo-frac: want fractions strictly between "
                            "0 and 1, got %g\n", frac[i]);
            return 2;
        }
    int opts_reset[2], nopt = pair_arg_("delink-optimizer", opt_arg, "copy",
                                        "reset", opts_reset);
    const char *corpora[4];
    const char *corpus_path[4];
    int ncorp = 0;
    {
        static char buf[256];
        snprintf(buf, sizeof buf, "%s", corpora_arg);
        for (char *save, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            int found = -1;
            for (size_t i = 0; i < sizeof known_corpora_ / sizeof *known_corpora_; i++)
                if (strcmp(tok, known_corpora_[i].name) == 0)
                    found = (int)i;
            if (found < 0 || ncorp == 4) {
                fprintf(stderr, P_ ": --corpora: unknown corpus \"%s\" (fortunes, "
                                "foldoc)\n", tok);
                return 2;
            }
            corpora[ncorp] = known_corpora_[found].name;
            corpus_path[ncorp++] = known_corpora_[found].path;
        }
    }

    if (strlen(out) > 900) {
        fprintf(stderr, P_ ": --out: at most 900 bytes\n");
        return 2;
    }
    /* OUT and its config: a sweep resumes only with the same shape */
    char path[2400], err[512];
    snprintf(path, sizeof path, "%s/curves", out);
    if ((mkdir(out, 0755) && errno != EEXIST) ||
        (mkdir(path, 0755) && errno != EEXIST)) {
        fprintf(stderr, P_ ": %s: %s\n", path, strerror(errno));
        return 1;
    }
    char shape[512];
    snprintf(shape, sizeof shape,
             "L=%d C=%d NH=%d T=%d B=%d steps=%ld lr=%g warmup=%ld "
             "eval_every=%ld eval_batches=%d",
             L, s.model.n_embd, s.model.n_head, s.model.seq_len,
             s.train.batch_size, s.train.steps, s.train.lr,
             s.train.warmup_steps, s.train.eval_every, s.train.eval_batches);
    snprintf(path, sizeof path, "%s/shape.txt", out);
    FILE *f = fopen(path, "r");
    if (f) {
        char old[512] = "";
        if (!fgets(old, sizeof old, f))
            old[0] = 0;
        fclose(f);
        old[strcspn(old, "\n")] = 0;
        if (strcmp(old, shape)) {
            fprintf(stderr, P_ ": %s holds a sweep of another shape (%s); "
                            "pass another --out or remove it\n", out, old);
            return 2;
        }
    } else {
        f = fopen(path, "w");
        if (!f || fprintf(f, "%s\n", shape) < 0 || fclose(f)) {
            fprintf(stderr, P_ ": %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    printf(P_ ": %s\n", shape);

    /* the corpora's shards */
    char data[4][1100];
    for (int c = 0; c < ncorp; c++) {
        snprintf(data[c], sizeof data[c], "%s/data-%s", out, corpora[c]);
        snprintf(path, sizeof path, "%.1100s/train_000000.bin", data[c]);
        struct stat st;
        if (stat(path, &st) == 0)
            continue;
        const char *in[] = {corpus_path[c]};
        prepare_stats ps;
        if (data_prepare(data[c], in, 1, 0.1, 100000000, &ps, NULL, NULL, err,
                         sizeof err) != 0) {
            fprintf(stderr, P_ ": preparing %s: %s\n(install Debian's %s)\n",
                    corpora[c], err,
                    strcmp(corpora[c], "foldoc") == 0 ? "dict-foldoc" : "fortunes");
            return 1;
        }
    }

    /* the tasks: per corpus and seed, scratch first, then the grid */
    int nset = nsg * nfrac * nopt * nrw * ngs * nlrs;
    int ntask = 0, cap = ncorp * nseed * (1 + nset);
    task *tasks = calloc((size_t)cap, sizeof *tasks);
    if (!tasks)
        die_("out of memory");
    for (int c = 0; c < ncorp; c++)
        for (int si = 0; si < nseed; si++) {
            tasks[ntask++] = (task){c, (int)seeds[si], 0, 0, 0, 0, 0, 1};
            for (int a = 0; a < nsg; a++)
                for (int b = 0; b < nfrac; b++)
                    for (int d = 0; d < nopt; d++)
                        for (int e = 0; e < nrw; e++)
                            for (int g = 0; g < ngs; g++)
                                for (int h = 0; h < nlrs; h++)
                                    tasks[ntask++] = (task){
                                        c, (int)seeds[si], (int)sg[a], frac[b],
                                        rewarm[e], opts_reset[d], gs_mean[g],
                                        lrs[h]};
        }
    /* the runs already done: a whole curve on disk */
    int todo = 0;
    char *have = calloc((size_t)ntask, 1);
    curve *tmp = malloc(sizeof *tmp);
    if (!have || !tmp)
        die_("out of memory");
    for (int i = 0; i < ntask; i++) {
        curve_path_(path, sizeof path, out, &tasks[i], corpora);
        have[i] = read_curve_(path, tmp) == 0;
        todo += !have[i];
    }
    free(tmp);
    printf(P_ ": %d runs (%d corpora x %d seeds x (scratch + %d settings)); "
              "%d already done in %s, %d to train, %ld at a time\n",
           ntask, ncorp, nseed, nset, ntask - todo, out,
           todo, jobs);
    fflush(stdout);

    /* train what is missing, jobs at a time */
    double t0 = clock_mono_s();
    int running = 0, failed = 0, done = 0;
    for (int i = 0; i < ntask || running > 0;) {
        if (i < ntask && running < jobs) {
            if (have[i++])
                continue;
            curve_path_(path, sizeof path, out, &tasks[i - 1], corpora);
            fflush(stdout);
            pid_t pid = fork();
            if (pid < 0)
                die_("fork failed");
            if (pid == 0)
                _exit(run_task_(&s, &tasks[i - 1], data[tasks[i - 1].corpus],
                                path) == 0 ? 0 : 1);
            running++;
            continue;
        }
        int st;
        if (wait(&st) < 0)
            break;
        running--;
        done++;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
        double el = clock_mono_s() - t0;
        printf("  %d/%d trained, %.0f s, about %.0f s left\n", done, todo, el,
               el / done * (todo - done));
        fflush(stdout);
    }
    if (failed) {
        fprintf(stderr, P_ ": %d runs failed (see above); run again to retry "
                        "them\n", failed);
        return 1;
    }

    /* the comparison */
    char csvpath[1000], tmpcsv[1100];
    snprintf(csvpath, sizeof csvpath, "%s/results%s%s.csv", out, tag ? "-" : "",
             tag ? tag : "");
    snprintf(tmpcsv, sizeof tmpcsv, "%s.tmp-%d", csvpath, (int)getpid());
    FILE *csv = fopen(tmpcsv, "w");
    if (!csv) {
        fprintf(stderr, P_ ": %s: %s\n", tmpcsv, strerror(errno));
        return 1;
    }
    fprintf(csv, "corpus,seed,share_groups,pseudo_frac,delink_optimizer,"
                 "rewarm_frac,grad_scale,pseudo_lr_scale,steps,final_val,"
                 "scratch_final_val,final_val_ratio,steps_to_target,"
                 "scratch_steps_to_target,step_ratio,wall_s,scratch_wall_s,"
                 "wall_ratio\n");
    /* per setting and corpus: sums over seeds */
    double *ratio_sum = calloc((size_t)nset * ncorp, sizeof(double));
    double *step_sum = calloc((size_t)nset * ncorp, sizeof(double));
    int *reached = calloc((size_t)nset * ncorp, sizeof(int));
    double *wall_sum = calloc((size_t)nset * ncorp, sizeof(double));
    curve *sc = malloc(sizeof *sc), *pc = malloc(sizeof *pc);
    if (!ratio_sum || !step_sum || !reached || !wall_sum || !sc || !pc)
        die_("out of memory");
    for (int i = 0; i < ntask;) {
        /* tasks[i] is the scratch of a (corpus, seed); nset settings follow */
        curve_path_(path, sizeof path, out, &tasks[i], corpora);
        if (read_curve_(path, sc) != 0)
            die_("a scratch curve is missing after training");
        double target = sc->val[sc->n - 1];
        long s_reach = reach_(sc, target);
        for (int k = 0; k < nset; k++) {
            const task *t = &tasks[i + 1 + k];
            curve_path_(path, sizeof path, out, t, corpora);
            if (read_curve_(path, pc) != 0)
                die_("a curve is missing after training");
            double fv = pc->val[pc->n - 1];
            long p_reach = reach_(pc, target);
            char sr[32] = "never";
            if (p_reach >= 0)
                snprintf(sr, sizeof sr, "%.4f", (double)p_reach / (double)s_reach);
            fprintf(csv, "%s,%d,%d,%g,%s,%g,%s,%g,%ld,%.6f,%.6f,%.6f,%ld,%ld,%s,"
                         "%.3f,%.3f,%.4f\n",
                    corpora[t->corpus], t->seed, t->S, t->frac,
                    t->reset ? "reset" : "copy", t->rewarm,
                    t->mean ? "mean" : "sum", t->lr_scale, s.train.steps, fv,
                    target, fv / target, p_reach, s_reach, sr, pc->total_wall,
                    sc->total_wall, pc->total_wall / sc->total_wall);
            size_t at = (size_t)k * ncorp + t->corpus;
            ratio_sum[at] += fv / target;
            wall_sum[at] += pc->total_wall / sc->total_wall;
            if (p_reach >= 0) {
                reached[at]++;
                step_sum[at] += (double)p_reach / (double)s_reach;
            }
        }
        i += 1 + nset;
    }
    if (fflush(csv) || fclose(csv) || rename(tmpcsv, csvpath)) {
        fprintf(stderr, P_ ": %s: %s\n", csvpath, strerror(errno));
        return 1;
    }

    /* the table, averaged over seeds; the best and worst settings */
    printf("\nmean over %d seeds: final val / scratch's, steps to scratch's "
           "final val / scratch's, wall-clock / scratch's\n%-30s", nseed,
           "setting");
    for (int c = 0; c < ncorp; c++)
        printf("  %-9s%6s %10s %5s", corpora[c], "final", "to-target", "wall");
    printf("\n");
    int best = 0, worst = 0;
    double best_m = INFINITY, worst_m = -INFINITY;
    for (int k = 0; k < nset; k++) {
        char name[128];
        setting_name_(&tasks[1 + k], name, sizeof name);
        printf("%-30s", name);
        double m = 0;
        for (int c = 0; c < ncorp; c++) {
            size_t at = (size_t)k * ncorp + c;
            double r = ratio_sum[at] / nseed;
            m += r / ncorp;
            char reach[32];
            if (reached[at] == nseed)
                snprintf(reach, sizeof reach, "%.3f", step_sum[at] / nseed);
            else
                snprintf(reach, sizeof reach, "never %d/%d", nseed - reached[at],
                         nseed);
            printf("  %-9s%6.4f %10s %5.2f", "", r, reach, wall_sum[at] / nseed);
        }
        printf("\n");
        if (m < best_m) { best_m = m; best = k; }
        if (m > worst_m) { worst_m = m; worst = k; }
    }

    /* the plots: per corpus, the first seed's scratch, best and worst */
    for (int c = 0; c < ncorp; c++) {
        int base = c * nseed * (1 + nset);
        const int idx[3] = {base, base + 1 + best, base + 1 + worst};
        const char *what[3] = {"scratch", "best", "worst"};
        static curve cv[3];
        static double nan_[3][4096];
        plot_run runs[3];
        char label[3][160];
        for (int r = 0; r < 3; r++) {
            curve_path_(path, sizeof path, out, &tasks[idx[r]], corpora);
            if (read_curve_(path, &cv[r]) != 0)
                die_("a curve is missing after training");
            for (int j = 0; j < cv[r].n; j++)
                nan_[r][j] = NAN;
            char sn[128] = "";
            if (r > 0)
                setting_name_(&tasks[idx[r]], sn, sizeof sn);
            snprintf(label[r], sizeof label[r], "%s %s (seed %d)", what[r], sn,
                     tasks[idx[r]].seed);
            runs[r] = (plot_run){label[r], (size_t)cv[r].n, cv[r].step,
                                 nan_[r], cv[r].val, cv[r].delink_step};
        }
        snprintf(path, sizeof path, "%s/sweep%s%s-%s.svg", out, tag ? "-" : "",
                 tag ? tag : "", corpora[c]);
        if (plot_svg_write(path, runs, best == worst ? 2 : 3, err, sizeof err)) {
            fprintf(stderr, P_ ": %s\n", err);
            return 1;
        }
    }

    char bn[128], wn[128];
    setting_name_(&tasks[1 + best], bn, sizeof bn);
    setting_name_(&tasks[1 + worst], wn, sizeof wn);
    printf("\nbest setting %s: final val %.4f x scratch's (mean over %d seeds "
           "and %d corpora); worst %s: %.4f\n", bn, best_m, nseed, ncorp, wn,
           worst_m);
    printf("wrote %s and the plots beside it\n", csvpath);
    printf("settings=%d runs=%d trained=%d", nset, ntask, todo);
    for (int c = 0; c < ncorp; c++)
        printf(" best_ratio_%s=%.4f", corpora[c],
               ratio_sum[(size_t)best * ncorp + c] / nseed);
    int goal = 1;  /* the goal: at most scratch's loss on every corpus */
    for (int c = 0; c < ncorp; c++)
        goal &= ratio_sum[(size_t)best * ncorp + c] / nseed <= 1.0;
    printf(" best=%s best_ratio=%.4f worst=%s worst_ratio=%.4f "
           "goal_met=%d seconds=%.0f\n",
           bn, best_m, wn, worst_m, goal, clock_mono_s() - t0);
    free(ratio_sum);
    free(step_sum);
    free(reached);
    free(wall_sum);
    free(sc);
    free(pc);
    free(have);
    free(tasks);
    return 0;
}
