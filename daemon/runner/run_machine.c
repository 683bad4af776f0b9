/*
 * run_machine.c — the run's state machine (see run_machine.h): one function
 * per command and per event, each a pure function of the run_machine value.
 */
#include "runner/run_machine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const cmd_names_[] = {
    [CMD_PAUSE] = "pause", [CMD_RESUME] = "resume",
    [CMD_DELINK] = "delink", [CMD_STOP] = "stop",
};

static char no_error_[] = "";  /* run_machine.error when there is none */

run_machine run_machine_init(run_state s)
{
    run_machine w;
    memset(&w, 0, sizeof w);
    w.state = s;
    w.delink_step = -1;
    w.error = no_error_;
    return w;
}

void run_machine_set_error(run_machine *w, const char *reason)
{
    static char oom[] = "out of memory (keeping why the run paused)";
    if (w->error != no_error_ && w->error != oom)
        free(w->error);
    w->error = no_error_;
    if (reason && reason[0] && !(w->error = strdup(reason)))
        w->error = oom;
}

/* The run the runner owns (its trainer is held). */
static int live_(run_state s)
{
    return s >= RUN_STARTING && s <= RUN_STOPPING;
}

/* ---------------------------------------------------------------- commands
 * Each returns the reply's status and writes its text; *w is the state
 * after the command. Only live, not stopping, runs get here (see
 * run_machine_command for the others). */

static m6_code pause_(run_machine *w, int64_t id, unsigned *act, char *msg,
                           size_t len)
{
    long long n = (long long)id;
    switch (w->state) {
    case RUN_PAUSING:
        snprintf(msg, len, "run %lld is already pausing: it pauses at the "
                 "next step boundary", n);
        return M6_EBADSTATE;
    case RUN_PAUSED:
        snprintf(msg, len, "run %lld is already paused", n);
        return M6_EBADSTATE;
    case RUN_RESUMING:
        /* not yet tried: the resume is cancelled and answered so, the run
         * stays paused; being tried: the run pauses once it resumed */
        if (w->resume_tried) {
            w->state = RUN_PAUSING;
        } else {
            w->state = RUN_PAUSED;
            *act |= RUN_ACT_RESUME_CANCEL;
        }
        break;
    default: /* STARTING, RUNNING */
        w->state = RUN_PAUSING;
        break;
    }
    snprintf(msg, len, "run %lld pauses at the next step boundary", n);
    return M6_OK;
}

static m6_code resume_(run_machine *w, int64_t id, unsigned *act, char *msg,
                            size_t len)
{
    long long n = (long long)id;
    switch (w->state) {
    case RUN_PAUSING: /* the pause not taken yet: cancelled */
        w->state = w->resume_tried ? RUN_RESUMING : RUN_RUNNING;
        snprintf(msg, len, "run %lld: pending pause cancelled", n);
        return M6_OK;
    case RUN_PAUSED:
        w->state = RUN_RESUMING;
        *act |= RUN_ACT_RESUME_NEW;
        msg[0] = 0;
        return M6_OK;
    case RUN_RESUMING: /* one more resume: served by the same try */
        *act |= w->resume_tried ? RUN_ACT_RESUME_JOIN : RUN_ACT_RESUME_NEW;
        msg[0] = 0;
        return M6_OK;
    default: /* STARTING, RUNNING */
        snprintf(msg, len, "run %lld is not paused", n);
        return M6_EBADSTATE;
    }
}

static m6_code delink_(run_machine *w, int64_t id, char *msg, size_t len)
{
    long long n = (long long)id;
    if (w->real && w->delink_step < 0) {
        snprintf(msg, len, "run %lld trains from scratch (pseudo.steps 0): it "
                 "has no shared slots to delink", n);
        return M6_EBADSTATE;
    }
    if (w->real) {
        snprintf(msg, len, "run %lld is already in the real phase (delinked "
                 "at step %ld)", n, w->delink_step);
        return M6_EBADSTATE;
    }
    w->delink_pending = 1;
    snprintf(msg, len, "run %lld delinks at the next step boundary", n);
    return M6_OK;
}

