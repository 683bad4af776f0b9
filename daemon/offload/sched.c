/*
 * sched.c — the offload runtime: places the model's state in the pools
 * (a gpt_storage), streams offloaded slots through device staging buffers
 * on a copy thread, and runs their AdamW updates on host threads.
 *
 * Threads and what they own:
 *   compute (the trainer's thread): gpt_forward/backward; at a layer whose
 *     slot is offloaded it waits for the slot's staging buffer to be READY,
 *     points the compute view at it, and releases it after the interval's
 *     last layer (queueing a gradient drain when backward layers ran).
 *   copy thread: drains first (they free buffers and complete gradients),
 *     then the next fetch of the pass, in interval order, into buffer
 *     (interval mod n_staging) once that buffer is FREE and the slot is not
 *     being updated. "Prefetch" is simply that the copy thread runs ahead
 *     of the compute thread by up to n_staging - 1 intervals.
 *   host threads: AdamW of offloaded slots whose gradient is final.
 * Streamed gradients (offload.stream_grads): an offloaded slot's host
 * gradient is a block of the gradient pool, taken by the copy thread at
 * the slot's first drain of the step (waiting while plan.n_grad_bufs are
 * out) and given back by the host thread once its AdamW is done; its sum
 * of squares is taken at the final drain, for the step's norm.
 * One mutex guards all shared state; three condition variables wake the
 * copy thread, the host threads and waiters on the compute side. Copies and
 * updates run outside the lock. Nothing spins.
 */
#include "offload/offload.h"
#include "offload/test_hooks.h"
#include "common/threads.h"
#include "common/clock.h"
#include "kernels.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload/intervals.h"

#define HOST_CHUNK_ (2u << 20) /* host pool growth, bytes; at most
                                * OFFLOAD_MAX_CHUNK a chunk (pool.c) */

/* staging buffer states */
enum { BUF_FREE, BUF_LOADING, BUF_READY, BUF_IN_USE, BUF_DRAINING };
/* interval states within the current pass */
enum { IV_PLANNED, IV_FETCHED, IV_RELEASED, IV_DRAINED };

typedef struct {
    float *w, *dw;        /* slot_size floats each, in the device pool */
    int state;
    long pass;            /* pass and interval it holds */
    int iv;
    int slot, final, has_bwd;
} staging_;

/* A queued AdamW update carries its own hyperparameters: it may run after
 * the next step has begun. A speculative one (spec 1) first keeps the
 * slot's params, m, v and step count in its second buffers; a redo (spec
 * 2) first puts them back. */
typedef struct {
    int slot;
    int spec;
    offload_adam a;
} adam_job_;

enum { JOB_PLAIN = 0, JOB_SPECULATE = 1, JOB_REDO = 2 };

struct offload_ctx {
    offload_plan_input in;     /* the run's planner input (slot_of NULL) */
    offload_plan first;        /* offload_create's plan for the first
                                * allocation, if given (placement NULL
                                * once used or when none) */
    offload_pool *dev, *host;
    offload_pool *gpool;       /* streamed gradients (pinned, like host) */
    int grads_out;             /* its blocks handed out now */
    float **gout;              /* [n_gout] slot s's block, or NULL */
    int n_gout;
    double *sumsq;             /* [S] streamed: each offloaded slot's final
                                * gradient's grad_sumsq of this step */
    uint64_t stream_skips;     /* streamed updates skipped: not finite */
    gpt_storage storage;
    gpt_model *g;
    offload_plan plan;
    char last_err[512];

    /* placement of the current state */
    float *dev_block;          /* params | grads | m | v, n_local floats each */
    float **host_arr;          /* offloaded slot k: params, grads, m, v at
                                * [4k..4k+3], one pool block each, so that
                                * none straddles a chunk of the host pool */
    int n_host_arr;
    staging_ *buf;
    int nbuf;
    size_t W;                  /* bytes of one slot region */

    /* per slot */
    unsigned char *updating;   /* AdamW queued or running */
    unsigned char *touched;    /* partial gradient on the host this step */
    unsigned char *adam_queued;/* queued this step */
    int *pending_drains;

    /* the current pass */
    offload_interval *iv;      /* [2L] */
    int *at_pos;               /* [2L] */
    int *iv_state, *dep;       /* [2L] dep: earlier backward interval of
                                * the same slot in this pass, or -1 */
    int n_iv, next_fetch, pass_active, pass_bwd, armed, armed_k;
    long pass_id;

    /* queues */
    int *drainq, dq_head, dq_n;    /* buffer indices (ring of nbuf) */
    adam_job_ *adamq;              /* ring of S */
    int aq_head, aq_n, qcap_s;
    offload_adam adam;             /* this step's, for early updates */
    const int *grad_div;           /* this step's divisors of the offloaded
                                    * slots' final gradients (caller's, [S]);
                                    * NULL: none */
    int early;
    int speculate;                 /* this step: speculative updates */
    int summed;                    /* ... queued by offload_grad_summed */
    void (*ready)(void *, int);    /* offload_set_grad_ready: final drains
                                    * reported, the microbatch the last */
    void *ready_ctx;

    /* speculative clipped update (offload.h): per offloaded slot s, the
     * old params | m | v (3 slot_size floats at spec_old[s]) and step
     * count, kept while its unclipped update runs in place */
    float *spec_block, **spec_old;
    long *spec_t;
    unsigned char *spec_pending;   /* speculated, not yet kept or redone */
    uint64_t spec_steps, redo_steps, spec_restores;
    pthread_mutex_t mu;
    pthread_cond_t cv_copy, cv_work, cv_done;
    pthread_t copy_thread, *host_threads;
    int n_host_threads, quit;
    int hold;                  /* tests: host threads take no jobs */

