/*
 * test_run_machine.c — the run's state machine
 * (daemon/runner/run_machine.h) without a model or a thread: every (state, command) pair, illegal ones included,
 * and every event in every state, against tables written here by hand
 * from the rules (run_machine.h's comment and the operator docs), not from the
 * code's output.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runner/run_machine.h"
#include "../common/test_main.h"

enum { ID = 7 };

/* Variants of a state that answer differently. */
enum {
    V_PLAIN = 0,   /* pseudo phase, no flag */
    V_TRIED = 1,   /* resume_tried: the runner is trying a resume */
};

typedef struct {
    run_state from;
    int variant;
    runner_cmd cmd;
    m6_code status;
    run_state to;
    unsigned actions;
    int delink_pending;   /* after */
    const char *words;    /* must be in the reply ("" for the resume
                           * answers, written by the caller) */
} cmd_case;

#define OK M6_OK
#define BAD M6_EBADSTATE

/* Every state x every command, pseudo phase, m6d not stopping. */
static const cmd_case cmd_table[] = {
    /* queued: only a stop, which takes it out of the queue */
    {RUN_QUEUED, 0, CMD_PAUSE, BAD, RUN_QUEUED, 0, 0,
     "cannot pause run 7: it is queued (waiting for the running run)"},
    {RUN_QUEUED, 0, CMD_RESUME, BAD, RUN_QUEUED, 0, 0,
     "cannot resume run 7: it is queued"},
    {RUN_QUEUED, 0, CMD_DELINK, BAD, RUN_QUEUED, 0, 0,
     "cannot delink run 7: it is queued"},
    {RUN_QUEUED, 0, CMD_STOP, OK, RUN_STOPPED, RUN_ACT_DEQUEUE, 0,
     "run 7 removed from the queue"},
    /* starting: as running, applied at the first boundary */
    {RUN_STARTING, 0, CMD_PAUSE, OK, RUN_PAUSING, 0, 0,
     "run 7 pauses at the next step boundary"},
    {RUN_STARTING, 0, CMD_RESUME, BAD, RUN_STARTING, 0, 0, "run 7 is not paused"},
    {RUN_STARTING, 0, CMD_DELINK, OK, RUN_STARTING, 0, 1,
     "run 7 delinks at the next step boundary"},
    {RUN_STARTING, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0,
     "run 7 stops at the next step boundary"},
    /* running */
    {RUN_RUNNING, 0, CMD_PAUSE, OK, RUN_PAUSING, 0, 0,
     "run 7 pauses at the next step boundary"},
    {RUN_RUNNING, 0, CMD_RESUME, BAD, RUN_RUNNING, 0, 0, "run 7 is not paused"},
    {RUN_RUNNING, 0, CMD_DELINK, OK, RUN_RUNNING, 0, 1,
     "run 7 delinks at the next step boundary"},
    {RUN_RUNNING, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0,
     "run 7 stops at the next step boundary"},
    /* pausing: a second pause is refused and says so; a resume cancels */
    {RUN_PAUSING, 0, CMD_PAUSE, BAD, RUN_PAUSING, 0, 0,
     "run 7 is already pausing"},
    {RUN_PAUSING, 0, CMD_RESUME, OK, RUN_RUNNING, 0, 0,
     "run 7: pending pause cancelled"},
    {RUN_PAUSING, 0, CMD_DELINK, OK, RUN_PAUSING, 0, 1,
     "run 7 delinks at the next step boundary"},
    {RUN_PAUSING, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0,
     "run 7 stops at the next step boundary"},
    /* pausing while a resume is tried: cancelling the pause leaves the
     * resume being tried */
    {RUN_PAUSING, V_TRIED, CMD_PAUSE, BAD, RUN_PAUSING, 0, 0,
     "already pausing"},
    {RUN_PAUSING, V_TRIED, CMD_RESUME, OK, RUN_RESUMING, 0, 0,
     "pending pause cancelled"},
    {RUN_PAUSING, V_TRIED, CMD_DELINK, OK, RUN_PAUSING, 0, 1, "delinks"},
    {RUN_PAUSING, V_TRIED, CMD_STOP, OK, RUN_STOPPING, 0, 0, "stops"},
    /* paused */
    {RUN_PAUSED, 0, CMD_PAUSE, BAD, RUN_PAUSED, 0, 0, "run 7 is already paused"},
    {RUN_PAUSED, 0, CMD_RESUME, OK, RUN_RESUMING, RUN_ACT_RESUME_NEW, 0, ""},
    {RUN_PAUSED, 0, CMD_DELINK, OK, RUN_PAUSED, 0, 1,
     "run 7 delinks now, at the step boundary it is paused at; it stays "
     "paused"},
    {RUN_PAUSED, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0,
     "run 7 stops at the next step boundary"},
    /* resuming, not yet tried: a pause cancels it (answered), one more
     * resume takes a ticket served by the same try */
    {RUN_RESUMING, 0, CMD_PAUSE, OK, RUN_PAUSED, RUN_ACT_RESUME_CANCEL, 0,
     "run 7 pauses at the next step boundary"},
    {RUN_RESUMING, 0, CMD_RESUME, OK, RUN_RESUMING, RUN_ACT_RESUME_NEW, 0, ""},
    {RUN_RESUMING, 0, CMD_DELINK, OK, RUN_RESUMING, 0, 1, "delinks"},
    {RUN_RESUMING, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0, "stops"},
    /* resuming, being tried: a pause waits for the try; a resume joins */
    {RUN_RESUMING, V_TRIED, CMD_PAUSE, OK, RUN_PAUSING, 0, 0,
     "run 7 pauses at the next step boundary"},
    {RUN_RESUMING, V_TRIED, CMD_RESUME, OK, RUN_RESUMING, RUN_ACT_RESUME_JOIN, 0, ""},
    {RUN_RESUMING, V_TRIED, CMD_DELINK, OK, RUN_RESUMING, 0, 1, "delinks"},
    {RUN_RESUMING, V_TRIED, CMD_STOP, OK, RUN_STOPPING, 0, 0, "stops"},
    /* stopping: only the stop again */
    {RUN_STOPPING, 0, CMD_PAUSE, BAD, RUN_STOPPING, 0, 0,
     "run 7 stops at the next step boundary: a pause cannot follow its stop"},
    {RUN_STOPPING, 0, CMD_RESUME, BAD, RUN_STOPPING, 0, 0,
     "a resume cannot follow its stop"},
    {RUN_STOPPING, 0, CMD_DELINK, BAD, RUN_STOPPING, 0, 0,
     "a delink cannot follow its stop"},
    {RUN_STOPPING, 0, CMD_STOP, OK, RUN_STOPPING, 0, 0,
     "run 7 is already stopping: it stops at the next step boundary"},
    /* terminal: nothing; a stopped run says to submit it again */
    {RUN_COMPLETED, 0, CMD_PAUSE, BAD, RUN_COMPLETED, 0, 0,
     "cannot pause run 7: it is completed"},
    {RUN_COMPLETED, 0, CMD_RESUME, BAD, RUN_COMPLETED, 0, 0,
     "cannot resume run 7: it is completed"},
    {RUN_COMPLETED, 0, CMD_DELINK, BAD, RUN_COMPLETED, 0, 0,
     "cannot delink run 7: it is completed"},
    {RUN_COMPLETED, 0, CMD_STOP, BAD, RUN_COMPLETED, 0, 0,
     "cannot stop run 7: it is completed"},
    {RUN_FAILED, 0, CMD_PAUSE, BAD, RUN_FAILED, 0, 0,
     "cannot pause run 7: it is failed"},
    {RUN_FAILED, 0, CMD_RESUME, BAD, RUN_FAILED, 0, 0,
     "cannot resume run 7: it is failed"},
    {RUN_FAILED, 0, CMD_DELINK, BAD, RUN_FAILED, 0, 0,
     "cannot delink run 7: it is failed"},
    {RUN_FAILED, 0, CMD_STOP, BAD, RUN_FAILED, 0, 0,
     "cannot stop run 7: it is failed"},
    {RUN_STOPPED, 0, CMD_PAUSE, BAD, RUN_STOPPED, 0, 0,
     "cannot pause run 7: it is stopped"},
    {RUN_STOPPED, 0, CMD_RESUME, BAD, RUN_STOPPED, 0, 0,
     "run 7 is stopped: a stopped run cannot be resumed; submit its spec "
     "again"},
    {RUN_STOPPED, 0, CMD_DELINK, BAD, RUN_STOPPED, 0, 0,
     "cannot delink run 7: it is stopped"},
    {RUN_STOPPED, 0, CMD_STOP, BAD, RUN_STOPPED, 0, 0,
     "cannot stop run 7: it is stopped"},
};

