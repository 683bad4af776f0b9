/*
 * local.c — the node-local engine of local.h: a process-wide table of
 * named groups, each a counting barrier with a timeout and the local
 * ranks' buffer addresses; the sums of one operation are computed in
 * slices by every local rank into local rank 0's buffer.
 */
#include "dist/local.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

/* One group, shared by its local ranks' handles. */
typedef struct group_ {
    struct group_ *next;     /* in the table */
    char name[256];
    int size, timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char joined[M6_LOCAL_MAX];  /* rank r joined */
    unsigned char holding[M6_LOCAL_MAX]; /* rank r joined, has not left */
    unsigned char arrived[M6_LOCAL_MAX]; /* rank r waits at the barrier */
    int n_holding, n_arrived;
    unsigned long gen;        /* barriers passed */
    int broken_code;          /* an m6_code; 0: healthy */
    char broken[1024];        /* why, once broken */
    float *buf[M6_LOCAL_MAX]; /* each rank's buffer of this operation */
    size_t n[M6_LOCAL_MAX];
} group_;

struct m6_local {
    group_ *g;
    int rank;
};

static pthread_mutex_t table_mu_ = PTHREAD_MUTEX_INITIALIZER;
static group_ *table_;

/* Break g (mu held) unless it is broken already: the first cause wins. */
static void break_locked_(group_ *g, int code, const char *msg)
{
    if (g->broken_code)
        return;
    g->broken_code = code;
    snprintf(g->broken, sizeof g->broken, "%s", msg);
    pthread_cond_broadcast(&g->cv);
}

static void set_broken_err_(const m6_local *h, m6_err *err)
{
    group_ *g = h->g;
    m6_err_set(err, g->broken_code == M6_ECANCELLED ? M6_ECANCELLED
                                                    : M6_EINTERNAL,
               "node-local group %s (local rank %d of %d): %s", g->name,
               h->rank, g->size, g->broken);
}

m6_local *m6_local_join(const char *name, int rank, int size, int timeout_ms,
                        m6_err *err)
{
    if (!name || strlen(name) > 255 || size < 1 || size > M6_LOCAL_MAX ||
        rank < 0 || rank >= size || timeout_ms <= 0) {
        m6_err_set(err, M6_EINVALID, "node-local group %s: local rank %d of "
                   "%d, timeout %d ms (name at most 255 bytes, 1 <= size <= "
                   "%d, 0 <= rank < size, timeout > 0)", name ? name : "?",
                   rank, size, timeout_ms, M6_LOCAL_MAX);
        return NULL;
    }
    m6_local *h = calloc(1, sizeof *h);
    if (!h) {
        m6_err_set(err, M6_EINTERNAL, "node-local group: out of memory");
        return NULL;
    }
    pthread_mutex_lock(&table_mu_);
    group_ *g = table_;
    while (g && strcmp(g->name, name) != 0)
        g = g->next;
    if (!g) {
        if (!(g = calloc(1, sizeof *g))) {
            pthread_mutex_unlock(&table_mu_);
            free(h);
            m6_err_set(err, M6_EINTERNAL, "node-local group: out of memory");
            return NULL;
        }
        snprintf(g->name, sizeof g->name, "%s", name);
        g->size = size;
        g->timeout_ms = timeout_ms;
        pthread_mutex_init(&g->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&g->cv, &ca);
        pthread_condattr_destroy(&ca);
        g->next = table_;
        table_ = g;
    }
    pthread_mutex_lock(&g->mu);
    int bad_size = g->size != size, again = !bad_size && g->joined[rank];
    if (!bad_size && !again) {
        g->joined[rank] = g->holding[rank] = 1;
        g->n_holding++;
    }
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_unlock(&table_mu_);
    if (bad_size || again) {
        if (bad_size)
            m6_err_set(err, M6_EINVALID, "node-local group %s: local rank %d "
                       "joins with size %d, the group has %d", name, rank,
                       size, g->size);
        else
            m6_err_set(err, M6_EINVALID, "node-local group %s: local rank %d "
                       "joined already", name, rank);
        free(h);
        return NULL;
    }
    h->g = g;
    h->rank = rank;
    return h;
}

int m6_local_rank(const m6_local *h) { return h->rank; }
int m6_local_size(const m6_local *h) { return h->g->size; }

/* Wait until every local rank has arrived (timeout_ms from now). A
 * barrier that every rank passed succeeds even if the group breaks
 * afterwards. 0, or -1 with err (the group broken: by this wait's timeout,
 * naming the first local rank missing, or earlier). */
