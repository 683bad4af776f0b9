/*
 * coordinator.h — the coordinator's side of many nodes (issue #14): a libuv
 * TCP listener (m6d --role coordinator --listen HOST:PORT) on the loop of
 * the control socket, speaking the control protocol's framing
 * (proto/frame.h) with its own first frame.
 *
 * A peer's first frame, within the first-frame timeout
 * (min(CLUSTER_AUTH_TIMEOUT_MS, timeout_ms)) and at most
 * CLUSTER_FIRST_FRAME_MAX bytes, must be a NodeJoin or a StoreOpen carrying
 * the shared token (compared in constant time, cluster.h). Anything else
 * gets one refusal status (UNAUTHENTICATED, TOO_LARGE, BAD_REQUEST), is
 * logged with the peer's address (cluster.refused) and the connection is
 * closed; at most CLUSTER_PENDING_PER_ADDRESS peers of one address and
 * CLUSTER_PENDING_MAX in all may be unauthenticated at once: a new one
 * past either closes the oldest (so a peer that authenticates at once
 * always gets its turn), and refusals are logged at most once per address
 * per CLUSTER_REFUSAL_LOG_MS, with a count. Nothing a peer sends blocks the loop: every
 * read is asynchronous and every wait has a deadline.
 *
 * Node registry (the nodes table of m6.db, state.h): a NodeJoin inserts or
 * updates the node's row (joining; live at its first heartbeat). A node is
 * lost when it sends no heartbeat for timeout_ms, or at once when its
 * connection closes without a NodeLeave (kill -9: the kernel closes the
 * socket); NodeLeave makes it left. Each change is a log line and a
 * daemon-wide event (node.join, node.reconnect, node.lost, node.left).
 *
 *   hostname new, uuid new          a new node (node.join)
 *   uuid known                      a reconnect of that node (node.reconnect;
 *                                   its old connection, if still open, is
 *                                   closed: the new one replaces it)
 *   hostname known, another uuid,   refused (BAD_STATE): two machines
 *     that node joining or live     claim one name; --node-name tells them
 *                                   apart
 *   hostname known, another uuid,   the new node takes the row over (a
 *     that node lost or left        reinstalled machine: node.replace)
 *
 * Store service (dist/store.h over TCP): after a StoreOpen(run, generation)
 * the peer sends StoreSet/StoreGet/StoreWait, one reply each, in order. A
 * get or wait whose keys are missing is parked, not blocking the loop: it
 * is answered when a set provides them or with STATUS_TIMEOUT at its
 * deadline. Keys live in memory until the coordinator stops (bootstrap
 * data, rewritten under a new generation at every rendezvous), at most
 * CLUSTER_STORE_BYTES_MAX bytes in all.
 *
 * Rank assignment: cluster/dp.c picks the nodes (cluster_coord_nodes_fit)
 * and queues each rank's RunAssign (cluster_coord_assign), sent as the
 * reply to the node's next heartbeat; see docs/DESIGN.md, "Many nodes:
 * roles and node registry".
 */
#ifndef M6_CLUSTER_COORDINATOR_H
#define M6_CLUSTER_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/cluster.h"
#include "state/state.h"

#define CLUSTER_PENDING_MAX 64
#define CLUSTER_PENDING_PER_ADDRESS 16
#define CLUSTER_REFUSAL_LOG_MS 10000
#define CLUSTER_STORE_BYTES_MAX (256u << 20)
#define CLUSTER_STORE_KEYS_MAX 65536

typedef struct cluster_coord cluster_coord;

typedef struct {
    uv_loop_t *loop;
    state *st;
    const char *listen;          /* "HOST:PORT"; port 0: any free one */
    const cluster_token *token;
    int timeout_ms;              /* heartbeat timeout; > 0 */
} cluster_coord_config;

/* Bind and listen (logs cluster.listen addr=HOST:PORT with the port
 * bound). NULL with err on failure (a bad address, the port in use). */
cluster_coord *cluster_coord_init(const cluster_coord_config *cfg, char *err,
                                  size_t errlen);
/* The port bound (the real one when the config asked for 0). */
int cluster_coord_port(const cluster_coord *c);
/* Close the listener and every peer (freed in close callbacks: run the loop
 * afterwards). Live nodes stay live in the DB: they reconnect to the next
 * coordinator, which marks them lost until they do. */
void cluster_coord_fini(cluster_coord *c);

/* The live worker nodes whose free device memory is at least
 * bytes_per_node, by id, at most max of them (ids into ids[]): the seam
 * where the coordinator will pick nodes for a run and give them ranks
 * 0..n-1 in this order. Returns how many (0 with none), or -1 (DB). */
int cluster_coord_nodes_fit(cluster_coord *c, uint64_t bytes_per_node,
                            int64_t *ids, int max);

/* Queue a rank assignment (dp.h) for node node_id: sent as the reply to
 * its next heartbeat (a newer one for the node replaces one not yet
 * sent). Callable from any thread; the spec is copied. 0, or -1 (out of
 * memory). */
int cluster_coord_assign(cluster_coord *c, int64_t node_id, int64_t run,
                         const char *spec, int rank, int world, int64_t gen,
                         int timeout_ms);

/* This m6d in its own nodes table (role coordinator, state live), at every
 * start whatever the role but a worker's: a single m6d lists itself.
 * Worker nodes that a previous life left joining or live become lost
 * ("coordinator restarted") until they reconnect. 0, or -1 with err. */
int cluster_self_register(state *st, const cluster_facts *f,
                          const char *uuid, char *err, size_t errlen);
/* At exit: this m6d's row becomes left. */
void cluster_self_leave(state *st, const char *uuid);

#endif /* M6_CLUSTER_COORDINATOR_H */
