/*
 * trainer_ep.c — expert parallelism in the trainer (nodes.expert_parallel
 * P > 1, one expert-parallel group of world_size = P ranks, the cpu
 * backend): the model re-laid to this rank's experts when the group is
 * given, its MoE blocks run by train/moe_ep.c over the group, the part of
 * each MoE slot's gradient that the all-reduce must skip (the local
 * experts: each rank's are other experts, already summed over every
 * rank's tokens by the all-to-all), and the global gradient norm that
 * counts every expert once.
 */
#include "train/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/facts.h"
#include "train/moe_ep.h"

/* one MoE layer's expert-parallel layer, made for N tokens a rank at one
 * capacity (training and evaluation differ: remade when they change) */
typedef struct {
    moe_ep *m;
    int N, capacity;
} ep_layer_;

struct trainer_ep {
    m6_coll *g;              /* the group (the trainer's; not owned) */
    int L;
    ep_layer_ *layers;       /* [L]; unused for dense layers */
    int failed;              /* a collective failed: err says which */
    m6_err err;
    gpt_moe_ext ext;
};

/* slot s's tensor idx through the compute view, weights or gradients */
static float *view_(const gpt_model *g, float *const *v, int s, int idx)
{
    return v[s] + g->kind[g->slot_moe[s]][idx].offset;
}

/* layer l's moe_ep for microbatches of B sequences at the pass's
 * capacity (g->moe_capacity); NULL with e->err when it cannot be made */
static moe_ep *layer_(trainer_ep *e, gpt_model *g, int l, int B)
{
    ep_layer_ *ly = &e->layers[l];
    int N = B * g->T;
    if (ly->m && ly->N == N && ly->capacity == g->moe_capacity)
        return ly->m;
    moe_ep_free(ly->m);
    const model_config *c = &g->cfg;
    moe_dims d = {.N = N, .C = c->n_embd, .E = c->moe_experts,
                  .k = c->moe_prototypes, .H = model_moe_hidden(c),
                  .capacity = g->moe_capacity};
    ly->m = moe_ep_create(&d, e->g, &e->err);
    ly->N = N;
    ly->capacity = g->moe_capacity;
    return ly->m;
}

static void ep_forward_(void *ctx, gpt_model *g, int l, int s, const float *x,
                        float *out, int B)
{
    trainer_ep *e = ctx;
    size_t n = (size_t)B * g->T * g->cfg.n_embd;
    moe_ep *m = e->failed ? NULL : layer_(e, g, l, B);
    float aux = 0, z = 0;
    int dropped = 0;
    if (!m || moe_ep_forward(m, out, &aux, &z, &dropped, x,
                             view_(g, g->w, s, SLOT_GATE_W),
                             view_(g, g->w, s, SLOT_GATE_B),
                             view_(g, g->w, s, SLOT_FC_W),
                             view_(g, g->w, s, SLOT_FC_B),
                             view_(g, g->w, s, SLOT_FCPROJ_W),
                             view_(g, g->w, s, SLOT_FCPROJ_B),
                             &e->err) != 0) {
        /* the group is broken (every later collective fails at once):
         * the step fails when the microbatch returns */
        e->failed = 1;
        memset(out, 0, n * sizeof(float));
        return;
    }
    const model_config *c = &g->cfg;
    gpt_moe_stats_add(&g->moe_stats, aux, z, 1, dropped,
                      (long)B * g->T * c->moe_prototypes, moe_ep_counts(m),
                      c->moe_experts);
}

static void ep_backward_(void *ctx, gpt_model *g, int l, int s,
                         const float *x, int B, float daux, float dz)
{
    trainer_ep *e = ctx;
    moe_ep *m = e->layers[l].m;
    if (e->failed || !m)
        return;
    if (moe_ep_backward(m, g->a.dln, view_(g, g->dw, s, SLOT_GATE_W),
                        view_(g, g->dw, s, SLOT_GATE_B),
                        view_(g, g->dw, s, SLOT_FC_W),
                        view_(g, g->dw, s, SLOT_FC_B),
                        view_(g, g->dw, s, SLOT_FCPROJ_W),
                        view_(g, g->dw, s, SLOT_FCPROJ_B), g->a.dres, x,
                        view_(g, g->w, s, SLOT_GATE_W),
                        view_(g, g->w, s, SLOT_FC_W),
                        view_(g, g->w, s, SLOT_FCPROJ_W), daux, dz,
                        &e->err) != 0)
        e->failed = 1;
}

