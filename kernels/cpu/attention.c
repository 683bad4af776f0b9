/*
 * attention.c — causal multi-head self-attention (Vaswani et al. 2017,
 * §3.2.2), CPU reference. Per batch b and head h, with q, k, v the (T,hs)
 * head slices of qkv (row stride 3C) and scale = 1/sqrt(hs):
 *   pre[t,s] = scale q[t]·k[s]            for s <= t (causal)
 *   att[t,:] = softmax(pre[t,:]),  att[t,s] = 0 for s > t
 *   out[t]   = sum_s att[t,s] v[s]
 * Backward, for s <= t:
 *   datt[t,s] = dout[t]·v[s];          dv[s] += att[t,s] dout[t]
 *   dpre[t,s] = att[t,s] (datt[t,s] - sum_j att[t,j] datt[t,j])
 *   dq[t] += scale sum_s dpre[t,s] k[s];  dk[s] += scale dpre[t,s] q[t]
 * Work is split over (b,h): each task owns its slices of out, att and dqkv,
 * so every output element is written by one thread in a fixed order.
 * Head slices are small (hs = 64 at the model sizes we train), so plain loops
 * with the vectorisable helpers of cpu_math.h (fixed summation order) are
 * used rather than per-head sgemm calls.
 */
#include <math.h>
#include "kernels.h"
#include "cpu_math.h"

/* y += alpha x over n */
static inline void axpy_(float *restrict y, float alpha,
                         const float *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

void attention_forward(float *out, float *att, const float *qkv,
                       int B, int T, int C, int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);

    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        for (int t = 0; t < T; t++) {
            const float *q = base + t * C3;
            float *a = att + ((size_t)bh * T + t) * T;
            float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;

            /* scores and their max */
            float maxv = -INFINITY;
            for (int s = 0; s <= t; s++) {
                const float *k = base + s * C3 + C;
                float v = scale * dot_(q, k, hs);
                a[s] = v;
                if (v > maxv) maxv = v;
            }
            /* softmax over s <= t; zeros above the diagonal */
            for (int s = 0; s <= t; s++)
                a[s] = exp_(a[s] - maxv);
            float inv = 1.0f / sum_(a, t + 1);
            for (int s = 0; s <= t; s++)
                a[s] *= inv;
            for (int s = t + 1; s < T; s++)
                a[s] = 0.0f;

            /* out = att @ v */
            for (int i = 0; i < hs; i++)
                o[i] = 0.0f;
            for (int s = 0; s <= t; s++)
                axpy_(o, a[s], base + s * C3 + 2 * C, hs);
        }
    }
}

void attention_backward(float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att,
                        int B, int T, int C, int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);

    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        float *dbase = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
        for (int t = 0; t < T; t++) {
            const float *a = att + ((size_t)bh * T + t) * T;
            float *dpre = scratch + ((size_t)bh * T + t) * T;
            const float *d = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
            const float *q = base + t * C3;
            float *dq = dbase + t * C3;

            /* datt = dout·v and dv += att dout; then the softmax backward */
            float adot = 0.0f;
            for (int s = 0; s <= t; s++) {
                float da = dot_(d, base + s * C3 + 2 * C, hs);
                dpre[s] = da;
                adot += a[s] * da;
                axpy_(dbase + s * C3 + 2 * C, a[s], d, hs);
            }
            for (int s = 0; s <= t; s++)
                dpre[s] = scale * a[s] * (dpre[s] - adot);

            /* dq += dpre @ k, dk += dpre^T q */
            for (int s = 0; s <= t; s++) {
                axpy_(dq, dpre[s], base + s * C3 + C, hs);
                axpy_(dbase + s * C3 + C, dpre[s], q, hs);
            }
        }
    }
}
