/*
 * join.c — a worker node's registration and heartbeats (see join.h).
 *
 * Lifetimes: the join object holds two timers (attempt deadline or retry
 * delay; heartbeats), at most one TCP connection and at most one name
 * lookup in flight; it counts them in refs and is freed, after
 * cluster_join_fini, when the last of them has called back. A lookup or
 * connection of an attempt that has been given up is told apart by its
 * attempt number and dropped.
 */
#include "cluster/join.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rankboard.h"
#include "common/readbuf.h"
#include "common/uvw.h"
#include "cluster/tls.h"
#include "proto/frame.h"
#include "m6.pb-c.h"

enum { RETRY_MS_ = 500 };

typedef struct jconn {
    uv_tcp_t tcp;       /* first: handle <-> jconn */
    uv_connect_t creq;
    struct cluster_join *j;
    unsigned attempt;
    cluster_tls tls;    /* ciphertext in and out; plaintext frames in rd */
    frame_reader rd;
    int closing;
} jconn;

typedef struct {
    uv_getaddrinfo_t req;  /* first */
    struct cluster_join *j;
    unsigned attempt;
} gai_req;


struct cluster_join {
    uv_timer_t timer;   /* the attempt's deadline, or the retry's delay */
    uv_timer_t hb;
    uv_loop_t *loop;
    char addr[300], host[256], port[8];
    SSL_CTX *tls;       /* the PSK's client side (tls.h) */
    const cluster_facts *facts;
    char uuid[33];
    char state_dir[4096];
    uint8_t secret[CLUSTER_SECRET_LEN];  /* the node's secret, when has_secret */
    int has_secret;
    int timeout_ms;
    void (*on_fatal)(void *, const char *);
    void (*on_assign)(void *, const cluster_assign *);
    void *ud;

    jconn *c;           /* the current connection, or NULL */
    unsigned attempt;
    int refs;
    int finishing, fatal_done;
    int joined_once, live;
    int leaving;        /* NodeLeave queued: busy until written */
    uint64_t start, last_rx;
    int heartbeat_ms, coord_timeout_ms;
    int64_t node_id;
    char last_err[256];
    int cut;            /* this attempt was cut short by its deadline */
    uint64_t lost_at, last_warn;  /* uv_now: coordinator lost; last said so */
};

static void attempt_(cluster_join *j);
static void heartbeat_(uv_timer_t *t);

static void retry_cb_(uv_timer_t *t) { attempt_(t->data); }

static void unref_(cluster_join *j)
{
    if (--j->refs == 0 && j->finishing) {
        cluster_tls_ctx_free(j->tls);
        OPENSSL_cleanse(j->secret, sizeof j->secret);
        free(j);
    }
}

static void handle_closed_(uv_handle_t *h) { unref_(h->data); }

static void conn_closed_(uv_handle_t *h)
{
    jconn *c = (jconn *)h;
    cluster_join *j = c->j;
    cluster_tls_free(&c->tls);
    frame_reader_free(&c->rd);
    free(c);
    unref_(j);
}

static void conn_close_(cluster_join *j)
{
    jconn *c = j->c;
    j->c = NULL;
    j->live = 0;
    if (!c || c->closing) return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, conn_closed_);
}

static void fatal_(cluster_join *j, const char *msg)
{
    conn_close_(j);
    uv_timer_stop(&j->timer);
    uv_timer_stop(&j->hb);
    if (j->fatal_done) return;
    j->fatal_done = 1;
    j->on_fatal(j->ud, msg);
}

/* This attempt failed (why): retry, or give up on a first join whose time
 * is over. */
