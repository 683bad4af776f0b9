/*
 * coordinator.c — the coordinator's TCP listener, peers, node registry and
 * the store's admission (see coordinator.h); the store's keys and
 * requests are coordinator_store.c.
 *
 * Lifetimes (libuv rules, as in control/server.c): a peer owns two handles
 * (its TCP stream and a timer: the first-frame deadline, then a parked
 * store request's deadline); it is freed when both close callbacks have
 * run. A write request is freed in its callback whatever the status; every
 * callback checks whether its peer is closing.
 */
#include "cluster/coordinator.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/rankboard.h"
#include "common/readbuf.h"
#include "common/uvw.h"
#include "cluster/tls.h"
#include "proto/frame.h"
#include "dist/store.h"
#include "m6.pb-c.h"
#include "cluster/coordinator_internal.h"

/* ------------------------------------------------------------------- peers */

void coord_peer_free_keys(peer *p)
{
    for (size_t i = 0; i < p->n_keys; i++) free(p->keys[i]);
    free(p->keys);
    p->keys = NULL;
    p->n_keys = 0;
    p->parked = 0;
}

static void handle_closed_(uv_handle_t *h)
{
    peer *p = h->data;
    if (--p->handles_open > 0) return;
    cluster_tls_free(&p->tls);
    frame_reader_free(&p->rd);
    coord_peer_free_keys(p);
    free(p);
}

/* The node's registry row after its connection ends or goes silent. */
static void node_gone_(peer *p, node_state s, const char *cause)
{
    if (p->kind != PEER_NODE || !p->node_id) return;
    cluster_coord *co = p->co;
    const char *kind = s == NODE_LEFT ? "node.left" : "node.lost";
    if (s == NODE_LEFT)
        log_info(kind, "node=%lld hostname=%s peer=%s", (long long)p->node_id,
                 p->hostname, p->addr);
    else
        log_warn(kind, "node=%lld hostname=%s peer=%s cause=\"%s\"",
                 (long long)p->node_id, p->hostname, p->addr, cause);
    if (p->arun > 0) {
        /* its ranks of the run of its latest assignment (dp.h) are gone,
         * lost or stopped: the run's lost ranks if it was still in that
         * generation (its other ranks' collectives fail or time out and
         * the run pauses, naming them) */
        run_lost l = {.node_id = p->node_id, .rank = p->arank,
                      .local_rank = 0,
                      .ranks = p->aranks > 1 ? p->aranks : 1};
        snprintf(l.hostname, sizeof l.hostname, "%s", p->hostname);
        snprintf(l.why, sizeof l.why, "node %s: %s",
                 s == NODE_LEFT ? "left" : "lost", cause);
        coord_rank_lost(co, p->arun, p->agen, &l);
    }
    if (s == NODE_LOST && p->arun > 0) {
        /* the run's own event */
        if (p->aranks > 1) {
            /* every local rank of the node went with it */
            state_event(co->st, p->arun, "nodes.rank_lost",
                        "node=%lld hostname=%s rank=%d ranks=%d-%d "
                        "local_ranks=0-%d cause=\"%s\"",
                        (long long)p->node_id, p->hostname, p->arank,
                        p->arank, p->arank + p->aranks - 1, p->aranks - 1,
                        cause);
            log_warn("run.rank_lost", "run=%lld node=%lld hostname=%s "
                     "rank=%d ranks=%d-%d", (long long)p->arun,
                     (long long)p->node_id, p->hostname, p->arank, p->arank,
                     p->arank + p->aranks - 1);
        } else {
            state_event(co->st, p->arun, "nodes.rank_lost",
                        "node=%lld hostname=%s rank=%d cause=\"%s\"",
                        (long long)p->node_id, p->hostname, p->arank, cause);
            log_warn("run.rank_lost", "run=%lld node=%lld hostname=%s "
                     "rank=%d", (long long)p->arun, (long long)p->node_id,
                     p->hostname, p->arank);
        }
    }
    state_node_set_state(co->st, p->node_id, s, cause);
    state_event(co->st, 0, kind, "node=%lld hostname=%s peer=%s cause=\"%s\"",
                (long long)p->node_id, p->hostname, p->addr, cause);
    p->node_id = 0;
}

static void peer_close_(peer *p, const char *cause)
{
    if (p->closing) return;
    p->closing = 1;
    node_gone_(p, NODE_LOST, cause);
    if (p->kind == PEER_NEW) p->co->n_new--;
    if (p->prev) p->prev->next = p->next;
    else p->co->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    log_debug("cluster.close", "peer=%s conn=%lu cause=\"%s\"", p->addr, p->id,
              cause);
    uv_close((uv_handle_t *)&p->timer, handle_closed_);
    uv_close((uv_handle_t *)&p->tcp, handle_closed_);
}

static void write_done_(void *owner, int status, int close_after)
{
    peer *p = owner;
    if (p->closing) return;
    if (status < 0) peer_close_(p, uv_strerror(status));
    else if (close_after) peer_close_(p, "refused");
}

/* Send the ciphertext TLS has queued (handshake messages, records, an
 * alert); close the connection after it when close_after (at once when
 * there is none). */
static void flush_(peer *p, int close_after)
{
    if (p->closing) return;
    uint8_t *buf;
    size_t len;
    int rc = cluster_tls_take_out(&p->tls, &buf, &len) < 0 ? UV_ENOMEM : 0;
    if (rc == 0 && !buf) {
        if (close_after) peer_close_(p, "refused");
        return;
    }
    if (rc == 0)
        rc = uvw_send((uv_stream_t *)&p->tcp, buf, len, p, close_after,
                      write_done_);
    if (rc < 0)
        peer_close_(p, rc == UV_ENOMEM ? "out of memory" : uv_strerror(rc));
}

/* Queue a Response (inside TLS); close the connection after it when
 * close_after. */
