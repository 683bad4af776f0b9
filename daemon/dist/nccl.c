/*
 * nccl.c — the "nccl" engine of collectives.h: NCCL between GPUs, from the
 * CUDA toolkit (nccl.h, libnccl.so.2).
 *
 * Bootstrap: rank 0 draws the unique id (ncclGetUniqueId) and sets it in
 * the store under "<prefix>/nccl_id"; the others get it, waiting up to the
 * timeout. The communicator is made non-blocking (ncclConfig_t.blocking 0)
 * so that init and every collective can be given up: each is polled
 * (ncclCommGetAsyncError, cudaStreamQuery) until done, failed or past the
 * timeout; then the communicator is aborted (ncclCommAbort), which frees
 * its resources without waiting for the peers.
 *
 * Buffers are device memory of cfg.device; the group owns one stream and
 * each call waits for its collective to finish on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/err.h"
#include "common/clock.h"
#include "dist/coll_backend.h"
#include "dist/store.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int rank, world;
} nccl_group_;

static int msg_(coll_msg *e, int code, const char *fmt, const char *a,
                const char *b)
{
    e->code = code;
    snprintf(e->msg, sizeof e->msg, fmt, a, b);
    return -1;
}

/* One turn of a poll that gives up at end (clock_mono_s): -1 with e once
 * past it, else a 0.2 ms nap and 0. */
static int poll_turn_(double end, const char *what, int timeout_ms,
                      coll_msg *e)
{
    if (clock_mono_s() > end) {
        char t[32];
        snprintf(t, sizeof t, "%d", timeout_ms);
        return msg_(e, M6_ECANCELLED, "%s: timed out after %s ms "
                    "(a peer did not take part)", what, t);
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
    return 0;
}

/* Wait until the communicator's pending work is issued (init, or an
 * enqueue that returned ncclInProgress): 0, or -1 with e. */
static int wait_comm_(nccl_group_ *g, const char *what, int timeout_ms,
                      coll_msg *e)
{
    double end = clock_mono_s() + timeout_ms / 1e3;
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = ncclCommGetAsyncError(g->comm, &st);
        if (r != ncclSuccess)
            return msg_(e, M6_EINTERNAL, "%s: ncclCommGetAsyncError: %s",
                        what, ncclGetErrorString(r));
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return msg_(e, M6_EINTERNAL, "%s: %s", what,
                        ncclGetLastError(g->comm)[0]
                            ? ncclGetLastError(g->comm)
                            : ncclGetErrorString(st));
        if (poll_turn_(end, what, timeout_ms, e) < 0)
            return -1;
    }
}

/* Wait for the group's stream: the collective done, or failed, or past
 * the timeout. */
static int wait_stream_(nccl_group_ *g, const char *what, int timeout_ms,
                        coll_msg *e)
{
    double end = clock_mono_s() + timeout_ms / 1e3;
    for (;;) {
        cudaError_t q = cudaStreamQuery(g->stream);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady)
            return msg_(e, M6_EINTERNAL, "%s: %s", what,
                        cudaGetErrorString(q));
        ncclResult_t st;
        if (ncclCommGetAsyncError(g->comm, &st) == ncclSuccess &&
            st != ncclSuccess && st != ncclInProgress)
            return msg_(e, M6_EINTERNAL, "%s: %s", what,
                        ncclGetErrorString(st));
        if (poll_turn_(end, what, timeout_ms, e) < 0)
            return -1;
    }
}

static void nccl_destroy_(void *ctx, int broken)
{
    nccl_group_ *g = ctx;
    if (!g)
        return;
    cudaSetDevice(g->device);
    if (g->comm) {
        /* a healthy group finishes its work with the peers first (10 s
         * at most); a broken one, or one whose peers are gone, aborts */
        coll_msg e;
        ncclResult_t r = broken ? ncclInternalError : ncclCommFinalize(g->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            wait_comm_(g, "ncclCommFinalize", 10000, &e) == 0)
            ncclCommDestroy(g->comm);
        else
            ncclCommAbort(g->comm);
    }
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g);
}

