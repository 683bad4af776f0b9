/*
 * test_trainer.c — a device.backend "cuda" run through the trainer API
 * (issue #4), on synthetic shards, against the same run on the CPU.
 * Exit 0 passed, 1 failed, 77 no CUDA device.
 *
 *  1. trainer_check_spec accepts the cuda spec; trainer_device_bytes > 0 and
 *     grows at delink.
 *  2. 20 steps with a delink at step 10 (as the coordinator does it: when
 *     the step count reaches pseudo.steps): every loss finite, the last
 *     below the first; 1 slot -> L slots; the loss of a fixed validation
 *     batch unchanged by delink (TOL_DELINK).
 *  3. The same spec on the CPU backend (same initial weights, batches and
 *     LR schedule): every step's loss within TOL_LOSS.
 *  4. Save at step 15, go on to 20; a fresh cuda trainer that loads the
 *     checkpoint gives bitwise the same losses for steps 16..20.
 *  5. Checkpoints move between backends: the cuda checkpoint loads into a
 *     CPU trainer with weights, moments and step counts bitwise the GPU's
 *     fp32 state; the CPU run's step-15 checkpoint loads on the GPU, and the
 *     GPU's losses for steps 16..20 from there are within TOL_LOSS of the
 *     CPU's.
 *
 * Tolerances (those of tests/gpu/test_model.cu, same reasons):
 *  TOL_LOSS 5e-2 nats: the GPU keeps activations, the weights' working copy
 *    and gradients in bf16, the CPU fp32; AdamW normalises each gradient,
 *    so bf16 error in tiny gradients moves weights by up to lr per step.
 *    Here: peak lr 1e-3 after 3 warmup steps, cosine to 1e-4 at step 20.
 *  TOL_DELINK 1e-6 nats: delink copies the bits of every slot; the margin
 *    only covers cuBLASLt choosing another algorithm for moved buffers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpt_cuda.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../common/synth_data.h"

#define TOL_LOSS 5e-2
#define TOL_DELINK 1e-6

#define STEPS 20
#define DELINK_AT 10
#define SAVE_AT 15

static char dir_[256];
static int n_failed;

static void check_(int ok, const char *what, double a, double b, double tol)
{
    printf("  %-48s %.6f vs %.6f (tol %.0e) %s\n", what, a, b, tol,
           ok ? "ok" : "FAIL");
    n_failed += !ok;
}

static void check_true_(int ok, const char *what)
{
    printf("  %-48s %s\n", what, ok ? "ok" : "FAIL");
    n_failed += !ok;
}

static run_spec spec_(backend_kind backend)
{
    run_spec s;
    spec_defaults(&s);
    synth_spec_data(&s, dir_);
    /* head size 32 and n_embd % 8 == 0: a shape gpt_cuda supports */
    s.model = (model_config){.vocab_size = 256, .n_layer = 3, .n_head = 2,
                             .n_embd = 64, .seq_len = 64};
    s.pseudo.share_groups = 1;
    s.pseudo.steps = DELINK_AT;
    s.train.steps = STEPS;
    s.train.batch_size = 4;
    s.train.grad_accum = 2;
    s.train.lr = 1e-3f;
    s.train.min_lr = 1e-4f;
    s.train.warmup_steps = 3;
    s.train.eval_every = DELINK_AT;
    s.train.eval_batches = 2;
    s.device.backend = backend;
    return s;
}

static trainer *create_(const run_spec *s)
{
    char err[512];
    trainer *t = trainer_create(s, err, sizeof err);
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        exit(1);
    }
    return t;
}

/* Steps until `until`, delinking when the step count reaches pseudo.steps
 * (probe losses of val batch 0 around it into probe[0..1] when given);
 * losses[step-1]. 0, or -1 after printing the error. */
