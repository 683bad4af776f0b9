/*
 * run_machine.h — the life of a run as a state machine: its states, and one
 * transition per operator command and per event of the training loop.
 *
 * What moves a run from state to state (commands are the operator's; "at
 * the boundary" is the runner thread between two steps):
 *
 *   QUEUED    the runner takes it                    -> STARTING
 *   QUEUED    stop (dequeued)                        -> STOPPED
 *   STARTING  set up (data, model, checkpoint)       -> RUNNING
 *   RUNNING   pause                                  -> PAUSING
 *   PAUSING   at the boundary: the pause is written  -> PAUSED
 *   PAUSING   resume: the pause is cancelled         -> RUNNING
 *   PAUSED    resume                                 -> RESUMING
 *   RESUMING  pause before it was tried: cancelled   -> PAUSED
 *   RESUMING  at the boundary: tried, it works       -> RUNNING
 *   RESUMING  tried, data or a write still fails     -> PAUSED
 *   any live  stop                                   -> STOPPING
 *   STOPPING  at the boundary: written               -> STOPPED
 *   STOPPING  at the boundary: cannot be written     -> PAUSED
 *   RUNNING   the last step and its checkpoint done  -> COMPLETED
 *   any live  the trainer fails                      -> FAILED
 *   any live  data that cannot be read, a write that fails (disk full),
 *             no checkpoint that loads, train.max_bad_steps non-finite
 *             steps in a row: it pauses itself -> PAUSED
 *
 * A delink is a flag beside the state (delink_pending): acknowledged in
 * any live state but STOPPING while the run is pseudo, done at the next
 * boundary. Once m6d is stopping (shutdown), every command to the live run
 * is refused: the runner may be past its last boundary.
 *
 * Live states are those of the run the runner thread owns (STARTING to
 * STOPPING); QUEUED and the terminal states (COMPLETED, FAILED, STOPPED)
 * are runs in the state DB only. A command is acknowledged by the reply
 * and applied by the runner at its next step boundary
 * (run_machine_boundary), in the order stop, delink, pause, (shutdown),
 * resume.
 *
 * The transitions are pure: they read and write a `run_machine` value and
 * say what the caller must do (actions), nothing else, so they are tested
 * without a model or a thread (tests/unit/test_run_machine.c). runner.c
 * holds one `run_machine` under its mutex and does the actions.
 */
#ifndef M6_RUNNER_RUN_MACHINE_H
#define M6_RUNNER_RUN_MACHINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/run_state.h"
#include "runner/runner.h"

/* The states are common/run_state.h's run_state (RUN_QUEUED ...), the one
 * table of their names. */

/* Everything the transitions read and write. */
typedef struct {
    run_state state;
    int delink_pending; /* a delink acknowledged, done at the next boundary */
    int resume_tried;   /* the runner took a resume and is trying it now:
                         * a resume sent meanwhile joins its answer */
    int real;           /* the run is in the real phase */
    long delink_step;   /* the real phase's first step; -1 never delinked
                         * (still pseudo, or trained from scratch) */
    int shutdown;       /* m6d is stopping: commands are refused */
    char *error;        /* why the run paused itself, whole; "" none. Never
                         * NULL (run_machine_init); set with run_machine_set_error */
    int error_write;    /* ... a write failed (not bad data or a lost
                         * checkpoint): a command may hold only in memory */
    m6_code error_code; /* ... its kind, for the operator's next step:
                         * M6_EDATA or M6_ENOFILE for data, M6_EBADSTATE
                         * otherwise (set by the caller with the event) */
} run_machine;

/* The state machine of a run in state s: no flags, pseudo, no error. */
run_machine run_machine_init(run_state s);

/* Set m->error to a copy of reason (NULL or "": none), freeing the one it
 * held. Out of memory: "out of memory (keeping why the run paused)". */
void run_machine_set_error(run_machine *m, const char *reason);

/* What runner_command must do after run_machine_command (bits). */
enum {
    RUN_ACT_RESUME_NEW = 1 << 0,  /* take a new resume ticket and wait for it */
    RUN_ACT_RESUME_JOIN = 1 << 1, /* wait for the answer of the resume being
                              * tried (no new ticket) */
    RUN_ACT_RESUME_CANCEL = 1 << 2, /* answer the resumes not yet tried: "a
                                * pause was sent after it" */
    RUN_ACT_DEQUEUE = 1 << 3,     /* take the queued run out of the queue */
};

/* The answer to command cmd for run id while m6d is stopping, into msg
 * (status M6_EBADSTATE): the runner may be past its last boundary, so an
 * acknowledgement could not be kept. */
