/*
 * layout.c — the parts of the model that need no kernel (gpt.h): the
 * parameter layout, the activation block's size and placement, and tensor
 * names. The planner (and so m6ctl) links this file without the engine;
 * gpt.c, model/init.c and the CUDA model build on it.
 */
#include "model/gpt.h"
#include "model/facts.h"

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

/* The slot tensors of one kind: moe 0 the dense block, 1 the MoE block. */
static void slot_layout_(const model_config *cfg, int moe,
                         gpt_tensor slot[SLOT_NTENSORS_MAX], size_t *size)
{
    int C = cfg->n_embd, first;
    int E = cfg->moe_experts, H = model_moe_hidden(cfg);
    int El = model_local_experts(cfg, &first); /* E without expert parallelism */
    size_t off = 0;
    set_tensor_(&slot[SLOT_LN1_W], "ln_1.weight", &off, C, 0);
    set_tensor_(&slot[SLOT_LN1_B], "ln_1.bias", &off, C, 0);
    set_tensor_(&slot[SLOT_QKV_W], "attn.c_attn.weight", &off, 3 * C, C);
    set_tensor_(&slot[SLOT_QKV_B], "attn.c_attn.bias", &off, 3 * C, 0);
    set_tensor_(&slot[SLOT_ATTPROJ_W], "attn.c_proj.weight", &off, C, C);
    set_tensor_(&slot[SLOT_ATTPROJ_B], "attn.c_proj.bias", &off, C, 0);
    set_tensor_(&slot[SLOT_LN2_W], "ln_2.weight", &off, C, 0);
    set_tensor_(&slot[SLOT_LN2_B], "ln_2.bias", &off, C, 0);
    if (!moe) {
        set_tensor_(&slot[SLOT_FC_W], "mlp.c_fc.weight", &off, 4 * C, C);
        set_tensor_(&slot[SLOT_FC_B], "mlp.c_fc.bias", &off, 4 * C, 0);
        set_tensor_(&slot[SLOT_FCPROJ_W], "mlp.c_proj.weight", &off, C, 4 * C);
        set_tensor_(&slot[SLOT_FCPROJ_B], "mlp.c_proj.bias", &off, C, 0);
        memset(&slot[SLOT_GATE_W], 0, 2 * sizeof slot[0]);
    } else {
        /* the (local) experts and the gate where a dense block has its
         * MLP */
        set_tensor_(&slot[SLOT_FC_W], "moe.experts.c_fc.weight", &off,
                    El * H, C);
        set_tensor_(&slot[SLOT_FC_B], "moe.experts.c_fc.bias", &off, El * H,
                    0);
        set_tensor_(&slot[SLOT_FCPROJ_W], "moe.experts.c_proj.weight", &off,
                    El * C, H);
        set_tensor_(&slot[SLOT_FCPROJ_B], "moe.experts.c_proj.bias", &off,
                    El * C, 0);
        set_tensor_(&slot[SLOT_GATE_W], "moe.gate.weight", &off, E, C);
        set_tensor_(&slot[SLOT_GATE_B], "moe.gate.bias", &off, E, 0);
    }
    *size = pad_(off);
}

void gpt_slot_layout(const model_config *cfg, int moe,
                     gpt_tensor slot[SLOT_NTENSORS_MAX], size_t *size)
{
    slot_layout_(cfg, moe && cfg->moe_experts > 0, slot, size);
}

void gpt_layout(const model_config *cfg, gpt_tensor glob[GLOB_NTENSORS],
                gpt_tensor slot[SLOT_NTENSORS_MAX], size_t *n_global,
                size_t *slot_size)
{
    int C = cfg->n_embd;
    size_t off = 0;
    set_tensor_(&glob[GLOB_WTE], "wte", &off, cfg->vocab_size, C);
    set_tensor_(&glob[GLOB_WPE], "wpe", &off, cfg->seq_len, C);
    set_tensor_(&glob[GLOB_LNF_W], "ln_f.weight", &off, C, 0);
    set_tensor_(&glob[GLOB_LNF_B], "ln_f.bias", &off, C, 0);
    *n_global = pad_(off);
    slot_layout_(cfg, cfg->moe_experts > 0, slot, slot_size);
}

/* ------------------------------------------------------------- checkpoints */

static int ck_put_(gpt_ckpt_tensor *out, int n, const char *name,
                   size_t offset, int rows, int cols)
{
    if (out) {
        snprintf(out[n].name, sizeof out[n].name, "%.47s", name);
        out[n].offset = offset;
        out[n].rows = rows;
        out[n].cols = cols;
    }
    return n + 1;
}

