/*
 * offload_host.c — the host side of an offloaded slot's optimizer step
 * (offload_host.h). Plain loops the compiler vectorises (SSE2 on any
 * x86-64: -O3 -fno-math-errno, see kernels/meson.build); memory bound.
 */
#include <math.h>
#include "offload_host.h"
#include "sround.h"

void host_grad_accumulate(float *acc, const uint16_t *g, size_t n,
                          int accumulate)
{
    if (accumulate)
        for (size_t i = 0; i < n; i++)
            acc[i] += bf16_to_f32(g[i]);
    else
        for (size_t i = 0; i < n; i++)
            acc[i] = bf16_to_f32(g[i]);
}

#define LANES 8

/* the lanes' sums, pairwise: ((0+1)+(2+3))+((4+5)+(6+7)) */
static double lanes_total_(const double s[LANES])
{
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

double host_sumsq_f32(const float *x, size_t n)
{
    double s[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++)
            s[l] += (double)x[i + l] * x[i + l];
    for (int l = 0; i < n; i++, l++)
        s[l] += (double)x[i] * x[i];
    return lanes_total_(s);
}

double host_sumsq_bf16(const uint16_t *x, size_t n)
{
    double s[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            double f = bf16_to_f32(x[i + l]);
            s[l] += f * f;
        }
    for (int l = 0; i < n; i++, l++) {
        double f = bf16_to_f32(x[i]);
        s[l] += f * f;
    }
    return lanes_total_(s);
}

/* one element of AdamW (the formula in offload_host.h); returns the new
 * master */
static inline float adamw_one_(float *master, float *m, float *v, float g,
                               float lr, float b1, float b2, float eps,
                               float wd, float bc1, float bc2)
{
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    float p = *master;
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    *m = mi;
    *v = vi;
    *master = p;
    return p;
}

void host_adamw_bf16(float *master, float *m, float *v, uint16_t *w,
                     const float *g32, const uint16_t *g16, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, float grad_scale, long t)
{
    /* bias corrections in double: beta^t for large t loses bits in float */
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    if (g32)
        for (size_t i = 0; i < n; i++)
            w[i] = bf16_from_f32(adamw_one_(&master[i], &m[i], &v[i],
                                            g32[i] * grad_scale, lr, beta1,
                                            beta2, eps, weight_decay, bc1,
                                            bc2));
    else
        for (size_t i = 0; i < n; i++)
            w[i] = bf16_from_f32(adamw_one_(&master[i], &m[i], &v[i],
                                            bf16_to_f32(g16[i]) * grad_scale,
                                            lr, beta1, beta2, eps,
                                            weight_decay, bc1, bc2));
}

void host_adamw_sr_bf16(uint16_t *w, float *m, float *v, const float *g32,
                        const uint16_t *g16, size_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay,
                        float grad_scale, long t, uint64_t sr_key,
                        uint64_t sr_base)
{
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    for (size_t i = 0; i < n; i++) {
        float p = bf16_to_f32(w[i]);
        float g = g32 ? g32[i] : bf16_to_f32(g16[i]);
        adamw_one_(&p, &m[i], &v[i], g * grad_scale, lr, beta1, beta2, eps,
                   weight_decay, bc1, bc2);
        /* a bf16 value widened: its top half is it (NaN stays NaN) */
        w[i] = bf16_from_f32(sr_round_bf16(p, sr_bits(sr_key, (uint64_t)t,
                                                      sr_base + i)));
    }
}

/* one element of AdamW from (p0, m0, v0) into (*p1, *m1, *v1): the same
 * operations, in the same order, as adamw_one_ */
static inline float adamw_one_to_(float p0, float m0, float v0, float *p1,
                                  float *m1, float *v1, float g, float lr,
                                  float b1, float b2, float eps, float wd,
                                  float bc1, float bc2)
{
    float mi = b1 * m0 + (1.0f - b1) * g;
    float vi = b2 * v0 + (1.0f - b2) * g * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    float p = p0;
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    *m1 = mi;
    *v1 = vi;
    *p1 = p;
    return p;
}

void host_adamw_bf16_to(const float *master, const float *m, const float *v,
                        float *master_out, float *m_out, float *v_out,
                        uint16_t *w_out, const float *g32,
                        const uint16_t *g16, size_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay,
                        float grad_scale, long t)
{
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    if (g32)
        for (size_t i = 0; i < n; i++)
            w_out[i] = bf16_from_f32(adamw_one_to_(
                master[i], m[i], v[i], &master_out[i], &m_out[i], &v_out[i],
                g32[i] * grad_scale, lr, beta1, beta2, eps, weight_decay, bc1,
                bc2));
    else
        for (size_t i = 0; i < n; i++)
            w_out[i] = bf16_from_f32(adamw_one_to_(
                master[i], m[i], v[i], &master_out[i], &m_out[i], &v_out[i],
                bf16_to_f32(g16[i]) * grad_scale, lr, beta1, beta2, eps,
                weight_decay, bc1, bc2));
}

void host_to_bf16(uint16_t *w, const float *master, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = bf16_from_f32(master[i]);
}
