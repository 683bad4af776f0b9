/*
 * test_adafactor.c — Adafactor (kernels/cpu/adafactor.c, gpt_adafactor,
 * the trainer's optimizer.name) against values worked out by hand and a
 * double-precision reference written here from the paper (Shazeer & Stern
 * 2018, Algorithms 4/5, in its sums form), plus what the trainer must do
 * with it: the spec's keys and refusals, a checkpoint round trip that
 * resumes bitwise, another optimizer's checkpoint refused by name, a
 * truncated optimizer file refused, the delink copying or resetting the
 * state per slot, and the state's allocated bytes against AdamW's.
 * torch_adafactor.py checks 10 steps of a whole model against float64.
 */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels.h"
#include "model/gpt.h"
#include "spec/spec.h"
#include "train/trainer.h"

#define FIXTURE_NAME "adafactor"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

static adafactor_hparams hp_(float lr, float beta1, float d)
{
    return (adafactor_hparams){lr, beta1, 0.8f, d, 1e-30f, 1e-3f, 0, 1.0f};
}

/* ------------------------------------------------------------ kernel */

/* At t = 1, beta2 = 0 and the factored moment of a rank-1 g^2 (g[i][j] =
 * a[i] b[j]) is g^2 itself (R C^T / sum R = a^2 b^2 up to eps1), so U =
 * sign(g), RMS(U) = 1: no clipping at d = 1, and the step is lr * sign(g)
 * plus the decay lr * wd * x. Worked out by hand, not by the formula's
 * code. */
static void test_rank1_first_step_is_sign(void **state)
{
    (void)state;
    enum { R = 5, C = 7 };
    float x[R * C], g[R * C], r[R] = {0}, c[C] = {0}, x0[R * C];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            g[i * C + j] = (0.3f + (float)i) * ((j % 2 ? -1.0f : 1.0f) *
                                                (0.1f + 0.2f * (float)j));
            x[i * C + j] = x0[i * C + j] = 0.01f * (float)(i - j);
        }
    adafactor_span sp = {x, g, NULL, r, c, R, C, 0.5f, 1, 0};
    adafactor_hparams h = hp_(0.1f, 0.0f, 1.0f);
    assert_int_equal(adafactor_update_spans(&sp, 1, &h), 0);
    for (int k = 0; k < R * C; k++) {
        double want = x0[k] - 0.1 * (g[k] > 0 ? 1.0 : -1.0) -
                      0.1 * 0.5 * x0[k];
        assert_true(fabs(x[k] - want) < 1e-6);
    }
    /* the row and column means of g^2 at t = 1 */
    double m0 = 0;
    for (int j = 0; j < C; j++)
        m0 += (double)g[j] * g[j] / C;
    assert_true(fabs(r[0] - m0) < 1e-6 * m0);
}

/* A vector at t = 1: vhat = g^2 + eps1, U = sign(g) with RMS 1; with d =
 * 0.5 the clipping halves it: the step is lr * 0.5 * sign(g). With beta1
 * 0.9 the first moment is 0.1 * that, the step too. No decay on vectors
 * is the caller's (span weight_decay 0). */
static void test_vector_clipping_and_first_moment(void **state)
{
    (void)state;
    float x[4] = {1, 2, 3, 4}, g[4] = {0.5f, -2.0f, 1e-3f, -7.0f};
    float v[4] = {0}, m[4] = {0};
    adafactor_span sp = {x, g, NULL, v, NULL, 4, 0, 0.0f, 1, 0};
    adafactor_hparams h = hp_(0.2f, 0.0f, 0.5f);
    assert_int_equal(adafactor_update_spans(&sp, 1, &h), 0);
    const float x0[4] = {1, 2, 3, 4};
    for (int k = 0; k < 4; k++)
        assert_true(fabs(x[k] - (x0[k] - 0.2 * 0.5 * (g[k] > 0 ? 1 : -1)))
                    < 1e-6);
    float y[4] = {1, 2, 3, 4}, w[4] = {0};
    sp = (adafactor_span){y, g, m, w, NULL, 4, 0, 0.0f, 1, 0};
    h = hp_(0.2f, 0.9f, 0.5f);
    assert_int_equal(adafactor_update_spans(&sp, 1, &h), 0);
    for (int k = 0; k < 4; k++) {
        double u = 0.5 * (g[k] > 0 ? 1 : -1);
        assert_true(fabs(m[k] - 0.1 * u) < 1e-7);
        assert_true(fabs(y[k] - (x0[k] - 0.2 * 0.1 * u)) < 1e-6);
    }
}

