/*
 * moe.c — mixture-of-experts feed-forward with expert prototyping (M6-T),
 * CPU reference. The shapes, the routing rule and the losses are in
 * kernels.h (section "mixture of experts"). Outline of one layer:
 *
 *   moe_route       logits = x Wg^T + bg; per prototype: softmax, top-1,
 *                   capacity in token order; dispatch rows expert by expert
 *   moe_forward     gather xe; per expert two GEMMs (matmul.c) and
 *                   GELU; combine out[n] = sum_p gate * ye[slot[n,p]]
 *   moe_aux_losses  Switch balancing loss and ST-MoE z-loss
 *   moe_backward    the reverse, then the softmax and the gate GEMM
 *
 * Every sum runs in a fixed order (tokens ascending, prototypes ascending,
 * experts ascending): results do not depend on the thread count beyond
 * what matmul.c's fixed blocks already fix. Routing decisions are exact
 * float compares, so the CPU and any backend that computes the same probs
 * pick the same experts.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* ------------------------------------------------------------------ router */

void moe_route_top1(float *probs, float *lse, int32_t *expert,
                    int32_t *routed, const float *x, const float *wg,
                    const float *bg, const moe_dims *d)
{
    const int N = d->N, E = d->E, k = d->k, Ep = E / k;
    matmul_forward(probs, x, wg, bg, N, d->C, E);  /* logits, in place */

    /* per prototype: top-1 on the logits (strict > : exact ties go to the
     * lowest index), softmax and its log-sum-exp */
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int p = 0; p < k; p++) {
            float *z = probs + (size_t)n * E + (size_t)p * Ep;
            int best = 0;
            for (int e = 1; e < Ep; e++)
                if (z[e] > z[best]) best = e;
            expert[(size_t)n * k + p] = p * Ep + best;
            float mx = z[best];
            double s = 0.0;
            for (int e = 0; e < Ep; e++) {
                z[e] = expf(z[e] - mx);
                s += z[e];
            }
            float inv = (float)(1.0 / s);
            for (int e = 0; e < Ep; e++) z[e] *= inv;
            lse[(size_t)n * k + p] = mx + (float)log(s);
        }
    }
    memset(routed, 0, (size_t)E * sizeof *routed);
    for (size_t i = 0; i < (size_t)N * k; i++)
        routed[expert[i]]++;
}

int moe_route_plan(int32_t *slot, int32_t *counts, int32_t *offset,
                   int32_t *row_token, const int32_t *expert,
                   const int32_t *before, const moe_dims *d)
{
    const int N = d->N, E = d->E, k = d->k;
    /* capacity in token order, after the group's earlier ranks (seen,
     * scratch in offset: pairs routed to e so far, kept or not); slot
     * holds the place within the expert until the offsets are known */
    int32_t *seen = offset;
    for (int e = 0; e < E; e++)
        seen[e] = before ? before[e] : 0;
    memset(counts, 0, (size_t)E * sizeof *counts);
    int dropped = 0;
    for (int n = 0; n < N; n++) {
        for (int p = 0; p < k; p++) {
            int g = expert[(size_t)n * k + p];
            if (seen[g]++ < d->capacity) {
                slot[(size_t)n * k + p] = counts[g]++;
            } else {
                slot[(size_t)n * k + p] = -1;
                dropped++;
            }
        }
    }
    offset[0] = 0;
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + counts[e];
    for (int n = 0; n < N; n++) {
        for (int p = 0; p < k; p++) {
            int32_t *s = slot + (size_t)n * k + p;
            if (*s < 0) continue;
            *s += offset[expert[(size_t)n * k + p]];
            row_token[*s] = n;
        }
    }
    return dropped;
}

int moe_route(float *probs, float *lse, int32_t *expert, int32_t *slot,
              int32_t *counts, int32_t *routed, int32_t *offset,
              int32_t *row_token, const float *x, const float *wg,
              const float *bg, const moe_dims *d)
{
    moe_route_top1(probs, lse, expert, routed, x, wg, bg, d);
    return moe_route_plan(slot, counts, offset, row_token, expert, NULL, d);
}

/* ----------------------------------------------------------------- forward */

void moe_gather(float *xe, const float *x, const int32_t *row_token, int R,
                int C)
{
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        memcpy(xe + (size_t)r * C, x + (size_t)row_token[r] * C,
               (size_t)C * sizeof(float));
}

