/*
 * coord.c — the coordinator (see coord.h): the worker thread's loop over
 * one run's steps, and the operator's commands, both steered by the run's
 * state machine (worker.h). The queue is queue.c, the checkpoints are
 * ckpt/store.c.
 */
#include "coord/coord.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/store.h"
#include "common/crashpoint.h"
#include "common/log.h"
#include "common/paths.h"
#include "coord/queue.h"
#include "coord/worker.h"
#include "dist/collectives.h"
#include "model/facts.h"
#include "train/data.h"
#include "train/spec.h"
#include "train/trainer.h"

struct coord {
    state *st;
    char runs_dir[3072];
    int threads;
    int coordinator;
    http_stats *stats;     /* /metrics (http/stats.h), NULL none */
    const coord_dist *dist; /* runs across nodes (coord.h), NULL none */
    int step_delay_ms;     /* test hook M6_TEST_STEP_DELAY_MS (coord_init) */
    ckpt_store store;      /* the runs' checkpoints (daemon/ckpt/store.h) */

    pthread_t thread;
    int thread_started;

    /* Everything below is guarded by mu; the worker waits on cv. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shutdown;
    int64_t active;       /* run the worker owns, 0 none */
    worker w;             /* its state machine (worker.h) */
    long active_step, active_total;
    double step_s_ema;    /* seconds per step, for the ETA */
    /* A resume is answered once the worker has tried it: the data reopened
     * and the writes owed done, or the reason it stays paused. Tickets:
     * each resume sent takes one (asked); the worker, taking the command,
     * serves every ticket up to resume_serving and, done, answers them
     * (answered). A resume sent while one is being tried joins it. */
    long resume_asked, resume_serving, resume_answered;
    char *resume_error;      /* the last answer, malloc'd: NULL it resumed */
    m6_code resume_code;     /* ... its code: M6_OK, M6_EDATA, M6_ENOFILE
                              * or M6_EBADSTATE */
    long resume_step;        /* ... the step it resumed at (its answer) */
    int offload_valid;    /* offload holds a sample of the active run */
    coord_offload offload;
    /* The command log (state.h, schema 0007): cmd_last is the newest
     * command of the active run recorded and applied to w (under mu); a
     * boundary takes every command up to it. cmd_mu (taken before mu)
     * serializes commands, so they are recorded in the order they are
     * applied, without holding mu over the database write. */
    int64_t cmd_last;
    pthread_mutex_t cmd_mu;
    /* tests: while this file exists the worker holds at its step boundary
     * (M6_TEST_HOLD_BOUNDARY), "" none */
    char hold_path[1024];
};

/* -------------------------------------------------------------- checkpoint */

typedef struct {
    coord *c;
    int64_t id;
    run_spec spec;
    trainer *t;
    long last_ckpt;   /* step of the newest checkpoint, -1 none */
    /* Writes owed at this step boundary, retried before the next step: a
     * metrics row the DB refused, a checkpoint that could not be written. */
    int metric_pending;
    metric_row pending;
    const char *ckpt_owed;  /* the checkpoint's why, NULL none */
    /* A shard could not be read (truncated or rewritten under the run): the
     * run paused; before the next step the data is opened again and the
     * pending row's validation pass, if that is what failed, is redone. */
    int data_error, eval_owed;
    m6_code data_code;      /* while data_error: M6_EDATA or M6_ENOFILE */
    long replay_delink;     /* an operator delink to replay at this step
                             * (recorded, then m6d restarted), -1 none */
    int64_t cmd_upto;       /* the commands this boundary took: up to this
                             * id (c->cmd_last at worker_boundary) */
    int64_t cmd_marked;     /* marked applied in m6.db up to this id */
    coord_offload off;     /* latest placement, published to c->offload */
    /* delink.policy plateau: the pseudo phase's validation passes so far,
     * in step order (from m6.db's rows at set-up, then as they come):
     * best[i] the least loss of passes 0..i, val the newest loss */
    double *best;
    int n_evals, cap_evals;
    double val;
    int plateau_seed_owed;  /* the passes before this life not read yet */
    double flops_per_token; /* model FLOPs per training token (MFU) */
    /* Across nodes (coord_dist): the run's group while it trains with
     * one, the phase it was made for, and the last reason it could not
     * be made (said once per change). */
    m6_coll *coll;
    run_phase coll_phase;
    char dist_why[512];
    double dist_retry_at;  /* CLOCK_MONOTONIC s: after a failed group,
                            * the next try (nodes.timeout later) */
} run_ctx;

/* Save the trainer at its step. -1 with err saying what failed (the caller
 * pauses the run, which logs it): the run keeps its last good checkpoint. */
static int checkpoint_(run_ctx *r, const char *why, m6_err *err)
{
    long step = trainer_step_count(r->t);
    if (step == r->last_ckpt) return 0;
    if (ckpt_store_save(&r->c->store, r->id, r->t, r->spec.checkpoint.keep, why,
                        err) < 0)
        return -1;
    r->last_ckpt = step;
    return 0;
}

/* ------------------------------------------------------------------ worker */

