/*
 * act_layout.c — the CUDA model's activation table (act_layout.h).
 */
#include "model/cuda/act_layout.h"

#include <string.h>

static size_t ceil_div_(size_t a, size_t b) { return (a + b - 1) / b; }

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
    size_t t[CUDA_ACT_N];
    t[CUDA_ACT_ENCODED] = BT * C * h;
    t[CUDA_ACT_LN1] = L * BT * C * h;
    t[CUDA_ACT_QKV] = L * BT * 3 * C * h;
    t[CUDA_ACT_ATTY] = L * BT * C * h;
    t[CUDA_ACT_RES2] = L * BT * C * h;
    t[CUDA_ACT_LN2] = L * BT * C * h;
    t[CUDA_ACT_FCH] = L * BT * 4 * C * h;
    t[CUDA_ACT_FCHG] = L * BT * 4 * C * h;
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
    t[CUDA_ACT_DFCH] = BT * 4 * C * h;
    t[CUDA_ACT_DFCHG] = BT * 4 * C * h;
    t[CUDA_ACT_SCRATCH] = ops->scratch_floats * f;
    t[CUDA_ACT_ATT_WS] = ops->att_ws_bytes;
    t[CUDA_ACT_RED] = ops->red_floats * f;
    t[CUDA_ACT_INP] = BT * i4;
    t[CUDA_ACT_TGT] = BT * i4;
    t[CUDA_ACT_PLAN] = ops->plan_ints * i4;
    size_t total = 0;
    for (int i = 0; i < CUDA_ACT_N; i++)
        total += ceil_div_(t[i], GPT_CUDA_ACT_ALIGN) * GPT_CUDA_ACT_ALIGN;
    if (bytes)
        memcpy(bytes, t, sizeof t);
    return total;
}
