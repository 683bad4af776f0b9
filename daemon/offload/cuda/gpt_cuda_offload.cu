/*
 * gpt_cuda_offload.cu — granular CPU offloading for gpt_cuda (gpt_cuda.h,
 * "offloading"; M6-10T and DESIGN.md section 1): host slots, the staging
 * buffers and the copy and drain streams, the interval schedule of a pass,
 * and the host threads that accumulate gradients and run AdamW.
 *
 * Who does what:
 *   compute thread (the caller of gpt_cuda_*): issues every kernel, copy
 *     and event. Before a fetch of slot s it waits (host side) until no
 *     AdamW of s is queued or running, because the fetch reads s's bf16
 *     working copy; before a drain of s it waits until s's previous
 *     accumulation is done, because the drain overwrites s's landing
 *     buffer. Both waits are normally already satisfied.
 *   copy stream: fetches (host bf16 -> staging weights); drain stream:
 *     drains (staging gradient -> host bf16), so that in backward a drain
 *     and the next fetch overlap. Ordered with the compute stream by events
 *     only: a fetch waits for the buffer's previous compute (freed), the
 *     compute stream waits for the fetch, a drain waits for the compute
 *     (freed), and the next interval's zeroing of the buffer's gradient
 *     waits for the drain (drained).
 *   host threads: jobs over element ranges (chunks) of a slot, so a few
 *     large slots still use every thread: ACCUM (wait for the drain, add
 *     the bf16 gradient to the fp32 accumulator, then, when final, its sum
 *     of squares and, with early updates, AdamW), ADAM, SUMSQ, TO_BF16.
 *     The loops are kernels/offload_host.h's. A slot drained once in a
 *     step (one microbatch, no sharing) skips the accumulator: its sum of
 *     squares and AdamW read the landed bf16 gradient (job.from_bf), which
 *     moves 8 fewer bytes per parameter through host memory and gives the
 *     same bits; its next drain waits for that AdamW.
 *     An early update (no clipping) waits for the slot's whole gradient:
 *     the last of its final ACCUM chunks queues its ADAM chunks when the
 *     slot's sum of squares is finite, and skips them (the slot keeps its
 *     state) when it is not; until then a token in adam_jobs holds the
 *     slot's next fetch and drain.
 *     Streamed gradients (n_grad_bufs > 0): a slot has no accumulator and
 *     no landing buffer of its own; its drain takes one of n_grad_bufs
 *     pinned buffers (waiting while all are out), and the slot gives it
 *     back once its early update is done or skipped. Each offloaded slot
 *     is drained once a step (the planner checks it).
 *     With Adafactor (optimizer.name adafactor) the update is one
 *     ADAFACTOR job per slot (a matrix's row and column statistics need
 *     its whole gradient: no chunks, no speculation), queued by
 *     gpt_offload_adafactor after the step's norm, the gradient
 *     accumulated into gacc (fp32, what kernels.h's Adafactor reads); or,
 *     streamed (gpt_offload_set_adafactor), early by resolve_early_ on the
 *     landed bf16 gradient, widened into a scratch.
 * One mutex guards the queue and the per-slot counters; nothing spins.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

/* elements per host job, at least; tests/unit/offload_mock builds this file
 * with a small one so that its small slots still make several chunks */
#ifndef MIN_CHUNK
#define MIN_CHUNK (1u << 18)
#endif

static hslot_ *hslot_of_(gpt_cuda *g, int s)
{
    return &g->off.hs[s - g->n_res];
}

/* ------------------------------------------------------------ host jobs */

/* AdamW over elements [i0, i1) of a host slot, tensor by tensor (decay on
 * 2-D tensors only), and the bf16 working copy: host_adamw_bf16, the
 * formula of kernels.h, computed as adamw_kernel in adamw.cu (fp32, bias
 * corrections in double rounded to float). The gradient is gacc, or gbf
 * when j->from_bf. The slot's tail padding is zero in master and wbf.
 * bf16 masters (g->mbf): no fp32 master; wbf is updated in place, each
 * weight rounded stochastically with the CPU model's key of its tensor
 * (host_adamw_sr_bf16). */
static void adam_range_(const gpt_cuda *g, hslot_ *h, const hjob_ *j)
{
    for (int k = 0; k < h->nt; k++) {
        size_t a = h->ts[k].off, b = a + h->ts[k].numel;
        if (a < j->i0) a = j->i0;
        if (b > j->i1) b = j->i1;
        if (a >= b)
            continue;
        float wd = h->ts[k].two_d ? j->wd : 0.0f;
        if (g->mbf) /* bf16 masters: wbf is the master, keyed by tensor */
            host_adamw_sr_bf16(h->wbf + a, h->m + a, h->v + a,
                               j->from_bf ? NULL : h->gacc + a, h->gbf + a,
                               b - a, j->lr, j->beta1, j->beta2, j->eps, wd,
                               j->scale, j->t,
                               gpt_cuda_sr_key_(g, j->slot, h->ts[k].off),
                               a - h->ts[k].off);
        else if (j->spec) /* speculative: old state kept, new in the second */
            host_adamw_bf16_to(h->master + a, h->m + a, h->v + a,
                               h->master2 + a, h->m2 + a, h->v2 + a,
                               h->wbf2 + a, j->from_bf ? NULL : h->gacc + a,
                               h->gbf + a, b - a, j->lr, j->beta1, j->beta2,
                               j->eps, wd, j->scale, j->t);
        else
            host_adamw_bf16(h->master + a, h->m + a, h->v + a, h->wbf + a,
                            j->from_bf ? NULL : h->gacc + a, h->gbf + a,
                            b - a, j->lr, j->beta1, j->beta2, j->eps, wd,
                            j->scale, j->t);
    }
}

/* Adafactor of a whole host slot: its kind's gpt_af_tensors tensors (the
 * CPU model's tensors and state layout, so checkpoints and the delink move
 * the state as they move a CPU slot's) through kernels.h
 * adafactor_update_spans on the fp32 master, the accumulated gradient and
 * the slot's m (or NULL) and v, at step count j->t; then the bf16 working
 * copy. bf16 masters (g->mbf): the master is the bf16 copy, widened into
 * a scratch of the slot's size for the update (each span rounding with
 * the CPU model's key of its tensor, so every value stays a bf16 one) and
 * written back exactly. Out of host memory (the tensor list, the scratch,
 * the column sums): reported and m6d exits, as for the job queue. */
