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
 *
 * adamw_multi_cuda is the same update over a list of tensors in one launch
 * (a plan of (offset, numel, decay, region) made once): each block finds
 * its tensor by binary search and updates one chunk of it; the clip scale
 * is computed in the kernel from the device sum of squares, by the same
 * function as clip_scale_kernel, so the separate scale kernel is not run.
 * A tensor with an sr_key has bf16 master weights: the update reads and
 * writes the bf16 params alone, rounded stochastically by sround.h's rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"
#include "sround.h"

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

/* The clip scale of global-norm clipping from the device sum of squares:
 * max_norm / norm when norm = sqrt(sumsq[0]) exceeds max_norm > 0, else 1.
 * One function for clip_scale_kernel and adamw_multi_kernel, so that the
 * fused scale is the separate kernel's bit for bit. */
static __device__ __forceinline__ float clip_scale_(const float *sumsq,
                                                    float max_norm)
{
    float norm = sqrtf(sumsq[0]);
    return (max_norm > 0.0f && norm > max_norm) ? max_norm / norm : 1.0f;
}

__global__ void clip_scale_kernel(float *scale, const float *sumsq,
                                  float max_norm)
{
    scale[0] = clip_scale_(sumsq, max_norm);
}

/* AdamW of element i (formula in kernels.h), gradient times scale. One
 * function for the per-tensor and the multi-tensor kernels, so that the
 * two give the same bits. */