/* An event of the run's state machine (worker.h), under mu. */
static void on_(coord *c, worker_event ev, const char *reason)
{
    pthread_mutex_lock(&c->mu);
    if (worker_on(&c->w, ev, reason) < 0)
        log_warn("coord.event", "run=%lld event=%d state=%s: not expected",
                 (long long)c->active, (int)ev, worker_state_name(c->w.state));
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* What status shows of the trainer: its step and phase. */
static void publish_(run_ctx *r)
{
    coord *c = r->c;
    pthread_mutex_lock(&c->mu);
    c->active_step = trainer_step_count(r->t);
    c->w.real = trainer_phase(r->t) == PHASE_REAL;
    c->w.delink_step = trainer_delink_step(r->t);
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- offload */

/* Publish the run's placement for status (coord_offload_get): after a
 * step its facts, rates included (step 1); outside a step (set-up, delink:
 * step 0) the placement now, the latest step's rates kept. */
static void offload_publish_(run_ctx *r, const step_placement *p, int step)
{
    coord_offload o = r->off;
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

/* The placement now (set-up, after a delink). */
static void offload_sample_(run_ctx *r)
{
    step_placement p;
    trainer_placement(r->t, &p);
    offload_publish_(r, &p, 0);
}

static void fail_run_(run_ctx *r, const char *what, const char *err)
{
    m6_err m = m6_err_make(M6_EINTERNAL, "%s: %s", what, err);
    log_error("run.failed", "run=%lld err=\"%s\"", (long long)r->id, m.msg);
    on_(r->c, WE_FAILED, NULL);
    state_run_set_state(r->c->st, r->id, RUN_FAILED, m.msg);
    state_event(r->c->st, r->id, "failed", "%s", m.msg);
    m6_err_free(&m);
}

/* The run pauses itself (ev: a data error, a write that failed, no
 * checkpoint that loads, a stop that could not be done): stop training at
 * this boundary, in memory first, so nothing is lost and nothing loops.
 * One error line; the reason is kept for status even if the DB cannot take
 * it. `m6ctl resume` retries. */
static void pause_error_(run_ctx *r, worker_event ev, const char *reason)
{
    coord *c = r->c;
    long step = trainer_step_count(r->t);
    log_error("run.paused", "run=%lld step=%ld reason=\"%s\"",
              (long long)r->id, step, reason);
    pthread_mutex_lock(&c->mu);
    if (worker_on(&c->w, ev, reason) < 0)
        log_warn("coord.event", "run=%lld event=%d state=%s: not expected",
                 (long long)r->id, (int)ev, worker_state_name(c->w.state));
    c->w.error_code = ev == WE_DATA_ERROR ? r->data_code
                      : ev == WE_CKPT_LOST ? M6_ENOCKPT : M6_EBADSTATE;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    /* held: recorded as soon as m6.db can take it, even while another
     * process holds its write lock (state.h) */
    if (state_run_set_state_held(c->st, r->id, RUN_PAUSED, reason) == 0)
        state_event(c->st, r->id, "paused.error", "step=%ld %s", step, reason);
    publish_(r);
}

/* "what: state DB: <SQLite's message>" */
static void db_error_(run_ctx *r, const char *what, m6_err *err)
{
    char e[256];  /* SQLite's words: no paths */
    state_last_error(r->c->st, e, sizeof e);
    m6_err_set(err, M6_EINTERNAL, "%s: state DB: %s", what, e);
}

/* Do the writes owed at this step boundary. -1 with err if one fails; it
 * stays owed. */
static int flush_(run_ctx *r, m6_err *err)
{
    if (r->metric_pending) {
        if (state_record_step(r->c->st, r->id, &r->pending) < 0) {
            char what[64];
            snprintf(what, sizeof what, "recording step %lld",
                     (long long)r->pending.step);
            db_error_(r, what, err);
            return -1;
        }
        r->metric_pending = 0;
    }
    if (r->ckpt_owed) {
        if (checkpoint_(r, r->ckpt_owed, err) < 0) return -1;
        r->ckpt_owed = NULL;
    }
    return 0;
}

/* --------------------------------------------------------- phase policy */

/* trainer_set_eval_interrupt's function (ud: the coord): a stop, a pause
 * or a shutdown is waiting, so the validation pass in progress is
 * abandoned and the command taken at the boundary right after it. A pass
 * of many batches (train.eval_batches) would otherwise hold the command,
 * and SIGTERM, for as long as it runs. */
static int eval_interrupt_(void *ud)
{
    coord *c = ud;
    pthread_mutex_lock(&c->mu);
    int stop = c->shutdown || c->w.state == W_STOPPING ||
               c->w.state == W_PAUSING;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

/* The validation pass of step was abandoned for a command
 * (eval_interrupt_; why says after how many batches): the step has no
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

/* delink.policy plateau: note a validation pass of the pseudo phase
 * (loss in nats per token). Out of memory: logged, the pass is not
 * counted (the pseudo.steps bound still delinks). */
static void plateau_note_(run_ctx *r, double val_loss)
{
    if (r->spec.delink.policy != DELINK_AT_PLATEAU || !isfinite(val_loss))
        return;
    if (r->n_evals == r->cap_evals) {
        int cap = r->cap_evals ? 2 * r->cap_evals : 64;
        double *b = realloc(r->best, (size_t)cap * sizeof *b);
        if (!b) {
            log_error("run.plateau", "run=%lld: out of memory, validation "
                      "pass not counted", (long long)r->id);
            return;
        }
        r->best = b;
        r->cap_evals = cap;
    }
    double prev = r->n_evals ? r->best[r->n_evals - 1] : INFINITY;
    r->best[r->n_evals++] = val_loss < prev ? val_loss : prev;
    r->val = val_loss;
}

/* delink.policy plateau, the rule (DESIGN.md "Phase policy: plateau"):
 * with passes 1..n and best_i the least loss of passes 1..i, the pseudo
 * phase has plateaued at pass n when n > patience and
 * best_{n-patience} - best_n < min_delta. 1 with the event's detail
 * ("val=V best=B prior_best=P evals=N") in buf; 0 not (yet). */
static int plateau_reached_(const run_ctx *r, char *buf, size_t len)
{
    int p = r->spec.delink.patience, n = r->n_evals;
    if (r->spec.delink.policy != DELINK_AT_PLATEAU || n <= p) return 0;
    double now = r->best[n - 1], prior = r->best[n - 1 - p];
    if (!(prior - now < (double)r->spec.delink.min_delta)) return 0;
    snprintf(buf, len, "val=%.9g best=%.9g prior_best=%.9g evals=%d", r->val,
             now, prior, n);
    return 1;
}

/* delink.policy plateau at set-up: the passes this trajectory made in the
 * pseudo phase, from m6.db's metrics rows up to the step the trainer
 * resumes from (rows past it are the ones align_tables_ drops). A run in
 * the real phase needs none. -1 if the rows cannot be read (the run
 * pauses: the rule would miss passes). */
static int plateau_seed_(run_ctx *r, m6_err *err)
{
    if (!r->plateau_seed_owed) return 0;
    if (r->spec.delink.policy != DELINK_AT_PLATEAU ||
        trainer_phase(r->t) != PHASE_PSEUDO) {
        r->plateau_seed_owed = 0;
        return 0;
    }
    metric_row *rows = NULL;
    int n = 0;
    if (state_metrics_list(r->c->st, r->id, 0, &rows, &n) < 0) {
        char db[512];
        state_last_error(r->c->st, db, sizeof db);
        m6_err_set(err, M6_EINTERNAL, "reading the validation losses of the "
                   "pseudo phase (delink.policy plateau) from m6.db: %s", db);
        return -1;
    }
    long step = trainer_step_count(r->t);
    for (int i = 0; i < n; i++)
        if (rows[i].phase == 0 && rows[i].step <= step)
            plateau_note_(r, rows[i].val_loss);
    free(rows);
    r->plateau_seed_owed = 0;
    return 0;
}

/* The code of a data error (rc TRAINER_EDATA or TRAINER_ENOFILE): what
 * the handler's advice is keyed by (`m6ctl resume` reopens the data). */
static m6_code data_code_(int rc)
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
        r->data_code = data_code_(rc);
        return -1;
    }
    if (r->eval_owed) {
        r->pending.val_loss = v;
        if (r->pending.phase == 0) plateau_note_(r, v);
        r->metric_pending = 1;
        r->eval_owed = 0;
        log_info("run.eval_redone", "run=%lld step=%ld val_loss=%g",
                 (long long)r->id, r->pending.step, (double)v);
    }
    return 0;
}

/* With c->mu held: answer the resumes up to ticket (never backwards): err
 * NULL, the run trains on; else why it stays paused, and its code (M6_EDATA
 * and M6_ENOFILE get the handler's advice). */
static void answer_locked_(coord *c, long ticket, const char *err,
                           m6_code code)
{
    if (ticket > c->resume_answered)
        c->resume_answered = ticket;
    free(c->resume_error);
    c->resume_error = err ? strdup(err) : NULL;
    if (err && !c->resume_error)
        c->resume_error = strdup("out of memory");
    c->resume_code = err ? code : M6_OK;
    c->resume_step = c->active_step; /* the run goes on from here */
    pthread_cond_broadcast(&c->cv);
}

/* Delink now, the event saying why (reason: spec, plateau, operator,
 * replay) and, when detail is not NULL, the figures it went by. */
static void delink_detail_(run_ctx *r, const char *reason, const char *detail)
{
    char err[512];
    long step = trainer_step_count(r->t);
    if (trainer_delink(r->t, err, sizeof err) < 0) {
        log_error("run.delink_failed", "run=%lld step=%ld err=\"%s\"",
                  (long long)r->id, step, err);
        return;
    }
    crashpoint("delink");
    /* the phase, the run's delink step and progress, the event and the
     * operator's delink commands: one transaction */
    char ev[640];
    snprintf(ev, sizeof ev, "step=%ld reason=%s slots=%d%s%s", step, reason,
             trainer_n_slots(r->t), detail ? " " : "", detail ? detail : "");
    int op = strcmp(reason, "operator") == 0;
    state_commit cm = {.delink = 1, .event_kind = "delink",
                       .event_detail = ev, .step = step,
                       .cmd_upto = op ? r->cmd_upto : 0,
                       .cmd_kinds = STATE_CMD_DELINK};
    if (state_commit_run(r->c->st, r->id, &cm) < 0)
        log_error("run.delink_record", "run=%lld step=%ld: the delink is done "
                  "but could not be recorded", (long long)r->id, step);
    log_info("run.delink", "run=%lld step=%ld reason=%s%s%s", (long long)r->id,
             step, reason, detail ? " " : "", detail ? detail : "");
    offload_sample_(r);  /* new share map, new plan */
    publish_(r);
}

static void delink_(run_ctx *r, const char *reason)
{
    delink_detail_(r, reason, NULL);
}

/* ------------------------------------------------------------ run set-up */

/* Make the state DB agree with the trainer a run resumes from (its
 * checkpoint's step and phase): metrics past the checkpoint are redone;
 * an operator delink recorded at a step not reached yet is kept and
 * replayed at that step (r->replay_delink); runs.delink_step is where this
 * trajectory delinked. Returns state_metrics_truncate's count (-1: the
 * rows could not be dropped). */
static int align_tables_(run_ctx *r, int was_queued, int64_t recorded_delink)
{
    coord *c = r->c;
    int64_t id = r->id;
    long step = trainer_step_count(r->t);
    int phase = trainer_phase(r->t) == PHASE_REAL;
    int dropped = state_metrics_truncate(c->st, id, step);
    int64_t from;
    if (phase == 0 && state_phase_get(c->st, id, 1, &from) == 0) {
        if (from >= step)
            r->replay_delink = (long)from;
        else
            state_phase_delete(c->st, id, 1);
    }
    if (state_phase_get(c->st, id, r->spec.pseudo.steps > 0 ? 0 : 1, &from) == 1)
        state_phase_set(c->st, id, r->spec.pseudo.steps > 0 ? 0 : 1, 0);
    state_run_set_progress(c->st, id, step, phase);
    /* runs.delink_step says where the trajectory we resume from delinked
     * (-1: it has not, or it trains from scratch); a delink recorded past
     * the checkpoint is recorded again when it is replayed */
    if (recorded_delink != trainer_delink_step(r->t))
        state_run_set_delink(c->st, id, trainer_delink_step(r->t));
    /* Steps between the last row m6.db has and the checkpoint: their
     * records were held in memory (m6.db locked by another process) when
     * m6d ended, while the checkpoint made it to disk (adopted by
     * ckpt_store_reconcile). They are not trained again: said, not
     * silent. */
    if (!was_queued && step > 0) {
        metric_row last;
        double last_val;
        int lr = state_metric_last(c->st, id, &last, &last_val);
        long first_missing = lr == 1 ? 1 : lr == 0 ? (long)last.step + 1 : 0;
        if (first_missing > 0 && first_missing <= step) {
            log_warn("metrics.gap", "run=%lld steps=%ld-%ld cause=\"their "
                     "records were held in memory (m6.db locked) when m6d "
                     "ended; the checkpoint at step %ld was kept\"",
                     (long long)id, first_missing, step, step);
            state_event(c->st, id, "metrics.gap", "steps %ld-%ld have no "
                        "metrics rows: their records were held in memory "
                        "(m6.db locked by another process) when m6d ended; "
                        "training goes on from the checkpoint at step %ld",
                        first_missing, step, step);
        }
    }
    /* A step whose training went through but whose validation pass could
     * not read the data (its row, the newest left, has no val_loss) owes
     * that pass: redone before the next step, as in the life that paused
     * on it. */
    if (!was_queued && step > 0 && trainer_step_evaluates(r->t, step)) {
        metric_row last;
        double last_val;
        if (state_metric_last(c->st, id, &last, &last_val) == 0 &&
            last.step == step && isnan(last.val_loss)) {
            r->pending = last;
            r->eval_owed = r->data_error = 1;
            r->data_code = M6_EDATA;
        }
    }
    return dropped;
}

/* Take up run id: parse its spec, build the trainer, load the newest
 * checkpoint that loads, make the tables agree with it, record the start.
 * The run may pause itself on the way (data that cannot be read, a write
 * that failed, no checkpoint that loads): it is then PAUSED with the
 * reason. 0 with r set up; -1 when the run failed (recorded). */
static int setup_(coord *c, int64_t id, run_ctx *r)
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
    int64_t recorded_delink = row.delink_step;
    /* a paused run keeps its reason */
    char *kept_error = strdup(paused && row.error ? row.error : "");
    run_row_clear(&row);
    if (!kept_error) {
        fail_run_(r, "setup", "out of memory");
        return -1;
    }
    if (rc < 0) {
        fail_run_(r, "spec", err);
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
        fail_run_(r, "trainer_create", m6_err_msg(&e));
        m6_err_free(&e);
        free(kept_error);
        return -1;
    }
    if (ckpt_store_restore(&c->store, id, &r->spec, &r->t,
                           was_queued ? NULL : &data_rc, &r->last_ckpt, &e,
                           &lost) < 0) {
        fail_run_(r, "trainer_create", m6_err_msg(&e));
        m6_err_free(&e);
        free(kept_error);
        return -1;
    }
    trainer_set_eval_interrupt(r->t, eval_interrupt_, c);
    /* the shards it opened must hold what the checkpoint was trained on */
    if (!was_queued && !data_rc && r->last_ckpt >= 0)
        data_rc = trainer_check_data(r->t, &e);
    m6_err open_err = M6_ERR_NONE;
    if (data_rc) {
        r->data_error = 1;
        r->data_code = data_code_(data_rc);
        open_err = e;  /* the data's error, whole */
        e = M6_ERR_NONE;
    }
    m6_err_free(&e);
    long step = trainer_step_count(r->t);
    int phase = trainer_phase(r->t) == PHASE_REAL;

    int dropped = align_tables_(r, was_queued, recorded_delink);
    r->plateau_seed_owed = 1;  /* read before the first step (owed_) */

    pthread_mutex_lock(&c->mu);
    worker_set_error(&c->w, kept_error);
    c->w.error_code = kept_error[0] ? M6_EBADSTATE : M6_OK;
    c->active_total = r->spec.train.steps;
    pthread_mutex_unlock(&c->mu);
    int erred = 1;
    if (state_run_set_state(c->st, id, paused ? RUN_PAUSED : RUN_RUNNING,
                            kept_error[0] ? kept_error : NULL) < 0) {
        db_error_(r, "recording the start", &e);
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&e));
    } else if (dropped < 0) {
        /* Rows past the checkpoint stay until training rewrites them
         * (INSERT OR REPLACE); pause so the operator sees why. */
        db_error_(r, "dropping metrics past the checkpoint", &e);
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&e));
    } else if (lost.msg) {
        /* every checkpoint failed to load: starting over from step 0 is
         * the operator's call, not a silent one */
        pause_error_(r, WE_CKPT_LOST, lost.msg);
    } else if (data_rc) {
        pause_error_(r, WE_DATA_ERROR, m6_err_msg(&open_err));
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
    offload_sample_(r);
    publish_(r);
    on_(c, WE_STARTED, NULL);
    return 0;
}