static const char *const cmd_name_[] = {"pause", "resume", "delink", "stop"};

static run_machine make_(run_state s, int variant)
{
    run_machine w = run_machine_init(s);
    w.resume_tried = variant == V_TRIED;
    return w;
}

/* w's error freed, then w replaced by n (machines are values here; their
 * error text is the one thing they own). */
static run_machine renew_(run_machine *w, run_machine n)
{
    run_machine_set_error(w, NULL);
    return n;
}

static void check_case_(const cmd_case *k, run_machine w)
{
    char msg[2048] = "unset";
    unsigned act = 12345;
    char what[128];
    snprintf(what, sizeof what, "%s%s + %s", run_state_name(k->from),
             k->variant == V_TRIED ? " (resume tried)" : "",
             cmd_name_[k->cmd]);
    m6_code st = run_machine_command(&w, ID, k->cmd, &act, msg, sizeof msg);
    if (st != k->status || w.state != k->to || act != k->actions ||
        w.delink_pending != k->delink_pending || !strstr(msg, k->words))
        fail_msg("%s: got status %d state %s actions %u delink %d '%s'; want "
                 "status %d state %s actions %u delink %d '%s'", what, st,
                 run_state_name(w.state), act, w.delink_pending, msg,
                 k->status, run_state_name(k->to), k->actions,
                 k->delink_pending, k->words);
    run_machine_set_error(&w, NULL);
}

