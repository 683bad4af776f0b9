/*
 * offload_host.h — the host side of an offloaded slot's optimizer step
 * (granular CPU offloading, docs/DESIGN.md "Offloading"): the gradient
 * that lands from the device in bf16 is accumulated in fp32 over
 * microbatches, its sum of squares feeds the global norm for clipping, and
 * AdamW updates the fp32 master and moments in host memory and writes the
 * bf16 working copy that the next step fetches.
 *
 * Used by the host threads of daemon/offload/cuda/gpt_cuda_offload.cu, over element
 * ranges (chunks) of a slot; measured by bench/offload_host.c. Every function
 * here is serial (the caller spreads chunks over its threads) and its result
 * depends only on its inputs and n, never on which thread runs it.
 *
 * These loops move far more bytes than they compute on, so their speed is
 * the host's memory bandwidth. With one microbatch per step the runtime
 * reads the landed bf16 gradient directly (host_sumsq_bf16, host_adamw_bf16
 * with g16) instead of first widening it into the fp32 accumulator: 2 bytes
 * read per parameter instead of 2 read, 4 written and 4 read again. Both
 * give the same bits (widening bf16 to fp32 is exact).
 *
 * bf16 values are their 16 bits (uint16_t): the top half of an IEEE fp32.
 */
#ifndef M6_OFFLOAD_HOST_H
#define M6_OFFLOAD_HOST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fp32 -> bf16 bits, round to nearest even, as __float2bfloat16_rn; a NaN
 * stays a (quiet) NaN. */
static inline uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 bits -> fp32 (exact). */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* acc (n) fp32 = g (n) bf16 widened, or acc += g when accumulate is
 * nonzero (one fp32 add per element, in element order). */
void host_grad_accumulate(float *acc, const uint16_t *g, size_t n,
                          int accumulate);

/* Sum of squares of x (n) in double: element i goes to lane i % 8, the 8
 * lanes are added pairwise at the end. A fixed order, so the same (x, n)
 * gives the same bits on any thread; unlike one running sum (a chain of
 * dependent double adds) it vectorises. host_sumsq_bf16 of bf16 bits gives
 * the bits host_sumsq_f32 gives for the widened values. */
double host_sumsq_f32(const float *x, size_t n);
double host_sumsq_bf16(const uint16_t *x, size_t n);

/* One AdamW step over n parameters, in place, then the bf16 working copy:
 *   g = grad * grad_scale             (grad_scale folds global-norm clipping)
 *   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
 *   master -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + weight_decay * master)
 *   w = bf16(master)
 * with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t computed in double and rounded
 * to float: the formula and rounding of adamw_update (kernels.h;
 * Loshchilov & Hutter 2019, Algorithm 2, decoupled weight decay) and of the
 * device's adamw_kernel. master, m, v (n) fp32; w (n) bf16 bits, written.
 * The gradient is g32 (n, fp32) or, when g32 is NULL, g16 (n, bf16 bits).
 * t >= 1 is the step count of these moments. */
void host_adamw_bf16(float *master, float *m, float *v, uint16_t *w,
                     const float *g32, const uint16_t *g16, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, float grad_scale, long t);

/* host_adamw_bf16 for bf16 master weights (optimizer.master bf16): w (n,
 * bf16 bits) is the master, read widened and written rounded
 * stochastically (kernels/sround.h: sr_round_bf16 with the bits
 * sr_bits(sr_key, t, sr_base + i) for element i; sr_key the tensor's key,
 * sr_base the first element's index in that tensor), the formula of
 * kernels.h adamw_update with a span's sr_key. m, v fp32 (n); gradient
 * g32, or g16 when g32 is NULL, as host_adamw_bf16. */
void host_adamw_sr_bf16(uint16_t *w, float *m, float *v, const float *g32,
                        const uint16_t *g16, size_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay,
                        float grad_scale, long t, uint64_t sr_key,
                        uint64_t sr_base);
/* host_adamw_bf16 out of place: reads master, m, v (n, unchanged) and
 * writes the updated ones to master_out, m_out, v_out and the bf16 copy to
 * w_out, with the same bits as host_adamw_bf16 on the same inputs (the
 * same per-element operations; no element depends on another). The
 * outputs must not overlap the inputs. For the speculative clipped update
 * (daemon/offload/cuda/gpt_cuda_offload.cu), whose second buffers are
 * kept or dropped once the global norm is known. */
void host_adamw_bf16_to(const float *master, const float *m, const float *v,
                        float *master_out, float *m_out, float *v_out,
                        uint16_t *w_out, const float *g32,
                        const uint16_t *g16, size_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay,
                        float grad_scale, long t);

/* w (n) = bf16(master (n)): the working copy after a change of the master
 * that was not an AdamW step (a checkpoint restored, a delink). */
void host_to_bf16(uint16_t *w, const float *master, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* M6_OFFLOAD_HOST_H */