void coord_send(peer *p, const M6__Response *resp, int close_after)
{
    if (p->closing) return;
    size_t len;
    uint8_t *buf = frame_pack(&resp->base, &len);
    int rc = buf ? cluster_tls_write(&p->tls, buf, len) : -1;
    free(buf);
    if (rc < 0) return peer_close_(p, "cannot encrypt a reply");
    flush_(p, close_after);
}

void coord_reply_status(peer *p, M6__Status st, const char *msg,
                          int close_after)
{
    M6__Response r = M6__RESPONSE__INIT;
    r.status = st;
    r.message = (char *)msg;
    coord_send(p, &r, close_after);
}

static void hard_close_(uv_timer_t *t)
{
    peer *p = t->data;
    if (!p->closing) peer_close_(p, "refusal not taken within the deadline");
}

/* The log line of a refusal, at most one per address and reason per
 * CLUSTER_REFUSAL_LOG_MS: the ones in between are counted and the count
 * comes with the next line (suppressed=N), so a flood of hostile
 * connections costs a few lines a minute (a handful of reasons), not one
 * each. An address and reason not in the table takes the slot used
 * longest ago only if that one's interval is over; while all are recent
 * (a flood from many addresses), the refusals of the addresses outside
 * the table share one line per interval (others=1, suppressed=N). */
void coord_log_refusal(cluster_coord *co, const peer *p, const char *why)
{
    uint64_t now = uv_now(co->loop);
    struct refusal_log *e = NULL, *oldest = &co->refusals[0];
    for (size_t i = 0; i < sizeof co->refusals / sizeof co->refusals[0]; i++) {
        struct refusal_log *r = &co->refusals[i];
        if (r->host[0] && strcmp(r->host, p->host) == 0 &&
            strncmp(r->why, why, sizeof r->why - 1) == 0) {
            e = r;
            break;
        }
        if (r->last_ms < oldest->last_ms) oldest = r;
    }
    if (e && e->last_ms && now - e->last_ms < CLUSTER_REFUSAL_LOG_MS) {
        e->suppressed++;
        return;
    }
    if (!e && oldest->host[0] && now - oldest->last_ms < CLUSTER_REFUSAL_LOG_MS) {
        if (co->other_last_ms && now - co->other_last_ms < CLUSTER_REFUSAL_LOG_MS) {
            co->other_suppressed++;
            return;
        }
        log_warn("cluster.refused", "peer=%s reason=\"%s\" suppressed=%lu "
                 "others=1", p->addr, why, co->other_suppressed);
        co->other_last_ms = now ? now : 1;
        co->other_suppressed = 0;
        return;
    }
    if (!e) {  /* a new address takes the slot used longest ago */
        e = oldest;
        snprintf(e->host, sizeof e->host, "%s", p->host);
        snprintf(e->why, sizeof e->why, "%s", why);
        e->suppressed = 0;
    }
    log_warn("cluster.refused", "peer=%s reason=\"%s\" suppressed=%lu",
             p->addr, why, e->suppressed);
    e->last_ms = now ? now : 1;
    e->suppressed = 0;
}

/* Refuse a peer: one status, a log line with its address, then close.
 * Reading stops: nothing it sends afterwards is looked at. A peer that
 * does not take even the refusal is closed at the first-frame deadline.
 * A peer that has not finished the TLS handshake gets no status (there is
 * no channel to send it on): only the TLS alert, if any, then the close. */
static void refuse_(peer *p, M6__Status st, const char *msg, const char *why)
{
    coord_log_refusal(p->co, p, why);
    if (p->reading) uv_read_stop((uv_stream_t *)&p->tcp);
    p->reading = 0;
    coord_peer_free_keys(p);
    uv_timer_start(&p->timer, hard_close_, (uint64_t)p->co->auth_ms, 0);
    if (p->tls.handshaken) coord_reply_status(p, st, msg, 1);
    else flush_(p, 1);
}

/* ------------------------------------------------------------ node registry */

static int valid_name_(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 255) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789.-_", s[i]))
            return 0;
    return 1;
}

static int valid_uuid_(const char *s)
{
    if (!s || strlen(s) != 32) return 0;
    for (int i = 0; i < 32; i++)
        if (!strchr("0123456789abcdef", s[i])) return 0;
    return 1;
}

static peer *peer_of_node_(cluster_coord *co, int64_t id)
{
    for (peer *q = co->peers; q; q = q->next)
        if (q->kind == PEER_NODE && q->node_id == id && !q->closing) return q;
    return NULL;
}

/* Whether the join presents the secret of node row r (constant time). A
 * row without one (written before node secrets) takes any: the join is
 * then issued one. */
static int secret_ok_(const node_row *r, ProtobufCBinaryData sec)
{
    if (!r->secret_sha256[0]) return 1;
    char h[65];
    cluster_secret_hash(sec.data, sec.len, h);
    return sec.len == CLUSTER_SECRET_LEN &&
           strlen(r->secret_sha256) == 64 &&
           CRYPTO_memcmp(h, r->secret_sha256, 64) == 0;
}

/* A fresh node secret into s and its hash into hex. 0, or -1. */
static int new_secret_(uint8_t s[CLUSTER_SECRET_LEN], char hex[65])
{
    if (getrandom(s, CLUSTER_SECRET_LEN, 0) != CLUSTER_SECRET_LEN) return -1;
    cluster_secret_hash(s, CLUSTER_SECRET_LEN, hex);
    return 0;
}

