/*
 * trainer.c — one training run's step: setup from the spec, data sampling,
 * the step (microbatches, clipping, AdamW), the LR schedule, evaluation,
 * delink and the step's figures. See trainer.h for the contract and
 * DESIGN.md for the method. Its neighbours: gradsync.c sums the gradient
 * over data-parallel ranks, trainer_ckpt.c writes and reads checkpoints;
 * trainer_internal.h is what the three share.
 *
 * The model itself sits behind a backend (backend.h): the CPU reference
 * (backend_cpu.c) or one GPU (backend_cuda.c, in CUDA builds). Everything
 * here is shared by both: the sampler, the schedule, the step sequence and
 * the share maps of delink.
 */
#include "train/trainer_internal.h"

#include "common/cpus.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crashpoint.h"
#include "common/log.h"
#include "ckpt/init_from.h"
#ifdef M6_HAVE_CUDA
#include "model/cuda/gpt_cuda.h"
#endif

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

int trainer_cuda_devices(void)
{
#ifdef M6_HAVE_CUDA
    const char *why;
    int n = gpt_cuda_device_count(&why);
    return n > 0 ? n : 0;
#else
    return 0;
#endif
}

uint64_t trainer_cuda_free_bytes(int device)
{
#ifdef M6_HAVE_CUDA
    return gpt_cuda_free_bytes(device);
#else
    (void)device;
    return 0;
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
                            ? offload_rank_host_available(spec) : 0;
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
        .optim = spec_gpt_optim(spec),
        .host_threads = spec_host_threads(spec),
        .device = spec->device.index,
        .bf16 = spec_precision(spec) == PRECISION_BF16,
        .plan_in = offload_plan_input_of(spec),
        .plan = t->planned ? &t->plan : NULL,
    };
    /* later plans (re-slotting) follow the start's decision on auto */
    bs.plan_in.host_limit = t->planned && !t->plan.speculative ? 0
                                                               : host_limit;
    t->bsetup = bs;
    t->bmodel = *mc;
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
        if (trainer_init_from_load_(t, &ie) != 0) {
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
    const char *fr = getenv("M6_TEST_FAULT_RANK");
    t->fault_rank = fr && fr[0] ? atoi(fr) : -1;
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
    trainer_ep_free_(t->ep);
    trainer_ep_groups_free_(t);
    free(t->dp_kind);
    token_set_close(&t->train);
    token_set_close(&t->val);
    offload_plan_free(&t->plan);
    free(t->inp);
    free(t->tgt);
    free(t->rows);
    free(t->init_error);
    free(t->bucket);
    free(t->dp_rank_stats);
    free(t->moe_idle);
    free(t->moe_tokens);
    free(t->dp_ready);
    free(t->dp_start);
    if (t->dp_sync) {
        pthread_mutex_destroy(&t->dp_mu);
        pthread_cond_destroy(&t->dp_cv);
    }
    free(t->win_pos);
    m6_coll_destroy(t->gcoll);
    m6_local_leave(t->local);
    m6_coll_destroy(t->leaders);
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
int trainer_val_batch_(trainer *t, int i, m6_err *err)
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

/* Which rank a bad gradient came from (step_result), from the per-rank
 * statistics the host all-reduce gathered this step (gradsync.c). */
static void attribute_(trainer *t, step_result *res)
{
    res->nonfinite_rank = res->outlier_rank = -1;
    if (!t->dp_stats_valid) return;
    t->dp_stats_valid = 0;
    int W = t->world;
    float *ss = malloc((size_t)W * sizeof *ss);
    if (!ss) return;
    for (int r = 0; r < W; r++) {
        ss[r] = t->dp_rank_stats[2 * r];
        if (t->dp_rank_stats[2 * r + 1] > 0) {
            if (res->nonfinite_rank < 0) res->nonfinite_rank = r;
            if (res->nonfinite_ranks < STEP_NONFINITE_LIST)
                res->nonfinite_list[res->nonfinite_ranks] = r;
            res->nonfinite_ranks++;
        }
    }
    res->outlier_rank = grad_outlier_rank(ss, W, GRAD_OUTLIER_RATIO,
                                          &res->outlier_ratio);
    free(ss);
}

/* TRAINER_FAULT_STOP_A2A: this process stops (SIGSTOP) the first time
 * only, whichever trainer asks. */
static void stop_once_(void)
{
    static int stopped;
    if (__atomic_exchange_n(&stopped, 1, __ATOMIC_RELAXED))
        return;
    log_warn("test.stop", "fault=stop_a2a pid=%d: SIGSTOP before the "
             "step's forward", (int)getpid());
    raise(SIGSTOP);
}

/* The test fault armed for 1-based step `step`, TRAINER_FAULT_NONE none. */
static trainer_fault fault_at_(const trainer *t, long step)
{
    if (t->fault == TRAINER_FAULT_NONE || step < t->fault_first ||
        step - t->fault_first >= t->fault_count ||
        (t->fault_rank >= 0 && t->fault_rank != t->rank))
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
    else if (n == 10 && strncmp(text, "grad_scale", n) == 0)
        *kind = TRAINER_FAULT_GRAD_SCALE;
    else if (n == 8 && strncmp(text, "stop_a2a", n) == 0)
        *kind = TRAINER_FAULT_STOP_A2A;
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

/* The step's tokens of each (MoE block, expert), summed over the ranks
 * (float: exact below 2^24 tokens an expert a step), into m->tokens; their
 * least, most and the pairs with none into m's step_* fields; and each
 * one's run of steps without a token (train.expert_idle_steps) into m's
 * idle fields. Every rank enters the same collective whatever N is. 0, or
 * -1 with err (the collective's, or out of memory). */
static int step_tokens_(trainer *t, const gpt_moe_stats *st, step_moe *m,
                        m6_err *err)
{
    long N = t->spec.train.expert_idle_steps;
    const model_config *c = &t->spec.model;
    size_t E = (size_t)c->moe_experts, n = (size_t)model_moe_layers(c) * E;
    m->idle_block = m->idle_expert = -1;
    m->step_tokens_min = m->step_tokens_max = m->step_experts_empty = -1;
    if (!st->tokens || n == 0)
        return 0;
    if ((!t->moe_tokens && !(t->moe_tokens = malloc(n * sizeof(float)))) ||
        (N > 0 && !t->moe_idle &&
         !(t->moe_idle = calloc(n, sizeof *t->moe_idle)))) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (tokens per expert)");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        t->moe_tokens[i] = (float)st->tokens[i];
    if (t->world > 1 &&
        m6_coll_allreduce_sum(t->coll, t->moe_tokens, n, err) != 0)
        return -1;
    m->step_experts_empty = 0;
    for (size_t i = 0; i < n; i++) {
        long k = (long)t->moe_tokens[i];
        if (i == 0 || k < m->step_tokens_min) m->step_tokens_min = k;
        if (i == 0 || k > m->step_tokens_max) m->step_tokens_max = k;
        m->step_experts_empty += k == 0;
        if (N <= 0)
            continue;
        t->moe_idle[i] = k > 0 ? 0 : t->moe_idle[i] + 1;
        m->experts_idle += t->moe_idle[i] >= N;
        if (t->moe_idle[i] == N && m->idle_new++ == 0) {
            m->idle_block = (int)(i / E);
            m->idle_expert = (int)(i % E);
        }
    }
    m->tokens = t->moe_tokens;
    m->n_tokens = n;
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
    if (t->world > 1 && gradsync_moe_gather_(t, &st, err) != 0)
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
    m->step_dropped = st.dropped;
    return step_tokens_(t, &st, m, err);
}

int trainer_step(trainer *t, step_result *res, m6_err *err)
{
    const run_spec *sp = &t->spec;
    const backend_iface *be = t->be.iface;
    int B = sp->train.batch_size, T = sp->model.seq_len;
    int accum = sp->train.grad_accum;
    double t0 = clock_mono_s();

    memset(res, 0, sizeof *res);
    /* rank 0 of an expert-parallel group after a save: its experts only
     * again */
    if (trainer_ep_local_again_(t, err) != 0)
        return TRAINER_ECOLL;
    be = t->be.iface;
    res->nonfinite_rank = res->outlier_rank = -1;
    res->phase = t->phase;
    float lr = lr_at_(t, t->step);
    backend_adam adam = {lr, sp->train.beta1, sp->train.beta2, sp->train.eps,
                         sp->train.weight_decay, sp->train.grad_clip,
                         sp->pseudo.grad_scale == GRAD_SCALE_MEAN &&
                             t->phase == PHASE_PSEUDO,
                         sp->optimizer.name == OPTIMIZER_ADAFACTOR,
                         {lr, sp->optimizer.beta1, sp->optimizer.decay_rate,
                          sp->optimizer.clip_threshold, sp->optimizer.eps1,
                          sp->optimizer.eps2, sp->optimizer.scale_parameter,
                          1.0f}};
    if (t->world > 1) {
        /* every rank fails the step when one cannot read its share */
        uint64_t rng0 = t->data_rng;
        int rrc = read_step_batches_(t, err);
        int agreed = gradsync_agree_(t, rrc != 0, "data.train", err);
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
    if (fault == TRAINER_FAULT_GRAD_SCALE)
        loss_scale *= TRAINER_FAULT_GRAD_SCALE_FACTOR;
    if (fault == TRAINER_FAULT_STOP_A2A)
        stop_once_();
    be->step_begin(t->be.ctx, &adam);
    if (fault == TRAINER_FAULT_INF_GRAD && be->poison_grad)
        be->poison_grad(t->be.ctx, t->fault_slot);
    double loss_sum = 0;
    /* alone: B and accum; a data-parallel rank: its share, with the
     * global step's loss scale; overlapped, the last microbatch's
     * finished slots are all-reduced while its backward goes on */
    pthread_t comm;
    int overlap = 0;
    /* sharded again after a gather (a checkpoint, trainer_gather_optim) */
    if (gradsync_shard_(t, err) != 0)
        return TRAINER_ECOLL;
    if (t->world > 1 && gradsync_layout_(t) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (all-reduce layout)");
        return TRAINER_ECOLL;
    }
    for (int k = 0; k < t->accum_rank; k++) {
        rows_to_batch_(t, k, t->B_rank);
        if (t->world > 1 && t->dp_overlap && !t->gcoll &&
            k == t->accum_rank - 1)
            overlap = gradsync_overlap_start_(t, &comm);
        float mb_loss = be->microbatch(t->be.ctx, k, t->inp, t->tgt,
                                       t->B_rank, loss_scale);
        if (!be->step_loss)
            loss_sum += mb_loss;
        if (trainer_ep_check_(t, err) != 0)
            return TRAINER_ECOLL;
    }
    float loss = NAN;
    if (t->world > 1) {
        if (be->step_loss)
            loss_sum = be->step_loss(t->be.ctx);
        /* the gradient and the loss sum over the ranks */
        if ((overlap  ? gradsync_overlap_finish_(t, comm, &loss_sum, err)
             : t->gcoll ? gradsync_allreduce_device_(t, &loss_sum, err)
                        : gradsync_allreduce_host_(t, &loss_sum, err)) != 0)
            return TRAINER_ECOLL;
        loss = (float)(loss_sum / ((double)t->accum_rank * t->world));
        if (trainer_ep_reduce_experts_(t, err) != 0)
            return TRAINER_ECOLL;
    }
    attribute_(t, res);
    if (moe_facts_(t, &res->moe, err) != 0)
        return TRAINER_ECOLL;
    float norm = be->grad_norm(t->be.ctx);
    /* expert parallelism: each rank's experts counted once */
    if (t->ep && trainer_ep_norm_(t, &norm, err) != 0)
        return TRAINER_ECOLL;
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
        /* sharded: each rank updated its range; every rank's to all (a
         * skipped step skips on every rank: loss and norm are the sums') */
        if (t->sharded && gradsync_allgather_params_(t, err) != 0)
            return TRAINER_ECOLL;
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
        return gradsync_eval_(t, loss, err);
    for (int i = 0; i < n; i++) {
        if (t->eval_stop && t->eval_stop(t->eval_stop_ud)) {
            m6_err_set(err, M6_ECANCELLED, "validation pass interrupted "
                       "after %d of %d batches", i, n);
            return TRAINER_EINTR;
        }
        if (trainer_val_batch_(t, i, err) != 0)
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
    int rc = trainer_val_batch_(t, batch_index, &e);
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
    /* sharded: the ranges change with the layout; gather, then re-shard
     * at the next step (every rank delinks at the same step) */
    m6_err me = M6_ERR_NONE;
    if (gradsync_unshard_(t, &me) != 0) {
        snprintf(err, errlen, "delink: %s", m6_err_msg(&me));
        m6_err_free(&me);
        free(slot_of);
        free(src);
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

size_t trainer_optim_bytes(const trainer *t)
{
    const backend_iface *be = t->be.iface;
    return be->optim_bytes ? be->optim_bytes(t->be.ctx) : 0;
}
