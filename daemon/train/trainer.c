/*
 * trainer.c — one training run: data sampling, the step (microbatches,
 * clipping, AdamW), the LR schedule, evaluation, delink and checkpoints.
 * See trainer.h for the contract and DESIGN.md §1 for the method.
 *
 * The model itself sits behind a backend (backend.h): the CPU reference
 * (backend_cpu.c) or one GPU (backend_cuda.c, in CUDA builds). Everything
 * in this file is shared by both: the sampler, the schedule, the step
 * sequence, the share maps of delink and the checkpoint format.
 */
#include "train/trainer.h"

#include "common/cpus.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <dirent.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crashpoint.h"
#include "model/gpt.h"
#include "offload/offload.h"
#include "train/backend.h"
#include "ckpt/checkpoint.h"
#include "ckpt/init_from.h"
#include "common/durable.h"
#include "train/data.h"
#include "train/test_hooks.h"

#define CKPT_VERSION 1

struct trainer {
    run_spec spec;
    backend be;            /* the model: weights, gradients, optimizer */
    /* the plain layout of gpt.h (checkpoints, state access) */
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t n_global, slot_size;
    token_set train, val;  /* n_shards 0: not open (trainer_create_resumable,
                            * or a failed trainer_reopen_data) */
    size_t data_total[2];  /* tokens of train, val when first opened by this
                            * trainer, 0 not yet: what a reopen must find */
    uint64_t data_rng;     /* state of the training-batch sampler */
    long step;             /* optimizer steps completed */
    long delink_step;      /* step at which delink happened, -1 if none */
    run_phase phase;
    offload_plan plan;     /* the run's memory plan (planned: a budget), as
                            * create_ made it: Real, plan.pseudo Pseudo */
    int planned;
    int32_t *inp, *tgt;    /* (B,T) */
    uint16_t *rows;        /* (grad_accum*B, T+1): the step's windows */
    /* device bytes of the unbudgeted plan, [pseudo], [real]: what a run
     * that does not offload holds (step_placement); peak_planned 0: not
     * yet computed */
    size_t plan_peak[2];
    int peak_planned;
    char *init_error;      /* trainer_init_error; NULL none */
    /* data parallelism (trainer_set_collectives): coll NULL or world 1:
     * alone. B_rank, accum_rank: this rank's microbatches (spec_dp_split;
     * the spec's B and grad_accum alone) */
    m6_coll *coll;
    m6_coll *gcoll;         /* trainer_adopt_grad_group (owned): the
                             * gradient summed in device memory over it
                             * (NCCL); NULL: over coll (host memory) */
    int rank, world;
    int B_rank, accum_rank;
    float *bucket;          /* bucket_floats: the all-reduce staging */
    size_t bucket_floats;
    /* overlap (dp_overlap 1): during the step's last microbatch the
     * backend reports finished slots (dp_ready_) and a communication
     * thread all-reduces each bucket once its regions are final. Under
     * dp_mu: dp_ready [dp_nreg] (regions of the virtual vector, see
     * grad_span_), dp_active (a step's thread runs), dp_loss, dp_rc and
     * dp_err (the thread's result). */
    int dp_overlap;
    /* trainer_set_eval_interrupt: asked between validation batches */
    int (*eval_stop)(void *ud);
    void *eval_stop_ud;
    int dp_sync;            /* dp_mu, dp_cv initialised */
    pthread_mutex_t dp_mu;
    pthread_cond_t dp_cv;
    unsigned char *dp_ready;
    size_t *dp_start;       /* [dp_nstart] first element of each region of
                             * the virtual vector, then its length
                             * (dp_layout_); a region is its slot's size */
    int dp_nstart;
    int dp_nreg, dp_active, dp_rc;
    int dp_mb_done;         /* the last microbatch returned */
    float dp_loss;
    m6_err dp_err;
    /* the last overlapped step: slots the backend reported before its
     * last microbatch returned, buckets whose all-reduce started before
     * then, and all buckets (trainer_dp_overlap_counts) */
    long dp_reported, dp_early, dp_buckets;
    size_t *win_pos;        /* (grad_accum*B) positions of this rank's
                             * windows of the last step; n_win of them */
    size_t n_win;
    long bad_steps;        /* consecutive skipped (non-finite) steps */
    long skipped_steps;    /* all of them; both in checkpoints */
    /* tests (train/test_hooks.h): a fault armed for steps
     * fault_first..fault_first+fault_count-1 */
    trainer_fault fault;
    long fault_first, fault_count;
    int fault_slot;
};

#define DEFAULT_BUCKET_FLOATS ((size_t)4 << 20)

static int n_slots_(const trainer *t)
{
    return t->be.iface->n_slots(t->be.ctx);
}

/* xorshift64* (Vigna 2016): the data sampler's generator; its whole state is
 * one u64, stored in checkpoints. */
static uint64_t rng_next_(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* ------------------------------------------------------------- create */

static int check_backend_(const run_spec *spec, char *err, size_t errlen)
{
    if (spec->device.backend == BACKEND_CPU)
        return 0;
#ifdef M6_HAVE_CUDA
    return backend_cuda_check(&spec->model, err, errlen);
#else
    snprintf(err, errlen, "device.backend: 'cuda': this m6d was built "
             "without CUDA");
    return -1;
#endif
}

/* Open one data split (key "data.train" or "data.val") and check it holds
 * more than one window of seq_len+1 tokens. 0, or -1 with err naming key,
 * or TOKEN_SET_ENOFILE (out of file descriptors; the data may be fine). */
static int open_split_(token_set *ts, const char *key, const char *glob,
                       const run_spec *spec, m6_err *err)
{
    int rc = token_set_open(ts, glob, spec->model.vocab_size, err);
    if (rc != 0) {
        m6_err_prefix(err, key);
        return rc == TOKEN_SET_ENOFILE ? rc : -1;
    }
    if (ts->total < (size_t)spec->model.seq_len + 2) {
        m6_err_set(err, M6_EDATA,
                   "%s: %zu tokens, need more than seq_len+1 = %lld", key,
                   ts->total, (long long)spec->model.seq_len + 1);
        token_set_close(ts);
        return -1;
    }
    return 0;
}

/* pseudo.grad_scale mean on cuda: gpt_cuda divides resident slots'
 * gradients only (an offloaded slot's is accumulated, and may be updated
 * speculatively, on its host threads), so the pseudo phase's plan must
 * keep every slot resident. plan: the run's (NULL without a budget). */
static int check_grad_scale_(const run_spec *spec, const offload_plan *plan,
                             m6_err *err)
{
    if (spec->pseudo.grad_scale != GRAD_SCALE_MEAN ||
        spec->device.backend != BACKEND_CUDA || !plan ||
        spec->pseudo.steps == 0 ||
        spec->pseudo.share_groups >= spec->model.n_layer)
        return 0;
    const offload_plan *p = plan->pseudo ? plan->pseudo : plan;
    if (p->n_offloaded == 0)
        return 0;
    m6_err_set(err, M6_EINVALID, "pseudo.grad_scale: \"mean\" on "
               "device.backend \"cuda\" needs every slot of the pseudo model "
               "resident, but device.memory_budget offloads %d of its %d "
               "slots; raise the budget, or use \"sum\"", p->n_offloaded,
               p->n_slots);
    return -1;
}

/* check_backend_ with its message in *err (M6_EINVALID). */
static int check_backend_err_(const run_spec *spec, m6_err *err)
{
    char e2[1024];  /* the backend's and the model's words: no paths */
    if (check_backend_(spec, e2, sizeof e2) == 0)
        return 0;
    m6_err_set(err, M6_EINVALID, "%s", e2);
    return -1;
}

int trainer_check_spec(const run_spec *spec, m6_err *err)
{
    if (check_backend_err_(spec, err) != 0)
        return -1;
    token_set ts;
    int rc = open_split_(&ts, "data.train", spec->data.train, spec, err);
    if (rc == 0) {
        token_set_close(&ts);
        rc = open_split_(&ts, "data.val", spec->data.val, spec, err);
    }
    if (rc != 0)
        return rc == TOKEN_SET_ENOFILE ? TRAINER_ENOFILE : -1;
    token_set_close(&ts);
    if (spec->init.from[0]) {  /* init.from: present, shapes match */
        init_src src;
        if (init_from_open(spec, &src, err) != 0)
            return -1;
        init_from_close(&src);
    }
    char e2[768];
    /* the memory plan must fit (the budget, and host memory: all of it on
     * the CPU backend); pinning failure is only a warning here (the host
     * pool says so again when it allocates) */
    char warn[512];
    offload_plan plan;
    if (offload_check(spec, 0, 0, &plan, warn, sizeof warn, e2, sizeof e2) != 0) {
        m6_err_set(err, M6_EINVALID, "%s%s",
                   spec->device.memory_budget > 0 ? "device.memory_budget: "
                                                  : "", e2);
        return -1;
    }
    int rc2 = check_grad_scale_(spec, spec->device.memory_budget > 0 ? &plan
                                                                     : NULL,
                                err);
    offload_plan_free(&plan);
    return rc2;
}

static int collect_tensors_(const trainer *t, backend_buf b,
                            const char *prefix, st_tensor *out, char **names);
static int ckpt_count_(const trainer *t);

/* init.from (ckpt/init_from.h): the weights of the spec's directory into
 * the new model, checked first; the optimizer stays fresh. A run taken up
 * again from its own checkpoint loads that over them. 0, or -1 with err. */
static int init_from_load_(trainer *t, m6_err *err)
{
    init_src src;
    if (init_from_open(&t->spec, &src, err) != 0)
        return -1;
    const backend_iface *be = t->be.iface;
    /* the checkpoint's tensors: an MoE slot has 8 + 2k + 4E */
    int per = ckpt_count_(t), rc = 0;
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per, sizeof *names);
    if (!ts || !names || be->state_begin(t->be.ctx, 1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "init.from: out of memory");
        free(ts);
        free(names);
        init_from_close(&src);
        return -1;
    }
    int n = collect_tensors_(t, BACKEND_PARAMS, "", ts, names);
    char e2[256];
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)ts[i].shape[0] *
                       (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
        if (rc == 0 && safetensors_get(&src.sf, ts[i].name, (float *)ts[i].data,
                                       numel, e2, sizeof e2) != 0) {
            m6_err_set(err, M6_EINVALID, "init.from: %s: %s", t->spec.init.from, e2);
            rc = -1;
        }
        free(names[i]);
    }
    if (be->state_end(t->be.ctx, rc == 0) != 0 && rc == 0) {
        m6_err_set(err, M6_EINTERNAL, "init.from: cannot store the weights "
                   "in the %s model", be->name);
        rc = -1;
    }
    free(names);
    free(ts);
    init_from_close(&src);
    return rc;
}

