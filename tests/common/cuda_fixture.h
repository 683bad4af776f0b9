/*
 * cuda_fixture.h — what the trainer tests outside cmocka share (tests/gpu,
 * tests/cuda_emu): the small spec gpt_cuda supports, and trainer creation
 * that exits with the error instead of returning it. Include after
 * train/trainer.h.
 */
#ifndef M6_TESTS_CUDA_FIXTURE_H
#define M6_TESTS_CUDA_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "model/cuda/gpt_cuda.h"
#include "train/trainer.h"
#include "synth_data.h"
#include "err_into.h"

/* The spec the GPU trainer tests train: V 256, 3 layers of C 64 (2 heads,
 * head size 32 and C % 8 == 0: a shape gpt_cuda supports), T 64, one
 * shared slot for `pseudo_steps` steps, `steps` in all, lr 1e-3 -> 1e-4,
 * 2 eval batches, on `backend`, data in dir. The caller sets B,
 * microbatches, warmup, eval_every and clipping. */
static inline run_spec synth_cuda_spec(const char *dir, backend_kind backend,
                                       long steps, long pseudo_steps)
{
    run_spec s;
    spec_defaults(&s);
    synth_spec_data(&s, dir);
    s.model = (model_config){.vocab_size = 256, .n_layer = 3, .n_head = 2,
                             .n_embd = 64, .seq_len = 64};
    s.pseudo.share_groups = 1;
    s.pseudo.steps = pseudo_steps;
    s.train.steps = steps;
    s.train.lr = 1e-3f;
    s.train.min_lr = 1e-4f;
    s.train.eval_batches = 2;
    s.device.backend = backend;
    return s;
}

/* s's batch and schedule: B sequences a microbatch, accum microbatches a
 * step, warmup steps of warmup, an evaluation every eval_every steps (0:
 * only at the end). */
static inline void synth_cuda_batch(run_spec *s, int B, int accum,
                                    long warmup, long eval_every)
{
    s->train.batch_size = B;
    s->train.grad_accum = accum;
    s->train.warmup_steps = warmup;
    s->train.eval_every = eval_every;
}

/* MoE in every `every`-th block of synth_cuda_spec's model: 8 experts of
 * hidden 64 in 2 prototypes (E and H multiples of 8, as gpt_cuda needs),
 * training capacity factor `capacity`, 2 for evaluation, aux and z loss
 * coefficients 0.01 and 0.001. */
static inline void synth_cuda_moe(run_spec *s, int every, float capacity)
{
    s->model.moe_experts = 8;
    s->model.moe_prototypes = 2;
    s->model.moe_every = every;
    s->model.moe_hidden = 64;
    s->model.moe_capacity_factor = capacity;
    s->model.moe_eval_capacity_factor = 2.0f;
    s->model.moe_aux_coef = 0.01f;
    s->model.moe_z_coef = 0.001f;
}

/* A GPU trainer test's start: exits 77 (meson's SKIP) with a line naming
 * prog when there is no CUDA device; returns the steps to run: hi, or
 * M6_TEST_STEPS when set (an even number from lo to hi, else exits 1
 * naming prog), as the CUDA emulation sets fewer. */
static inline int fixture_gpu_steps(const char *prog, int lo, int hi)
{
    const char *why = "";
    if (gpt_cuda_device_count(&why) < 1) {
        printf("%s: SKIP: no CUDA device (%s)\n", prog, why);
        exit(77);
    }
    const char *steps = getenv("M6_TEST_STEPS");
    if (!steps)
        return hi;
    int n = atoi(steps);
    if (n < lo || n > hi || n % 2) {
        fprintf(stderr, "%s: M6_TEST_STEPS=%s: want an even number from %d "
                "to %d\n", prog, steps, lo, hi);
        exit(1);
    }
    return n;
}

/* trainer_create; on error prints it and exits 1. */
static inline trainer *fixture_create_or_exit(const run_spec *s)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        exit(1);
    }
    return t;
}

#endif /* M6_TESTS_CUDA_FIXTURE_H */