/* The paper's Algorithm 4 in double, written here with row and column
 * SUMS (vhat = R C^T / 1^T R), first moment, grad_scale, decay. */
static void ref_matrix_(double *x, const float *g, double *R, double *Cc,
                        double *m, int nr, int nc, long t, double lr,
                        double b1, double d, double wd, double gs)
{
    double b2 = 1.0 - pow((double)t, -0.8), eps1 = 1e-30;
    for (int i = 0; i < nr; i++) {
        double s = 0;
        for (int j = 0; j < nc; j++)
            s += (g[i * nc + j] * gs) * (g[i * nc + j] * gs) + eps1;
        R[i] = b2 * R[i] + (1 - b2) * s;
    }
    for (int j = 0; j < nc; j++) {
        double s = 0;
        for (int i = 0; i < nr; i++)
            s += (g[i * nc + j] * gs) * (g[i * nc + j] * gs) + eps1;
        Cc[j] = b2 * Cc[j] + (1 - b2) * s;
    }
    double sr = 0, su = 0;
    for (int i = 0; i < nr; i++)
        sr += R[i];
    double *u = malloc((size_t)nr * nc * sizeof *u);
    assert_non_null(u);
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) {
            double v = R[i] * Cc[j] / sr;
            u[i * nc + j] = g[i * nc + j] * gs / sqrt(v);
            su += u[i * nc + j] * u[i * nc + j];
        }
    double den = fmax(1.0, sqrt(su / (nr * nc)) / d);
    for (int k = 0; k < nr * nc; k++) {
        double uk = u[k] / den;
        if (b1 > 0) {
            m[k] = b1 * m[k] + (1 - b1) * uk;
            uk = m[k];
        }
        x[k] = x[k] - lr * uk - lr * wd * x[k];
    }
    free(u);
}

/* Three steps of a 6 x 9 matrix with gradients of mixed scale, beta1 0.9,
 * grad_scale 0.7, d 0.8 (clipping fires at t = 1, where RMS(U) > 0.8):
 * every weight within 1e-6 relative (of max(|x|, 0.1)) of the double
 * reference. */
static void test_matrix_against_reference(void **state)
{
    (void)state;
    enum { NR = 6, NC = 9, N = NR * NC };
    float x[N], g[N], r[NR] = {0}, c[NC] = {0}, m[N] = {0};
    double xd[N], Rd[NR] = {0}, Cd[NC] = {0}, md[N] = {0};
    uint64_t s = 11;
    for (int k = 0; k < N; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[k] = (float)((double)(s >> 40) / (1 << 24) - 0.5);
        xd[k] = x[k];
    }
    for (long t = 1; t <= 3; t++) {
        for (int k = 0; k < N; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            g[k] = (float)(((double)(s >> 40) / (1 << 24) - 0.5) *
                           (k % 5 == 0 ? 10.0 : 0.1));
        }
        adafactor_span sp = {x, g, m, r, c, NR, NC, 0.1f, t, 0};
        adafactor_hparams h = hp_(0.05f, 0.9f, 0.8f);
        h.grad_scale = 0.7f;
        assert_int_equal(adafactor_update_spans(&sp, 1, &h), 0);
        ref_matrix_(xd, g, Rd, Cd, md, NR, NC, t, 0.05, 0.9, 0.8, 0.1, 0.7);
    }
    double worst = 0;
    for (int k = 0; k < N; k++) {
        double e = fabs(x[k] - xd[k]) / fmax(fabs(xd[k]), 0.1);
        worst = fmax(worst, e);
    }
    printf("matrix: max relative error %.3g after 3 steps\n", worst);
    assert_true(worst < 1e-6);
}

