/*
 * coord.c — run queue, phase policy and the training worker (see coord.h).
 */
#include "coord/coord.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/store.h"
#include "common/log.h"
#include "common/paths.h"
#include "coord/queue.h"
#include "train/data.h"
#include "train/spec.h"
#include "train/trainer.h"

struct coord {
    state *st;
    char runs_dir[3072];
    int threads;
    ckpt_store store;      /* the runs' checkpoints (daemon/ckpt/store.h) */

    pthread_t worker;
    int worker_started;

    /* Everything below is guarded by mu; the worker waits on cv. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shutdown;
    int64_t active;       /* run the worker owns, 0 none */
    int active_paused;
    int active_phase;
    long active_step, active_total, active_delink_step;
    double step_s_ema;    /* seconds per step, for the ETA */
    int cmd_pause, cmd_resume, cmd_delink, cmd_stop;
    char active_error[512]; /* why the active run paused itself, "" none */
    int active_error_write; /* ... a failed write (not bad data or a lost
                             * checkpoint): a stop may not be recorded */
    /* A resume is answered once the worker has tried it: the data reopened
     * and the writes owed done, or the reason it stays paused. Tickets:
     * each resume sent takes one (asked); the worker, taking the command,
     * serves every ticket up to resume_serving and, done, answers them
     * (answered). A resume sent while one is being tried joins it. */
    long resume_asked, resume_serving, resume_answered;
    int resuming;           /* the worker is trying a resume */
    char resume_error[1200]; /* the last answer: "" it resumed */
    int offload_valid;    /* offload holds a sample of the active run */
    coord_offload offload;
};

/* ---------------------------------------------------------------- recovery */

/* Whether trainer_step runs a validation pass after step (1-based). */
static int step_evaluates_(const run_spec *sp, long step)
{
    long ev = sp->train.eval_every;
    return (ev > 0 && step % ev == 0) || step == sp->train.steps;
}

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
    int ckpt_lost;          /* paused because no checkpoint loaded */
    size_t plan_peak[2];   /* unbudgeted device bytes: [pseudo], [real] */
    offload_stats prev;    /* counters at the previous sample */
    coord_offload off;     /* latest sample, also published to c->offload */
} run_ctx;

/* Save the trainer at its step. -1 with msg saying what failed (the caller
 * pauses the run, which logs it): the run keeps its last good checkpoint. */
static int checkpoint_(run_ctx *r, const char *why, char *msg, size_t msglen)
{
    long step = trainer_step_count(r->t);
    if (step == r->last_ckpt) return 0;
    if (ckpt_store_save(&r->c->store, r->id, r->t, r->spec.checkpoint.keep, why,
                        msg, msglen) < 0)
        return -1;
    r->last_ckpt = step;
    return 0;
}

/* ------------------------------------------------------------------ worker */

