/*
 * collectives.c — the one collectives interface (collectives.h): checks the
 * configuration, picks the engine by name, turns an engine's error into an
 * m6_err naming the operation and the rank, and keeps a group that failed
 * broken (every later call fails at once with the first failure's words).
 */
#include "dist/collectives.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "dist/coll_backend.h"

struct m6_coll {
    const coll_ops *ops;
    void *ctx;
    int rank, world_size, timeout_ms;
    char *broken;  /* the first failure's message; NULL: healthy */
};

static const coll_ops *find_ops_(const char *name)
{
#ifdef M6_HAVE_GLOO
    if (strcmp(name, "gloo") == 0)
        return &coll_gloo_ops;
#endif
#ifdef M6_HAVE_NCCL
    if (strcmp(name, "nccl") == 0)
        return &coll_nccl_ops;
#endif
    (void)name;
    return NULL;
}

int m6_coll_available(const char *backend)
{
    return backend && find_ops_(backend) != NULL;
}

/* coll_msg -> m6_err, "<what> (rank r of n): <msg>" */
static void set_err_(m6_err *err, const coll_msg *e, const char *what,
                     int rank, int world)
{
    m6_code code = e->code == M6_ECANCELLED ? M6_ECANCELLED : M6_EINTERNAL;
    m6_err_set(err, code, "%s (rank %d of %d): %s", what, rank, world,
               e->msg[0] ? e->msg : "failed");
}

/* m6_err -> coll_msg (the store's error, for an engine) */
static int to_msg_(m6_err *me, coll_msg *e)
{
    e->code = me->code == M6_ECANCELLED ? M6_ECANCELLED : M6_EINTERNAL;
    snprintf(e->msg, sizeof e->msg, "%s", m6_err_msg(me));
    m6_err_free(me);
    return -1;
}

int coll_store_set(m6_store *st, const char *key, const void *val,
                   size_t len, coll_msg *e)
{
    m6_err me = M6_ERR_NONE;
    if (st->set(st->ctx, key, val, len, &me) == 0)
        return 0;
    return to_msg_(&me, e);
}

int coll_store_get(m6_store *st, const char *key, void **val, size_t *len,
                   int timeout_ms, coll_msg *e)
{
    m6_err me = M6_ERR_NONE;
    if (st->get(st->ctx, key, val, len, timeout_ms, &me) == 0)
        return 0;
    return to_msg_(&me, e);
}

int coll_store_wait(m6_store *st, const char *const *keys, size_t n,
                    int timeout_ms, coll_msg *e)
{
    m6_err me = M6_ERR_NONE;
    if (st->wait(st->ctx, keys, n, timeout_ms, &me) == 0)
        return 0;
    return to_msg_(&me, e);
}

m6_coll *m6_coll_init(const m6_coll_config *cfg, m6_err *err)
{
    const char *name = cfg->backend ? cfg->backend : "";
    const coll_ops *ops = find_ops_(name);
    if (!ops) {
        if (strcmp(name, "gloo") == 0 || strcmp(name, "nccl") == 0)
            m6_err_set(err, M6_EINVALID, "collectives: backend '%s': this "
                       "m6 was built without %s (meson option %s)", name,
                       strcmp(name, "gloo") == 0 ? "Gloo" : "NCCL", name);
        else
            m6_err_set(err, M6_EINVALID, "collectives: unknown backend "
                       "'%s' (gloo or nccl)", name);
        return NULL;
    }
    if (cfg->world_size < 1 || cfg->rank < 0 ||
        cfg->rank >= cfg->world_size) {
        m6_err_set(err, M6_EINVALID, "collectives: rank %d is not in "
                   "[0, world size %d)", cfg->rank, cfg->world_size);
        return NULL;
    }
    if (cfg->timeout_ms <= 0) {
        m6_err_set(err, M6_EINVALID, "collectives: timeout must be > 0 ms, "
                   "got %d", cfg->timeout_ms);
        return NULL;
    }
    if (!cfg->store || !cfg->store->set || !cfg->store->get ||
        !cfg->store->wait) {
        m6_err_set(err, M6_EINVALID, "collectives: no bootstrap store");
        return NULL;
    }
    m6_coll *c = calloc(1, sizeof *c);
    if (!c) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        return NULL;
    }
    coll_setup s = {cfg->rank, cfg->world_size, cfg->store,
                    cfg->prefix ? cfg->prefix : "", cfg->timeout_ms,
                    cfg->hostname ? cfg->hostname : "127.0.0.1",
                    cfg->device};
    coll_msg e = {0, ""};
    c->ops = ops;
    c->rank = cfg->rank;
    c->world_size = cfg->world_size;
    c->timeout_ms = cfg->timeout_ms;
    if (!(c->ctx = ops->init(&s, &e))) {
        char what[64];
        snprintf(what, sizeof what, "%s init", ops->name);
        set_err_(err, &e, what, c->rank, c->world_size);
        free(c);
        return NULL;
    }
    return c;
}

