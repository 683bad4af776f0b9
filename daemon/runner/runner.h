/*
 * runner.h — the runner: the node's run driver. Run queue, phase policy,
 * and the runner thread that drives the trainer. The only writer of the
 * state DB.
 *
 * One run trains at a time; queued runs start in submit order. The runner
 * thread owns the trainer and acts on operator commands (pause, resume,
 * delink, stop) and on the phase policy only at step boundaries. The policy
 * lives here and nowhere else: delink before the step that would take the
 * run past spec.pseudo.steps, or (delink.policy plateau) at the boundary
 * after the validation pass where the pseudo phase plateaus (DESIGN.md
 * "Phase policy: plateau"), or at the next boundary after `m6ctl delink`.
 *
 * Threads: runner_submit/runner_command/runner_eta are called from the control
 * server's threads (libuv's loop and thread pool) and never wait on a
 * training step (they take a mutex held only for flag updates), so the
 * control socket answers mid-step.
 */
#ifndef M6_RUNNER_H
#define M6_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "http/stats.h"
#include "state/state.h"
#include "train/trainer.h"

typedef struct runner runner;

/* Data parallelism across nodes (issue 14, the wiring): how the runner
 * thread gets the collectives group of a run whose world size (the
 * current phase's, spec_world_of_phase) is above 1. This m6d is rank 0;
 * daemon/cluster/dp.h implements it on the coordinator (rank assignment
 * over the node registry, the rendezvous through its store).
 *
 * group(): called from the runner thread between steps, with the trainer
 * as it stands (its config, share map and spec are what the ranks'
 * hashes cover). 1: *out is the group (world ranks, this m6d rank 0),
 * the caller owns it; 0: not enough live nodes yet, why says so ("waiting
 * for 2 live nodes, have 1"; the caller retries later); -1: the group
 * failed (why names the cause: a rank's hash, a rendezvous timeout), the
 * caller retries later. ungroup(): the run holds no group any more (its
 * nodes' run and rank are cleared). lost(): the run's group failed; which
 * ranks were lost (run_lost: node, rank, local rank), waiting a bounded
 * time for word of it: 1 with *out, 0 none known. Each may be NULL (no
 * coordinator). */
typedef struct {
    int (*group)(void *ud, int64_t id, const run_spec *spec, trainer *t,
                 int world, m6_coll **out, char *why, size_t len);
    void (*ungroup)(void *ud, int64_t id);
    int (*lost)(void *ud, int64_t id, const run_spec *spec, run_lost *out);
    void *ud;
} runner_dist;

typedef struct {
    state *st;
    const char *runs_dir;  /* <state-dir>/runs */
    int threads;           /* --threads: device.threads for new runs, 0 keeps */
    int rank_threads;      /* --devices N > 1: rank 0's share of the cores,
                            * device.threads for new runs across nodes
                            * instead of threads; 0 none */
    int coordinator;       /* --role coordinator: runs of nodes.world_size
                            * > 1 can be grouped; else refused at submit */
    const char *worker_of; /* --join HOST:PORT: this m6d is a worker of that
                            * coordinator and trains only its ranks: a
                            * submit or a resume of a run of its own is
                            * refused; NULL none (copied) */
    http_stats *stats;     /* each step's figures for /metrics; NULL none */
    const runner_dist *dist; /* runs across nodes; NULL: world size 1 only
                             * (kept by pointer: the caller's) */
    /* Testing seam (tests/fuzz/fuzz_dispatch.c): no runner thread and no
     * active run. Nothing trains; commands see every run as the DB has it
     * (a queued run can be stopped, others are refused), so the request
     * handlers run against a state DB without the trainer. m6d never sets
     * it (0: the runner starts as always). */
    int no_thread;
} runner_config;



typedef enum { CMD_PAUSE, CMD_RESUME, CMD_DELINK, CMD_STOP } runner_cmd;

/* Recover (clean stray *.tmp-* checkpoint dirs, reconcile the checkpoints
 * table with the disk), pick the run to resume, start the runner thread. */
runner *runner_init(const runner_config *cfg, char *err, size_t errlen);

/* Ask the runner to stop after its current step: it checkpoints the active
 * run and leaves it running/paused in the DB, so the next start resumes it. */
void runner_request_shutdown(runner *c);

/* Request shutdown, join the runner, free. */
void runner_fini(runner *c);

/* Validate and enqueue a spec (JSON text). Validation reads every shard
 * (seconds for a large corpus); when *cancel (may be NULL; read atomically)
 * is set by then -- the client disconnected, m6d is stopping -- nothing is
 * queued (M6_ECANCELLED). *id and *name on success (code M6_OK, msg "run
 * N queued"); else M6_EINVALID (msg names the spec key or the data glob)
 * or M6_EINTERNAL (the state DB; m6d out of file descriptors). Free the
 * result with m6_err_free. */
m6_err runner_submit(runner *c, const char *json, size_t len, const int *cancel,
                     int64_t *id, char *name, size_t namelen);

