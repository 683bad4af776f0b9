/*
 * attention.c — causal multi-head self-attention (Vaswani et al. 2017,
 * §3.2.2), CPU reference. Per batch b and head h, with Q, K, V the (T,hs)
 * head slices of qkv (row stride 3C), P the (T,T) probabilities and
 * scale = 1/sqrt(hs):
 *   S = scale Q K^T;  P[t,:] = softmax over s <= t of S[t,:], 0 for s > t
 *   O = P V
 * Backward, with dO the head's slice of dout:
 *   dP = dO V^T;                    dV += P^T dO
 *   dS[t,s] = scale P[t,s] (dP[t,s] - sum_j P[t,j] dP[t,j])
 *   dQ += dS K;                     dK += dS^T Q
 *
 * The products are GEMM calls (cpu_gemm.h) on the strided head slices, no
 * copies. Rows go in blocks of ATT_ROWS: block [i0, i1) only multiplies
 * columns [0, i1), so the causal upper triangle costs at most one block's
 * width. Work is split over (b,h) in one OpenMP region, each task with a
 * single-threaded GEMM: each task owns its slices of out, att, scratch and
 * dqkv, so every output element is written by one thread in a fixed order
 * (deterministic for any thread count).
 */
#include <math.h>
#include <string.h>
#include "kernels.h"
#include "cpu_math.h"
#include "cpu_gemm.h"

#define ATT_ROWS 64     /* rows per causal block */

/* Row t of P in place: softmax over a[0..t], zeros in a[t+1..T) */
M6_SIMD_CLONES
static void softmax_row_(float *a, int t, int T)
{
    float maxv = max_(a, t + 1);
    for (int s = 0; s <= t; s++)
        a[s] = exp_(a[s] - maxv);
    float inv = 1.0f / sum_(a, t + 1);
    for (int s = 0; s <= t; s++)
        a[s] *= inv;
    for (int s = t + 1; s < T; s++)
        a[s] = 0.0f;
}

/* Row t of the softmax backward in place: d[s] = scale a[s] (d[s] - a.d)
 * for s <= t, zeros in d[t+1..n) */
M6_SIMD_CLONES
static void softmax_row_backward_(float *d, const float *a, float scale,
                                  int t, int n)
{
    float adot = dot_(a, d, t + 1);
    for (int s = 0; s <= t; s++)
        d[s] = scale * a[s] * (d[s] - adot);
    for (int s = t + 1; s < n; s++)
        d[s] = 0.0f;
}

/* Where task bh (batch row b = bh / NH, head h = bh % NH) finds its head
 * at t = 0: qkv, the offset of its query in a (B,T,3C) buffer (key at +C,
 * value at +2C, rows 3C apart); out, of its slice of a (B,T,C) buffer
 * (rows C apart); q, k, v, its query, key and value in qkv itself. */
typedef struct {
    size_t qkv, out;
    const float *q, *k, *v;
} head_at_;

static inline head_at_ head_at_of_(const float *qkv, int bh, int T, int C,
                                   int NH)
{
    size_t b = (size_t)(bh / NH), h = (size_t)(bh % NH), hs = (size_t)(C / NH);
    head_at_ at = {b * T * 3 * C + h * hs, b * T * C + h * hs, NULL, NULL,
                   NULL};
    at.q = qkv + at.qkv;
    at.k = at.q + C;
    at.v = at.q + 2 * C;
    return at;
}

/* the scores' scale, 1/sqrt(hs) (Vaswani et al. 2017, section 3.2.1) */
static inline float scale_of_(int C, int NH)
{
    return 1.0f / sqrtf((float)(C / NH));
}

void attention_forward(float *out, float *att, const float *qkv,
                       int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;

    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        head_at_ at = head_at_of_(qkv, bh, T, C, NH);
        const float *q = at.q, *k = at.k, *v = at.v;
        float *P = att + (size_t)bh * T * T;
        float *o = out + at.out;
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T, M = i1 - i0;
            float *Pb = P + (size_t)i0 * T;
            /* S[i0:i1, 0:i1] = scale Q[i0:i1] K[0:i1]^T */
            gemm_f32_(GEMM_N, GEMM_T, M, i1, hs, scale_of_(C, NH),
                      q + (size_t)i0 * C3, C3, k, C3, 0.0f, Pb, T);
            /* softmax over s <= t; zeros above the diagonal */
            for (int t = i0; t < i1; t++)
                softmax_row_(P + (size_t)t * T, t, T);
            /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
            gemm_f32_(GEMM_N, GEMM_N, M, hs, i1,
                        1.0f, Pb, T, v, C3, 0.0f, o + (size_t)i0 * C, C);
        }
    }
}

/* The backward; first: each task zeroes its (b,h) slices of dqkv before
 * its first product (attention_backward_first), so the caller needs no
 * zeroed buffer and the zeroing runs in parallel, on lines about to be
 * used. */
static void backward_(float *dqkv, float *scratch, const float *dout,
                      const float *qkv, const float *att, int B, int T,
                      int C, int NH, int first)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = scale_of_(C, NH);

    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        head_at_ at = head_at_of_(qkv, bh, T, C, NH);
        const float *q = at.q, *k = at.k, *v = at.v;
        float *dq = dqkv + at.qkv, *dk = dq + C, *dv = dq + 2 * C;
        const float *P = att + (size_t)bh * T * T;
        float *dS = scratch + (size_t)bh * T * T;
        const float *dO = dout + at.out;
        if (first)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < 3; j++)
                    memset(dq + (size_t)t * C3 + (size_t)j * C, 0,
                           (size_t)hs * sizeof(float));
        for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
            int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T, M = i1 - i0;
            const float *Pb = P + (size_t)i0 * T;
            float *dSb = dS + (size_t)i0 * T;
            const float *dOb = dO + (size_t)i0 * C;
            /* dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T, into dS */
            gemm_f32_(GEMM_N, GEMM_T, M, i1, hs,
                        1.0f, dOb, C, v, C3, 0.0f, dSb, T);
            /* dV[0:i1] += P[i0:i1, 0:i1]^T dO[i0:i1] */
            gemm_f32_(GEMM_T, GEMM_N, i1, hs, M,
                        1.0f, Pb, T, dOb, C, 1.0f, dv, C3);
            /* the softmax backward, in place; 0 above the diagonal */
            for (int t = i0; t < i1; t++)
                softmax_row_backward_(dS + (size_t)t * T, P + (size_t)t * T,
                                      scale, t, i1);
            /* dQ[i0:i1] += dS[i0:i1, 0:i1] K[0:i1] */
            gemm_f32_(GEMM_N, GEMM_N, M, hs, i1,
                        1.0f, dSb, T, k, C3, 1.0f, dq + (size_t)i0 * C3, C3);
            /* dK[0:i1] += dS[i0:i1, 0:i1]^T Q[i0:i1] */
            gemm_f32_(GEMM_T, GEMM_N, i1, hs, M,
                        1.0f, dSb, T, q + (size_t)i0 * C3, C3, 1.0f, dk, C3);
        }
    }
}

void attention_backward(float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att,
                        int B, int T, int C, int NH)
{
    backward_(dqkv, scratch, dout, qkv, att, B, T, C, NH, 0);
}

void attention_backward_first(float *dqkv, float *scratch, const float *dout,
                              const float *qkv, const float *att,
                              int B, int T, int C, int NH)
{
    backward_(dqkv, scratch, dout, qkv, att, B, T, C, NH, 1);
}
