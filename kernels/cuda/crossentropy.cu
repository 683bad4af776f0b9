/*
 * crossentropy.cu — fused softmax + cross-entropy over a padded vocabulary,
 * bf16 logits, fp32 math. Formulas in kernels/cpu/crossentropy.c.
 *
 * One block per row. Each thread keeps an online (max, sum of exp) pair over
 * its columns; the pairs are merged across the block, giving the row's max M
 * and S = sum exp(z - M). Then loss = log S + M - z[target] and
 * p_j = exp(z_j - M) / S. Backward recomputes these stats from the logits
 * (one extra read of the logits instead of storing probabilities) and writes
 * (p - onehot) * dloss over the row, in place if asked. Columns [V,Vp) are
 * padding: never read in the stats, zero in probs and dlogits.
 * The fused classifier (training) does both in one kernel per row: the
 * stats pass, then the loss and dlogits written over the logits, the
 * second read of the row by the same block right after the first (on a
 * GPU, from L2 rather than HBM: not measured yet), instead of three
 * passes in two kernels and a fill of dlosses.
 */
#include "common.cuh"

#define CE_THREADS 512

struct maxsum { float m, s; };

static __device__ __forceinline__ maxsum ms_merge(maxsum a, maxsum b)
{
    if (a.m == -INFINITY)
        return b;
    if (b.m == -INFINITY)
        return a;
    float M = fmaxf(a.m, b.m);
    maxsum r = {M, a.s * expf(a.m - M) + b.s * expf(b.m - M)};
    return r;
}

/* (max, sum exp(z - max)) over z[0..V), for the whole block; every thread
 * gets the result. Contains __syncthreads. */
static __device__ maxsum row_stats(const bf16 *z, int V)
{
    __shared__ float sm[32], ss[32];
    maxsum a = {-INFINITY, 0.0f};
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = ld(z[j]);
        if (x > a.m) {
            a.s = a.s * expf(a.m - x) + 1.0f; /* expf(-inf) = 0 at start */
            a.m = x;
        } else {
            a.s += expf(x - a.m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        maxsum b = {__shfl_xor_sync(0xffffffffu, a.m, o),
                    __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_merge(a, b);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        sm[warp] = a.m;
        ss[warp] = a.s;
    }
    __syncthreads();
    maxsum r = {-INFINITY, 0.0f};
    for (int w = 0; w < (int)blockDim.x / 32; w++) { /* fixed order */
        maxsum b = {sm[w], ss[w]};
        r = ms_merge(r, b);
    }
    return r;
}

/* ------------------------------------------------------------- kernels */

__global__ void ce_forward_kernel(float *losses, bf16 *probs,
                                  const bf16 *logits, const int32_t *targets,
                                  int V, int Vp)
{
    size_t row = blockIdx.x;
    const bf16 *z = logits + row * Vp;
    maxsum a = row_stats(z, V);
    if (threadIdx.x == 0)
        losses[row] = logf(a.s) + a.m - ld(z[targets[row]]);
    if (probs) {
        float inv = 1.0f / a.s;
        for (int j = threadIdx.x; j < Vp; j += blockDim.x)
            probs[row * Vp + j] = st(j < V ? expf(ld(z[j]) - a.m) * inv : 0.0f);
    }
}

__global__ void ce_backward_kernel(bf16 *dlogits, const bf16 *logits,
                                   const int32_t *targets,
                                   const float *dlosses, int V, int Vp)
{
    size_t row = blockIdx.x;
    const bf16 *z = logits + row * Vp;
    maxsum a = row_stats(z, V); /* ends after a __syncthreads: all reads of
                                   the stats pass are done before any write */
    float inv = 1.0f / a.s, dl = dlosses[row];
    int tgt = targets[row];
    bf16 *dz = dlogits + row * Vp;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float g = 0.0f;
        if (j < V) {
            float p = expf(ld(z[j]) - a.m) * inv;
            g = (p - (j == tgt ? 1.0f : 0.0f)) * dl;
        }
        dz[j] = st(g); /* same thread read z[j] just above: in place is safe */
    }
}

/* The fused classifier, one block per row: the stats pass, then the loss
 * and the row's dlogits written over its logits. Thread 0 reads
 * z[target] before row_stats' barrier, so before any thread overwrites
 * it; every other column is read and written by the same thread. */
__global__ void ce_fused_kernel(float *losses, bf16 *logits,
                                const int32_t *targets, float dloss, int V,
                                int Vp)
{
    size_t row = blockIdx.x;
    bf16 *z = logits + row * Vp;
    int tgt = targets[row];
    float zt = threadIdx.x == 0 ? ld(z[tgt]) : 0.0f;
    maxsum a = row_stats(z, V); /* ends after a __syncthreads */
    if (threadIdx.x == 0)
        losses[row] = logf(a.s) + a.m - zt;
    float inv = 1.0f / a.s;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float g = 0.0f;
        if (j < V) {
            float p = expf(ld(z[j]) - a.m) * inv;
            g = (p - (j == tgt ? 1.0f : 0.0f)) * dloss;
        }
        z[j] = st(g);
    }
}

__global__ void mean_kernel(float *out, const float *x, int n)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        out[0] = s / n;
}

__global__ void fill_kernel(float *x, float value, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = value;
}

/* ------------------------------------------------------------- launchers */

void softmax_crossentropy_forward_cuda(float *losses, bf16 *probs,
                                       const bf16 *logits,
                                       const int32_t *targets, int N, int V,
                                       int Vp, cudaStream_t stream)
{
    ce_forward_kernel<<<N, CE_THREADS, 0, stream>>>(losses, probs, logits,
                                                    targets, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void softmax_crossentropy_backward_cuda(bf16 *dlogits, const bf16 *logits,
                                        const int32_t *targets,
                                        const float *dlosses, int N, int V,
                                        int Vp, cudaStream_t stream)
{
    ce_backward_kernel<<<N, CE_THREADS, 0, stream>>>(dlogits, logits, targets,
                                                     dlosses, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void softmax_crossentropy_fused_cuda(float *losses, bf16 *logits,
                                     const int32_t *targets, float dloss,
                                     int N, int V, int Vp,
                                     cudaStream_t stream)
{
    ce_fused_kernel<<<N, CE_THREADS, 0, stream>>>(losses, logits, targets,
                                                  dloss, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void mean_cuda(float *out, const float *x, int n, cudaStream_t stream)
{
    mean_kernel<<<1, 1024, 0, stream>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

void fill_cuda(float *x, float value, size_t n, cudaStream_t stream)
{
    const int bs = 256;
    if (n == 0)
        return;
    fill_kernel<<<ceil_div(n, bs), bs, 0, stream>>>(x, value, n);
    CUDA_CHECK_LAUNCH();
}