int gpt_slot_ckpt_tensors(const model_config *cfg, int moe,
                          gpt_ckpt_tensor *out)
{
    gpt_tensor t[SLOT_NTENSORS_MAX];
    size_t size;
    moe = moe && cfg->moe_experts > 0;
    gpt_slot_layout(cfg, moe, t, &size);
    int n = 0, nt = moe ? SLOT_LN2_B + 1 : SLOT_NTENSORS;
    for (int i = 0; i < nt; i++)
        n = ck_put_(out, n, t[i].name, t[i].offset, t[i].rows, t[i].cols);
    if (!moe)
        return n;
    int E = cfg->moe_experts, k = cfg->moe_prototypes, Ep = E / k;
    int C = cfg->n_embd, H = model_moe_hidden(cfg), first;
    int El = model_local_experts(cfg, &first);
    char nm[64];
    for (int p = 0; p < k; p++) {
        snprintf(nm, sizeof nm, "moe.gate.%d.weight", p);
        n = ck_put_(out, n, nm, t[SLOT_GATE_W].offset + (size_t)p * Ep * C,
                    Ep, C);
        snprintf(nm, sizeof nm, "moe.gate.%d.bias", p);
        n = ck_put_(out, n, nm, t[SLOT_GATE_B].offset + (size_t)p * Ep, Ep, 0);
    }
    /* local expert e is global expert first + e (all E: first 0) */
    for (int e = 0; e < El; e++) {
        snprintf(nm, sizeof nm, "moe.experts.%d.c_fc.weight", first + e);
        n = ck_put_(out, n, nm, t[SLOT_FC_W].offset + (size_t)e * H * C, H,
                    C);
        snprintf(nm, sizeof nm, "moe.experts.%d.c_fc.bias", first + e);
        n = ck_put_(out, n, nm, t[SLOT_FC_B].offset + (size_t)e * H, H, 0);
        snprintf(nm, sizeof nm, "moe.experts.%d.c_proj.weight", first + e);
        n = ck_put_(out, n, nm, t[SLOT_FCPROJ_W].offset + (size_t)e * C * H,
                    C, H);
        snprintf(nm, sizeof nm, "moe.experts.%d.c_proj.bias", first + e);
        n = ck_put_(out, n, nm, t[SLOT_FCPROJ_B].offset + (size_t)e * C, C,
                    0);
    }
    return n;
}

/* ------------------------------------------------------------- Adafactor */

static int af_put_(gpt_af_tensor *out, int n, size_t *state, size_t offset,
                   int rows, int cols)
{
    if (out)
        out[n] = (gpt_af_tensor){offset, *state, rows, cols, cols != 0};
    *state += (size_t)rows + (size_t)cols;
    return n + 1;
}

int gpt_af_tensors(const model_config *cfg, int region, gpt_af_tensor *out,
                   size_t *state_floats)
{
    size_t state = 0;
    int n = 0;
    if (region < 0) {
        gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
        size_t ng, ss;
        gpt_layout(cfg, glob, slot, &ng, &ss);
        for (int i = 0; i < GLOB_NTENSORS; i++)
            n = af_put_(out, n, &state, glob[i].offset, glob[i].rows,
                        glob[i].cols);
    } else {
        int nt = gpt_slot_ckpt_tensors(cfg, region, NULL);
        gpt_ckpt_tensor *ct = malloc((size_t)nt * sizeof *ct);
        if (!ct)
            return -1;
        gpt_slot_ckpt_tensors(cfg, region, ct);
        for (int i = 0; i < nt; i++)
            n = af_put_(out, n, &state, ct[i].offset, ct[i].rows, ct[i].cols);
        free(ct);
    }
    if (state_floats)
        *state_floats = state;
    return n;
}

/* ------------------------------------------------------------- share map */

int gpt_model_mixed(const model_config *cfg)
{
    int n_moe = 0, L = cfg->n_layer;
    for (int l = 0; l < L; l++)
        n_moe += model_layer_is_moe(cfg, l);
    return n_moe > 0 && n_moe < L;
}

int gpt_default_share_map(const model_config *cfg, int S, int *slot_of)
{
    int L = cfg->n_layer;
    if (S < 1 || S > L)
        return -1;
    if (!gpt_model_mixed(cfg)) {
        for (int l = 0; l < L; l++)
            slot_of[l] = (int)((long)l * S / L);
        return 0;
    }
    int Lk[2] = {0, 0};
    for (int l = 0; l < L; l++)
        Lk[model_layer_is_moe(cfg, l)]++;
    if (S < 2)
        return -1;
    /* MoE slots in proportion to MoE layers, at least one of each kind */
    int Sm = (int)(((long)S * Lk[1] + L / 2) / L);
    if (Sm < S - Lk[0]) Sm = S - Lk[0];
    if (Sm < 1) Sm = 1;
    if (Sm > Lk[1]) Sm = Lk[1];
    if (Sm > S - 1) Sm = S - 1;
    int Sk[2] = {S - Sm, Sm}, base[2] = {0, S - Sm}, seen[2] = {0, 0};
    /* group of each layer within its kind, then slots numbered in the
     * order of their first layer */
    int *renum = malloc((size_t)S * sizeof(int)), next = 0;
    if (!renum)
        return -1;
    for (int s = 0; s < S; s++)
        renum[s] = -1;
    for (int l = 0; l < L; l++) {
        int k = model_layer_is_moe(cfg, l);
        int grp = base[k] + (int)((long)seen[k]++ * Sk[k] / Lk[k]);
        if (renum[grp] < 0)
            renum[grp] = next++;
        slot_of[l] = renum[grp];
    }
    free(renum);
    return 0;
}

