/*
 * coll_backend.h — what collectives.c needs of one engine (private to
 * daemon/dist/). Plain C types only, so the C++ engine (gloo.cc) includes
 * it without common/err.h: an engine's error is a coll_msg (an m6_code
 * and its words), which collectives.c turns into the caller's m6_err.
 * Each function returns 0, or -1 with *e filled. The engines are compiled
 * in when m6 is built with them (M6_HAVE_GLOO: gloo.cc, M6_HAVE_NCCL:
 * nccl.c).
 */
#ifndef M6_DIST_COLL_BACKEND_H
#define M6_DIST_COLL_BACKEND_H

#include <stddef.h>

/* dist/store.h's table, opaque here (store.h includes common/err.h,
 * which is C only) */
typedef struct m6_store m6_store;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int code;        /* an m6_code: M6_ECANCELLED timed out, M6_EINTERNAL */
    char msg[1536];
} coll_msg;

/* What an engine is given (collectives.c checked it: rank in range,
 * timeout > 0, prefix never NULL). */
typedef struct {
    int rank, world_size;
    m6_store *store;
    const char *prefix;
    int timeout_ms;
    const char *hostname;
    int device;
} coll_setup;

typedef struct {
    const char *name;
    int device_buffers;
    void *(*init)(const coll_setup *s, coll_msg *e);
    int (*allreduce_sum)(void *ctx, float *buf, size_t n, int timeout_ms,
                         coll_msg *e);
    int (*broadcast)(void *ctx, void *buf, size_t bytes, int root,
                     int timeout_ms, coll_msg *e);
    int (*barrier)(void *ctx, int timeout_ms, coll_msg *e);
    /* broken: a collective failed (abort, do not wait for peers) */
    void (*destroy)(void *ctx, int broken);
    /* in place: rank r's counts[r] floats at buf + the counts before it
     * to every rank. NULL: the engine has none (collectives.c refuses). */
    int (*allgather)(void *ctx, float *buf, const size_t *counts,
                     int timeout_ms, coll_msg *e);
    /* send_bytes[j] bytes of send (in rank order) to rank j, recv_bytes[i]
     * bytes from rank i into recv (in rank order); any may be 0. NULL: the
     * engine has none. */
    int (*alltoallv)(void *ctx, const void *send, const size_t *send_bytes,
                     void *recv, const size_t *recv_bytes, int timeout_ms,
                     coll_msg *e);
} coll_ops;

/* The store's functions with a coll_msg (collectives.c), for gloo.cc:
 * the m6_err of the store becomes *e. */
int coll_store_set(m6_store *st, const char *key, const void *val,
                   size_t len, coll_msg *e);
int coll_store_get(m6_store *st, const char *key, void **val, size_t *len,
                   int timeout_ms, coll_msg *e);
int coll_store_wait(m6_store *st, const char *const *keys, size_t n,
                    int timeout_ms, coll_msg *e);

#ifdef M6_HAVE_GLOO
extern const coll_ops coll_gloo_ops;
#endif
#ifdef M6_HAVE_NCCL
extern const coll_ops coll_nccl_ops;
#endif

#ifdef __cplusplus
}
#endif

#endif /* M6_DIST_COLL_BACKEND_H */