static void adafactor_slot_(const gpt_cuda *g, hslot_ *h, const hjob_ *j)
{
    /* a scratch of two slots: the widened bf16 master (bf16 masters) and
     * the widened landed gradient (streamed: no accumulator) */
    float *scratch = NULL, *p = h->master, *gr = h->gacc;
    if (g->mbf || j->from_bf) {
        scratch = (float *)malloc((2 * h->n + 1) * sizeof(float));
        if (!scratch) {
            fprintf(stderr, "gpt_cuda offload: out of host memory for slot "
                            "%d's Adafactor\n", j->slot);
            exit(1);
        }
        if (g->mbf) {
            p = scratch;
            for (size_t i = 0; i < h->n; i++)
                p[i] = bf16_to_f32(h->wbf[i]);
        }
        if (j->from_bf) {
            gr = scratch + h->n;
            for (size_t i = 0; i < h->n; i++)
                gr[i] = bf16_to_f32(h->gbf[i]);
        }
    }
    int nt = gpt_af_tensors(&g->cfg, h->kind, NULL, NULL);
    gpt_af_tensor *ts = nt > 0 ? (gpt_af_tensor *)malloc((size_t)nt *
                                                         sizeof *ts)
                               : NULL;
    adafactor_span *sp = nt > 0 ? (adafactor_span *)malloc((size_t)nt *
                                                           sizeof *sp)
                                : NULL;
    if (!ts || !sp || gpt_af_tensors(&g->cfg, h->kind, ts, NULL) != nt) {
        fprintf(stderr, "gpt_cuda offload: out of host memory for slot "
                        "%d's Adafactor\n", j->slot);
        exit(1);
    }
    for (int i = 0; i < nt; i++) {
        const gpt_af_tensor *a = &ts[i];
        float *r = h->v + a->state_off;
        uint64_t key = g->mbf ? gpt_cuda_sr_key_(g, j->slot, a->offset) : 0;
        sp[i] = (adafactor_span){p + a->offset, gr + a->offset,
                                 h->m ? h->m + a->offset : NULL, r,
                                 a->cols ? r + a->rows : NULL, a->rows,
                                 a->cols, a->decay ? j->wd : 0.0f, j->t, key};
    }
    if (adafactor_update_spans(sp, nt, &j->af) != 0) {
        fprintf(stderr, "gpt_cuda offload: out of host memory in slot "
                        "%d's Adafactor\n", j->slot);
        exit(1);
    }
    free(ts);
    free(sp);
    host_to_bf16(h->wbf, p, h->n);
    free(scratch);
}

static double sumsq_range_(const hslot_ *h, const hjob_ *j)
{
    if (j->from_bf && !h->gbf) /* streamed, given back: nothing landed */
        return 0.0;
    return j->from_bf ? host_sumsq_bf16(h->gbf + j->i0, j->i1 - j->i0)
                      : host_sumsq_f32(h->gacc + j->i0, j->i1 - j->i0);
}

/* An ACCUM job first waits for its slot's gradient to land (the drain
 * copy, and the backward before it): outside the job's timed part, so
 * that the accumulation time is the host's work, not the device's. The
 * first chunk's job returns the drain copy's time in ms, the others 0. */
static double wait_drained_(gpt_cuda *g, const hjob_ *j)
{
    hslot_ *h = hslot_of_(g, j->slot);
    CUDA_CHECK(cudaEventSynchronize(h->drained));
    float ms = 0.0f;
    if (j->i0 == 0)
        CUDA_CHECK(cudaEventElapsedTime(&ms, h->d2h_start, h->drained));
    return ms;
}

/* Run one job outside the lock (an ACCUM after wait_drained_); returns its
 * sum of squares (or 0). */
static double run_job_(gpt_cuda *g, const hjob_ *j)
{
    hslot_ *h = hslot_of_(g, j->slot);
    double ss = 0.0;
    switch (j->kind) {
    case JOB_ACCUM:
        if (!j->from_bf) /* else the gradient stays in gbf */
            host_grad_accumulate(h->gacc + j->i0, h->gbf + j->i0,
                                 j->i1 - j->i0, !j->first);
        if (j->final)
            ss = sumsq_range_(h, j);
        break; /* j->adam: the host thread runs adam_range_ after publishing */
    case JOB_ADAM:
        adam_range_(g, h, j);
        break;
    case JOB_SUMSQ:
        ss = sumsq_range_(h, j);
        break;
    case JOB_TO_BF16:
        host_to_bf16(h->wbf + j->i0, h->master + j->i0, j->i1 - j->i0);
        break;
    case JOB_ADAFACTOR:
        adafactor_slot_(g, h, j);
        break;
    }
    return ss;
}

static void queue_chunks_(gpt_cuda *g, const hjob_ *proto);

/* Job j's AdamW hyperparameters: this step's (gpt_cuda_step_begin), at
 * clip scale 1 (an early or speculative update). */
static void unclipped_(const offload_rt_ *o, hjob_ *j)
{
    j->lr = o->lr;
    j->beta1 = o->beta1;
    j->beta2 = o->beta2;
    j->eps = o->eps;
    j->wd = o->wd;
    j->scale = 1.0f;
}

/* Streamed gradients: slot h's landing buffer back to the pool (lock
 * held). */
static void gbuf_release_(offload_rt_ *o, hslot_ *h)
{
    if (!o->n_gbufs || !h->gbf)
        return;
    o->gfree[o->n_gfree++] = h->gbf;
    h->gbf = NULL;
    h->gbf_release = 0;
    pthread_cond_broadcast(&o->cv_done);
}

/* Streamed gradients: a pool buffer for slot h, zeroed, as its gradient
 * (a slot no layer used this step), waiting while none is free (lock
 * held; its last update is done). */
static void gbuf_zero_(offload_rt_ *o, hslot_ *h)
{
    while (o->n_gfree == 0)
        pthread_cond_wait(&o->cv_done, &o->mu);
    h->gbf = o->gfree[--o->n_gfree];
    if (o->n_gbufs - o->n_gfree > o->gbuf_peak)
        o->gbuf_peak = o->n_gbufs - o->n_gfree;
    memset(h->gbf, 0, h->n * sizeof(uint16_t));
    h->g_in_bf = 1;
}

/* The early update of slot s, whose final gradient's chunks are all
 * summed (lock held): queued when the slot's sum of squares is finite,
 * else skipped (the slot keeps its weights, moments and step count; a
 * streamed slot's buffer goes back); then the token taken by
 * gpt_offload_leave is given back. */
static void resolve_early_(gpt_cuda *g, int s)
{
    offload_rt_ *o = &g->off;
    hslot_ *h = hslot_of_(g, s);
    size_t nc = ceil_div(h->n, o->chunk);
    double ss = 0.0;
    for (size_t c = 0; c < nc; c++)
        ss += h->ssq[c];
    h->pending = 0;
    if (isfinite(ss)) {
        hjob_ j;
        memset(&j, 0, sizeof j);
        j.kind = o->af_early ? JOB_ADAFACTOR : JOB_ADAM;
        j.af = o->af_h;
        j.af.grad_scale = 1.0f;
        j.slot = s;
        j.from_bf = h->g_in_bf;
        unclipped_(o, &j);
        j.t = ++g->adam_t_slot[s];
        h->gbf_release = 1;
        queue_chunks_(g, &j);
    } else {
        o->skips++;
        gbuf_release_(o, h);
    }
    h->adam_jobs--; /* the token */
    pthread_cond_broadcast(&o->cv_done);
}