int gpt_slot_kinds(const model_config *cfg, int S, const int *slot_of,
                   unsigned char *moe, char *err, size_t errlen)
{
    int L = cfg->n_layer, mixed = gpt_model_mixed(cfg);
    unsigned char uniform = cfg->moe_experts > 0 && !mixed;
    for (int s = 0; s < S; s++)
        moe[s] = 0xff;
    for (int l = 0; l < L; l++) {
        int s = slot_of[l];
        if (s < 0 || s >= S) {
            if (err)
                snprintf(err, errlen, "slot_of[%d] = %d out of range [0, %d)",
                         l, s, S);
            return -1;
        }
        unsigned char k = (unsigned char)model_layer_is_moe(cfg, l);
        if (moe[s] != 0xff && moe[s] != k) {
            if (err)
                snprintf(err, errlen, "slot %d is shared by an MoE and a dense "
                         "block (layer %d); a slot holds blocks of one kind",
                         s, l);
            return -1;
        }
        moe[s] = k;
    }
    for (int s = 0; s < S; s++)
        if (moe[s] == 0xff) {
            if (mixed) {
                if (err)
                    snprintf(err, errlen, "slot %d is used by no layer", s);
                return -1;
            }
            moe[s] = uniform;
        }
    return 0;
}

void gpt_layout_sizes(const model_config *cfg, size_t *n_global,
                      size_t *slot_size)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
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
    int moe = c->moe_experts > 0;
    size_t E = c->moe_experts, K = moe ? c->moe_prototypes : 0;
    /* mixed models (model.moe.every > 1) keep both per-layer sets, indexed
     * by layer: simple, and the activations are not what bounds them */
    int mixed = gpt_model_mixed(c);
    size_t H = moe ? (size_t)model_moe_hidden(c) : 0;
    size_t F = moe && !mixed ? 0 : 4 * C;
    size_t NK = BT * K, Lm = moe ? L : 0;
    act_entry_ tab[] = {
        {&a->encoded, BT * C},
        {&a->ln1, L * BT * C}, {&a->ln1_mean, L * BT}, {&a->ln1_rstd, L * BT},
        {&a->qkv, L * BT * 3 * C}, {&a->atty, L * BT * C},
        {&a->att, L * B * NH * T * T}, {&a->residual2, L * BT * C},
        {&a->ln2, L * BT * C}, {&a->ln2_mean, L * BT}, {&a->ln2_rstd, L * BT},
        {&a->fch, L * BT * F}, {&a->fch_gelu, L * BT * F},
        {&a->residual3, L * BT * C},
        {&a->lnf, BT * C}, {&a->lnf_mean, BT}, {&a->lnf_rstd, BT},
        {&a->logits, BT * V}, {&a->probs, BT * V}, {&a->losses, BT},
        {&a->dres, BT * C}, {&a->dln, BT * C}, {&a->datty, BT * C},
        {&a->dqkv, BT * 3 * C}, {&a->dfch, BT * F},
        {&a->dfch_gelu, BT * F}, {&a->datt, B * NH * T * T},
        {&a->dlogits, BT * V}, {&a->dlnf, BT * C}, {&a->dlosses, BT},
        /* MoE (int32 tensors placed as floats: the same size) */
        {&a->moe_probs, Lm * BT * E}, {&a->moe_lse, Lm * NK},
        {(float **)(void *)&a->moe_expert, Lm * NK},
        {(float **)(void *)&a->moe_slot, Lm * NK},
        {(float **)(void *)&a->moe_counts, Lm * E},
        {(float **)(void *)&a->moe_routed, Lm * E},
        {(float **)(void *)&a->moe_offset, moe ? Lm * (E + 1) : 0},
        {(float **)(void *)&a->moe_row_token, Lm * NK},
        {&a->moe_xe, Lm * NK * C}, {&a->moe_ye, Lm * NK * C},
        {&a->moe_hpre, Lm * NK * H}, {&a->moe_hact, Lm * NK * H},
        {&a->moe_dye, NK * C}, {&a->moe_dxe, NK * C},
        {&a->moe_dh1, NK * H}, {&a->moe_dh2, NK * H},
        {&a->moe_dlogits, BT * E},
    };
    _Static_assert(sizeof(int32_t) == sizeof(float), "int32 acts as floats");
    size_t n = sizeof tab / sizeof tab[0];
    _Static_assert(sizeof tab / sizeof tab[0] == 47, "N_ACTS_");
    if (t)
        memcpy(t, tab, sizeof tab);
    return n;
}

#define N_ACTS_ 47

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
