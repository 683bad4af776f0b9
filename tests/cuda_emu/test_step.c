/*
 * test_step.c — what one training step on the cuda backend asks of the
 * host (issue 18, item 4, "fewer launches"), counted in the CUDA
 * emulation (emu_counts.h), with the step's losses checked against the
 * CPU backend's. Emulation only (the counters are the emulator's).
 * Exit 0 passed, 1 failed.
 *
 *  1. Three trainers on the same spec (3 microbatches per step, so that
 *     per-microbatch waits would show; a Pseudo phase of one shared slot
 *     for DELINK_AT steps, then a delink): cuda with CUDA graphs (the
 *     default), cuda without (M6_CUDA_GRAPH=0 at its creation: the queued
 *     path) and cpu. No evaluation in the steps counted.
 *  2. Step 1 (the first: cuBLASLt descriptors and algorithms, the
 *     microbatch staging, the multi-tensor AdamW plan and the graphs are
 *     made), then every later step counted on its own:
 *     - no cuBLASLt matmul descriptor and no matrix layout made on either
 *       path (kernels/cuda/matmul.cu keeps them per configuration);
 *     - exactly one host wait (gpt_cuda_grad_norm's: the norm decides
 *       whether the step is skipped) on either path;
 *     - queued path: GEMMs queued one by one, no graph;
 *     - graphs: two graph launches (the microbatches, the optimizer), no
 *       GEMM queued by the host, at most GRAPH_OPS other operations (the
 *       norm's sum of squares: two kernels and a copy), and no capture.
 *     Step 1 and the first step after the delink (the reslot moved the
 *     state) capture the two graphs; they are not counted otherwise.
 *  3. The graphs replay exactly the queued path: every step's loss is the
 *     same float on both cuda trainers, before and after the delink (a
 *     graph that kept the old state's pointers, an lr or bias correction
 *     frozen at capture, or a stale encoder plan would part them); and
 *     both are within TOL_LOSS of the CPU backend's.
 *  4. The validation loss (a forward pass: it waits for the queued
 *     update) the same float on both cuda trainers and within TOL_LOSS of
 *     the CPU's: the last AdamW was applied before the state was read.
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
#include "../common/cuda_fixture.h"
#include "../common/err_into.h"

/* TOL_LOSS 5e-2 nats: tests/gpu/test_trainer.c's (its reasons: bf16 on
 * the device, fp32 on the CPU, over a handful of AdamW steps at lr 1e-3) */
#define TOL_LOSS 5e-2
#define STEPS 6
#define ACCUM 3
#define DELINK_AT 3 /* steps 1..3 Pseudo (one slot), 4..6 Real */
#define GRAPH_OPS 3 /* per graph step, outside the graphs: sumsq, copy */

static char dir_[256];

