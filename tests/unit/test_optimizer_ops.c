/*
 * test_optimizer_ops.c — unit tests of the optimizer's CPU ops: AdamW
 * (kernels.h) against its formula in double over three steps and a step
 * worked out on paper, grad_sumsq against a long double sum (same bits
 * for 1 and 2 threads), and the offloaded slots' host loops
 * (offload_host.h): bf16 rounding by hand, gradient accumulation, sums of
 * squares, AdamW with the bf16 working copy, and AdamW on bf16 masters
 * against the CPU op.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "offload_host.h"
#include "../common/rand_fill.h"
#include "../common/test_main.h"

/* ---------------------------------------------------------------- AdamW */

/* One AdamW step of one parameter in double (the formula of kernels.h),
 * g already scaled: the reference of test_adamw and test_host_adamw. */
static void adamw_ref_(double *p, double *m, double *v, double g, float lr,
                       float b1, float b2, float eps, float wd, int t)
{
    *m = (double)b1 * *m + (1.0 - (double)b1) * g;
    *v = (double)b2 * *v + (1.0 - (double)b2) * g * g;
    double mhat = *m / (1.0 - pow(b1, t)), vhat = *v / (1.0 - pow(b2, t));
    *p -= (double)lr * (mhat / (sqrt(vhat) + eps) + (double)wd * *p);
}

/* Three steps over a few scalars against the formula of kernels.h in double,
 * with bias correction, weight decay and grad_scale. fp32 rounding of m, v,
 * sqrt and the update: relative error ~1e-7 of the parameter; 1e-6. */
