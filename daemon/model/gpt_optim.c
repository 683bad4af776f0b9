/*
 * gpt_optim.c — the optimizer over a gpt_model's parameters: the gradient
 * norm, AdamW and Adafactor steps (on the globals and each slot, fp32 or
 * bf16 masters), and the ZeRO-1 shard of the optimizer state
 * (optimizer.shard: the ranges a rank owns and the state it keeps). The
 * update rules themselves are kernels/ (adamw.c, adafactor.c); this file
 * lays their spans over the model's storage (model/gpt.c).
 */
#include "model/gpt.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model/facts.h"
#include "model/gpt_internal.h"

/* ------------------------------------------------------------- optimizer */

float gpt_grad_norm_with(const gpt_model *g, const double *slot_sumsq)
{
    gpt_grads_settle(g);
    /* the buffers here in one parallel region up to the first slot that
     * is elsewhere, then one by one: the same sum in the same order
     * (grad_sumsq_many) */
    int S = g->S, k = 0;
    while (k < S && !g->offloaded[k])
        k++;
    const float **bufs = malloc((size_t)(1 + k) * sizeof *bufs);
    size_t *ns = malloc((size_t)(1 + k) * sizeof *ns);
    double sum = 0.0;
    int rc = -1;
    if (bufs && ns) {
        bufs[0] = g->grads;
        ns[0] = g->n_global;
        for (int s = 0; s < k; s++) {
            bufs[1 + s] = g->slots[s].grads;
            ns[1 + s] = gpt_slot_floats(g, s);
        }
        rc = grad_sumsq_many(&sum, bufs, ns, 1 + k);
    }
    if (rc != 0) { /* out of memory: buffer by buffer */
        sum = grad_sumsq(g->grads, g->n_global);
        for (int s = 0; s < k; s++)
            sum += grad_sumsq(g->slots[s].grads, gpt_slot_floats(g, s));
    }
    free(bufs);
    free(ns);
    for (int s = k; s < S; s++)
        sum += g->offloaded[s]
                   ? slot_sumsq[s]
                   : grad_sumsq(g->slots[s].grads, gpt_slot_floats(g, s));
    return (float)sqrt(sum);
}

float gpt_grad_norm(const gpt_model *g)
{
    gpt_grads_settle(g);
    /* all buffers in one parallel region; the same sum as one by one */
    int nb = 1 + g->S;
    const float **bufs = malloc((size_t)nb * sizeof *bufs);
    size_t *ns = malloc((size_t)nb * sizeof *ns);
    double sum = 0.0;
    int rc = -1;
    if (bufs && ns) {
        bufs[0] = g->grads;
        ns[0] = g->n_global;
        for (int s = 0; s < g->S; s++) {
            bufs[1 + s] = g->slots[s].grads;
            ns[1 + s] = gpt_slot_floats(g, s);
        }
        rc = grad_sumsq_many(&sum, bufs, ns, nb);
    }
    if (rc != 0) { /* out of memory: buffer by buffer */
        sum = grad_sumsq(g->grads, g->n_global);
        for (int s = 0; s < g->S; s++)
            sum += grad_sumsq(g->slots[s].grads, gpt_slot_floats(g, s));
    }
    free(bufs);
    free(ns);
    return (float)sqrt(sum);
}

/* The stochastic-rounding key of the span at offset in region (-1 the
 * globals, else slot s) of g, 0 with fp32 masters, as the whole model
 * (every expert) keys it: under expert parallelism a slot holds a rank's
 * experts only, and they are rounded as one rank rounds them. whole 1: the
 * span is a slot tensor (AdamW's), keyed by the whole model's tensor, *base
 * its first element there; 0: the span is one expert's tensor or inside a
 * dense tensor (Adafactor's), keyed by its own place in the whole model,
 * *base 0. */
