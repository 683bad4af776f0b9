/*
 * dp.h — one run across several m6d nodes (issue 14, the wiring between
 * the node registry of coordinator.h and the collectives of
 * dist/collectives.h).
 *
 * Ranks: a node runs one rank per device (m6d --devices N on cpu; 1 by
 * default and on cuda). The coordinator m6d's runner thread is rank 0 (it
 * trains the run, writes m6.db, the metrics and the checkpoints:
 * replicated state written once); cluster_ranks_place gives the
 * coordinator ranks 0..N0-1 (1..N0-1 on its own rank threads) and each
 * live worker, in node id order, its next Ni ranks, local ranks
 * contiguous. The coordinator records each node's ranks in the nodes
 * table (run, rank, ranks) and as an event (nodes.assign), and sends each
 * worker a RunAssign (run id, spec, first rank, local ranks, world size,
 * generation, timeout) as the reply to its next heartbeat.
 *
 * A group (cluster_dp_group), on every rank: open the coordinator's store
 * in the namespace (run, generation); set "hash/<rank>" to this rank's
 * hash (cluster_dp_hash); rank 0 reads every rank's and sets "verdict"
 * ("ok", or the refusal naming the rank and both hashes); every rank
 * refuses a verdict that is not "ok" before any collective; then Gloo's
 * group (m6_coll_init, prefix "run<id>/g<gen>") and
 * trainer_broadcast_state from rank 0, so every rank continues from rank
 * 0's state (a fresh run, a resume from rank 0's checkpoint, a delink).
 * Every wait is bounded by nodes.timeout.
 *
 * The gradient's sum: rank 0 also sets "allreduce" (M6_DP_ALLREDUCE in
 * its environment: flat, hier or auto, the default). Every rank learns
 * each rank's node from one all-reduce over the group (a node's ranks
 * are contiguous: its first rank and its count), and the rule (dp.c
 * use_hier_: auto is hier where a node runs more than one rank, measured
 * by bench/allreduce_hier) decides for all alike. hier: every rank joins
 * its node's node-local group (dist/local.h, "run<id>/g<gen>/node<k>"),
 * each node's local rank 0 the leaders' Gloo group ("<prefix>/leaders",
 * node k its rank k, its store keys carrying the leader's global rank),
 * and the trainer sums its gradient buckets through them
 * (trainer_adopt_node_groups); everything else stays on the group.
 *
 * Expert parallelism (nodes.expert_parallel P, 1 < P < world): every
 * rank also makes its two sub-groups before the state broadcast, its
 * expert-parallel group ("<prefix>/ep<d>", world ranks d*P .. d*P+P-1)
 * first, then the ranks holding its experts ("<prefix>/edp<q>", q, q+P,
 * ...), their store keys those of their global ranks as the leaders'
 * are; the trainer adopts them (trainer_adopt_expert_groups). With
 * P = world the group itself is the expert-parallel one.
 *
 * A generation is used once: every group of a run (a start, a resume
 * after a lost rank, a regroup after the delink) takes a new one.
 */
#ifndef M6_CLUSTER_DP_H
#define M6_CLUSTER_DP_H

#include <pthread.h>
#include <stdint.h>

#include "cluster/cluster.h"
#include "cluster/coordinator.h"
#include "cluster/join.h"
#include "common/err.h"
#include "dist/collectives.h"
#include "spec/spec.h"
#include "train/trainer.h"

/* SHA-256 (64 hex digits and NUL in out) of what every rank must agree
 * on: this build (M6_VERSION), the world size and the canonical spec
 * (spec_to_json: the model configuration, the share map's keys
 * pseudo.*, everything else; the trainer derives its share map from
 * them, and the state broadcast copies rank 0's). Test hook: the
 * environment variable M6_TEST_DP_HASH_SALT is hashed too. */
void cluster_dp_hash(const run_spec *s, const trainer *t, int world,
                     char out[65]);

/* The coordinator's side (runner_dist of runner.h; ud is this struct).
 * co is guarded by mu: cluster_dp_coord_attach/detach set it on the loop
 * while the runner thread may be picking nodes. */
struct cluster_dp_worker;

