/*
 * layernorm.c — LayerNorm over the channel dim (Ba et al. 2016), CPU
 * reference. For each row x (C):
 *   mean = sum(x)/C,  var = sum((x-mean)^2)/C,  rstd = 1/sqrt(var + eps)
 *   xhat = (x - mean) rstd,  out = xhat * weight + bias
 * Backward, with g = dout * weight:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat))
 *   dweight += sum_rows dout xhat,  dbias += sum_rows dout
 * dinp is done row-parallel; dweight/dbias (a reduction over rows) in a
 * second pass, column-block-parallel, so each element is summed by one
 * thread in row order (deterministic for any thread count).
 * residual_layernorm_forward adds the residual in the same row loop (one
 * parallel region and one pass over the rows instead of two).
 */
#include <math.h>
#include "kernels.h"
#include "cpu_math.h"

#define LN_EPS 1e-5f
#define LN_CBLOCK 64    /* columns per block in the dweight/dbias pass */

/* One row: o (C) = LayerNorm(x) with its mean and rstd */
static inline void ln_row_(float *restrict o, float *mean, float *rstd,
                           const float *restrict x, const float *weight,
                           const float *bias, int C)
{
    float m = sum_(x, C) / C;
    for (int c = 0; c < C; c++)         /* o holds x - mean for now */
        o[c] = x[c] - m;
    float var = dot_(o, o, C) / C;
    float s = 1.0f / sqrtf(var + LN_EPS);
    for (int c = 0; c < C; c++)
        o[c] = o[c] * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        ln_row_(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C,
                weight, bias, C);
}

void residual_layernorm_forward(float *res, float *out, float *mean,
                                float *rstd, const float *a, const float *b,
                                const float *weight, const float *bias, int N,
                                int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = res + (size_t)n * C;
        const float *x = a + (size_t)n * C, *y = b + (size_t)n * C;
        for (int c = 0; c < C; c++)
            r[c] = x[c] + y[c];
        ln_row_(out + (size_t)n * C, mean + n, rstd + n, r, weight, bias, C);
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, const float *mean,
                        const float *rstd, int N, int C)
{
    int nblk = (C + LN_CBLOCK - 1) / LN_CBLOCK;
    #pragma omp parallel
    {
        /* dinp: one row per iteration */
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            /* row sums of g and g xhat, 8 partial sums each (fixed order) */
            float ag[8] = {0}, agx[8] = {0};
            int c = 0;
            for (; c + 8 <= C; c += 8)
                for (int j = 0; j < 8; j++) {
                    float g = d[c + j] * weight[c + j];
                    ag[j] += g;
                    agx[j] += g * (x[c + j] - m) * s;
                }
            float gmean = ((ag[0] + ag[1]) + (ag[2] + ag[3])) +
                          ((ag[4] + ag[5]) + (ag[6] + ag[7]));
            float gxmean = ((agx[0] + agx[1]) + (agx[2] + agx[3])) +
                           ((agx[4] + agx[5]) + (agx[6] + agx[7]));
            for (; c < C; c++) {
                float g = d[c] * weight[c];
                gmean += g;
                gxmean += g * (x[c] - m) * s;
            }
            gmean /= C;
            gxmean /= C;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                float g = d[c] * weight[c];
                dx[c] += s * (g - gmean - xhat * gxmean);
            }
        }
        /* dweight, dbias: column blocks, rows in order */
        #pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int c0 = blk * LN_CBLOCK;
            int c1 = c0 + LN_CBLOCK < C ? c0 + LN_CBLOCK : C;
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C;
                const float *d = dout + (size_t)n * C;
                float m = mean[n], s = rstd[n];
                for (int c = c0; c < c1; c++) {
                    dweight[c] += d[c] * (x[c] - m) * s;
                    dbias[c] += d[c];
                }
            }
        }
    }
}
