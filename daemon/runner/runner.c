/*
 * runner.c — the runner (see runner.h): the runner thread's loop over
 * one run's steps, steered by the run's state machine (run_machine.h): taking
 * the next run, setting it up (the tables made to agree with its
 * checkpoint), the step and its records, the writes a boundary owes, and
 * the group across nodes. The commands it applies at each boundary are
 * runner_commands.c's; when to delink is runner_policy.c's; what the three
 * share is runner_internal.h. The queue is queue.c, the checkpoints are
 * runner/run_ckpts.c.
 */
#include "runner/runner_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/threads.h"
#include "common/crashpoint.h"
#include "common/log.h"
#include "common/paths.h"
#include "runner/queue.h"
#include "model/facts.h"
#include "train/data.h"
#include "kernels.h"

/* -------------------------------------------------------------- checkpoint */

/* Save the trainer at its step. -1 with err saying what failed (the caller
 * pauses the run, which logs it): the run keeps its last good checkpoint. */
int runner_checkpoint_(run_ctx *r, const char *why, m6_err *err)
{
    long step = trainer_step_count(r->t);
    /* checkpoints gone: the trainer is fresh, and a checkpoint of it is
     * one the next start would go on from, over the recorded steps */
    if (step == r->last_ckpt || r->ckpts_gone) return 0;
    /* optimizer.shard, nodes.expert_parallel: every rank gathers first (a
     * partial state, rank 0's part, is never written: trainer_save
     * refuses it) */
    if (runner_sync_(r, 1, err) < 0) return -1;
    if (run_ckpts_save(&r->c->ckpts, r->id, r->t, r->spec.checkpoint.keep, why,
                       err) < 0)
        return -1;
    r->last_ckpt = step;
    return 0;
}

/* -------------------------------------------------------- the run's events */

