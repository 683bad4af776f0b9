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
 * fp32 optimizer state (master | m | v: AdamW's moments, or Adafactor's
 * state, gpt_cuda_create_optim) and all activations + scratch — plus
 * cuBLASLt's workspace. No managed memory. With offloading (end of this
 * file) the first three hold only the globals and the resident slots, and
 * staging buffers are added.
 *
 * Errors of the CUDA runtime and cuBLASLt exit (cuda_check.h); argument
 * errors print a message and return NULL / -1.
 */
#ifndef M6_GPT_CUDA_H
#define M6_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/gpt.h"  /* gpt_optim */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_cuda gpt_cuda;

/* CUDA devices visible to this process; -1 when the runtime cannot say
 * (no driver, no device), with *why the runtime's error string (static).
 * Never exits. */
int gpt_cuda_device_count(const char **why);

/* Makes device (0 .. gpt_cuda_device_count - 1) the calling thread's
 * current CUDA device: what gpt_cuda_create* and every later call on that
 * thread allocate on and launch to (a model is used from the thread that
 * made it; its own host threads take its device). 0, or -1 with *why the
 * runtime's error string (static). Never exits. */
int gpt_cuda_use_device(int device, const char **why);

/* Device `device`'s free memory now (cudaMemGetInfo on it; the calling
 * thread's current device is kept), bytes; 0 when it cannot be read.
 * Opens a CUDA context on the device if none is open. Never exits. */
uint64_t gpt_cuda_free_bytes(int device);

/* Whether cuBLASLt answers (kernels/cuda/cublaslt_load.c opens it on the
 * first call): 0, or -1 with *why cuBLASLt's status string, which names
 * the library and the loader's reason when it could not be opened
 * (static). A host-side call: needs no device. Never exits. */
int gpt_cuda_blas_ready(const char **why);

/* The shapes gpt_cuda supports: n_embd % 8 == 0, n_embd % n_head == 0 and
 * head size 16, 32, 64 or 128. 0, or -1 with err naming the model key. */
int gpt_cuda_check_config(const model_config *cfg, char *err, size_t errlen);

typedef struct {
    int S;                  /* parameter slots */
    int n_resident;         /* of which on the device: [0, n_resident) */
    int Vp;                 /* padded vocabulary (rows of wte, cols of logits) */
    size_t n_params;        /* elements per device parameter buffer, GPU
                             * layout: globals + resident slots */
    size_t n_params_cpu;    /* floats of the same model in the gpt.h layout */
    size_t bytes_params, bytes_grads, bytes_opt, bytes_acts;
    int att_gemm;           /* 1 attention on cuBLASLt's tensor cores, 0 on
                             * the flash kernels (no tensor-core path for
                             * the shape, or cuBLASLt had no algorithm) */
    int epi_fallback;       /* of a layer's 4 forward epilogues (3 biases,
                             * GELU + bias), how many cuBLASLt had no
                             * algorithm for: plain GEMM + own kernels */
    int graphs;             /* steps through CUDA graphs where they apply
                             * (gpt_cuda_set_graphs; 0 after a refused
                             * capture) */
    long graph_captures;    /* graphs captured since creation */
} gpt_cuda_info;

/* S slots with gpt_default_share_map's slot_of (as gpt_create: l*S/L,
 * or in a mixed model each kind over its own slots, S >= 2); activations
 * for microbatches of up to B sequences of cfg->seq_len tokens. Needs
 * n_embd % 8 == 0 and head size 16, 32, 64 or 128. Weights zero. */
gpt_cuda *gpt_cuda_create(const model_config *cfg, int S, int B);
void gpt_cuda_free(gpt_cuda *g);
void gpt_cuda_get_info(const gpt_cuda *g, gpt_cuda_info *info);
const int *gpt_cuda_slot_of(const gpt_cuda *g);
/* Floats from the first slot to slot s (0 <= s <= S; S: all slots) in the
 * gpt.h plain layout: s times the slot size, except in a mixed model
 * (model.moe.every > 1), whose dense slots are smaller than its MoE
 * ones (gpt.h slot_off). Slot s's size is offset(s + 1) - offset(s). */
