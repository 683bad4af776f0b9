/*
 * op_check.cuh — what the GPU op tests share (test_ops.cu, test_moe.cu):
 * random bf16-rounded inputs, host<->device copies in bf16 and fp32,
 * NaN-filled outputs and scratch, and the normalised L2 check with its
 * counters. Header-only, static: each test gets its own copy. The test
 * creates the stream `st` before using the copies.
 */
#ifndef M6_OP_CHECK_CUH
#define M6_OP_CHECK_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kernels_cuda.h"

static int n_checks, n_failed;
static cudaStream_t st;

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x1234567ull;

static float urand_(void) /* [0,1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static float bf_(float x)
{
    return __bfloat162float(__float2bfloat16(x));
}

/* n values uniform in [lo,hi), rounded to bf16 */
static float *hrand_(size_t n, float lo, float hi)
{
    float *p = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = bf_(lo + (hi - lo) * urand_());
    return p;
}

static float *hcopy_(const float *x, size_t n)
{
    float *p = (float *)malloc(n * sizeof(float));
    memcpy(p, x, n * sizeof(float));
    return p;
}

static bf16 *dbf_(const float *h, size_t n) /* device bf16 copy of h */
{
    bf16 *tmp = (bf16 *)malloc(n * sizeof(bf16)), *d;
    for (size_t i = 0; i < n; i++)
        tmp[i] = __float2bfloat16(h[i]);
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemcpy(d, tmp, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

static float *hbf_(const bf16 *d, size_t n) /* host fp32 copy of device bf16 */
{
    bf16 *tmp = (bf16 *)malloc(n * sizeof(bf16));
    float *h = (float *)malloc(n * sizeof(float));
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaMemcpy(tmp, d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        h[i] = __bfloat162float(tmp[i]);
    free(tmp);
    return h;
}

template <typename X> static X *dcopy_(const X *h, size_t n)
{
    X *d;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(X)));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(X), cudaMemcpyHostToDevice));
    return d;
}

template <typename X> static X *hcopy_dev_(const X *d, size_t n)
{
    X *h = (X *)malloc(n * sizeof(X));
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(X), cudaMemcpyDeviceToHost));
    return h;
}

/* Outputs and scratch start as NaN (all bits set, in bf16 and fp32): an
 * op that leaves an element unwritten, or reads scratch it did not write,
 * fails its check instead of passing on a lucky zero or on a buffer that
 * already held the answer. */
template <typename X> static X *dnan_(size_t n) /* int32: all -1 */
{
    X *d;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * sizeof(X)));
    CUDA_CHECK(cudaMemset(d, 0xff, (n ? n : 1) * sizeof(X)));
    return d;
}
static bf16 *dnan_bf16_(size_t n) { return dnan_<bf16>(n); }
static float *dnan_f32_(size_t n) { return dnan_<float>(n); }

/* ||got - want|| / ||want||; inf when got has a non-finite value. If base
 * is given, both are compared as increments over base. */
static double nerr_(const float *got, const float *want, const float *base,
                    size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        double b = base ? base[i] : 0.0;
        double d = ((double)got[i] - b) - ((double)want[i] - b);
        num += d * d;
        den += ((double)want[i] - b) * ((double)want[i] - b);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_(const char *what, const float *got, const float *want,
                   const float *base, size_t n, double tol)
{
    double e = nerr_(got, want, base, n);
    int ok = e <= tol;
    n_checks++;
    n_failed += !ok;
    printf("  %-34s nerr %.3e (tol %.0e) %s\n", what, e, tol,
           ok ? "ok" : "FAIL");
}

static void check_true_(const char *what, int ok)
{
    n_checks++;
    n_failed += !ok;
    printf("  %-34s %s\n", what, ok ? "ok" : "FAIL");
}

#endif /* M6_OP_CHECK_CUH */
