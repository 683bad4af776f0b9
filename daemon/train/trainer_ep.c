/*
 * trainer_ep.c — expert parallelism in the trainer (nodes.expert_parallel
 * P > 1 on the cpu backend; world_size = D x P, D replicas of an
 * expert-parallel group): the model re-laid to this rank's experts when
 * the group is given, its MoE blocks run by train/moe_ep.c over the
 * expert-parallel group, the part of each MoE slot's gradient that the
 * all-reduce must skip (the local experts: each rank's are other experts,
 * already summed over its group's tokens by the all-to-all, then over the
 * replicas), the global gradient norm that counts every expert once, and
 * the gather of the experts to rank 0 for a save.
 */
#include "train/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/facts.h"
#include "train/moe_ep.h"

/* one MoE layer's expert-parallel layer, made for N tokens a rank at one
 * capacity and routing group (training and evaluation differ: remade when
 * they change) */
typedef struct {
    moe_ep *m;
    int N, capacity, N_group;
} ep_layer_;

struct trainer_ep {
    m6_coll *g;              /* the expert-parallel group of P ranks: the
                              * trainer's own when world = P; not owned */
    m6_coll *edp;            /* the D ranks holding the same experts
                              * (world = D x P, D > 1); NULL: none */
    int P, rank;             /* this rank's experts: model_expert_range */
    int whole;               /* 1: the model holds every expert now (rank
                              * 0 after trainer_ep_gather_root_) until its
                              * next step */
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

/* layer l's moe_ep for microbatches of B sequences in the pass's dims
 * (gpt_moe_dims: its capacity and routing group); NULL with e->err when
 * it cannot be made */
static moe_ep *layer_(trainer_ep *e, gpt_model *g, int l, int B)
{
    ep_layer_ *ly = &e->layers[l];
    moe_dims d = gpt_moe_dims(g, B);
    if (ly->m && ly->N == d.N && ly->capacity == d.capacity &&
        ly->N_group == d.N_group)
        return ly->m;
    moe_ep_free(ly->m);
    ly->m = moe_ep_create(&d, e->g, &e->err);
    ly->N = d.N;
    ly->capacity = d.capacity;
    ly->N_group = d.N_group;
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
                      c->moe_experts, model_moe_layer_index(c, l));
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
    if (!c && e->whole) {
        /* rank 0 holds every expert (gathered for a save): a plain
         * trainer again, whose state a later group's broadcast carries
         * and whose model that group re-lays (trainer_ep_start_) */
        trainer_ep_free_(e);
        t->ep = NULL;
        return;
    }
    m6_coll *g = c && t->ep_given[0] ? t->ep_given[0]
                 : c && m6_coll_world_size(c) == e->P ? c : NULL;
    if (g == e->g && (!g || t->ep_given[1] == e->edp))
        return;
    for (int l = 0; l < e->L; l++) {
        moe_ep_free(e->layers[l].m);
        e->layers[l].m = NULL;
    }
    e->g = g;
    e->edp = g ? t->ep_given[1] : NULL;
    if (!g && !e->failed) {
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

/* ------------------------------------------------------------- runs */

/* A run of floats of one region of a state buffer, in the whole model
 * and in this rank's: n floats at loc in this rank's region; per 0, at
 * all in the whole model's too; per > 0, this rank's experts, per floats
 * each: at all + first * per in the whole model's region, where every
 * rank's follow each other in rank order from all (model_expert_range is
 * contiguous). */
typedef struct {
    size_t all, loc, n, per;
} ep_run_;

/* tensors of one expert in a slot's layout (and in Adafactor's v) */
enum { EXPERT_TENSORS_ = SLOT_FCPROJ_B - SLOT_FC_W + 1 };

/* The runs of a region of buffer b into r[SLOT_NTENSORS_MAX]: region -1
 * the globals, else a slot of kind region (0 dense, 1 MoE). Weights,
 * AdamW's m and v and Adafactor's m: tensor by tensor (an expert
 * tensor is [E x rows, cols], expert by expert); Adafactor's v: the
 * statistics before the experts', then the experts' (gpt_af_tensors:
 * expert by expert, after the gates). Their count (0: the buffer has
 * none), or -1 when out of memory. */
static int runs_(const trainer *t, backend_buf b, int region, ep_run_ *r)
{
    const run_spec *sp = &t->spec;
    if (region < 0) {
        size_t n = trainer_state_floats_(t, b, -1, t->n_global);
        if (n == SIZE_MAX)
            return -1;
        r[0] = (ep_run_){0, 0, n, 0};
        return n > 0;
    }
    int first, E = sp->model.moe_experts;
    int El = model_local_experts(&t->bmodel, &first);
    int af = sp->optimizer.name == OPTIMIZER_ADAFACTOR;
    if (af && b == BACKEND_M && !spec_has_first_moment(sp))
        return 0;
    if (af && b == BACKEND_V) {
        size_t vl;
        int nl = gpt_af_tensors(&t->bmodel, region, NULL, &vl);
        int na = gpt_af_tensors(&sp->model, region, NULL, NULL);
        if (nl < 0 || na < 0)
            return -1;
        r[0] = (ep_run_){0, 0, vl, 0};
        if (!region)
            return 1;
        gpt_af_tensor *tl = malloc((size_t)nl * sizeof *tl);
        gpt_af_tensor *ta = malloc((size_t)na * sizeof *ta);
        if (!tl || !ta || gpt_af_tensors(&t->bmodel, region, tl, NULL) < 0 ||
            gpt_af_tensors(&sp->model, region, ta, NULL) < 0) {
            free(tl);
            free(ta);
            return -1;
        }
        int x = nl - EXPERT_TENSORS_ * El;  /* the first expert's first */
        size_t pre = tl[x].state_off;
        r[0].n = pre;
        r[1] = (ep_run_){ta[x].state_off, pre, vl - pre, (vl - pre) / El};
        free(tl);
        free(ta);
        return 2;
    }
    gpt_tensor all[SLOT_NTENSORS_MAX], loc[SLOT_NTENSORS_MAX];
    size_t sa, sl;
    gpt_slot_layout(&sp->model, region, all, &sa);
    gpt_slot_layout(&t->bmodel, region, loc, &sl);
    int nt = region ? SLOT_NTENSORS_MAX : SLOT_NTENSORS;
    for (int i = 0; i < nt; i++) {
        int expert = region && i >= SLOT_FC_W && i <= SLOT_FCPROJ_B;
        r[i] = (ep_run_){all[i].offset, loc[i].offset, loc[i].numel,
                         expert ? all[i].numel / (size_t)E : 0};
    }
    return nt;
}

/* Copy buffer b of every region of the old model (whole) into the new
 * one (this rank's experts). 0, or -1 when out of memory. */
static int copy_local_(trainer *t, const backend *from, const backend *to,
                       backend_buf b, const unsigned char *kind)
{
    int first;
    model_local_experts(&t->bmodel, &first);
    ep_run_ r[SLOT_NTENSORS_MAX];
    for (int s = -1; s < n_slots_(t); s++) {
        int n = runs_(t, b, s < 0 ? -1 : kind[s], r);
        if (n < 0)
            return -1;
        float *src = n ? from->iface->state_region(from->ctx, b, s) : NULL;
        float *dst = n ? to->iface->state_region(to->ctx, b, s) : NULL;
        for (int i = 0; src && dst && i < n; i++)
            memcpy(dst + r[i].loc, src + r[i].all + (size_t)first * r[i].per,
                   r[i].n * sizeof(float));
    }
    return 0;
}

/* A backend of model m (the spec's model, m's moe_ep_* set or not) in
 * t's current phase and slots, into *nb. Offloading, its memory plan is
 * m's own (a rank's slots hold only its experts: smaller slots, so more
 * of them may be resident), made as the run's was (the same budget and
 * decision on offload.speculative). 0, or -1 with err. */
static int backend_of_(trainer *t, const model_config *m, backend *nb,
                       m6_err *err)
{
    backend_setup bs = t->bsetup;
    bs.model = *m;
    gpt_layout_sizes(&bs.model, &bs.n_global, &bs.slot_size);
    bs.n_slots = n_slots_(t);
    bs.pseudo = t->phase == PHASE_PSEUDO;
    char e1[1024];
    offload_plan plan;
    if (bs.plan) {
        run_spec sp = t->spec;
        sp.model = *m;
        if (offload_plan_for_run(&sp, 0, bs.plan_in.host_limit, &plan, e1,
                                 sizeof e1) != 0) {
            m6_err_set(err, M6_EINVALID, "expert parallelism: "
                       "device.memory_budget: %s", e1);
            return -1;
        }
        bs.plan = &plan;
        bs.plan_in.model = *m;
    }
    int rc = backend_cpu_create(nb, &bs, e1, sizeof e1);
    if (bs.plan)
        offload_plan_free(&plan);
    if (rc != 0) {
        m6_err_set(err, M6_EINTERNAL, "expert parallelism: %s", e1);
        return -1;
    }
    return 0;
}

/* nb in place of t's backend (freed): its offload counts go on from the
 * old one's, and it hears how gradients are summed, as every backend the
 * trainer adopts must. */
static void adopt_(trainer *t, backend nb)
{
    trainer_keep_offload_counts_(t);
    t->be.iface->free(t->be.ctx);
    t->be = nb;
    gradsync_backend_(t);
}

/* t's backend, holding every expert, replaced by one holding this rank's
 * (e->rank of e->P), its values copied; the MoE blocks then run over the
 * group. 0, or -1 with err (the old backend kept). */
static int to_local_(trainer *t, trainer_ep *e, m6_err *err)
{
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!kind) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    model_config lc = t->spec.model;
    lc.moe_ep_size = e->P;
    lc.moe_ep_rank = e->rank;
    backend nb;
    if (backend_of_(t, &lc, &nb, err) != 0) {
        free(kind);
        return -1;
    }
    model_config whole = t->bmodel;
    t->bmodel = lc;  /* copy_local_ reads the local layout from it */
    long *steps = calloc((size_t)n_slots_(t) + 1, sizeof(long));
    int rc = steps && t->be.iface->state_begin(t->be.ctx, 0) == 0 ? 0 : -1;
    if (rc == 0 && nb.iface->state_begin(nb.ctx, 1) == 0) {
        for (int b = BACKEND_PARAMS; b <= BACKEND_V && rc == 0; b++)
            rc = copy_local_(t, &t->be, &nb, (backend_buf)b, kind);
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
        m6_err_set(err, M6_EINTERNAL, "expert parallelism: cannot copy the "
                   "model's state to this rank's experts");
        return -1;
    }
    adopt_(t, nb);
    t->be.iface->set_moe_ext(t->be.ctx, &e->ext);
    e->whole = 0;
    return 0;
}

int trainer_ep_start_(trainer *t, m6_coll *c, m6_err *err)
{
    int P = t->spec.nodes.expert_parallel, W = m6_coll_world_size(c);
    if (t->ep || P <= 1)
        return 0;
    if (W % P != 0 || !t->be.iface->set_moe_ext ||
        m6_coll_device_buffers(c)) {
        m6_err_set(err, M6_EINVALID, "nodes.expert_parallel %d: needs a "
                   "host group of a multiple of %d ranks and the cpu "
                   "backend (got %d ranks on %s, the %s backend)", P, P, W,
                   m6_coll_backend(c), t->be.iface->name);
        return -1;
    }
    /* replicas: this rank's two sub-groups, given first */
    int r = m6_coll_rank(c), D = W / P;
    m6_coll *g = W == P ? c : t->ep_given[0], *edp = t->ep_given[1];
    if (W > P && (!g || !edp || m6_coll_world_size(g) != P ||
                  m6_coll_rank(g) != r % P || m6_coll_world_size(edp) != D ||
                  m6_coll_rank(edp) != r / P)) {
        m6_err_set(err, M6_EINVALID, "nodes.expert_parallel %d over %d "
                   "ranks: rank %d needs its expert-parallel group (rank %d "
                   "of %d) and the group of the ranks holding its experts "
                   "(rank %d of %d) first (trainer_adopt_expert_groups)", P,
                   W, r, r % P, P, r / P, D);
        return -1;
    }
    trainer_ep *e = calloc(1, sizeof *e);
    int L = t->spec.model.n_layer;
    if (e)
        e->layers = calloc((size_t)L, sizeof *e->layers);
    if (!e || !e->layers) {
        trainer_ep_free_(e);
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    e->g = g;
    e->edp = W > P ? edp : NULL;
    e->P = P;
    e->rank = m6_coll_rank(g);
    e->L = L;
    e->ext = (gpt_moe_ext){e, ep_forward_, ep_backward_};
    if (to_local_(t, e, err) != 0) {
        trainer_ep_free_(e);
        return -1;
    }
    t->ep = e;
    /* the backward's all-to-alls use the group: no all-reduce beside it */
    t->dp_overlap = 0;
    return 0;
}

int trainer_ep_local_again_(trainer *t, m6_err *err)
{
    if (!t->ep || !t->ep->whole)
        return 0;
    return to_local_(t, t->ep, err);
}

int trainer_ep_whole_(const trainer *t)
{
    return !t->ep || t->ep->whole;
}

int trainer_ep_gather_root_(trainer *t, m6_err *err)
{
    trainer_ep *e = t->ep;
    /* rank 0's expert-parallel group, world ranks 0..P-1, gathers; the
     * replicas' ranks hold copies of the same experts */
    if (t->rank >= e->P)
        return 0;
    int W = e->P, me = e->rank, rc = 0;
    if (trainer_ep_local_again_(t, err) != 0)  /* a second save in a row */
        return -1;
    int E = t->spec.model.moe_experts;
    unsigned char *kind = trainer_slot_kinds_(t);
    size_t *sb = calloc((size_t)W, sizeof *sb);
    size_t *rb = calloc((size_t)W, sizeof *rb);
    long *steps = calloc((size_t)n_slots_(t) + 1, sizeof(long));
    if (!kind || !sb || !rb || !steps) {
        free(kind);
        free(sb);
        free(rb);
        free(steps);
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    backend nb = {0};
    if (me == 0 && backend_of_(t, &t->spec.model, &nb, err) != 0)
        rc = -1;
    /* every rank enters every all-to-all, rank 0's failure or not: tell
     * the others first */
    float f = rc != 0;
    m6_err e2 = M6_ERR_NONE;
    if (m6_coll_allreduce_sum(e->g, &f, 1, rc ? &e2 : err) != 0) {
        rc = -1;
    } else if (f > 0) {
        if (rc == 0)
            m6_err_set(err, M6_EINTERNAL, "expert parallelism: rank 0 "
                       "cannot hold the whole model for a save");
        rc = -1;
    }
    m6_err_free(&e2);
    int begun = rc == 0 && t->be.iface->state_begin(t->be.ctx, 0) == 0;
    if (!begun)
        rc = -1;  /* (the cpu backend's never fails) */
    if (rc == 0 && me == 0)
        nb.iface->state_begin(nb.ctx, 1);
    ep_run_ r[SLOT_NTENSORS_MAX];
    for (int b = BACKEND_PARAMS; b <= BACKEND_V && rc == 0; b++)
        for (int s = -1; s < n_slots_(t) && rc == 0; s++) {
            /* the same runs on every rank (the spec's) */
            int n = runs_(t, (backend_buf)b, s < 0 ? -1 : kind[s], r);
            if (n < 0) {
                m6_err_set(err, M6_EINTERNAL, "out of memory");
                rc = -1;  /* (the others fail at nodes.timeout) */
                break;
            }
            float *src = n ? t->be.iface->state_region(t->be.ctx,
                                                       (backend_buf)b, s)
                           : NULL;
            float *dst = n && me == 0 ? nb.iface->state_region(
                                            nb.ctx, (backend_buf)b, s)
                                      : NULL;
            for (int i = 0; i < n && rc == 0; i++) {
                if (!r[i].per) {
                    if (dst)
                        memcpy(dst + r[i].all, src + r[i].loc,
                               r[i].n * sizeof(float));
                    continue;
                }
                /* rank q's experts to rank 0, in rank order */
                memset(sb, 0, (size_t)W * sizeof *sb);
                memset(rb, 0, (size_t)W * sizeof *rb);
                sb[0] = r[i].n * sizeof(float);
                if (me == 0)
                    for (int q = 0; q < W; q++) {
                        int f0;
                        rb[q] = (size_t)model_expert_range(E, W, q, &f0) *
                                r[i].per * sizeof(float);
                    }
                rc = m6_coll_alltoallv(e->g, src + r[i].loc, sb,
                                       dst ? dst + r[i].all : NULL, rb, err);
            }
        }
    if (begun)
        t->be.iface->state_end(t->be.ctx, 0);
    t->be.iface->get_adam_steps(t->be.ctx, steps);
    free(kind);
    free(sb);
    free(rb);
    if (me != 0 || rc != 0) {
        if (me == 0 && nb.iface)
            nb.iface->free(nb.ctx);
        free(steps);
        return rc;
    }
    nb.iface->state_end(nb.ctx, 1);
    nb.iface->set_adam_steps(nb.ctx, steps);
    free(steps);
    adopt_(t, nb);
    t->bmodel = t->spec.model;
    e->whole = 1;
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
    /* every rank's expert squares over the expert-parallel group (each
     * replica's the same), exactly (its own pair of columns: hi and lo),
     * added in rank order */
    int W = t->ep->P, me = t->ep->rank;
    float *v = calloc(2 * (size_t)W, sizeof(float));
    if (!v) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    v[2 * me] = (float)experts;
    v[2 * me + 1] = (float)(experts - (double)v[2 * me]);
    if (m6_coll_allreduce_sum(t->ep->g, v, 2 * (size_t)W, err) != 0) {
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

/* ------------------------------------------------------------- replicas */

int trainer_ep_reduce_experts_(trainer *t, m6_err *err)
{
    if (!t->ep || !t->ep->edp)
        return 0;
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!kind) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return -1;
    }
    int rc = 0;
    for (int s = n_slots_(t); s-- > 0 && rc == 0;) {
        size_t h0, hl = trainer_ep_hole_(t, kind[s], &h0);
        if (hl)
            rc = m6_coll_allreduce_sum(t->ep->edp,
                                       t->be.iface->grad_region(t->be.ctx, s)
                                           + h0, hl, err);
        /* the slot is summed whole now (the all-reduce held it back) */
        if (rc == 0 && t->be.iface->grad_summed)
            t->be.iface->grad_summed(t->be.ctx, s);
    }
    free(kind);
    return rc;
}

m6_coll *trainer_ep_replica_group_(const trainer *t)
{
    return t->ep ? t->ep->edp : NULL;
}

void trainer_ep_groups_free_(trainer *t)
{
    m6_coll_destroy(t->ep_given[0]);
    m6_coll_destroy(t->ep_given[1]);
    t->ep_given[0] = t->ep_given[1] = NULL;
}

int trainer_adopt_expert_groups(trainer *t, m6_coll *ep, m6_coll *edp,
                                m6_err *err)
{
    if (t->ep && t->ep->g && t->ep->g == t->ep_given[0]) {
        m6_coll_destroy(ep);
        m6_coll_destroy(edp);
        m6_err_set(err, M6_EINVALID, "expert groups: the trainer's "
                   "all-to-alls still run over the groups it holds; "
                   "trainer_set_collectives(NULL) first");
        return -1;
    }
    trainer_ep_groups_free_(t);
    if (!ep || !edp || m6_coll_device_buffers(ep) ||
        m6_coll_device_buffers(edp)) {
        m6_coll_destroy(ep);
        m6_coll_destroy(edp);
        m6_err_set(err, M6_EINVALID, "expert groups: two host groups "
                   "(gloo) wanted");
        return -1;
    }
    t->ep_given[0] = ep;
    t->ep_given[1] = edp;
    return 0;
}
