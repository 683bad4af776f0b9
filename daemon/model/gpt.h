/*
 * gpt.h — the GPT-2-style decoder with a share map (DESIGN.md §1).
 *
 * Parameters live in ONE allocation laid out as
 *     [ globals | slot 0 | slot 1 | ... | slot S-1 ]
 * globals = wte (V,C), wpe (T,C), ln_f.weight (C), ln_f.bias (C);
 * every slot holds one block's weights, contiguous, so a slot moves between
 * host and device (or is copied at delink) in one memcpy. Regions are padded
 * to 16 floats (64 bytes). Gradients and the AdamW moments m, v use the same
 * layout. Layer l reads slot slot_of[l]; a shared slot's gradient is the sum
 * over the layers that use it (backward kernels accumulate).
 *
 * Tensor names (stable; used in checkpoints):
 *   wte, wpe, ln_f.weight, ln_f.bias,
 *   slots.<s>.ln_1.weight, slots.<s>.ln_1.bias,
 *   slots.<s>.attn.c_attn.weight (3C,C), slots.<s>.attn.c_attn.bias (3C),
 *   slots.<s>.attn.c_proj.weight (C,C),  slots.<s>.attn.c_proj.bias (C),
 *   slots.<s>.ln_2.weight, slots.<s>.ln_2.bias,
 *   slots.<s>.mlp.c_fc.weight (4C,C),    slots.<s>.mlp.c_fc.bias (4C),
 *   slots.<s>.mlp.c_proj.weight (C,4C),  slots.<s>.mlp.c_proj.bias (C)
 * Weights are (out, in) row-major, as nn.Linear stores them.
 */
#ifndef M6_GPT_H
#define M6_GPT_H

#include <stddef.h>
#include <stdint.h>
#include "train/spec.h"

/* Per-slot tensor indices, in memory order within a slot. */
enum {
    SLOT_LN1_W, SLOT_LN1_B, SLOT_QKV_W, SLOT_QKV_B, SLOT_ATTPROJ_W,
    SLOT_ATTPROJ_B, SLOT_LN2_W, SLOT_LN2_B, SLOT_FC_W, SLOT_FC_B,
    SLOT_FCPROJ_W, SLOT_FCPROJ_B, SLOT_NTENSORS
};
/* Global tensor indices. */
enum { GLOB_WTE, GLOB_WPE, GLOB_LNF_W, GLOB_LNF_B, GLOB_NTENSORS };

typedef struct {
    const char *name;   /* suffix: "ln_1.weight" etc. */
    size_t offset;      /* floats from the start of its region */
    size_t numel;
    int rows, cols;     /* shape; cols 0 for 1-D */
    int decay;          /* AdamW weight decay applies (2-D tensors) */
} gpt_tensor;

/* Activations of the forward pass, kept for backward. (shapes per layer) */
typedef struct {
    float *encoded;            /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd;   /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *qkv;                /* (L,B,T,3C) */
    float *atty;               /* (L,B,T,C) */
    float *att;                /* (L,B,NH,T,T) */
    float *residual2;          /* (L,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;   /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *fch, *fch_gelu;     /* (L,B,T,4C) */
    float *residual3;          /* (L,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;   /* (B,T,C), (B,T), (B,T) */
    float *logits;             /* (B,T,V) */
    float *probs;              /* (B,T,V) */
    float *losses;             /* (B,T) */
    /* backward scratch, one layer's worth, reused layer by layer */
    float *dres;               /* (B,T,C) residual-stream gradient */
    float *dln, *datty;        /* (B,T,C) */
    float *dqkv;               /* (B,T,3C) */
    float *dfch, *dfch_gelu;   /* (B,T,4C) */
    float *datt;               /* (B,NH,T,T) */
    float *dlogits;            /* (B,T,V) */
    float *dlnf;               /* (B,T,C) */
    float *dlosses;            /* (B,T) */
} gpt_acts;

typedef struct {
    model_config cfg;          /* V, L, NH, C, T */
    int S;                     /* number of parameter slots */
    int *slot_of;              /* [L] slot used by each layer */
    size_t n_global;           /* floats in the global region (padded) */
    size_t slot_size;          /* floats per slot (padded) */
    size_t n_params;           /* n_global + S * slot_size */
    float *params, *grads;     /* (n_params) each */
    float *m, *v;              /* AdamW moments (n_params) each */
    long adam_t_global;        /* AdamW step count of the globals */
    long *adam_t_slot;         /* [S] AdamW step count of each slot */
    gpt_tensor glob[GLOB_NTENSORS];
    gpt_tensor slot[SLOT_NTENSORS];
    int B, T;                  /* activation shapes allocated */
    gpt_acts a;
    float *act_mem;            /* one allocation behind a */
} gpt_model;

/* Allocate a model with S slots (1 <= S <= L; slot_of[l] = l*S/L) and
 * activations for microbatches of B sequences of cfg->seq_len tokens.
 * Weights zeroed; call gpt_init_weights. Returns 0 or -1 (errno ENOMEM). */
int gpt_create(gpt_model *g, const model_config *cfg, int S, int B);
void gpt_free(gpt_model *g);

/* GPT-2 initialisation from a 64-bit seed: every 2-D weight N(0, 0.02), the
 * residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L))
 * (GPT-2 paper §2.3), biases 0, LayerNorm weights 1. */
void gpt_init_weights(gpt_model *g, uint64_t seed);

/* Pointer to slot s's region inside buf (params, grads, m or v). */
static inline float *gpt_slot_ptr(const gpt_model *g, float *buf, int s)
{
    return buf + g->n_global + (size_t)s * g->slot_size;
}

/* Forward pass. inp, targets (B,T) int32 token ids; targets may be NULL (no
 * loss). Returns the mean loss in nats (or 0 without targets); per-position
 * losses in g->a.losses. B <= allocated B. */
float gpt_forward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B);

/* Backward pass after gpt_forward with targets: accumulates into g->grads
 * the gradient of  loss_scale * sum(losses)  (pass 1/(B*T*accum) for a mean
 * over the optimizer step). */
void gpt_backward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B, float loss_scale);

void gpt_zero_grad(gpt_model *g);

/* Global L2 norm of g->grads (double accumulation). */
float gpt_grad_norm(const gpt_model *g);

/* AdamW over all parameters (decay on 2-D tensors only), each region with
 * its own step count (incremented here). grad_scale folds clipping. */
void gpt_adamw(gpt_model *g, float lr, float beta1, float beta2, float eps,
               float weight_decay, float grad_scale);

/* Re-lay the model to S' slots with the given share map (len L), each new
 * slot s' a copy of old slot src_of[s'] (params, m, v, step count);
 * grads zeroed. reset_moments zeroes m, v and the step counts of the slots.
 * This is delink when S' = L and src_of[l] = old slot_of[l]. 0 or -1. */
int gpt_reslot(gpt_model *g, int new_S, const int *new_slot_of,
               const int *src_of, int reset_moments);

/* Parameters of the compute path (globals + one slot per layer, unpadded):
 * the N of 6N. */
size_t gpt_compute_params(const gpt_model *g);

#endif /* M6_GPT_H */
