/*
 * handlers.c — request validation and one handler per command.
 */
#include "control/handlers.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/rankboard.h"
#include "common/run_state.h"
#include "control/advice.h"
#include "proto/frame.h"
#include "runner/run_ckpts.h"
#include "m6.pb-c.h"
#include "offload/offload.h"
#include "spec/spec.h"

#define SPEC_JSON_MAX (1u << 20)
#define NAME_MAX_ 255

/* Allocations made while building one Response, freed after packing. */
typedef struct {
    void **ptrs;
    int n, cap;
} arena;

static void *arena_alloc_(arena *a, size_t size)
{
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        void **np = realloc(a->ptrs, (size_t)cap * sizeof *np);
        if (!np) return NULL;
        a->ptrs = np;
        a->cap = cap;
    }
    void *p = calloc(1, size ? size : 1);
    if (p) a->ptrs[a->n++] = p;
    return p;
}

static char *arena_strdup_(arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = arena_alloc_(a, n);
    if (p) memcpy(p, s, n);
    return p;
}

static void arena_free_(arena *a)
{
    for (int i = 0; i < a->n; i++) free(a->ptrs[i]);
    free(a->ptrs);
}

typedef struct {
    handlers_ctx *h;
    session *s;
    arena *a;
    M6__Response *resp;
    int close_after;
} call;