static void *host_thread_(void *arg)
{
    gpt_cuda *g = (gpt_cuda *)arg;
    offload_rt_ *o = &g->off;
    CUDA_CHECK(cudaSetDevice(o->device)); /* the model's, for event calls */
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->quit && o->q_n == 0)
            pthread_cond_wait(&o->cv_job, &o->mu);
        if (o->q_n == 0)
            break; /* quit */
        hjob_ j = o->q[o->q_head];
        o->q_head = (o->q_head + 1) % o->q_cap;
        o->q_n--;
        o->running++;
        pthread_mutex_unlock(&o->mu);

        double d2h_ms = j.kind == JOB_ACCUM ? wait_drained_(g, &j) : 0.0;
        double t0 = clock_mono_s();
        double ss = run_job_(g, &j);
        double dt = clock_mono_s() - t0;

        pthread_mutex_lock(&o->mu);
        hslot_ *h = hslot_of_(g, j.slot);
        o->d2h_ms += d2h_ms;
        if (j.kind == JOB_ACCUM || j.kind == JOB_SUMSQ) {
            /* one partial per chunk, summed in chunk order by
             * gpt_offload_grad_sumsq: the norm does not depend on which job
             * finished first */
            if (j.final || j.kind == JOB_SUMSQ)
                h->ssq[j.i0 / o->chunk] = ss;
            if (--h->accum_jobs == 0 && (j.final || j.kind == JOB_SUMSQ))
                h->sumsq_done = 1;
            if (h->accum_jobs == 0 && h->pending)
                resolve_early_(g, j.slot);
        }
        if (j.kind == JOB_ACCUM && j.adam) {
            /* the gradient of this chunk is final and counted: let
             * gpt_offload_grad_sumsq / gpt_offload_step_begin go on while its early
             * AdamW runs (still counted in running and adam_jobs) */
            o->accum_s += dt;
            pthread_cond_broadcast(&o->cv_done);
            pthread_mutex_unlock(&o->mu);
            t0 = clock_mono_s();
            adam_range_(g, h, &j);
            dt = clock_mono_s() - t0;
            pthread_mutex_lock(&o->mu);
            h->adam_jobs--;
            o->adam_s += dt;
        } else if (j.kind == JOB_ADAM || j.kind == JOB_ADAFACTOR ||
                   j.kind == JOB_TO_BF16) {
            h->adam_jobs--;
            if (j.kind != JOB_TO_BF16)
                o->adam_s += dt;
            if (h->adam_jobs == 0 && h->gbf_release)
                gbuf_release_(o, h);
            else
                o->accum_s += dt;
        } else {
            o->accum_s += dt;
        }
        o->running--;
        pthread_cond_broadcast(&o->cv_done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Queue job *proto over every chunk of its slot (an ADAFACTOR job: one,
 * the whole slot) and count the jobs on the slot, as host_thread_
 * uncounts them: ACCUM and SUMSQ in accum_jobs; ADAM, ADAFACTOR, TO_BF16
 * and an ACCUM with adam in adam_jobs. Called with the lock held. */
static void queue_chunks_(gpt_cuda *g, const hjob_ *proto)
{
    offload_rt_ *o = &g->off;
    size_t n = hslot_of_(g, proto->slot)->n;
    size_t c = proto->kind == JOB_ADAFACTOR ? n : o->chunk;
    int nj = (int)ceil_div(n, c);
    if (o->q_n + nj > o->q_cap) {
        int cap = 2 * (o->q_cap + nj);
        hjob_ *q = (hjob_ *)malloc((size_t)cap * sizeof *q);
        if (!q) {
            fprintf(stderr, "gpt_cuda offload: out of host memory for the "
                            "job queue\n");
            exit(1);
        }
        for (int i = 0; i < o->q_n; i++)
            q[i] = o->q[(o->q_head + i) % o->q_cap];
        free(o->q);
        o->q = q;
        o->q_head = 0;
        o->q_cap = cap;
    }
    for (int k = 0; k < nj; k++) {
        hjob_ j = *proto;
        j.i0 = (size_t)k * c;
        j.i1 = j.i0 + c < n ? j.i0 + c : n;
        o->q[(o->q_head + o->q_n++) % o->q_cap] = j;
    }
    hslot_ *h = hslot_of_(g, proto->slot);
    if (proto->kind == JOB_ACCUM || proto->kind == JOB_SUMSQ)
        h->accum_jobs += nj;
    if (proto->kind == JOB_ADAM || proto->kind == JOB_ADAFACTOR ||
        proto->kind == JOB_TO_BF16 || (proto->kind == JOB_ACCUM && proto->adam))
        h->adam_jobs += nj;
    pthread_cond_broadcast(&o->cv_job);
}

/* Wait (lock held) until no slot has an accumulation or sum of squares
 * queued or running. */
static void wait_accums_(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    for (int s = g->n_res; s < g->S; s++)
        while (hslot_of_(g, s)->accum_jobs > 0)
            pthread_cond_wait(&o->cv_done, &o->mu);
}

/* Forget the speculative updates not yet kept or redone (a step that
 * never reached gpt_offload_adamw, or state read in the middle of one): their
 * second buffers are simply not used; the slot's step count goes back and
 * it is updated again by gpt_offload_adamw if that comes. Lock held; waits for
 * the slots' jobs. */
static void spec_drop_(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    for (int s = g->n_res; o->hs && s < g->S; s++) {
        hslot_ *h = hslot_of_(g, s);
        if (!h->spec)
            continue;
        while (h->adam_jobs > 0)
            pthread_cond_wait(&o->cv_done, &o->mu);
        g->adam_t_slot[s] = h->spec_t;
        h->spec = h->updated = 0;
    }
}

/* drop: forget unresolved speculation (gpt_offload_wait_idle); gpt_offload_fini may
 * run after the host slots are freed, so it does not */
static void wait_idle_(gpt_cuda *g, int drop)
{
    offload_rt_ *o = &g->off;
    if (!o->enabled)
        return;
    pthread_mutex_lock(&o->mu);
    while (o->q_n > 0 || o->running > 0)
        pthread_cond_wait(&o->cv_done, &o->mu);
    if (drop)
        spec_drop_(g);
    pthread_mutex_unlock(&o->mu);
}

void gpt_offload_wait_idle(gpt_cuda *g)
{
    wait_idle_(g, 1);
}

void gpt_offload_refresh_bf16(gpt_cuda *g, int s)
{
    offload_rt_ *o = &g->off;
    if (g->mbf) /* the bf16 copy is the master: nothing to make */
        return;
    hjob_ j;
    memset(&j, 0, sizeof j);
    j.kind = JOB_TO_BF16;
    j.slot = s;
    pthread_mutex_lock(&o->mu);
    queue_chunks_(g, &j);
    pthread_mutex_unlock(&o->mu);
    gpt_offload_wait_idle(g);
}

/* ------------------------------------------------------------ runtime */

static void *host_alloc_(size_t bytes, int *pinned);
static void host_free_(void *p, int pinned);

/* Streamed gradients: the pool of n_gbufs pinned landing buffers of the
 * largest slot, made with the staging buffers (while some slot is
 * offloaded, as the planner counts it). 0, or -1 out of host memory (a
 * message). */
static int gpool_alloc_(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    size_t per = g->slot_size, bytes = (size_t)o->n_gbufs * per * 2;
    if (!o->n_gbufs || o->gpool)
        return 0;
    o->gpool = (uint16_t *)host_alloc_(bytes, &o->gpool_pinned);
    if (!o->gpool) {
        fprintf(stderr, "gpt_cuda: out of host memory for %d streamed "
                        "gradient buffers (%.1f MiB)\n", o->n_gbufs,
                bytes / 1048576.0);
        return -1;
    }
    for (int b = 0; b < o->n_gbufs; b++)
        o->gfree[b] = o->gpool + (size_t)b * per;
    o->n_gfree = o->n_gbufs;
    o->host_bytes += bytes;
    if (o->gpool_pinned)
        o->pinned_bytes += bytes;
    return 0;
}

/* The pool freed (every buffer back: no slot is offloaded). */
static void gpool_free_(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    size_t bytes = (size_t)o->n_gbufs * g->slot_size * 2;
    if (!o->gpool)
        return;
    host_free_(o->gpool, o->gpool_pinned);
    o->host_bytes -= bytes;
    if (o->gpool_pinned)
        o->pinned_bytes -= bytes;
    o->gpool = NULL;
    o->n_gfree = 0;
}

/* The offload runtime's host arrays freed and the runtime zeroed (init's
 * failure path and fini share it). */
static void runtime_free_(offload_rt_ *o)
{
    free(o->gfree);
    free(o->iv);
    free(o->at_pos);
    free(o->stg);
    free(o->q);
    free(o->th);
    memset(o, 0, sizeof *o);
}

int gpt_offload_init(gpt_cuda *g, const gpt_cuda_offload *cfg)
{
    offload_rt_ *o = &g->off;
    int L = g->cfg.n_layer;
    memset(o, 0, sizeof *o);
    o->n_staging = cfg->n_staging < 1 ? 1 : cfg->n_staging;
    if (o->n_staging > TIMING_RING / 2) /* harvest_ needs a started oldest */
        o->n_staging = TIMING_RING / 2;
    o->n_threads = cfg->host_threads < 1 ? 1 : cfg->host_threads;
    o->speculative = cfg->speculative != 0;
    if (o->speculative && (g->af || g->mbf)) { /* the planner never asks */
        fprintf(stderr, "gpt_cuda: the speculative update keeps AdamW's "
                        "fp32-master state only\n");
        return -1;
    }
    o->n_gbufs = cfg->n_grad_bufs > 0 ? cfg->n_grad_bufs : 0;
    if (o->n_gbufs && o->speculative) { /* nor this */
        fprintf(stderr, "gpt_cuda: streamed gradients need early updates, "
                        "not speculative ones\n");
        return -1;
    }
    CUDA_CHECK(cudaGetDevice(&o->device));
    size_t per = ceil_div(g->slot_size, (size_t)o->n_threads);
    per = ceil_div(per, 64) * 64;
    o->chunk = per < MIN_CHUNK ? MIN_CHUNK : per;
    o->iv = (piv_ *)calloc(2 * (size_t)L, sizeof(piv_));
    o->at_pos = (int *)calloc(2 * (size_t)L, sizeof(int));
    o->stg = (stage_ *)calloc((size_t)o->n_staging, sizeof(stage_));
    o->q_cap = 64;
    o->q = (hjob_ *)calloc((size_t)o->q_cap, sizeof(hjob_));
    o->th = (pthread_t *)calloc((size_t)o->n_threads, sizeof(pthread_t));
    if (o->n_gbufs &&
        !(o->gfree = (uint16_t **)calloc((size_t)o->n_gbufs,
                                         sizeof *o->gfree)))
        goto fail;
    for (int b = 0; b < o->n_staging; b++) {
        stage_ *sb = &o->stg[b];
        CUDA_CHECK(cudaEventCreateWithFlags(&sb->freed,
                                            cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&sb->drained,
                                            cudaEventDisableTiming));
    }
    for (int i = 0; i < TIMING_RING; i++) {
        timing_ *t = &o->ring[i];
        CUDA_CHECK(cudaEventCreate(&t->h2d_a));
        CUDA_CHECK(cudaEventCreate(&t->h2d_b));
        CUDA_CHECK(cudaEventCreate(&t->wait_a));
        CUDA_CHECK(cudaEventCreate(&t->wait_b));
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->drain, cudaStreamNonBlocking));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv_job, NULL);
    pthread_cond_init(&o->cv_done, NULL);
    for (int i = 0; i < o->n_threads; i++)
        if (pthread_create(&o->th[i], NULL, host_thread_, g) != 0) {
            fprintf(stderr, "gpt_cuda: cannot start host thread %d\n", i);
            o->n_threads = i;
            o->enabled = 1; /* so that fini stops the started ones */
            gpt_offload_fini(g);
            return -1;
        }
    o->enabled = 1;
    return 0;
