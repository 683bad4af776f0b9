/*
 * test_moe.c — the MoE ops of kernels/cpu/moe.c (expert prototyping, M6-T)
 * against references written here from the math, never from moe.c:
 *
 *  - routing against a brute-force loop over tokens and prototypes (random
 *    inputs, exact ties, capacity overflow), and a case by hand:
 *    k = 2 prototypes of 4 experts, capacity factor 1, 16 tokens all routed
 *    to expert 0 of each prototype: 4 processed per prototype, 24 dropped;
 *  - the balancing loss and the z-loss against hand-computed values;
 *  - the whole block's gradient (gate included, capacity drops included)
 *    against central differences of a double-precision reference forward;
 *  - an expert that gets no tokens (gate bias -1e4) with every scratch and
 *    saved buffer NaN beforehand: its gradient is exactly 0 and nothing is
 *    NaN.
 * Also built with AddressSanitizer (test moe_asan, moe.c compiled in).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "../common/test_main.h"

#define FD_H 1e-5

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rng_float(float lo, float hi)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}
static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}
static int32_t *ialloc(size_t n)
{
    int32_t *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}
static void fill(float *f, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) f[i] = rng_float(lo, hi);
}
static void fill_nan(float *f, size_t n)
{
    for (size_t i = 0; i < n; i++) f[i] = NAN;
}

/* ------------------------------------------------------------ one layer */

/* Everything one MoE layer needs, sized from d. */
typedef struct {
    moe_dims d;
    float *x, *wg, *bg, *w1, *b1, *w2, *b2;             /* inputs, weights */
    float *probs, *lse, *xe, *hpre, *hact, *ye, *out;   /* forward */
    int32_t *expert, *slot, *counts, *routed, *offset, *row_token;
    float *dx, *dwg, *dbg, *dw1, *db1, *dw2, *db2;       /* gradients */
    float *dye, *dh1, *dh2, *dxe, *dlogits, *dout;       /* scratch, seed */
} layer;

static void layer_alloc(layer *L, int N, int C, int E, int k, int H,
                        double cf)
{
    memset(L, 0, sizeof *L);
    L->d = (moe_dims){N, C, E, k, H, moe_capacity(cf, N, E, k), 0};
    size_t NK = (size_t)N * k;
    L->x = falloc((size_t)N * C);
    L->wg = falloc((size_t)E * C);
    L->bg = falloc(E);
    L->w1 = falloc((size_t)E * H * C);
    L->b1 = falloc((size_t)E * H);
    L->w2 = falloc((size_t)E * C * H);
    L->b2 = falloc((size_t)E * C);
    L->probs = falloc((size_t)N * E);
    L->lse = falloc(NK);
    L->xe = falloc(NK * C);
    L->hpre = falloc(NK * H);
    L->hact = falloc(NK * H);
    L->ye = falloc(NK * C);
    L->out = falloc((size_t)N * C);
    L->expert = ialloc(NK);
    L->slot = ialloc(NK);
    L->counts = ialloc(E);
    L->routed = ialloc(E);
    L->offset = ialloc(E + 1);
    L->row_token = ialloc(NK);
    L->dx = falloc((size_t)N * C);
    L->dwg = falloc((size_t)E * C);
    L->dbg = falloc(E);
    L->dw1 = falloc((size_t)E * H * C);
    L->db1 = falloc((size_t)E * H);
    L->dw2 = falloc((size_t)E * C * H);
    L->db2 = falloc((size_t)E * C);
    L->dye = falloc(NK * C);
    L->dh1 = falloc(NK * H);
    L->dh2 = falloc(NK * H);
    L->dxe = falloc(NK * C);
    L->dlogits = falloc((size_t)N * E);
    L->dout = falloc((size_t)N * C);
}