static void attempt_failed_(cluster_join *j, const char *why)
{
    conn_close_(j);
    uv_timer_stop(&j->timer);
    if (j->finishing || j->fatal_done) return;
    /* an attempt cut short by the deadline keeps the reason of the ones
     * before it (connection refused) */
    if (!j->cut || !j->last_err[0])
        snprintf(j->last_err, sizeof j->last_err, "%s", why);
    j->cut = 0;
    why = j->last_err;
    uint64_t now = uv_now(j->loop);
    if (!j->joined_once) {
        uint64_t spent = now - j->start;
        if (spent >= (uint64_t)j->timeout_ms) {
            char msg[640];
            snprintf(msg, sizeof msg, "cannot join the coordinator at %s "
                     "within %.1f s: %s", j->addr, j->timeout_ms / 1000.0, why);
            return fatal_(j, msg);
        }
        uint64_t left = (uint64_t)j->timeout_ms - spent;
        log_debug("cluster.join_retry", "coordinator=%s err=\"%s\"", j->addr, why);
        uv_timer_start(&j->timer, retry_cb_,
                       left < RETRY_MS_ ? left : RETRY_MS_, 0);
        return;
    }
    /* still no coordinator: say so once a minute, not at every attempt */
    if (now - j->last_warn >= 60000) {
        if (j->last_warn)
            log_warn("cluster.rejoin_failing", "coordinator=%s node=%lld "
                     "lost_for_s=%llu err=\"%s\"", j->addr,
                     (long long)j->node_id,
                     (unsigned long long)((now - j->lost_at) / 1000), why);
        j->last_warn = now;
    }
    log_debug("cluster.rejoin_retry", "coordinator=%s err=\"%s\"", j->addr, why);
    uv_timer_start(&j->timer, retry_cb_,
                   (uint64_t)j->heartbeat_ms, 0);
}

static void write_done_(void *owner, int status, int close_after)
{
    jconn *c = owner;
    cluster_join *j = c->j;
    if (c->closing) return;
    if (close_after) {
        j->leaving = 0;
        conn_close_(j);
    } else if (status < 0) {
        attempt_failed_(j, uv_strerror(status));
    }
}

/* Send the ciphertext TLS has queued (handshake messages, records). 0,
 * or -1. */
static int flush_(cluster_join *j, int close_after)
{
    jconn *c = j->c;
    uint8_t *buf;
    size_t len;
    if (cluster_tls_take_out(&c->tls, &buf, &len) < 0) return -1;
    if (!buf) return 0;
    return uvw_send((uv_stream_t *)&c->tcp, buf, len, c, close_after,
                    write_done_) < 0 ? -1 : 0;
}

static int send_(cluster_join *j, const M6__Request *rq, int close_after)
{
    jconn *c = j->c;
    size_t len;
    uint8_t *buf = frame_pack(&rq->base, &len);
    int rc = buf ? cluster_tls_write(&c->tls, buf, len) : -1;
    free(buf);
    return rc < 0 ? -1 : flush_(j, close_after);
}

/* ---------------------------------------------------------------- replies */

static void lost_(cluster_join *j, const char *why)
{
    j->lost_at = j->last_warn = uv_now(j->loop);
    log_warn("cluster.coordinator_lost", "coordinator=%s node=%lld cause=\"%s\" "
             "msg=\"rejoining every %d ms\"", j->addr, (long long)j->node_id,
             why, j->heartbeat_ms);
    attempt_failed_(j, why);
}

