/*
 * adamw.c — AdamW optimizer (Loshchilov & Hutter 2019, Algorithm 2,
 * decoupled weight decay) and the gradient sum of squares for global-norm
 * clipping, CPU reference. The formula is in kernels.h.
 *
 * grad_sumsq splits the buffer into a fixed number of chunks (independent of
 * the thread count), sums each in double, then adds the chunk sums in order:
 * the result is bitwise the same for any number of threads.
 */
#include <math.h>
#include "kernels.h"

#define SUMSQ_CHUNKS 64

double grad_sumsq(const float *grads, size_t n)
{
    double part[SUMSQ_CHUNKS];
    size_t chunk = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < SUMSQ_CHUNKS; k++) {
        size_t i0 = (size_t)k * chunk;
        size_t i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++)
            s += (double)grads[i] * grads[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SUMSQ_CHUNKS; k++)
        total += part[k];
    return total;
}

void adamw_update(float *params, const float *grads, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, long t)
{
    /* bias corrections in double: beta^t for large t loses bits in float */
    float bc1 = (float)(1.0 - pow(beta1, (double)t));
    float bc2 = (float)(1.0 - pow(beta2, (double)t));
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}