static m6_code stop_(run_machine *w, int64_t id, char *msg, size_t len)
{
    /* a resume not yet tried stays owed: answered by the stop's outcome
     * (the run ended, or why the stop failed) */
    int again = w->state == RUN_STOPPING;
    w->state = RUN_STOPPING;
    snprintf(msg, len, again ? "run %lld is already stopping: it stops at "
             "the next step boundary" : "run %lld stops at the next step "
             "boundary", (long long)id);
    return M6_OK;
}

/* A run that is not the runner's: queued, or ended. */
static m6_code not_live_(run_machine *w, int64_t id, runner_cmd cmd,
                              unsigned *act, char *msg, size_t len)
{
    long long n = (long long)id;
    if (w->state == RUN_QUEUED && cmd == CMD_STOP) {
        w->state = RUN_STOPPED;
        *act |= RUN_ACT_DEQUEUE;
        snprintf(msg, len, "run %lld removed from the queue", n);
        return M6_OK;
    }
    if (w->state == RUN_STOPPED && cmd == CMD_RESUME)
        snprintf(msg, len, "run %lld is stopped: a stopped run cannot be "
                 "resumed; submit its spec again", n);
    else
        snprintf(msg, len, "cannot %s run %lld: it is %s%s", cmd_names_[cmd],
                 n, run_state_name(w->state),
                 w->state == RUN_QUEUED ? " (waiting for the running run)" : "");
    return M6_EBADSTATE;
}

void run_machine_stopping_msg(int64_t id, runner_cmd cmd, char *msg, size_t len)
{
    snprintf(msg, len, "m6d is stopping: send the %s again once it is back "
             "(`m6ctl watch %lld` waits for it)", cmd_names_[cmd],
             (long long)id);
}

m6_code run_machine_command(run_machine *w, int64_t id, runner_cmd cmd,
                            unsigned *actions, char *msg, size_t msglen)
{
    long long n = (long long)id;
    *actions = 0;
    if (!live_(w->state))
        return not_live_(w, id, cmd, actions, msg, msglen);
    if (w->shutdown) {
        run_machine_stopping_msg(id, cmd, msg, msglen);
        return M6_EBADSTATE;
    }
    if (w->state == RUN_STOPPING && cmd != CMD_STOP) {
        snprintf(msg, msglen, "run %lld stops at the next step boundary: a "
                 "%s cannot follow its stop", n, cmd_names_[cmd]);
        return M6_EBADSTATE;
    }
    m6_code st;
    switch (cmd) {
    case CMD_PAUSE: st = pause_(w, id, actions, msg, msglen); break;
    case CMD_RESUME: st = resume_(w, id, actions, msg, msglen); break;
    case CMD_DELINK: st = delink_(w, id, msg, msglen); break;
    default: st = stop_(w, id, msg, msglen); break;
    }
    /* The runner acts (and records) at the boundary; if the run's last
     * write failed, say the command may only hold in memory. */
    if (st == M6_OK && w->error[0] && w->error_write && cmd == CMD_STOP) {
        size_t k = strlen(msg);
        snprintf(msg + k, msglen - k, ", but its last write failed (%s): the "
                 "stop is final only once its checkpoint and state are "
                 "written; until then the run stays paused", w->error);
    } else if (st == M6_OK && w->error[0] && w->error_write &&
               cmd != CMD_RESUME) {
        size_t k = strlen(msg);
        snprintf(msg + k, msglen - k, "; it takes effect in memory, but may "
                 "not be recorded: %s", w->error);
    }
    return st;
}

/* ------------------------------------------------------------------ events */

run_machine_take run_machine_boundary(run_machine *w)
{
    run_machine_take t = {0};
    if (!live_(w->state)) return t;
    if (w->state == RUN_STOPPING) { /* the stop first; if it fails, the rest */
        t.stop = 1;
        return t;
    }
    if (w->delink_pending) {
        t.delink = 1;
        w->delink_pending = 0;
    }
    if (w->state == RUN_PAUSING) {
        /* paused from now on, so that a resume sent while the pause is
         * written waits for it, not "not paused" */
        w->state = RUN_PAUSED;
        t.pause = 1;
    }
    t.shutdown = w->shutdown;
    if (w->state == RUN_RESUMING && !w->resume_tried) {
        w->resume_tried = 1;
        run_machine_set_error(w, NULL); /* the try says anew why it stays
                                    * paused, if so */
        w->error_write = 0;
        w->error_code = M6_OK;
        t.resume = 1;
    }
    return t;
}

