/*
 * moe_ep.c — the expert-parallel MoE layer (moe_ep.h): kernels.h's MoE
 * steps with the dispatch rows moved between the ranks of a group by
 * m6_coll_alltoallv.
 *
 * Row orders. On the tokens' rank the R dispatch rows are expert by expert
 * (moe_route), so the rows for owner q are one contiguous run. On the
 * owner the rows arrive sender by sender ("by sender": sender i's rows for
 * local expert 0, then 1, ...); the experts run over them expert by expert
 * ("by expert": expert e's rows from sender 0, then 1, ...), two dense
 * GEMMs each. perm maps a by-expert row to its by-sender row; outputs and
 * gradients go back by sender, so each returns to where its input left.
 */
#include "train/moe_ep.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "model/facts.h"

struct moe_ep {
    moe_dims d;
    m6_coll *g;
    int P, rank;
    int grouped;          /* routing over the group's tokens
                           * (moe_route_tokens(d) > N: capacity_scope
                           * group) */
    int first, El;        /* this rank's experts */
    int *first_of, *El_of; /* [P] every rank's */
    size_t cap_rows;      /* rows the owner side can hold */

    /* the tokens' side: moe_route's plan and the dispatch rows (N*k) */
    float *probs, *lse;                 /* (N,E), (N,k) */
    int32_t *expert, *slot, *counts, *routed, *offset, *row_token;
    /* a routing group (N_group > N): the group's routed (E, the backward's
     * f_e), the lower ranks' (before, E), and the all-to-all of every
     * rank's routed and probability sums (gsend, grecv: P x 2E doubles) */
    int32_t *routed_g, *before;
    double *gsend, *grecv;
    float *xe, *ye, *dye, *dxe, *dlogits;

    /* the owner's side (cap_rows) */
    int32_t *rcounts;     /* [P][El]: rows from sender i for local expert e */
    int32_t *loff;        /* [El + 1] by-expert offsets */
    int32_t *cursor;      /* [El] scratch: the next by-expert row of each */
    int32_t *perm;        /* by-expert row -> by-sender row */
    float *xr, *xl, *hpre, *hact, *yl, *yr, *dh1, *dh2;
    size_t *sb, *rb;      /* [P] bytes, scratch for the all-to-alls */
    int timing_barrier;   /* moe_ep_set_timing_barrier */
    moe_ep_stats stats;
};

static void *alloc_(size_t n, size_t size, int *ok)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        *ok = 0;
    return p;
}

/* m6_coll_alltoallv of sb/rb (set by the caller), timed and counted in
 * m->stats. */
static int alltoall_(moe_ep *m, const void *send, void *recv, m6_err *err)
{
    double t0 = clock_mono_s();
    if (m->timing_barrier) {
        if (m6_coll_barrier(m->g, err) != 0)
            return -1;
        double t1 = clock_mono_s();
        m->stats.wait_seconds += t1 - t0;
        t0 = t1;
    }
    int rc = m6_coll_alltoallv(m->g, send, m->sb, recv, m->rb, err);
    m->stats.seconds += clock_mono_s() - t0;
    m->stats.calls++;
    for (int q = 0; q < m->P; q++)
        if (q != m->rank)
            m->stats.bytes_sent += m->sb[q];
    return rc;
}

