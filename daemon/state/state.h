/*
 * state.h — m6d's SQLite state (m6.db): runs, phases, metrics, events,
 * checkpoints. WAL mode, busy timeout, migrations from schema/ recorded in
 * PRAGMA user_version. One connection, used by the runner from the loop
 * and the runner thread; every call is serialized by a mutex and every write
 * is one short transaction, so concurrent readers (sqlite3 m6.db 'select')
 * never see "database is locked".
 *
 * Return convention: 0 ok, 1 not found (where said), -1 database error (the
 * error is logged with the statement, file:line and SQLite's message).
 *
 * Other writers. Another process may hold m6.db's write lock (an operator's
 * `sqlite3 m6.db` in BEGIN IMMEDIATE, a backup tool): a write then meets
 * SQLITE_BUSY. Two kinds of write take that differently:
 *   - step records ("held" below: metrics rows with the run's progress,
 *     events, checkpoint rows, phases, the delink step, a self-pause) never
 *     wait: after a 100 ms try they are held in memory, in order, and a
 *     flusher thread writes them in one transaction once the lock goes
 *     (0 is returned: written or held). state_hold_overdue says when they
 *     have been held past the hold limit, for the caller to pause the run.
 *   - state changes the caller must know are recorded (a run inserted, a
 *     state set, metrics truncated) wait for the lock in 100 ms slices,
 *     the mutex let go between (reads and step records go on), for 30 s or
 *     the hold limit if shorter, the held records written first; then -1,
 *     state_last_error saying the lock.
 * Any other error (disk full) is -1 at once, as before: nothing is held.
 */
#ifndef M6_STATE_H
#define M6_STATE_H

#include <stddef.h>
#include <stdint.h>
#include "common/phase.h"   /* run_phase, phase_name, phase_parse */
#include "common/run_state.h" /* run_state: runs.state holds the recorded
                                * ones' names */

typedef struct state state;

/* The ranks whose loss paused a run across nodes (schema 0013): node_id
 * the nodes table's row (0: none known), hostname its name then; rank
 * the first global rank lost, local_rank its local rank on that node,
 * ranks how many went (1: one rank; a whole node: all of its ranks, local
 * ranks local_rank .. local_rank + ranks - 1); why the cause as the
 * coordinator heard it (a rank's error, "connection closed"). Only
 * node_id, rank, local_rank and ranks are stored; hostname and why are
 * for the pause's reason. */
typedef struct {
    int64_t node_id;
    char hostname[256];
    int rank, local_rank, ranks;
    char why[512];
} run_lost;

typedef struct {
    int64_t id;
    char name[256];
    char *spec;         /* malloc'd by state_run_get only; run_row_clear frees */
    run_state state;    /* a recorded one (run_state_recorded) */
    int phase;          /* 0 pseudo, 1 real */
    int64_t step, total_steps;
    double created, updated;
    char *error;        /* why it failed or paused itself, whole; NULL none
                         * (malloc'd: run_row_clear, run_rows_free) */
    int64_t delink_step; /* the real phase's first step; -1 (NULL) never
                          * delinked: pseudo, or trained from scratch */
    /* The spec's fields list and status show, stored at submit (schema
     * 0009, run_summary). have_summary 0: a row from before it (NULL
     * columns): read them from the spec. */
    int have_summary;
    int64_t pseudo_steps;     /* pseudo.steps */
    int64_t device_budget;    /* device.memory_budget, bytes; 0 none */
    char backend[8];          /* device.backend: "cpu", "cuda" */
    char delink_policy[16];   /* delink.policy: "step", "plateau" */
    /* The layout (schema 0015): nodes.world_size and
     * nodes.expert_parallel, as submitted or as the latest resume at
     * another layout set them; 0 both: a row from before it (read them
     * from the spec). */
    int world_size, expert_parallel;
    /* The arithmetic (schema 0016): spec_precision's and
     * optimizer.master's names, "fp32" or "bf16"; "" both: a row from
     * before it (read them from the spec). */
    char precision[8], master_precision[8];
    run_lost lost;            /* lost.node_id 0: none (NULL columns);
                               * hostname and why empty (not stored) */
} run_row;

/* What state_run_insert stores beside the spec (run_row's fields of the
 * same names); strings are copied, at most 7 and 15 bytes kept. */
typedef struct {
    int64_t pseudo_steps, device_budget;
    const char *backend, *delink_policy;
    int world_size, expert_parallel;
    const char *precision, *master_precision;
} run_summary;