/* ------------------------------------------------- commands at a boundary */

/* The run's state s with its event ("kind", "step=N") and the state
 * machine's commands this boundary took, marked applied: one
 * transaction. 0 or -1 (nothing written). */
static int commit_state_(run_ctx *r, run_state s, const char *kind, long step)
{
    char detail[64];
    snprintf(detail, sizeof detail, "step=%ld", step);
    state_commit cm = {.set_state = 1, .state = s, .event_kind = kind,
                       .event_detail = detail, .step = step,
                       .cmd_upto = r->cmd_upto,
                       .cmd_kinds = STATE_CMD_NOT_DELINK};
    if (state_commit_run(r->c->st, r->id, &cm) < 0)
        return -1;
    return 0;
}

/* After a boundary's commands: every command it took is applied, or had
 * nothing left to do (a pause cancelled by a resume, a delink of a run
 * that delinked already); marked so, they are not applied again after a
 * restart. A failed mark leaves them pending: applying one again finds
 * nothing to do. */
static void commands_done_(run_ctx *r)
{
    if (r->cmd_upto <= r->cmd_marked)
        return;
    if (state_commands_mark(r->c->st, r->id, r->cmd_upto,
                            trainer_step_count(r->t)) == 0)
        r->cmd_marked = r->cmd_upto;
}

