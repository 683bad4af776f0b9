/*
 * facts.h — the one owner of the model's derived figures: parameter counts
 * (total, per slot, embeddings, per token), FLOPs per training token and
 * the size of the parameter block. The dashboard's MFU (http/stats.c), the
 * planners (offload/), the benchmarks and the trainer ask these functions;
 * none of them counts for itself. Built on the parameter layout
 * (layout.c, gpt.h), so a count here is the layout's count; linked into
 * m6layout, below everything that needs it (no kernel, no CUDA, no spec).
 *
 * Counts are elements (parameters), unpadded unless the name says floats:
 * model_param_floats is the allocation (regions padded to 16 floats).
 */
#ifndef M6_MODEL_FACTS_H
#define M6_MODEL_FACTS_H

#include <stddef.h>

#include "model/config.h"
#include "model/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parameters of the global tensors: wte (V,C), wpe (T,C), ln_f (2C). */
size_t model_global_params(const model_config *cfg);

/* Parameters of the embeddings: wte (V,C) + wpe (T,C). The LM head is wte
 * (tied), so it adds none. */
size_t model_embedding_params(const model_config *cfg);

/* Parameters of one slot (one block's weights): moe 0 a dense block
 * (ln_1, c_attn, attn c_proj, ln_2, MLP: 12C^2 + 13C), moe 1 an MoE block
 * (the MLP replaced by E experts of hidden H and the gate E(C+1)); moe 1
 * on a dense model counts a dense slot. */
size_t model_slot_params(const model_config *cfg, int moe);

/* The parts of one block, parameters: attn, the attention with both
 * LayerNorms (ln_1, c_attn, attn c_proj, ln_2: 4C^2 + 8C); mlp, a dense
 * block's MLP (8C^2 + 5C); gate, an MoE block's router (E(C + 1)); expert,
 * one expert (2HC + H + C). A dense slot is attn + mlp, an MoE slot attn
 * + gate + E * expert. gate and expert 0 on a dense model. */
typedef struct {
    size_t attn, mlp, gate, expert;
} model_block_parts;
model_block_parts model_block_parts_of(const model_config *cfg);

/* Parameters of the model with S slots of the default share map
 * (gpt_default_share_map; S = n_layer: the Real model): the globals plus
 * each slot once. 0 when S is out of range for cfg. */
size_t model_params(const model_config *cfg, int S);

/* Floats of the plain parameter block the model allocates for S slots with
 * share map slot_of (NULL: the default one), the gpt.h layout: n_global +
 * the padded size of each slot of its kind (gpt_slot_kinds). gpt.c's
 * n_params is this number; gradients and each AdamW moment have the same.
 * 0 when S or slot_of is invalid for cfg. */
size_t model_param_floats(const model_config *cfg, int S, const int *slot_of);

/* N, the parameters one token passes through in a forward pass: the LM
 * head's V*C (the tied wte as a matrix) plus, for every layer, its block's
 * parameters — a dense block's all, an MoE block's attention, LayerNorms
 * and gate (E*C + E) but only k = moe_prototypes of its E experts (each
 * prototype routes a token to one expert: top-1 within the prototype,
 * kernels.h "mixture of experts"), k*(2HC + H + C). The input lookup of
 * wte and wpe does no arithmetic and is left out, as is ln_f (2C). Real
 * model (layer count, not slot count: a shared slot is used once per layer
 * that reads it, so the Pseudo model's N is the same). */
double model_active_params(const model_config *cfg);

/* Model FLOPs of one training token, forward and backward:
 *
 *     6 N + 12 L C T        (N = model_active_params)
 *
 * Derivation (Kaplan et al. 2020, "Scaling Laws for Neural Language
 * Models", §2.1; Chowdhery et al. 2022, PaLM, appendix B): a matmul with a
 * (out, in) weight costs 2*out*in FLOPs per token forward (a multiply and
 * an add per weight) and twice that backward (the gradient of the input
 * and of the weight), 6 per parameter the token passes through: 6 N. An
 * MoE block contributes its gate and the k experts that token is routed
 * to, not all E (model_active_params). Attention's two products with the
 * other tokens, Q K^T and (scores) V, cost 2*T*C each per token and layer
 * forward (T positions, C = NH * head size): 4 L C T forward, 12 L C T
 * with backward. This counts full (non-causal) attention, as PaLM does;
 * causal kernels skip about half of it. Per-element work (LayerNorm,
 * GeLU, softmax, biases) is counted only through N, as is usual.
 * MFU = this * tokens/s / peak FLOP/s. */
double model_flops_per_token(const model_config *cfg);

