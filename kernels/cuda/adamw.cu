/*
 * adamw.cu — AdamW (formula in kernels.h) on fp32 master weights and
 * moments with bf16 gradients, writing the bf16 working copy in the same
 * pass; and the global gradient norm for clipping, on the device.
 *
 * grad_sumsq is deterministic: a fixed grid of SUMSQ_BLOCKS blocks, each
 * summing a fixed grid-stride subset into scratch[block], then one block
 * adds the partial sums in a fixed tree. The clip scale is computed by a
 * one-thread kernel, and the AdamW kernel reads it from device memory, so
 * the whole optimizer step is queued without a host round trip.
 */
#include "common.cuh"

#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

/* ------------------------------------------------------------- kernels */

__global__ void sumsq_partial_kernel(float *scratch, const bf16 *g, size_t n)
{
    float s = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        float x = ld(g[i]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        scratch[blockIdx.x] = s;
}

/* one block of SUMSQ_BLOCKS threads */
__global__ void sumsq_final_kernel(float *out, const float *scratch)
{
    float s = block_sum(scratch[threadIdx.x]);
    if (threadIdx.x == 0)
        out[0] = s;
}

__global__ void clip_scale_kernel(float *scale, const float *sumsq,
                                  float max_norm)
{
    float norm = sqrtf(sumsq[0]);
    scale[0] = (max_norm > 0.0f && norm > max_norm) ? max_norm / norm : 1.0f;
}

__global__ void adamw_kernel(float *master, bf16 *params, const bf16 *grads,
                             float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd,
                             const float *grad_scale, float bc1, float bc2)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float scale = grad_scale ? grad_scale[0] : 1.0f;
    float g = ld(grads[i]) * scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    float p = master[i];
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    params[i] = st(p);
}

__global__ void grad_div_kernel(bf16 *grads, size_t n, float d)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        grads[i] = st(ld(grads[i]) / d);
}

__global__ void copy_to_bf16_kernel(bf16 *params, const float *master,
                                    size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        params[i] = st(master[i]);
}

/* ------------------------------------------------------------- launchers */

size_t grad_sumsq_scratch_floats(void)
{
    return SUMSQ_BLOCKS;
}

void grad_sumsq_cuda(float *out, float *scratch, const bf16 *grads, size_t n,
                     cudaStream_t stream)
{
    sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, stream>>>(
        scratch, grads, n);
    CUDA_CHECK_LAUNCH();
    sumsq_final_kernel<<<1, SUMSQ_BLOCKS, 0, stream>>>(out, scratch);
    CUDA_CHECK_LAUNCH();
}

void grad_clip_scale_cuda(float *scale, const float *sumsq, float max_norm,
                          cudaStream_t stream)
{
    clip_scale_kernel<<<1, 1, 0, stream>>>(scale, sumsq, max_norm);
    CUDA_CHECK_LAUNCH();
}

void adamw_update_cuda(float *master, bf16 *params, const bf16 *grads,
                       float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay,
                       const float *grad_scale, long t, cudaStream_t stream)
{
    if (n == 0)
        return;
    /* bias corrections in double, as the CPU reference */
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    const int bs = 256;
    adamw_kernel<<<ceil_div(n, bs), bs, 0, stream>>>(
        master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay,
        grad_scale, bc1, bc2);
    CUDA_CHECK_LAUNCH();
}

void grad_div_cuda(bf16 *grads, size_t n, float d, cudaStream_t stream)
{
    const int bs = 256;
    if (n == 0)
        return;
    grad_div_kernel<<<ceil_div(n, bs), bs, 0, stream>>>(grads, n, d);
    CUDA_CHECK_LAUNCH();
}

void copy_to_bf16_cuda(bf16 *params, const float *master, size_t n,
                       cudaStream_t stream)
{
    const int bs = 256;
    if (n == 0)
        return;
    copy_to_bf16_kernel<<<ceil_div(n, bs), bs, 0, stream>>>(params, master,
                                                            n);
    CUDA_CHECK_LAUNCH();
}
