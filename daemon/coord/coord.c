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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/store.h"
#include "common/log.h"
#include "common/paths.h"
#include "coord/queue.h"
#include "coord/worker.h"
#include "train/data.h"
#include "train/spec.h"
#include "train/trainer.h"

struct coord {
    state *st;
    char runs_dir[3072];
    int threads;
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
    coord_offload off;     /* latest placement, published to c->offload */
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

/* The code of a data error (rc TRAINER_EDATA or TRAINER_ENOFILE): what
 * the handler's advice is keyed by (`m6ctl resume` reopens the data). */
static m6_code data_code_(int rc)
{
    return rc == TRAINER_ENOFILE ? M6_ENOFILE : M6_EDATA;
}

/* After a pause for unreadable data (r->data_error): open the shards
 * again, as at the start, and redo the validation pass the pending row is
 * owed; its row is then written again with the val_loss. -1 with msg if
 * the data is still bad (the run stays paused). */
static int retry_data_(run_ctx *r, m6_err *err)
{
    if (!r->data_error) return 0;
    float v;
    int rc = trainer_reopen_data(r->t, err);
    if (rc == 0 && r->eval_owed)
        rc = trainer_eval_checked(r->t, &v, err);
    if (rc != 0) {
        r->data_code = data_code_(rc);
        return -1;
    }
    if (r->eval_owed) {
        r->pending.val_loss = v;
        r->metric_pending = 1;
        r->eval_owed = 0;
    }
    r->data_error = 0;
    log_info("run.data_reopened", "run=%lld step=%ld", (long long)r->id,
             trainer_step_count(r->t));
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

static void delink_(run_ctx *r, const char *reason)
{
    char err[512];
    long step = trainer_step_count(r->t);
    if (trainer_delink(r->t, err, sizeof err) < 0) {
        log_error("run.delink_failed", "run=%lld step=%ld err=\"%s\"",
                  (long long)r->id, step, err);
        return;
    }
    state_phase_set(r->c->st, r->id, 1, step);
    state_run_set_delink(r->c->st, r->id, step);
    state_run_set_progress(r->c->st, r->id, step, 1);
    state_event(r->c->st, r->id, "delink", "step=%ld reason=%s slots=%d", step,
                reason, trainer_n_slots(r->t));
    log_info("run.delink", "run=%lld step=%ld reason=%s", (long long)r->id,
             step, reason);
    offload_sample_(r);  /* new share map, new plan */
    publish_(r);
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

/* Stop: final only with everything written. Otherwise the run pauses
 * (training ends now) and a later stop retries. 1 stopped, 0 not. */
static int stop_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    int ok = flush_(r, &err) == 0 && checkpoint_(r, "stop", &err) == 0;
    if (ok && state_run_set_state(c->st, r->id, RUN_STOPPED, NULL) < 0) {
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
    state_event(c->st, r->id, "stop", "step=%ld", step);
    log_info("run.stop", "run=%lld step=%ld", (long long)r->id, step);
    return 1;
}

/* Pause (the state is PAUSED already): the writes owed, a checkpoint, the
 * state; a failure keeps it paused with the reason. */
static void pause_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    if (flush_(r, &err) < 0 || checkpoint_(r, "pause", &err) < 0) {
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    } else if (state_run_set_state(c->st, r->id, RUN_PAUSED, NULL) < 0) {
        db_error_(r, "recording the pause", &err);
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    } else {
        state_event(c->st, r->id, "pause", "step=%ld", step);
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

/* The writes a boundary owes before the next step: data to reopen after a
 * data error (and the validation pass it owes), then what the last
 * boundary could not write. 0, or -1 with err (they stay owed). */
static int owed_(run_ctx *r, m6_err *err)
{
    if (retry_data_(r, err) < 0) return -1;
    return flush_(r, err);
}

/* Try the resume taken at this boundary: the writes owed, then the state.
 * Only then is it a resume (event); one that fails leaves the run paused
 * with the reason. The resumes waiting get the answer. */
static void resume_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = trainer_step_count(r->t);
    int rc = owed_(r, &err);
    worker_event failed = r->data_error ? WE_DATA_ERROR : WE_WRITE_FAILED;
    if (rc == 0 && state_run_set_state(c->st, r->id, RUN_RUNNING, NULL) < 0) {
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
    state_event(c->st, r->id, "resume", "step=%ld", step);
    log_info("run.resume", "run=%lld step=%ld", (long long)r->id, step);
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
 * spec.pseudo.steps, or at an operator delink replayed after a restart. */
static void phase_policy_(run_ctx *r)
{
    if (trainer_phase(r->t) != PHASE_PSEUDO) return;
    long step = trainer_step_count(r->t);
    if (r->replay_delink >= 0 && step >= r->replay_delink)
        delink_(r, "replay");
    else if (r->spec.pseudo.steps > 0 && step >= r->spec.pseudo.steps)
        delink_(r, "spec");
}

/* One step, recorded: its metrics row (and a checkpoint every
 * checkpoint.every steps) written before the next boundary. -1 when the
 * run failed (recorded). */
static int step_(run_ctx *r)
{
    coord *c = r->c;
    m6_err err = M6_ERR_NONE;
    step_result res;
    m6_err data_err = M6_ERR_NONE;
    int src = trainer_step(r->t, &res, &data_err);
    if (src == TRAINER_EDATA) {
        /* like a write that failed: pause, keep the model; the operator
         * fixes the shard and resumes (retry_data_) */
        r->data_error = 1;
        r->data_code = data_code_(src);
        if (!res.eval_failed) { /* nothing of the step was done */
            pause_error_(r, WE_DATA_ERROR, m6_err_msg(&data_err));
            m6_err_free(&data_err);
            return 0;
        }
        r->eval_owed = 1; /* the step stands: record it, val_loss owed */
    } else if (src < 0) {
        fail_run_(r, "trainer_step", m6_err_msg(&data_err));
        m6_err_free(&data_err);
        return -1;
    }
    on_(c, WE_STEP_DONE, NULL);
    offload_publish_(r, &res.mem, 1);
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
        .moe_aux_loss = res.moe.present ? res.moe.aux_loss : NAN,
        .moe_z_loss = res.moe.present ? res.moe.z_loss : NAN,
        .moe_dropped_fraction = res.moe.present ? res.moe.dropped_fraction
                                                : NAN,
        .moe_load_min = res.moe.present ? res.moe.load_min : NAN,
        .moe_load_max = res.moe.present ? res.moe.load_max : NAN,
        .moe_load_cv = res.moe.present ? res.moe.load_cv : NAN,
        .moe_experts_empty = res.moe.present ? res.moe.experts_empty : NAN,
    };
    r->pending = m;
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
    if (flush_(r, &err) < 0)
        pause_error_(r, WE_WRITE_FAILED, m6_err_msg(&err));
    else if (state_hold_overdue(c->st, held_why, sizeof held_why))
        /* another process has held m6.db's write lock past the limit */
        pause_error_(r, WE_WRITE_FAILED, held_why);
    else if (r->eval_owed)
        pause_error_(r, WE_DATA_ERROR, m6_err_msg(&data_err));
    else
        publish_(r);
    m6_err_free(&err);
    m6_err_free(&data_err);
    return 0;
}

/* ------------------------------------------------------------ the loop */

/* The worker's life with one run: set it up, then at every step boundary
 * the operator's commands (in the order stop, delink, pause, shutdown,
 * resume: a stop, delink or pause m6d has acknowledged holds across a
 * shutdown), then the step: completion, phase policy, step, record. */
static void run_one_(coord *c, int64_t id)
{
    run_ctx r = {.c = c, .id = id, .last_ckpt = -1, .replay_delink = -1};
    r.off.h2d_gbps = r.off.d2h_gbps = r.off.copy_hidden_fraction = NAN;
    if (setup_(c, id, &r) < 0) {
        trainer_free(r.t);
        return;
    }
    for (;;) {
        /* commands */
        pthread_mutex_lock(&c->mu);
        while (worker_waits(&c->w))
            pthread_cond_wait(&c->cv, &c->mu);
        worker_take tk = worker_boundary(&c->w);
        if (tk.resume) c->resume_serving = c->resume_asked;
        pthread_mutex_unlock(&c->mu);
        if (tk.stop) {
            if (stop_(&r)) break;
            continue;
        }
        if (tk.delink && trainer_phase(r.t) == PHASE_PSEUDO)
            delink_(&r, "operator");
        if (tk.pause) pause_(&r);
        if (tk.shutdown) {
            interrupted_(&r, tk.resume);
            break;
        }
        if (tk.resume) resume_(&r);
        publish_(&r);
        pthread_mutex_lock(&c->mu);
        int trains = worker_trains(&c->w);
        pthread_mutex_unlock(&c->mu);
        if (!trains) continue;

        /* what an earlier boundary owes (a restart's validation pass) */
        m6_err err = M6_ERR_NONE;
        if (owed_(&r, &err) < 0) {
            pause_error_(&r, r.data_error ? WE_DATA_ERROR : WE_WRITE_FAILED,
                         m6_err_msg(&err));
            m6_err_free(&err);
            continue;
        }
        if (trainer_step_count(r.t) >= r.spec.train.steps) {
            if (complete_(&r)) break;
            continue;
        }
        phase_policy_(&r);
        if (step_(&r) < 0) break;
    }
    trainer_free(r.t);
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
    snprintf(c->runs_dir, sizeof c->runs_dir, "%s", cfg->runs_dir);
    c->store = (ckpt_store){.st = c->st, .runs_dir = c->runs_dir};
    c->w = worker_init(W_QUEUED);
    pthread_mutex_init(&c->mu, NULL);
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
    *id = rid;
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
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

m6_err coord_command(coord *c, int64_t id, coord_cmd cmd)
{
    static const char *const names[] = {"pause", "resume", "delink", "stop"};
    m6_err ret;
    unsigned act = 0;
    pthread_mutex_lock(&c->mu);
    if (id == c->active) {
        ret = worker_command_(&c->w, id, cmd, &act);
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
                m6_err_set(&ret, M6_EINTERNAL, "run %lld: database error "
                           "while taking it out of the queue", (long long)id);
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