/* Tests (M6_TEST_HOLD_BOUNDARY): wait at the boundary while the file is
 * there, so that a command is acknowledged and m6d killed before the
 * boundary takes it. */
static void test_hold_(coord *c)
{
    if (!c->hold_path[0])
        return;
    int logged = 0;
    while (access(c->hold_path, F_OK) == 0) {
        if (!logged++)
            log_info("test.hold", "boundary held while %s exists",
                     c->hold_path);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->mu);
        int stop = c->shutdown;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
    }
}

/* Stop: final only with everything written. Otherwise the run pauses
 * (training ends now) and a later stop retries. 1 stopped, 0 not. */
static int stop_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    int ok = flush_(r, &err) == 0 && checkpoint_(r, "stop", &err) == 0;
    char detail[64];
    snprintf(detail, sizeof detail, "step=%ld", step);
    state_commit cm = {.set_state = 1, .state = RUN_STOPPED,
                       .event_kind = "stop", .event_detail = detail,
                       .step = step, .cmd_upto = r->cmd_upto,
                       .cmd_kinds = STATE_CMD_NOT_DELINK};
    if (ok && state_commit_run(c->st, r->id, &cm) < 0) {
        db_error_(r, "recording the stop", &err);
        ok = 0;
    }
    if (!ok) {
        m6_err why = m6_err_make(M6_EBADSTATE, "stop not done (%s); stop "
                                 "again once there is space",
                                 m6_err_msg(&err));
        m6_err_free(&err);
        pause_error_(r, WE_STOP_FAILED, why.msg);
        /* a resume sent before the stop, not tried: it stays paused */
        pthread_mutex_lock(&c->mu);
        if (c->resume_asked > c->resume_answered)
            answer_locked_(c, c->resume_asked, why.msg, M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
        m6_err_free(&why);
        return 0;
    }
    on_(c, WE_STOPPED, NULL);
    log_info("run.stop", "run=%lld step=%ld", (long long)r->id, step);
    return 1;
}

/* Pause (the state is PAUSED already): the writes owed, a checkpoint, the
 * state; a failure keeps it paused with the reason. */
static void pause_(run_ctx *r)
{
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    if (flush_(r, &err) < 0 || checkpoint_(r, "pause", &err) < 0) {
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    } else if (commit_state_(r, RUN_PAUSED, "pause", step) < 0) {
        db_error_(r, "recording the pause", &err);
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    } else {
        log_info("run.pause", "run=%lld step=%ld", (long long)r->id, step);
    }
    m6_err_free(&err);
    publish_(r);
}

/* m6d stops (a signal): checkpoint and leave the run as it is recorded,
 * running or paused, for the next start. resume: a resume was taken at
 * this boundary (not tried: it is answered so). */
static void interrupted_(run_ctx *r, int resume)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    pthread_mutex_lock(&c->mu);
    int paused = c->w.state != W_RUNNING; /* PAUSED, or RESUMING untried */
    pthread_mutex_unlock(&c->mu);
    /* On failure the next start resumes from the last good one. */
    if (checkpoint_(r, "shutdown", &err) < 0)
        log_warn("run.interrupted", "run=%lld step=%ld err=\"%s\"",
                 (long long)r->id, step, m6_err_msg(&err));
    m6_err_free(&err);
    state_event(c->st, r->id, "interrupted", "step=%ld %s at next start", step,
                paused ? "paused" : "resumes");
    log_info("run.interrupted", "run=%lld step=%ld paused=%d",
             (long long)r->id, step, paused);
    if (resume) {
        pthread_mutex_lock(&c->mu);
        answer_locked_(c, c->resume_serving, "m6d is stopping; resume the run "
                       "once it is back", M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
    }
}

/* The writes a boundary owes before the next step: the plateau policy's
 * passes from m6.db (after a restart), data to reopen after a
 * data error (and the validation pass it owes, or one a command
 * interrupted), then what the last boundary could not write. 0, or -1
 * with err (they stay owed), or 1 when a command interrupted the pass
 * again (still owed). redo: as retry_data_'s. */
static int owed_(run_ctx *r, int redo, m6_err *err)
{
    /* the seed first: the pass retry_data_ redoes is not in m6.db yet */
    if (plateau_seed_(r, err) < 0) return -1;
    int rc = retry_data_(r, redo, err);
    if (rc < 0 || flush_(r, err) < 0) return -1;
    return rc;
}

/* Try the resume taken at this boundary: the writes owed, then the state.
 * Only then is it a resume (event); one that fails leaves the run paused
 * with the reason. The resumes waiting get the answer. */
static void resume_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    /* a pass a command interrupted is redone after the answer (run_one_);
     * 1: the pass owed for bad data was interrupted again (still owed):
     * the resume stands, the command that interrupted it is taken next */
    int rc = owed_(r, 0, &err) < 0 ? -1 : 0;
    worker_event failed = r->data_error ? WE_DATA_ERROR : WE_WRITE_FAILED;
    if (rc == 0 && commit_state_(r, RUN_RUNNING, "resume", step) < 0) {
        db_error_(r, "recording the resume", &err);
        rc = -1;
        failed = WE_WRITE_FAILED;
    }
    if (rc < 0) {
        pause_error_(r, failed, m6_err_msg(&err));
        pthread_mutex_lock(&c->mu);
        answer_locked_(c, c->resume_serving, m6_err_msg(&err),
                       failed == WE_DATA_ERROR ? r->data_code : M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
        m6_err_free(&err);
        return;
    }
    log_info("run.resume", "run=%lld step=%ld", (long long)r->id, step);
    /* a pause for non-finite steps: the operator gives it max_bad_steps
     * more */
    trainer_clear_bad_steps(r->t);
    pthread_mutex_lock(&c->mu);
    worker_on(&c->w, WE_RESUMED, NULL);
    answer_locked_(c, c->resume_serving, NULL, M6_OK);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ the step */

/* The last step is done: a checkpoint, then completed. 1 completed. */
static int complete_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    if (checkpoint_(r, "end", &err) < 0) {
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
        m6_err_free(&err);
        return 0;
    }
    if (state_run_set_state(c->st, r->id, RUN_COMPLETED, NULL) < 0) {
        db_error_(r, "recording the completion", &err);
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
        m6_err_free(&err);
        return 0;
    }
    on_(c, WE_COMPLETED, NULL);
    state_event(c->st, r->id, "completed", "step=%ld", step);
    log_info("run.completed", "run=%lld step=%ld", (long long)r->id, step);
    return 1;
}

/* The phase policy: delink before the step that would take the run past
 * spec.pseudo.steps, or (delink.policy plateau) at the first boundary after
 * a validation pass that meets the plateau rule, or at an operator delink
 * replayed after a restart. */
static void phase_policy_(run_ctx *r)
{
    if (trainer_phase(r->t) != PHASE_PSEUDO) return;
    long step = trainer_step_count(r->t);
    char detail[256];
    if (r->replay_delink >= 0 && step >= r->replay_delink)
        delink_(r, "replay");
    else if (plateau_reached_(r, detail, sizeof detail))
        delink_detail_(r, "plateau", detail);
    else if (r->spec.pseudo.steps > 0 && step >= r->spec.pseudo.steps)
        delink_(r, "spec");
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
    };
    stats_step(r->c->stats, &s);
}