moe_ep *moe_ep_create(const moe_dims *d, m6_coll *g, m6_err *err)
{
    if (d->k <= 0 || d->E % d->k != 0 || d->N <= 0 || d->capacity <= 0) {
        m6_err_set(err, M6_EINVALID, "expert parallel MoE: E %d, k %d, N "
                   "%d, capacity %d (k must divide E; N, capacity > 0)",
                   d->E, d->k, d->N, d->capacity);
        return NULL;
    }
    if (d->N_group > 0 && d->N_group != d->N &&
        d->N_group != d->N * m6_coll_world_size(g)) {
        m6_err_set(err, M6_EINVALID, "expert parallel MoE: a routing group "
                   "of %d tokens, neither this rank's %d nor the group's %d",
                   d->N_group, d->N, d->N * m6_coll_world_size(g));
        return NULL;
    }
    if (m6_coll_device_buffers(g)) {
        m6_err_set(err, M6_EINVALID, "expert parallel MoE on the CPU: the "
                   "group's engine (%s) moves device memory; use gloo",
                   m6_coll_backend(g));
        return NULL;
    }
    moe_ep *m = calloc(1, sizeof *m);
    if (!m) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return NULL;
    }
    m->d = *d;
    m->g = g;
    m->P = m6_coll_world_size(g);
    m->rank = m6_coll_rank(g);
    int ok = 1, P = m->P, N = d->N, E = d->E, k = d->k, C = d->C, H = d->H;
    m->first_of = alloc_((size_t)P, sizeof(int), &ok);
    m->El_of = alloc_((size_t)P, sizeof(int), &ok);
    if (ok)
        for (int q = 0; q < P; q++)
            m->El_of[q] = model_expert_range(E, P, q, &m->first_of[q]);
    m->El = ok ? m->El_of[m->rank] : 0;
    m->first = ok ? m->first_of[m->rank] : 0;
    /* every sender sends an expert at most `capacity` rows, and no more
     * than its N*k in all; in a routing group the capacity bounds the
     * rows of all senders together too */
    size_t per = (size_t)m->El * (size_t)d->capacity;
    if (per > (size_t)N * k)
        per = (size_t)N * k;
    m->cap_rows = per * (size_t)P;
    m->grouped = moe_route_tokens(d) > N;
    if (m->grouped && (size_t)m->El * (size_t)d->capacity < m->cap_rows)
        m->cap_rows = (size_t)m->El * (size_t)d->capacity;
    size_t Nk = (size_t)N * k, cr = m->cap_rows;
    m->probs = alloc_((size_t)N * E, sizeof(float), &ok);
    m->lse = alloc_(Nk, sizeof(float), &ok);
    m->expert = alloc_(Nk, sizeof(int32_t), &ok);
    m->slot = alloc_(Nk, sizeof(int32_t), &ok);
    m->counts = alloc_((size_t)E, sizeof(int32_t), &ok);
    m->routed = alloc_((size_t)E, sizeof(int32_t), &ok);
    m->offset = alloc_((size_t)E + 1, sizeof(int32_t), &ok);
    m->row_token = alloc_(Nk, sizeof(int32_t), &ok);
    m->routed_g = alloc_((size_t)E, sizeof(int32_t), &ok);
    m->before = alloc_((size_t)E, sizeof(int32_t), &ok);
    m->gsend = alloc_((size_t)P * 2 * E, sizeof(double), &ok);
    m->grecv = alloc_((size_t)P * 2 * E, sizeof(double), &ok);
    m->xe = alloc_(Nk * C, sizeof(float), &ok);
    m->ye = alloc_(Nk * C, sizeof(float), &ok);
    m->dye = alloc_(Nk * C, sizeof(float), &ok);
    m->dxe = alloc_(Nk * C, sizeof(float), &ok);
    m->dlogits = alloc_((size_t)N * E, sizeof(float), &ok);
    m->rcounts = alloc_((size_t)P * (m->El ? m->El : 1), sizeof(int32_t), &ok);
    m->loff = alloc_((size_t)m->El + 1, sizeof(int32_t), &ok);
    m->cursor = alloc_((size_t)m->El, sizeof(int32_t), &ok);
    m->perm = alloc_(cr, sizeof(int32_t), &ok);
    m->xr = alloc_(cr * C, sizeof(float), &ok);
    m->xl = alloc_(cr * C, sizeof(float), &ok);
    m->hpre = alloc_(cr * H, sizeof(float), &ok);
    m->hact = alloc_(cr * H, sizeof(float), &ok);
    m->yl = alloc_(cr * C, sizeof(float), &ok);
    m->yr = alloc_(cr * C, sizeof(float), &ok);
    m->dh1 = alloc_(cr * H, sizeof(float), &ok);
    m->dh2 = alloc_(cr * H, sizeof(float), &ok);
    m->sb = alloc_((size_t)P, sizeof(size_t), &ok);
    m->rb = alloc_((size_t)P, sizeof(size_t), &ok);
    if (!ok) {
        moe_ep_free(m);
        m6_err_set(err, M6_EINTERNAL, "expert parallel MoE: out of memory "
                   "for its buffers (%zu rows on the owner's side)", cr);
        return NULL;
    }
    return m;
}

int moe_ep_local_experts(const moe_ep *m, int *first)
{
    *first = m->first;
    return m->El;
}

/* This rank's dispatch rows for owner q: [offset[first_q], offset[first_q
 * + El_q]) */
static int rows_for_(const moe_ep *m, int q, int *r0)
{
    *r0 = m->offset[m->first_of[q]];
    return m->offset[m->first_of[q] + m->El_of[q]] - *r0;
}