typedef struct {
    int64_t step;
    int phase;
    double train_loss, val_loss;  /* val_loss NAN when NULL */
    double lr, tokens_per_s, grad_norm;
    /* Offloading figures (schema 0002, units as m6.proto's MetricRow).
     * Integers -1 and reals NAN are stored as NULL and read back so. */
    int resident_slots, offloaded_slots;
    int64_t peak_device_bytes;
    double h2d_gbps, d2h_gbps, copy_hidden_fraction;
    /* MoE router figures (schema 0005; trainer.h step_moe): NAN (NULL)
     * for a dense model */
    double moe_aux_loss, moe_z_loss, moe_dropped_fraction;
    double moe_load_min, moe_load_max, moe_load_cv, moe_experts_empty;
    /* The whole step's per-expert figures (schema 0014; trainer.h
     * step_moe's step_* and experts_idle): -1 (NULL) for a dense model,
     * rows from before the migration, and moe_experts_idle when
     * train.expert_idle_steps is 0 */
    int64_t moe_step_tokens_min, moe_step_tokens_max;
    int64_t moe_step_experts_empty, moe_step_dropped, moe_experts_idle;
    /* Non-finite steps (schema 0007; trainer.h step_result): the update
     * of this step was skipped; the run's skipped steps up to this one.
     * 0 in rows from before the migration. */
    int skipped;
    int64_t skipped_total;
    /* speculative host AdamW (schema 0008): 1 redone, 0 kept, -1 (NULL)
     * the step did not speculate */
    int offload_redo_steps;
} metric_row;

typedef struct {
    int64_t step;
    char path[1024];
    int64_t bytes;
} ckpt_row;

/* How long step records may be held while another process holds m6.db's
 * write lock before the run is paused (state_hold_overdue), by default. */
#define STATE_HOLD_LIMIT_DEFAULT_S 600.0

/* Open (create) the database at path and apply pending migrations. */
state *state_open(const char *path, char *err, size_t errlen);
void state_close(state *st);
int state_user_version(state *st);

/* Runs. A run inserted with an empty name is named "run-<id>". sum: the
 * spec's summary columns; NULL leaves them NULL (read back as
 * have_summary 0). */
int64_t state_run_insert(state *st, const char *name, const char *spec,
                         int64_t total_steps, int phase,
                         const run_summary *sum);
/* Free rows of state_run_list (n of them) and what each holds. */
void run_rows_free(run_row *rows, int n);
int state_run_get(state *st, int64_t id, run_row *out);  /* 0, 1, -1 */
void run_row_clear(run_row *r);
/* The run named name: the one queued, running or paused if there is
 * exactly one, else the only one (a spec submitted again after its run
 * was stopped names the new run). 0 found (*id set), 1 none, 2 several
 * live ones, or no live one and several ended ones, -1 error. ids (idslen
 * bytes, at least 32): with 2, their ids in order, "3, 5" (cut with
 * ", ..." when they do not fit); else "" or the one found. */
int state_run_find_name(state *st, const char *name, int64_t *id,
                        char *ids, size_t idslen);
/* All runs by id, spec not loaded. *rows malloc'd, caller frees. */
int state_run_list(state *st, run_row **rows, int *n);
/* Ids of runs in state s, ascending (submit order). */
int state_run_ids(state *st, run_state s, int64_t **ids, int *n);
int state_run_set_state(state *st, int64_t id, run_state s, const char *error);
/* The ranks whose loss paused run id (run_lost; NULL or node_id 0: none,
 * the columns cleared). Held (see the top): 0 written or held, -1 another
 * error. */
int state_run_set_lost(state *st, int64_t id, const run_lost *l);
/* Replace run id's spec (canonical JSON) and its summary columns (sum,
 * that spec's) and record the event kind with detail, in one transaction;
 * before (NULL: none) is kept as the spec to put back should m6d stop
 * before the change is settled (state_run_settle_spec; schema 0017).
 * 0, 1 no such run, -1 error. */
int state_run_set_spec(state *st, int64_t id, const char *spec,
                       const run_summary *sum, const char *kind,
                       const char *detail, const char *before);
/* The change of run id's spec is settled: its spec_before dropped. 0 or
 * -1. */
int state_run_settle_spec(state *st, int64_t id);
/* Runs whose spec change was never settled (an m6d stopped between the
 * change and its answer): ids and the specs to put back. *rows malloc'd,
 * each spec_before malloc'd; the caller frees both. 0 or -1. */
typedef struct {
    int64_t id;
    char *spec_before;
} run_unsettled;
int state_run_unsettled(state *st, run_unsettled **rows, int *n);
/* The same as a held record (never waits for another writer's lock; 0
 * written or held, -1 another error): for the run's own pause for an error,
 * recorded as soon as m6.db can take it, in order with the step records. */
int state_run_set_state_held(state *st, int64_t id, run_state s,
                             const char *error);
int state_run_set_progress(state *st, int64_t id, int64_t step, int phase);
/* The step at which the run delinked (schema 0004); -1 stores NULL (never
 * delinked). Held (see the top). 0 (written or held), 1 no such run (known
 * only when written at once), -1 error. */
