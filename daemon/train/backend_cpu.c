/*
 * backend_cpu.c — the trainer's CPU backend (backend.h): the reference model
 * of daemon/model/gpt.c, fp32 with GEMMs in the run's precision (fp32, or
 * bf16 inputs: kernels.h's gemm_precision), with granular offloading
 * (daemon/offload/offload.h) when device.memory_budget > 0. The sequence of
 * calls per step is the one offload.h documents; losses are bitwise those
 * of the fully resident run.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels.h"
#include "model/gpt.h"
#include "offload/offload.h"
#include "train/backend.h"

typedef struct {
    gpt_model model;
    offload_ctx *off;      /* NULL unless device.memory_budget > 0 */
    gemm_precision precision;  /* of the GEMMs; set before each pass */
    int poison_slot;       /* tests: slot whose gradient gets an Inf in
                            * this step, -1 none */
    /* pseudo.grad_scale mean in this step: share[s] layers use slot s
     * (n_share entries); grad_mean 0: the sum, share unused */
    int grad_mean;
    int *share, n_share;
    /* data parallelism (cpu_data_parallel_): dp_accum > 0 microbatches a
     * step, the gradient all-reduced after the last; ready/ready_ctx its
     * per-slot reports then (NULL: none) */
    int dp_accum;
    void (*ready)(void *ctx, int s);
    void *ready_ctx;
} cpu_ctx_;

static void cpu_free_(void *ctx)
{
    cpu_ctx_ *c = ctx;
    if (!c)
        return;
    gpt_free(&c->model);
    offload_free(c->off);
    free(c->share);
    free(c);
}

/* ------------------------------------------------------------- step */

static offload_adam offload_adam_(const backend_adam *h, float grad_scale)
{
    return (offload_adam){h->lr, h->beta1, h->beta2, h->eps,
                          h->weight_decay, grad_scale, h->adafactor, h->af};
}

/* share[s] = the layers using slot s under the model's share map, into
 * c->share (grown to S entries). 0, or -1 when out of memory. */
static int count_share_(cpu_ctx_ *c)
{
    int S = c->model.S, L = c->model.cfg.n_layer;
    if (S > c->n_share) {
        int *p = realloc(c->share, (size_t)S * sizeof *p);
        if (!p)
            return -1;
        c->share = p;
        c->n_share = S;
    }
    memset(c->share, 0, (size_t)S * sizeof *c->share);
    for (int l = 0; l < L; l++)
        c->share[c->model.slot_of[l]]++;
    return 0;
}

static void cpu_step_begin_(void *ctx, const backend_adam *h)
{
    cpu_ctx_ *c = ctx;
    /* out of memory for the counts: grad_norm says NaN (step skipped) */
    c->grad_mean = h->slot_grad_mean ? (count_share_(c) == 0 ? 1 : -1) : 0;
    /* Offloaded slots are updated only once the global norm is known to
     * be finite (adamw), also without clipping: an update started as soon
     * as a slot's gradient is final could not be taken back when another
     * slot's gradient, or the loss, turns out NaN or Inf (the step is then
     * skipped, trainer.h). With clipping and a speculative plan they are
     * updated unclipped at once into second buffers, kept when the norm is
     * finite and within the clip, else redone or (a skipped step) undone.
     * Streamed gradients (offload.stream_grads, no clip, one microbatch)
     * are the exception the spec states: updated at once, a slot whose own
     * gradient is not finite skipped, the others kept. */
    if (c->off) {
        int stream = offload_current_plan(c->off)->stream_grads;
        offload_adam now = offload_adam_(h, 1.0f);
        offload_step_begin(c->off, stream ? &now : NULL);
        /* an offloaded slot's gradient is divided where it lands, before
         * a speculative update reads it; data-parallel, it is final only
         * once the all-reduce has summed it (cpu_grad_summed_) */
        if (c->grad_mean > 0 && !c->dp_accum)
            offload_set_grad_divisors(c->off, c->share);
        if (h->grad_clip > 0) {
            offload_adam early = offload_adam_(h, 1.0f);
            if (c->dp_accum)
                offload_step_speculate_summed(c->off, &early);
            else
                offload_step_speculate(c->off, &early);
        }
    }
    c->poison_slot = -1;
    gpt_zero_grad(&c->model);
    gpt_moe_stats_reset(&c->model);
}

