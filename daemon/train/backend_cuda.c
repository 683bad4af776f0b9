/*
 * backend_cuda.c — the trainer's CUDA backend (backend.h): the model on one
 * GPU through daemon/model/cuda/gpt_cuda.h. bf16 weights' working copy,
 * activations and gradients; fp32 master weights and the optimizer's
 * state (AdamW's moments, or Adafactor's with optimizer.name adafactor,
 * laid out as the CPU model's: gpt_cuda_state_offset); the global
 * gradient norm and clipping computed on the device; delink as an
 * on-device reslot. Plain C: only gpt_cuda's C interface is used.
 * Compiled only when m6 is built with CUDA (M6_HAVE_CUDA).
 *
 * Granular offloading (device.memory_budget > 0): the offload planner
 * (daemon/offload/plan.c, its cuda accounting) says how many slots stay
 * resident for the current share map; gpt_cuda places the rest on the host
 * and streams them (gpt_cuda.h, "offloading"), and is placed again at every
 * reslot (delink, checkpoint load). The model is made with the offloading
 * machinery (host threads, staging buffers) only when the Real phase
 * offloads: the phase that needs the most. The budget is the planner's;
 * gpt_cuda does not enforce it byte for byte (its cudaMallocs are the
 * planned ones; tests/gpu/test_trainer.c checks the two agree). With a
 * budget 0 every slot is resident, the plain path.
 *
 * A step: step_begin (gpt_cuda_step_begin: zero the gradients; offloaded
 * slots' host AdamW waits for the global norm even without clipping, so a
 * non-finite step can be skipped whole: clip_), microbatches
 * (gpt_cuda_queue_microbatch, fused forward + backward, queued without a
 * wait; the last one marked), grad_norm (the step's one host wait, for
 * the norm), step_loss (the microbatches' losses, done by then), adamw
 * (queued; with a budget it waits for the device only, not for host
 * AdamW jobs, which overlap the next step); anything that reads or
 * writes state (checkpoints, step counts, reslot) calls
 * gpt_cuda_synchronize first.
 *
 * Data parallelism (backend.h data_parallel; docs/DESIGN.md "Data
 * parallelism on the cuda backend"): after this rank's last microbatch the
 * bf16 gradients of the globals and the resident slots are converted to
 * fp32 on the device (gpt_cuda_grads_f32) and either copied to one host
 * buffer in the plain layout (grad_region: a host engine, Gloo, sums it)
 * or, with dp_device on (an NCCL group), left on the device for the
 * trainer to sum in place (device_grads). grad_norm first takes the sums
 * back into the bf16 gradients (one bf16 rounding), so the pseudo mean,
 * the norm and AdamW see the group's gradient. A model made with
 * offloading has no grad_region (the trainer refuses it data-parallel):
 * its offloaded slots' accumulators and early host updates would need
 * the sum first.
 *
 * Errors of the CUDA runtime and cuBLASLt end the process with the
 * statement and the library's message (kernels/cuda/cuda_check.h);
 * running out of device memory at create or delink is an error returned.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/cuda/gpt_cuda.h"
#include "model/gpt.h"
#include "offload/offload.h"
#include "train/backend.h"

typedef struct {
    gpt_cuda *g;
    size_t n_global, slot_size;   /* the plain layout of gpt.h */
    float *host[3];               /* state_begin..state_end: the state in
                                   * gpt_cuda_state_offset's layout, by
                                   * backend_buf (NULL: no such buffer) */
    int grad_accum;               /* microbatches per step */
    int stream_grads;             /* offload.stream_grads (the plan's) */
    int master_bf16;              /* optimizer.master bf16: an offloaded
                                   * slot's weights are its bf16 copy, so
                                   * host[0] holds every slot's */
    /* offloading (device.memory_budget > 0) */
    offload_plan_input plan_in;   /* the run's planner input; n_slots and
                                   * slot_of set per phase (reslot) */
    size_t budget;                /* 0: no budget, nothing below is set */
    int placed;                   /* made by gpt_cuda_create_offload */
    size_t predicted_peak;        /* current plan: device bytes gpt_cuda
                                   * allocates (the plan's peak less the
                                   * cuBLASLt workspace, which gpt_cuda's
                                   * figures do not count) */
    size_t peak_device, peak_host; /* most seen at stats / reslot */
    model_config model;           /* the shape (MoE facts) */
    /* MoE (every model.moe.every-th block): the step's router facts, as
     * gpt.c gathers them */
    int moe;
    int n_moe_layers;             /* Lm: the MoE blocks */
    gpt_moe_stats moe_st;         /* since step_begin, training passes */
    int32_t *moe_counts;          /* (Lm, E) host copy of one pass's */
    /* pseudo.grad_scale mean in this step (backend_adam.slot_grad_mean) */
    int grad_mean;
    /* data parallelism (data_parallel): dp_accum > 0 this rank's
     * microbatches per step; dp_device: the sum is of gpt_cuda_grads_f32's
     * device buffer (dp_device_), else of ghost, the host copy of the
     * globals' and resident slots' gradients in the plain layout
     * (ghost_n floats); dp_pending: this step's gradient went out, the
     * sum is to be taken back before grad_norm */
    int dp_accum, dp_device, dp_pending;
    float *ghost;
    size_t ghost_n;
} cuda_ctx_;