static void reply_(call *c, M6__Status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_(call *c, M6__Status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = n >= 0 ? arena_alloc_(c->a, (size_t)n + 1) : NULL;
    if (msg) {  /* whole, never cut */
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    c->resp->status = st;
    c->resp->message = msg ? msg : (char *)"out of memory";
}

/* The protocol status of a core error code. */
static M6__Status status_of_(m6_code code)
{
    switch (code) {
    case M6_OK: return M6__STATUS__STATUS_OK;
    case M6_ENOTFOUND: return M6__STATUS__STATUS_NOT_FOUND;
    case M6_EBADSTATE:
    case M6_EDATA:    /* a run's data: what refused the command */
    case M6_ENOFILE:
    case M6_ENOCKPT: return M6__STATUS__STATUS_BAD_STATE;
    case M6_ECKPTGONE: return M6__STATUS__STATUS_BAD_STATE;
    case M6_EINVALID: return M6__STATUS__STATUS_INVALID_SPEC;
    case M6_EINTERNAL:
    case M6_ESUBMITFD: /* m6d's limit, not the spec's fault */
    case M6_ECANCELLED: break;
    }
    return M6__STATUS__STATUS_INTERNAL;
}

/* "<prefix>: <msg><sep><advice for code>" in the call's arena (prefix
 * NULL: none; the advice only where control/advice.h has one), never cut.
 * NULL when out of memory. */
static char *with_advice_(call *c, const char *prefix, const char *msg,
                          m6_code code)
{
    m6_advice adv = m6_advice_for(code);
    size_t n = (prefix ? strlen(prefix) + 2 : 0) + strlen(msg) +
               (adv.text ? strlen(adv.sep) + strlen(adv.text) : 0) + 1;
    char *m = arena_alloc_(c->a, n);
    if (m)
        snprintf(m, n, "%s%s%s%s%s", prefix ? prefix : "", prefix ? ": " : "",
                 msg, adv.text ? adv.sep : "", adv.text ? adv.text : "");
    return m;
}

/* Reply with a core error (or success) as it is: its status by code, its
 * whole message (prefix: "<prefix>: " first, NULL none) and the advice
 * for its code. */
static void reply_err_(call *c, const m6_err *e, const char *prefix)
{
    char *m = with_advice_(c, prefix, e->msg, e->code);
    c->resp->status = status_of_(e->code);
    c->resp->message = m ? m : (char *)"out of memory";
}

/* ---------------------------------------------------------------- run info */

/* The protocol's number of a recorded state (common/run_state.h's table). */
static M6__RunState state_to_pb_(run_state s)
{
    return (M6__RunState)run_state_wire(s);
}

static M6__Phase phase_to_pb_(int phase)
{
    return phase ? M6__PHASE__PHASE_REAL : M6__PHASE__PHASE_PSEUDO;
}

/* Whether row lacks a summary column (schemas 0009, 0015: a run
 * submitted before them), so that run_info_ reads its spec instead. */
static int summary_from_spec_(const run_row *row)
{
    return !row->have_summary || row->world_size <= 0 || !row->precision[0];
}

/* Fill a RunInfo from the DB row (+ latest metrics, phases, checkpoints). */
static M6__RunInfo *run_info_(call *c, const run_row *row, const char *spec_json)
{
    M6__RunInfo *ri = arena_alloc_(c->a, sizeof *ri);
    if (!ri) return NULL;
    m6__run_info__init(ri);
    ri->id = row->id;
    ri->name = arena_strdup_(c->a, row->name);
    ri->state = state_to_pb_(row->state);
    ri->phase = phase_to_pb_(row->phase);
    ri->step = row->step;
    ri->total_steps = row->total_steps;
    ri->created = row->created;
    ri->updated = row->updated;
    /* A run that paused on a failed write: the runner's word, which the DB
     * may not have been able to record. */
    char *live_err; /* as the runner holds it (runner/run_machine.h), whole */
    m6_code code = M6_OK;
    int live = runner_run_error(c->h->runner, row->id, &live_err, &code);
    if (live < 0) return NULL;
    if (live == 2) ri->state = M6__RUN_STATE__RUN_STATE_PAUSED;
    ri->error = live ? with_advice_(c, NULL, live_err, code)
                     : arena_strdup_(c->a, row->error ? row->error : "");
    free(live_err);
    if (!ri->name || !ri->error) return NULL;
    ri->train_loss = NAN;
    ri->val_loss = NAN;
    ri->lr = NAN;
    ri->tokens_per_s = 0;
    ri->h2d_gbps = ri->d2h_gbps = ri->copy_hidden_fraction = NAN;
    ri->moe_aux_loss = ri->moe_z_loss = ri->moe_dropped_fraction = NAN;
    ri->moe_load_min = ri->moe_load_max = ri->moe_load_cv = NAN;
    ri->moe_experts_empty = NAN;
    ri->offload_redo_steps = -1;
    metric_row m;
    double last_val;
    int have_metrics = state_metric_last(c->h->st, row->id, &m, &last_val) == 0;
    if (have_metrics) {
        ri->train_loss = (float)m.train_loss;
        ri->val_loss = (float)last_val;
        ri->lr = (float)m.lr;
        ri->tokens_per_s = isnan(m.tokens_per_s) ? 0 : m.tokens_per_s;
        ri->moe_aux_loss = m.moe_aux_loss;
        ri->moe_z_loss = m.moe_z_loss;
        ri->moe_dropped_fraction = m.moe_dropped_fraction;
        ri->moe_load_min = m.moe_load_min;
        ri->moe_load_max = m.moe_load_max;
        ri->moe_load_cv = m.moe_load_cv;
        ri->moe_experts_empty = m.moe_experts_empty;
        ri->skipped_steps = m.skipped_total;
    }
    /* Offloading: the runner's latest sample while the run is active, else
     * what its last step recorded (nothing is held then); nothing while
     * the active run's placement is being set up (the last step's may be
     * another budget's) */
    runner_offload off;
    int orc = runner_offload_get(c->h->runner, row->id, &off);
    if (orc == 0) {
        ri->resident_slots = off.resident_slots;
        ri->offloaded_slots = off.offloaded_slots;
        ri->device_bytes_in_use = off.device_bytes_in_use;
        ri->peak_device_bytes = off.peak_device_bytes;
        ri->device_budget_bytes = off.device_budget_bytes;
        ri->h2d_gbps = off.h2d_gbps;
        ri->d2h_gbps = off.d2h_gbps;
        ri->copy_hidden_fraction = off.copy_hidden_fraction;
        ri->offload_redo_steps = off.offload_redo_steps;
    } else if (orc == 1 && have_metrics) {
        ri->resident_slots = m.resident_slots > 0 ? m.resident_slots : 0;
        ri->offloaded_slots = m.offloaded_slots > 0 ? m.offloaded_slots : 0;
        ri->peak_device_bytes = m.peak_device_bytes > 0 ? m.peak_device_bytes : 0;
        ri->h2d_gbps = m.h2d_gbps;
        ri->d2h_gbps = m.d2h_gbps;
        ri->copy_hidden_fraction = m.copy_hidden_fraction;
    }
    /* stored once, by the runner, when the delink happened */
    ri->delink_step = row->phase == 1 ? row->delink_step : -1;
    char pending[64];
    runner_pending(c->h->runner, row->id, row->state, pending, sizeof pending);
    ri->pending = arena_strdup_(c->a, pending);
    if (!ri->pending) return NULL;
    ri->pseudo_steps = -1;
    if (row->have_summary) {
        /* the columns stored at submit */
        ri->pseudo_steps = row->pseudo_steps;
        ri->device_budget_bytes = row->device_budget;
        ri->backend = arena_strdup_(c->a, row->backend);
        ri->delink_policy = arena_strdup_(c->a, row->delink_policy);
        if (!ri->backend || !ri->delink_policy) return NULL;
    }
    ri->world_size = row->world_size;
    ri->expert_parallel = row->expert_parallel;
    ri->precision = arena_strdup_(c->a, row->precision);
    ri->master_precision = arena_strdup_(c->a, row->master_precision);
    if (!ri->precision || !ri->master_precision) return NULL;
    if (summary_from_spec_(row) && spec_json) {
        /* a run submitted before m6.db had them all: from its spec */
        run_spec spec;
        char err[256];
        if (spec_parse(&spec, spec_json, strlen(spec_json), err, sizeof err) == 0) {
            ri->pseudo_steps = spec.pseudo.steps;
            ri->device_budget_bytes = (int64_t)spec.device.memory_budget;
            ri->backend = (char *)spec_backend_name(spec.device.backend);
            ri->delink_policy = (char *)spec_delink_policy_name(spec.delink.policy);
            ri->world_size = spec.nodes.world_size;
            ri->expert_parallel = spec.nodes.expert_parallel;
            ri->precision = (char *)spec_precision_name(spec_precision(&spec));
            ri->master_precision = (char *)spec_master_name(spec.optimizer.master);
        }
    }
    /* a delink to come: only for a live run still in the pseudo phase */
    int to_come = row->phase == 0 && (row->state == RUN_QUEUED ||
                                      row->state == RUN_RUNNING ||
                                      row->state == RUN_PAUSED);
    ri->next_delink_step = -1;
    long pending_at = to_come ? runner_delink_pending(c->h->runner, row->id)
                              : -1;
    if (pending_at >= 0)
        ri->next_delink_step = pending_at;
    else if (to_come && ri->pseudo_steps > 0)
        ri->next_delink_step = ri->pseudo_steps;
    ri->eta_s = runner_eta(c->h->runner, row->id);
    ckpt_row *ck;
    int n;
    ri->checkpoint_step = -1;
    if (state_checkpoints_list(c->h->st, row->id, &ck, &n) == 0) {
        if (n > 0) ri->checkpoint_step = ck[n - 1].step;
        free(ck);
    }
    return ri;
}

/* Resolve a RunRef: by id if > 0, else by unique name. Replies on error. */
static int resolve_(call *c, const M6__RunRef *ref, int64_t *id)
{
    if (!ref) {
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST, "missing run reference");
        return -1;
    }
    if (ref->run_id > 0) {
        run_row row;
        int rc = state_run_get(c->h->st, ref->run_id, &row);
        if (rc == 0) {
            run_row_clear(&row);
            *id = ref->run_id;
            return 0;
        }
        if (rc == 1)
            reply_(c, M6__STATUS__STATUS_NOT_FOUND, "no run with id %lld",
                   (long long)ref->run_id);
        else
            reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
        return -1;
    }
    if (ref->run_id < 0) {
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST, "run id must be > 0, got %lld",
               (long long)ref->run_id);
        return -1;
    }
    if (!ref->name || !*ref->name || strlen(ref->name) > NAME_MAX_) {
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST,
               "run reference needs an id > 0 or a name (1..255 bytes)");
        return -1;
    }
    char ids[256];
    int rc = state_run_find_name(c->h->st, ref->name, id, ids, sizeof ids);
    if (rc == 0) return 0;
    if (rc == 1)
        reply_(c, M6__STATUS__STATUS_NOT_FOUND, "no run named \"%s\"", ref->name);
    else if (rc == 2)
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST, "several runs are named "
               "\"%s\" (ids %s); use the numeric id", ref->name, ids);
    else
        reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    return -1;
}