/* An event of the run's state machine (run_machine.h), under mu. */
void runner_on_(runner *c, run_machine_event ev, const char *reason)
{
    pthread_mutex_lock(&c->mu);
    if (run_machine_on(&c->machine, ev, reason) < 0)
        log_warn("runner.event", "run=%lld event=%d state=%s: not expected",
                 (long long)c->active, (int)ev, run_state_name(c->machine.state));
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* What status shows of the trainer: its step and phase. */
long runner_step_(const run_ctx *r)
{
    return r->ckpts_gone ? r->gone_step : trainer_step_count(r->t);
}

void runner_publish_(run_ctx *r)
{
    runner *c = r->c;
    pthread_mutex_lock(&c->mu);
    c->active_step = runner_step_(r);
    c->machine.real = r->ckpts_gone ? r->gone_real
                                    : trainer_phase(r->t) == PHASE_REAL;
    c->machine.delink_step = r->ckpts_gone ? (long)r->recorded_delink
                                           : trainer_delink_step(r->t);
    c->delinking_at = -1;  /* done, or (a failed delink) no longer coming */
    c->in_step = 0;        /* at the boundary of active_step */
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- offload */

/* Publish the run's placement for status (runner_offload_get): after a
 * step its facts, rates included (step 1); outside a step (set-up, delink:
 * step 0) the placement now, the latest step's rates kept. */
static void offload_publish_(run_ctx *r, const step_placement *p, int step)
{
    runner_offload o = r->off;
    o.resident_slots = p->resident_slots;
    o.offloaded_slots = p->offloaded_slots;
    o.device_bytes_in_use = p->device_bytes;
    o.peak_device_bytes = p->peak_device_bytes;
    o.device_budget_bytes = p->budget_bytes;
    o.offload_redo_steps = p->speculative ? (int64_t)p->redo_steps : -1;
    if (step || p->budget_bytes == 0) {
        o.h2d_gbps = p->h2d_gbps;
        o.d2h_gbps = p->d2h_gbps;
        o.copy_hidden_fraction = p->copy_hidden_fraction;
    }
    r->off = o;
    pthread_mutex_lock(&r->c->mu);
    r->c->offload = o;
    r->c->offload_valid = 1;
    pthread_mutex_unlock(&r->c->mu);
}

/* The placement now (set-up, after a delink). None while the run's
 * checkpoints are gone: the trainer held then is a stand-in built from
 * the spec (step 0, pseudo phase), not the run's, as for its step. */
void runner_offload_sample_(run_ctx *r)
{
    if (r->ckpts_gone) {
        pthread_mutex_lock(&r->c->mu);
        r->c->offload_valid = 0;
        pthread_mutex_unlock(&r->c->mu);
        return;
    }
    step_placement p;
    trainer_placement(r->t, &p);
    offload_publish_(r, &p, 0);
}

void runner_fail_run_(run_ctx *r, const char *what, const char *err)
{
    m6_err m = m6_err_make(M6_EINTERNAL, "%s: %s", what, err);
    log_error("run.failed", "run=%lld err=\"%s\"", (long long)r->id, m.msg);
    runner_on_(r->c, RUN_EV_FAILED, NULL);
    state_run_set_state(r->c->st, r->id, RUN_FAILED, m.msg);
    state_event(r->c->st, r->id, "failed", "%s", m.msg);
    m6_err_free(&m);
}

/* The run pauses itself (ev: a data error, a write that failed, no
 * checkpoint that loads, a stop that could not be done): stop training at
 * this boundary, in memory first, so nothing is lost and nothing loops.
 * One error line; the reason is kept for status even if the DB cannot take
 * it. `m6ctl resume` retries. */
void runner_pause_error_(run_ctx *r, run_machine_event ev, const char *reason)
{
    runner *c = r->c;
    long step = runner_step_(r);
    log_error("run.paused", "run=%lld step=%ld reason=\"%s\"",
              (long long)r->id, step, reason);
    pthread_mutex_lock(&c->mu);
    if (run_machine_on(&c->machine, ev, reason) < 0)
        log_warn("runner.event", "run=%lld event=%d state=%s: not expected",
                 (long long)r->id, (int)ev, run_state_name(c->machine.state));
    c->machine.error_code = ev == RUN_EV_DATA_ERROR ? r->data_code
                      : ev != RUN_EV_CKPT_LOST ? M6_EBADSTATE
                      : r->ckpts_gone == 2 ? M6_ECKPTGONE : M6_ENOCKPT;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    /* held: recorded as soon as m6.db can take it, even while another
     * process holds its write lock (state.h) */
    if (state_run_set_state_held(c->st, r->id, RUN_PAUSED, reason) == 0)
        state_event(c->st, r->id, "paused.error", "step=%ld %s", step, reason);
    runner_publish_(r);
}

void runner_pause_saved_(run_ctx *r, run_machine_event ev, const char *reason)
{
    m6_err werr = M6_ERR_NONE;
    if (runner_flush_(r, &werr) < 0 || runner_checkpoint_(r, "pause", &werr) < 0)
        log_warn("run.checkpoint", "run=%lld err=\"%s\": paused with its "
                 "last checkpoint", (long long)r->id, m6_err_msg(&werr));
    m6_err_free(&werr);
    runner_pause_error_(r, ev, reason);
}

/* "what: state DB: <SQLite's message>" */
void runner_db_error_(run_ctx *r, const char *what, m6_err *err)
{
    char e[256];  /* SQLite's words: no paths */
    state_last_error(r->c->st, e, sizeof e);
    m6_err_set(err, M6_EINTERNAL, "%s: state DB: %s", what, e);
}

/* Do the writes owed at this step boundary. -1 with err if one fails; it
 * stays owed. */
int runner_flush_(run_ctx *r, m6_err *err)
{
    if (r->metric_pending) {
        if (state_record_step(r->c->st, r->id, &r->pending) < 0) {
            char what[64];
            snprintf(what, sizeof what, "recording step %lld",
                     (long long)r->pending.step);
            runner_db_error_(r, what, err);
            return -1;
        }
        r->metric_pending = 0;
    }
    if (r->ckpt_owed) {
        if (runner_checkpoint_(r, r->ckpt_owed, err) < 0) return -1;
        r->ckpt_owed = NULL;
    }
    return 0;
}

/* ------------------------------------------- data and validation owed */

/* trainer_set_eval_interrupt's function (ud: the runner): a stop, a pause
 * or a shutdown is waiting, so the validation pass in progress is
 * abandoned and the command taken at the boundary right after it. A pass
 * of many batches (train.eval_batches) would otherwise hold the command,
 * and SIGTERM, for as long as it runs. */
int runner_eval_interrupt_(void *ud)
{
    runner *c = ud;
    pthread_mutex_lock(&c->mu);
    int stop = c->shutdown || c->machine.state == RUN_STOPPING ||
               c->machine.state == RUN_PAUSING;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

/* The validation pass of step was abandoned for a command
 * (runner_eval_interrupt_; why says after how many batches): the step has no
 * val_loss for now and owes the pass (r->eval_owed), redone whole before
 * the next step (retry_data_: after a resume, or at the next start, where
 * align_tables_ finds the row without one). An event and a log line say
 * so. */
static void eval_interrupted_(run_ctx *r, long step, const m6_err *why)
{
    r->eval_owed = 1;
    state_event(r->c->st, r->id, "eval.interrupted", "step=%ld %s: redone "
                "before the next step", step, m6_err_msg(why));
    log_info("run.eval_interrupted", "run=%lld step=%ld why=\"%s\"",
             (long long)r->id, step, m6_err_msg(why));
}

/* The code of a data error (rc TRAINER_EDATA or TRAINER_ENOFILE): what
 * the handler's advice is keyed by (`m6ctl resume` reopens the data). */
m6_code runner_data_code_(int rc)
{
    return rc == TRAINER_ENOFILE ? M6_ENOFILE : M6_EDATA;
}

/* After a pause for unreadable data (r->data_error): open the shards
 * again, as at the start. Then (also after a pass a command interrupted,
 * r->eval_owed alone) redo the validation pass the pending row is owed;
 * its row is then written again with the val_loss. -1 with err if the
 * data is still bad (the run stays paused); 1 when a stop, pause or
 * shutdown interrupted the pass again (still owed: the boundary takes the
 * command first); else 0. redo 0: a pass owed with the data sound is left
 * for later (a resume is answered first, the pass may be long). */
static int retry_data_(run_ctx *r, int redo, m6_err *err)
{
    if (!r->data_error && (!r->eval_owed || !redo)) return 0;
    float v;
    int rc = r->data_error ? trainer_reopen_data(r->t, err) : 0;
    if (rc == 0 && r->data_error) {
        r->data_error = 0;
        log_info("run.data_reopened", "run=%lld step=%ld", (long long)r->id,
                 trainer_step_count(r->t));
    }
    if (rc == 0 && r->eval_owed) {
        rc = trainer_eval_checked(r->t, &v, err);
        if (rc == TRAINER_EINTR) {
            eval_interrupted_(r, r->pending.step, err);
            m6_err_free(err);
            return 1;
        }
    }
    if (rc != 0) {
        r->data_error = 1;  /* reopen the data again next time */
        r->data_code = runner_data_code_(rc);
        return -1;
    }
    if (r->eval_owed) {
        r->pending.val_loss = v;
        if (r->pending.phase == 0) runner_plateau_note_(r, v);
        r->metric_pending = 1;
        r->eval_owed = 0;
        log_info("run.eval_redone", "run=%lld step=%ld val_loss=%g",
                 (long long)r->id, r->pending.step, (double)v);
    }
    return 0;
}

/* ------------------------------------------------------------ run set-up */

/* Take up run id: parse its spec, build the trainer, load the newest
 * checkpoint that loads, make the tables agree with it, record the start.
 * The run may pause itself on the way (data that cannot be read, a write
 * that failed, no checkpoint that loads): it is then PAUSED with the
 * reason. 0 with r set up; -1 when the run failed (recorded). */
/* What multiplies in this run, once when it is set up (started or taken
 * up again): on `cpu` the GEMM library, its ISA and whether bf16 is native
 * (kernels.h, gemm_describe); the precision from the spec. */
static void log_run_gemm_(const run_ctx *r)
{
    const char *prec = spec_precision_name(spec_precision(&r->spec));
    if (r->spec.device.backend == BACKEND_CUDA) {
        log_info("run.gemm", "run=%lld backend=cuda precision=%s",
                 (long long)r->id, prec);
        return;
    }
    gemm_info gi;
    gemm_describe(&gi);
    log_info("run.gemm", "run=%lld backend=cpu library=%s version=%s isa=%s "
             "precision=%s%s", (long long)r->id, gi.library, gi.version,
             gi.isa, prec, spec_precision(&r->spec) == PRECISION_BF16
             ? (gi.bf16_native ? " bf16=native" : " bf16=emulated") : "");
}

static int setup_(runner *c, int64_t id, run_ctx *r)
{
    char err[1024];
    run_row row;
    if (state_run_get(c->st, id, &row) != 0) {
        log_error("run.lost", "run=%lld", (long long)id);
        return -1;
    }
    int rc = spec_parse(&r->spec, row.spec, strlen(row.spec), err, sizeof err);
    int was_queued = row.state == RUN_QUEUED;
    int paused = row.state == RUN_PAUSED; /* left paused: stays paused */
    r->recorded_delink = row.delink_step;
    r->gone_step = (long)row.step;  /* what it stays at if they are gone */
    r->gone_real = row.phase;
    /* a paused run keeps its reason */
    char *kept_error = strdup(paused && row.error ? row.error : "");
    run_row_clear(&row);
    if (!kept_error) {
        runner_fail_run_(r, "setup", "out of memory");
        return -1;
    }
    if (rc < 0) {
        runner_fail_run_(r, "spec", err);
        free(kept_error);
        return -1;
    }
    r->flops_per_token = model_flops_per_token(&r->spec.model);
    log_info("run.setup", "run=%lld (opening the data, building the model)",
             (long long)id);
    /* A queued run whose data no longer passes fails here: it has nothing
     * to lose, and can be submitted again once the data is fixed. A run that
     * has trained (left running or paused by the last m6d) pauses instead,
     * as it would had its data gone bad under this m6d: failing it would
     * strand its checkpoints, and `m6ctl resume` retries once the data is
     * fixed (retry_data_). */
    int data_rc = 0;
    m6_err e = M6_ERR_NONE, lost = M6_ERR_NONE;
    r->t = was_queued ? trainer_create(&r->spec, &e)
                      : trainer_create_resumable(&r->spec, &data_rc, &e);
    if (!r->t) {
        runner_fail_run_(r, "setup", m6_err_msg(&e));
        m6_err_free(&e);
        free(kept_error);
        return -1;
    }
    if (runner_take_up_(r, was_queued, 0, &data_rc, &e, &lost) < 0) {
        runner_fail_run_(r, "setup", m6_err_msg(&e));
        m6_err_free(&e);
        free(kept_error);
        return -1;
    }
    m6_err open_err = M6_ERR_NONE;
    if (data_rc) {
        r->data_error = 1;
        r->data_code = runner_data_code_(data_rc);
        open_err = e;  /* the data's error, whole */
        e = M6_ERR_NONE;
    }
    m6_err_free(&e);
    long step = runner_step_(r);
    int phase = trainer_phase(r->t) == PHASE_REAL, dropped = r->dropped;

    pthread_mutex_lock(&c->mu);
    run_machine_set_error(&c->machine, kept_error);
    c->machine.error_code = kept_error[0] ? M6_EBADSTATE : M6_OK;
    c->active_total = r->spec.train.steps;
    pthread_mutex_unlock(&c->mu);
    int erred = 1;
    if (state_run_set_state(c->st, id, paused ? RUN_PAUSED : RUN_RUNNING,
                            kept_error[0] ? kept_error : NULL) < 0) {
        runner_db_error_(r, "recording the start", &e);
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&e));
    } else if (dropped < 0) {
        /* Rows past the checkpoint stay until training rewrites them
         * (INSERT OR REPLACE); pause so the operator sees why. */
        runner_db_error_(r, "dropping metrics past the checkpoint", &e);
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&e));
    } else if (lost.msg) {
        /* every checkpoint failed to load, or they are gone: starting
         * over from step 0 is the operator's call, not a silent one */
        runner_pause_error_(r, RUN_EV_CKPT_LOST, lost.msg);
    } else if (data_rc) {
        runner_pause_error_(r, RUN_EV_DATA_ERROR, m6_err_msg(&open_err));
    } else {
        erred = 0;
    }
    m6_err_free(&e);
    m6_err_free(&lost);
    m6_err_free(&open_err);
    free(kept_error);
    paused |= erred;
    if (was_queued) {
        state_event(c->st, id, "start", "phase=%s", phase_name(phase));
        log_info("run.start", "run=%lld name=%s total_steps=%ld", (long long)id,
                 r->spec.name, r->spec.train.steps);
    } else {
        state_event(c->st, id, "resume.restart",
                    "step=%ld metrics_dropped=%d paused=%d", step, dropped,
                    paused);
        log_info("run.recover", "run=%lld step=%ld metrics_dropped=%d paused=%d",
                 (long long)id, step, dropped, paused);
    }
    log_run_gemm_(r);
    runner_offload_sample_(r);
    runner_publish_(r);
    runner_on_(c, RUN_EV_STARTED, NULL);
    return 0;
}

