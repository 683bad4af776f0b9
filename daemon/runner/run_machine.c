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
    run_machine m;
    memset(&m, 0, sizeof m);
    m.state = s;
    m.delink_step = -1;
    m.error = no_error_;
    return m;
}

void run_machine_set_error(run_machine *m, const char *reason)
{
    static char oom[] = "out of memory (keeping why the run paused)";
    if (m->error != no_error_ && m->error != oom)
        free(m->error);
    m->error = no_error_;
    if (reason && reason[0] && !(m->error = strdup(reason)))
        m->error = oom;
}

/* The run the runner owns (its trainer is held). */
static int live_(run_state s)
{
    return s >= RUN_STARTING && s <= RUN_STOPPING;
}

/* ---------------------------------------------------------------- commands
 * Each returns the reply's status and writes its text; *m is the state
 * after the command. Only live, not stopping, runs get here (see
 * run_machine_command for the others). */

static m6_code pause_(run_machine *m, int64_t id, unsigned *act, char *msg,
                           size_t len)
{
    long long n = (long long)id;
    switch (m->state) {
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
        if (m->resume_tried) {
            m->state = RUN_PAUSING;
        } else {
            m->state = RUN_PAUSED;
            *act |= RUN_ACT_RESUME_CANCEL;
        }
        break;
    default: /* STARTING, RUNNING */
        m->state = RUN_PAUSING;
        break;
    }
    snprintf(msg, len, "run %lld pauses at the next step boundary", n);
    return M6_OK;
}

static m6_code resume_(run_machine *m, int64_t id, unsigned *act, char *msg,
                            size_t len)
{
    long long n = (long long)id;
    switch (m->state) {
    case RUN_PAUSING: /* the pause not taken yet: cancelled */
        m->state = m->resume_tried ? RUN_RESUMING : RUN_RUNNING;
        snprintf(msg, len, "run %lld: pending pause cancelled", n);
        return M6_OK;
    case RUN_PAUSED:
        m->state = RUN_RESUMING;
        *act |= RUN_ACT_RESUME_NEW;
        msg[0] = 0;
        return M6_OK;
    case RUN_RESUMING: /* one more resume: served by the same try */
        *act |= m->resume_tried ? RUN_ACT_RESUME_JOIN : RUN_ACT_RESUME_NEW;
        msg[0] = 0;
        return M6_OK;
    default: /* STARTING, RUNNING */
        snprintf(msg, len, "run %lld is not paused", n);
        return M6_EBADSTATE;
    }
}

static m6_code delink_(run_machine *m, int64_t id, char *msg, size_t len)
{
    long long n = (long long)id;
    if (m->real && m->delink_step < 0) {
        snprintf(msg, len, "run %lld trains from scratch (pseudo.steps 0): it "
                 "has no shared slots to delink", n);
        return M6_EBADSTATE;
    }
    if (m->real) {
        snprintf(msg, len, "run %lld is already in the real phase (delinked "
                 "at step %ld)", n, m->delink_step);
        return M6_EBADSTATE;
    }
    m->delink_pending = 1;
    /* a paused run's runner waits at a step boundary: it delinks there
     * now and stays paused */
    snprintf(msg, len, m->state == RUN_PAUSED
                 ? "run %lld delinks now, at the step boundary it is paused "
                   "at; it stays paused"
                 : "run %lld delinks at the next step boundary", n);
    return M6_OK;
}

static m6_code stop_(run_machine *m, int64_t id, char *msg, size_t len)
{
    /* a resume not yet tried stays owed: answered by the stop's outcome
     * (the run ended, or why the stop failed) */
    int again = m->state == RUN_STOPPING;
    m->state = RUN_STOPPING;
    snprintf(msg, len, again ? "run %lld is already stopping: it stops at "
             "the next step boundary" : "run %lld stops at the next step "
             "boundary", (long long)id);
    return M6_OK;
}

