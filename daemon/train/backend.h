/*
 * backend.h — the model behind a trainer: the private interface between
 * trainer.c and the two places a model can run.
 *
 * trainer.c owns everything that does not depend on where the model runs:
 * the data sampler, the LR schedule, the phase and delink policy, and the
 * checkpoint files. A backend owns weights, gradients and optimizer state
 * and runs the passes:
 *
 *   backend_cpu.c   the CPU reference model (daemon/model/gpt.c), with
 *                   granular offloading when device.memory_budget > 0
 *   backend_cuda.c  one GPU (daemon/model/cuda/gpt_cuda.h); compiled only when m6
 *                   is built with CUDA (M6_HAVE_CUDA)
 *
 * Both start from the same weights for the same seed (gpt_init_weights'
 * values) and exchange state in the plain layout of gpt.h
 * ([globals | slot 0 | ... | slot S-1], fp32), so a checkpoint written by
 * one loads on the other. Every function of the table is required.
 */
#ifndef M6_TRAIN_BACKEND_H
#define M6_TRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "model/config.h"
#include "model/gpt.h"
#include "offload/offload.h"
#include "kernels.h"

/* Optimizer settings of one step. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip;          /* global-norm clip; <= 0: none */
    /* pseudo.grad_scale mean (the pseudo phase only): each slot s's
     * gradient of the step is divided by n_s, the layers l with
     * slot_of[l] == s, once it is final (after the microbatches and the
     * trainer's all-reduce) and before grad_norm reads it; the globals'
     * are not. 0: the sum over the layers, as backward leaves it. */
    int slot_grad_mean;
    /* optimizer.name adafactor: af holds its hyperparameters (lr is lr
     * above, grad_scale set by the backend) and beta1, beta2, eps above
     * are unused. 0: AdamW. */
    int adafactor;
    struct adafactor_hparams af;
} backend_adam;

/* Which state buffer: fp32 weights, AdamW first and second moments. */
typedef enum { BACKEND_PARAMS = 0, BACKEND_M = 1, BACKEND_V = 2 } backend_buf;

