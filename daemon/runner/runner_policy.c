/*
 * runner_policy.c — the runner's phase policy: when a run delinks (the
 * spec's pseudo.steps, the plateau rule of delink.policy plateau over the
 * pseudo phase's validation passes, an operator delink replayed after a
 * restart), the delink itself with its record, and the pause after
 * train.max_bad_steps non-finite steps. Called by runner.c's loop.
 */
#include "runner/runner_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crashpoint.h"
#include "common/log.h"

/* delink.policy plateau: note a validation pass of the pseudo phase
 * (loss in nats per token). Out of memory: logged, the pass is not
 * counted (the pseudo.steps bound still delinks). */
void runner_plateau_note_(run_ctx *r, double val_loss)
{
    if (r->spec.delink.policy != DELINK_AT_PLATEAU || !isfinite(val_loss))
        return;
    if (r->n_evals == r->cap_evals) {
        int cap = r->cap_evals ? 2 * r->cap_evals : 64;
        double *b = realloc(r->best, (size_t)cap * sizeof *b);
        if (!b) {
            log_error("run.plateau", "run=%lld: out of memory, validation "
                      "pass not counted", (long long)r->id);
            return;
        }
        r->best = b;
        r->cap_evals = cap;
    }
    double prev = r->n_evals ? r->best[r->n_evals - 1] : INFINITY;
    r->best[r->n_evals++] = val_loss < prev ? val_loss : prev;
    r->val = val_loss;
}

/* delink.policy plateau, the rule (DESIGN.md "Phase policy: plateau"):
 * with passes 1..n and best_i the least loss of passes 1..i, the pseudo
 * phase has plateaued at pass n when n > patience and
 * best_{n-patience} - best_n < min_delta. 1 with the event's detail
 * ("val=V best=B prior_best=P evals=N") in buf; 0 not (yet). */
static int plateau_reached_(const run_ctx *r, char *buf, size_t len)
{
    int p = r->spec.delink.patience, n = r->n_evals;
    if (r->spec.delink.policy != DELINK_AT_PLATEAU || n <= p) return 0;
    double now = r->best[n - 1], prior = r->best[n - 1 - p];
    if (!(prior - now < (double)r->spec.delink.min_delta)) return 0;
    snprintf(buf, len, "val=%.9g best=%.9g prior_best=%.9g evals=%d", r->val,
             now, prior, n);
    return 1;
}

/* delink.policy plateau at set-up: the passes this trajectory made in the
 * pseudo phase, from m6.db's metrics rows up to the step the trainer
 * resumes from (rows past it are the ones align_tables_ drops). A run in
 * the real phase needs none. -1 if the rows cannot be read (the run
 * pauses: the rule would miss passes). */
int runner_plateau_seed_(run_ctx *r, m6_err *err)
{
    if (!r->plateau_seed_owed) return 0;
    if (r->spec.delink.policy != DELINK_AT_PLATEAU ||
        trainer_phase(r->t) != PHASE_PSEUDO) {
        r->plateau_seed_owed = 0;
        return 0;
    }
    metric_row *rows = NULL;
    int n = 0;
    if (state_metrics_list(r->c->st, r->id, 0, &rows, &n) < 0) {
        char db[512];
        state_last_error(r->c->st, db, sizeof db);
        m6_err_set(err, M6_EINTERNAL, "reading the validation losses of the "
                   "pseudo phase (delink.policy plateau) from m6.db: %s", db);
        return -1;
    }
    long step = trainer_step_count(r->t);
    for (int i = 0; i < n; i++)
        if (rows[i].phase == 0 && rows[i].step <= step)
            runner_plateau_note_(r, rows[i].val_loss);
    free(rows);
    r->plateau_seed_owed = 0;
    return 0;
}

/* Delink now, the event saying why (reason: spec, plateau, operator,
 * replay) and, when detail is not NULL, the figures it went by. */
