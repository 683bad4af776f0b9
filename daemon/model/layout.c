/*
 * layout.c — the parts of the model that need no kernel (gpt.h): the
 * parameter layout, the activation block's size and placement, tensor
 * names and the initial weights. The planner (and so m6ctl) links this file
 * without the engine; gpt.c and the CUDA model build on it.
 */
#include "model/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAD 16 /* floats: 64-byte alignment of every region */

static size_t pad_(size_t n) { return (n + PAD - 1) / PAD * PAD; }

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

void gpt_layout(const model_config *cfg, gpt_tensor glob[GLOB_NTENSORS],
                gpt_tensor slot[SLOT_NTENSORS], size_t *n_global,
                size_t *slot_size)
{
    int C = cfg->n_embd;
    size_t off = 0;
    set_tensor_(&glob[GLOB_WTE], "wte", &off, cfg->vocab_size, C);
    set_tensor_(&glob[GLOB_WPE], "wpe", &off, cfg->seq_len, C);
    set_tensor_(&glob[GLOB_LNF_W], "ln_f.weight", &off, C, 0);
    set_tensor_(&glob[GLOB_LNF_B], "ln_f.bias", &off, C, 0);
    *n_global = pad_(off);
    off = 0;
    set_tensor_(&slot[SLOT_LN1_W], "ln_1.weight", &off, C, 0);
    set_tensor_(&slot[SLOT_LN1_B], "ln_1.bias", &off, C, 0);
    set_tensor_(&slot[SLOT_QKV_W], "attn.c_attn.weight", &off, 3 * C, C);
    set_tensor_(&slot[SLOT_QKV_B], "attn.c_attn.bias", &off, 3 * C, 0);
    set_tensor_(&slot[SLOT_ATTPROJ_W], "attn.c_proj.weight", &off, C, C);
    set_tensor_(&slot[SLOT_ATTPROJ_B], "attn.c_proj.bias", &off, C, 0);
    set_tensor_(&slot[SLOT_LN2_W], "ln_2.weight", &off, C, 0);
    set_tensor_(&slot[SLOT_LN2_B], "ln_2.bias", &off, C, 0);
    set_tensor_(&slot[SLOT_FC_W], "mlp.c_fc.weight", &off, 4 * C, C);
    set_tensor_(&slot[SLOT_FC_B], "mlp.c_fc.bias", &off, 4 * C, 0);
    set_tensor_(&slot[SLOT_FCPROJ_W], "mlp.c_proj.weight", &off, C, 4 * C);
    set_tensor_(&slot[SLOT_FCPROJ_B], "mlp.c_proj.bias", &off, C, 0);
    *slot_size = pad_(off);
}

void gpt_layout_sizes(const model_config *cfg, size_t *n_global,
                      size_t *slot_size)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS];
    gpt_layout(cfg, glob, slot, n_global, slot_size);
}

void gpt_tensor_name(char *out, size_t n, const char *prefix, int s,
                     const gpt_tensor *t)
{
    if (s < 0)
        snprintf(out, n, "%s%s", prefix, t->name);
    else
        snprintf(out, n, "%sslots.%d.%s", prefix, s, t->name);
}

/* ------------------------------------------------------------- activations */

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

void gpt_acts_place(const model_config *cfg, int B, gpt_acts *a, float *mem)
{
    act_entry_ t[N_ACTS_];
    size_t n = act_table_(cfg, B, a, t);
    for (size_t i = 0; i < n; i++) {
        *t[i].p = mem;
        mem += pad_(t[i].n);
    }
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

void gpt_init_regions(const model_config *cfg, int S, float *globals,
                      float *const *slot_params, uint64_t seed)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS];
    size_t n_global, slot_size;
    gpt_layout(cfg, glob, slot, &n_global, &slot_size);
    uint64_t s = seed;
    float std = 0.02f;
    float proj_std = 0.02f / sqrtf(2.0f * (float)cfg->n_layer);
    memset(globals, 0, n_global * sizeof(float));
    init_tensor_(globals, &glob[GLOB_WTE], std, 0, &s);
    init_tensor_(globals, &glob[GLOB_WPE], 0.01f, 0, &s);
    init_tensor_(globals, &glob[GLOB_LNF_W], 0, 1, &s);
    init_tensor_(globals, &glob[GLOB_LNF_B], 0, 0, &s);
    for (int sl = 0; sl < S; sl++) {
        float *base = slot_params[sl];
        memset(base, 0, slot_size * sizeof(float));
        for (int i = 0; i < SLOT_NTENSORS; i++) {
            int is_proj = i == SLOT_ATTPROJ_W || i == SLOT_FCPROJ_W;
            int is_lnw = i == SLOT_LN1_W || i == SLOT_LN2_W;
            init_tensor_(base, &slot[i], is_proj ? proj_std : std, is_lnw,
                         &s);
        }
    }
}

int gpt_init_params(const model_config *cfg, int S, float *params,
                    uint64_t seed)
{
    size_t n_global, slot_size;
    gpt_layout_sizes(cfg, &n_global, &slot_size);
    float **slot_params = malloc((size_t)(S > 0 ? S : 1) * sizeof *slot_params);
    if (!slot_params)
        return -1;
    for (int s = 0; s < S; s++)
        slot_params[s] = params + n_global + (size_t)s * slot_size;
    gpt_init_regions(cfg, S, params, slot_params, seed);
    free(slot_params);
    return 0;
}
