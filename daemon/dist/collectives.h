/*
 * collectives.h — the collective operations of data-parallel training, one
 * interface over the engines m6 uses (never a hand-written network
 * all-reduce):
 *
 *   "gloo"  Gloo (Debian's libgloo-dev) over its TCP transport, between
 *           CPU workers; buffers are host memory.   (daemon/dist/gloo.cc)
 *   "nccl"  NCCL (the CUDA toolkit's libnccl.so.2), between GPUs; buffers
 *           are device memory of the communicator's GPU. (daemon/dist/nccl.c)
 *
 * A backend is present when m6 was built with it (meson options gloo and
 * nccl, both `auto`); m6_coll_available says which.
 *
 * Between the ranks of one process (m6d --devices N) the node-local
 * engine of dist/local.h sums through shared memory, and its
 * hierarchical all-reduce uses a group of this interface among the
 * nodes' leaders.
 *
 * Bootstrap: every rank of one group calls m6_coll_init with the same
 * world size, backend, store and key prefix and its own rank. The store
 * (dist/store.h: the coordinator's, or a file store in tests) carries the
 * ranks' addresses (Gloo) or rank 0's unique id (NCCL).
 *
 * Timeouts: init and every collective give up after cfg.timeout_ms: a rank
 * that never joins, dies or stops answering makes the others fail with
 * M6_ECANCELLED (timed out) or M6_EINTERNAL (connection lost) and a message
 * naming the operation, the rank and the cause. Nothing waits forever.
 * After a failed collective the group is broken: every later call fails at
 * once (naming the first failure); destroy it and make a new one (with a
 * new prefix: store keys are written once per run and generation).
 *
 * Determinism: for one world size, backend and buffer length, an
 * all-reduce's result is bitwise the same on every rank and from run to
 * run (Gloo's ring reduce-scatter and all-gather: each element is summed
 * in a fixed order on one rank, then copied to the others; NCCL with its
 * algorithm and protocol pinned by NCCL_ALGO/NCCL_PROTO).
 *
 * Not thread-safe: one thread at a time calls the functions of one group.
 * The gloo engine sets SIGPIPE to be ignored when its disposition is the
 * default (a dead peer must fail a send, not end this process).
 */
#ifndef M6_DIST_COLLECTIVES_H
#define M6_DIST_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "dist/store.h"

typedef struct m6_coll m6_coll;

typedef struct {
    const char *backend;  /* "gloo" or "nccl" */
    int rank;             /* 0 .. world_size-1 */
    int world_size;       /* >= 1 */
    m6_store *store;      /* bootstrap; only used during m6_coll_init */
    const char *prefix;   /* store key prefix of this group (a run and
                           * generation, "run7/g0"); NULL: none */
    int timeout_ms;       /* init and each collective; > 0 */
    const char *hostname; /* gloo: the address this rank listens on and
                           * its peers reach it at (NULL: 127.0.0.1) */
    int device;           /* nccl: CUDA device ordinal */
} m6_coll_config;

/* 1 when this build has the named backend ("gloo", "nccl"), else 0. */
int m6_coll_available(const char *backend);

/* Join the group: rendezvous through cfg->store, connect to every peer.
 * Returns the group, or NULL with err: M6_EINVALID for a bad config (an
 * unknown or absent backend, rank out of range, timeout <= 0),
 * M6_ECANCELLED when a peer did not join within timeout_ms (the message
 * names the missing rank's key), M6_EINTERNAL otherwise (the engine's
 * words). */
m6_coll *m6_coll_init(const m6_coll_config *cfg, m6_err *err);

/* Sum buf (n fp32 values; host memory for gloo, device memory for nccl)
 * over the ranks, in place: afterwards every rank holds the same sums.
 * 0, or -1 with err (see Timeouts). */
int m6_coll_allreduce_sum(m6_coll *c, float *buf, size_t n, m6_err *err);

/* Copy root's bytes bytes at buf into buf on every other rank (memory as
 * for m6_coll_allreduce_sum). 0, or -1 with err. */
