/*
 * runner_dist.c — the runner's side of a run across nodes (runner_dist in
 * runner.h): making the run's group before a step, leaving it, the
 * boundary's agreement of a split state (sharded optimizer state, experts
 * spread by expert parallelism), and the reason a
 * run pauses when its group fails.
 */
#include "runner/runner_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

void runner_lost_why_(run_ctx *r, const char *what, const m6_err *e,
                      char *buf, size_t len)
{
    char back[200] = "";
    const char *split = r->spec.optimizer.shard ? "the optimizer state is "
                        "sharded" : "the experts are split over the ranks";
    if (spec_state_split(&r->spec) && r->last_ckpt >= 0)
        snprintf(back, sizeof back, "; %s and could not be gathered: "
                 "nothing is saved after the last whole checkpoint (step "
                 "%ld), resume starts from it", split, r->last_ckpt);
    else if (spec_state_split(&r->spec))
        snprintf(back, sizeof back, "; %s and could not be gathered: "
                 "nothing is saved, resume starts from step 0", split);
    /* who was lost, as the coordinator heard it: the reason names it and
     * the run's row keeps it (status) */
    runner *c = r->c;
    run_lost l = {0};
    char who[1200] = "";
    if (c->dist && c->dist->lost &&
        c->dist->lost(c->dist->ud, r->id, &r->spec, &l) == 1) {
        if (l.ranks > 1)
            snprintf(who, sizeof who, "ranks %d-%d were lost (node %s, id "
                     "%lld, local ranks %d-%d): %s; ", l.rank,
                     l.rank + l.ranks - 1, l.hostname, (long long)l.node_id,
                     l.local_rank, l.local_rank + l.ranks - 1, l.why);
        else
            snprintf(who, sizeof who, "rank %d was lost (node %s, id %lld, "
                     "local rank %d): %s; ", l.rank, l.hostname,
                     (long long)l.node_id, l.local_rank, l.why);
        if (state_run_set_lost(c->st, r->id, &l) < 0)
            log_warn("run.lost", "run=%lld err=\"state DB: cannot record "
                     "the lost rank\"", (long long)r->id);
    }
    snprintf(buf, len, "%sa rank of the run's %d-rank group failed %s: %s%s",
             who, trainer_world_size(r->t), what, m6_err_msg(e), back);
}

int runner_sync_(run_ctx *r, int whole, m6_err *err)
{
    if (r->lost) {
        m6_err_set(err, M6_EBADSTATE, "the run's group failed earlier; the "
                   "state is not whole (optimizer.shard, "
                   "nodes.expert_parallel)");
        return -1;
    }
    if (!spec_state_split(&r->spec) || !r->coll || r->synced == 2 ||
        (r->synced == 1 && !whole))
        return 0;  /* whole: not sharded, or gathered at this boundary */
    if (r->synced == 1) {  /* a step was due, not a save: a runner bug */
        m6_err_set(err, M6_EINTERNAL, "the split state cannot be gathered "
                   "at step %ld: this boundary's agreement was made for a "
                   "step", trainer_step_count(r->t));
        return -1;
    }
    m6_err e = M6_ERR_NONE;
    int rc = trainer_sync_boundary(r->t, whole, &e);
    if (rc < 0) {
        char why[2400];
        r->lost = 1;
        runner_lost_why_(r, whole ? "as rank 0 gathered the state"
                                  : "at the step boundary", &e, why,
                         sizeof why);
        m6_err_free(&e);
        m6_err_set(err, M6_EBADSTATE, "%s", why);
        log_warn("run.group_lost", "run=%lld step=%ld why=\"%s\"",
                 (long long)r->id, trainer_step_count(r->t), why);
        return -1;
    }
    r->synced = rc == 1 ? 2 : 1;
    return 0;
}