void moe_experts_forward(float *hpre, float *hact, float *ye, const float *xe,
                         const int32_t *offset, int nE, const float *w1,
                         const float *b1, const float *w2, const float *b2,
                         int C, int H)
{
    for (int e = 0; e < nE; e++) {
        int r0 = offset[e], n = offset[e + 1] - r0;
        if (n == 0) continue;  /* an expert without tokens is skipped */
        matmul_forward(hpre + (size_t)r0 * H, xe + (size_t)r0 * C,
                       w1 + (size_t)e * H * C, b1 + (size_t)e * H, n, C, H);
        gelu_forward(hact + (size_t)r0 * H, hpre + (size_t)r0 * H,
                     (size_t)n * H);
        matmul_forward(ye + (size_t)r0 * C, hact + (size_t)r0 * H,
                       w2 + (size_t)e * C * H, b2 + (size_t)e * C, n, H, C);
    }
}

void moe_combine(float *out, const float *ye, const float *probs,
                 const int32_t *expert, const int32_t *slot,
                 const moe_dims *d)
{
    const int N = d->N, C = d->C, E = d->E, k = d->k;
    /* prototypes in order */
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        memset(o, 0, (size_t)C * sizeof *o);
        for (int p = 0; p < k; p++) {
            int r = slot[(size_t)n * k + p];
            if (r < 0) continue;
            float g = probs[(size_t)n * E + expert[(size_t)n * k + p]];
            const float *y = ye + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += g * y[c];
        }
    }
}

void moe_forward(float *out, float *xe, float *hpre, float *hact, float *ye,
                 const float *x, const float *probs, const int32_t *expert,
                 const int32_t *slot, const int32_t *offset,
                 const int32_t *row_token, const float *w1, const float *b1,
                 const float *w2, const float *b2, const moe_dims *d)
{
    moe_gather(xe, x, row_token, offset[d->E], d->C);
    moe_experts_forward(hpre, hact, ye, xe, offset, d->E, w1, b1, w2, b2,
                        d->C, d->H);
    moe_combine(out, ye, probs, expert, slot, d);
}

/* ------------------------------------------------------------------ losses */

void moe_prob_sums(double *psum, const float *probs, const moe_dims *d)
{
    const int N = d->N, E = d->E;
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int n = 0; n < N; n++) P += probs[(size_t)n * E + e];
        psum[e] = P;
    }
}

float moe_balance_loss(const int32_t *routed, const double *psum,
                       const moe_dims *d)
{
    const int E = d->E, k = d->k, Ep = E / k, Ng = moe_route_tokens(d);
    double a = 0.0;
    for (int e = 0; e < E; e++)
        a += ((double)routed[e] / Ng) * (psum[e] / Ng);
    return (float)(a * Ep / k);
}

float moe_z_loss(const float *lse, const moe_dims *d)
{
    const int N = d->N, k = d->k;
    double s = 0.0;
    for (size_t i = 0; i < (size_t)N * k; i++) s += (double)lse[i] * lse[i];
    return (float)(s / ((double)N * k));
}

void moe_aux_losses(float *aux, float *z, const float *probs, const float *lse,
                    const int32_t *routed, const moe_dims *d)
{
    double psum[d->E > 0 ? d->E : 1];
    moe_prob_sums(psum, probs, d);
    *aux = moe_balance_loss(routed, psum, d);
    *z = moe_z_loss(lse, d);
}

/* ---------------------------------------------------------------- backward */

void moe_combine_backward(float *dye, float *dlogits, const float *dout,
                          const float *ye, const float *probs,
                          const int32_t *expert, const int32_t *slot,
                          const moe_dims *d)
{
    const int N = d->N, C = d->C, E = d->E, k = d->k;
    /* d(gate * y)/dy = gate: dye[r] = gate * dout[token]; the gate's own
     * gradient dot(dout, y) goes to dlogits, as d/dprobs for now */
    memset(dlogits, 0, (size_t)N * E * sizeof *dlogits);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *go = dout + (size_t)n * C;
        for (int p = 0; p < k; p++) {
            int r = slot[(size_t)n * k + p];
            if (r < 0) continue;
            int g = expert[(size_t)n * k + p];
            float gate = probs[(size_t)n * E + g];
            const float *y = ye + (size_t)r * C;
            float *dy = dye + (size_t)r * C;
            double dg = 0.0;
            for (int c = 0; c < C; c++) {
                dy[c] = gate * go[c];
                dg += (double)go[c] * y[c];
            }
            dlogits[(size_t)n * E + g] += (float)dg;
        }
    }
}