static int run_(trainer *t, const run_spec *s, long until, float *losses,
                float *probe)
{
    char err[512];
    while (trainer_step_count(t) < until) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == s->pseudo.steps) {
            if (probe)
                probe[0] = trainer_probe_loss(t, 0);
            if (trainer_delink(t, err, sizeof err) != 0) {
                fprintf(stderr, "trainer_delink: %s\n", err);
                return -1;
            }
            if (probe)
                probe[1] = trainer_probe_loss(t, 0);
        }
        step_result r;
        if (trainer_step(t, &r, err, sizeof err) != 0) {
            fprintf(stderr, "trainer_step: %s\n", err);
            return -1;
        }
        losses[r.step - 1] = r.train_loss;
        printf("    %s step %2ld  loss %.6f  norm %.4f  lr %.2e%s\n",
               s->device.backend == BACKEND_CUDA ? "cuda" : "cpu ", r.step,
               r.train_loss, r.grad_norm, r.lr, isnan(r.val_loss) ? "" : "  (eval)");
    }
    return 0;
}

static int save_(trainer *t, const char *name)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    if (trainer_save(t, path, err, sizeof err) < 0) {
        fprintf(stderr, "trainer_save: %s\n", err);
        return -1;
    }
    return 0;
}

static int load_(trainer *t, const char *name)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    if (trainer_load(t, path, err, sizeof err) != 0) {
        fprintf(stderr, "trainer_load: %s\n", err);
        return -1;
    }
    return 0;
}

/* The three state buffers and the step counts, concatenated. */
typedef struct {
    float *buf[3];
    size_t n;
    long steps[64];
    int n_steps;
} state_;

static void state_get_(trainer *t, state_ *st)
{
    st->n = trainer_copy_state(t, 0, NULL);
    for (int i = 0; i < 3; i++) {
        st->buf[i] = malloc(st->n * sizeof(float));
        if (!st->buf[i]) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        trainer_copy_state(t, i, st->buf[i]);
    }
    st->n_steps = trainer_copy_adam_steps(t, st->steps);
}

static int state_equal_(const state_ *a, const state_ *b)
{
    if (a->n != b->n || a->n_steps != b->n_steps ||
        memcmp(a->steps, b->steps, (size_t)a->n_steps * sizeof(long)))
        return 0;
    for (int i = 0; i < 3; i++)
        if (memcmp(a->buf[i], b->buf[i], a->n * sizeof(float)))
            return 0;
    return 1;
}

static void state_free_(state_ *st)
{
    for (int i = 0; i < 3; i++)
        free(st->buf[i]);
}