static uint64_t sr_key_(const gpt_model *g, int region, size_t offset,
                        int whole, uint64_t *base)
{
    *base = 0;
    if (!g->master_bf16)
        return 0;
    if (region >= 0 && g->cfg.moe_ep_size > 1 && g->slot_moe[region]) {
        model_config all = g->cfg;
        all.moe_ep_size = all.moe_ep_rank = 0;
        gpt_tensor ta[SLOT_NTENSORS_MAX], tl[SLOT_NTENSORS_MAX];
        size_t sa, sl;
        gpt_slot_layout(&all, 1, ta, &sa);
        gpt_slot_layout(&g->cfg, 1, tl, &sl);
        int first;
        model_local_experts(&g->cfg, &first);
        for (int i = 0; i < SLOT_NTENSORS_MAX; i++) {
            if (offset < tl[i].offset || offset >= tl[i].offset + tl[i].numel)
                continue;
            int expert = i >= SLOT_FC_W && i <= SLOT_FCPROJ_B;
            size_t skip = expert ? ta[i].numel / (size_t)all.moe_experts *
                                       (size_t)first
                                 : 0;
            if (whole) {
                *base = skip;
                offset = ta[i].offset;
            } else {
                offset = ta[i].offset + skip + (offset - tl[i].offset);
            }
            break;
        }
    }
    return sr_span_key(g->sr_seed, region, offset);
}

/* The AdamW spans of one region (region -1 the globals, else slot s of g;
 * params, grads, m, v with the tensors ts) appended at sp; returns the
 * number appended. */
static int adamw_spans_(const gpt_model *g, int region, adamw_span *sp,
                        float *p, float *gr, float *m, float *v,
                        const gpt_tensor *ts, int nt, long t, float wd)
{
    for (int i = 0; i < nt; i++) {
        size_t o = ts[i].offset;
        uint64_t base;
        uint64_t key = sr_key_(g, region, o, 1, &base);
        sp[i] = (adamw_span){p + o, gr + o, m + o, v + o, ts[i].numel,
                             ts[i].decay ? wd : 0.0f, t, key, base};
    }
    return nt;
}

/* Sharded AdamW spans of region (-1 the globals, else slot s) whose
 * first element is element `base` of the flat layout: each tensor's part
 * inside [shard_lo, shard_hi), its moments at m, v + (element - shard_lo);
 * appended at sp, returns the number appended. AdamW is elementwise, so
 * the parts get the same update as the whole tensors would; bf16 masters
 * round each element with its tensor's key at its place in the tensor
 * (sr_base), so the same bits too. */
static int adamw_shard_spans_(const gpt_model *g, int region, adamw_span *sp,
                              float *p, const float *gr, size_t base,
                              const gpt_tensor *ts, int nt, long t, float wd)
{
    int n = 0;
    for (int i = 0; i < nt; i++) {
        size_t a = base + ts[i].offset, b = a + ts[i].numel;
        size_t lo = a > g->shard_lo ? a : g->shard_lo;
        size_t hi = b < g->shard_hi ? b : g->shard_hi;
        if (lo >= hi)
            continue;
        size_t o = ts[i].offset + (lo - a);
        uint64_t kbase;
        uint64_t key = sr_key_(g, region, ts[i].offset, 1, &kbase);
        sp[n++] = (adamw_span){p + o, gr + o, g->m + (lo - g->shard_lo),
                               g->v + (lo - g->shard_lo), hi - lo,
                               ts[i].decay ? wd : 0.0f, t, key,
                               kbase + (lo - a)};
    }
    return n;
}

void gpt_adamw_slot(gpt_model *g, int s, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale)
{
    const gpt_slot_state *st = &g->slots[s];
    gpt_settle_slot(g, s);
    long t = ++g->adam_t_slot[s];
    adamw_span sp[SLOT_NTENSORS_MAX];
    int n = g->shard_world > 1
                ? adamw_shard_spans_(g, s, sp, st->params, st->grads,
                                     g->n_global + g->slot_off[s],
                                     gpt_slot_tensors(g, s),
                                     gpt_slot_ntensors_of(g, s), t,
                                     weight_decay)
                : adamw_spans_(g, s, sp, st->params, st->grads, st->m, st->v,
                               gpt_slot_tensors(g, s),
                               gpt_slot_ntensors_of(g, s), t, weight_decay);
    adamw_update_spans(sp, n, lr, beta1, beta2, eps, grad_scale);
}