static void publish_(run_ctx *r, int paused)
{
    coord *c = r->c;
    pthread_mutex_lock(&c->mu);
    c->active_step = trainer_step_count(r->t);
    c->active_phase = trainer_phase(r->t) == PHASE_REAL;
    c->active_delink_step = trainer_delink_step(r->t);
    c->active_paused = paused;
    pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- offload */

/* Device bytes of each phase without a budget (the planner's peak: globals
 * and slots with their grads and AdamW moments, plus activations), for runs
 * that do not offload. Worker thread, once per run. */
static void offload_plan_peaks_(run_ctx *r)
{
    run_spec unlimited = r->spec;
    offload_plan p;
    char err[512];
    unlimited.device.memory_budget = 0;
    r->plan_peak[0] = r->plan_peak[1] = 0;
    if (offload_plan_for_spec(&unlimited, 0, &p, err, sizeof err) != 0) {
        log_warn("offload.plan", "run=%lld err=\"%s\"", (long long)r->id, err);
        return;
    }
    r->plan_peak[1] = p.peak_device_bytes;
    r->plan_peak[0] = p.pseudo ? p.pseudo->peak_device_bytes : p.peak_device_bytes;
    offload_plan_free(&p);
}

/* Sample the trainer's offloading figures on the worker thread, between
 * steps, and publish them under mu. after_step: the counters moved by
 * exactly one step since the previous sample, so the rates and the hidden
 * fraction are that step's; otherwise the previous step's rates stay (and
 * copies made outside steps, by delink or a checkpoint, are not counted). */
static void offload_sample_(run_ctx *r, int after_step)
{
    offload_stats st;
    coord_offload o = r->off;
    if (trainer_offload_stats(r->t, &st) == 0) {
        o.resident_slots = st.n_resident;
        o.offloaded_slots = st.n_offloaded;
        o.device_bytes_in_use = (int64_t)st.device.in_use;
        o.peak_device_bytes = (int64_t)st.device.peak;
        o.device_budget_bytes = (int64_t)st.budget_bytes;
        if (after_step) {
            double hs = st.h2d_s - r->prev.h2d_s, ds = st.d2h_s - r->prev.d2h_s;
            double stall = st.stall_s - r->prev.stall_s;
            uint64_t hb = st.h2d_bytes - r->prev.h2d_bytes;
            uint64_t db = st.d2h_bytes - r->prev.d2h_bytes;
            o.h2d_gbps = hb > 0 && hs > 0 ? (double)hb / hs / 1e9 : NAN;
            o.d2h_gbps = db > 0 && ds > 0 ? (double)db / ds / 1e9 : NAN;
            o.copy_hidden_fraction = NAN;
            if (hs + ds > 0) {
                double h = 1.0 - stall / (hs + ds);
                o.copy_hidden_fraction = h < 0 ? 0 : h > 1 ? 1 : h;
            }
        }
        r->prev = st;
    } else {
        size_t dev = r->plan_peak[trainer_phase(r->t) == PHASE_REAL];
        o.resident_slots = st.n_slots;
        o.offloaded_slots = 0;
        o.device_bytes_in_use = o.peak_device_bytes = (int64_t)dev;
        o.device_budget_bytes = 0;
        o.h2d_gbps = o.d2h_gbps = o.copy_hidden_fraction = NAN;
    }
    r->off = o;
    pthread_mutex_lock(&r->c->mu);
    r->c->offload = o;
    r->c->offload_valid = 1;
    pthread_mutex_unlock(&r->c->mu);
}

static void fail_run_(coord *c, int64_t id, const char *what, const char *err)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", what, err);
    log_error("run.failed", "run=%lld err=\"%s\"", (long long)id, msg);
    state_run_set_state(c->st, id, RUN_FAILED, msg);
    state_event(c->st, id, "failed", "%s", msg);
}

/* A write the run depends on failed (checkpoint, metrics row, state): stop
 * training at this boundary, in memory first, so nothing is lost and nothing
 * loops. One error line; the reason is kept for status even if the DB
 * cannot take it. `m6ctl resume` retries. */
static void pause_error_(run_ctx *r, int *paused, const char *reason)
{
    coord *c = r->c;
    long step = trainer_step_count(r->t);
    *paused = 1;
    log_error("run.paused", "run=%lld step=%ld reason=\"%s\"",
              (long long)r->id, step, reason);
    pthread_mutex_lock(&c->mu);
    snprintf(c->active_error, sizeof c->active_error, "%s", reason);
    c->active_error_write = !r->data_error && !r->ckpt_lost;
    pthread_mutex_unlock(&c->mu);
    r->ckpt_lost = 0; /* said once */
    if (state_run_set_state(c->st, r->id, RUN_PAUSED, reason) == 0)
        state_event(c->st, r->id, "paused.error", "step=%ld %s", step, reason);
    publish_(r, 1);
}

/* "what: state DB: <SQLite's message>" */
static void db_error_(run_ctx *r, const char *what, char *msg, size_t msglen)
{
    char e[256];
    state_last_error(r->c->st, e, sizeof e);
    snprintf(msg, msglen, "%s: state DB: %s", what, e);
}

/* Do the writes owed at this step boundary. -1 with msg if one fails; it
 * stays owed. */
static int flush_(run_ctx *r, char *msg, size_t msglen)
{
    if (r->metric_pending) {
        if (state_record_step(r->c->st, r->id, &r->pending) < 0) {
            char what[64];
            snprintf(what, sizeof what, "recording step %lld",
                     (long long)r->pending.step);
            db_error_(r, what, msg, msglen);
            return -1;
        }
        r->metric_pending = 0;
    }
    if (r->ckpt_owed) {
        if (checkpoint_(r, r->ckpt_owed, msg, msglen) < 0) return -1;
        r->ckpt_owed = NULL;
    }
    return 0;
}

/* Append to a data error (rc TRAINER_EDATA or TRAINER_ENOFILE) what
 * `m6ctl resume` will do about it. */