    /* statistics */
    uint64_t h2d_bytes, d2h_bytes;
    double h2d_s, d2h_s, stall_s, adam_s;
};

/* ------------------------------------------------------------- copy thread */

static int fetch_ready_(const offload_ctx *o, int j)
{
    const offload_interval *I = &o->iv[j];
    if (o->buf[j % o->nbuf].state != BUF_FREE || o->updating[I->slot])
        return 0;
    if (I->has_bwd && I->grad_from_host &&
        (o->pending_drains[I->slot] > 0 ||
         (o->dep[j] >= 0 && o->iv_state[o->dep[j]] != IV_DRAINED)))
        return 0;
    return 1;
}

static void queue_adam_(offload_ctx *o, int s, const offload_adam *a)
{
    o->adam_queued[s] = o->updating[s] = 1;
    o->adamq[(o->aq_head + o->aq_n++) % o->qcap_s] =
        (adam_job_){s, JOB_PLAIN, *a};
    pthread_cond_signal(&o->cv_work);
}

static _Atomic unsigned slow_drains_; /* offload_test_slow_drains */

void offload_test_slow_drains(unsigned usec) { slow_drains_ = usec; }

static void do_drain_(offload_ctx *o)
{
    int b = o->drainq[o->dq_head];
    o->dq_head = (o->dq_head + 1) % o->nbuf;
    o->dq_n--;
    staging_ *B = &o->buf[b];
    gpt_slot_state *dst_st = &o->g->slots[B->slot];
    if (o->plan.stream_grads && !dst_st->grads) {
        /* the slot's first drain of the step: a gradient buffer, once an
         * update has given one back (offload_stream_grad_bufs: one will) */
        size_t gb = gpt_slot_floats(o->g, B->slot) * sizeof(float);
        while (o->grads_out >= o->plan.n_grad_bufs && !o->quit)
            pthread_cond_wait(&o->cv_copy, &o->mu);
        if (o->quit)
            return;
        dst_st->grads = o->gout[B->slot] = offload_pool_alloc(o->gpool, gb);
        if (!dst_st->grads) { /* the host is out of memory: nothing to
                               * stream into; the step cannot go on */
            fprintf(stderr, "offload: cannot allocate %zu bytes for a "
                    "streamed gradient; aborting\n", gb);
            abort();
        }
        o->grads_out++;
    }
    float *dst = dst_st->grads;
    int div = B->final && o->grad_div ? o->grad_div[B->slot] : 1;
    void (*ready)(void *, int) = B->final ? o->ready : NULL;
    void *ready_ctx = o->ready_ctx;
    pthread_mutex_unlock(&o->mu);
    unsigned slow = slow_drains_;
    if (slow)
        nanosleep(&(struct timespec){slow / 1000000, slow % 1000000 * 1000L},
                  NULL);
    double t0 = clock_mono_s();
    size_t W = gpt_slot_floats(o->g, B->slot) * sizeof(float);
    memcpy(dst, B->dw, W);
    double dt = clock_mono_s() - t0;
    if (div > 1) { /* the gradient is complete: its mean over the layers */
        float n = (float)div;
        for (size_t i = 0; i < W / sizeof(float); i++)
            dst[i] /= n;
    }
    /* streamed: the norm's part of the slot (gpt_grad_norm_with), taken
     * before its update gives the buffer back */
    double sq = B->final && o->sumsq ? grad_sumsq(dst, W / sizeof(float))
                                     : 0.0;
    if (ready)
        ready(ready_ctx, B->slot);
    pthread_mutex_lock(&o->mu);
    o->d2h_s += dt;
    o->d2h_bytes += W;
    o->pending_drains[B->slot]--;
    if (B->final && o->sumsq)
        o->sumsq[B->slot] = sq;
    if (B->pass == o->pass_id)
        o->iv_state[B->iv] = IV_DRAINED;
    if (B->final && (o->early || (o->speculate && !o->summed)) &&
        !o->adam_queued[B->slot]) {
        queue_adam_(o, B->slot, &o->adam);
        if (!o->early) { /* unclipped, kept only if the norm allows */
            o->adamq[(o->aq_head + o->aq_n - 1) % o->qcap_s].spec =
                JOB_SPECULATE;
            o->spec_pending[B->slot] = 1;
        }
    }
    B->state = BUF_FREE;
    pthread_cond_broadcast(&o->cv_done);
}

static void do_fetch_(offload_ctx *o)
{
    int j = o->next_fetch++;
    const offload_interval *I = &o->iv[j];
    staging_ *B = &o->buf[j % o->nbuf];
    B->state = BUF_LOADING;
    B->pass = o->pass_id;
    B->iv = j;
    B->slot = I->slot;
    B->final = I->final;
    B->has_bwd = I->has_bwd;
    const gpt_slot_state *st = &o->g->slots[I->slot];
    int grads = I->has_bwd, from_host = I->grad_from_host;
    /* this slot's kind's size (a mixed model: dense or MoE; the buffer
     * holds the largest) */
    size_t W = gpt_slot_floats(o->g, I->slot) * sizeof(float);
    pthread_mutex_unlock(&o->mu);
    double t0 = clock_mono_s();
    memcpy(B->w, st->params, W);
    if (grads && from_host)
        memcpy(B->dw, st->grads, W);
    double dt = clock_mono_s() - t0;
    if (grads && !from_host)
        memset(B->dw, 0, W); /* a device memset, not a transfer */
    pthread_mutex_lock(&o->mu);
    o->h2d_s += dt;
    o->h2d_bytes += W * (grads && from_host ? 2 : 1);
    o->iv_state[j] = IV_FETCHED;
    B->state = BUF_READY;
    pthread_cond_broadcast(&o->cv_done);
}

