/*
 * runner_internal.h — what the runner's files share, private to
 * daemon/runner/: the runner's state (struct runner), one run's context
 * on the runner thread (run_ctx), and the helpers one file calls in
 * another. runner.c owns the runner thread's loop (set-up, the step, the
 * writes it owes, the group across nodes); runner_restore.c taking a run
 * up from its checkpoint; runner_commands.c the operator's
 * commands, from the server thread that sends one to the boundary that
 * applies it; runner_policy.c the phase policy (when to delink) and the
 * bad-steps pause. runner.h is the interface.
 */
#ifndef M6_RUNNER_INTERNAL_H
#define M6_RUNNER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "runner/run_ckpts.h"
#include "runner/runner.h"
#include "runner/run_machine.h"
#include "dist/collectives.h"
#include "spec/spec.h"
#include "train/trainer.h"

struct runner {
    state *st;
    char runs_dir[3072];
    int threads;
    int rank_threads;      /* runner_config.rank_threads */
    int coordinator;
    char worker_of[256];   /* runner_config.worker_of; "" none */
    int in_step;           /* under mu: the runner is inside a step (1) or
                            * at a boundary whose step active_step is (0) */
    long delinking_at;     /* under mu: the step of a delink a boundary
                            * took and has not yet published (status shows
                            * it pending); -1 none */
    http_stats *stats;     /* /metrics (http/stats.h), NULL none */
    const runner_dist *dist; /* runs across nodes (runner.h), NULL none */
    int step_delay_ms;     /* test hook M6_TEST_STEP_DELAY_MS (runner_init) */
    run_ckpts ckpts;      /* the runs' checkpoints (runner/run_ckpts.h) */

    pthread_t thread;
    int thread_started;

    /* Everything below is guarded by mu; the runner waits on cv. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shutdown;
    int64_t active;       /* run the runner owns, 0 none */
    run_machine machine;       /* its state machine (run_machine.h) */
    long active_step, active_total;
    double step_s_ema;    /* seconds per step, for the ETA */
    /* A resume is answered once the runner has tried it: the data reopened
     * and the writes owed done, or the reason it stays paused. Tickets:
     * each resume sent takes one (asked); the runner, taking the command,
     * serves every ticket up to resume_serving and, done, answers them
     * (answered). A resume sent while one is being tried joins it. */
    long resume_asked, resume_serving, resume_answered;
    char *resume_error;      /* the last answer, malloc'd: NULL it resumed */
    m6_code resume_code;     /* ... its code: M6_OK, M6_EDATA, M6_ENOFILE
                              * or M6_EBADSTATE */
    long resume_step;        /* ... the step it resumed at (its answer) */
    int64_t relayout;        /* runner_resume_at changed this run's spec:
                              * the boundary that takes its resume sets the
                              * run up again from m6.db (0: none) */
    int64_t resuming_at;     /* the run a runner_resume_at is changing and
                              * resuming now (0: none): one at a time */
    int offload_valid;    /* offload holds a sample of the active run */
    runner_offload offload;
    /* The command log (state.h, schema 0007): cmd_last is the newest
     * command of the active run recorded and applied to machine (under mu); a
     * boundary takes every command up to it. cmd_mu (taken before mu)
     * serializes commands, so they are recorded in the order they are
     * applied, without holding mu over the database write. */
    int64_t cmd_last;
    pthread_mutex_t cmd_mu;
    /* under mu: the active run's checkpoints are gone (run_ctx's, for the
     * commands), and the resume ticket sent with --from-scratch (0 none) */
    int ckpts_gone;
    long scratch_ticket;
    /* tests: while this file exists the runner holds at its step boundary
     * (M6_TEST_HOLD_BOUNDARY), "" none */
    char hold_path[1024];
};