static __device__ __forceinline__ void adamw_elem_(
    float *master, bf16 *params, const bf16 *grads, float *m, float *v,
    size_t i, float lr, float beta1, float beta2, float eps, float wd,
    float scale, float bc1, float bc2)
{
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

/* adamw_elem_ for a bf16 master weight: params[i] is the master; the new
 * value rounded to bf16 stochastically with the bits of (key, t, i)
 * (sround.h, the CPU optimizers' rule), so that st() of it is exact. */
static __device__ __forceinline__ void adamw_elem_sr_(
    bf16 *params, const bf16 *grads, float *m, float *v, size_t i, size_t e,
    float lr, float beta1, float beta2, float eps, float wd, float scale,
    float bc1, float bc2, uint64_t key, uint64_t t)
{
    float g = ld(grads[i]) * scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    float p = ld(params[i]);
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    m[i] = mi;
    v[i] = vi;
    params[i] = st(sr_round_bf16(p, sr_bits(key, t, e)));
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
    adamw_elem_(master, params, grads, m, v, i, lr, beta1, beta2, eps, wd,
                scale, bc1, bc2);
}

/* One tensor of a multi-tensor plan on the device: numel elements at off,
 * its first block blk0 (blocks of MT_CHUNK elements, tensor by tensor). */
typedef struct {
    size_t off, numel;
    uint64_t sr_key;        /* 0 fp32 master, else bf16 (adamw_tensor_cuda) */
    unsigned blk0;
    int decay, region;
} mt_tensor_;

#define MT_THREADS 256
#define MT_CHUNK (4 * MT_THREADS)   /* elements per block */

/* bias corrections of up to ADAMW_MULTI_REGIONS regions, by value */
typedef struct {
    float bc1[ADAMW_MULTI_REGIONS], bc2[ADAMW_MULTI_REGIONS];
    unsigned long long t[ADAMW_MULTI_REGIONS];  /* step counts */
} mt_bc_;

/* Blocks b0 + blockIdx.x of tensors [k0, k1) (of regions from region0):
 * each block finds its tensor by binary search on blk0 (the largest k with
 * blk0 <= b, which skips empty tensors) and updates one MT_CHUNK of it. */
__global__ void adamw_multi_kernel(const mt_tensor_ *ts, int k0, int k1,
                                   unsigned b0, float *master, bf16 *params,
                                   const bf16 *grads, float *m, float *v,
                                   float lr, float beta1, float beta2,
                                   float eps, float wd, const float *sumsq,
                                   float max_norm, mt_bc_ bc, int region0,
                                   const float *args, int n_regions)
{
    unsigned b = b0 + blockIdx.x;
    int lo = k0, hi = k1 - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ts[mid].blk0 <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const mt_tensor_ t = ts[lo];
    float bc1, bc2;
    uint64_t step;
    if (args) { /* adamw_multi_dev_cuda: the step's values on the device */
        lr = args[MT_ARG_LR];
        beta1 = args[MT_ARG_BETA1];
        beta2 = args[MT_ARG_BETA2];
        eps = args[MT_ARG_EPS];
        wd = args[MT_ARG_WD];
        max_norm = args[MT_ARG_MAX_NORM];
        bc1 = args[MT_ARG_BC + t.region];
        bc2 = args[MT_ARG_BC + n_regions + t.region];
        uint32_t lo32, hi32;
        memcpy(&lo32, &args[MT_ARG_BC + 2 * n_regions + 2 * t.region], 4);
        memcpy(&hi32, &args[MT_ARG_BC + 2 * n_regions + 2 * t.region + 1],
               4);
        step = (uint64_t)lo32 | (uint64_t)hi32 << 32;
    } else {
        int r = t.region - region0;
        bc1 = bc.bc1[r];
        bc2 = bc.bc2[r];
        step = bc.t[r];
    }
    float scale = sumsq ? clip_scale_(sumsq, max_norm) : 1.0f;
    float twd = t.decay ? wd : 0.0f;
    size_t s0 = (size_t)(b - t.blk0) * MT_CHUNK;
    size_t s1 = s0 + MT_CHUNK < t.numel ? s0 + MT_CHUNK : t.numel;
    if (t.sr_key) {
        for (size_t i = s0 + threadIdx.x; i < s1; i += blockDim.x)
            adamw_elem_sr_(params, grads, m, v, t.off + i, i, lr, beta1,
                           beta2, eps, twd, scale, bc1, bc2, t.sr_key, step);
        return;
    }
    for (size_t i = s0 + threadIdx.x; i < s1; i += blockDim.x)
        adamw_elem_(master, params, grads, m, v, t.off + i, lr, beta1, beta2,
                    eps, twd, scale, bc1, bc2);
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

__global__ void copy_to_f32_kernel(float *dst, const bf16 *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = ld(src[i]);
}

/* ------------------------------------------------------------- launchers */

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

struct adamw_multi_plan {
    mt_tensor_ *d_ts;          /* [nt] on the device */
    int nt, n_regions;
    int *reg_k0;               /* [n_regions + 1] first tensor of a region */
    unsigned *reg_b0;          /* [n_regions + 1] its first block */
};

adamw_multi_plan *adamw_multi_plan_create(const adamw_tensor_cuda *ts,
                                          int nt, int n_regions)
{
    if (nt < 1 || n_regions < 1) {
        fprintf(stderr, "adamw_multi_plan_create: %d tensors, %d regions "
                "(want >= 1 each)\n", nt, n_regions);
        return NULL;
    }
    for (int k = 0; k < nt; k++)
        if (ts[k].region < 0 || ts[k].region >= n_regions ||
            (k > 0 && ts[k].region < ts[k - 1].region)) {
            fprintf(stderr, "adamw_multi_plan_create: tensor %d has region "
                    "%d (want regions in [0,%d), non-decreasing)\n", k,
                    ts[k].region, n_regions);
            return NULL;
        }
    adamw_multi_plan *p = (adamw_multi_plan *)calloc(1, sizeof *p);
    mt_tensor_ *h = (mt_tensor_ *)calloc((size_t)nt, sizeof *h);
    if (p) {
        p->reg_k0 = (int *)calloc((size_t)n_regions + 1, sizeof(int));
        p->reg_b0 = (unsigned *)calloc((size_t)n_regions + 1,
                                       sizeof(unsigned));
    }
    if (!p || !h || !p->reg_k0 || !p->reg_b0) {
        fprintf(stderr, "adamw_multi_plan_create: out of memory\n");
        free(h);
        adamw_multi_plan_destroy(p);
        return NULL;
    }
    size_t blk = 0;
    int r = 0;
    for (int k = 0; k < nt; k++) {
        while (r <= ts[k].region) {     /* regions up to this one start */
            p->reg_k0[r] = k;
            p->reg_b0[r] = (unsigned)blk;
            r++;
        }
        h[k].off = ts[k].off;
        h[k].numel = ts[k].numel;
        h[k].blk0 = (unsigned)blk;
        h[k].decay = ts[k].decay;
        h[k].region = ts[k].region;
        h[k].sr_key = ts[k].sr_key;
        blk += ceil_div(ts[k].numel, MT_CHUNK);
        if (blk > 0x7fffffffu) {
            fprintf(stderr, "adamw_multi_plan_create: more than 2^31 "
                    "blocks of %d elements\n", MT_CHUNK);
            free(h);
            adamw_multi_plan_destroy(p);
            return NULL;
        }
    }
    for (; r <= n_regions; r++) {       /* empty regions and the end */
        p->reg_k0[r] = nt;
        p->reg_b0[r] = (unsigned)blk;
    }
    p->nt = nt;
    p->n_regions = n_regions;
    CUDA_CHECK(cudaMalloc((void **)&p->d_ts, (size_t)nt * sizeof *h));
    CUDA_CHECK(cudaMemcpy(p->d_ts, h, (size_t)nt * sizeof *h,
                          cudaMemcpyHostToDevice));
    free(h);
    return p;
}

void adamw_multi_plan_destroy(adamw_multi_plan *p)
{
    if (!p)
        return;
    if (p->d_ts)
        CUDA_CHECK(cudaFree(p->d_ts));
    free(p->reg_k0);
    free(p->reg_b0);
    free(p);
}

void adamw_multi_cuda(const adamw_multi_plan *p, float *master, bf16 *params,
                      const bf16 *grads, float *m, float *v, const long *t,
                      float lr, float beta1, float beta2, float eps,
                      float weight_decay, const float *sumsq, float max_norm,
                      cudaStream_t stream)
{
    /* one launch per ADAMW_MULTI_REGIONS regions (the bias corrections go
     * by value): one launch in all up to that many */
    for (int r0 = 0; r0 < p->n_regions; r0 += ADAMW_MULTI_REGIONS) {
        int r1 = r0 + ADAMW_MULTI_REGIONS < p->n_regions
                     ? r0 + ADAMW_MULTI_REGIONS : p->n_regions;
        unsigned nb = p->reg_b0[r1] - p->reg_b0[r0];
        if (nb == 0)
            continue;
        mt_bc_ bc;
        memset(&bc, 0, sizeof bc);
        for (int r = r0; r < r1; r++) {
            /* bias corrections in double, as adamw_update_cuda */
            bc.bc1[r - r0] = (float)(1.0 - pow((double)beta1, (double)t[r]));
            bc.bc2[r - r0] = (float)(1.0 - pow((double)beta2, (double)t[r]));
            bc.t[r - r0] = (unsigned long long)t[r];
        }
        adamw_multi_kernel<<<nb, MT_THREADS, 0, stream>>>(
            p->d_ts, p->reg_k0[r0], p->reg_k0[r1], p->reg_b0[r0], master,
            params, grads, m, v, lr, beta1, beta2, eps, weight_decay, sumsq,
            max_norm, bc, r0, (const float *)NULL, p->n_regions);
        CUDA_CHECK_LAUNCH();
    }
}

size_t adamw_multi_args_floats(const adamw_multi_plan *p)
{
    return MT_ARG_BC + 4 * (size_t)p->n_regions;
}

void adamw_multi_args_fill(const adamw_multi_plan *p, float *args,
                           const long *t, float lr, float beta1, float beta2,
                           float eps, float weight_decay, float max_norm)
{
    args[MT_ARG_LR] = lr;
    args[MT_ARG_BETA1] = beta1;
    args[MT_ARG_BETA2] = beta2;
    args[MT_ARG_EPS] = eps;
    args[MT_ARG_WD] = weight_decay;
    args[MT_ARG_MAX_NORM] = max_norm;
    for (int r = 0; r < p->n_regions; r++) {
        /* bias corrections in double, as adamw_multi_cuda */
        args[MT_ARG_BC + r] =
            (float)(1.0 - pow((double)beta1, (double)t[r]));
        args[MT_ARG_BC + p->n_regions + r] =
            (float)(1.0 - pow((double)beta2, (double)t[r]));
        /* the step count's bits, for the stochastic rounding */
        uint64_t tr = (uint64_t)t[r];
        uint32_t lo32 = (uint32_t)tr, hi32 = (uint32_t)(tr >> 32);
        memcpy(&args[MT_ARG_BC + 2 * p->n_regions + 2 * r], &lo32, 4);
        memcpy(&args[MT_ARG_BC + 2 * p->n_regions + 2 * r + 1], &hi32, 4);
    }
}

void adamw_multi_dev_cuda(const adamw_multi_plan *p, float *master,
                          bf16 *params, const bf16 *grads, float *m, float *v,
                          const float *args, const float *sumsq,
                          cudaStream_t stream)
{
    unsigned nb = p->reg_b0[p->n_regions];
    if (nb == 0)
        return;
    mt_bc_ bc;
    memset(&bc, 0, sizeof bc);
    adamw_multi_kernel<<<nb, MT_THREADS, 0, stream>>>(
        p->d_ts, 0, p->nt, 0, master, params, grads, m, v, 0.0f, 0.0f, 0.0f,
        0.0f, 0.0f, sumsq, 0.0f, bc, 0, args, p->n_regions);
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

void copy_to_f32_cuda(float *dst, const bf16 *src, size_t n,
                      cudaStream_t stream)
{
    const int bs = 256;
    if (n == 0)
        return;
    copy_to_f32_kernel<<<ceil_div(n, bs), bs, 0, stream>>>(dst, src, n);
    CUDA_CHECK_LAUNCH();
}
