/*
 * adafactor.cu — Adafactor (Shazeer & Stern 2018; the formula in kernels.h,
 * the CPU reference kernels/cpu/adafactor.c) on one tensor: fp32 master
 * weights and state, bf16 gradients, the bf16 working copy written in the
 * same pass as the master.
 *
 * One step of a tensor is five launches on its stream, each reduction in
 * double in a fixed order (the result does not depend on timing):
 *   stats   matrix: each row's mean of g^2 + eps1 (a warp per row) and
 *           each column's (32 columns a block, 8 row strides); vector: the
 *           element's. The factored (or full) second moment updated.
 *   mean_r  matrix: 1 / mean(r) after the update (one block).
 *   sums    per chunk of AF_CHUNK elements: sum of U^2 (U = g / sqrt(vhat))
 *           and, with scale_parameter, of the master weights' squares.
 *   final   the chunks' sums (one block): the clip denominator
 *           max(1, RMS(U) / d) and the step size alpha.
 *   apply   u = U / denom, the first moment, decoupled weight decay, the
 *           master and its bf16 copy.
 * The scalars travel through the caller's scratch (adafactor_scratch_doubles),
 * so nothing waits for the host. The clip scale of global-norm clipping is
 * read from device memory (grad_clip_scale_cuda's output).
 */
#include <stdio.h>
#include "common.cuh"
#include "sround.h"

#define AF_THREADS 256
#define AF_CHUNK (16 * AF_THREADS)  /* elements per block of sums */
#define AF_ROWS 8                   /* stats: rows a block (a warp each) and
                                     * row strides of a column block */

/* scratch[AF_S_*]: the step's scalars, each a float value held in a double */
enum { AF_S_INV_MEAN_R, AF_S_DENOM, AF_S_ALPHA, AF_S_N };

/* ------------------------------------------------------------- kernels */

/* Sum of v over a block of AF_THREADS threads in a fixed tree; every thread
 * gets it. Contains __syncthreads: call from all threads. */
static __device__ double af_block_sum_(double v)
{
    __shared__ double sh[AF_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = AF_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    double s = sh[0];
    __syncthreads(); /* sh may be written by the next call */
    return s;
}

/* g^2 + eps1 of one gradient element times scale, in double (the CPU
 * reference's expression: the scaled gradient is a float). */
static __device__ __forceinline__ double g2_(const bf16 *grads, size_t i,
                                             float scale, float eps1)
{
    float x = ld(grads[i]) * scale;
    return (double)x * x + eps1;
}

static __device__ __forceinline__ float scale_of_(const float *grad_scale)
{
    return grad_scale ? grad_scale[0] : 1.0f;
}

/* Matrix (rows, cols): r[row] = b2 r + (1-b2) mean_j g2, a warp a row. */
__global__ void af_rows_kernel(float *r, const bf16 *grads, int rows,
                               int cols, float b2, float eps1,
                               const float *grad_scale)
{
    int row = blockIdx.x * AF_ROWS + threadIdx.x / 32, lane = threadIdx.x % 32;
    float scale = scale_of_(grad_scale);
    double s = 0.0;
    if (row < rows)
        for (int j = lane; j < cols; j += 32)
            s += g2_(grads, (size_t)row * cols + j, scale, eps1);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (row < rows && lane == 0)
        r[row] = b2 * r[row] + (1.0f - b2) * (float)(s / (double)cols);
}

/* Matrix: c[col] = b2 c + (1-b2) mean_i g2; block (32, AF_ROWS): 32
 * columns, each summed over AF_ROWS row strides, then in order. */
__global__ void af_cols_kernel(float *c, const bf16 *grads, int rows,
                               int cols, float b2, float eps1,
                               const float *grad_scale)
{
    __shared__ double part[AF_ROWS][32];
    int col = blockIdx.x * 32 + threadIdx.x;
    float scale = scale_of_(grad_scale);
    double s = 0.0;
    if (col < cols)
        for (int i = threadIdx.y; i < rows; i += AF_ROWS)
            s += g2_(grads, (size_t)i * cols + col, scale, eps1);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double t = 0.0;
        for (int k = 0; k < AF_ROWS; k++)
            t += part[k][threadIdx.x];
        c[col] = b2 * c[col] + (1.0f - b2) * (float)(t / (double)rows);
    }
}

