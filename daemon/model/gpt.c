/*
 * gpt.c — GPT-2-style decoder with a share map: storage, forward, backward
 * and re-slotting (delink); the optimizer steps and ZeRO-1 shards over
 * the slots are model/gpt_optim.c. The layout, the activation
 * sizes and the initial weights are model/layout.c (no kernels); the math
 * lives in kernels/; this file wires the ops together.
 */
#include "model/gpt.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels.h"
#include "model/gpt_internal.h"

float *gpt_alloc_floats(size_t n)
{
    const size_t huge = (size_t)2 << 20;  /* x86-64's and arm64's THP size */
    size_t bytes = gpt_pad_floats(n ? n : 1) * sizeof(float);
    void *p = NULL;
    if (posix_memalign(&p, bytes >= 2 * huge ? huge : 64, bytes) != 0)
        return NULL;
    if (bytes >= 2 * huge)  /* advice only: no error is ours to report */
        (void)madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
    memset(p, 0, n * sizeof(float));  /* faults the pages in, huge ones */
    return p;
}

/* ------------------------------------------------------------- layout */

/* The tensor tables and region sizes of g->cfg (model/layout.c). */
static void layout_(gpt_model *g)
{
    gpt_layout(&g->cfg, g->glob, g->slot, &g->n_global, &g->slot_size);
    gpt_slot_layout(&g->cfg, 0, g->kind[0], &g->kind_size[0]);
    gpt_slot_layout(&g->cfg, 1, g->kind[1], &g->kind_size[1]);
}

/* Per-slot tables (slots, w, dw, offloaded, adam_t_slot) for g->S slots. */
static int alloc_tables_(gpt_model *g)
{
    size_t S = (size_t)g->S;
    g->slots = calloc(S, sizeof *g->slots);
    g->w = calloc(S, sizeof *g->w);
    g->dw = calloc(S, sizeof *g->dw);
    g->offloaded = calloc(S, 1);
    g->dw_fresh = calloc(S, 1);
    g->adam_t_slot = calloc(S, sizeof(long));
    g->slot_moe = calloc(S, 1);
    g->slot_off = calloc(S, sizeof(size_t));
    g->af_v_off = calloc(S, sizeof(size_t));
    return g->af_v_off && g->slots && g->w && g->dw && g->offloaded && g->dw_fresh &&
                   g->adam_t_slot &&
                   g->slot_moe && g->slot_off
               ? 0 : -1;
}

/* free p and forget it */
#define FREE_NULL_(p) (free(p), (p) = NULL)

static void free_tables_(gpt_model *g)
{
    FREE_NULL_(g->slots);
    FREE_NULL_(g->w);
    FREE_NULL_(g->dw);
    FREE_NULL_(g->offloaded);
    FREE_NULL_(g->dw_fresh);
    FREE_NULL_(g->adam_t_slot);
    FREE_NULL_(g->slot_moe);
    FREE_NULL_(g->slot_off);
    FREE_NULL_(g->af_v_off);
}

/* m and v whole in the plain flat layout (Adafactor's v in the plain af
 * layout), every slot's pointers into them: plain storage's, and the
 * optimizer state on the host (gpt_model.state_on_host) once the storage
 * has placed params and grads. 0, or -1 out of memory. */
static int alloc_flat_state_(gpt_model *g)
{
    int has_m = !g->adafactor || g->af_first_moment;
    size_t nv = g->n_params;
    if (g->adafactor) {
        nv = g->af_v_global;
        for (int s = 0; s < g->S; s++) {
            g->af_v_off[s] = nv - g->af_v_global;
            nv += g->af_v_kind[g->slot_moe[s]];
        }
    }
    g->m = has_m ? gpt_alloc_floats(g->n_params) : NULL;
    g->v = gpt_alloc_floats(nv);
    if ((has_m && !g->m) || !g->v)
        return -1;
    for (int s = 0; s < g->S; s++) {
        g->slots[s].m = has_m ? gpt_slot_ptr(g, g->m, s) : NULL;
        g->slots[s].v = g->adafactor
                            ? g->v + g->af_v_global + g->af_v_off[s]
                            : gpt_slot_ptr(g, g->v, s);
    }
    return 0;
}

/* Plain storage: one allocation per buffer, every slot resident. */
static int alloc_plain_state_(gpt_model *g)
{
    g->n_local = g->n_params;
    g->params = gpt_alloc_floats(g->n_local);
    g->grads = gpt_alloc_floats(g->n_local);
    if (!g->params || !g->grads || alloc_flat_state_(g) != 0)
        return -1;
    for (int s = 0; s < g->S; s++) {
        g->slots[s].params = gpt_slot_ptr(g, g->params, s);
        g->slots[s].grads = gpt_slot_ptr(g, g->grads, s);
        g->w[s] = g->slots[s].params;
        g->dw[s] = g->slots[s].grads;
    }
    return 0;
}