/* gpt_adamw of a model with sharded state: region by region, the step
 * counts of every resident region counted (the same on every rank; an
 * offloaded slot's by its storage's gpt_adamw_slot). */
static void adamw_sharded_(gpt_model *g, float lr, float beta1, float beta2,
                           float eps, float wd, float grad_scale)
{
    adamw_span sp[(int)GLOB_NTENSORS > (int)SLOT_NTENSORS_MAX
                      ? (int)GLOB_NTENSORS : (int)SLOT_NTENSORS_MAX];
    int n = adamw_shard_spans_(g, -1, sp, g->params, g->grads, 0, g->glob,
                               GLOB_NTENSORS, ++g->adam_t_global, wd);
    adamw_update_spans(sp, n, lr, beta1, beta2, eps, grad_scale);
    for (int s = 0; s < g->S; s++) {
        if (g->offloaded[s])
            continue;
        n = adamw_shard_spans_(g, s, sp, g->slots[s].params,
                               g->slots[s].grads,
                               g->n_global + g->slot_off[s],
                               gpt_slot_tensors(g, s),
                               gpt_slot_ntensors_of(g, s),
                               ++g->adam_t_slot[s], wd);
        adamw_update_spans(sp, n, lr, beta1, beta2, eps, grad_scale);
    }
}

void gpt_adamw(gpt_model *g, float lr, float beta1, float beta2, float eps,
               float weight_decay, float grad_scale)
{
    gpt_grads_settle(g);
    if (g->shard_world > 1) {
        adamw_sharded_(g, lr, beta1, beta2, eps, weight_decay, grad_scale);
        return;
    }
    /* every resident tensor in one parallel region */
    adamw_span *sp = malloc(((size_t)GLOB_NTENSORS +
                             (size_t)g->S * SLOT_NTENSORS_MAX) * sizeof *sp);
    if (!sp) { /* out of memory: region by region, the same update */
        long t = ++g->adam_t_global;
        adamw_span gs[GLOB_NTENSORS];
        int n = adamw_spans_(g, -1, gs, g->params, g->grads, g->m, g->v, g->glob,
                             GLOB_NTENSORS, t, weight_decay);
        adamw_update_spans(gs, n, lr, beta1, beta2, eps, grad_scale);
        for (int s = 0; s < g->S; s++)
            if (!g->offloaded[s])
                gpt_adamw_slot(g, s, lr, beta1, beta2, eps, weight_decay,
                               grad_scale);
        return;
    }
    long t = ++g->adam_t_global;
    int n = adamw_spans_(g, -1, sp, g->params, g->grads, g->m, g->v, g->glob,
                         GLOB_NTENSORS, t, weight_decay);
    for (int s = 0; s < g->S; s++) {
        if (g->offloaded[s])
            continue;
        const gpt_slot_state *st = &g->slots[s];
        n += adamw_spans_(g, s, sp + n, st->params, st->grads, st->m, st->v,
                          gpt_slot_tensors(g, s), gpt_slot_ntensors_of(g, s),
                          ++g->adam_t_slot[s], weight_decay);
    }
    adamw_update_spans(sp, n, lr, beta1, beta2, eps, grad_scale);
    free(sp);
}

/* The Adafactor spans of one region (-1 the globals, else slot s of g;
 * af tensors ts of its kind, nt of them) appended at sp; returns the
 * number appended. */