/* Many spans at 1 and at 3 threads: bitwise the same. */
static void test_threads_bitwise(void **state)
{
    (void)state;
    enum { NS = 7, R = 11, C = 13, SPAN = 4 * R * C };
    float *buf[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run ? 3 : 1);
        float *p = calloc((size_t)NS * SPAN, sizeof *p);
        assert_non_null(p);
        buf[run] = p;
        adafactor_span sp[NS];
        for (int k = 0; k < NS; k++) {
            float *x = p + (size_t)k * SPAN;
            /* r: R*C floats, a vector span's moment; a matrix's R row
             * and C column means within them */
            float *g = x + R * C, *m = g + R * C, *r = m + R * C,
                  *c = r + R;
            for (int i = 0; i < R * C; i++) {
                x[i] = 0.01f * (float)((i * 7 + k) % 23) - 0.1f;
                g[i] = 0.001f * (float)((i * 13 + 3 * k) % 31) - 0.015f;
            }
            sp[k] = (adafactor_span){x, g, m, r, k % 2 ? NULL : c,
                                     k % 2 ? R * C : R, k % 2 ? 0 : C,
                                     0.1f, 1, 0};
        }
        adafactor_hparams h = hp_(0.01f, 0.9f, 1.0f);
        for (long t = 1; t <= 3; t++) {
            for (int k = 0; k < NS; k++)
                sp[k].t = t;
            assert_int_equal(adafactor_update_spans(sp, NS, &h), 0);
        }
    }
    assert_memory_equal(buf[0], buf[1],
                        (size_t)NS * SPAN * sizeof(float));
    free(buf[0]);
    free(buf[1]);
    omp_set_num_threads(1);
}

/* ------------------------------------------------------------ spec */

static void test_spec_keys_and_refusals(void **state)
{
    (void)state;
    run_spec s;
    const char *base = "{\"data\": {\"train\": \"t*\", \"val\": \"v*\"}";
    /* an AdamW spec's canonical text, and so its hash, has no optimizer
     * section: the same hash as before the key existed */
    fixture_spec_parse(&s, base, NULL);
    uint64_t h0 = spec_hash(&s);
    char *text = spec_to_json(&s);
    assert_null(strstr(text, "\"optimizer\": {"));
    assert_null(strstr(text, "adamw"));
    free(text);
    fixture_spec_parse(&s, base, "\"optimizer\": {\"name\": \"adamw\"}");
    assert_true(spec_hash(&s) == h0);
    /* adafactor with its defaults */
    fixture_spec_parse(&s, base, "\"optimizer\": {\"name\": \"adafactor\"}");
    assert_int_equal(s.optimizer.name, OPTIMIZER_ADAFACTOR);
    assert_true(s.optimizer.beta1 == 0.0f && s.optimizer.decay_rate == 0.8f &&
                s.optimizer.clip_threshold == 1.0f &&
                s.optimizer.eps1 == 1e-30f && s.optimizer.eps2 == 1e-3f &&
                s.optimizer.scale_parameter == 0);
    assert_true(spec_hash(&s) != h0);
    /* refusals, each naming what is wrong */
    const char *const bad[][2] = {
        {"\"optimizer\": {\"name\": \"adagrad\"}", "optimizer.name"},
        {"\"optimizer\": {\"beta1\": 0.9}", "optimizer"},
        {"\"optimizer\": {\"name\": \"adafactor\", \"beta1\": 1}",
         "optimizer.beta1"},
        {"\"optimizer\": {\"name\": \"adafactor\", \"decay_rate\": 0}",
         "optimizer.decay_rate"},
        {"\"optimizer\": {\"name\": \"adafactor\", \"clip_threshold\": 0}",
         "optimizer.clip_threshold"},
        {"\"optimizer\": {\"name\": \"adafactor\", \"eps1\": 0}",
         "optimizer.eps1"},
        {"\"optimizer\": {\"name\": \"adafactor\"}, \"device\": "
         "{\"memory_budget\": \"1GiB\"}, \"offload\": {\"speculative\": "
         "\"on\"}", "optimizer.name \"adafactor\" with offload.speculative "
         "\"on\" is not supported yet"},
    };
    fixture_spec_refusals(base, bad, sizeof bad / sizeof bad[0]);
    /* on cuda, and offloaded slots get host Adafactor (cpu:
     * test_offload.c; cuda, both at once: tests/gpu/test_adafactor.c) */
    fixture_optimizer_accepted(base, "{\"name\": \"adafactor\"}");
    fixture_spec_parse(&s, base, "\"optimizer\": {\"name\": \"adafactor\"}, "
                       "\"device\": {\"backend\": \"cuda\", "
                       "\"memory_budget\": \"1GiB\"}");
    assert_int_equal(s.optimizer.name, OPTIMIZER_ADAFACTOR);
    assert_true(s.device.memory_budget == (size_t)1 << 30);
}