/* trainer_create, and with data_rc (not NULL) trainer_create_resumable:
 * a split that cannot be opened is then reported in *data_rc and err, and
 * the trainer built without it.
 *
 * Setting up reads in one direction: the spec (checked: a backend that can
 * run it), then the memory plan, computed once here; then the data; then
 * the backend, built from the plan (backend_setup: the backends never see
 * the spec), which allocates the model and draws its weights. */
static trainer *create_(const run_spec *spec, int *data_rc, m6_err *err)
{
    m6_err data_err = M6_ERR_NONE;
    char e1[1024];  /* the backend's words: no paths */
    if (data_rc)
        *data_rc = 0;
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return NULL;
    }
    t->spec = *spec;
    t->delink_step = -1;
    t->world = 1;
    t->B_rank = spec->train.batch_size;
    t->accum_rank = spec->train.grad_accum;
    t->bucket_floats = DEFAULT_BUCKET_FLOATS;
    const char *ov = getenv("M6_DP_OVERLAP");
    t->dp_overlap = !(ov && strcmp(ov, "0") == 0);
    /* 1. the spec: a backend that can run it */
    if (check_backend_err_(spec, err) != 0) {
        free(t);
        return NULL;
    }
    /* OpenMP threads run the kernels; each GEMM block runs single-threaded
     * OpenBLAS inside them (kernels/cpu/matmul.c). */
    /* The spec's count, else OMP_NUM_THREADS, else the CPUs this process
     * may use (its affinity mask capped by its cgroup's CPU quota,
     * common/cpus.h: a quota of 1.5 CPUs must not get one thread per core
     * spinning against it), never more than 1024: libgomp crashes the
     * process when it cannot create the threads it was told to. */
    int nt = spec->device.threads > 0 ? spec->device.threads
             : getenv("OMP_NUM_THREADS") ? omp_get_max_threads()
                                         : cpus_available();
    omp_set_num_threads(nt > 1024 ? 1024 : nt);
    const model_config *mc = &spec->model;
    int T = mc->seq_len, B = spec->train.batch_size;
    t->phase = spec->pseudo.steps > 0 ? PHASE_PSEUDO : PHASE_REAL;
    gpt_layout(mc, t->glob, t->slot, &t->n_global, &t->slot_size);
    /* 2. the plan, once: the Real phase and, with one, the Pseudo phase */
    /* offload.speculative auto: decided once, on the host memory now */
    size_t host_limit = spec->device.memory_budget > 0
                            ? offload_host_available() : 0;
    if (spec->device.memory_budget > 0) {
        char e2[768];
        if (offload_plan_for_run(spec, 0, host_limit, &t->plan, e2,
                                 sizeof e2) != 0) {
            m6_err_set(err, M6_EINVALID, "device.memory_budget: %s", e2);
            goto fail;
        }
        t->planned = 1;
        if (check_grad_scale_(spec, &t->plan, err) != 0)
            goto fail;
    }
    /* 3. the data */
    int orc = open_split_(&t->train, "data.train", spec->data.train, spec,
                          &data_err);
    if (orc == 0)
        orc = open_split_(&t->val, "data.val", spec->data.val, spec,
                          &data_err);
    if (orc != 0) {
        if (!data_rc) {
            m6_err_free(err);
            *err = data_err;
            data_err = M6_ERR_NONE;
            goto fail;
        }
        *data_rc = orc == TOKEN_SET_ENOFILE ? TRAINER_ENOFILE : TRAINER_EDATA;
    }
    t->data_total[0] = t->train.total;
    t->data_total[1] = t->val.total;
    /* 4. the backend from the plan, and the model in it */
    backend_setup bs = {
        .model = *mc,
        .n_global = t->n_global,
        .slot_size = t->slot_size,
        .n_slots = spec_slots_of_phase(spec, t->phase == PHASE_PSEUDO),
        .pseudo = t->phase == PHASE_PSEUDO,
        .batch_size = B,
        .grad_accum = spec->train.grad_accum,
        .seed = spec->train.seed,
        .host_threads = spec_host_threads(spec),
        .plan_in = offload_plan_input_of(spec),
        .plan = t->planned ? &t->plan : NULL,
    };
    /* later plans (re-slotting) follow the start's decision on auto */
    bs.plan_in.host_limit = t->planned && !t->plan.speculative ? 0
                                                               : host_limit;
    int rc;
#ifdef M6_HAVE_CUDA
    if (spec->device.backend == BACKEND_CUDA)
        rc = backend_cuda_create(&t->be, &bs, e1, sizeof e1);
    else
#endif
        rc = backend_cpu_create(&t->be, &bs, e1, sizeof e1);
    if (rc != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s", e1);
        goto fail;
    }
    if (spec->init.from[0]) {
        m6_err ie = M6_ERR_NONE;
        if (init_from_load_(t, &ie) != 0) {
            if (!data_rc) {  /* a new run: refused */
                m6_err_free(err);
                *err = ie;
                goto fail;
            }
            /* a run taken up again: its own checkpoint replaces the
             * weights; without one it must not train (trainer_init_error) */
            t->init_error = strdup(m6_err_msg(&ie));
            m6_err_free(&ie);
            if (!t->init_error) {
                m6_err_set(err, M6_EINTERNAL, "out of memory");
                goto fail;
            }
        }
    }
    t->data_rng = spec->train.seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
    if (!t->data_rng)
        t->data_rng = 1;
    t->inp = malloc((size_t)B * T * sizeof(int32_t));
    t->tgt = malloc((size_t)B * T * sizeof(int32_t));
    t->rows = malloc((size_t)spec->train.grad_accum * B * ((size_t)T + 1) *
                     sizeof(uint16_t));
    t->win_pos = malloc((size_t)spec->train.grad_accum * B * sizeof(size_t));
    if (!t->inp || !t->tgt || !t->rows || !t->win_pos) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto fail;
    }
    if (data_rc && *data_rc) {
        m6_err_free(err);
        *err = data_err;
    }
    const char *fault = getenv("M6_TEST_FAULT");
    if (fault && fault[0] &&
        trainer_test_fault_parse(fault, &t->fault, &t->fault_first,
                                 &t->fault_count, &t->fault_slot) != 0)
        t->fault = TRAINER_FAULT_NONE;
    return t;
fail:
    m6_err_free(&data_err);
    trainer_free(t);
    if (data_rc)
        *data_rc = 0;
    return NULL;
}

trainer *trainer_create(const run_spec *spec, m6_err *err)
{
    return create_(spec, NULL, err);
}

trainer *trainer_create_resumable(const run_spec *spec, int *data_rc,
                                  m6_err *err)
{
    return create_(spec, data_rc, err);
}

void trainer_free(trainer *t)
{
    if (!t)
        return;
    if (t->be.iface)
        t->be.iface->free(t->be.ctx);
    token_set_close(&t->train);
    token_set_close(&t->val);
    offload_plan_free(&t->plan);
    free(t->inp);
    free(t->tgt);
    free(t->rows);
    free(t->init_error);
    free(t->bucket);
    free(t->dp_ready);
    free(t->dp_start);
    if (t->dp_sync) {
        pthread_mutex_destroy(&t->dp_mu);
        pthread_cond_destroy(&t->dp_cv);
    }
    free(t->win_pos);
    m6_coll_destroy(t->gcoll);
    free(t);
}

const char *trainer_init_error(const trainer *t)
{
    return t->init_error;
}

/* ------------------------------------------------------------- batches */

/* Batches are read from the shard files (token_set_read), which may fail
 * when a shard is truncated or rewritten while the run uses it: a step
 * reads every window it needs before it touches the model, so a failed
 * read leaves the trainer as it was and the step can be retried. */

/* Inputs and targets of microbatch k from its B windows (B: the spec's
 * batch_size, or a data-parallel rank's share) of T+1 tokens in
 * t->rows: row b holds tokens [pos, pos+T] of the set. */
static void rows_to_batch_(trainer *t, int k, int B)
{
    int T = t->spec.model.seq_len;
    const uint16_t *w = t->rows + (size_t)k * B * ((size_t)T + 1);
    for (int b = 0; b < B; b++, w += T + 1) {
        int32_t *in = t->inp + (size_t)b * T, *tg = t->tgt + (size_t)b * T;
        for (int j = 0; j < T; j++) {
            in[j] = w[j];
            tg[j] = w[j + 1];
        }
    }
}

/* 1 when split ts is open; else 0 with err: a split that could not be
 * opened (trainer_create_resumable, a failed trainer_reopen_data) */
static int split_open_(const token_set *ts, const char *key, m6_err *err)
{
    if (ts->n_shards > 0)
        return 1;
    m6_err_set(err, M6_EDATA, "%s: not open (it could not be opened; "
               "trainer_reopen_data opens it)", key);
    return 0;
}

/* The training windows of one step: grad_accum*B windows at uniformly
 * random offsets, drawn in microbatch order. On failure the sampler is
 * rewound: the retried step draws the same windows. A data-parallel rank
 * draws every window's position (its sampler stays the one-node sampler)
 * and reads only its share, [rank*n/W, (rank+1)*n/W). */
static int read_step_batches_(trainer *t, m6_err *err)
{
    int T = t->spec.model.seq_len;
    size_t n = (size_t)t->spec.train.grad_accum * t->spec.train.batch_size;
    size_t lo = n / (size_t)t->world * (size_t)t->rank;
    size_t hi = lo + n / (size_t)t->world;
    if (!split_open_(&t->train, "data.train", err))
        return TRAINER_EDATA;
    size_t span = t->train.total - (size_t)T - 1;
    uint64_t rng0 = t->data_rng;
    t->n_win = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pos = rng_next_(&t->data_rng) % span;
        if (i < lo || i >= hi)
            continue;
        t->win_pos[t->n_win++] = pos;
        if (token_set_read(&t->train, pos,
                           t->rows + (i - lo) * ((size_t)T + 1),
                           (size_t)T + 1, err) != 0) {
            m6_err_prefix(err, "data.train");
            t->data_rng = rng0;
            return TRAINER_EDATA;
        }
    }
    return 0;
}