static void do_join_(peer *p, const M6__NodeJoin *j)
{
    cluster_coord *co = p->co;
    char msg[768];
    const char *backend = j->backend ? j->backend : "";
    if (!valid_name_(j->hostname) || !valid_uuid_(j->node_uuid) ||
        (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) ||
        j->devices < 0 || j->devices > 4096) {
        snprintf(msg, sizeof msg, "bad NodeJoin: want a hostname of 1..255 "
                 "letters, digits, '.', '-' or '_', a node_uuid of 32 hex "
                 "digits, backend cpu or cuda and devices 0..4096");
        return refuse_(p, M6__STATUS__STATUS_BAD_REQUEST, msg, "bad NodeJoin");
    }
    node_row n = {0};
    snprintf(n.hostname, sizeof n.hostname, "%s", j->hostname);
    snprintf(n.node_uuid, sizeof n.node_uuid, "%s", j->node_uuid);
    snprintf(n.backend, sizeof n.backend, "%s", backend);
    snprintf(n.address, sizeof n.address, "%s", p->addr);
    /* what it says of its GEMM, for display: printable ASCII, truncated */
    for (size_t i = 0; j->gemm && j->gemm[i] && i + 1 < sizeof n.gemm; i++)
        n.gemm[i] = j->gemm[i] >= 0x20 && j->gemm[i] < 0x7f ? j->gemm[i]
                                                             : '?';
    n.devices = j->devices;
    n.memory = j->memory;
    n.free_device_memory = j->free_device_memory;
    n.state = NODE_JOINING;

    node_row by_uuid, by_host;
    int ru = state_node_find(co->st, 'u', j->node_uuid, &by_uuid);
    int rh = state_node_find(co->st, 'h', j->hostname, &by_host);
    if (ru < 0 || rh < 0)
        return refuse_(p, M6__STATUS__STATUS_INTERNAL,
                       "the coordinator's database failed; see its log",
                       "database error");
    int64_t id = 0;
    const char *how;
    uint8_t secret[CLUSTER_SECRET_LEN];
    int issue = 0;  /* a new secret goes with the reply */
    if (ru == 0 && !by_uuid.coordinator &&
        !secret_ok_(&by_uuid, j->node_secret)) {
        /* a known node id without its secret: whoever learnt the id does
         * not get the node's place; the live node keeps it */
        snprintf(msg, sizeof msg, "join of node %lld (%s) without its node "
                 "secret", (long long)by_uuid.id, by_uuid.hostname);
        return refuse_(p, M6__STATUS__STATUS_UNAUTHENTICATED,
                       "this node id is registered with a node secret that "
                       "this join did not present (if this node's state "
                       "directory was reset, remove its node-id file to "
                       "join as a new node)", msg);
    }
    if (ru == 0 && by_uuid.coordinator) {
        return refuse_(p, M6__STATUS__STATUS_BAD_STATE,
                       "this node id is the coordinator's own: a worker "
                       "needs its own --state-dir", "coordinator's node id");
    } else if (ru == 0) {
        /* the same node again: a restart, or a new connection after a
         * network cut; its hostname may have changed (--node-name) */
        if (rh == 0 && by_host.id != by_uuid.id) {
            snprintf(msg, sizeof msg, "hostname %s is taken by node %lld "
                     "(another node id); node %lld keeps its name %s",
                     n.hostname, (long long)by_host.id,
                     (long long)by_uuid.id, by_uuid.hostname);
            return refuse_(p, M6__STATUS__STATUS_BAD_STATE, msg,
                           "hostname taken");
        }
        id = by_uuid.id;
        how = "reconnect";
        snprintf(n.secret_sha256, sizeof n.secret_sha256, "%s",
                 by_uuid.secret_sha256);
        issue = !n.secret_sha256[0];
        if (issue && new_secret_(secret, n.secret_sha256) < 0)
            return refuse_(p, M6__STATUS__STATUS_INTERNAL,
                           "the coordinator cannot make a node secret; see "
                           "its log", "getrandom failed");
        peer *old = peer_of_node_(co, id);
        if (old) {  /* the new connection replaces it: not lost */
            old->node_id = 0;
            peer_close_(old, "replaced by a reconnect of the same node");
        }
        if (state_node_update(co->st, id, &n) != 0)
            return refuse_(p, M6__STATUS__STATUS_INTERNAL,
                           "the coordinator's database failed; see its log",
                           "database error");
    } else if (rh == 0 && (by_host.coordinator ||
                           by_host.state == NODE_JOINING ||
                           by_host.state == NODE_LIVE)) {
        /* the peer learns that the name is taken, not by whom: the
         * live node's id and address stay in the log */
        char why[512];
        snprintf(why, sizeof why, "duplicate hostname %s: node %lld (%s, "
                 "joined from %s)", n.hostname, (long long)by_host.id,
                 by_host.coordinator ? "the coordinator"
                                     : node_state_name(by_host.state),
                 by_host.address[0] ? by_host.address : "this host");
        snprintf(msg, sizeof msg, "duplicate hostname: %s is taken by "
                 "another node that is joining or live; a second node with "
                 "that name is refused: give it another one (m6d "
                 "--node-name) or stop the other first", n.hostname);
        return refuse_(p, M6__STATUS__STATUS_BAD_STATE, msg, why);
    } else if (rh == 0) {
        /* a lost or left node's name, from another node id (a
         * reinstalled machine): the newcomer takes the row over, with a
         * secret of its own */
        id = by_host.id;
        how = "replace";
        issue = 1;
        if (new_secret_(secret, n.secret_sha256) < 0 ||
            state_node_update(co->st, id, &n) != 0)
            return refuse_(p, M6__STATUS__STATUS_INTERNAL,
                           "the coordinator's database failed; see its log",
                           "database error");
    } else {
        how = "join";
        issue = 1;
        if (new_secret_(secret, n.secret_sha256) < 0 ||
            state_node_insert(co->st, &n, &id) != 0)
            return refuse_(p, M6__STATUS__STATUS_INTERNAL,
                           "the coordinator's database failed; see its log",
                           "database error");
    }
    uv_timer_stop(&p->timer);
    p->kind = PEER_NODE;
    co->n_new--;
    p->node_id = id;
    snprintf(p->hostname, sizeof p->hostname, "%s", n.hostname);
    p->last_hb = uv_now(co->loop);
    char ev[32];
    snprintf(ev, sizeof ev, "node.%s", how);
    log_info(ev, "node=%lld hostname=%s peer=%s backend=%s devices=%d "
             "memory=%llu free_device_memory=%llu%s", (long long)id,
             n.hostname, p->addr, n.backend, n.devices,
             (unsigned long long)n.memory,
             (unsigned long long)n.free_device_memory,
             strcmp(how, "replace") == 0
                 ? " msg=\"a new node id took over a lost or left node's "
                   "hostname\"" : "");
    state_event(co->st, 0, ev, "node=%lld hostname=%s peer=%s backend=%s "
                "devices=%d", (long long)id, n.hostname, p->addr, n.backend,
                n.devices);

    M6__NodeJoinReply jr = M6__NODE_JOIN_REPLY__INIT;
    jr.node_id = id;
    jr.timeout_ms = (uint32_t)co->timeout_ms;
    jr.heartbeat_ms = (uint32_t)(co->timeout_ms / 3 > 0 ? co->timeout_ms / 3 : 1);
    jr.reconnect = strcmp(how, "reconnect") == 0;
    jr.server = (char *)"m6d " M6_VERSION;
    if (issue) {
        jr.node_secret.data = secret;
        jr.node_secret.len = CLUSTER_SECRET_LEN;
    }
    M6__Response r = M6__RESPONSE__INIT;
    r.body_case = M6__RESPONSE__BODY_NODE_JOIN;
    r.node_join = &jr;
    snprintf(msg, sizeof msg, "%s as node %lld", how, (long long)id);
    r.message = msg;
    coord_send(p, &r, 0);
}