/* Whether the k-th rank whose loss paused the run (lo) is one past rank
 * 0 that the board's n entries e lack (no heartbeat carried it). */
static int lost_unheard_(const run_lost *lo, const rank_entry *e, int n,
                         int k)
{
    int r = lo->rank + k;
    if (lo->node_id <= 0 || k >= lo->ranks || r <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (e[i].rank == r) return 0;
    return 1;
}

/* RunInfo.ranks: where each rank of a run of several stands. Rank 0 is
 * the coordinator's runner (the run row's step and state, "training"
 * while it runs); the others are the board's (rankboard.h: this m6d's
 * rank threads, each worker's latest heartbeat), a rank whose node is no
 * longer live "lost" with the node's detail. The ranks whose loss paused
 * the run (the row's lost_*) are there whether or not a heartbeat ever
 * carried them (a node killed before its first one): "lost" (or
 * "failed", its node live), step -1 (never heard from). None (0) when no
 * rank past 0 was heard of or lost: a run of one rank, or one whose ranks
 * never started. 0, or -1 out of memory. */
static int run_ranks_(call *c, const run_row *row, M6__RunInfo *ri)
{
    rank_entry *e = malloc(RANKBOARD_MAX * sizeof *e);
    if (!e) return -1;
    int n = rankboard_run(row->id, e, RANKBOARD_MAX);
    const run_lost *lo = &row->lost;
    int unheard = 0;  /* lost ranks the board lacks: after its entries */
    for (int k = 0; k < lo->ranks; k++)
        unheard += lost_unheard_(lo, e, n, k);
    if (n == 0 && unheard == 0) {
        free(e);
        return 0;
    }
    node_row *nodes = NULL;
    int nn = 0;
    if (state_nodes_list(c->h->st, &nodes, &nn) != 0) nn = 0;
    M6__RankState **v = arena_alloc_(c->a, (size_t)(n + unheard + 1) * sizeof *v);
    if (!v) goto oom;
    int k = 0;
    for (int i = -1; i < n + lo->ranks; i++) {
        int lost_i = i - n;  /* >= 0: the lost_i-th lost rank */
        if (i >= 0 && i < n && e[i].rank == 0) continue;  /* the runner */
        if (lost_i >= 0 && !lost_unheard_(lo, e, n, lost_i)) continue;
        M6__RankState *r = arena_alloc_(c->a, sizeof *r);
        if (!r) goto oom;
        m6__rank_state__init(r);
        r->run_id = row->id;
        const node_row *nd = NULL;
        int64_t node = i < 0 ? 0 : lost_i >= 0 ? lo->node_id
                                               : e[i].node_id; /* 0: here */
        for (int j = 0; j < nn && !nd; j++)
            if (node ? nodes[j].id == node : nodes[j].coordinator)
                nd = &nodes[j];
        const char *state, *reason = "";
        if (i < 0) {
            r->step = row->step;
            state = row->state == RUN_RUNNING ? "training"
                                              : run_state_name(row->state);
        } else if (lost_i >= 0) {
            r->rank = lo->rank + lost_i;
            r->local_rank = lo->local_rank + lost_i;
            r->step = -1;
            /* its node gone, or (ranks 1) a rank that failed on a live one */
            int live = nd && nd->state == NODE_LIVE;
            state = live ? "failed" : "lost";
            reason = nd && !live ? nd->detail : "";
        } else {
            r->rank = e[i].rank;
            r->local_rank = e[i].local_rank;
            r->step = e[i].step;
            state = rankboard_state_name(e[i].state);
            reason = e[i].reason;
            if (nd && nd->state != NODE_LIVE && !nd->coordinator &&
                e[i].state != RANK_DONE && e[i].state != RANK_FAILED) {
                state = "lost";
                reason = nd->detail;
            }
        }
        r->node_id = nd ? nd->id : 0;
        r->hostname = arena_strdup_(c->a, nd ? nd->hostname : "");
        r->state = arena_strdup_(c->a, state);
        r->reason = arena_strdup_(c->a, reason);
        if (!r->hostname || !r->state || !r->reason) goto oom;
        v[k++] = r;
    }
    free(nodes);
    free(e);
    ri->ranks = v;
    ri->n_ranks = (size_t)k;
    return 0;
oom:
    free(nodes);
    free(e);
    return -1;
}

/* RunInfo.lost: the ranks whose loss paused the run (the row's lost_*
 * columns), the node's hostname from the nodes table. 0, or -1 out of
 * memory. */
static int run_lost_(call *c, const run_row *row, M6__RunInfo *ri)
{
    if (row->lost.node_id <= 0) return 0;
    M6__LostRanks *l = arena_alloc_(c->a, sizeof *l);
    if (!l) return -1;
    m6__lost_ranks__init(l);
    l->node_id = row->lost.node_id;
    l->rank = row->lost.rank;
    l->local_rank = row->lost.local_rank;
    l->ranks = row->lost.ranks;
    node_row *nodes = NULL;
    int nn = 0;
    if (state_nodes_list(c->h->st, &nodes, &nn) != 0) nn = 0;
    const char *host = "";
    for (int j = 0; j < nn; j++)
        if (nodes[j].id == row->lost.node_id) host = nodes[j].hostname;
    l->hostname = arena_strdup_(c->a, host);
    free(nodes);
    if (!l->hostname) return -1;
    ri->lost = l;
    return 0;
}

static int reply_run_(call *c, int64_t id)
{
    run_row row;
    int rc = state_run_get(c->h->st, id, &row);
    if (rc != 0) {
        reply_(c, rc == 1 ? M6__STATUS__STATUS_NOT_FOUND : M6__STATUS__STATUS_INTERNAL,
               rc == 1 ? "no run with id %lld" : "database error (run %lld)",
               (long long)id);
        return -1;
    }
    M6__RunInfo *ri = run_info_(c, &row, row.spec);
    if (ri && (run_ranks_(c, &row, ri) < 0 || run_lost_(c, &row, ri) < 0))
        ri = NULL;
    run_row_clear(&row);
    if (!ri) {
        reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
        return -1;
    }
    c->resp->body_case = M6__RESPONSE__BODY_RUN;
    c->resp->run = ri;
    return 0;
}

/* ---------------------------------------------------------------- handlers */

static void do_hello_(call *c, const M6__Request *rq)
{
    const M6__Hello *h = rq->hello;
    if (h->protocol_version != M6_PROTOCOL_VERSION) {
        reply_(c, M6__STATUS__STATUS_BAD_VERSION,
               "bad version: client speaks protocol %u, m6d speaks %u",
               h->protocol_version, M6_PROTOCOL_VERSION);
        c->close_after = 1;
        return;
    }
    M6__HelloReply *hr = arena_alloc_(c->a, sizeof *hr);
    if (!hr) return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    m6__hello_reply__init(hr);
    hr->protocol_version = M6_PROTOCOL_VERSION;
    hr->server = (char *)"m6d " M6_VERSION;
    c->s->hello_done = 1;
    c->resp->body_case = M6__RESPONSE__BODY_HELLO;
    c->resp->hello = hr;
    reply_(c, M6__STATUS__STATUS_OK, "hello");
}

/* The spec text of a Submit or PlanQuery: its length, or -1 after
 * replying (empty, or over SPEC_JSON_MAX). */
static long spec_len_(call *c, const char *json)
{
    size_t len = json ? strlen(json) : 0;
    if (len == 0) {
        reply_(c, M6__STATUS__STATUS_INVALID_SPEC, "empty spec");
        return -1;
    }
    if (len > SPEC_JSON_MAX) {
        reply_(c, M6__STATUS__STATUS_INVALID_SPEC,
               "spec is %zu bytes; the limit is %u", len, SPEC_JSON_MAX);
        return -1;
    }
    return (long)len;
}

static void do_submit_(call *c, const M6__Request *rq)
{
    const char *json = rq->submit->spec_json;
    long len = spec_len_(c, json);
    if (len < 0) return;
    int64_t id;
    char name[256] = "";
    m6_err e = runner_submit(c->h->runner, json, (size_t)len, &c->s->gone, &id,
                             name, sizeof name);
    const char *origin = rq->submit->origin && *rq->submit->origin
                             ? rq->submit->origin : NULL;
    if (e.code != M6_OK) {
        /* a spec the client read from a file: its name first */
        reply_err_(c, &e, origin);
        return m6_err_free(&e);
    }
    M6__SubmitReply *sr = arena_alloc_(c->a, sizeof *sr);
    if (!sr) {
        m6_err_free(&e);
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    }
    m6__submit_reply__init(sr);
    sr->run_id = id;
    sr->name = arena_strdup_(c->a, name);
    if (!sr->name) {
        m6_err_free(&e);
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    }
    c->resp->body_case = M6__RESPONSE__BODY_SUBMIT;
    c->resp->submit = sr;
    reply_err_(c, &e, NULL);
    m6_err_free(&e);
}

static void do_list_(call *c, const M6__Request *rq)
{
    (void)rq;
    run_row *rows;
    int n;
    if (state_run_list(c->h->st, &rows, &n) < 0)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    M6__RunList *rl = arena_alloc_(c->a, sizeof *rl);
    M6__RunInfo **v = arena_alloc_(c->a, (size_t)n * sizeof *v);
    if (!rl || !v) goto oom;
    m6__run_list__init(rl);
    for (int i = 0; i < n; i++) {
        /* the spec's fields from the row's columns; only a row from
         * before them needs its spec */
        run_row full;
        int have = summary_from_spec_(&rows[i]) &&
                   state_run_get(c->h->st, rows[i].id, &full) == 0;
        v[i] = run_info_(c, &rows[i], have ? full.spec : NULL);
        if (have) run_row_clear(&full);
        if (!v[i]) goto oom;
    }
    rl->n_runs = (size_t)n;
    rl->runs = v;
    run_rows_free(rows, n);
    c->resp->body_case = M6__RESPONSE__BODY_LIST;
    c->resp->list = rl;
    return reply_(c, M6__STATUS__STATUS_OK, "%d runs", n);
oom:
    run_rows_free(rows, n);
    reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
}

static void do_status_(call *c, const M6__Request *rq)
{
    int64_t id;
    if (resolve_(c, rq->status, &id) < 0) return;
    if (reply_run_(c, id) == 0) reply_(c, M6__STATUS__STATUS_OK, "ok");
}

static void do_command_(call *c, const M6__RunRef *ref, runner_cmd cmd)
{
    int64_t id;
    if (resolve_(c, ref, &id) < 0) return;
    m6_err e = runner_command(c->h->runner, id, cmd,
                              ref->from_scratch ? RUNNER_FROM_SCRATCH : 0);
    if (e.code != M6_OK || reply_run_(c, id) == 0)
        reply_err_(c, &e, NULL);
    m6_err_free(&e);
}

static void do_pause_(call *c, const M6__Request *rq) { do_command_(c, rq->pause, CMD_PAUSE); }
static void do_resume_(call *c, const M6__Request *rq) { do_command_(c, rq->resume, CMD_RESUME); }

/* resume at another layout or memory budget (ResumeAt):
 * runner_resume_at, answered as a resume */
static void do_resume_at_(call *c, const M6__Request *rq)
{
    int64_t id;
    const M6__ResumeAt *q = rq->resume_at;
    if (resolve_(c, q->run, &id) < 0) return;
    m6_err e = runner_resume_at(c->h->runner, id, q->world_size,
                                q->expert_parallel, q->memory_budget);
    if (e.code != M6_OK || reply_run_(c, id) == 0)
        reply_err_(c, &e, NULL);
    m6_err_free(&e);
}
static void do_delink_(call *c, const M6__Request *rq) { do_command_(c, rq->delink, CMD_DELINK); }
static void do_stop_(call *c, const M6__Request *rq) { do_command_(c, rq->stop, CMD_STOP); }

/* Page sizes: m6d's and the largest a client may ask for. Metrics rows
 * are ~110 bytes on the wire, events at most ~1.1 KB: both pages stay well
 * under the frame limit. */
enum { METRICS_PAGE_ = 10000, EVENTS_PAGE_ = 10000 };

/* The start of a paged query (metrics, events): the run, the cursor (rows
 * after it; >= 0) and the page size (limit in 0..max, 0: max). Replies and
 * returns -1 when one of them is bad. */
static int page_query_(call *c, const M6__RunRef *ref, const char *cursor_name,
                       int64_t cursor, int limit, int max, int64_t *id, int *page)
{
    if (resolve_(c, ref, id) < 0) return -1;
    if (cursor < 0) {
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST, "%s must be >= 0, got %lld",
               cursor_name, (long long)cursor);
        return -1;
    }
    if (limit < 0 || limit > max) {
        reply_(c, M6__STATUS__STATUS_BAD_REQUEST,
               "limit must be in 0..%d (0: %d), got %d", max, max, limit);
        return -1;
    }
    *page = limit ? limit : max;
    return 0;
}