void trainer_ep_free_(trainer_ep *e)
{
    if (!e)
        return;
    for (int l = 0; l < e->L; l++)
        moe_ep_free(e->layers[l].m);
    free(e->layers);
    m6_err_free(&e->err);
    free(e);
}

void trainer_ep_regroup_(trainer *t, m6_coll *c)
{
    trainer_ep *e = t->ep;
    if (c == e->g)
        return;
    for (int l = 0; l < e->L; l++) {
        moe_ep_free(e->layers[l].m);
        e->layers[l].m = NULL;
    }
    e->g = c;
    if (!c && !e->failed) {
        e->failed = 1;
        m6_err_set(&e->err, M6_EINVALID, "nodes.expert_parallel %d: the "
                   "group is gone and this rank holds only its experts; it "
                   "cannot train alone", t->spec.nodes.expert_parallel);
    }
}

/* ------------------------------------------------------------- layout */

size_t trainer_ep_hole_(const trainer *t, int moe, size_t *h0)
{
    *h0 = 0;
    if (!t->ep || !moe)
        return 0;
    gpt_tensor tab[SLOT_NTENSORS_MAX];
    size_t size;
    gpt_slot_layout(&t->bmodel, 1, tab, &size);
    *h0 = tab[SLOT_FC_W].offset;
    return tab[SLOT_GATE_W].offset - tab[SLOT_FC_W].offset;
}

/* Copy buffer b of every region of the old model (whole) into the new
 * one (this rank's experts). */
static void copy_local_(trainer *t, const backend *from, const backend *to,
                        backend_buf b, const unsigned char *kind)
{
    float *src = from->iface->state_region(from->ctx, b, -1);
    float *dst = to->iface->state_region(to->ctx, b, -1);
    if (!src || !dst)
        return;  /* no such buffer (refused optimizers) */
    memcpy(dst, src, t->n_global * sizeof(float));
    int first, E = t->spec.model.moe_experts;
    model_local_experts(&t->bmodel, &first);
    for (int s = 0; s < n_slots_(t); s++) {
        gpt_tensor all[SLOT_NTENSORS_MAX], loc[SLOT_NTENSORS_MAX];
        size_t sa, sl;
        gpt_slot_layout(&t->spec.model, kind[s], all, &sa);
        gpt_slot_layout(&t->bmodel, kind[s], loc, &sl);
        src = from->iface->state_region(from->ctx, b, s);
        dst = to->iface->state_region(to->ctx, b, s);
        int nt = kind[s] ? SLOT_NTENSORS_MAX : SLOT_NTENSORS;
        for (int i = 0; i < nt; i++) {
            int expert = kind[s] && i >= SLOT_FC_W && i <= SLOT_FCPROJ_B;
            size_t e0 = expert ? all[i].numel / (size_t)E * (size_t)first : 0;
            memcpy(dst + loc[i].offset, src + all[i].offset + e0,
                   loc[i].numel * sizeof(float));
        }
    }
}