/* ------------------------------------------------------------ trainer */

static run_spec af_spec_(long steps, long pseudo, float beta1)
{
    run_spec s = synth_tiny_spec(tmpdir_, 3, steps, pseudo);
    s.optimizer.name = OPTIMIZER_ADAFACTOR;
    s.optimizer.beta1 = beta1;
    s.train.lr = 1e-2f;
    s.train.min_lr = 1e-3f;
    s.device.threads = 1;
    return s;
}

/* State buffer `which` of t (trainer_copy_state) and its length. */
static float *state_(trainer *t, int which, size_t *n)
{
    *n = trainer_copy_state(t, which, NULL);
    float *p = malloc((*n ? *n : 1) * sizeof(float));
    assert_non_null(p);
    assert_int_equal(trainer_copy_state(t, which, p), *n);
    return p;
}

/* Save at 12 (after the delink at 6), run on to 20; a trainer loading the
 * checkpoint gives the same losses for 13..20 bitwise and the same state
 * (weights, first and second moment) at 20. With and without m. */
static void test_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    for (int with_m = 0; with_m < 2; with_m++) {
        run_spec s = af_spec_(20, 6, with_m ? 0.9f : 0.0f);
        float a[20];
        char dir[512];
        snprintf(dir, sizeof dir, "%s/af-ckpt-%d", tmpdir_, with_m);
        trainer *t = fixture_trainer(&s);
        fixture_run_steps(t, &s, 12, a, NULL);
        assert_true(fixture_save(t, dir) > 0);
        fixture_resume_same(t, &s, dir, 12, 20, a);
        assert_true(a[19] < a[0]);  /* it learns */
        size_t nm = trainer_copy_state(t, 1, NULL);
        assert_true(with_m ? nm > 0 : nm == 0);
        trainer_free(t);
    }
}

/* An AdamW checkpoint into an Adafactor run, and the reverse: refused by
 * name; init.from the AdamW checkpoint: its weights and a fresh Adafactor.
 * A truncated or a missing optimizer file: refused. */
static void test_other_optimizer_and_truncation_refused(void **state)
{
    (void)state;
    char err[512], dir[2][512], path[600];
    run_spec sp[2] = {synth_tiny_spec(tmpdir_, 3, 10, 0),
                      af_spec_(10, 0, 0.0f)};
    const char *const want[2] = {
        "optimizer \"adafactor\" state and this run uses optimizer.name "
        "\"adamw\"",
        "optimizer \"adamw\" state and this run uses optimizer.name "
        "\"adafactor\""};
    fixture_cross_load_refused(sp, "opt", dir, want);
    /* init.from an AdamW checkpoint: its weights, a fresh Adafactor */
    run_spec si;
    trainer *a, *w;
    fixture_init_from(&sp[1], &sp[0], dir[0], &si, &a, &w);
    size_t na, nw, nv;
    float *pa = state_(a, 0, &na), *pw = state_(w, 0, &nw);
    float *va = state_(a, 2, &nv);
    assert_int_equal(na, nw);
    assert_memory_equal(pa, pw, na * sizeof(float));
    for (size_t i = 0; i < nv; i++)
        assert_true(va[i] == 0.0f);
    fixture_run_steps(a, &si, 3, NULL, NULL);
    free(pa);
    free(pw);
    free(va);
    trainer_free(a);
    trainer_free(w);
    /* truncated: the last 100 bytes of optimizer.safetensors gone */
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir[1]);
    FILE *f = fopen(path, "rb+");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fclose(f);
    assert_int_equal(truncate(path, len - 100), 0);
    trainer *t = fixture_trainer(&sp[1]);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir[1], &err_)), 0);
    assert_non_null(strstr(err, "optimizer.safetensors"));
    trainer_free(t);
    /* missing: the file gone */
    assert_int_equal(unlink(path), 0);
    t = fixture_trainer(&sp[1]);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir[1], &err_)), 0);
    assert_non_null(strstr(err, "optimizer.safetensors"));
    trainer_free(t);
}

/* The delink with delink.optimizer copy: every new slot's second moment
 * (and m) is the pseudo slot's, the step counts too; reset: zero, counts
 * zero. The loss is unchanged by the delink either way. */