/* One page of a run's metrics. Runs on the thread pool (handlers_is_slow):
 * a page of many rows must not hold up the event loop. */
static void do_metrics_(call *c, const M6__Request *rq)
{
    const M6__MetricsQuery *q = rq->metrics;
    int64_t id;
    int limit;
    if (page_query_(c, q->run, "after_step", q->after_step, q->limit, METRICS_PAGE_,
                    &id, &limit) < 0)
        return;
    metric_row *rows;
    int n;
    /* one row more than the page says whether more follow */
    if (state_metrics_page(c->h->st, id, q->after_step, limit + 1, &rows, &n) < 0)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    int more = n > limit;
    if (more) n = limit;
    M6__MetricRows *mr = arena_alloc_(c->a, sizeof *mr);
    M6__MetricRow **v = arena_alloc_(c->a, (size_t)n * sizeof *v);
    M6__MetricRow *cells = arena_alloc_(c->a, (size_t)n * sizeof *cells);
    if (!mr || !v || !cells) {
        free(rows);
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    }
    m6__metric_rows__init(mr);
    for (int i = 0; i < n; i++) {
        M6__MetricRow *r = &cells[i];
        m6__metric_row__init(r);
        r->step = rows[i].step;
        r->phase = phase_to_pb_(rows[i].phase);
        r->train_loss = (float)rows[i].train_loss;
        r->val_loss = (float)rows[i].val_loss;
        r->lr = (float)rows[i].lr;
        r->tokens_per_s = rows[i].tokens_per_s;
        r->grad_norm = (float)rows[i].grad_norm;
        r->resident_slots = rows[i].resident_slots;
        r->offloaded_slots = rows[i].offloaded_slots;
        r->peak_device_bytes = rows[i].peak_device_bytes;
        r->h2d_gbps = rows[i].h2d_gbps;
        r->d2h_gbps = rows[i].d2h_gbps;
        r->copy_hidden_fraction = rows[i].copy_hidden_fraction;
        r->offload_redo_steps = rows[i].offload_redo_steps;
        r->moe_aux_loss = rows[i].moe_aux_loss;
        r->moe_z_loss = rows[i].moe_z_loss;
        r->moe_dropped_fraction = rows[i].moe_dropped_fraction;
        r->moe_load_min = rows[i].moe_load_min;
        r->moe_load_max = rows[i].moe_load_max;
        r->moe_load_cv = rows[i].moe_load_cv;
        r->moe_experts_empty = rows[i].moe_experts_empty;
        r->moe_step_tokens_min = rows[i].moe_step_tokens_min;
        r->moe_step_tokens_max = rows[i].moe_step_tokens_max;
        r->moe_step_experts_empty = rows[i].moe_step_experts_empty;
        r->moe_step_dropped = rows[i].moe_step_dropped;
        r->moe_experts_idle = rows[i].moe_experts_idle;
        r->skipped = rows[i].skipped != 0;
        r->skipped_total = rows[i].skipped_total;
        v[i] = r;
    }
    free(rows);
    mr->run_id = id;
    mr->n_rows = (size_t)n;
    mr->rows = v;
    mr->more = more;
    c->resp->body_case = M6__RESPONSE__BODY_METRICS;
    c->resp->metrics = mr;
    reply_(c, M6__STATUS__STATUS_OK, "%d rows%s", n, more ? ", more follow" : "");
}

