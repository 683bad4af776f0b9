/*
 * gpt.h — the GPT-2-style decoder with a share map (docs/DESIGN.md, "The share map and the delink").
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
 * and in an MoE slot (cfg.moe_experts E > 0) instead of the mlp.* tensors,
 * in memory each whole (experts e = 0..E-1 in order, prototype p holding
 * experts p*E/k .. (p+1)*E/k-1, kernels.h "mixture of experts"):
 *   slots.<s>.moe.experts.c_fc.weight (E*H,C), ...c_fc.bias (E*H),
 *   slots.<s>.moe.experts.c_proj.weight (E*C,H), ...c_proj.bias (E*C),
 *   slots.<s>.moe.gate.weight (E,C), slots.<s>.moe.gate.bias (E)
 * Checkpoints split these per expert and per prototype's gate
 * (gpt_slot_ckpt_tensors: slots.<s>.moe.experts.<e>.c_fc.weight, ...,
 * slots.<s>.moe.gate.<p>.weight). Weights are (out, in) row-major, as
 * nn.Linear stores them. Under expert parallelism (cfg.moe_ep_size > 1)
 * the expert tensors hold only the rank's El local experts
 * (model_local_experts: E replaced by El above); the gate stays whole.
 *
 * MoE blocks: layer l is MoE when (l + 1) % cfg.moe_every == 0
 * (model_layer_is_moe). With moe_every 1 every slot is an MoE slot; with
 * moe_every > 1 (a "mixed" model, gpt_model_mixed) slots have two kinds,
 * dense and MoE, of different sizes: a slot holds blocks of one kind only
 * (gpt_slot_kinds), the share map of S slots is gpt_default_share_map's,
 * and in the plain layout slot s starts slot_off[s] floats after the
 * globals. The router's aux and z losses join the gradient (gpt_backward),
 * not the returned loss.
 *
 * Storage and placement (granular offloading, daemon/offload/): by default
 * every buffer is one plain allocation and every slot is resident. A
 * gpt_storage may instead place the model: then params/grads/m/v hold only
 * the globals and the resident slots (the "device block"), each offloaded
 * slot's state lives elsewhere (host memory), and the layer kernels find a
 * slot's working weights and gradient through the compute view w[s], dw[s],
 * which the storage points at a staging buffer around the layers that use
 * the slot (gpt_event hooks). The math is the same either way.
 */
#ifndef M6_GPT_H
#define M6_GPT_H

#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "kernels.h"  /* moe_dims */

#ifdef __cplusplus
extern "C" {
#endif

/* Per-slot tensor indices, in memory order within a slot. A dense slot has
 * the first SLOT_NTENSORS. An MoE slot (cfg.moe_experts > 0, kernels.h
 * "mixture of experts") has SLOT_NTENSORS_MAX: SLOT_FC_* and SLOT_FCPROJ_*
 * hold the experts instead of the dense MLP (moe.experts.c_fc.weight
 * (E*H,C) = W1 (E,H,C), moe.experts.c_fc.bias (E*H), moe.experts.c_proj.weight
 * (E*C,H) = W2 (E,C,H), moe.experts.c_proj.bias (E*C)) and SLOT_GATE_* the
 * router (moe.gate.weight (E,C), moe.gate.bias (E)). gpt_slot_ntensors
 * says which. */
enum {
    SLOT_LN1_W, SLOT_LN1_B, SLOT_QKV_W, SLOT_QKV_B, SLOT_ATTPROJ_W,
    SLOT_ATTPROJ_B, SLOT_LN2_W, SLOT_LN2_B, SLOT_FC_W, SLOT_FC_B,
    SLOT_FCPROJ_W, SLOT_FCPROJ_B, SLOT_NTENSORS,
    SLOT_GATE_W = SLOT_NTENSORS, SLOT_GATE_B, SLOT_NTENSORS_MAX
};
/* Tensors per slot for cfg: SLOT_NTENSORS dense, SLOT_NTENSORS_MAX MoE. */
static inline int gpt_slot_ntensors(const model_config *cfg)
{
    return cfg->moe_experts > 0 ? SLOT_NTENSORS_MAX : SLOT_NTENSORS;
}
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
    /* MoE blocks (sizes 0 for a dense model; fch, fch_gelu, dfch and
     * dfch_gelu are then 0 for an MoE model), N = B*T, kernels.h's names,
     * every layer's saved for backward: */
    float *moe_probs;          /* (L,N,E) */
    float *moe_lse;            /* (L,N,k) */
    int32_t *moe_expert, *moe_slot;   /* (L,N,k) */
    int32_t *moe_counts, *moe_routed; /* (L,E) */
    int32_t *moe_offset;       /* (L,E+1) */
    int32_t *moe_row_token;    /* (L,N*k) */
    float *moe_xe, *moe_ye;    /* (L,N*k,C) */
    float *moe_hpre, *moe_hact;   /* (L,N*k,H) */
    /* and one layer's backward scratch */
    float *moe_dye, *moe_dxe;  /* (N*k,C) */
    float *moe_dh1, *moe_dh2;  /* (N*k,H) */
    float *moe_dlogits;        /* (N,E) */
} gpt_acts;