static run_spec spec_(backend_kind backend)
{
    /* one slot for the 3 layers, then a delink at DELINK_AT: the state
     * moves; 100 steps: the last step's evaluation is far off */
    run_spec s = synth_cuda_spec(dir_, backend, 100, DELINK_AT);
    s.train.eval_every = 100;
    s.train.batch_size = 2;
    s.train.grad_accum = ACCUM;
    s.train.warmup_steps = 2;
    s.train.grad_clip = 1.0f;
    return s;
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

/* What one step asked of the host, from the emulation's counters. */
typedef struct {
    long desc, layouts, gemms, waits, ops, captures, launches;
} counts_;

static counts_ now_(void)
{
    return (counts_){emu_lt_desc_creates(), emu_lt_layout_creates(),
                     emu_lt_matmuls(), emu_host_waits(), emu_stream_ops(),
                     emu_graph_captures(), emu_graph_launches()};
}

static counts_ since_(counts_ a)
{
    counts_ b = now_();
    return (counts_){b.desc - a.desc, b.layouts - a.layouts,
                     b.gemms - a.gemms, b.waits - a.waits, b.ops - a.ops,
                     b.captures - a.captures, b.launches - a.launches};
}

/* One step of t (delinking first when the Pseudo phase is over); its
 * counts into *c. The train loss, or NAN after printing the error. */
static float step_counted_(trainer *t, counts_ *c)
{
    char err[512];
    if (trainer_phase(t) == PHASE_PSEUDO &&
        trainer_step_count(t) == DELINK_AT &&
        trainer_delink(t, err, sizeof err) != 0) {
        fprintf(stderr, "trainer_delink: %s\n", err);
        return NAN;
    }
    counts_ c0 = now_();
    step_result r;
    if (step_(t, &r) != 0)
        return NAN;
    *c = since_(c0);
    return r.train_loss;
}

static void check_counts_(int step, int graphs, const counts_ *c)
{
    char what[96];
    const char *path = graphs ? "graphs" : "queued";
#define CHECK_COUNT_(cond, name, got, want)                                  \
    do {                                                                     \
        snprintf(what, sizeof what, "step %d %s: %s", step, path, name);     \
        check_(cond, what, (double)(got), (double)(want), 0);                \
    } while (0)
    CHECK_COUNT_(c->desc == 0, "matmul descriptors made", c->desc, 0);
    CHECK_COUNT_(c->layouts == 0, "matrix layouts made", c->layouts, 0);
    CHECK_COUNT_(c->waits == 1, "host waits", c->waits, 1);
    if (!graphs) {
        snprintf(what, sizeof what, "step %d queued: GEMMs queued (> 0)",
                 step);
        check_true_(c->gemms > 0, what);
        CHECK_COUNT_(c->launches == 0, "graph launches", c->launches, 0);
        CHECK_COUNT_(c->captures == 0, "captures", c->captures, 0);
        return;
    }
    CHECK_COUNT_(c->gemms == 0, "GEMMs queued by the host", c->gemms, 0);
    CHECK_COUNT_(c->launches == 2, "graph launches", c->launches, 2);
    CHECK_COUNT_(c->ops <= GRAPH_OPS, "operations queued one by one",
                 c->ops, GRAPH_OPS);
    CHECK_COUNT_(c->captures == 0, "captures", c->captures, 0);
#undef CHECK_COUNT_
}

int main(void)
{
    if (synth_shards_tmp(dir_, sizeof dir_, "test_step", 40000) != 0)
        return 1;
    run_spec sg = spec_(BACKEND_CUDA), sc = spec_(BACKEND_CPU);
    printf("1. cuda (graphs), cuda (queued) and cpu trainers, %d "
           "microbatches per step, delink after step %d\n", ACCUM,
           DELINK_AT);
    unsetenv("M6_CUDA_GRAPH");
    trainer *tg = fixture_create_or_exit(&sg);
    setenv("M6_CUDA_GRAPH", "0", 1);
    trainer *tq = fixture_create_or_exit(&sg);
    unsetenv("M6_CUDA_GRAPH");
    trainer *tc = fixture_create_or_exit(&sc);

    printf("2. per step: descriptors made, host waits, launches\n");
    float lg[STEPS], lq[STEPS], lc[STEPS];
    for (int i = 0; i < STEPS; i++) {
        counts_ cg, cq, cc;
        lg[i] = step_counted_(tg, &cg);
        lq[i] = step_counted_(tq, &cq);
        lc[i] = step_counted_(tc, &cc);
        if (isnan(lg[i]) || isnan(lq[i]) || isnan(lc[i]))
            return 1;
        printf("  step %d queued: %ld GEMMs (uncached: %ld descriptors, "
               "%ld layouts); made %ld descriptors, %ld layouts; %ld host "
               "waits; %ld operations\n", i + 1, cq.gemms, cq.gemms,
               3 * cq.gemms, cq.desc, cq.layouts, cq.waits, cq.ops);
        printf("  step %d graphs: %ld graph launches, %ld captures, %ld "
               "GEMMs and %ld operations one by one, %ld host waits\n",
               i + 1, cg.launches, cg.captures, cg.gemms, cg.ops, cg.waits);
        printf("  step %d loss: graphs %.9g queued %.9g cpu %.6f\n", i + 1,
               lg[i], lq[i], lc[i]);
        if (i == 0 || i == DELINK_AT) {
            /* the first step makes what the others keep; the first after
             * the delink makes it again for the moved state (descriptors
             * whose pointers' alignment changed, the graphs) */
            char what[64];
            snprintf(what, sizeof what, "step %d graphs: captures", i + 1);
            check_(cg.captures == 2, what, (double)cg.captures, 2, 0);
            continue;
        }
        check_counts_(i + 1, 0, &cq);
        check_counts_(i + 1, 1, &cg);
    }

    printf("3. losses: graphs = queued path, and against the cpu backend\n");
    for (int i = 0; i < STEPS; i++) {
        char what[64];
        snprintf(what, sizeof what, "step %d loss, graphs = queued", i + 1);
        check_(!memcmp(&lg[i], &lq[i], sizeof(float)), what, lg[i], lq[i],
               0);
        snprintf(what, sizeof what, "step %d loss, cuda vs cpu", i + 1);
        check_(isfinite(lg[i]) && fabs(lg[i] - lc[i]) <= TOL_LOSS, what,
               lg[i], lc[i], TOL_LOSS);
    }

    printf("4. validation loss after the last queued update\n");
    char err[512];
    float vg = NAN, vq = NAN, vc = NAN;
    if (ERR_INTO(err, trainer_eval_checked(tg, &vg, &err_)) != 0 ||
        ERR_INTO(err, trainer_eval_checked(tq, &vq, &err_)) != 0 ||
        ERR_INTO(err, trainer_eval_checked(tc, &vc, &err_)) != 0) {
        fprintf(stderr, "trainer_eval_checked: %s\n", err);
        return 1;
    }
    check_(!memcmp(&vg, &vq, sizeof(float)), "validation loss, graphs = "
           "queued", vg, vq, 0);
    check_(isfinite(vg) && fabs(vg - vc) <= TOL_LOSS, "validation loss, "
           "cuda vs cpu", vg, vc, TOL_LOSS);

    trainer_free(tg);
    trainer_free(tq);
    trainer_free(tc);
    synth_remove(dir_);
    printf("test_step: %s (%d failed)\n", n_failed ? "FAIL" : "ok",
           n_failed);
    return n_failed ? 1 : 0;
}