size_t gpt_cuda_slot_offset(const gpt_cuda *g, int s);

/* GPT-2 initialisation: the CPU model's (gpt_init_region, model/init.c),
 * the same values bit for bit as gpt_init_weights of a CPU model with the
 * same config, slots and seed: 2-D N(0,0.02), residual projections
 * N(0, 0.02/sqrt(2L)), wpe N(0,0.01), biases 0, LN weights 1. Drawn on
 * the host one region at a time (one region's floats of host memory).
 * 0, or -1 (message on stderr) when that host buffer cannot be had. */
int gpt_cuda_init_weights(gpt_cuda *g, uint64_t seed);

/* Load / store the fp32 weights in the gpt.h layout (n floats, must equal
 * info.n_params_cpu). set also writes the bf16 copy. 0 or -1. */
int gpt_cuda_set_params(gpt_cuda *g, const float *host, size_t n);
int gpt_cuda_get_params(gpt_cuda *g, float *host, size_t n);

/* The same for any state buffer, in the gpt.h layout: which 0 fp32 master
 * weights (set also writes the bf16 copy), 1 m, 2 v (AdamW's moments; with
 * Adafactor its first moment, none without one: -1, and its second
 * moment in the af layout: gpt_cuda_state_offset gives each layout's
 * sizes). The padded rows of wte stay zero. 0 or -1. */
int gpt_cuda_get_state(gpt_cuda *g, int which, float *host, size_t n);
int gpt_cuda_set_state(gpt_cuda *g, int which, const float *host, size_t n);

/* The same for the device's part only: globals and slots
 * [0, n_resident) in the gpt.h layout, n = n_global +
 * gpt_cuda_slot_offset(n_resident) floats (gpt.h sizes). With gpt_cuda_host_slot, state moves
 * without a host copy of the offloaded slots. 0 or -1. */
int gpt_cuda_get_state_resident(gpt_cuda *g, int which, float *host,
                                size_t n);
int gpt_cuda_set_state_resident(gpt_cuda *g, int which, const float *host,
                                size_t n);

/* Offloaded slot s (n_resident <= s < S): its host buffer `which` (0 fp32
 * master weights, 1 AdamW m, 2 v), the slot's floats (its kind's size,
 * gpt_cuda_slot_offset) in the gpt.h slot layout; NULL when s is
 * resident. Valid until the next reslot. Call
 * gpt_cuda_synchronize before reading or writing it, and
 * gpt_cuda_host_slot_written after writing its master weights (rebuilds
 * the bf16 working copy). */
float *gpt_cuda_host_slot(gpt_cuda *g, int which, int s);
void gpt_cuda_host_slot_written(gpt_cuda *g, int s);

/* Floats of state buffer `which` (0 master weights, 1 m, 2 v) before
 * slot s (0 <= s <= S) in the layout get_state and set_state use: the
 * globals' and slots [0, s)'s. gpt.h's plain layout, except Adafactor's
 * v, which is gpt.h's af layout (gpt_af_tensors: row and column
 * statistics of each matrix, a vector's elements); s = n_resident: the
 * floats of get_state_resident. 0 for m on a model with Adafactor
 * without a first moment (it keeps none: get/set_state of m fail). */
size_t gpt_cuda_state_offset(const gpt_cuda *g, int which, int s);

/* Step counts [globals, slot 0, ..., slot S-1] (S+1 entries), AdamW's or
 * Adafactor's. */
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

/* pseudo.grad_scale mean: divide each resident slot s's gradient by
 * div[s] ([S] ints; <= 1: untouched), in fp32 with one more bf16 rounding.
 * Queued on the compute stream after the microbatches, before
 * gpt_cuda_grad_norm. -1, nothing queued, when an offloaded slot has
 * div[s] > 1 (its gradient is the host threads'); else 0. */
int gpt_cuda_div_slot_grads(gpt_cuda *g, const int *div);

