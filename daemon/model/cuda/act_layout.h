/*
 * act_layout.h — the CUDA model's activation block (gpt_cuda.cu's one
 * cudaMalloc for activations and scratch), region by region, in plain C:
 * the one table that gpt_cuda allocates from and the offload planner
 * (daemon/offload/plan.c, and through it m6ctl) counts from, so the two
 * cannot drift.
 *
 * The scratch sizes of the ops (matmul, layernorm and attention backward,
 * the attention workspace, the grad-norm partials, the encoder's plan) are
 * inputs: gpt_cuda asks the kernels, the planner passes its copies of the
 * kernels' constants.
 */
#ifndef M6_ACT_LAYOUT_H
#define M6_ACT_LAYOUT_H

#include <stddef.h>
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPT_CUDA_VPAD 128      /* wte rows (and logits columns) padded to */
#define GPT_CUDA_ACT_ALIGN 256 /* bytes: every region rounded up to */

/* The regions, in memory order. bf16 (2 bytes) unless marked f32 / i32;
 * L layers, B sequences of T tokens, C channels, NH heads, Vp padded vocab.
 * The dense MLP's regions (FCH, FCHG) have one entry per dense block (Ld
 * of them, written L below) and the MoE regions one per MoE block (Lm,
 * written L): block l's entry is gpt_cuda_mlp_index / gpt_cuda_moe_index;
 * a model of one kind has L of its kind and none of the other. */
enum {
    CUDA_ACT_ENCODED,                   /* (B,T,C) */
    CUDA_ACT_LN1, CUDA_ACT_QKV,         /* (L,B,T,C), (L,B,T,3C) */
    CUDA_ACT_ATTY, CUDA_ACT_RES2,       /* (L,B,T,C) each */
    CUDA_ACT_LN2, CUDA_ACT_FCH,         /* (L,B,T,C), (L,B,T,4C) */
    CUDA_ACT_FCHG, CUDA_ACT_RES3,       /* (L,B,T,4C), (L,B,T,C) */
    CUDA_ACT_LNF, CUDA_ACT_LOGITS,      /* (B,T,C), (B,T,Vp) */
    CUDA_ACT_LN1_MEAN, CUDA_ACT_LN1_RSTD,  /* f32 (L,B,T) each */
    CUDA_ACT_LN2_MEAN, CUDA_ACT_LN2_RSTD,  /* f32 (L,B,T) each */
    CUDA_ACT_LNF_MEAN, CUDA_ACT_LNF_RSTD,  /* f32 (B,T) each */
    CUDA_ACT_LSE,                       /* f32 (L,B,NH,T) */
    CUDA_ACT_LOSSES, CUDA_ACT_DLOSSES,  /* f32 (B,T) each */
    CUDA_ACT_DRES, CUDA_ACT_DLN,        /* (B,T,C) each */
    CUDA_ACT_DATTY, CUDA_ACT_DLNF,      /* (B,T,C) each */
    CUDA_ACT_DQKV,                      /* (B,T,3C) */
    CUDA_ACT_DFCH, CUDA_ACT_DFCHG,      /* (B,T,4C), 0 (unused: the GELU's
                                         * backward is fused) */
    CUDA_ACT_SCRATCH,                   /* f32 op scratch */
    CUDA_ACT_ATT_WS,                    /* attention workspace (may be 0) */
    CUDA_ACT_RED,                       /* f32 grad-norm partials + scalars */
    CUDA_ACT_INP, CUDA_ACT_TGT,         /* i32 (B,T) each */
    CUDA_ACT_PLAN,                      /* i32 encoder plan */
    /* MoE (0 bytes for a dense model), N = B*T, R = E * cap rows, cap
     * the capacity of the larger capacity factor (gpt_cuda_moe_rows): */
    CUDA_ACT_MOE_PROBS,                 /* f32 (L,N,E) */
    CUDA_ACT_MOE_LSE,                   /* f32 (L,N,k) */
    CUDA_ACT_MOE_EXPERT, CUDA_ACT_MOE_SLOT,   /* i32 (L,N,k) each */
    CUDA_ACT_MOE_COUNTS, CUDA_ACT_MOE_ROUTED, /* i32 (L,E) each */
    CUDA_ACT_MOE_ROW_TOKEN,             /* i32 (L,R) */
    CUDA_ACT_MOE_DROPPED,               /* i32 (L) */
    CUDA_ACT_MOE_XE, CUDA_ACT_MOE_HPRE, /* (L,R,C), (L,R,H) */
    CUDA_ACT_MOE_HACT, CUDA_ACT_MOE_YE, /* (L,R,H), (L,R,C) */
    CUDA_ACT_MOE_SCRATCH,               /* moe_backward_cuda's, one layer */
    CUDA_ACT_MOE_AUX,                   /* f32 (L,2) */
    CUDA_ACT_N
};

/* MoE blocks of cfg (model.moe.every: blocks l with (l + 1) % every == 0),
 * and the entry of block l in the MoE regions (its rank among the MoE
 * blocks; l must be one) or in the dense MLP's (its rank among the dense
 * blocks; l must be one). */
static inline int gpt_cuda_moe_layers(const model_config *cfg)
{
    return cfg->moe_experts > 0 && cfg->moe_every > 0
               ? cfg->n_layer / cfg->moe_every : 0;
}
static inline int gpt_cuda_moe_index(const model_config *cfg, int l)
{
    return (l + 1) / cfg->moe_every - 1;
}
static inline int gpt_cuda_mlp_index(const model_config *cfg, int l)
{
    return cfg->moe_experts > 0 && cfg->moe_every > 0
               ? l - (l + 1) / cfg->moe_every : l;
}

/* Rows per layer of the MoE dispatch buffers for microbatches of up to B
 * sequences: E * the capacity (kernels.h moe_capacity) of the larger of
 * capacity_factor and eval_capacity_factor; 0 for a dense model. */
size_t gpt_cuda_moe_rows(const model_config *cfg, int B);
/* What the ops need, in their own units. */
typedef struct {
    size_t scratch_floats;  /* max of matmul backward (B*T rows, 4C
                             * columns), layernorm and attention backward */
    size_t att_ws_bytes;    /* attention_gemm workspace; 0: flash kernels */
    size_t red_floats;      /* grad-norm partials + the scalars after them */
    size_t plan_ints;       /* encoder plan for B*T tokens */
} gpt_cuda_act_ops;

/* Bytes of each region (unrounded) for microbatches of up to B sequences
 * into bytes[CUDA_ACT_N]; returns the block's total, every region rounded
 * up to GPT_CUDA_ACT_ALIGN bytes. bytes may be NULL. */
size_t gpt_cuda_act_layout(const model_config *cfg, int B,
                           const gpt_cuda_act_ops *ops,
                           size_t bytes[CUDA_ACT_N]);

#ifdef __cplusplus
}
#endif

#endif /* M6_ACT_LAYOUT_H */