/* run's entry in the generations list (made at generation 0 when it has
 * none), with co->amu held; NULL when out of memory */
static run_gen *run_gen_entry_(cluster_coord *co, int64_t run)
{
    run_gen *rg = co->gens;
    while (rg && rg->run != run) rg = rg->next;
    if (!rg && (rg = calloc(1, sizeof *rg))) {
        rg->run = run;
        rg->next = co->gens;
        co->gens = rg;
    }
    return rg;
}

/* rg's generation is gen if that is newer: nothing lost in it yet */
static void run_gen_newer_(run_gen *rg, int64_t gen)
{
    if (gen <= rg->gen) return;
    rg->gen = gen;
    rg->has_lost = 0;
}

/* The assignment for node id, unlinked (the caller frees it), or NULL. */
static assign_entry *take_assign_(cluster_coord *co, int64_t id)
{
    pthread_mutex_lock(&co->amu);
    assign_entry **pp = &co->assigns, *a = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->node_id == id) {
            a = *pp;
            *pp = a->next;
            break;
        }
    pthread_mutex_unlock(&co->amu);
    return a;
}

int cluster_coord_assign(cluster_coord *co, int64_t node_id, int64_t run,
                         const char *spec, int rank, int world, int64_t gen,
                         int timeout_ms)
{
    return cluster_coord_assign_ranks(co, node_id, run, spec, rank, 1, world,
                                      gen, timeout_ms);
}

int cluster_coord_assign_ranks(cluster_coord *co, int64_t node_id,
                               int64_t run, const char *spec, int rank,
                               int ranks, int world, int64_t gen,
                               int timeout_ms)
{
    assign_entry *a = calloc(1, sizeof *a);
    if (!a || !(a->spec = strdup(spec))) {
        free(a);
        return -1;
    }
    a->node_id = node_id;
    a->run = run;
    a->rank = rank;
    a->ranks = ranks < 1 ? 1 : ranks;
    a->world = world;
    a->gen = gen;
    a->timeout_ms = timeout_ms;
    assign_entry *old = take_assign_(co, node_id);  /* the newer replaces */
    if (old) {
        free(old->spec);
        free(old);
    }
    pthread_mutex_lock(&co->amu);
    run_gen *rg = run_gen_entry_(co, run);
    if (!rg) {
        pthread_mutex_unlock(&co->amu);
        free(a->spec);
        free(a);
        return -1;
    }
    run_gen_newer_(rg, gen);
    a->next = co->assigns;
    co->assigns = a;
    if (!co->push_closed)
        uv_async_send(&co->push);  /* sent now, not on a heartbeat */
    pthread_mutex_unlock(&co->amu);
    return 0;
}

/* A worker's heartbeat: where its ranks stand, onto the board (for
 * m6ctl status; rankboard.h). A state this m6d does not know is left
 * out. */
static void put_ranks_(int64_t node_id, const M6__NodeHeartbeat *hb)
{
    static rank_entry e[RANKBOARD_DEVICES_MAX];  /* the loop thread's */
    int n = 0;
    for (size_t i = 0; i < hb->n_ranks && n < RANKBOARD_DEVICES_MAX; i++) {
        const M6__RankState *r = hb->ranks[i];
        int st = rankboard_state_parse(r->state);
        if (st < 0) continue;
        e[n] = (rank_entry){.run = r->run_id, .rank = r->rank,
                            .local_rank = r->local_rank, .step = r->step,
                            .state = (rank_state)st};
        snprintf(e[n].reason, sizeof e[n].reason, "%s",
                 r->reason ? r->reason : "");
        n++;
    }
    rankboard_put_node(node_id, e, n);
}

/* Send assignment a (taken from the queue; freed here) to node p as a
 * RunAssign response: on the reply to its heartbeat, or pushed as soon as
 * it is queued (push_cb_; a worker takes a RunAssign whenever it comes). */
static void send_assign_(peer *p, assign_entry *a)
{
    M6__RunAssign ra = M6__RUN_ASSIGN__INIT;
    ra.run_id = a->run;
    ra.spec = a->spec;
    ra.rank = a->rank;
    ra.local_ranks = a->ranks > 1 ? a->ranks : 0;  /* 0: one, as before */
    ra.world_size = a->world;
    ra.generation = a->gen;
    ra.timeout_ms = a->timeout_ms;
    M6__Response r = M6__RESPONSE__INIT;
    r.status = M6__STATUS__STATUS_OK;
    r.message = (char *)"";
    r.body_case = M6__RESPONSE__BODY_RUN_ASSIGN;
    r.run_assign = &ra;
    coord_send(p, &r, 0);
    p->arun = a->run;
    p->arank = a->rank;
    p->aranks = a->ranks;
    p->agen = a->gen;
    free(a->spec);
    free(a);
}