static void free_state_(gpt_model *g)
{
    if (g->storage && g->state_on_host) {
        free(g->m);
        free(g->v);
        g->m = g->v = NULL;
    }
    if (g->storage && g->slots)
        g->storage->free_state(g->storage->ctx, g);
    else if (!g->storage) {
        free(g->params);
        free(g->grads);
        free(g->m);
        free(g->v);
    }
    g->params = g->grads = g->m = g->v = NULL;
    free_tables_(g);
}

size_t gpt_v_floats_total(const gpt_model *g)
{
    if (!g->adafactor)
        return g->n_params;
    size_t n = g->af_v_global;
    for (int s = 0; s < g->S; s++)
        n += g->af_v_kind[g->slot_moe[s]];
    return n;
}

static int alloc_state_(gpt_model *g, int S)
{
    g->S = S;
    if (alloc_tables_(g) != 0) {
        free_tables_(g);
        errno = ENOMEM;
        return -1;
    }
    /* each slot's kind from the layers that use it, and its place */
    if (gpt_slot_kinds(&g->cfg, S, g->slot_of, g->slot_moe, NULL, 0) != 0) {
        free_tables_(g);
        errno = EINVAL;
        return -1;
    }
    size_t off = 0;
    for (int s = 0; s < S; s++) {
        g->slot_off[s] = off;
        off += gpt_slot_floats(g, s);
    }
    g->n_params = g->n_global + off;
    int rc = g->storage ? g->storage->alloc_state(g->storage->ctx, g)
                        : alloc_plain_state_(g);
    if (rc == 0 && g->storage && g->state_on_host &&
        alloc_flat_state_(g) != 0) {
        free_state_(g);   /* the storage's part too */
        errno = ENOMEM;
        return -1;
    }
    if (rc != 0) {
        int e = errno ? errno : ENOMEM;
        if (!g->storage)
            free_state_(g);
        else
            free_tables_(g); /* a failing alloc_state cleans up after itself */
        errno = e;
        return -1;
    }
    g->shard_rank = 0;
    g->shard_world = 1;
    g->shard_lo = 0;
    g->shard_hi = g->n_params;
    g->shard_vlo = 0;
    g->shard_vhi = gpt_v_floats_total(g);
    return 0;
}

static void event_(gpt_model *g, gpt_event ev, int layer)
{
    if (g->storage && g->storage->event)
        g->storage->event(g->storage->ctx, g, ev, layer);
}

static int alloc_acts_(gpt_model *g, int B)
{
    size_t total = gpt_act_floats(&g->cfg, B);
    g->act_mem = g->storage ? g->storage->alloc_acts(g->storage->ctx, total)
                            : gpt_alloc_floats(total);
    if (!g->act_mem)
        return -1;
    gpt_acts_place(&g->cfg, B, &g->a, g->act_mem);
    g->B = B;
    g->T = g->cfg.seq_len;
    return 0;
}

int gpt_create_with(gpt_model *g, const model_config *cfg, int S, int B,
                    const gpt_storage *storage)
{
    return gpt_create_optim(g, cfg, S, B, storage, NULL);
}

int gpt_create_optim(gpt_model *g, const model_config *cfg, int S, int B,
                     const gpt_storage *storage, const gpt_optim *o)
{
    memset(g, 0, sizeof *g);
    g->cfg = *cfg;
    g->storage = storage;
    if (S < 1 || S > cfg->n_layer || B < 1 || cfg->n_embd % cfg->n_head) {
        errno = EINVAL;
        return -1;
    }
    layout_(g);
    if (o && o->master_bf16) {
        g->master_bf16 = 1;
        g->sr_seed = o->sr_seed;
    }
    g->state_on_host = storage && o && o->state_on_host;
    if (o && o->adafactor) {
        g->adafactor = 1;
        g->af_first_moment = o->first_moment != 0;
        if (gpt_af_tensors(cfg, -1, NULL, &g->af_v_global) < 0 ||
            gpt_af_tensors(cfg, 0, NULL, &g->af_v_kind[0]) < 0 ||
            gpt_af_tensors(cfg, cfg->moe_experts > 0, NULL,
                           &g->af_v_kind[1]) < 0) {
            errno = ENOMEM;
            return -1;
        }
    }
    g->slot_of = calloc((size_t)cfg->n_layer, sizeof(int));
    if (!g->slot_of) {
        errno = ENOMEM;
        return -1;
    }
    if (gpt_default_share_map(cfg, S, g->slot_of) != 0) {
        gpt_free(g);
        errno = EINVAL;
        return -1;
    }
    size_t n_tokens = (size_t)model_moe_layers(cfg) * (size_t)cfg->moe_experts;
    if (n_tokens && !(g->moe_stats.tokens = calloc(n_tokens, sizeof(double)))) {
        gpt_free(g);
        errno = ENOMEM;
        return -1;
    }
    /* activations first: in a placed pool they stay put across re-slotting */
    if (alloc_acts_(g, B) != 0 || alloc_state_(g, S) != 0) {
        int e = errno ? errno : ENOMEM;
        gpt_free(g);
        errno = e;
        return -1;
    }
    return 0;
}