/* Bytes per parameter of a slot's state for AdamW (weights, gradient,
 * first and second moment), by model and placement: what the planners
 * (offload/plan.c, plan_cluster.c, plan_p2r.c) count and the models
 * allocate (gpt.c with the cpu backend's pools; gpt_cuda and the offload
 * runtime). cuda 0, the CPU model (fp32 everywhere; its "device" is a
 * pool of ordinary memory):
 *   resident  16 = weights 4 + gradients 4 + optimizer 8 (m, v)
 *   staging    8 (fp32 weights + gradients);  moved 4 (fp32)
 *   offloaded, host 16 = weights 4 + gradients 4 + optimizer 8, all of it
 *     pinned (the host pool)
 *   speculative update's second buffers 12 (the old master, m, v), 0 pinned
 *   host AdamW traffic 28 (fp32 params, grads, m, v read 16; params, m, v
 *     written 12), the same when drained more than once
 *   streamed gradients (offload.stream_grads): an offloaded slot keeps
 *     weights and optimizer state (12, pinned); its gradient, 4 pinned,
 *     lives only while in flight (offload_stream_grad_bufs of them)
 * cuda 1, the CUDA model (bf16 working copy, fp32 master and moments):
 *   resident  16 = weights 6 (bf16 2 + fp32 master 4) + gradients 2 (bf16)
 *     + optimizer 8
 *   staging    4 (bf16 weights + gradients);  moved 2 (bf16)
 *   offloaded, host 20 = weights 6 (fp32 master 4 + pinned bf16 2) +
 *     gradients 6 (fp32 accumulator 4 + pinned bf16 2) + optimizer 8; 4
 *     pinned
 *   speculative 14 (new fp32 master, m, v 12 + new bf16 copy 2), 2 pinned
 *   host AdamW traffic (bench/offload_host.c, reads + writes, no write-
 *     allocate): 30 when the gradient is drained once in the step (bf16
 *     grad 2 + master, m, v 12 read; master, m, v 12 + bf16 copy 2
 *     written), 36 when drained more than once (+ the fp32 accumulator's
 *     widen and store).
 *   streamed gradients (a design for the plans at scale; gpt_cuda does
 *     not stream yet): one microbatch a step needs no fp32 accumulator,
 *     the host update reads the pinned bf16 landing buffer, 2 bytes a
 *     parameter in flight; an offloaded slot keeps weights and optimizer
 *     state (14, 2 pinned). */
typedef struct {
    int weights, grads, optim;     /* resident, on the device */
    int resident;                  /* weights + grads + optim */
    int staging;                   /* one staging buffer, per parameter */
    int moved;                     /* weights (or a gradient) per copy */
    int host_weights, host_grads;  /* offloaded, on the host (+ optim) */
    int host;                      /* host_weights + host_grads + optim */
    int pinned;                    /* of host, page-locked */
    int spec_host, spec_pinned;    /* speculative update's second buffers */
    int adam_direct, adam_accum;   /* host AdamW memory traffic */
    int stream_grad;               /* offload.stream_grads: one gradient in
                                    * flight, all of it pinned (of host_grads;
                                    * the others are not kept) */
} model_param_bytes;

/* The bytes per parameter above for the CUDA model (cuda 1) or the CPU
 * model (cuda 0): AdamW with fp32 masters, model_param_bytes_for(cuda,
 * NULL). */
model_param_bytes model_param_bytes_of(int cuda);

/* The same for the optimizer setting o (NULL: AdamW, fp32 masters), the
 * fields that change with it:
 *   optim: AdamW 8 (m, v); Adafactor 4 with a first moment (m), 0
 *     without; its factored second moment depends on the tensors' shapes,
 *     not on their size: model_optim_floats and model_af_state_floats,
 *     counted beside this table.
 *   master_bf16 on the CUDA model: the bf16 working copy is the master,
 *     no fp32 one: weights 2 resident (6 with fp32 masters) and 2 on the
 *     host (the pinned bf16 copy; 6 with fp32), so 4 bytes less a
 *     parameter either way. On the CPU model nothing changes: its kernels
 *     read the fp32 working copy, which holds the bf16 values (gpt.h
 *     master_bf16; measured by bench/optim_memory); only checkpoints
 *     shrink (2 bytes a weight).
 * resident and host follow (weights + grads + optim). The host update's
 * traffic (adam_direct, adam_accum) and the speculative buffers are fp32
 * AdamW's whatever o says (the CPU model's offloaded slots run either
 * optimizer, with either master: its bf16 masters are fp32 floats).
 * The CUDA model runs every combination, offloaded slots included
 * (gpt_cuda_create_optim). */
model_param_bytes model_param_bytes_for(int cuda, const gpt_optim *o);

/* Adafactor's second-moment floats (gpt_af_tensors: rows + cols a matrix,
 * n a vector) of the parts the planners count: the globals, a dense slot,
 * an MoE slot without its experts (attention, LayerNorms and the k
 * prototypes' gates) and one expert (its c_fc and c_proj matrices and
 * biases). An MoE slot's is moe_shared + E * expert. 0, or -1 when out
 * of memory. */