/* A call on a broken group: fail at once. */
static int check_broken_(m6_coll *c, const char *what, m6_err *err)
{
    if (!c->broken)
        return 0;
    m6_err_set(err, M6_EINTERNAL, "%s %s (rank %d of %d): the group is "
               "broken by an earlier failure: %s", c->ops->name, what,
               c->rank, c->world_size, c->broken);
    return -1;
}

/* An operation the engine may lack (have: its entry is set): refused by
 * name when it does, or when the group is broken. 0, or -1 with err. */
static int can_run_(m6_coll *c, int have, const char *what, m6_err *err)
{
    if (!have) {
        m6_err_set(err, M6_EINVALID, "%s %s: not implemented by this engine",
                   c->ops->name, what);
        return -1;
    }
    return check_broken_(c, what, err);
}

/* After an engine's failure: err, and the group broken. */
static int fail_(m6_coll *c, const coll_msg *e, const char *what,
                 m6_err *err)
{
    char w[96];
    snprintf(w, sizeof w, "%s %s", c->ops->name, what);
    set_err_(err, e, w, c->rank, c->world_size);
    if (!c->broken)
        c->broken = strdup(m6_err_msg(err));
    return -1;
}

/* ------------------------------------------------ the thread's wait clock */

static __thread int64_t *wait_clock_;
static __thread int wait_depth_;

void m6_coll_wait_clock(int64_t *clock)
{
    if (wait_clock_) __atomic_store_n(wait_clock_, 0, __ATOMIC_RELAXED);
    wait_clock_ = clock;
    wait_depth_ = 0;
}

void m6_coll_wait_begin(void)
{
    if (wait_depth_++ || !wait_clock_) return;
    int64_t ms = clock_mono_ms();
    __atomic_store_n(wait_clock_, ms > 0 ? ms : 1, __ATOMIC_RELAXED);
}

void m6_coll_wait_end(void)
{
    if (wait_depth_ > 0 && --wait_depth_ == 0 && wait_clock_)
        __atomic_store_n(wait_clock_, 0, __ATOMIC_RELAXED);
}

/* m6_coll_wait_end, passing rc on */
static int wait_end_(int rc)
{
    m6_coll_wait_end();
    return rc;
}

/* An engine's call (an expression giving 0 or -1) on the thread's wait
 * clock; its value. */
#define ON_CLOCK_(call) (m6_coll_wait_begin(), wait_end_(call))

/* ---------------------------------------------------------- operations */

int m6_coll_allreduce_sum(m6_coll *c, float *buf, size_t n, m6_err *err)
{
    if (check_broken_(c, "all-reduce", err) != 0)
        return -1;
    if (n == 0 || c->world_size == 1)
        return 0;
    coll_msg e = {0, ""};
    if (ON_CLOCK_(c->ops->allreduce_sum(c->ctx, buf, n, c->timeout_ms, &e)) != 0)
        return fail_(c, &e, "all-reduce", err);
    return 0;
}

int m6_coll_broadcast(m6_coll *c, void *buf, size_t bytes, int root,
                      m6_err *err)
{
    if (root < 0 || root >= c->world_size) {
        m6_err_set(err, M6_EINVALID, "%s broadcast: root %d is not in "
                   "[0, world size %d)", c->ops->name, root, c->world_size);
        return -1;
    }
    if (check_broken_(c, "broadcast", err) != 0)
        return -1;
    if (bytes == 0 || c->world_size == 1)
        return 0;
    coll_msg e = {0, ""};
    if (ON_CLOCK_(c->ops->broadcast(c->ctx, buf, bytes, root, c->timeout_ms,
                                    &e)) != 0)
        return fail_(c, &e, "broadcast", err);
    return 0;
}