int gpt_create(gpt_model *g, const model_config *cfg, int S, int B)
{
    return gpt_create_with(g, cfg, S, B, NULL);
}

void gpt_free(gpt_model *g)
{
    free_state_(g);
    if (g->act_mem) {
        if (g->storage)
            g->storage->free_acts(g->storage->ctx, g->act_mem);
        else
            free(g->act_mem);
    }
    free(g->slot_of);
    free(g->moe_stats.tokens);
    g->slot_of = NULL;
    g->act_mem = NULL;
    g->moe_stats.tokens = NULL;
}

/* ------------------------------------------------------------- init */

void gpt_init_weights(gpt_model *g, uint64_t seed)
{
    gpt_init_region(&g->cfg, -1, g->params, seed);
    for (int s = 0; s < g->S; s++)
        gpt_init_slot(&g->cfg, g->slot_moe[s], s, g->slots[s].params, seed);
    gpt_round_masters(g);
}

/* n floats of p rounded to the nearest bf16 */
static void round_bf16_(float *p, size_t n)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        p[i] = gemm_bf16_round(p[i]);
}

void gpt_round_masters(gpt_model *g)
{
    if (!g->master_bf16)
        return;
    round_bf16_(g->params, g->n_global);
    for (int s = 0; s < g->S; s++)
        round_bf16_(g->slots[s].params, gpt_slot_floats(g, s));
}

/* ------------------------------------------------------------- forward */

/* Slot tensors through the compute view (see gpt.h: storage). */
#define W_(g, s, idx) ((g)->w[s] + (g)->kind[(g)->slot_moe[s]][idx].offset)
#define DW_(g, s, idx) ((g)->dw[s] + (g)->kind[(g)->slot_moe[s]][idx].offset)
#define GW_(g, idx) ((g)->params + (g)->glob[idx].offset)
#define GDW_(g, idx) ((g)->grads + (g)->glob[idx].offset)

/* ------------------------------------------------------------- MoE */

moe_dims gpt_moe_dims(const gpt_model *g, int B)
{
    const model_config *c = &g->cfg;
    moe_dims d = {.N = B * g->T, .C = c->n_embd, .E = c->moe_experts,
                  .k = c->moe_prototypes, .H = model_moe_hidden(c)};
    /* a group routes as one only where its MoE blocks run over the group */
    int G = g->moe_ext && c->moe_capacity_scope == MOE_SCOPE_GROUP &&
            c->moe_ep_size > 1 ? c->moe_ep_size : 1;
    d.N_group = G * d.N;
    double cf = g->moe_eval ? c->moe_eval_capacity_factor
                            : c->moe_capacity_factor;
    d.capacity = moe_capacity(cf, d.N_group, d.E, d.k);
    return d;
}

/* Pointers of MoE layer l's saved tensors (act strides: allocated B). */
typedef struct {
    float *probs, *lse, *xe, *ye, *hpre, *hact;
    int32_t *expert, *slot, *counts, *routed, *offset, *row_token;
} moe_saved_;

static moe_saved_ moe_saved_of_(const gpt_model *g, int l)
{
    const gpt_acts *a = &g->a;
    size_t Na = (size_t)g->B * g->T, E = (size_t)g->cfg.moe_experts;
    size_t K = (size_t)g->cfg.moe_prototypes, C = (size_t)g->cfg.n_embd;
    size_t H = (size_t)model_moe_hidden(&g->cfg), NK = Na * K;
    return (moe_saved_){
        a->moe_probs + l * Na * E, a->moe_lse + l * NK, a->moe_xe + l * NK * C,
        a->moe_ye + l * NK * C, a->moe_hpre + l * NK * H,
        a->moe_hact + l * NK * H, a->moe_expert + l * NK, a->moe_slot + l * NK,
        a->moe_counts + l * E, a->moe_routed + l * E,
        a->moe_offset + l * (E + 1), a->moe_row_token + l * NK};
}

void gpt_moe_stats_clear(gpt_moe_stats *st, size_t n_tokens)
{
    double *tokens = st->tokens;
    memset(st, 0, sizeof *st);
    st->tokens = tokens;
    if (tokens)
        memset(tokens, 0, n_tokens * sizeof *tokens);
}

void gpt_moe_stats_reset(gpt_model *g)
{
    gpt_moe_stats_clear(&g->moe_stats, (size_t)model_moe_layers(&g->cfg) *
                                           (size_t)g->cfg.moe_experts);
}

