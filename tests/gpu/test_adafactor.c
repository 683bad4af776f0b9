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
 * own: gpt_af_tensors). That the clipping fires: C's weight change on
 * the GPU differs from A's by more than CLIP_APART (C is A but for d);
 * the CPU agreeing with each within TOL_UPDATE then says the GPU clips
 * as the CPU does.
 * Checkpoints: B's GPU run saves at the end; the checkpoint loads into a
 * fresh cuda trainer and into a cpu trainer with weights, both moments
 * and step counts bitwise the GPU's (the optimizer's state in the
 * checkpoint, at full precision, in the CPU engine's layout); a cuda
 * AdamW run refuses it, naming the optimizer.
 * A spec with a memory budget (offloading) is refused by the trainer's
 * check, naming device.memory_budget and Adafactor (a spec file is
 * refused at parse already: tests/unit/test_adafactor.c).
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
#define NCASES 4

/* 8 steps, the delink at 4; M6_TEST_STEPS=N (even, 4 to 8) runs N */
#define STEPS_MAX 8
static int STEPS = STEPS_MAX;

static char dir_[256];

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

/* A run's losses, state buffers (0 weights, 1 m, 2 v; n[i] floats, 0:
 * none) and step counts. */
typedef struct {
    float loss[STEPS_MAX];
    float *buf[3];
    size_t n[3];
    long steps[64];
    int n_steps;
    size_t dev[2];      /* trainer_device_bytes: pseudo phase, real */
} run_;

static void state_get_(trainer *t, run_ *r)
{
    for (int i = 0; i < 3; i++) {
        r->n[i] = trainer_copy_state(t, i, NULL);
        r->buf[i] = malloc((r->n[i] ? r->n[i] : 1) * sizeof(float));
        if (!r->buf[i]) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        if (r->n[i])
            trainer_copy_state(t, i, r->buf[i]);
    }
    r->n_steps = trainer_copy_adam_steps(t, r->steps);
}

static void run_free_(run_ *r)
{
    for (int i = 0; i < 3; i++)
        free(r->buf[i]);
}

/* STEPS steps of spec s from a fresh trainer, delinking when the step
 * count reaches pseudo.steps; the end state in *r, the initial weights in
 * w0 (malloc'd, *n0 floats; when w0 is not NULL); the checkpoint `save`
 * (when not NULL) written at the end. Exits 1 on an error. */
static void train_(const run_spec *s, run_ *r, float **w0, size_t *n0,
                   const char *save)
{
    char err[512];
    trainer *t = fixture_create_or_exit(s);
    r->dev[0] = trainer_device_bytes(t);
    if (w0) {
        size_t n = *n0 = trainer_copy_state(t, 0, NULL);
        *w0 = malloc(n * sizeof(float));
        if (!*w0 || trainer_copy_state(t, 0, *w0) != n) {
            fprintf(stderr, "initial weights: out of memory\n");
            exit(1);
        }
    }
    while (trainer_step_count(t) < STEPS) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == s->pseudo.steps &&
            trainer_delink(t, err, sizeof err) != 0) {
            fprintf(stderr, "trainer_delink: %s\n", err);
            exit(1);
        }
        step_result st;
        if (ERR_INTO(err, trainer_step(t, &st, &err_)) != 0) {
            fprintf(stderr, "trainer_step: %s\n", err);
            exit(1);
        }
        r->loss[st.step - 1] = st.train_loss;
        printf("    %s step %2ld  loss %.6f  norm %.4f\n",
               s->device.backend == BACKEND_CUDA ? "cuda" : "cpu ", st.step,
               st.train_loss, st.grad_norm);
    }
    state_get_(t, r);
    r->dev[1] = trainer_device_bytes(t);
    if (save) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir_, save);
        if (ERR_INTO(err, trainer_save(t, path, &err_)) < 0) {
            fprintf(stderr, "trainer_save: %s\n", err);
            exit(1);
        }
    }
    trainer_free(t);
}

