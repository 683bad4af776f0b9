/*
 * layernorm.cu — LayerNorm over the channel dim, bf16 in/out, fp32 math.
 * Formulas in kernels/cpu/layernorm.c.
 *
 * Forward and the dinp part of backward: one warp per row (two passes over
 * the row for a stable variance). dweight/dbias: column sums over rows, done
 * deterministically: each block sums a fixed chunk of LN_ROWS rows per
 * column into scratch, then one thread per column adds the chunk sums in
 * chunk order.
 */
#include "common.cuh"

#define LN_EPS 1e-5f
#define LN_ROWS 256          /* rows per chunk in the dweight/dbias pass */
#define LN_WARPS 8           /* rows (warps) per block in the row kernels */

/* ------------------------------------------------------------- kernels */

__global__ void layernorm_forward_kernel(bf16 *out, float *mean, float *rstd,
                                         const bf16 *inp, const bf16 *weight,
                                         const bf16 *bias, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return; /* whole warp; no block-level sync below */
    const bf16 *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s += ld(x[c]);
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = ld(x[c]) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + LN_EPS);
    bf16 *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = st((ld(x[c]) - m) * r * ld(weight[c]) + ld(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ void layernorm_backward_dinp_kernel(bf16 *dinp, const bf16 *dout,
                                               const bf16 *inp,
                                               const bf16 *weight,
                                               const float *mean,
                                               const float *rstd, int N, int C,
                                               int acc)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float gs = 0.0f, gxs = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = ld(d[c]) * ld(weight[c]);
        gs += g;
        gxs += g * (ld(x[c]) - m) * r;
    }
    float gmean = warp_sum(gs) / C, gxmean = warp_sum(gxs) / C;
    bf16 *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (ld(x[c]) - m) * r;
        float g = ld(d[c]) * ld(weight[c]);
        float v = r * (g - gmean - xhat * gxmean);
        dx[c] = st(acc ? ld(dx[c]) + v : v); /* acc 0: dinp not read */
    }
}

/* grid (ceil(C/blockDim), nchunks); scratch (nchunks, 2, C) */
__global__ void layernorm_backward_partial_kernel(float *scratch,
                                                  const bf16 *dout,
                                                  const bf16 *inp,
                                                  const float *mean,
                                                  const float *rstd, int N,
                                                  int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (c >= C)
        return;
    int r0 = chunk * LN_ROWS, r1 = min(r0 + LN_ROWS, N);
    float dw = 0.0f, db = 0.0f;
    for (int n = r0; n < r1; n++) {
        float d = ld(dout[(size_t)n * C + c]);
        float xhat = (ld(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
        dw += d * xhat;
        db += d;
    }
    scratch[((size_t)chunk * 2) * C + c] = dw;
    scratch[((size_t)chunk * 2 + 1) * C + c] = db;
}

__global__ void layernorm_backward_final_kernel(bf16 *dweight, bf16 *dbias,
                                                const float *scratch,
                                                int nchunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float dw = 0.0f, db = 0.0f;
    for (int k = 0; k < nchunks; k++) {
        dw += scratch[((size_t)k * 2) * C + c];
        db += scratch[((size_t)k * 2 + 1) * C + c];
    }
    add_bf16(&dweight[c], dw);
    add_bf16(&dbias[c], db);
}

/* ------------------------------------------------------------- launchers */

void layernorm_forward_cuda(bf16 *out, float *mean, float *rstd,
                            const bf16 *inp, const bf16 *weight,
                            const bf16 *bias, int N, int C,
                            cudaStream_t stream)
{
    layernorm_forward_kernel<<<ceil_div(N, LN_WARPS), LN_WARPS * 32, 0,
                               stream>>>(out, mean, rstd, inp, weight, bias,
                                         N, C);
    CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C)
{
    return ceil_div(N, LN_ROWS) * 2 * (size_t)C;
}

/* layernorm_backward_cuda (acc 1: dinp +=) and _first_ (acc 0: dinp =) */
static void backward_(bf16 *dinp, bf16 *dweight, bf16 *dbias, float *scratch,
                      const bf16 *dout, const bf16 *inp, const bf16 *weight,
                      const float *mean, const float *rstd, int N, int C,
                      int acc, cudaStream_t stream)
{
    layernorm_backward_dinp_kernel<<<ceil_div(N, LN_WARPS), LN_WARPS * 32, 0,
                                     stream>>>(dinp, dout, inp, weight, mean,
                                               rstd, N, C, acc);
    CUDA_CHECK_LAUNCH();
    int nchunks = (int)ceil_div(N, LN_ROWS);
    const int bs = 128;
    dim3 grid(ceil_div(C, bs), nchunks);
    layernorm_backward_partial_kernel<<<grid, bs, 0, stream>>>(
        scratch, dout, inp, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    layernorm_backward_final_kernel<<<ceil_div(C, bs), bs, 0, stream>>>(
        dweight, dbias, scratch, nchunks, C);
    CUDA_CHECK_LAUNCH();
}

void layernorm_backward_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                             float *scratch, const bf16 *dout,
                             const bf16 *inp, const bf16 *weight,
                             const float *mean, const float *rstd, int N,
                             int C, cudaStream_t stream)
{
    backward_(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N,
              C, 1, stream);
}

void layernorm_backward_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                   float *scratch, const bf16 *dout,
                                   const bf16 *inp, const bf16 *weight,
                                   const float *mean, const float *rstd,
                                   int N, int C, cudaStream_t stream)
{
    backward_(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N,
              C, 0, stream);
}
