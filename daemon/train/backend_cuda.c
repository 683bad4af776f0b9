/*
 * backend_cuda.c — the trainer's CUDA backend (backend.h): the model on one
 * GPU through kernels/cuda/gpt_cuda.h. bf16 weights' working copy,
 * activations and gradients; fp32 master weights and AdamW moments; the
 * global gradient norm and clipping computed on the device; delink as an
 * on-device reslot. Plain C: only gpt_cuda's C interface is used.
 * Compiled only when m6 is built with CUDA (M6_HAVE_CUDA).
 *
 * Every slot is resident. A device.memory_budget is accepted when the
 * offload planner keeps every slot resident under it (its estimate counts
 * fp32 activations, so it is conservative for bf16); the budget is not
 * enforced on the GPU. Offloading slots of a GPU model is not implemented.
 *
 * Errors of the CUDA runtime and cuBLASLt end the process with the
 * statement and the library's message (kernels/cuda/cuda_check.h);
 * running out of device memory at create or delink is an error returned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpt_cuda.h"
#include "model/gpt.h"
#include "offload/offload.h"
#include "train/backend.h"

typedef struct {
    gpt_cuda *g;
    size_t n_global, slot_size;   /* the plain layout of gpt.h */
    float *host[3];               /* state_begin..state_end: the state in
                                   * the plain layout, by backend_buf */
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
    return info.n_params_cpu; /* = n_global + S * slot_size */
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
    free(c);
}

/* ------------------------------------------------------------- step */

static void cuda_step_begin_(void *ctx, const backend_adam *h)
{
    gpt_cuda_zero_grad(((cuda_ctx_ *)ctx)->g);
}

static float cuda_microbatch_(void *ctx, int k, const int32_t *inp,
                              const int32_t *tgt, int B, float loss_scale)
{
    gpt_cuda *g = ((cuda_ctx_ *)ctx)->g;
    float loss = gpt_cuda_forward(g, inp, tgt, B);
    gpt_cuda_backward(g, inp, tgt, B, loss_scale);
    return loss;
}

static float cuda_grad_norm_(void *ctx)
{
    return gpt_cuda_grad_norm(((cuda_ctx_ *)ctx)->g);
}

/* The clip scale is computed on the device from the same sum of squares
 * (grad_norm's value); waits, so that the step's time is its real time. */
static void cuda_adamw_(void *ctx, const backend_adam *h, float norm)
{
    gpt_cuda *g = ((cuda_ctx_ *)ctx)->g;
    gpt_cuda_adamw(g, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay,
                   h->grad_clip);
    gpt_cuda_synchronize(g);
}

static float cuda_loss_(void *ctx, const int32_t *inp, const int32_t *tgt,
                        int B)
{
    return gpt_cuda_forward(((cuda_ctx_ *)ctx)->g, inp, tgt, B);
}

/* ------------------------------------------------------------- slots */

static int cuda_reslot_(void *ctx, int S, const int *slot_of,
                        const int *src_of, int reset_moments, char *err,
                        size_t errlen)
{
    /* new state is allocated before the old is freed: peak is old + new */
    if (gpt_cuda_reslot(((cuda_ctx_ *)ctx)->g, S, slot_of, src_of,
                        reset_moments) != 0) {
        snprintf(err, errlen, "cannot allocate %d slots: out of device "
                 "memory", S);
        return -1;
    }
    return 0;
}

static const int *cuda_slot_of_(void *ctx)
{
    return gpt_cuda_slot_of(((cuda_ctx_ *)ctx)->g);
}

/* ------------------------------------------------------------- state */

/* A host copy of master weights, m and v in the plain layout (3 x 4 bytes
 * per parameter while a checkpoint is written or read). */
static int cuda_state_begin_(void *ctx, int for_load)
{
    cuda_ctx_ *c = ctx;
    size_t n = plain_floats_(c);
    free_host_(c);
    for (int i = 0; i < 3; i++) {
        c->host[i] = calloc(n, sizeof(float));
        if (!c->host[i] ||
            (!for_load && gpt_cuda_get_state(c->g, i, c->host[i], n) != 0)) {
            free_host_(c);
            return -1;
        }
    }
    return 0;
}