/* train.max_bad_steps non-finite steps in a row: the run pauses itself
 * (its weights are those before the first of them; the step records and
 * the events have each). `m6ctl resume` clears the count and tries again. */
static void bad_steps_pause_(run_ctx *r, const step_result *res)
{
    m6_err why = m6_err_make(M6_EBADSTATE, "%ld non-finite steps in a row "
        "(train.max_bad_steps %ld), the last step %ld (loss %g, grad norm %g): "
        "their updates were skipped; lower train.lr or check the data, then "
        "`m6ctl resume` tries again", res->bad_steps,
        r->spec.train.max_bad_steps, res->step, (double)res->train_loss,
        (double)res->grad_norm);
    pause_error_(r, WE_BAD_STEPS, m6_err_msg(&why));
    m6_err_free(&why);
}

/* One step, recorded: its metrics row (and a checkpoint every
 * checkpoint.every steps) written before the next boundary. -1 when the
 * run failed (recorded); 1 when a collective failed (the run paused; the
 * trainer must be rebuilt from the last checkpoint). */
static int step_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    step_result res;
    m6_err data_err = M6_ERR_NONE;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (c->step_delay_ms > 0) /* test hook: a step of known length */
        nanosleep(&(struct timespec){c->step_delay_ms / 1000,
                                     (c->step_delay_ms % 1000) * 1000000L},
                  NULL);
    int src = trainer_step(r->t, &res, &data_err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (src == TRAINER_EDATA) {
        /* like a write that failed: pause, keep the model; the operator
         * fixes the shard and resumes (retry_data_) */
        r->data_error = 1;
        r->data_code = data_code_(src);
        if (!res.eval_failed) { /* nothing of the step was done */
            /* the model is the last step's, sound: checkpoint it, as a
             * plain pause does, so that a crash before the shard is fixed
             * does not train those steps again. A write that fails is
             * logged; the run keeps its last checkpoint. */
            m6_err werr = M6_ERR_NONE;
            if (flush_(r, &werr) < 0 || checkpoint_(r, "pause", &werr) < 0)
                log_warn("run.checkpoint", "run=%lld err=\"%s\": paused on "
                         "bad data with its last checkpoint", (long long)r->id,
                         m6_err_msg(&werr));
            m6_err_free(&werr);
            pause_error_(r, WE_DATA_ERROR, m6_err_msg(&data_err));
            m6_err_free(&data_err);
            return 0;
        }
        r->eval_owed = 1; /* the step stands: record it, val_loss owed */
    } else if (src == TRAINER_ECOLL) {
        /* a rank died or stopped answering: the step was not applied;
         * pause, and the worker reloads the last checkpoint (run_one_) */
        char why[1200];
        snprintf(why, sizeof why, "a rank of the run's %d-rank group "
                 "failed: %s", trainer_world_size(r->t),
                 m6_err_msg(&data_err));
        r->data_code = M6_EBADSTATE;
        pause_error_(r, WE_DATA_ERROR, why);
        m6_err_free(&data_err);
        return 1;
    } else if (src < 0) {
        fail_run_(r, "trainer_step", m6_err_msg(&data_err));
        m6_err_free(&data_err);
        return -1;
    }
    on_(c, WE_STEP_DONE, NULL);
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
        .skipped = res.skipped, .skipped_total = res.skipped_total,
    };
    r->pending = m;
    if (res.eval_interrupted)
        eval_interrupted_(r, res.step, &data_err);
    else if (res.evaluated && !res.eval_failed && m.phase == 0)
        plateau_note_(r, res.val_loss);
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
        log_warn("run.step_skipped", "run=%lld step=%ld loss=%g grad_norm=%g "
                 "bad_steps=%ld", (long long)r->id, res.step,
                 (double)res.train_loss, (double)res.grad_norm, res.bad_steps);
        state_event(c->st, r->id, "step.skipped", "step=%ld loss=%g "
                    "grad_norm=%g bad_steps=%ld skipped_total=%ld", res.step,
                    (double)res.train_loss, (double)res.grad_norm,
                    res.bad_steps, res.skipped_total);
    }
    if (flush_(r, &err) < 0)
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    else if (state_hold_overdue(c->st, held_why, sizeof held_why))
        /* another process has held m6.db's write lock past the limit */
        pause_error_(r, WE_WRITE_FAILED, held_why);
    else if (r->data_error) /* its pass could not read the data */
        pause_error_(r, WE_DATA_ERROR, m6_err_msg(&data_err));
    else if (res.bad_steps >= r->spec.train.max_bad_steps)
        bad_steps_pause_(r, &res);
    else
        publish_(r);
    m6_err_free(&err);
    m6_err_free(&data_err);
    return 0;
}

/* ---------------------------------------------- across nodes (coord_dist) */

/* Leave the run's group (if any): the trainer trains alone again, the
 * other ranks' collectives fail at once and they free their trainers. */
static void dist_drop_(run_ctx *r, const char *why)
{
    if (!r->coll) return;
    coord *c = r->c;
    m6_err e = M6_ERR_NONE;
    trainer_set_collectives(r->t, NULL, &e);
    m6_err_free(&e);
    m6_coll_destroy(r->coll);
    r->coll = NULL;
    if (c->dist && c->dist->ungroup) c->dist->ungroup(c->dist->ud, r->id);
    log_info("run.ungroup", "run=%lld step=%ld why=\"%s\"", (long long)r->id,
             trainer_step_count(r->t), why);
}

/* Before a step: a run whose current phase has world size W > 1 trains
 * only in a group of W ranks. 1: train now; 0: not yet (the reason is an
 * event and the run's error in status, once per change; the worker sleeps
 * a little, or less when a command comes in, and comes back). */
