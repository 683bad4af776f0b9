/*
 * layernorm.cu — LayerNorm over the channel dim, bf16 in/out, fp32 math.
 * Formulas in kernels/cpu/layernorm.c.
 *
 * Forward: one warp per row, two passes over the row for a stable variance,
 * 128-bit loads and stores (8 bf16 per lane; C a multiple of 8, rows
 * 16-byte aligned). residual_layernorm_forward_cuda adds the residual in
 * the same pass.
 *
 * Backward: one kernel over the rows. A block owns LN_ROWS rows: its warps
 * make dinp row by row (one warp per row, 128-bit accesses), then the
 * block sums dweight and dbias over its rows per column, in row order,
 * into its partial in scratch (the rows it just read, from L2); a second
 * tiny kernel adds the partials in block order. No atomics: the same bits
 * on every run.
 */
#include "common.cuh"

#define LN_EPS 1e-5f
#define LN_WARPS 8           /* rows (warps) per block in the forward */
#define LN_BWD_WARPS 16      /* warps per block in the backward */

/* ------------------------------------------------------------- kernels */

/* One row of the forward, by one warp: x (C) -> o (C), the row's mean
 * and rstd written by lane 0. */
static __device__ __forceinline__ void ln_row_(bf16 *o, float *mean,
                                               float *rstd, const bf16 *x,
                                               const bf16 *weight,
                                               const bf16 *bias, int C,
                                               int lane)
{
    float s = 0.0f;
    for (int c = 8 * lane; c < C; c += 256) {
        bf16x8 v = ld8(x + c);
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += ld(v.v[j]);
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int c = 8 * lane; c < C; c += 256) {
        bf16x8 v = ld8(x + c);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float d = ld(v.v[j]) - m;
            var += d * d;
        }
    }
    float r = rsqrtf(warp_sum(var) / C + LN_EPS);
    for (int c = 8 * lane; c < C; c += 256) {
        bf16x8 v = ld8(x + c), w = ld8(weight + c), b = ld8(bias + c), y;
#pragma unroll
        for (int j = 0; j < 8; j++)
            y.v[j] = st((ld(v.v[j]) - m) * r * ld(w.v[j]) + ld(b.v[j]));
        st8(o + c, y);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = r;
    }
}

__global__ void layernorm_forward_kernel(bf16 *out, float *mean, float *rstd,
                                         const bf16 *inp, const bf16 *weight,
                                         const bf16 *bias, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return; /* whole warp; no block-level sync below */
    ln_row_(out + (size_t)row * C, mean + row, rstd + row,
            inp + (size_t)row * C, weight, bias, C, lane);
}

/* res = bf16(a + b) (res may alias a or b), then the LayerNorm of res */
__global__ void residual_layernorm_forward_kernel(
    bf16 *res, bf16 *out, float *mean, float *rstd, const bf16 *a,
    const bf16 *b, const bf16 *weight, const bf16 *bias, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    size_t at = (size_t)row * C;
    /* each lane reads back only the columns it wrote itself */
    for (int c = 8 * lane; c < C; c += 256) {
        bf16x8 x = ld8(a + at + c), y = ld8(b + at + c), z;
#pragma unroll
        for (int j = 0; j < 8; j++)
            z.v[j] = st(ld(x.v[j]) + ld(y.v[j]));
        st8(res + at + c, z);
    }
    ln_row_(out + at, mean + row, rstd + row, res + at, weight, bias, C,
            lane);
}