void moe_experts_backward(float *dxe, float *dh1, float *dh2, float *dw1,
                          float *db1, float *dw2, float *db2,
                          const float *dye, const float *xe,
                          const float *hpre, const float *hact,
                          const float *w1, const float *w2,
                          const int32_t *offset, int nE, int C, int H)
{
    const int R = offset[nE];
    /* the input gradients start at 0 (only the rows written here are
     * read) */
    memset(dxe, 0, (size_t)R * C * sizeof *dxe);
    memset(dh1, 0, (size_t)R * H * sizeof *dh1);
    memset(dh2, 0, (size_t)R * H * sizeof *dh2);
    for (int e = 0; e < nE; e++) {
        int r0 = offset[e], n = offset[e + 1] - r0;
        if (n == 0) continue;
        /* ye = hact W2^T + b2 */
        matmul_backward(dh1 + (size_t)r0 * H, dw2 + (size_t)e * C * H,
                        db2 + (size_t)e * C, dye + (size_t)r0 * C,
                        hact + (size_t)r0 * H, w2 + (size_t)e * C * H, n, H, C);
        gelu_backward(dh2 + (size_t)r0 * H, hpre + (size_t)r0 * H,
                      dh1 + (size_t)r0 * H, (size_t)n * H);
        /* hpre = xe W1^T + b1 */
        matmul_backward(dxe + (size_t)r0 * C, dw1 + (size_t)e * H * C,
                        db1 + (size_t)e * H, dh2 + (size_t)r0 * H,
                        xe + (size_t)r0 * C, w1 + (size_t)e * H * C, n, C, H);
    }
}

void moe_scatter_add(float *dx, const float *dxe, const int32_t *slot,
                     const moe_dims *d)
{
    const int N = d->N, C = d->C, k = d->k;
    /* prototypes in order */
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *g = dx + (size_t)n * C;
        for (int p = 0; p < k; p++) {
            int r = slot[(size_t)n * k + p];
            if (r < 0) continue;
            const float *s = dxe + (size_t)r * C;
            for (int c = 0; c < C; c++) g[c] += s[c];
        }
    }
}

void moe_router_backward(float *dx, float *dwg, float *dbg, float *dlogits,
                         const float *x, const float *probs, const float *lse,
                         const int32_t *routed, const float *wg, float daux,
                         float dz, const moe_dims *d)
{
    const int N = d->N, C = d->C, E = d->E, k = d->k, Ep = E / k;
    const int Ng = moe_route_tokens(d);
    /* d aux / d probs[n,e] = daux * Ep f_e / (k N), f_e = routed[e] / Ng
     * (the routing group's fraction; Ng = N for one microbatch); then the
     * softmax of each prototype, dlogit = p (dprob - <p, dprob>), and the
     * z-loss's d z / d logit[n,e] = dz * 2 lse[n,p] p[n,e] / (N k) */
    const double aux_scale = (double)daux * Ep / ((double)k * N);
    const double z_scale = 2.0 * (double)dz / ((double)N * k);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int p = 0; p < k; p++) {
            float *dl = dlogits + (size_t)n * E + (size_t)p * Ep;
            const float *pr = probs + (size_t)n * E + (size_t)p * Ep;
            const int32_t *rt = routed + (size_t)p * Ep;
            double dot = 0.0;
            for (int e = 0; e < Ep; e++) {
                dl[e] += (float)(aux_scale * ((double)rt[e] / Ng));
                dot += (double)pr[e] * dl[e];
            }
            double zl = z_scale * lse[(size_t)n * k + p];
            for (int e = 0; e < Ep; e++)
                dl[e] = (float)((double)pr[e] * ((double)dl[e] - dot + zl));
        }
    }

    /* logits = x Wg^T + bg */
    matmul_backward(dx, dwg, dbg, dlogits, x, wg, N, C, E);
}

void moe_backward(float *dx, float *dwg, float *dbg, float *dw1, float *db1,
                  float *dw2, float *db2, float *dye, float *dh1, float *dh2,
                  float *dxe, float *dlogits, const float *dout, const float *x,
                  const float *probs, const float *lse, const int32_t *expert,
                  const int32_t *slot, const int32_t *routed,
                  const int32_t *offset, const float *xe, const float *hpre, const float *hact,
                  const float *ye, const float *wg, const float *w1,
                  const float *w2, float daux, float dz, const moe_dims *d)
{
    moe_combine_backward(dye, dlogits, dout, ye, probs, expert, slot, d);
    moe_experts_backward(dxe, dh1, dh2, dw1, db1, dw2, db2, dye, xe, hpre,
                         hact, w1, w2, offset, d->E, d->C, d->H);
    moe_scatter_add(dx, dxe, slot, d);
    moe_router_backward(dx, dwg, dbg, dlogits, x, probs, lse, routed, wg,
                        daux, dz, d);
}