/* The MoE facts of the forward passes since gpt_moe_stats_reset, over MoE
 * layers and passes: sums and extremes, turned into a step's metrics by the
 * trainer. Tokens per expert are those processed (after capacity). */
typedef struct {
    double aux_sum, z_sum;     /* moe_aux_losses' aux and z, summed */
    long layers;               /* (layer, pass) pairs summed */
    long dropped, pairs;       /* dropped and all (token, prototype) pairs */
    long load_min, load_max;   /* tokens of one expert in one (layer, pass) */
    double load_sum, load_sumsq;  /* over (layer, pass, expert) */
    long load_n, empty;        /* such triples, and those with no tokens */
    /* (model_moe_layers, E): the tokens each expert of each MoE block
     * processed, summed over the passes; owned by the model or backend
     * that records (NULL: not kept), kept across gpt_moe_stats_clear */
    double *tokens;
} gpt_moe_stats;

/* Where one slot's state lives: slot_size floats each. */
typedef struct {
    float *params, *grads, *m, *v;
} gpt_slot_state;

/* Hook events, in call order within a pass. layer is -1 for pass events. */
typedef enum {
    GPT_FWD_START, GPT_FWD_LAYER_BEGIN, GPT_FWD_LAYER_END, GPT_FWD_DONE,
    GPT_BWD_START, GPT_BWD_LAYER_BEGIN, GPT_BWD_LAYER_END, GPT_BWD_DONE
} gpt_event;

typedef struct gpt_model gpt_model;

/* MoE blocks run elsewhere (expert parallelism: train/moe_ep.h over a
 * group). forward: MoE block l (slot s) of a forward over x (B*T,C) into
 * out (B*T,C) (the residual added by the caller), recording its router
 * facts in g->moe_stats (gpt_moe_stats_add). backward: its backward, d(x)
 * accumulated into g->a.dln (zeroed by the caller) from d(out) in
 * g->a.dres, the slot's router and local experts' gradients accumulated
 * through g->dw[s]; daux, dz the weights of its aux and z losses. Both
 * are entered by every rank in the same order; a failure is the hook's
 * to record (gpt_forward has no error). */
typedef struct {
    void *ctx;
    void (*forward)(void *ctx, gpt_model *g, int l, int s, const float *x,
                    float *out, int B);
    void (*backward)(void *ctx, gpt_model *g, int l, int s, const float *x,
                     int B, float daux, float dz);
} gpt_moe_ext;

/* A placement of the model's state (NULL everywhere: plain allocations).
 * alloc_state: g->S, the layout and g->slot_of are set; allocate and zero
 *   g->params, grads, m, v (g->n_local floats each, set it; with
 *   Adafactor's state m only with a first moment, else NULL, and v in the
 *   af layout: af_v_global floats, then each resident slot's, its offset
 *   in g->af_v_off[s]), fill
 *   g->slots[s], g->w[s], g->dw[s] (resident: = slots[s].params/grads;
 *   offloaded: NULL until an event) and g->offloaded[s] for every slot
 *   (those arrays are allocated by gpt.c). 0, or -1 with errno.
 * free_state: release what alloc_state allocated.
 * alloc_acts/free_acts: the activation block (floats, 64-byte aligned).
 * event: called around passes and layers; on *_LAYER_BEGIN the compute view
 *   of slot_of[layer] must be valid when it returns. May be NULL. */
