/*
 * p2r_run.h — one training run from start to end, delinking at
 * pseudo.steps, for the Pseudo-to-Real benchmarks (p2r_convergence.c,
 * p2r_sweep.c, p2r_offload.c).
 */
#ifndef M6_BENCH_P2R_RUN_H
#define M6_BENCH_P2R_RUN_H

#include <math.h>
#include <stdio.h>

#include "bench_args.h"
#include "bench_util.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

/* The index of the first of the n validation losses val[] at or below
 * target; -1 if none is. */
static inline int p2r_reach(const double *val, int n, double target)
{
    for (int i = 0; i < n; i++)
        if (val[i] <= target)
            return i;
    return -1;
}

/* The convergence benchmarks' default run before their options: a GPT on
 * bytes (V 256) of L 6 blocks of 4 heads, width C and context T,
 * microbatch B for `steps` steps, lr 3e-3 with `warmup` steps of warmup
 * and the cosine to 3e-4, a validation pass of eval_batches batches every
 * eval_every steps; the rest spec_defaults'. */
typedef struct {
    int n_embd, seq_len, batch;
    long steps, warmup, eval_every;
    int eval_batches;
} p2r_defaults;

static inline run_spec p2r_default_spec(p2r_defaults d)
{
    run_spec s;
    spec_defaults(&s);
    s.model = (model_config){.vocab_size = 256, .n_layer = 6, .n_head = 4,
                             .n_embd = d.n_embd, .seq_len = d.seq_len};
    s.train.batch_size = d.batch;
    s.train.steps = d.steps;
    s.train.lr = 3e-3f;
    s.train.min_lr = 3e-4f;
    s.train.warmup_steps = d.warmup;
    s.train.eval_every = d.eval_every;
    s.train.eval_batches = d.eval_batches;
    return s;
}

/* getopt_long entries of the shape and schedule options both benchmarks
 * take (put them first in the option table). */
#define P2R_TRAIN_OPTIONS                                                    \
    {"layers", 1, 0, 'L'}, {"embd", 1, 0, 'C'}, {"heads", 1, 0, 'H'},        \
    {"seq", 1, 0, 'T'}, {"batch", 1, 0, 'B'}, {"steps", 1, 0, 'n'},          \
    {"lr", 1, 0, 'l'}, {"warmup", 1, 0, 'w'}, {"eval-every", 1, 0, 'e'},     \
    {"eval-batches", 1, 0, 'E'}

/* Apply option o of P2R_TRAIN_OPTIONS with argument arg to *s: 1 when it
 * was one of them (--lr also sets min_lr to a tenth), 0 when the benchmark
 * must handle it. A bad value exits 2 naming the option (bench_int_arg). */
static inline int p2r_train_option(const char *prog, int o, const char *arg,
                                   run_spec *s)
{
    switch (o) {
    case 'L': s->model.n_layer = bench_int_arg(prog, "layers", arg, 1); return 1;
    case 'C': s->model.n_embd = bench_int_arg(prog, "embd", arg, 1); return 1;
    case 'H': s->model.n_head = bench_int_arg(prog, "heads", arg, 1); return 1;
    case 'T': s->model.seq_len = bench_int_arg(prog, "seq", arg, 1); return 1;
    case 'B': s->train.batch_size = bench_int_arg(prog, "batch", arg, 1); return 1;
    case 'n': s->train.steps = bench_int_arg(prog, "steps", arg, 2); return 1;
    case 'l':
        s->train.lr = (float)bench_real_arg(prog, "lr", arg, 1e-9, 10);
        s->train.min_lr = s->train.lr / 10;
        return 1;
    case 'w': s->train.warmup_steps = bench_int_arg(prog, "warmup", arg, 0); return 1;
    case 'e': s->train.eval_every = bench_int_arg(prog, "eval-every", arg, 1); return 1;
    case 'E': s->train.eval_batches = bench_int_arg(prog, "eval-batches", arg, 1); return 1;
    default: return 0;
    }
}