int run_machine_waits(const run_machine *w)
{
    return w->state == RUN_PAUSED && !w->delink_pending && !w->shutdown;
}

int run_machine_trains(const run_machine *w)
{
    return w->state == RUN_RUNNING && !w->shutdown;
}

/* A data error, a failed write, a lost checkpoint: the run pauses itself
 * with the reason. A stop or a resume not yet tried stays acknowledged:
 * the runner does it at its next boundary. A resume being tried ends here
 * (it failed). */
static int pause_self_(run_machine *w, const char *reason, int write)
{
    if (!(w->state == RUN_STOPPING ||
          (w->state == RUN_RESUMING && !w->resume_tried)))
        w->state = RUN_PAUSED;
    w->resume_tried = 0;
    run_machine_set_error(w, reason);
    w->error_write = write;
    return 0;
}

int run_machine_on(run_machine *w, run_machine_event ev, const char *reason)
{
    run_state s = w->state;
    if (!live_(s)) return -1;
    switch (ev) {
    case RUN_EV_STARTED:
        if (s == RUN_RUNNING) return -1;
        if (s == RUN_STARTING) w->state = RUN_RUNNING;
        return 0;
    case RUN_EV_STEP_DONE:
    case RUN_EV_EVAL_DONE: /* a command may have come in during the step */
        return s == RUN_RUNNING || s == RUN_PAUSING || s == RUN_STOPPING ? 0 : -1;
    case RUN_EV_CHECKPOINT:
        return s == RUN_STARTING ? -1 : 0;
    case RUN_EV_RESUMED:
        if (!w->resume_tried ||
            !(s == RUN_RESUMING || s == RUN_PAUSING || s == RUN_STOPPING))
            return -1;
        w->resume_tried = 0;
        if (s == RUN_RESUMING) w->state = RUN_RUNNING;
        return 0; /* PAUSING, STOPPING: sent during the try, done next */
    case RUN_EV_DATA_ERROR:
    case RUN_EV_CKPT_LOST:
    case RUN_EV_BAD_STEPS:
        return pause_self_(w, reason, 0);
    case RUN_EV_WRITE_FAILED:
        return pause_self_(w, reason, 1);
    case RUN_EV_STOPPED:
        if (s != RUN_STOPPING) return -1;
        w->state = RUN_STOPPED;
        return 0;
    case RUN_EV_STOP_FAILED:
        if (s != RUN_STOPPING) return -1;
        w->state = RUN_PAUSED;
        run_machine_set_error(w, reason);
        w->error_write = 1;
        return 0;
    case RUN_EV_COMPLETED:
        if (!(s == RUN_RUNNING || s == RUN_PAUSING || s == RUN_STOPPING)) return -1;
        w->state = RUN_COMPLETED;
        return 0;
    case RUN_EV_FAILED:
        w->state = RUN_FAILED;
        return 0;
    case RUN_EV_SHUTDOWN:
        w->shutdown = 1;
        return 0;
    }
    return -1;
}

void run_machine_delinked(run_machine *w, long step)
{
    w->real = 1;
    w->delink_step = step;
}

int run_machine_delink_pending(const run_machine *w)
{
    return w->state != RUN_STOPPING && live_(w->state) && w->delink_pending;
}

const char *run_machine_pending(const run_machine *w)
{
    int d = run_machine_delink_pending(w);
    switch (w->state) {
    case RUN_STOPPING: return "stopping";
    case RUN_PAUSING: return d ? "delinking, pausing" : "pausing";
    case RUN_RESUMING: return d ? "delinking, resuming" : "resuming";
    default: return d ? "delinking" : "";
    }
}

int run_machine_is_training(const run_machine *w)
{
    return w->state == RUN_RUNNING || w->state == RUN_PAUSING;
}

int run_machine_is_paused(const run_machine *w)
{
    return w->state == RUN_PAUSED || w->state == RUN_RESUMING ||
           (w->state == RUN_STOPPING && w->error[0]);
}