typedef struct {
    runner *c;
    int64_t id;
    run_spec spec;
    trainer *t;
    long last_ckpt;   /* step of the newest checkpoint, -1 none */
    /* No checkpoint to go on from (run_ckpts_restore's code): 2 its
     * checkpoint directories are gone and none older loads, 1 every one
     * failed to load (set aside as .bad); 0 neither. While set: paused,
     * the trainer fresh and unsaved, m6.db as recorded (step and phase
     * below, for status; no metrics row dropped) until a resume finds them
     * back (2) or starts over (1, or 2 with --from-scratch;
     * runner_retake_). */
    int ckpts_gone;
    long gone_step;
    int gone_real;
    int64_t recorded_delink; /* runs.delink_step when it was taken up */
    int dropped;             /* metrics rows the take-up dropped */
    /* Writes owed at this step boundary, retried before the next step: a
     * metrics row the DB refused, a checkpoint that could not be written. */
    int metric_pending;
    metric_row pending;
    const char *ckpt_owed;  /* the checkpoint's why, NULL none */
    /* A shard could not be read (truncated or rewritten under the run): the
     * run paused; before the next step the data is opened again and the
     * pending row's validation pass, if that is what failed, is redone. */
    int data_error, eval_owed;
    m6_code data_code;      /* while data_error: M6_EDATA or M6_ENOFILE */
    long replay_delink;     /* an operator delink to replay at this step
                             * (recorded, then m6d restarted), -1 none */
    int64_t cmd_upto;       /* the commands this boundary took: up to this
                             * id (c->cmd_last at run_machine_boundary) */
    int64_t cmd_marked;     /* marked applied in m6.db up to this id */
    runner_offload off;     /* latest placement, published to c->offload */
    /* delink.policy plateau: the pseudo phase's validation passes so far,
     * in step order (from m6.db's rows at set-up, then as they come):
     * best[i] the least loss of passes 0..i, val the newest loss */
    double *best;
    int n_evals, cap_evals;
    double val;
    int plateau_seed_owed;  /* the passes before this life not read yet */
    double flops_per_token; /* model FLOPs per training token (MFU) */
    /* Across nodes (runner_dist): the run's group while it trains with
     * one, the phase it was made for, and the last reason it could not
     * be made (said once per change). */
    m6_coll *coll;
    run_phase coll_phase;
    /* split state in a group (spec_state_split: optimizer.shard,
     * nodes.expert_parallel): this boundary's agreement with the other
     * ranks (trainer_sync_boundary, runner_sync_) is done: 0 not yet, 1
     * done with the state left split, 2 done and gathered (whole).
     * lost: a collective failed; the group is no more, the trainer may
     * hold only its part: nothing is saved, the runner rebuilds the run
     * from its last checkpoint. */
    int synced, lost;
    char dist_why[512];
    double dist_retry_at;  /* CLOCK_MONOTONIC s: after a failed group,
                            * the next try (nodes.timeout later) */
    /* per rank (outlier_n of them): the step of its last grad.outlier
     * report (0 none) and its outlier steps since, unreported
     * (GRAD_OUTLIER_REPORT_STEPS) */
    long *outlier_at, *outlier_quiet;
    int outlier_n;
} run_ctx;

/* ---- runner.c: the run's records (all on the runner thread) */

/* Save the trainer at its step (once per step). 0, or -1 with err: the
 * run keeps its last good checkpoint. */
int runner_checkpoint_(run_ctx *r, const char *why, m6_err *err);

/* An event of the run's state machine (run_machine.h); takes mu. */
void runner_on_(runner *c, run_machine_event ev, const char *reason);

/* What status shows of the trainer: its step and phase (takes mu). */
void runner_publish_(run_ctx *r);

/* Publish the run's placement now (set-up, after a delink). */
void runner_offload_sample_(run_ctx *r);

/* The run pauses itself for ev (a data error, a write that failed, ...):
 * in memory first, then in m6.db, with reason; one error line. */
void runner_pause_error_(run_ctx *r, run_machine_event ev, const char *reason);

/* runner_pause_error_ for a pause whose model is sound (bad data, steps
 * whose updates were skipped): first the boundary's writes and a checkpoint
 * of the model at this step ("pause", as a plain pause takes), so that a
 * crash before the operator's fix trains no step again. A write that fails
 * is logged; the run then keeps its last checkpoint. */
void runner_pause_saved_(run_ctx *r, run_machine_event ev, const char *reason);

/* err = "what: state DB: <SQLite's message>" (M6_EINTERNAL). */
void runner_db_error_(run_ctx *r, const char *what, m6_err *err);

/* Do the writes owed at this boundary (a metrics row, a checkpoint). 0,
 * or -1 with err; what failed stays owed. */
int runner_flush_(run_ctx *r, m6_err *err);

/* Everything a boundary owes before the next step: the plateau policy's
 * passes from m6.db, data to reopen and its validation pass, then
 * runner_flush_. 0; -1 with err (still owed); 1 a command interrupted the
 * pass again. redo 0: a pass owed with the data sound waits. */
int runner_owed_(run_ctx *r, int redo, m6_err *err);

/* The run failed (what: the stage, err: why): recorded, with an event. */
void runner_fail_run_(run_ctx *r, const char *what, const char *err);

/* The step and phase status shows: the trainer's, or while the
 * checkpoints are gone the recorded ones. */
long runner_step_(const run_ctx *r);

/* trainer_set_eval_interrupt's function (ud: the runner). */
int runner_eval_interrupt_(void *ud);

/* The code of a data error (TRAINER_EDATA or TRAINER_ENOFILE). */
m6_code runner_data_code_(int rc);

/* ---- runner_restore.c: taking a run up from its checkpoint */

/* Load the newest checkpoint of r's run that loads into r->t
 * (run_ckpts_restore; from_scratch: its forget_gone) and make m6.db agree
 * with it: metrics past it dropped (r->dropped), phases and progress set
 * to it. *data_rc and err as run_ckpts_restore's (data_rc unused when
 * was_queued); then the opened shards are checked against the checkpoint
 * (trainer_check_data: *data_rc, err). Sets r->ckpts_gone (and the
 * runner's). Returns run_ckpts_restore's: 0; 1 none loads (*lost,
 * M6_ENOCKPT) and 2 gone (*lost, M6_ECKPTGONE), m6.db untouched by both
 * (the resume that starts over drops the rows); -1 with err, r->t NULL. */