/* grid ceil(N/LN_ROWS), LN_BWD_WARPS warps: dinp of the block's rows (+=
 * when acc, else =), then its column partials scratch (blocks, 2, C) */
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
layernorm_backward_kernel(bf16 *dinp, float *scratch, const bf16 *dout,
                          const bf16 *inp, const bf16 *weight,
                          const float *mean, const float *rstd, int N, int C,
                          int acc)
{
    __shared__ float sm[LN_ROWS], sr[LN_ROWS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blockIdx.x * LN_ROWS, r1 = min(r0 + LN_ROWS, N);
    for (int row = r0 + warp; row < r1; row += LN_BWD_WARPS) {
        const bf16 *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float gs = 0.0f, gxs = 0.0f;
        for (int c = 8 * lane; c < C; c += 256) {
            bf16x8 xv = ld8(x + c), dv = ld8(d + c), wv = ld8(weight + c);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float g = ld(dv.v[j]) * ld(wv.v[j]);
                gs += g;
                gxs += g * (ld(xv.v[j]) - m) * r;
            }
        }
        float gmean = warp_sum(gs) / C, gxmean = warp_sum(gxs) / C;
        bf16 *dx = dinp + (size_t)row * C;
        for (int c = 8 * lane; c < C; c += 256) {
            bf16x8 xv = ld8(x + c), dv = ld8(d + c), wv = ld8(weight + c);
            bf16x8 o;
            if (acc)
                o = ld8(dx + c); /* acc 0: dinp not read */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float xhat = (ld(xv.v[j]) - m) * r;
                float g = ld(dv.v[j]) * ld(wv.v[j]);
                float v = r * (g - gmean - xhat * gxmean);
                o.v[j] = st(acc ? ld(o.v[j]) + v : v);
            }
            st8(dx + c, o);
        }
        if (lane == 0) {
            sm[row - r0] = m;
            sr[row - r0] = r;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dw = 0.0f, db = 0.0f;
        for (int n = r0; n < r1; n++) { /* row order: deterministic */
            float d = ld(dout[(size_t)n * C + c]);
            float xhat = (ld(inp[(size_t)n * C + c]) - sm[n - r0]) *
                         sr[n - r0];
            dw += d * xhat;
            db += d;
        }
        scratch[((size_t)blockIdx.x * 2) * C + c] = dw;
        scratch[((size_t)blockIdx.x * 2 + 1) * C + c] = db;
    }
}

/* dweight, dbias += the partials of the nblocks blocks, in block order */
__global__ void layernorm_backward_final_kernel(bf16 *dweight, bf16 *dbias,
                                                const float *scratch,
                                                int nblocks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float dw = 0.0f, db = 0.0f;
    for (int k = 0; k < nblocks; k++) {
        dw += scratch[((size_t)k * 2) * C + c];
        db += scratch[((size_t)k * 2 + 1) * C + c];
    }
    add_bf16(&dweight[c], dw);
    add_bf16(&dbias[c], db);
}

/* ------------------------------------------------------------- launchers */

/* the 128-bit accesses' needs: C % 8 and 16-byte aligned tensors */
static void check_vec_(const char *who, int C, const void *p0,
                       const void *p1, const void *p2, const void *p3,
                       const void *p4, const void *p5)
{
    if (C % 8 == 0 && aligned16(p0, p1, p2) && aligned16(p3, p4, p5))
        return;
    fprintf(stderr, "%s: C=%d must be a multiple of 8 and every tensor "
                    "16-byte aligned\n", who, C);
    exit(1);
}

void layernorm_forward_cuda(bf16 *out, float *mean, float *rstd,
                            const bf16 *inp, const bf16 *weight,
                            const bf16 *bias, int N, int C,
                            cudaStream_t stream)
{
    check_vec_("layernorm_forward_cuda", C, out, inp, weight, bias, NULL,
               NULL);
    layernorm_forward_kernel<<<ceil_div(N, LN_WARPS), LN_WARPS * 32, 0,
                               stream>>>(out, mean, rstd, inp, weight, bias,
                                         N, C);
    CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward_cuda(bf16 *res, bf16 *out, float *mean,
                                     float *rstd, const bf16 *a,
                                     const bf16 *b, const bf16 *weight,
                                     const bf16 *bias, int N, int C,
                                     cudaStream_t stream)
{
    check_vec_("residual_layernorm_forward_cuda", C, res, out, a, b, weight,
               bias);
    residual_layernorm_forward_kernel<<<ceil_div(N, LN_WARPS), LN_WARPS * 32,
                                        0, stream>>>(res, out, mean, rstd, a,
                                                     b, weight, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

/* layernorm_backward_cuda (acc 1: dinp +=) and _first_ (acc 0: dinp =) */
static void backward_(bf16 *dinp, bf16 *dweight, bf16 *dbias, float *scratch,
                      const bf16 *dout, const bf16 *inp, const bf16 *weight,
                      const float *mean, const float *rstd, int N, int C,
                      int acc, cudaStream_t stream)
{
    check_vec_("layernorm_backward_cuda", C, dinp, dout, inp, weight, NULL,
               NULL);
    int nblocks = (int)ceil_div(N, LN_ROWS);
    layernorm_backward_kernel<<<nblocks, LN_BWD_WARPS * 32, 0, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, N, C, acc);
    CUDA_CHECK_LAUNCH();
    const int bs = 128;
    layernorm_backward_final_kernel<<<ceil_div(C, bs), bs, 0, stream>>>(
        dweight, dbias, scratch, nblocks, C);
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