typedef struct {
    const char *name;   /* "cpu", "cuda" */
    void (*free)(void *ctx);

    /* One optimizer step, in this order: step_begin (zero the gradients),
     * microbatch for k = 0..accum-1 (forward, then backward accumulating
     * the gradient of loss_scale * sum of the token losses; returns the
     * mean loss, or anything with step_loss), grad_norm (with
     * h->slot_grad_mean, first the slots' gradients divided by their
     * layer counts; then the global L2 norm of the step's gradient; NaN
     * when the backend cannot scale, so the step is skipped), and, when
     * loss and norm are finite, adamw (clip to h->grad_clip, update;
     * returns when the step's work is done, or when it is queued on a
     * device that every later call reading the state waits for). Nothing
     * of the weights, the moments or the AdamW step counts may change
     * before adamw: a step whose loss or norm is not finite ends after
     * grad_norm, skipped. */
    void (*step_begin)(void *ctx, const backend_adam *h);
    float (*microbatch)(void *ctx, int k, const int32_t *inp,
                        const int32_t *tgt, int B, float loss_scale);
    float (*grad_norm)(void *ctx);
    void (*adamw)(void *ctx, const backend_adam *h, float grad_norm);

    /* Mean loss of a forward pass without backward; changes no state. */
    float (*loss)(void *ctx, const int32_t *inp, const int32_t *tgt, int B);

    /* gpt_reslot: S' slots with share map slot_of (len L), slot s' a copy
     * of old slot src_of[s'] (moments and step counts zeroed with
     * reset_moments). 0, or -1 with err saying why; the old state stays. */
    int (*reslot)(void *ctx, int S, const int *slot_of, const int *src_of,
                  int reset_moments, char *err, size_t errlen);
    int (*n_slots)(void *ctx);
    const int *(*slot_of)(void *ctx);   /* [L] */

    /* State in the plain layout, for checkpoints and tests. Between
     * state_begin and state_end, state_region gives host memory holding
     * buffer `which` of the globals (s = -1, n_global floats) or of slot s
     * (slot_size floats). state_begin(for_load = 1) may leave the regions
     * uninitialised (they are about to be overwritten); state_end
     * (modified = 1) makes the model take the regions' values. 0 or -1.
     * A region may be the model's own memory (an offloaded slot's host
     * state), written in place: after a load that fails half-way the
     * model's state is undefined (the trainer then discards the model;
     * loading reslots with zeroed moments first anyway). */
    int (*state_begin)(void *ctx, int for_load);
    float *(*state_region)(void *ctx, backend_buf which, int s);
    int (*state_end)(void *ctx, int modified);
    /* AdamW step counts [globals, slot 0, ..., slot S-1]. */
    void (*get_adam_steps)(void *ctx, long *dst);
    void (*set_adam_steps)(void *ctx, const long *src);

    /* Device memory the model holds now, bytes (see trainer_device_bytes). */
    size_t (*device_bytes)(void *ctx);
    /* trainer_offload_stats. */
    int (*offload_stats)(void *ctx, offload_stats *st);
    /* The MoE facts of the microbatches since the last step_begin (loss
     * passes not counted) into *st: 0, or -1 when the backend has none
     * (a dense model). NULL: a backend without MoE. */
    int (*moe_stats)(void *ctx, gpt_moe_stats *st);
    /* Data parallelism: host memory holding the step's gradient of the
     * globals (s = -1, n_global floats) or of slot s (slot_size floats),
     * final as data_parallel says; read and written in
     * place by the trainer's all-reduce. The cpu backend's own gradients;
     * the cuda backend's a host copy made after the last microbatch,
     * whose sums grad_norm takes back to the device. NULL (the member, or
     * its result): the backend cannot train data-parallel over host
     * collectives (the cuda backend on a model made with offloading). */
    float *(*grad_region)(void *ctx, int s);
    /* Tests only (train/test_hooks.h): make element 0 of slot s's gradient
     * +Inf in this step, once the gradients are final (before grad_norm
     * reads them). NULL: a backend without the hook. */
    void (*poison_grad)(void *ctx, int s);
    /* Data parallelism (trainer_set_collectives): accum > 0 says that from
     * now on the trainer all-reduces each step's gradient in place
     * (grad_region) after microbatch k = accum-1, this rank's last, and
     * before grad_norm. That microbatch returns only once every gradient
     * is final in its grad_region, and nothing reads, divides or applies
     * slot s's gradient before grad_summed(s), nor the globals' before
     * grad_norm (a speculative update waits for the sum). ready, when
     * not NULL, is called during that microbatch, once per slot at most,
     * as soon as slot s's gradient is final there (backward writes it no
     * more), from the training thread or a backend thread, for the
     * all-reduce to start while backward goes on; a slot not reported is
     * final when the microbatch returns, as are the globals. The sum is
     * final once grad_summed(s) says so. accum 0: alone again. NULL: the
     * backend cannot train data-parallel. */
    void (*data_parallel)(void *ctx, int accum,
                          void (*ready)(void *ready_ctx, int s),
                          void *ready_ctx);
    /* Data parallelism: the trainer's all-reduce has summed slot s's
     * gradient in grad_region(s) (every rank holds the step's gradient of
     * s); called once per slot in every data-parallel step, before
     * grad_norm, from the training thread or the trainer's communication
     * thread, the slots in any order (the last ones first). The backend
     * may start on it (an offloaded slot's speculative update). NULL:
     * nothing to do. */
    void (*grad_summed)(void *ctx, int s);
    /* Data parallelism over a device-memory engine (NCCL; trainer.c
     * trainer_adopt_grad_group), no host staging. dp_device(1) says that
     * from now on the trainer sums device_grads' buffer instead of the
     * grad_regions (0: grad_region again; the calls of data_parallel are
     * the same either way). device_grads, after microbatch accum-1 and
     * before grad_norm: the step's whole gradient (globals and every
     * slot) as one fp32 buffer of *n floats in device memory, in the
     * backend's own layout (padding zero), final; the trainer sums it in
     * place over the ranks, and grad_norm takes the sums from it. NULL
     * result: no such buffer (out of device memory; a model made with
     * offloading): the step fails. NULL members: host gradients only. */
    void (*dp_device)(void *ctx, int on);
    float *(*device_grads)(void *ctx, size_t *n);
    /* The sum of the mean losses of the microbatches since step_begin, in
     * their order, in double; for a backend whose microbatch only queues
     * its work (what microbatch returns is then not the loss). The
     * trainer reads it once per step: after grad_norm alone (the device
     * is done by then, so it adds no wait), before the all-reduce of the
     * loss sum when data-parallel. NULL: the sum of microbatch's
     * returns. */
    double (*step_loss)(void *ctx);

    /* Bytes of optimizer state allocated (trainer_optim_bytes). May be
     * NULL: not counted. */
    size_t (*optim_bytes)(void *ctx);

    /* Sharded optimizer state (optimizer.shard, ZeRO stage 1): keep the
     * AdamW state of rank's range of `world` (model/gpt.h gpt_shard_range
     * over the flat layout; world 1: whole), the old values of the
     * elements both ranges hold kept, zeros elsewhere (the trainer
     * gathers the rest; Adafactor's part is whole tensors, see
     * gpt_set_shard). While sharded, adamw updates only the range's
     * weights (the trainer all-gathers them), reslot is refused and the
     * moments' state_region is NULL. 0, or -1 with err. NULL:
     * the backend cannot shard. */
    int (*shard)(void *ctx, int rank, int world, char *err, size_t errlen);
    /* Host memory of buffer `which` of the whole model in the flat layout
     * (Adafactor's v: the af layout), contiguous, *n floats; BACKEND_M and
     * BACKEND_V while sharded: this rank's part only (its shard_counts
     * entry, the elements from its range's start). NULL: not one buffer
     * (the weights of a model with offloaded slots: the trainer then
     * all-gathers them region by region through state_region; its
     * optimizer state unless kept on the host, gpt.h state_on_host;
     * Adafactor's m without a first moment). NULL member: none. */
    float *(*flat)(void *ctx, backend_buf which, size_t *n);
    /* Each of `world` ranks' floats of buffer `which` (as flat lays it)
     * under shard's partition, in rank order: what the trainer
     * all-gathers. 0, or -1. */
    int (*shard_counts)(void *ctx, int world, backend_buf which,
                        size_t *counts);
    /* Expert parallelism: the model's MoE blocks run through ext from now
     * on (model/gpt.h gpt_moe_ext; NULL: here again); the model must have
     * been made with the local experts (setup model.moe_ep_*). NULL
     * member: the backend cannot (cuda). */
    void (*set_moe_ext)(void *ctx, const gpt_moe_ext *ext);
} backend_iface;

