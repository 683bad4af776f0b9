/*
 * matmul.c — fully connected layer, CPU reference, GEMMs through CBLAS:
 *   out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
 *   dinp (N,C)     += dout (N,OC) @ weight (OC,C)
 *   dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
 *   dbias (OC)     += sum over rows of dout
 * Accumulation uses sgemm's beta = 1. The bias is added by pre-filling out
 * and running the forward GEMM with beta = 1 (no extra pass over out).
 */
#include <string.h>
#include <cblas.h>
#include "kernels.h"

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
