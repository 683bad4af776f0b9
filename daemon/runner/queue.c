/*
 * queue.c — the run queue (see queue.h).
 */
#include "runner/queue.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"

int64_t queue_next(state *st, int *paused)
{
    static const run_state order[] = {RUN_RUNNING, RUN_PAUSED, RUN_QUEUED};
    for (int k = 0; k < 3; k++) {
        int64_t *ids;
        int n;
        if (state_run_ids(st, order[k], &ids, &n) < 0) return 0;
        int64_t id = n > 0 ? ids[0] : 0;
        free(ids);
        if (id) {
            *paused = order[k] == RUN_PAUSED;
            return id;
        }
    }
    return 0;
}

run_summary queue_summary(const run_spec *spec)
{
    return (run_summary){
        .pseudo_steps = spec->pseudo.steps,
        .device_budget = (int64_t)spec->device.memory_budget,
        .backend = spec_backend_name(spec->device.backend),
        .delink_policy = spec_delink_policy_name(spec->delink.policy),
        .world_size = spec->nodes.world_size,
        .expert_parallel = spec->nodes.expert_parallel,
        .precision = spec_precision_name(spec_precision(spec)),
        .master_precision = spec_master_name(spec->optimizer.master),
    };
}

int64_t queue_add(state *st, const run_spec *spec, const char *json,
                  char *name, size_t namelen)
{
    char *canon = spec_to_json(spec);
    int phase = spec->pseudo.steps > 0 ? 0 : 1;
    run_summary sum = queue_summary(spec);
    int64_t rid = state_run_insert(st, spec->name, canon ? canon : json,
                                   spec->train.steps, phase, &sum);
    free(canon);
    if (rid < 0) return -1;
    run_row row;
    if (state_run_get(st, rid, &row) == 0) {
        snprintf(name, namelen, "%s", row.name);
        run_row_clear(&row);
    }
    state_event(st, rid, "submit", "name=%s steps=%ld pseudo_steps=%ld", name,
                spec->train.steps, spec->pseudo.steps);
    log_info("run.submit", "run=%lld name=%s", (long long)rid, name);
    return rid;
}

int queue_dequeue(state *st, int64_t id)
{
    if (state_run_set_state(st, id, RUN_STOPPED, NULL) < 0) return -1;
    state_event(st, id, "stop", "step=0 (dequeued)");
    return 0;
}