typedef struct {
    void *ctx;
    int (*alloc_state)(void *ctx, gpt_model *g);
    void (*free_state)(void *ctx, gpt_model *g);
    float *(*alloc_acts)(void *ctx, size_t floats);
    void (*free_acts)(void *ctx, float *p);
    void (*event)(void *ctx, gpt_model *g, gpt_event ev, int layer);
} gpt_storage;

struct gpt_model {
    model_config cfg;          /* V, L, NH, C, T */
    int S;                     /* number of parameter slots */
    int *slot_of;              /* [L] slot used by each layer */
    size_t n_global;           /* floats in the global region (padded) */
    size_t slot_size;          /* floats per slot (padded) */
    size_t n_params;           /* n_global + S * slot_size: the whole model */
    size_t n_local;            /* floats in params..v: n_params unless some
                                * slots are offloaded */
    float *params, *grads;     /* (n_local) each: globals, resident slots */
    float *m, *v;              /* AdamW moments (n_local) each */
    gpt_slot_state *slots;     /* [S] where each slot's state lives */
    float **w, **dw;           /* [S] compute view: weights/grads the layer
                                * kernels use for each slot */
    unsigned char *offloaded;  /* [S] 1: state outside the device block */
    unsigned char *dw_fresh;   /* [S] 1: the slot's four weight-matrix
                                * gradients are zero but not yet written
                                * (gpt_zero_grad); the next backward stores
                                * them instead of adding (see there) */
    /* The optimizer state m, v hold (gpt_create_optim): adafactor 0,
     * AdamW's moments, each n_local floats in the parameter layout;
     * adafactor 1, m the first moment in the parameter layout (NULL
     * without one, af_first_moment 0) and v Adafactor's second moment in
     * the af layout (gpt_af_tensors): af_v_global floats of the globals,
     * then each slot's af_v_kind[kind] floats, slot s at af_v_off[s]
     * floats after the globals'. */
    int adafactor, af_first_moment;
    size_t af_v_global, af_v_kind[2];
    size_t *af_v_off;          /* [S] */
    /* bf16 master weights (gpt_optim.master_bf16): params (and each
     * slot's) still hold fp32 floats, the working copy the kernels read,
     * but every one is a bf16 value: gpt_init_weights and
     * gpt_round_masters round to nearest, gpt_adamw and gpt_adafactor
     * round each update stochastically (kernels.h sr_round_bf16), keyed by
     * sr_seed, the region and the step count. The CPU model keeps no
     * second, fp32 copy: its weights cost 4 bytes a parameter either way
     * (model_param_bytes_of), checkpoints 2. */
    int master_bf16;
    uint64_t sr_seed;
    /* Sharded optimizer state (gpt_set_shard; ZeRO stage 1): shard_world
     * > 1 says m holds only the elements [shard_lo, shard_hi) of the flat
     * parameter layout, m[0] the element shard_lo, and v only
     * [shard_vlo, shard_vhi) of its layout (AdamW: the same range;
     * Adafactor: the af layout's, the range widened to whole tensors);
     * slots[s].m and .v are then NULL. shard_world 1: whole (lo 0, hi
     * n_params, vhi all of v). */
    int shard_rank, shard_world;
    size_t shard_lo, shard_hi;
    size_t shard_vlo, shard_vhi;
    /* Optimizer state on the host (gpt_optim.state_on_host; a storage
     * places the model): the storage places params and grads only, and
     * m, v are this file's own host allocations in the plain flat layout
     * (the af layout's for Adafactor's v), whole or the shard as above,
     * every slot's (offloaded or not) in them: slots[s].m and .v point
     * into them while whole. So an offloaded slot's host block holds its
     * weights and gradient, and a rank's host holds only its shard of the
     * state (DeepSpeed's ZeRO-Offload; Rajbhandari et al. 2021, "ZeRO-
     * Offload", section 4). */
    int state_on_host;
    long adam_t_global;        /* optimizer step count of the globals
                                * (AdamW's, or Adafactor's t) */
    long *adam_t_slot;         /* [S] the same of each slot */
    gpt_tensor glob[GLOB_NTENSORS];
    gpt_tensor slot[SLOT_NTENSORS_MAX];  /* the largest kind's tensors (MoE
                                * when E > 0): first gpt_slot_ntensors used;
                                * slot_size is its size */
    gpt_tensor kind[2][SLOT_NTENSORS_MAX]; /* [0] dense, [1] MoE slot */
    size_t kind_size[2];       /* floats of a dense and an MoE slot (padded) */
    unsigned char *slot_moe;   /* [S] kind of slot s: 1 MoE, 0 dense */
    size_t *slot_off;          /* [S] floats from the first slot to slot s in
                                * the plain layout */
    int B, T;                  /* activation shapes allocated */
    int moe_eval;              /* 1: forward uses eval_capacity_factor */
    int moe_capacity;          /* capacity of the last forward (MoE) */
    gpt_moe_stats moe_stats;   /* since gpt_moe_stats_reset */
    gpt_acts a;
    float *act_mem;            /* one allocation behind a */
    const gpt_storage *storage;  /* NULL: plain allocations, all resident */
    /* Data-parallel overlap (NULL: none): gpt_backward calls
     * grad_ready(grad_ready_ctx, s) for each resident slot s right after
     * the backward of the lowest layer using it (backward runs layer L-1
     * down to 0, so that is the slot's last write of the pass: with a
     * shared slot, once its first-using layer is done). An offloaded
     * slot's gradient is then still in its staging buffer: its storage
     * reports it. Called on the thread running gpt_backward. */
    void (*grad_ready)(void *ctx, int s);
    void *grad_ready_ctx;
    /* NULL: MoE blocks run here (kernels.h moe_*). Else they run through
     * it (cfg.moe_ep_size > 1: the slot holds only its local experts). */
    const gpt_moe_ext *moe_ext;
};