typedef struct {
    pthread_mutex_t mu;
    cluster_coord *co;        /* NULL: not listening (yet, or any more) */
    char store_addr[300];     /* its store, "HOST:PORT", as rank 0 dials it */
    char host[256];           /* rank 0's Gloo address */
    const cluster_token *token;
    const char *state_dir;    /* node-id and node-secret: its store's who */
    state *st;
    int64_t gen;              /* the latest generation given out */
    int devices;              /* ranks this m6d runs (--devices); < 1: 1 */
    struct cluster_dp_worker *local;  /* its local ranks 1..devices-1; NULL
                                       * with devices 1 */
} cluster_dp_coord;

/* Before runner_init: mu, co NULL. */
void cluster_dp_coord_init(cluster_dp_coord *d);
/* Set (co: the listener is up) or clear (NULL: before cluster_coord_fini)
 * the coordinator; waits for a pick in progress to end. */
void cluster_dp_coord_attach(cluster_dp_coord *d, cluster_coord *co);

/* runner_dist.group: see runner.h. Places the world ranks on this m6d
 * and the live worker nodes (cluster_ranks_place: this m6d's devices
 * first, ranks 0..devices-1, its own rank threads taking 1..; then each
 * worker's devices in node id order), assigns them, makes the group as
 * rank 0 (hash check, Gloo, trainer_broadcast_state). 1 with *out, 0 not
 * enough (why: "waiting for W live nodes, have K" when every node has
 * one device, K counting this m6d; else "waiting for W devices on live
 * nodes, have K ..."), -1 with why. */
int cluster_dp_coord_group(void *ud, int64_t id, const run_spec *spec,
                           trainer *t, int world, m6_coll **out, char *why,
                           size_t len);
/* runner_dist.ungroup: the run's nodes lose their run and rank. */
void cluster_dp_coord_ungroup(void *ud, int64_t id);
/* runner_dist.lost: which ranks of the run's group were lost
 * (cluster_coord_rank_lost), waiting up to half the run's nodes.timeout
 * for the coordinator to hear of it: a rank's failure and a node's lost
 * connection reach it at once, a silent node at its heartbeat timeout,
 * which a collective's own timeout (nodes.timeout) may pass by a little;
 * so the run pauses within 1.5 nodes.timeout. 1 with *out, 0 none heard
 * of (a rank of this m6d, or one that hangs while its node lives). */
int cluster_dp_coord_lost(void *ud, int64_t id, const run_spec *spec,
                          run_lost *out);

/* A worker node's trainer threads, one per local rank: take assignments (cluster_dp_assign,
 * from the join's loop), trains its rank until the run's last step or
 * until a collective fails (rank 0 paused, delinked or died), then frees
 * the trainer and the group and waits for the next assignment. Only
 * failures are logged (cluster.rank_failed); nothing is written to this
 * node's m6.db. Each thread publishes where its rank stands (grouping,
 * training, boundary, left, done, failed; its step) on this m6d's rank
 * board (common/rankboard.h), and hands its collective calls the board's
 * wait clock (waiting: blocked in one for a second or more), which a
 * worker's heartbeats carry to the coordinator for m6ctl status. A rank
 * that fails sets its store key "failed/<rank>": the coordinator keeps it
 * as the run's lost rank (cluster_coord_rank_lost). */
typedef struct cluster_dp_worker cluster_dp_worker;

/* coord_addr: the coordinator (its store); state_dir: this node's
 * (node-id, node-secret: who opens the store); threads: device.threads
 * for each rank (0 keeps the spec's; cluster_rank_threads gives a rank's
 * share of the node's); local_ranks: how many ranks this node runs (m6d
 * --devices), one thread each, the i-th training rank a->rank + i of an
 * assignment; first_local: the first thread's local rank in the logs (0
 * on a worker; 1 on the coordinator, whose runner is local rank 0). The
 * spec's hash is taken before threads replaces the spec's count. NULL on
 * out of memory / no thread. */
cluster_dp_worker *cluster_dp_worker_start(const char *coord_addr,
                                           const cluster_token *token,
                                           const char *state_dir,
                                           int threads, int local_ranks,
                                           int first_local);
/* Hand an assignment to the threads of its local ranks (copied; a newer
 * one replaces one not yet taken). Never blocks on training. */
void cluster_dp_assign(cluster_dp_worker *w, const cluster_assign *a);
/* Stop: the current group is left at its next collective (bounded by
 * its timeout); joins the thread and frees. NULL: nothing. */
void cluster_dp_worker_stop(cluster_dp_worker *w);

#endif /* M6_CLUSTER_DP_H */