static void delink_detail_(run_ctx *r, const char *reason, const char *detail)
{
    char err[512];
    long step = trainer_step_count(r->t);
    if (r->ckpts_gone) {
        /* the trainer is fresh, not the run's: a delink of it would be
         * recorded over the run's own phases */
        log_warn("run.delink_refused", "run=%lld reason=%s: its checkpoints "
                 "are gone", (long long)r->id, reason);
        state_event(r->c->st, r->id, "delink.refused", "its checkpoints are "
                    "gone; delink once it is taken up again");
        return;
    }
    /* split state (optimizer.shard, nodes.expert_parallel): every rank
     * gathers, so rank 0 delinks the whole state (its group then goes:
     * the ranks regroup with it) */
    m6_err se = M6_ERR_NONE;
    if (runner_sync_(r, 1, &se) < 0) {
        r->data_code = M6_EBADSTATE;
        runner_pause_error_(r, RUN_EV_DATA_ERROR, m6_err_msg(&se));
        m6_err_free(&se);
        return;
    }
    if (trainer_delink(r->t, err, sizeof err) < 0) {
        log_error("run.delink_failed", "run=%lld step=%ld err=\"%s\"",
                  (long long)r->id, step, err);
        return;
    }
    crashpoint("delink");
    /* the phase, the run's delink step and progress, the event and the
     * operator's delink commands: one transaction */
    char ev[640];
    snprintf(ev, sizeof ev, "step=%ld reason=%s slots=%d%s%s", step, reason,
             trainer_n_slots(r->t), detail ? " " : "", detail ? detail : "");
    int op = strcmp(reason, "operator") == 0;
    state_commit cm = {.delink = 1, .event_kind = "delink",
                       .event_detail = ev, .step = step,
                       .cmd_upto = op ? r->cmd_upto : 0,
                       .cmd_kinds = STATE_CMD_DELINK};
    if (state_commit_run(r->c->st, r->id, &cm) < 0)
        log_error("run.delink_record", "run=%lld step=%ld: the delink is done "
                  "but could not be recorded", (long long)r->id, step);
    log_info("run.delink", "run=%lld step=%ld reason=%s%s%s", (long long)r->id,
             step, reason, detail ? " " : "", detail ? detail : "");
    runner_offload_sample_(r);  /* new share map, new plan */
    runner_publish_(r);
}

void runner_delink_(run_ctx *r, const char *reason)
{
    delink_detail_(r, reason, NULL);
}

/* The phase policy: delink before the step that would take the run past
 * spec.pseudo.steps, or (delink.policy plateau) at the first boundary after
 * a validation pass that meets the plateau rule, or at an operator delink
 * replayed after a restart. */
void runner_phase_policy_(run_ctx *r)
{
    if (trainer_phase(r->t) != PHASE_PSEUDO) return;
    long step = trainer_step_count(r->t);
    char detail[256];
    if (r->replay_delink >= 0 && step >= r->replay_delink)
        runner_delink_(r, "replay");
    else if (plateau_reached_(r, detail, sizeof detail))
        delink_detail_(r, "plateau", detail);
    else if (r->spec.pseudo.steps > 0 && step >= r->spec.pseudo.steps)
        runner_delink_(r, "spec");
}

/* train.max_bad_steps non-finite steps in a row: the run pauses itself
 * (its weights are those before the first of them; the step records and
 * the events have each). `m6ctl resume` clears the count and tries again. */
void runner_bad_steps_pause_(run_ctx *r, const step_result *res)
{
    m6_err why = m6_err_make(M6_EBADSTATE, "%ld non-finite steps in a row "
        "(train.max_bad_steps %ld), the last step %ld (loss %g, grad norm %g): "
        "their updates were skipped; lower train.lr or check the data, then "
        "`m6ctl resume` tries again", res->bad_steps,
        r->spec.train.max_bad_steps, res->step, (double)res->train_loss,
        (double)res->grad_norm);
    runner_pause_saved_(r, RUN_EV_BAD_STEPS, m6_err_msg(&why));
    m6_err_free(&why);
}