static float cpu_microbatch_(void *ctx, int k, const int32_t *inp,
                             const int32_t *tgt, int B, float loss_scale)
{
    cpu_ctx_ *c = ctx;
    /* data-parallel, the step's last: slots reported as they are final
     * (resident ones by gpt_backward, offloaded ones as their last drain
     * lands), and every gradient final in host memory on return */
    int last = c->dp_accum > 0 && k == c->dp_accum - 1;
    if (last && c->ready) {
        c->model.grad_ready = c->ready;
        c->model.grad_ready_ctx = c->ready_ctx;
        if (c->off)
            offload_set_grad_ready(c->off, c->ready, c->ready_ctx);
    }
    if (c->off)
        offload_microbatch(c->off, k);
    /* the run's precision for this pass (the process's: other ranks of
     * this m6d pass in the same one meanwhile) */
    gemm_precision_enter(c->precision);
    float loss = gpt_forward(&c->model, inp, tgt, B);
    gpt_backward(&c->model, inp, tgt, B, loss_scale);
    gemm_precision_leave();
    if (last && c->off)
        offload_wait_grads(c->off);
    if (last && c->ready) {
        c->model.grad_ready = NULL;
        if (c->off)
            offload_set_grad_ready(c->off, NULL, NULL);
    }
    return loss;
}

static void cpu_data_parallel_(void *ctx, int accum,
                               void (*ready)(void *ctx, int s),
                               void *ready_ctx)
{
    cpu_ctx_ *c = ctx;
    c->dp_accum = accum > 0 ? accum : 0;
    c->ready = c->dp_accum ? ready : NULL;
    c->ready_ctx = ready_ctx;
}

/* pseudo.grad_scale mean: slot s's final gradient divided by share[s]. */
static void mean_slot_grad_(cpu_ctx_ *c, int s)
{
    float *gr = c->model.slots[s].grads, n = (float)c->share[s];
    size_t len = gpt_slot_floats(&c->model, s);
    for (size_t i = 0; i < len; i++)
        gr[i] /= n;
}

/* Of the resident slots: the offload runtime divided the offloaded ones
 * when their last drain landed (data-parallel: cpu_grad_summed_, after
 * the all-reduce). */
static void mean_slot_grads_(cpu_ctx_ *c)
{
    for (int s = 0; s < c->model.S; s++)
        if (c->share[s] > 1 && !(c->off && c->model.offloaded[s]))
            mean_slot_grad_(c, s);
}

/* Data parallelism: slot s's gradient is summed over the ranks. An
 * offloaded slot's is then final: its mean taken, its speculative update
 * queued (offload_step_speculate_summed), while the trainer sums the
 * earlier slots. */
static void cpu_grad_summed_(void *ctx, int s)
{
    cpu_ctx_ *c = ctx;
    if (!c->off || s < 0 || s >= c->model.S || !c->model.offloaded[s])
        return;
    if (c->grad_mean > 0 && c->share[s] > 1)
        mean_slot_grad_(c, s);
    offload_grad_summed(c->off, s);
}

static float cpu_grad_norm_(void *ctx)
{
    cpu_ctx_ *c = ctx;
    if (c->off)
        offload_wait_grads(c->off);
    if (c->grad_mean < 0)
        return NAN;
    if (c->grad_mean > 0)
        mean_slot_grads_(c);
    double *sq = NULL;
    if (c->off && offload_current_plan(c->off)->stream_grads) {
        /* streamed: offloaded slots' parts as they landed */
        if (!(sq = malloc((size_t)c->model.S * sizeof *sq)))
            return NAN;
        offload_stream_sumsq(c->off, sq);
    }
    if (c->poison_slot >= 0 && c->poison_slot < c->model.S) {
        if (sq && c->model.offloaded[c->poison_slot])
            sq[c->poison_slot] = INFINITY; /* its gradient may be gone */
        else
            c->model.slots[c->poison_slot].grads[0] = INFINITY;
    }
    float norm = sq ? gpt_grad_norm_with(&c->model, sq)
                    : gpt_grad_norm(&c->model);
    free(sq);
    return norm;
}