int state_run_set_delink(state *st, int64_t id, int64_t step);

/* Phases: INSERT OR REPLACE (run, phase) from_step. */
int state_phase_set(state *st, int64_t run, int phase, int64_t from_step);
int state_phase_get(state *st, int64_t run, int phase, int64_t *from_step);
int state_phase_delete(state *st, int64_t run, int phase);

/* One step done: the metrics row and the run's step/phase, one transaction.
 * Held (see the top): 0 written or held, -1 another error. Progress, phases,
 * events and checkpoint rows are held the same way. */
int state_record_step(state *st, int64_t run, const metric_row *m);
int state_metrics_truncate(state *st, int64_t run, int64_t after_step);
/* A run's metrics rows with step > after_step, ascending, all of them;
 * *rows malloc'ed (free it), *n of them. 0, or -1 (database error). */
int state_metrics_list(state *st, int64_t run, int64_t after_step,
                       metric_row **rows, int *n);
/* The same, at most max rows (max < 0: no limit): one page of a client
 * that pages with after_step = the last step it got. */
int state_metrics_page(state *st, int64_t run, int64_t after_step, int max,
                       metric_row **rows, int *n);
/* Latest row (1 if none); *last_val = newest non-NULL val_loss or NAN. */
int state_metric_last(state *st, int64_t run, metric_row *out,
                      double *last_val);