static void layer_free(layer *L)
{
    void *p[] = {L->x, L->wg, L->bg, L->w1, L->b1, L->w2, L->b2, L->probs,
                 L->lse, L->xe, L->hpre, L->hact, L->ye, L->out, L->expert,
                 L->slot, L->counts, L->routed, L->offset, L->row_token, L->dx,
                 L->dwg, L->dbg, L->dw1, L->db1, L->dw2, L->db2, L->dye,
                 L->dh1, L->dh2, L->dxe, L->dlogits, L->dout};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static int layer_forward(layer *L)
{
    int dropped = moe_route(L->probs, L->lse, L->expert, L->slot, L->counts,
                            L->routed, L->offset, L->row_token, L->x, L->wg,
                            L->bg, &L->d);
    moe_forward(L->out, L->xe, L->hpre, L->hact, L->ye, L->x, L->probs,
                L->expert, L->slot, L->offset, L->row_token, L->w1, L->b1,
                L->w2, L->b2, &L->d);
    return dropped;
}

static void layer_backward(layer *L, float daux, float dz)
{
    moe_backward(L->dx, L->dwg, L->dbg, L->dw1, L->db1, L->dw2, L->db2,
                 L->dye, L->dh1, L->dh2, L->dxe, L->dlogits, L->dout, L->x,
                 L->probs, L->lse, L->expert, L->slot, L->routed, L->offset,
                 L->xe, L->hpre, L->hact, L->ye, L->wg, L->w1, L->w2, daux,
                 dz, &L->d);
}

/* ----------------------------------------------- brute-force routing */

/* Token by token and prototype by prototype, from the logits computed
 * here in double: softmax, the first maximum, a running count per
 * expert. Writes expert, kept (1 processed / 0 dropped), returns dropped. */
static int brute_route(const layer *L, int *expert, int *kept, int *per)
{
    const moe_dims *d = &L->d;
    int Ep = d->E / d->k, dropped = 0;
    memset(per, 0, (size_t)d->E * sizeof *per);
    for (int n = 0; n < d->N; n++) {
        for (int p = 0; p < d->k; p++) {
            double best = -INFINITY;
            int arg = -1;
            for (int j = 0; j < Ep; j++) {
                int e = p * Ep + j;
                double z = L->bg[e];
                for (int c = 0; c < d->C; c++)
                    z += (double)L->x[n * d->C + c] * L->wg[e * d->C + c];
                if (z > best) best = z, arg = e;
            }
            expert[n * d->k + p] = arg;
            if (per[arg] < d->capacity) {
                per[arg]++;
                kept[n * d->k + p] = 1;
            } else {
                kept[n * d->k + p] = 0;
                dropped++;
            }
        }
    }
    return dropped;
}

static void check_routing_(layer *L)
{
    const moe_dims *d = &L->d;
    size_t NK = (size_t)d->N * d->k;
    int *expert = calloc(NK, sizeof *expert), *kept = calloc(NK, sizeof *kept);
    int *per = calloc(d->E, sizeof *per);
    int dropped = layer_forward(L);
    assert_int_equal(dropped, brute_route(L, expert, kept, per));
    for (size_t i = 0; i < NK; i++) {
        assert_int_equal(L->expert[i], expert[i]);
        assert_int_equal(L->slot[i] >= 0, kept[i]);
    }
    /* dispatch rows: expert by expert, tokens ascending within each */
    int R = 0;
    for (int e = 0; e < d->E; e++) {
        assert_int_equal(L->counts[e], per[e]);
        assert_int_equal(L->offset[e], R);
        R += per[e];
    }
    assert_int_equal(L->offset[d->E], R);
    for (int e = 0; e < d->E; e++)
        for (int r = L->offset[e] + 1; r < L->offset[e + 1]; r++)
            assert_true(L->row_token[r - 1] < L->row_token[r]);
    for (int n = 0; n < d->N; n++)
        for (int p = 0; p < d->k; p++) {
            int r = L->slot[n * d->k + p];
            if (r < 0) continue;
            assert_int_equal(L->row_token[r], n);
            int e = L->expert[n * d->k + p];
            assert_true(r >= L->offset[e] && r < L->offset[e + 1]);
        }
    free(expert), free(kept), free(per);
}

/* Random inputs at several shapes, some with capacity overflow. */
static void test_routing_random(void **state)
{
    (void)state;
    static const int shapes[][6] = {
        /* N, C, E, k, H, cf*100 */
        {16, 8, 8, 2, 4, 100}, {33, 5, 6, 3, 3, 50}, {20, 4, 4, 1, 2, 125},
        {7, 3, 8, 8, 2, 100},  {64, 8, 16, 4, 4, 30},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *sh = shapes[s];
        layer L;
        layer_alloc(&L, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5] / 100.0);
        fill(L.x, (size_t)sh[0] * sh[1], -1, 1);
        fill(L.wg, (size_t)sh[2] * sh[1], -1, 1);
        fill(L.bg, sh[2], -0.5f, 0.5f);
        fill(L.w1, (size_t)sh[2] * sh[4] * sh[1], -0.5f, 0.5f);
        fill(L.w2, (size_t)sh[2] * sh[1] * sh[4], -0.5f, 0.5f);
        check_routing_(&L);
        layer_free(&L);
    }
}