static void cpu_poison_grad_(void *ctx, int s)
{
    ((cpu_ctx_ *)ctx)->poison_slot = s;
}

static void cpu_adamw_(void *ctx, const backend_adam *h, float norm)
{
    cpu_ctx_ *c = ctx;
    float clip = h->grad_clip;
    float scale = (clip > 0 && norm > clip) ? clip / norm : 1.0f;
    if (h->adafactor) {
        if (c->off) { /* host threads update offloaded slots meanwhile */
            offload_adam a = offload_adam_(h, scale);
            offload_adamw(c->off, &a);
        }
        adafactor_hparams af = h->af;
        af.grad_scale = scale;
        /* out of memory for its span table: the weights, state and step
         * counts stay as they were (a skipped update), said in the log */
        if (gpt_adafactor(&c->model, &af, h->weight_decay) != 0)
            log_event(LOG_ERROR, "train.adafactor",
                      "update=skipped error=\"%s\"", strerror(errno));
        return;
    }
    if (c->off) { /* host threads update offloaded slots meanwhile */
        offload_adam a = offload_adam_(h, scale);
        offload_adamw(c->off, &a);
    }
    gpt_adamw(&c->model, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
              scale);
}

static float cpu_loss_(void *ctx, const int32_t *inp, const int32_t *tgt,
                       int B)
{
    cpu_ctx_ *c = ctx;
    /* validation capacity; the step's MoE facts stay those of training */
    gpt_moe_stats keep = c->model.moe_stats;
    c->model.moe_stats.tokens = NULL;  /* kept out of the step's tokens */
    int cap = c->model.moe_capacity;
    c->model.moe_eval = 1;
    gemm_precision_enter(c->precision);
    float loss = gpt_forward(&c->model, inp, tgt, B);
    gemm_precision_leave();
    c->model.moe_eval = 0;
    c->model.moe_stats = keep;
    c->model.moe_capacity = cap;
    return loss;
}

static int cpu_moe_stats_(void *ctx, gpt_moe_stats *st)
{
    cpu_ctx_ *c = ctx;
    if (c->model.cfg.moe_experts == 0)
        return -1;
    *st = c->model.moe_stats;
    return 0;
}

/* ------------------------------------------------------------- slots */

static int cpu_reslot_(void *ctx, int S, const int *slot_of,
                       const int *src_of, int reset_moments, char *err,
                       size_t errlen)
{
    cpu_ctx_ *c = ctx;
    unsigned char *kinds = malloc((size_t)S);
    if (!kinds) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int bad = gpt_slot_kinds(&c->model.cfg, S, slot_of, kinds, err, errlen);
    for (int s = 0; !bad && s < S; s++)
        if (src_of[s] < 0 || src_of[s] >= c->model.S ||
            kinds[s] != c->model.slot_moe[src_of[s]]) {
            snprintf(err, errlen, "slot %d would copy slot %d of another "
                     "kind (or none): a slot copies a slot of its own kind",
                     s, src_of[s]);
            bad = 1;
        }
    free(kinds);
    if (bad)
        return -1;
    if (c->off)
        offload_sync(c->off);
    if (gpt_reslot(&c->model, S, slot_of, src_of, reset_moments) != 0) {
        snprintf(err, errlen, "cannot allocate %d slots: %s", S,
                 c->off && offload_last_error(c->off)[0]
                     ? offload_last_error(c->off) : strerror(errno));
        return -1;
    }
    return 0;
}

static int cpu_n_slots_(void *ctx) { return ((cpu_ctx_ *)ctx)->model.S; }

static const int *cpu_slot_of_(void *ctx)
{
    return ((cpu_ctx_ *)ctx)->model.slot_of;
}

/* ------------------------------------------------------------- state */