static void *copy_main_(void *arg)
{
    offload_ctx *o = arg;
    omp_set_num_threads(1); /* grad_sumsq of streamed gradients: serial */
    pthread_mutex_lock(&o->mu);
    while (!o->quit) {
        if (o->dq_n > 0)
            do_drain_(o);
        else if (o->pass_active && o->next_fetch < o->n_iv &&
                 fetch_ready_(o, o->next_fetch))
            do_fetch_(o);
        else
            pthread_cond_wait(&o->cv_copy, &o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* ------------------------------------------------------------- host threads */

/* Slot s's second buffers (outside the lock: s is UPDATING, nothing else
 * touches its state): keep 1 copies params, m, v and the step count into
 * them, keep 0 copies them back. */
static void spec_keep_or_restore_(offload_ctx *o, int s, int keep)
{
    const gpt_slot_state *st = &o->g->slots[s];
    /* at the slot's own size (a mixed model's dense slots are smaller
     * than the slot_size stride of spec_old) */
    size_t ss = gpt_slot_floats(o->g, s), W = ss * sizeof(float);
    float *old = o->spec_old[s];
    if (keep) {
        memcpy(old, st->params, W);
        memcpy(old + ss, st->m, W);
        memcpy(old + 2 * ss, st->v, W);
        o->spec_t[s] = o->g->adam_t_slot[s];
    } else {
        memcpy(st->params, old, W);
        memcpy(st->m, old + ss, W);
        memcpy(st->v, old + 2 * ss, W);
        o->g->adam_t_slot[s] = o->spec_t[s];
    }
}

/* Undo the speculative updates of a step that did not reach offload_adamw
 * (a failed step): wait for each, put the old state back. Lock held. */
static void spec_revert_(offload_ctx *o)
{
    for (int s = 0; o->spec_pending && s < o->g->S; s++) {
        if (!o->spec_pending[s])
            continue;
        while (o->updating[s])
            pthread_cond_wait(&o->cv_done, &o->mu);
        spec_keep_or_restore_(o, s, 0);
        o->spec_pending[s] = 0;
    }
}

static void *host_thread_main_(void *arg)
{
    offload_ctx *o = arg;
    omp_set_num_threads(1); /* this thread's kernels run serially */
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->quit && (o->aq_n == 0 || o->hold))
            pthread_cond_wait(&o->cv_work, &o->mu);
        if (o->quit)
            break;
        adam_job_ job = o->adamq[o->aq_head];
        o->aq_head = (o->aq_head + 1) % o->qcap_s;
        o->aq_n--;
        int s = job.slot;
        const offload_adam a = job.a;
        pthread_mutex_unlock(&o->mu);
        double t0 = clock_mono_s();
        if (job.spec)
            spec_keep_or_restore_(o, s, job.spec == JOB_SPECULATE);
        /* streamed: a slot whose gradient is not finite keeps its state
         * (the step is skipped, trainer.h; the slots updated already
         * cannot be taken back: offload.stream_grads says so) */
        int skip = o->sumsq && !isfinite(o->sumsq[s]);
        if (!skip && a.adafactor) {
            adafactor_hparams af = a.af;
            af.grad_scale = a.grad_scale;
            /* out of memory for its spans: the slot keeps its state */
            if (gpt_adafactor_slot(o->g, s, &af, a.weight_decay) != 0)
                fprintf(stderr, "offload: slot %d's Adafactor update "
                        "skipped: out of memory\n", s);
        } else if (!skip)
            gpt_adamw_slot(o->g, s, a.lr, a.beta1, a.beta2, a.eps,
                           a.weight_decay, a.grad_scale);
        double dt = clock_mono_s() - t0;
        pthread_mutex_lock(&o->mu);
        o->adam_s += dt;
        o->updating[s] = 0;
        if (o->gout && o->gout[s]) {
            offload_pool_free(o->gpool, o->gout[s]);
            o->gout[s] = o->g->slots[s].grads = NULL;
            o->grads_out--;
            o->stream_skips += (uint64_t)skip;
        }
        pthread_cond_signal(&o->cv_copy);
        pthread_cond_broadcast(&o->cv_done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* ------------------------------------------------------------- passes */

/* Start a pass (the lock is held): cut it into intervals, wake the copy
 * thread. A train pass was announced by offload_microbatch. */
static void pass_start_(offload_ctx *o, int with_bwd)
{
    gpt_model *g = o->g;
    int L = g->cfg.n_layer;
    o->pass_id++;
    o->pass_bwd = with_bwd;
    o->n_iv = offload_cut_pass(g->slot_of, L, g->offloaded, with_bwd,
                               with_bwd && (o->ready ||
                                            o->armed_k == o->in.grad_accum - 1),
                               o->touched, o->iv, o->at_pos);
    for (int j = 0; j < o->n_iv; j++) {
        o->iv_state[j] = IV_PLANNED;
        o->dep[j] = -1;
        for (int i = j - 1; i >= 0 && o->iv[j].has_bwd; i--)
            if (o->iv[i].slot == o->iv[j].slot && o->iv[i].has_bwd) {
                o->dep[j] = i;
                break;
            }
    }
    o->next_fetch = 0;
    o->pass_active = 1;
    pthread_cond_signal(&o->cv_copy);
}

static void acquire_(offload_ctx *o, int j)
{
    staging_ *B = &o->buf[j % o->nbuf];
    if (!(B->state == BUF_READY && B->pass == o->pass_id && B->iv == j)) {
        double t0 = clock_mono_s();
        while (!(B->state == BUF_READY && B->pass == o->pass_id && B->iv == j))
            pthread_cond_wait(&o->cv_done, &o->mu);
        o->stall_s += clock_mono_s() - t0;
    }
    B->state = BUF_IN_USE;
    int s = o->iv[j].slot;
    o->g->w[s] = B->w;
    o->g->dw[s] = B->has_bwd ? B->dw : NULL;
}

static void release_(offload_ctx *o, int j)
{
    int b = j % o->nbuf, s = o->iv[j].slot;
    staging_ *B = &o->buf[b];
    o->g->w[s] = o->g->dw[s] = NULL;
    o->iv_state[j] = IV_RELEASED;
    if (B->has_bwd) {
        B->state = BUF_DRAINING;
        o->pending_drains[s]++;
        o->drainq[(o->dq_head + o->dq_n++) % o->nbuf] = b;
    } else {
        B->state = BUF_FREE;
        o->iv_state[j] = IV_DRAINED;
    }
    pthread_cond_signal(&o->cv_copy);
}

static void event_(void *ctx, gpt_model *g, gpt_event ev, int layer)
{
    offload_ctx *o = ctx;
    int L = g->cfg.n_layer;
    if (g->n_local == g->n_params)
        return; /* nothing offloaded */
    pthread_mutex_lock(&o->mu);
    switch (ev) {
    case GPT_FWD_START:
        pass_start_(o, o->armed);
        o->armed = 0;
        break;
    case GPT_FWD_DONE:
        if (!o->pass_bwd)
            o->pass_active = 0;
        break;
    case GPT_BWD_DONE:
        o->pass_active = 0;
        break;
    case GPT_FWD_LAYER_BEGIN:
    case GPT_BWD_LAYER_BEGIN:
    case GPT_FWD_LAYER_END:
    case GPT_BWD_LAYER_END: {
        int pos = ev == GPT_FWD_LAYER_BEGIN || ev == GPT_FWD_LAYER_END
                      ? layer : L + (L - 1 - layer);
        int j = o->at_pos[pos];
        if (j < 0)
            break;
        if ((ev == GPT_FWD_LAYER_BEGIN || ev == GPT_BWD_LAYER_BEGIN) &&
            o->iv[j].first == pos)
            acquire_(o, j);
        else if ((ev == GPT_FWD_LAYER_END || ev == GPT_BWD_LAYER_END) &&
                 o->iv[j].last == pos)
            release_(o, j);
        break;
    }
    default:
        break;
    }
    pthread_mutex_unlock(&o->mu);
}

/* ------------------------------------------------------------- storage */

/* Release the placement (lock held, or the threads gone). */
static void free_placement_(offload_ctx *o)
{
    for (int b = 0; b < o->nbuf; b++)
        offload_pool_free(o->dev, o->buf[b].w);
    free(o->buf);
    o->buf = NULL;
    o->nbuf = 0;
    offload_pool_free(o->dev, o->dev_block);
    for (int i = 0; o->host_arr && i < o->n_host_arr; i++)
        offload_pool_free(o->host, o->host_arr[i]);
    for (int s = 0; o->gout && s < o->n_gout; s++)
        offload_pool_free(o->gpool, o->gout[s]);
    free(o->gout);
    o->gout = NULL;
    o->n_gout = o->grads_out = 0;
    free(o->sumsq);
    o->sumsq = NULL;
    free(o->host_arr);
    o->host_arr = NULL;
    o->n_host_arr = 0;
    o->dev_block = NULL;
    offload_pool_trim(o->host);
    free(o->spec_block);
    free(o->spec_old);
    free(o->spec_t);
    free(o->spec_pending);
    o->spec_block = NULL;
    o->spec_old = NULL;
    o->spec_t = NULL;
    o->spec_pending = NULL;
    free(o->updating);
    free(o->touched);
    free(o->adam_queued);
    free(o->pending_drains);
    free(o->iv);
    free(o->at_pos);
    free(o->iv_state);
    free(o->dep);
    free(o->drainq);
    free(o->adamq);
    o->updating = o->touched = o->adam_queued = NULL;
    o->pending_drains = o->at_pos = o->iv_state = o->dep = NULL;
    o->drainq = NULL;
    o->adamq = NULL;
    o->iv = NULL;
}

static void pool_error_(offload_ctx *o, offload_pool *p, const char *what,
                        size_t bytes)
{
    offload_pool_stats st;
    offload_pool_get_stats(p, &st);
    snprintf(o->last_err, sizeof o->last_err,
             "%s pool: cannot allocate %zu bytes for %s (%zu of %zu in use)",
             p == o->dev ? "device" : "host", bytes, what, st.in_use,
             st.capacity);
}

/* Whether offload_create's plan is the one alloc_state_ would make for g:
 * the same slots, the default share map l*S/L, the same microbatch. */
static int first_plan_fits_(const offload_ctx *o, const gpt_model *g)
{
    const offload_plan *p = &o->first;
    int L = g->cfg.n_layer;
    if (!p->placement || p->n_slots != g->S || p->n_layer != L ||
        p->batch_size != g->B)
        return 0;
    int *map = malloc((size_t)L * sizeof(int)), same = map != NULL;
    if (same && gpt_default_share_map(&g->cfg, g->S, map) != 0)
        same = 0;
    for (int l = 0; same && l < L; l++)
        same = g->slot_of[l] == map[l];
    free(map);
    return same;
}

static int alloc_state_(void *ctx, gpt_model *g)
{
    offload_ctx *o = ctx;
    offload_plan plan;
    o->last_err[0] = 0;
    offload_plan_input in = o->in;
    in.model = g->cfg;
    in.n_slots = g->S;
    in.slot_of = g->slot_of;
    in.batch_size = g->B;
    if (first_plan_fits_(o, g)) {
        plan = o->first;    /* the plan made for exactly this state */
        o->first.placement = NULL;
    } else if (offload_plan_make(&in, &plan, o->last_err,
                                 sizeof o->last_err) != 0) {
        errno = ENOMEM;
        return -1;
    }
    int S = g->S, L = g->cfg.n_layer;
    size_t ng = g->n_global, ss = g->slot_size;
    /* the threads are idle (the model was synced) but may wake, and stats
     * may be read: publish the new placement under the lock */
    pthread_mutex_lock(&o->mu);
    offload_plan_free(&o->plan);
    o->plan = plan;
    o->g = g;
    o->W = ss * sizeof(float);  /* the largest kind: staging buffers */
    /* resident slots, and the host block of offloaded ones, at their own
     * kind's sizes (a mixed model's dense and MoE slots) */
    size_t res_floats = 0, off_floats = 0;
    for (int s = 0; s < S; s++) {
        if (plan.placement[s] == OFFLOAD_RESIDENT)
            res_floats += gpt_slot_floats(g, s);
        else
            off_floats += gpt_slot_floats(g, s);
    }
    g->n_local = ng + res_floats;
    /* m and v: AdamW's n_local floats each; Adafactor's first moment
     * (n_local, or none) and its second moment in the af layout, the
     * globals' then each resident slot's (gpt.h gpt_storage); none with
     * the state on the host (optimizer.shard: the model keeps m and v
     * itself, gpt.h state_on_host, the blocks here hold weights and
     * gradients only) */
    int has_m = (!g->adafactor || g->af_first_moment) && !g->state_on_host;
    size_t nm = has_m ? g->n_local : 0;
    size_t nv = g->state_on_host ? 0 : g->n_local;
    if (g->adafactor && !g->state_on_host) {
        nv = g->af_v_global;
        for (int s = 0; s < S; s++) {
            g->af_v_off[s] = nv - g->af_v_global;
            if (plan.placement[s] == OFFLOAD_RESIDENT)
                nv += g->af_v_kind[g->slot_moe[s]];
        }
    }
    size_t nb = (2 * g->n_local + nm + nv) * sizeof(float);
    o->dev_block = offload_pool_alloc(o->dev, nb);
    if (!o->dev_block) {
        pool_error_(o, o->dev, "globals and resident slots", nb);
        goto fail;
    }
    /* each offloaded slot's params, grads, m, v (streamed: no grads; the
     * state on the host: no m, v): a pool block of its own (at its kind's
     * size), so no block straddles a pinned chunk */
    int per = 4 - o->plan.stream_grads - (g->state_on_host ? 2 : 0);
    size_t hb = (size_t)per * off_floats * sizeof(float);
    if (hb) {
        int n = 4 * o->plan.n_offloaded;
        if (!(o->host_arr = calloc((size_t)n, sizeof *o->host_arr)))
            goto oom;
        for (int s = 0; s < S; s++) {
            if (plan.placement[s] == OFFLOAD_RESIDENT)
                continue;
            size_t bytes = gpt_slot_floats(g, s) * sizeof(float);
            size_t vbytes = g->adafactor
                                ? g->af_v_kind[g->slot_moe[s]] * sizeof(float)
                                : bytes;
            for (int a = 0; a < 4; a++, o->n_host_arr++)
                if (!(a == 1 && o->plan.stream_grads) &&
                    !(a == 2 && !has_m) && !(a == 3 && g->state_on_host) &&
                    !(o->host_arr[o->n_host_arr] = offload_pool_alloc(
                          o->host, a == 3 ? vbytes : bytes))) {
                    pool_error_(o, o->host, "offloaded slots", hb);
                    goto fail;
                }
        }
    }
    o->nbuf = o->plan.n_staging;
    o->buf = calloc((size_t)(o->nbuf ? o->nbuf : 1), sizeof *o->buf);
    if (!o->buf)
        goto oom;
    for (int b = 0; b < o->nbuf; b++) {
        o->buf[b].w = offload_pool_alloc(o->dev, 2 * o->W);
        if (!o->buf[b].w) {
            pool_error_(o, o->dev, "a staging buffer", 2 * o->W);
            goto fail;
        }
        o->buf[b].dw = o->buf[b].w + ss;
        o->buf[b].pass = -1;
    }
    o->updating = calloc((size_t)S, 1);
    o->touched = calloc((size_t)S, 1);
    o->adam_queued = calloc((size_t)S, 1);
    o->pending_drains = calloc((size_t)S, sizeof(int));
    o->iv = calloc(2 * (size_t)L, sizeof *o->iv);
    o->at_pos = calloc(2 * (size_t)L, sizeof(int));
    o->iv_state = calloc(2 * (size_t)L, sizeof(int));
    o->dep = calloc(2 * (size_t)L, sizeof(int));
    o->drainq = calloc((size_t)(o->nbuf ? o->nbuf : 1), sizeof(int));
    o->adamq = calloc((size_t)S, sizeof *o->adamq);
    if (o->plan.stream_grads) {
        o->gout = calloc((size_t)S, sizeof *o->gout);
        o->sumsq = calloc((size_t)S, sizeof *o->sumsq);
        if (!o->gout || !o->sumsq || !o->gpool)
            goto oom;
        o->n_gout = S;
    }
    if (o->plan.speculative && g->state_on_host) {
        snprintf(o->last_err, sizeof o->last_err,
                 "offload: the speculative update keeps a copy of each "
                 "offloaded slot's state, which lives apart with "
                 "optimizer.shard (offload.speculative: off)");
        goto fail;
    }
    if (o->plan.speculative) {
        size_t sb = (size_t)o->plan.n_offloaded * 3 * o->W;
        o->spec_block = malloc(sb);
        o->spec_old = calloc((size_t)S, sizeof *o->spec_old);
        o->spec_t = calloc((size_t)S, sizeof(long));
        o->spec_pending = calloc((size_t)S, 1);
        if (!o->spec_block || !o->spec_old || !o->spec_t ||
            !o->spec_pending) {
            snprintf(o->last_err, sizeof o->last_err,
                     "offload: cannot allocate %zu bytes of host memory for "
                     "the speculative update's second buffers "
                     "(offload.speculative: off does without)", sb);
            goto fail;
        }
        for (int s = 0, k = 0; s < S; s++)
            if (plan.placement[s] != OFFLOAD_RESIDENT)
                o->spec_old[s] = o->spec_block + (size_t)k++ * 3 * ss;
    }
    if (!o->updating || !o->touched || !o->adam_queued || !o->pending_drains ||
        !o->iv || !o->at_pos || !o->iv_state || !o->dep || !o->drainq ||
        !o->adamq)
        goto oom;
    o->qcap_s = S;
    o->dq_head = o->dq_n = o->aq_head = o->aq_n = 0;
    o->pass_active = o->armed = 0;

    g->params = o->dev_block;
    g->grads = g->params + g->n_local;
    g->m = has_m ? g->grads + g->n_local : NULL;
    g->v = g->state_on_host ? NULL : g->grads + g->n_local + nm;
    size_t r = ng, k = 0;
    for (int s = 0; s < S; s++) {
        gpt_slot_state *st = &g->slots[s];
        size_t n = gpt_slot_floats(g, s);
        if (o->plan.placement[s] == OFFLOAD_RESIDENT) {
            size_t off = r;
            r += n;
            *st = (gpt_slot_state){
                g->params + off, g->grads + off, has_m ? g->m + off : NULL,
                !g->v          ? NULL
                : g->adafactor ? g->v + g->af_v_global + g->af_v_off[s]
                               : g->v + off};
            g->w[s] = st->params;
            g->dw[s] = st->grads;
            g->offloaded[s] = 0;
        } else {
            float **h = o->host_arr + 4 * k++;
            *st = (gpt_slot_state){h[0], h[1], h[2], h[3]};
            g->w[s] = g->dw[s] = NULL;
            g->offloaded[s] = 1;
        }
    }
    pthread_mutex_unlock(&o->mu);
    return 0;
oom:
    snprintf(o->last_err, sizeof o->last_err, "offload: out of memory");
fail:
    free_placement_(o);
    pthread_mutex_unlock(&o->mu);
    errno = ENOMEM;
    return -1;
}

static void free_state_(void *ctx, gpt_model *g)
{
    offload_ctx *o = ctx;
    offload_sync(o);
    pthread_mutex_lock(&o->mu);
    free_placement_(o);
    pthread_mutex_unlock(&o->mu);
    g->params = g->grads = g->m = g->v = NULL;
}

static float *alloc_acts_(void *ctx, size_t floats)
{
    offload_ctx *o = ctx;
    float *p = offload_pool_alloc(o->dev, floats * sizeof(float));
    if (!p)
        pool_error_(o, o->dev, "activations", floats * sizeof(float));
    return p;
}

static void free_acts_(void *ctx, float *p)
{
    offload_ctx *o = ctx;
    offload_pool_free(o->dev, p);
}

/* ------------------------------------------------------------- public */

offload_ctx *offload_create(const offload_plan_input *in, int host_threads,
                            const offload_plan *first, char *err,
                            size_t errlen)
{
    offload_ctx *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, errlen, "offload: out of memory");
        return NULL;
    }
    o->in = *in;
    o->in.slot_of = NULL;
    if (first && offload_plan_copy(&o->first, first) != 0) {
        snprintf(err, errlen, "offload: out of memory");
        free(o);
        return NULL;
    }
    o->storage = (gpt_storage){
        /* .ctx         = */ o,
        /* .alloc_state = */ alloc_state_,
        /* .free_state  = */ free_state_,
        /* .alloc_acts  = */ alloc_acts_,
        /* .free_acts   = */ free_acts_,
        /* .event       = */ event_,
    };
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv_copy, NULL);
    pthread_cond_init(&o->cv_work, NULL);
    pthread_cond_init(&o->cv_done, NULL);
    o->dev = offload_device_pool_create(in->budget);
    o->host = offload_host_pool_create(HOST_CHUNK_);
    if (in->stream_grads)
        o->gpool = offload_host_pool_create(HOST_CHUNK_);
    if (!o->dev || !o->host || (in->stream_grads && !o->gpool)) {
        snprintf(err, errlen, "offload: cannot create the memory pools "
                 "(device budget %zu bytes)", in->budget);
        goto fail;
    }
    if (threads_start(&o->copy_thread, copy_main_, o) != 0) {
        snprintf(err, errlen, "offload: cannot start the copy thread");
        goto fail;
    }
    int nthreads = host_threads;
    o->host_threads = calloc((size_t)nthreads, sizeof(pthread_t));
    for (int i = 0; o->host_threads && i < nthreads; i++) {
        if (threads_start(&o->host_threads[i], host_thread_main_, o) != 0)
            break;
        o->n_host_threads++;
    }
    if (o->n_host_threads != nthreads) {
        snprintf(err, errlen, "offload: cannot start %d host threads",
                 nthreads);
        offload_free(o);
        return NULL;
    }
    return o;
fail:
    offload_pool_destroy(o->dev);
    offload_pool_destroy(o->host);
    offload_pool_destroy(o->gpool);
    offload_plan_free(&o->first);
    free(o);
    return NULL;
}

void offload_free(offload_ctx *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->quit = 1;
    pthread_cond_broadcast(&o->cv_copy);
    pthread_cond_broadcast(&o->cv_work);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->copy_thread, NULL);
    for (int i = 0; i < o->n_host_threads; i++)
        pthread_join(o->host_threads[i], NULL);
    free(o->host_threads);
    free_placement_(o);
    offload_plan_free(&o->plan);
    offload_plan_free(&o->first);
    offload_pool_destroy(o->dev);
    offload_pool_destroy(o->host);
    offload_pool_destroy(o->gpool);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv_copy);
    pthread_cond_destroy(&o->cv_work);
    pthread_cond_destroy(&o->cv_done);
    free(o);
}