static void test_every_state_and_command(void **unused)
{
    (void)unused;
    int seen[RUN_STATE_COUNT][4] = {{0}};
    for (size_t i = 0; i < sizeof cmd_table / sizeof cmd_table[0]; i++) {
        const cmd_case *k = &cmd_table[i];
        check_case_(k, make_(k->from, k->variant));
        seen[k->from][k->cmd] = 1;
    }
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        for (int c = 0; c < 4; c++)
            if (!seen[s][c])
                fail_msg("table misses %s + %s",
                         run_state_name((run_state)s), cmd_name_[c]);
}

/* In the real phase a delink is refused, in every live state but
 * stopping (which refuses it for its own reason). */
static void test_delink_in_real_phase(void **unused)
{
    (void)unused;
    const run_state live[] = {RUN_STARTING, RUN_RUNNING, RUN_PAUSING, RUN_PAUSED,
                                 RUN_RESUMING};
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
        char msg[512];
        unsigned act;
        run_machine w = run_machine_init(live[i]);
        w.real = 1;
        w.delink_step = 40;
        assert_int_equal(run_machine_command(&w, ID, CMD_DELINK, &act, msg,
                                             sizeof msg), M6_EBADSTATE);
        assert_string_equal(msg, "run 7 is already in the real phase "
                                 "(delinked at step 40)");
        assert_int_equal(w.state, live[i]);
        assert_int_equal(w.delink_pending, 0);

        w = run_machine_init(live[i]);
        w.real = 1; /* delink_step -1: trained from scratch */
        assert_int_equal(run_machine_command(&w, ID, CMD_DELINK, &act, msg,
                                             sizeof msg), M6_EBADSTATE);
        assert_string_equal(msg, "run 7 trains from scratch (pseudo.steps 0): "
                                 "it has no shared slots to delink");
        assert_int_equal(w.delink_pending, 0);
    }
}

/* Once m6d is stopping, every command to a live run is refused and changes
 * nothing; a queued run can still be taken out of the queue. */