static double max_diff_(const float *a, const float *b, int from, int to)
{
    double m = 0;
    for (int i = from; i < to; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!isfinite(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}

int main(void)
{
    const char *why = "";
    if (gpt_cuda_device_count(&why) < 1) {
        printf("test_trainer: SKIP: no CUDA device (%s)\n", why);
        return 77;
    }
    snprintf(dir_, sizeof dir_, "/tmp/m6-gpu-trainer.XXXXXX");
    if (synth_shards(dir_, 40000) != 0) {
        fprintf(stderr, "test_trainer: cannot make temporary data\n");
        return 1;
    }
    run_spec sg = spec_(BACKEND_CUDA), sc = spec_(BACKEND_CPU);
    char err[512];
    float lg[STEPS], lc[STEPS], lr[STEPS], lx[STEPS], probe[2] = {0, 0};

    printf("1. submit check, device memory\n");
    int ok = trainer_check_spec(&sg, err, sizeof err) == 0;
    if (!ok)
        printf("  trainer_check_spec: %s\n", err);
    check_true_(ok, "trainer_check_spec accepts the cuda spec");
    trainer *tg = create_(&sg);
    size_t bytes_pseudo = trainer_device_bytes(tg);
    printf("  device bytes, pseudo phase: %zu\n", bytes_pseudo);
    check_true_(bytes_pseudo > 0, "trainer_device_bytes > 0");

    printf("2. cuda: %d steps, delink at %d, save at %d\n", STEPS, DELINK_AT,
           SAVE_AT);
    state_ g15;
    if (run_(tg, &sg, SAVE_AT, lg, probe) != 0 || save_(tg, "cuda-15") != 0)
        return 1;
    state_get_(tg, &g15);
    if (run_(tg, &sg, STEPS, lg, NULL) != 0)
        return 1;
    int finite = 1;
    for (int i = 0; i < STEPS; i++)
        finite &= isfinite(lg[i]);
    check_true_(finite, "every loss finite");
    check_(lg[STEPS - 1] < lg[0], "loss decreases (last vs first)",
           lg[STEPS - 1], lg[0], 0);
    check_true_(trainer_phase(tg) == PHASE_REAL &&
                trainer_delink_step(tg) == DELINK_AT &&
                trainer_n_slots(tg) == sg.model.n_layer,
                "delinked at step 10 to L slots");
    check_(fabs(probe[1] - probe[0]) <= TOL_DELINK,
           "probe loss after vs before delink", probe[1], probe[0],
           TOL_DELINK);
    size_t bytes_real = trainer_device_bytes(tg);
    printf("  device bytes, real phase: %zu\n", bytes_real);
    check_true_(bytes_real > bytes_pseudo, "device bytes grow at delink");
    trainer_free(tg);

    printf("3. cpu: the same spec\n");
    trainer *tc = create_(&sc);
    check_true_(trainer_device_bytes(tc) == 0, "cpu: trainer_device_bytes 0");
    state_ c15;
    if (run_(tc, &sc, SAVE_AT, lc, NULL) != 0 || save_(tc, "cpu-15") != 0)
        return 1;
    state_get_(tc, &c15);
    if (run_(tc, &sc, STEPS, lc, NULL) != 0)
        return 1;
    trainer_free(tc);
    for (int i = 0; i < STEPS; i++)
        printf("    step %2d  cpu %.6f  cuda %.6f  |d| %.2e\n", i + 1, lc[i],
               lg[i], fabs(lc[i] - lg[i]));
    check_(max_diff_(lg, lc, 0, STEPS) <= TOL_LOSS,
           "max |loss cuda - loss cpu| over 20 steps",
           max_diff_(lg, lc, 0, STEPS), 0, TOL_LOSS);

    printf("4. cuda: load the step-15 checkpoint, resume\n");
    tg = create_(&sg);
    if (load_(tg, "cuda-15") != 0)
        return 1;
    check_true_(trainer_step_count(tg) == SAVE_AT &&
                trainer_phase(tg) == PHASE_REAL &&
                trainer_n_slots(tg) == sg.model.n_layer,
                "step, phase and slots restored");
    memcpy(lr, lg, sizeof lr);
    if (run_(tg, &sg, STEPS, lr, NULL) != 0)
        return 1;
    trainer_free(tg);
    check_true_(memcmp(lr + SAVE_AT, lg + SAVE_AT,
                       (STEPS - SAVE_AT) * sizeof(float)) == 0,
                "steps 16..20 bitwise equal after resume");
    printf("  (max |d| over steps 16..20: %.3g)\n",
           max_diff_(lr, lg, SAVE_AT, STEPS));

    printf("5. checkpoints across backends\n");
    state_ s;
    tc = create_(&sc);
    ok = load_(tc, "cuda-15") == 0;
    check_true_(ok, "cuda checkpoint loads on the cpu");
    if (ok) {
        state_get_(tc, &s);
        check_true_(state_equal_(&s, &g15),
                    "cpu state bitwise the gpu's fp32 state");
        state_free_(&s);
    }
    trainer_free(tc);
    tg = create_(&sg);
    ok = load_(tg, "cpu-15") == 0;
    check_true_(ok, "cpu checkpoint loads on the gpu");
    if (ok) {
        state_get_(tg, &s);
        check_true_(state_equal_(&s, &c15),
                    "gpu state bitwise the cpu's state");
        state_free_(&s);
        memcpy(lx, lc, sizeof lx);
        if (run_(tg, &sg, STEPS, lx, NULL) != 0)
            return 1;
        check_(max_diff_(lx, lc, SAVE_AT, STEPS) <= TOL_LOSS,
               "from the cpu checkpoint: max |cuda - cpu| 16..20",
               max_diff_(lx, lc, SAVE_AT, STEPS), 0, TOL_LOSS);
    }
    trainer_free(tg);
    state_free_(&g15);
    state_free_(&c15);

    if (synth_remove(dir_) != 0)
        fprintf(stderr, "test_trainer: could not remove %s\n", dir_);
    printf("test_trainer: %s (%d failed)\n", n_failed ? "FAILED" : "passed",
           n_failed);
    return n_failed ? 1 : 0;
}