/* Vector (n): r = b2 r + (1-b2) g2, elementwise. */
__global__ void af_vec_kernel(float *r, const bf16 *grads, size_t n, float b2,
                              float eps1, const float *grad_scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        r[i] = b2 * r[i] +
               (1.0f - b2) * (float)g2_(grads, i, scale_of_(grad_scale), eps1);
}

/* Matrix: scratch[AF_S_INV_MEAN_R] = (float)(1 / mean(r)), one block. */
__global__ void af_mean_r_kernel(double *scratch, const float *r, int rows)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < rows; i += AF_THREADS)
        s += r[i];
    s = af_block_sum_(s);
    if (threadIdx.x == 0)
        scratch[AF_S_INV_MEAN_R] = (float)(1.0 / (s / (double)rows));
}

/* vhat of element i: r[row] c[col] / mean(r) (matrix), r[i] (vector) */
static __device__ __forceinline__ float vhat_(const float *r, const float *c,
                                              int cols, float inv_mean_r,
                                              size_t i)
{
    if (!cols)
        return r[i];
    return r[i / (size_t)cols] * c[i % (size_t)cols] * inv_mean_r;
}

/* Per chunk of AF_CHUNK elements: the sums of U^2 and of master^2 (the
 * latter only with want_p) into scratch[AF_S_N + 2 blk + 0, 1]. */
__global__ void af_sums_kernel(double *scratch, const bf16 *grads,
                               const float *master, const float *r,
                               const float *c, size_t n, int cols,
                               const float *grad_scale, int want_p,
                               const bf16 *params)
{
    float scale = scale_of_(grad_scale);
    float imr = cols ? (float)scratch[AF_S_INV_MEAN_R] : 0.0f;
    size_t i0 = (size_t)blockIdx.x * AF_CHUNK;
    size_t i1 = i0 + AF_CHUNK < n ? i0 + AF_CHUNK : n;
    double su = 0.0, sp = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += AF_THREADS) {
        float u = ld(grads[i]) * scale / sqrtf(vhat_(r, c, cols, imr, i));
        su += (double)u * u;
        if (want_p) { /* master NULL: bf16 masters, params are they */
            float w = master ? master[i] : ld(params[i]);
            sp += (double)w * w;
        }
    }
    su = af_block_sum_(su);
    sp = af_block_sum_(sp);
    if (threadIdx.x == 0) {
        scratch[AF_S_N + 2 * (size_t)blockIdx.x] = su;
        scratch[AF_S_N + 2 * (size_t)blockIdx.x + 1] = sp;
    }
}

/* One block: the chunks' sums, in order per thread, then the tree:
 * denom = max(1, RMS(U) / clip), alpha = lr or lr max(eps2, RMS(master)). */
__global__ void af_final_kernel(double *scratch, int nb, size_t n, float lr,
                                float clip, float eps2, int scale_parameter)
{
    double su = 0.0, sp = 0.0;
    for (int b = threadIdx.x; b < nb; b += AF_THREADS) {
        su += scratch[AF_S_N + 2 * (size_t)b];
        sp += scratch[AF_S_N + 2 * (size_t)b + 1];
    }
    su = af_block_sum_(su);
    sp = af_block_sum_(sp);
    if (threadIdx.x == 0) {
        double rms_u = sqrt(su / (double)n);
        scratch[AF_S_DENOM] = (float)fmax(1.0, rms_u / clip);
        scratch[AF_S_ALPHA] =
            scale_parameter ? (float)((double)lr *
                                    fmax((double)eps2, sqrt(sp / (double)n)))
                            : lr;
    }
}