/* The slot indices with placement pl, into an arena array. */
static int32_t *slots_of_(call *c, const offload_plan *p, int pl, size_t *n)
{
    int32_t *v = arena_alloc_(c->a, (size_t)p->n_slots * sizeof *v);
    *n = 0;
    for (int s = 0; v && s < p->n_slots; s++)
        if (p->placement[s] == pl) v[(*n)++] = s;
    return v;
}

/* One phase's plan as a PhasePlan (arena); NULL when out of memory. */
static M6__PhasePlan *phase_plan_(call *c, const offload_plan *p)
{
    M6__PhasePlan *pp = arena_alloc_(c->a, sizeof *pp);
    if (!pp) return NULL;
    m6__phase_plan__init(pp);
    pp->n_layer = p->n_layer;
    pp->n_slots = p->n_slots;
    pp->resident_slots = slots_of_(c, p, OFFLOAD_RESIDENT, &pp->n_resident_slots);
    pp->offloaded_slots = slots_of_(c, p, OFFLOAD_OFFLOADED, &pp->n_offloaded_slots);
    if (!pp->resident_slots || !pp->offloaded_slots) return NULL;
    pp->staging_buffers = p->n_staging;
    pp->batch_size = p->batch_size;
    pp->grad_accum = p->grad_accum;
    pp->prefetch = p->prefetch;
    pp->budget_bytes = p->budget_bytes;
    pp->global_bytes = p->global_bytes;
    pp->slot_bytes = p->slot_bytes;
    pp->staging_buffer_bytes = p->staging_bytes;
    pp->activations_bytes = p->act_bytes;
    pp->workspace_bytes = p->workspace_bytes;
    pp->peak_device_bytes = p->peak_device_bytes;
    pp->min_budget_bytes = p->min_budget_bytes;
    pp->host_slot_bytes = p->host_slot_bytes;
    pp->pinned_slot_bytes = p->pinned_slot_bytes;
    pp->host_bytes = p->host_bytes;
    pp->pinned_bytes = p->pinned_bytes;
    pp->h2d_bytes_per_step = p->h2d_bytes_per_step;
    pp->d2h_bytes_per_step = p->d2h_bytes_per_step;
    pp->speculative = p->speculative != 0;
    pp->speculative_mode = (char *)offload_speculative_mode_name(
        p->speculative_mode);
    pp->speculative_slot_bytes = p->spec_slot_bytes;
    pp->speculative_pinned_slot_bytes = p->spec_pinned_slot_bytes;
    pp->stream_grads = p->stream_grads != 0;
    pp->grad_buffers = p->n_grad_bufs;
    pp->grad_buffer_bytes = p->grad_buf_bytes;
    pp->host_state_bytes = p->host_state_bytes;
    return pp;
}

