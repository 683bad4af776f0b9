/*
 * run_ckpts.h — the checkpoints of runs: each run's step-N directories under
 * <state-dir>/runs/<id>/checkpoints and their rows in m6.db's checkpoints
 * table, kept in step with each other.
 *
 * A checkpoint is complete once its directory has its final name
 * (trainer_save renames <dir>.tmp-<pid>); *.tmp-* leftovers of an
 * interrupted save are removed at reconcile. A directory the DB missed is
 * adopted; a row whose directory is gone is kept while its run may train
 * again (run_ckpts_restore: the run goes on from an older checkpoint, or
 * pauses) and dropped once it has ended; a checkpoint that does not load is
 * set aside as <dir>.bad (never adopted again).
 *
 * Threads: only the runner thread, or runner_init before it
 * starts (it walks directories and writes the state DB).
 */
#ifndef M6_RUNNER_RUN_CKPTS_H
#define M6_RUNNER_RUN_CKPTS_H

#include <stddef.h>
#include <stdint.h>

#include "state/state.h"
#include "train/trainer.h"

typedef struct {
    state *st;
    const char *runs_dir;  /* <state-dir>/runs */
} run_ckpts;

/* "<runs_dir>/<run>/checkpoints" into buf. */
void run_ckpts_dir(const run_ckpts *s, int64_t run, char *buf, size_t len);

/* Whether a checkpoint's directory (a row's path) is on disk: 1 when a
 * directory is there, else 0 (gone, something else there, or m6d may not
 * look). What pruning counts toward `keep` and what `m6ctl checkpoints`
 * shows as ON DISK. */
int run_ckpts_on_disk(const char *path);

/* For every run in the DB: remove *.tmp-* leftovers (event
 * checkpoint.stray), add complete step-N dirs the DB missed (a crash
 * between rename and insert); a row whose directory is gone is logged
 * (checkpoint.missing) and kept for a running or paused run, dropped for
 * an ended one (event checkpoint.missing); one that m6d may not look at,
 * EACCES or EIO, is kept and logged. */
void run_ckpts_reconcile(const run_ckpts *s);

/* Write t's state as the checkpoint of its current step (why: "every",
 * "pause", "stop", "end", "shutdown"; in the event and the log), record it,
 * then keep only the newest `keep` (>= 1; 0 means 1) whose directories
 * are there (a gone one's row stays, not counted). 0 with *bytes the
 * size written; -1 with *err saying what failed, whole (mkdir, the write,
 * or the DB row: then the directory is removed too, so disk and DB agree);
 * the caller frees it. A stale directory of the same step (a trajectory
 * left behind) is replaced. */
int run_ckpts_save(const run_ckpts *s, int64_t run, trainer *t, int keep,
                   const char *why, m6_err *err);

/* Set a checkpoint that does not load aside as <path>.bad (then .bad-2,
 * ...), *kept the name it now has (path itself when the rename failed). */
void run_ckpts_quarantine(const char *path, char *kept, size_t keptlen);

/* Load the newest checkpoint of run that loads into *t, newest first; one
 * that does not is set aside (run_ckpts_quarantine, event checkpoint.bad)
 * and its row dropped, and *t is made again fresh from spec (a failed load
 * may have half-filled it): with data_rc (not NULL) by
 * trainer_create_resumable, which sets *data_rc and err anew, else by
 * trainer_create. *step: the loaded step, -1 when none loaded.
 * A checkpoint whose directory is gone is skipped, not set aside: when an
 * older one loads, the run goes on from it and each gone one newer than it
 * has its row dropped with an event (checkpoint.missing); when none loads,
 * every row is kept (the directories may be put back). forget_gone (the
 * operator's resume --from-scratch) first drops the rows of the gone ones
 * (event checkpoint.forgotten each).
 * Returns 0; 1 when checkpoints existed but none loaded: *lost (code
 * M6_ENOCKPT) then says "no checkpoint of run N loads: checkpoint of step
 * S does not load (<why>; kept as <path>), nor does any older one" (what
 * the operator can do is the edge's to add); 1 too when the run has no
 * checkpoint row but set-aside ones (step-N.bad: every one failed to load
 * in an earlier life), data_rc is not NULL (a resumable run) and
 * forget_gone is 0 (the operator has not said to start over); 2 when a checkpoint's
 * directory is gone and none older loads: *lost (code M6_ECKPTGONE) names
 * the directory (the run's checkpoint directory when it is gone whole) and
 * the steps, *t is fresh and nothing in m6.db changed but the rows of
 * older checkpoints that did not load; -1 with *err when no trainer could
 * be made (*t is then NULL). The caller frees *err and *lost. */
int run_ckpts_restore(const run_ckpts *s, int64_t run, const run_spec *spec,
                      trainer **t, int *data_rc, long *step, int forget_gone,
                      m6_err *err, m6_err *lost);

#endif /* M6_RUNNER_RUN_CKPTS_H */