const gpt_storage *offload_storage(offload_ctx *o) { return &o->storage; }
const char *offload_last_error(const offload_ctx *o) { return o->last_err; }
const offload_plan *offload_current_plan(const offload_ctx *o)
{
    return &o->plan;
}

void offload_step_begin(offload_ctx *o, const offload_adam *early)
{
    pthread_mutex_lock(&o->mu);
    int S = o->g->S;
    spec_revert_(o); /* the last step failed before offload_adamw */
    o->speculate = o->summed = 0;
    memset(o->touched, 0, (size_t)S);
    memset(o->adam_queued, 0, (size_t)S);
    o->early = early != NULL;
    o->grad_div = NULL;
    if (early)
        o->adam = *early;
    pthread_mutex_unlock(&o->mu);
}

void offload_set_grad_divisors(offload_ctx *o, const int *div)
{
    pthread_mutex_lock(&o->mu);
    o->grad_div = div;
    pthread_mutex_unlock(&o->mu);
}

void offload_step_speculate(offload_ctx *o, const offload_adam *a)
{
    pthread_mutex_lock(&o->mu);
    if (o->spec_pending && !o->early) {
        o->speculate = 1;
        o->adam = *a;
        o->adam.grad_scale = 1.0f;
    }
    pthread_mutex_unlock(&o->mu);
}