/* Data parallelism (trainer.c's all-reduce, backend_cuda.c). The step's
 * gradient of the globals and the resident slots, after the step's last
 * microbatch, as fp32:
 *
 * gpt_cuda_grads_f32: in a device buffer of n_params floats (*n when n is
 * not NULL) in gpt_cuda's device layout ([globals, wte with Vp rows |
 * resident slots], padding and rows [V, Vp) zero), converted exactly from
 * the bf16 gradients; an NCCL all-reduce sums it in place. The buffer is
 * allocated at the first call (4 bytes per device parameter, not in
 * gpt_cuda_info's or the offload plan's figures), again after a reslot,
 * and freed with the model. Waits for the compute stream. NULL (message
 * on stderr) when device memory runs out.
 * gpt_cuda_grads_f32_back: the buffer's values (the sums) back into the
 * bf16 gradients, one bf16 rounding each; queued. Nothing without a
 * buffer of the current layout.
 * gpt_cuda_get_grads_resident / set_grads_resident: the same through host
 * memory in gpt.h's plain layout (n = n_global + the resident slots'
 * floats, as gpt_cuda_get_state_resident), for a host all-reduce (Gloo);
 * set needs a get since the last reslot and waits. 0, or -1 (a wrong n,
 * out of device memory).
 * Offloaded slots' gradients are not included (their fp32 accumulators
 * are on the host). */
float *gpt_cuda_grads_f32(gpt_cuda *g, size_t *n);
void gpt_cuda_grads_f32_back(gpt_cuda *g);
int gpt_cuda_get_grads_resident(gpt_cuda *g, float *host, size_t n);
int gpt_cuda_set_grads_resident(gpt_cuda *g, const float *host, size_t n);

/* Global L2 norm of the gradients (waits for the GPU; with offloaded
 * slots also for their accumulation, and adds the host's part). */
float gpt_cuda_grad_norm(gpt_cuda *g);

/* AdamW over all parameters (decay on 2-D tensors only), step counts per
 * region as gpt_adamw. Global-norm clipping to max_norm (<= 0: none) is
 * computed on the device. Queued; the norm before clipping is then
 * available from gpt_cuda_last_grad_norm, which waits for the compute
 * stream only (not for host AdamW of offloaded slots, which overlaps the
 * next step: gpt_cuda_synchronize waits for everything). */
void gpt_cuda_adamw(gpt_cuda *g, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float max_norm);
float gpt_cuda_last_grad_norm(gpt_cuda *g);

/* Adafactor (a model made by gpt_cuda_create_optim with o->adafactor)
 * over all parameters, kernels.h's formula and the CPU model's tensors
 * and state layout (gpt.h gpt_af_tensors; gpt_adafactor): each matrix
 * (wte of V rows, not Vp) with factored row and column statistics, each
 * vector with a full second moment; beta2 = 1 - t^-h->decay_rate at
 * each region's step count t (globals, each slot: counted as AdamW's);
 * the update clipped at h->clip_threshold; h->beta1 > 0 with a first
 * moment; weight decay (2-D tensors) decoupled. h->grad_scale is not
 * read: global-norm clipping to max_norm (<= 0: none) is computed on the
 * device, as gpt_cuda_adamw. Offloaded slots: the same update on the
 * host (fp32 masters, kernels.h adafactor_update_spans), one host job per
 * slot, with the norm's clip scale. Queued; gpt_cuda_last_grad_norm as
 * after gpt_cuda_adamw. -1 (a message, nothing done) on a model without
 * Adafactor's state. */
struct adafactor_hparams;
int gpt_cuda_adafactor(gpt_cuda *g, const struct adafactor_hparams *h,
                       float weight_decay, float max_norm);

/* As gpt_reslot: S' slots, each a device copy of old slot src_of[s']
 * (params, master, m, v, step count; zeroed m, v, count with
 * reset_moments); grads zeroed. Delink is S' = L, src_of[l] = slot_of[l].
 * Every new slot is resident: an offloading model uses
 * gpt_cuda_reslot_placed. */
int gpt_cuda_reslot(gpt_cuda *g, int new_S, const int *new_slot_of,
                    const int *src_of, int reset_moments);