int trainer_ep_start_(trainer *t, m6_coll *c, m6_err *err)
{
    int P = t->spec.nodes.expert_parallel, W = m6_coll_world_size(c);
    if (t->ep || P <= 1)
        return 0;
    if (W != P || !t->be.iface->set_moe_ext || m6_coll_device_buffers(c)) {
        m6_err_set(err, M6_EINVALID, "nodes.expert_parallel %d: needs a "
                   "host group of exactly %d ranks and the cpu backend "
                   "(got %d ranks on %s, the %s backend)", P, P, W,
                   m6_coll_backend(c), t->be.iface->name);
        return -1;
    }
    trainer_ep *e = calloc(1, sizeof *e);
    unsigned char *kind = trainer_slot_kinds_(t);
    int L = t->spec.model.n_layer;
    if (e)
        e->layers = calloc((size_t)L, sizeof *e->layers);
    if (!e || !e->layers || !kind) {
        free(kind);
        trainer_ep_free_(e);
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    e->g = c;
    e->L = L;
    e->ext = (gpt_moe_ext){e, ep_forward_, ep_backward_};
    /* the same model with this rank's experts only, then its state */
    backend_setup bs = t->bsetup;
    bs.model = t->spec.model;
    bs.model.moe_ep_size = P;
    bs.model.moe_ep_rank = m6_coll_rank(c);
    gpt_layout_sizes(&bs.model, &bs.n_global, &bs.slot_size);
    bs.n_slots = n_slots_(t);
    bs.pseudo = t->phase == PHASE_PSEUDO;
    backend nb;
    char e1[1024];
    if (backend_cpu_create(&nb, &bs, e1, sizeof e1) != 0) {
        free(kind);
        trainer_ep_free_(e);
        m6_err_set(err, M6_EINTERNAL, "expert parallelism: %s", e1);
        return -1;
    }
    model_config whole = t->bmodel;
    t->bmodel = bs.model;
    long *steps = calloc((size_t)bs.n_slots + 1, sizeof(long));
    int rc = steps && t->be.iface->state_begin(t->be.ctx, 0) == 0 ? 0 : -1;
    if (rc == 0 && nb.iface->state_begin(nb.ctx, 1) == 0) {
        for (int b = BACKEND_PARAMS; b <= BACKEND_V; b++)
            copy_local_(t, &t->be, &nb, (backend_buf)b, kind);
        nb.iface->state_end(nb.ctx, 1);
        t->be.iface->get_adam_steps(t->be.ctx, steps);
        nb.iface->set_adam_steps(nb.ctx, steps);
    } else {
        rc = -1;
    }
    if (steps)
        t->be.iface->state_end(t->be.ctx, 0);
    free(steps);
    free(kind);
    if (rc != 0) {
        t->bmodel = whole;
        nb.iface->free(nb.ctx);
        trainer_ep_free_(e);
        m6_err_set(err, M6_EINTERNAL, "expert parallelism: cannot copy the "
                   "model's state to this rank's experts");
        return -1;
    }
    t->be.iface->free(t->be.ctx);
    t->be = nb;
    t->be.iface->set_moe_ext(t->be.ctx, &e->ext);
    t->ep = e;
    /* the backward's all-to-alls use the group: no all-reduce beside it */
    t->dp_overlap = 0;
    return 0;
}

int trainer_ep_check_(trainer *t, m6_err *err)
{
    if (!t->ep || !t->ep->failed)
        return 0;
    m6_err_free(err);
    *err = t->ep->err;
    t->ep->err = M6_ERR_NONE;
    if (!m6_err_msg(err)[0])
        m6_err_set(err, M6_EINTERNAL, "expert parallelism: an all-to-all "
                   "failed");
    return -1;
}

/* ------------------------------------------------------------- norm */

int trainer_ep_norm_(trainer *t, float *norm, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!kind) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    double dense = 0, experts = 0;
    const float *gr = be->grad_region(t->be.ctx, -1);
    for (size_t i = 0; i < t->n_global; i++)
        dense += (double)gr[i] * gr[i];
    for (int s = 0; s < n_slots_(t); s++) {
        gpt_tensor tab[SLOT_NTENSORS_MAX];
        size_t size, h0, hl = trainer_ep_hole_(t, kind[s], &h0);
        gpt_slot_layout(&t->bmodel, kind[s], tab, &size);
        gr = be->grad_region(t->be.ctx, s);
        for (size_t i = 0; i < size; i++) {
            double v = (double)gr[i] * gr[i];
            if (i >= h0 && i < h0 + hl)
                experts += v;
            else
                dense += v;
        }
    }
    free(kind);
    /* every rank's expert squares, exactly (its own pair of columns:
     * hi and lo), added in rank order */
    int W = t->world;
    float *v = calloc(2 * (size_t)W, sizeof(float));
    if (!v) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    v[2 * t->rank] = (float)experts;
    v[2 * t->rank + 1] = (float)(experts - (double)v[2 * t->rank]);
    if (m6_coll_allreduce_sum(t->coll, v, 2 * (size_t)W, err) != 0) {
        free(v);
        return -1;
    }
    double sum = dense;
    for (int r = 0; r < W; r++)
        sum += (double)v[2 * r] + (double)v[2 * r + 1];
    free(v);
    *norm = (float)sqrt(sum);
    return 0;
}
