/*
 * adafactor.c — the Adafactor optimizer, CPU reference: Shazeer & Stern
 * 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost"
 * (arXiv 1804.04235), Algorithm 4 (factored second moment of a matrix) and
 * Algorithm 5 (full second moment of a vector), with the paper's
 * increasing decay (beta2_t = 1 - t^-c), its update clipping and the
 * first moment it makes optional; an explicit learning rate and decoupled
 * weight decay (Loshchilov & Hutter 2019) instead of the relative step
 * size (which scale_parameter adds back as a factor). The formula is in
 * kernels.h.
 *
 * Each span (one matrix or vector) is updated by one thread, start to end,
 * with its row/column reductions and the RMS of its update summed in
 * double in a fixed order: the result does not depend on the thread
 * count. Spans are shared among the threads of one parallel region.
 */
#include <math.h>
#include <stdlib.h>
#include "kernels.h"

/* RMS(x) over n floats, summed in double. */
static double rms_(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/* The step's update of one span, after its second moment is updated:
 * u = U / max(1, RMS(U)/d) (U = g / sqrt(vhat), g = grads * grad_scale,
 * vhat from vhat_at_), first moment, then the weights. vhat is evaluated
 * twice (once for RMS(U), once to apply), the same expression both times,
 * so no n-float scratch is needed. */
typedef struct {
    const float *r, *c;   /* matrix: row and column means; vector: r (n) */
    float inv_mean_r;     /* matrix: 1 / mean(r) */
    int cols;             /* 0: vector */
} vhat_;

static inline float vhat_at_(const vhat_ *v, size_t i)
{
    if (!v->cols)
        return v->r[i];
    size_t row = i / (size_t)v->cols, col = i % (size_t)v->cols;
    return v->r[row] * v->c[col] * v->inv_mean_r;
}

static void apply_(const adafactor_span *sp, const adafactor_hparams *h,
                   const vhat_ *v, size_t n)
{
    float gs = h->grad_scale;
    double su = 0.0;
    for (size_t i = 0; i < n; i++) {
        float u = sp->grads[i] * gs / sqrtf(vhat_at_(v, i));
        su += (double)u * u;
    }
    double rms_u = sqrt(su / (double)n);
    float denom = (float)fmax(1.0, rms_u / h->clip_threshold);
    float alpha = h->lr;
    if (h->scale_parameter)
        alpha = (float)(h->lr * fmax(h->eps2, rms_(sp->params, n)));
    float lr_wd = h->lr * sp->weight_decay;
    float b1 = h->beta1;
    for (size_t i = 0; i < n; i++) {
        float u = sp->grads[i] * gs / sqrtf(vhat_at_(v, i)) / denom;
        if (sp->m) {
            sp->m[i] = b1 * sp->m[i] + (1.0f - b1) * u;
            u = sp->m[i];
        }
        float p = sp->params[i] - (alpha * u + lr_wd * sp->params[i]);
        /* bf16 masters: rounded stochastically (kernels.h sr_round_bf16) */
        sp->params[i] = sp->sr_key ? sr_round_bf16(p, sr_bits(sp->sr_key,
                                                               (uint64_t)sp->t, i))
                                   : p;
    }
}

/* One matrix span (rows x cols): the factored second moment, then apply_.
 * colsum: cols doubles of scratch. */
static void matrix_(const adafactor_span *sp, const adafactor_hparams *h,
                    float b2, double *colsum)
{
    size_t R = (size_t)sp->rows, C = (size_t)sp->cols;
    float gs = h->grad_scale, eps1 = h->eps1;
    for (size_t j = 0; j < C; j++)
        colsum[j] = 0.0;
    for (size_t i = 0; i < R; i++) {
        const float *g = sp->grads + i * C;
        double rs = 0.0;
        for (size_t j = 0; j < C; j++) {
            double gg = (double)(g[j] * gs) * (g[j] * gs) + eps1;
            rs += gg;
            colsum[j] += gg;
        }
        sp->r[i] = b2 * sp->r[i] + (1.0f - b2) * (float)(rs / (double)C);
    }
    for (size_t j = 0; j < C; j++)
        sp->c[j] = b2 * sp->c[j] + (1.0f - b2) * (float)(colsum[j] / (double)R);
    double mr = 0.0;
    for (size_t i = 0; i < R; i++)
        mr += sp->r[i];
    mr /= (double)R;
    vhat_ v = {sp->r, sp->c, (float)(1.0 / mr), sp->cols};
    apply_(sp, h, &v, R * C);
}

/* One vector span (rows elements): the full second moment, then apply_. */
static void vector_(const adafactor_span *sp, const adafactor_hparams *h,
                    float b2)
{
    size_t n = (size_t)sp->rows;
    float gs = h->grad_scale;
    for (size_t i = 0; i < n; i++) {
        float g = sp->grads[i] * gs;
        sp->r[i] = b2 * sp->r[i] +
                   (1.0f - b2) * (float)((double)g * g + h->eps1);
    }
    vhat_ v = {sp->r, NULL, 0.0f, 0};
    apply_(sp, h, &v, n);
}

float adafactor_beta2(long t, float decay_rate)
{
    return (float)(1.0 - pow((double)t, -(double)decay_rate));
}

int adafactor_update_spans(const adafactor_span *spans, int ns,
                           const adafactor_hparams *h)
{
    int maxc = 0;
    for (int k = 0; k < ns; k++)
        if (spans[k].cols > maxc)
            maxc = spans[k].cols;
    int rc = 0;
    #pragma omp parallel
    {
        double *colsum = maxc ? malloc((size_t)maxc * sizeof *colsum) : NULL;
        if (maxc && !colsum) {
            #pragma omp atomic write
            rc = -1;
        }
        #pragma omp barrier
        if (rc == 0) {
            #pragma omp for schedule(dynamic, 1)
            for (int k = 0; k < ns; k++) {
                const adafactor_span *sp = &spans[k];
                float b2 = adafactor_beta2(sp->t, h->decay_rate);
                if (sp->cols)
                    matrix_(sp, h, b2, colsum);
                else
                    vector_(sp, h, b2);
            }
        }
        free(colsum);
    }
    return rc;
}