/* Exact ties: a zero gate gives every expert the same probability, so
 * every token goes to the first expert of each prototype. */
static void test_routing_ties(void **state)
{
    (void)state;
    layer L;
    layer_alloc(&L, 10, 4, 6, 2, 3, 10.0);
    fill(L.x, 40, -1, 1);
    /* wg, bg zero: all logits 0; then two experts tied at the top in the
     * second prototype via equal bias */
    L.bg[4] = 1.0f, L.bg[5] = 1.0f;
    check_routing_(&L);
    for (int n = 0; n < 10; n++) {
        assert_int_equal(L.expert[n * 2 + 0], 0);
        assert_int_equal(L.expert[n * 2 + 1], 4);  /* 4 and 5 tie: lowest */
        assert_int_equal(L.slot[n * 2 + 0] >= 0, 1);
    }
    layer_free(&L);
}

/* Issue 13's case: k = 2 prototypes of 4 experts, capacity factor 1.0, 16
 * tokens all routed to expert 0 of each prototype: capacity
 * ceil(1.0 * 16 / 4) = 4, so 4 tokens per prototype (the first four), and
 * 2 * (16 - 4) = 24 dropped pairs. */
static void test_routing_overflow(void **state)
{
    (void)state;
    layer L;
    layer_alloc(&L, 16, 4, 8, 2, 3, 1.0);
    assert_int_equal(L.d.capacity, 4);
    fill(L.x, 64, -1, 1);
    L.bg[0] = 5.0f, L.bg[4] = 5.0f;
    int dropped = layer_forward(&L);
    assert_int_equal(dropped, 24);
    assert_int_equal(L.counts[0], 4);
    assert_int_equal(L.counts[4], 4);
    assert_int_equal(L.routed[0], 16);
    assert_int_equal(L.routed[4], 16);
    assert_int_equal(L.offset[8], 8);
    for (int n = 0; n < 16; n++)
        for (int p = 0; p < 2; p++)
            assert_int_equal(L.slot[n * 2 + p] >= 0, n < 4);
    /* a token dropped by both prototypes gets exactly 0 */
    for (int n = 4; n < 16; n++)
        for (int c = 0; c < 4; c++)
            assert_true(L.out[n * 4 + c] == 0.0f);
    check_routing_(&L);
    layer_free(&L);
}

/* ------------------------------------------------------------- losses */

/* Balanced routing and uniform probabilities: f_e = P_e = 1/Ep, so
 * Ep * sum_e f_e P_e = Ep * Ep / Ep^2 = 1 exactly. Zero gate: logits 0,
 * probs 1/Ep, lse = log Ep. Balanced f comes from setting routed by hand
 * (the loss reads only probs, lse and routed). */