static int af_spans_(const gpt_model *g, int region, adafactor_span *sp,
                     float *p, const float *gr, float *m, float *v,
                     const gpt_af_tensor *ts, int nt, long t, float wd)
{
    for (int i = 0; i < nt; i++) {
        const gpt_af_tensor *a = &ts[i];
        float *r = v + a->state_off;
        uint64_t base;  /* 0: an Adafactor span is one expert's */
        sp[i] = (adafactor_span){p + a->offset, gr + a->offset,
                                 m ? m + a->offset : NULL, r,
                                 a->cols ? r + a->rows : NULL, a->rows,
                                 a->cols, a->decay ? wd : 0.0f, t,
                                 sr_key_(g, region, a->offset, 0, &base)};
    }
    return nt;
}

/* Sharded Adafactor spans of one region whose parameters start at flat
 * element base and whose v at element vbase of the af layout: the
 * tensors starting inside [shard_lo, shard_hi) (whole tensors: the
 * factored statistics are per tensor), m and v at their offsets from the
 * shard's starts; appended at sp, returns the number appended. */
static int af_shard_spans_(const gpt_model *g, int region,
                           adafactor_span *sp, float *p, const float *gr,
                           size_t base, size_t vbase,
                           const gpt_af_tensor *ts, int nt, long t, float wd)
{
    int n = 0;
    for (int i = 0; i < nt; i++) {
        const gpt_af_tensor *a = &ts[i];
        size_t x = base + a->offset;
        if (x < g->shard_lo || x >= g->shard_hi)
            continue;
        float *r = g->v + (vbase + a->state_off - g->shard_vlo);
        uint64_t kbase;  /* 0: an Adafactor span is one expert's */
        sp[n++] = (adafactor_span){p + a->offset, gr + a->offset,
                                   g->m ? g->m + (x - g->shard_lo) : NULL, r,
                                   a->cols ? r + a->rows : NULL, a->rows,
                                   a->cols, a->decay ? wd : 0.0f, t,
                                   sr_key_(g, region, a->offset, 0, &kbase)};
    }
    return n;
}

int gpt_adafactor(gpt_model *g, const struct adafactor_hparams *h,
                  float weight_decay)
{
    if (!g->adafactor) {
        errno = EINVAL;
        return -1;
    }
    gpt_grads_settle(g);
    const model_config *cfg = &g->cfg;
    int nk[3];
    gpt_af_tensor *tab[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        int region = k == 0 ? -1 : k == 1 ? 0 : cfg->moe_experts > 0;
        nk[k] = gpt_af_tensors(cfg, region, NULL, NULL);
        tab[k] = nk[k] < 0 ? NULL : malloc((size_t)nk[k] * sizeof *tab[k]);
        if (tab[k])
            gpt_af_tensors(cfg, region, tab[k], NULL);
    }
    size_t n_sp = (size_t)nk[0] + (size_t)g->S * (size_t)(nk[1] > nk[2]
                                                          ? nk[1] : nk[2]);
    adafactor_span *sp = malloc(n_sp * sizeof *sp);
    int rc = -1;
    if (!sp || !tab[0] || !tab[1] || !tab[2]) {
        errno = ENOMEM;
        goto out;
    }
    /* the spans first, the step counts only once the update is certain */
    int sh = g->shard_world > 1, n;
    if (sh)
        n = af_shard_spans_(g, -1, sp, g->params, g->grads, 0, 0, tab[0],
                            nk[0], g->adam_t_global + 1, weight_decay);
    else
        n = af_spans_(g, -1, sp, g->params, g->grads, g->m, g->v, tab[0],
                      nk[0], g->adam_t_global + 1, weight_decay);
    for (int s = 0; s < g->S; s++) {
        if (g->offloaded[s])
            continue;
        const gpt_slot_state *st = &g->slots[s];
        int k = 1 + g->slot_moe[s];
        if (sh)
            n += af_shard_spans_(g, s, sp + n, st->params, st->grads,
                                 g->n_global + g->slot_off[s],
                                 g->af_v_global + g->af_v_off[s], tab[k],
                                 nk[k], g->adam_t_slot[s] + 1, weight_decay);
        else
            n += af_spans_(g, s, sp + n, st->params, st->grads, st->m, st->v,
                           tab[k], nk[k], g->adam_t_slot[s] + 1,
                           weight_decay);
    }
    if (adafactor_update_spans(sp, n, h) != 0) {
        errno = ENOMEM;
        goto out;
    }
    g->adam_t_global++;
    for (int s = 0; s < g->S; s++)
        if (!g->offloaded[s])
            g->adam_t_slot[s]++;
    rc = 0;
out:
    for (int k = 0; k < 3; k++)
        free(tab[k]);
    free(sp);
    return rc;
}