void runner_dist_drop_(run_ctx *r, const char *why)
{
    if (!r->coll) return;
    runner *c = r->c;
    m6_err e = M6_ERR_NONE;
    /* split state: whole before the group goes (the other ranks are at
     * this boundary; rank 0's trainer is then a plain one); a lost group
     * leaves it split, and the run is rebuilt from its last checkpoint */
    if (!r->lost)
        runner_sync_(r, 1, &e);  /* a failure: logged, r->lost */
    m6_err_free(&e);
    trainer_set_collectives(r->t, NULL, &e);
    m6_err_free(&e);
    r->synced = 0;
    m6_coll_destroy(r->coll);
    r->coll = NULL;
    if (c->dist && c->dist->ungroup) c->dist->ungroup(c->dist->ud, r->id);
    log_info("run.ungroup", "run=%lld step=%ld why=\"%s\"", (long long)r->id,
             trainer_step_count(r->t), why);
}

/* Before a step: a run whose current phase has world size W > 1 trains
 * only in a group of W ranks. 1: train now; 0: not yet (the reason is an
 * event and the run's error in status, once per change; the runner sleeps
 * a little, or less when a command comes in, and comes back). */
int runner_dist_ready_(run_ctx *r)
{
    runner *c = r->c;
    int world = spec_world_of_phase(&r->spec,
                                    trainer_phase(r->t) == PHASE_PSEUDO);
    if (world <= 1 || r->coll) return 1;
    char why[512] = "";
    m6_coll *g = NULL;
    int rc = 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double now_s = (double)now.tv_sec + now.tv_nsec * 1e-9;
    if (now_s < r->dist_retry_at) {
        /* a group failed (a refused rank, a rendezvous timeout): not
         * every 300 ms, which would reassign the nodes as often */
        snprintf(why, sizeof why, "%s", r->dist_why);
        rc = -1;
    } else if (c->dist && c->dist->group)
        rc = c->dist->group(c->dist->ud, r->id, &r->spec, r->t, world, &g,
                            why, sizeof why);
    else
        snprintf(why, sizeof why, "nodes.world_size %d needs a coordinator "
                 "(m6d --role coordinator --listen HOST:PORT)", world);
    if (rc == 1) {
        m6_err e = M6_ERR_NONE;
        if (trainer_set_collectives(r->t, g, &e) == 0) {
            r->coll = g;
            r->synced = 0;
            r->coll_phase = trainer_phase(r->t);
            r->dist_why[0] = 0;
            /* a loss that paused the run is behind it now */
            state_run_set_lost(c->st, r->id, NULL);
            state_event(c->st, r->id, "nodes.group", "world_size=%d step=%ld",
                        world, trainer_step_count(r->t));
            log_info("run.group", "run=%lld world_size=%d step=%ld",
                     (long long)r->id, world, trainer_step_count(r->t));
            pthread_mutex_lock(&c->mu);
            run_machine_set_error(&c->machine, NULL);
            pthread_mutex_unlock(&c->mu);
            return 1;
        }
        snprintf(why, sizeof why, "%s", m6_err_msg(&e));
        m6_err_free(&e);
        m6_coll_destroy(g);
        rc = -1;
    }
    if (rc < 0 && now_s >= r->dist_retry_at)
        r->dist_retry_at = now_s + (r->spec.nodes.timeout > 0
                                        ? r->spec.nodes.timeout : 30);
    if (strcmp(why, r->dist_why) != 0) {
        snprintf(r->dist_why, sizeof r->dist_why, "%s", why);
        state_event(c->st, r->id, rc == 0 ? "nodes.wait" : "nodes.refused",
                    "%s", why);
        log_warn(rc == 0 ? "run.wait" : "run.group_failed",
                 "run=%lld why=\"%s\"", (long long)r->id, why);
        pthread_mutex_lock(&c->mu);
        run_machine_set_error(&c->machine, why);
        pthread_mutex_unlock(&c->mu);
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += 300 * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    pthread_cond_timedwait(&c->cv, &c->mu, &until);
    pthread_mutex_unlock(&c->mu);
    return 0;
}