/* ------------------------------------------------------- writes owed */

/* The writes a boundary owes before the next step: the plateau policy's
 * passes from m6.db (after a restart), data to reopen after a
 * data error (and the validation pass it owes, or one a command
 * interrupted), then what the last boundary could not write. 0, or -1
 * with err (they stay owed), or 1 when a command interrupted the pass
 * again (still owed). redo: as retry_data_'s. */
int runner_owed_(run_ctx *r, int redo, m6_err *err)
{
    /* checkpoints gone: back now, or the operator's start over */
    if (runner_retake_(r, err) < 0) return -1;
    /* the seed first: the pass retry_data_ redoes is not in m6.db yet */
    if (runner_plateau_seed_(r, err) < 0) return -1;
    int rc = retry_data_(r, redo, err);
    if (rc < 0 || runner_flush_(r, err) < 0) return -1;
    return rc;
}

/* ------------------------------------------------------------ the step */

/* The last step is done: a checkpoint, then completed. 1 completed. */
static int complete_(run_ctx *r)
{
    runner *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    if (runner_checkpoint_(r, "end", &err) < 0) {
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&err));
        m6_err_free(&err);
        return 0;
    }
    if (state_run_set_state(c->st, r->id, RUN_COMPLETED, NULL) < 0) {
        runner_db_error_(r, "recording the completion", &err);
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&err));
        m6_err_free(&err);
        return 0;
    }
    runner_on_(c, RUN_EV_COMPLETED, NULL);
    state_event(c->st, r->id, "completed", "step=%ld", step);
    log_info("run.completed", "run=%lld step=%ld", (long long)r->id, step);
    return 1;
}

