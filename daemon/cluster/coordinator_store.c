/*
 * coordinator_store.c — the coordinator's rendezvous store (dist/store.h):
 * keys per (run, generation) in memory, set and get and wait, a request
 * parked until its keys are set or its deadline passes, each rank writing
 * only its own keys, and a run's older generations freed. Who may open
 * the store is coordinator.c's (the node's id and secret, the rank it
 * holds); the wire, TLS and the peers' lifetimes too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "cluster/coordinator_internal.h"
#include "dist/store.h"
#include "m6.pb-c.h"

static store_entry *store_find_(cluster_coord *co, int64_t run, int64_t gen,
                                const char *key)
{
    for (store_entry *e = co->store; e; e = e->next)
        if (e->run == run && e->gen == gen && strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

/* The first missing key of the peer's parked request, or NULL: all set. */
static const char *store_missing_(peer *p)
{
    for (size_t i = 0; i < p->n_keys; i++)
        if (!store_find_(p->co, p->run, p->gen, p->keys[i])) return p->keys[i];
    return NULL;
}


/* Answer a parked request (its keys are all set now). */
static void store_answer_(peer *p)
{
    uv_timer_stop(&p->timer);
    M6__Response r = M6__RESPONSE__INIT;
    M6__StoreValue sv = M6__STORE_VALUE__INIT;
    if (p->parked_get) {
        store_entry *e = store_find_(p->co, p->run, p->gen, p->keys[0]);
        sv.value.data = e->val;
        sv.value.len = e->len;
        r.body_case = M6__RESPONSE__BODY_STORE_VALUE;
        r.store_value = &sv;
    }
    coord_send(p, &r, 0);
    coord_peer_free_keys(p);
}

/* The parked request's deadline passed: STATUS_TIMEOUT naming a key. */
static void store_refuse_timeout_(peer *p)
{
    char msg[512];
    const char *miss = store_missing_(p);
    snprintf(msg, sizeof msg, "store (run %lld, generation %lld): key \"%s\" "
             "not set after %d ms%s", (long long)p->run, (long long)p->gen,
             miss ? miss : "?", p->timeout_ms,
             p->n_keys > 1 ? " (waiting for several keys)" : "");
    coord_reply_status(p, M6__STATUS__STATUS_TIMEOUT, msg, 0);
    coord_peer_free_keys(p);
}

static void store_timeout_(uv_timer_t *t)
{
    peer *p = t->data;
    if (p->closing || !p->parked) return;
    store_refuse_timeout_(p);
    coord_pump(p);
}