static int cuda_n_slots_(void *ctx)
{
    gpt_cuda_info info;
    gpt_cuda_get_info(((cuda_ctx_ *)ctx)->g, &info);
    return info.S;
}

static size_t plain_floats_(const cuda_ctx_ *c)
{
    gpt_cuda_info info;
    gpt_cuda_get_info(c->g, &info);
    return info.n_params_cpu; /* = n_global + the slots' sizes */
}

static void free_host_(cuda_ctx_ *c)
{
    for (int i = 0; i < 3; i++) {
        free(c->host[i]);
        c->host[i] = NULL;
    }
}

static void cuda_free_(void *ctx)
{
    cuda_ctx_ *c = ctx;
    if (!c)
        return;
    gpt_cuda_free(c->g);
    free_host_(c);
    free(c->ghost);
    free(c->moe_counts);
    free(c->moe_st.tokens);
    free(c);
}

/* ------------------------------------------------------------- step */

/* The max_norm given to gpt_cuda: grad_clip, or +Inf without clipping.
 * gpt_cuda starts an offloaded slot's host AdamW as soon as its gradient
 * is final when max_norm <= 0; that update could not be taken back when
 * the step turns out non-finite (skipped, trainer.h). With +Inf every
 * update waits for the norm, and the scale is min(1, Inf / norm) = 1, the
 * same value as without clipping. */
static float clip_(const backend_adam *h)
{
    return h->grad_clip > 0 ? h->grad_clip : INFINITY;
}

/* Zeroes the gradients. */
static void cuda_step_begin_(void *ctx, const backend_adam *h)
{
    cuda_ctx_ *c = ctx;
    /* streamed gradients (offload.stream_grads, no clipping): each
     * offloaded slot's update runs once its gradient is final, and is
     * skipped when that gradient is not finite; the others stand */
    gpt_cuda_step_begin(c->g, h->lr, h->beta1, h->beta2, h->eps,
                        h->weight_decay, c->stream_grads ? 0.0f : clip_(h));
    if (c->stream_grads && h->adafactor)
        gpt_cuda_step_adafactor(c->g, &h->af, h->weight_decay);
    gpt_moe_stats_clear(&c->moe_st, (size_t)c->n_moe_layers *
                                        (size_t)c->model.moe_experts);
    c->grad_mean = h->slot_grad_mean;
    c->dp_pending = 0;
}

/* The router facts of the pass just run (B sequences) into c->moe_st
 * (waits for the GPU). */
static void moe_note_(cuda_ctx_ *c, int B)
{
    const model_config *m = &c->model;
    int L = c->n_moe_layers, E = m->moe_experts;
    double aux, z;
    long dropped;
    if (gpt_cuda_moe_facts(c->g, &aux, &z, &dropped) != 0 ||
        gpt_cuda_moe_counts(c->g, c->moe_counts) != 0)
        return;
    gpt_moe_stats_add(&c->moe_st, aux, z, L, dropped,
                      (long)L * B * m->seq_len * m->moe_prototypes,
                      c->moe_counts, L * E, 0);
}

static size_t resident_floats_(const cuda_ctx_ *c);

/* The host staging buffer for the current slots (resident_floats_):
 * reallocated after a reslot. NULL out of memory. */