fail:
    runtime_free_(o);
    return -1;
}

void gpt_offload_fini(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    if (!o->enabled)
        return;
    wait_idle_(g, 0);
    pthread_mutex_lock(&o->mu);
    o->quit = 1;
    pthread_cond_broadcast(&o->cv_job);
    pthread_mutex_unlock(&o->mu);
    for (int i = 0; i < o->n_threads; i++)
        pthread_join(o->th[i], NULL);
    CUDA_CHECK(cudaStreamSynchronize(o->copy));
    CUDA_CHECK(cudaStreamSynchronize(o->drain));
    gpt_offload_set_staging(g, 0);
    for (int b = 0; b < o->n_staging; b++) {
        CUDA_CHECK(cudaEventDestroy(o->stg[b].freed));
        CUDA_CHECK(cudaEventDestroy(o->stg[b].drained));
    }
    for (int i = 0; i < TIMING_RING; i++) {
        timing_ *t = &o->ring[i];
        CUDA_CHECK(cudaEventDestroy(t->h2d_a));
        CUDA_CHECK(cudaEventDestroy(t->h2d_b));
        CUDA_CHECK(cudaEventDestroy(t->wait_a));
        CUDA_CHECK(cudaEventDestroy(t->wait_b));
    }
    CUDA_CHECK(cudaStreamDestroy(o->copy));
    CUDA_CHECK(cudaStreamDestroy(o->drain));
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv_job);
    pthread_cond_destroy(&o->cv_done);
    runtime_free_(o);
}

/* Staging buffers exist only while some slot is offloaded, so that an
 * all-resident phase (usually the Pseudo one) holds what its plan counts. */