void offload_step_speculate_summed(offload_ctx *o, const offload_adam *a)
{
    offload_step_speculate(o, a);
    pthread_mutex_lock(&o->mu);
    o->summed = o->speculate;
    pthread_mutex_unlock(&o->mu);
}

void offload_grad_summed(offload_ctx *o, int s)
{
    pthread_mutex_lock(&o->mu);
    if (o->speculate && o->summed && s >= 0 && s < o->g->S &&
        o->g->offloaded[s] && !o->adam_queued[s] && !o->updating[s]) {
        queue_adam_(o, s, &o->adam);
        o->adamq[(o->aq_head + o->aq_n - 1) % o->qcap_s].spec = JOB_SPECULATE;
        o->spec_pending[s] = 1;
    }
    pthread_mutex_unlock(&o->mu);
}

void offload_microbatch(offload_ctx *o, int k)
{
    pthread_mutex_lock(&o->mu);
    o->armed = 1;
    o->armed_k = k;
    pthread_mutex_unlock(&o->mu);
}

void offload_set_grad_ready(offload_ctx *o, void (*ready)(void *ctx, int s),
                            void *ready_ctx)
{
    pthread_mutex_lock(&o->mu);
    o->ready = ready;
    o->ready_ctx = ready_ctx;
    pthread_mutex_unlock(&o->mu);
}

