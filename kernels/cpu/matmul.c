/*
 * matmul.c — fully connected layer, CPU reference, GEMMs through CBLAS:
 *   out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
 *   dinp (N,C)     += dout (N,OC) @ weight (OC,C)
 *   dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
 *   dbias (OC)     += sum over rows of dout
 * Accumulation uses sgemm's beta = 1. The bias is added by pre-filling out
 * and running the forward GEMM with beta = 1 (no extra pass over out).
 *
 * -DM6_NO_CBLAS replaces sgemm by plain OpenMP loops (slow, same results up
 * to summation order) for machines without a BLAS, e.g. the GPU check
 * (bench/gpu-check.sh) that builds the CPU model as a reference with gcc.
 */
#include <string.h>
#include "kernels.h"

#ifndef M6_NO_CBLAS
#include <cblas.h>
#else
/* The three sgemm shapes used below, row-major, beta = 1 (accumulate). */
enum { CblasRowMajor, CblasNoTrans, CblasTrans };

static void cblas_sgemm(int order, int ta, int tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *Cm, int ldc)
{
    (void)order;
    #pragma omp parallel for schedule(static)
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

#define MM_CBLOCK 64    /* columns per block in the dbias reduction */

void matmul_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        /* column blocks, rows in order: each dbias[o] summed by one thread */
        int nblk = (OC + MM_CBLOCK - 1) / MM_CBLOCK;
        #pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int o0 = blk * MM_CBLOCK;
            int o1 = o0 + MM_CBLOCK < OC ? o0 + MM_CBLOCK : OC;
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int o = o0; o < o1; o++)
                    dbias[o] += d[o];
            }
        }
    }
}