int gpt_offload_set_staging(gpt_cuda *g, int on)
{
    offload_rt_ *o = &g->off;
    size_t bytes = 2 * g->slot_size * sizeof(bf16);
    if (!o->enabled || on == o->staging_on)
        return 0;
    if (!on) {
        CUDA_CHECK(cudaStreamSynchronize(o->copy));
        CUDA_CHECK(cudaStreamSynchronize(o->drain));
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        for (int b = 0; b < o->n_staging; b++) {
            CUDA_CHECK(cudaFree(o->stg[b].w));
            o->stg[b].w = o->stg[b].dw = NULL;
        }
        gpool_free_(g);
        o->staging_on = 0;
        return 0;
    }
    for (int b = 0; b < o->n_staging; b++) {
        stage_ *sb = &o->stg[b];
        if (cudaMalloc((void **)&sb->w, bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* the OOM is not sticky: clear it */
            fprintf(stderr, "gpt_cuda: out of device memory for %d staging "
                            "buffers of %.1f MiB\n", o->n_staging,
                    bytes / 1048576.0);
            for (int k = 0; k < b; k++) {
                CUDA_CHECK(cudaFree(o->stg[k].w));
                o->stg[k].w = o->stg[k].dw = NULL;
            }
            sb->w = NULL;
            return -1;
        }
        sb->dw = sb->w + g->slot_size;
    }
    if (gpool_alloc_(g) != 0) {
        for (int b = 0; b < o->n_staging; b++) {
            CUDA_CHECK(cudaFree(o->stg[b].w));
            o->stg[b].w = o->stg[b].dw = NULL;
        }
        return -1;
    }
    o->staging_on = 1;
    return 0;
}

/* ------------------------------------------------------------ host slots */

/* bytes of zeroed host memory, page-locked when cudaHostAlloc allows
 * (*pinned 1), else ordinary (*pinned 0: copies from it are slower and do
 * not overlap); NULL when neither can be had. */
static void *host_alloc_(size_t bytes, int *pinned)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess) {
        *pinned = 1;
        memset(p, 0, bytes);
        return p;
    }
    (void)cudaGetLastError(); /* clear it: pageable still works */
    *pinned = 0;
    return calloc(bytes, 1);
}

/* Frees what host_alloc_ returned (pinned: as it said). */
static void host_free_(void *p, int pinned)
{
    if (pinned)
        CUDA_CHECK(cudaFreeHost(p));
    else
        free(p);
}

/* The second buffers of host slot h (ss elements each): fp32 master, m, v
 * (ordinary memory) and the bf16 copy (pinned when cudaHostAlloc allows).
 * 0, or -1 with a message (nothing left allocated). */
static int spec_alloc_(offload_rt_ *o, hslot_ *h, size_t ss, int slot)
{
    h->alt = (float *)calloc(3 * ss, sizeof(float));
    if (!h->alt) {
        fprintf(stderr, "gpt_cuda: out of host memory for the speculative "
                        "update's second buffers of slot %d (%.1f MiB); "
                        "offload.speculative: off does without\n", slot,
                3.0 * ss * sizeof(float) / 1048576.0);
        return -1;
    }
    size_t b = ss * sizeof(uint16_t);
    h->pin2 = (uint16_t *)host_alloc_(b, &h->pinned2);
    if (!h->pin2) {
        free(h->alt);
        h->alt = NULL;
        return -1;
    }
    h->master2 = h->alt;
    h->m2 = h->alt + ss;
    h->v2 = h->alt + 2 * ss;
    h->wbf2 = h->pin2;
    o->spec_bytes += 3 * ss * sizeof(float) + b;
    if (h->pinned2)
        o->spec_pinned_bytes += b;
    return 0;
}

static void spec_free_(offload_rt_ *o, hslot_ *h, size_t ss)
{
    size_t b = ss * sizeof(uint16_t);
    if (!h->alt)
        return;
    host_free_(h->pin2, h->pinned2);
    if (h->pinned2)
        o->spec_pinned_bytes -= b;
    free(h->alt);
    o->spec_bytes -= 3 * ss * sizeof(float) + b;
    h->alt = NULL;
    h->pin2 = NULL;
}

/* Floats of an offloaded slot's pageable block (kind kd, ss elements),
 * master | m | v | gacc: the fp32 master (none with bf16 masters: the
 * pinned bf16 copy is it), m (none with Adafactor without a first
 * moment), v (Adafactor's af layout, rounded up to 16 floats, 64 bytes,
 * as the planner counts it: offload/plan.c), the fp32 accumulator (none
 * with streamed gradients). */
static size_t v_floats_(const gpt_cuda *g, int kd, size_t ss)
{
    return g->af ? (g->af_kind[kd] + 15) / 16 * 16 : ss;
}

static size_t host_floats_(const gpt_cuda *g, int kd, size_t ss)
{
    return (g->mbf ? 0 : ss) + (!g->af || g->af_m ? ss : 0) +
           v_floats_(g, kd, ss) + (g->off.n_gbufs ? 0 : ss);
}

/* An offloaded slot's pinned bytes (ss elements): its bf16 copy and,
 * unless gradients are streamed, its landing buffer. */
static size_t pin_bytes_(const offload_rt_ *o, size_t ss)
{
    return (o->n_gbufs ? 1 : 2) * ss * sizeof(uint16_t);
}