/* One tensor as Adafactor sees it (gpt_af_tensors): a matrix (cols > 0,
 * rows x cols row-major, its factored second moment rows + cols floats:
 * row means then column means) or a vector (cols 0, rows elements, its
 * second moment rows floats). */
typedef struct {
    size_t offset;      /* floats from the start of its parameter region */
    size_t state_off;   /* floats from the start of its region of v */
    int rows, cols;
    int decay;          /* weight decay applies (2-D tensors, as AdamW) */
} gpt_af_tensor;
/* Adafactor's tensors of a region: region -1 the globals (wte (V,C) and
 * wpe (T,C) matrices, ln_f vectors), 0 a dense slot, 1 an MoE slot. They
 * are the checkpoint's tensors (gpt_slot_ckpt_tensors): in an MoE slot
 * each expert's c_fc (H,C) and c_proj (C,H) is its own matrix, and each
 * prototype's gate (E/k, C) too, since they are separate linear maps;
 * (3C,C) c_attn is one matrix. Written to out (NULL: count only); returns
 * the count, and *state_floats (may be NULL) the floats of the region's
 * second moment; -1 when out of memory. */
int gpt_af_tensors(const model_config *cfg, int region, gpt_af_tensor *out,
                   size_t *state_floats);
/* Which optimizer state a model allocates: AdamW's m and v (NULL, or
 * adafactor 0) or Adafactor's (gpt_model's af fields). */
typedef struct {
    int adafactor;
    int first_moment;   /* Adafactor with beta1 > 0 */
    /* optimizer.master bf16: the weights are bf16 master weights (see
     * gpt_model.master_bf16); sr_seed keys their stochastic rounding
     * (kernels.h sr_span_key). 0: fp32 masters. */
    int master_bf16;
    uint64_t sr_seed;
    /* The optimizer state on the host, apart from the placed slots
     * (gpt_model.state_on_host): optimizer.shard with offloading, the
     * ZeRO-Offload layout. 0: m and v where each slot lives. */
    int state_on_host;
} gpt_optim;
/* Allocate a model with S slots (1 <= S <= L; gpt_default_share_map) and
 * activations for microbatches of B sequences of cfg->seq_len tokens.
 * Weights zeroed; call gpt_init_weights. Returns 0 or -1 (errno ENOMEM). */