static void *nccl_init_(const coll_setup *s, coll_msg *e)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        msg_(e, M6_EINTERNAL, "no CUDA device (cudaGetDeviceCount: %s)%s",
             ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices", "");
        return NULL;
    }
    if (s->device < 0 || s->device >= n) {
        char d[48];
        snprintf(d, sizeof d, "%d (this node has %d)", s->device, n);
        msg_(e, M6_EINTERNAL, "no CUDA device %s%s", d, "");
        return NULL;
    }
    nccl_group_ *g = calloc(1, sizeof *g);
    if (!g) {
        msg_(e, M6_EINTERNAL, "out of memory%s%s", "", "");
        return NULL;
    }
    g->device = s->device;
    g->rank = s->rank;
    g->world = s->world_size;
    char key[M6_STORE_KEY_MAX + 16];
    snprintf(key, sizeof key, "%s%snccl_id", s->prefix,
             s->prefix[0] ? "/" : "");
    ncclUniqueId id;
    if (s->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            msg_(e, M6_EINTERNAL, "ncclGetUniqueId: %s%s",
                 ncclGetErrorString(r), "");
            goto fail;
        }
        if (coll_store_set(s->store, key, &id, sizeof id, e) != 0)
            goto fail;
    } else {
        void *val = NULL;
        size_t len = 0;
        if (coll_store_get(s->store, key, &val, &len, s->timeout_ms, e) != 0)
            goto fail;
        if (len != sizeof id) {
            free(val);
            msg_(e, M6_EINTERNAL, "store key %s: not an NCCL unique id%s",
                 key, "");
            goto fail;
        }
        memcpy(&id, val, sizeof id);
        free(val);
    }
    if ((ce = cudaSetDevice(s->device)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking))
            != cudaSuccess) {
        msg_(e, M6_EINTERNAL, "CUDA: %s%s", cudaGetErrorString(ce), "");
        goto fail;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&g->comm, s->world_size, id,
                                            s->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        msg_(e, M6_EINTERNAL, "ncclCommInitRankConfig: %s%s",
             ncclGetErrorString(r), "");
        goto fail;
    }
    if (wait_comm_(g, "ncclCommInitRank", s->timeout_ms, e) != 0) {
        nccl_destroy_(g, 1);
        return NULL;
    }
    return g;
fail:
    nccl_destroy_(g, 1);
    return NULL;
}

/* Enqueue done (r), then wait for it on the stream. */
static int finish_(nccl_group_ *g, ncclResult_t r, const char *what,
                   int timeout_ms, coll_msg *e)
{
    if (r != ncclSuccess && r != ncclInProgress)
        return msg_(e, M6_EINTERNAL, "%s: %s", what, ncclGetErrorString(r));
    if (r == ncclInProgress && wait_comm_(g, what, timeout_ms, e) != 0)
        return -1;
    return wait_stream_(g, what, timeout_ms, e);
}

static int nccl_allreduce_sum_(void *ctx, float *buf, size_t n,
                               int timeout_ms, coll_msg *e)
{
    nccl_group_ *g = ctx;
    cudaSetDevice(g->device);
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, g->comm,
                                   g->stream);
    return finish_(g, r, "ncclAllReduce", timeout_ms, e);
}

static int nccl_broadcast_(void *ctx, void *buf, size_t bytes, int root,
                           int timeout_ms, coll_msg *e)
{
    nccl_group_ *g = ctx;
    cudaSetDevice(g->device);
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->comm,
                                   g->stream);
    return finish_(g, r, "ncclBroadcast", timeout_ms, e);
}

/* NCCL has no barrier: an all-reduce of one float on the device. */
static int nccl_barrier_(void *ctx, int timeout_ms, coll_msg *e)
{
    nccl_group_ *g = ctx;
    cudaSetDevice(g->device);
    float *d = NULL;
    cudaError_t ce = cudaMalloc((void **)&d, sizeof(float));
    if (ce != cudaSuccess)
        return msg_(e, M6_EINTERNAL, "barrier: cudaMalloc: %s%s",
                    cudaGetErrorString(ce), "");
    cudaMemsetAsync(d, 0, sizeof(float), g->stream);
    ncclResult_t r = ncclAllReduce(d, d, 1, ncclFloat, ncclSum, g->comm,
                                   g->stream);
    int rc = finish_(g, r, "barrier (ncclAllReduce)", timeout_ms, e);
    cudaFree(d);
    return rc;
}

/* Point-to-point in one NCCL group: a send and a receive per peer with a
 * non-empty part (rank order; this rank's own part too), bytes as
 * ncclUint8. With nothing to move the group is empty and completes at
 * once: the peers' groups do not wait for this rank's. */
static int nccl_alltoallv_(void *ctx, const void *send,
                           const size_t *send_bytes, void *recv,
                           const size_t *recv_bytes, int timeout_ms,
                           coll_msg *e)
{
    nccl_group_ *g = ctx;
    cudaSetDevice(g->device);
    ncclResult_t r = ncclGroupStart();
    size_t so = 0, ro = 0;
    for (int j = 0; j < g->world && (r == ncclSuccess || r == ncclInProgress);
         j++) {
        if (send_bytes[j])
            r = ncclSend((const char *)send + so, send_bytes[j], ncclUint8, j,
                         g->comm, g->stream);
        if (recv_bytes[j] && (r == ncclSuccess || r == ncclInProgress))
            r = ncclRecv((char *)recv + ro, recv_bytes[j], ncclUint8, j,
                         g->comm, g->stream);
        so += send_bytes[j];
        ro += recv_bytes[j];
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress)
        r = r2;
    return finish_(g, r, "all-to-all (ncclSend/ncclRecv)", timeout_ms, e);
}

const coll_ops coll_nccl_ops = {
    "nccl", 1, nccl_init_, nccl_allreduce_sum_, nccl_broadcast_,
    nccl_barrier_, nccl_destroy_, NULL, /* no all-gather yet */
    nccl_alltoallv_,
};