void offload_wait_grads(offload_ctx *o)
{
    pthread_mutex_lock(&o->mu);
    int S = o->g->S, busy = 1;
    double t0 = clock_mono_s();
    while (busy) {
        busy = o->dq_n > 0;
        for (int s = 0; s < S && !busy; s++)
            busy = o->pending_drains[s] > 0;
        if (busy)
            pthread_cond_wait(&o->cv_done, &o->mu);
    }
    o->stall_s += clock_mono_s() - t0;
    pthread_mutex_unlock(&o->mu);
}

static _Atomic int spec_wait_;

void offload_test_spec_wait(int wait) { spec_wait_ = wait; }

void offload_adamw(offload_ctx *o, const offload_adam *a)
{
    pthread_mutex_lock(&o->mu);
    for (int s = 0; spec_wait_ && o->speculate && s < o->g->S; s++)
        while (o->spec_pending[s] && o->updating[s])
            pthread_cond_wait(&o->cv_done, &o->mu);
    /* speculative updates: the unclipped update has the clipped one's bits
     * exactly when the scale is 1; else each is redone from its old state
     * (a job still queued is simply given the scale) */
    int kept = a->grad_scale == 1.0f;
    if (o->speculate) {
        o->spec_steps++;
        o->redo_steps += !kept;
    }
    for (int s = 0; o->speculate && s < o->g->S; s++) {
        if (!o->spec_pending[s])
            continue;
        o->spec_pending[s] = 0;
        if (kept)
            continue;
        int queued = 0;
        for (int i = 0; i < o->aq_n && !queued; i++) {
            adam_job_ *j = &o->adamq[(o->aq_head + i) % o->qcap_s];
            if (j->slot == s) {
                j->spec = JOB_PLAIN;
                j->a = *a;
                queued = 1;
            }
        }
        if (queued)
            continue;
        while (o->updating[s])
            pthread_cond_wait(&o->cv_done, &o->mu);
        queue_adam_(o, s, a);
        o->adamq[(o->aq_head + o->aq_n - 1) % o->qcap_s].spec = JOB_REDO;
        o->spec_restores++;
    }
    o->speculate = 0;
    for (int s = 0; s < o->g->S; s++) {
        if (!o->g->offloaded[s] || o->adam_queued[s])
            continue;
        /* a slot no layer uses was never fetched: its last update may
         * still be queued; one job per slot in the ring */
        while (o->updating[s])
            pthread_cond_wait(&o->cv_done, &o->mu);
        if (o->gout && !o->gout[s]) { /* streamed: a zero gradient */
            while (o->grads_out >= o->plan.n_grad_bufs)
                pthread_cond_wait(&o->cv_done, &o->mu);
            size_t gb = gpt_slot_floats(o->g, s) * sizeof(float);
            if (!(o->gout[s] = offload_pool_alloc(o->gpool, gb)))
                continue; /* out of memory: the unused slot keeps its state */
            o->g->slots[s].grads = o->gout[s];
            o->grads_out++;
            o->sumsq[s] = 0.0;
        }
        queue_adam_(o, s, a);
    }
    pthread_mutex_unlock(&o->mu);
}

