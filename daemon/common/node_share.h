/*
 * node_share.h — how a node's host resources are divided among the
 * data-parallel ranks it runs (m6d --devices N: N ranks in one process).
 *
 * One fact per node: the host memory m6d may use (common/memlimit.h) and
 * the pages it may lock, and its CPUs (common/cpus.h) belong to the node;
 * each rank that trains on it gets an equal share. A run's ranks on this
 * node are min(N, its nodes.world_size): a run of one rank on a node of
 * several has the node to itself. With N = 1 (the default) every share is
 * the whole, as on a node of one rank.
 */
#ifndef M6_NODE_SHARE_H
#define M6_NODE_SHARE_H

#include <stddef.h>

/* This node: its name (refusals name it; NULL or "" keeps "this node")
 * and the ranks it runs (m6d --devices; < 1 counts as 1). Set once at
 * start, before any run is planned or trained. */
void node_share_set(const char *name, int ranks);
/* ... as set; 1 unset. */
int node_share_node_ranks(void);
/* ... as set; "this node" unset. */
const char *node_share_name(void);

/* The ranks of a run of `world` ranks (nodes.world_size; < 1 counts as
 * 1) that share this node: min(node ranks, world). */
int node_share_ranks(int world);

/* One rank's part of a count (threads) split among k ranks:
 * max(1, total / k) (k < 1 counts as 1). */
int node_share_split(int total, int k);

/* One rank's part of the node's bytes among k ranks: bytes / k; SIZE_MAX
 * (unknown, no limit) stays SIZE_MAX. */
size_t node_share_bytes(size_t bytes, int k);

#endif /* M6_NODE_SHARE_H */