/* rows of C floats between the tokens' side (the dispatch rows by owner)
 * and the owner's side (by sender): to_owner 1 sends tok and fills own,
 * 0 the reverse. Sizes from the plan and rcounts. */
static int exchange_rows_(moe_ep *m, float *tok, float *own, int to_owner,
                          m6_err *err)
{
    size_t row = (size_t)m->d.C * sizeof(float);
    for (int q = 0; q < m->P; q++) {
        int r0, n = rows_for_(m, q, &r0);
        size_t in = 0;
        for (int e = 0; e < m->El; e++)
            in += (size_t)m->rcounts[(size_t)q * m->El + e];
        m->sb[q] = to_owner ? (size_t)n * row : in * row;
        m->rb[q] = to_owner ? in * row : (size_t)n * row;
    }
    /* the dispatch rows start at row 0 and run owner by owner */
    return to_owner ? alltoall_(m, tok, own, err) : alltoall_(m, own, tok, err);
}

/* by sender <-> by expert, rows of w floats: dir 1 gathers src (by
 * sender) into dst (by expert), 0 scatters back */
static void permute_(const moe_ep *m, float *dst, const float *src, int w,
                     int dir)
{
    int n = m->loff[m->El];
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        size_t a = (size_t)r * w, b = (size_t)m->perm[r] * w;
        if (dir)
            memcpy(dst + a, src + b, (size_t)w * sizeof(float));
        else
            memcpy(dst + b, src + a, (size_t)w * sizeof(float));
    }
}

/* A routing group's first half of the routing: this rank's top-1
 * choices (moe_route_top1), then every rank's routed counts and
 * probability sums to every rank (one all-to-all of 2E doubles each way;
 * counts are exact in double), from which before (the lower ranks'
 * routed), routed_g (the group's) and the group's balancing loss *aux,
 * the sums taken in rank order: the same on every rank. */
static int route_group_(moe_ep *m, const float *x, const float *wg,
                        const float *bg, float *aux, m6_err *err)
{
    const moe_dims *d = &m->d;
    const int P = m->P, E = d->E;
    moe_route_top1(m->probs, m->lse, m->expert, m->routed, x, wg, bg, d);
    double *mine = m->gsend;
    for (int e = 0; e < E; e++)
        mine[e] = (double)m->routed[e];
    moe_prob_sums(mine + E, m->probs, d);
    for (int q = 1; q < P; q++)
        memcpy(m->gsend + (size_t)q * 2 * E, mine, 2 * E * sizeof(double));
    for (int q = 0; q < P; q++)
        m->sb[q] = m->rb[q] = 2 * (size_t)E * sizeof(double);
    if (alltoall_(m, m->gsend, m->grecv, err) != 0)
        return -1;
    double *psum = m->gsend;   /* free again: the group's sums */
    for (int e = 0; e < E; e++) {
        long before = 0, all = 0;
        double ps = 0.0;
        for (int i = 0; i < P; i++) {
            const double *r = m->grecv + (size_t)i * 2 * E;
            long n = (long)r[e];
            if (i < m->rank)
                before += n;
            all += n;
            ps += r[E + e];
        }
        m->before[e] = (int32_t)before;
        m->routed_g[e] = (int32_t)all;
        psum[e] = ps;
    }
    *aux = moe_balance_loss(m->routed_g, psum, d);
    return 0;
}