int gpt_create(gpt_model *g, const model_config *cfg, int S, int B);
/* The same with the state placed by storage (kept by pointer; NULL = plain). */
int gpt_create_with(gpt_model *g, const model_config *cfg, int S, int B,
                    const gpt_storage *storage);
/* gpt_create_with and the optimizer state o asks for (NULL: AdamW's,
 * fp32 masters); a storage places Adafactor's state as its alloc_state
 * says. */
int gpt_create_optim(gpt_model *g, const model_config *cfg, int S, int B,
                     const gpt_storage *storage, const gpt_optim *o);
/* Bytes of optimizer state g allocated (m and v as allocated, the
 * resident part: what gpt_create's allocations hold, not a formula). */
size_t gpt_optim_bytes(const gpt_model *g);
void gpt_free(gpt_model *g);

/* Sizes of the layout for cfg, in floats (padded to 16): the global region
 * and one slot. */
void gpt_layout_sizes(const model_config *cfg, size_t *n_global,
                      size_t *slot_size);
/* The whole layout for cfg without a model: the tensor tables (names,
 * offsets within their region, shapes) and the padded region sizes. */
void gpt_layout(const model_config *cfg, gpt_tensor glob[GLOB_NTENSORS],
                gpt_tensor slot[SLOT_NTENSORS_MAX], size_t *n_global,
                size_t *slot_size);
/* Floats of the activation block for microbatches of B sequences (forward
 * activations of all L layers plus one layer's backward scratch). */
size_t gpt_act_floats(const model_config *cfg, int B);
/* Point every tensor of *a into mem (gpt_act_floats(cfg, B) floats, each
 * tensor padded to 16 floats, in the order of gpt_acts). */
void gpt_acts_place(const model_config *cfg, int B, gpt_acts *a, float *mem);

/* GPT-2 initialisation from a 64-bit seed: every 2-D weight N(0, 0.02)
 * except the position embedding wpe, N(0, 0.01) as in OpenAI's GPT-2 code;
 * the residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L))
 * (GPT-2 paper §2.3); biases 0, LayerNorm weights 1. */
void gpt_init_weights(gpt_model *g, uint64_t seed);

/* With bf16 masters (g->master_bf16), every weight of the globals and of
 * each slot rounded to the nearest bf16 (gemm_bf16_round): what weights
 * written from outside (init.from, a checkpoint of fp32 values) become;
 * a bf16 value stays itself. Nothing without. */
void gpt_round_masters(gpt_model *g);

/* gpt_init_weights of a model with S slots, written into a plain buffer of
 * n_global + S*slot_size floats (the plain layout): the same values bit for
 * bit, without allocating a model. Another backend starts from it. Returns
 * 0 (kept for callers that check; it allocates nothing). */
int gpt_init_params(const model_config *cfg, int S, float *params,
                    uint64_t seed);
/* The one weight init behind both (model/init.c) and the CUDA model's
 * (gpt_cuda_init_weights): region s of the gpt.h layout for cfg, written
 * to buf with its padding zeroed: s = -1 the globals (n_global floats),
 * else slot s (slot_size floats), as slot s of a model initialised from
 * seed. Regions are independent: any order, any subset. Uses OpenMP
 * threads on large tensors; the values do not depend on their number. */
void gpt_init_region(const model_config *cfg, int s, float *buf,
                     uint64_t seed);

/* The stable name of tensor t (see the list at the top of this file) with a
 * prefix ("", "exp_avg.", ...): s < 0 for a global ("wte"), else slot s
 * ("slots.3.attn.c_attn.weight"). Truncated to fit n bytes. */
void gpt_tensor_name(char *out, size_t n, const char *prefix, int s,
                     const gpt_tensor *t);

/* Pointer to slot s's region inside buf (params, grads, m or v) of a model
 * with the plain layout (every slot resident, no storage). Anywhere else use
 * g->slots[s]. */
