/*
 * gpt.c — GPT-2-style decoder with a share map: parameter layout, init,
 * forward, backward, AdamW over slots, and re-slotting (delink).
 * The math lives in kernels/; this file wires the ops together.
 */
#include "model/gpt.h"

#include <errno.h>
#include <math.h>
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

static int alloc_state_(gpt_model *g, int S)
{
    g->S = S;
    g->n_params = g->n_global + (size_t)S * g->slot_size;
    g->params = alloc_floats_(g->n_params);
    g->grads = alloc_floats_(g->n_params);
    g->m = alloc_floats_(g->n_params);
    g->v = alloc_floats_(g->n_params);
    g->adam_t_slot = calloc((size_t)S, sizeof(long));
    if (!g->params || !g->grads || !g->m || !g->v || !g->adam_t_slot)
        return -1;
    return 0;
}

static void free_state_(gpt_model *g)
{
    free(g->params);
    free(g->grads);
    free(g->m);
    free(g->v);
    free(g->adam_t_slot);
    g->params = g->grads = g->m = g->v = NULL;
    g->adam_t_slot = NULL;
}

static int alloc_acts_(gpt_model *g, int B)
{
    const model_config *c = &g->cfg;
    size_t L = c->n_layer, T = c->seq_len, C = c->n_embd, NH = c->n_head;
    size_t V = c->vocab_size, BT = (size_t)B * T;
    gpt_acts *a = &g->a;
    struct { float **p; size_t n; } t[] = {
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
    size_t n = sizeof t / sizeof t[0], total = 0;
    for (size_t i = 0; i < n; i++)
        total += pad_(t[i].n);
    g->act_mem = alloc_floats_(total);
    if (!g->act_mem)
        return -1;
    float *p = g->act_mem;
    for (size_t i = 0; i < n; i++) {
        *t[i].p = p;
        p += pad_(t[i].n);
    }
    g->B = B;
    g->T = (int)T;
    return 0;
}

static void default_share_map_(int *slot_of, int L, int S)
{
    for (int l = 0; l < L; l++)
        slot_of[l] = (int)((long)l * S / L);
}

int gpt_create(gpt_model *g, const model_config *cfg, int S, int B)
{
    memset(g, 0, sizeof *g);
    g->cfg = *cfg;
    if (S < 1 || S > cfg->n_layer || B < 1 || cfg->n_embd % cfg->n_head) {
        errno = EINVAL;
        return -1;
    }
    layout_(g);
    g->slot_of = calloc((size_t)cfg->n_layer, sizeof(int));
    if (!g->slot_of || alloc_state_(g, S) != 0 || alloc_acts_(g, B) != 0) {
        gpt_free(g);
        errno = ENOMEM;
        return -1;
    }
    default_share_map_(g->slot_of, cfg->n_layer, S);
    return 0;
}

void gpt_free(gpt_model *g)
{
    free_state_(g);
    free(g->slot_of);
    free(g->act_mem);
    g->slot_of = NULL;
    g->act_mem = NULL;
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
    memset(g->params, 0, g->n_params * sizeof(float));
    init_tensor_(g->params, &g->glob[GLOB_WTE], std, 0, &s);
    init_tensor_(g->params, &g->glob[GLOB_WPE], 0.01f, 0, &s);
    init_tensor_(g->params, &g->glob[GLOB_LNF_W], 0, 1, &s);
    init_tensor_(g->params, &g->glob[GLOB_LNF_B], 0, 0, &s);
    for (int sl = 0; sl < g->S; sl++) {
        float *base = gpt_slot_ptr(g, g->params, sl);
        for (int i = 0; i < SLOT_NTENSORS; i++) {
            int is_proj = i == SLOT_ATTPROJ_W || i == SLOT_FCPROJ_W;
            int is_lnw = i == SLOT_LN1_W || i == SLOT_LN2_W;
            init_tensor_(base, &g->slot[i], is_proj ? proj_std : std, is_lnw,
                         &s);
        }
    }
}

/* ------------------------------------------------------------- forward */

#define W_(g, s, idx) (gpt_slot_ptr((g), (g)->params, (s)) + (g)->slot[idx].offset)
#define DW_(g, s, idx) (gpt_slot_ptr((g), (g)->grads, (s)) + (g)->slot[idx].offset)
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

    encoder_forward(a->encoded, inp, GW_(g, GLOB_WTE), GW_(g, GLOB_WPE), B, T,
                    C);
    for (int l = 0; l < L; l++) {
        int s = g->slot_of[l];
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
    }
    const float *last = a->residual3 + (size_t)(L - 1) * Ba * C;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last,
                      GW_(g, GLOB_LNF_W), GW_(g, GLOB_LNF_B), (int)BT, C);
    matmul_forward(a->logits, a->lnf, GW_(g, GLOB_WTE), NULL, (int)BT, C, V);
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
    memset(g->grads, 0, g->n_params * sizeof(float));
}

