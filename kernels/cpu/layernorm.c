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
static M6_SIMD_CLONES void ln_row_(float *restrict o, float *mean, float *rstd,
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

/* One row of dinp: dx (C) += rstd (g - mean(g) - xhat mean(g xhat)),
 * g = d * weight; the row sums in 8 partial sums each (fixed order) */
static M6_SIMD_CLONES void ln_row_backward_(float *restrict dx,
                                            const float *restrict x,
                                            const float *restrict d,
                                            const float *restrict weight,
                                            float m, float s, int C)
{
    f8_ ag = {0}, agx = {0}, dv, wv, xv;
    int c = 0;
    for (; c + 8 <= C; c += 8) {
        F8_LOAD_(dv, d + c);
        F8_LOAD_(wv, weight + c);
        F8_LOAD_(xv, x + c);
        f8_ g = dv * wv;
        ag += g;
        agx += g * (xv - m) * s;
    }
    float gmean = F8_HSUM_(ag), gxmean = F8_HSUM_(agx);
    for (; c < C; c++) {
        float g = d[c] * weight[c];
        gmean += g;
        gxmean += g * (x[c] - m) * s;
    }
    gmean /= C;
    gxmean /= C;
    for (c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        float g = d[c] * weight[c];
        dx[c] += s * (g - gmean - xhat * gxmean);
    }
}

/* dweight[c0:c1] += sum_rows dout xhat, dbias[c0:c1] += sum_rows dout,
 * rows in order (c1 - c0 <= LN_CBLOCK) */
static M6_SIMD_CLONES void ln_dparams_block_(float *restrict dweight,
                                             float *restrict dbias,
                                             const float *restrict dout,
                                             const float *restrict inp,
                                             const float *mean,
                                             const float *rstd, int N, int C,
                                             int c0, int c1)
{
    float aw[LN_CBLOCK], ab[LN_CBLOCK];
    int w = c1 - c0;
    for (int c = 0; c < w; c++) {
        aw[c] = dweight[c0 + c];
        ab[c] = dbias[c0 + c];
    }
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C + c0;
        const float *d = dout + (size_t)n * C + c0;
        float m = mean[n], s = rstd[n];
        for (int c = 0; c < w; c++) {
            aw[c] += d[c] * (x[c] - m) * s;
            ab[c] += d[c];
        }
    }
    for (int c = 0; c < w; c++) {
        dweight[c0 + c] = aw[c];
        dbias[c0 + c] = ab[c];
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
        #pragma omp for schedule(static)
        for (int n = 0; n < N; n++)
            ln_row_backward_(dinp + (size_t)n * C, inp + (size_t)n * C,
                             dout + (size_t)n * C, weight, mean[n], rstd[n],
                             C);
        /* dweight, dbias: column blocks, rows in order */
        #pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int c0 = blk * LN_CBLOCK;
            int c1 = c0 + LN_CBLOCK < C ? c0 + LN_CBLOCK : C;
            ln_dparams_block_(dweight, dbias, dout, inp, mean, rstd, N, C, c0,
                              c1);
        }
    }
}