static void on_reply_(cluster_join *j, const M6__Response *r)
{
    j->last_rx = uv_now(j->loop);
    if (j->live && r->body_case == M6__RESPONSE__BODY_RUN_ASSIGN &&
        r->run_assign) {
        const M6__RunAssign *ra = r->run_assign;
        cluster_assign a = {.run_id = ra->run_id, .spec = ra->spec,
                            .rank = ra->rank, .world_size = ra->world_size,
                            .generation = ra->generation,
                            .timeout_ms = ra->timeout_ms,
                            .local_host = NULL,
                            .local_ranks = ra->local_ranks};
        char host[64];
        struct sockaddr_storage ss;
        int sl = sizeof ss;
        if (j->c && uv_tcp_getsockname(&j->c->tcp, (struct sockaddr *)&ss,
                                       &sl) == 0) {
            if (ss.ss_family == AF_INET &&
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host) == 0)
                a.local_host = host;
            else if (ss.ss_family == AF_INET6 &&
                     uv_ip6_name((struct sockaddr_in6 *)&ss, host,
                                 sizeof host) == 0)
                a.local_host = host;
        }
        if (!a.local_host) {
            /* this rank's collectives bind the address it reached the
             * coordinator from, which its peers can reach too; never a
             * guess (127.0.0.1 is unreachable for a remote peer). Rank 0
             * times out waiting for this rank and pauses the run. */
            log_error("cluster.rank_failed", "run=%lld rank=%d err=\"cannot "
                      "learn the local address of the connection to the "
                      "coordinator %s, which the collectives bind\"",
                      (long long)a.run_id, a.rank, j->addr);
            return;
        }
        log_info("cluster.assign", "coordinator=%s run=%lld rank=%d "
                 "world_size=%d generation=%lld local=%s", j->addr,
                 (long long)a.run_id, a.rank, a.world_size,
                 (long long)a.generation, a.local_host);
        if (j->on_assign) j->on_assign(j->ud, &a);
        return;
    }
    if (j->live) {
        if (r->status != M6__STATUS__STATUS_OK)
            log_warn("cluster.reply", "coordinator=%s status=%d msg=\"%s\"",
                     j->addr, r->status, r->message ? r->message : "");
        return;
    }
    if (r->status != M6__STATUS__STATUS_OK ||
        r->body_case != M6__RESPONSE__BODY_NODE_JOIN) {
        char msg[900];
        snprintf(msg, sizeof msg, "the coordinator at %s refused the join: %s",
                 j->addr, r->message && *r->message ? r->message
                                                    : "no reason given");
        return fatal_(j, msg);
    }
    const M6__NodeJoinReply *jr = r->node_join;
    uv_timer_stop(&j->timer);
    if (jr->node_secret.len == CLUSTER_SECRET_LEN) {
        /* issued at this node id's first join: needed at every later one */
        char err[600];
        memcpy(j->secret, jr->node_secret.data, CLUSTER_SECRET_LEN);
        j->has_secret = 1;
        if (cluster_node_secret_save(j->state_dir, j->secret, err,
                                     sizeof err) < 0)
            log_error("cluster.node_secret", "err=\"%s\" msg=\"the node "
                      "secret is not kept: after a restart this node id "
                      "cannot rejoin (remove node-id to join anew)\"", err);
        else
            log_info("cluster.node_secret", "coordinator=%s node=%lld "
                     "msg=\"issued; kept in %s/node-secret\"", j->addr,
                     (long long)jr->node_id, j->state_dir);
    }
    j->live = 1;
    j->node_id = jr->node_id;
    j->heartbeat_ms = jr->heartbeat_ms > 0 ? (int)jr->heartbeat_ms : 1000;
    j->coord_timeout_ms = jr->timeout_ms > 0 ? (int)jr->timeout_ms
                                             : 3 * j->heartbeat_ms;
    log_info(j->joined_once ? "cluster.rejoined" : "cluster.joined",
             "coordinator=%s node=%lld hostname=%s heartbeat_ms=%d "
             "timeout_ms=%d reconnect=%d", j->addr, (long long)j->node_id,
             j->facts->hostname, j->heartbeat_ms, j->coord_timeout_ms,
             jr->reconnect ? 1 : 0);
    j->joined_once = 1;
    uv_timer_start(&j->hb, heartbeat_, 0, 0);  /* the first one now: live */
}