static void test_commands_refused_while_m6d_stops(void **unused)
{
    (void)unused;
    for (int s = RUN_STARTING; s <= RUN_STOPPING; s++)
        for (int c = 0; c < 4; c++) {
            char msg[512], want[256];
            unsigned act = 99;
            run_machine w = run_machine_init((run_state)s);
            w.shutdown = 1;
            assert_int_equal(run_machine_command(&w, ID, (runner_cmd)c, &act, msg,
                                                 sizeof msg), M6_EBADSTATE);
            snprintf(want, sizeof want, "m6d is stopping: send the %s again "
                     "once it is back (`m6ctl watch 7` waits for it)",
                     cmd_name_[c]);
            assert_string_equal(msg, want);
            assert_int_equal(w.state, s);
            assert_int_equal(act, 0);
            assert_int_equal(w.delink_pending, 0);
        }
    run_machine q = run_machine_init(RUN_QUEUED);
    q.shutdown = 1;
    char msg[256];
    unsigned act;
    assert_int_equal(run_machine_command(&q, ID, CMD_STOP, &act, msg, sizeof msg),
                     M6_OK);
    assert_int_equal(q.state, RUN_STOPPED);
}

/* A run that paused on a failed write: what a command says it can keep. */
static void test_commands_after_a_failed_write(void **unused)
{
    (void)unused;
    char msg[2048];
    unsigned act;
    run_machine w = run_machine_init(RUN_PAUSED);
    run_machine_set_error(&w, "checkpoint failed: No space left on device");
    w.error_write = 1;
    assert_int_equal(run_machine_command(&w, ID, CMD_STOP, &act, msg, sizeof msg),
                     M6_OK);
    assert_string_equal(msg, "run 7 stops at the next step boundary, but its "
                        "last write failed (checkpoint failed: No space left "
                        "on device): the stop is final only once its "
                        "checkpoint and state are written; until then the "
                        "run stays paused");
    w = renew_(&w, run_machine_init(RUN_PAUSED));
    run_machine_set_error(&w, "disk full");
    w.error_write = 1;
    assert_int_equal(run_machine_command(&w, ID, CMD_DELINK, &act, msg, sizeof msg),
                     M6_OK);
    assert_string_equal(msg, "run 7 delinks now, at the step boundary it "
                        "is paused at; it stays paused; it takes effect in "
                        "memory, but may not be recorded: disk full");
    /* a resume's text is its answer: nothing added */
    assert_int_equal(run_machine_command(&w, ID, CMD_RESUME, &act, msg, sizeof msg),
                     M6_OK);
    assert_int_equal(act, RUN_ACT_RESUME_NEW);
    assert_string_equal(msg, "");
    /* bad data is no failed write: nothing added */
    w = renew_(&w, run_machine_init(RUN_PAUSED));
    run_machine_set_error(&w, "data.train: truncated");
    assert_int_equal(run_machine_command(&w, ID, CMD_STOP, &act, msg, sizeof msg),
                     M6_OK);
    assert_string_equal(msg, "run 7 stops at the next step boundary");
    run_machine_set_error(&w, NULL);
}

/* ------------------------------------------------------------------ events */

#define NO (-1) /* the event cannot happen in that state */

typedef struct {
    run_machine_event ev;
    int variant;
    int to[RUN_STATE_COUNT]; /* new state per state, NO: refused */
} ev_case;

/* columns: QUEUED STARTING RUNNING PAUSING PAUSED RESUMING STOPPING
 *          COMPLETED FAILED STOPPED */