static int dist_ready_(run_ctx *r)
{
    coord *c = r->c;
    int world = spec_world_of_phase(&r->spec,
                                    trainer_phase(r->t) == PHASE_PSEUDO);
    if (world <= 1 || r->coll) return 1;
    char why[512] = "";
    m6_coll *g = NULL;
    int rc = 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double now_s = (double)now.tv_sec + now.tv_nsec * 1e-9;
    if (now_s < r->dist_retry_at) {
        /* a group failed (a refused rank, a rendezvous timeout): not
         * every 300 ms, which would reassign the nodes as often */
        snprintf(why, sizeof why, "%s", r->dist_why);
        rc = -1;
    } else if (c->dist && c->dist->group)
        rc = c->dist->group(c->dist->ud, r->id, &r->spec, r->t, world, &g,
                            why, sizeof why);
    else
        snprintf(why, sizeof why, "nodes.world_size %d needs a coordinator "
                 "(m6d --role coordinator --listen HOST:PORT)", world);
    if (rc == 1) {
        m6_err e = M6_ERR_NONE;
        if (trainer_set_collectives(r->t, g, &e) == 0) {
            r->coll = g;
            r->coll_phase = trainer_phase(r->t);
            r->dist_why[0] = 0;
            state_event(c->st, r->id, "nodes.group", "world_size=%d step=%ld",
                        world, trainer_step_count(r->t));
            log_info("run.group", "run=%lld world_size=%d step=%ld",
                     (long long)r->id, world, trainer_step_count(r->t));
            pthread_mutex_lock(&c->mu);
            worker_set_error(&c->w, NULL);
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
        snprintf(why, sizeof why, "%s", m6_err_msg(&e));
        m6_err_free(&e);
        m6_coll_destroy(g);
        rc = -1;
    }
    if (rc < 0 && now_s >= r->dist_retry_at)
        r->dist_retry_at = now_s + (r->spec.nodes.timeout > 0
                                        ? r->spec.nodes.timeout : 30);
    if (strcmp(why, r->dist_why) != 0) {
        snprintf(r->dist_why, sizeof r->dist_why, "%s", why);
        state_event(c->st, r->id, rc == 0 ? "nodes.wait" : "nodes.refused",
                    "%s", why);
        log_warn(rc == 0 ? "run.wait" : "run.group_failed",
                 "run=%lld why=\"%s\"", (long long)r->id, why);
        pthread_mutex_lock(&c->mu);
        worker_set_error(&c->w, why);
        pthread_mutex_unlock(&c->mu);
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += 300 * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    pthread_cond_timedwait(&c->cv, &c->mu, &until);
    pthread_mutex_unlock(&c->mu);
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
static int stop_before_setup_(coord *c, int64_t id)
{
    pthread_mutex_lock(&c->mu);
    int stopping = c->w.state == W_STOPPING;
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
    on_(c, WE_STOPPED, NULL);
    log_info("run.stop", "run=%lld step=%ld before=setup", (long long)id,
             step);
    return 1;
}

/* The worker's life with one run: set it up, then at every step boundary
 * the operator's commands (in the order stop, delink, pause, shutdown,
 * resume: a stop, delink or pause m6d has acknowledged holds across a
 * shutdown), then the step: completion, phase policy, step, record. A stop
 * pending before set-up ends it without setting it up. */
static void run_one_(coord *c, int64_t id)
{
    run_ctx r = {.c = c, .id = id, .last_ckpt = -1, .replay_delink = -1};
    r.off.h2d_gbps = r.off.d2h_gbps = r.off.copy_hidden_fraction = NAN;
    r.off.offload_redo_steps = -1;
    if (stop_before_setup_(c, id))
        return;
    if (setup_(c, id, &r) < 0) {
        trainer_free(r.t);
        free(r.best);
        return;
    }
    for (;;) {
        /* commands */
        pthread_mutex_lock(&c->mu);
        while (worker_waits(&c->w))
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->hold_path[0]) {
            pthread_mutex_unlock(&c->mu);
            test_hold_(c);
            pthread_mutex_lock(&c->mu);
        }
        worker_take tk = worker_boundary(&c->w);
        if (tk.resume) c->resume_serving = c->resume_asked;
        r.cmd_upto = c->cmd_last;
        pthread_mutex_unlock(&c->mu);
        if (tk.stop) {
            int stopped = stop_(&r);
            commands_done_(&r);
            if (stopped) break;
            continue;
        }
        if (tk.delink && trainer_phase(r.t) == PHASE_PSEUDO)
            delink_(&r, "operator");
        if (tk.pause) pause_(&r);
        if (tk.shutdown) {
            /* what this boundary took is done; commands sent after it
             * were refused (m6d is stopping) */
            interrupted_(&r, tk.resume);
            commands_done_(&r);
            break;
        }
        if (tk.resume) resume_(&r);
        commands_done_(&r);
        publish_(&r);
        pthread_mutex_lock(&c->mu);
        int trains = worker_trains(&c->w);
        pthread_mutex_unlock(&c->mu);
        if (!trains) {
            /* paused (or stopping): the other ranks leave the group */
            dist_drop_(&r, "the run is not training");
            continue;
        }

        /* what an earlier boundary owes (a restart's validation pass) */
        m6_err err = M6_ERR_NONE;
        int orc = owed_(&r, 1, &err);
        if (orc < 0) {
            pause_error_(&r, r.data_error ? WE_DATA_ERROR : WE_WRITE_FAILED,
                         m6_err_msg(&err));
            m6_err_free(&err);
            continue;
        }
        if (orc > 0) continue; /* a command interrupted the owed pass */
        if (trainer_step_count(r.t) >= r.spec.train.steps) {
            if (complete_(&r)) break;
            continue;
        }
        phase_policy_(&r);
        if (r.coll && trainer_phase(r.t) != r.coll_phase)
            /* delinked: the ranks regroup and get the delinked state
             * from rank 0 (dist_ready_) */
            dist_drop_(&r, "delinked");
        if (!dist_ready_(&r)) continue;
        if (step_(&r) != 0) break;
    }
    dist_drop_(&r, "the run left the worker");
    trainer_free(r.t);
    free(r.best);
}

/* With mu held, for the run just taken up (c->active): the commands m6d
 * acknowledged for it and did not apply before it stopped (a crash, kill
 * -9, power loss), applied to its state machine again in the order they
 * came, as if they had just been sent: its next boundary takes them. A
 * command that finds nothing to do (a pause of a run recorded paused)
 * changes nothing and is marked applied there. */
static void replay_commands_locked_(coord *c)
{
    static const char *const kinds[] = {"pause", "resume", "delink", "stop"};
    command_row *rows = NULL;
    int n = 0;
    c->cmd_last = 0;
    if (state_commands_pending(c->st, c->active, &rows, &n) < 0) {
        log_error("command.replay", "run=%lld: cannot read its pending "
                  "commands", (long long)c->active);
        return;
    }
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < 4 && strcmp(rows[i].kind, kinds[k]) != 0)
            k++;
        c->cmd_last = rows[i].id;
        if (k == 4)
            continue;  /* marked applied at the first boundary */
        unsigned act = 0;
        size_t len = strlen(c->w.error) + 512;
        char *msg = malloc(len);
        if (!msg)
            break;
        m6_code code = worker_command(&c->w, c->active, (coord_cmd)k, &act,
                                      msg, len);
        if (act & WA_RESUME_NEW)
            c->resume_asked++;  /* nobody waits for its answer */
        log_info("command.replay", "run=%lld command=%lld kind=%s "
                 "result=\"%s\"", (long long)c->active,
                 (long long)rows[i].id, rows[i].kind,
                 code == M6_OK ? "applied again" : msg);
        free(msg);
    }
    free(rows);
}

/* With mu held: make the next run of the queue the worker's (c->active,
 * 0 none), its state machine set from the DB: PAUSED for a run left paused,
 * else STARTING; the phase and the delink step as recorded. */
static void take_next_locked_(coord *c)
{
    int paused = 0;
    c->active = queue_next(c->st, &paused);
    worker_set_error(&c->w, NULL);
    c->w = worker_init(paused ? W_PAUSED : W_STARTING);
    c->w.shutdown = c->shutdown;
    c->active_step = 0;
    if (!c->active) {
        c->w = worker_init(W_QUEUED);
        return;
    }
    run_row row;
    if (state_run_get(c->st, c->active, &row) == 0) {
        c->active_step = row.step;
        c->active_total = row.total_steps;
        /* as publish_ will say once the run is set up: the real phase's
         * first step if it was delinked, -1 if it trains from scratch or
         * is still pseudo */
        c->w.real = row.phase;
        c->w.delink_step = row.phase ? (long)row.delink_step : -1;
        run_row_clear(&row);
    }
    replay_commands_locked_(c);
}