void gpt_moe_stats_add(gpt_moe_stats *st, double aux, double z, long layers,
                       long dropped, long pairs, const int32_t *counts, int n,
                       int first_moe)
{
    if (st->tokens && layers > 0) {
        double *t = st->tokens + (size_t)first_moe * (size_t)(n / layers);
        for (int i = 0; i < n; i++)
            t[i] += counts[i];
    }
    st->aux_sum += aux;
    st->z_sum += z;
    st->layers += layers;
    st->dropped += dropped;
    st->pairs += pairs;
    for (int i = 0; i < n; i++) {
        long c = counts[i];
        if (st->load_n == 0 || c < st->load_min) st->load_min = c;
        if (st->load_n == 0 || c > st->load_max) st->load_max = c;
        st->load_sum += (double)c;
        st->load_sumsq += (double)c * (double)c;
        st->load_n++;
        st->empty += c == 0;
    }
}

/* MoE block l of a forward: out (B*T,C) = the experts' combined output for
 * x = ln2 (the residual is added by the caller); stats recorded. */
static void moe_layer_forward_(gpt_model *g, int s, int l, const float *x,
                               float *out, int B)
{
    moe_dims d = gpt_moe_dims(g, B);
    g->moe_capacity = d.capacity;
    if (g->moe_ext) {
        g->moe_ext->forward(g->moe_ext->ctx, g, l, s, x, out, B);
        return;
    }
    moe_saved_ m = moe_saved_of_(g, l);
    int dropped = moe_route(m.probs, m.lse, m.expert, m.slot, m.counts,
                            m.routed, m.offset, m.row_token, x,
                            W_(g, s, SLOT_GATE_W), W_(g, s, SLOT_GATE_B), &d);
    moe_forward(out, m.xe, m.hpre, m.hact, m.ye, x, m.probs, m.expert, m.slot,
                m.offset, m.row_token, W_(g, s, SLOT_FC_W),
                W_(g, s, SLOT_FC_B), W_(g, s, SLOT_FCPROJ_W),
                W_(g, s, SLOT_FCPROJ_B), &d);
    float aux, z;
    moe_aux_losses(&aux, &z, m.probs, m.lse, m.routed, &d);
    gpt_moe_stats_add(&g->moe_stats, aux, z, 1, dropped, (long)d.N * d.k,
                      m.counts, d.E, model_moe_layer_index(&g->cfg, l));
}

/* MoE block l of a backward: d(ln2) (zeroed by the caller) in a->dln from
 * d(out) in a->dres, the router and experts' gradients accumulated; daux,
 * dz the weights of this layer's aux and z losses in the training loss. */
static void moe_layer_backward_(gpt_model *g, int s, int l, const float *x,
                                int B, float daux, float dz)
{
    gpt_acts *a = &g->a;
    if (g->moe_ext) {
        g->moe_ext->backward(g->moe_ext->ctx, g, l, s, x, B, daux, dz);
        return;
    }
    moe_dims d = gpt_moe_dims(g, B);
    d.capacity = g->moe_capacity;  /* that of the forward */
    moe_saved_ m = moe_saved_of_(g, l);
    moe_backward(a->dln, DW_(g, s, SLOT_GATE_W), DW_(g, s, SLOT_GATE_B),
                 DW_(g, s, SLOT_FC_W), DW_(g, s, SLOT_FC_B),
                 DW_(g, s, SLOT_FCPROJ_W), DW_(g, s, SLOT_FCPROJ_B),
                 a->moe_dye, a->moe_dh1, a->moe_dh2, a->moe_dxe,
                 a->moe_dlogits, a->dres, x, m.probs, m.lse, m.expert, m.slot,
                 m.routed, m.offset, m.xe, m.hpre, m.hact, m.ye,
                 W_(g, s, SLOT_GATE_W), W_(g, s, SLOT_FC_W),
                 W_(g, s, SLOT_FCPROJ_W), daux, dz, &d);
}

/* The dense MLP of block l: out (B*T,C) = c_proj(gelu(c_fc(x))), the
 * pre-activation and activation saved. */
static void mlp_forward_(gpt_model *g, int s, int l, const float *x,
                         float *out, int B)
{
    const int C = g->cfg.n_embd;
    const size_t BT = (size_t)B * g->T, Ba = (size_t)g->B * g->T;
    float *fch = g->a.fch + l * Ba * 4 * C;
    float *fchg = g->a.fch_gelu + l * Ba * 4 * C;
    matmul_forward_gelu(fch, fchg, x, W_(g, s, SLOT_FC_W), W_(g, s, SLOT_FC_B),
                        (int)BT, C, 4 * C);
    matmul_forward(out, fchg, W_(g, s, SLOT_FCPROJ_W), W_(g, s, SLOT_FCPROJ_B),
                   (int)BT, 4 * C, C);
}