int cluster_store_key_owner(const char *key)
{
    const char *last = strrchr(key, '/');
    last = last ? last + 1 : key;
    if (strncmp(last, "rank_", 5) == 0) last += 5;
    if (!*last || strlen(last) > 9) return 0;
    for (const char *c = last; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return atoi(last);
}

/* Free the store's keys of run's generations older than gen (nobody
 * waits on them: a parked request of such a generation times out). */
void coord_store_free_stale(cluster_coord *co, int64_t run, int64_t gen)
{
    size_t n = 0;
    for (store_entry **pp = &co->store; *pp;) {
        store_entry *e = *pp;
        if (e->run == run && e->gen < gen) {
            *pp = e->next;
            co->store_bytes -= e->len;
            co->store_keys--;
            free(e->key);
            free(e->val);
            free(e);
            n++;
        } else {
            pp = &e->next;
        }
    }
    if (n)
        log_debug("store.free", "run=%lld below_gen=%lld keys=%zu",
                  (long long)run, (long long)gen, n);
}

static int valid_key_(const char *k)
{
    size_t n = k ? strlen(k) : 0;
    return n >= 1 && n <= M6_STORE_KEY_MAX;
}

enum { STORE_WAIT_MAX_MS = 600000, STORE_WAIT_KEYS_MAX = 1024 };

/* A rank that failed says so in its key "failed/<rank>" (dp.c): the run's
 * event nodes.rank_failed and a log line name its node and local rank,
 * and it is the generation's lost rank (coord_rank_lost); the run pauses
 * when its collectives fail or time out. The value is the rank's error,
 * printable ASCII kept (at most 400 bytes). */
static void store_rank_failed_(peer *p, const M6__StoreSet *s)
{
    char why[401];
    size_t n = 0;
    for (size_t i = 0; i < s->value.len && n < sizeof why - 1; i++) {
        uint8_t c = s->value.data[i];
        why[n++] = c >= 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
    }
    why[n] = 0;
    state_event(p->co->st, p->run, "nodes.rank_failed",
                "node=%lld hostname=%s rank=%d local_rank=%d err=\"%s\"",
                (long long)p->store_node, p->hostname, p->rank,
                p->store_local, why);
    log_warn("run.rank_failed", "run=%lld node=%lld hostname=%s rank=%d "
             "local_rank=%d err=\"%s\"", (long long)p->run,
             (long long)p->store_node, p->hostname, p->rank, p->store_local,
             why);
    run_lost l = {.node_id = p->store_node, .rank = p->rank,
                  .local_rank = p->store_local, .ranks = 1};
    snprintf(l.hostname, sizeof l.hostname, "%s", p->hostname);
    snprintf(l.why, sizeof l.why, "%s", why);
    coord_rank_lost(p->co, p->run, p->gen, &l);
}

void coord_store_request(peer *p, const M6__Request *rq)
{
    cluster_coord *co = p->co;
    char msg[512];
    switch (rq->body_case) {
    case M6__REQUEST__BODY_STORE_SET: {
        const M6__StoreSet *s = rq->store_set;
        if (!valid_key_(s->key))
            return coord_reply_status(p, M6__STATUS__STATUS_BAD_REQUEST,
                                 "store key must be 1..256 bytes", 0);
        int owner = cluster_store_key_owner(s->key);
        if (owner != p->rank) {
            snprintf(msg, sizeof msg, "store key \"%s\" is rank %d's: rank "
                     "%d sets only its own keys", s->key, owner, p->rank);
            coord_log_refusal(co, p, "store set of another rank's key");
            return coord_reply_status(p, M6__STATUS__STATUS_PERMISSION_DENIED, msg,
                                 0);
        }
        if (!strncmp(s->key, "failed/", 7)) store_rank_failed_(p, s);
        if (s->value.len > M6_STORE_VALUE_MAX) {
            snprintf(msg, sizeof msg, "store value of %zu bytes for \"%s\": "
                     "the limit is %u", s->value.len, s->key,
                     M6_STORE_VALUE_MAX);
            return coord_reply_status(p, M6__STATUS__STATUS_TOO_LARGE, msg, 0);
        }
        store_entry *e = store_find_(co, p->run, p->gen, s->key);
        size_t old = e ? e->len : 0;
        if (co->store_bytes - old + s->value.len > CLUSTER_STORE_BYTES_MAX ||
            (!e && co->store_keys >= CLUSTER_STORE_KEYS_MAX)) {
            snprintf(msg, sizeof msg, "store full: %zu keys, %zu bytes (the "
                     "limits are %d keys, %u bytes)", co->store_keys,
                     co->store_bytes, CLUSTER_STORE_KEYS_MAX,
                     CLUSTER_STORE_BYTES_MAX);
            return coord_reply_status(p, M6__STATUS__STATUS_INTERNAL, msg, 0);
        }
        uint8_t *val = malloc(s->value.len ? s->value.len : 1);
        if (!val)
            return coord_reply_status(p, M6__STATUS__STATUS_INTERNAL,
                                 "out of memory", 0);
        if (s->value.len) memcpy(val, s->value.data, s->value.len);
        if (!e) {
            e = calloc(1, sizeof *e);
            char *key = strdup(s->key);
            if (!e || !key) {
                free(e);
                free(key);
                free(val);
                return coord_reply_status(p, M6__STATUS__STATUS_INTERNAL,
                                     "out of memory", 0);
            }
            e->run = p->run;
            e->gen = p->gen;
            e->key = key;
            e->next = co->store;
            co->store = e;
            co->store_keys++;
        }
        free(e->val);
        e->val = val;
        e->len = s->value.len;
        co->store_bytes = co->store_bytes - old + e->len;
        log_debug("store.set", "run=%lld gen=%lld key=\"%s\" bytes=%zu",
                  (long long)p->run, (long long)p->gen, e->key, e->len);
        coord_reply_status(p, M6__STATUS__STATUS_OK, "", 0);
        /* parked requests of this namespace that are now complete */
        for (peer *q = co->peers, *next; q; q = next) {
            next = q->next;
            if (q->parked && !q->closing && q->run == p->run &&
                q->gen == p->gen && !store_missing_(q)) {
                store_answer_(q);
                coord_pump(q);
            }
        }
        return;
    }
    case M6__REQUEST__BODY_STORE_GET:
    case M6__REQUEST__BODY_STORE_WAIT: {
        int get = rq->body_case == M6__REQUEST__BODY_STORE_GET;
        size_t n = get ? 1 : rq->store_wait->n_keys;
        char *const *keys = get ? &rq->store_get->key : rq->store_wait->keys;
        int tmo = get ? rq->store_get->timeout_ms : rq->store_wait->timeout_ms;
        if (n < 1 || n > STORE_WAIT_KEYS_MAX)
            return coord_reply_status(p, M6__STATUS__STATUS_BAD_REQUEST,
                                 "store wait takes 1..1024 keys", 0);
        for (size_t i = 0; i < n; i++)
            if (!valid_key_(keys[i]))
                return coord_reply_status(p, M6__STATUS__STATUS_BAD_REQUEST,
                                     "store key must be 1..256 bytes", 0);
        if (tmo < 0 || tmo > STORE_WAIT_MAX_MS)
            return coord_reply_status(p, M6__STATUS__STATUS_BAD_REQUEST,
                                 "store timeout_ms must be 0..600000", 0);
        p->keys = calloc(n, sizeof *p->keys);
        if (!p->keys)
            return coord_reply_status(p, M6__STATUS__STATUS_INTERNAL,
                                 "out of memory", 0);
        for (size_t i = 0; i < n; i++) {
            if (!(p->keys[p->n_keys++] = strdup(keys[i]))) {
                coord_peer_free_keys(p);
                return coord_reply_status(p, M6__STATUS__STATUS_INTERNAL,
                                     "out of memory", 0);
            }
        }
        p->parked = 1;
        p->parked_get = get;
        p->timeout_ms = tmo;
        if (!store_missing_(p)) return store_answer_(p);
        if (tmo == 0) return store_refuse_timeout_(p);
        uv_timer_start(&p->timer, store_timeout_, (uint64_t)tmo, 0);
        return;
    }
    default:
        coord_reply_status(p, M6__STATUS__STATUS_UNKNOWN_REQUEST,
                      "a store connection takes StoreSet, StoreGet and "
                      "StoreWait only", 0);
    }
}