/* Validation batch i into inp/tgt: fixed, consecutive windows (the same
 * every eval). */
static int val_batch_(trainer *t, int i, m6_err *err)
{
    int B = t->spec.train.batch_size, T = t->spec.model.seq_len;
    if (!split_open_(&t->val, "data.val", err))
        return TRAINER_EDATA;
    size_t span = t->val.total - (size_t)T - 1;
    for (int b = 0; b < B; b++)
        if (token_set_read(&t->val, ((size_t)i * B + b) * T % span,
                           t->rows + (size_t)b * (T + 1), (size_t)T + 1,
                           err) != 0) {
            m6_err_prefix(err, "data.val");
            return TRAINER_EDATA;
        }
    rows_to_batch_(t, 0, t->spec.train.batch_size);
    return 0;
}

/* ------------------------------------------------------------- schedule */

/* Learning rate for 0-based step s: linear warmup to lr over warmup_steps,
 * cosine decay to min_lr at train.steps (Loshchilov & Hutter 2017, SGDR
 * without restarts); in the pseudo phase times pseudo.lr_scale; after
 * delink, optionally scaled by a linear re-warmup over
 * delink.rewarm_steps. */
static float lr_at_(const trainer *t, long s)
{
    const run_spec *sp = &t->spec;
    double lr;
    long W = sp->train.warmup_steps, N = sp->train.steps;
    if (s < W) {
        lr = sp->train.lr * (double)(s + 1) / (double)W;
    } else {
        double p = N > W ? (double)(s - W) / (double)(N - W) : 1.0;
        if (p > 1.0)
            p = 1.0;
        lr = sp->train.min_lr +
             0.5 * (1.0 + cos(M_PI * p)) * (sp->train.lr - sp->train.min_lr);
    }
    if (t->phase == PHASE_PSEUDO)
        lr *= sp->pseudo.lr_scale;
    long R = sp->delink.rewarm_steps;
    if (t->delink_step >= 0 && R > 0 && s - t->delink_step < R)
        lr *= (double)(s - t->delink_step + 1) / (double)R;
    return (float)lr;
}

/* ------------------------------------------------------------- step */

/* The test fault armed for 1-based step `step`, TRAINER_FAULT_NONE none. */
static trainer_fault fault_at_(const trainer *t, long step)
{
    if (t->fault == TRAINER_FAULT_NONE || step < t->fault_first ||
        step - t->fault_first >= t->fault_count)
        return TRAINER_FAULT_NONE;
    return t->fault;
}

void trainer_test_fault(trainer *t, trainer_fault kind, long first,
                        long count, int slot)
{
    t->fault = kind;
    t->fault_first = first;
    t->fault_count = count;
    t->fault_slot = slot;
}

int trainer_test_fault_parse(const char *text, trainer_fault *kind,
                             long *first, long *count, int *slot)
{
    const char *at = strchr(text, '@');
    if (!at)
        return -1;
    size_t n = (size_t)(at - text);
    if (n == 9 && strncmp(text, "nan_batch", n) == 0)
        *kind = TRAINER_FAULT_NAN_BATCH;
    else if (n == 8 && strncmp(text, "inf_grad", n) == 0)
        *kind = TRAINER_FAULT_INF_GRAD;
    else
        return -1;
    char *end;
    errno = 0;
    *first = strtol(at + 1, &end, 10);
    if (end == at + 1 || errno || *first < 1)
        return -1;
    *count = 1;
    *slot = 0;
    if (*end == 'x') {
        const char *p = end + 1;
        *count = strtol(p, &end, 10);
        if (end == p || *count < 1)
            return -1;
    }
    if (*end == '/') {
        const char *p = end + 1;
        long s = strtol(p, &end, 10);
        if (end == p || s < 0 || s > INT_MAX)
            return -1;
        *slot = (int)s;
    }
    return *end ? -1 : 0;
}

int trainer_step_evaluates(const trainer *t, long step)
{
    long ev = t->spec.train.eval_every;
    return (ev > 0 && step % ev == 0) || step == t->spec.train.steps;
}

/* Device bytes of the current phase's plan without a budget (the
 * planner's peak: globals and slots with their gradients and AdamW
 * moments, plus activations). Planned once per trainer; 0 if the planner
 * refuses the spec (logged by nobody: trainer_check_spec has passed it). */
static size_t plan_peak_(trainer *t)
{
    if (!t->peak_planned) {
        run_spec unlimited = t->spec;
        offload_plan p;
        char err[512];
        unlimited.device.memory_budget = 0;
        if (offload_plan_for_spec(&unlimited, 0, &p, err, sizeof err) == 0) {
            t->plan_peak[1] = p.peak_device_bytes;
            t->plan_peak[0] = p.pseudo ? p.pseudo->peak_device_bytes
                                       : p.peak_device_bytes;
            offload_plan_free(&p);
        }
        t->peak_planned = 1;
    }
    return t->plan_peak[t->phase == PHASE_REAL];
}

/* The placement now into p; with before (the counters at the step's
 * start; NULL: outside a step) the copies since then, as rates. */
static void placement_(trainer *t, const offload_stats *before,
                       step_placement *p)
{
    offload_stats st;
    memset(p, 0, sizeof *p);
    p->h2d_gbps = p->d2h_gbps = p->copy_hidden_fraction = NAN;
    if (trainer_offload_stats(t, &st) != 0) {
        p->resident_slots = st.n_slots;
        p->device_bytes = p->peak_device_bytes = (int64_t)plan_peak_(t);
        return;
    }
    p->resident_slots = st.n_resident;
    p->offloaded_slots = st.n_offloaded;
    p->device_bytes = (int64_t)st.device.in_use;
    p->peak_device_bytes = (int64_t)st.device.peak;
    p->budget_bytes = (int64_t)st.budget_bytes;
    p->speculative = st.speculative;
    p->redo_steps = st.redo_steps;
    if (!before) return;
    p->redone = st.redo_steps > before->redo_steps;
    p->h2d_bytes = st.h2d_bytes - before->h2d_bytes;
    p->d2h_bytes = st.d2h_bytes - before->d2h_bytes;
    p->h2d_s = st.h2d_s - before->h2d_s;
    p->d2h_s = st.d2h_s - before->d2h_s;
    p->stall_s = st.stall_s - before->stall_s;
    if (p->h2d_bytes > 0 && p->h2d_s > 0)
        p->h2d_gbps = (double)p->h2d_bytes / p->h2d_s / 1e9;
    if (p->d2h_bytes > 0 && p->d2h_s > 0)
        p->d2h_gbps = (double)p->d2h_bytes / p->d2h_s / 1e9;
    double copy_s = p->h2d_s + p->d2h_s;
    if (copy_s > 0) {
        double h = 1.0 - p->stall_s / copy_s;
        p->copy_hidden_fraction = h < 0 ? 0 : h > 1 ? 1 : h;
    }
}

void trainer_placement(trainer *t, step_placement *p)
{
    placement_(t, NULL, p);
}

/* The router sums of all W ranks' microbatches: each rank's nine sums and
 * two extremes, as exact float pairs (hi, lo = x - hi) in the rank's own
 * columns of one all-reduce, so every element is one rank's value plus
 * zeros and arrives unrounded; then added in double in rank order. *st is
 * this rank's on entry, the group's on return. 0, or -1 with err. */
#define MOE_FIELDS_ 11
static int moe_gather_(trainer *t, gpt_moe_stats *st, m6_err *err)
{
    int W = t->world;
    size_t n = (size_t)W * MOE_FIELDS_ * 2;
    float *v = calloc(n, sizeof(float));
    if (!v) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (MoE figures)");
        return -1;
    }
    double mine[MOE_FIELDS_] = {
        st->aux_sum, st->z_sum, (double)st->layers, (double)st->dropped,
        (double)st->pairs, st->load_sum, st->load_sumsq, (double)st->load_n,
        (double)st->empty, (double)st->load_min, (double)st->load_max};
    float *row = v + (size_t)t->rank * MOE_FIELDS_ * 2;
    for (int f = 0; f < MOE_FIELDS_; f++) {
        row[2 * f] = (float)mine[f];
        row[2 * f + 1] = (float)(mine[f] - (double)row[2 * f]);
    }
    if (m6_coll_allreduce_sum(t->coll, v, n, err) != 0) {
        free(v);
        return -1;
    }
    double sum[MOE_FIELDS_] = {0}, lo = INFINITY, hi = 0;
    for (int r = 0; r < W; r++) {
        const float *q = v + (size_t)r * MOE_FIELDS_ * 2;
        double x[MOE_FIELDS_];
        for (int f = 0; f < MOE_FIELDS_; f++)
            x[f] = (double)q[2 * f] + (double)q[2 * f + 1];
        for (int f = 0; f < 9; f++)
            sum[f] += x[f];
        if (x[7] > 0) {  /* a rank with MoE passes: its extremes count */
            lo = x[9] < lo ? x[9] : lo;
            hi = x[10] > hi ? x[10] : hi;
        }
    }
    free(v);
    st->aux_sum = sum[0];
    st->z_sum = sum[1];
    st->layers = (long)sum[2];
    st->dropped = (long)sum[3];
    st->pairs = (long)sum[4];
    st->load_sum = sum[5];
    st->load_sumsq = sum[6];
    st->load_n = (long)sum[7];
    st->empty = (long)sum[8];
    st->load_min = isfinite(lo) ? (long)lo : 0;
    st->load_max = (long)hi;
    return 0;
}

/* The step's MoE facts from the backend's sums (gpt_moe_stats), over every
 * rank's microbatches when data-parallel. 0, or -1 with err (the
 * collective's). */
static int moe_facts_(trainer *t, step_moe *m, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    gpt_moe_stats st;
    memset(m, 0, sizeof *m);
    if (!be->moe_stats || be->moe_stats(t->be.ctx, &st) != 0)
        return 0;
    if (t->world > 1 && moe_gather_(t, &st, err) != 0)
        return -1;
    if (st.layers == 0 || st.load_n == 0)
        return 0;
    m->present = 1;
    m->aux_loss = st.aux_sum / (double)st.layers;
    m->z_loss = st.z_sum / (double)st.layers;
    m->dropped_fraction = st.pairs ? (double)st.dropped / (double)st.pairs : 0;
    m->load_min = (double)st.load_min;
    m->load_max = (double)st.load_max;
    double mean = st.load_sum / (double)st.load_n;
    double var = st.load_sumsq / (double)st.load_n - mean * mean;
    m->load_cv = mean > 0 ? sqrt(var > 0 ? var : 0) / mean : 0;
    m->experts_empty = (double)st.empty / (double)st.layers;
    return 0;
}