static void retry_hint_(char *msg, size_t msglen, int rc)
{
    size_t n = strlen(msg);
    snprintf(msg + n, msglen - n, "; once %s, `m6ctl resume` reopens the "
             "data", rc == TRAINER_ENOFILE ? "m6d can open them"
                                           : "the shard is fixed");
}

/* After a pause for unreadable data (r->data_error): open the shards
 * again, as at the start, and redo the validation pass the pending row is
 * owed; its row is then written again with the val_loss. -1 with msg if
 * the data is still bad (the run stays paused). */
static int retry_data_(run_ctx *r, char *msg, size_t msglen)
{
    if (!r->data_error) return 0;
    float v;
    int rc = trainer_reopen_data(r->t, msg, msglen);
    if (rc == 0 && r->eval_owed)
        rc = trainer_eval_checked(r->t, &v, msg, msglen);
    if (rc != 0) {
        retry_hint_(msg, msglen, rc);
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
 * NULL, the run trains on; else why it stays paused. */
static void answer_locked_(coord *c, long ticket, const char *err)
{
    if (ticket > c->resume_answered)
        c->resume_answered = ticket;
    snprintf(c->resume_error, sizeof c->resume_error, "%s", err ? err : "");
    pthread_cond_broadcast(&c->cv);
}

/* The worker's answer to the resume it took (coord_command waits on it). */
static void answer_resume_(coord *c, const char *err)
{
    pthread_mutex_lock(&c->mu);
    answer_locked_(c, c->resume_serving, err);
    c->resuming = 0;
    pthread_mutex_unlock(&c->mu);
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
    state_run_set_progress(r->c->st, r->id, step, 1);
    state_event(r->c->st, r->id, "delink", "step=%ld reason=%s slots=%d", step,
                reason, trainer_n_slots(r->t));
    log_info("run.delink", "run=%lld step=%ld reason=%s", (long long)r->id,
             step, reason);
    offload_sample_(r, 0);  /* new share map, new plan */
}

static void run_one_(coord *c, int64_t id, int start_paused)
{
    char err[1024];
    run_row row;
    run_ctx r = {.c = c, .id = id, .last_ckpt = -1};
    r.off.h2d_gbps = r.off.d2h_gbps = r.off.copy_hidden_fraction = NAN;
    if (state_run_get(c->st, id, &row) != 0) {
        log_error("run.lost", "run=%lld", (long long)id);
        return;
    }
    int rc = spec_parse(&r.spec, row.spec, strlen(row.spec), err, sizeof err);
    int was_queued = row.state == RUN_QUEUED;
    char kept_error[sizeof row.error];  /* a paused run keeps its reason */
    snprintf(kept_error, sizeof kept_error, "%s", start_paused ? row.error : "");
    run_row_clear(&row);
    if (rc < 0) {
        fail_run_(c, id, "spec", err);
        return;
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
    r.t = was_queued ? trainer_create(&r.spec, err, sizeof err)
                     : trainer_create_resumable(&r.spec, &data_rc, err,
                                                sizeof err);
    if (!r.t) {
        fail_run_(c, id, "trainer_create", err);
        return;
    }
    char lost[1200];
    if (ckpt_store_restore(&c->store, id, &r.spec, &r.t,
                           was_queued ? NULL : &data_rc, &r.last_ckpt, err,
                           sizeof err, lost, sizeof lost) < 0) {
        fail_run_(c, id, "trainer_create", err);
        return;
    }
    /* the shards it opened must hold what the checkpoint was trained on */
    if (!was_queued && !data_rc && r.last_ckpt >= 0)
        data_rc = trainer_check_data(r.t, err, sizeof err);
    char open_err[sizeof err] = "";
    if (data_rc) {
        r.data_error = 1;
        snprintf(open_err, sizeof open_err, "%.900s", err);
        retry_hint_(open_err, sizeof open_err, data_rc);
    }
    long step = trainer_step_count(r.t);
    int phase = trainer_phase(r.t) == PHASE_REAL;

    /* Keep the tables consistent with the state we resume from: metrics past
     * the checkpoint are redone. An operator delink recorded at a step we
     * have not reached yet is kept and replayed at that step. */
    int dropped = state_metrics_truncate(c->st, id, step);
    long replay_delink = -1;
    int64_t from;
    if (phase == 0 && state_phase_get(c->st, id, 1, &from) == 0) {
        if (from >= step)
            replay_delink = (long)from;
        else
            state_phase_delete(c->st, id, 1);
    }
    if (state_phase_get(c->st, id, r.spec.pseudo.steps > 0 ? 0 : 1, &from) == 1)
        state_phase_set(c->st, id, r.spec.pseudo.steps > 0 ? 0 : 1, 0);
    state_run_set_progress(c->st, id, step, phase);
    /* A step whose training went through but whose validation pass could
     * not read the data (its row, the newest left, has no val_loss) owes
     * that pass: redone before the next step, as in the life that paused
     * on it. */
    if (!was_queued && step > 0 && step_evaluates_(&r.spec, step)) {
        metric_row last;
        double last_val;
        if (state_metric_last(c->st, id, &last, &last_val) == 0 &&
            last.step == step && isnan(last.val_loss)) {
            r.pending = last;
            r.eval_owed = r.data_error = 1;
        }
    }

    int paused = start_paused;
    pthread_mutex_lock(&c->mu);
    snprintf(c->active_error, sizeof c->active_error, "%s", kept_error);
    pthread_mutex_unlock(&c->mu);
    if (state_run_set_state(c->st, id, paused ? RUN_PAUSED : RUN_RUNNING,
                            kept_error[0] ? kept_error : NULL) < 0) {
        db_error_(&r, "recording the start", err, sizeof err);
        pause_error_(&r, &paused, err);
    } else if (dropped < 0) {
        /* Rows past the checkpoint stay until training rewrites them
         * (INSERT OR REPLACE); pause so the operator sees why. */
        db_error_(&r, "dropping metrics past the checkpoint", err, sizeof err);
        pause_error_(&r, &paused, err);
    } else if (lost[0]) {
        /* every checkpoint failed to load: starting over from step 0 is
         * the operator's call, not a silent one */
        r.ckpt_lost = 1;
        pause_error_(&r, &paused, lost);
    } else if (data_rc) {
        pause_error_(&r, &paused, open_err);
    }
    if (was_queued) {
        state_event(c->st, id, "start", "phase=%s", phase_name(phase));
        log_info("run.start", "run=%lld name=%s total_steps=%ld", (long long)id,
                 r.spec.name, r.spec.train.steps);
    } else {
        state_event(c->st, id, "resume.restart",
                    "step=%ld metrics_dropped=%d paused=%d", step, dropped,
                    paused);
        log_info("run.recover", "run=%lld step=%ld metrics_dropped=%d paused=%d",
                 (long long)id, step, dropped, paused);
    }
    pthread_mutex_lock(&c->mu);
    c->active_total = r.spec.train.steps;
    pthread_mutex_unlock(&c->mu);
    offload_plan_peaks_(&r);
    offload_sample_(&r, 0);
    publish_(&r, paused);

    for (;;) {
        int stop, go_pause, go_resume, want_delink, shutdown;
        pthread_mutex_lock(&c->mu);
        for (;;) {
            stop = c->cmd_stop;
            go_pause = c->cmd_pause;
            go_resume = c->cmd_resume;
            want_delink = c->cmd_delink;
            shutdown = c->shutdown;
            c->cmd_stop = c->cmd_pause = c->cmd_resume = c->cmd_delink = 0;
            /* paused from now on for coord_command, so that a resume sent
             * while the pause checkpoints waits for it, not "not paused" */
            if (go_pause && !paused)
                c->active_paused = 1;
            if (go_resume) {
                c->resuming = 1;
                c->resume_serving = c->resume_asked;
            }
            int any = stop || go_pause || go_resume || want_delink || shutdown;
            if (!paused || any) break;
            pthread_cond_wait(&c->cv, &c->mu);
        }
        pthread_mutex_unlock(&c->mu);

        /* The operator's commands first, in this order, then a shutdown:
         * a stop, delink or pause m6d has acknowledged holds across it. */
        step = trainer_step_count(r.t);
        if (stop) {
            /* Stopped is final: only with everything written. Otherwise the
             * run pauses (training ends now) and a later stop retries. */
            int ok = flush_(&r, err, sizeof err) == 0 &&
                     checkpoint_(&r, "stop", err, sizeof err) == 0;
            if (ok && state_run_set_state(c->st, id, RUN_STOPPED, NULL) < 0) {
                db_error_(&r, "recording the stop", err, sizeof err);
                ok = 0;
            }
            if (!ok) {
                char why[1200];
                snprintf(why, sizeof why, "stop not done (%s); stop again "
                         "once there is space", err);
                pause_error_(&r, &paused, why);
                if (go_resume) answer_resume_(c, why);
                continue;
            }
            state_event(c->st, id, "stop", "step=%ld", step);
            log_info("run.stop", "run=%lld step=%ld", (long long)id, step);
            break;
        }
        if (want_delink && trainer_phase(r.t) == PHASE_PSEUDO)
            delink_(&r, "operator");
        if (go_pause && !paused) {
            paused = 1;
            if (flush_(&r, err, sizeof err) < 0 ||
                checkpoint_(&r, "pause", err, sizeof err) < 0) {
                pause_error_(&r, &paused, err);
            } else if (state_run_set_state(c->st, id, RUN_PAUSED, NULL) < 0) {
                db_error_(&r, "recording the pause", err, sizeof err);
                pause_error_(&r, &paused, err);
            } else {
                state_event(c->st, id, "pause", "step=%ld", step);
                log_info("run.pause", "run=%lld step=%ld", (long long)id, step);
            }
        }
        if (shutdown) {
            /* On failure the next start resumes from the last good one. */
            if (checkpoint_(&r, "shutdown", err, sizeof err) < 0)
                log_warn("run.interrupted", "run=%lld step=%ld err=\"%s\"",
                         (long long)id, step, err);
            state_event(c->st, id, "interrupted", "step=%ld %s at next start",
                        step, paused ? "paused" : "resumes");
            log_info("run.interrupted", "run=%lld step=%ld paused=%d",
                     (long long)id, step, paused);
            if (go_resume) /* running, it goes on at the next start */
                answer_resume_(c, paused ? "m6d is stopping; resume the run "
                               "once it is back" : NULL);
            break;
        }
        /* A resume taken is owed an answer (coord_command waits); one of
         * a run already resumed (two sent at once) is answered as it goes
         * on. */
        int resumed = go_resume && paused;
        if (resumed) {
            paused = 0;
            pthread_mutex_lock(&c->mu);
            c->active_error[0] = 0;
            pthread_mutex_unlock(&c->mu);
        }
        publish_(&r, paused);
        if (paused) continue;
        /* After a resume: the data that could not be read, then what the
         * last boundary could not write. Only then is it a resume (state,
         * event); one that fails leaves the run paused with the reason. */
        int owed = retry_data_(&r, err, sizeof err);
        if (owed == 0)
            owed = flush_(&r, err, sizeof err);
        if (owed == 0 && resumed &&
            state_run_set_state(c->st, id, RUN_RUNNING, NULL) < 0) {
            db_error_(&r, "recording the resume", err, sizeof err);
            owed = -1;
        }
        if (owed < 0) {
            pause_error_(&r, &paused, err);
            if (go_resume) answer_resume_(c, err);
            continue;
        }
        if (resumed) {
            state_event(c->st, id, "resume", "step=%ld", step);
            log_info("run.resume", "run=%lld step=%ld", (long long)id, step);
        }
        if (go_resume) answer_resume_(c, NULL);

        if (step >= r.spec.train.steps) {
            if (checkpoint_(&r, "end", err, sizeof err) < 0) {
                pause_error_(&r, &paused, err);
                continue;
            }
            if (state_run_set_state(c->st, id, RUN_COMPLETED, NULL) < 0) {
                db_error_(&r, "recording the completion", err, sizeof err);
                pause_error_(&r, &paused, err);
                continue;
            }
            state_event(c->st, id, "completed", "step=%ld", step);
            log_info("run.completed", "run=%lld step=%ld", (long long)id, step);
            break;
        }
        /* Phase policy: the spec's step, or an operator delink replayed. */
        if (trainer_phase(r.t) == PHASE_PSEUDO) {
            if (replay_delink >= 0 && step >= replay_delink)
                delink_(&r, "replay");
            else if (r.spec.pseudo.steps > 0 && step >= r.spec.pseudo.steps)
                delink_(&r, "spec");
        }

        step_result res;
        char data_err[sizeof err];
        int src = trainer_step(r.t, &res, data_err, sizeof data_err);
        if (src == TRAINER_EDATA) {
            /* like a write that failed: pause, keep the model; the
             * operator fixes the shard and resumes (retry_data_) */
            retry_hint_(data_err, sizeof data_err, src);
            r.data_error = 1;
            if (!res.eval_failed) {  /* nothing of the step was done */
                pause_error_(&r, &paused, data_err);
                continue;
            }
            r.eval_owed = 1;  /* the step stands: record it, val_loss owed */
        } else if (src < 0) {
            fail_run_(c, id, "trainer_step", data_err);
            break;
        }
        metric_row m = {
            .step = res.step, .phase = res.phase == PHASE_REAL,
            .train_loss = res.train_loss, .val_loss = res.val_loss,
            .lr = res.lr, .tokens_per_s = res.tokens_per_s,
            .grad_norm = res.grad_norm,
        };
        offload_sample_(&r, 1);
        m.resident_slots = r.off.resident_slots;
        m.offloaded_slots = r.off.offloaded_slots;
        m.peak_device_bytes = r.off.peak_device_bytes;
        m.h2d_gbps = r.off.h2d_gbps;
        m.d2h_gbps = r.off.d2h_gbps;
        m.copy_hidden_fraction = r.off.copy_hidden_fraction;
        r.pending = m;
        r.metric_pending = 1;
        if (r.spec.checkpoint.every > 0 && res.step % r.spec.checkpoint.every == 0)
            r.ckpt_owed = "every";
        log_debug("run.step", "run=%lld step=%ld loss=%.6f ms=%.1f",
                  (long long)id, res.step, res.train_loss, res.step_ms);
        pthread_mutex_lock(&c->mu);
        double s = res.step_ms / 1e3;
        c->step_s_ema = c->step_s_ema > 0 ? 0.9 * c->step_s_ema + 0.1 * s : s;
        pthread_mutex_unlock(&c->mu);
        if (flush_(&r, err, sizeof err) < 0)
            pause_error_(&r, &paused, err);
        else if (r.eval_owed)
            pause_error_(&r, &paused, data_err);
        else
            publish_(&r, 0);
    }
    trainer_free(r.t);
}

static void *worker_main_(void *arg)
{
    coord *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->shutdown) {
        int paused = 0;
        int64_t id = c->active;
        if (!id) {
            id = queue_next(c->st, &paused);
            c->active = id;
            c->active_paused = paused;
        } else {
            paused = c->active_paused;
        }
        if (!id) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        c->step_s_ema = 0;
        pthread_mutex_unlock(&c->mu);
        run_one_(c, id, paused);
        pthread_mutex_lock(&c->mu);
        /* commands left for this run die with it; those sent before it
         * started (m6d just came up) were kept for it */
        c->cmd_stop = c->cmd_pause = c->cmd_resume = c->cmd_delink = 0;
        c->resuming = 0;
        c->active = 0;
        c->active_paused = 0;
        c->active_error[0] = 0;
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
    /* Pick the first active run now, so commands that arrive before the
     * worker gets going already find it. */
    int paused = 0;
    c->active = queue_next(c->st, &paused);
    c->active_paused = paused;
    c->active_step = 0;
    if (c->active) {
        run_row row;
        if (state_run_get(c->st, c->active, &row) == 0) {
            c->active_step = row.step;
            c->active_phase = row.phase;
            c->active_total = row.total_steps;
            run_row_clear(&row);
        }
        /* as publish_ will say once the run is set up: the real phase's
         * first step if it was delinked, -1 if it trains from scratch (no
         * pseudo phase row) or is still pseudo */
        int64_t from;
        c->active_delink_step = -1;
        if (c->active_phase == 1 &&
            state_phase_get(c->st, c->active, 0, &from) == 0 &&
            state_phase_get(c->st, c->active, 1, &from) == 0)
            c->active_delink_step = (long)from;
    }
    int rc = pthread_create(&c->worker, NULL, worker_main_, c);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_create: %s", strerror(rc));
        goto fail;
    }
    c->worker_started = 1;
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
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void coord_fini(coord *c)
{
    if (!c) return;
    coord_request_shutdown(c);
    if (c->worker_started) pthread_join(c->worker, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---------------------------------------------------------------- commands */

coord_status coord_submit(coord *c, const char *json, size_t len,
                          const int *cancel, int64_t *id, char *name,
                          size_t namelen, char *msg, size_t msglen)
{
    run_spec spec;
    char err[1024];
    if (spec_parse(&spec, json, len, err, sizeof err) < 0) {
        snprintf(msg, msglen, "invalid spec: %s", err);
        return COORD_INVALID;
    }
    /* Bad data or an unsupported backend fails at submit, not at start:
     * every shard's header, size and token ids. This runs on libuv's thread
     * pool (server.c), never on the loop, so a corpus that takes seconds to
     * read holds up only this client, which gets a definite yes or no. The
     * trainer opens the data again when the run starts (on the worker);
     * data.c remembers each shard it has read by file identity and version,
     * so only a shard changed since is read again, and a bad one then fails
     * the run with the same message. */
    int crc = trainer_check_spec(&spec, err, sizeof err);
    if (crc == TRAINER_ENOFILE) {  /* m6d's limit, not the spec's fault */
        log_warn("run.submit_refused", "name=%s err=\"%s\"", spec.name, err);
        snprintf(msg, msglen, "not queued: %s", err);
        return COORD_INTERNAL;
    }
    if (crc != 0) {
        snprintf(msg, msglen, "invalid spec: %s", err);
        return COORD_INVALID;
    }
    if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
        log_info("run.submit_dropped", "name=%s reason=\"the client disconnected "
                 "or m6d is stopping before the spec was checked\"", spec.name);
        snprintf(msg, msglen, "submit cancelled: nothing queued");
        return COORD_CANCELLED;
    }
    /* --threads is folded into the stored spec, so a restart with other
     * flags still loads this run's checkpoints (the spec hash is stable). */
    if (c->threads > 0 && spec.device.threads == 0)
        spec.device.threads = c->threads;
    int64_t rid = queue_add(c->st, &spec, json, name, namelen);
    if (rid < 0) {
        snprintf(msg, msglen, "database error while queueing the run");
        return COORD_INTERNAL;
    }
    *id = rid;
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    snprintf(msg, msglen, "run %lld queued", (long long)rid);
    return COORD_OK;
}

static const char *const cmd_names[] = {"pause", "resume", "delink", "stop"};

/* With c->mu held: wait (up to RESUME_WAIT_S) for the worker to try the
 * resume of this ticket -- reopen data a pause was for, do the writes owed
 * -- and say how it went. A resume that cannot go through is refused with
 * the reason; the run stays paused. */
enum { RESUME_WAIT_S = 10 }; /* under m6ctl's 15 s read timeout */
static coord_status wait_resume_(coord *c, int64_t id, long ticket, char *msg,
                                 size_t msglen)
{
    pthread_cond_broadcast(&c->cv);
    struct timespec until; /* c->cv waits on CLOCK_MONOTONIC (coord_init) */
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += RESUME_WAIT_S;
    int rc = 0;
    while (c->resume_answered < ticket && c->active == id && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &until);
    if (c->resume_answered >= ticket && c->resume_error[0]) {
        snprintf(msg, msglen, "run %lld could not resume, it stays paused: %s",
                 (long long)id, c->resume_error);
        return COORD_BAD_STATE;
    }
    if (c->resume_answered >= ticket)
        snprintf(msg, msglen, "run %lld resumed at step %ld", (long long)id,
                 c->active_step);
    else if (c->active != id) {
        snprintf(msg, msglen, "run %lld did not resume: it ended first (a "
                 "stop?); `m6ctl status %lld` says how", (long long)id,
                 (long long)id);
        return COORD_BAD_STATE;
    } else
        snprintf(msg, msglen, "run %lld resumes (its data and the writes owed "
                 "were not done after %d s; `m6ctl status %lld` shows how it "
                 "went)", (long long)id, RESUME_WAIT_S, (long long)id);
    return COORD_OK;
}

coord_status coord_command(coord *c, int64_t id, coord_cmd cmd, char *msg,
                           size_t msglen)
{
    coord_status ret = COORD_OK;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->shutdown) {
        /* the worker may already be past its last boundary: an answer
         * here could not be kept */
        snprintf(msg, msglen, "m6d is stopping: send the %s again once it "
                 "is back (`m6ctl watch %lld` waits for it)", cmd_names[cmd],
                 (long long)id);
        pthread_mutex_unlock(&c->mu);
        return COORD_BAD_STATE;
    }
    if (id == c->active) {
        switch (cmd) {
        case CMD_PAUSE:
            /* while a resume is tried, a pause waits for its end */
            if ((c->active_paused && !c->cmd_resume && !c->resuming) ||
                c->cmd_pause) {
                snprintf(msg, msglen, "run %lld is already paused", (long long)id);
                ret = COORD_BAD_STATE;
            } else {
                c->cmd_pause = 1;
                if (c->cmd_resume) { /* the resume not yet taken: cancelled */
                    c->cmd_resume = 0;
                    answer_locked_(c, c->resume_asked,
                                   "a pause was sent after it");
                }
                snprintf(msg, msglen, "run %lld pauses at the next step boundary",
                         (long long)id);
            }
            break;
        case CMD_RESUME:
            if (c->cmd_pause && !c->active_paused) {
                c->cmd_pause = 0;
                snprintf(msg, msglen, "run %lld: pending pause cancelled",
                         (long long)id);
            } else if (c->resuming) { /* being tried: wait with it */
                ret = wait_resume_(c, id, c->resume_serving, msg, msglen);
            } else if (!c->active_paused) {
                snprintf(msg, msglen, "run %lld is not paused", (long long)id);
                ret = COORD_BAD_STATE;
            } else { /* ask the worker and wait (one more resume sent
                      * before it takes this one is served by the same try) */
                c->cmd_resume = 1;
                ret = wait_resume_(c, id, ++c->resume_asked, msg, msglen);
            }
            break;
        case CMD_DELINK:
            if (c->active_phase == 1 && c->active_delink_step < 0) {
                snprintf(msg, msglen,
                         "run %lld trains from scratch (pseudo.steps 0): it "
                         "has no shared slots to delink", (long long)id);
                ret = COORD_BAD_STATE;
            } else if (c->active_phase == 1) {
                snprintf(msg, msglen,
                         "run %lld is already in the real phase (delinked at "
                         "step %ld)", (long long)id, c->active_delink_step);
                ret = COORD_BAD_STATE;
            } else {
                c->cmd_delink = 1;
                snprintf(msg, msglen, "run %lld delinks at the next step "
                         "boundary", (long long)id);
            }
            break;
        case CMD_STOP:
            c->cmd_stop = 1;
            snprintf(msg, msglen, "run %lld stops at the next step boundary",
                     (long long)id);
            break;
        }
        /* The worker acts (and records) at the boundary; if the run's last
         * write failed, say the command may only hold in memory. */
        if (ret == COORD_OK && c->active_error[0] && c->active_error_write &&
            cmd == CMD_STOP) {
            size_t n = strlen(msg);
            snprintf(msg + n, msglen - n, ", but its last write failed (%s): "
                     "the stop is final only once its checkpoint and state are "
                     "written; until then the run stays paused",
                     c->active_error);
        } else if (ret == COORD_OK && c->active_error[0] &&
                   c->active_error_write && cmd != CMD_RESUME) {
            size_t n = strlen(msg);
            snprintf(msg + n, msglen - n, "; it takes effect in memory, but "
                     "may not be recorded: %s", c->active_error);
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
        snprintf(msg, msglen, "no run with id %lld", (long long)id);
        ret = COORD_NOT_FOUND;
    } else if (rc < 0) {
        snprintf(msg, msglen, "database error");
        ret = COORD_INTERNAL;
    } else {
        if (row.state == RUN_QUEUED && cmd == CMD_STOP) {
            queue_dequeue(c->st, id);
            snprintf(msg, msglen, "run %lld removed from the queue", (long long)id);
        } else {
            snprintf(msg, msglen, "cannot %s run %lld: it is %s%s", cmd_names[cmd],
                     (long long)id, run_state_name(row.state),
                     row.state == RUN_QUEUED ? " (waiting for the running run)"
                                             : "");
            ret = COORD_BAD_STATE;
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
    if (id == c->active && c->step_s_ema > 0 && !c->active_paused)
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

int coord_run_error(coord *c, int64_t id, char *buf, size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->active_error[0]) {
        snprintf(buf, len, "%s", c->active_error);
        rc = 1 + c->active_paused;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void coord_describe(coord *c, char *buf, size_t len)
{
    pthread_mutex_lock(&c->mu);
    if (c->active)
        snprintf(buf, len, "run %lld step %ld/%ld %s%s", (long long)c->active,
                 c->active_step, c->active_total, phase_name(c->active_phase),
                 c->active_paused ? " (paused)" : "");
    else
        snprintf(buf, len, "idle");
    pthread_mutex_unlock(&c->mu);
}
