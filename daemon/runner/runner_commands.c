/*
 * runner_commands.c — the operator's commands to the runner: submit,
 * and pause, resume, delink and stop from the server threads (recorded in
 * m6.db, applied to the run's state machine, answered), replayed after a
 * restart, then applied by the runner at the next step boundary (stop,
 * pause, resume, shutdown); and the queries the server threads ask (ETA,
 * placement, error, pending commands).
 */
#include "runner/runner_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "runner/queue.h"

/* With c->mu held: answer the resumes up to ticket (never backwards): err
 * NULL, the run trains on; else why it stays paused, and its code (M6_EDATA
 * and M6_ENOFILE get the handler's advice). */
static void answer_locked_(runner *c, long ticket, const char *err,
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
void runner_commands_done_(run_ctx *r)
{
    if (r->cmd_upto <= r->cmd_marked)
        return;
    if (state_commands_mark(r->c->st, r->id, r->cmd_upto,
                            runner_step_(r)) == 0)
        r->cmd_marked = r->cmd_upto;
}

/* The step count a hold file names (its first line), or 0 (none: an
 * empty file holds every boundary). */
static long hold_from_step_(const char *path)
{
    char buf[32] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    long n = strtol(buf, NULL, 10);
    return n > 0 ? n : 0;
}

/* Tests (M6_TEST_HOLD_BOUNDARY): wait at the boundary while the file is
 * there, so that a command is acknowledged and m6d killed before the
 * boundary takes it; a step count in the file lets the run train up to
 * that step first, so a test can hold a short run at a step it has not
 * reached yet (no race with a run that ends first). */
void runner_test_hold_(runner *c, long step)
{
    /* one look decides: a file that appears after it waits for the next
     * boundary, and one read as missing (removed meanwhile) holds nothing */
    if (!c->hold_path[0] || access(c->hold_path, F_OK) != 0)
        return;
    if (step < hold_from_step_(c->hold_path))
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
 * (training ends now): a later stop retries, or, when a rank is lost
 * (r->lost: what it holds cannot be saved), the stop itself is applied
 * again once the run is taken up from its last whole checkpoint (the
 * runner leaves it pending). 1 stopped, 0 not. */
int runner_stop_(run_ctx *r)
{
    runner *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = runner_step_(r);
    int ok = runner_flush_(r, &err) == 0 && runner_checkpoint_(r, "stop", &err) == 0;
    char detail[64];
    snprintf(detail, sizeof detail, "step=%ld", step);
    state_commit cm = {.set_state = 1, .state = RUN_STOPPED,
                       .event_kind = "stop", .event_detail = detail,
                       .step = step, .cmd_upto = r->cmd_upto,
                       .cmd_kinds = STATE_CMD_NOT_DELINK};
    if (ok && state_commit_run(c->st, r->id, &cm) < 0) {
        runner_db_error_(r, "recording the stop", &err);
        ok = 0;
    }
    if (!ok) {
        m6_err why = r->lost
            ? m6_err_make(M6_EBADSTATE, "stop not done (%s); it stops at "
                          "that checkpoint", m6_err_msg(&err))
            : m6_err_make(M6_EBADSTATE, "stop not done (%s); stop again "
                          "once there is space", m6_err_msg(&err));
        m6_err_free(&err);
        runner_pause_error_(r, RUN_EV_STOP_FAILED, why.msg);
        /* a resume sent before the stop, not tried: it stays paused */
        pthread_mutex_lock(&c->mu);
        if (c->resume_asked > c->resume_answered)
            answer_locked_(c, c->resume_asked, why.msg, M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
        m6_err_free(&why);
        return 0;
    }
    runner_on_(c, RUN_EV_STOPPED, NULL);
    log_info("run.stop", "run=%lld step=%ld", (long long)r->id, step);
    return 1;
}

/* Pause (the state is PAUSED already): the writes owed, a checkpoint, the
 * state; a failure keeps it paused with the reason. */
void runner_pause_(run_ctx *r)
{
    m6_err err = M6_ERR_NONE;
    long step = runner_step_(r);
    if (runner_flush_(r, &err) < 0 || runner_checkpoint_(r, "pause", &err) < 0) {
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&err));
    } else if (commit_state_(r, RUN_PAUSED, "pause", step) < 0) {
        runner_db_error_(r, "recording the pause", &err);
        runner_pause_error_(r, RUN_EV_WRITE_FAILED, m6_err_msg(&err));
    } else {
        log_info("run.pause", "run=%lld step=%ld", (long long)r->id, step);
    }
    m6_err_free(&err);
    runner_publish_(r);
}

/* m6d stops (a signal): checkpoint and leave the run as it is recorded,
 * running or paused, for the next start. resume: a resume was taken at
 * this boundary (not tried: it is answered so). */
void runner_interrupted_(run_ctx *r, int resume)
{
    runner *c = r->c;
    m6_err err = M6_ERR_NONE;
    long step = runner_step_(r);
    pthread_mutex_lock(&c->mu);
    int paused = c->machine.state != RUN_RUNNING; /* PAUSED, or RESUMING untried */
    pthread_mutex_unlock(&c->mu);
    /* On failure the next start resumes from the last good one. */
    if (runner_checkpoint_(r, "shutdown", &err) < 0)
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

/* Try the resume taken at this boundary: the writes owed, then the state.
 * Only then is it a resume (event); one that fails leaves the run paused
 * with the reason. The resumes waiting get the answer. 0 resumed, -1
 * not. */
int runner_resume_(run_ctx *r)
{
    runner *c = r->c;
    m6_err err = M6_ERR_NONE;
    /* a pass a command interrupted is redone after the answer (run_one_);
     * 1: the pass owed for bad data was interrupted again (still owed):
     * the resume stands, the command that interrupted it is taken next */
    int rc = runner_owed_(r, 0, &err) < 0 ? -1 : 0;
    long step = r->t ? runner_step_(r) : 0;  /* taken up again: its own */
    int lost = err.code == M6_ECKPTGONE || err.code == M6_ENOCKPT;
    run_machine_event failed = lost ? RUN_EV_CKPT_LOST
                             : r->data_error ? RUN_EV_DATA_ERROR
                                             : RUN_EV_WRITE_FAILED;
    if (rc < 0 && !r->t) {
        /* taking it up again made no trainer: the run failed */
        runner_fail_run_(r, "setup", m6_err_msg(&err));
        pthread_mutex_lock(&c->mu);
        answer_locked_(c, c->resume_serving, m6_err_msg(&err), M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
        m6_err_free(&err);
        return -1;
    }
    if (rc == 0 && commit_state_(r, RUN_RUNNING, "resume", step) < 0) {
        runner_db_error_(r, "recording the resume", &err);
        rc = -1;
        failed = RUN_EV_WRITE_FAILED;
    }
    if (rc < 0) {
        runner_pause_error_(r, failed, m6_err_msg(&err));
        pthread_mutex_lock(&c->mu);
        answer_locked_(c, c->resume_serving, m6_err_msg(&err),
                       lost ? err.code
                       : failed == RUN_EV_DATA_ERROR ? r->data_code
                                                     : M6_EBADSTATE);
        pthread_mutex_unlock(&c->mu);
        m6_err_free(&err);
        return -1;
    }
    log_info("run.resume", "run=%lld step=%ld", (long long)r->id, step);
    /* a pause for non-finite steps: the operator gives it max_bad_steps
     * more */
    trainer_clear_bad_steps(r->t);
    pthread_mutex_lock(&c->mu);
    run_machine_on(&c->machine, RUN_EV_RESUMED, NULL);
    answer_locked_(c, c->resume_serving, NULL, M6_OK);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* With mu held, for the run just taken up (c->active): the commands m6d
 * acknowledged for it and did not apply before it stopped (a crash, kill
 * -9, power loss), applied to its state machine again in the order they
 * came, as if they had just been sent: its next boundary takes them. A
 * command that finds nothing to do (a pause of a run recorded paused)
 * changes nothing and is marked applied there. */
void runner_replay_commands_locked_(runner *c)
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
        size_t len = strlen(c->machine.error) + 512;
        char *msg = malloc(len);
        if (!msg)
            break;
        m6_code code = run_machine_command(&c->machine, c->active, (runner_cmd)k, &act,
                                           msg, len);
        if (act & RUN_ACT_RESUME_NEW)
            c->resume_asked++;  /* nobody waits for its answer */
        log_info("command.replay", "run=%lld command=%lld kind=%s "
                 "result=\"%s\"", (long long)c->active,
                 (long long)rows[i].id, rows[i].kind,
                 code == M6_OK ? "applied again" : msg);
        free(msg);
    }
    free(rows);
}

/* ---------------------------------------------------------------- commands */

m6_err runner_submit(runner *c, const char *json, size_t len, const int *cancel,
                     int64_t *id, char *name, size_t namelen)
{
    run_spec spec;
    char err[1024];  /* spec_parse's words: a key and a value, no paths */
    if (spec_parse(&spec, json, len, err, sizeof err) < 0) {
        return m6_err_make(M6_EINVALID, "invalid spec: %s", err);
    }
    /* A worker trains the coordinator's ranks: a run of its own would
     * share its cores, memory and devices with them unplanned */
    if (c->worker_of[0]) {
        log_warn("run.submit_refused", "name=%s err=\"this m6d is a worker "
                 "of %s\"", spec.name, c->worker_of);
        return m6_err_make(M6_EBADSTATE, "this m6d is a worker of the "
                           "coordinator at %s (--join): it trains that "
                           "coordinator's runs and takes none of its own; "
                           "submit to the coordinator", c->worker_of);
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
     * trainer opens the data again when the run starts (on the runner);
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
     * flags still loads this run's checkpoints (the spec hash is stable);
     * a run across nodes on a node of several ranks: rank 0's share */
    int threads = spec.nodes.world_size > 1 && c->rank_threads > 0
                      ? c->rank_threads : c->threads;
    if (threads > 0 && spec.device.threads == 0)
        spec.device.threads = threads;
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

/* With c->mu held: wait (up to RESUME_WAIT_S) for the runner to try the
 * resume of this ticket -- reopen data a pause was for, do the writes owed
 * -- and say how it went. A resume that cannot go through is refused with
 * the reason; the run stays paused. */
enum { RESUME_WAIT_S = 10 }; /* under m6ctl's 15 s read timeout */
static m6_err wait_resume_(runner *c, int64_t id, long ticket)
{
    pthread_cond_broadcast(&c->cv);
    struct timespec until; /* c->cv waits on CLOCK_MONOTONIC (runner_init) */
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

/* Whether the state machine of a run the runner does not own starts from
 * its DB state: 1 for queued or ended, 0 for a run left running or paused
 * that another run holds the runner from (several were left paused). */
static int not_owned_(run_state s)
{
    return s == RUN_QUEUED || s == RUN_COMPLETED || s == RUN_FAILED ||
           s == RUN_STOPPED;
}

/* run_machine_command on m, its reply whole (the room it asks for). */
static m6_err run_machine_command_(run_machine *m, int64_t id, runner_cmd cmd,
                                   unsigned *act)
{
    size_t n = strlen(m->error) + 512;
    char *msg = malloc(n);
    if (!msg) return m6_err_make(M6_EINTERNAL, "out of memory");
    m6_code code = run_machine_command(m, id, cmd, act, msg, n);
    m6_err e = m6_err_make(code, "%s", msg);
    free(msg);
    return e;
}

/* Whether command cmd, applied to before giving after, is one to record:
 * it changed the run's state or asked for a delink. An answer that changes
 * nothing ("already paused", a second resume joining the first) has
 * nothing to keep. */
static int changes_(const run_machine *before, const run_machine *after)
{
    return before->state != after->state ||
           (!before->delink_pending && after->delink_pending);
}

/* The reply when the command log could not take command `name`: it is not
 * acknowledged, nothing changed. A resume says so in the words of a resume
 * that could not be done. */
static m6_err not_recorded_(runner *c, int64_t id, runner_cmd cmd,
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
        if (id == c->active && run_machine_is_paused(&c->machine)) {
            run_machine_set_error(&c->machine, strchr(r.msg, ':') + 2);
            c->machine.error_write = 1;
            c->machine.error_code = M6_EBADSTATE;
            log_error("run.paused", "run=%lld step=%ld reason=\"%s\"",
                      (long long)id, c->active_step, c->machine.error);
        }
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    return m6_err_make(M6_EINTERNAL, "run %lld: %s not done: the state DB "
                       "could not record it (%s); send it again once it can",
                       (long long)id, name, e);
}

/* --from-scratch is for a resume of the active run paused because its
 * checkpoints are gone: M6_OK, else the refusal (nothing sent). */
static m6_err scratch_ok_(runner *c, int64_t id, runner_cmd cmd)
{
    pthread_mutex_lock(&c->mu);
    int ok = cmd == CMD_RESUME && id == c->active && c->ckpts_gone;
    pthread_mutex_unlock(&c->mu);
    if (ok) return m6_err_make(M6_OK, "ok");
    return m6_err_make(M6_EBADSTATE, "run %lld: --from-scratch starts over "
                       "only a run paused because its checkpoints are gone, "
                       "and this one is not: nothing done (`m6ctl resume` "
                       "without it resumes a paused run)", (long long)id);
}

m6_err runner_command(runner *c, int64_t id, runner_cmd cmd, unsigned flags)
{
    static const char *const names[] = {"pause", "resume", "delink", "stop"};
    m6_err ret;
    unsigned act = 0;
    if (flags & RUNNER_FROM_SCRATCH) {
        ret = scratch_ok_(c, id, cmd);
        if (ret.code != M6_OK) return ret;
        m6_err_free(&ret);
    }
    pthread_mutex_lock(&c->mu);
    int gone = cmd == CMD_DELINK && id == c->active && c->ckpts_gone;
    pthread_mutex_unlock(&c->mu);
    if (gone)  /* its trainer is fresh, not the run's (runner_restore.c) */
        return m6_err_make(M6_EBADSTATE, "run %lld is not delinked: its "
                           "checkpoints are gone; delink once it is taken "
                           "up again", (long long)id);
    if (cmd == CMD_RESUME && c->worker_of[0])
        return m6_err_make(M6_EBADSTATE, "run %lld stays as it is: this m6d "
                           "is a worker of the coordinator at %s (--join) and "
                           "trains none of its own runs; start it without "
                           "--join to resume it", (long long)id,
                           c->worker_of);
    /* Acknowledged means recorded: a command that changes the active run
     * is written to the command log (synced) before it is applied and
     * answered; the runner marks it applied at the boundary that does it,
     * and a restart applies the pending ones again. cmd_mu keeps the log
     * in the order of application; the write is made without mu, so
     * status and the runner never wait for it. */
    pthread_mutex_lock(&c->cmd_mu);
    int64_t cid = 0;
    pthread_mutex_lock(&c->mu);
    int active = id == c->active;
    if (active) {
        run_machine trial = c->machine;  /* run_machine_command leaves error alone */
        unsigned a = 0;
        size_t n = strlen(trial.error) + 512;
        char *msg = malloc(n);
        int record = msg && run_machine_command(&trial, id, cmd, &a, msg, n) ==
                                M6_OK && changes_(&c->machine, &trial);
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
        run_machine before = c->machine;
        ret = run_machine_command_(&c->machine, id, cmd, &act);
        if (cid > 0 && ret.code == M6_OK && changes_(&before, &c->machine))
            c->cmd_last = cid;
        else if (cid > 0)  /* the run moved on meanwhile: not this answer */
            state_command_drop(c->st, cid);
        pthread_mutex_unlock(&c->cmd_mu);
        if (act & RUN_ACT_RESUME_CANCEL) /* the resume not yet taken */
            answer_locked_(c, c->resume_asked, "a pause was sent after it",
                           M6_EBADSTATE);
        if (act & (RUN_ACT_RESUME_NEW | RUN_ACT_RESUME_JOIN)) {
            /* ask the runner and wait (one more resume sent before it
             * takes this one is served by the same try); or, being
             * tried, wait with it */
            m6_err_free(&ret);
            if ((flags & RUNNER_FROM_SCRATCH) && (act & RUN_ACT_RESUME_NEW))
                c->scratch_ticket = c->resume_asked + 1;  /* this one's */
            ret = wait_resume_(c, id, act & RUN_ACT_RESUME_NEW ? ++c->resume_asked
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
     * under mu so the runner can't pick it meanwhile. */
    run_row row;
    int rc = state_run_get(c->st, id, &row);
    if (rc == 1) {
        ret = m6_err_make(M6_ENOTFOUND, "no run with id %lld", (long long)id);
    } else if (rc < 0) {
        ret = m6_err_make(M6_EINTERNAL, "database error");
    } else {
        if (not_owned_(row.state)) {
            run_machine m = run_machine_init(row.state);
            ret = run_machine_command_(&m, id, cmd, &act);
            if ((act & RUN_ACT_DEQUEUE) && queue_dequeue(c->st, id) < 0) {
                /* not acknowledged: the run stays queued; say why (m6.db
                 * locked by another process past the wait, a full disk) */
                char e[256];
                state_last_error(c->st, e, sizeof e);
                m6_err_set(&ret, M6_EINTERNAL, "run %lld: not stopped, still "
                           "queued: writing m6.db failed (%s); try again",
                           (long long)id, e);
            } else if ((act & RUN_ACT_DEQUEUE) &&
                       state_command_add(c->st, id, names[cmd], 1, 0) < 0) {
                /* the run is stopped (recorded); only the log's sync
                 * failed: the stop may not survive a power loss */
                log_warn("command.log", "run=%lld kind=stop: dequeued, but "
                         "the command log could not record it",
                         (long long)id);
            }
        } else if (c->shutdown) {
            /* the runner left the run at its last boundary (interrupted):
             * not "it is paused" to a command sent as m6d stops */
            char msg[256];
            run_machine_stopping_msg(id, cmd, msg, sizeof msg);
            ret = m6_err_make(M6_EBADSTATE, "%s", msg);
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

double runner_eta(runner *c, int64_t id)
{
    double eta = -1;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->step_s_ema > 0 && run_machine_is_training(&c->machine))
        eta = (double)(c->active_total - c->active_step) * c->step_s_ema;
    pthread_mutex_unlock(&c->mu);
    return eta;
}

int runner_offload_get(runner *c, int64_t id, runner_offload *out)
{
    int rc = 1;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->offload_valid) {
        *out = c->offload;
        rc = 0;
    } else if (id == c->active) {
        rc = 2;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int runner_run_error(runner *c, int64_t id, char **msg, m6_code *code)
{
    int rc = 0;
    *msg = NULL;
    pthread_mutex_lock(&c->mu);
    if (id == c->active && c->machine.error[0]) {
        *msg = strdup(c->machine.error);
        *code = c->machine.error_code;
        rc = *msg ? 1 + run_machine_is_paused(&c->machine) : -1;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void runner_pending(runner *c, int64_t id, run_state recorded, char *buf,
                    size_t len)
{
    pthread_mutex_lock(&c->mu);
    const char *p = id == c->active ? run_machine_pending(&c->machine) : "";
    if (id == c->active && !p[0] && c->delinking_at >= 0)
        p = "delinking";  /* taken at this boundary, not yet done */
    if (id == c->active && !p[0]) {
        /* applied in memory, m6.db not written yet */
        if (recorded == RUN_RUNNING && run_machine_is_paused(&c->machine))
            p = "pausing";
        else if (recorded == RUN_PAUSED && run_machine_is_training(&c->machine))
            p = "resuming";
    }
    snprintf(buf, len, "%s", p);
    pthread_mutex_unlock(&c->mu);
}

long runner_delink_pending(runner *c, int64_t id)
{
    pthread_mutex_lock(&c->mu);
    long at = -1;
    if (id == c->active && c->delinking_at >= 0)
        at = c->delinking_at;
    else if (id == c->active && run_machine_delink_pending(&c->machine))
        /* active_step is the last boundary's: taken there while the
         * runner is at it (paused, or between steps), else at the boundary
         * after the step in progress */
        at = c->in_step && !run_machine_is_paused(&c->machine)
                 ? c->active_step + 1 : c->active_step;
    pthread_mutex_unlock(&c->mu);
    return at;
}

void runner_describe(runner *c, char *buf, size_t len)
{
    pthread_mutex_lock(&c->mu);
    if (c->active)
        snprintf(buf, len, "run %lld step %ld/%ld %s%s", (long long)c->active,
                 c->active_step, c->active_total, phase_name(c->machine.real),
                 run_machine_is_paused(&c->machine) ? " (paused)" : "");
    else
        snprintf(buf, len, "idle");
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------ resume at a layout */

/* the spec of run id set to json (summary sum) with a "layout" event
 * saying detail, before kept to be put back until the change is settled
 * (NULL: settled); 0, or -1 with the state DB's reason in db */
static int set_spec_(runner *c, int64_t id, const char *json,
                     const run_spec *s, const char *detail,
                     const char *before, char *db, size_t dblen)
{
    run_summary sum = queue_summary(s);
    if (state_run_set_spec(c->st, id, json, &sum, "layout", detail,
                           before) == 0)
        return 0;
    state_last_error(c->st, db, dblen);
    return -1;
}

/* whether run id has a resume m6d recorded and not yet applied (the
 * command log replays it) */
static int resume_pending_(runner *c, int64_t id)
{
    command_row *rows = NULL;
    int n = 0, found = 0;
    if (state_commands_pending(c->st, id, &rows, &n) < 0)
        return 0;
    for (int i = 0; i < n; i++)
        found |= strcmp(rows[i].kind, "resume") == 0;
    free(rows);
    return found;
}

void runner_settle_specs_(runner *c)
{
    run_unsettled *u = NULL;
    int n = 0;
    if (state_run_unsettled(c->st, &u, &n) < 0) {
        char db[256];
        state_last_error(c->st, db, sizeof db);
        log_error("run.layout", "the state DB could not list the runs "
                  "changed by a resume never answered: %s", db);
        return;
    }
    for (int i = 0; i < n; i++) {
        run_spec s;
        char err[512], db[256];
        int64_t id = u[i].id;
        if (resume_pending_(c, id)) {
            /* the resume was recorded: replayed, it takes the new spec */
            if (state_run_settle_spec(c->st, id) == 0) {
                state_event(c->st, id, "layout", "kept: m6d stopped after "
                            "recording the resume at this layout or budget, "
                            "which it tries again");
                log_warn("run.layout", "run=%lld kept: the resume at a "
                         "layout or budget was recorded", (long long)id);
            }
        } else if (spec_parse(&s, u[i].spec_before, strlen(u[i].spec_before),
                              err, sizeof err) < 0) {
            log_error("run.layout", "run=%lld the spec to put back does not "
                      "parse (%s): the run keeps its new one",
                      (long long)id, err);
        } else {
            const char *why = "undone: m6d stopped before the resume at "
                              "this layout or budget was recorded";
            if (set_spec_(c, id, u[i].spec_before, &s, why, NULL, db,
                          sizeof db) == 0)
                log_warn("run.layout", "run=%lld %s", (long long)id, why);
            else
                log_error("run.layout", "run=%lld the spec of before an "
                          "unrecorded resume could not be put back: %s",
                          (long long)id, db);
        }
        free(u[i].spec_before);
    }
    free(u);
}

m6_err runner_resume_at(runner *c, int64_t id, int world, int ep,
                        int64_t budget)
{
    if (world < 0 || ep < 0 || (world == 0 && ep > 0) || budget < -1 ||
        (world == 0 && budget == 0))
        return m6_err_make(M6_EINVALID, "resume at a layout: world size %d, "
                           "expert parallel %d, memory budget %lld: want a "
                           "world size >= 1 (0: the run's own) with an "
                           "expert parallel >= 0, or a memory budget (-1: "
                           "none)", world, ep, (long long)budget);
    if (c->worker_of[0])
        return runner_command(c, id, CMD_RESUME, 0);  /* its refusal */
    run_row row;
    if (state_run_get(c->st, id, &row) != 0)
        return m6_err_make(M6_EINTERNAL, "run %lld: the state DB could not "
                           "read it", (long long)id);
    run_spec s, old;
    char err[1024];
    run_state st = row.state;
    int rc = spec_parse(&s, row.spec, strlen(row.spec), err, sizeof err);
    run_row_clear(&row);
    if (st == RUN_RUNNING)
        return m6_err_make(M6_EBADSTATE, "run %lld could not resume at "
                           "another layout or budget: it is running (pause "
                           "it first: it continues from its newest "
                           "checkpoint)", (long long)id);
    if (st != RUN_PAUSED)  /* queued or ended: a resume's refusal */
        return runner_command(c, id, CMD_RESUME, 0);
    if (rc < 0)
        return m6_err_make(M6_EINTERNAL, "run %lld: its spec does not parse "
                           "any more: %s", (long long)id, err);
    old = s;
    int W0 = s.nodes.world_size, P0 = s.nodes.expert_parallel;
    size_t B0 = s.device.memory_budget;
    int relayout = world > 0;
    if (relayout) {
        s.nodes.world_size = world;
        s.nodes.expert_parallel = ep > 0 ? ep : world % P0 == 0 ? P0 : 1;
        if (s.nodes.pseudo_world_size > world)
            s.nodes.pseudo_world_size = 0;
    }
    world = s.nodes.world_size;
    if (budget != 0)
        s.device.memory_budget = budget < 0 ? 0 : (size_t)budget;
    /* every check of a submit, by key */
    char *json = spec_to_json(&s), *was = spec_to_json(&old);
    if (!json || !was) {
        free(json);
        free(was);
        return m6_err_make(M6_EINTERNAL, "out of memory");
    }
    m6_err e = M6_ERR_NONE, ce = M6_ERR_NONE;
    char what[160] = "";  /* what the spec checks refused */
    if (relayout)
        snprintf(what, sizeof what, "the layout nodes.world_size %d, "
                 "nodes.expert_parallel %d%s", world,
                 s.nodes.expert_parallel, budget ? " and " : "");
    if (budget)
        snprintf(what + strlen(what), sizeof what - strlen(what),
                 "device.memory_budget %zu", s.device.memory_budget);
    if (spec_parse(&s, json, strlen(json), err, sizeof err) < 0) {
        e = m6_err_make(M6_EINVALID, "run %lld could not resume, it stays "
                        "paused: %s: %s", (long long)id, what, err);
    } else if (trainer_check_spec(&s, &ce) != 0) {
        /* a submit's checks of what it needs (the data, the memory plan
         * at this layout and budget, host memory): what would fail the
         * run at its set-up is refused here, the run paused as it was */
        e = m6_err_make(M6_EINVALID, "run %lld could not resume, it stays "
                        "paused: %s", (long long)id, m6_err_msg(&ce));
        m6_err_free(&ce);
    } else if (world > 1 && !c->coordinator) {
        e = m6_err_make(M6_EINVALID, "run %lld could not resume, it stays "
                        "paused: nodes.world_size %d needs a coordinator, "
                        "and this m6d is not one", (long long)id, world);
    } else if (strcmp(json, was) == 0) {
        /* nothing changes: a plain resume */
        free(json);
        free(was);
        return runner_command(c, id, CMD_RESUME, 0);
    }
    if (e.code != M6_OK) {
        free(json);
        free(was);
        return e;
    }
    /* one such resume of a run at a time: a second, with other figures,
     * would be answered as if its own had been taken */
    pthread_mutex_lock(&c->mu);
    int busy = c->resuming_at == id;
    if (!busy) c->resuming_at = id;
    pthread_mutex_unlock(&c->mu);
    if (busy) {
        free(json);
        free(was);
        return m6_err_make(M6_EBADSTATE, "run %lld could not resume at "
                           "another layout or budget: another resume of it "
                           "at a layout or budget is being tried",
                           (long long)id);
    }
    char detail[256], back[320], db[256];
    size_t o = 0;
    if (relayout)
        o += (size_t)snprintf(detail, sizeof detail, "nodes.world_size %d -> "
                              "%d, nodes.expert_parallel %d -> %d, ", W0,
                              world, P0, s.nodes.expert_parallel);
    if (budget != 0 && o < sizeof detail)
        o += (size_t)snprintf(detail + o, sizeof detail - o,
                              "device.memory_budget %zu -> %zu, ", B0,
                              s.device.memory_budget);
    if (o >= 2 && o < sizeof detail)  /* ", " -> ": from ..." */
        snprintf(detail + o - 2, sizeof detail - (o - 2),
                 ": from the newest checkpoint");
    pthread_mutex_lock(&c->cmd_mu);
    int wrc = set_spec_(c, id, json, &s, detail, was, db, sizeof db);
    if (wrc == 0) {
        pthread_mutex_lock(&c->mu);
        if (id == c->active) {
            c->relayout = id;
            c->offload_valid = 0;  /* the old placement: none until set up */
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&c->cmd_mu);
    if (wrc != 0) {
        e = m6_err_make(M6_EINTERNAL, "run %lld could not resume, it stays "
                        "paused: the state DB could not record its new "
                        "layout (%s)", (long long)id, db);
    } else {
        log_info("run.layout", "run=%lld %s", (long long)id, detail);
        e = runner_command(c, id, CMD_RESUME, 0);
    }
    if (wrc == 0 && e.code != M6_OK) {
        /* refused: the run keeps the spec it paused with (the boundary
         * that refused it set nothing up from the new one) */
        snprintf(back, sizeof back, "undone, the resume was refused: %s",
                 detail);
        pthread_mutex_lock(&c->cmd_mu);
        pthread_mutex_lock(&c->mu);
        if (c->relayout == id) c->relayout = 0;
        pthread_mutex_unlock(&c->mu);
        if (set_spec_(c, id, was, &old, back, NULL, db, sizeof db) == 0)
            log_info("run.layout", "run=%lld %s", (long long)id, back);
        else
            log_error("run.layout", "run=%lld the spec of before the refused "
                      "resume could not be put back: %s", (long long)id, db);
        pthread_mutex_unlock(&c->cmd_mu);
    }
    if (wrc == 0 && e.code == M6_OK && state_run_settle_spec(c->st, id) < 0) {
        /* taken; m6d's next start would put the old spec back (the
         * checkpoints load under either) */
        state_last_error(c->st, db, sizeof db);
        log_error("run.layout", "run=%lld resumed, but the state DB could "
                  "not record its new spec as settled (%s): a restart of "
                  "m6d would put the old one back", (long long)id, db);
    }
    pthread_mutex_lock(&c->mu);
    c->resuming_at = 0;
    pthread_mutex_unlock(&c->mu);
    free(json);
    free(was);
    return e;
}