static void test_adamw(void **state)
{
    enum { NP = 5, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const float gscale = 0.5f;
    float p[NP] = { 0.5f, -1.25f, 2.0f, 0.0f, -0.03125f };
    float m[NP] = { 0 }, v[NP] = { 0 };
    float grads[STEPS][NP] = {
        { 0.1f, -0.2f, 0.3f, 1.0f, 0.0f },
        { -0.4f, 0.05f, 0.3f, 1.0f, 2.0f },
        { 0.2f, 0.2f, -0.6f, -1.0f, 0.5f },
    };
    double pd[NP], md[NP] = { 0 }, vd[NP] = { 0 };
    for (int i = 0; i < NP; i++) pd[i] = p[i];

    for (int t = 1; t <= STEPS; t++) {
        adamw_update(p, grads[t - 1], m, v, NP, lr, b1, b2, eps, wd, gscale, t);
        for (int i = 0; i < NP; i++)
            adamw_ref_(&pd[i], &md[i], &vd[i], (double)grads[t - 1][i] * gscale,
                       lr, b1, b2, eps, wd, t);
        for (int i = 0; i < NP; i++) {
            printf("    t=%d p[%d] %.9f want %.9f\n", t, i, p[i], pd[i]);
            assert_true(fabs(p[i] - pd[i]) <= 1e-6 * (1.0 + fabs(pd[i])));
            assert_true(fabs(m[i] - md[i]) <= 1e-6 * (1e-3 + fabs(md[i])));
            assert_true(fabs(v[i] - vd[i]) <= 1e-6 * (1e-6 + fabs(vd[i])));
        }
    }
    /* a plain number worked out on paper: step 1 with g = 0.1*0.5, p = 0.5:
     * mhat = 0.05, vhat = 0.0025, update = 0.01*(0.05/0.05 + 0.1*0.5) */
    float q = 0.5f, gq = 0.1f, mq = 0, vq = 0;
    adamw_update(&q, &gq, &mq, &vq, 1, lr, b1, b2, 0.0f, wd, gscale, 1);
    assert_true(fabs(q - (0.5 - 0.01 * 1.05)) < 1e-7);
    (void)state;
}

static void test_grad_sumsq(void **state)
{
    rng_seed(9);
    enum { NG = 100003 };
    float *g = falloc(NG);
    fill(g, NULL, NG, -3, 3);
    long double want = 0.0L;
    for (int i = 0; i < NG; i++) want += (long double)g[i] * g[i];
    double got = grad_sumsq(g, NG);
    printf("    grad_sumsq %.17g want %.17Lg\n", got, want);
    assert_true(fabsl(got - want) <= 1e-12L * want);
    /* small and empty buffers */
    float three[3] = { 1, 2, -2 };
    assert_true(grad_sumsq(three, 3) == 9.0);
    assert_true(grad_sumsq(three, 0) == 0.0);
    /* same bits for 1 and 2 threads */
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    double one = grad_sumsq(g, NG);
    omp_set_num_threads(2);
    double two = grad_sumsq(g, NG);
    omp_set_num_threads(nt);
    assert_true(memcmp(&one, &two, sizeof one) == 0);
    free(g);
    (void)state;
}

/* ------------------------------------------- offloaded slots' host side */

static uint32_t f32_bits_(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float f32_of_bits_(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* bf16 rounding by hand: ties go to the even 16-bit pattern, just above a
 * tie rounds up, the largest float rounds to infinity, NaN stays NaN. */
static void test_bf16_convert(void **state)
{
    static const struct { uint32_t in; uint16_t want; } cases[] = {
        { 0x3f800000u, 0x3f80 },  /* 1.0 */
        { 0x3f808000u, 0x3f80 },  /* 1 + 2^-8: a tie, 0x3f80 is even */
        { 0x3f818000u, 0x3f82 },  /* a tie above odd 0x3f81: up to even */
        { 0x3f808001u, 0x3f81 },  /* just above the tie */
        { 0x3f807fffu, 0x3f80 },  /* just below */
        { 0x80000000u, 0x8000 },  /* -0 */
        { 0x7f7fffffu, 0x7f80 },  /* FLT_MAX -> +inf */
        { 0xff800000u, 0xff80 },  /* -inf */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint16_t got = bf16_from_f32(f32_of_bits_(cases[k].in));
        printf("    bf16(%08x) = %04x want %04x\n", cases[k].in, got,
               cases[k].want);
        assert_int_equal(got, cases[k].want);
        assert_int_equal(f32_bits_(bf16_to_f32(cases[k].want)),
                         (uint32_t)cases[k].want << 16);
    }
    uint16_t nan = bf16_from_f32(f32_of_bits_(0x7f800001u));
    assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0);
    assert_true(isnan(bf16_to_f32(nan)));
    (void)state;
}

/* host_grad_accumulate: a copy, then sums, against fp32 sums by hand on
 * values (multiples of 2^-10) whose sums are exact; host_sumsq_* against a
 * long double sum, for lengths around the 8 lanes. */
static void test_host_grad(void **state)
{
    enum { NG = 1003 };
    uint16_t *g = malloc(NG * sizeof *g);
    float *acc = falloc(NG), *x = falloc(NG);
    for (int i = 0; i < NG; i++)
        g[i] = bf16_from_f32((float)((i % 37) - 18) / 1024.0f);
    for (int i = 0; i < NG; i++) acc[i] = 1e9f; /* overwritten */
    host_grad_accumulate(acc, g, NG, 0);
    host_grad_accumulate(acc, g, NG, 1);
    host_grad_accumulate(acc, g, NG, 1);
    for (int i = 0; i < NG; i++)
        assert_true(acc[i] == 3.0f * (float)((i % 37) - 18) / 1024.0f);

    rng_seed(11);
    fill(x, NULL, NG, -3, 3);
    static const size_t lens[] = { 0, 1, 7, 8, 9, 17, 1003 };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        size_t n = lens[k];
        long double want = 0.0L, want16 = 0.0L;
        for (size_t i = 0; i < n; i++) {
            want += (long double)x[i] * x[i];
            long double w = bf16_to_f32(g[i]);
            want16 += w * w;
        }
        double got = host_sumsq_f32(x, n), got16 = host_sumsq_bf16(g, n);
        printf("    n=%zu sumsq %.17g want %.17Lg; bf16 %.17g want %.17Lg\n",
               n, got, want, got16, want16);
        assert_true(fabsl(got - want) <= 1e-13L * want);
        assert_true(fabsl(got16 - want16) <= 1e-13L * want16);
    }
    free(g);
    free(acc);
    free(x);
    (void)state;
}

/* host_adamw_bf16 over three steps against the formula in double (as
 * test_adamw), with the gradient in fp32 and in bf16 (values exact in
 * bf16, so both runs see the same numbers); w must be bf16 of the master
 * after every step. */
static void test_host_adamw(void **state)
{
    enum { NP = 5, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const float gscale = 0.5f;
    const float grads[STEPS][NP] = {
        { 0.125f, -0.25f, 0.375f, 1.0f, 0.0f },
        { -0.5f, 0.0625f, 0.375f, 1.0f, 2.0f },
        { 0.25f, 0.25f, -0.75f, -1.0f, 0.5f },
    };
    for (int as_bf16 = 0; as_bf16 <= 1; as_bf16++) {
        float p[NP] = { 0.5f, -1.25f, 2.0f, 0.0f, -0.03125f };
        float m[NP] = { 0 }, v[NP] = { 0 };
        uint16_t w[NP], g16[NP];
        double pd[NP], md[NP] = { 0 }, vd[NP] = { 0 };
        for (int i = 0; i < NP; i++) pd[i] = p[i];
        for (int t = 1; t <= STEPS; t++) {
            for (int i = 0; i < NP; i++) g16[i] = bf16_from_f32(grads[t - 1][i]);
            host_adamw_bf16(p, m, v, w, as_bf16 ? NULL : grads[t - 1], g16,
                            NP, lr, b1, b2, eps, wd, gscale, t);
            for (int i = 0; i < NP; i++) {
                adamw_ref_(&pd[i], &md[i], &vd[i],
                           (double)grads[t - 1][i] * gscale, lr, b1, b2, eps,
                           wd, t);
                printf("    %s t=%d p[%d] %.9f want %.9f\n",
                       as_bf16 ? "bf16" : "fp32", t, i, p[i], pd[i]);
                assert_true(fabs(p[i] - pd[i]) <= 1e-6 * (1.0 + fabs(pd[i])));
                assert_true(fabs(m[i] - md[i]) <= 1e-6 * (1e-3 + fabs(md[i])));
                assert_true(fabs(v[i] - vd[i]) <= 1e-6 * (1e-6 + fabs(vd[i])));
                assert_int_equal(w[i], bf16_from_f32(p[i]));
            }
        }
    }
    float master[3] = { 1.0f, -2.5f, 1.00390625f };
    uint16_t w3[3];
    host_to_bf16(w3, master, 3);
    assert_int_equal(w3[0], 0x3f80);
    assert_int_equal(w3[1], 0xc020);
    assert_int_equal(w3[2], 0x3f80);
    (void)state;
}

/* host_adamw_sr_bf16 (bf16 masters of an offloaded cuda slot) against the
 * CPU op, adamw_update_spans with the tensor's sr_key: three steps of a
 * tensor of N weights (bf16 values) that the host updates in two chunks,
 * the second with sr_base at its first element, the gradient in fp32 and
 * then in bf16: the same weights (bitwise: the same rounding decisions
 * from the same bits) and moments. */
static void test_host_adamw_sr(void **state)
{
    enum { N = 1000, K = 377, STEPS = 3 };
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const float gscale = 0.75f;
    const uint64_t key = sr_span_key(1234, 2, 4096);
    float *p = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    float *m = calloc(N, sizeof(float)), *v = calloc(N, sizeof(float));
    float *hm = calloc(N, sizeof(float)), *hv = calloc(N, sizeof(float));
    uint16_t *w = malloc(N * sizeof(uint16_t)), *g16 = malloc(N * 2);
    assert_true(p && g && m && v && hm && hv && w && g16);
    for (int as_bf16 = 0; as_bf16 <= 1; as_bf16++) {
        rng_seed(7 + (uint64_t)as_bf16);
        for (int i = 0; i < N; i++) {
            w[i] = bf16_from_f32(rng_float(-1.0f, 1.0f));
            p[i] = bf16_to_f32(w[i]);
        }
        memset(m, 0, N * sizeof(float));
        memset(v, 0, N * sizeof(float));
        memset(hm, 0, N * sizeof(float));
        memset(hv, 0, N * sizeof(float));
        for (long t = 1; t <= STEPS; t++) {
            for (int i = 0; i < N; i++) {
                g16[i] = bf16_from_f32(rng_float(-0.5f, 0.5f));
                g[i] = bf16_to_f32(g16[i]); /* both forms the same values */
            }
            adamw_span sp = {p, g, m, v, N, wd, t, key, 0};
            adamw_update_spans(&sp, 1, lr, b1, b2, eps, gscale);
            const float *g32 = as_bf16 ? NULL : g;
            host_adamw_sr_bf16(w, hm, hv, g32, g16, K, lr, b1, b2, eps, wd,
                               gscale, t, key, 0);
            host_adamw_sr_bf16(w + K, hm + K, hv + K, g32 ? g32 + K : NULL,
                               g16 + K, N - K, lr, b1, b2, eps, wd, gscale,
                               t, key, K);
            for (int i = 0; i < N; i++) {
                assert_int_equal(w[i], bf16_from_f32(p[i]));
                assert_true(bf16_to_f32(w[i]) == p[i]); /* a bf16 value */
                assert_memory_equal(&hm[i], &m[i], sizeof(float));
                assert_memory_equal(&hv[i], &v[i], sizeof(float));
            }
        }
    }
    free(p);
    free(g);
    free(m);
    free(v);
    free(hm);
    free(hv);
    free(w);
    free(g16);
    (void)state;
}

TEST_MAIN(
    cmocka_unit_test(test_host_adamw_sr),
    cmocka_unit_test(test_adamw),
    cmocka_unit_test(test_grad_sumsq),
    cmocka_unit_test(test_bf16_convert),
    cmocka_unit_test(test_host_grad),
    cmocka_unit_test(test_host_adamw))