/* The step's figures for /metrics (http/stats.h). */
static void stats_publish_(run_ctx *r, const step_result *res, double seconds)
{
    if (!r->c->stats) return;
    stats_step_rec s = {
        .run_id = r->id, .name = r->spec.name, .phase = res->phase == PHASE_REAL,
        .step = res->step, .train_loss = res->train_loss,
        .val_loss = res->evaluated ? res->val_loss : NAN, .lr = res->lr,
        .grad_norm = res->grad_norm, .tokens_per_s = res->tokens_per_s,
        .tokens = res->tokens, .step_seconds = seconds,
        .flops_per_token = r->flops_per_token,
        .resident_slots = res->mem.resident_slots,
        .offloaded_slots = res->mem.offloaded_slots,
        .device_bytes_in_use = res->mem.device_bytes,
        .peak_device_bytes = res->mem.peak_device_bytes,
        .h2d_bytes = res->mem.h2d_bytes, .d2h_bytes = res->mem.d2h_bytes,
        .copy_hidden_fraction = res->mem.copy_hidden_fraction,
        .moe = res->moe.present, .moe_aux_loss = res->moe.aux_loss,
        .moe_dropped_fraction = res->moe.dropped_fraction,
        .moe_load_min = res->moe.load_min, .moe_load_max = res->moe.load_max,
        .moe_load_cv = res->moe.load_cv,
        .moe_step_tokens_min = res->moe.step_tokens_min,
        .moe_step_tokens_max = res->moe.step_tokens_max,
        .moe_step_experts_empty = res->moe.step_experts_empty,
        .moe_step_dropped = res->moe.step_dropped,
        .moe_experts_idle = r->spec.train.expert_idle_steps > 0
                                ? res->moe.experts_idle : -1,
    };
    stats_step(r->c->stats, &s);
}

/* Which node holds rank of run, for an event or a log line: "node=self"
 * for this m6d's ranks (rank 0, and those after it with --devices N),
 * "node=ID hostname=NAME" from the nodes table for the others (a node
 * holds ranks rank .. rank + ranks - 1), "node=?" when it has no such
 * row. */
static void rank_node_(runner *c, int64_t run, int rank, char *out,
                       size_t len)
{
    snprintf(out, len, "node=%s", rank == 0 ? "self" : "?");
    node_row *rows;
    int n;
    if (rank == 0 || state_nodes_list(c->st, &rows, &n) != 0)
        return;
    for (int i = 0; i < n; i++) {
        const node_row *w = &rows[i];
        int held = w->ranks > 0 ? w->ranks : 1;
        if (w->run != run || w->rank < 0 || rank < w->rank ||
            rank >= w->rank + held)
            continue;
        if (w->coordinator)
            snprintf(out, len, "node=self");
        else
            snprintf(out, len, "node=%lld hostname=%s", (long long)w->id,
                     w->hostname);
    }
    free(rows);
}