/* A run that is not the runner's: queued, or ended. */
static m6_code not_live_(run_machine *m, int64_t id, runner_cmd cmd,
                              unsigned *act, char *msg, size_t len)
{
    long long n = (long long)id;
    if (m->state == RUN_QUEUED && cmd == CMD_STOP) {
        m->state = RUN_STOPPED;
        *act |= RUN_ACT_DEQUEUE;
        snprintf(msg, len, "run %lld removed from the queue", n);
        return M6_OK;
    }
    if (m->state == RUN_STOPPED && cmd == CMD_RESUME)
        snprintf(msg, len, "run %lld is stopped: a stopped run cannot be "
                 "resumed; submit its spec again", n);
    else
        snprintf(msg, len, "cannot %s run %lld: it is %s%s", cmd_names_[cmd],
                 n, run_state_name(m->state),
                 m->state == RUN_QUEUED ? " (waiting for the running run)" : "");
    return M6_EBADSTATE;
}

void run_machine_stopping_msg(int64_t id, runner_cmd cmd, char *msg, size_t len)
{
    snprintf(msg, len, "m6d is stopping: send the %s again once it is back "
             "(`m6ctl watch %lld` waits for it)", cmd_names_[cmd],
             (long long)id);
}

m6_code run_machine_command(run_machine *m, int64_t id, runner_cmd cmd,
                            unsigned *actions, char *msg, size_t msglen)
{
    long long n = (long long)id;
    *actions = 0;
    if (!live_(m->state))
        return not_live_(m, id, cmd, actions, msg, msglen);
    if (m->shutdown) {
        run_machine_stopping_msg(id, cmd, msg, msglen);
        return M6_EBADSTATE;
    }
    if (m->state == RUN_STOPPING && cmd != CMD_STOP) {
        snprintf(msg, msglen, "run %lld stops at the next step boundary: a "
                 "%s cannot follow its stop", n, cmd_names_[cmd]);
        return M6_EBADSTATE;
    }
    m6_code st;
    switch (cmd) {
    case CMD_PAUSE: st = pause_(m, id, actions, msg, msglen); break;
    case CMD_RESUME: st = resume_(m, id, actions, msg, msglen); break;
    case CMD_DELINK: st = delink_(m, id, msg, msglen); break;
    default: st = stop_(m, id, msg, msglen); break;
    }
    /* The runner acts (and records) at the boundary; if the run's last
     * write failed, say the command may only hold in memory. */
    if (st == M6_OK && m->error[0] && m->error_write && cmd == CMD_STOP) {
        size_t k = strlen(msg);
        snprintf(msg + k, msglen - k, ", but its last write failed (%s): the "
                 "stop is final only once its checkpoint and state are "
                 "written; until then the run stays paused", m->error);
    } else if (st == M6_OK && m->error[0] && m->error_write &&
               cmd != CMD_RESUME) {
        size_t k = strlen(msg);
        snprintf(msg + k, msglen - k, "; it takes effect in memory, but may "
                 "not be recorded: %s", m->error);
    }
    return st;
}

/* ------------------------------------------------------------------ events */

run_machine_take run_machine_boundary(run_machine *m)
{
    run_machine_take t = {0};
    if (!live_(m->state)) return t;
    if (m->state == RUN_STOPPING) { /* the stop first; if it fails, the rest */
        t.stop = 1;
        return t;
    }
    if (m->delink_pending) {
        t.delink = 1;
        m->delink_pending = 0;
    }
    if (m->state == RUN_PAUSING) {
        /* paused from now on, so that a resume sent while the pause is
         * written waits for it, not "not paused" */
        m->state = RUN_PAUSED;
        t.pause = 1;
    }
    t.shutdown = m->shutdown;
    if (m->state == RUN_RESUMING && !m->resume_tried) {
        m->resume_tried = 1;
        run_machine_set_error(m, NULL); /* the try says anew why it stays
                                    * paused, if so */
        m->error_write = 0;
        m->error_code = M6_OK;
        t.resume = 1;
    }
    return t;
}

