/*
 * gpt.c — GPT-2-style decoder with a share map: parameter layout, init,
 * forward, backward, AdamW over slots, and re-slotting (delink).
 * The math lives in kernels/; this file wires the ops together.
 */
#include "model/gpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define PAD 16 /* floats: 64-byte alignment of every region */

static size_t pad_(size_t n) { return (n + PAD - 1) / PAD * PAD; }

static float *alloc_floats_(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, pad_(n ? n : 1) * sizeof(float)) != 0)
        return NULL;
    memset(p, 0, n * sizeof(float));
    return p;
}

/* ------------------------------------------------------------- layout */

static void set_tensor_(gpt_tensor *t, const char *name, size_t *off,
                        int rows, int cols)
{
    t->name = name;
    t->offset = *off;
    t->rows = rows;
    t->cols = cols;
    t->numel = (size_t)rows * (cols ? cols : 1);
    t->decay = cols != 0;
    *off += t->numel;
}

static void layout_(gpt_model *g)
{
    const model_config *c = &g->cfg;
    int C = c->n_embd;
    size_t off = 0;
    set_tensor_(&g->glob[GLOB_WTE], "wte", &off, c->vocab_size, C);
    set_tensor_(&g->glob[GLOB_WPE], "wpe", &off, c->seq_len, C);
    set_tensor_(&g->glob[GLOB_LNF_W], "ln_f.weight", &off, C, 0);
    set_tensor_(&g->glob[GLOB_LNF_B], "ln_f.bias", &off, C, 0);
    g->n_global = pad_(off);
    off = 0;
    set_tensor_(&g->slot[SLOT_LN1_W], "ln_1.weight", &off, C, 0);
    set_tensor_(&g->slot[SLOT_LN1_B], "ln_1.bias", &off, C, 0);
    set_tensor_(&g->slot[SLOT_QKV_W], "attn.c_attn.weight", &off, 3 * C, C);
    set_tensor_(&g->slot[SLOT_QKV_B], "attn.c_attn.bias", &off, 3 * C, 0);
    set_tensor_(&g->slot[SLOT_ATTPROJ_W], "attn.c_proj.weight", &off, C, C);
    set_tensor_(&g->slot[SLOT_ATTPROJ_B], "attn.c_proj.bias", &off, C, 0);
    set_tensor_(&g->slot[SLOT_LN2_W], "ln_2.weight", &off, C, 0);
    set_tensor_(&g->slot[SLOT_LN2_B], "ln_2.bias", &off, C, 0);
    set_tensor_(&g->slot[SLOT_FC_W], "mlp.c_fc.weight", &off, 4 * C, C);
    set_tensor_(&g->slot[SLOT_FC_B], "mlp.c_fc.bias", &off, 4 * C, 0);
    set_tensor_(&g->slot[SLOT_FCPROJ_W], "mlp.c_proj.weight", &off, C, 4 * C);
    set_tensor_(&g->slot[SLOT_FCPROJ_B], "mlp.c_proj.bias", &off, C, 0);
    g->slot_size = pad_(off);
}

/* Per-slot tables (slots, w, dw, offloaded, adam_t_slot) for g->S slots. */
static int alloc_tables_(gpt_model *g)
{
    size_t S = (size_t)g->S;
    g->slots = calloc(S, sizeof *g->slots);
    g->w = calloc(S, sizeof *g->w);
    g->dw = calloc(S, sizeof *g->dw);
    g->offloaded = calloc(S, 1);
    g->adam_t_slot = calloc(S, sizeof(long));
    return g->slots && g->w && g->dw && g->offloaded && g->adam_t_slot ? 0 : -1;
}

static void free_tables_(gpt_model *g)
{
    free(g->slots);
    free(g->w);
    free(g->dw);
    free(g->offloaded);
    free(g->adam_t_slot);
    g->slots = NULL;
    g->w = g->dw = NULL;
    g->offloaded = NULL;
    g->adam_t_slot = NULL;
}