/* A step whose res->outlier_rank stood out: a grad.outlier event and a
 * run.grad_outlier log line naming the rank and its node, at most once
 * per GRAD_OUTLIER_REPORT_STEPS steps per rank (the steps in between
 * counted in the next report). Reporting never changes the step. */
static void report_outlier_(run_ctx *r, const step_result *res)
{
    int k = res->outlier_rank;
    if (k >= r->outlier_n) {
        int n = k + 1;
        long *at = realloc(r->outlier_at, (size_t)n * sizeof *at);
        if (at) r->outlier_at = at;
        long *q = at ? realloc(r->outlier_quiet, (size_t)n * sizeof *q)
                     : NULL;
        if (q) r->outlier_quiet = q;
        if (!at || !q) return;  /* out of memory: unreported */
        for (int i = r->outlier_n; i < n; i++) at[i] = q[i] = 0;
        r->outlier_n = n;
    }
    if (r->outlier_at[k] > 0 &&
        res->step - r->outlier_at[k] < GRAD_OUTLIER_REPORT_STEPS) {
        r->outlier_quiet[k]++;
        return;
    }
    char node[300];
    rank_node_(r->c, r->id, k, node, sizeof node);
    long between = r->outlier_quiet[k];
    log_warn("run.grad_outlier", "run=%lld step=%ld rank=%d %s ratio=%.1f "
             "unreported=%ld", (long long)r->id, res->step, k, node,
             (double)res->outlier_ratio, between);
    state_event(r->c->st, r->id, "grad.outlier", "step=%ld rank=%d %s: its "
                "gradient norm is %.1f times the median of the other ranks' "
                "(%ld more such steps of this rank since its last report; "
                "one report per %d steps)", res->step, k, node,
                (double)res->outlier_ratio, between,
                GRAD_OUTLIER_REPORT_STEPS);
    r->outlier_at[k] = res->step;
    r->outlier_quiet[k] = 0;
}

/* One step, recorded: its metrics row (and a checkpoint every
 * checkpoint.every steps) written before the next boundary. -1 when the
 * run failed (recorded); 1 when a collective failed (the run paused; the
 * trainer must be rebuilt from the last checkpoint). */
