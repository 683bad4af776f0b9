/*
 * test_adafactor.c — optimizer.name "adafactor" on device.backend "cuda"
 * (kernels/cuda/adafactor.cu through daemon/model/cuda/optim_cuda.cu and
 * backend_cuda.c) against the same run on the CPU engine's Adafactor
 * (kernels/cpu/adafactor.c, itself tested against a float64 reference in
 * tests/unit/test_adafactor.c): same spec, same initial weights, same
 * batches. Exit 0 passed, 1 failed, 77 no CUDA device.
 *
 * Each case trains STEPS steps of the trainer tests' small model
 * (tests/common/cuda_fixture.h: 3 layers, one shared slot delinked at
 * STEPS/2, global-norm clipping at 1; V 300 here, so that the device's
 * wte has padded rows) on both backends and checks:
 *   - every step's loss within TOL_LOSS;
 *   - the weights' change since the start (the whole flat layout) within
 *     TOL_UPDATE (normalised L2 error of the GPU's change against the
 *     CPU's), and the second moment (the af layout: row and column
 *     statistics) and the first moment, where kept, within TOL_STATE;
 *   - the step counts equal;
 *   - (A, B, D) the device bytes of each phase (trainer_device_bytes: what
 *     gpt_cuda allocated) equal to the planner's prediction.
 * Cases: A no first moment (beta1 0), update clipping at d = 1; B first
 * moment (beta1 0.9) and delink.optimizer reset; C as A with update
 * clipping at d = 0.25; D B's optimizer (delink copying) on MoE blocks
 * (each expert's matrices and each prototype's gate are tensors of their
 * own: gpt_af_tensors); E and F offloaded (a device.memory_budget that
 * keeps one slot of the real phase resident: the other two are updated
 * by the host Adafactor of gpt_cuda_offload.cu, the delink copying
 * state between device and host slots), E A's optimizer on dense
 * blocks, F D's (first moment) on MoE blocks; the cpu reference of every
 * case keeps all slots resident. E and F also check the host bytes
 * gpt_cuda holds against the planner's. That the clipping fires: C's weight change on
 * the GPU differs from A's by more than CLIP_APART (C is A but for d);
 * the CPU agreeing with each within TOL_UPDATE then says the GPU clips
 * as the CPU does.
 * Checkpoints: B's GPU run saves at the end; the checkpoint loads into a
 * fresh cuda trainer and into a cpu trainer with weights, both moments
 * and step counts bitwise the GPU's (the optimizer's state in the
 * checkpoint, at full precision, in the CPU engine's layout); a cuda
 * AdamW run refuses it, naming the optimizer.
 * E's GPU run saves before its last step and at the end: the end
 * checkpoint loads into a fresh offloaded cuda trainer and into a cpu
 * trainer bitwise, and the offloaded trainer resumed from the earlier
 * one takes the last step with the uninterrupted run's loss bitwise.
 * The spec with a budget passes the trainer's check.
 *
 * Tolerances (tests/gpu/test_trainer.c's, for the same reasons):
 *  TOL_LOSS 5e-2 nats: bf16 activations, working copy and gradients on
 *    the GPU against fp32 on the CPU; Adafactor, like AdamW, normalises
 *    each gradient, so bf16 error in small gradients moves weights by up
 *    to lr per step.
 *  TOL_UPDATE 5e-2 and TOL_STATE 5e-2: test_model.cu's TOL_GRAD (the
 *    normalised error of a bf16 gradient against fp32's); the update is
 *    the gradient normalised by statistics of the gradient, and the
 *    statistics are means of its squares, so each carries that error.
 *  CLIP_APART 0.2: the clipped update is at least 4x smaller wherever
 *    RMS(U) reaches 1 (it is about 1 at every step for a vector, and at
 *    step 1, beta2 = 0, for every tensor), far beyond TOL_UPDATE.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#include "model/cuda/gpt_cuda.h"
#include "offload/offload.h"
#include "train/trainer.h"
#include "../common/cuda_fixture.h"
#include "../common/err_into.h"

#define TOL_LOSS 5e-2
#define TOL_UPDATE 5e-2
#define TOL_STATE 5e-2
#define CLIP_APART 0.2
#define NCASES 6

#include "gpu_vs_cpu.h"

static run_spec spec_(backend_kind backend, float beta1, float clip,
                      delink_optimizer dopt)
{
    run_spec s = synth_cuda_spec(dir_, backend, STEPS, STEPS / 2);
    /* V 300, not a multiple of 128: the device's wte has padded rows
     * (Vp 384), which the statistics must not count */
    s.model.vocab_size = 300;
    synth_cuda_batch(&s, 4, 2, 2, 0);
    s.train.grad_clip = 1.0f;
    s.optimizer.name = OPTIMIZER_ADAFACTOR;
    s.optimizer.beta1 = beta1;
    s.optimizer.clip_threshold = clip;
    s.delink.optimizer = dopt;
    return s;
}