/* Its backward: d(x) written to a->dln from d(out) in a->dres; the MLP's
 * gradients accumulated (dw_store: its weight matrices' stored). */
static void mlp_backward_(gpt_model *g, int s, int l, const float *x, int B,
                          int dw_store)
{
    gpt_acts *a = &g->a;
    const int C = g->cfg.n_embd;
    const size_t BT = (size_t)B * g->T, Ba = (size_t)g->B * g->T;
    const float *fch = a->fch + l * Ba * 4 * C;
    const float *fchg = a->fch_gelu + l * Ba * 4 * C;
    /* d(fch_gelu) and d(fch) written (not added), GELU in the same pass */
    matmul_backward_gelu(a->dfch, a->dfch_gelu, DW_(g, s, SLOT_FCPROJ_W),
                         DW_(g, s, SLOT_FCPROJ_B), a->dres, fchg, fch,
                         W_(g, s, SLOT_FCPROJ_W), (int)BT, 4 * C, C, dw_store);
    matmul_backward_first(a->dln, DW_(g, s, SLOT_FC_W), DW_(g, s, SLOT_FC_B),
                          a->dfch, x, W_(g, s, SLOT_FC_W), (int)BT, C, 4 * C,
                          dw_store);
}

float gpt_forward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const int V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    const size_t Ba = (size_t)g->B * T; /* per-layer stride: allocated B */
    gpt_acts *a = &g->a;

    event_(g, GPT_FWD_START, -1);
    encoder_forward(a->encoded, inp, GW_(g, GLOB_WTE), GW_(g, GLOB_WPE), B, T,
                    C);
    for (int l = 0; l < L; l++) {
        int s = g->slot_of[l];
        event_(g, GPT_FWD_LAYER_BEGIN, l);
        const float *res = l == 0 ? a->encoded : a->residual3 + (l - 1) * Ba * C;
        float *ln1 = a->ln1 + l * Ba * C;
        float *qkv = a->qkv + l * Ba * 3 * C;
        float *atty = a->atty + l * Ba * C;
        float *att = a->att + (size_t)l * g->B * NH * T * T;
        float *res2 = a->residual2 + l * Ba * C;
        float *ln2 = a->ln2 + l * Ba * C;
        float *res3 = a->residual3 + l * Ba * C;

        layernorm_forward(ln1, a->ln1_mean + l * Ba, a->ln1_rstd + l * Ba, res,
                          W_(g, s, SLOT_LN1_W), W_(g, s, SLOT_LN1_B), (int)BT,
                          C);
        matmul_forward(qkv, ln1, W_(g, s, SLOT_QKV_W), W_(g, s, SLOT_QKV_B),
                       (int)BT, C, 3 * C);
        attention_forward(atty, att, qkv, B, T, C, NH);
        /* attention projection written to res2, then residual added in place */
        matmul_forward(res2, atty, W_(g, s, SLOT_ATTPROJ_W),
                       W_(g, s, SLOT_ATTPROJ_B), (int)BT, C, C);
        residual_layernorm_forward(res2, ln2, a->ln2_mean + l * Ba,
                                   a->ln2_rstd + l * Ba, res, res2,
                                   W_(g, s, SLOT_LN2_W), W_(g, s, SLOT_LN2_B),
                                   (int)BT, C);
        if (model_layer_is_moe(&g->cfg, l))
            moe_layer_forward_(g, s, l, ln2, res3, B);
        else
            mlp_forward_(g, s, l, ln2, res3, B);
        residual_forward(res3, res2, res3, BTC);
        event_(g, GPT_FWD_LAYER_END, l);
    }
    const float *last = a->residual3 + (size_t)(L - 1) * Ba * C;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last,
                      GW_(g, GLOB_LNF_W), GW_(g, GLOB_LNF_B), (int)BT, C);
    matmul_forward(a->logits, a->lnf, GW_(g, GLOB_WTE), NULL, (int)BT, C, V);
    event_(g, GPT_FWD_DONE, -1);
    if (!targets)
        return 0.0f;
    softmax_crossentropy_forward(a->losses, a->probs, a->logits, targets,
                                 (int)BT, V);
    double sum = 0;
    for (size_t i = 0; i < BT; i++)
        sum += a->losses[i];
    return (float)(sum / (double)BT);
}

/* ------------------------------------------------------------- backward */

/* The weight matrices whose gradient gpt_backward can store at its first
 * write (matmul_backward_first/_gelu with dw_store): every element is
 * written by one GEMM. */
static const int store_mats_[] = {SLOT_QKV_W, SLOT_ATTPROJ_W, SLOT_FC_W,
                                  SLOT_FCPROJ_W};
enum { N_STORE_MATS = sizeof store_mats_ / sizeof store_mats_[0] };

/* Slot s's gradient can skip the memset: resident, dense, and computed in
 * place (the compute view is its own gradient buffer). */