static int step_(run_ctx *r)
{
    runner *c = r->c;
    m6_err err = M6_ERR_NONE;
    step_result res;
    m6_err data_err = M6_ERR_NONE;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (c->step_delay_ms > 0) /* test hook: a step of known length */
        nanosleep(&(struct timespec){c->step_delay_ms / 1000,
                                     (c->step_delay_ms % 1000) * 1000000L},
                  NULL);
    /* split state: the boundary's agreement, if no save made it */
    if (runner_sync_(r, 0, &data_err) < 0) {
        r->data_code = M6_EBADSTATE;
        runner_pause_error_(r, RUN_EV_DATA_ERROR, m6_err_msg(&data_err));
        m6_err_free(&data_err);
        return 1;
    }
    int src = trainer_step(r->t, &res, &data_err);
    r->synced = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (src == TRAINER_EDATA) {
        /* like a write that failed: pause, keep the model; the operator
         * fixes the shard and resumes (retry_data_) */
        r->data_error = 1;
        r->data_code = runner_data_code_(src);
        if (!res.eval_failed) { /* nothing of the step was done */
            /* the model is the last step's, sound */
            runner_pause_saved_(r, RUN_EV_DATA_ERROR, m6_err_msg(&data_err));
            m6_err_free(&data_err);
            return 0;
        }
        r->eval_owed = 1; /* the step stands: record it, val_loss owed */
    } else if (src == TRAINER_ECOLL) {
        /* a rank died or stopped answering: the step was not applied;
         * pause, and the runner reloads the last checkpoint (run_one_) */
        char why[2400];
        r->lost = 1;
        runner_lost_why_(r, "in the step", &data_err, why, sizeof why);
        r->data_code = M6_EBADSTATE;
        runner_pause_error_(r, RUN_EV_DATA_ERROR, why);
        m6_err_free(&data_err);
        return 1;
    } else if (src < 0) {
        r->lost = 1;  /* the other ranks are not at a boundary */
        runner_fail_run_(r, "training step", m6_err_msg(&data_err));
        m6_err_free(&data_err);
        return -1;
    }
    runner_on_(c, RUN_EV_STEP_DONE, NULL);
    offload_publish_(r, &res.mem, 1);
    stats_publish_(r, &res, (double)(t1.tv_sec - t0.tv_sec) +
                                (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    metric_row m = {
        .step = res.step, .phase = res.phase == PHASE_REAL,
        .train_loss = res.train_loss, .val_loss = res.val_loss,
        .lr = res.lr, .tokens_per_s = res.tokens_per_s,
        .grad_norm = res.grad_norm,
        .resident_slots = res.mem.resident_slots,
        .offloaded_slots = res.mem.offloaded_slots,
        .peak_device_bytes = res.mem.peak_device_bytes,
        .h2d_gbps = res.mem.h2d_gbps, .d2h_gbps = res.mem.d2h_gbps,
        .copy_hidden_fraction = res.mem.copy_hidden_fraction,
        .offload_redo_steps = res.mem.speculative ? res.mem.redone : -1,
        .moe_aux_loss = res.moe.present ? res.moe.aux_loss : NAN,
        .moe_z_loss = res.moe.present ? res.moe.z_loss : NAN,
        .moe_dropped_fraction = res.moe.present ? res.moe.dropped_fraction
                                                : NAN,
        .moe_load_min = res.moe.present ? res.moe.load_min : NAN,
        .moe_load_max = res.moe.present ? res.moe.load_max : NAN,
        .moe_load_cv = res.moe.present ? res.moe.load_cv : NAN,
        .moe_experts_empty = res.moe.present ? res.moe.experts_empty : NAN,
        .moe_step_tokens_min = res.moe.present ? res.moe.step_tokens_min : -1,
        .moe_step_tokens_max = res.moe.present ? res.moe.step_tokens_max : -1,
        .moe_step_experts_empty = res.moe.present ? res.moe.step_experts_empty
                                                  : -1,
        .moe_step_dropped = res.moe.present ? res.moe.step_dropped : -1,
        .moe_experts_idle = res.moe.present &&
                                    r->spec.train.expert_idle_steps > 0
                                ? res.moe.experts_idle : -1,
        .skipped = res.skipped, .skipped_total = res.skipped_total,
    };
    r->pending = m;
    if (res.eval_interrupted)
        eval_interrupted_(r, res.step, &data_err);
    else if (res.evaluated && !res.eval_failed && m.phase == 0)
        runner_plateau_note_(r, res.val_loss);
    r->metric_pending = 1;
    if (r->spec.checkpoint.every > 0 && res.step % r->spec.checkpoint.every == 0)
        r->ckpt_owed = "every";
    log_debug("run.step", "run=%lld step=%ld loss=%.6f ms=%.1f",
              (long long)r->id, res.step, res.train_loss, res.step_ms);
    pthread_mutex_lock(&c->mu);
    double s = res.step_ms / 1e3;
    c->step_s_ema = c->step_s_ema > 0 ? 0.9 * c->step_s_ema + 0.1 * s : s;
    pthread_mutex_unlock(&c->mu);
    char held_why[1536];
    if (res.skipped) {
        /* data parallel: which rank's own gradient had NaN/Inf in it */
        char who[512] = "";
        if (res.nonfinite_ranks > 0) {
            /* every such rank (the lowest STEP_NONFINITE_LIST), and the
             * lowest one's node */
            char node[300], list[STEP_NONFINITE_LIST * 12 + 8] = "";
            size_t n = 0;
            int k = res.nonfinite_ranks < STEP_NONFINITE_LIST
                        ? res.nonfinite_ranks : STEP_NONFINITE_LIST;
            for (int i = 0; i < k; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%d",
                                      i ? "," : "", res.nonfinite_list[i]);
            if (res.nonfinite_ranks > k)
                snprintf(list + n, sizeof list - n, ",...");
            rank_node_(c, r->id, res.nonfinite_rank, node, sizeof node);
            snprintf(who, sizeof who, " nonfinite_rank=%d nonfinite_ranks=%d"
                     " ranks=%s %s", res.nonfinite_rank, res.nonfinite_ranks,
                     list, node);
        }
        log_warn("run.step_skipped", "run=%lld step=%ld loss=%g grad_norm=%g "
                 "bad_steps=%ld%s", (long long)r->id, res.step,
                 (double)res.train_loss, (double)res.grad_norm, res.bad_steps,
                 who);
        state_event(c->st, r->id, "step.skipped", "step=%ld loss=%g "
                    "grad_norm=%g bad_steps=%ld skipped_total=%ld%s", res.step,
                    (double)res.train_loss, (double)res.grad_norm,
                    res.bad_steps, res.skipped_total, who);
    }
    if (res.outlier_rank >= 0)
        report_outlier_(r, &res);
    runner_report_idle_experts_(r, &res);
    if (runner_flush_(r, &err) < 0)
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&err));
    else if (state_hold_overdue(c->st, held_why, sizeof held_why))
        /* another process has held m6.db's write lock past the limit */
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, held_why);
    else if (r->data_error) /* its pass could not read the data */
        runner_pause_saved_(r, RUN_EV_DATA_ERROR, m6_err_msg(&data_err));
    else if (res.bad_steps >= r->spec.train.max_bad_steps)
        runner_bad_steps_pause_(r, &res);
    else
        runner_publish_(r);
    m6_err_free(&err);
    m6_err_free(&data_err);
    return 0;
}

/* ------------------------------------------------------------ the loop */

/* A stop m6d acknowledged before the run was set up (replayed at start
 * after a life that died setting it up, e.g. OOM-killed; or sent between
 * taking the run and setting it up) is applied without setting it up:
 * building the model may kill m6d again, and the operator asked for the
 * run to end. The run is recorded stopped at its recorded step with its
 * checkpoints as they are (nothing was trained since), as a stop of a
 * queued run leaves it. 1 applied; 0 no stop pending, or the database
 * refused (then the run is set up and its first boundary takes the stop). */
