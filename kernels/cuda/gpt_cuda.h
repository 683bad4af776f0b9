/*
 * gpt_cuda.h — the GPT model of daemon/model/gpt.h on one GPU: bf16
 * weights' working copy, activations and gradients; fp32 master weights and
 * AdamW moments; the share map (slot_of) and delink (reslot) on the device.
 * Self-contained (cudart + cuBLASLt only) and callable from C.
 *
 * Layout mirrors gpt.h: every buffer is [ globals | slot 0 | ... | slot S-1 ]
 * with the same slot layout and offsets (padding to 16 elements); the only
 * difference is wte, which has Vp = V rounded up to 128 rows here (rows
 * [V,Vp) are zero and stay zero). gpt_cuda_set_params / get_params convert
 * from / to the CPU layout (gpt_model.params, fp32), so a CPU model and a GPU
 * model can start from the same weights.
 *
 * Memory: four cudaMalloc blocks planned up front — bf16 params, bf16 grads,
 * fp32 optimizer state (master | m | v) and all activations + scratch — plus
 * cuBLASLt's workspace. No managed memory.
 *
 * Errors of the CUDA runtime and cuBLASLt exit (cuda_check.h); argument
 * errors print a message and return NULL / -1.
 */
#ifndef M6_GPT_CUDA_H
#define M6_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "train/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_cuda gpt_cuda;

/* CUDA devices visible to this process; -1 when the runtime cannot say
 * (no driver, no device), with *why the runtime's error string (static).
 * Never exits. */
int gpt_cuda_device_count(const char **why);

/* The shapes gpt_cuda supports: n_embd % 8 == 0, n_embd % n_head == 0 and
 * head size 16, 32, 64 or 128. 0, or -1 with err naming the model key. */
int gpt_cuda_check_config(const model_config *cfg, char *err, size_t errlen);

typedef struct {
    int S;                  /* parameter slots */
    int Vp;                 /* padded vocabulary (rows of wte, cols of logits) */
    size_t n_params;        /* elements per parameter buffer, GPU layout */
    size_t n_params_cpu;    /* floats of the same model in the gpt.h layout */
    size_t n_compute;       /* parameters of the compute path: the N of 6N */
    size_t bytes_params, bytes_grads, bytes_opt, bytes_acts;
} gpt_cuda_info;

/* S slots with slot_of[l] = l*S/L (as gpt_create); activations for
 * microbatches of up to B sequences of cfg->seq_len tokens. Needs
 * n_embd % 8 == 0 and head size 16, 32, 64 or 128. Weights zero. */
gpt_cuda *gpt_cuda_create(const model_config *cfg, int S, int B);
void gpt_cuda_free(gpt_cuda *g);
void gpt_cuda_get_info(const gpt_cuda *g, gpt_cuda_info *info);
const int *gpt_cuda_slot_of(const gpt_cuda *g);

/* GPT-2 initialisation on the device (same distributions as
 * gpt_init_weights, different random stream): 2-D N(0,0.02), residual
 * projections N(0, 0.02/sqrt(2L)), wpe N(0,0.01), biases 0, LN weights 1. */
void gpt_cuda_init_weights(gpt_cuda *g, uint64_t seed);

/* Load / store the fp32 weights in the gpt.h layout (n floats, must equal
 * info.n_params_cpu). set also writes the bf16 copy. 0 or -1. */
int gpt_cuda_set_params(gpt_cuda *g, const float *host, size_t n);
int gpt_cuda_get_params(gpt_cuda *g, float *host, size_t n);

/* The same for any state buffer, in the gpt.h layout: which 0 fp32 master
 * weights (set also writes the bf16 copy), 1 AdamW m, 2 AdamW v. The padded
 * rows of wte stay zero. 0 or -1. */
int gpt_cuda_get_state(gpt_cuda *g, int which, float *host, size_t n);
int gpt_cuda_set_state(gpt_cuda *g, int which, const float *host, size_t n);

/* AdamW step counts [globals, slot 0, ..., slot S-1] (S+1 entries). */
void gpt_cuda_get_adam_steps(const gpt_cuda *g, long *dst);
void gpt_cuda_set_adam_steps(gpt_cuda *g, const long *src);

/* Forward on host token arrays inp, targets (B,T); targets may be NULL.
 * Returns the mean loss (waits for the GPU). */
float gpt_cuda_forward(gpt_cuda *g, const int32_t *inp,
                       const int32_t *targets, int B);

/* Backward after gpt_cuda_forward with targets on the same inp/targets:
 * accumulates the gradient of loss_scale * sum(losses). Queued; returns
 * without waiting. Overwrites the logits. */
void gpt_cuda_backward(gpt_cuda *g, const int32_t *inp,
                       const int32_t *targets, int B, float loss_scale);

void gpt_cuda_zero_grad(gpt_cuda *g);

/* Global L2 norm of the gradients (waits for the GPU). */
float gpt_cuda_grad_norm(gpt_cuda *g);

/* AdamW over all parameters (decay on 2-D tensors only), step counts per
 * region as gpt_adamw. Global-norm clipping to max_norm (<= 0: none) is
 * computed on the device. Queued; the norm before clipping is then
 * available from gpt_cuda_last_grad_norm (which waits). */
void gpt_cuda_adamw(gpt_cuda *g, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float max_norm);
float gpt_cuda_last_grad_norm(gpt_cuda *g);

/* As gpt_reslot: S' slots, each a device copy of old slot src_of[s']
 * (params, master, m, v, step count; zeroed m, v, count with
 * reset_moments); grads zeroed. Delink is S' = L, src_of[l] = slot_of[l]. */
int gpt_cuda_reslot(gpt_cuda *g, int new_S, const int *new_slot_of,
                    const int *src_of, int reset_moments);

/* Wait for all queued work. */
void gpt_cuda_synchronize(gpt_cuda *g);

#ifdef __cplusplus
}
#endif

#endif /* M6_GPT_CUDA_H */