/* Assignments queued by a runner thread go out at once to the nodes
 * connected now (the others' on their next heartbeat, when they are). */
static void push_cb_(uv_async_t *h)
{
    cluster_coord *co = h->data;
    for (peer *p = co->peers; p; p = p->next) {
        if (!p->node_id)
            continue;  /* not a node yet, or replaced */
        assign_entry *a = take_assign_(co, p->node_id);
        if (a)
            send_assign_(p, a);
    }
}

static void do_node_frame_(peer *p, const M6__Request *rq)
{
    cluster_coord *co = p->co;
    p->last_hb = uv_now(co->loop);
    if (!p->node_id) return;  /* replaced: closing */
    switch (rq->body_case) {
    case M6__REQUEST__BODY_NODE_HEARTBEAT: {
        state_node_heartbeat(co->st, p->node_id,
                             rq->node_heartbeat->free_device_memory);
        put_ranks_(p->node_id, rq->node_heartbeat);
        assign_entry *a = take_assign_(co, p->node_id);
        if (!a) {
            coord_reply_status(p, M6__STATUS__STATUS_OK, "", 0);
            return;
        }
        send_assign_(p, a);
        return;
    }
    case M6__REQUEST__BODY_NODE_LEAVE:
        node_gone_(p, NODE_LEFT, "the node stopped (NodeLeave)");
        coord_reply_status(p, M6__STATUS__STATUS_OK, "left", 1);
        return;
    default:
        coord_reply_status(p, M6__STATUS__STATUS_UNKNOWN_REQUEST,
                      "a node connection takes NodeHeartbeat and NodeLeave "
                      "only", 0);
    }
}

static int64_t self_id_(state *st, const char *uuid)
{
    node_row r;
    return state_node_find(st, 'u', uuid, &r) == 0 ? r.id : 0;
}

int cluster_self_register(state *st, const cluster_facts *f,
                          const char *uuid, const char *secret_sha256,
                          char *err, size_t errlen)
{
    node_row n = {0}, old;
    snprintf(n.hostname, sizeof n.hostname, "%s", f->hostname);
    snprintf(n.secret_sha256, sizeof n.secret_sha256, "%s",
             secret_sha256 ? secret_sha256 : "");
    snprintf(n.node_uuid, sizeof n.node_uuid, "%s", uuid);
    snprintf(n.backend, sizeof n.backend, "%s", f->backend);
    snprintf(n.gemm, sizeof n.gemm, "%s", f->gemm);
    n.coordinator = 1;
    n.devices = f->devices;
    n.memory = f->memory;
    n.free_device_memory = f->free_device_memory;
    n.state = NODE_LIVE;
    int marked = state_nodes_mark(st, NODE_LIVE, NODE_LOST,
                                  "coordinator restarted; until the node "
                                  "reconnects");
    if (marked >= 0)
        marked += state_nodes_mark(st, NODE_JOINING, NODE_LOST,
                                   "coordinator restarted; until the node "
                                   "reconnects");
    if (marked > 0)
        log_info("node.lost", "nodes=%d cause=\"coordinator restarted; "
                 "until they reconnect\"", marked);
    /* a kill -9 left the previous life's assignments in place (a run's
     * end clears them, dp.c): no node holds a rank now */
    if (state_nodes_clear_runs(st) != 0) {
        snprintf(err, errlen, "nodes table: database error");
        return -1;
    }
    int rh = state_node_find(st, 'h', n.hostname, &old);
    int64_t id = self_id_(st, uuid);
    if (rh == 0 && old.id != id) {
        snprintf(err, errlen, "hostname %s is node %lld's (node id %s) in "
                 "m6.db: this m6d is not listed in its own nodes table",
                 n.hostname, (long long)old.id, old.node_uuid);
        return -1;
    }
    int rc = id ? state_node_update(st, id, &n) : state_node_insert(st, &n, &id);
    if (rc != 0) {
        snprintf(err, errlen, "nodes table: database error");
        return -1;
    }
    return 0;
}

void cluster_self_leave(state *st, const char *uuid)
{
    int64_t id = self_id_(st, uuid);
    if (id) state_node_set_state(st, id, NODE_LEFT, "m6d stopped");
}

int cluster_coord_nodes_fit(cluster_coord *c, uint64_t bytes_per_node,
                            int64_t *ids, int max)
{
    node_row *rows;
    int n, k = 0;
    if (state_nodes_list(c->st, &rows, &n) < 0) return -1;
    for (int i = 0; i < n && k < max; i++)
        if (!rows[i].coordinator && rows[i].state == NODE_LIVE &&
            rows[i].free_device_memory >= bytes_per_node)
            ids[k++] = rows[i].id;
    free(rows);
    return k;
}

void cluster_coord_run_generation(cluster_coord *co, int64_t run, int64_t gen)
{
    pthread_mutex_lock(&co->amu);
    run_gen *rg = run_gen_entry_(co, run);
    if (rg) run_gen_newer_(rg, gen);
    pthread_mutex_unlock(&co->amu);
}

int cluster_coord_nodes_slots(cluster_coord *c, int64_t *ids, int *slots,
                              int max)
{
    node_row *rows;
    int n, k = 0;
    if (state_nodes_list(c->st, &rows, &n) < 0) return -1;
    for (int i = 0; i < n && k < max; i++)
        if (!rows[i].coordinator && rows[i].state == NODE_LIVE) {
            ids[k] = rows[i].id;
            slots[k++] = rows[i].devices > 1 ? rows[i].devices : 1;
        }
    free(rows);
    return k;
}