/* getopt_long over argv with the table opts (short options: only "h"),
 * applying every option of P2R_TRAIN_OPTIONS to *s as it comes
 * (p2r_train_option): the next option the benchmark handles itself, or -1
 * when there are none left. */
static inline int p2r_next_option(const char *prog, int argc, char **argv,
                                  const struct option *opts, run_spec *s)
{
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1)
        if (!p2r_train_option(prog, o, optarg, s))
            return o;
    return -1;
}

/* What p2r_train_hooked calls while it trains (any may be NULL; ctx is
 * passed to each):
 *   on_start(ctx, t)          once, after trainer_create, before any step
 *                             (trainer_plan, trainer_placement are valid);
 *   on_step(ctx, t, r)        after every step, with its step_result;
 *   on_delink(ctx, t, s)      right after the delink, which took s seconds
 *                             (counted in the wall-clock);
 *   on_eval(ctx, step, val_loss, wall_s)  at each validation pass, wall_s
 *                             the training wall-clock since the start in
 *                             seconds, evaluation excluded. */
typedef struct {
    void (*on_start)(void *ctx, trainer *t);
    void (*on_step)(void *ctx, trainer *t, const step_result *r);
    void (*on_delink)(void *ctx, trainer *t, double seconds);
    void (*on_eval)(void *ctx, long step, double val, double wall_s);
    void *ctx;
} p2r_hooks;

/* Train spec s to train.steps, delinking once pseudo.steps are done (when
 * it has a pseudo phase), calling h's hooks. 0 with *total_wall_s (the
 * training wall-clock at the end, evaluation excluded) and *delink_step
 * (the steps done when it delinked; -1: none), or -1 after printing the
 * error, prefixed by prog, on stderr. */
static inline int p2r_train_hooked(const char *prog, const run_spec *s,
                                   const p2r_hooks *h, double *total_wall_s,
                                   long *delink_step)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return -1;
    }
    if (h->on_start)
        h->on_start(h->ctx, t);
    double t0 = clock_mono_s(), evals = 0;
    *delink_step = -1;
    while (trainer_step_count(t) < s->train.steps) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) >= s->pseudo.steps) {
            double d0 = clock_mono_s();
            if (trainer_delink(t, err, sizeof err) != 0) {
                fprintf(stderr, "%s: %s\n", prog, err);
                trainer_free(t);
                return -1;
            }
            *delink_step = trainer_step_count(t);
            if (h->on_delink)
                h->on_delink(h->ctx, t, clock_mono_s() - d0);
        }
        step_result r;
        double a = clock_mono_s();
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0) {
            fprintf(stderr, "%s: %s\n", prog, err);
            trainer_free(t);
            return -1;
        }
        double b = clock_mono_s();
        if (h->on_step)
            h->on_step(h->ctx, t, &r);
        if (!isnan(r.val_loss)) {
            /* the wall-clock leaves out the time spent evaluating */
            evals += (b - a) - r.step_ms / 1e3;
            if (h->on_eval)
                h->on_eval(h->ctx, r.step, r.val_loss, b - t0 - evals);
        }
        /* the hooks' own time is not training */
        evals += clock_mono_s() - b;
    }
    *total_wall_s = clock_mono_s() - t0 - evals;
    trainer_free(t);
    return 0;
}

/* p2r_train_hooked with only on_eval (the convergence benchmarks). */
static inline int p2r_train(const char *prog, const run_spec *s,
                            void (*on_eval)(void *ctx, long step, double val,
                                            double wall_s),
                            void *ctx, double *total_wall_s, long *delink_step)
{
    p2r_hooks h = {.on_eval = on_eval, .ctx = ctx};
    return p2r_train_hooked(prog, s, &h, total_wall_s, delink_step);
}

#endif /* M6_BENCH_P2R_RUN_H */