static float *ghost_(cuda_ctx_ *c)
{
    size_t n = resident_floats_(c);
    if (c->ghost && c->ghost_n == n)
        return c->ghost;
    free(c->ghost);
    c->ghost = malloc(n * sizeof(float));
    c->ghost_n = c->ghost ? n : 0;
    return c->ghost;
}

/* After this rank's last microbatch: the step's gradient out for the
 * all-reduce. Should the device's fp32 copy fail (out of device memory),
 * the host copy is NaN: every rank's sum is NaN and the group skips the
 * step together (a rank alone with stale values would part from the
 * others). */
static void dp_stage_(cuda_ctx_ *c)
{
    c->dp_pending = 1;
    if (c->dp_device)
        return; /* device_grads converts */
    float *h = ghost_(c);
    if (!h)     /* grad_region answers NULL: the trainer fails the step */
        return;
    if (gpt_cuda_get_grads_resident(c->g, h, c->ghost_n) != 0)
        for (size_t i = 0; i < c->ghost_n; i++)
            h[i] = NAN;
}

/* Queued, not waited for (the loss is step_loss's): the host goes on to
 * the next microbatch while the device runs this one. The MoE facts and
 * the data-parallel staging wait for it. */
static float cuda_microbatch_(void *ctx, int k, const int32_t *inp,
                              const int32_t *tgt, int B, float loss_scale)
{
    cuda_ctx_ *c = ctx;
    int accum = c->dp_accum > 0 ? c->dp_accum : c->grad_accum;
    gpt_cuda_queue_microbatch(c->g, inp, tgt, B, loss_scale, k == accum - 1);
    if (c->moe)
        moe_note_(c, B);
    if (c->dp_accum > 0 && k == accum - 1)
        dp_stage_(c);
    return NAN; /* step_loss has it */
}

static double cuda_step_loss_(void *ctx)
{
    return gpt_cuda_step_loss(((cuda_ctx_ *)ctx)->g);
}

/* pseudo.grad_scale mean: each slot's gradient divided by the layers
 * sharing it, on the device, before the norm. The trainer refuses the
 * option when the pseudo phase offloads (trainer.c check_grad_scale_);
 * should it meet an offloaded shared slot anyway, the step's norm is NaN
 * and the step skipped, never trained with the sum. */
static float cuda_grad_norm_(void *ctx)
{
    cuda_ctx_ *c = ctx;
    if (c->dp_pending) { /* the group's sum back into the bf16 gradients */
        c->dp_pending = 0;
        if (c->dp_device)
            gpt_cuda_grads_f32_back(c->g);
        else if (!c->ghost || gpt_cuda_set_grads_resident(c->g, c->ghost,
                                                          c->ghost_n) != 0)
            return NAN;
    }
    if (c->grad_mean) {
        int S = cuda_n_slots_(c), L = c->model.n_layer;
        const int *map = gpt_cuda_slot_of(c->g);
        int *div = calloc((size_t)S, sizeof *div), rc = -1;
        if (div) {
            for (int l = 0; l < L; l++)
                div[map[l]]++;
            rc = gpt_cuda_div_slot_grads(c->g, div);
        }
        free(div);
        if (rc != 0) {
            fprintf(stderr, "m6d: pseudo.grad_scale mean: %s; step "
                    "skipped\n", div ? "a shared slot is offloaded"
                                     : "out of memory");
            return NAN;
        }
    }
    return gpt_cuda_grad_norm(c->g);
}

/* The clip scale is computed on the device from the same sum of squares
 * (grad_norm's value). Without a budget the update is only queued: the
 * next step's microbatches queue behind it on the same stream, its
 * grad_norm (the step's one host wait) waits for it, and so does every
 * call that reads state (gpt_cuda_synchronize, a loss pass); a step's
 * time then holds the previous step's update instead of its own. With
 * a budget (offloading) it waits for the device, so that the step's time
 * is its real time, but not for offloaded slots' host AdamW: those
 * overlap the next step, whose fetch of each such slot waits for its
 * update. gpt_cuda.h has no device-only wait; gpt_cuda_last_grad_norm is
 * one (it synchronizes the compute stream, where the AdamW kernels are
 * queued after the norm). Without a placed model there are no host jobs
 * and gpt_cuda_synchronize waits for exactly the same. */
