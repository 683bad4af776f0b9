/*
 * adamw.c — AdamW optimizer (Loshchilov & Hutter 2019, Algorithm 2,
 * decoupled weight decay) and the gradient sum of squares for global-norm
 * clipping, CPU reference. The formula is in kernels.h.
 *
 * grad_sumsq splits the buffer into a fixed number of chunks (independent of
 * the thread count), sums each in double, then adds the chunk sums in order:
 * the result is bitwise the same for any number of threads.
 *
 * The many-buffer forms (grad_sumsq_many, adamw_update_spans) run every
 * buffer in one parallel region, with no barrier between buffers: a model
 * has ~100 tensors, and on a shared machine each region's barrier waited a
 * scheduler slice for a descheduled thread. Each element's arithmetic is
 * that of the one-buffer forms, so the results are bitwise the same.
 */
#include <math.h>
#include <stdlib.h>
#include "kernels.h"
#include "cpu_math.h"

#define SUMSQ_CHUNKS 64

typedef double d8_ __attribute__((vector_size(64)));

/* The chunk sums of one buffer into part[SUMSQ_CHUNKS]; an orphaned
 * worksharing loop (no barrier), run by the enclosing parallel region. */
M6_SIMD_CLONES
static void sumsq_chunks_(double *part, const float *grads, size_t n)
{
    size_t chunk = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
    #pragma omp for schedule(static) nowait
    for (int k = 0; k < SUMSQ_CHUNKS; k++) {
        size_t i0 = (size_t)k * chunk;
        size_t i1 = i0 + chunk < n ? i0 + chunk : n;
        /* 8 interleaved partial sums in one vector (f8_ in cpu_math.h
         * says why not an array), added in a fixed order: one chain of
         * dependent adds ran at the add latency, and the result depends
         * only on the input */
        d8_ acc = {0};
        size_t i = i0;
        for (; i + 8 <= i1; i += 8) {
            f8_ x;
            F8_LOAD_(x, grads + i);
            d8_ xd = __builtin_convertvector(x, d8_);
            acc += xd * xd;
        }
        double s = F8_HSUM_(acc);
        for (; i < i1; i++)
            s += (double)grads[i] * grads[i];
        part[k] = s;
    }
}

static double chunks_total_(const double *part)
{
    double total = 0.0;
    for (int k = 0; k < SUMSQ_CHUNKS; k++)
        total += part[k];
    return total;
}

double grad_sumsq(const float *grads, size_t n)
{
    double part[SUMSQ_CHUNKS];
    #pragma omp parallel
    sumsq_chunks_(part, grads, n);
    return chunks_total_(part);
}

int grad_sumsq_many(double *out, const float *const *bufs, const size_t *ns,
                    int nb)
{
    if (nb <= 0) {
        *out = 0.0;
        return 0;
    }
    double *part = malloc((size_t)nb * SUMSQ_CHUNKS * sizeof(double));
    if (!part)
        return -1;
    #pragma omp parallel
    for (int b = 0; b < nb; b++)
        sumsq_chunks_(part + (size_t)b * SUMSQ_CHUNKS, bufs[b], ns[b]);
    /* the buffers' totals added in order, as grad_sumsq one by one */
    double total = 0.0;
    for (int b = 0; b < nb; b++)
        total += chunks_total_(part + (size_t)b * SUMSQ_CHUNKS);
    free(part);
    *out = total;
    return 0;
}

/* One element's AdamW update (Loshchilov & Hutter 2019, Algorithm 2):
 * m, v updated in place, the new weight returned. g: the scaled
 * gradient; bc1, bc2: the bias corrections 1 - beta^t. The one place of
 * the formula for both loops below. */
static inline float adamw_elem_(float p, float g, float *m, float *v,
                                float lr, float beta1, float beta2, float eps,
                                float weight_decay, float bc1, float bc2)
{
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    *m = mi;
    *v = vi;
    return p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
}

/* AdamW over elements [0, n) of one span; an orphaned worksharing loop
 * (no barrier). bc1, bc2: the bias corrections 1 - beta^t. */
M6_SIMD_CLONES
static void adamw_span_(float *params, const float *grads, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, float grad_scale,
                        float bc1, float bc2)
{
    #pragma omp for schedule(static) nowait
    for (size_t i = 0; i < n; i++)
        params[i] = adamw_elem_(params[i], grads[i] * grad_scale, &m[i],
                                &v[i], lr, beta1, beta2, eps, weight_decay,
                                bc1, bc2);
}

/* adamw_span_ for bf16 master weights: the same arithmetic, each new
 * weight rounded to bf16 stochastically (kernels.h sr_round_bf16), the
 * bits of element i at step t from key (sr_bits of base + i). A loop of its own: the
 * fp32 one above stays as it was, vectorised. */
static void adamw_span_sr_(float *params, const float *grads, float *m,
                           float *v, size_t n, float lr, float beta1,
                           float beta2, float eps, float weight_decay,
                           float grad_scale, float bc1, float bc2,
                           uint64_t key, uint64_t base, long t)
{
    #pragma omp for schedule(static) nowait
    for (size_t i = 0; i < n; i++) {
        float p = adamw_elem_(params[i], grads[i] * grad_scale, &m[i], &v[i],
                              lr, beta1, beta2, eps, weight_decay, bc1, bc2);
        params[i] = sr_round_bf16(p, sr_bits(key, (uint64_t)t, base + i));
    }
}

void adamw_update(float *params, const float *grads, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, long t)
{
    /* bias corrections in double: beta^t for large t loses bits in float */
    float bc1 = (float)(1.0 - pow(beta1, (double)t));
    float bc2 = (float)(1.0 - pow(beta2, (double)t));
    #pragma omp parallel
    adamw_span_(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay,
                grad_scale, bc1, bc2);
}

void adamw_update_spans(const adamw_span *spans, int ns, float lr,
                        float beta1, float beta2, float eps, float grad_scale)
{
    #pragma omp parallel
    for (int k = 0; k < ns; k++) {
        const adamw_span *sp = &spans[k];
        float bc1 = (float)(1.0 - pow(beta1, (double)sp->t));
        float bc2 = (float)(1.0 - pow(beta2, (double)sp->t));
        if (sp->sr_key)
            adamw_span_sr_(sp->params, sp->grads, sp->m, sp->v, sp->n, lr,
                           beta1, beta2, eps, sp->weight_decay, grad_scale,
                           bc1, bc2, sp->sr_key, sp->sr_base, sp->t);
        else
            adamw_span_(sp->params, sp->grads, sp->m, sp->v, sp->n, lr,
                        beta1, beta2, eps, sp->weight_decay, grad_scale, bc1,
                        bc2);
    }
}
