/*
 * test_step.c — what one training step on the cuda backend asks of the
 * host (issue 18, item 4, "fewer launches"), counted in the CUDA
 * emulation (emu_counts.h), with the step's losses checked against the
 * CPU backend's. Emulation only (the counters are the emulator's).
 * Exit 0 passed, 1 failed.
 *
 *  1. A cuda trainer and a cpu trainer on the same spec (3 microbatches
 *     per step, so that per-microbatch waits would show), no evaluation
 *     in the steps counted.
 *  2. Step 1 (the first: cuBLASLt descriptors and algorithms, the
 *     microbatch staging and the multi-tensor AdamW plan are made), then
 *     steps 2..STEPS, each counted on its own:
 *     - no cuBLASLt matmul descriptor and no matrix layout made
 *       (kernels/cuda/matmul.cu keeps them per configuration); the GEMMs
 *       queued per step are printed, with the descriptors and layouts
 *       they would make without the cache (1 and 3 each);
 *     - exactly one host wait (gpt_cuda_grad_norm's: the norm decides
 *       whether the step is skipped): the microbatches are queued with
 *       no wait between them, their losses read once (backend
 *       step_loss), the AdamW update queued.
 *  3. Every step's loss within TOL_LOSS of the CPU backend's: the queued
 *     path computes the same step (tolerance as tests/gpu/test_trainer.c:
 *     bf16 activations, weights' working copy and gradients against fp32).
 *  4. The cuda trainer's validation loss (a forward pass: it waits for
 *     the queued update) within TOL_LOSS of the CPU's: the last queued
 *     AdamW was applied before the state was read.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_counts.h"
#include "report.h"

#include "train/data.h"
#include "train/trainer.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

/* TOL_LOSS 5e-2 nats: tests/gpu/test_trainer.c's (its reasons: bf16 on
 * the device, fp32 on the CPU, over a handful of AdamW steps at lr 1e-3) */
#define TOL_LOSS 5e-2
#define STEPS 5
#define ACCUM 3

static char dir_[256];

static run_spec spec_(backend_kind backend)
{
    run_spec s;
    spec_defaults(&s);
    synth_spec_data(&s, dir_);
    /* head size 32 and n_embd % 8 == 0: a shape gpt_cuda supports */
    s.model = (model_config){.vocab_size = 256, .n_layer = 3, .n_head = 2,
                             .n_embd = 64, .seq_len = 64};
    s.pseudo.steps = 0;         /* one slot per layer, no delink */
    s.train.steps = 100;        /* the last step's evaluation is far off */
    s.train.eval_every = 100;
    s.train.eval_batches = 2;
    s.train.batch_size = 2;
    s.train.grad_accum = ACCUM;
    s.train.lr = 1e-3f;
    s.train.min_lr = 1e-4f;
    s.train.warmup_steps = 2;
    s.train.grad_clip = 1.0f;
    s.device.backend = backend;
    return s;
}

static trainer *create_(const run_spec *s)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        exit(1);
    }
    return t;
}

static int step_(trainer *t, step_result *r)
{
    char err[512];
    if (ERR_INTO(err, trainer_step(t, r, &err_)) != 0) {
        fprintf(stderr, "trainer_step: %s\n", err);
        return -1;
    }
    return 0;
}

int main(void)
{
    snprintf(dir_, sizeof dir_, "/tmp/m6-emu-step.XXXXXX");
    if (synth_shards(dir_, 40000) != 0) {
        fprintf(stderr, "test_step: cannot make temporary data\n");
        return 1;
    }
    run_spec sg = spec_(BACKEND_CUDA), sc = spec_(BACKEND_CPU);
    printf("1. cuda and cpu trainers, %d microbatches per step\n", ACCUM);
    trainer *tg = create_(&sg), *tc = create_(&sc);

    printf("2. per step: cuBLASLt descriptors made, host waits\n");
    float lg[STEPS], lc[STEPS];
    for (int i = 0; i < STEPS; i++) {
        long d0 = emu_lt_desc_creates(), l0 = emu_lt_layout_creates();
        long w0 = emu_host_waits(), m0 = emu_lt_matmuls();
        step_result r;
        if (step_(tg, &r) != 0)
            return 1;
        long d = emu_lt_desc_creates() - d0;
        long l = emu_lt_layout_creates() - l0;
        long w = emu_host_waits() - w0, m = emu_lt_matmuls() - m0;
        lg[i] = r.train_loss;
        if (step_(tc, &r) != 0)
            return 1;
        lc[i] = r.train_loss;
        printf("  step %d: %ld GEMMs (uncached: %ld descriptors, %ld "
               "layouts); made %ld descriptors, %ld layouts; %ld host "
               "waits; loss cuda %.6f cpu %.6f\n", i + 1, m, m, 3 * m, d, l,
               w, lg[i], lc[i]);
        if (i == 0)
            continue; /* the first step makes what the others keep */
        char what[96];
        snprintf(what, sizeof what, "step %d: matmul descriptors made", i + 1);
        check_(d == 0, what, (double)d, 0, 0);
        snprintf(what, sizeof what, "step %d: matrix layouts made", i + 1);
        check_(l == 0, what, (double)l, 0, 0);
        snprintf(what, sizeof what, "step %d: GEMMs queued (> 0)", i + 1);
        check_true_(m > 0, what);
        snprintf(what, sizeof what, "step %d: host waits", i + 1);
        check_(w == 1, what, (double)w, 1, 0);
    }

    printf("3. losses against the cpu backend\n");
    for (int i = 0; i < STEPS; i++) {
        char what[64];
        snprintf(what, sizeof what, "step %d loss", i + 1);
        check_(isfinite(lg[i]) && fabs(lg[i] - lc[i]) <= TOL_LOSS, what,
               lg[i], lc[i], TOL_LOSS);
    }

    printf("4. validation loss after the last queued update\n");
    char err[512];
    float vg = NAN, vc = NAN;
    if (ERR_INTO(err, trainer_eval_checked(tg, &vg, &err_)) != 0 ||
        ERR_INTO(err, trainer_eval_checked(tc, &vc, &err_)) != 0) {
        fprintf(stderr, "trainer_eval_checked: %s\n", err);
        return 1;
    }
    check_(isfinite(vg) && fabs(vg - vc) <= TOL_LOSS, "validation loss", vg,
           vc, TOL_LOSS);

    trainer_free(tg);
    trainer_free(tc);
    synth_remove(dir_);
    printf("test_step: %s (%d failed)\n", n_failed ? "FAIL" : "ok",
           n_failed);
    return n_failed ? 1 : 0;
}