static const ev_case ev_table[] = {
    {RUN_EV_STARTED, 0, {NO, RUN_RUNNING, NO, RUN_PAUSING, RUN_PAUSED, RUN_RESUMING,
                     RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_STEP_DONE, 0, {NO, NO, RUN_RUNNING, RUN_PAUSING, NO, NO, RUN_STOPPING,
                       NO, NO, NO}},
    {RUN_EV_EVAL_DONE, 0, {NO, NO, RUN_RUNNING, RUN_PAUSING, NO, NO, RUN_STOPPING,
                       NO, NO, NO}},
    {RUN_EV_CHECKPOINT, 0, {NO, NO, RUN_RUNNING, RUN_PAUSING, RUN_PAUSED, RUN_RESUMING,
                        RUN_STOPPING, NO, NO, NO}},
    /* resumed: only while a resume is tried */
    {RUN_EV_RESUMED, 0, {NO, NO, NO, NO, NO, NO, NO, NO, NO, NO}},
    {RUN_EV_RESUMED, V_TRIED, {NO, NO, NO, RUN_PAUSING, NO, RUN_RUNNING, RUN_STOPPING,
                           NO, NO, NO}},
    /* pausing itself: a stop or an untried resume stays acknowledged */
    {RUN_EV_DATA_ERROR, 0, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                        RUN_RESUMING, RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_DATA_ERROR, V_TRIED, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                              RUN_PAUSED, RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_WRITE_FAILED, 0, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                          RUN_RESUMING, RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_WRITE_FAILED, V_TRIED, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                                RUN_PAUSED, RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_CKPT_LOST, 0, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                       RUN_RESUMING, RUN_STOPPING, NO, NO, NO}},
    {RUN_EV_STOPPED, 0, {NO, NO, NO, NO, NO, NO, RUN_STOPPED, NO, NO, NO}},
    {RUN_EV_STOP_FAILED, 0, {NO, NO, NO, NO, NO, NO, RUN_PAUSED, NO, NO, NO}},
    {RUN_EV_COMPLETED, 0, {NO, NO, RUN_COMPLETED, RUN_COMPLETED, NO, NO, RUN_COMPLETED,
                       NO, NO, NO}},
    {RUN_EV_FAILED, 0, {NO, RUN_FAILED, RUN_FAILED, RUN_FAILED, RUN_FAILED, RUN_FAILED,
                    RUN_FAILED, NO, NO, NO}},
    {RUN_EV_SHUTDOWN, 0, {NO, RUN_STARTING, RUN_RUNNING, RUN_PAUSING, RUN_PAUSED,
                      RUN_RESUMING, RUN_STOPPING, NO, NO, NO}},
    /* non-finite steps: pausing itself, as a data error */
    {RUN_EV_BAD_STEPS, 0, {NO, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED, RUN_PAUSED,
                       RUN_RESUMING, RUN_STOPPING, NO, NO, NO}},
};

static void test_every_event_in_every_state(void **unused)
{
    (void)unused;
    int seen[RUN_MACHINE_NEVENTS] = {0};
    for (size_t i = 0; i < sizeof ev_table / sizeof ev_table[0]; i++) {
        const ev_case *k = &ev_table[i];
        seen[k->ev] = 1;
        for (int s = 0; s < RUN_STATE_COUNT; s++) {
            run_machine w = make_((run_state)s, k->variant);
            run_machine before = w;
            int rc = run_machine_on(&w, k->ev, "why");
            if (k->to[s] == NO) {
                if (rc != -1 || memcmp(&w, &before, sizeof w) != 0)
                    fail_msg("event %d in %s: accepted (rc %d, state %s)",
                             k->ev, run_state_name((run_state)s), rc,
                             run_state_name(w.state));
                run_machine_set_error(&w, NULL);
                continue;
            }
            if (rc != 0 || (int)w.state != k->to[s])
                fail_msg("event %d in %s%s: rc %d state %s, want %s", k->ev,
                         run_state_name((run_state)s),
                         k->variant ? " (resume tried)" : "", rc,
                         run_state_name(w.state),
                         run_state_name((run_state)k->to[s]));
            run_machine_set_error(&w, NULL);
        }
    }
    for (int e = 0; e < RUN_MACHINE_NEVENTS; e++)
        if (!seen[e]) fail_msg("event %d not in the table", e);
}

/* What the events leave besides the state. */
static void test_event_details(void **unused)
{
    (void)unused;
    run_machine w = make_(RUN_RESUMING, V_TRIED);
    assert_int_equal(run_machine_on(&w, RUN_EV_WRITE_FAILED, "disk full"), 0);
    assert_string_equal(w.error, "disk full");
    assert_int_equal(w.error_write, 1);
    assert_int_equal(w.resume_tried, 0); /* the try is over */

    w = renew_(&w, run_machine_init(RUN_RUNNING));
    assert_int_equal(run_machine_on(&w, RUN_EV_DATA_ERROR, "data.val: truncated"), 0);
    assert_string_equal(w.error, "data.val: truncated");
    assert_int_equal(w.error_write, 0);

    w = renew_(&w, make_(RUN_RESUMING, V_TRIED));
    assert_int_equal(run_machine_on(&w, RUN_EV_RESUMED, NULL), 0);
    assert_int_equal(w.resume_tried, 0);

    w = renew_(&w, run_machine_init(RUN_STOPPING));
    assert_int_equal(run_machine_on(&w, RUN_EV_STOP_FAILED, "stop not done (x)"), 0);
    assert_string_equal(w.error, "stop not done (x)");
    assert_int_equal(w.error_write, 1);

    w = renew_(&w, run_machine_init(RUN_RUNNING));
    assert_int_equal(run_machine_on(&w, RUN_EV_SHUTDOWN, NULL), 0);
    assert_int_equal(w.shutdown, 1);
    assert_int_equal(run_machine_trains(&w), 0);

    w = renew_(&w, run_machine_init(RUN_RUNNING));
    run_machine_delinked(&w, 25);
    assert_int_equal(w.real, 1);
    assert_int_equal(w.delink_step, 25);
    run_machine_set_error(&w, NULL);
}