/* ------------------------------------------------------------- data parallel */

/* Whether any rank failed (failed: this one did), by an all-reduce of the
 * count: 1 some rank failed (err says why: this rank's own error, or that
 * another's read of key failed), 0 none, -1 the collective failed (err). */
static int agree_(trainer *t, int failed, const char *key, m6_err *err)
{
    float f = failed ? 1.0f : 0.0f;
    m6_err e2 = M6_ERR_NONE;
    if (m6_coll_allreduce_sum(t->coll, &f, 1, &e2) != 0) {
        m6_err_free(err);
        *err = e2;
        return -1;
    }
    if (f > 0 && !failed)
        m6_err_set(err, M6_EDATA, "%s: %g of %d ranks could not read their "
                   "share of the batch (this rank could)", key, (double)f,
                   t->world);
    return f > 0;
}

static unsigned char *slot_kinds_(const trainer *t);

/* Floats of one slot of each kind ([0] dense, [1] MoE): a mixed model's
 * dense slots are smaller than its MoE slots (gpt.h "MoE blocks"). */
static void kind_floats_(const trainer *t, size_t sz[2])
{
    gpt_tensor tab[SLOT_NTENSORS_MAX];
    sz[0] = sz[1] = t->slot_size;
    for (int k = 0; k < 2; k++)
        if (k == 0 || t->spec.model.moe_experts > 0)
            gpt_slot_layout(&t->spec.model, k, tab, &sz[k]);
}

/* The virtual gradient vector all-reduced each step:
 *     [loss | globals | slot 0 | ... | slot S-1]
 * region 0 the step's loss sum (1 float), region 1 the globals' gradient
 * (n_global), region 2+s slot s's (its kind's size), cut into buckets of
 * bucket_floats from its start. dp_layout_ sets the regions' starts for
 * the current slots (once per step: a delink changes them); 0, or -1 out
 * of memory. Then its length, the region holding element x, and the
 * first element of region r: */
static int dp_layout_(trainer *t)
{
    int S = n_slots_(t), n = S + 3;
    size_t *st = t->dp_nstart >= n ? t->dp_start
                                   : realloc(t->dp_start, (size_t)n *
                                                          sizeof(size_t));
    unsigned char *kind = slot_kinds_(t);
    if (!st || !kind) {
        free(kind);
        return -1;
    }
    t->dp_start = st;
    t->dp_nstart = n;
    size_t sz[2];
    kind_floats_(t, sz);
    st[0] = 0;
    st[1] = 1;
    st[2] = 1 + t->n_global;
    for (int s = 0; s < S; s++)
        st[3 + s] = st[2 + s] + sz[kind[s]];
    free(kind);
    return 0;
}

static size_t dp_total_(const trainer *t)
{
    return t->dp_start[n_slots_(t) + 2];
}

static int dp_region_of_(const trainer *t, size_t x)
{
    int r = 0;
    while (r + 1 < n_slots_(t) + 2 && t->dp_start[r + 1] <= x)
        r++;
    return r;
}

static size_t dp_region_start_(const trainer *t, int r)
{
    return t->dp_start[r];
}

/* Copy elements [start, start+len) of the virtual vector into buf (out 1)
 * or back from it (out 0); loss is region 0. */
static void grad_span_(trainer *t, size_t start, size_t len, float *buf,
                       float *loss, int out)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    size_t base = 0, end = start + len;
    for (int r = 0; r < S + 2 && start < end; r++) {
        size_t rlen = t->dp_start[r + 1] - t->dp_start[r];
        float *reg = r == 0 ? loss : be->grad_region(t->be.ctx, r - 2);
        if (start < base + rlen) {
            size_t off = start - base;
            size_t k = rlen - off < end - start ? rlen - off : end - start;
            if (out)
                memcpy(buf, reg + off, k * sizeof(float));
            else
                memcpy(reg + off, buf, k * sizeof(float));
            buf += k;
            start += k;
        }
        base += rlen;
    }
}

/* Sum the virtual vector over the ranks (*loss its region 0): one
 * all-reduce per bucket, the last bucket first and the first (the loss
 * and the globals) last, so the order is fixed, and backward's order
 * (the last layers' slots are final first). wait 1 (the communication
 * thread): each bucket waits until dp_ready says its regions are final.
 * Each bucket is the same all-reduce whether overlapped or not: the sums
 * are the same bits. 0, or -1 with err (the collective's). */
static int reduce_buckets_(trainer *t, float *loss, int wait, m6_err *err)
{
    size_t total = dp_total_(t), bf = t->bucket_floats;
    size_t nb = (total + bf - 1) / bf;
    for (size_t b = nb; b-- > 0;) {
        size_t start = b * bf;
        size_t len = total - start < bf ? total - start : bf;
        if (wait) {
            int r0 = dp_region_of_(t, start);
            int r1 = dp_region_of_(t, start + len - 1);
            pthread_mutex_lock(&t->dp_mu);
            for (int r = r0; r <= r1; r++)
                while (!t->dp_ready[r])
                    pthread_cond_wait(&t->dp_cv, &t->dp_mu);
            t->dp_early += !t->dp_mb_done;
            t->dp_buckets++;
            pthread_mutex_unlock(&t->dp_mu);
        }
        grad_span_(t, start, len, t->bucket, loss, 1);
        if (m6_coll_allreduce_sum(t->coll, t->bucket, len, err) != 0)
            return -1;
        grad_span_(t, start, len, t->bucket, loss, 0);
        /* a slot starting in this bucket is summed now (its later
         * buckets went before): the backend may start on it */
        if (t->be.iface->grad_summed)
            for (int r = dp_region_of_(t, start + len - 1);
                 r >= 2 && dp_region_start_(t, r) >= start; r--)
                t->be.iface->grad_summed(t->be.ctx, r - 2);
    }
    return 0;
}

/* Sum the step's gradient and *loss_sum over the ranks, after the
 * microbatches (no overlap). 0, or -1 with err. */
static int allreduce_grads_(trainer *t, double *loss_sum, m6_err *err)
{
    float loss = (float)*loss_sum;
    if (reduce_buckets_(t, &loss, 0, err) != 0)
        return -1;
    *loss_sum = loss;
    return 0;
}

/* The step's gradient and *loss_sum over the ranks with a device-memory
 * group (trainer_adopt_grad_group): the loss over the host group, the
 * backend's device buffer (backend.h device_grads) in place over gcoll,
 * in buckets of bucket_floats, the last bucket first, as reduce_buckets_
 * does. 0, or -1 with err. */
static int allreduce_device_(trainer *t, double *loss_sum, m6_err *err)
{
    float loss = (float)*loss_sum;
    if (m6_coll_allreduce_sum(t->coll, &loss, 1, err) != 0)
        return -1;
    *loss_sum = loss;
    size_t n = 0, bf = t->bucket_floats;
    float *g = t->be.iface->device_grads(t->be.ctx, &n);
    if (!g) {
        m6_err_set(err, M6_EINTERNAL, "the %s backend has no device buffer "
                   "of the step's gradient (out of device memory)",
                   t->be.iface->name);
        return -1;
    }
    for (size_t b = (n + bf - 1) / bf; b-- > 0;) {
        size_t start = b * bf, len = n - start < bf ? n - start : bf;
        if (m6_coll_allreduce_sum(t->gcoll, g + start, len, err) != 0)
            return -1;
    }
    return 0;
}

/* The backend's report (backend.h data_parallel): slot s's gradient is
 * final. From the training thread or a backend thread. */
static void dp_ready_(void *ctx, int s)
{
    trainer *t = ctx;
    pthread_mutex_lock(&t->dp_mu);
    if (t->dp_active && s >= 0 && s + 2 < t->dp_nreg && !t->dp_ready[s + 2]) {
        t->dp_ready[s + 2] = 1;
        t->dp_reported++;
        pthread_cond_broadcast(&t->dp_cv);
    }
    pthread_mutex_unlock(&t->dp_mu);
}

static void *dp_comm_main_(void *arg)
{
    trainer *t = arg;
    m6_err e = M6_ERR_NONE;
    /* region 0, dp_loss, is read once dp_ready[0] says it is set */
    int rc = reduce_buckets_(t, &t->dp_loss, 1, &e);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_rc = rc;
    t->dp_err = e;
    pthread_mutex_unlock(&t->dp_mu);
    return NULL;
}

/* Start the step's communication thread, before its last microbatch: 1
 * started, 0 not (out of memory, no thread: the step all-reduces after
 * the microbatches instead). */
static int dp_overlap_start_(trainer *t, pthread_t *th)
{
    int nreg = n_slots_(t) + 2;
    unsigned char *r = realloc(t->dp_ready, (size_t)nreg);
    if (!r)
        return 0;
    memset(r, 0, (size_t)nreg);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_ready = r;
    t->dp_nreg = nreg;
    t->dp_rc = 0;
    t->dp_loss = 0;
    t->dp_active = 1;
    t->dp_mb_done = 0;
    t->dp_reported = t->dp_early = t->dp_buckets = 0;
    pthread_mutex_unlock(&t->dp_mu);
    if (pthread_create(th, NULL, dp_comm_main_, t) != 0) {
        pthread_mutex_lock(&t->dp_mu);
        t->dp_active = 0;
        pthread_mutex_unlock(&t->dp_mu);
        return 0;
    }
    return 1;
}

/* After the last microbatch: every region is final now (the loss sum
 * too); wait for the thread's last buckets. 0, or -1 with err. */