/* Operator command; takes effect at the next step boundary. The result's
 * msg says what happened or why not (M6_ENOTFOUND, M6_EBADSTATE,
 * M6_EINTERNAL); free it with m6_err_free. A resume of a paused run waits
 * (up to 10 s) for the runner to try it: the data a pause was for is
 * reopened, the writes owed are done; if that fails the run stays paused
 * and M6_EBADSTATE says why. So call it for a resume only off the event
 * loop (the thread pool). flags: RUNNER_FROM_SCRATCH with CMD_RESUME of
 * the active run paused because its checkpoints are gone (M6_ECKPTGONE):
 * it trains again from step 0 (its init.from, if any), the rows of the
 * gone checkpoints and its metrics rows dropped and its old delink not
 * replayed, each said in an event;
 * refused (M6_EBADSTATE, nothing done) for any other command or run. A
 * resume replayed from the command log after a crash is a plain one. */
enum { RUNNER_FROM_SCRATCH = 1 };
m6_err runner_command(runner *c, int64_t id, runner_cmd cmd, unsigned flags);

/* m6ctl resume RUN [--world-size N [--expert-parallel P]]
 * [--memory-budget SIZE|none]: the paused run id continues from its
 * newest checkpoint at nodes.world_size world (0: its own; then ep 0 too)
 * and nodes.expert_parallel ep (0: the run's own where it divides world,
 * else 1; nodes.pseudo_world_size dropped where it is above world), under
 * device.memory_budget budget bytes (0: its own, -1: none). The new spec
 * is checked as a submit's (errors name the key; trainer_check_spec: the
 * data, and the memory plan at that layout and budget, a budget below the
 * model's minimum refused with the planner's figures), written to m6.db with a "layout" event naming
 * what changed, then the run is resumed (runner_command CMD_RESUME: its
 * answer); the boundary that takes that resume sets the run up again from
 * m6.db (spec and newest checkpoint, whose hash leaves the layout, the
 * budget and offload.* out). M6_EBADSTATE for a run that is not paused,
 * M6_EINVALID for a layout or budget refused (the run stays paused as it
 * was). Off the event loop, as a resume. */
m6_err runner_resume_at(runner *c, int64_t id, int world, int ep,
                        int64_t budget);

/* Seconds left for the active run (-1 if id isn't active or unknown). */
double runner_eta(runner *c, int64_t id);

/* The active run's offloading figures (m6.proto RunInfo fields of the same
 * names and units), as the runner sampled them with trainer_offload_stats()
 * after the run's latest step (or when it took the run, or delinked it).
 * Rates and the hidden fraction are the latest step's own (counter deltas
 * over that step); NAN when that step copied nothing or before the first
 * step. Without a budget: every slot resident, device bytes = the plan's
 * peak for the current phase, no copies. */
typedef struct {
    int resident_slots, offloaded_slots;
    int64_t device_bytes_in_use, peak_device_bytes, device_budget_bytes;
    double h2d_gbps, d2h_gbps, copy_hidden_fraction;
    int64_t offload_redo_steps;  /* redone speculative steps since the
                                  * trainer started; -1 not speculating */
} runner_offload;

/* 0 with *out filled when id is the active run and the runner has sampled
 * it; 2 when it is active and its placement is being set up (no sample
 * yet, or a resume at another budget or layout dropped the old one); 1
 * when it is not active. Never waits on a step (copies under the lock). */
int runner_offload_get(runner *c, int64_t id, runner_offload *out);

/* Why the active run paused itself (a checkpoint or state DB write failed,
 * its data could not be read, no checkpoint loads), held in memory so
 * status shows it even when the DB cannot record it; *code its kind
 * (M6_EDATA, M6_ENOFILE: the data; M6_ENOCKPT: no checkpoint loads;
 * M6_ECKPTGONE: they are gone; M6_EBADSTATE otherwise), for the operator's next step. 0: none (or id
 * is not active); 1: *msg set (malloc'd, whole: free it), run not paused
 * yet; 2: *msg set, run paused; -1: out of memory. */
int runner_run_error(runner *c, int64_t id, char **msg, m6_code *code);

/* The command acknowledged for the active run and not yet applied at a
 * step boundary: "pausing", "resuming", "delinking", "stopping", or two
 * joined in the order they apply ("delinking, pausing"); "" none or id is
 * not active (m6.proto RunInfo.pending). recorded: the run's state as
 * m6.db has it (the caller's row): while the runner has paused (resumed)
 * in memory and m6.db still says running (paused), the pause (resume) is
 * not recorded yet and is still reported as pending. */
void runner_pending(runner *c, int64_t id, run_state recorded, char *buf,
                    size_t len);

/* The step at which an acknowledged delink of run id not yet applied
 * (the "delinking" of runner_pending, as a fact) takes place: the
 * boundary the run is paused or delinking at, or the one after the step
 * it is training; -1 when none is pending (or id is not active). */
long runner_delink_pending(runner *c, int64_t id);

/* One line for sd_notify STATUS= ("run 3 step 40/60 pseudo" or "idle"). */
void runner_describe(runner *c, char *buf, size_t len);

#endif /* M6_RUNNER_H */
