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

#ifdef __cplusplus
}
#endif

#endif /* M6_MODEL_FACTS_H */
