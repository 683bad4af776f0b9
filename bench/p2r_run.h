/*
 * p2r_run.h — one training run from start to end, delinking at
 * pseudo.steps, for the Pseudo-to-Real benchmarks (p2r_convergence.c,
 * p2r_sweep.c).
 */
#ifndef M6_BENCH_P2R_RUN_H
#define M6_BENCH_P2R_RUN_H

#include <math.h>
#include <stdio.h>

#include "bench_util.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

/* Train spec s to train.steps, delinking once pseudo.steps are done (when
 * it has a pseudo phase). At each validation pass calls on_eval(ctx, step,
 * val_loss, wall_s), wall_s the training wall-clock since the start in
 * seconds, evaluation excluded. 0 with *total_wall_s (the same clock at the
 * end) and *delink_step (the first real step; -1: none), or -1 after
 * printing the error, prefixed by prog, on stderr. */
static inline int p2r_train(const char *prog, const run_spec *s,
                            void (*on_eval)(void *ctx, long step, double val,
                                            double wall_s),
                            void *ctx, double *total_wall_s, long *delink_step)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return -1;
    }
    double t0 = clock_mono_s(), evals = 0;
    *delink_step = -1;
    while (trainer_step_count(t) < s->train.steps) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) >= s->pseudo.steps) {
            if (trainer_delink(t, err, sizeof err) != 0) {
                fprintf(stderr, "%s: %s\n", prog, err);
                trainer_free(t);
                return -1;
            }
            *delink_step = trainer_step_count(t);
        }
        step_result r;
        double a = clock_mono_s();
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0) {
            fprintf(stderr, "%s: %s\n", prog, err);
            trainer_free(t);
            return -1;
        }
        if (!isnan(r.val_loss)) {
            /* the wall-clock leaves out the time spent evaluating */
            evals += (clock_mono_s() - a) - r.step_ms / 1e3;
            on_eval(ctx, r.step, r.val_loss, clock_mono_s() - t0 - evals);
        }
    }
    *total_wall_s = clock_mono_s() - t0 - evals;
    trainer_free(t);
    return 0;
}

#endif /* M6_BENCH_P2R_RUN_H */