/* The update of element i (kernels.h): u = U / denom, the first moment
 * (m NULL: none), decoupled weight decay, master and bf16 copy. */
__global__ void af_apply_kernel(float *master, bf16 *params, const bf16 *grads,
                                float *m, const float *r, const float *c,
                                size_t n, int cols, float lr, float beta1,
                                float wd, const double *scratch,
                                const float *grad_scale, uint64_t sr_key,
                                uint64_t t)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float scale = scale_of_(grad_scale);
    float imr = cols ? (float)scratch[AF_S_INV_MEAN_R] : 0.0f;
    float denom = (float)scratch[AF_S_DENOM];
    float alpha = (float)scratch[AF_S_ALPHA];
    float u = ld(grads[i]) * scale / sqrtf(vhat_(r, c, cols, imr, i)) / denom;
    if (m) {
        m[i] = beta1 * m[i] + (1.0f - beta1) * u;
        u = m[i];
    }
    if (sr_key) { /* bf16 masters: params are they, rounded as the CPU */
        float p = ld(params[i]);
        p = p - (alpha * u + lr * wd * p);
        params[i] = st(sr_round_bf16(p, sr_bits(sr_key, t, i)));
        return;
    }
    float p = master[i];
    p = p - (alpha * u + lr * wd * p);
    master[i] = p;
    params[i] = st(p);
}

/* ------------------------------------------------------------- launchers */

size_t adafactor_scratch_doubles(size_t numel)
{
    return AF_S_N + 2 * ceil_div(numel > 0 ? numel : 1, AF_CHUNK);
}

void adafactor_update_cuda(const adafactor_tensor_step_cuda *x,
                           const adafactor_hparams_cuda *h,
                           const float *grad_scale, double *scratch,
                           cudaStream_t stream)
{
    size_t n = (size_t)x->rows * (size_t)(x->cols ? x->cols : 1);
    if (n == 0)
        return;
    if (x->cols) {
        af_rows_kernel<<<ceil_div(x->rows, AF_ROWS), 32 * AF_ROWS, 0,
                         stream>>>(x->r, x->grads, x->rows, x->cols, x->beta2,
                                   h->eps1, grad_scale);
        CUDA_CHECK_LAUNCH();
        af_cols_kernel<<<ceil_div(x->cols, 32), dim3(32, AF_ROWS), 0,
                         stream>>>(x->c, x->grads, x->rows, x->cols, x->beta2,
                                   h->eps1, grad_scale);
        CUDA_CHECK_LAUNCH();
        af_mean_r_kernel<<<1, AF_THREADS, 0, stream>>>(scratch, x->r,
                                                       x->rows);
        CUDA_CHECK_LAUNCH();
    } else {
        af_vec_kernel<<<ceil_div(n, AF_THREADS), AF_THREADS, 0, stream>>>(
            x->r, x->grads, n, x->beta2, h->eps1, grad_scale);
        CUDA_CHECK_LAUNCH();
    }
    int nb = (int)ceil_div(n, AF_CHUNK);
    af_sums_kernel<<<nb, AF_THREADS, 0, stream>>>(
        scratch, x->grads, x->master, x->r, x->c, n, x->cols, grad_scale,
        h->scale_parameter, x->params);
    CUDA_CHECK_LAUNCH();
    af_final_kernel<<<1, AF_THREADS, 0, stream>>>(
        scratch, nb, n, h->lr, h->clip_threshold, h->eps2,
        h->scale_parameter);
    CUDA_CHECK_LAUNCH();
    af_apply_kernel<<<ceil_div(n, AF_THREADS), AF_THREADS, 0, stream>>>(
        x->master, x->params, x->grads, x->m, x->r, x->c, n, x->cols, h->lr,
        h->beta1, x->weight_decay, scratch, grad_scale, x->sr_key,
        (uint64_t)x->t);
    CUDA_CHECK_LAUNCH();
}