static int can_store_(const gpt_model *g, int s)
{
    return !g->offloaded[s] && !g->slot_moe[s] &&
           g->dw[s] == g->slots[s].grads;
}

typedef struct {
    float *p;
    size_t n;
} span_;

static int cmp_span_(const void *a, const void *b)
{
    const float *x = ((const span_ *)a)->p, *y = ((const span_ *)b)->p;
    return (x > y) - (x < y);
}

void gpt_zero_grad(gpt_model *g)
{
    /* memset the device block but the marked matrices (address order) */
    span_ *skip = malloc(((size_t)g->S * N_STORE_MATS + 1) * sizeof *skip);
    if (!skip) { /* out of memory: all of it, nothing marked */
        memset(g->grads, 0, g->n_local * sizeof(float));
        memset(g->dw_fresh, 0, (size_t)g->S);
        return;
    }
    int n = 0;
    for (int s = 0; s < g->S; s++) {
        g->dw_fresh[s] = (unsigned char)can_store_(g, s);
        if (!g->dw_fresh[s])
            continue;
        for (int i = 0; i < N_STORE_MATS; i++) {
            const gpt_tensor *t = &g->kind[0][store_mats_[i]];
            skip[n++] = (span_){g->slots[s].grads + t->offset, t->numel};
        }
    }
    qsort(skip, (size_t)n, sizeof *skip, cmp_span_);
    skip[n] = (span_){g->grads + g->n_local, 0};
    float *p = g->grads;
    for (int i = 0; i <= n; i++) {
        memset(p, 0, (size_t)(skip[i].p - p) * sizeof(float));
        p = skip[i].p + skip[i].n;
    }
    free(skip);
}

void gpt_settle_slot(const gpt_model *g, int s)
{
    if (!g->dw_fresh[s])
        return;
    for (int i = 0; i < N_STORE_MATS; i++) {
        const gpt_tensor *t = &g->kind[0][store_mats_[i]];
        memset(g->slots[s].grads + t->offset, 0, t->numel * sizeof(float));
    }
    g->dw_fresh[s] = 0;
}

void gpt_grads_settle(const gpt_model *g)
{
    for (int s = 0; s < g->S; s++)
        gpt_settle_slot(g, s);
}

/* Layer l is the lowest layer using its slot: backward (L-1 down to 0)
 * writes the slot's gradient no more after it. */
static int first_use_(const gpt_model *g, int l)
{
    for (int i = 0; i < l; i++)
        if (g->slot_of[i] == g->slot_of[l])
            return 0;
    return 1;
}