hslot_ *gpt_offload_alloc_slots(gpt_cuda *g, int S, int n_res,
                         const unsigned char *kinds, int *failed)
{
    offload_rt_ *o = &g->off;
    int n = S - n_res;
    *failed = 0;
    if (n <= 0)
        return NULL;
    hslot_ *hs = (hslot_ *)calloc((size_t)n, sizeof *hs);
    if (!hs) {
        *failed = 1;
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        hslot_ *h = &hs[i];
        /* the slot's own kind: a mixed model's dense slots are smaller */
        int big = g->cfg.moe_experts > 0;
        int kd = kinds ? kinds[n_res + i] != 0 : big;
        size_t ss = kinds ? g->kind_size[kd] : g->slot_size;
        h->n = ss;
        h->kind = kd;
        h->ts = kinds ? g->kind[kd] : g->slot;
        h->nt = kinds ? g->kind_nt[kd] : g->slot_nt;
        /* calloc: large blocks come zeroed from mmap, pages on first touch */
        size_t nf = host_floats_(g, kd, ss);
        h->master = (float *)calloc(nf, sizeof(float));
        if (!h->master) {
            fprintf(stderr, "gpt_cuda: out of host memory for offloaded "
                            "slot %d (%.1f MiB)\n", n_res + i,
                    (double)nf * sizeof(float) / 1048576.0);
            gpt_offload_free_slots(g, hs, i);
            *failed = 1;
            return NULL;
        }
        h->blk = h->master;
        float *at = h->blk;
        h->master = g->mbf ? NULL : at; /* else wbf is the master */
        at += g->mbf ? 0 : ss;
        h->m = !g->af || g->af_m ? at : NULL;
        at += h->m ? ss : 0;
        h->v = at;
        at += v_floats_(g, kd, ss);
        h->gacc = o->n_gbufs ? NULL : at;
        size_t pin = pin_bytes_(o, ss);
        if (o->speculative && spec_alloc_(o, h, ss, n_res + i) != 0) {
            free(h->blk);
            gpt_offload_free_slots(g, hs, i);
            *failed = 1;
            return NULL;
        }
        h->wbf = (uint16_t *)host_alloc_(pin, &h->pinned);
        if (!h->wbf) {
            spec_free_(o, h, ss);
            free(h->blk);
            gpt_offload_free_slots(g, hs, i);
            *failed = 1;
            return NULL;
        }
        if (!h->pinned) {
            if (!o->warned_pin)
                fprintf(stderr, "gpt_cuda: warning: cannot pin %.1f MiB of "
                                "host memory for slot %d (cudaHostAlloc); "
                                "using pageable memory: copies will be "
                                "slower and not overlap\n",
                        pin / 1048576.0, n_res + i);
            o->warned_pin = 1;
        }
        h->pin = h->wbf;
        h->gbf = o->n_gbufs ? NULL : h->wbf + ss; /* streamed: at drains */
        h->ssq = (double *)calloc(ceil_div(ss, o->chunk), sizeof(double));
        if (!h->ssq) {
            host_free_(h->wbf, h->pinned);
            spec_free_(o, h, ss);
            free(h->blk);
            gpt_offload_free_slots(g, hs, i);
            *failed = 1;
            return NULL;
        }
        CUDA_CHECK(cudaEventCreate(&h->d2h_start));
        /* host threads wait on it: block, don't spin */
        CUDA_CHECK(cudaEventCreateWithFlags(&h->drained,
                                            cudaEventBlockingSync));
        o->host_bytes += nf * sizeof(float) + pin;
        if (h->pinned)
            o->pinned_bytes += pin;
    }
    return hs;
}

void gpt_offload_free_slots(gpt_cuda *g, hslot_ *hs, int n)
{
    offload_rt_ *o = &g->off;
    if (!hs)
        return;
    for (int i = 0; i < n; i++) {
        hslot_ *h = &hs[i];
        size_t ss = h->n, pin = pin_bytes_(o, ss);
        if (!h->blk)
            continue;
        pthread_mutex_lock(&o->mu); /* a streamed buffer it still holds */
        gbuf_release_(o, h);
        pthread_mutex_unlock(&o->mu);
        host_free_(h->pin, h->pinned);
        if (h->pinned)
            o->pinned_bytes -= pin;
        spec_free_(o, h, ss);
        free(h->blk);
        free(h->ssq);
        CUDA_CHECK(cudaEventDestroy(h->d2h_start));
        CUDA_CHECK(cudaEventDestroy(h->drained));
        o->host_bytes -= host_floats_(g, h->kind, ss) * sizeof(float) + pin;
    }
    free(hs);
}

/* ------------------------------------------------------------ passes */

/* Read back the event timings that are complete (all of them, waiting,
 * with force; force 2: only the oldest one). */
static void harvest_(offload_rt_ *o, int force)
{
    while (o->ring_read < o->ring_n) {
        timing_ *t = &o->ring[o->ring_read % TIMING_RING];
        if (!t->wait)
            break; /* its interval has not started */
        if (!force) {
            cudaError_t e = cudaEventQuery(t->wait_b);
            if (e == cudaErrorNotReady) {
                (void)cudaGetLastError(); /* else the next CUDA_CHECK_LAUNCH
                                           * reports it */
                break;
            }
            CUDA_CHECK(e);
        }
        CUDA_CHECK(cudaEventSynchronize(t->wait_b));
        float h2d = 0.0f, stall = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&h2d, t->h2d_a, t->h2d_b));
        CUDA_CHECK(cudaEventElapsedTime(&stall, t->wait_a, t->wait_b));
        o->h2d_ms += h2d;
        o->stall_ms += stall;
        t->wait = 0;
        o->ring_read++;
        if (force == 2)
            break;
    }
}

/* Issue the pass's next fetch, interval j = next_fetch, into staging
 * buffer j % n_staging, when there is one and that buffer's previous
 * interval (j - n_staging) has been issued to its end. Its slot's AdamW
 * must be done (the fetch reads the working copy it writes): block = 0
 * gives up if it is not, block = 1 waits. 1 when a fetch was issued. */
static int try_fetch_(gpt_cuda *g, int block)
{
    offload_rt_ *o = &g->off;
    int j = o->next_fetch;
    if (j >= o->n_iv || j >= o->n_left + o->n_staging)
        return 0;
    piv_ *I = &o->iv[j];
    stage_ *sb = &o->stg[j % o->n_staging];
    hslot_ *h = hslot_of_(g, I->slot);
    pthread_mutex_lock(&o->mu);
    while (h->adam_jobs > 0 && block)
        pthread_cond_wait(&o->cv_done, &o->mu);
    int busy = h->adam_jobs > 0;
    pthread_mutex_unlock(&o->mu);
    if (busy)
        return 0;
    if (o->ring_n - o->ring_read >= TIMING_RING)
        harvest_(o, 2);
    timing_ *t = &o->ring[o->ring_n % TIMING_RING];
    CUDA_CHECK(cudaStreamWaitEvent(o->copy, sb->freed, 0));
    CUDA_CHECK(cudaEventRecord(t->h2d_a, o->copy));
    CUDA_CHECK(cudaMemcpyAsync(sb->w, h->wbf, h->n * sizeof(bf16),
                               cudaMemcpyHostToDevice, o->copy));
    CUDA_CHECK(cudaEventRecord(t->h2d_b, o->copy));
    o->ring_n++;
    o->h2d_bytes += h->n * sizeof(bf16);
    o->next_fetch++;
    return 1;
}

void gpt_offload_poll(gpt_cuda *g)
{
    while (try_fetch_(g, 0))
        ;
}

void gpt_offload_pass_begin(gpt_cuda *g, int p0, int p1, int last)
{
    offload_rt_ *o = &g->off;
    const int L = g->cfg.n_layer;
    int n = 0;
    for (int p = p0; p < p1; p++) {
        int s = g->slot_of[p < L ? p : 2 * L - 1 - p];
        o->at_pos[p] = -1;
        if (s < g->n_res)
            continue;
        if (n > 0 && o->iv[n - 1].slot == s && o->iv[n - 1].last == p - 1) {
            o->iv[n - 1].last = p;
        } else {
            piv_ iv = {s, p, p, 0, 0};
            o->iv[n++] = iv;
        }
        o->at_pos[p] = n - 1;
        if (p >= L)
            o->iv[n - 1].has_bwd = 1;
    }
    /* final: the step's last microbatch and no later backward interval of
     * the same slot in this pass */
    for (int j = 0; j < n; j++) {
        int later = 0;
        for (int i = j + 1; i < n; i++)
            later |= o->iv[i].slot == o->iv[j].slot && o->iv[i].has_bwd;
        o->iv[j].final = last && o->iv[j].has_bwd && !later;
    }
    o->n_iv = n;
    /* the first fetches start now, under the encoder and resident layers
     * (a slot still being updated is fetched at a later poll) */
    o->next_fetch = o->n_left = 0;
    o->ring_base = o->ring_n; /* fetch j's timing: ring[ring_base + j] */
    gpt_offload_poll(g);
}