typedef struct {
    const backend_iface *iface;
    void *ctx;
} backend;

/* What a backend is built from. trainer.c fills it once, from the spec and
 * the run's memory plan (computed once, before the data is opened); a
 * backend never sees the spec. The plan decides, the backend allocates. */
typedef struct {
    model_config model;
    size_t n_global, slot_size;   /* gpt_layout_sizes(model): gpt.h layout */
    int n_slots;              /* S to start with (share map l*S/L):
                               * spec_slots_of_phase(spec, pseudo) */
    int pseudo;               /* 1: the run starts in the Pseudo phase */
    int batch_size;           /* B: activations for microbatches of B */
    int grad_accum;           /* microbatches per optimizer step */
    uint64_t seed;            /* initial weights (gpt_init_region) */
    gpt_optim optim;          /* the optimizer state to allocate */
    int host_threads;         /* offloaded slots' host AdamW threads */
    int device;               /* cuda: the GPU (spec device.index) */
    int bf16;                 /* 1: GEMM inputs in bf16, fp32 sums
                               * (spec_precision; the CUDA backend is bf16
                               * whatever this says) */
    /* Offloading: plan_in.budget > 0 (device bytes). plan_in is the
     * planner's input for this run (n_slots, slot_of set per phase, for
     * re-planning at reslot); plan its offload_plan_for_spec: the Real
     * phase, plan->pseudo the Pseudo phase when the run has one. Both
     * unused (plan NULL) without a budget. */
    offload_plan_input plan_in;
    const offload_plan *plan;
} backend_setup;

/* The plan of setup's starting phase (n_slots slots, the default share
 * map): setup->plan->pseudo in the Pseudo phase, else setup->plan; NULL
 * without a budget. */
static inline const offload_plan *backend_setup_phase_plan(
    const backend_setup *bs)
{
    if (!bs->plan)
        return NULL;
    return bs->pseudo && bs->plan->pseudo ? bs->plan->pseudo : bs->plan;
}

/* Create the model with setup->n_slots slots (default share map l*S/L)
 * and activations for microbatches of setup->batch_size, placed by the
 * plan when there is a budget, weights initialised from setup->seed,
 * GEMMs in setup->bf16's precision. 0, or -1 with err; refused (-1, err
 * saying why) when the CPU GEMM fails its self-check in that precision
 * (gemm_ready, kernels.h). */
int backend_cpu_create(backend *be, const backend_setup *setup, char *err,
                       size_t errlen);

#ifdef M6_HAVE_CUDA
/* What backend_cuda_create would refuse before allocating: a CUDA device
 * and a model shape gpt_cuda supports (the memory budget is the plan's
 * business). 0, or -1 with err naming the key. */
int backend_cuda_check(const model_config *model, char *err, size_t errlen);
int backend_cuda_create(backend *be, const backend_setup *setup, char *err,
                        size_t errlen);
#endif

#endif /* M6_TRAIN_BACKEND_H */