/* CUDA graphs of a training step (issue 18, item 4). On (the default;
 * M6_CUDA_GRAPH=0 at creation: off), a step of gpt_cuda_step_begin (or
 * gpt_cuda_zero_grad), gpt_cuda_queue_microbatch for each microbatch and
 * gpt_cuda_adamw runs as two graph launches: the zeroing of the gradients
 * and every microbatch, launched by the microbatch queued with last = 1
 * (until then they are staged on the host only), and the optimizer
 * (the sum of squares and the multi-tensor AdamW). Each is captured at its
 * first use and again after a reslot, or when the step's microbatch
 * count, sizes or loss scales change; the values that change every step
 * (lr, bias corrections, the encoder plan's segment count) are read from
 * device memory. Steps with offloaded slots, MoE blocks or
 * M6_ADAMW_PER_TENSOR=1 take the queued path, as does every step after a
 * capture the runtime refused (said once on stderr). Any other call that
 * queues work or waits first queues the staged work without a graph, so
 * results never depend on the setting: the two paths give the same bits
 * (tests/cuda_emu/test_step.c). */
void gpt_cuda_set_graphs(gpt_cuda *g, int on);

/* Wait for all queued work: the compute and copy streams and, when
 * offloading, every host job (gradient accumulation, AdamW). Call before
 * reading or writing state from the host. */
void gpt_cuda_synchronize(gpt_cuda *g);

/* ------------------------------------------------------------ offloading
 * Granular CPU offloading (M6-10T; docs/DESIGN.md, "Offloading"). Slots
 * [0, n_resident) live on the device as above. Each slot s >= n_resident
 * lives on the host:
 *   fp32 master weights, AdamW m and v, and the step's gradient
 *     accumulator: ordinary host memory, 16 bytes per parameter;
 *   its bf16 working copy (source of the host->device fetch) and a bf16
 *     gradient landing buffer (target of the device->host drain): pinned
 *     with cudaHostAlloc, one chunk per slot (4 bytes per parameter), or
 *     pageable with one warning on stderr when pinning fails.
 * The device holds globals + resident slots (bf16 params and grads, fp32
 * master, m, v) and n_staging staging buffers of one slot each (bf16
 * weights + bf16 gradient).
 *
 * A pass over the layers (forward positions 0..L-1, backward L..2L-1) is
 * cut into intervals: maximal runs of adjacent positions using the same
 * offloaded slot. Interval j is fetched into staging buffer j % n_staging
 * on a copy stream as soon as that buffer's previous interval is issued,
 * so fetches run up to n_staging - 1 intervals ahead of compute; the
 * compute stream waits on an event only when a fetch is late. An interval
 * with backward positions starts from a zero gradient and its gradient is
 * drained to the host after its last kernel; a host thread then adds it,
 * in fp32, to the slot's accumulator (a resident slot accumulates
 * microbatches in bf16 on the device, so the two agree to bf16 rounding,
 * not bitwise). AdamW of an offloaded slot runs on the host threads in
 * fp32 (the formula of kernels.h, as adamw.cu) and writes the bf16 working
 * copy; the slot's next fetch waits for it. Without clipping
 * (max_norm <= 0 at gpt_cuda_step_begin) the update starts as soon as the
 * slot's gradient is final in gpt_cuda_train_microbatch(last = 1), so it
 * overlaps the rest of backward and the next forward over resident slots.
 *
 * Offloaded slots are a suffix of the stack: in backward the last layers'
 * gradients are final first and in the next forward their weights are
 * needed last, which gives their host update the most time to hide.
 *
 * Every function above works on an offloading model (forward, backward,
 * zero_grad, grad_norm, adamw, get/set_state, init_weights, step counts);
 * state reads and writes wait for host jobs first. gpt_cuda_backward
 * fetches the offloaded slots again; gpt_cuda_train_microbatch shares the
 * last layer's fetch between forward and backward and needs no host round
 * trip in between, so it is the one to train with. Call everything from
 * one thread. */