static void do_plan_(call *c, const M6__Request *rq)
{
    const char *json = rq->plan->spec_json;
    long len = spec_len_(c, json);
    if (len < 0) return;
    run_spec spec;
    char err[1024], warn[512];
    if (spec_parse(&spec, json, (size_t)len, err, sizeof err) < 0)
        return reply_(c, M6__STATUS__STATUS_INVALID_SPEC, "invalid spec: %s", err);
    offload_plan plan;
    if (offload_check(&spec, (size_t)rq->plan->device_memory, 0, &plan, warn,
                      sizeof warn, err, sizeof err) != 0)
        return reply_(c, M6__STATUS__STATUS_INVALID_SPEC, "%s", err);
    M6__PlanReply *pr = arena_alloc_(c->a, sizeof *pr);
    int ok = pr != NULL;
    if (ok) {
        m6__plan_reply__init(pr);
        pr->backend = (char *)(plan.backend == BACKEND_CUDA ? "cuda" : "cpu");
        pr->warning = arena_strdup_(c->a, warn);
        pr->real = phase_plan_(c, &plan);
        pr->pseudo = plan.pseudo ? phase_plan_(c, plan.pseudo) : NULL;
        ok = pr->warning && pr->real && (!plan.pseudo || pr->pseudo);
        const offload_plan *er = plan.ep_rank;
        if (ok && er) {
            pr->rank_real = phase_plan_(c, er);
            pr->rank_pseudo = er->pseudo ? phase_plan_(c, er->pseudo) : NULL;
            pr->rank_experts = plan.ep_experts;
            ok = pr->rank_real && (!er->pseudo || pr->rank_pseudo);
        }
    }
    offload_plan_free(&plan);
    if (!ok) return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    c->resp->body_case = M6__RESPONSE__BODY_PLAN;
    c->resp->plan = pr;
    reply_(c, M6__STATUS__STATUS_OK, "%s", warn[0] ? warn : "ok");
}

static void do_events_(call *c, const M6__Request *rq)
{
    int64_t id;
    int limit;
    if (page_query_(c, rq->events->run, "after_id", rq->events->after_id, 0,
                    EVENTS_PAGE_, &id, &limit) < 0)
        return;
    event_row *rows;
    int n;
    /* the client asks again with after_id for the rest, until a page
     * comes back empty */
    if (state_events_list(c->h->st, id, rq->events->after_id, limit, &rows,
                          &n) < 0)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    M6__EventRows *er = arena_alloc_(c->a, sizeof *er);
    M6__Event **v = arena_alloc_(c->a, (size_t)n * sizeof *v);
    M6__Event *cells = arena_alloc_(c->a, (size_t)n * sizeof *cells);
    int ok = er && v && cells;
    for (int i = 0; ok && i < n; i++) {
        M6__Event *e = &cells[i];
        m6__event__init(e);
        e->id = rows[i].id;
        e->time = rows[i].time;
        e->kind = arena_strdup_(c->a, rows[i].kind);
        e->detail = rows[i].detail ? arena_strdup_(c->a, rows[i].detail)
                                   : NULL;
        ok = e->kind && e->detail;
        v[i] = e;
    }
    event_rows_free(rows, n);
    if (!ok)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    m6__event_rows__init(er);
    er->run_id = id;
    er->n_events = (size_t)n;
    er->events = v;
    c->resp->body_case = M6__RESPONSE__BODY_EVENTS;
    c->resp->events = er;
    reply_(c, M6__STATUS__STATUS_OK, "%d events", n);
}

/* ------------------------------------------------------------ export */

/* A run's spec and its checkpoints (m6ctl export reads the files). Paths
 * are made absolute (m6d's --state-dir may be relative to its own working
 * directory, not the client's). */