static void test_aux_balanced(void **state)
{
    (void)state;
    layer L;
    layer_alloc(&L, 8, 4, 8, 2, 2, 1.0);  /* Ep = 4, 8 tokens */
    fill(L.x, 32, -1, 1);
    layer_forward(&L);
    for (int e = 0; e < 8; e++) L.routed[e] = 2;  /* 8 tokens / 4 experts */
    float aux, z;
    moe_aux_losses(&aux, &z, L.probs, L.lse, L.routed, &L.d);
    assert_float_equal(aux, 1.0f, 1e-6f);
    /* z = mean over (n,p) of (log 4)^2 */
    assert_float_equal(z, (float)(log(4.0) * log(4.0)), 1e-6f);
    layer_free(&L);
}

/* Collapsed router: every token to expert 0 of each prototype with
 * probability near 1. f_0 = 1, P_0 = 1 - 3 eps', so aux ~ Ep = 4 (E/k). */
static void test_aux_collapsed(void **state)
{
    (void)state;
    layer L;
    layer_alloc(&L, 16, 4, 8, 2, 2, 1.0);
    fill(L.x, 64, -0.01f, 0.01f);
    L.bg[0] = 20.0f, L.bg[4] = 20.0f;
    layer_forward(&L);
    float aux, z;
    moe_aux_losses(&aux, &z, L.probs, L.lse, L.routed, &L.d);
    /* P_0 = 1 / (1 + 3 e^-20) to within the tiny x: 4 * P_0 */
    double expect = 4.0 / (1.0 + 3.0 * exp(-20.0));
    assert_float_equal(aux, (float)expect, 1e-5f);
    layer_free(&L);
}

/* The z-loss on given logits: N = 2, one prototype of 3 experts, logits
 * [0, ln 2, ln 5] (both tokens; wg = 0), then [1, 1, 1]: lse = ln 8, then
 * 1 + ln 3. */
static void test_zloss_formula(void **state)
{
    (void)state;
    layer L;
    layer_alloc(&L, 2, 1, 3, 1, 1, 1.0);
    L.x[0] = 1.0f, L.x[1] = 1.0f;  /* logits = wg (C = 1) + bg */
    L.bg[0] = 0.0f, L.bg[1] = (float)log(2.0), L.bg[2] = (float)log(5.0);
    layer_forward(&L);
    float aux, z;
    moe_aux_losses(&aux, &z, L.probs, L.lse, L.routed, &L.d);
    double l8 = log(8.0);
    assert_float_equal(L.lse[0], (float)l8, 1e-6f);
    assert_float_equal(z, (float)(l8 * l8), 1e-5f);  /* both tokens alike */
    L.bg[0] = L.bg[1] = L.bg[2] = 1.0f;
    layer_forward(&L);
    moe_aux_losses(&aux, &z, L.probs, L.lse, L.routed, &L.d);
    double l3 = 1.0 + log(3.0);
    assert_float_equal(z, (float)(l3 * l3), 1e-5f);
    layer_free(&L);
}

/* ------------------------------------------------- finite differences */

/* The double reference: the same layer, from the formulas in kernels.h,
 * written out here. Parameters live in one double vector so the central
 * differences can walk it. Routing decisions are made on the double
 * logits; the test checks they match the fp32 ones at the base point and
 * keeps a margin so no perturbation of FD_H flips one. */