typedef struct {
    int n_resident;     /* slots [0, n_resident) on the device; >= S: all */
    int n_staging;      /* staging buffers (offload.prefetch), >= 1 */
    int host_threads;   /* host threads for accumulation and AdamW, >= 1 */
    int speculative;    /* speculative clipped update (offload.speculative,
                         * the plan's decision): with max_norm > 0 an
                         * offloaded slot's AdamW runs unclipped into
                         * second buffers (fp32 master, m, v; pinned bf16
                         * copy: 14 bytes per parameter) as soon as its
                         * gradient is final; gpt_cuda_adamw keeps them
                         * when the clip scale is 1 and redoes the update
                         * from the old state otherwise */
    int n_grad_bufs;    /* offload.stream_grads (the plan's n_grad_bufs):
                         * > 0, offloaded slots keep no gradient of their
                         * own; a drain lands in one of these pinned bf16
                         * buffers, held until the slot's early update is
                         * done (max_norm <= 0 only; each offloaded slot
                         * drained once a step). 0: each slot its own
                         * landing buffer and fp32 accumulator */
} gpt_cuda_offload;

/* As gpt_cuda_create with the state placed by *off (NULL: all resident;
 * the host threads and staging buffers are only made when off is given,
 * so a later reslot may offload). NULL on failure (message on stderr). */
gpt_cuda *gpt_cuda_create_offload(const model_config *cfg, int S, int B,
                                  const gpt_cuda_offload *off);

/* As gpt_cuda_create_offload with the optimizer state o asks for (NULL:
 * AdamW's m and v). o->adafactor: Adafactor's (gpt_cuda_adafactor), m
 * only with o->first_moment; with off, offloaded slots keep theirs on the
 * host (off->speculative refused: NULL, a message). o->master_bf16: the bf16
 * params are the master weights (no fp32 copy: 2 bytes per parameter
 * instead of 6), AdamW rounding each update stochastically with the CPU
 * model's keys from o->sr_seed (Adafactor's too); with off, an offloaded
 * slot's pinned bf16 copy is its master, updated in place by host AdamW
 * (or widened and rounded back by host Adafactor; refused with
 * off->speculative: NULL, a message). */
gpt_cuda *gpt_cuda_create_optim(const model_config *cfg, int S, int B,
                                const gpt_cuda_offload *off,
                                const gpt_optim *o);

/* As gpt_cuda_reslot, the new state placed with slots [0, n_resident)
 * resident (>= new_S: all). Needs a model made by gpt_cuda_create_offload
 * when n_resident < new_S. -1 (old state kept) when memory runs out. */
int gpt_cuda_reslot_placed(gpt_cuda *g, int new_S, const int *new_slot_of,
                           const int *src_of, int reset_moments,
                           int n_resident);

/* Start an optimizer step: zero the gradients (device and host) and note
 * the hyperparameters for early host updates (used only when
 * max_norm <= 0; the step's gpt_cuda_adamw must then get the same ones). */
void gpt_cuda_step_begin(gpt_cuda *g, float lr, float beta1, float beta2,
                         float eps, float weight_decay, float max_norm);

/* After gpt_cuda_step_begin(max_norm <= 0) on a model with Adafactor's
 * state: this step's Adafactor hyperparameters (h, its grad_scale not
 * read, and weight decay), so that an offloaded slot's update runs as soon
 * as its gradient is final (streamed gradients), as AdamW's does. Without
 * it such a model's offloaded slots wait for gpt_cuda_adafactor. */
struct adafactor_hparams;
void gpt_cuda_step_adafactor(gpt_cuda *g, const struct adafactor_hparams *h,
                             float weight_decay);

/* One training microbatch: forward and backward in one pass, so that the
 * last layer's slot is fetched once for both, accumulating the gradient of
 * loss_scale * sum(losses). last = 1 on the step's last microbatch (lets
 * offloaded slots' gradients be final, and their early updates start,
 * during backward). Returns the mean loss; waits for the compute stream,
 * not for the host jobs. Equivalent to gpt_cuda_forward + backward. */
float gpt_cuda_train_microbatch(gpt_cuda *g, const int32_t *inp,
                                const int32_t *targets, int B,
                                float loss_scale, int last);