/* The first frame, once the TLS handshake is done. 0, or -1. */
static int send_node_join_(cluster_join *j)
{
    M6__NodeJoin nj = M6__NODE_JOIN__INIT;
    nj.protocol_version = M6_PROTOCOL_VERSION;
    nj.hostname = (char *)j->facts->hostname;
    nj.node_uuid = j->uuid;
    nj.backend = (char *)j->facts->backend;
    nj.devices = j->facts->devices;
    nj.memory = j->facts->memory;
    nj.free_device_memory = cluster_free_device_memory(j->facts);
    nj.version = (char *)"m6d " M6_VERSION;
    nj.gemm = (char *)j->facts->gemm;
    if (j->has_secret) {
        nj.node_secret.data = j->secret;
        nj.node_secret.len = CLUSTER_SECRET_LEN;
    }
    M6__Request rq = frame_request(M6__REQUEST__BODY_NODE_JOIN, &nj.base);
    return send_(j, &rq, 0);
}

static void read_cb_(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    jconn *c = (jconn *)s;
    cluster_join *j = c->j;
    if (c->closing) goto out;
    if (nread < 0) {
        const char *why = nread == UV_EOF
            ? c->tls.handshaken ? "the coordinator closed the connection"
                                : "the peer closed the connection during "
                                  "the TLS handshake"
            : uv_strerror((int)nread);
        if (j->live) lost_(j, why);
        else attempt_failed_(j, why);
        goto out;
    }
    char why[300];
    int was = c->tls.handshaken;
    cluster_tls_result tr = cluster_tls_feed(&c->tls, buf->base,
                                             (size_t)nread, &c->rd, why,
                                             sizeof why);
    if (tr == CLUSTER_TLS_FAILED && !was) {
        /* whatever answers at the address cannot prove that it holds the
         * cluster's token: nothing it says is taken */
        char msg[900];
        snprintf(msg, sizeof msg, "the peer at %s is not this cluster's "
                 "coordinator: %s (it does not hold the token of "
                 "--token-file, or it does not speak m6's TLS)", j->addr, why);
        log_error("cluster.tls_refused", "coordinator=%s err=\"%s\"",
                  j->addr, why);
        if (!j->joined_once) fatal_(j, msg);
        else attempt_failed_(j, msg);
        goto out;
    }
    if (tr == CLUSTER_TLS_FAILED || flush_(j, 0) < 0) {
        if (j->live) lost_(j, tr == CLUSTER_TLS_FAILED ? why : "cannot send");
        else attempt_failed_(j, tr == CLUSTER_TLS_FAILED ? why : "cannot send");
        goto out;
    }
    if (!was && c->tls.handshaken && send_node_join_(j) < 0) {
        attempt_failed_(j, "cannot send NodeJoin");
        goto out;
    }
    if (tr == CLUSTER_TLS_CLOSED) {
        if (j->live) lost_(j, "the coordinator closed the connection");
        else attempt_failed_(j, "the coordinator closed the connection");
        goto out;
    }
    for (;;) {
        const uint8_t *payload;
        size_t len;
        frame_result fr = frame_reader_next(&c->rd, &payload, &len);
        if (fr == FRAME_NEED_MORE) break;
        M6__Response *r = fr == FRAME_OK ? m6__response__unpack(NULL, len, payload)
                                         : NULL;
        if (!r) {
            attempt_failed_(j, "a malformed frame from the coordinator");
            break;
        }
        on_reply_(j, r);
        m6__response__free_unpacked(r, NULL);
        if (c->closing) break;
    }
out:
    free(buf->base);
}

/* ---------------------------------------------------------------- attempts */

static void connected_(uv_connect_t *req, int status)
{
    jconn *c = req->data;
    cluster_join *j = c->j;
    if (c->closing || c != j->c) return;
    if (status < 0) return attempt_failed_(j, uv_strerror(status));
    uv_tcp_nodelay(&c->tcp, 1);
    /* TLS first (its ClientHello); the NodeJoin once it is done */
    if (cluster_tls_init(&c->tls, j->tls, 0) < 0)
        return attempt_failed_(j, "out of memory (TLS)");
    int rc = uv_read_start((uv_stream_t *)&c->tcp, readbuf_alloc, read_cb_);
    if (rc < 0) return attempt_failed_(j, uv_strerror(rc));
    if (flush_(j, 0) < 0) return attempt_failed_(j, "cannot send the TLS hello");
}