static void cuda_adamw_(void *ctx, const backend_adam *h, float norm)
{
    cuda_ctx_ *c = ctx;
    (void)norm;
    /* Adafactor's lr is h->lr (backend.h). Should its tensor table not
     * fit in host memory, weights, state and step counts stay as they
     * were (a skipped update), said in the log as on cpu */
    if (h->adafactor) {
        if (gpt_cuda_adafactor(c->g, &h->af, h->weight_decay, clip_(h)) != 0)
            log_event(LOG_ERROR, "train.adafactor", "update=skipped "
                      "error=\"out of host memory (details on stderr)\"");
    } else
        gpt_cuda_adamw(c->g, h->lr, h->beta1, h->beta2, h->eps,
                       h->weight_decay, clip_(h));
    if (c->placed)
        (void)gpt_cuda_last_grad_norm(c->g);
    else if (c->budget)
        gpt_cuda_synchronize(c->g);
}

static float cuda_loss_(void *ctx, const int32_t *inp, const int32_t *tgt,
                        int B)
{
    cuda_ctx_ *c = ctx;
    /* validation capacity; the step's facts stay those of training */
    gpt_cuda_set_moe_eval(c->g, 1);
    float loss = gpt_cuda_forward(c->g, inp, tgt, B);
    gpt_cuda_set_moe_eval(c->g, 0);
    return loss;
}

static int cuda_moe_stats_(void *ctx, gpt_moe_stats *st)
{
    cuda_ctx_ *c = ctx;
    if (!c->moe)
        return -1;
    *st = c->moe_st;
    return 0;
}

/* ------------------------------------------------------------- slots */

/* Resident slots for S slots with share map slot_of (NULL: the default)
 * under the budget, and the device bytes gpt_cuda will allocate for them.
 * 0, or -1 with err (the plan's reason). */
static int phase_plan_(cuda_ctx_ *c, int S, const int *slot_of,
                       int *n_resident, size_t *device_bytes, char *err,
                       size_t errlen)
{
    offload_plan_input in = c->plan_in;
    offload_plan p;
    in.n_slots = S;
    in.slot_of = slot_of;
    if (offload_plan_make(&in, &p, err, errlen) != 0)
        return -1;
    *n_resident = p.n_resident;
    *device_bytes = p.peak_device_bytes - p.workspace_bytes;
    offload_plan_free(&p);
    return 0;
}

static void note_peaks_(cuda_ctx_ *c, const gpt_cuda_offload_stats *os);

static int cuda_reslot_(void *ctx, int S, const int *slot_of,
                        const int *src_of, int reset_moments, char *err,
                        size_t errlen)
{
    cuda_ctx_ *c = ctx;
    /* new state is allocated before the old is freed: peak is old + new */
    if (!c->budget) {
        if (gpt_cuda_reslot(c->g, S, slot_of, src_of, reset_moments) != 0) {
            snprintf(err, errlen, "cannot allocate %d slots: out of device "
                     "memory", S);
            return -1;
        }
        return 0;
    }
    int n_res;
    size_t dev;
    char e2[512];
    if (phase_plan_(c, S, slot_of, &n_res, &dev, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "cannot place %d slots: %s", S, e2);
        return -1;
    }
    if (n_res < S && !c->placed) { /* the create-time plan said no */
        snprintf(err, errlen, "cannot place %d slots: the plan offloads %d "
                 "of them, and the model was made without offloading",
                 S, S - n_res);
        return -1;
    }
    if (gpt_cuda_reslot_placed(c->g, S, slot_of, src_of, reset_moments,
                               n_res) != 0) {
        snprintf(err, errlen, "cannot allocate %d slots (%d resident, %d "
                 "offloaded): out of device or host memory (details on "
                 "m6d's stderr)", S, n_res, S - n_res);
        return -1;
    }
    c->predicted_peak = dev;
    gpt_cuda_offload_stats os;
    gpt_cuda_get_offload_stats(c->g, &os);
    note_peaks_(c, &os);
    return 0;
}

static const int *cuda_slot_of_(void *ctx)
{
    return gpt_cuda_slot_of(((cuda_ctx_ *)ctx)->g);
}

/* ------------------------------------------------------------- state */