static void do_checkpoints_(call *c, const M6__Request *rq)
{
    int64_t id;
    if (resolve_(c, rq->checkpoints->run, &id) < 0)
        return;
    run_row row;
    if (state_run_get(c->h->st, id, &row) != 0)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error (run %lld)",
                      (long long)id);
    ckpt_row *rows = NULL;
    int n = 0;
    if (state_checkpoints_list(c->h->st, id, &rows, &n) < 0) {
        run_row_clear(&row);
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    }
    M6__CheckpointList *cl = arena_alloc_(c->a, sizeof *cl);
    M6__CheckpointEntry **v = arena_alloc_(c->a, (size_t)n * sizeof *v);
    M6__CheckpointEntry *cells = arena_alloc_(c->a, (size_t)n * sizeof *cells);
    int ok = cl && v && cells;
    if (ok) {
        m6__checkpoint_list__init(cl);
        cl->run_id = id;
        cl->name = arena_strdup_(c->a, row.name);
        cl->spec_json = arena_strdup_(c->a, row.spec ? row.spec : "");
        ok = cl->name && cl->spec_json;
    }
    for (int i = 0; ok && i < n; i++) {
        M6__CheckpointEntry *e = &cells[i];
        m6__checkpoint_entry__init(e);
        e->step = rows[i].step;
        e->bytes = rows[i].bytes;
        char *abs = realpath(rows[i].path, NULL);
        e->on_disk = run_ckpts_on_disk(rows[i].path);
        e->path = arena_strdup_(c->a, abs ? abs : rows[i].path);
        free(abs);
        ok = e->path != NULL;
        v[i] = e;
    }
    free(rows);
    run_row_clear(&row);
    if (!ok)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    cl->n_checkpoints = (size_t)n;
    cl->checkpoints = v;
    c->resp->body_case = M6__RESPONSE__BODY_CHECKPOINTS;
    c->resp->checkpoints = cl;
    reply_(c, M6__STATUS__STATUS_OK, "%d checkpoints", n);
}

/* ------------------------------------------------------------------- nodes */

/* The nodes table (daemon/cluster/coordinator.h keeps it). This m6d's own
 * row is live while it answers: its last heartbeat is now. */
static void do_nodes_(call *c, const M6__Request *rq)
{
    (void)rq;
    if (c->h->cluster_join)
        return reply_(c, M6__STATUS__STATUS_BAD_STATE,
                      "this m6d is a worker node of the coordinator at %s: "
                      "run m6ctl nodes there", c->h->cluster_join);
    node_row *rows;
    int n;
    if (state_nodes_list(c->h->st, &rows, &n) < 0)
        return reply_(c, M6__STATUS__STATUS_INTERNAL, "database error");
    M6__NodeList *nl = arena_alloc_(c->a, sizeof *nl);
    M6__NodeInfo **v = arena_alloc_(c->a, (size_t)n * sizeof *v);
    M6__NodeInfo *cells = arena_alloc_(c->a, (size_t)n * sizeof *cells);
    int ok = nl && v && cells;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    for (int i = 0; ok && i < n; i++) {
        const node_row *r = &rows[i];
        M6__NodeInfo *ni = &cells[i];
        m6__node_info__init(ni);
        ni->id = r->id;
        ni->hostname = arena_strdup_(c->a, r->hostname);
        ni->node_uuid = arena_strdup_(c->a, r->node_uuid);
        ni->state = (char *)node_state_name(r->state);
        ni->role = (char *)(r->coordinator ? "coordinator" : "worker");
        ni->backend = arena_strdup_(c->a, r->backend);
        ni->devices = r->devices;
        ni->memory = r->memory;
        ni->free_device_memory = r->free_device_memory;
        ni->run_id = r->run;
        ni->rank = r->rank;
        ni->ranks = r->ranks;
        ni->last_heartbeat = r->coordinator && r->state == NODE_LIVE
                                 ? now : r->last_heartbeat;
        ni->joined = r->joined;
        ni->updated = r->updated;
        ni->address = arena_strdup_(c->a, r->address);
        ni->detail = arena_strdup_(c->a, r->detail);
        ni->gemm = arena_strdup_(c->a, r->gemm);
        ok = ni->hostname && ni->node_uuid && ni->backend && ni->address &&
             ni->detail && ni->gemm;
        v[i] = ni;
    }
    free(rows);
    if (!ok) return reply_(c, M6__STATUS__STATUS_INTERNAL, "out of memory");
    m6__node_list__init(nl);
    nl->n_nodes = (size_t)n;
    nl->nodes = v;
    c->resp->body_case = M6__RESPONSE__BODY_NODES;
    c->resp->nodes = nl;
    reply_(c, M6__STATUS__STATUS_OK, "%d nodes", n);
}

/* The dispatch table: one entry per Request.body case. */
typedef struct {
    M6__Request__BodyCase which;
    const char *name;
    void (*fn)(call *, const M6__Request *);
    int read;  /* only reads: what a --group-read-only member may send */
} handler_entry;

static const handler_entry table_[] = {
    {M6__REQUEST__BODY_HELLO, "hello", do_hello_, 1},
    {M6__REQUEST__BODY_SUBMIT, "submit", do_submit_, 0},
    {M6__REQUEST__BODY_LIST, "list", do_list_, 1},
    {M6__REQUEST__BODY_STATUS, "status", do_status_, 1},
    {M6__REQUEST__BODY_PAUSE, "pause", do_pause_, 0},
    {M6__REQUEST__BODY_RESUME, "resume", do_resume_, 0},
    {M6__REQUEST__BODY_RESUME_AT, "resume_at", do_resume_at_, 0},
    {M6__REQUEST__BODY_DELINK, "delink", do_delink_, 0},
    {M6__REQUEST__BODY_STOP, "stop", do_stop_, 0},
    {M6__REQUEST__BODY_METRICS, "metrics", do_metrics_, 1},
    {M6__REQUEST__BODY_PLAN, "plan", do_plan_, 1},
    {M6__REQUEST__BODY_EVENTS, "events", do_events_, 1},
    {M6__REQUEST__BODY_CHECKPOINTS, "checkpoints", do_checkpoints_, 1},
    {M6__REQUEST__BODY_NODES, "nodes", do_nodes_, 1},
};
enum { N_HANDLERS_ = sizeof table_ / sizeof table_[0] };

int handlers_is_read(int body_case)
{
    for (int i = 0; i < N_HANDLERS_; i++)
        if ((int)table_[i].which == body_case)
            return table_[i].read;
    return 0;
}