/* The counts' sum, or SIZE_MAX after err when it is not n (n SIZE_MAX:
 * any). */
static size_t counts_sum_(const m6_coll *c, const size_t *counts, size_t n,
                          const char *what, m6_err *err)
{
    size_t sum = 0;
    for (int r = 0; r < c->world_size; r++)
        sum += counts[r];
    if (n != SIZE_MAX && sum != n) {
        m6_err_set(err, M6_EINVALID, "%s %s: the ranks' counts add up to "
                   "%zu, not %zu", c->ops->name, what, sum, n);
        return SIZE_MAX;
    }
    return sum;
}

int m6_coll_reduce_scatter_sum(m6_coll *c, float *buf, size_t n,
                               const size_t *counts, m6_err *err)
{
    if (counts_sum_(c, counts, n, "reduce-scatter", err) == SIZE_MAX)
        return -1;
    return m6_coll_allreduce_sum(c, buf, n, err);
}

int m6_coll_allgather(m6_coll *c, float *buf, const size_t *counts,
                      m6_err *err)
{
    if (can_run_(c, c->ops->allgather != NULL, "all-gather", err) != 0)
        return -1;
    if (c->world_size == 1 ||
        counts_sum_(c, counts, SIZE_MAX, "all-gather", err) == 0)
        return 0;
    coll_msg e = {0, ""};
    if (ON_CLOCK_(c->ops->allgather(c->ctx, buf, counts, c->timeout_ms, &e)) != 0)
        return fail_(c, &e, "all-gather", err);
    return 0;
}

int m6_coll_alltoallv(m6_coll *c, const void *send, const size_t *send_bytes,
                      void *recv, const size_t *recv_bytes, m6_err *err)
{
    if (can_run_(c, c->ops->alltoallv != NULL, "all-to-all", err) != 0)
        return -1;
    if (c->world_size == 1 && send_bytes[0] != recv_bytes[0]) {
        m6_err_set(err, M6_EINVALID, "all-to-all: world 1 sends %zu bytes "
                   "to itself and receives %zu", send_bytes[0],
                   recv_bytes[0]);
        return -1;
    }
    if (c->world_size == 1 && !c->ops->device_buffers) {
        if (send_bytes[0])
            memcpy(recv, send, send_bytes[0]);
        return 0;
    }
    coll_msg e = {0, ""};
    if (ON_CLOCK_(c->ops->alltoallv(c->ctx, send, send_bytes, recv,
                                    recv_bytes, c->timeout_ms, &e)) != 0)
        return fail_(c, &e, "all-to-all", err);
    return 0;
}

int m6_coll_alltoall_sizes(m6_coll *c, const uint64_t *send, uint64_t *recv,
                           m6_err *err)
{
    size_t W = (size_t)c->world_size;
    size_t *b = malloc(W * sizeof *b);
    if (!b) {
        m6_err_set(err, M6_EINTERNAL, "all-to-all of sizes: out of memory");
        return -1;
    }
    for (size_t i = 0; i < W; i++)
        b[i] = sizeof(uint64_t);
    int rc = m6_coll_alltoallv(c, send, b, recv, b, err);
    free(b);
    return rc;
}

int m6_coll_barrier(m6_coll *c, m6_err *err)
{
    if (check_broken_(c, "barrier", err) != 0)
        return -1;
    if (c->world_size == 1)
        return 0;
    coll_msg e = {0, ""};
    if (ON_CLOCK_(c->ops->barrier(c->ctx, c->timeout_ms, &e)) != 0)
        return fail_(c, &e, "barrier", err);
    return 0;
}

int m6_coll_rank(const m6_coll *c) { return c->rank; }
int m6_coll_world_size(const m6_coll *c) { return c->world_size; }
const char *m6_coll_backend(const m6_coll *c) { return c->ops->name; }
int m6_coll_device_buffers(const m6_coll *c) { return c->ops->device_buffers; }

void m6_coll_destroy(m6_coll *c)
{
    if (!c)
        return;
    c->ops->destroy(c->ctx, c->broken != NULL);
    free(c->broken);
    free(c);
}
