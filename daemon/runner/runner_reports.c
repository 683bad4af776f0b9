/*
 * runner_reports.c — what the runner reports about a step beyond its
 * metrics row: experts that have processed no token for
 * train.expert_idle_steps steps (event moe.expert_idle). Reporting never
 * changes the step. Called by runner.c's loop.
 */
#include "runner/runner_internal.h"

#include "common/log.h"

void runner_report_idle_experts_(run_ctx *r, const step_result *res)
{
    const step_moe *m = &res->moe;
    if (!m->present || m->idle_new <= 0)
        return;
    long N = r->spec.train.expert_idle_steps;
    log_warn("run.expert_idle", "run=%lld step=%ld block=%d expert=%d "
             "new=%ld idle=%ld steps=%ld", (long long)r->id, res->step,
             m->idle_block, m->idle_expert, m->idle_new, m->experts_idle, N);
    state_event(r->c->st, r->id, "moe.expert_idle", "step=%ld: expert %d of "
                "MoE block %d (and %ld more) processed no token of any rank "
                "in the last %ld steps; %ld (block, expert) pairs idle so "
                "far (train.expert_idle_steps)", res->step, m->idle_expert,
                m->idle_block, m->idle_new - 1, N, m->experts_idle);
}
