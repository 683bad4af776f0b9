/*
 * act_layout.c — the CUDA model's activation table (act_layout.h).
 */
#include "model/cuda/act_layout.h"

#include "kernels.h"

#include <math.h>
#include <string.h>

static size_t ceil_div_(size_t a, size_t b) { return (a + b - 1) / b; }

size_t gpt_cuda_moe_rows(const model_config *cfg, int B)
{
    if (cfg->moe_experts <= 0 || cfg->moe_prototypes <= 0)
        return 0;
    size_t N = (size_t)B * (size_t)cfg->seq_len, E = (size_t)cfg->moe_experts;
    double cf = cfg->moe_capacity_factor > cfg->moe_eval_capacity_factor
                    ? cfg->moe_capacity_factor : cfg->moe_eval_capacity_factor;
    return E * (size_t)moe_capacity(cf, (int)N, (int)E,
                                             cfg->moe_prototypes);
}

size_t gpt_cuda_act_layout(const model_config *cfg, int B_,
                           const gpt_cuda_act_ops *ops,
                           size_t bytes[CUDA_ACT_N])
{
    const size_t L = (size_t)cfg->n_layer, T = (size_t)cfg->seq_len;
    const size_t C = (size_t)cfg->n_embd, NH = (size_t)cfg->n_head;
    const size_t Vp = ceil_div_((size_t)cfg->vocab_size, GPT_CUDA_VPAD) *
                      GPT_CUDA_VPAD;
    const size_t B = (size_t)B_, BT = B * T;
    const size_t h = 2, f = 4, i4 = 4; /* bf16, fp32, int32 */
    const int moe = cfg->moe_experts > 0;
    const size_t F = 4 * C;  /* the dense MLP's hidden width */
    /* the MoE blocks' entries (Lm) and the dense blocks' (Ld) */
    const size_t Lm = (size_t)gpt_cuda_moe_layers(cfg), Ld = L - Lm;
    const size_t E = moe ? (size_t)cfg->moe_experts : 0;
    const size_t K = moe ? (size_t)cfg->moe_prototypes : 0;
    const size_t H = moe ? (size_t)model_moe_hidden(cfg) : 0;
    const size_t R = gpt_cuda_moe_rows(cfg, B_);
    size_t t[CUDA_ACT_N];
    t[CUDA_ACT_ENCODED] = BT * C * h;
    t[CUDA_ACT_LN1] = L * BT * C * h;
    t[CUDA_ACT_QKV] = L * BT * 3 * C * h;
    t[CUDA_ACT_ATTY] = L * BT * C * h;
    t[CUDA_ACT_RES2] = L * BT * C * h;
    t[CUDA_ACT_LN2] = L * BT * C * h;
    t[CUDA_ACT_FCH] = Ld * BT * F * h;
    t[CUDA_ACT_FCHG] = Ld * BT * F * h;
    t[CUDA_ACT_RES3] = L * BT * C * h;
    t[CUDA_ACT_LNF] = BT * C * h;
    t[CUDA_ACT_LOGITS] = BT * Vp * h;
    t[CUDA_ACT_LN1_MEAN] = L * BT * f;
    t[CUDA_ACT_LN1_RSTD] = L * BT * f;
    t[CUDA_ACT_LN2_MEAN] = L * BT * f;
    t[CUDA_ACT_LN2_RSTD] = L * BT * f;
    t[CUDA_ACT_LNF_MEAN] = BT * f;
    t[CUDA_ACT_LNF_RSTD] = BT * f;
    t[CUDA_ACT_LSE] = L * B * NH * T * f;
    t[CUDA_ACT_LOSSES] = BT * f;
    t[CUDA_ACT_DLOSSES] = BT * f;
    t[CUDA_ACT_DRES] = BT * C * h;
    t[CUDA_ACT_DLN] = BT * C * h;
    t[CUDA_ACT_DATTY] = BT * C * h;
    t[CUDA_ACT_DLNF] = BT * C * h;
    t[CUDA_ACT_DQKV] = BT * 3 * C * h;
    t[CUDA_ACT_DFCH] = Ld ? BT * F * h : 0;
    /* none since the GELU's backward is the fcproj backward GEMM's
     * epilogue (or in place in DFCH): d(fchg) is never stored */
    t[CUDA_ACT_DFCHG] = 0;
    t[CUDA_ACT_SCRATCH] = ops->scratch_floats * f;
    t[CUDA_ACT_ATT_WS] = ops->att_ws_bytes;
    t[CUDA_ACT_RED] = ops->red_floats * f;
    t[CUDA_ACT_INP] = BT * i4;
    t[CUDA_ACT_TGT] = BT * i4;
    t[CUDA_ACT_PLAN] = ops->plan_ints * i4;
    t[CUDA_ACT_MOE_PROBS] = Lm * BT * E * f;
    t[CUDA_ACT_MOE_LSE] = Lm * BT * K * f;
    t[CUDA_ACT_MOE_EXPERT] = Lm * BT * K * i4;
    t[CUDA_ACT_MOE_SLOT] = Lm * BT * K * i4;
    t[CUDA_ACT_MOE_COUNTS] = Lm * E * i4;
    t[CUDA_ACT_MOE_ROUTED] = Lm * E * i4;
    t[CUDA_ACT_MOE_ROW_TOKEN] = Lm * R * i4;
    t[CUDA_ACT_MOE_DROPPED] = Lm * i4;
    t[CUDA_ACT_MOE_XE] = Lm * R * C * h;
    t[CUDA_ACT_MOE_HPRE] = Lm * R * H * h;
    t[CUDA_ACT_MOE_HACT] = Lm * R * H * h;
    t[CUDA_ACT_MOE_YE] = Lm * R * C * h;
    /* kernels/cuda/moe.cu moe_backward_scratch_bytes at R rows: bf16
     * dye, dh, dxe and dlogits, 256-aligned, then the gate's fp32
     * column sums (matmul.cu: ceil(N / 256) * E) */
    t[CUDA_ACT_MOE_SCRATCH] =
        moe ? ceil_div_((R * C * 2 + R * H + BT * E) * h, 256) * 256 +
                  ceil_div_(BT, 256) * E * f
            : 0;
    t[CUDA_ACT_MOE_AUX] = 2 * Lm * f;
    size_t total = 0;
    for (int i = 0; i < CUDA_ACT_N; i++)
        total += ceil_div_(t[i], GPT_CUDA_ACT_ALIGN) * GPT_CUDA_ACT_ALIGN;
    if (bytes)
        memcpy(bytes, t, sizeof t);
    return total;
}
