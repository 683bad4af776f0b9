/*
 * facts.c — the model's derived figures (facts.h): parameter counts and
 * FLOPs per token, each read off the parameter layout (layout.c) so that
 * a count and the allocation cannot drift apart.
 */
#include "model/facts.h"

#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"

/* Sum of numel over the first n tensors of t. */
static size_t numel_(const gpt_tensor *t, int n)
{
    size_t s = 0;
    for (int i = 0; i < n; i++)
        s += t[i].numel;
    return s;
}

size_t model_global_params(const model_config *cfg)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t ng, ss;
    gpt_layout(cfg, glob, slot, &ng, &ss);
    return numel_(glob, GLOB_NTENSORS);
}

size_t model_embedding_params(const model_config *cfg)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t ng, ss;
    gpt_layout(cfg, glob, slot, &ng, &ss);
    return glob[GLOB_WTE].numel + glob[GLOB_WPE].numel;
}

size_t model_slot_params(const model_config *cfg, int moe)
{
    gpt_tensor slot[SLOT_NTENSORS_MAX];
    size_t size;
    moe = moe && cfg->moe_experts > 0;
    gpt_slot_layout(cfg, moe, slot, &size);
    return numel_(slot, moe ? SLOT_NTENSORS_MAX : SLOT_NTENSORS);
}

size_t model_params(const model_config *cfg, int S)
{
    int L = cfg->n_layer;
    if (S < 1 || S > L)
        return 0;
    int *slot_of = malloc((size_t)L * sizeof(int));
    unsigned char *moe = malloc((size_t)S);
    size_t n = 0;
    if (slot_of && moe && gpt_default_share_map(cfg, S, slot_of) == 0 &&
        gpt_slot_kinds(cfg, S, slot_of, moe, NULL, 0) == 0) {
        n = model_global_params(cfg);
        for (int s = 0; s < S; s++)
            n += model_slot_params(cfg, moe[s]);
    }
    free(slot_of);
    free(moe);
    return n;
}

size_t model_param_floats(const model_config *cfg, int S, const int *slot_of)
{
    int L = cfg->n_layer;
    if (S < 1 || S > L)
        return 0;
    int *map = NULL;
    unsigned char *moe = malloc((size_t)S);
    size_t n = 0;
    if (!slot_of) {
        map = malloc((size_t)L * sizeof(int));
        if (map && gpt_default_share_map(cfg, S, map) == 0)
            slot_of = map;
    }
    if (slot_of && moe && gpt_slot_kinds(cfg, S, slot_of, moe, NULL, 0) == 0) {
        gpt_tensor slot[SLOT_NTENSORS_MAX];
        size_t size[2];
        gpt_layout_sizes(cfg, &n, &size[0]);
        gpt_slot_layout(cfg, 0, slot, &size[0]);
        gpt_slot_layout(cfg, 1, slot, &size[1]);
        for (int s = 0; s < S; s++)
            n += size[moe[s]];
    }
    free(map);
    free(moe);
    return n;
}

model_block_parts model_block_parts_of(const model_config *cfg)
{
    gpt_tensor slot[SLOT_NTENSORS_MAX];
    size_t ss;
    model_block_parts p = {0, 0, 0, 0};
    gpt_slot_layout(cfg, 0, slot, &ss);
    p.attn = numel_(slot, SLOT_LN2_B + 1);
    p.mlp = numel_(slot + SLOT_FC_W, SLOT_FCPROJ_B - SLOT_FC_W + 1);
    if (cfg->moe_experts > 0) {
        gpt_slot_layout(cfg, 1, slot, &ss);
        p.gate = numel_(slot + SLOT_GATE_W, 2);
        /* the expert tensors hold E experts of equal size */
        p.expert = numel_(slot + SLOT_FC_W, SLOT_FCPROJ_B - SLOT_FC_W + 1) /
                   (size_t)cfg->moe_experts;
    }
    return p;
}

double model_active_params(const model_config *cfg)
{
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t ng, ss;
    gpt_layout(cfg, glob, slot, &ng, &ss);
    model_block_parts p = model_block_parts_of(cfg);
    /* an MoE block: its gate and the k experts a token is routed to */
    double block[2] = {(double)(p.attn + p.mlp),
                       (double)(p.attn + p.gate) +
                           (double)cfg->moe_prototypes * (double)p.expert};
    double n = (double)glob[GLOB_WTE].numel; /* the tied LM head */
    for (int l = 0; l < cfg->n_layer; l++)
        n += block[model_layer_is_moe(cfg, l)];
    return n;
}

model_param_bytes model_param_bytes_of(int cuda)
{
    return model_param_bytes_for(cuda, NULL);
}