static int dp_overlap_finish_(trainer *t, pthread_t th, double *loss_sum,
                              m6_err *err)
{
    pthread_mutex_lock(&t->dp_mu);
    t->dp_loss = (float)*loss_sum;
    t->dp_mb_done = 1;
    memset(t->dp_ready, 1, (size_t)t->dp_nreg);
    pthread_cond_broadcast(&t->dp_cv);
    pthread_mutex_unlock(&t->dp_mu);
    pthread_join(th, NULL);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_active = 0;
    int rc = t->dp_rc;
    m6_err e = t->dp_err;
    t->dp_err = M6_ERR_NONE;
    pthread_mutex_unlock(&t->dp_mu);
    if (rc != 0) {
        m6_err_free(err);
        *err = e;
        return -1;
    }
    *loss_sum = t->dp_loss;
    return 0;
}

/* Validation on W ranks: rank r the spec's batches r, r+W, ...; the sums
 * (and a count of ranks whose read failed) all-reduced. */
static int eval_dp_(trainer *t, float *loss, m6_err *err)
{
    int n = t->spec.train.eval_batches, failed = 0;
    double sum = 0;
    for (int i = t->rank; i < n && !failed; i += t->world) {
        if (val_batch_(t, i, err) != 0)
            failed = 1;
        else
            sum += t->be.iface->loss(t->be.ctx, t->inp, t->tgt,
                                     t->spec.train.batch_size);
    }
    float v[2] = {(float)sum, failed ? 1.0f : 0.0f};
    m6_err e2 = M6_ERR_NONE;
    if (m6_coll_allreduce_sum(t->coll, v, 2, &e2) != 0) {
        m6_err_free(err);
        *err = e2;
        return TRAINER_ECOLL;
    }
    if (v[1] > 0) {
        if (!failed)
            m6_err_set(err, M6_EDATA, "data.val: %g of %d ranks could not "
                       "read their validation batches (this rank could)",
                       (double)v[1], t->world);
        return TRAINER_EDATA;
    }
    *loss = (float)((double)v[0] / n);
    return 0;
}

/* Tell the backend how the gradient is summed (world > 1): after
 * microbatch accum_rank-1, with per-slot reports when overlapping. */
static void dp_backend_(trainer *t)
{
    const backend_iface *be = t->be.iface;
    if (!be->data_parallel)
        return;
    if (t->world > 1)
        be->data_parallel(t->be.ctx, t->accum_rank,
                          t->dp_overlap ? dp_ready_ : NULL, t);
    else
        be->data_parallel(t->be.ctx, 0, NULL, NULL);
}

/* trainer_adopt_grad_group; any_memory 1 (test_hooks.h): a group of
 * host memory too. */
static int adopt_(trainer *t, m6_coll *dev, int any_memory, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int mem_ok = dev && (any_memory || m6_coll_device_buffers(dev));
    if (!dev || !mem_ok || !be->dp_device || !be->device_grads) {
        if (dev)
            m6_err_set(err, M6_EINVALID, "collectives: %s",
                       !mem_ok
                           ? "a gradient group must reduce device memory "
                             "(nccl); a host group is trainer_set_collectives'"
                           : "the backend's gradients are not in device "
                             "memory (use gloo)");
        else
            m6_err_set(err, M6_EINVALID, "collectives: no group");
        m6_coll_destroy(dev);
        return -1;
    }
    m6_coll_destroy(t->gcoll);
    t->gcoll = dev;
    return 0;
}

int trainer_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err)
{
    return adopt_(t, dev, 0, err);
}

int trainer_test_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err)
{
    return adopt_(t, dev, 1, err);
}

int trainer_set_collectives(trainer *t, m6_coll *c, m6_err *err)
{
    int W = c ? m6_coll_world_size(c) : 1, B_r, A_r;
    int pseudo = t->phase == PHASE_PSEUDO;
    int want = spec_world_of_phase(&t->spec, pseudo);
    if (W != want) {
        m6_err_set(err, M6_EINVALID, "collectives: a group of %d rank%s, but "
                   "the spec's %s phase has %s %d", W, W == 1 ? "" : "s",
                   pseudo ? "pseudo" : "real",
                   pseudo && t->spec.nodes.pseudo_world_size > 0
                       ? "nodes.pseudo_world_size" : "nodes.world_size",
                   want);
        return -1;
    }
    const backend_iface *be = t->be.iface;
    if (W > 1) {
        if (m6_coll_device_buffers(c)) {
            m6_err_set(err, M6_EINVALID, "collectives: backend '%s' reduces "
                       "device memory, but the trainer's group carries host "
                       "memory (the loss, the state broadcast; use gloo, "
                       "and trainer_adopt_grad_group for the %s gradients)",
                       m6_coll_backend(c), be->name);
            return -1;
        }
        if (t->gcoll && (m6_coll_world_size(t->gcoll) != W ||
                         m6_coll_rank(t->gcoll) != m6_coll_rank(c))) {
            m6_err_set(err, M6_EINVALID, "collectives: the gradient group is "
                       "rank %d of %d, the host group rank %d of %d",
                       m6_coll_rank(t->gcoll), m6_coll_world_size(t->gcoll),
                       m6_coll_rank(c), W);
            return -1;
        }
        if (!be->data_parallel ||
            (t->gcoll ? !be->device_grads(t->be.ctx, NULL)
                      : !be->grad_region || !be->grad_region(t->be.ctx, -1))) {
            m6_err_set(err, M6_EINVALID, "collectives: the %s backend "
                       "cannot train data-parallel%s", be->name,
                       !be->data_parallel ? ""
                       : t->planned && t->plan.n_offloaded > 0
                           ? " with offloaded slots (device.memory_budget)"
                           : " (out of memory for the gradient's copy)");
            return -1;
        }
        if (spec_dp_split(&t->spec, W, &B_r, &A_r) != 0) {
            m6_err_set(err, M6_EINVALID, "collectives: %d ranks must divide "
                       "train.grad_accum (%d) or train.batch_size (%d)", W,
                       t->spec.train.grad_accum, t->spec.train.batch_size);
            return -1;
        }
        if (!t->bucket &&
            !(t->bucket = malloc(t->bucket_floats * sizeof(float)))) {
            m6_err_set(err, M6_EINTERNAL, "out of memory (all-reduce "
                       "bucket of %zu floats)", t->bucket_floats);
            return -1;
        }
        if (!t->dp_sync) {
            pthread_mutex_init(&t->dp_mu, NULL);
            pthread_cond_init(&t->dp_cv, NULL);
            t->dp_sync = 1;
        }
    } else {
        B_r = t->spec.train.batch_size;
        A_r = t->spec.train.grad_accum;
    }
    if (W <= 1 && t->gcoll) { /* alone: the gradient group goes too */
        m6_coll_destroy(t->gcoll);
        t->gcoll = NULL;
    }
    if (be->dp_device)
        be->dp_device(t->be.ctx, W > 1 && t->gcoll);
    t->coll = c;
    t->world = W;
    t->rank = c ? m6_coll_rank(c) : 0;
    t->B_rank = B_r;
    t->accum_rank = A_r;
    dp_backend_(t);
    return 0;
}

void trainer_set_eval_interrupt(trainer *t, int (*fn)(void *ud), void *ud)
{
    t->eval_stop = fn;
    t->eval_stop_ud = ud;
}

void trainer_set_dp_overlap(trainer *t, int on)
{
    t->dp_overlap = on != 0;
    dp_backend_(t);
}

void trainer_dp_overlap_counts(const trainer *t, long *reported, long *early,
                               long *buckets)
{
    *reported = t->dp_reported;
    *early = t->dp_early;
    *buckets = t->dp_buckets;
}

void trainer_set_bucket_floats(trainer *t, size_t n)
{
    if (n < 1 || n == t->bucket_floats)
        return;
    free(t->bucket);
    t->bucket = NULL;
    t->bucket_floats = n;
    if (t->world > 1 && !(t->bucket = malloc(n * sizeof(float)))) {
        t->bucket_floats = DEFAULT_BUCKET_FLOATS;  /* next try allocates */
        t->bucket = malloc(t->bucket_floats * sizeof(float));
    }
}

size_t trainer_step_windows(const trainer *t, size_t *dst)
{
    if (dst)
        memcpy(dst, t->win_pos, t->n_win * sizeof(size_t));
    return t->n_win;
}

/* What trainer_broadcast_state sends before the tensors. */
typedef struct {
    int64_t step, delink_step;
    uint64_t data_rng;
    int32_t phase, n_slots;
} bcast_head_;

int trainer_broadcast_state(trainer *t, m6_coll *c, int root, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int L = t->spec.model.n_layer, rc = -1;
    if (!c) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: no group");
        return -1;
    }
    if (m6_coll_device_buffers(c)) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: backend '%s' "
                   "moves device memory; the trainer's state regions are "
                   "host memory (use gloo)", m6_coll_backend(c));
        return -1;
    }
    int me = m6_coll_rank(c);
    bcast_head_ h = {t->step, t->delink_step, t->data_rng, (int32_t)t->phase,
                     n_slots_(t)};
    int32_t *map = malloc((size_t)L * sizeof(int32_t));
    int *imap = malloc((size_t)L * sizeof(int)), *src = NULL;
    long *steps = NULL;
    if (!map || !imap) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    const int *om = be->slot_of(t->be.ctx);
    for (int l = 0; l < L; l++)
        map[l] = om[l];
    if (m6_coll_broadcast(c, &h, sizeof h, root, err) != 0 ||
        m6_coll_broadcast(c, map, (size_t)L * sizeof(int32_t), root, err) != 0) {
        rc = TRAINER_ECOLL;
        goto out;
    }
    /* the receiver takes root's share map first (values overwritten) */
    int S = h.n_slots, same = S == n_slots_(t);
    for (int l = 0; l < L; l++) {
        imap[l] = map[l];
        same = same && om[l] == map[l];
    }
    if (me != root && !same) {
        char e2[512];
        src = calloc((size_t)S, sizeof(int));
        if (!src || be->reslot(t->be.ctx, S, imap, src, 1, e2,
                               sizeof e2) != 0) {
            m6_err_set(err, M6_EINTERNAL, "broadcast of the state: %s",
                       src ? e2 : "out of memory");
            goto out;
        }
    }
    if (be->state_begin(t->be.ctx, me != root) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory reading the %s model's "
                   "state", be->name);
        goto out;
    }
    int crc = 0;
    size_t sz[2];
    kind_floats_(t, sz);
    unsigned char *kind = slot_kinds_(t);  /* root's share map now */
    if (!kind) {
        be->state_end(t->be.ctx, 0);
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    for (int b = 0; b < 3 && crc == 0; b++)
        for (int s = -1; s < S && crc == 0; s++) {
            size_t n = s < 0 ? t->n_global : sz[kind[s]];
            crc = m6_coll_broadcast(c, be->state_region(t->be.ctx,
                                                        (backend_buf)b, s),
                                    n * sizeof(float), root, err);
        }
    free(kind);
    if (be->state_end(t->be.ctx, me != root && crc == 0) != 0 && crc == 0) {
        m6_err_set(err, M6_EINTERNAL, "broadcast of the state: cannot store "
                   "it in the %s model", be->name);
        goto out;
    }
    steps = malloc(((size_t)S + 1) * sizeof(long));
    if (crc == 0 && steps) {
        be->get_adam_steps(t->be.ctx, steps);
        crc = m6_coll_broadcast(c, steps, ((size_t)S + 1) * sizeof(long),
                                root, err);
    }
    if (crc != 0) {
        rc = TRAINER_ECOLL;
        goto out;
    }
    if (!steps) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    be->set_adam_steps(t->be.ctx, steps);
    t->step = h.step;
    t->delink_step = h.delink_step;
    t->data_rng = h.data_rng;
    t->phase = h.phase == PHASE_PSEUDO ? PHASE_PSEUDO : PHASE_REAL;
    rc = 0;
out:
    free(map);
    free(imap);
    free(src);
    free(steps);
    return rc;
}