void gpt_backward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B, float loss_scale)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const int V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    const size_t Ba = (size_t)g->B * T;
    gpt_acts *a = &g->a;
    /* d(training loss)/d(aux, z) of each MoE layer: coefficient over the
     * MoE layers, times the microbatch's weight (loss_scale * B*T) */
    int n_moe = model_moe_layers(&g->cfg);
    float daux = 0, dz = 0;
    if (n_moe > 0) {
        double w = (double)loss_scale * (double)BT / n_moe;
        daux = (float)(g->cfg.moe_aux_coef * w);
        dz = (float)(g->cfg.moe_z_coef * w);
    }

    event_(g, GPT_BWD_START, -1);
    for (size_t i = 0; i < BT; i++)
        a->dlosses[i] = loss_scale;
    /* the first write of each activation gradient stores (_first): no
     * buffer is zeroed but dres, once, and an MoE block's input gradient */
    softmax_crossentropy_backward_first(a->dlogits, a->probs, targets,
                                        a->dlosses, (int)BT, V);
    matmul_backward_first(a->dlnf, GDW_(g, GLOB_WTE), NULL, a->dlogits,
                          a->lnf, GW_(g, GLOB_WTE), (int)BT, C, V, 0);
    memset(a->dres, 0, BTC * sizeof(float));
    const float *last = a->residual3 + (size_t)(L - 1) * Ba * C;
    layernorm_backward(a->dres, GDW_(g, GLOB_LNF_W), GDW_(g, GLOB_LNF_B),
                       a->dlnf, last, GW_(g, GLOB_LNF_W), a->lnf_mean,
                       a->lnf_rstd, (int)BT, C);

    for (int l = L - 1; l >= 0; l--) {
        int s = g->slot_of[l];
        event_(g, GPT_BWD_LAYER_BEGIN, l);
        /* the slot's first layer since gpt_zero_grad stores its weight
         * matrices' gradients (marked there). Should the storage have
         * moved the compute view since, they are cleared instead. */
        int st = g->dw_fresh[s];
        if (st && g->dw[s] != g->slots[s].grads) {
            gpt_settle_slot(g, s);
            st = 0;
        }
        const float *res = l == 0 ? a->encoded : a->residual3 + (l - 1) * Ba * C;
        const float *ln1 = a->ln1 + l * Ba * C;
        const float *qkv = a->qkv + l * Ba * 3 * C;
        const float *atty = a->atty + l * Ba * C;
        const float *att = a->att + (size_t)l * g->B * NH * T * T;
        const float *res2 = a->residual2 + l * Ba * C;
        const float *ln2 = a->ln2 + l * Ba * C;

        /* dres holds d(residual3). residual3 = res2 + mlp(ln2(res2)): the
         * stream gradient passes through unchanged; the MLP adds to it. */
        if (model_layer_is_moe(&g->cfg, l)) {
            memset(a->dln, 0, BTC * sizeof(float));
            moe_layer_backward_(g, s, l, ln2, B, daux, dz);
        } else {
            mlp_backward_(g, s, l, ln2, B, st);
        }
        layernorm_backward(a->dres, DW_(g, s, SLOT_LN2_W),
                           DW_(g, s, SLOT_LN2_B), a->dln, res2,
                           W_(g, s, SLOT_LN2_W), a->ln2_mean + l * Ba,
                           a->ln2_rstd + l * Ba, (int)BT, C);
        /* dres now holds d(residual2) = d(res + attproj(attn(ln1(res)))). */
        matmul_backward_first(a->datty, DW_(g, s, SLOT_ATTPROJ_W),
                              DW_(g, s, SLOT_ATTPROJ_B), a->dres, atty,
                              W_(g, s, SLOT_ATTPROJ_W), (int)BT, C, C, st);
        attention_backward_first(a->dqkv, a->datt, a->datty, qkv, att, B, T,
                                 C, NH);
        matmul_backward_first(a->dln, DW_(g, s, SLOT_QKV_W),
                              DW_(g, s, SLOT_QKV_B), a->dqkv, ln1,
                              W_(g, s, SLOT_QKV_W), (int)BT, C, 3 * C, st);
        layernorm_backward(a->dres, DW_(g, s, SLOT_LN1_W),
                           DW_(g, s, SLOT_LN1_B), a->dln, res,
                           W_(g, s, SLOT_LN1_W), a->ln1_mean + l * Ba,
                           a->ln1_rstd + l * Ba, (int)BT, C);
        /* dres now holds d(res): the previous layer's residual3. */
        g->dw_fresh[s] = 0; /* written: the slot's next layer adds */
        event_(g, GPT_BWD_LAYER_END, l);
        if (g->grad_ready && !g->offloaded[s] && first_use_(g, l))
            g->grad_ready(g->grad_ready_ctx, s);
    }
    encoder_backward(GDW_(g, GLOB_WTE), GDW_(g, GLOB_WPE), a->dres, inp, B, T,
                     C);
    event_(g, GPT_BWD_DONE, -1);
}

/* ------------------------------------------------------------- delink */

/* Host snapshot of the parameters and moments (not gradients): globals,
 * then S slots, each as params | m | v. */
typedef struct {
    float *mem;
    long adam_t_global;
    long *adam_t_slot;
    size_t *off;           /* [S] floats from mem to the slot's params */
    unsigned char *moe;    /* [S] each slot's kind */
} snapshot_;

static void snapshot_free_(snapshot_ *sn)
{
    free(sn->mem);
    free(sn->adam_t_slot);
    free(sn->off);
    free(sn->moe);
}

/* Floats of m and of v in region s (-1 the globals) of g: AdamW's are the
 * region's parameter floats each; Adafactor's m the same or none, its v
 * the af layout's. */
static size_t m_floats_(const gpt_model *g, int s)
{
    if (g->adafactor && !g->af_first_moment)
        return 0;
    return s < 0 ? g->n_global : gpt_slot_floats(g, s);
}

static size_t v_floats_(const gpt_model *g, int s)
{
    if (!g->adafactor)
        return s < 0 ? g->n_global : gpt_slot_floats(g, s);
    return s < 0 ? g->af_v_global : g->af_v_kind[g->slot_moe[s]];
}

size_t gpt_optim_bytes(const gpt_model *g)
{
    if (g->shard_world > 1 || g->state_on_host)
        return ((g->m ? g->shard_hi - g->shard_lo : 0) +
                (g->shard_vhi - g->shard_vlo)) * sizeof(float);
    size_t n = m_floats_(g, -1) + v_floats_(g, -1);
    for (int s = 0; s < g->S; s++)
        if (!g->offloaded[s])
            n += m_floats_(g, s) + v_floats_(g, s);
    return n * sizeof(float);
}