/* The device's part of the state (globals and resident slots) as host
 * copies of master weights, m and v in gpt_cuda_state_offset's layout
 * (AdamW: 3 x 4 bytes per resident parameter while a checkpoint is
 * written or read); offloaded slots are read and written in place, in
 * gpt_cuda's host memory, with no second copy. */
static size_t resident_floats_(const cuda_ctx_ *c)
{
    gpt_cuda_info info;
    gpt_cuda_get_info(c->g, &info);
    return c->n_global + gpt_cuda_slot_offset(c->g, info.n_resident);
}

/* Whether host[b] holds the offloaded slots' part too: with bf16
 * masters, the weights (b 0), which have no fp32 copy on the host to read
 * in place, widened into host[0] (4 bytes a weight while a checkpoint is
 * written or read). */
static int whole_(const cuda_ctx_ *c, int b)
{
    return b == 0 && c->master_bf16;
}

/* Floats of host[b]: the device's part of buffer b (whole_: every
 * slot's). */
static size_t state_floats_(const cuda_ctx_ *c, int b)
{
    gpt_cuda_info info;
    gpt_cuda_get_info(c->g, &info);
    return gpt_cuda_state_offset(c->g, b, whole_(c, b) ? info.S
                                                       : info.n_resident);
}

static int cuda_state_begin_(void *ctx, int for_load)
{
    cuda_ctx_ *c = ctx;
    gpt_cuda_synchronize(c->g); /* settle host AdamW jobs, copies */
    free_host_(c);
    for (int i = 0; i < 3; i++) {
        size_t n = state_floats_(c, i);
        if (n == 0) /* Adafactor without a first moment: no m */
            continue;
        c->host[i] = calloc(n, sizeof(float));
        if (!c->host[i] ||
            (!for_load &&
             (whole_(c, i) ? gpt_cuda_get_state(c->g, i, c->host[i], n)
                           : gpt_cuda_get_state_resident(c->g, i, c->host[i],
                                                         n)) != 0)) {
            free_host_(c);
            return -1;
        }
    }
    return 0;
}

static float *cuda_state_region_(void *ctx, backend_buf b, int s)
{
    cuda_ctx_ *c = ctx;
    float *in_place = s < 0 ? NULL : gpt_cuda_host_slot(c->g, (int)b, s);
    if (in_place)
        return in_place;
    if (!c->host[b])
        return NULL;
    return c->host[b] + (s < 0 ? 0 : gpt_cuda_state_offset(c->g, b, s));
}

static int cuda_state_end_(void *ctx, int modified)
{
    cuda_ctx_ *c = ctx;
    int rc = 0;
    for (int i = 0; i < 3 && modified; i++) {
        size_t n = state_floats_(c, i);
        if (n && (!c->host[i] ||
                  (whole_(c, i)
                       ? gpt_cuda_set_state(c->g, i, c->host[i], n)
                       : gpt_cuda_set_state_resident(c->g, i, c->host[i],
                                                     n)) != 0))
            rc = -1;
    }
    if (modified) { /* offloaded masters written in place: bf16 copies */
        gpt_cuda_info info;
        gpt_cuda_get_info(c->g, &info);
        for (int s = info.n_resident; s < info.S; s++)
            gpt_cuda_host_slot_written(c->g, s);
    }
    free_host_(c);
    return rc;
}

/* Step counts: a host AdamW counts its step when it is queued, and
 * gpt_cuda_set_adam_steps waits for the host jobs itself. */
static void cuda_get_adam_steps_(void *ctx, long *dst)
{
    gpt_cuda_get_adam_steps(((cuda_ctx_ *)ctx)->g, dst);
}

static void cuda_set_adam_steps_(void *ctx, const long *src)
{
    gpt_cuda_set_adam_steps(((cuda_ctx_ *)ctx)->g, src);
}

/* ------------------------------------------------------------- figures */

/* The planned allocations: bf16 weights and gradients, fp32 master weights
 * and moments, activations and scratch, and with offloading the staging
 * buffers (cuBLASLt's workspace and the CUDA context are not counted). */
static size_t cuda_device_bytes_(void *ctx)
{
    gpt_cuda_offload_stats os; /* any model: its device bytes */
    gpt_cuda_get_offload_stats(((cuda_ctx_ *)ctx)->g, &os);
    return os.device_bytes;
}