/* At a step boundary the runner takes the commands: stop alone first;
 * else delink, pause, shutdown, resume. */
static void test_boundary(void **unused)
{
    (void)unused;
    run_machine w = run_machine_init(RUN_STOPPING);
    w.delink_pending = 1;
    run_machine_take t = run_machine_boundary(&w);
    assert_true(t.stop && !t.delink && !t.pause && !t.resume);
    assert_int_equal(w.state, RUN_STOPPING);
    assert_int_equal(w.delink_pending, 1); /* after the stop, if it fails */

    w = renew_(&w, run_machine_init(RUN_PAUSING));
    w.delink_pending = 1;
    t = run_machine_boundary(&w);
    assert_true(!t.stop && t.delink && t.pause && !t.resume && !t.shutdown);
    assert_int_equal(w.state, RUN_PAUSED);
    assert_int_equal(w.delink_pending, 0);

    w = renew_(&w, run_machine_init(RUN_RESUMING));
    run_machine_set_error(&w, "old reason");
    w.error_write = 1;
    t = run_machine_boundary(&w);
    assert_true(t.resume && !t.pause && !t.stop);
    assert_int_equal(w.state, RUN_RESUMING);
    assert_int_equal(w.resume_tried, 1);
    assert_string_equal(w.error, "");
    assert_int_equal(w.error_write, 0);
    t = run_machine_boundary(&w); /* tried already: not taken twice */
    assert_false(t.resume);

    w = renew_(&w, run_machine_init(RUN_RUNNING));
    t = run_machine_boundary(&w);
    assert_true(!t.stop && !t.delink && !t.pause && !t.resume && !t.shutdown);
    assert_int_equal(w.state, RUN_RUNNING);

    w = renew_(&w, run_machine_init(RUN_PAUSED));
    w.shutdown = 1;
    t = run_machine_boundary(&w);
    assert_true(t.shutdown && !t.pause);

    for (int s = RUN_COMPLETED; s <= RUN_STOPPED; s++) {
        w = run_machine_init((run_state)s);
        w.delink_pending = 1;
        t = run_machine_boundary(&w);
        assert_true(!t.stop && !t.delink && !t.pause && !t.resume);
    }
    run_machine_set_error(&w, NULL);
}

static void test_waits_trains_pending(void **unused)
{
    (void)unused;
    /* waits: paused with nothing to take */
    for (int s = 0; s < RUN_STATE_COUNT; s++) {
        run_machine w = run_machine_init((run_state)s);
        assert_int_equal(run_machine_waits(&w), s == RUN_PAUSED);
        assert_int_equal(run_machine_trains(&w), s == RUN_RUNNING);
    }
    run_machine w = run_machine_init(RUN_PAUSED);
    w.delink_pending = 1;
    assert_false(run_machine_waits(&w));
    w = renew_(&w, run_machine_init(RUN_PAUSED));
    w.shutdown = 1;
    assert_false(run_machine_waits(&w));

    static const char *const pending[RUN_STATE_COUNT] = {
        [RUN_QUEUED] = "", [RUN_STARTING] = "", [RUN_RUNNING] = "",
        [RUN_PAUSING] = "pausing", [RUN_PAUSED] = "", [RUN_RESUMING] = "resuming",
        [RUN_STOPPING] = "stopping", [RUN_COMPLETED] = "", [RUN_FAILED] = "",
        [RUN_STOPPED] = "",
    };
    for (int s = 0; s < RUN_STATE_COUNT; s++) {
        w = run_machine_init((run_state)s);
        assert_string_equal(run_machine_pending(&w), pending[s]);
    }
    for (int s = 0; s < RUN_STATE_COUNT; s++) {
        w = run_machine_init((run_state)s);
        assert_false(run_machine_delink_pending(&w));
    }
    w = renew_(&w, run_machine_init(RUN_RUNNING));
    w.delink_pending = 1;
    assert_string_equal(run_machine_pending(&w), "delinking");
    assert_true(run_machine_delink_pending(&w));
    w.state = RUN_PAUSING;
    assert_string_equal(run_machine_pending(&w), "delinking, pausing");
    assert_true(run_machine_delink_pending(&w));
    w.state = RUN_PAUSED;
    assert_string_equal(run_machine_pending(&w), "delinking");
    assert_true(run_machine_delink_pending(&w));
    w.state = RUN_STOPPING; /* the stop comes first: no delink to come */
    assert_string_equal(run_machine_pending(&w), "stopping");
    assert_false(run_machine_delink_pending(&w));
    w.state = RUN_STOPPED; /* ended: nothing pending */
    assert_string_equal(run_machine_pending(&w), "");
    assert_false(run_machine_delink_pending(&w));
    run_machine_set_error(&w, NULL);
}