void gpt_offload_enter(gpt_cuda *g, int p, bf16 **w, bf16 **dw)
{
    offload_rt_ *o = &g->off;
    int j = o->at_pos[p];
    piv_ *I = &o->iv[j];
    stage_ *sb = &o->stg[j % o->n_staging];
    if (p == I->first) {
        while (o->next_fetch <= j) /* n_left = j: it can be issued */
            try_fetch_(g, 1);
        gpt_offload_poll(g);
        timing_ *t = &o->ring[(o->ring_base + j) % TIMING_RING];
        CUDA_CHECK(cudaEventRecord(t->wait_a, g->stream));
        CUDA_CHECK(cudaStreamWaitEvent(g->stream, t->h2d_b, 0));
        CUDA_CHECK(cudaEventRecord(t->wait_b, g->stream));
        t->wait = 1;
        if (I->has_bwd) {
            /* the buffer's previous gradient must have left (drain
             * stream) before this interval's starts from zero */
            CUDA_CHECK(cudaStreamWaitEvent(g->stream, sb->drained, 0));
            CUDA_CHECK(cudaMemsetAsync(sb->dw, 0,
                                       hslot_of_(g, I->slot)->n *
                                           sizeof(bf16),
                                       g->stream));
        }
    }
    *w = sb->w;
    *dw = sb->dw;
}

void gpt_offload_leave(gpt_cuda *g, int p)
{
    offload_rt_ *o = &g->off;
    int j = o->at_pos[p];
    piv_ *I = &o->iv[j];
    if (p != I->last)
        return;
    stage_ *sb = &o->stg[j % o->n_staging];
    CUDA_CHECK(cudaEventRecord(sb->freed, g->stream));
    if (!I->has_bwd) {
        o->n_left++;
        gpt_offload_poll(g);
        return;
    }
    /* drain the interval's gradient; the slot's landing buffer must have
     * been consumed by its previous accumulation, and by its AdamW when
     * that read it (from_bf; already done in any order of calls that
     * fetched the slot since, as every fetch waits for the slot's AdamW) */
    int s = I->slot;
    hslot_ *h = hslot_of_(g, s);
    pthread_mutex_lock(&o->mu);
    while (h->accum_jobs > 0 || (h->g_in_bf && h->adam_jobs > 0))
        pthread_cond_wait(&o->cv_done, &o->mu);
    if (o->n_gbufs) {
        /* streamed: one drain a step, final (one microbatch, trained by
         * gpt_cuda_train_microbatch with last), unclipped: the planner and
         * the spec see to all three; a landing buffer from the pool */
        if (h->touched || !I->final || !o->early) {
            fprintf(stderr, "gpt_cuda offload: streamed gradients need "
                            "each offloaded slot drained once a step, by "
                            "the step's last microbatch, without clipping "
                            "(slot %d)\n", s);
            exit(1);
        }
        while (o->n_gfree == 0)
            pthread_cond_wait(&o->cv_done, &o->mu);
        h->gbf = o->gfree[--o->n_gfree];
        if (o->n_gbufs - o->n_gfree > o->gbuf_peak)
            o->gbuf_peak = o->n_gbufs - o->n_gfree;
    }
    pthread_mutex_unlock(&o->mu);
    CUDA_CHECK(cudaStreamWaitEvent(o->drain, sb->freed, 0));
    CUDA_CHECK(cudaEventRecord(h->d2h_start, o->drain));
    CUDA_CHECK(cudaMemcpyAsync(h->gbf, sb->dw, h->n * sizeof(bf16),
                               cudaMemcpyDeviceToHost, o->drain));
    CUDA_CHECK(cudaEventRecord(h->drained, o->drain));
    CUDA_CHECK(cudaEventRecord(sb->drained, o->drain));
    o->d2h_bytes += h->n * sizeof(bf16);

    hjob_ job;
    memset(&job, 0, sizeof job);
    job.kind = JOB_ACCUM;
    job.slot = s;
    job.first = !h->touched;
    job.final = I->final;
    /* Adafactor reads gacc; streamed, there is none (and no second drain) */
    job.from_bf = (job.first && job.final && !g->af) || o->n_gbufs > 0;
    /* early: queued by the last chunk, once the whole gradient is summed
     * (resolve_early_), its token in adam_jobs from now */
    int early = I->final && o->early && (!g->af || o->af_early);
    job.adam = I->final && o->speculate;
    if (job.adam) { /* unclipped, into the second buffers */
        job.spec = 1;
        h->spec = 1;
        h->spec_t = g->adam_t_slot[s];
    }
    if (job.adam) {
        unclipped_(o, &job);
        job.t = ++g->adam_t_slot[s];
        h->updated = 1;
    }
    h->touched = 1;
    pthread_mutex_lock(&o->mu);
    h->g_in_bf = job.from_bf;
    h->sumsq_done = 0; /* a norm taken earlier in the step is stale now */
    if (early) {
        h->pending = 1;
        h->updated = 1;
        h->adam_jobs++;
    }
    queue_chunks_(g, &job);
    pthread_mutex_unlock(&o->mu);
    /* buffer j % n_staging may be refetched from now on: the fetch
     * writes only its weights; the next interval's memset of dw waits for
     * sb->drained, recorded above */
    o->n_left++;
    gpt_offload_poll(g);
}

/* ------------------------------------------------------------ optimizer */

/* AdamW jobs of the last step may still run (they overlap this step's
 * forward; a slot's fetch waits for its own); accumulations may not. */
void gpt_offload_step_begin(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    pthread_mutex_lock(&o->mu);
    wait_accums_(g);
    spec_drop_(g); /* the last step did not reach gpt_offload_adamw */
    for (int s = g->n_res; s < g->S; s++) {
        hslot_ *h = hslot_of_(g, s);
        h->touched = h->updated = h->sumsq_done = 0;
        /* g_in_bf stays until the next drain: an AdamW of last step may
         * still read gbf */
    }
    pthread_mutex_unlock(&o->mu);
}

/* Waits for the accumulations only: early AdamW jobs (queued with the
 * final accumulation) may still run when this returns. */
