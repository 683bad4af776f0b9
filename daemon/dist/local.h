/*
 * local.h — the node-local engine: the ranks of one m6d (its rank threads,
 * m6d --devices N) sum a buffer through shared memory instead of
 * loopback TCP, and the hierarchical all-reduce built on it (sum inside
 * the node, all-reduce across nodes among one leader per node over a
 * collectives.h group, copy back inside the node).
 *
 * Debian's libgloo has transports tcp and ibverbs only (no shared-memory
 * one), so this is an in-process group: a barrier and every local rank's
 * buffer address, found by name in a process-wide table.
 *
 * Join: each of the size threads calls m6_local_join with the same name
 * (unique per run, generation and node: "run7/g3/node0") and size, and its
 * own local rank. Nothing waits at the join; the first operation waits
 * for every local rank.
 *
 * Determinism: element i of a sum is ((b0[i] + b1[i]) + b2[i]) + ... in
 * local rank order, whichever thread computes it and whichever thread
 * arrives first: the same bits on every rank and from run to run.
 *
 * Timeouts: every wait gives up after the group's timeout_ms. A rank that
 * times out, fails (m6_local_fail) or leaves (m6_local_leave) while the
 * others still use the group breaks it: every waiting and later operation
 * fails at once with M6_ECANCELLED (timed out) or M6_EINTERNAL, naming the
 * local rank and the cause. Nothing waits forever. A broken group stays
 * broken; every rank leaves it and a new generation makes a new one.
 *
 * One thread per local rank calls the functions of its handle.
 */
#ifndef M6_DIST_LOCAL_H
#define M6_DIST_LOCAL_H

#include <stddef.h>

#include "common/err.h"
#include "dist/collectives.h"

typedef struct m6_local m6_local;

/* The most local ranks of one group: at least the ranks one m6d runs
 * (dp.c asserts it against RANKBOARD_DEVICES_MAX). */
#define M6_LOCAL_MAX 256

/* Join the node-local group called name (at most 255 bytes) as local rank
 * rank of size (1 <= size <= M6_LOCAL_MAX). The handle, or NULL with err:
 * M6_EINVALID for a bad rank, size or timeout (<= 0), a size that differs
 * from the group's, or a rank that already joined; M6_EINTERNAL out of
 * memory. */
m6_local *m6_local_join(const char *name, int rank, int size, int timeout_ms,
                        m6_err *err);

int m6_local_rank(const m6_local *g);
int m6_local_size(const m6_local *g);

/* Sum buf (n fp32 values, host memory) over the local ranks in place:
 * afterwards every local rank holds the same sums (see Determinism). Each
 * local rank sums 1/size of the elements. 0, or -1 with err. */
int m6_local_allreduce_sum(m6_local *g, float *buf, size_t n, m6_err *err);

/* The hierarchical all-reduce: buf summed over the local ranks (as
 * m6_local_allreduce_sum), then local rank 0 (the node's leader) sums
 * that over the nodes with leaders (one rank per node, in node order;
 * NULL or world 1: one node), then every local rank copies the leader's
 * result. On the other local ranks leaders is NULL. Every rank of every
 * node ends with the same bits. A leader whose collective fails breaks
 * the local group with its error, so its local ranks fail too. 0, or -1
 * with err. */
int m6_local_hier_allreduce_sum(m6_local *g, m6_coll *leaders, float *buf,
                                size_t n, m6_err *err);

/* Break the group with why (this rank failed): the others' waits fail at
 * once naming this local rank. */
void m6_local_fail(m6_local *g, const char *why);

/* Leave the group and free the handle (NULL: nothing). A rank that leaves
 * while another still has the group breaks it ("local rank r left"); the
 * last one out frees it. */
void m6_local_leave(m6_local *g);

#endif /* M6_DIST_LOCAL_H */