typedef struct {
    moe_dims d;
    double *v;      /* x | wg | bg | w1 | b1 | w2 | b2 */
    size_t off[8];  /* offsets of each part; off[7] = total */
    const float *R; /* dout seed (N,C) */
    double daux, dz;
} ref;

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double ref_loss(void *ctx)
{
    ref *r = ctx;
    const moe_dims *d = &r->d;
    const int N = d->N, C = d->C, E = d->E, k = d->k, H = d->H, Ep = E / k;
    const double *x = r->v + r->off[0], *wg = r->v + r->off[1],
                 *bg = r->v + r->off[2], *w1 = r->v + r->off[3],
                 *b1 = r->v + r->off[4], *w2 = r->v + r->off[5],
                 *b2 = r->v + r->off[6];
    double *prob = dalloc((size_t)N * E), *h = dalloc(H);
    int *per = calloc(E, sizeof *per), *rt = calloc(E, sizeof *rt);
    double L = 0.0, z = 0.0;
    for (int n = 0; n < N; n++) {
        for (int p = 0; p < k; p++) {
            double lg[64], mx = -INFINITY, s = 0.0;
            for (int j = 0; j < Ep; j++) {
                int e = p * Ep + j;
                lg[j] = bg[e];
                for (int c = 0; c < C; c++) lg[j] += x[n * C + c] * wg[e * C + c];
                if (lg[j] > mx) mx = lg[j];
            }
            for (int j = 0; j < Ep; j++) s += exp(lg[j] - mx);
            double lse = mx + log(s);
            z += lse * lse;
            int arg = 0;
            for (int j = 0; j < Ep; j++) {
                prob[n * E + p * Ep + j] = exp(lg[j] - lse);
                if (lg[j] > lg[arg]) arg = j;
            }
            int e = p * Ep + arg;
            rt[e]++;
            if (per[e] >= d->capacity) continue;  /* dropped */
            per[e]++;
            double g = prob[n * E + e];
            for (int i = 0; i < H; i++) {
                double a = b1[e * H + i];
                for (int c = 0; c < C; c++)
                    a += w1[((size_t)e * H + i) * C + c] * x[n * C + c];
                h[i] = gelu_d(a);
            }
            for (int c = 0; c < C; c++) {
                double y = b2[e * C + c];
                for (int i = 0; i < H; i++)
                    y += w2[((size_t)e * C + c) * H + i] * h[i];
                L += g * y * r->R[n * C + c];
            }
        }
    }
    double aux = 0.0;
    for (int e = 0; e < E; e++) {
        double P = 0.0;
        for (int n = 0; n < N; n++) P += prob[n * E + e];
        aux += ((double)rt[e] / N) * (P / N);
    }
    aux *= (double)Ep / k;
    z /= (double)N * k;
    free(prob), free(h), free(per), free(rt);
    return L + r->daux * aux + r->dz * z;
}

static double nerr(const float *got, const double *want, size_t n)
{
    double mx = 1e-30, diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(want[i]) > mx) mx = fabs(want[i]);
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= diff)) diff = e;  /* NaN fails */
    }
    return diff / mx;
}

/* The smallest gap between the top-1 and top-2 logit of any (token,
 * prototype), in the fp32 probs: routing is stable under FD_H when it is
 * well above FD_H * (|x| + |w|) * C. */
static double route_margin(const layer *L)
{
    const moe_dims *d = &L->d;
    int Ep = d->E / d->k;
    double m = INFINITY;
    for (int n = 0; n < d->N; n++)
        for (int p = 0; p < d->k; p++) {
            const float *pr = L->probs + (size_t)n * d->E + (size_t)p * Ep;
            double a = -1, b = -1;
            for (int j = 0; j < Ep; j++) {
                if (pr[j] > a) b = a, a = pr[j];
                else if (pr[j] > b) b = pr[j];
            }
            if (Ep > 1 && log(a / b) < m) m = log(a / b);
        }
    return m;
}