static float *cuda_state_region_(void *ctx, backend_buf b, int s)
{
    cuda_ctx_ *c = ctx;
    return c->host[b] + (s < 0 ? 0 : c->n_global + (size_t)s * c->slot_size);
}

static int cuda_state_end_(void *ctx, int modified)
{
    cuda_ctx_ *c = ctx;
    size_t n = plain_floats_(c);
    int rc = 0;
    for (int i = 0; i < 3 && modified; i++)
        if (!c->host[i] || gpt_cuda_set_state(c->g, i, c->host[i], n) != 0)
            rc = -1;
    free_host_(c);
    return rc;
}

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
 * and moments, activations and scratch (cuBLASLt's workspace and the CUDA
 * context are not counted). */
static size_t cuda_device_bytes_(void *ctx)
{
    gpt_cuda_info info;
    gpt_cuda_get_info(((cuda_ctx_ *)ctx)->g, &info);
    return info.bytes_params + info.bytes_grads + info.bytes_opt +
           info.bytes_acts;
}

static int cuda_offload_stats_(void *ctx, offload_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n_slots = st->n_resident = cuda_n_slots_(ctx);
    return -1; /* no offloading */
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
};

/* ------------------------------------------------------------- create */

int backend_cuda_check(const run_spec *spec, char *err, size_t errlen)
{
    const char *why = "";
    if (gpt_cuda_device_count(&why) < 1) {
        snprintf(err, errlen, "device.backend: 'cuda': no CUDA device "
                 "(cudaGetDeviceCount: %s)", why);
        return -1;
    }
    if (gpt_cuda_check_config(&spec->model, err, errlen) != 0)
        return -1;
    if (spec->device.memory_budget > 0) {
        offload_plan p;
        char e2[512];
        memset(&p, 0, sizeof p);
        if (offload_plan_for_spec(spec, 0, &p, e2, sizeof e2) != 0) {
            snprintf(err, errlen, "device.memory_budget: %s", e2);
            offload_plan_free(&p);
            return -1;
        }
        int n_off = p.n_offloaded + (p.pseudo ? p.pseudo->n_offloaded : 0);
        offload_plan_free(&p);
        if (n_off > 0) {
            snprintf(err, errlen, "device.memory_budget: the plan offloads "
                     "%d slot(s), and the cuda backend keeps every slot "
                     "resident (no offloading on the GPU yet): raise the "
                     "budget or set it to 0", n_off);
            return -1;
        }
    }
    return 0;
}

int backend_cuda_create(backend *be, const run_spec *spec, int S, char *err,
                        size_t errlen)
{
    cuda_ctx_ *c = calloc(1, sizeof *c);
    float *w = NULL;
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    gpt_layout_sizes(&spec->model, &c->n_global, &c->slot_size);
    c->g = gpt_cuda_create(&spec->model, S, spec->train.batch_size);
    if (!c->g) {
        snprintf(err, errlen, "cannot create the model on the GPU (%d "
                 "slots, batch_size %d): out of device memory or an "
                 "unsupported shape (details on m6d's stderr)", S,
                 spec->train.batch_size);
        goto fail;
    }
    /* the CPU model's initial weights for the seed, so a run starts from
     * the same point on either backend */
    size_t n = plain_floats_(c);
    if (n != c->n_global + (size_t)S * c->slot_size) {
        snprintf(err, errlen, "gpt_cuda's layout (%zu floats) differs from "
                 "gpt.h's (%zu)", n, c->n_global + (size_t)S * c->slot_size);
        goto fail;
    }
    w = malloc(n * sizeof(float));
    if (!w || gpt_init_params(&spec->model, S, w, spec->train.seed) != 0) {
        snprintf(err, errlen, "out of memory initialising the weights");
        goto fail;
    }
    if (gpt_cuda_set_params(c->g, w, n) != 0) {
        snprintf(err, errlen, "cannot load the initial weights to the GPU");
        goto fail;
    }
    free(w);
    be->iface = &cuda_iface_;
    be->ctx = c;
    return 0;
fail:
    free(w);
    cuda_free_(c);
    return -1;
}
