/*
 * worker.h — the life of a run as a state machine: its states, and one
 * transition per operator command and per event of the training loop.
 *
 * What moves a run from state to state (commands are the operator's; "at
 * the boundary" is the worker thread between two steps):
 *
 *   QUEUED    the worker takes it                    -> STARTING
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
 * is refused: the worker may be past its last boundary.
 *
 * Live states are those of the run the worker thread owns (STARTING to
 * STOPPING); QUEUED and the terminal states (COMPLETED, FAILED, STOPPED)
 * are runs in the state DB only. A command is acknowledged by the reply
 * and applied by the worker at its next step boundary (worker_boundary),
 * in the order stop, delink, pause, (shutdown), resume.
 *
 * The transitions are pure: they read and write a `worker` value and say
 * what the caller must do (actions), nothing else, so they are tested
 * without a model or a thread (tests/unit/test_worker.c). runner.c holds one
 * `worker` under its mutex and does the actions.
 */
#ifndef M6_RUNNER_WORKER_H
#define M6_RUNNER_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "runner/runner.h"

typedef enum {
    W_QUEUED = 0, /* waiting in the queue (not the worker's yet) */
    W_STARTING,   /* the worker sets it up: data, model, checkpoint */
    W_RUNNING,    /* training */
    W_PAUSING,    /* a pause acknowledged, done at the next boundary */
    W_PAUSED,     /* not training: by a pause, or paused itself (error) */
    W_RESUMING,   /* a resume acknowledged; the worker tries it at its
                   * next boundary (reopen data, owed writes), answered
                   * once tried */
    W_STOPPING,   /* a stop acknowledged, done at the next boundary */
    W_COMPLETED,  /* terminal: trained to train.steps */
    W_FAILED,     /* terminal: bad spec, the trainer failed */
    W_STOPPED,    /* terminal: stopped by the operator */
} worker_state;

#define WORKER_NSTATES 10

const char *worker_state_name(worker_state s);

/* Everything the transitions read and write. */
typedef struct {
    worker_state state;
    int delink_pending; /* a delink acknowledged, done at the next boundary */
    int resume_tried;   /* the worker took a resume and is trying it now:
                         * a resume sent meanwhile joins its answer */
    int real;           /* the run is in the real phase */
    long delink_step;   /* the real phase's first step; -1 never delinked
                         * (still pseudo, or trained from scratch) */
    int shutdown;       /* m6d is stopping: commands are refused */
    char *error;        /* why the run paused itself, whole; "" none. Never
                         * NULL (worker_init); set with worker_set_error */
    int error_write;    /* ... a write failed (not bad data or a lost
                         * checkpoint): a command may hold only in memory */
    m6_code error_code; /* ... its kind, for the operator's next step:
                         * M6_EDATA or M6_ENOFILE for data, M6_EBADSTATE
                         * otherwise (set by the caller with the event) */
} worker;

/* The worker of a run in state s: no flags, pseudo, no error. */
worker worker_init(worker_state s);

/* Set w->error to a copy of reason (NULL or "": none), freeing the one it
 * held. Out of memory: "out of memory (keeping why the run paused)". */
void worker_set_error(worker *w, const char *reason);

/* What runner_command must do after worker_command (bits). */
enum {
    WA_RESUME_NEW = 1 << 0,  /* take a new resume ticket and wait for it */
    WA_RESUME_JOIN = 1 << 1, /* wait for the answer of the resume being
                              * tried (no new ticket) */
    WA_RESUME_CANCEL = 1 << 2, /* answer the resumes not yet tried: "a
                                * pause was sent after it" */
    WA_DEQUEUE = 1 << 3,     /* take the queued run out of the queue */
};

/* The answer to command cmd for run id while m6d is stopping, into msg
 * (status M6_EBADSTATE): the worker may be past its last boundary, so an
 * acknowledgement could not be kept. */
void worker_stopping_msg(int64_t id, runner_cmd cmd, char *msg, size_t len);