int gpt_adafactor_slot(gpt_model *g, int s, const adafactor_hparams *h,
                       float weight_decay)
{
    if (!g->adafactor || s < 0 || s >= g->S) {
        errno = EINVAL;
        return -1;
    }
    gpt_settle_slot(g, s);
    int region = g->slot_moe[s];
    int nt = gpt_af_tensors(&g->cfg, region, NULL, NULL);
    gpt_af_tensor *tab = nt < 0 ? NULL : malloc((size_t)nt * sizeof *tab);
    adafactor_span *sp = nt < 0 ? NULL : malloc((size_t)nt * sizeof *sp);
    int rc = -1;
    if (!tab || !sp) {
        errno = ENOMEM;
        goto out;
    }
    gpt_af_tensors(&g->cfg, region, tab, NULL);
    const gpt_slot_state *st = &g->slots[s];
    int n = g->shard_world > 1
                ? af_shard_spans_(g, s, sp, st->params, st->grads,
                                  g->n_global + g->slot_off[s],
                                  g->af_v_global + g->af_v_off[s], tab, nt,
                                  g->adam_t_slot[s] + 1, weight_decay)
                : af_spans_(g, s, sp, st->params, st->grads, st->m, st->v,
                            tab, nt, g->adam_t_slot[s] + 1, weight_decay);
    if (adafactor_update_spans(sp, n, h) != 0) {
        errno = ENOMEM;
        goto out;
    }
    g->adam_t_slot[s]++;
    rc = 0;
out:
    free(tab);
    free(sp);
    return rc;
}

/* ------------------------------------------------------------- sharding */

void gpt_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi)
{
    if (world <= 1) {
        *lo = 0;
        *hi = n;
        return;
    }
    size_t chunk = gpt_pad_floats((n + (size_t)world - 1) / (size_t)world);
    size_t a = (size_t)rank * chunk;
    *lo = a < n ? a : n;
    *hi = a + chunk < n ? a + chunk : n;
}

/* Adafactor's partition: rank's elements [lo, hi) of gpt_shard_range
 * widened to whole tensors (a tensor is the rank's whose first element
 * is in its range): *plo, *phi in the flat layout, *vlo, *vhi in the af
 * layout. -1 when the af layout's tensors are not in the flat layout's
 * order (the ranges would not be contiguous in both) or out of memory. */
static int af_shard_range_(const gpt_model *g, int world, int rank,
                           size_t *plo, size_t *phi, size_t *vlo, size_t *vhi)
{
    size_t lo, hi, nv = gpt_v_floats_total(g);
    gpt_shard_range(g->n_params, world, rank, &lo, &hi);
    *plo = *phi = g->n_params;
    *vlo = *vhi = nv;
    int found_lo = 0, found_hi = 0, rc = 0;
    size_t last_x = 0, last_v = 0;
    int first = 1;
    for (int s = -1; s < g->S && rc == 0; s++) {
        int region = s < 0 ? -1 : g->slot_moe[s] ? g->cfg.moe_experts > 0 : 0;
        int nt = gpt_af_tensors(&g->cfg, region, NULL, NULL);
        gpt_af_tensor *ts = nt > 0 ? malloc((size_t)nt * sizeof *ts) : NULL;
        if (!ts) {
            rc = -1;
            break;
        }
        gpt_af_tensors(&g->cfg, region, ts, NULL);
        size_t base = s < 0 ? 0 : g->n_global + g->slot_off[s];
        size_t vbase = s < 0 ? 0 : g->af_v_global + g->af_v_off[s];
        for (int i = 0; i < nt; i++) {
            size_t x = base + ts[i].offset, v = vbase + ts[i].state_off;
            if (!first && (x <= last_x || v <= last_v)) {
                rc = -1;
                break;
            }
            first = 0;
            last_x = x;
            last_v = v;
            if (!found_lo && x >= lo) {
                *plo = x;
                *vlo = v;
                found_lo = 1;
            }
            if (!found_hi && x >= hi) {
                *phi = x;
                *vhi = v;
                found_hi = 1;
            }
        }
        free(ts);
    }
    if (world <= 1) {
        *plo = *vlo = 0;
        *phi = g->n_params;
        *vhi = nv;
    }
    return rc;
}