/* AdamW with fp32 masters: the table of facts.h */
static model_param_bytes adamw_fp32_bytes_(int cuda)
{
    if (cuda)
        return (model_param_bytes){
            .weights = 6, .grads = 2, .optim = 8, .resident = 16,
            .staging = 4, .moved = 2,
            .host_weights = 6, .host_grads = 6, .host = 20, .pinned = 4,
            .spec_host = 14, .spec_pinned = 2,
            .adam_direct = 30, .adam_accum = 36,
            .stream_grad = 2,
        };
    return (model_param_bytes){
        .weights = 4, .grads = 4, .optim = 8, .resident = 16,
        .staging = 8, .moved = 4,
        .host_weights = 4, .host_grads = 4, .host = 16, .pinned = 16,
        .spec_host = 12, .spec_pinned = 0,
        .adam_direct = 28, .adam_accum = 28,
        .stream_grad = 4,
    };
}

model_param_bytes model_param_bytes_for(int cuda, const gpt_optim *o)
{
    model_param_bytes b = adamw_fp32_bytes_(cuda);
    if (!o)
        return b;
    if (o->adafactor)
        b.optim = o->first_moment ? 4 : 0;
    if (o->master_bf16 && cuda) {
        b.weights = 2;      /* the bf16 working copy is the master */
        b.host_weights = 2; /* the pinned bf16 copy is */
    }
    b.resident = b.weights + b.grads + b.optim;
    b.host = b.host_weights + b.host_grads + b.optim;
    return b;
}

int model_af_state_floats(const model_config *cfg, model_af_floats *out)
{
    memset(out, 0, sizeof *out);
    size_t moe = 0;
    if (gpt_af_tensors(cfg, -1, NULL, &out->global) < 0 ||
        gpt_af_tensors(cfg, 0, NULL, &out->dense_slot) < 0)
        return -1;
    if (cfg->moe_experts <= 0)
        return 0;
    int n = gpt_af_tensors(cfg, 1, NULL, &moe);
    gpt_af_tensor *t = n < 0 ? NULL : malloc((size_t)n * sizeof *t);
    if (!t)
        return -1;
    gpt_af_tensors(cfg, 1, t, NULL);
    /* the experts' tensors are the region's last 4E (gpt_slot_ckpt_tensors'
     * order: c_fc weight and bias, c_proj weight and bias per expert), all
     * experts of one shape */
    size_t e = 0;
    for (int i = n - 4; i < n; i++)
        e += t[i].cols ? (size_t)t[i].rows + (size_t)t[i].cols
                       : (size_t)t[i].rows;
    free(t);
    out->expert = e;
    out->moe_shared = moe - (size_t)cfg->moe_experts * e;
    return 0;
}

size_t model_optim_floats(const model_config *cfg, int region,
                          const gpt_optim *o)
{
    size_t ng, ss, rf;
    gpt_tensor slot[SLOT_NTENSORS_MAX];
    gpt_layout_sizes(cfg, &ng, &ss);
    if (region < 0)
        rf = ng;
    else
        gpt_slot_layout(cfg, region && cfg->moe_experts > 0, slot, &rf);
    if (!o || !o->adafactor)
        return 2 * rf;
    size_t v;
    if (gpt_af_tensors(cfg, region < 0 ? -1 : region && cfg->moe_experts > 0,
                       NULL, &v) < 0)
        return 0;
    return (o->first_moment ? rf : 0) + v;
}

double model_flops_per_token(const model_config *cfg)
{
    return 6.0 * model_active_params(cfg) +
           12.0 * cfg->n_layer * (double)cfg->n_embd * cfg->seq_len;
}

size_t model_optim_bytes_sharded(size_t bytes, int world)
{
    return world <= 1 ? bytes : (bytes + (size_t)world - 1) / (size_t)world;
}

int model_expert_range(int E, int P, int q, int *first)
{
    long lo = (long)q * E / P, hi = (long)(q + 1) * E / P;
    *first = (int)lo;
    return (int)(hi - lo);
}

double model_ep_alltoall_bytes(double N, int k, int C, int E, int P, int q,
                               size_t elem)
{
    if (P <= 1 || E <= 0)
        return 0;
    int first, El = model_expert_range(E, P, q, &first);
    double away = (double)(E - El) / E;
    return 4.0 * N * k * away * C * (double)elem +
           (double)(E - El) * sizeof(int32_t);
}

double model_ep_alltoall_seconds(double bytes, double calls, int P, int G,
                                 double intra_Bps, double inter_Bps,
                                 double latency_s)
{
    double t = calls * latency_s;
    if (P <= 1 || bytes <= 0)
        return t;
    int in_node = G < P ? (G > 1 ? G : 1) : P;
    double inter = bytes * (double)(P - in_node) / (P - 1);
    double t_in = (bytes - inter) / intra_Bps, t_out = inter / inter_Bps;
    return t + (t_in > t_out ? t_in : t_out);
}

int model_local_experts(const model_config *cfg, int *first)
{
    if (cfg->moe_ep_size <= 1) {
        *first = 0;
        return cfg->moe_experts;
    }
    return model_expert_range(cfg->moe_experts, cfg->moe_ep_size,
                              cfg->moe_ep_rank, first);
}