/* "hello, list, ... and nodes": the names of the reads, from table_ */
static void reads_named_(char *buf, size_t len)
{
    int n = 0, k = 0;
    for (int i = 0; i < N_HANDLERS_; i++)
        n += table_[i].read;
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_HANDLERS_ && o < len; i++) {
        if (!table_[i].read)
            continue;
        k++;
        int w = snprintf(buf + o, len - o, "%s%s",
                         k == 1 ? "" : k == n ? " and " : ", ",
                         table_[i].name);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* protobuf-c leaves a sub-message NULL only if absent; the oneof case says
 * it is present, so the pointer is set. Guard anyway. */
static int body_present_(const M6__Request *rq)
{
    return rq->hello != NULL;  /* union: any member */
}

static uint8_t *pack_(const M6__Response *resp, size_t *outlen)
{
    return frame_pack(&resp->base, outlen);
}

int handlers_is_slow(const uint8_t *payload, size_t len)
{
    M6__Request *rq = m6__request__unpack(NULL, len, payload);
    if (!rq) return 0;
    int slow = rq->body_case == M6__REQUEST__BODY_SUBMIT ||
               rq->body_case == M6__REQUEST__BODY_PLAN ||
               rq->body_case == M6__REQUEST__BODY_METRICS ||
               rq->body_case == M6__REQUEST__BODY_RESUME ||
               rq->body_case == M6__REQUEST__BODY_RESUME_AT;
    m6__request__free_unpacked(rq, NULL);
    return slow;
}

uint8_t *handlers_error_frame(int status, const char *message, size_t *outlen)
{
    M6__Response resp = M6__RESPONSE__INIT;
    resp.status = (M6__Status)status;
    resp.message = (char *)message;
    return pack_(&resp, outlen);
}

/* /metrics' m6_control_requests_total{type, status}: the status by its
 * proto name, "STATUS_NOT_FOUND" as "not_found". */
static void count_(handlers_ctx *h, const char *type, M6__Status st)
{
    if (!h->stats) return;
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&m6__status__descriptor, (int)st);
    char name[32] = "unknown";
    if (v && !strncmp(v->name, "STATUS_", 7)) {
        snprintf(name, sizeof name, "%s", v->name + 7);
        for (char *p = name; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    }
    stats_request(h->stats, type, name);
}

int handlers_dispatch(handlers_ctx *h, session *s, const uint8_t *payload,
                      size_t len, uint8_t **out, size_t *outlen,
                      int *close_after)
{
    arena a = {0};
    M6__Response resp = M6__RESPONSE__INIT;
    call c = {.h = h, .s = s, .a = &a, .resp = &resp};
    M6__Request *rq = m6__request__unpack(NULL, len, payload);
    const char *name = "?";
    const handler_entry *e = NULL;
    if (!rq) {
        reply_(&c, M6__STATUS__STATUS_BAD_REQUEST,
               "malformed request: %zu bytes that do not decode as m6.Request",
               len);
        c.close_after = 1;
        goto done;
    }
    for (size_t i = 0; i < sizeof table_ / sizeof table_[0]; i++)
        if (table_[i].which == rq->body_case) e = &table_[i];
    if (!e || !body_present_(rq)) {
        reply_(&c, M6__STATUS__STATUS_UNKNOWN_REQUEST,
               "unknown request type (this m6d speaks protocol %u)",
               M6_PROTOCOL_VERSION);
        goto done;
    }
    name = e->name;
    /* access: the peer's rights, set by the server from SO_PEERCRED */
    if (s->denied[0]) {
        reply_(&c, M6__STATUS__STATUS_PERMISSION_DENIED, "%s", s->denied);
        c.close_after = 1;
        goto done;
    }
    if (s->read_only && !handlers_is_read(rq->body_case)) {
        char reads[256];
        reads_named_(reads, sizeof reads);
        reply_(&c, M6__STATUS__STATUS_PERMISSION_DENIED,
               "permission denied: uid %u may only read on this m6d "
               "(--group-read-only): %s refused; the reads are %s",
               s->peer_uid, name, reads);
        goto done;
    }
    if (!s->hello_done && rq->body_case != M6__REQUEST__BODY_HELLO) {
        reply_(&c, M6__STATUS__STATUS_NEED_HELLO,
               "send Hello with protocol_version %u first", M6_PROTOCOL_VERSION);
        goto done;
    }
    e->fn(&c, rq);
done:
    if (resp.status == M6__STATUS__STATUS_UNKNOWN_REQUEST ||
        resp.status == M6__STATUS__STATUS_NEED_HELLO) {
        if (++s->protocol_refusals >= HANDLERS_PROTOCOL_REFUSALS_MAX &&
            !c.close_after) {
            c.close_after = 1;
            log_warn("conn.protocol_refusals", "refusals=%d msg=\"closing "
                     "the connection: %d requests in a row that are not "
                     "m6's protocol\"", s->protocol_refusals,
                     s->protocol_refusals);
        }
    } else {
        s->protocol_refusals = 0;
    }
    count_(h, !rq ? "malformed" : strcmp(name, "?") ? name : "unknown",
           resp.status);
    if (resp.status == M6__STATUS__STATUS_PERMISSION_DENIED)
        log_warn("request.refused", "request=%s status=%d msg=\"%s\"", name,
                 resp.status, resp.message ? resp.message : "");
    else if (resp.status != M6__STATUS__STATUS_OK)
        log_info("request.refused", "request=%s status=%d msg=\"%s\"", name,
                 resp.status, resp.message ? resp.message : "");
    else
        log_debug("request", "request=%s", name);
    *out = pack_(&resp, outlen);
    if (!*out) {  /* too big or OOM: say so in a small frame */
        *out = handlers_error_frame(M6__STATUS__STATUS_INTERNAL,
                                    "reply too large or out of memory", outlen);
    }
    *close_after = c.close_after;
    if (rq) m6__request__free_unpacked(rq, NULL);
    arena_free_(&a);
    return *out ? 0 : -1;
}