int runner_take_up_(run_ctx *r, int was_queued, int from_scratch,
                    int *data_rc, m6_err *err, m6_err *lost);

/* At a resume of a run whose checkpoints were gone or failed to load
 * (r->ckpts_gone; else 0 at once): take it up again, from them if they
 * are back, from step 0 when every one had failed to load (event
 * resume.start_over; the metrics rows dropped then, not before) or when
 * the resume being tried was sent with --from-scratch (event
 * resume.from_scratch; the recorded delink dropped, event
 * delink.forgotten). 0 taken up; -1 with err (M6_ECKPTGONE still gone,
 * M6_ENOCKPT back but none loads, a data error with r->data_error set;
 * r->t NULL: no trainer could be made). */
int runner_retake_(run_ctx *r, m6_err *err);

/* ---- runner_dist.c: the group across nodes (runner thread) */

/* The boundary's agreement of a group whose state is split
 * (spec_state_split; trainer_sync_boundary), once per boundary: whole 1
 * before a save, a delink or leaving the group (every rank sends rank 0
 * its part: the optimizer state's range, its experts, so rank 0's state
 * is whole), 0 right before a step. No-op (0) out of a group, once done,
 * or when the state is not split. -1 with err when a rank failed: r->lost
 * is set, nothing may be saved, the caller pauses with err and the runner
 * rebuilds the run from its last checkpoint. */
int runner_sync_(run_ctx *r, int whole, m6_err *err);

/* The group's failure e, for the pause's reason (into buf): what failed
 * ("in the step"), and with sharded state the checkpoint the run goes
 * back to. */
void runner_lost_why_(run_ctx *r, const char *what, const m6_err *e,
                      char *buf, size_t len);

/* Leave the run's group (if any): the trainer trains alone again, the
 * other ranks' collectives fail at once and they free their trainers. */
void runner_dist_drop_(run_ctx *r, const char *why);

/* Before a step: a run whose current phase has world size W > 1 trains
 * only in a group of W ranks. 1: train now; 0: not yet (the reason is an
 * event and the run's error in status, once per change). */
int runner_dist_ready_(run_ctx *r);

/* ---- runner_commands.c: commands taken at a boundary (runner thread) */

/* Mark the commands this boundary took (r->cmd_upto) applied in m6.db. */
void runner_commands_done_(run_ctx *r);

/* Tests (M6_TEST_HOLD_BOUNDARY): hold the boundary while the file is
 * there; a file holding a step count N holds only the boundaries after
 * step N or later (step: the run's steps done). */
void runner_test_hold_(runner *c, long step);

/* Stop: everything written, then stopped (1); else the run pauses with
 * the reason and a later stop retries (0). */
int runner_stop_(run_ctx *r);

/* Pause (the state machine is PAUSED already): the writes owed, a
 * checkpoint, the state. */
void runner_pause_(run_ctx *r);

/* m6d stops: checkpoint, leave the run as recorded. resume: a resume was
 * taken at this boundary and is answered that m6d is stopping. */
void runner_interrupted_(run_ctx *r, int resume);

/* Try the resume taken at this boundary and answer the resumes waiting. */
int runner_resume_(run_ctx *r);
/* At start, before any run is taken up: the runs whose spec a resume at
 * another layout or budget changed and that m6d never answered (it
 * stopped in between: spec_before set) keep the new spec where the
 * resume itself was recorded (the command log replays it), and get their
 * old spec back where it was not; a "layout" event says which. */
void runner_settle_specs_(runner *c);

/* With mu held, for the run just taken up: the commands acknowledged and
 * not applied before m6d stopped, applied to its state machine again. */
void runner_replay_commands_locked_(runner *c);

/* ---- runner_reports.c: what a step reports beyond its metrics */

/* A step at which experts reached train.expert_idle_steps steps without a
 * token (res->moe.idle_new > 0): a moe.expert_idle event and a
 * run.expert_idle log line naming the first of them, once per expert
 * until it processes a token again. */
void runner_report_idle_experts_(run_ctx *r, const step_result *res);

/* ---- runner_policy.c: when the run delinks; the bad-steps pause */

/* delink.policy plateau: note a validation pass of the pseudo phase. */
void runner_plateau_note_(run_ctx *r, double val_loss);

/* delink.policy plateau at set-up: the pseudo phase's passes so far from
 * m6.db (once). 0, or -1 with err (the run pauses). */
int runner_plateau_seed_(run_ctx *r, m6_err *err);

/* Delink now; reason (spec, plateau, operator, replay) goes in the event. */
void runner_delink_(run_ctx *r, const char *reason);

/* Before a step: delink if the spec's pseudo.steps, the plateau rule or
 * a replayed operator delink says so. */
void runner_phase_policy_(run_ctx *r);

/* train.max_bad_steps non-finite steps in a row: the run pauses itself. */
void runner_bad_steps_pause_(run_ctx *r, const step_result *res);

#endif /* M6_RUNNER_INTERNAL_H */