int trainer_rank(const trainer *t) { return t->rank; }
int trainer_world_size(const trainer *t) { return t->world; }

int trainer_step(trainer *t, step_result *res, m6_err *err)
{
    const run_spec *sp = &t->spec;
    const backend_iface *be = t->be.iface;
    int B = sp->train.batch_size, T = sp->model.seq_len;
    int accum = sp->train.grad_accum;
    double t0 = clock_mono_s();

    memset(res, 0, sizeof *res);
    res->phase = t->phase;
    float lr = lr_at_(t, t->step);
    backend_adam adam = {lr, sp->train.beta1, sp->train.beta2, sp->train.eps,
                         sp->train.weight_decay, sp->train.grad_clip,
                         sp->pseudo.grad_scale == GRAD_SCALE_MEAN &&
                             t->phase == PHASE_PSEUDO};
    if (t->world > 1) {
        /* every rank fails the step when one cannot read its share */
        uint64_t rng0 = t->data_rng;
        int rrc = read_step_batches_(t, err);
        int agreed = agree_(t, rrc != 0, "data.train", err);
        if (agreed < 0)
            return TRAINER_ECOLL;
        if (agreed > 0) {
            t->data_rng = rng0;
            return TRAINER_EDATA;
        }
    } else if (read_step_batches_(t, err) != 0)
        return TRAINER_EDATA;  /* nothing done: the step can be retried */
    offload_stats before;
    int counted = trainer_offload_stats(t, &before) == 0;
    trainer_fault fault = fault_at_(t, t->step + 1);
    float loss_scale = 1.0f / ((float)B * (float)T * (float)accum);
    if (fault == TRAINER_FAULT_NAN_BATCH)
        loss_scale = NAN;  /* every gradient NaN */
    be->step_begin(t->be.ctx, &adam);
    if (fault == TRAINER_FAULT_INF_GRAD && be->poison_grad)
        be->poison_grad(t->be.ctx, t->fault_slot);
    double loss_sum = 0;
    /* alone: B and accum; a data-parallel rank: its share, with the
     * global step's loss scale; overlapped, the last microbatch's
     * finished slots are all-reduced while its backward goes on */
    pthread_t comm;
    int overlap = 0;
    if (t->world > 1 && dp_layout_(t) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (all-reduce layout)");
        return TRAINER_ECOLL;
    }
    for (int k = 0; k < t->accum_rank; k++) {
        rows_to_batch_(t, k, t->B_rank);
        if (t->world > 1 && t->dp_overlap && !t->gcoll &&
            k == t->accum_rank - 1)
            overlap = dp_overlap_start_(t, &comm);
        float mb_loss = be->microbatch(t->be.ctx, k, t->inp, t->tgt,
                                       t->B_rank, loss_scale);
        if (!be->step_loss)
            loss_sum += mb_loss;
    }
    float loss = NAN;
    if (t->world > 1) {
        if (be->step_loss)
            loss_sum = be->step_loss(t->be.ctx);
        /* the gradient and the loss sum over the ranks */
        if ((overlap  ? dp_overlap_finish_(t, comm, &loss_sum, err)
             : t->gcoll ? allreduce_device_(t, &loss_sum, err)
                        : allreduce_grads_(t, &loss_sum, err)) != 0)
            return TRAINER_ECOLL;
        loss = (float)(loss_sum / ((double)t->accum_rank * t->world));
    }
    if (moe_facts_(t, &res->moe, err) != 0)
        return TRAINER_ECOLL;
    float norm = be->grad_norm(t->be.ctx);
    if (t->world == 1) {
        /* after grad_norm, which waits for the device: a backend that
         * queues its microbatches has their losses by then */
        if (be->step_loss)
            loss_sum = be->step_loss(t->be.ctx);
        loss = (float)(loss_sum / accum);
    }
    if (fault == TRAINER_FAULT_NAN_BATCH)
        loss = NAN;
    crashpoint("step");
    /* A non-finite loss or norm skips the update: the weights, the AdamW
     * moments and AdamW's step counts stay as they were (nothing of them
     * is written before adamw, backend.h). The step number, and with it
     * the LR schedule, moves on: the skipped step's batch is consumed, so
     * the run's later batches and lrs are the ones it would have had. */
    if (isfinite(loss) && isfinite(norm)) {
        be->adamw(t->be.ctx, &adam, norm);
        t->bad_steps = 0;
    } else {
        res->skipped = 1;
        t->bad_steps++;
        t->skipped_steps++;
    }
    res->bad_steps = t->bad_steps;
    res->skipped_total = t->skipped_steps;
    t->step++;
    double dt = clock_mono_s() - t0;

    res->step = t->step;
    res->train_loss = loss;
    res->lr = lr;
    res->grad_norm = norm;
    res->tokens = (long)B * T * accum;
    res->step_ms = dt * 1e3;
    res->tokens_per_s = (double)res->tokens / dt;
    res->val_loss = NAN;
    res->evaluated = trainer_step_evaluates(t, t->step);
    int rc = 0;
    if (res->evaluated &&
        (rc = trainer_eval_checked(t, &res->val_loss, err)) != 0) {
        if (rc == TRAINER_EINTR) {
            /* the step stands; its pass is abandoned, not owed */
            res->eval_interrupted = 1;
            rc = 0;
        } else {
            res->eval_failed = 1;  /* the step stands; its eval is owed */
            if (rc != TRAINER_ECOLL)
                rc = TRAINER_EDATA;
        }
    }
    /* the copies of the step and of its validation pass */
    placement_(t, counted ? &before : NULL, &res->mem);
    return rc;
}

int trainer_eval_checked(trainer *t, float *loss, m6_err *err)
{
    double sum = 0;
    int n = t->spec.train.eval_batches;
    *loss = NAN;
    if (t->world > 1)
        return eval_dp_(t, loss, err);
    for (int i = 0; i < n; i++) {
        if (t->eval_stop && t->eval_stop(t->eval_stop_ud)) {
            m6_err_set(err, M6_ECANCELLED, "validation pass interrupted "
                       "after %d of %d batches", i, n);
            return TRAINER_EINTR;
        }
        if (val_batch_(t, i, err) != 0)
            return TRAINER_EDATA;
        sum += t->be.iface->loss(t->be.ctx, t->inp, t->tgt,
                                 t->spec.train.batch_size);
        crashpoint("eval");
    }
    *loss = (float)(sum / n);
    return 0;
}

float trainer_probe_loss(trainer *t, int batch_index)
{
    m6_err e = M6_ERR_NONE;
    int rc = val_batch_(t, batch_index, &e);
    m6_err_free(&e);
    if (rc != 0)
        return NAN;
    return t->be.iface->loss(t->be.ctx, t->inp, t->tgt,
                             t->spec.train.batch_size);
}

/* ------------------------------------------------------------- data */

/* An open split whose token count is not want (0: any): say so, close it
 * (no step may draw from it) and return 1. */
static int total_differs_(token_set *ts, size_t want, const char *key,
                          m6_err *err)
{
    if (!ts->n_shards || !want || ts->total == want)
        return 0;
    m6_err_set(err, M6_EDATA, "%s: %zu tokens now, the run was trained on "
               "%zu (its batches are drawn by position): restore the shards "
               "it used (or stop the run and submit it again)", key,
               ts->total, want);
    token_set_close(ts);
    return 1;
}

/* Reopen one split for trainer_reopen_data: the same token count as when
 * this trainer first opened it or its checkpoint recorded (*total, 0:
 * never), or the batches would not be the ones the run draws. The old set
 * is closed first: reopening a set of many shards must not need twice its
 * file descriptors. On failure ts is left closed. 0, -1 or
 * TOKEN_SET_ENOFILE, as open_split_. */
static int reopen_split_(token_set *ts, size_t *total, const char *key,
                         const char *glob, const run_spec *spec, m6_err *err)
{
    token_set_close(ts);
    int rc = open_split_(ts, key, glob, spec, err);
    if (rc != 0)
        return rc;
    if (total_differs_(ts, *total, key, err))
        return -1;
    *total = ts->total;
    return 0;
}

int trainer_check_data(trainer *t, m6_err *err)
{
    if (total_differs_(&t->train, t->data_total[0], "data.train", err) ||
        total_differs_(&t->val, t->data_total[1], "data.val", err))
        return TRAINER_EDATA;
    return 0;
}

int trainer_reopen_data(trainer *t, m6_err *err)
{
    const run_spec *sp = &t->spec;
    int rc = reopen_split_(&t->train, &t->data_total[0], "data.train",
                           sp->data.train, sp, err);
    if (rc == 0)
        rc = reopen_split_(&t->val, &t->data_total[1], "data.val",
                           sp->data.val, sp, err);
    if (rc != 0)
        return rc == TOKEN_SET_ENOFILE ? TRAINER_ENOFILE : TRAINER_EDATA;
    return 0;
}

/* ------------------------------------------------------------- delink */