int m6_coll_broadcast(m6_coll *c, void *buf, size_t bytes, int root,
                      m6_err *err);

/* Sum buf (n fp32 values, memory as for m6_coll_allreduce_sum) over the
 * ranks and leave rank r's part summed: counts[r] values (world_size of
 * them, adding up to n) at buf + the counts before it; the rest of buf is
 * unspecified afterwards. Composed from the all-reduce (Debian's Gloo has
 * reduce-scatter only as its old halving-doubling algorithm class, no
 * options API with timeouts and tags): the same wire bytes as an
 * all-reduce, and each rank's part bitwise the all-reduce's sums. 0, or
 * -1 with err (M6_EINVALID: counts do not add up to n). */
int m6_coll_reduce_scatter_sum(m6_coll *c, float *buf, size_t n,
                               const size_t *counts, m6_err *err);

/* All-gather in place: rank r's counts[r] fp32 values (world_size counts,
 * any may be 0) at buf + the counts before it go to the same place on
 * every rank; afterwards every rank holds all of buf. Gloo's allgatherv;
 * M6_EINVALID on an engine without one (nccl). 0, or -1 with err. */
int m6_coll_allgather(m6_coll *c, float *buf, const size_t *counts,
                      m6_err *err);

/* Return once every rank has entered the barrier. 0, or -1 with err. */
/* All-to-all with sizes that vary by pair (expert parallelism's token
 * exchange): send holds, in rank order, the send_bytes[j] bytes for each
 * rank j (its own part included: copied locally); afterwards recv holds,
 * in rank order, the recv_bytes[i] bytes rank i sent here. Any size may be
 * 0, and a rank that sends and receives nothing still calls it: every
 * rank enters every collective (the engines number them). The sizes must
 * agree pairwise (rank i's send_bytes[j] is rank j's recv_bytes[i];
 * m6_coll_alltoall_sizes exchanges them); send and recv must not overlap.
 * send_bytes and recv_bytes have world_size entries. Gloo's alltoallv;
 * NCCL's grouped send and receive (device buffers). 0, or -1 with err
 * (M6_EINVALID: an engine without it, or world 1 with unequal sizes). */
int m6_coll_alltoallv(m6_coll *c, const void *send, const size_t *send_bytes,
                      void *recv, const size_t *recv_bytes, m6_err *err);

/* Each rank's world_size sizes, one to every rank: send[j] goes to rank j;
 * afterwards recv[i] is what rank i sent here (the sizes of a following
 * m6_coll_alltoallv). On a device-buffer engine (nccl) send and recv are
 * device memory, as for every call of that group. 0, or -1 with err. */
int m6_coll_alltoall_sizes(m6_coll *c, const uint64_t *send, uint64_t *recv,
                           m6_err *err);

int m6_coll_barrier(m6_coll *c, m6_err *err);

int m6_coll_rank(const m6_coll *c);
int m6_coll_world_size(const m6_coll *c);
/* "gloo" or "nccl". */
const char *m6_coll_backend(const m6_coll *c);
/* 1: buffers are device memory (nccl); 0: host memory (gloo). */
int m6_coll_device_buffers(const m6_coll *c);

/* Leave the group and free it (NULL: nothing). A broken group is aborted
 * without waiting for peers. */
void m6_coll_destroy(m6_coll *c);

/* Where the calling thread says since when it waits in a collective (the
 * rank threads: rankboard_wait_clock): while one of its collective calls
 * runs (m6_coll_* with world > 1, m6_local_*; nested ones count once),
 * *clock holds the CLOCK_MONOTONIC millisecond it entered the outermost,
 * else 0; written with __atomic_store_n, for another thread to read with
 * __atomic_load_n. NULL: none (the default). Per thread. */
void m6_coll_wait_clock(int64_t *clock);
/* Entering (begin) and leaving (end) a blocking collective call, for the
 * engines of this folder (local.c): the clock above. Pairs; may nest. */
void m6_coll_wait_begin(void);
void m6_coll_wait_end(void);

#endif /* M6_DIST_COLLECTIVES_H */