static int stop_before_setup_(runner *c, int64_t id)
{
    pthread_mutex_lock(&c->mu);
    int stopping = c->machine.state == RUN_STOPPING;
    int64_t upto = c->cmd_last;
    pthread_mutex_unlock(&c->mu);
    if (!stopping)
        return 0;
    run_row row;
    if (state_run_get(c->st, id, &row) != 0)
        return 0;
    long step = (long)row.step;
    run_row_clear(&row);
    char detail[64];
    snprintf(detail, sizeof detail, "step=%ld (before set-up)", step);
    state_commit cm = {.set_state = 1, .state = RUN_STOPPED,
                       .event_kind = "stop", .event_detail = detail,
                       .step = step, .cmd_upto = upto,
                       .cmd_kinds = STATE_CMD_NOT_DELINK};
    if (state_commit_run(c->st, id, &cm) < 0) {
        log_error("run.stop", "run=%lld: recording the stop failed; the "
                  "run is set up and stopped at its first boundary",
                  (long long)id);
        return 0;
    }
    runner_on_(c, RUN_EV_STOPPED, NULL);
    log_info("run.stop", "run=%lld step=%ld before=setup", (long long)id,
             step);
    return 1;
}

/* The runner's life with one run: set it up, then at every step boundary
 * the operator's commands (in the order stop, delink, pause, shutdown,
 * resume: a stop, delink or pause m6d has acknowledged holds across a
 * shutdown), then the step: completion, phase policy, step, record. A stop
 * pending before set-up ends it without setting it up. */
static void run_one_(runner *c, int64_t id)
{
    run_ctx r = {.c = c, .id = id, .last_ckpt = -1, .replay_delink = -1};
    r.off.h2d_gbps = r.off.d2h_gbps = r.off.copy_hidden_fraction = NAN;
    r.off.offload_redo_steps = -1;
    if (stop_before_setup_(c, id))
        return;
    if (setup_(c, id, &r) < 0) {
        trainer_free(r.t);
        free(r.best);
        free(r.outlier_at);
        free(r.outlier_quiet);
        return;
    }
    for (;;) {
        /* the group failed with split state (a save that could not
         * gather): paused; the run is rebuilt from its last checkpoint */
        if (r.lost) break;
        /* paused by the run itself (a data error, a failed write): the
         * other ranks leave the group before the runner waits, as at a
         * pause command; a resume regroups them with fresh trainers */
        pthread_mutex_lock(&c->mu);
        int waits = run_machine_waits(&c->machine);
        pthread_mutex_unlock(&c->mu);
        if (waits && r.coll) {
            runner_dist_drop_(&r, "the run is paused");
            if (r.lost) break;  /* rebuilt from the last checkpoint */
        }
        /* commands */
        pthread_mutex_lock(&c->mu);
        while (run_machine_waits(&c->machine))
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->hold_path[0]) {
            pthread_mutex_unlock(&c->mu);
            runner_test_hold_(c, r.t ? trainer_step_count(r.t) : 0);
            pthread_mutex_lock(&c->mu);
        }
        c->in_step = 0;  /* at a boundary, whatever the step's end did */
        run_machine_take tk = run_machine_boundary(&c->machine);
        /* the taken delink stays visible as pending until it is done */
        c->delinking_at = tk.delink && trainer_phase(r.t) == PHASE_PSEUDO
                              ? trainer_step_count(r.t) : -1;
        if (tk.resume) c->resume_serving = c->resume_asked;
        int relayout = tk.resume && c->relayout == id;  /* runner_resume_at */
        if (relayout) c->relayout = 0;
        r.cmd_upto = c->cmd_last;
        pthread_mutex_unlock(&c->mu);
        if (tk.stop) {
            int stopped = runner_stop_(&r);
            /* a stop that could not save because a rank is lost stays
             * pending: the run, taken up again from its last whole
             * checkpoint (it leaves the runner: r.lost), applies it there
             * (runner_replay_commands_locked_), and so after a restart */
            if (stopped || !r.lost)
                runner_commands_done_(&r);
            if (stopped) break;
            continue;
        }
        if (tk.delink && trainer_phase(r.t) == PHASE_PSEUDO)
            runner_delink_(&r, "operator");
        if (r.lost) break;  /* paused: rebuilt from the last checkpoint */
        if (tk.pause) runner_pause_(&r);
        if (tk.shutdown) {
            /* what this boundary took is done; commands sent after it
             * were refused (m6d is stopping) */
            runner_interrupted_(&r, tk.resume);
            runner_commands_done_(&r);
            break;
        }
        /* a refused resume sets nothing up from a new spec
         * (runner_resume_at puts the old one back) */
        int resumed = tk.resume && runner_resume_(&r) == 0;
        if (!r.t) break;  /* failed taking it up again (recorded) */
        runner_commands_done_(&r);
        if (relayout && resumed) break;  /* set up again from m6.db: the new spec */
        runner_publish_(&r);
        pthread_mutex_lock(&c->mu);
        int trains = run_machine_trains(&c->machine);
        pthread_mutex_unlock(&c->mu);
        if (!trains) {
            /* paused (or stopping): the other ranks leave the group */
            runner_dist_drop_(&r, "the run is not training");
            if (r.lost) break;  /* rebuilt from the last checkpoint */
            continue;
        }

        /* what an earlier boundary owes (a restart's validation pass) */
        m6_err err = M6_ERR_NONE;
        int orc = runner_owed_(&r, 1, &err);
        if (orc < 0) {
            runner_pause_error_(&r, r.data_error ? RUN_EV_DATA_ERROR : RUN_EV_WRITE_FAILED,
                         m6_err_msg(&err));
            m6_err_free(&err);
            continue;
        }
        if (orc > 0) continue; /* a command interrupted the owed pass */
        if (trainer_step_count(r.t) >= r.spec.train.steps) {
            if (complete_(&r)) break;
            continue;
        }
        runner_phase_policy_(&r);
        if (r.lost) break;  /* paused: rebuilt from the last checkpoint */
        if (r.coll && trainer_phase(r.t) != r.coll_phase)
            /* delinked: the ranks regroup and get the delinked state
             * from rank 0 (runner_dist_ready_) */
            runner_dist_drop_(&r, "delinked");
        if (!runner_dist_ready_(&r)) continue;
        pthread_mutex_lock(&c->mu);
        c->in_step = 1;  /* until the step's publication */
        pthread_mutex_unlock(&c->mu);
        if (step_(&r) != 0) break;
    }
    runner_dist_drop_(&r, "the run left the runner");
    trainer_free(r.t);
    free(r.best);
    free(r.outlier_at);
    free(r.outlier_quiet);
}