int trainer_delink(trainer *t, char *err, size_t errlen)
{
    int L = t->spec.model.n_layer;
    if (t->phase == PHASE_REAL)
        return 0;
    int *slot_of = malloc((size_t)L * sizeof(int));
    int *src = malloc((size_t)L * sizeof(int));
    if (!slot_of || !src) {
        free(slot_of);
        free(src);
        snprintf(err, errlen, "delink: out of memory");
        return -1;
    }
    const int *old = t->be.iface->slot_of(t->be.ctx);
    for (int l = 0; l < L; l++) {
        slot_of[l] = l;
        src[l] = old[l];
    }
    char e2[512];
    int rc = t->be.iface->reslot(t->be.ctx, L, slot_of, src,
                                 t->spec.delink.optimizer == DELINK_OPT_RESET,
                                 e2, sizeof e2);
    free(slot_of);
    free(src);
    if (rc != 0) {
        snprintf(err, errlen, "delink: %s", e2);
        return -1;
    }
    t->phase = PHASE_REAL;
    t->delink_step = t->step;
    return 0;
}

/* ------------------------------------------------------------- queries */

long trainer_step_count(const trainer *t) { return t->step; }
long trainer_bad_steps(const trainer *t) { return t->bad_steps; }
long trainer_skipped_steps(const trainer *t) { return t->skipped_steps; }
void trainer_clear_bad_steps(trainer *t) { t->bad_steps = 0; }
run_phase trainer_phase(const trainer *t) { return t->phase; }
int trainer_n_slots(const trainer *t) { return n_slots_(t); }
long trainer_delink_step(const trainer *t) { return t->delink_step; }
const offload_plan *trainer_plan(const trainer *t)
{
    return t->planned ? &t->plan : NULL;
}

size_t trainer_device_bytes(const trainer *t)
{
    return t->be.iface->device_bytes(t->be.ctx);
}

/* ------------------------------------------------------------- checkpoints */

/* Checkpoint files are written from, and read into, the backend's state
 * regions (backend.h: between state_begin and state_end), tensor by tensor
 * in the plain layout of gpt.h: the same files on every backend. */
/* Each slot's kind (1 MoE) under the backend's share map into kinds[S]
 * (malloc'd); NULL when out of memory. */
static unsigned char *slot_kinds_(const trainer *t)
{
    int S = n_slots_(t);
    unsigned char *k = malloc((size_t)S);
    if (k && gpt_slot_kinds(&t->spec.model, S,
                            t->be.iface->slot_of(t->be.ctx), k, NULL, 0) != 0)
        memset(k, t->spec.model.moe_experts > 0, (size_t)S);
    return k;
}

/* Tensors per buffer in a checkpoint of t's current layout
 * (gpt_slot_ckpt_tensors per slot); -1 when out of memory. */
static int ckpt_count_(const trainer *t)
{
    unsigned char *k = slot_kinds_(t);
    if (!k)
        return -1;
    int n = GLOB_NTENSORS, per[2];
    for (int kd = 0; kd < 2; kd++)
        per[kd] = gpt_slot_ckpt_tensors(&t->spec.model, kd, NULL);
    for (int s = 0; s < n_slots_(t); s++)
        n += per[k[s]];
    free(k);
    return n;
}

/* Enumerate every tensor of the model over buffer b (params, m or v) with
 * the given name prefix: the globals, then each slot's checkpoint tensors
 * (gpt_slot_ckpt_tensors: per expert and per prototype gate in an MoE
 * slot). Returns the count (-1 out of memory); names malloc'd into names[]. */
static int collect_tensors_(const trainer *t, backend_buf b,
                            const char *prefix, st_tensor *out, char **names)
{
    const backend_iface *be = t->be.iface;
    int n = 0, S = n_slots_(t);
    float *buf = be->state_region(t->be.ctx, b, -1);
    char nm[160];
    gpt_ckpt_tensor *tab[2] = {NULL, NULL};
    int nt[2];
    unsigned char *kind = slot_kinds_(t);
    for (int kd = 0; kd < 2; kd++) {
        nt[kd] = gpt_slot_ckpt_tensors(&t->spec.model, kd, NULL);
        tab[kd] = malloc((size_t)nt[kd] * sizeof *tab[kd]);
        if (tab[kd])
            gpt_slot_ckpt_tensors(&t->spec.model, kd, tab[kd]);
    }
    if (!kind || !tab[0] || !tab[1]) {
        free(kind);
        free(tab[0]);
        free(tab[1]);
        return -1;
    }
    for (int i = 0; i < GLOB_NTENSORS; i++, n++) {
        const gpt_tensor *gt = &t->glob[i];
        gpt_tensor_name(nm, sizeof nm, prefix, -1, gt);
        names[n] = strdup(nm);
        out[n] = (st_tensor){names[n], buf + gt->offset, gt->cols ? 2 : 1,
                             {gt->rows, gt->cols}};
    }
    for (int s = 0; s < S; s++) {
        float *sbuf = be->state_region(t->be.ctx, b, s);
        const gpt_ckpt_tensor *ct = tab[kind[s]];
        for (int i = 0; i < nt[kind[s]]; i++, n++) {
            snprintf(nm, sizeof nm, "%sslots.%d.%s", prefix, s, ct[i].name);
            names[n] = strdup(nm);
            out[n] = (st_tensor){names[n], sbuf + ct[i].offset,
                                 ct[i].cols ? 2 : 1,
                                 {ct[i].rows, ct[i].cols}};
        }
    }
    free(kind);
    free(tab[0]);
    free(tab[1]);
    return n;
}

static long write_tensors_file_(const char *path, const trainer *t,
                                const backend_buf *bufs,
                                const char *const *prefixes,
                                int nbufs, m6_err *err)
{
    int per = ckpt_count_(t);
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per * nbufs, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per * nbufs, sizeof *names);
    long rc = -1;
    if (!ts || !names) {
        per = 0;
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    int n = 0;
    for (int b = 0; b < nbufs; b++) {
        int nb = collect_tensors_(t, bufs[b], prefixes[b], ts + n, names + n);
        if (nb < 0) {
            m6_err_set(err, M6_EINTERNAL, "out of memory");
            goto out;
        }
        n += nb;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, strerror(errno));
        goto out;
    }
    char e2[256];  /* safetensors_write's own words: no path */
    rc = safetensors_write(f, ts, n, e2, sizeof e2);
    if (rc < 0)
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, e2);
    else if (fsync(fileno(f)) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: fsync: %s", path, strerror(errno));
        rc = -1;
    }
    if (fclose(f) != 0 && rc >= 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: close: %s", path, strerror(errno));
        rc = -1;
    }
out:
    if (names)
        for (int i = 0; i < per * nbufs; i++)
            free(names[i]);
    free(names);
    free(ts);
    return rc;
}

/* The spec hash a checkpoint carries: the spec's, with device.backend taken
 * as 'cpu', so checkpoints move between backends (a CPU spec's hash is
 * exactly spec_hash). */
static uint64_t ckpt_hash_(const run_spec *spec)
{
    run_spec s = *spec;
    s.device.backend = BACKEND_CPU;
    return spec_hash(&s);
}

static char *meta_json_(const trainer *t)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    const int *map = be->slot_of(t->be.ctx);
    long *steps = malloc(((size_t)S + 1) * sizeof(long));
    if (!steps)
        return NULL;
    be->get_adam_steps(t->be.ctx, steps);
    json_t *slot_of = json_array(), *adam_t = json_array();
    for (int l = 0; l < t->spec.model.n_layer; l++)
        json_array_append_new(slot_of, json_integer(map[l]));
    for (int s = 0; s < S; s++)
        json_array_append_new(adam_t, json_integer(steps[s + 1]));
    char rng[32], hash[32];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->data_rng);
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)ckpt_hash_(&t->spec));
    json_t *m = json_pack(
        "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
        "format", "m6-checkpoint", "version", CKPT_VERSION,
        "step", (json_int_t)t->step,
        "phase", phase_name(t->phase),
        "n_slots", S, "slot_of", slot_of,
        "delink_step", (json_int_t)t->delink_step,
        "adam_t_global", (json_int_t)steps[0],
        "adam_t_slot", adam_t,
        "data_rng", rng, "spec_hash", hash);
    /* the token counts the batches were drawn from (0: split not open) */
    json_object_set_new(m, "train_tokens", json_integer((json_int_t)t->data_total[0]));
    json_object_set_new(m, "val_tokens", json_integer((json_int_t)t->data_total[1]));
    /* the data-parallel world that wrote it (only when > 1: a one-node
     * checkpoint is what it was). The state is replicated and the sampler
     * is the one-node sampler, so it loads at any world size that splits
     * the batch. */
    if (t->world > 1)
        json_object_set_new(m, "world_size", json_integer(t->world));
    /* non-finite steps skipped: in a row up to now, and all */
    json_object_set_new(m, "bad_steps", json_integer((json_int_t)t->bad_steps));
    json_object_set_new(m, "skipped_steps",
                        json_integer((json_int_t)t->skipped_steps));
    free(steps);
    char *s = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(m);
    return s;
}

/* model.safetensors and optimizer.safetensors into dir: bytes or -1. */
static long write_state_files_(trainer *t, const char *dir, m6_err *err)
{
    char path[PATH_MAX + 64];
    const backend_iface *be = t->be.iface;
    long total = 0, rc;
    /* e.g. offloaded slots settled in host memory, or a GPU's state
     * copied to the host */
    if (be->state_begin(t->be.ctx, 0) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "out of memory reading the %s model's state",
                   be->name);
        return -1;
    }
    const backend_buf pb[] = {BACKEND_PARAMS};
    const char *pp[] = {""};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = write_tensors_file_(path, t, pb, pp, 1, err)) < 0)
        goto out;
    total += rc;
    const backend_buf ob[] = {BACKEND_M, BACKEND_V};
    const char *op[] = {"exp_avg.", "exp_avg_sq."};
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if ((rc = write_tensors_file_(path, t, ob, op, 2, err)) < 0)
        goto out;
    total += rc;
out:
    be->state_end(t->be.ctx, 0);
    return rc < 0 ? -1 : total;
}

/* Best effort: remove a flat temporary checkpoint directory (the files
 * trainer_save writes, then the directory). errno is kept for the caller. */