void gpt_tensor_name(char *out, size_t n, const char *prefix, int s,
                     const gpt_tensor *t)
{
    if (s < 0)
        snprintf(out, n, "%s%s", prefix, t->name);
    else
        snprintf(out, n, "%sslots.%d.%s", prefix, s, t->name);
}

/* Plain storage: one allocation per buffer, every slot resident. */
static int alloc_plain_state_(gpt_model *g)
{
    g->n_local = g->n_params;
    g->params = alloc_floats_(g->n_local);
    g->grads = alloc_floats_(g->n_local);
    g->m = alloc_floats_(g->n_local);
    g->v = alloc_floats_(g->n_local);
    if (!g->params || !g->grads || !g->m || !g->v)
        return -1;
    for (int s = 0; s < g->S; s++) {
        g->slots[s] = (gpt_slot_state){gpt_slot_ptr(g, g->params, s),
                                       gpt_slot_ptr(g, g->grads, s),
                                       gpt_slot_ptr(g, g->m, s),
                                       gpt_slot_ptr(g, g->v, s)};
        g->w[s] = g->slots[s].params;
        g->dw[s] = g->slots[s].grads;
    }
    return 0;
}

static void free_state_(gpt_model *g)
{
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

static int alloc_state_(gpt_model *g, int S)
{
    g->S = S;
    g->n_params = g->n_global + (size_t)S * g->slot_size;
    if (alloc_tables_(g) != 0) {
        free_tables_(g);
        errno = ENOMEM;
        return -1;
    }
    int rc = g->storage ? g->storage->alloc_state(g->storage->ctx, g)
                        : alloc_plain_state_(g);
    if (rc != 0) {
        int e = errno ? errno : ENOMEM;
        if (!g->storage)
            free_state_(g);
        else
            free_tables_(g); /* a failing alloc_state cleans up after itself */
        errno = e;
        return -1;
    }
    return 0;
}

static void event_(gpt_model *g, gpt_event ev, int layer)
{
    if (g->storage && g->storage->event)
        g->storage->event(g->storage->ctx, g, ev, layer);
}

/* The activation tensors for microbatches of B: pointer slot and floats. */
typedef struct { float **p; size_t n; } act_entry_;

static size_t act_table_(const model_config *c, int B, gpt_acts *a,
                         act_entry_ *t)
{
    size_t L = c->n_layer, T = c->seq_len, C = c->n_embd, NH = c->n_head;
    size_t V = c->vocab_size, BT = (size_t)B * T;
    act_entry_ tab[] = {
        {&a->encoded, BT * C},
        {&a->ln1, L * BT * C}, {&a->ln1_mean, L * BT}, {&a->ln1_rstd, L * BT},
        {&a->qkv, L * BT * 3 * C}, {&a->atty, L * BT * C},
        {&a->att, L * B * NH * T * T}, {&a->residual2, L * BT * C},
        {&a->ln2, L * BT * C}, {&a->ln2_mean, L * BT}, {&a->ln2_rstd, L * BT},
        {&a->fch, L * BT * 4 * C}, {&a->fch_gelu, L * BT * 4 * C},
        {&a->residual3, L * BT * C},
        {&a->lnf, BT * C}, {&a->lnf_mean, BT}, {&a->lnf_rstd, BT},
        {&a->logits, BT * V}, {&a->probs, BT * V}, {&a->losses, BT},
        {&a->dres, BT * C}, {&a->dln, BT * C}, {&a->datty, BT * C},
        {&a->dqkv, BT * 3 * C}, {&a->dfch, BT * 4 * C},
        {&a->dfch_gelu, BT * 4 * C}, {&a->datt, B * NH * T * T},
        {&a->dlogits, BT * V}, {&a->dlnf, BT * C}, {&a->dlosses, BT},
    };
    size_t n = sizeof tab / sizeof tab[0];
    _Static_assert(sizeof tab / sizeof tab[0] == 30, "N_ACTS_");
    if (t)
        memcpy(t, tab, sizeof tab);
    return n;
}

#define N_ACTS_ 30

size_t gpt_act_floats(const model_config *cfg, int B)
{
    gpt_acts a;
    act_entry_ t[N_ACTS_];
    size_t n = act_table_(cfg, B, &a, t), total = 0;
    for (size_t i = 0; i < n; i++)
        total += pad_(t[i].n);
    return total;
}

static int alloc_acts_(gpt_model *g, int B)
{
    act_entry_ t[N_ACTS_];
    size_t n = act_table_(&g->cfg, B, &g->a, t);
    size_t total = gpt_act_floats(&g->cfg, B);
    g->act_mem = g->storage ? g->storage->alloc_acts(g->storage->ctx, total)
                            : alloc_floats_(total);
    if (!g->act_mem)
        return -1;
    float *p = g->act_mem;
    for (size_t i = 0; i < n; i++) {
        *t[i].p = p;
        p += pad_(t[i].n);
    }
    g->B = B;
    g->T = g->cfg.seq_len;
    return 0;
}

static void default_share_map_(int *slot_of, int L, int S)
{
    for (int l = 0; l < L; l++)
        slot_of[l] = (int)((long)l * S / L);
}

int gpt_create_with(gpt_model *g, const model_config *cfg, int S, int B,
                    const gpt_storage *storage)
{
    memset(g, 0, sizeof *g);
    g->cfg = *cfg;
    g->storage = storage;
    if (S < 1 || S > cfg->n_layer || B < 1 || cfg->n_embd % cfg->n_head) {
        errno = EINVAL;
        return -1;
    }
    layout_(g);
    g->slot_of = calloc((size_t)cfg->n_layer, sizeof(int));
    if (!g->slot_of) {
        errno = ENOMEM;
        return -1;
    }
    default_share_map_(g->slot_of, cfg->n_layer, S);
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
    g->slot_of = NULL;
    g->act_mem = NULL;
}

void gpt_layout_sizes(const model_config *cfg, size_t *n_global,
                      size_t *slot_size)
{
    gpt_model g;
    memset(&g, 0, sizeof g);
    g.cfg = *cfg;
    layout_(&g);
    *n_global = g.n_global;
    *slot_size = g.slot_size;
}

void gpt_layout(const model_config *cfg, gpt_tensor glob[GLOB_NTENSORS],
                gpt_tensor slot[SLOT_NTENSORS], size_t *n_global,
                size_t *slot_size)
{
    gpt_model g;
    memset(&g, 0, sizeof g);
    g.cfg = *cfg;
    layout_(&g);
    memcpy(glob, g.glob, sizeof g.glob);
    memcpy(slot, g.slot, sizeof g.slot);
    *n_global = g.n_global;
    *slot_size = g.slot_size;
}

size_t gpt_compute_params(const gpt_model *g)
{
    size_t n = 0;
    for (int i = 0; i < GLOB_NTENSORS; i++)
        n += g->glob[i].numel;
    size_t per_slot = 0;
    for (int i = 0; i < SLOT_NTENSORS; i++)
        per_slot += g->slot[i].numel;
    return n + per_slot * (size_t)g->cfg.n_layer;
}

/* ------------------------------------------------------------- init */

/* splitmix64: a small, well-mixed generator for weight init. */
static uint64_t splitmix64_(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform_(uint64_t *s) /* (0,1) */
{
    return ((splitmix64_(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void fill_normal_(float *p, size_t n, float std, uint64_t *s)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = uniform_(s), u2 = uniform_(s);
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(std * r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            p[i + 1] = (float)(std * r * sin(2 * M_PI * u2));
    }
}

static void fill_const_(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

static void init_tensor_(float *base, const gpt_tensor *t, float std,
                         int is_ln_weight, uint64_t *s)
{
    float *p = base + t->offset;
    if (t->cols)
        fill_normal_(p, t->numel, std, s);
    else
        fill_const_(p, t->numel, is_ln_weight ? 1.0f : 0.0f);
}

void gpt_init_weights(gpt_model *g, uint64_t seed)
{
    uint64_t s = seed;
    float std = 0.02f;
    float proj_std = 0.02f / sqrtf(2.0f * (float)g->cfg.n_layer);
    memset(g->params, 0, g->n_global * sizeof(float));
    init_tensor_(g->params, &g->glob[GLOB_WTE], std, 0, &s);
    init_tensor_(g->params, &g->glob[GLOB_WPE], 0.01f, 0, &s);
    init_tensor_(g->params, &g->glob[GLOB_LNF_W], 0, 1, &s);
    init_tensor_(g->params, &g->glob[GLOB_LNF_B], 0, 0, &s);
    for (int sl = 0; sl < g->S; sl++) {
        float *base = g->slots[sl].params;
        memset(base, 0, g->slot_size * sizeof(float));
        for (int i = 0; i < SLOT_NTENSORS; i++) {
            int is_proj = i == SLOT_ATTPROJ_W || i == SLOT_FCPROJ_W;
            int is_lnw = i == SLOT_LN1_W || i == SLOT_LN2_W;
            init_tensor_(base, &g->slot[i], is_proj ? proj_std : std, is_lnw,
                         &s);
        }
    }
}

int gpt_init_params(const model_config *cfg, int S, float *params,
                    uint64_t seed)
{
    gpt_model g; /* just what gpt_init_weights reads */
    memset(&g, 0, sizeof g);
    g.cfg = *cfg;
    layout_(&g);
    g.S = S;
    g.params = params;
    g.slots = calloc((size_t)S, sizeof *g.slots);
    if (!g.slots)
        return -1;
    for (int s = 0; s < S; s++)
        g.slots[s].params = gpt_slot_ptr(&g, params, s);
    gpt_init_weights(&g, seed);
    free(g.slots);
    return 0;
}

/* ------------------------------------------------------------- forward */

/* Slot tensors through the compute view (see gpt.h: storage). */
#define W_(g, s, idx) ((g)->w[s] + (g)->slot[idx].offset)
#define DW_(g, s, idx) ((g)->dw[s] + (g)->slot[idx].offset)
#define GW_(g, idx) ((g)->params + (g)->glob[idx].offset)
#define GDW_(g, idx) ((g)->grads + (g)->glob[idx].offset)

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
        float *fch = a->fch + l * Ba * 4 * C;
        float *fchg = a->fch_gelu + l * Ba * 4 * C;
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
        residual_forward(res2, res, res2, BTC);
        layernorm_forward(ln2, a->ln2_mean + l * Ba, a->ln2_rstd + l * Ba, res2,
                          W_(g, s, SLOT_LN2_W), W_(g, s, SLOT_LN2_B), (int)BT,
                          C);
        matmul_forward(fch, ln2, W_(g, s, SLOT_FC_W), W_(g, s, SLOT_FC_B),
                       (int)BT, C, 4 * C);
        gelu_forward(fchg, fch, BT * 4 * C);
        matmul_forward(res3, fchg, W_(g, s, SLOT_FCPROJ_W),
                       W_(g, s, SLOT_FCPROJ_B), (int)BT, 4 * C, C);
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

void gpt_zero_grad(gpt_model *g)
{
    memset(g->grads, 0, g->n_local * sizeof(float));
}

void gpt_backward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B, float loss_scale)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const int V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    const size_t Ba = (size_t)g->B * T;
    gpt_acts *a = &g->a;

    event_(g, GPT_BWD_START, -1);
    for (size_t i = 0; i < BT; i++)
        a->dlosses[i] = loss_scale;
    memset(a->dlogits, 0, BT * V * sizeof(float));
    softmax_crossentropy_backward(a->dlogits, a->probs, targets, a->dlosses,
                                  (int)BT, V);
    memset(a->dlnf, 0, BTC * sizeof(float));
    matmul_backward(a->dlnf, GDW_(g, GLOB_WTE), NULL, a->dlogits, a->lnf,
                    GW_(g, GLOB_WTE), (int)BT, C, V);
    memset(a->dres, 0, BTC * sizeof(float));
    const float *last = a->residual3 + (size_t)(L - 1) * Ba * C;
    layernorm_backward(a->dres, GDW_(g, GLOB_LNF_W), GDW_(g, GLOB_LNF_B),
                       a->dlnf, last, GW_(g, GLOB_LNF_W), a->lnf_mean,
                       a->lnf_rstd, (int)BT, C);

    for (int l = L - 1; l >= 0; l--) {
        int s = g->slot_of[l];
        event_(g, GPT_BWD_LAYER_BEGIN, l);
        const float *res = l == 0 ? a->encoded : a->residual3 + (l - 1) * Ba * C;
        const float *ln1 = a->ln1 + l * Ba * C;
        const float *qkv = a->qkv + l * Ba * 3 * C;
        const float *atty = a->atty + l * Ba * C;
        const float *att = a->att + (size_t)l * g->B * NH * T * T;
        const float *res2 = a->residual2 + l * Ba * C;
        const float *ln2 = a->ln2 + l * Ba * C;
        const float *fch = a->fch + l * Ba * 4 * C;
        const float *fchg = a->fch_gelu + l * Ba * 4 * C;

        /* dres holds d(residual3). residual3 = res2 + mlp(ln2(res2)): the
         * stream gradient passes through unchanged; the MLP adds to it. */
        memset(a->dfch_gelu, 0, BT * 4 * C * sizeof(float));
        matmul_backward(a->dfch_gelu, DW_(g, s, SLOT_FCPROJ_W),
                        DW_(g, s, SLOT_FCPROJ_B), a->dres, fchg,
                        W_(g, s, SLOT_FCPROJ_W), (int)BT, 4 * C, C);
        memset(a->dfch, 0, BT * 4 * C * sizeof(float));
        gelu_backward(a->dfch, fch, a->dfch_gelu, BT * 4 * C);
        memset(a->dln, 0, BTC * sizeof(float));
        matmul_backward(a->dln, DW_(g, s, SLOT_FC_W), DW_(g, s, SLOT_FC_B),
                        a->dfch, ln2, W_(g, s, SLOT_FC_W), (int)BT, C, 4 * C);
        layernorm_backward(a->dres, DW_(g, s, SLOT_LN2_W),
                           DW_(g, s, SLOT_LN2_B), a->dln, res2,
                           W_(g, s, SLOT_LN2_W), a->ln2_mean + l * Ba,
                           a->ln2_rstd + l * Ba, (int)BT, C);
        /* dres now holds d(residual2) = d(res + attproj(attn(ln1(res)))). */
        memset(a->datty, 0, BTC * sizeof(float));
        matmul_backward(a->datty, DW_(g, s, SLOT_ATTPROJ_W),
                        DW_(g, s, SLOT_ATTPROJ_B), a->dres, atty,
                        W_(g, s, SLOT_ATTPROJ_W), (int)BT, C, C);
        memset(a->dqkv, 0, BT * 3 * C * sizeof(float));
        attention_backward(a->dqkv, a->datt, a->datty, qkv, att, B, T, C, NH);
        memset(a->dln, 0, BTC * sizeof(float));
        matmul_backward(a->dln, DW_(g, s, SLOT_QKV_W), DW_(g, s, SLOT_QKV_B),
                        a->dqkv, ln1, W_(g, s, SLOT_QKV_W), (int)BT, C, 3 * C);
        layernorm_backward(a->dres, DW_(g, s, SLOT_LN1_W),
                           DW_(g, s, SLOT_LN1_B), a->dln, res,
                           W_(g, s, SLOT_LN1_W), a->ln1_mean + l * Ba,
                           a->ln1_rstd + l * Ba, (int)BT, C);
        /* dres now holds d(res): the previous layer's residual3. */
        event_(g, GPT_BWD_LAYER_END, l);
    }
    encoder_backward(GDW_(g, GLOB_WTE), GDW_(g, GLOB_WPE), a->dres, inp, B, T,
                     C);
    event_(g, GPT_BWD_DONE, -1);
}

/* ------------------------------------------------------------- optimizer */

float gpt_grad_norm(const gpt_model *g)
{
    double sum = grad_sumsq(g->grads, g->n_global);
    for (int s = 0; s < g->S; s++)
        sum += grad_sumsq(g->slots[s].grads, g->slot_size);
    return (float)sqrt(sum);
}

static void adamw_region_(float *p, float *gr, float *m, float *v,
                          const gpt_tensor *ts, int nt, long t, float lr,
                          float beta1, float beta2, float eps, float wd,
                          float grad_scale)
{
    for (int i = 0; i < nt; i++) {
        size_t o = ts[i].offset;
        adamw_update(p + o, gr + o, m + o, v + o, ts[i].numel, lr, beta1,
                     beta2, eps, ts[i].decay ? wd : 0.0f, grad_scale, t);
    }
}

void gpt_adamw_slot(gpt_model *g, int s, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale)
{
    const gpt_slot_state *st = &g->slots[s];
    long t = ++g->adam_t_slot[s];
    adamw_region_(st->params, st->grads, st->m, st->v, g->slot,
                  SLOT_NTENSORS, t, lr, beta1, beta2, eps, weight_decay,
                  grad_scale);
}

void gpt_adamw(gpt_model *g, float lr, float beta1, float beta2, float eps,
               float weight_decay, float grad_scale)
{
    long t = ++g->adam_t_global;
    adamw_region_(g->params, g->grads, g->m, g->v, g->glob, GLOB_NTENSORS, t,
                  lr, beta1, beta2, eps, weight_decay, grad_scale);
    for (int s = 0; s < g->S; s++)
        if (!g->offloaded[s])
            gpt_adamw_slot(g, s, lr, beta1, beta2, eps, weight_decay,
                           grad_scale);
}

/* ------------------------------------------------------------- delink */

/* Host snapshot of the parameters and moments (not gradients): globals,
 * then S slots, each as params | m | v. */
typedef struct {
    float *mem;
    long adam_t_global;
    long *adam_t_slot;
} snapshot_;

static int snapshot_take_(const gpt_model *g, snapshot_ *sn)
{
    size_t ng = g->n_global, ss = g->slot_size;
    sn->mem = malloc(3 * (ng + (size_t)g->S * ss) * sizeof(float));
    sn->adam_t_slot = malloc((size_t)g->S * sizeof(long));
    if (!sn->mem || !sn->adam_t_slot) {
        free(sn->mem);
        free(sn->adam_t_slot);
        return -1;
    }
    float *p = sn->mem;
    memcpy(p, g->params, ng * sizeof(float));
    memcpy(p + ng, g->m, ng * sizeof(float));
    memcpy(p + 2 * ng, g->v, ng * sizeof(float));
    p += 3 * ng;
    for (int s = 0; s < g->S; s++, p += 3 * ss) {
        memcpy(p, g->slots[s].params, ss * sizeof(float));
        memcpy(p + ss, g->slots[s].m, ss * sizeof(float));
        memcpy(p + 2 * ss, g->slots[s].v, ss * sizeof(float));
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
    size_t ng = g->n_global, ss = g->slot_size;
    const float *p = sn->mem;
    memcpy(g->params, p, ng * sizeof(float));
    memcpy(g->m, p + ng, ng * sizeof(float));
    memcpy(g->v, p + 2 * ng, ng * sizeof(float));
    g->adam_t_global = sn->adam_t_global;
    for (int s = 0; s < g->S; s++) {
        int src = src_of ? src_of[s] : s;
        const float *q = p + 3 * ng + (size_t)src * 3 * ss;
        memcpy(g->slots[s].params, q, ss * sizeof(float));
        if (!reset_moments) {
            memcpy(g->slots[s].m, q + ss, ss * sizeof(float));
            memcpy(g->slots[s].v, q + 2 * ss, ss * sizeof(float));
            g->adam_t_slot[s] = sn->adam_t_slot[src];
        }
    }
}

int gpt_reslot(gpt_model *g, int new_S, const int *new_slot_of,
               const int *src_of, int reset_moments)
{
    int L = g->cfg.n_layer, old_S = g->S;
    if (new_S < 1 || new_S > L)
        return -1;
    for (int s = 0; s < new_S; s++)
        if (src_of[s] < 0 || src_of[s] >= old_S)
            return -1;
    for (int l = 0; l < L; l++)
        if (new_slot_of[l] < 0 || new_slot_of[l] >= new_S)
            return -1;
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
    free(sn.mem);
    free(sn.adam_t_slot);
    return rc;
}