/* run 0: a daemon-wide event (run NULL). */
int state_event(state *st, int64_t run, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One row of the events table (time: unix seconds). */
typedef struct {
    int64_t id;
    double time;
    char kind[64];
    char *detail;       /* whole (malloc'd: event_rows_free) */
} event_row;

/* Free rows of state_events_list (n of them) and their details. */
void event_rows_free(event_row *rows, int n);

/* A run's events with id > after_id, oldest first, at most max of them;
 * *rows malloc'ed (free it), *n of them. 0, or -1 (database error). */
int state_events_list(state *st, int64_t run, int64_t after_id, int max,
                      event_row **rows, int *n);

int state_checkpoint_add(state *st, int64_t run, int64_t step,
                         const char *path, int64_t bytes);
int state_checkpoint_delete(state *st, int64_t run, int64_t step);
/* Ascending by step. */
int state_checkpoints_list(state *st, int64_t run, ckpt_row **rows, int *n);

/* The hold limit in seconds (m6d --db-hold-limit; <= 0: the default). */
void state_set_hold_limit(state *st, double seconds);

/* A shorter bound (seconds) for the waited writes made on the calling
 * thread: m6d's event loop thread, which answers every client, waits at
 * most this long (5 s, the busy timeout it had before) for another
 * writer's lock; other threads wait the 30 s. < 0: no bound of its own. */
void state_thread_wait_limit(double seconds);

/* Records held in memory now (0 none); *age_s (may be NULL) how long the
 * oldest has waited, in seconds. */
int state_held(state *st, double *age_s);

/* At most this many records are held (a few hundred bytes each) before
 * state_hold_overdue says so, whatever the hold limit: fast steps on a
 * long lock must not eat the host's memory. */
#define STATE_HELD_MAX 500000

/* 1 when records have been held longer than the hold limit, or
 * STATE_HELD_MAX of them, msg set (why, how many, what to do: for the
 * run's pause); 0 otherwise. */
int state_hold_overdue(state *st, char *msg, size_t len);
/* ---- The command log (schema 0007): acknowledged means recorded. */

/* One acknowledged command not applied yet. */
typedef struct {
    int64_t id, run;
    char kind[16];      /* "pause", "resume", "delink", "stop" */
} command_row;

/* Record command kind ("pause", "resume", "delink", "stop", "submit") for
 * run: pending, or applied (applied 1: done already, e.g. a submit, whose
 * run row is the effect; step its step). The commit is synced to disk
 * (synchronous FULL) before this returns, and with it everything written
 * before on this connection (a submit's run row): call it before the reply
 * that acknowledges the command. The row id (> 0), or -1. */
int64_t state_command_add(state *st, int64_t run, const char *kind,
                          int applied, int64_t step);

/* run's pending commands, oldest first; *rows malloc'd (NULL: none). 0 or
 * -1. */
int state_commands_pending(state *st, int64_t run, command_row **rows,
                           int *n);

/* Which pending commands a mark takes: all, the delinks only, or all but
 * the delinks (the state machine's: pause, resume, stop). */
enum { STATE_CMD_ALL = 0, STATE_CMD_DELINK = 1, STATE_CMD_NOT_DELINK = 2 };

/* Mark run's pending commands with id <= upto applied at step. 0 or -1. */
int state_commands_mark(state *st, int64_t run, int64_t upto, int64_t step);

/* Remove command id: it was recorded, then not acknowledged after all
 * (refused when applied). 0 or -1. */
int state_command_drop(state *st, int64_t id);

/* What one command's effect writes, in one transaction with marking the
 * run's pending commands up to cmd_upto applied (0: none): all of it, or
 * nothing, is in m6.db after a crash. */
typedef struct {
    int set_state;          /* runs.state := state, runs.error := error */
    run_state state;    /* a recorded one (run_state_recorded) */
    const char *error;
    int delink;             /* the real phase from step: the phases row,
                             * runs.delink_step, runs.step and phase */
    const char *event_kind; /* an event (NULL: none) with event_detail */
    const char *event_detail;
    int64_t step;           /* the run's step now */
    int64_t cmd_upto;
    int cmd_kinds;          /* STATE_CMD_*: which of them */
} state_commit;

/* 0, or -1 (rolled back; database error). */
int state_commit_run(state *st, int64_t run, const state_commit *c);

/* SQLite's message for the latest failed statement ("database or disk is
 * full"), for errors shown to the operator. */
void state_last_error(state *st, char *buf, size_t len);

/* ------------------------------------------------------------------ nodes
 * The coordinator's node registry (schema 0006, daemon/cluster/). */

typedef enum { NODE_JOINING = 0, NODE_LIVE, NODE_LOST, NODE_LEFT } node_state;

const char *node_state_name(node_state s);  /* "joining", "live", ... */

typedef struct {
    int64_t id;
    char hostname[256];
    char node_uuid[64];
    int coordinator;          /* role 'coordinator': this m6d itself */
    char backend[16];
    int devices;
    uint64_t memory, free_device_memory;  /* bytes */
    node_state state;
    int64_t run;              /* current run; 0 none */
    int rank;                 /* -1 none */
    char address[96];         /* peer address it joined from; "" none */
    char detail[256];         /* why lost or left; "" none */
    double last_heartbeat, joined, updated;  /* unix seconds */
    char gemm[64];            /* its CPU GEMM, "LIBRARY ISA"; "" unknown
                               * (schema 0010) */
    char secret_sha256[65];   /* SHA-256 (hex) of its node secret; "" none
                               * (schema 0011, coordinator.h) */
    int ranks;                /* ranks it holds in run: rank .. rank +
                               * ranks - 1; 0 none (schema 0012) */
} node_row;

/* Insert a node in state (hostname and node_uuid unique; run none,
 * last_heartbeat = joined = updated = now). *id set. 0, or -1 (error,
 * a duplicate hostname or uuid included: check with state_node_find
 * first). */
int state_node_insert(state *st, const node_row *n, int64_t *id);
/* Overwrite node id's hostname, uuid, role, backend, devices, memory,
 * free memory, state, address, detail, gemm and secret_sha256 from n (a reconnect, or a node
 * taking over a lost one's hostname); last_heartbeat and updated = now.
 * 0, 1 no such node, -1 error. */
int state_node_update(state *st, int64_t id, const node_row *n);
/* One node by hostname (by is 'h') or by uuid ('u'): 0 found, 1 none,
 * -1 error. */
int state_node_find(state *st, char by, const char *key, node_row *out);
/* The node's state and why (detail NULL: none); updated = now. 0, 1 none,
 * -1 error. */
int state_node_set_state(state *st, int64_t id, node_state s,
                         const char *detail);
/* A heartbeat: last_heartbeat = now, free device memory; a joining node
 * becomes live. 0, 1 none, -1 error. */
int state_node_heartbeat(state *st, int64_t id, uint64_t free_device_memory);
/* Every node in state from (joining or live) other than the coordinator
 * becomes to, with detail: at a coordinator's start its previous life's
 * nodes are lost until they reconnect. The number changed, or -1. */
int state_nodes_mark(state *st, node_state from, node_state to,
                     const char *detail);
/* Wiring (dp.h): node id's current run and its rank there (run 0: none,
 * rank then NULL too). 0, 1 no such node, -1 error. */
int state_node_set_run(state *st, int64_t id, int64_t run, int rank);
/* The same for a node holding ranks consecutive ranks of run from rank
 * (m6d --devices: one per device). 0, 1 no such node, -1 error. */
int state_node_set_ranks(state *st, int64_t id, int64_t run, int rank,
                         int ranks);
/* Every node of run: run and rank none. 0, or -1. */
int state_nodes_clear_run(state *st, int64_t run);
/* Every node: run and rank none. At a coordinator's start: no assignment
 * outlives the coordinator that made it (its rendezvous store starts
 * empty), and a run it takes up assigns its ranks again. 0, or -1. */
int state_nodes_clear_runs(state *st);
/* All nodes by id; *rows malloc'd (free it). 0, or -1. */
int state_nodes_list(state *st, node_row **rows, int *n);

#endif /* M6_STATE_H */