/* Operator command cmd for run id in w's state: the new state into *w,
 * the reply's status (M6_OK: acknowledged), what to do into *actions,
 * the reply's text into msg ("run 3 pauses at the next step boundary",
 * "run 3 is already paused", ...; for WA_RESUME_* the text is the resume's
 * answer, written by the caller once it came). msglen: at least
 * strlen(w->error) + 512, so a reply that quotes the error is never cut.
 * Never fails otherwise. */
m6_code worker_command(worker *w, int64_t id, runner_cmd cmd,
                            unsigned *actions, char *msg, size_t msglen);

/* The commands the worker applies at a step boundary, in this order. */
typedef struct {
    int stop, delink, pause, shutdown, resume;
} worker_take;

/* Event: the worker is at a step boundary. Takes the commands acknowledged
 * since the last one: PAUSING -> PAUSED (then the pause is written),
 * RESUMING -> resume_tried (the error and its code are cleared: the try
 * says anew),
 * a pending delink, STOPPING (stays until WE_STOPPED or WE_STOP_FAILED). */
worker_take worker_boundary(worker *w);

/* Whether the worker thread sleeps until a command: paused with nothing
 * to take. */
int worker_waits(const worker *w);

/* Whether the worker runs a step now (after its boundary): RUNNING only;
 * any other live state goes back to the boundary first. */
int worker_trains(const worker *w);

/* Events of the training loop (worker thread). */
typedef enum {
    WE_STARTED,       /* setup done: STARTING -> RUNNING */
    WE_STEP_DONE,     /* a step trained and recorded: no change */
    WE_EVAL_DONE,     /* its validation pass done: no change */
    WE_CHECKPOINT,    /* a checkpoint written ("every", "pause"): no change */
    WE_RESUMED,       /* the resume taken worked: RESUMING -> RUNNING (a
                       * pause or stop sent during the try stays) */
    /* The run pauses itself: -> PAUSED with the reason, except that a stop,
     * or a resume not yet tried, stays acknowledged (done at the next
     * boundary). A resume being tried fails with it. */
    WE_DATA_ERROR,    /* a shard could not be read (reason) */
    WE_WRITE_FAILED,  /* a checkpoint or state DB write failed, e.g. disk
                       * full (reason): commands may then hold only in
                       * memory (their reply says so) */
    WE_CKPT_LOST,     /* no checkpoint loads (reason) */
    WE_STOPPED,       /* the stop written: STOPPING -> STOPPED */
    WE_STOP_FAILED,   /* it could not be (reason): -> PAUSED */
    WE_COMPLETED,     /* the last step's checkpoint and state written */
    WE_FAILED,        /* the trainer failed: -> FAILED */
    WE_SHUTDOWN,      /* SIGTERM/SIGINT/SIGHUP: m6d stops; the run stays
                       * as recorded (resumes or stays paused next start) */
    WE_BAD_STEPS,     /* train.max_bad_steps non-finite steps in a row
                       * (reason): it pauses itself, as for a data error */
} worker_event;

#define WORKER_NEVENTS 14

/* Apply event ev (reason: the error for the pausing events, else NULL) to
 * *w. Returns 0, or -1 (w unchanged) when ev cannot happen in w's state
 * (e.g. WE_STOPPED while RUNNING): a bug in the caller. */
int worker_on(worker *w, worker_event ev, const char *reason);

/* The delink was done at step (event): real phase from step. */
void worker_delinked(worker *w, long step);

/* The command acknowledged and not yet applied, for status ("pausing",
 * "resuming", "stopping", "delinking", or two of them joined by ", " in
 * the order applied: "delinking, pausing"); "" none. */
const char *worker_pending(const worker *w);

/* Whether a delink is acknowledged and not yet applied (worker_pending
 * then says "delinking"): 1 or 0. Read this, not the text. */
int worker_delink_pending(const worker *w);

/* Whether the run trains (for the ETA): RUNNING or PAUSING. */
int worker_is_training(const worker *w);

/* Whether the run holds still (PAUSED, RESUMING, or a stop of a run that
 * paused itself): status says paused. */
int worker_is_paused(const worker *w);

#endif /* M6_RUNNER_WORKER_H */
