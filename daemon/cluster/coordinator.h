/*
 * coordinator.h — the coordinator's side of many nodes (issue #14): a libuv
 * TCP listener (m6d --role coordinator --listen HOST:PORT) on the loop of
 * the control socket, speaking the control protocol's framing
 * (proto/frame.h) with its own first frame.
 *
 * Every connection is TLS 1.3 keyed by the shared token (tls.h): a peer
 * that cannot finish the handshake (no token, another token, plaintext)
 * is closed at once, with at most a TLS alert, and logged with
 * OpenSSL's reason (cluster.refused). Inside it, the peer's first frame,
 * within the first-frame timeout (min(CLUSTER_AUTH_TIMEOUT_MS,
 * timeout_ms), counted from the connection: handshake included) and at
 * most CLUSTER_FIRST_FRAME_MAX bytes, must be a NodeJoin or a StoreOpen.
 * Anything else gets one refusal status (UNAUTHENTICATED, TOO_LARGE,
 * BAD_REQUEST), is logged with the peer's address (cluster.refused) and
 * the connection is closed; at most CLUSTER_PENDING_PER_ADDRESS peers of one address and
 * CLUSTER_PENDING_MAX in all may be unauthenticated at once: a new one
 * past either closes the oldest (so a peer that authenticates at once
 * always gets its turn), and refusals are logged at most once per address
 * per CLUSTER_REFUSAL_LOG_MS, with a count (for CLUSTER_REFUSAL_LOG_SLOTS
 * addresses and reasons; the refusals of any more share one line per
 * interval, so that many addresses cannot flood the log either). Nothing
 * a peer sends blocks the loop: every
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
 *                                   apart (the refusal does not say which
 *                                   node has it; the log does)
 *   hostname known, another uuid,   the new node takes the row over (a
 *     that node lost or left        reinstalled machine: node.replace)
 *
 * Node secrets: a node id's first join is issued a random secret
 * (CLUSTER_SECRET_LEN bytes, in the NodeJoinReply; only its SHA-256 is
 * kept, in the nodes table); every later join with that node id must
 * present it, else it is refused (UNAUTHENTICATED) and the node that holds
 * the id keeps its place. The coordinator's own row holds the hash of its
 * own secret (STATE_DIR/node-secret, cluster_node_secret_ensure).
 *
 * Store service (dist/store.h over TCP): after a StoreOpen(run,
 * generation, node id and secret, rank) the peer sends
 * StoreSet/StoreGet/StoreWait, one reply each, in order. The StoreOpen is
 * refused (UNAUTHENTICATED) unless the node id and secret match the nodes
 * table and the node holds the rank: the coordinator's own node is rank 0
 * of any (run, generation); a node must hold that rank of that run in the
 * nodes table (one of rank .. rank+ranks-1: a node runs one rank per
 * device), in the run's latest generation (cluster_coord_assign). A key
 * "failed/<rank>" set by a rank is also the run's event nodes.rank_failed
 * naming its node and local rank.
 * A set of a key that another rank owns (cluster_store_key_owner) is
 * refused (PERMISSION_DENIED). A get or wait whose keys are missing is
 * parked, not blocking the loop: it is answered when a set provides them
 * or with STATUS_TIMEOUT at its deadline. Keys live in memory, at most
 * CLUSTER_STORE_BYTES_MAX bytes in all; when rank 0 opens a run's newer
 * generation, the run's older generations are freed.
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
/* address and reason pairs whose refusals are counted apart; refusals of
 * the others share one line per CLUSTER_REFUSAL_LOG_MS */
#define CLUSTER_REFUSAL_LOG_SLOTS 32
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
/* The rank that owns a store key: the number of its last '/'-separated
 * part when that part is N or rank_N ("hash/3", "run5/g7/3",
 * "run5/g7/rank_3": 3); 0 for every other key (the group's own: "verdict",
 * "engine", "run5/g7/nccl/nccl_id"), which rank 0 writes. */
int cluster_store_key_owner(const char *key);

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
/* The same for a node running ranks local ranks, rank .. rank+ranks-1
 * (RunAssign.local_ranks; m6d --devices). */
int cluster_coord_assign_ranks(cluster_coord *c, int64_t node_id,
                               int64_t run, const char *spec, int rank,
                               int ranks, int world, int64_t gen,
                               int timeout_ms);

/* Record gen as run's latest generation without a worker's assignment:
 * the coordinator's own local ranks beyond rank 0 (m6d --devices) open
 * the store in it. */
void cluster_coord_run_generation(cluster_coord *c, int64_t run, int64_t gen);

/* Which ranks of run's latest generation were lost, as the coordinator
 * heard it: a rank that failed (its store key "failed/<rank>": that rank,
 * its node and local rank, its error) or a node lost or stopped (left)
 * while it held ranks of the run (every one of its ranks, local ranks 0
 * .. ranks - 1; the cause). The first loss of the generation; waits up to wait_ms (>= 0)
 * for one. 1 with *out set, 0 none heard of. Any thread but the loop's
 * (the loop records the losses). */
int cluster_coord_rank_lost(cluster_coord *c, int64_t run, int wait_ms,
                            run_lost *out);

/* The live worker nodes by id, at most max (ids into ids[]) and how many
 * ranks each runs (slots[]: its devices, cluster_facts.devices: m6d
 * --devices, or every visible GPU of a cuda node). Returns how many, or
 * -1 (DB). */
int cluster_coord_nodes_slots(cluster_coord *c, int64_t *ids, int *slots,
                              int max);

/* This m6d in its own nodes table (role coordinator, state live, its
 * node secret's hash secret_sha256), at every start whatever the role but
 * a worker's: a single m6d lists itself.
 * Worker nodes that a previous life left joining or live become lost
 * ("coordinator restarted") until they reconnect. 0, or -1 with err. */
int cluster_self_register(state *st, const cluster_facts *f,
                          const char *uuid, const char *secret_sha256,
                          char *err, size_t errlen);
/* At exit: this m6d's row becomes left. */
void cluster_self_leave(state *st, const char *uuid);

#endif /* M6_CLUSTER_COORDINATOR_H */