static inline float *gpt_slot_ptr(const gpt_model *g, float *buf, int s)
{
    return buf + g->n_global + g->slot_off[s];
}
/* The tensor table of slot s (its kind's) and its size in floats. */
static inline const gpt_tensor *gpt_slot_tensors(const gpt_model *g, int s)
{
    return g->kind[g->slot_moe[s]];
}
static inline size_t gpt_slot_floats(const gpt_model *g, int s)
{
    return g->kind_size[g->slot_moe[s]];
}
static inline int gpt_slot_ntensors_of(const gpt_model *g, int s)
{
    return g->slot_moe[s] ? SLOT_NTENSORS_MAX : SLOT_NTENSORS;
}

/* The slot tensors of one kind for cfg (moe 1: the MoE block, only when
 * cfg->moe_experts > 0; else the dense block) and its padded size in
 * floats. */
void gpt_slot_layout(const model_config *cfg, int moe,
                     gpt_tensor slot[SLOT_NTENSORS_MAX], size_t *size);
/* 1 when cfg has both MoE and dense blocks (moe_every > 1, E > 0). */
int gpt_model_mixed(const model_config *cfg);
/* The share map of S slots (slot_of, len L): l*S/L when every block has
 * one kind; in a mixed model each kind's layers, in order, are spread over
 * that kind's slots the same way (MoE slots in proportion to MoE layers,
 * at least one of each kind), slots numbered in the order of their first
 * layer, so S = L gives slot_of[l] = l. 0, or -1 when S is out of [1, L]
 * or a mixed model has S < 2. */
int gpt_default_share_map(const model_config *cfg, int S, int *slot_of);
/* The kind of each of S slots under share map slot_of into moe[S] (1 MoE,
 * 0 dense). 0, or -1 with err (may be NULL) when a slot is out of range,
 * shared by blocks of both kinds, or (mixed model) used by no layer. */
int gpt_slot_kinds(const model_config *cfg, int S, const int *slot_of,
                   unsigned char *moe, char *err, size_t errlen);
/* One tensor of a slot as checkpoints name it. */
typedef struct {
    char name[48];     /* after "slots.<s>.": "moe.experts.3.c_fc.weight" */
    size_t offset;     /* floats from the start of the slot */
    int rows, cols;    /* shape; cols 0 for 1-D */
} gpt_ckpt_tensor;
/* The checkpoint tensors of a slot of kind moe (1 MoE, 0 dense) into out
 * (NULL: count only); returns the count. A dense slot's are its tensors
 * (the names at the top of this file). An MoE slot's are ln_1, attn and
 * ln_2 as in a dense slot, then per prototype p = 0..k-1
 *   moe.gate.<p>.weight (E/k, C), moe.gate.<p>.bias (E/k)
 * (rows p*E/k .. (p+1)*E/k-1 of the gate), then per expert e = 0..E-1 (the
 * global index; prototype e / (E/k))
 *   moe.experts.<e>.c_fc.weight (H, C), moe.experts.<e>.c_fc.bias (H),
 *   moe.experts.<e>.c_proj.weight (C, H), moe.experts.<e>.c_proj.bias (C)
 * each a view of the slot's whole expert tensors: 8 + 2k + 4E tensors.
 * Under expert parallelism (cfg->moe_ep_size > 1) the slot holds only its
 * El local experts (model_local_experts), listed by their global index:
 * 8 + 2k + 4El tensors. */
int gpt_slot_ckpt_tensors(const model_config *cfg, int moe,
                          gpt_ckpt_tensor *out);
/* gpt_init_region for a slot of a given kind (moe 1/0): what a mixed
 * model's slot s of that kind starts from. */
void gpt_init_slot(const model_config *cfg, int moe, int s, float *buf,
                   uint64_t seed);

/* The MoE dims (kernels.h moe_dims) of g's MoE blocks for a microbatch of
 * B sequences in the current pass: N = B*T tokens, capacity from
 * cfg.moe_capacity_factor (moe_eval_capacity_factor when g->moe_eval)
 * over the routing group's tokens, N_group: N, or moe_ep_size*N when the
 * MoE blocks run over an expert-parallel group (g->moe_ext) and
 * cfg.moe_capacity_scope is MOE_SCOPE_GROUP. The one place of that
 * rule. */