/* With mu held: make the next run of the queue the runner's (c->active,
 * 0 none), its state machine set from the DB: PAUSED for a run left paused,
 * else STARTING; the phase and the delink step as recorded. */
static void take_next_locked_(runner *c)
{
    int paused = 0;
    c->active = queue_next(c->st, &paused);
    c->delinking_at = -1;
    run_machine_set_error(&c->machine, NULL);
    c->machine = run_machine_init(paused ? RUN_PAUSED : RUN_STARTING);
    c->machine.shutdown = c->shutdown;
    c->active_step = 0;
    if (!c->active) {
        c->machine = run_machine_init(RUN_QUEUED);
        return;
    }
    run_row row;
    if (state_run_get(c->st, c->active, &row) == 0) {
        c->active_step = row.step;
        c->active_total = row.total_steps;
        /* as publish_ will say once the run is set up: the real phase's
         * first step if it was delinked, -1 if it trains from scratch or
         * is still pseudo */
        c->machine.real = row.phase;
        c->machine.delink_step = row.phase ? (long)row.delink_step : -1;
        run_row_clear(&row);
    }
    runner_replay_commands_locked_(c);
}

static void *thread_main_(void *arg)
{
    runner *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->shutdown) {
        if (!c->active) take_next_locked_(c);
        if (!c->active) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        c->step_s_ema = 0;
        int64_t id = c->active;
        pthread_mutex_unlock(&c->mu);
        run_one_(c, id);
        pthread_mutex_lock(&c->mu);
        /* a run that ended (completed, failed, stopped) has nothing left
         * to apply; one left by a shutdown keeps its pending commands */
        if (c->machine.state == RUN_COMPLETED || c->machine.state == RUN_FAILED ||
            c->machine.state == RUN_STOPPED)
            state_commands_mark(c->st, id, INT64_MAX, c->active_step);
        /* commands left for this run die with it; those sent before it
         * started (m6d just came up) were kept for it */
        c->active = 0;
        run_machine_set_error(&c->machine, NULL);
        c->machine = run_machine_init(RUN_QUEUED);
        c->machine.shutdown = c->shutdown;
        c->offload_valid = 0;
        pthread_cond_broadcast(&c->cv); /* a waiting resume: the run ended */
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* --------------------------------------------------------------- lifecycle */

runner *runner_init(const runner_config *cfg, char *err, size_t errlen)
{
    runner *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->st = cfg->st;
    c->threads = cfg->threads;
    c->rank_threads = cfg->rank_threads;
    c->coordinator = cfg->coordinator;
    c->delinking_at = -1;
    snprintf(c->worker_of, sizeof c->worker_of, "%s",
             cfg->worker_of ? cfg->worker_of : "");
    c->stats = cfg->stats;
    c->dist = cfg->dist;
    /* Test hook (tests/integration/prometheus.sh): every step takes this
     * many ms longer, so the step-duration histogram has a known answer. */
    const char *delay = getenv("M6_TEST_STEP_DELAY_MS");
    if (delay) c->step_delay_ms = atoi(delay) > 0 ? atoi(delay) : 0;
    snprintf(c->runs_dir, sizeof c->runs_dir, "%s", cfg->runs_dir);
    c->ckpts = (run_ckpts){.st = c->st, .runs_dir = c->runs_dir};
    c->machine = run_machine_init(RUN_QUEUED);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->cmd_mu, NULL);
    const char *hold = getenv("M6_TEST_HOLD_BOUNDARY");
    snprintf(c->hold_path, sizeof c->hold_path, "%s", hold ? hold : "");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* timed waits: resume */
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (paths_mkdir_p(c->runs_dir, 0755) < 0) {
        snprintf(err, errlen, "%s: %s", c->runs_dir, strerror(errno));
        goto fail;
    }
    run_ckpts_reconcile(&c->ckpts);
    runner_settle_specs_(c);
    if (cfg->no_thread) return c;  /* the testing seam (runner.h) */
    /* Pick the first active run now, so commands that arrive before the
     * runner thread gets going already find it. */
    take_next_locked_(c);
    int rc = threads_start(&c->thread, thread_main_, c);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_create: %s", strerror(rc));
        goto fail;
    }
    c->thread_started = 1;
    return c;
fail:
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->cmd_mu);
    free(c);
    return NULL;
}

void runner_request_shutdown(runner *c)
{
    pthread_mutex_lock(&c->mu);
    c->shutdown = 1;
    if (c->active)
        run_machine_on(&c->machine, RUN_EV_SHUTDOWN, NULL);
    c->machine.shutdown = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void runner_fini(runner *c)
{
    if (!c) return;
    runner_request_shutdown(c);
    if (c->thread_started) pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->cmd_mu);
    run_machine_set_error(&c->machine, NULL);
    free(c->resume_error);
    free(c);
}