/* Rank's ranges of g's state: flat [lo, hi) (weights, and m), af or flat
 * [vlo, vhi) (v). AdamW: gpt_shard_range's element range for both. */
static int shard_ranges_(const gpt_model *g, int world, int rank, size_t *lo,
                         size_t *hi, size_t *vlo, size_t *vhi)
{
    if (g->adafactor)
        return af_shard_range_(g, world, rank, lo, hi, vlo, vhi);
    gpt_shard_range(g->n_params, world, rank, lo, hi);
    *vlo = *lo;
    *vhi = *hi;
    return 0;
}

int gpt_shard_counts(const gpt_model *g, int world, int v, size_t *counts)
{
    for (int r = 0; r < world; r++) {
        size_t lo, hi, vlo, vhi;
        if (shard_ranges_(g, world, r, &lo, &hi, &vlo, &vhi) != 0) {
            errno = EINVAL;
            return -1;
        }
        counts[r] = v ? vhi - vlo : hi - lo;
    }
    return 0;
}

/* The floats of [a, b) ∩ [c, d) from src (holding [c, d)) into dst
 * (holding [a, b)). */
static void copy_overlap_(float *dst, size_t a, size_t b, const float *src,
                          size_t c, size_t d)
{
    size_t x = a > c ? a : c, y = b < d ? b : d;
    if (x < y && dst && src)
        gpt_copy_floats(dst + (x - a), src + (x - c), y - x);
}

int gpt_set_shard(gpt_model *g, int rank, int world)
{
    size_t lo, hi, vlo, vhi;
    if (world < 1 || rank < 0 || rank >= world ||
        (g->storage && !g->state_on_host) ||
        shard_ranges_(g, world, rank, &lo, &hi, &vlo, &vhi) != 0) {
        errno = EINVAL;
        return -1;
    }
    if (world == g->shard_world && lo == g->shard_lo && hi == g->shard_hi)
        return 0;
    int has_m = !g->adafactor || g->af_first_moment;
    float *m = has_m ? gpt_alloc_floats(hi - lo) : NULL;
    float *v = gpt_alloc_floats(vhi - vlo);
    if ((has_m && !m) || !v) {
        free(m);
        free(v);
        errno = ENOMEM;
        return -1;
    }
    /* the elements the old ranges and the new ones share */
    copy_overlap_(m, lo, hi, g->m, g->shard_lo, g->shard_hi);
    copy_overlap_(v, vlo, vhi, g->v, g->shard_vlo, g->shard_vhi);
    free(g->m);
    free(g->v);
    g->m = m;
    g->v = v;
    g->shard_rank = world > 1 ? rank : 0;
    g->shard_world = world;
    g->shard_lo = lo;
    g->shard_hi = hi;
    g->shard_vlo = vlo;
    g->shard_vhi = vhi;
    for (int s = 0; s < g->S; s++) {
        int whole = world == 1;
        g->slots[s].m = whole && has_m ? gpt_slot_ptr(g, g->m, s) : NULL;
        g->slots[s].v = !whole ? NULL
                        : g->adafactor ? g->v + g->af_v_global + g->af_v_off[s]
                                       : gpt_slot_ptr(g, g->v, s);
    }
    return 0;
}