/* The latest generation assigned in run (0: none). */
static int64_t run_gen_(cluster_coord *co, int64_t run)
{
    pthread_mutex_lock(&co->amu);
    int64_t g = 0;
    for (run_gen *rg = co->gens; rg; rg = rg->next)
        if (rg->run == run) g = rg->gen;
    pthread_mutex_unlock(&co->amu);
    return g;
}

/* ------------------------------------------------------- lost ranks */

void coord_rank_lost(cluster_coord *co, int64_t run, int64_t gen,
                     const run_lost *l)
{
    pthread_mutex_lock(&co->amu);
    run_gen *rg = co->gens;
    while (rg && rg->run != run) rg = rg->next;
    if (rg && rg->gen == gen && gen > 0 && !rg->has_lost) {
        rg->lost = *l;
        rg->has_lost = 1;
        pthread_cond_broadcast(&co->lost_cv);
    }
    pthread_mutex_unlock(&co->amu);
}

int cluster_coord_rank_lost(cluster_coord *co, int64_t run, int wait_ms,
                            run_lost *out)
{
    /* lost_cv is on CLOCK_REALTIME (pthread_cond_init's default) */
    struct timespec until = clock_deadline(CLOCK_REALTIME, wait_ms);
    int found = 0;
    pthread_mutex_lock(&co->amu);
    for (;;) {
        for (run_gen *rg = co->gens; rg && !found; rg = rg->next)
            if (rg->run == run && rg->gen > 0 && rg->has_lost) {
                *out = rg->lost;
                found = 1;
            }
        if (found || pthread_cond_timedwait(&co->lost_cv, &co->amu,
                                            &until) != 0)
            break;
    }
    pthread_mutex_unlock(&co->amu);
    return found;
}

/* ------------------------------------------------- the store's admission */

/* Whether the StoreOpen's node id, secret and rank are a rank of (run,
 * gen) (coordinator.h); why says what is wrong when not. 1 yes, 0 no, -1
 * database error. */
static int store_who_ok_(cluster_coord *co, const M6__StoreOpen *so,
                         peer *p, char *why, size_t whylen)
{
    node_row r;
    int rf = valid_uuid_(so->node_uuid)
                 ? state_node_find(co->st, 'u', so->node_uuid, &r) : 1;
    if (rf < 0) return -1;
    if (rf != 0 || !r.secret_sha256[0] || !secret_ok_(&r, so->node_secret)) {
        snprintf(why, whylen, "store open without a node's id and secret");
        return 0;
    }
    /* a node's ranks: rank .. rank+ranks-1 of its run's latest
     * generation; the coordinator is rank 0 of any, and its other local
     * ranks (m6d --devices) are held like a worker's */
    int held = r.run == so->run_id && r.rank >= 0 && so->rank >= r.rank &&
               so->rank < r.rank + (r.ranks > 0 ? r.ranks : 1) &&
               run_gen_(co, so->run_id) == so->generation;
    if (r.coordinator ? so->rank != 0 && (so->rank < 1 || !held)
                      : so->rank < 1 || !held) {
        snprintf(why, whylen, "store open as rank %d of run %lld generation "
                 "%lld by node %lld (%s), which does not hold it", so->rank,
                 (long long)so->run_id, (long long)so->generation,
                 (long long)r.id, r.hostname);
        return 0;
    }
    /* who it is, for the events of what it reports (a rank's failure) */
    p->store_node = r.id;
    p->store_local = so->rank - (r.coordinator && so->rank == 0 ? 0 : r.rank);
    snprintf(p->hostname, sizeof p->hostname, "%s", r.hostname);
    return 1;
}

/* ------------------------------------------------------------ the framing */

static void first_frame_(peer *p, const uint8_t *payload, size_t len)
{
    cluster_coord *co = p->co;
    M6__Request *rq = m6__request__unpack(NULL, len, payload);
    if (!rq || (rq->body_case != M6__REQUEST__BODY_NODE_JOIN &&
                rq->body_case != M6__REQUEST__BODY_STORE_OPEN)) {
        refuse_(p, M6__STATUS__STATUS_UNAUTHENTICATED,
                "the first frame must be a NodeJoin or StoreOpen",
                rq ? "first frame is not NodeJoin/StoreOpen"
                   : "first frame does not decode");
        if (rq) m6__request__free_unpacked(rq, NULL);
        return;
    }
    int join = rq->body_case == M6__REQUEST__BODY_NODE_JOIN;
    uint32_t ver = join ? rq->node_join->protocol_version
                        : rq->store_open->protocol_version;
    /* the peer holds the token: it finished the TLS handshake keyed by it */
    if (ver != M6_PROTOCOL_VERSION) {
        char msg[128];
        snprintf(msg, sizeof msg, "bad version: peer speaks protocol %u, "
                 "m6d speaks %u", ver, M6_PROTOCOL_VERSION);
        refuse_(p, M6__STATUS__STATUS_BAD_VERSION, msg, "bad version");
    } else if (join) {
        do_join_(p, rq->node_join);
    } else {
        char why[400];
        int ok = store_who_ok_(co, rq->store_open, p, why, sizeof why);
        if (ok <= 0) {
            refuse_(p, ok < 0 ? M6__STATUS__STATUS_INTERNAL
                              : M6__STATUS__STATUS_UNAUTHENTICATED,
                    ok < 0 ? "the coordinator's database failed; see its log"
                           : "the store takes the ranks of a run only: this "
                             "node id, secret and rank are not one",
                    ok < 0 ? "database error" : why);
            m6__request__free_unpacked(rq, NULL);
            return;
        }
        uv_timer_stop(&p->timer);
        p->kind = PEER_STORE;
        co->n_new--;
        p->run = rq->store_open->run_id;
        p->gen = rq->store_open->generation;
        p->rank = rq->store_open->rank;
        if (p->rank == 0) coord_store_free_stale(co, p->run, p->gen);
        log_debug("store.open", "peer=%s run=%lld gen=%lld", p->addr,
                  (long long)p->run, (long long)p->gen);
        coord_reply_status(p, M6__STATUS__STATUS_OK, "store open", 0);
    }
    m6__request__free_unpacked(rq, NULL);
}