static void resolved_(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    gai_req *g = (gai_req *)req;
    cluster_join *j = g->j;
    unsigned attempt = g->attempt;
    free(g);
    if (j->finishing || j->fatal_done || attempt != j->attempt) {
        uv_freeaddrinfo(res);
        return unref_(j);
    }
    unref_(j);
    if (status < 0 || !res) {
        char why[400];
        snprintf(why, sizeof why, "cannot resolve %s: %s", j->host,
                 uv_strerror(status));
        uv_freeaddrinfo(res);
        return attempt_failed_(j, why);
    }
    jconn *c = calloc(1, sizeof *c);
    if (!c) {
        uv_freeaddrinfo(res);
        return attempt_failed_(j, "out of memory");
    }
    c->j = j;
    c->attempt = attempt;
    frame_reader_init(&c->rd);
    uv_tcp_init(j->loop, &c->tcp);
    c->tcp.data = c;
    c->creq.data = c;
    j->refs++;
    j->c = c;
    int rc = uv_tcp_connect(&c->creq, &c->tcp, res->ai_addr, connected_);
    uv_freeaddrinfo(res);
    if (rc < 0) attempt_failed_(j, uv_strerror(rc));
}

static void attempt_timeout_(uv_timer_t *t)
{
    cluster_join *j = t->data;
    if (j->live) return;
    j->cut = 1;
    attempt_failed_(j, j->c ? j->c->tls.handshaken
                                  ? "no reply to NodeJoin in time"
                                  : "no TLS handshake in time"
                            : "name lookup or connect did not finish in time");
}

static void attempt_(cluster_join *j)
{
    if (j->finishing || j->fatal_done) return;
    conn_close_(j);
    j->attempt++;
    /* this attempt's deadline: what is left of the first join's time, or
     * the coordinator's timeout for a rejoin */
    uint64_t now = uv_now(j->loop);
    uint64_t dl = j->joined_once ? (uint64_t)j->coord_timeout_ms
                                 : (uint64_t)j->timeout_ms - (now - j->start);
    if ((int64_t)dl <= 0) dl = 1;
    uv_timer_start(&j->timer, attempt_timeout_, dl, 0);
    gai_req *g = calloc(1, sizeof *g);
    if (!g) return attempt_failed_(j, "out of memory");
    g->j = j;
    g->attempt = j->attempt;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    j->refs++;
    int rc = uv_getaddrinfo(j->loop, &g->req, resolved_, j->host, j->port,
                            &hints);
    if (rc < 0) {
        free(g);
        j->refs--;
        attempt_failed_(j, uv_strerror(rc));
    }
}

/* -------------------------------------------------------------- heartbeat */