static int barrier_wait_(m6_local *h, int timeout_ms, m6_err *err)
{
    group_ *g = h->g;
    pthread_mutex_lock(&g->mu);
    if (g->broken_code) {
        set_broken_err_(h, err);
        pthread_mutex_unlock(&g->mu);
        return -1;
    }
    unsigned long gen = g->gen;
    g->arrived[h->rank] = 1;
    if (++g->n_arrived == g->size) {
        memset(g->arrived, 0, (size_t)g->size);
        g->n_arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    struct timespec dl = clock_deadline(CLOCK_MONOTONIC, timeout_ms);
    while (g->gen == gen && !g->broken_code) {
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT &&
            g->gen == gen && !g->broken_code) {
            int miss = 0;
            while (miss < g->size && g->arrived[miss])
                miss++;
            char msg[256];
            snprintf(msg, sizeof msg, "timed out: local rank %d waited %d ms "
                     "for local rank %d", h->rank, timeout_ms, miss);
            break_locked_(g, M6_ECANCELLED, msg);
        }
    }
    int rc = 0;
    if (g->gen == gen) {
        g->arrived[h->rank] = 0;
        g->n_arrived--;
        set_broken_err_(h, err);
        rc = -1;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* barrier_wait_ on the thread's wait clock (collectives.h) */
static int barrier_(m6_local *h, int timeout_ms, m6_err *err)
{
    m6_coll_wait_begin();
    int rc = barrier_wait_(h, timeout_ms, err);
    m6_coll_wait_end();
    return rc;
}

/* Break the group from this rank (code, its words), and err the same. */
static int fail_(m6_local *h, int code, const char *msg, m6_err *err)
{
    pthread_mutex_lock(&h->g->mu);
    break_locked_(h->g, code, msg);
    set_broken_err_(h, err);
    pthread_mutex_unlock(&h->g->mu);
    return -1;
}

/* Sum every local rank's buf into local rank 0's, then (cross) the
 * leader's collective over the nodes, then every rank copies rank 0's.
 * Barriers: posted, summed, [crossed,] copied. */
static int reduce_(m6_local *h, m6_coll *leaders, float *buf, size_t n,
                   int cross, m6_err *err)
{
    group_ *g = h->g;
    int P = g->size, me = h->rank;
    if (P == 1 && !cross)
        return 0;
    pthread_mutex_lock(&g->mu);
    g->buf[me] = buf;
    g->n[me] = n;
    pthread_mutex_unlock(&g->mu);
    if (barrier_(h, g->timeout_ms, err) != 0)
        return -1;
    for (int r = 1; r < P; r++)
        if (g->n[r] != g->n[0]) {
            char msg[256];
            snprintf(msg, sizeof msg, "local rank %d sums %zu floats, local "
                     "rank 0 %zu", r, g->n[r], g->n[0]);
            return fail_(h, M6_EINTERNAL, msg, err);
        }
    /* this rank's slice, in local rank order into rank 0's buffer: each
     * element is read and written by one thread */
    size_t lo = n * (size_t)me / (size_t)P, hi = n * (size_t)(me + 1) /
                                                 (size_t)P;
    float *acc = g->buf[0];
    for (int r = 1; r < P; r++) {
        const float *b = g->buf[r];
        for (size_t i = lo; i < hi; i++)
            acc[i] += b[i];
    }
    if (P > 1 && barrier_(h, g->timeout_ms, err) != 0)
        return -1;
    if (cross) {
        if (me == 0 && leaders &&
            m6_coll_allreduce_sum(leaders, acc, n, err) != 0) {
            char msg[1024];
            snprintf(msg, sizeof msg, "the all-reduce among the nodes' "
                     "leaders (its ranks are node indices) failed: %s",
                     m6_err_msg(err));
            m6_err_free(err);
            return fail_(h, M6_EINTERNAL, msg, err);
        }
        /* the others wait for the leader's collective, which has its own
         * timeout: twice theirs, so its error is the one they report */
        if (P > 1 && barrier_(h, 2 * g->timeout_ms, err) != 0)
            return -1;
    }
    if (me != 0)
        memcpy(buf, acc, n * sizeof(float));
    /* rank 0's buffer is read until every copy is done */
    return P > 1 ? barrier_(h, g->timeout_ms, err) : 0;
}

int m6_local_allreduce_sum(m6_local *h, float *buf, size_t n, m6_err *err)
{
    return reduce_(h, NULL, buf, n, 0, err);
}

int m6_local_hier_allreduce_sum(m6_local *h, m6_coll *leaders, float *buf,
                                size_t n, m6_err *err)
{
    return reduce_(h, h->rank == 0 ? leaders : NULL, buf, n, 1, err);
}

void m6_local_fail(m6_local *h, const char *why)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "local rank %d failed: %s", h->rank,
             why ? why : "?");
    pthread_mutex_lock(&h->g->mu);
    break_locked_(h->g, M6_EINTERNAL, msg);
    pthread_mutex_unlock(&h->g->mu);
}

void m6_local_leave(m6_local *h)
{
    if (!h)
        return;
    group_ *g = h->g;
    pthread_mutex_lock(&table_mu_);
    pthread_mutex_lock(&g->mu);
    g->holding[h->rank] = 0;
    int last = --g->n_holding == 0;
    if (!last) {
        char msg[128];
        snprintf(msg, sizeof msg, "local rank %d left the group", h->rank);
        break_locked_(g, M6_EINTERNAL, msg);
    }
    pthread_mutex_unlock(&g->mu);
    if (last) {
        group_ **p = &table_;
        while (*p != g)
            p = &(*p)->next;
        *p = g->next;
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
    pthread_mutex_unlock(&table_mu_);
    free(h);
}