typedef struct {
    size_t global, dense_slot, moe_shared, expert;
} model_af_floats;
int model_af_state_floats(const model_config *cfg, model_af_floats *out);
/* Floats of optimizer state the CPU model allocates for one region of the
 * gpt.h layout (region -1 the globals, 0 a dense slot, 1 an MoE slot) with
 * optimizer o (NULL or adafactor 0: AdamW): AdamW's m and v, 2 x the
 * region's padded floats (the 8 bytes per parameter of
 * model_param_bytes_of); Adafactor's first moment (the region's floats,
 * only with first_moment) plus its second moment, which depends on the
 * tensors' shapes, not a constant per parameter: rows + cols per matrix
 * (per expert and per prototype gate in an MoE slot), n per vector
 * (gpt_af_tensors, which owns that rule), so about (rows + cols) /
 * (rows * cols) floats per matrix element. 0 when out of memory. */
size_t model_optim_floats(const model_config *cfg, int region,
                          const gpt_optim *o);

/* Bytes of optimizer state one data-parallel rank keeps of `bytes` (the
 * whole optimizer state of replicated parameters) when optimizer.shard
 * spreads it over `world` ranks (ZeRO stage 1): bytes / world, rounded up;
 * world <= 1: bytes. The planners count sharded state through this alone.
 * (The model's partition, gpt_shard_range, cuts the flat layout into
 * contiguous ranges of ceil(n / world) floats rounded up to 16: a rank
 * keeps at most 16 floats of each moment more than this share.) */
size_t model_optim_bytes_sharded(size_t bytes, int world);

/* Expert parallelism's rule: of a layer's E experts, rank q of an
 * expert-parallel group of P ranks holds the contiguous global experts
 * [*first, *first + returned count), floor(q E / P) to floor((q+1) E / P),
 * so the groups differ by at most one expert and the last rank's is the
 * largest, ceil(E / P). E >= 0, 0 <= q < P. The engine (train/moe_ep.c) and the
 * plan at scale (offload/plan_cluster.c) both ask it. */
int model_expert_range(int E, int P, int q, int *first);

/* Bytes rank q of an expert-parallel group of P ranks sends to the other
 * ranks in one training step of one MoE layer, with N tokens on the rank:
 * its N k dispatch rows of C elements of elem bytes each travel four
 * times (forward: to their experts and the outputs back; backward: the
 * output gradients to the experts and the input gradients back: the
 * dispatch and combine all-to-alls of GShard, Lepikhin et al. 2020, arXiv
 * 2006.16668, section 3.2), the share (E - El_q) / E of them to experts
 * held elsewhere under uniform routing with no token dropped (a rank sends
 * back the rows it received, as many as it sent in expectation); plus the
 * forward's per-expert row counts, one int32 for each expert held
 * elsewhere. Rows kept on the rank cost no transfer. P <= 1: 0. The
 * engine's measured bytes (moe_ep_stats) and the plan at scale compare
 * with this. */
double model_ep_alltoall_bytes(double N, int k, int C, int E, int P, int q,
                               size_t elem);

/* All-to-alls an expert-parallel rank makes per MoE layer and microbatch
 * in a training step (train/moe_ep.c): the forward's per-expert row
 * counts, its dispatch and its combine, and the backward's two. */
#define MODEL_EP_ALLTOALLS 5

/* Seconds a rank of an expert-parallel group of P ranks spends in a
 * step's all-to-alls: `calls` of them carrying `bytes` in all (what it
 * sends: model_ep_alltoall_bytes), by the alpha-beta model (Hockney 1994,
 * "The communication challenge for MPP", Parallel Computing 20(3)):
 *   t = calls * latency_s + max(bytes_intra / intra_Bps,
 *                               bytes_inter / inter_Bps)
 * where the group is packed node by node, G ranks a node (the ranks of a
 * node are contiguous), and under uniform routing each of its P - 1 peers
 * gets the same share: bytes_inter = bytes (P - min(P, G)) / (P - 1) go
 * over the network, the rest inside the node, the two links at once. The
 * all-to-alls block the compute (plan_p2r.h). The equal shares hold when
 * every rank holds experts (E >= P) and the rank's node is full (P a
 * multiple of G, or P <= G): the plan at scale (P = N G) and
 * bench/moe_ep (G = P) ask it so. P <= 1 or bytes 0: calls * latency_s
 * (0 calls: 0). Rates in bytes/s, > 0. */
double model_ep_alltoall_seconds(double bytes, double calls, int P, int G,
                                 double intra_Bps, double inter_Bps,
                                 double latency_s);

/* The experts of each MoE slot a model of cfg holds: all E (*first 0)
 * when cfg->moe_ep_size <= 1, else model_expert_range(E, moe_ep_size,
 * moe_ep_rank). The layout (gpt.h) sizes the expert tensors by it. */
int model_local_experts(const model_config *cfg, int *first);

#ifdef __cplusplus
}
#endif

#endif /* M6_MODEL_FACTS_H */
