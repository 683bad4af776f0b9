/*
 * matmul.c — fully connected layer, CPU reference, GEMMs through CBLAS:
 *   out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
 *   dinp (N,C)     += dout (N,OC) @ weight (OC,C)
 *   dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
 *   dbias (OC)     += sum over rows of dout
 * Accumulation uses sgemm's beta = 1. The bias is added by pre-filling out
 * and running the forward GEMM with beta = 1 (no extra pass over out).
 *
 * Threading: the output of each GEMM is cut into one column (or row) block
 * per OpenMP thread and each thread runs a single-threaded sgemm on its
 * block. OpenBLAS's own thread pool is set to 1 thread on first use: two
 * pools (OpenMP for the other kernels, OpenBLAS for GEMMs) busy-waiting on
 * the same cores starved each other (GEMMs fell to a third of peak between
 * OpenMP regions). Every output element is computed by one sgemm call with
 * a block layout fixed by the thread count: deterministic for a given count.
 *
 * The _gelu forms fuse the MLP's GELU into the GEMM's parallel region: each
 * thread applies it (forward) or its derivative (backward, to the input
 * gradient) on the block it has just computed; no extra region or pass.
 */
#include <string.h>
#include <omp.h>
#include "kernels.h"
#include "cpu_math.h"

/* -DM6_NO_CBLAS replaces sgemm by plain loops (slow, same results up to
 * summation order) for machines without a BLAS, e.g. the GPU check
 * (bench/gpu-check.sh) that builds the CPU model as a reference with gcc. */
#ifndef M6_NO_CBLAS
#include <cblas.h>
#else
enum { CblasRowMajor, CblasNoTrans, CblasTrans };
static void openblas_set_num_threads(int n) { (void)n; }
/* Runs inside one OpenMP thread's block, like the single-threaded BLAS. */
static void cblas_sgemm(int order, int ta, int tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *Cm, int ldc)
{
    (void)order;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = ta == CblasTrans ? A[(size_t)k * lda + i]
                                           : A[(size_t)i * lda + k];
                float b = tb == CblasTrans ? B[(size_t)j * ldb + k]
                                           : B[(size_t)k * ldb + j];
                s += a * b;
            }
            float *c = Cm + (size_t)i * ldc + j;
            *c = alpha * s + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}
#endif

#define MM_ALIGN 16     /* block edges on multiples of 16 floats */

/* OpenBLAS runs inside our OpenMP threads, one thread each */
static void blas_single_thread_(void)
{
    static int done;
    if (!done) {
        openblas_set_num_threads(1);
        done = 1;
    }
}

/* [*lo, *hi) = block `part` of `nparts` over [0, n), edges aligned */
static void block_(int n, int part, int nparts, int *lo, int *hi)
{
    int step = (n + nparts - 1) / nparts;
    step = (step + MM_ALIGN - 1) / MM_ALIGN * MM_ALIGN;
    *lo = part * step < n ? part * step : n;
    *hi = *lo + step < n ? *lo + step : n;
}

/* One thread's column block [o0, o1) of the forward GEMM; with act, that
 * block's GELU too (act (N,OC) = gelu(out)). */
static void forward_block_(float *out, float *act, const float *inp,
                           const float *weight, const float *bias, int N,
                           int C, int OC, int o0, int o1)
{
    if (o1 <= o0)
        return;
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC + o0, bias + o0,
                   (size_t)(o1 - o0) * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, o1 - o0, C,
                1.0f, inp, C, weight + (size_t)o0 * C, C,
                beta, out + o0, OC);
    if (act)
        for (int n = 0; n < N; n++) {
            const float *x = out + (size_t)n * OC;
            float *y = act + (size_t)n * OC;
            for (int o = o0; o < o1; o++)
                y[o] = gelu_(x[o]);
        }
}

void matmul_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC)
{
    matmul_forward_gelu(out, NULL, inp, weight, bias, N, C, OC);
}

void matmul_forward_gelu(float *out, float *act, const float *inp,
                         const float *weight, const float *bias, int N, int C,
                         int OC)
{
    blas_single_thread_();
    #pragma omp parallel
    {
        int o0, o1;
        block_(OC, omp_get_thread_num(), omp_get_num_threads(), &o0, &o1);
        forward_block_(out, act, inp, weight, bias, N, C, OC, o0, o1);
    }
}

/* The backward of one thread's blocks (see matmul_backward); with pre,
 * the input gradient's column block is then taken through GELU:
 * dpre[:, c0:c1] = gelu'(pre) * dinp[:, c0:c1] (dpre written, not added). */
static void backward_blocks_(float *dinp, float *dpre, const float *pre,
                             float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N,
                             int C, int OC, float dinp_beta)
{
    int part = omp_get_thread_num(), nparts = omp_get_num_threads();
    int c0, c1, o0, o1;
    block_(C, part, nparts, &c0, &c1);
    block_(OC, part, nparts, &o0, &o1);

    /* dinp[:, c0:c1] += dout @ weight[:, c0:c1] */
    if (dinp && c1 > c0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, c1 - c0, OC,
                    1.0f, dout, OC, weight + c0, C, dinp_beta, dinp + c0, C);
        if (dpre)
            for (int n = 0; n < N; n++) {
                const float *d = dinp + (size_t)n * C;
                const float *x = pre + (size_t)n * C;
                float *dx = dpre + (size_t)n * C;
                for (int c = c0; c < c1; c++)
                    dx[c] = gelu_grad_(x[c]) * d[c];
            }
    }
    /* dweight[o0:o1, :] += dout[:, o0:o1]^T @ inp */
    if (o1 > o0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N,
                    1.0f, dout + o0, OC, inp, C, 1.0f,
                    dweight + (size_t)o0 * C, C);
    /* dbias[o0:o1]: rows in order, one thread per element */
    if (dbias) {
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++)
                dbias[o] += d[o];
        }
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC)
{
    blas_single_thread_();
    #pragma omp parallel
    backward_blocks_(dinp, NULL, NULL, dweight, dbias, dout, inp, weight, N,
                     C, OC, 1.0f);
}

void matmul_backward_gelu(float *dpre, float *dact, float *dweight,
                          float *dbias, const float *dout, const float *act,
                          const float *pre, const float *weight, int N, int C,
                          int OC)
{
    blas_single_thread_();
    #pragma omp parallel
    backward_blocks_(dact, dpre, pre, dweight, dbias, dout, act, weight, N, C,
                     OC, 0.0f);
}