int run_machine_waits(const run_machine *m)
{
    return m->state == RUN_PAUSED && !m->delink_pending && !m->shutdown;
}

int run_machine_trains(const run_machine *m)
{
    return m->state == RUN_RUNNING && !m->shutdown;
}

/* A data error, a failed write, a lost checkpoint: the run pauses itself
 * with the reason. A stop or a resume not yet tried stays acknowledged:
 * the runner does it at its next boundary. A resume being tried ends here
 * (it failed). */
static int pause_self_(run_machine *m, const char *reason, int write)
{
    if (!(m->state == RUN_STOPPING ||
          (m->state == RUN_RESUMING && !m->resume_tried)))
        m->state = RUN_PAUSED;
    m->resume_tried = 0;
    run_machine_set_error(m, reason);
    m->error_write = write;
    return 0;
}

int run_machine_on(run_machine *m, run_machine_event ev, const char *reason)
{
    run_state s = m->state;
    if (!live_(s)) return -1;
    switch (ev) {
    case RUN_EV_STARTED:
        if (s == RUN_RUNNING) return -1;
        if (s == RUN_STARTING) m->state = RUN_RUNNING;
        return 0;
    case RUN_EV_STEP_DONE:
    case RUN_EV_EVAL_DONE: /* a command may have come in during the step */
        return s == RUN_RUNNING || s == RUN_PAUSING || s == RUN_STOPPING ? 0 : -1;
    case RUN_EV_CHECKPOINT:
        return s == RUN_STARTING ? -1 : 0;
    case RUN_EV_RESUMED:
        if (!m->resume_tried ||
            !(s == RUN_RESUMING || s == RUN_PAUSING || s == RUN_STOPPING))
            return -1;
        m->resume_tried = 0;
        if (s == RUN_RESUMING) m->state = RUN_RUNNING;
        return 0; /* PAUSING, STOPPING: sent during the try, done next */
    case RUN_EV_DATA_ERROR:
    case RUN_EV_CKPT_LOST:
    case RUN_EV_BAD_STEPS:
        return pause_self_(m, reason, 0);
    case RUN_EV_WRITE_FAILED:
        return pause_self_(m, reason, 1);
    case RUN_EV_STOPPED:
        if (s != RUN_STOPPING) return -1;
        m->state = RUN_STOPPED;
        return 0;
    case RUN_EV_STOP_FAILED:
        if (s != RUN_STOPPING) return -1;
        m->state = RUN_PAUSED;
        run_machine_set_error(m, reason);
        m->error_write = 1;
        return 0;
    case RUN_EV_COMPLETED:
        if (!(s == RUN_RUNNING || s == RUN_PAUSING || s == RUN_STOPPING)) return -1;
        m->state = RUN_COMPLETED;
        return 0;
    case RUN_EV_FAILED:
        m->state = RUN_FAILED;
        return 0;
    case RUN_EV_SHUTDOWN:
        m->shutdown = 1;
        return 0;
    }
    return -1;
}

void run_machine_delinked(run_machine *m, long step)
{
    m->real = 1;
    m->delink_step = step;
}

int run_machine_delink_pending(const run_machine *m)
{
    return m->state != RUN_STOPPING && live_(m->state) && m->delink_pending;
}

const char *run_machine_pending(const run_machine *m)
{
    int d = run_machine_delink_pending(m);
    switch (m->state) {
    case RUN_STOPPING: return "stopping";
    case RUN_PAUSING: return d ? "delinking, pausing" : "pausing";
    case RUN_RESUMING: return d ? "delinking, resuming" : "resuming";
    default: return d ? "delinking" : "";
    }
}

int run_machine_is_training(const run_machine *m)
{
    return m->state == RUN_RUNNING || m->state == RUN_PAUSING;
}

int run_machine_is_paused(const run_machine *m)
{
    return m->state == RUN_PAUSED || m->state == RUN_RESUMING ||
           (m->state == RUN_STOPPING && m->error[0]);
}