/* Handle the complete frames buffered, in order, until one is parked. */
void coord_pump(peer *p)
{
    while (!p->closing && !p->parked && p->reading) {
        if (p->kind == PEER_NEW &&
            frame_reader_pending(&p->rd) >= M6_FRAME_HDR) {
            uint32_t n = frame_get_len(p->rd.buf + p->rd.pos);
            if (n > CLUSTER_FIRST_FRAME_MAX) {
                char msg[128];
                snprintf(msg, sizeof msg, "first frame of %u bytes refused: "
                         "the limit is %u", n, CLUSTER_FIRST_FRAME_MAX);
                return refuse_(p, M6__STATUS__STATUS_TOO_LARGE, msg,
                               "first frame too large");
            }
        }
        const uint8_t *payload;
        size_t len;
        frame_result fr = frame_reader_next(&p->rd, &payload, &len);
        if (fr == FRAME_TOO_LARGE) {
            char msg[128];
            snprintf(msg, sizeof msg, "frame of %zu bytes refused: the limit "
                     "is %u", len, M6_FRAME_MAX);
            return refuse_(p, M6__STATUS__STATUS_TOO_LARGE, msg,
                           "frame too large");
        }
        if (fr == FRAME_NEED_MORE) return;
        if (p->kind == PEER_NEW) {
            first_frame_(p, payload, len);
            continue;
        }
        M6__Request *rq = m6__request__unpack(NULL, len, payload);
        if (!rq) {
            return refuse_(p, M6__STATUS__STATUS_BAD_REQUEST,
                           "malformed frame: does not decode as m6.Request",
                           "malformed frame");
        }
        if (p->kind == PEER_NODE) do_node_frame_(p, rq);
        else coord_store_request(p, rq);
        m6__request__free_unpacked(rq, NULL);
    }
}

static void read_cb_(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    peer *p = (peer *)s;
    if (p->closing) goto out;
    if (nread < 0) {
        peer_close_(p, nread == UV_EOF ? "connection closed by the peer"
                                       : uv_strerror((int)nread));
        goto out;
    }
    if (nread == 0) goto out;
    /* a parked request's peer may pipeline one frame ahead, no more */
    if (p->parked && frame_reader_pending(&p->rd) > M6_FRAME_HDR + M6_FRAME_MAX) {
        peer_close_(p, "sent too much while waiting for a reply");
        goto out;
    }
    char why[300];
    int was = p->tls.handshaken;
    cluster_tls_result tr = cluster_tls_feed(&p->tls, buf->base,
                                             (size_t)nread, &p->rd, why,
                                             sizeof why);
    if (tr == CLUSTER_TLS_FAILED) {
        /* the details here; the peer gets a TLS alert at most (refuse_
         * sends no status before the handshake is done) */
        if (!p->tls.handshaken) {
            refuse_(p, M6__STATUS__STATUS_UNAUTHENTICATED, "", why);
        } else {  /* a broken session: nothing more can be said on it */
            coord_log_refusal(p->co, p, why);
            peer_close_(p, why);
        }
        goto out;
    }
    flush_(p, 0);  /* the handshake's own messages */
    if (!was && p->tls.handshaken)
        log_debug("cluster.tls", "peer=%s conn=%lu msg=\"handshake done\"",
                  p->addr, p->id);
    if (tr == CLUSTER_TLS_CLOSED) {
        peer_close_(p, "connection closed by the peer");
        goto out;
    }
    coord_pump(p);
out:
    free(buf->base);
}

static void auth_timeout_(uv_timer_t *t)
{
    peer *p = t->data;
    if (p->closing || p->kind != PEER_NEW) return;
    char msg[128];
    snprintf(msg, sizeof msg, "no NodeJoin or StoreOpen within %d ms",
             p->co->auth_ms);
    refuse_(p, M6__STATUS__STATUS_UNAUTHENTICATED, msg,
            p->tls.handshaken ? "no first frame in time"
                              : "no TLS handshake in time");
}

static void peer_addr_(peer *p)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    char host[64] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&p->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(p->addr, sizeof p->addr, ss.ss_family == AF_INET6 ? "[%s]:%d"
             : "%s:%d", host, port);
    snprintf(p->host, sizeof p->host, "%s", host);
}

/* Make room for the new peer p among the unauthenticated: past
 * CLUSTER_PENDING_PER_ADDRESS from its address, or CLUSTER_PENDING_MAX in
 * all, the oldest such peer is closed (not the new one: a peer that
 * authenticates at once, as a worker does, then always gets its turn,
 * however many idle connections others open). */
static void make_room_(cluster_coord *co, peer *p)
{
    peer *oldest_here = NULL, *oldest = NULL;
    int here = 0;
    for (peer *o = co->peers; o; o = o->next) {  /* newest first */
        if (o == p || o->closing || o->kind != PEER_NEW) continue;
        oldest = o;
        if (strcmp(o->host, p->host) == 0) {
            here++;
            oldest_here = o;
        }
    }
    peer *evict = here >= CLUSTER_PENDING_PER_ADDRESS ? oldest_here
                  : co->n_new > CLUSTER_PENDING_MAX ? oldest : NULL;
    if (!evict) return;
    char why[160];
    snprintf(why, sizeof why, "evicted unauthenticated: %s", evict == oldest_here
             ? "too many from its address" : "too many in all");
    coord_log_refusal(co, evict, why);
    peer_close_(evict, why);
}

