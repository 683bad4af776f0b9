/*
 * gpt_offload.h — the offload runtime as the CUDA model sees it: the calls
 * gpt_cuda's files make at each place an offloaded slot (one kept in host
 * memory, gpt_cuda.h "offloading") takes part in a pass, a step or a
 * state change. Implemented by daemon/offload/cuda/gpt_cuda_offload.cu
 * (host slots, staging buffers, the copy and drain streams, host AdamW
 * threads), which sees the model's struct (gpt_cuda_impl.cuh); the model
 * sees the runtime only through this header, so the dependency runs one
 * way: offload/cuda on model/cuda. Every function runs on the compute
 * thread (the caller of gpt_cuda_*); none may be called before
 * gpt_offload_init or after gpt_offload_fini.
 */
#ifndef M6_GPT_OFFLOAD_H
#define M6_GPT_OFFLOAD_H

#include "model/cuda/gpt_cuda_impl.cuh"

/* Start the runtime for g (copy and drain streams, host threads, sized by
 * cfg): 0, or -1 (a message on stderr; nothing left to free). */
int gpt_offload_init(gpt_cuda *g, const gpt_cuda_offload *cfg);
/* Stop the host threads and free what gpt_offload_init made. */
void gpt_offload_fini(gpt_cuda *g);
/* Allocate (on 1) or free (on 0) the device staging buffers. 0, or -1 out
 * of device memory (nothing allocated). */
int gpt_offload_set_staging(gpt_cuda *g, int on);
/* Host slots (pinned, zeroed) for slots [n_res, S) of a state, slot s of
 * kind kinds[s] (1 MoE; kinds NULL: all of the largest kind, g->slot).
 * NULL when there are none; on failure NULL with *failed = 1. */
hslot_ *gpt_offload_alloc_slots(gpt_cuda *g, int S, int n_res,
                                const unsigned char *kinds, int *failed);
/* Free n host slots of gpt_offload_alloc_slots (hs NULL: none). */
void gpt_offload_free_slots(gpt_cuda *g, hslot_ *hs, int n);
/* A pass over positions [p0, p1) (forward layer l = p, backward layer
 * l = 2L-1-p): cut into intervals, the first fetches issued. last: the
 * step's last microbatch (backward gradients may be final). */
void gpt_offload_pass_begin(gpt_cuda *g, int p0, int p1, int last);
/* Position p of the pass, whose slot is offloaded: *w and *dw the staging
 * buffer's weights and gradient (bf16), valid until gpt_offload_leave. */
void gpt_offload_enter(gpt_cuda *g, int p, bf16 **w, bf16 **dw);
/* Position p done: its staging buffer drains (backward) and is freed. */
void gpt_offload_leave(gpt_cuda *g, int p);
/* Issue the fetches that can start now without waiting (at every
 * position of a pass, resident ones included). */
void gpt_offload_poll(gpt_cuda *g);
/* Wait until no host job is queued or running. */
void gpt_offload_wait_idle(gpt_cuda *g);
/* Step begin: forget the host gradients (waits for accumulations). */
void gpt_offload_step_begin(gpt_cuda *g);
/* Sum of squares of the offloaded slots' gradients (waits; finalises). */
double gpt_offload_grad_sumsq(gpt_cuda *g);
/* AdamW of the offloaded slots not yet updated this step, queued on the
 * host threads; scale: the clip scale of the global norm. */
void gpt_offload_adamw(gpt_cuda *g, float lr, float beta1, float beta2,
                       float eps, float wd, float scale);
/* Adafactor (hyperparameters h, weight decay wd on 2-D tensors) of every
 * offloaded slot, one host job each, at step count adam_t_slot[s] + 1
 * (counted when queued); scale: the clip scale of the global norm (h's
 * grad_scale is not read). A model made with Adafactor's state only. */
void gpt_offload_adafactor(gpt_cuda *g, const adafactor_hparams *h, float wd,
                           float scale);
/* This step's early Adafactor updates (h, weight decay wd; after
 * gpt_cuda_step_begin with max_norm <= 0): what resolve_early_ queues. */
void gpt_offload_set_adafactor(gpt_cuda *g, const adafactor_hparams *h,
                               float wd);
/* Host slot s's bf16 working copy made again from its fp32 master (waits
 * for its queued jobs). */
void gpt_offload_refresh_bf16(gpt_cuda *g, int s);

#endif /* M6_GPT_OFFLOAD_H */