moe_dims gpt_moe_dims(const gpt_model *g, int B);

/* Forward pass. inp, targets (B,T) int32 token ids; targets may be NULL (no
 * loss). Returns the mean loss in nats (or 0 without targets); per-position
 * losses in g->a.losses. B <= allocated B. With MoE blocks the returned loss
 * is the LM loss alone; the router's aux and z losses go to g->moe_stats
 * (and into the gradient, gpt_backward), capacity from
 * cfg.moe_capacity_factor, or moe_eval_capacity_factor when g->moe_eval. */
float gpt_forward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B);

/* Backward pass after gpt_forward with targets: accumulates into g->grads
 * the gradient of  loss_scale * sum(losses)  (pass 1/(B*T*accum) for a mean
 * over the optimizer step). With MoE blocks, plus loss_scale * B*T *
 * (aux_coef * mean over MoE layers of aux + z_coef * mean of z), so the
 * router losses are weighted per microbatch like the mean LM loss. */
void gpt_backward(gpt_model *g, const int32_t *inp, const int32_t *targets,
                  int B, float loss_scale);

/* Clear g->moe_stats (the trainer does so before a step's microbatches). */
void gpt_moe_stats_reset(gpt_model *g);

/* Zero *st's sums and its tokens (n_tokens of them), keeping the tokens
 * array. */
void gpt_moe_stats_clear(gpt_moe_stats *st, size_t n_tokens);

/* Add the router facts of `layers` MoE (layer, pass) pairs to st: their
 * summed aux and z losses, dropped and all (token, prototype) pairs, and
 * the tokens each expert processed, counts[n] (n = layers * experts), of
 * the consecutive MoE blocks from first_moe (model_moe_layer_index): into
 * st->tokens too when it is kept. The CPU model and the CUDA backend both
 * record through this. */
void gpt_moe_stats_add(gpt_moe_stats *st, double aux, double z, long layers,
                       long dropped, long pairs, const int32_t *counts,
                       int n, int first_moe);

/* Zero the gradients in the device block (globals and resident slots; with
 * plain storage, all of them). An offloaded slot's gradient belongs to its
 * storage, which starts every step from zero.
 * The four weight matrices of a resident dense slot (9/10 of the floats at
 * any C) are not cleared here but marked (dw_fresh): gpt_backward's first
 * write of them stores (GEMM beta 0), so the step has no memset pass over
 * them. gpt_grad_norm, gpt_adamw and gpt_adamw_slot clear what is still
 * marked first, so every reader of the gradients through this interface
 * sees zeros; code reading slots[s].grads directly must call it after a
 * gpt_backward (as the trainer does) or call gpt_grads_settle. */
void gpt_zero_grad(gpt_model *g);

/* Clear the marked (dw_fresh) weight-matrix gradients now: after it every
 * gradient in the device block holds its value. Cheap when nothing is
 * marked (after a gpt_backward). */
void gpt_grads_settle(const gpt_model *g);

/* Global L2 norm of all gradients: sums of squares (double) of the globals,
 * then of slot 0, 1, ..., S-1 (each slot's gradient where slots[s] says),
 * added in that order, so the result does not depend on placement. */
float gpt_grad_norm(const gpt_model *g);
/* gpt_grad_norm when the offloaded slots' gradients are elsewhere: slot s
 * with g->offloaded[s] counts as slot_sumsq[s] ([S], the grad_sumsq of its
 * gradient, taken where it landed; offload_stream_sumsq), its grads never
 * read (another thread may be giving them back). The sum is added in
 * gpt_grad_norm's order, so the norm has its bits. */
float gpt_grad_norm_with(const gpt_model *g, const double *slot_sumsq);

/* AdamW over the globals and every resident slot (decay on 2-D tensors
 * only), each region with its own step count (incremented here). grad_scale
 * folds clipping. Offloaded slots are updated by their storage through
 * gpt_adamw_slot. */
