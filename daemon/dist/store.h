/*
 * store.h — the rendezvous key-value store that a collective engine's
 * bootstrap needs (Gloo's Store interface; NCCL's unique id travels through
 * it too).
 *
 * The multi-node coordinator serves one store per run over m6's own
 * protocol (daemon/cluster/); the collectives (daemon/dist/) use it only
 * through this table of functions, so a test can put a store in a file or
 * in memory instead.
 *
 * Keys are NUL-terminated strings of at most M6_STORE_KEY_MAX bytes; values
 * are opaque bytes of at most M6_STORE_VALUE_MAX. A key is written once per
 * run and generation (a second set of the same key replaces the value).
 *
 * Every function returns 0 or fills *err (code M6_EINTERNAL for a store
 * that cannot be reached, M6_ECANCELLED on timeout, naming the key and the
 * time waited) and returns -1. Thread-safe: Gloo calls it from its own
 * threads.
 */
#ifndef M6_DIST_STORE_H
#define M6_DIST_STORE_H

#include <stddef.h>

#include "common/err.h"

#define M6_STORE_KEY_MAX 256
#define M6_STORE_VALUE_MAX (1u << 20)

typedef struct m6_store {
    void *ctx;
    /* Set key to the len bytes at val. */
    int (*set)(void *ctx, const char *key, const void *val, size_t len,
               m6_err *err);
    /* Get key's value, waiting up to timeout_ms (0: do not wait) for a set.
     * *val is malloc'd (the caller frees it), *len its size in bytes. */
    int (*get)(void *ctx, const char *key, void **val, size_t *len,
               int timeout_ms, m6_err *err);
    /* Wait up to timeout_ms until every one of the n keys is set. */
    int (*wait)(void *ctx, const char *const *keys, size_t n, int timeout_ms,
                m6_err *err);
} m6_store;

#endif
