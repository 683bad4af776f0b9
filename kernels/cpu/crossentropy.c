/*
 * crossentropy.c — fused softmax + cross-entropy over the vocabulary, CPU
 * reference. For each row i with logits z (V) and target y:
 *   probs = exp(z - max z) / sum exp(z - max z)
 *   loss  = -log probs[y] = log sum exp(z - max z) - (z[y] - max z)
 * (the log-sum-exp form stays finite when probs[y] underflows to 0).
 * Backward: dlogits += (probs - onehot(y)) dloss[i].
 */
#include <math.h>
#include "kernels.h"
#include "cpu_math.h"

/* One row: p (V) = softmax(z); returns the loss of target y */
static M6_SIMD_CLONES float ce_row_(float *restrict p, const float *restrict z,
                                    int32_t y, int V)
{
    float maxv = -INFINITY;
    for (int j = 0; j < V; j++)
        if (z[j] > maxv) maxv = z[j];
    for (int j = 0; j < V; j++)
        p[j] = exp_(z[j] - maxv);
    float sum = sum_(p, V);
    float inv = 1.0f / sum;
    for (int j = 0; j < V; j++)
        p[j] *= inv;
    return logf(sum) - (z[y] - maxv);
}

void softmax_crossentropy_forward(float *losses, float *probs,
                                  const float *logits, const int32_t *targets,
                                  int N, int V)
{
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        losses[i] = ce_row_(probs + (size_t)i * V, logits + (size_t)i * V,
                            targets[i], V);
}

/* The backward; first: dlogits written (p dl), not added (dz + p dl). */
static void backward_(float *dlogits, const float *probs,
                      const int32_t *targets, const float *dlosses, int N,
                      int V, int first)
{
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * V;
        float *dz = dlogits + (size_t)i * V;
        float dl = dlosses[i];
        if (first)
            for (int j = 0; j < V; j++)
                dz[j] = p[j] * dl;
        else
            for (int j = 0; j < V; j++)
                dz[j] += p[j] * dl;
        dz[targets[i]] -= dl;
    }
}

void softmax_crossentropy_backward(float *dlogits, const float *probs,
                                   const int32_t *targets,
                                   const float *dlosses, int N, int V)
{
    backward_(dlogits, probs, targets, dlosses, N, V, 0);
}

void softmax_crossentropy_backward_first(float *dlogits, const float *probs,
                                         const int32_t *targets,
                                         const float *dlosses, int N, int V)
{
    backward_(dlogits, probs, targets, dlosses, N, V, 1);
}