int offload_stream_sumsq(offload_ctx *o, double *out)
{
    pthread_mutex_lock(&o->mu);
    int on = o->sumsq != NULL;
    for (int s = 0; on && s < o->g->S; s++)
        out[s] = o->g->offloaded[s] ? o->sumsq[s] : 0.0;
    pthread_mutex_unlock(&o->mu);
    return on ? 0 : -1;
}

void offload_sync(offload_ctx *o)
{
    pthread_mutex_lock(&o->mu);
    if (o->g)
        spec_revert_(o); /* a failed step's speculative updates */
    for (;;) {
        int busy = o->dq_n > 0 || o->aq_n > 0;
        for (int s = 0; o->g && o->updating && s < o->g->S && !busy; s++)
            busy = o->updating[s] || o->pending_drains[s] > 0;
        if (!busy)
            break;
        pthread_cond_wait(&o->cv_done, &o->mu);
    }
    pthread_mutex_unlock(&o->mu);
}

void offload_test_hold_updates(offload_ctx *o, int hold)
{
    pthread_mutex_lock(&o->mu);
    o->hold = hold;
    pthread_cond_broadcast(&o->cv_work);
    pthread_mutex_unlock(&o->mu);
}

/* st's rates and hidden fraction, from its bytes and seconds. */
static void rates_(offload_stats *st)
{
    st->h2d_gbps = st->h2d_s > 0 ? st->h2d_bytes / st->h2d_s / 1e9 : 0;
    st->d2h_gbps = st->d2h_s > 0 ? st->d2h_bytes / st->d2h_s / 1e9 : 0;
    double copy = st->h2d_s + st->d2h_s;
    st->hidden_fraction = 1.0;
    if (copy > 0) {
        double h = 1.0 - st->stall_s / copy;
        st->hidden_fraction = h < 0 ? 0 : h > 1 ? 1 : h;
    }
}