/* The state is host memory already; offloaded slots are read where they
 * live, once their pending updates are settled. */
static int cpu_state_begin_(void *ctx, int for_load)
{
    cpu_ctx_ *c = ctx;
    if (c->off)
        offload_sync(c->off);
    return 0;
}

static float *cpu_state_region_(void *ctx, backend_buf b, int s)
{
    const gpt_model *g = &((cpu_ctx_ *)ctx)->model;
    if (b != BACKEND_PARAMS && g->shard_world > 1)
        return NULL;  /* the moments are not all here (gpt_set_shard) */
    if (s < 0)
        return b == BACKEND_PARAMS ? g->params : b == BACKEND_M ? g->m : g->v;
    const gpt_slot_state *st = &g->slots[s];
    return b == BACKEND_PARAMS ? st->params : b == BACKEND_M ? st->m : st->v;
}

/* Weights written from outside (a checkpoint, init.from) become bf16
 * masters when the model keeps them (gpt_round_masters; a bf16 value
 * stays itself). */
static int cpu_state_end_(void *ctx, int modified)
{
    if (modified)
        gpt_round_masters(&((cpu_ctx_ *)ctx)->model);
    return 0;
}

static size_t cpu_optim_bytes_(void *ctx)
{
    return gpt_optim_bytes(&((cpu_ctx_ *)ctx)->model);
}

static void cpu_get_adam_steps_(void *ctx, long *dst)
{
    cpu_ctx_ *c = ctx;
    if (c->off)
        offload_sync(c->off);
    dst[0] = c->model.adam_t_global;
    memcpy(dst + 1, c->model.adam_t_slot, (size_t)c->model.S * sizeof(long));
}

static void cpu_set_adam_steps_(void *ctx, const long *src)
{
    cpu_ctx_ *c = ctx;
    c->model.adam_t_global = src[0];
    memcpy(c->model.adam_t_slot, src + 1, (size_t)c->model.S * sizeof(long));
}

/* ------------------------------------------------------------- figures */

/* The stand-in device pool's use with offloading; 0 without (the model is
 * ordinary host memory then). */
static size_t cpu_device_bytes_(void *ctx)
{
    cpu_ctx_ *c = ctx;
    if (!c->off)
        return 0;
    offload_stats st;
    offload_get_stats(c->off, &st);
    return st.device.in_use;
}

static int cpu_offload_stats_(void *ctx, offload_stats *st)
{
    cpu_ctx_ *c = ctx;
    if (!c->off) {
        memset(st, 0, sizeof *st);
        st->n_slots = st->n_resident = c->model.S;
        return -1;
    }
    offload_get_stats(c->off, st);
    return 0;
}

/* Every gradient is host memory: the globals' and resident slots' in the
 * (stand-in) device block, an offloaded slot's where its drains land. */
static float *cpu_grad_region_(void *ctx, int s)
{
    cpu_ctx_ *c = ctx;
    return s < 0 ? c->model.grads : c->model.slots[s].grads;
}

static int cpu_shard_(void *ctx, int rank, int world, char *err,
                      size_t errlen)
{
    cpu_ctx_ *c = ctx;
    if (gpt_set_shard(&c->model, rank, world) == 0)
        return 0;
    snprintf(err, errlen, "cannot shard the optimizer state (rank %d of "
             "%d): %s", rank, world, errno == EINVAL
                 ? "with offloading only the state kept on the host "
                   "shards (or Adafactor's tensors are out of order)"
                 : strerror(errno));
    return -1;
}

static float *cpu_flat_(void *ctx, backend_buf b, size_t *n)
{
    gpt_model *g = &((cpu_ctx_ *)ctx)->model;
    /* placed: the weights are the globals' and each slot's blocks; the
     * optimizer state one buffer only when the model keeps it on the
     * host (gpt.h state_on_host) */
    if (g->storage && (b == BACKEND_PARAMS || !g->state_on_host))
        return NULL;
    if (b == BACKEND_PARAMS) {
        *n = g->n_params;
        return g->params;
    }
    /* whole: lo 0 and hi the whole; sharded: this rank's part */
    *n = b == BACKEND_V ? g->shard_vhi - g->shard_vlo
                        : g->shard_hi - g->shard_lo;
    return b == BACKEND_M ? g->m : g->v;
}