static void heartbeat_(uv_timer_t *t)
{
    cluster_join *j = t->data;
    if (j->finishing || !j->live || !j->c) return;
    uint64_t now = uv_now(j->loop);
    if (now - j->last_rx > (uint64_t)j->coord_timeout_ms) {
        char why[128];
        snprintf(why, sizeof why, "no answer for %llu ms (timeout %d ms)",
                 (unsigned long long)(now - j->last_rx), j->coord_timeout_ms);
        return lost_(j, why);
    }
    M6__NodeHeartbeat hb = M6__NODE_HEARTBEAT__INIT;
    hb.free_device_memory = cluster_free_device_memory(j->facts);
    /* where this node's ranks stand (rankboard.h), for m6ctl status */
    static rank_entry e[RANKBOARD_DEVICES_MAX];  /* the loop thread's */
    M6__RankState rs[RANKBOARD_DEVICES_MAX], *rp[RANKBOARD_DEVICES_MAX];
    int n = rankboard_local(e, RANKBOARD_DEVICES_MAX);
    for (int i = 0; i < n; i++) {
        m6__rank_state__init(&rs[i]);
        rs[i].run_id = e[i].run;
        rs[i].rank = e[i].rank;
        rs[i].local_rank = e[i].local_rank;
        rs[i].step = e[i].step;
        rs[i].state = (char *)rankboard_state_name(e[i].state);
        rs[i].reason = e[i].reason;
        rp[i] = &rs[i];
    }
    hb.n_ranks = (size_t)n;
    hb.ranks = rp;
    M6__Request rq = frame_request(M6__REQUEST__BODY_NODE_HEARTBEAT, &hb.base);
    if (send_(j, &rq, 0) < 0) return lost_(j, "cannot send a heartbeat");
    uv_timer_start(&j->hb, heartbeat_, (uint64_t)j->heartbeat_ms, 0);
}

/* ------------------------------------------------------------------ public */

cluster_join *cluster_join_start(const cluster_join_config *cfg, char *err,
                                 size_t errlen)
{
    cluster_join *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int port;
    if (cluster_parse_addr(cfg->addr, 0, j->host, sizeof j->host, &port, err,
                           errlen) < 0) {
        free(j);
        return NULL;
    }
    snprintf(j->port, sizeof j->port, "%d", port);
    snprintf(j->addr, sizeof j->addr, "%s", cfg->addr);
    snprintf(j->uuid, sizeof j->uuid, "%s", cfg->node_uuid);
    snprintf(j->state_dir, sizeof j->state_dir, "%s", cfg->state_dir);
    int sr = cluster_node_secret_load(cfg->state_dir, j->secret, err, errlen);
    if (sr < 0) {
        free(j);
        return NULL;
    }
    j->has_secret = sr == 0;
    if (!(j->tls = cluster_tls_ctx(cfg->token, 0, err, errlen))) {
        free(j);
        return NULL;
    }
    j->loop = cfg->loop;
    j->facts = cfg->facts;
    j->timeout_ms = cfg->timeout_ms;
    j->on_fatal = cfg->on_fatal;
    j->on_assign = cfg->on_assign;
    j->ud = cfg->ud;
    j->heartbeat_ms = cfg->timeout_ms / 3 > 0 ? cfg->timeout_ms / 3 : 1;
    j->coord_timeout_ms = cfg->timeout_ms;
    uv_timer_init(j->loop, &j->timer);
    uv_timer_init(j->loop, &j->hb);
    j->timer.data = j->hb.data = j;
    j->refs = 2;
    uv_update_time(j->loop);
    j->start = uv_now(j->loop);
    log_info("cluster.join", "coordinator=%s hostname=%s node_uuid=%s "
             "backend=%s devices=%d timeout_ms=%d", j->addr,
             j->facts->hostname, j->uuid, j->facts->backend, j->facts->devices,
             j->timeout_ms);
    attempt_(j);
    return j;
}

void cluster_join_leave(cluster_join *j)
{
    if (!j || !j->live || !j->c) return;
    uv_timer_stop(&j->hb);
    M6__NodeLeave nl = M6__NODE_LEAVE__INIT;
    M6__Request rq = frame_request(M6__REQUEST__BODY_NODE_LEAVE, &nl.base);
    j->live = 0;  /* replies from here on are not looked at */
    if (send_(j, &rq, 1) == 0) j->leaving = 1;
}

int cluster_join_busy(const cluster_join *j) { return j && j->leaving; }

void cluster_join_fini(cluster_join *j)
{
    if (!j) return;
    j->finishing = 1;
    conn_close_(j);
    uv_close((uv_handle_t *)&j->timer, handle_closed_);
    uv_close((uv_handle_t *)&j->hb, handle_closed_);
}