void offload_get_stats(offload_ctx *o, offload_stats *st)
{
    memset(st, 0, sizeof *st);
    st->enabled = 1;
    offload_pool_get_stats(o->dev, &st->device);
    offload_pool_get_stats(o->host, &st->host);
    if (o->gpool)
        offload_pool_get_stats(o->gpool, &st->grads);
    pthread_mutex_lock(&o->mu);
    st->stream_grads = o->plan.stream_grads;
    st->n_grad_bufs = o->plan.n_grad_bufs;
    st->stream_skips = o->stream_skips;
    st->n_slots = o->plan.n_slots;
    st->n_resident = o->plan.n_resident;
    st->n_offloaded = o->plan.n_offloaded;
    st->n_staging = o->plan.n_staging;
    st->budget_bytes = o->plan.budget_bytes;
    st->predicted_peak_bytes = o->plan.peak_device_bytes;
    st->h2d_bytes = o->h2d_bytes;
    st->d2h_bytes = o->d2h_bytes;
    st->h2d_s = o->h2d_s;
    st->d2h_s = o->d2h_s;
    st->stall_s = o->stall_s;
    st->adam_s = o->adam_s;
    st->speculative = o->plan.speculative;
    st->spec_bytes = o->spec_block ? (size_t)o->plan.n_offloaded * 3 * o->W
                                   : 0;
    st->spec_steps = o->spec_steps;
    st->redo_steps = o->redo_steps;
    st->spec_restores = o->spec_restores;
    pthread_mutex_unlock(&o->mu);
    rates_(st);
}

void offload_stats_carry(offload_stats *st, const offload_stats *earlier)
{
    st->h2d_bytes += earlier->h2d_bytes;
    st->d2h_bytes += earlier->d2h_bytes;
    st->h2d_s += earlier->h2d_s;
    st->d2h_s += earlier->d2h_s;
    st->stall_s += earlier->stall_s;
    st->adam_s += earlier->adam_s;
    st->spec_steps += earlier->spec_steps;
    st->redo_steps += earlier->redo_steps;
    st->spec_restores += earlier->spec_restores;
    st->stream_skips += earlier->stream_skips;
    rates_(st);
}