static void note_peaks_(cuda_ctx_ *c, const gpt_cuda_offload_stats *os)
{
    if (os->device_bytes > c->peak_device)
        c->peak_device = os->device_bytes;
    if (os->host_bytes > c->peak_host)
        c->peak_host = os->host_bytes;
}

/* offload_stats from gpt_cuda's: the "device pool" is the budget
 * (capacity) and gpt_cuda's planned device allocations (in_use; peak: the
 * most seen between steps and at reslot); the "host pool" is the
 * offloaded slots' host memory, one chunk per slot, pinned_bytes of it
 * page-locked. Copy times are the copy stream's (event timing), stall_s
 * the compute stream waiting for late fetches, adam_s the host threads'
 * AdamW time. */
static int cuda_offload_stats_(void *ctx, offload_stats *st)
{
    cuda_ctx_ *c = ctx;
    memset(st, 0, sizeof *st);
    if (!c->budget) {
        st->n_slots = st->n_resident = cuda_n_slots_(ctx);
        return -1; /* no offloading */
    }
    /* a model made without offloading (nothing ever offloaded) has all
     * slots resident and zero host bytes and copies */
    gpt_cuda_offload_stats os;
    gpt_cuda_get_offload_stats(c->g, &os);
    note_peaks_(c, &os);
    st->enabled = 1;
    st->budget_bytes = c->budget;
    st->predicted_peak_bytes = c->predicted_peak;
    st->device.capacity = c->budget;
    st->device.in_use = os.device_bytes;
    st->device.peak = c->peak_device;
    st->hidden_fraction = 1.0;
    st->n_slots = os.n_slots;
    st->n_resident = os.n_resident;
    st->n_offloaded = os.n_offloaded;
    st->n_staging = os.n_staging;
    st->host.capacity = st->host.in_use = os.host_bytes;
    st->host.peak = c->peak_host;
    st->host.pinned = os.pinned_bytes;
    st->host.chunks = os.n_offloaded;
    st->h2d_bytes = os.h2d_bytes;
    st->d2h_bytes = os.d2h_bytes;
    st->h2d_s = os.h2d_s;
    st->d2h_s = os.d2h_s;
    st->h2d_gbps = os.h2d_s > 0 ? (double)os.h2d_bytes / os.h2d_s / 1e9 : 0;
    st->d2h_gbps = os.d2h_s > 0 ? (double)os.d2h_bytes / os.d2h_s / 1e9 : 0;
    st->stall_s = os.stall_s;
    st->speculative = os.spec_bytes > 0;
    st->spec_bytes = os.spec_bytes;
    st->spec_steps = os.spec_steps;
    st->redo_steps = os.redo_steps;
    st->spec_restores = os.spec_restores;
    /* streamed: the pool's buffers (in host and pinned above too); the
     * skips of updates whose slot's gradient was not finite */
    st->stream_grads = os.n_grad_bufs > 0;
    st->n_grad_bufs = os.n_grad_bufs;
    st->grads.capacity = os.grad_buf_bytes;
    st->grads.pinned = os.grad_buf_bytes;
    st->grads.in_use = os.grad_buf_in_use;
    st->grads.peak = os.grad_buf_peak;
    if (st->stream_grads)
        st->stream_skips = os.update_skips;
    double copy = os.h2d_s + os.d2h_s;
    if (copy > 0) {
        double h = 1.0 - os.stall_s / copy;
        st->hidden_fraction = h < 0 ? 0 : h > 1 ? 1 : h;
    }
    st->adam_s = os.adam_s;
    return 0;
}

/* ------------------------------------------------------------- data parallel */

/* backend.h grad_region: slot s's (s = -1 the globals') part of the host
 * copy, in the plain layout. NULL on a model made with offloading (see the
 * top of this file) and out of memory. */
static float *cuda_grad_region_(void *ctx, int s)
{
    cuda_ctx_ *c = ctx;
    if (c->placed)
        return NULL;
    float *h = ghost_(c);
    if (!h)
        return NULL;
    return h + (s < 0 ? 0 : c->n_global + gpt_cuda_slot_offset(c->g, s));
}