/* The checks of one case: cuda run g against cpu run c from weights w0. */
static void compare_(const char *name, const run_ *g, const run_ *c,
                     const float *w0)
{
    compare_runs_(name, g, c, w0);
}

/* The Adafactor checkpoint `name` into a cuda AdamW trainer of s's shape:
 * refused, naming the checkpoint's optimizer. */
static void refuse_check_(const run_spec *s, const char *name)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    run_spec a = *s;
    a.optimizer.name = OPTIMIZER_ADAMW;
    a.optimizer.beta1 = 0.0f;
    trainer *t = fixture_create_or_exit(&a);
    int ok = ERR_INTO(err, trainer_load(t, path, &err_)) != 0 &&
             strstr(err, "optimizer \"adafactor\"") != NULL; /* not the
                                                        * path's name */
    printf("  (%s)\n", err);
    check_true_(ok, "B: into a cuda AdamW run: refused, naming adafactor");
    trainer_free(t);
}

int main(void)
{
    STEPS = fixture_gpu_steps("test_adafactor", 4, STEPS_MAX);
    if (synth_shards_tmp(dir_, sizeof dir_, "test_adafactor", 40000) != 0)
        return 1;
    spec_check_(spec_(BACKEND_CUDA, 0.0f, 1.0f, DELINK_OPT_COPY), "adafactor");

    static const struct {
        const char *name;
        float beta1, clip;
        delink_optimizer dopt;
        int moe, offload;
    } cases[NCASES] = {
        {"A beta1 0", 0.0f, 1.0f, DELINK_OPT_COPY, 0, 0},
        {"B beta1 0.9, reset", 0.9f, 1.0f, DELINK_OPT_RESET, 0, 0},
        {"C d 0.25", 0.0f, 0.25f, DELINK_OPT_COPY, 0, 0},
        {"D MoE", 0.9f, 1.0f, DELINK_OPT_COPY, 1, 0},
        {"E offloaded", 0.0f, 1.0f, DELINK_OPT_COPY, 0, 1},
        {"F offloaded MoE", 0.9f, 1.0f, DELINK_OPT_COPY, 1, 1},
    };
    run_ g[NCASES], c[NCASES];
    float *w0[NCASES];
    for (int k = 0; k < NCASES; k++) {
        printf("%d. %s: %d steps, delink at %d\n", k + 1, cases[k].name,
               STEPS, STEPS / 2);
        run_spec sg = spec_(BACKEND_CUDA, cases[k].beta1, cases[k].clip,
                            cases[k].dopt);
        case_spec_(&sg, cases[k].moe, cases[k].offload);
        run_spec sc;
        size_t n0;
        case_pair_(&sg, cases[k].moe, &sc, &g[k], &c[k], &w0[k], &n0,
                   k == 1 ? "cuda-b" : k == 4 ? "cuda-e" : NULL, NULL,
                   k == 4);
        compare_(cases[k].name, &g[k], &c[k], w0[k]);
        if (k != 2) /* without and with a first moment, MoE slots */
            plan_check_(&sg, &g[k], cases[k].name);
        if (cases[k].offload)
            check_true_(g[k].n_offloaded == 2,
                        "E, F: the real phase offloads 2 slots of 3");
        if (k == 1) {
            load_check_(&sg, "cuda-b", &g[k],
                        "B: cuda checkpoint into cuda, state bitwise");
            load_check_(&sc, "cuda-b", &g[k],
                        "B: cuda checkpoint into cpu, state bitwise");
            refuse_check_(&sg, "cuda-b");
        }
        if (k == 4)
            offload_load_checks_(&sg, &sc, "cuda-e", &g[k]);
    }
    double apart = update_nerr_(g[2].buf[0], g[0].buf[0], w0[0], g[0].n[0]);
    check_(apart > CLIP_APART, "update clipping fires: C's change vs A's",
           apart, CLIP_APART, 0);
    for (int k = 0; k < NCASES; k++) {
        run_free_(&g[k]);
        run_free_(&c[k]);
        free(w0[k]);
    }
    printf("test_adafactor: %s (%d failed)\n", n_failed ? "FAIL" : "ok",
           n_failed);
    return n_failed ? 1 : 0;
}
