/*
 * config.h — the shape of a GPT model: what daemon/model/gpt.h and the CUDA
 * model (daemon/model/cuda/gpt_cuda.h) are built from. The run spec
 * (spec/spec.h) embeds one; the model does not know about the spec.
 */
#ifndef M6_MODEL_CONFIG_H
#define M6_MODEL_CONFIG_H

/* Over which tokens an expert's capacity and the balancing loss's
 * fractions are taken (spec model.moe.capacity_scope; kernels.h "routing
 * group"): MOE_SCOPE_RANK, each rank's microbatch; MOE_SCOPE_GROUP, the
 * P microbatches of an expert-parallel group together, as one microbatch
 * of P*N tokens. Without expert parallelism the two are the same. */
typedef enum { MOE_SCOPE_RANK = 0, MOE_SCOPE_GROUP = 1 } moe_scope;

typedef struct {
    int vocab_size;   /* V */
    int n_layer;      /* L */
    int n_head;       /* NH */
    int n_embd;       /* C */
    int seq_len;      /* T (also the size of the position table) */
    /* Mixture of experts (spec model.moe; kernels.h "mixture of experts").
     * moe_experts 0: a dense model, the other fields unused. Layer l is MoE
     * when (l + 1) % moe_every == 0 (moe_every > 1: dense blocks between,
     * slots of two kinds; gpt.h). */
    int moe_experts;             /* E, all prototypes */
    int moe_prototypes;          /* k, divides E */
    int moe_every;               /* MoE in every n-th block */
    int moe_hidden;              /* H of every expert; 0: 4*C */
    float moe_capacity_factor;   /* training */
    float moe_eval_capacity_factor;
    float moe_aux_coef;          /* balancing loss coefficient */
    float moe_z_coef;            /* router z-loss coefficient */
    int moe_capacity_scope;      /* moe_scope: the tokens capacity and the
                                  * balancing fractions count */
    /* Expert parallelism (not spec keys: the trainer sets them for its
     * rank's model). moe_ep_size 0 or 1: the model holds all E experts of
     * each MoE slot; P > 1: only those of rank moe_ep_rank of P
     * (model_local_experts), the router still whole. */
    int moe_ep_size;
    int moe_ep_rank;
} model_config;

/* Whether layer l of cfg is an MoE block. */
static inline int model_layer_is_moe(const model_config *cfg, int l)
{
    return cfg->moe_experts > 0 && cfg->moe_every > 0 &&
           (l + 1) % cfg->moe_every == 0;
}

/* How many of cfg's n_layer blocks are MoE blocks (model_layer_is_moe). */
static inline int model_moe_layers(const model_config *cfg)
{
    int n = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        n += model_layer_is_moe(cfg, l);
    return n;
}

/* The index among the MoE blocks (0 .. model_moe_layers - 1) of block l,
 * which must be one. */
static inline int model_moe_layer_index(const model_config *cfg, int l)
{
    return (l + 1) / cfg->moe_every - 1;
}

/* The expert hidden size H of cfg (moe_hidden, or 4*C when 0). */
static inline int model_moe_hidden(const model_config *cfg)
{
    return cfg->moe_hidden > 0 ? cfg->moe_hidden : 4 * cfg->n_embd;
}

#endif /* M6_MODEL_CONFIG_H */