/* backend.h data_parallel. No per-slot reports (ready): the bf16
 * gradients are converted and copied out at once after the microbatch.
 * The device's fp32 copy is allocated here (and again after a reslot), so
 * a first step does not find the memory short. */
static void cuda_data_parallel_(void *ctx, int accum,
                                void (*ready)(void *ready_ctx, int s),
                                void *ready_ctx)
{
    cuda_ctx_ *c = ctx;
    (void)ready;
    (void)ready_ctx;
    c->dp_accum = accum > 0 ? accum : 0;
    c->dp_pending = 0;
    if (c->dp_accum > 0 && !c->placed)
        (void)gpt_cuda_grads_f32(c->g, NULL);
}

/* backend.h dp_device. */
static void cuda_dp_device_(void *ctx, int on)
{
    cuda_ctx_ *c = ctx;
    c->dp_device = on != 0;
    if (c->dp_device) { /* the host copy is not used */
        free(c->ghost);
        c->ghost = NULL;
        c->ghost_n = 0;
    }
}

/* backend.h device_grads: gpt_cuda_grads_f32's buffer (globals and every
 * slot, gpt_cuda's device layout), NULL on a model made with offloading
 * or out of device memory. */
static float *cuda_device_grads_(void *ctx, size_t *n)
{
    cuda_ctx_ *c = ctx;
    if (c->placed)
        return NULL;
    return gpt_cuda_grads_f32(c->g, n);
}

static const backend_iface cuda_iface_ = {
    /* .name           = */ "cuda",
    /* .free           = */ cuda_free_,
    /* .step_begin     = */ cuda_step_begin_,
    /* .microbatch     = */ cuda_microbatch_,
    /* .grad_norm      = */ cuda_grad_norm_,
    /* .adamw          = */ cuda_adamw_,
    /* .loss           = */ cuda_loss_,
    /* .reslot         = */ cuda_reslot_,
    /* .n_slots        = */ cuda_n_slots_,
    /* .slot_of        = */ cuda_slot_of_,
    /* .state_begin    = */ cuda_state_begin_,
    /* .state_region   = */ cuda_state_region_,
    /* .state_end      = */ cuda_state_end_,
    /* .get_adam_steps = */ cuda_get_adam_steps_,
    /* .set_adam_steps = */ cuda_set_adam_steps_,
    /* .device_bytes   = */ cuda_device_bytes_,
    /* .offload_stats  = */ cuda_offload_stats_,
    /* .moe_stats      = */ cuda_moe_stats_,
    /* .grad_region    = */ cuda_grad_region_,
    /* .poison_grad    = */ NULL,  /* the test fault inf_grad: cpu only */
    /* .data_parallel  = */ cuda_data_parallel_,
    /* .grad_summed    = */ NULL,  /* grad_norm takes the sums back */
    /* .dp_device      = */ cuda_dp_device_,
    /* .device_grads   = */ cuda_device_grads_,
    /* .step_loss      = */ cuda_step_loss_,
    /* .optim_bytes    = */ NULL,  /* not counted */
    /* .shard          = */ NULL,  /* the whole state on the device */
    /* .flat           = */ NULL,
    /* .shard_counts   = */ NULL,
    /* .set_moe_ext    = */ NULL,  /* expert parallelism: cpu only */
};

/* ------------------------------------------------------------- create */

int backend_cuda_check(const model_config *model, char *err, size_t errlen)
{
    const char *why = "";
    if (gpt_cuda_device_count(&why) < 1) {
        snprintf(err, errlen, "device.backend: 'cuda': no CUDA device "
                 "(cudaGetDeviceCount: %s); device.backend \"cpu\" trains "
                 "without one", why);
        return -1;
    }
    if (gpt_cuda_blas_ready(&why) != 0) {
        snprintf(err, errlen, "device.backend: 'cuda': %s", why);
        return -1;
    }
    return gpt_cuda_check_config(model, err, errlen);
}

/* Floats of gpt.h's plain layout of S slots under the default share map
 * (a mixed model's dense slots at their own size), independently of
 * gpt_cuda; 0 when there is no such map. */
