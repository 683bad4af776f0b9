/*
 * runner_restore.c — taking a run up from its checkpoint, on the runner
 * thread: the newest checkpoint that loads (runner/run_ckpts.c) and m6.db
 * made to agree with it (metrics past it dropped, phases and progress set
 * to it); and a run with no checkpoint to go on from (their directories
 * gone with none older to load, or every one failing to load), held paused
 * with its rows and metrics untouched until the operator puts them back,
 * starts it over (a resume when none loads; `m6ctl resume --from-scratch`
 * when they are gone) or stops it.
 */
#include "runner/runner_internal.h"

#include <math.h>
#include <stdio.h>

#include "common/log.h"

/* Make the state DB agree with the trainer a run resumes from (its
 * checkpoint's step and phase): metrics past the checkpoint are redone;
 * an operator delink recorded at a step not reached yet is kept and
 * replayed at that step (r->replay_delink); runs.delink_step is where this
 * trajectory delinked. Returns state_metrics_truncate's count (-1: the
 * rows could not be dropped). */
static int align_tables_(run_ctx *r, int was_queued, int64_t recorded_delink)
{
    runner *c = r->c;
    int64_t id = r->id;
    long step = trainer_step_count(r->t);
    int phase = trainer_phase(r->t) == PHASE_REAL;
    int dropped = state_metrics_truncate(c->st, id, step);
    int64_t from;
    if (phase == 0 && state_phase_get(c->st, id, 1, &from) == 0) {
        if (from >= step)
            r->replay_delink = (long)from;
        else
            state_phase_delete(c->st, id, 1);
    }
    if (state_phase_get(c->st, id, r->spec.pseudo.steps > 0 ? 0 : 1, &from) == 1)
        state_phase_set(c->st, id, r->spec.pseudo.steps > 0 ? 0 : 1, 0);
    state_run_set_progress(c->st, id, step, phase);
    /* runs.delink_step says where the trajectory we resume from delinked
     * (-1: it has not, or it trains from scratch); a delink recorded past
     * the checkpoint is recorded again when it is replayed */
    if (recorded_delink != trainer_delink_step(r->t))
        state_run_set_delink(c->st, id, trainer_delink_step(r->t));
    /* Steps between the last row m6.db has and the checkpoint: their
     * records were held in memory (m6.db locked by another process) when
     * m6d ended, while the checkpoint made it to disk (adopted by
     * run_ckpts_reconcile). They are not trained again: said, not
     * silent. */
    if (!was_queued && step > 0) {
        metric_row last;
        double last_val;
        int lr = state_metric_last(c->st, id, &last, &last_val);
        long first_missing = lr == 1 ? 1 : lr == 0 ? (long)last.step + 1 : 0;
        if (first_missing > 0 && first_missing <= step) {
            log_warn("metrics.gap", "run=%lld steps=%ld-%ld cause=\"their "
                     "records were held in memory (m6.db locked) when m6d "
                     "ended; the checkpoint at step %ld was kept\"",
                     (long long)id, first_missing, step, step);
            state_event(c->st, id, "metrics.gap", "steps %ld-%ld have no "
                        "metrics rows: their records were held in memory "
                        "(m6.db locked by another process) when m6d ended; "
                        "training goes on from the checkpoint at step %ld",
                        first_missing, step, step);
        }
    }
    /* A step whose training went through but whose validation pass could
     * not read the data (its row, the newest left, has no val_loss) owes
     * that pass: redone before the next step, as in the life that paused
     * on it. */
    if (!was_queued && step > 0 && trainer_step_evaluates(r->t, step)) {
        metric_row last;
        double last_val;
        if (state_metric_last(c->st, id, &last, &last_val) == 0 &&
            last.step == step && isnan(last.val_loss)) {
            r->pending = last;
            r->eval_owed = r->data_error = 1;
            r->data_code = M6_EDATA;
        }
    }
    return dropped;
}

