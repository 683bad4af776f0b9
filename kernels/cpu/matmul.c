/*
 * matmul.c — fully connected layer, CPU reference, GEMMs through cpu_gemm.h:
 *   out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
 *   dinp (N,C)     += dout (N,OC) @ weight (OC,C)
 *   dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
 *   dbias (OC)     += sum over rows of dout
 * Accumulation uses the GEMM's beta = 1. The bias is added by pre-filling out
 * and running the forward GEMM with beta = 1 (no extra pass over out).
 *
 * Threading: the output of each GEMM is cut into one column (or row) block
 * per OpenMP thread (in the backward, the input and weight gradients' GEMMs
 * each over half the threads) and each thread runs a single-threaded GEMM
 * on its block (cpu_gemm.h). Every output element is computed by one
 * GEMM call with a block layout fixed by the thread count: deterministic
 * for a given count.
 *
 * The _gelu forms fuse the MLP's GELU into the GEMM's parallel region. In
 * the forward each thread applies it to the block it has just computed; in
 * the backward, once both GEMMs are done, every thread takes the
 * derivative over a row block of the input gradient (one barrier, no extra
 * region).
 */
#include <string.h>
#include <omp.h>
#include "kernels.h"
#include "cpu_math.h"
#include "cpu_gemm.h"

#define MM_ALIGN 16     /* block edges on multiples of 16 floats */

/* [*lo, *hi) = block `part` of `nparts` over [0, n), edges aligned */
static void block_(int n, int part, int nparts, int *lo, int *hi)
{
    int step = (n + nparts - 1) / nparts;
    step = (step + MM_ALIGN - 1) / MM_ALIGN * MM_ALIGN;
    *lo = part * step < n ? part * step : n;
    *hi = *lo + step < n ? *lo + step : n;
}

/* y[:, c0:c1] = gelu(x[:, c0:c1]), rows of ld floats */
M6_SIMD_CLONES
static void gelu_block_(float *restrict y, const float *restrict x, int N,
                        int ld, int c0, int c1)
{
    for (int n = 0; n < N; n++)
        for (int c = c0; c < c1; c++)
            y[(size_t)n * ld + c] = gelu_(x[(size_t)n * ld + c]);
}

/* dx[:, c0:c1] = gelu'(x) * d over the same block (dx written) */
M6_SIMD_CLONES
static void gelu_grad_block_(float *restrict dx, const float *restrict x,
                             const float *restrict d, int N, int ld, int c0,
                             int c1)
{
    for (int n = 0; n < N; n++)
        for (int c = c0; c < c1; c++) {
            size_t i = (size_t)n * ld + c;
            dx[i] = gelu_grad_(x[i]) * d[i];
        }
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
    gemm_f32_(GEMM_N, GEMM_T, N, o1 - o0, C,
                1.0f, inp, C, weight + (size_t)o0 * C, C,
                beta, out + o0, OC);
    if (act)
        gelu_block_(act, out, N, OC, o0, o1);
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
    #pragma omp parallel
    {
        int o0, o1;
        block_(OC, omp_get_thread_num(), omp_get_num_threads(), &o0, &o1);
        forward_block_(out, act, inp, weight, bias, N, C, OC, o0, o1);
    }
}

/* The backward of one thread's blocks (see matmul_backward); with pre,
 * the input gradient's column block is then taken through GELU:
 * dpre[:, c0:c1] = gelu'(pre) * dinp[:, c0:c1] (dpre written, not added).
 *
 * Which thread does what: the input gradient and the weight gradient are
 * two independent GEMMs of the same N*C*OC size. With two threads or more
 * the first half of the threads does the input gradient's column blocks
 * and the other half the weight gradient's row blocks (and dbias): each
 * GEMM is cut in half as many blocks, so its shared operand (dout) is
 * packed half as often, and no thread waits between the two. One thread
 * does both; without dinp every thread does dweight. */
static void backward_blocks_(float *dinp, float *dpre, const float *pre,
                             float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N,
                             int C, int OC, float dinp_beta, float dw_beta)
{
    int part = omp_get_thread_num(), nparts = omp_get_num_threads();
    /* threads [0, n_in) on dinp, [w0, nparts) on dweight */
    int n_in = !dinp ? 0 : nparts == 1 ? 1 : nparts / 2;
    int w0 = nparts == 1 ? 0 : n_in;
    int do_in = part < n_in;
    int c0 = 0, c1 = 0, o0 = 0, o1 = 0;
    if (do_in)
        block_(C, part, n_in, &c0, &c1);
    if (part >= w0)
        block_(OC, part - w0, nparts - w0, &o0, &o1);

    /* dinp[:, c0:c1] += dout @ weight[:, c0:c1] */
    if (do_in && c1 > c0) {
        gemm_f32_(GEMM_N, GEMM_N, N, c1 - c0, OC,
                    1.0f, dout, OC, weight + c0, C, dinp_beta, dinp + c0, C);
    }
    /* dweight[o0:o1, :] = dw_beta dweight[o0:o1, :] + dout[:, o0:o1]^T @ inp */
    if (o1 > o0)
        gemm_f32_(GEMM_T, GEMM_N, o1 - o0, C, N,
                    1.0f, dout + o0, OC, inp, C, dw_beta,
                    dweight + (size_t)o0 * C, C);
    /* dbias[o0:o1]: rows in order, one thread per element */
    if (dbias) {
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++)
                dbias[o] += d[o];
        }
    }
    /* the GELU derivative over all the threads, a row block each, once
     * the whole input gradient is there: on the input gradient's threads
     * alone it left the others waiting for it */
    if (dpre) {
        int r0, r1;
        #pragma omp barrier
        block_(N, part, nparts, &r0, &r1);
        if (r1 > r0)
            gelu_grad_block_(dpre + (size_t)r0 * C, pre + (size_t)r0 * C,
                             dinp + (size_t)r0 * C, r1 - r0, C, 0, C);
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC)
{
    #pragma omp parallel
    backward_blocks_(dinp, NULL, NULL, dweight, dbias, dout, inp, weight, N,
                     C, OC, 1.0f, 1.0f);
}

void matmul_backward_first(float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC,
                           int dw_store)
{
    #pragma omp parallel
    backward_blocks_(dinp, NULL, NULL, dweight, dbias, dout, inp, weight, N,
                     C, OC, 0.0f, dw_store ? 0.0f : 1.0f);
}

void matmul_backward_gelu(float *dpre, float *dact, float *dweight,
                          float *dbias, const float *dout, const float *act,
                          const float *pre, const float *weight, int N, int C,
                          int OC, int dw_store)
{
    #pragma omp parallel
    backward_blocks_(dact, dpre, pre, dweight, dbias, dout, act, weight, N, C,
                     OC, 0.0f, dw_store ? 0.0f : 1.0f);
}