static int snapshot_take_(const gpt_model *g, snapshot_ *sn)
{
    size_t ng = g->n_global, S = (size_t)g->S;
    size_t total = ng + m_floats_(g, -1) + v_floats_(g, -1);
    for (int s = 0; s < g->S; s++)
        total += gpt_slot_floats(g, s) + m_floats_(g, s) + v_floats_(g, s);
    sn->mem = malloc(total * sizeof(float));
    sn->adam_t_slot = malloc(S * sizeof(long));
    sn->off = malloc(S * sizeof(size_t));
    sn->moe = malloc(S);
    if (!sn->mem || !sn->adam_t_slot || !sn->off || !sn->moe) {
        snapshot_free_(sn);
        return -1;
    }
    float *p = sn->mem;
    size_t mg = m_floats_(g, -1), vg = v_floats_(g, -1);
    gpt_copy_floats(p, g->params, ng);
    gpt_copy_floats(p + ng, g->m, mg);
    gpt_copy_floats(p + ng + mg, g->v, vg);
    p += ng + mg + vg;
    for (int s = 0; s < g->S; s++) {
        size_t ss = gpt_slot_floats(g, s), ms = m_floats_(g, s),
               vs = v_floats_(g, s);
        sn->off[s] = (size_t)(p - sn->mem);
        sn->moe[s] = g->slot_moe[s];
        gpt_copy_floats(p, g->slots[s].params, ss);
        gpt_copy_floats(p + ss, g->slots[s].m, ms);
        gpt_copy_floats(p + ss + ms, g->slots[s].v, vs);
        p += ss + ms + vs;
    }
    memcpy(sn->adam_t_slot, g->adam_t_slot, (size_t)g->S * sizeof(long));
    sn->adam_t_global = g->adam_t_global;
    return 0;
}

/* Fill g's (freshly allocated, zeroed) state from the snapshot of a model
 * with the same globals: slot s from snapshot slot src_of[s] (NULL: s). */
static void snapshot_put_(gpt_model *g, const snapshot_ *sn, const int *src_of,
                          int reset_moments)
{
    size_t ng = g->n_global, mg = m_floats_(g, -1), vg = v_floats_(g, -1);
    const float *p = sn->mem;
    gpt_copy_floats(g->params, p, ng);
    gpt_copy_floats(g->m, p + ng, mg);
    gpt_copy_floats(g->v, p + ng + mg, vg);
    g->adam_t_global = sn->adam_t_global;
    for (int s = 0; s < g->S; s++) {
        int src = src_of ? src_of[s] : s;
        /* sizes = the source's: a slot copies a slot of its own kind */
        size_t ss = gpt_slot_floats(g, s), ms = m_floats_(g, s),
               vs = v_floats_(g, s);
        const float *q = p + sn->off[src];
        gpt_copy_floats(g->slots[s].params, q, ss);
        if (!reset_moments) {
            gpt_copy_floats(g->slots[s].m, q + ss, ms);
            gpt_copy_floats(g->slots[s].v, q + ss + ms, vs);
            g->adam_t_slot[s] = sn->adam_t_slot[src];
        }
    }
}

int gpt_reslot(gpt_model *g, int new_S, const int *new_slot_of,
               const int *src_of, int reset_moments)
{
    int L = g->cfg.n_layer, old_S = g->S;
    if (new_S < 1 || new_S > L || g->shard_world > 1) {
        errno = EINVAL;
        return -1;
    }
    for (int s = 0; s < new_S; s++)
        if (src_of[s] < 0 || src_of[s] >= old_S)
            return -1;
    for (int l = 0; l < L; l++)
        if (new_slot_of[l] < 0 || new_slot_of[l] >= new_S)
            return -1;
    /* a new slot copies an old slot of its own kind */
    unsigned char *kinds = malloc((size_t)new_S);
    if (!kinds) {
        errno = ENOMEM;
        return -1;
    }
    int bad = gpt_slot_kinds(&g->cfg, new_S, new_slot_of, kinds, NULL, 0);
    for (int s = 0; !bad && s < new_S; s++)
        bad = kinds[s] != g->slot_moe[src_of[s]];
    free(kinds);
    if (bad) {
        errno = EINVAL;
        return -1;
    }
    int *old_map = malloc((size_t)L * sizeof(int));
    snapshot_ sn;
    if (!old_map || snapshot_take_(g, &sn) != 0) {
        free(old_map);
        errno = ENOMEM;
        return -1;
    }
    memcpy(old_map, g->slot_of, (size_t)L * sizeof(int));
    free_state_(g);
    memcpy(g->slot_of, new_slot_of, (size_t)L * sizeof(int));
    int rc = 0;
    if (alloc_state_(g, new_S) == 0) {
        snapshot_put_(g, &sn, src_of, reset_moments);
    } else {
        int e = errno;
        memcpy(g->slot_of, old_map, (size_t)L * sizeof(int));
        if (alloc_state_(g, old_S) == 0)
            snapshot_put_(g, &sn, NULL, 0);
        /* else: even the old layout no longer fits; g has no state */
        errno = e;
        rc = -1;
    }
    free(old_map);
    snapshot_free_(&sn);
    return rc;
}