/* The initial weights w0 (n0 floats: the globals and the pseudo phase's
 * one slot) as the real phase lays them out (n floats: the globals, then
 * the slot once per layer, as the delink copies it): malloc'd. */
static float *w0_real_(const float *w0, size_t n0, size_t n, int L)
{
    size_t ss = (n - n0) / (size_t)(L - 1), ng = n0 - ss;
    float *w = malloc(n * sizeof(float));
    if (!w || ng + (size_t)L * ss != n) {
        fprintf(stderr, "weights: out of memory or not %d equal slots\n", L);
        exit(1);
    }
    memcpy(w, w0, ng * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(w + ng + (size_t)l * ss, w0 + ng, ss * sizeof(float));
    return w;
}

/* Normalised L2 error of a's change from w0 against b's (n floats). */
static double update_nerr_(const float *a, const float *b, const float *w0,
                           size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double da = (double)a[i] - w0[i], db = (double)b[i] - w0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    if (!isfinite(num) || den == 0)
        return INFINITY;
    return sqrt(num / den);
}

/* The checks of one case: cuda run g against cpu run c from weights w0. */
static void compare_(const char *name, const run_ *g, const run_ *c,
                     const float *w0)
{
    char what[160];
    double maxd = 0;
    for (int i = 0; i < STEPS; i++) {
        double d = fabs((double)g->loss[i] - c->loss[i]);
        maxd = isfinite(d) && d <= maxd ? maxd : d;
    }
    snprintf(what, sizeof what, "%s: max |loss cuda - loss cpu|", name);
    check_(maxd <= TOL_LOSS, what, maxd, 0, TOL_LOSS);
    snprintf(what, sizeof what, "%s: weights' change, nerr", name);
    double e = g->n[0] == c->n[0] ? update_nerr_(g->buf[0], c->buf[0], w0,
                                                 g->n[0])
                                  : INFINITY;
    check_(e <= TOL_UPDATE, what, e, 0, TOL_UPDATE);
    static const char *buf_name[3] = {"", "first moment", "second moment"};
    for (int i = 1; i < 3; i++) {
        snprintf(what, sizeof what, "%s: %s floats", name, buf_name[i]);
        check_(g->n[i] == c->n[i], what, (double)g->n[i], (double)c->n[i], 0);
        if (g->n[i] != c->n[i] || g->n[i] == 0)
            continue;
        snprintf(what, sizeof what, "%s: %s, nerr", name, buf_name[i]);
        e = nerr_(g->buf[i], c->buf[i], g->n[i]);
        check_(e <= TOL_STATE, what, e, 0, TOL_STATE);
    }
    snprintf(what, sizeof what, "%s: step counts equal", name);
    check_true_(g->n_steps == c->n_steps &&
                    !memcmp(g->steps, c->steps,
                            (size_t)g->n_steps * sizeof(long)),
                what);
}

/* The cuda run g's device bytes in each phase against the planner's
 * prediction for spec s (offload_plan_for_spec: what gpt_cuda allocates
 * for all-resident slots, cuBLASLt's workspace aside). */
static void plan_check_(const run_spec *s, const run_ *g, const char *name)
{
    char err[512], what[160];
    offload_plan p;
    if (offload_plan_for_spec(s, 0, &p, err, sizeof err) != 0) {
        printf("  offload_plan_for_spec: %s\n", err);
        check_true_(0, "the planner plans the spec");
        return;
    }
    const offload_plan *ph[2] = {p.pseudo, &p};
    static const char *phase[2] = {"pseudo", "real"};
    for (int i = 0; i < 2; i++) {
        size_t want = ph[i] ? ph[i]->peak_device_bytes - ph[i]->workspace_bytes
                            : 0;
        snprintf(what, sizeof what, "%s: %s device bytes vs the plan", name,
                 phase[i]);
        check_(g->dev[i] == want, what, (double)g->dev[i], (double)want, 0);
    }
    offload_plan_free(&p);
}

/* The checkpoint `name` loads into a fresh trainer of spec s with its
 * state bitwise want's. */
static void load_check_(const run_spec *s, const char *name,
                        const run_ *want, const char *what)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    trainer *t = fixture_create_or_exit(s);
    int ok = ERR_INTO(err, trainer_load(t, path, &err_)) == 0;
    if (!ok)
        printf("  trainer_load: %s\n", err);
    run_ got;
    memset(&got, 0, sizeof got);
    if (ok)
        state_get_(t, &got);
    for (int i = 0; ok && i < 3; i++)
        ok = got.n[i] == want->n[i] &&
             !memcmp(got.buf[i], want->buf[i], want->n[i] * sizeof(float));
    ok = ok && got.n_steps == want->n_steps &&
         !memcmp(got.steps, want->steps, (size_t)got.n_steps * sizeof(long));
    check_true_(ok, what);
    if (got.buf[0])
        run_free_(&got);
    trainer_free(t);
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
    char err[512];

    printf("0. the spec\n");
    run_spec sb = spec_(BACKEND_CUDA, 0.0f, 1.0f, DELINK_OPT_COPY);
    int ok = ERR_INTO(err, trainer_check_spec(&sb, &err_)) == 0;
    if (!ok)
        printf("  trainer_check_spec: %s\n", err);
    check_true_(ok, "adafactor on cuda accepted");
    sb.device.memory_budget = (size_t)64 << 20;
    ok = ERR_INTO(err, trainer_check_spec(&sb, &err_)) != 0 &&
         strstr(err, "device.memory_budget") && strstr(err, "Adafactor");
    printf("  (%s)\n", err);
    check_true_(ok, "with a memory budget: refused, naming it");

    static const struct {
        const char *name;
        float beta1, clip;
        delink_optimizer dopt;
        int moe;
    } cases[NCASES] = {
        {"A beta1 0", 0.0f, 1.0f, DELINK_OPT_COPY, 0},
        {"B beta1 0.9, reset", 0.9f, 1.0f, DELINK_OPT_RESET, 0},
        {"C d 0.25", 0.0f, 0.25f, DELINK_OPT_COPY, 0},
        {"D MoE", 0.9f, 1.0f, DELINK_OPT_COPY, 1},
    };
    run_ g[NCASES], c[NCASES];
    float *w0[NCASES];
    for (int k = 0; k < NCASES; k++) {
        printf("%d. %s: %d steps, delink at %d\n", k + 1, cases[k].name,
               STEPS, STEPS / 2);
        run_spec sg = spec_(BACKEND_CUDA, cases[k].beta1, cases[k].clip,
                            cases[k].dopt);
        if (cases[k].moe) /* capacity factor 2: few tokens dropped, so
                           * that a route bf16 flips moves little */
            synth_cuda_moe(&sg, 1, 2.0f);
        run_spec sc = sg;
        sc.device.backend = BACKEND_CPU;
        size_t n0;
        train_(&sg, &g[k], &w0[k], &n0, k == 1 ? "cuda-b" : NULL);
        /* the start in the real phase's layout */
        float *w = w0_real_(w0[k], n0, g[k].n[0], sg.model.n_layer);
        free(w0[k]);
        w0[k] = w;
        train_(&sc, &c[k], NULL, NULL, NULL);
        compare_(cases[k].name, &g[k], &c[k], w0[k]);
        if (k != 2) /* without and with a first moment, MoE slots */
            plan_check_(&sg, &g[k], cases[k].name);
        if (k == 1) {
            load_check_(&sg, "cuda-b", &g[k],
                        "B: cuda checkpoint into cuda, state bitwise");
            load_check_(&sc, "cuda-b", &g[k],
                        "B: cuda checkpoint into cpu, state bitwise");
            refuse_check_(&sg, "cuda-b");
        }
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