static void fd_case_(int N, int C, int E, int k, int H, double cf,
                     float daux, float dz, int want_drops)
{
    layer L;
    layer_alloc(&L, N, C, E, k, H, cf);
    size_t sz[7] = {(size_t)N * C, (size_t)E * C, (size_t)E,
                    (size_t)E * H * C, (size_t)E * H, (size_t)E * C * H,
                    (size_t)E * C};
    float *fp[7] = {L.x, L.wg, L.bg, L.w1, L.b1, L.w2, L.b2};
    float *gp[7] = {L.dx, L.dwg, L.dbg, L.dw1, L.db1, L.dw2, L.db2};
    static const char *names[7] = {"dx", "dwg", "dbg", "dw1", "db1", "dw2",
                                   "db2"};
    /* draw until routing has a margin (a near tie would flip under FD) */
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        for (int i = 0; i < 7; i++) fill(fp[i], sz[i], -1, 1);
        layer_forward(&L);
        if (route_margin(&L) > 1e-3) break;
    }
    int dropped = layer_forward(&L);
    if (want_drops) assert_true(dropped > 0);
    fill(L.dout, (size_t)N * C, -1, 1);
    for (int i = 0; i < 7; i++) memset(gp[i], 0, sz[i] * sizeof(float));
    layer_backward(&L, daux, dz);

    ref r = {.d = L.d, .R = L.dout, .daux = daux, .dz = dz};
    r.off[0] = 0;
    for (int i = 0; i < 7; i++) r.off[i + 1] = r.off[i] + sz[i];
    r.v = dalloc(r.off[7]);
    for (int i = 0; i < 7; i++)
        for (size_t j = 0; j < sz[i]; j++) r.v[r.off[i] + j] = fp[i][j];
    double *g = dalloc(r.off[7]);
    for (size_t j = 0; j < r.off[7]; j++) {
        double v0 = r.v[j];
        r.v[j] = v0 + FD_H;
        double lp = ref_loss(&r);
        r.v[j] = v0 - FD_H;
        double lm = ref_loss(&r);
        r.v[j] = v0;
        g[j] = (lp - lm) / (2 * FD_H);
    }
    /* fp32 forward and backward against the double central differences:
     * fp32 round-off through two GEMMs of length <= max(C, H) and a
     * softmax, relative to the largest entry, measured at 0.5-3e-7 here;
     * 1e-5 leaves room for other BLAS summation orders, while any wrong
     * term (a missing aux or z piece, a wrong gate gradient) is off by
     * 1e-3 or more. */
    for (int i = 0; i < 7; i++) {
        double e = nerr(gp[i], g + r.off[i], sz[i]);
        printf("    N %d C %d E %d k %d H %d cf %.2f  %-4s err %.2e\n", N, C,
               E, k, H, cf, names[i], e);
        if (!(e <= 1e-5)) fail_msg("%s: normalised error %.3e > 1e-5", names[i], e);
    }
    free(r.v), free(g);
    layer_free(&L);
}

static void test_grad_fd(void **state)
{
    (void)state;
    fd_case_(12, 8, 4, 2, 6, 0.75, 0.5f, 0.25f, 1);  /* drops */
    fd_case_(10, 6, 4, 1, 5, 4.0, 0.3f, 0.1f, 0);    /* k = 1: Switch */
    fd_case_(9, 5, 6, 3, 4, 0.5, 1.0f, 1.0f, 1);
    fd_case_(8, 4, 4, 2, 3, 2.0, 0.0f, 0.0f, 0);    /* no aux terms */
}

/* --------------------------------------------------------- empty experts */

/* Expert 1 (prototype 0) and expert 6 (prototype 1) get a gate bias of
 * -1e4: no token routes to them. Every scratch and saved buffer starts as
 * NaN; the weight gradients start at 0 as the trainer zeroes them. Their
 * gradients must stay exactly 0 and nothing may be NaN. */