static void *worker_main_(void *arg)
{
    coord *c = arg;
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
        if (c->w.state == W_COMPLETED || c->w.state == W_FAILED ||
            c->w.state == W_STOPPED)
            state_commands_mark(c->st, id, INT64_MAX, c->active_step);
        /* commands left for this run die with it; those sent before it
         * started (m6d just came up) were kept for it */
        c->active = 0;
        worker_set_error(&c->w, NULL);
        c->w = worker_init(W_QUEUED);
        c->w.shutdown = c->shutdown;
        c->offload_valid = 0;
        pthread_cond_broadcast(&c->cv); /* a waiting resume: the run ended */
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* --------------------------------------------------------------- lifecycle */

coord *coord_init(const coord_config *cfg, char *err, size_t errlen)
{
    coord *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->st = cfg->st;
    c->threads = cfg->threads;
    c->coordinator = cfg->coordinator;
    c->stats = cfg->stats;
    c->dist = cfg->dist;
    /* Test hook (tests/integration/prometheus.sh): every step takes this
     * many ms longer, so the step-duration histogram has a known answer. */
    const char *delay = getenv("M6_TEST_STEP_DELAY_MS");
    if (delay) c->step_delay_ms = atoi(delay) > 0 ? atoi(delay) : 0;
    snprintf(c->runs_dir, sizeof c->runs_dir, "%s", cfg->runs_dir);
    c->store = (ckpt_store){.st = c->st, .runs_dir = c->runs_dir};
    c->w = worker_init(W_QUEUED);
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
    ckpt_store_reconcile(&c->store);
    if (cfg->no_worker) return c;  /* the testing seam (coord.h) */
    /* Pick the first active run now, so commands that arrive before the
     * worker gets going already find it. */
    take_next_locked_(c);
    int rc = pthread_create(&c->thread, NULL, worker_main_, c);
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

void coord_request_shutdown(coord *c)
{
    pthread_mutex_lock(&c->mu);
    c->shutdown = 1;
    if (c->active)
        worker_on(&c->w, WE_SHUTDOWN, NULL);
    c->w.shutdown = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void coord_fini(coord *c)
{
    if (!c) return;
    coord_request_shutdown(c);
    if (c->thread_started) pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->cmd_mu);
    worker_set_error(&c->w, NULL);
    free(c->resume_error);
    free(c);
}

/* ---------------------------------------------------------------- commands */

m6_err coord_submit(coord *c, const char *json, size_t len, const int *cancel,
                    int64_t *id, char *name, size_t namelen)
{
    run_spec spec;
    char err[1024];  /* spec_parse's words: a key and a value, no paths */
    if (spec_parse(&spec, json, len, err, sizeof err) < 0) {
        return m6_err_make(M6_EINVALID, "invalid spec: %s", err);
    }
    /* A run across nodes could never start here: no node would join it */
    if (spec.nodes.world_size > 1 && !c->coordinator) {
        log_warn("run.submit_refused", "name=%s err=\"nodes.world_size %d on "
                 "an m6d that is not a coordinator\"", spec.name,
                 spec.nodes.world_size);
        return m6_err_make(M6_EINVALID, "invalid spec: nodes.world_size %d "
                           "needs a coordinator, and this m6d is not one (start "
                           "it with --role coordinator --listen HOST:PORT, or "
                           "submit to the coordinator)", spec.nodes.world_size);
    }
    /* Bad data or an unsupported backend fails at submit, not at start:
     * every shard's header, size and token ids. This runs on libuv's thread
     * pool (server.c), never on the loop, so a corpus that takes seconds to
     * read holds up only this client, which gets a definite yes or no. The
     * trainer opens the data again when the run starts (on the worker);
     * data.c remembers each shard it has read by file identity and version,
     * so only a shard changed since is read again, and a bad one then fails
     * the run with the same message. */
    m6_err ce = M6_ERR_NONE;
    int crc = trainer_check_spec(&spec, &ce);
    if (crc == TRAINER_ENOFILE) {  /* m6d's limit, not the spec's fault */
        log_warn("run.submit_refused", "name=%s err=\"%s\"", spec.name,
                 ce.msg);
        m6_err_prefix(&ce, "not queued");
        ce.code = M6_ESUBMITFD;  /* the handler says what to do */
        return ce;
    }
    if (crc != 0) {
        m6_err_prefix(&ce, "invalid spec");
        ce.code = M6_EINVALID;
        return ce;
    }
    if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
        log_info("run.submit_dropped", "name=%s reason=\"the client disconnected "
                 "or m6d is stopping before the spec was checked\"", spec.name);
        return m6_err_make(M6_ECANCELLED, "submit cancelled: nothing queued");
    }
    /* --threads is folded into the stored spec, so a restart with other
     * flags still loads this run's checkpoints (the spec hash is stable). */
    if (c->threads > 0 && spec.device.threads == 0)
        spec.device.threads = c->threads;
    int64_t rid = queue_add(c->st, &spec, json, name, namelen);
    if (rid < 0) {
        return m6_err_make(M6_EINTERNAL,
                           "database error while queueing the run");
    }
    /* the run's row is the submit's effect; its log entry is written with
     * a sync, which takes the row to the disk with it before the reply */
    int synced = state_command_add(c->st, rid, "submit", 1, 0) > 0;
    if (!synced)
        log_warn("command.log", "run=%lld kind=submit: queued, but the "
                 "command log could not record it", (long long)rid);
    *id = rid;
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!synced)  /* queued (committed), maybe not on the disk yet */
        return m6_err_make(M6_OK, "run %lld queued (not yet synced to disk: "
                           "a power loss now could lose it)", (long long)rid);
    return m6_err_make(M6_OK, "run %lld queued", (long long)rid);
}

/* With c->mu held: wait (up to RESUME_WAIT_S) for the worker to try the
 * resume of this ticket -- reopen data a pause was for, do the writes owed
 * -- and say how it went. A resume that cannot go through is refused with
 * the reason; the run stays paused. */
enum { RESUME_WAIT_S = 10 }; /* under m6ctl's 15 s read timeout */
static m6_err wait_resume_(coord *c, int64_t id, long ticket)
{
    pthread_cond_broadcast(&c->cv);
    struct timespec until; /* c->cv waits on CLOCK_MONOTONIC (coord_init) */
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += RESUME_WAIT_S;
    int rc = 0;
    while (c->resume_answered < ticket && c->active == id && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &until);
    if (c->resume_answered >= ticket && c->resume_error)
        /* M6_EDATA, M6_ENOFILE: the handler advises */
        return m6_err_make(c->resume_code, "run %lld could not resume, it "
                           "stays paused: %s", (long long)id, c->resume_error);
    if (c->resume_answered >= ticket)
        return m6_err_make(M6_OK, "run %lld resumed at step %ld",
                           (long long)id, c->resume_step);
    if (c->active != id)
        return m6_err_make(M6_EBADSTATE, "run %lld did not resume: it ended "
                           "first (a stop?); `m6ctl status %lld` says how",
                           (long long)id, (long long)id);
    return m6_err_make(M6_OK, "run %lld resumes (its data and the writes owed "
                       "were not done after %d s; `m6ctl status %lld` shows "
                       "how it went)", (long long)id, RESUME_WAIT_S,
                       (long long)id);
}

/* The state machine's state of a run the worker does not own, from its
 * DB state. -1 for a run left running or paused that another run holds
 * the worker from (several were left paused). */
static int db_worker_state_(run_state s)
{
    switch (s) {
    case RUN_QUEUED: return W_QUEUED;
    case RUN_COMPLETED: return W_COMPLETED;
    case RUN_FAILED: return W_FAILED;
    case RUN_STOPPED: return W_STOPPED;
    default: return -1;
    }
}

/* worker_command on w, its reply whole (the room it asks for). */
static m6_err worker_command_(worker *w, int64_t id, coord_cmd cmd,
                              unsigned *act)
{
    size_t n = strlen(w->error) + 512;
    char *msg = malloc(n);
    if (!msg) return m6_err_make(M6_EINTERNAL, "out of memory");
    m6_code code = worker_command(w, id, cmd, act, msg, n);
    m6_err e = m6_err_make(code, "%s", msg);
    free(msg);
    return e;
}

/* Whether command cmd, applied to before giving after, is one to record:
 * it changed the run's state or asked for a delink. An answer that changes
 * nothing ("already paused", a second resume joining the first) has
 * nothing to keep. */