/* gpt_cuda_train_microbatch without the wait: the microbatch is queued on
 * the compute stream and its mean loss kept for gpt_cuda_step_loss. The
 * tokens are copied before it returns (inp and targets may be reused);
 * the step's k-th microbatch has pinned staging of its own (made at the
 * first step with a k-th: B * T * 12 bytes and the encoder plan), so no
 * microbatch waits for the one before. At most 4096 microbatches between
 * two gpt_cuda_zero_grad (gpt_cuda_step_begin); more exit. */
void gpt_cuda_queue_microbatch(gpt_cuda *g, const int32_t *inp,
                               const int32_t *targets, int B,
                               float loss_scale, int last);

/* The sum of the mean losses of the microbatches (queued or trained)
 * since gpt_cuda_zero_grad, in their order, in double (0 for none).
 * Waits for the last of them unless it is done already, as it is after
 * gpt_cuda_grad_norm, so that there it costs no wait of its own. */
double gpt_cuda_step_loss(gpt_cuda *g);

typedef struct {
    int n_slots, n_resident, n_offloaded, n_staging;
    size_t device_bytes;     /* planned device allocations: params, grads,
                              * optimizer state, activations, staging */
    size_t staging_bytes;    /* of which staging buffers */
    size_t host_bytes;       /* host memory of offloaded slots */
    size_t pinned_bytes;     /* of which page-locked */
    uint64_t h2d_bytes, d2h_bytes;   /* since creation */
    double h2d_s, d2h_s;     /* copy stream busy time (event timing) */
    double stall_s;          /* compute stream waiting for fetches */
    double accum_s, adam_s;  /* host thread busy time, all threads */
    size_t spec_bytes;       /* the speculative update's second buffers */
    size_t spec_pinned_bytes;/* of which page-locked */
    uint64_t spec_steps;     /* steps that speculated */
    uint64_t redo_steps;     /* of which the clip applied: redone */
    uint64_t spec_restores;  /* slot updates redone */
    int n_grad_bufs;         /* streamed gradients' buffers (0: off) */
    size_t grad_buf_bytes;   /* ... their bytes, pinned, in host_bytes */
    size_t grad_buf_in_use, grad_buf_peak; /* bytes out now, most at once */
    uint64_t update_skips;   /* early (unclipped) slot updates skipped, the
                              * slot's own gradient not finite */
} gpt_cuda_offload_stats;

/* Statistics (times of copies still in flight are not yet counted). Any
 * model (all resident: counts and device bytes only). Call from the thread
 * that drives the model. */
void gpt_cuda_get_offload_stats(gpt_cuda *g, gpt_cuda_offload_stats *st);

/* ------------------------------------------------------------ MoE
 * With cfg.moe_experts > 0 (E and H multiples of 8) the MLP of every
 * moe_every-th block (model_layer_is_moe) is the experts and gate of
 * kernels_cuda.h's MoE ops, its slot laid out as gpt.h's MoE slot; with
 * moe_every > 1 the other blocks keep the dense MLP in dense slots, a
 * slot holding blocks of one kind (gpt_slot_kinds: the share map, reslot
 * and delink keep each slot's kind). The aux and z losses join the
 * gradient as in gpt_backward (mean over the MoE blocks), the returned
 * loss is the LM loss alone. MoE slots offload like dense ones: the whole
 * slot, experts and gate included, streams through a staging buffer
 * (sized for the largest kind) and host AdamW updates it. */

/* Forward passes at eval_capacity_factor (eval 1) or capacity_factor. */
void gpt_cuda_set_moe_eval(gpt_cuda *g, int eval);
/* The last forward's router facts, summed over the MoE layers: the balancing
 * (aux) and z losses (moe_aux_losses per layer, before the coefficients)
 * and the dropped (token, prototype) pairs. Waits for the GPU. 0, or -1
 * for a dense model. */
int gpt_cuda_moe_facts(gpt_cuda *g, double *aux_sum, double *z_sum,
                       long *dropped);
/* The last forward's tokens processed per expert, (Lm, E) int32 into
 * counts, Lm the MoE layers (L / moe_every) in layer order. Waits for the
 * GPU. 0, or -1 for a dense model. */
int gpt_cuda_moe_counts(gpt_cuda *g, int32_t *counts);

#ifdef __cplusplus
}
#endif

#endif /* M6_GPT_CUDA_H */