/* A few sequences as the operator sends them. */
static void test_sequences(void **unused)
{
    (void)unused;
    char msg[512];
    unsigned act;
    /* pause, then resume before the boundary: cancelled, trains on */
    run_machine w = run_machine_init(RUN_RUNNING);
    run_machine_command(&w, ID, CMD_PAUSE, &act, msg, sizeof msg);
    run_machine_command(&w, ID, CMD_RESUME, &act, msg, sizeof msg);
    assert_int_equal(w.state, RUN_RUNNING);
    /* pause taken, resume, tried, pause during the try, try works: the
     * run pauses at the next boundary */
    w = renew_(&w, run_machine_init(RUN_RUNNING));
    run_machine_command(&w, ID, CMD_PAUSE, &act, msg, sizeof msg);
    run_machine_boundary(&w);
    assert_int_equal(w.state, RUN_PAUSED);
    assert_int_equal(run_machine_command(&w, ID, CMD_RESUME, &act, msg, sizeof msg),
                     M6_OK);
    assert_int_equal(act, RUN_ACT_RESUME_NEW);
    assert_true(run_machine_boundary(&w).resume);
    assert_int_equal(run_machine_command(&w, ID, CMD_PAUSE, &act, msg, sizeof msg),
                     M6_OK);
    assert_int_equal(w.state, RUN_PAUSING);
    assert_int_equal(run_machine_on(&w, RUN_EV_RESUMED, NULL), 0);
    assert_int_equal(w.state, RUN_PAUSING);
    assert_false(run_machine_trains(&w)); /* back to the boundary: the pause */
    assert_true(run_machine_boundary(&w).pause);
    assert_int_equal(w.state, RUN_PAUSED);
    /* stop that fails for want of space, then stop again */
    w = renew_(&w, run_machine_init(RUN_RUNNING));
    run_machine_command(&w, ID, CMD_STOP, &act, msg, sizeof msg);
    assert_true(run_machine_boundary(&w).stop);
    run_machine_on(&w, RUN_EV_STOP_FAILED, "stop not done (disk full)");
    assert_int_equal(w.state, RUN_PAUSED);
    assert_int_equal(run_machine_command(&w, ID, CMD_STOP, &act, msg, sizeof msg),
                     M6_OK);
    assert_non_null(strstr(msg, "but its last write failed"));
    assert_true(run_machine_boundary(&w).stop);
    assert_int_equal(run_machine_on(&w, RUN_EV_STOPPED, NULL), 0);
    assert_int_equal(w.state, RUN_STOPPED);
    run_machine_set_error(&w, NULL);
}

TEST_MAIN(
    cmocka_unit_test(test_every_state_and_command),
    cmocka_unit_test(test_delink_in_real_phase),
    cmocka_unit_test(test_commands_refused_while_m6d_stops),
    cmocka_unit_test(test_commands_after_a_failed_write),
    cmocka_unit_test(test_every_event_in_every_state),
    cmocka_unit_test(test_event_details),
    cmocka_unit_test(test_boundary),
    cmocka_unit_test(test_waits_trains_pending),
    cmocka_unit_test(test_sequences))