static size_t gpt_plain_floats_(const model_config *cfg, int S)
{
    gpt_tensor glob[GLOB_NTENSORS], tab[SLOT_NTENSORS_MAX];
    size_t ng, size[2], n = 0;
    gpt_layout(cfg, glob, tab, &ng, &size[1]);
    gpt_slot_layout(cfg, 0, tab, &size[0]);
    gpt_slot_layout(cfg, 1, tab, &size[1]);
    int *map = malloc((size_t)cfg->n_layer * sizeof(int));
    unsigned char *kind = malloc((size_t)S);
    if (map && kind && gpt_default_share_map(cfg, S, map) == 0 &&
        gpt_slot_kinds(cfg, S, map, kind, NULL, 0) == 0) {
        n = ng;
        for (int s = 0; s < S; s++)
            n += size[kind[s]];
    }
    free(map);
    free(kind);
    return n;
}

int backend_cuda_create(backend *be, const backend_setup *bs, char *err,
                        size_t errlen)
{
    int S = bs->n_slots;
    const char *why = "";
    /* this thread's device, for the model and every later call on it */
    if (gpt_cuda_use_device(bs->device, &why) != 0) {
        snprintf(err, errlen, "cannot use CUDA device %d: %s", bs->device,
                 why);
        return -1;
    }
    cuda_ctx_ *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->n_global = bs->n_global;
    c->master_bf16 = bs->optim.master_bf16;
    c->slot_size = bs->slot_size;
    c->grad_accum = bs->grad_accum;
    c->model = bs->model;
    c->moe = bs->model.moe_experts > 0;
    c->n_moe_layers = model_moe_layers(&bs->model);
    if (c->moe && (!(c->moe_counts = malloc((size_t)bs->model.n_layer *
                                            bs->model.moe_experts *
                                            sizeof(int32_t))) ||
                   !(c->moe_st.tokens = calloc((size_t)c->n_moe_layers *
                                                   bs->model.moe_experts,
                                               sizeof(double))))) {
        snprintf(err, errlen, "out of memory");
        free(c->moe_counts);
        free(c);
        return -1;
    }
    gpt_cuda_offload off = {0}, *offp = NULL;
    if (bs->plan) {
        /* the starting phase's plan places the slots; the Real phase
         * offloads the most: it decides whether gpt_cuda gets its
         * offloading machinery, and its staging buffers, which gpt_cuda
         * makes once for the model's life */
        const offload_plan *now = backend_setup_phase_plan(bs);
        c->budget = bs->plan_in.budget;
        c->plan_in = bs->plan_in;
        c->predicted_peak = now->peak_device_bytes - now->workspace_bytes;
        if (bs->plan->n_offloaded > 0) {
            off.n_resident = now->n_resident;
            off.n_staging = bs->plan->n_staging; /* min(prefetch, offloaded) */
            off.host_threads = bs->host_threads;
            off.speculative = bs->plan->speculative; /* the Real phase's */
            off.n_grad_bufs = bs->plan->stream_grads ? bs->plan->n_grad_bufs
                                                     : 0;
            c->stream_grads = bs->plan->stream_grads;
            offp = &off;
            c->placed = 1;
        }
    }
    c->g = gpt_cuda_create_optim(&bs->model, S, bs->batch_size, offp,
                                 &bs->optim);
    if (!c->g) {
        snprintf(err, errlen, "cannot create the model on the GPU (%d "
                 "slots%s, batch_size %d): out of device or host memory or "
                 "an unsupported shape (details on m6d's stderr)", S,
                 offp ? ", offloading on" : "", bs->batch_size);
        goto fail;
    }
    /* the CPU model's initial weights for the seed, so a run starts from
     * the same point on either backend */
    size_t n = plain_floats_(c), want = gpt_plain_floats_(&bs->model, S);
    if (n != want) {
        snprintf(err, errlen, "gpt_cuda's layout (%zu floats) differs from "
                 "gpt.h's (%zu)", n, want);
        goto fail;
    }
    if (gpt_cuda_init_weights(c->g, bs->seed) != 0) {
        snprintf(err, errlen, "out of host memory initialising the weights");
        goto fail;
    }
    if (c->budget) {
        gpt_cuda_offload_stats os;
        gpt_cuda_get_offload_stats(c->g, &os);
        note_peaks_(c, &os);
    }
    be->iface = &cuda_iface_;
    be->ctx = c;
    return 0;
fail:
    cuda_free_(c);
    return -1;
}