static void test_delink_copies_or_resets_state(void **state)
{
    (void)state;
    for (int reset = 0; reset < 2; reset++) {
        run_spec s = af_spec_(10, 4, 0.9f);
        s.delink.optimizer = reset ? DELINK_OPT_RESET : DELINK_OPT_COPY;
        trainer *t = fixture_trainer(&s);
        fixture_run_steps(t, &s, 4, NULL, NULL);
        size_t nv0, nm0;
        float *v0 = state_(t, 2, &nv0), *m0 = state_(t, 1, &nm0);
        fixture_delink_keeps_loss(t, 1, 3);
        size_t nv1, nm1;
        float *v1 = state_(t, 2, &nv1), *m1 = state_(t, 1, &nm1);
        /* af layout: globals then slots; 1 slot before, 3 after */
        size_t vs = nv0 - (nv1 - nv0) / 2, vslot = nv0 - vs;
        size_t ms = nm0 - (nm1 - nm0) / 2, mslot = nm0 - ms;
        assert_int_equal(nv1, vs + 3 * vslot);
        assert_memory_equal(v0, v1, vs * sizeof(float));  /* globals kept */
        assert_memory_equal(m0, m1, ms * sizeof(float));
        long steps[4];
        assert_int_equal(trainer_copy_adam_steps(t, steps), 4);
        for (int k = 0; k < 3; k++) {
            const float *vk = v1 + vs + k * vslot, *mk = m1 + ms + k * mslot;
            if (reset) {
                for (size_t i = 0; i < vslot; i++)
                    assert_true(vk[i] == 0.0f);
                for (size_t i = 0; i < mslot; i++)
                    assert_true(mk[i] == 0.0f);
                assert_int_equal(steps[1 + k], 0);
            } else {
                assert_memory_equal(vk, v0 + vs, vslot * sizeof(float));
                assert_memory_equal(mk, m0 + ms, mslot * sizeof(float));
                assert_int_equal(steps[1 + k], 4);
            }
        }
        /* the state was not all zero before: the copy check can fail */
        int nonzero = 0;
        for (size_t i = 0; i < vslot; i++)
            nonzero |= v0[vs + i] != 0.0f;
        assert_true(nonzero);
        fixture_run_steps(t, &s, 10, NULL, NULL);  /* and trains on */
        free(v0);
        free(v1);
        free(m0);
        free(m1);
        trainer_free(t);
    }
}

/* Optimizer-state bytes as allocated (trainer_optim_bytes: the sizes the
 * model's allocations were made with) on a matrix-heavy model (C 128):
 * Adafactor without m at most 0.1 of AdamW's; the planner's resident
 * bytes (offload_plan: m6ctl plan's) equal to the allocation for both. */
static void test_state_bytes(void **state)
{
    (void)state;
    size_t bytes[2];
    for (int i = 0; i < 2; i++) {
        run_spec s = i ? af_spec_(10, 0, 0.0f)
                       : synth_tiny_spec(tmpdir_, 3, 10, 0);
        s.model.n_embd = 128;
        s.model.n_head = 4;
        trainer *t = fixture_trainer(&s);
        bytes[i] = trainer_optim_bytes(t);
        /* the planner's resident state (m6ctl plan) is the allocation:
         * weights and gradients 8 bytes a float, and the optimizer's */
        size_t floats = trainer_copy_state(t, 0, NULL);
        offload_plan pl;
        char err[256];
        assert_int_equal(offload_plan_for_spec(&s, 0, &pl, err, sizeof err),
                         0);
        assert_int_equal(pl.global_bytes + (size_t)pl.n_slots * pl.slot_bytes,
                         8 * floats + bytes[i]);
        offload_plan_free(&pl);
        trainer_free(t);
    }
    double ratio = (double)bytes[1] / (double)bytes[0];
    printf("optimizer state: AdamW %zu bytes, Adafactor (beta1 0) %zu bytes,"
           " ratio %.4f\n", bytes[0], bytes[1], ratio);
    assert_true(bytes[0] > 0);
    assert_true(ratio <= 0.1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank1_first_step_is_sign),
        cmocka_unit_test(test_vector_clipping_and_first_moment),
        cmocka_unit_test(test_matrix_against_reference),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_spec_keys_and_refusals),
        cmocka_unit_test(test_checkpoint_resume_bitwise),
        cmocka_unit_test(test_other_optimizer_and_truncation_refused),
        cmocka_unit_test(test_delink_copies_or_resets_state),
        cmocka_unit_test(test_state_bytes),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