int moe_ep_forward(moe_ep *m, float *out, float *aux, float *z, int *dropped,
                   const float *x, const float *wg, const float *bg,
                   const float *w1, const float *b1, const float *w2,
                   const float *b2, m6_err *err)
{
    const moe_dims *d = &m->d;
    const int P = m->P, El = m->El;
    int drop;
    if (m->grouped) {
        if (route_group_(m, x, wg, bg, aux, err) != 0)
            return -1;
        drop = moe_route_plan(m->slot, m->counts, m->offset, m->row_token,
                              m->expert, m->before, d);
        *z = moe_z_loss(m->lse, d);
    } else {
        drop = moe_route(m->probs, m->lse, m->expert, m->slot, m->counts,
                         m->routed, m->offset, m->row_token, x, wg, bg, d);
        moe_aux_losses(aux, z, m->probs, m->lse, m->routed, d);
    }
    if (dropped)
        *dropped = drop;
    moe_gather(m->xe, x, m->row_token, m->offset[d->E], d->C);

    /* the per-expert row counts: counts[first_q .. first_q + El_q) to q */
    for (int q = 0; q < P; q++) {
        m->sb[q] = (size_t)m->El_of[q] * sizeof(int32_t);
        m->rb[q] = (size_t)El * sizeof(int32_t);
    }
    /* counts is expert-ordered, so owner q's part starts at first_q and
     * the parts run in rank order */
    if (alltoall_(m, m->counts, m->rcounts, err) != 0)
        return -1;

    /* by-expert offsets, and the map to by-sender rows: the senders'
     * rows arrive in sender order, each sender's expert by expert; each
     * goes to its expert's next free by-expert row (cursor) */
    m->loff[0] = 0;
    for (int e = 0; e < El; e++) {
        int n = 0;
        for (int i = 0; i < P; i++)
            n += m->rcounts[(size_t)i * El + e];
        m->loff[e + 1] = m->loff[e] + n;
    }
    if ((size_t)m->loff[El] > m->cap_rows) {
        m6_err_set(err, M6_EINTERNAL, "expert parallel MoE: %d rows "
                   "received, more than the %zu a sender's capacity allows",
                   m->loff[El], m->cap_rows);
        return -1;
    }
    memcpy(m->cursor, m->loff, (size_t)El * sizeof *m->cursor);
    int sent = 0;  /* by-sender row */
    for (int i = 0; i < P; i++)
        for (int e = 0; e < El; e++)
            for (int r = 0; r < m->rcounts[(size_t)i * El + e]; r++)
                m->perm[m->cursor[e]++] = sent++;

    if (exchange_rows_(m, m->xe, m->xr, 1, err) != 0)
        return -1;
    permute_(m, m->xl, m->xr, d->C, 1);
    moe_experts_forward(m->hpre, m->hact, m->yl, m->xl, m->loff, El, w1, b1,
                        w2, b2, d->C, d->H);
    permute_(m, m->yr, m->yl, d->C, 0);
    if (exchange_rows_(m, m->ye, m->yr, 0, err) != 0)
        return -1;
    moe_combine(out, m->ye, m->probs, m->expert, m->slot, d);
    return 0;
}

int moe_ep_backward(moe_ep *m, float *dx, float *dwg, float *dbg, float *dw1,
                    float *db1, float *dw2, float *db2, const float *dout,
                    const float *x, const float *wg, const float *w1,
                    const float *w2, float daux, float dz, m6_err *err)
{
    const moe_dims *d = &m->d;
    moe_combine_backward(m->dye, m->dlogits, dout, m->ye, m->probs,
                         m->expert, m->slot, d);
    /* the output gradients to the owners, where they meet their rows;
     * yr and xr are free again: they carry dye and dxe by sender */
    if (exchange_rows_(m, m->dye, m->yr, 1, err) != 0)
        return -1;
    permute_(m, m->yl, m->yr, d->C, 1);
    moe_experts_backward(m->xr, m->dh1, m->dh2, dw1, db1, dw2, db2, m->yl,
                         m->xl, m->hpre, m->hact, w1, w2, m->loff, m->El,
                         d->C, d->H);
    /* xr holds dxe by expert now; back to by sender in yr */
    permute_(m, m->yr, m->xr, d->C, 0);
    if (exchange_rows_(m, m->dxe, m->yr, 0, err) != 0)
        return -1;
    moe_scatter_add(dx, m->dxe, m->slot, d);
    moe_router_backward(dx, dwg, dbg, m->dlogits, x, m->probs, m->lse,
                        m->grouped ? m->routed_g : m->routed,
                        wg, daux, dz, d);
    return 0;
}

const int32_t *moe_ep_counts(const moe_ep *m)
{
    return m->counts;
}

void moe_ep_set_timing_barrier(moe_ep *m, int on)
{
    m->timing_barrier = on != 0;
}

void moe_ep_get_stats(const moe_ep *m, moe_ep_stats *out)
{
    *out = m->stats;
}

void moe_ep_free(moe_ep *m)
{
    if (!m)
        return;
    void *bufs[] = {m->first_of, m->El_of, m->probs, m->lse, m->expert,
                    m->slot, m->counts, m->routed, m->offset, m->row_token,
                    m->routed_g, m->before, m->gsend, m->grecv,
                    m->xe, m->ye, m->dye, m->dxe, m->dlogits, m->rcounts,
                    m->loff, m->cursor, m->perm, m->xr, m->xl, m->hpre,
                    m->hact, m->yl, m->yr, m->dh1, m->dh2, m->sb, m->rb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(m);
}