void run_machine_stopping_msg(int64_t id, runner_cmd cmd, char *msg, size_t len);

/* Operator command cmd for run id in m's state: the new state into *m,
 * the reply's status (M6_OK: acknowledged), what to do into *actions,
 * the reply's text into msg ("run 3 pauses at the next step boundary",
 * "run 3 is already paused", ...; for RUN_ACT_RESUME_* the text is the resume's
 * answer, written by the caller once it came). msglen: at least
 * strlen(m->error) + 512, so a reply that quotes the error is never cut.
 * Never fails otherwise. */
m6_code run_machine_command(run_machine *m, int64_t id, runner_cmd cmd,
                            unsigned *actions, char *msg, size_t msglen);

/* The commands the runner applies at a step boundary, in this order. */
typedef struct {
    int stop, delink, pause, shutdown, resume;
} run_machine_take;

/* Event: the runner is at a step boundary. Takes the commands acknowledged
 * since the last one: PAUSING -> PAUSED (then the pause is written),
 * RESUMING -> resume_tried (the error and its code are cleared: the try
 * says anew),
 * a pending delink, STOPPING (stays until RUN_EV_STOPPED or RUN_EV_STOP_FAILED). */
run_machine_take run_machine_boundary(run_machine *m);

/* Whether the runner thread sleeps until a command: paused with nothing
 * to take. */
int run_machine_waits(const run_machine *m);

/* Whether the runner runs a step now (after its boundary): RUNNING only;
 * any other live state goes back to the boundary first. */
int run_machine_trains(const run_machine *m);

/* Events of the training loop (runner thread). */
typedef enum {
    RUN_EV_STARTED,       /* setup done: STARTING -> RUNNING */
    RUN_EV_STEP_DONE,     /* a step trained and recorded: no change */
    RUN_EV_EVAL_DONE,     /* its validation pass done: no change */
    RUN_EV_CHECKPOINT,    /* a checkpoint written ("every", "pause"): no change */
    RUN_EV_RESUMED,       /* the resume taken worked: RESUMING -> RUNNING (a
                       * pause or stop sent during the try stays) */
    /* The run pauses itself: -> PAUSED with the reason, except that a stop,
     * or a resume not yet tried, stays acknowledged (done at the next
     * boundary). A resume being tried fails with it. */
    RUN_EV_DATA_ERROR,    /* a shard could not be read (reason) */
    RUN_EV_WRITE_FAILED,  /* a checkpoint or state DB write failed, e.g. disk
                       * full (reason): commands may then hold only in
                       * memory (their reply says so) */
    RUN_EV_CKPT_LOST,     /* no checkpoint loads (reason) */
    RUN_EV_STOPPED,       /* the stop written: STOPPING -> STOPPED */
    RUN_EV_STOP_FAILED,   /* it could not be (reason): -> PAUSED */
    RUN_EV_COMPLETED,     /* the last step's checkpoint and state written */
    RUN_EV_FAILED,        /* the trainer failed: -> FAILED */
    RUN_EV_SHUTDOWN,      /* SIGTERM/SIGINT/SIGHUP: m6d stops; the run stays
                       * as recorded (resumes or stays paused next start) */
    RUN_EV_BAD_STEPS,     /* train.max_bad_steps non-finite steps in a row
                       * (reason): it pauses itself, as for a data error */
} run_machine_event;

#define RUN_MACHINE_NEVENTS 14

/* Apply event ev (reason: the error for the pausing events, else NULL) to
 * *m. Returns 0, or -1 (m unchanged) when ev cannot happen in m's state
 * (e.g. RUN_EV_STOPPED while RUNNING): a bug in the caller. */
int run_machine_on(run_machine *m, run_machine_event ev, const char *reason);

/* The delink was done at step (event): real phase from step. */
void run_machine_delinked(run_machine *m, long step);

/* The command acknowledged and not yet applied, for status ("pausing",
 * "resuming", "stopping", "delinking", or two of them joined by ", " in
 * the order applied: "delinking, pausing"); "" none. */
const char *run_machine_pending(const run_machine *m);

/* Whether a delink is acknowledged and not yet applied (run_machine_pending
 * then says "delinking"): 1 or 0. Read this, not the text. */
int run_machine_delink_pending(const run_machine *m);

/* Whether the run trains (for the ETA): RUNNING or PAUSING. */
int run_machine_is_training(const run_machine *m);

/* Whether the run holds still (PAUSED, RESUMING, or a stop of a run that
 * paused itself): status says paused. */
int run_machine_is_paused(const run_machine *m);

#endif /* M6_RUNNER_RUN_MACHINE_H */
