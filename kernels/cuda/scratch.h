/*
 * scratch.h — the CUDA ops' scratch, workspace and plan sizes, and which
 * attention a shape runs, as plain C (no CUDA header): the ops
 * (kernels_cuda.h includes this), gpt_cuda's allocation and the offload
 * planner (daemon/offload/plan.c, linked into m6ctl without CUDA) all ask
 * these functions, so a size the planner counts is the size the model
 * allocates. Constants are the ops' own (one definition each, here).
 */
#ifndef M6_KERNELS_CUDA_SCRATCH_H
#define M6_KERNELS_CUDA_SCRATCH_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define MM_ROWS 256               /* matmul.cu: rows per chunk in the dbias pass */
#define MM_WORKSPACE (32u << 20)  /* cuBLASLt workspace (Hopper wants 32 MiB) */
#define LN_ROWS 128               /* layernorm.cu: rows per block in the backward */
#define SUMSQ_BLOCKS 1024         /* adamw.cu: grad_sumsq's fixed grid */
#define ATT_WS_CAP ((size_t)512 << 20) /* attention.cu: workspace bytes, at most */

static inline size_t scratch_ceil_div_(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* Floats of scratch matmul_backward_cuda takes for N rows and OC outputs. */
static inline size_t matmul_backward_scratch_floats(int N, int OC)
{
    return scratch_ceil_div_((size_t)N, MM_ROWS) * (size_t)OC;
}

/* Floats of scratch layernorm_backward_cuda takes for N rows of C. */
static inline size_t layernorm_backward_scratch_floats(int N, int C)
{
    return scratch_ceil_div_((size_t)N, LN_ROWS) * 2 * (size_t)C;
}

/* Floats of scratch attention_backward_cuda takes: one per (b, h, t). */
static inline size_t attention_backward_scratch_floats(int B, int T, int NH)
{
    return (size_t)B * NH * T;
}

/* Floats of scratch grad_sumsq_cuda takes: one partial per block. */
static inline size_t grad_sumsq_scratch_floats(void)
{
    return SUMSQ_BLOCKS;
}

/* Ints of the plan encoder_backward_plan builds for N tokens. */
static inline size_t encoder_plan_ints(int N)
{
    return 3 * (size_t)N + 2;
}

/* attention.cu's cuBLASLt path: the row stride of a (T, T) score matrix,
 * the workspace bytes of one batch item (one head of one sequence: fp32
 * S, fp32 dS, bf16 P; 10 bytes per score), and the batch items per pass
 * that fit `bytes` (at least one, at most items). */
static inline int att_ldT_(int T)
{
    return (int)scratch_ceil_div_((size_t)T, 8) * 8;
}
static inline size_t att_item_bytes_(int T)
{
    return (size_t)T * att_ldT_(T) * (4 + 4 + 2);
}
static inline int att_items_(int T, int items, size_t bytes)
{
    size_t n = bytes / att_item_bytes_(T);
    return n < 1 ? 1 : n > (size_t)items ? items : (int)n;
}

/* The workspace attention_gemm_forward_cuda/backward take, the size that
 * gpt_cuda allocates: as many (sequence, head) items as fit ATT_WS_CAP, up
 * to max(B, NH); 0 when the head size is not a multiple of 8 (its slices
 * would not be 16-byte aligned) or one item does not fit (T > 7,326): the
 * flash kernels then, which need none. */
static inline size_t attention_gemm_workspace_bytes(int B, int T, int C,
                                                    int NH)
{
    if (C % NH || (C / NH) % 8)
        return 0;
    if (att_item_bytes_(T) > ATT_WS_CAP)
        return 0;
    int items = B > NH ? B : NH;
    return (size_t)att_items_(T, items, ATT_WS_CAP) * att_item_bytes_(T);
}

/* Which attention runs (kernels_cuda.h attention_impl_cuda). */
enum { ATT_IMPL_TC = 0, ATT_IMPL_CORE = 1, ATT_IMPL_GEMM = 2 };

/* The choice $M6_ATTENTION makes: e its value (NULL, "" or "tc":
 * ATT_IMPL_TC; "core"; "gemm"); *unknown (when not NULL) set to 1 for any
 * other value, which also means ATT_IMPL_TC. */
static inline int attention_impl_parse(const char *e, int *unknown)
{
    if (unknown)
        *unknown = e && *e && strcmp(e, "tc") != 0 &&
                   strcmp(e, "core") != 0 && strcmp(e, "gemm") != 0;
    if (e && strcmp(e, "core") == 0)
        return ATT_IMPL_CORE;
    if (e && strcmp(e, "gemm") == 0)
        return ATT_IMPL_GEMM;
    return ATT_IMPL_TC;
}

/* Whether head size hs has tensor-core flash kernels (attention.cu). */
static inline int attention_tc_head_size(int hs)
{
    return hs == 32 || hs == 64 || hs == 80 || hs == 128;
}

/* The attention a model of C channels and NH heads runs under choice env
 * (attention_impl_parse): ATT_IMPL_TC only where the head size has
 * tensor-core flash kernels, else ATT_IMPL_GEMM. */
static inline int attention_impl_of(int env, int C, int NH)
{
    if (env != ATT_IMPL_TC)
        return env;
    return NH > 0 && C % NH == 0 && attention_tc_head_size(C / NH)
               ? ATT_IMPL_TC : ATT_IMPL_GEMM;
}

/* attention_impl_of under this process's $M6_ATTENTION, read now (the
 * planner's question; attention_impl_cuda reads it once and warns). */
static inline int attention_impl_env(int C, int NH)
{
    return attention_impl_of(attention_impl_parse(getenv("M6_ATTENTION"),
                                                  NULL), C, NH);
}

#endif /* M6_KERNELS_CUDA_SCRATCH_H */