int runner_take_up_(run_ctx *r, int was_queued, int from_scratch,
                    int *data_rc, m6_err *err, m6_err *lost)
{
    runner *c = r->c;
    int rc = run_ckpts_restore(&c->ckpts, r->id, &r->spec, &r->t,
                               was_queued ? NULL : data_rc, &r->last_ckpt,
                               from_scratch, err, lost);
    if (rc < 0) return -1;
    trainer_set_eval_interrupt(r->t, runner_eval_interrupt_, c);
    r->ckpts_gone = rc;
    pthread_mutex_lock(&c->mu);
    c->ckpts_gone = r->ckpts_gone;
    pthread_mutex_unlock(&c->mu);
    r->dropped = 0;
    /* m6.db as it was: nothing to agree with yet (the operator's resume
     * takes it up again, runner_retake_) */
    if (rc != 0) return rc;
    int64_t from;
    if (from_scratch && r->last_ckpt < 0 &&
        state_phase_get(c->st, r->id, 1, &from) == 0) {
        /* started over: the old trajectory's delink is not replayed (the
         * spec, the policy or the operator decide anew) */
        state_phase_delete(c->st, r->id, 1);
        state_event(c->st, r->id, "delink.forgotten", "the delink of the "
                    "trajectory left behind (step %lld) is not replayed",
                    (long long)from);
    }
    /* the shards it opened must hold what the checkpoint was trained on */
    if (!was_queued && !*data_rc && r->last_ckpt >= 0)
        *data_rc = trainer_check_data(r->t, err);
    r->dropped = align_tables_(r, was_queued, r->recorded_delink);
    r->plateau_seed_owed = 1;  /* read before the first step (owed_) */
    return rc;
}

int runner_retake_(run_ctx *r, m6_err *err)
{
    runner *c = r->c;
    if (!r->ckpts_gone) return 0;
    pthread_mutex_lock(&c->mu);
    int scratch = c->scratch_ticket > 0 &&
                  c->scratch_ticket <= c->resume_serving;
    c->scratch_ticket = 0;
    pthread_mutex_unlock(&c->mu);
    int drc = r->data_error;  /* bad data: reopened later (runner_owed_) */
    /* every checkpoint failed to load: this resume is the word to start
     * over (run_ckpts_restore's forget_gone) */
    int none_loaded = r->ckpts_gone == 1;
    m6_err lost = M6_ERR_NONE;
    int rc = runner_take_up_(r, 0, scratch || none_loaded, &drc, err, &lost);
    if (rc < 0) return -1;  /* no trainer: r->t is NULL */
    if (rc == 0 && none_loaded && !scratch && r->last_ckpt < 0) {
        log_warn("run.start_over", "run=%lld metrics_dropped=%d (no "
                 "checkpoint loaded)", (long long)r->id, r->dropped);
        state_event(c->st, r->id, "resume.start_over", "at the operator's "
                    "resume: no checkpoint of the run loaded, so it trains "
                    "again from step 0; %d metrics rows dropped", r->dropped);
    }
    if (scratch) {
        log_warn("run.from_scratch", "run=%lld step=%ld metrics_dropped=%d",
                 (long long)r->id, trainer_step_count(r->t), r->dropped);
        state_event(c->st, r->id, "resume.from_scratch", "at the operator's "
                    "word: its checkpoints gone, the run trains again from "
                    "step %ld; %d metrics rows dropped",
                    trainer_step_count(r->t), r->dropped);
    }
    if (rc > 0) {  /* 2: still gone; 1: back, and none loads */
        m6_err_free(err);
        *err = lost;
        return -1;
    }
    if (drc && !r->data_error) {
        r->data_error = 1;
        r->data_code = runner_data_code_(drc);
        return -1;  /* err: the data's */
    }
    m6_err_free(err);
    if (!scratch && r->last_ckpt >= 0)
        log_info("run.restore", "run=%lld step=%ld metrics_dropped=%d (its "
                 "checkpoints are back)", (long long)r->id,
                 trainer_step_count(r->t), r->dropped);
    runner_publish_(r);
    runner_offload_sample_(r);
    return 0;
}