void gpt_backward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B, float loss_scale)
{
    const int T = g->T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    const int V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    const size_t Ba = (size_t)g->B * T;
    gpt_acts *a = &g->a;

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
    }
    encoder_backward(GDW_(g, GLOB_WTE), GDW_(g, GLOB_WPE), a->dres, inp, B, T,
                     C);
}

/* ------------------------------------------------------------- optimizer */

float gpt_grad_norm(const gpt_model *g)
{
    return (float)sqrt(grad_sumsq(g->grads, g->n_params));
}

static void adamw_region_(gpt_model *g, size_t base, const gpt_tensor *ts,
                          int nt, long t, float lr, float beta1, float beta2,
                          float eps, float wd, float grad_scale)
{
    for (int i = 0; i < nt; i++) {
        size_t o = base + ts[i].offset;
        adamw_update(g->params + o, g->grads + o, g->m + o, g->v + o,
                     ts[i].numel, lr, beta1, beta2, eps,
                     ts[i].decay ? wd : 0.0f, grad_scale, t);
    }
}

void gpt_adamw(gpt_model *g, float lr, float beta1, float beta2, float eps,
               float weight_decay, float grad_scale)
{
    long t = ++g->adam_t_global;
    adamw_region_(g, 0, g->glob, GLOB_NTENSORS, t, lr, beta1, beta2, eps,
                  weight_decay, grad_scale);
    for (int s = 0; s < g->S; s++) {
        t = ++g->adam_t_slot[s];
        adamw_region_(g, g->n_global + (size_t)s * g->slot_size, g->slot,
                      SLOT_NTENSORS, t, lr, beta1, beta2, eps, weight_decay,
                      grad_scale);
    }
}

/* ------------------------------------------------------------- delink */

int gpt_reslot(gpt_model *g, int new_S, const int *new_slot_of,
               const int *src_of, int reset_moments)
{
    gpt_model old = *g;
    if (new_S < 1 || new_S > g->cfg.n_layer)
        return -1;
    for (int s = 0; s < new_S; s++)
        if (src_of[s] < 0 || src_of[s] >= old.S)
            return -1;
    g->params = g->grads = g->m = g->v = NULL;
    g->adam_t_slot = NULL;
    if (alloc_state_(g, new_S) != 0) {
        free_state_(g);
        g->S = old.S;
        g->n_params = old.n_params;
        g->params = old.params;
        g->grads = old.grads;
        g->m = old.m;
        g->v = old.v;
        g->adam_t_slot = old.adam_t_slot;
        errno = ENOMEM;
        return -1;
    }
    size_t nb = g->n_global * sizeof(float), sb = g->slot_size * sizeof(float);
    memcpy(g->params, old.params, nb);
    memcpy(g->m, old.m, nb);
    memcpy(g->v, old.v, nb);
    for (int s = 0; s < new_S; s++) {
        int src = src_of[s];
        memcpy(gpt_slot_ptr(g, g->params, s), gpt_slot_ptr(&old, old.params, src), sb);
        if (!reset_moments) {
            memcpy(gpt_slot_ptr(g, g->m, s), gpt_slot_ptr(&old, old.m, src), sb);
            memcpy(gpt_slot_ptr(g, g->v, s), gpt_slot_ptr(&old, old.v, src), sb);
            g->adam_t_slot[s] = old.adam_t_slot[src];
        }
    }
    memcpy(g->slot_of, new_slot_of, (size_t)g->cfg.n_layer * sizeof(int));
    free(old.params);
    free(old.grads);
    free(old.m);
    free(old.v);
    free(old.adam_t_slot);
    return 0;
}