static void on_connection_(uv_stream_t *ls, int status)
{
    cluster_coord *co = (cluster_coord *)ls;
    if (status < 0) {
        log_warn("cluster.accept_error", "err=\"%s\"", uv_strerror(status));
        return;
    }
    peer *p = calloc(1, sizeof *p);
    if (!p) return;
    p->co = co;
    p->id = ++co->next_id;
    frame_reader_init(&p->rd);
    uv_tcp_init(co->loop, &p->tcp);
    uv_timer_init(co->loop, &p->timer);
    p->tcp.data = p->timer.data = p;
    p->handles_open = 2;
    p->next = co->peers;
    if (co->peers) co->peers->prev = p;
    co->peers = p;
    co->n_new++;
    int rc = uv_accept(ls, (uv_stream_t *)&p->tcp);
    if (rc < 0) {
        snprintf(p->addr, sizeof p->addr, "?");
        log_warn("cluster.accept_error", "err=\"%s\"", uv_strerror(rc));
        return peer_close_(p, "accept failed");
    }
    peer_addr_(p);
    make_room_(co, p);
    if (cluster_tls_init(&p->tls, co->tls, 1) < 0)
        return peer_close_(p, "out of memory (TLS)");
    uv_tcp_nodelay(&p->tcp, 1);
    rc = uv_read_start((uv_stream_t *)&p->tcp, readbuf_alloc, read_cb_);
    if (rc < 0)
        return peer_close_(p, uv_strerror(rc));
    p->reading = 1;
    uv_timer_start(&p->timer, auth_timeout_, (uint64_t)co->auth_ms, 0);
    log_debug("cluster.open", "peer=%s conn=%lu", p->addr, p->id);
}

/* Every node silent for timeout_ms is lost. */
static void sweep_cb_(uv_timer_t *t)
{
    cluster_coord *co = t->data;
    uint64_t now = uv_now(co->loop);
    for (peer *p = co->peers, *next; p; p = next) {
        next = p->next;
        if (p->kind == PEER_NODE && !p->closing && p->node_id &&
            now - p->last_hb > (uint64_t)co->timeout_ms) {
            char cause[128];
            snprintf(cause, sizeof cause, "no heartbeat for %llu ms (timeout "
                     "%d ms)", (unsigned long long)(now - p->last_hb),
                     co->timeout_ms);
            peer_close_(p, cause);
        }
    }
}

/* -------------------------------------------------------------- listener */

static void co_closed_(uv_handle_t *h)
{
    cluster_coord *co = h->data;
    if (--co->handles_open > 0) return;
    for (store_entry *e = co->store, *n; e; e = n) {
        n = e->next;
        free(e->key);
        free(e->val);
        free(e);
    }
    for (assign_entry *a = co->assigns, *n; a; a = n) {
        n = a->next;
        free(a->spec);
        free(a);
    }
    for (run_gen *rg = co->gens, *n; rg; rg = n) {
        n = rg->next;
        free(rg);
    }
    pthread_cond_destroy(&co->lost_cv);
    pthread_mutex_destroy(&co->amu);
    cluster_tls_ctx_free(co->tls);
    free(co);
}

cluster_coord *cluster_coord_init(const cluster_coord_config *cfg, char *err,
                                  size_t errlen)
{
    char host[256];
    int port;
    if (cluster_parse_addr(cfg->listen, 1, host, sizeof host, &port, err,
                           errlen) < 0)
        return NULL;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        snprintf(err, errlen, "--listen %s: %s is not an IPv4 or IPv6 "
                 "address (listen on an address, not a name)", cfg->listen,
                 host);
        return NULL;
    }
    cluster_coord *co = calloc(1, sizeof *co);
    if (!co) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    co->tls = cluster_tls_ctx(cfg->token, 1, err, errlen);
    if (!co->tls) {
        free(co);
        return NULL;
    }
    pthread_mutex_init(&co->amu, NULL);
    pthread_cond_init(&co->lost_cv, NULL);
    co->loop = cfg->loop;
    co->st = cfg->st;
    co->timeout_ms = cfg->timeout_ms;
    co->auth_ms = cfg->timeout_ms < CLUSTER_AUTH_TIMEOUT_MS
                      ? cfg->timeout_ms : CLUSTER_AUTH_TIMEOUT_MS;
    uv_tcp_init(co->loop, &co->listener);
    uv_timer_init(co->loop, &co->sweep);
    uv_async_init(co->loop, &co->push, push_cb_);
    co->listener.data = co->sweep.data = co->push.data = co;
    co->handles_open = 3;
    int rc = uv_tcp_bind(&co->listener, (struct sockaddr *)&ss, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&co->listener, 128,
                                on_connection_);
    if (rc < 0) {
        snprintf(err, errlen, "--listen %s: %s", cfg->listen, uv_strerror(rc));
        cluster_coord_fini(co);
        return NULL;
    }
    int len = sizeof ss;
    uv_tcp_getsockname(&co->listener, (struct sockaddr *)&ss, &len);
    co->port = ntohs(ss.ss_family == AF_INET6
                         ? ((struct sockaddr_in6 *)&ss)->sin6_port
                         : ((struct sockaddr_in *)&ss)->sin_port);
    uint64_t every = (uint64_t)(co->timeout_ms / 10 > 20 ? co->timeout_ms / 10 : 20);
    uv_timer_start(&co->sweep, sweep_cb_, every, every);
    log_info("cluster.listen", "addr=%s%s%s:%d timeout_ms=%d heartbeat_ms=%d",
             strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
             co->port, co->timeout_ms, co->timeout_ms / 3);
    return co;
}

int cluster_coord_port(const cluster_coord *c) { return c->port; }

void cluster_coord_fini(cluster_coord *co)
{
    if (!co) return;
    while (co->peers) {
        peer *p = co->peers;
        p->node_id = 0;  /* not lost: the coordinator goes, not the node */
        peer_close_(p, "coordinator stopping");
    }
    pthread_mutex_lock(&co->amu);
    co->push_closed = 1;
    pthread_mutex_unlock(&co->amu);
    uv_close((uv_handle_t *)&co->push, co_closed_);
    uv_close((uv_handle_t *)&co->sweep, co_closed_);
    uv_close((uv_handle_t *)&co->listener, co_closed_);
}