double gpt_offload_grad_sumsq(gpt_cuda *g)
{
    offload_rt_ *o = &g->off;
    pthread_mutex_lock(&o->mu);
    wait_accums_(g);
    for (int s = g->n_res; s < g->S; s++) {
        hslot_ *h = hslot_of_(g, s);
        size_t nc = ceil_div(h->n, o->chunk);
        if (h->sumsq_done)
            continue;
        if (!h->touched) {
            /* no layer used it this step: its gradient is zero (the last
             * step's AdamW of it may still read gacc) */
            while (h->adam_jobs > 0)
                pthread_cond_wait(&o->cv_done, &o->mu);
            if (o->n_gbufs) { /* its zero buffer comes with its update */
                h->g_in_bf = 1;
            } else {
                memset(h->gacc, 0, h->n * sizeof(float));
                h->g_in_bf = 0;
            }
            memset(h->ssq, 0, nc * sizeof(double));
            h->touched = 1;
            h->sumsq_done = 1;
            continue;
        }
        hjob_ j;
        memset(&j, 0, sizeof j);
        j.kind = JOB_SUMSQ;
        j.slot = s;
        j.from_bf = h->g_in_bf;
        queue_chunks_(g, &j);
    }
    wait_accums_(g);
    double total = 0.0; /* chunks in order within a slot, then slots */
    for (int s = g->n_res; s < g->S; s++) {
        double slot = 0.0;
        size_t nc = ceil_div(hslot_of_(g, s)->n, o->chunk);
        for (size_t c = 0; c < nc; c++)
            slot += hslot_of_(g, s)->ssq[c];
        total += slot;
    }
    pthread_mutex_unlock(&o->mu);
    return total;
}

/* The update *proto (ADAM or ADAFACTOR) of every offloaded slot not
 * updated yet this step (early), at its next step count (lock held);
 * streamed, a slot without a landed gradient gets a zero one, and each
 * gives its buffer back when the update is done. */
static void queue_updates_(gpt_cuda *g, const hjob_ *proto)
{
    offload_rt_ *o = &g->off;
    hjob_ j = *proto;
    for (int s = g->n_res; s < g->S; s++) {
        hslot_ *h = hslot_of_(g, s);
        if (h->updated)
            continue; /* early update, already queued */
        h->updated = 1;
        if (o->n_gbufs) {
            if (!h->gbf)
                gbuf_zero_(o, h);
            h->gbf_release = 1;
        }
        j.slot = s;
        j.from_bf = h->g_in_bf;
        j.t = ++g->adam_t_slot[s];
        queue_chunks_(g, &j);
    }
}

void gpt_offload_adamw(gpt_cuda *g, float lr, float beta1, float beta2, float eps,
                float wd, float scale)
{
    offload_rt_ *o = &g->off;
    hjob_ j;
    memset(&j, 0, sizeof j);
    j.kind = JOB_ADAM;
    j.lr = lr;
    j.beta1 = beta1;
    j.beta2 = beta2;
    j.eps = eps;
    j.wd = wd;
    j.scale = scale;
    pthread_mutex_lock(&o->mu);
    /* speculative updates: the unclipped update has the clipped one's bits
     * exactly when the scale is 1: then swap the buffers in; else redo it
     * from the old state (unchanged: the speculation wrote the second
     * buffers) with the true scale and the same step count */
    int kept = scale == 1.0f;
    if (o->speculate) {
        o->spec_steps++;
        o->redo_steps += !kept;
    }
    for (int s = g->n_res; s < g->S; s++) {
        hslot_ *h = hslot_of_(g, s);
        if (!h->spec)
            continue;
        while (h->adam_jobs > 0)
            pthread_cond_wait(&o->cv_done, &o->mu);
        h->spec = 0;
        if (kept) {
            float *f;
            uint16_t *w;
            f = h->master; h->master = h->master2; h->master2 = f;
            f = h->m; h->m = h->m2; h->m2 = f;
            f = h->v; h->v = h->v2; h->v2 = f;
            w = h->wbf; h->wbf = h->wbf2; h->wbf2 = w;
            continue;
        }
        j.slot = s;
        j.from_bf = h->g_in_bf;
        j.t = h->spec_t + 1; /* = adam_t_slot[s], taken by the speculation */
        queue_chunks_(g, &j);
        o->spec_restores++;
    }
    o->speculate = 0;
    queue_updates_(g, &j);
    pthread_mutex_unlock(&o->mu);
}

void gpt_offload_adafactor(gpt_cuda *g, const adafactor_hparams *h, float wd,
                           float scale)
{
    offload_rt_ *o = &g->off;
    hjob_ j;
    memset(&j, 0, sizeof j);
    j.kind = JOB_ADAFACTOR;
    j.af = *h;
    j.af.grad_scale = scale;
    j.wd = wd;
    pthread_mutex_lock(&o->mu);
    queue_updates_(g, &j);
    pthread_mutex_unlock(&o->mu);
}

void gpt_offload_set_adafactor(gpt_cuda *g, const adafactor_hparams *h,
                               float wd)
{
    offload_rt_ *o = &g->off;
    o->af_h = *h;
    o->wd = wd;
    o->af_early = 1;
}

/* ------------------------------------------------------------ statistics */

void gpt_cuda_get_offload_stats(gpt_cuda *g, gpt_cuda_offload_stats *st)
{
    offload_rt_ *o = &g->off;
    memset(st, 0, sizeof *st);
    st->n_slots = g->S;
    st->n_resident = g->n_res;
    st->n_offloaded = g->S - g->n_res;
    gpt_cuda_info info;
    gpt_cuda_get_info(g, &info);
    st->device_bytes = info.bytes_params + info.bytes_grads + info.bytes_opt +
                       info.bytes_acts;
    if (!o->enabled)
        return;
    st->n_staging = o->n_staging;
    if (o->staging_on)
        st->staging_bytes = (size_t)o->n_staging * 2 * g->slot_size *
                            sizeof(bf16);
    st->device_bytes += st->staging_bytes;
    harvest_(o, 0);
    pthread_mutex_lock(&o->mu);
    st->host_bytes = o->host_bytes;
    st->pinned_bytes = o->pinned_bytes;
    st->h2d_bytes = o->h2d_bytes;
    st->d2h_bytes = o->d2h_bytes;
    st->h2d_s = o->h2d_ms * 1e-3;
    st->d2h_s = o->d2h_ms * 1e-3;
    st->stall_s = o->stall_ms * 1e-3;
    st->accum_s = o->accum_s;
    st->adam_s = o->adam_s;
    st->spec_bytes = o->spec_bytes;
    st->spec_pinned_bytes = o->spec_pinned_bytes;
    st->n_grad_bufs = o->gpool ? o->n_gbufs : 0;
    st->grad_buf_bytes = o->gpool ? (size_t)o->n_gbufs * g->slot_size * 2
                                  : 0;
    st->update_skips = o->skips;
    if (o->gpool) {
        size_t b = g->slot_size * 2;
        st->grad_buf_in_use = (size_t)(o->n_gbufs - o->n_gfree) * b;
        st->grad_buf_peak = (size_t)o->gbuf_peak * b;
    }
    st->spec_steps = o->spec_steps;
    st->redo_steps = o->redo_steps;
    st->spec_restores = o->spec_restores;
    pthread_mutex_unlock(&o->mu);
}
