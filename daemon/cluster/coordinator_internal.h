/*
 * coordinator_internal.h — what coordinator.c (listener, peers, node
 * registry, the store's admission) and coordinator_store.c (the store's
 * keys and requests) share: the coordinator's and a peer's state, and the
 * calls each makes into the other. Private to daemon/cluster/.
 */
#ifndef M6_CLUSTER_COORDINATOR_INTERNAL_H
#define M6_CLUSTER_COORDINATOR_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "cluster/coordinator.h"
#include "cluster/tls.h"
#include "common/uvw.h"
#include "proto/frame.h"
#include "m6.pb-c.h"

typedef enum { PEER_NEW = 0, PEER_NODE, PEER_STORE } peer_kind;

typedef struct peer peer;

typedef struct store_entry {
    int64_t run, gen;
    char *key;
    uint8_t *val;
    size_t len;
    struct store_entry *next;
} store_entry;

/* A run's latest generation (cluster_coord_assign): a worker's store
 * opens only that one; and the first loss heard of in it
 * (cluster_coord_rank_lost; has_lost 0: none yet). */
typedef struct run_gen {
    int64_t run, gen;
    int has_lost;
    run_lost lost;
    struct run_gen *next;
} run_gen;

/* A rank assignment waiting for its node's next heartbeat (dp.h). */
typedef struct assign_entry {
    int64_t node_id, run, gen;
    int rank, ranks, world, timeout_ms;  /* ranks: rank .. rank+ranks-1 */
    char *spec;
    struct assign_entry *next;
} assign_entry;

struct cluster_coord {
    uv_tcp_t listener;  /* first: handle <-> coordinator */
    pthread_mutex_t amu;  /* guards assigns, gens: set from the runner
                           * thread */
    pthread_cond_t lost_cv; /* with amu: a loss recorded in gens */
    assign_entry *assigns;
    run_gen *gens;
    uv_timer_t sweep;   /* heartbeat timeouts */
    uv_async_t push;    /* a runner thread queued an assignment: send it
                         * to its node now (push_cb_) */
    int push_closed;    /* with amu: push is closing, not to be sent */
    uv_loop_t *loop;
    state *st;
    SSL_CTX *tls;       /* the PSK's server side (tls.h) */
    int timeout_ms, auth_ms;
    int port;
    int n_new;          /* unauthenticated peers */
    unsigned long next_id;
    peer *peers;
    store_entry *store;
    size_t store_bytes, store_keys;
    int handles_open;   /* listener, sweep, push: freed at 0 after fini */
    /* refusal log lines, one per address and reason per
     * CLUSTER_REFUSAL_LOG_MS for the CLUSTER_REFUSAL_LOG_SLOTS pairs seen
     * last; while every slot is that recent, one line per interval for all
     * the other addresses together (other_*) */
    struct refusal_log {
        char host[64];
        char why[64];
        uint64_t last_ms;
        unsigned long suppressed;
    } refusals[CLUSTER_REFUSAL_LOG_SLOTS];
    uint64_t other_last_ms;
    unsigned long other_suppressed;
};

struct peer {
    uv_tcp_t tcp;       /* first: handle <-> peer */
    uv_timer_t timer;
    cluster_coord *co;
    unsigned long id;
    char addr[96];
    char host[64];      /* addr without the port: the per-address limit */
    cluster_tls tls;    /* ciphertext in and out; plaintext frames in rd */
    frame_reader rd;
    peer_kind kind;
    int closing, handles_open, reading;
    peer *prev, *next;
    /* a node */
    int64_t node_id;    /* 0: none (refused, or replaced by a reconnect) */
    char hostname[256];
    uint64_t last_hb;   /* uv_now of its latest frame */
    int64_t arun;       /* wiring: the run of its latest assignment, 0 */
    int arank;          /* ... its (first) rank there */
    int aranks;         /* ... how many: arank .. arank+aranks-1 */
    int64_t agen;       /* ... and its generation */
    /* a store client */
    int64_t run, gen;
    int rank;           /* the rank it writes as (StoreOpen) */
    int64_t store_node; /* ... the node it is (hostname above) */
    int store_local;    /* ... that node's local rank it is */
    int parked;         /* a get/wait waits for keys (timer running) */
    int parked_get;     /* ... a get: reply with the value */
    char **keys;
    size_t n_keys;
    int timeout_ms;
};

/* coordinator.c */

/* Queue resp to p (inside TLS); close the connection after it when
 * close_after. Nothing when p is closing. */
void coord_send(peer *p, const M6__Response *resp, int close_after);
/* coord_send of a Response with only a status and a message */
void coord_reply_status(peer *p, M6__Status st, const char *msg,
                        int close_after);
/* Handle p's complete frames buffered, in order, until one is parked. */
void coord_pump(peer *p);
/* The log line of a refusal to p, at most one per address and reason per
 * CLUSTER_REFUSAL_LOG_MS (the ones between are counted), and at most
 * CLUSTER_REFUSAL_LOG_SLOTS + 1 lines per interval whatever the number of
 * addresses. */
void coord_log_refusal(cluster_coord *co, const peer *p, const char *why);
/* Forget p's parked request's keys; p is no longer parked. */
void coord_peer_free_keys(peer *p);
/* Ranks of run's generation gen were lost (l: which, and why): kept for
 * cluster_coord_rank_lost when gen is the run's latest generation and
 * no loss of it was kept yet (the first loss is the cause; the others'
 * failures follow from it). Any thread. */
void coord_rank_lost(cluster_coord *co, int64_t run, int64_t gen,
                     const run_lost *l);

/* coordinator_store.c */

/* Serve one store request (set, get, wait, ...) of p, an opened store
 * client; rq is freed here. A get or wait whose keys are not all set
 * parks p until they are or its deadline passes. */
void coord_store_request(peer *p, const M6__Request *rq);
/* Free the store's keys of run's generations older than gen (nobody
 * waits on them: a parked request of such a generation times out). */
void coord_store_free_stale(cluster_coord *co, int64_t run, int64_t gen);

#endif