void gpt_adamw(gpt_model *g, float lr, float beta1, float beta2, float eps,
               float weight_decay, float grad_scale);

/* One Adafactor step (kernels.h adafactor_update_spans, hyperparameters
 * h, h->grad_scale folding the clip) of the globals and every resident
 * slot of a model created with Adafactor's state (gpt_create_optim), at
 * step counts adam_t_global + 1 and adam_t_slot[s] + 1 (then counted).
 * Each gpt_af_tensors tensor is one span; weight decay on 2-D tensors.
 * 0, or -1 with errno (EINVAL: the model holds AdamW's state; ENOMEM:
 * nothing updated, the counts unchanged). */
struct adafactor_hparams;
int gpt_adafactor(gpt_model *g, const struct adafactor_hparams *h,
                  float weight_decay);

/* gpt_adafactor of slot s alone, its state wherever it lives (slots[s]:
 * the first moment, or NULL, and the second moment in its af layout;
 * sharded: the slot's tensors whose first element is in the shard), at
 * step count adam_t_slot[s] + 1 (then counted). Safe to run for different
 * slots on different threads. 0, or -1 with errno (EINVAL: AdamW's state
 * or s out of range; ENOMEM: nothing updated). */
int gpt_adafactor_slot(gpt_model *g, int s, const struct adafactor_hparams *h,
                       float weight_decay);

/* AdamW over slot s's state wherever it lives (slots[s]; sharded: the
 * slot's elements in [shard_lo, shard_hi) only, their moments in m, v);
 * increments adam_t_slot[s]. Safe to run for different slots on
 * different threads. */
void gpt_adamw_slot(gpt_model *g, int s, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale);

/* The partition of sharded optimizer state (ZeRO stage 1), the one owner
 * of the rule: of n elements of the flat parameter layout ([globals |
 * slot 0 | ... ], gpt.h's plain layout), rank r of `world` keeps
 * [lo, hi): chunks of ceil(n / world) rounded up to 16 floats, rank r
 * the r-th (the last ranks' chunks may be shorter or empty). world <= 1:
 * [0, n). */
void gpt_shard_range(size_t n, int world, int rank, size_t *lo, size_t *hi);

/* Re-partition g's optimizer state to rank's part of `world` (world 1:
 * whole): new m, v of the part, holding the old values of the elements
 * the old part and the new one share and zeros elsewhere (the caller
 * gathers the rest); step counts unchanged. AdamW's part is
 * gpt_shard_range's element range; Adafactor's (its statistics are per
 * tensor) the whole tensors whose first element is in that range, m in
 * the flat layout and v in the af layout (bf16 masters: the same
 * stochastic rounding as unsharded, each element keyed by its tensor and
 * its place in it). Only plain storage or the state on the host
 * (state_on_host): -1 with errno EINVAL otherwise, ENOMEM when out of
 * memory (the old state kept). */
int gpt_set_shard(gpt_model *g, int rank, int world);

/* Each rank's floats of g's state under gpt_set_shard's partition over
 * `world` ranks, in rank order (ranges contiguous, adding up to the
 * whole): v 0 the weights' and m's (flat layout), 1 v's. 0, or -1 (errno
 * EINVAL). */
int gpt_shard_counts(const gpt_model *g, int world, int v, size_t *counts);

/* Re-lay the model to S' slots with the given share map (len L), each new
 * slot s' a copy of old slot src_of[s'] (params, m, v, step count);
 * grads zeroed. reset_moments zeroes m, v and the step counts of the slots.
 * This is delink when S' = L and src_of[l] = old slot_of[l]. The old state
 * is first copied to a temporary host snapshot and released, then the new
 * state allocated (through the storage, which may place it anew), so peak
 * memory in the placed pools is max(old, new), not their sum.
 * 0, or -1 (errno): on failure the old layout is restored; EINVAL while
 * the optimizer state is sharded (gpt_set_shard to world 1 first). */
int gpt_reslot(gpt_model *g, int new_S, const int *new_slot_of,
               const int *src_of, int reset_moments);

#ifdef __cplusplus
}
#endif

#endif /* M6_GPT_H */
