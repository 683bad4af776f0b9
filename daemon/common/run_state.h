/*
 * run_state.h — the states of a run, the one type and the one table of
 * their names inside m6. The run's state machine (runner/run_machine.h)
 * moves a run through all ten; m6.db records six of them (runs.state holds
 * their names: "queued", "running", ...) and the protocol sends the same
 * six (proto/m6.proto RunState, by number; 0 is its RUN_STATE_UNSPECIFIED).
 *
 * The other four are transient: a command acknowledged or a set-up under
 * way, done at the runner thread's next step boundary. While a run is in
 * one, m6.db keeps the recorded state the run was in before (STARTING:
 * queued, or running or paused as the last m6d left it; PAUSING, RESUMING
 * and STOPPING: running or paused), and the boundary writes the next one;
 * status reports the transient state as a pending command (m6.proto
 * RunInfo.pending).
 *
 * The names and numbers are the ones m6.db files and m6ctl already hold:
 * they never change (tests/unit/test_run_state.c checks them against
 * m6.proto's descriptor and the literal names).
 */
#ifndef M6_RUN_STATE_H
#define M6_RUN_STATE_H

typedef enum {
    RUN_QUEUED = 0, /* waiting in the queue (not the runner's yet) */
    RUN_STARTING,   /* transient: the runner sets it up (data, model,
                     * checkpoint) */
    RUN_RUNNING,    /* training */
    RUN_PAUSING,    /* transient: a pause acknowledged, done at the next
                     * boundary */
    RUN_PAUSED,     /* not training: by a pause, or paused itself (error) */
    RUN_RESUMING,   /* transient: a resume acknowledged; the runner tries it
                     * at its next boundary (reopen data, owed writes),
                     * answered once tried */
    RUN_STOPPING,   /* transient: a stop acknowledged, done at the next
                     * boundary */
    RUN_COMPLETED,  /* terminal: trained to train.steps */
    RUN_FAILED,     /* terminal: bad spec, the trainer failed */
    RUN_STOPPED,    /* terminal: stopped by the operator */
} run_state;

#define RUN_STATE_COUNT 10

/* "queued", "starting", "running", ...: the name m6.db stores for a
 * recorded state, and the one logs and replies use; "unknown" for a value
 * out of range. */
const char *run_state_name(run_state s);

/* The state named name (any of the ten), or -1 (NULL included). */
int run_state_parse(const char *name);

/* 1 when m6.db records s (and the protocol sends it), 0 for a transient
 * state or a value out of range. */
int run_state_recorded(run_state s);

/* m6.proto's RunState number for s: 1..6 for a recorded state, 0
 * (RUN_STATE_UNSPECIFIED) for a transient one or a value out of range. */
int run_state_wire(run_state s);

/* The recorded state whose m6.proto RunState number is n, or -1 (0,
 * UNSPECIFIED, included). */
int run_state_from_wire(int n);

#endif /* M6_RUN_STATE_H */