static void test_empty_expert(void **state)
{
    (void)state;
    const int N = 24, C = 6, E = 8, k = 2, H = 5;
    layer L;
    layer_alloc(&L, N, C, E, k, H, 1.5);
    fill(L.x, (size_t)N * C, -1, 1);
    fill(L.wg, (size_t)E * C, -1, 1);
    fill(L.w1, (size_t)E * H * C, -1, 1);
    fill(L.b1, (size_t)E * H, -1, 1);
    fill(L.w2, (size_t)E * C * H, -1, 1);
    fill(L.b2, (size_t)E * C, -1, 1);
    L.bg[1] = -1e4f, L.bg[6] = -1e4f;
    size_t NK = (size_t)N * k;
    fill_nan(L.probs, (size_t)N * E), fill_nan(L.lse, NK);
    fill_nan(L.xe, NK * C), fill_nan(L.hpre, NK * H);
    fill_nan(L.hact, NK * H), fill_nan(L.ye, NK * C);
    fill_nan(L.out, (size_t)N * C);
    fill_nan(L.dye, NK * C), fill_nan(L.dh1, NK * H);
    fill_nan(L.dh2, NK * H), fill_nan(L.dxe, NK * C);
    fill_nan(L.dlogits, (size_t)N * E);
    layer_forward(&L);
    assert_int_equal(L.routed[1], 0);
    assert_int_equal(L.routed[6], 0);
    fill(L.dout, (size_t)N * C, -1, 1);
    layer_backward(&L, 0.01f, 0.001f);
    int empty[2] = {1, 6};
    for (int t = 0; t < 2; t++) {
        int e = empty[t];
        for (int i = 0; i < H * C; i++) {
            assert_true(L.dw1[(size_t)e * H * C + i] == 0.0f);
            assert_true(L.dw2[(size_t)e * C * H + i] == 0.0f);
        }
        for (int i = 0; i < H; i++) assert_true(L.db1[e * H + i] == 0.0f);
        for (int i = 0; i < C; i++) assert_true(L.db2[e * C + i] == 0.0f);
    }
    float *all[] = {L.out, L.dx, L.dwg, L.dbg, L.dw1, L.db1, L.dw2, L.db2};
    size_t n[] = {(size_t)N * C, (size_t)N * C, (size_t)E * C, E,
                  (size_t)E * H * C, (size_t)E * H, (size_t)E * C * H,
                  (size_t)E * C};
    for (int a = 0; a < 8; a++)
        for (size_t i = 0; i < n[a]; i++) assert_false(isnan(all[a][i]));
    /* a used expert did get a gradient (the test can see one) */
    double s = 0;
    for (int i = 0; i < H * C; i++) s += fabs(L.dw1[i]);
    assert_true(s > 0);
    layer_free(&L);
}

static void test_capacity(void **state)
{
    (void)state;
    assert_int_equal(moe_capacity(1.0, 16, 8, 2), 4);   /* 16 / 4 */
    assert_int_equal(moe_capacity(1.25, 16, 8, 2), 5);  /* ceil(5.0) */
    assert_int_equal(moe_capacity(1.3, 16, 8, 2), 6);   /* ceil(5.2) */
    assert_int_equal(moe_capacity(1.0, 10, 8, 1), 2);   /* ceil(1.25) */
    assert_int_equal(moe_capacity(100.0, 10, 8, 1), 10); /* at most N */
    assert_int_equal(moe_capacity(0.01, 10, 8, 1), 1);  /* at least 1 */
    assert_int_equal(moe_capacity(0, 10, 8, 1), 10);    /* dropless: N */
    assert_int_equal(moe_capacity(0, 16, 8, 2), 16);
}

TEST_MAIN(
    cmocka_unit_test(test_capacity),
    cmocka_unit_test(test_routing_random),
    cmocka_unit_test(test_routing_ties),
    cmocka_unit_test(test_routing_overflow),
    cmocka_unit_test(test_aux_balanced),
    cmocka_unit_test(test_aux_collapsed),
    cmocka_unit_test(test_zloss_formula),
    cmocka_unit_test(test_grad_fd),
    cmocka_unit_test(test_empty_expert))