static int changes_(const worker *before, const worker *after)
{
    return before->state != after->state ||
           (!before->delink_pending && after->delink_pending);
}

/* The reply when the command log could not take command `name`: it is not
 * acknowledged, nothing changed. A resume says so in the words of a resume
 * that could not be done. */
static m6_err not_recorded_(coord *c, int64_t id, coord_cmd cmd,
                            const char *name)
{
    char e[256];  /* SQLite's words: no paths */
    state_last_error(c->st, e, sizeof e);
    if (cmd == CMD_RESUME) {
        m6_err r = m6_err_make(M6_EBADSTATE, "run %lld could not resume, it "
                               "stays paused: the state DB could not record "
                               "the resume (%s)", (long long)id, e);
        /* as a resume tried and failed: status says why it stays paused */
        pthread_mutex_lock(&c->mu);
        if (id == c->active && worker_is_paused(&c->w)) {
            worker_set_error(&c->w, strchr(r.msg, ':') + 2);
            c->w.error_write = 1;
            c->w.error_code = M6_EBADSTATE;
            log_error("run.paused", "run=%lld step=%ld reason=\"%s\"",
                      (long long)id, c->active_step, c->w.error);
        }
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    return m6_err_make(M6_EINTERNAL, "run %lld: %s not done: the state DB "
                       "could not record it (%s); send it again once it can",
                       (long long)id, name, e);
}

m6_err coord_command(coord *c, int64_t id, coord_cmd cmd)
{
    static const char *const names[] = {"pause", "resume", "delink", "stop"};
    m6_err ret;
    unsigned act = 0;
    /* Acknowledged means recorded: a command that changes the active run
     * is written to the command log (synced) before it is applied and
     * answered; the worker marks it applied at the boundary that does it,
     * and a restart applies the pending ones again. cmd_mu keeps the log
     * in the order of application; the write is made without mu, so
     * status and the worker never wait for it. */
    pthread_mutex_lock(&c->cmd_mu);
    int64_t cid = 0;
    pthread_mutex_lock(&c->mu);
    int active = id == c->active;
    if (active) {
        worker trial = c->w;  /* worker_command leaves error alone */
        unsigned a = 0;
        size_t n = strlen(trial.error) + 512;
        char *msg = malloc(n);
        int record = msg && worker_command(&trial, id, cmd, &a, msg, n) ==
                                M6_OK && changes_(&c->w, &trial);
        free(msg);
        pthread_mutex_unlock(&c->mu);
        if (record &&
            (cid = state_command_add(c->st, id, names[cmd], 0, 0)) < 0) {
            pthread_mutex_unlock(&c->cmd_mu);
            return not_recorded_(c, id, cmd, names[cmd]);
        }
        pthread_mutex_lock(&c->mu);
        active = id == c->active;
    }
    if (active) {
        worker before = c->w;
        ret = worker_command_(&c->w, id, cmd, &act);
        if (cid > 0 && ret.code == M6_OK && changes_(&before, &c->w))
            c->cmd_last = cid;
        else if (cid > 0)  /* the run moved on meanwhile: not this answer */
            state_command_drop(c->st, cid);
        pthread_mutex_unlock(&c->cmd_mu);
        if (act & WA_RESUME_CANCEL) /* the resume not yet taken */
            answer_locked_(c, c->resume_asked, "a pause was sent after it",
                           M6_EBADSTATE);
        if (act & (WA_RESUME_NEW | WA_RESUME_JOIN)) {
            /* ask the worker and wait (one more resume sent before it
             * takes this one is served by the same try); or, being
             * tried, wait with it */
            m6_err_free(&ret);
            ret = wait_resume_(c, id, act & WA_RESUME_NEW ? ++c->resume_asked
                                                          : c->resume_serving);
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return ret;
    }
    if (cid > 0)  /* the run ended meanwhile */
        state_command_drop(c->st, cid);
    pthread_mutex_unlock(&c->cmd_mu);
    /* Not the active run: only a queued run can be stopped (dequeued). Done
     * under mu so the worker can't pick it meanwhile. */
    run_row row;
    int rc = state_run_get(c->st, id, &row);
    if (rc == 1) {
        ret = m6_err_make(M6_ENOTFOUND, "no run with id %lld", (long long)id);
    } else if (rc < 0) {
        ret = m6_err_make(M6_EINTERNAL, "database error");
    } else {
        int s = db_worker_state_(row.state);
        if (s >= 0) {
            worker w = worker_init((worker_state)s);
            ret = worker_command_(&w, id, cmd, &act);
            if ((act & WA_DEQUEUE) && queue_dequeue(c->st, id) < 0) {
                /* not acknowledged: the run stays queued; say why (m6.db
                 * locked by another process past the wait, a full disk) */
                char e[256];
                state_last_error(c->st, e, sizeof e);
                m6_err_set(&ret, M6_EINTERNAL, "run %lld: not stopped, still "
                           "queued: writing m6.db failed (%s); try again",
                           (long long)id, e);
            } else if ((act & WA_DEQUEUE) &&
                       state_command_add(c->st, id, names[cmd], 1, 0) < 0) {
                /* the run is stopped (recorded); only the log's sync
                 * failed: the stop may not survive a power loss */
                log_warn("command.log", "run=%lld kind=stop: dequeued, but "
                         "the command log could not record it",
                         (long long)id);
            }
        } else {
            ret = m6_err_make(M6_EBADSTATE, "cannot %s run %lld: it is %s",
                              names[cmd], (long long)id,
                              run_state_name(row.state));
        }
        run_row_clear(&row);
    }
    pthread_mutex_unlock(&c->mu);
    return ret;
}

double coord_eta(coord *c, int64_t id)
{
    double eta = -1;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->step_s_ema > 0 && worker_is_training(&c->w))
        eta = (double)(c->active_total - c->active_step) * c->step_s_ema;
    pthread_mutex_unlock(&c->mu);
    return eta;
}

int coord_offload_get(coord *c, int64_t id, coord_offload *out)
{
    int rc = 1;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->offload_valid) {
        *out = c->offload;
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_run_error(coord *c, int64_t id, char **msg, m6_code *code)
{
    int rc = 0;
    *msg = NULL;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->w.error[0]) {
        *msg = strdup(c->w.error);
        *code = c->w.error_code;
        rc = *msg ? 1 + worker_is_paused(&c->w) : -1;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void coord_pending(coord *c, int64_t id, run_state recorded, char *buf,
                   size_t len)
{
    pthread_mutex_lock(&c->mu);
    const char *p = id == c->active ? worker_pending(&c->w) : "";
    if (id == c->active && !p[0]) {
        /* applied in memory, m6.db not written yet */
        if (recorded == RUN_RUNNING && worker_is_paused(&c->w))
            p = "pausing";
        else if (recorded == RUN_PAUSED && worker_is_training(&c->w))
            p = "resuming";
    }
    snprintf(buf, len, "%s", p);
    pthread_mutex_unlock(&c->mu);
}

int coord_delink_pending(coord *c, int64_t id)
{
    pthread_mutex_lock(&c->mu);
    int d = id == c->active && worker_delink_pending(&c->w);
    pthread_mutex_unlock(&c->mu);
    return d;
}

void coord_describe(coord *c, char *buf, size_t len)
{
    pthread_mutex_lock(&c->mu);
    if (c->active)
        snprintf(buf, len, "run %lld step %ld/%ld %s%s", (long long)c->active,
                 c->active_step, c->active_total, phase_name(c->w.real),
                 worker_is_paused(&c->w) ? " (paused)" : "");
    else
        snprintf(buf, len, "idle");
    pthread_mutex_unlock(&c->mu);
}