static int cpu_shard_counts_(void *ctx, int world, backend_buf b,
                             size_t *counts)
{
    return gpt_shard_counts(&((cpu_ctx_ *)ctx)->model, world, b == BACKEND_V,
                            counts);
}

static void cpu_set_moe_ext_(void *ctx, const gpt_moe_ext *ext)
{
    ((cpu_ctx_ *)ctx)->model.moe_ext = ext;
}

static const backend_iface cpu_iface_ = {
    /* .name           = */ "cpu",
    /* .free           = */ cpu_free_,
    /* .step_begin     = */ cpu_step_begin_,
    /* .microbatch     = */ cpu_microbatch_,
    /* .grad_norm      = */ cpu_grad_norm_,
    /* .adamw          = */ cpu_adamw_,
    /* .loss           = */ cpu_loss_,
    /* .reslot         = */ cpu_reslot_,
    /* .n_slots        = */ cpu_n_slots_,
    /* .slot_of        = */ cpu_slot_of_,
    /* .state_begin    = */ cpu_state_begin_,
    /* .state_region   = */ cpu_state_region_,
    /* .state_end      = */ cpu_state_end_,
    /* .get_adam_steps = */ cpu_get_adam_steps_,
    /* .set_adam_steps = */ cpu_set_adam_steps_,
    /* .device_bytes   = */ cpu_device_bytes_,
    /* .offload_stats  = */ cpu_offload_stats_,
    /* .moe_stats      = */ cpu_moe_stats_,
    /* .grad_region    = */ cpu_grad_region_,
    /* .poison_grad    = */ cpu_poison_grad_,
    /* .data_parallel  = */ cpu_data_parallel_,
    /* .grad_summed    = */ cpu_grad_summed_,
    /* .dp_device      = */ NULL,  /* host gradients only */
    /* .device_grads   = */ NULL,
    /* .step_loss      = */ NULL,  /* microbatch returns each loss */
    /* .optim_bytes    = */ cpu_optim_bytes_,
    /* .shard          = */ cpu_shard_,
    /* .flat           = */ cpu_flat_,
    /* .shard_counts   = */ cpu_shard_counts_,
    /* .set_moe_ext    = */ cpu_set_moe_ext_,
};

/* ------------------------------------------------------------- create */

int backend_cpu_create(backend *be, const backend_setup *bs, char *err,
                       size_t errlen)
{
    /* never fast and wrong: a GEMM that fails its self-check trains nothing */
    char why[512];
    gemm_precision prec = bs->bf16 ? GEMM_BF16 : GEMM_FP32;
    if (gemm_ready(prec, why, sizeof why) != 0) {
        snprintf(err, errlen, "refusing to train on the CPU in %s "
                 "(device.precision): %s", gemm_precision_name(prec), why);
        return -1;
    }
    cpu_ctx_ *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->precision = prec;
    /* the runtime places every (re)allocation of the model's state by the
     * plan for its share map, the starting phase's first */
    if (bs->plan && !(c->off = offload_create(&bs->plan_in, bs->host_threads,
                                              backend_setup_phase_plan(bs),
                                              err, errlen)))
        goto fail;
    if (gpt_create_optim(&c->model, &bs->model, bs->n_slots, bs->batch_size,
                         c->off ? offload_storage(c->off) : NULL,
                         &bs->optim) != 0) {
        if (c->off && offload_last_error(c->off)[0])
            snprintf(err, errlen, "cannot place the model: %s",
                     offload_last_error(c->off));
        else
            snprintf(err, errlen, "cannot allocate the model: %s",
                     strerror(errno));
        goto fail;
    }
    gpt_init_weights(&c->model, bs->seed);
    c->poison_slot = -1;
    be->iface = &cpu_iface_;
    be->ctx = c;
    return 0;
fail:
    cpu_free_(c);
    return -1;
}