static void remove_tmp_dir_(const char *tmp)
{
    int e = errno;
    DIR *d = opendir(tmp);
    if (d) {
        struct dirent *de;
        char p[PATH_MAX + 256];
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", tmp, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(tmp);
    errno = e;
}

long trainer_save(trainer *t, const char *dir, m6_err *err)
{
    char tmp[PATH_MAX], path[PATH_MAX + 64];
    struct stat st;
    if (stat(dir, &st) == 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: already exists", dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    remove_tmp_dir_(tmp);  /* ours, left by an earlier failed save */
    if (mkdir(tmp, 0755) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    long total, rc;
    if ((total = write_state_files_(t, tmp, err)) < 0)
        goto fail;
    crashpoint("ckpt");
    char *meta = meta_json_(t);
    snprintf(path, sizeof path, "%s/meta.json", tmp);
    if (!meta)
        m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
    char e4[PATH_MAX + 512];  /* one path (at most PATH_MAX) and a cause */
    rc = meta ? write_file_durable(path, meta, strlen(meta), e4, sizeof e4)
              : -1;
    if (meta && rc < 0)
        m6_err_set(err, M6_EINTERNAL, "%s", e4);
    free(meta);
    if (rc < 0)
        goto fail;
    total += rc;
    if (fsync_path(tmp) != 0 || rename(tmp, dir) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: commit failed: %s", dir, strerror(errno));
        goto fail;
    }
    /* the checkpoint is complete once renamed; a failed fsync of its
     * parent only risks the name on a crash, as before */
    char e3[64];
    fsync_parent_dir(dir, e3, sizeof e3);
    return total;
fail:
    remove_tmp_dir_(tmp);  /* err already names the file and the cause */
    return -1;
}

static int load_tensors_(const char *path, trainer *t, const backend_buf *bufs,
                         const char *const *prefixes, int nbufs, m6_err *err)
{
    st_file sf;
    char e1[PATH_MAX + 512];  /* one path (at most PATH_MAX) and a cause */
    if (safetensors_open(&sf, path, e1, sizeof e1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s", e1);
        return -1;
    }
    int per = ckpt_count_(t), rc = 0;
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per, sizeof *names);
    char e2[256];  /* safetensors_get's words: a tensor name, no path */
    if (!ts || !names) {
        m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
        rc = -1;
    }
    for (int b = 0; b < nbufs && rc == 0; b++) {
        int n = collect_tensors_(t, bufs[b], prefixes[b], ts, names);
        if (n < 0) {
            m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
            rc = -1;
        }
        for (int i = 0; i < n; i++) {
            size_t numel = (size_t)ts[i].shape[0] *
                           (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
            if (rc == 0 && safetensors_get(&sf, ts[i].name, (float *)ts[i].data,
                                           numel, e2, sizeof e2) != 0) {
                m6_err_set(err, M6_EINTERNAL, "%s: %s", path, e2);
                rc = -1;
            }
            free(names[i]);
        }
    }
    free(names);
    free(ts);
    safetensors_close(&sf);
    return rc;
}

int trainer_load(trainer *t, const char *dir, m6_err *err)
{
    char path[PATH_MAX];
    json_error_t je;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    json_t *m = json_load_file(path, 0, &je);
    if (!m) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: %s (line %d)", path, je.text, je.line);
        return -1;
    }
    const backend_iface *be = t->be.iface;
    int L = t->spec.model.n_layer, version = 0, n_slots = 0, rc = -1;
    long *steps = NULL;
    json_int_t step, delink_step, adam_t_global;
    const char *phase, *rng, *hash, *format;
    json_t *slot_of, *adam_t;
    if (json_unpack_ex(m, &je, 0,
            "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
            "format", &format, "version", &version, "step", &step,
            "phase", &phase, "n_slots", &n_slots, "slot_of", &slot_of,
            "delink_step", &delink_step, "adam_t_global", &adam_t_global,
            "adam_t_slot", &adam_t, "data_rng", &rng, "spec_hash", &hash) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, je.text);
        goto out;
    }
    if (strcmp(format, "m6-checkpoint") != 0 || version != CKPT_VERSION) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: not an m6 checkpoint of version %d", path,
                   CKPT_VERSION);
        goto out;
    }
    char want[32];
    snprintf(want, sizeof want, "%016llx",
             (unsigned long long)ckpt_hash_(&t->spec));
    if (strcmp(hash, want) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: spec hash %s does not match this run's %s",
                   path, hash, want);
        goto out;
    }
    if (n_slots < 1 || n_slots > L || json_array_size(slot_of) != (size_t)L ||
        json_array_size(adam_t) != (size_t)n_slots) {
        m6_err_set(err, M6_EINTERNAL, "%s: bad share map", path);
        goto out;
    }
    int *map = malloc((size_t)L * sizeof(int)), *src = calloc((size_t)n_slots, sizeof(int));
    for (int l = 0; l < L; l++) {
        map[l] = (int)json_integer_value(json_array_get(slot_of, l));
        if (map[l] < 0 || map[l] >= n_slots) {
            m6_err_set(err, M6_EINTERNAL,
                       "%s: slot_of[%d] out of range", path, l);
            free(map);
            free(src);
            goto out;
        }
    }
    /* each new slot copies an old slot of its own kind (values are
     * overwritten below); a map that mixes kinds in a slot is refused */
    {
        int oS = n_slots_(t);
        unsigned char *nk = malloc((size_t)n_slots), *ok_ = malloc((size_t)oS);
        char e3[256] = "out of memory";
        int bad = !nk || !ok_ ||
                  gpt_slot_kinds(&t->spec.model, n_slots, map, nk, e3,
                                 sizeof e3) != 0 ||
                  gpt_slot_kinds(&t->spec.model, oS, be->slot_of(t->be.ctx),
                                 ok_, e3, sizeof e3) != 0;
        for (int s = 0; !bad && s < n_slots; s++) {
            src[s] = -1;
            for (int o = 0; o < oS && src[s] < 0; o++)
                if (ok_[o] == nk[s])
                    src[s] = o;
            if (src[s] < 0) {
                snprintf(e3, sizeof e3, "no slot of the kind of slot %d", s);
                bad = 1;
            }
        }
        free(nk);
        free(ok_);
        if (bad) {
            m6_err_set(err, M6_EINTERNAL, "%s: bad share map: %s", path, e3);
            free(map);
            free(src);
            goto out;
        }
    }
    /* Re-lay to the checkpoint's slot count; values are overwritten below. */
    char e2[512];
    int ok = be->reslot(t->be.ctx, n_slots, map, src, 1, e2, sizeof e2) == 0;
    free(map);
    free(src);
    if (!ok) {
        m6_err_set(err, M6_EINTERNAL, "loading %s: %s", dir, e2);
        goto out;
    }
    steps = malloc(((size_t)n_slots + 1) * sizeof(long));
    if (!steps || be->state_begin(t->be.ctx, 1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory loading %s", dir);
        goto out;
    }
    const backend_buf pb[] = {BACKEND_PARAMS};
    const char *pp[] = {""};
    const backend_buf ob[] = {BACKEND_M, BACKEND_V};
    const char *op[] = {"exp_avg.", "exp_avg_sq."};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int lrc = load_tensors_(path, t, pb, pp, 1, err);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (lrc == 0)
        lrc = load_tensors_(path, t, ob, op, 2, err);
    if (be->state_end(t->be.ctx, lrc == 0) != 0 && lrc == 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "loading %s: cannot store the state in the %s "
                   "model", dir, be->name);
        lrc = -1;
    }
    if (lrc != 0)
        goto out;
    steps[0] = (long)adam_t_global;
    for (int s = 0; s < n_slots; s++)
        steps[s + 1] = (long)json_integer_value(json_array_get(adam_t, s));
    be->set_adam_steps(t->be.ctx, steps);
    t->step = (long)step;
    t->delink_step = (long)delink_step;
    t->phase = phase_parse(phase) == PHASE_PSEUDO ? PHASE_PSEUDO : PHASE_REAL;
    t->data_rng = strtoull(rng, NULL, 16);
    /* what the data must hold for the same batches (trainer_check_data);
     * checkpoints before they were recorded, or with a split not open
     * (0), leave the counts of this trainer's open */
    for (int k = 0; k < 2; k++) {
        json_t *n = json_object_get(m, k ? "val_tokens" : "train_tokens");
        if (json_is_integer(n) && json_integer_value(n) > 0)
            t->data_total[k] = (size_t)json_integer_value(n);
    }
    /* checkpoints from before skipped steps were counted: none */
    json_t *bad = json_object_get(m, "bad_steps");
    json_t *skipped = json_object_get(m, "skipped_steps");
    t->bad_steps = json_is_integer(bad) ? (long)json_integer_value(bad) : 0;
    t->skipped_steps = json_is_integer(skipped)
                           ? (long)json_integer_value(skipped) : 0;
    rc = 0;
out:
    free(steps);
    json_decref(m);
    return rc;
}

/* ------------------------------------------------------------- state access */

size_t trainer_copy_state(trainer *t, int which, float *dst)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    unsigned char *kind = slot_kinds_(t);
    if (!kind)
        return 0;
    size_t ks[2];
    gpt_tensor tab[SLOT_NTENSORS_MAX];
    gpt_slot_layout(&t->spec.model, 0, tab, &ks[0]);
    gpt_slot_layout(&t->spec.model, 1, tab, &ks[1]);
    size_t n = t->n_global;
    for (int s = 0; s < S; s++)
        n += ks[kind[s]];
    if (!dst) {
        free(kind);
        return n;
    }
    if (be->state_begin(t->be.ctx, 0) != 0) {
        free(kind);
        return 0;
    }
    backend_buf b = which == 0 ? BACKEND_PARAMS : which == 1 ? BACKEND_M : BACKEND_V;
    memcpy(dst, be->state_region(t->be.ctx, b, -1),
           t->n_global * sizeof(float));
    size_t off = t->n_global;
    for (int s = 0; s < S; s++) {
        memcpy(dst + off, be->state_region(t->be.ctx, b, s),
               ks[kind[s]] * sizeof(float));
        off += ks[kind[s]];
    }
    be->state_end(t->be.ctx, 0);
    free(kind);
    return n;
}

int trainer_copy_adam_steps(trainer *t, long *dst)
{
    t->be.iface->get_adam_steps(t->be.ctx, dst);
    return n_slots_(t) + 1;
}

int trainer_offload_stats(trainer *t, offload_stats *st)
{
    return t->be.iface->offload_stats(t->be.ctx, st);
}
