/*
 * join.h — a worker node's side (m6d --join HOST:PORT): register with the
 * coordinator over TCP, heartbeat, reconnect. Runs on m6d's libuv loop.
 *
 * The first join must succeed within timeout_ms: attempts (a name lookup,
 * a TCP connect, a NodeJoin and its reply, each bounded by what is left of
 * timeout_ms) repeat every 500 ms until then; after that on_fatal is called
 * with a message naming the address and the last error ("cannot join the
 * coordinator at 127.0.0.1:7070 within 2.0 s: connection refused"). A
 * refusal by the coordinator (duplicate hostname, a node id without its
 * secret) is fatal at once, with the coordinator's message.
 *
 * The connection is TLS keyed by the token (tls.h): a peer at the address
 * that cannot finish the handshake is not the coordinator, and nothing it
 * sends is read (fatal at the first join: cluster.tls_refused; a rejoin
 * tries again). The NodeJoin carries the node's secret (cluster.h) once
 * it has one; the coordinator issues it at the first join and it is kept
 * in STATE_DIR/node-secret.
 *
 * Once joined: a NodeHeartbeat (with the free device memory) every
 * heartbeat_ms of the coordinator's NodeJoinReply; every one is answered.
 * A coordinator silent for its timeout_ms, or a closed connection, is a
 * lost coordinator: logged (cluster.coordinator_lost), then the node
 * rejoins with the same node id (a reconnect for the coordinator), trying
 * every heartbeat interval for as long as m6d runs.
 */
#ifndef M6_CLUSTER_JOIN_H
#define M6_CLUSTER_JOIN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/cluster.h"

typedef struct cluster_join cluster_join;

/* A rank of a run across nodes, as the coordinator sent it (RunAssign,
 * the reply to a heartbeat; see dp.h). Pointers valid during the call. */
typedef struct {
    int64_t run_id;
    const char *spec;        /* canonical JSON */
    int rank, world_size;
    int local_ranks;         /* this node's ranks: rank .. rank+local_ranks-1
                              * (m6d --devices); 0 means 1 */
    int64_t generation;
    int timeout_ms;          /* nodes.timeout */
    const char *local_host;  /* this node's address on its connection to
                              * the coordinator (never NULL): where its
                              * collectives bind and peers reach it */
} cluster_assign;

typedef struct {
    uv_loop_t *loop;
    const char *addr;            /* "HOST:PORT" (a name or an address) */
    const cluster_token *token;
    const cluster_facts *facts;
    const char *node_uuid;       /* cluster_node_uuid */
    const char *state_dir;       /* where node-secret is kept (cluster.h) */
    int timeout_ms;              /* for the first join; > 0 */
    /* The first join failed or the coordinator refused: msg says why (the
     * caller logs it and stops m6d). Called at most once. */
    void (*on_fatal)(void *ud, const char *msg);
    /* The coordinator assigned this node a rank (NULL: ignored). */
    void (*on_assign)(void *ud, const cluster_assign *a);
    void *ud;
} cluster_join_config;

/* Start joining (asynchronously; the loop does the work). NULL with err
 * when the address does not parse. */
cluster_join *cluster_join_start(const cluster_join_config *cfg, char *err,
                                 size_t errlen);
/* At shutdown: send NodeLeave if joined (the node becomes "left" rather
 * than "lost") and close once it is written. Run the loop until
 * cluster_join_busy is 0 (bounded by the caller). */
void cluster_join_leave(cluster_join *j);
int cluster_join_busy(const cluster_join *j);
/* Close everything (freed in close callbacks: run the loop afterwards). */
void cluster_join_fini(cluster_join *j);

#endif /* M6_CLUSTER_JOIN_H */
