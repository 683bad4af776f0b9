/*
 * test_rendezvous_store.c — the rendezvous store end to end in one process: the
 * coordinator's store service (cluster/coordinator.c) on its own libuv loop
 * thread, listening on 127.0.0.1, and m6_store clients
 * (cluster/store_client.c) over real TCP: values with NUL bytes, the 1 MiB
 * limit and one byte over it, keys kept apart by run and generation, a get
 * that times out (and one of timeout 0), a wait on several keys, and one
 * store shared by several threads, as Gloo uses it (every rank sets its
 * key, then waits for all of them and reads them). And the seam where
 * the coordinator will pick nodes for a run (cluster_coord_nodes_fit),
 * and the lost rank it keeps for a run's generation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uv.h>

#include "cluster/coordinator.h"
#include "cluster/store_client.h"

static struct {
    char dir[256], addr[64];
    state *st;
    cluster_token token;
    uv_loop_t loop;
    uv_async_t stop;
    cluster_coord *co;
    pthread_t thread;
    m6_store_who who;  /* the coordinator's own node: rank 0 */
} g;

static void on_stop_(uv_async_t *a)
{
    cluster_coord_fini(g.co);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main_(void *arg)
{
    (void)arg;
    uv_run(&g.loop, UV_RUN_DEFAULT);
    return NULL;
}

static int setup_(void **s)
{
    (void)s;
    snprintf(g.dir, sizeof g.dir, "/tmp/m6-test-store.XXXXXX");
    if (!mkdtemp(g.dir)) return -1;
    char db[300], err[512];
    snprintf(db, sizeof db, "%s/m6.db", g.dir);
    g.st = state_open(db, err, sizeof err);
    if (!g.st) return -1;
    char tok[300];
    snprintf(tok, sizeof tok, "%s/token", g.dir);
    FILE *f = fopen(tok, "w");
    fputs("0123456789abcdef0123456789abcdef\n", f);
    fclose(f);
    chmod(tok, 0600);
    if (cluster_token_load(tok, &g.token, err, sizeof err) < 0) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    uv_loop_init(&g.loop);
    uv_async_init(&g.loop, &g.stop, on_stop_);
    cluster_coord_config cc = {.loop = &g.loop, .st = g.st,
                               .listen = "127.0.0.1:0", .token = &g.token,
                               .timeout_ms = 2000};
    g.co = cluster_coord_init(&cc, err, sizeof err);
    if (!g.co) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    snprintf(g.addr, sizeof g.addr, "127.0.0.1:%d", cluster_coord_port(g.co));
    /* the coordinator's own row, with the hash of its secret */
    char hex[65];
    cluster_facts facts = {0};
    snprintf(facts.hostname, sizeof facts.hostname, "self");
    snprintf(facts.backend, sizeof facts.backend, "cpu");
    snprintf(g.who.node_uuid, sizeof g.who.node_uuid,
             "c0ffee00000000000000000000000001");
    memset(g.who.secret, 0x5a, sizeof g.who.secret);
    g.who.rank = 0;
    cluster_secret_hash(g.who.secret, sizeof g.who.secret, hex);
    if (cluster_self_register(g.st, &facts, g.who.node_uuid, hex, err,
                              sizeof err) < 0) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    return pthread_create(&g.thread, NULL, loop_main_, NULL) == 0 ? 0 : -1;
}

static int teardown_(void **s)
{
    (void)s;
    uv_async_send(&g.stop);
    pthread_join(g.thread, NULL);
    int rc = uv_loop_close(&g.loop);  /* every handle closed */
    state_close(g.st);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g.dir);
    if (system(cmd) != 0) return -1;
    return rc == 0 ? 0 : -1;
}

static double now_s_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void open_(m6_store *s, int64_t run, int64_t gen)
{
    m6_err e = M6_ERR_NONE;
    int rc = m6_store_tcp_open(g.addr, &g.token, &g.who, run, gen, 2000, s, &e);
    if (rc < 0) fprintf(stderr, "open: %s\n", m6_err_msg(&e));
    assert_int_equal(rc, 0);
}

static void test_values(void **st)
{
    (void)st;
    m6_store a, b;
    open_(&a, 1, 0);
    open_(&b, 1, 0);
    m6_err e = M6_ERR_NONE;
    const uint8_t bin[5] = {1, 0, 2, 0, 3};  /* NUL bytes travel */
    assert_int_equal(a.set(a.ctx, "nccl.id", bin, sizeof bin, &e), 0);
    void *v;
    size_t n;
    assert_int_equal(b.get(b.ctx, "nccl.id", &v, &n, 1000, &e), 0);
    assert_int_equal(n, sizeof bin);
    assert_memory_equal(v, bin, sizeof bin);
    free(v);
    /* the largest value, byte for byte; one byte more is refused */
    size_t max = M6_STORE_VALUE_MAX;
    uint8_t *big = malloc(max + 1);
    for (size_t i = 0; i <= max; i++) big[i] = (uint8_t)(i * 131 + 7);
    assert_int_equal(a.set(a.ctx, "big", big, max, &e), 0);
    assert_int_equal(b.get(b.ctx, "big", &v, &n, 0, &e), 0);
    assert_int_equal(n, max);
    assert_memory_equal(v, big, max);
    free(v);
    assert_int_equal(a.set(a.ctx, "big", big, max + 1, &e), -1);
    assert_int_equal(e.code, M6_EINVALID);
    assert_non_null(strstr(e.msg, "1048577 bytes"));
    m6_err_free(&e);
    free(big);
    /* a second set replaces the value */
    assert_int_equal(a.set(a.ctx, "nccl.id", "x", 1, &e), 0);
    assert_int_equal(b.get(b.ctx, "nccl.id", &v, &n, 0, &e), 0);
    assert_int_equal(n, 1);
    assert_memory_equal(v, "x", 1);
    free(v);
    /* keys: 1..256 bytes */
    char key[300];
    memset(key, 'k', 257);
    key[257] = 0;
    assert_int_equal(a.set(a.ctx, key, "v", 1, &e), -1);
    assert_int_equal(e.code, M6_EINVALID);
    m6_err_free(&e);
    key[256] = 0;
    assert_int_equal(a.set(a.ctx, key, "v", 1, &e), 0);
    assert_int_equal(a.set(a.ctx, "", "v", 1, &e), -1);
    m6_err_free(&e);
    m6_store_tcp_close(&a);
    m6_store_tcp_close(&b);
}

static void test_namespaces_and_timeouts(void **st)
{
    (void)st;
    m6_store r1g0, r1g1, r2g0;
    open_(&r1g0, 1, 0);
    open_(&r1g1, 1, 1);
    open_(&r2g0, 2, 0);
    m6_err e = M6_ERR_NONE;
    assert_int_equal(r1g0.set(r1g0.ctx, "rank0", "a", 1, &e), 0);
    void *v;
    size_t n;
    /* another generation or another run does not see it */
    double t0 = now_s_();
    assert_int_equal(r1g1.get(r1g1.ctx, "rank0", &v, &n, 0, &e), -1);
    assert_int_equal(e.code, M6_ECANCELLED);
    assert_true(now_s_() - t0 < 1.0);  /* 0: does not wait */
    m6_err_free(&e);
    t0 = now_s_();
    assert_int_equal(r2g0.get(r2g0.ctx, "rank0", &v, &n, 300, &e), -1);
    double took = now_s_() - t0;
    assert_int_equal(e.code, M6_ECANCELLED);
    assert_non_null(strstr(e.msg, "key \"rank0\" not set after 300 ms"));
    assert_non_null(strstr(e.msg, g.addr));
    assert_true(took >= 0.29 && took < 2.0);
    m6_err_free(&e);
    /* a wait names a key still missing */
    const char *keys[] = {"rank0", "rank1"};
    assert_int_equal(r1g0.wait(r1g0.ctx, keys, 2, 200, &e), -1);
    assert_int_equal(e.code, M6_ECANCELLED);
    assert_non_null(strstr(e.msg, "\"rank1\""));
    m6_err_free(&e);
    /* the connection is still good after a timeout */
    assert_int_equal(r1g0.set(r1g0.ctx, "rank1", "b", 1, &e), 0);
    assert_int_equal(r1g0.wait(r1g0.ctx, keys, 2, 0, &e), 0);
    m6_store_tcp_close(&r1g0);
    m6_store_tcp_close(&r1g1);
    m6_store_tcp_close(&r2g0);
}

/* ------------------------------------------------- one store, many threads */

enum { RANKS_ = 4 };
static m6_store shared_;

static void *rank_main_(void *arg)
{
    int r = (int)(intptr_t)arg;
    m6_err e = M6_ERR_NONE;
    char key[32], val[32];
    snprintf(key, sizeof key, "rank%d", r);
    snprintf(val, sizeof val, "addr-of-%d", r);
    /* ranks arrive at different times; the later ones find keys set */
    struct timespec ts = {0, (long)r * 50 * 1000000L};
    nanosleep(&ts, NULL);
    if (shared_.set(shared_.ctx, key, val, strlen(val), &e) < 0) goto fail;
    /* everyone's key: the get of a key not yet set waits on the
     * coordinator; meanwhile other threads' calls wait on the mutex */
    for (int q = 0; q < RANKS_; q++) {
        char k[32], want[32];
        snprintf(k, sizeof k, "rank%d", q);
        snprintf(want, sizeof want, "addr-of-%d", q);
        void *v;
        size_t n;
        if (shared_.get(shared_.ctx, k, &v, &n, 5000, &e) < 0) goto fail;
        int ok = n == strlen(want) && memcmp(v, want, n) == 0;
        free(v);
        if (!ok) return (void *)"wrong value";
    }
    return NULL;
fail:
    fprintf(stderr, "rank %d: %s\n", r, m6_err_msg(&e));
    m6_err_free(&e);
    return (void *)"store call failed";
}

static void test_threads(void **st)
{
    (void)st;
    open_(&shared_, 3, 0);
    pthread_t t[RANKS_];
    for (int r = 0; r < RANKS_; r++)
        assert_int_equal(pthread_create(&t[r], NULL, rank_main_, (void *)(intptr_t)r), 0);
    for (int r = 0; r < RANKS_; r++) {
        void *res;
        pthread_join(t[r], &res);
        if (res) fail_msg("rank %d: %s", r, (const char *)res);
    }
    m6_store_tcp_close(&shared_);
}

/* A wrong token, and nobody at the address: clear errors, in time. */
static void test_refusals(void **st)
{
    (void)st;
    m6_store s;
    m6_err e = M6_ERR_NONE;
    cluster_token bad = g.token;
    bad.raw[0] ^= 1;
    bad.len = g.token.len;
    char path[300], msg[256];
    snprintf(path, sizeof path, "%s/bad", g.dir);
    FILE *f = fopen(path, "w");
    fwrite(bad.raw, 1, bad.len, f);
    fclose(f);
    chmod(path, 0600);
    assert_int_equal(cluster_token_load(path, &bad, msg, sizeof msg), 0);
    assert_int_equal(m6_store_tcp_open(g.addr, &bad, &g.who, 1, 0, 1000, &s, &e), -1);
    assert_int_equal(e.code, M6_EINTERNAL);
    assert_non_null(strstr(e.msg, "refused the connection: authentication failed"));
    m6_err_free(&e);
    double t0 = now_s_();
    assert_int_equal(m6_store_tcp_open("127.0.0.1:1", &g.token, &g.who, 1, 0, 400, &s, &e), -1);
    double took = now_s_() - t0;
    assert_int_equal(e.code, M6_EINTERNAL);
    assert_non_null(strstr(e.msg, "rendezvous store at 127.0.0.1:1: cannot connect: "
                                  "Connection refused"));
    assert_true(took >= 0.35 && took < 2.0);
    m6_err_free(&e);
}

/* The live workers with enough free device memory, in id order (rank
 * order); not lost ones, not the coordinator itself. */
static void test_nodes_fit(void **st)
{
    (void)st;
    struct { const char *host; node_state s; uint64_t free; int coord; } rows[] = {
        {"c0", NODE_LIVE, 1u << 30, 1}, {"a", NODE_LIVE, 8u << 20, 0},
        {"b", NODE_LOST, 1u << 30, 0},  {"c", NODE_LIVE, 1u << 30, 0},
        {"d", NODE_LEFT, 1u << 30, 0},  {"e", NODE_LIVE, 512u << 20, 0},
    };
    int64_t id[6];
    for (int i = 0; i < 6; i++) {
        node_row n = {0};
        snprintf(n.hostname, sizeof n.hostname, "%s", rows[i].host);
        snprintf(n.node_uuid, sizeof n.node_uuid, "%031d%d", 0, i);
        snprintf(n.backend, sizeof n.backend, "cpu");
        n.devices = 1;
        n.memory = n.free_device_memory = rows[i].free;
        n.state = rows[i].s;
        n.coordinator = rows[i].coord;
        assert_int_equal(state_node_insert(g.st, &n, &id[i]), 0);
    }
    int64_t got[8];
    assert_int_equal(cluster_coord_nodes_fit(g.co, 256u << 20, got, 8), 2);
    assert_int_equal(got[0], id[3]);  /* c */
    assert_int_equal(got[1], id[5]);  /* e */
    assert_int_equal(cluster_coord_nodes_fit(g.co, 1u << 20, got, 8), 3);
    assert_int_equal(got[0], id[1]);  /* a, c, e */
    assert_int_equal(cluster_coord_nodes_fit(g.co, 1u << 20, got, 1), 1);
    assert_int_equal(cluster_coord_nodes_fit(g.co, 2u << 30, got, 8), 0);
}

/* m6_store_tcp_open as who; the store's message into msg on failure. */
static int open_as_(const m6_store_who *who, int64_t run, int64_t gen,
                    m6_store *s, char *msg, size_t len)
{
    m6_err e = M6_ERR_NONE;
    int rc = m6_store_tcp_open(g.addr, &g.token, who, run, gen, 1000, s, &e);
    snprintf(msg, len, "%s", rc < 0 ? m6_err_msg(&e) : "");
    m6_err_free(&e);
    return rc;
}

static int set_(m6_store *s, const char *key, char *msg, size_t len)
{
    m6_err e = M6_ERR_NONE;
    int rc = s->set(s->ctx, key, "v", 1, &e);
    snprintf(msg, len, "%s", rc < 0 ? m6_err_msg(&e) : "");
    m6_err_free(&e);
    return rc;
}

/* A worker node's row called host (its uuid "beef...<fill>", its secret
 * bytes fill, state lost: out of test_nodes_fit's way) and *w to open the
 * store as its rank `rank`. Its id. */
static int64_t worker_node_(const char *host, int rank, int fill,
                            m6_store_who *w)
{
    *w = (m6_store_who){.rank = rank};
    snprintf(w->node_uuid, sizeof w->node_uuid, "beef00000000000000000000000000%02x",
             fill);
    memset(w->secret, fill, sizeof w->secret);
    node_row n = {0};
    snprintf(n.hostname, sizeof n.hostname, "%s", host);
    snprintf(n.node_uuid, sizeof n.node_uuid, "%s", w->node_uuid);
    snprintf(n.backend, sizeof n.backend, "cpu");
    n.state = NODE_LOST;
    cluster_secret_hash(w->secret, sizeof w->secret, n.secret_sha256);
    int64_t id;
    assert_int_equal(state_node_insert(g.st, &n, &id), 0);
    return id;
}

/* Keys owned by their writer: the owner of each key by hand; a worker
 * node opens only the rank it holds, in its run's latest generation, with
 * its own secret, and sets only its own keys; rank 0 opening a newer
 * generation frees the older ones. */
static void test_owners(void **st)
{
    (void)st;
    assert_int_equal(cluster_store_key_owner("hash/3"), 3);
    assert_int_equal(cluster_store_key_owner("run5/g7/12"), 12);
    assert_int_equal(cluster_store_key_owner("run5/g7/rank_2"), 2);
    assert_int_equal(cluster_store_key_owner("verdict"), 0);
    assert_int_equal(cluster_store_key_owner("run5/g7/nccl/nccl_id"), 0);
    assert_int_equal(cluster_store_key_owner("rank1"), 0);
    assert_int_equal(cluster_store_key_owner("x/1a"), 0);
    assert_int_equal(cluster_store_key_owner("x/"), 0);
    /* a worker node holding rank 1 of run R, generation 9 */
    int64_t run = state_run_insert(g.st, "owners", "{}", 10, 0, NULL);
    assert_true(run > 0);
    m6_store_who w;
    int64_t id = worker_node_("w1", 1, 0x33, &w);
    assert_int_equal(state_node_set_run(g.st, id, run, 1), 0);
    assert_int_equal(cluster_coord_assign(g.co, id, run, "{}", 1, 2, 9, 1000), 0);
    char msg[512];
    m6_store s, r0;
    assert_int_equal(open_as_(&w, run, 9, &s, msg, sizeof msg), 0);
    assert_int_equal(set_(&s, "hash/1", msg, sizeof msg), 0);
    assert_int_equal(set_(&s, "run5/g9/1", msg, sizeof msg), 0);
    assert_int_equal(set_(&s, "run5/g9/rank_1", msg, sizeof msg), 0);
    assert_int_equal(set_(&s, "hash/2", msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "store key \"hash/2\" is rank 2's: rank 1 sets only its own keys"));
    assert_int_equal(set_(&s, "verdict", msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "is rank 0's"));
    m6_store_tcp_close(&s);
    /* the coordinator (rank 0) may not set rank 1's key either */
    assert_int_equal(open_as_(&g.who, run, 9, &r0, msg, sizeof msg), 0);
    assert_int_equal(set_(&r0, "run5/g9/1", msg, sizeof msg), -1);
    assert_int_equal(set_(&r0, "verdict", msg, sizeof msg), 0);
    m6_store_tcp_close(&r0);
    /* a rank it does not hold, an old generation, another run, rank 0, a
     * wrong secret, an unknown node id: refused at the open */
    const char *want = "refused the connection: the store takes the ranks "
                       "of a run only";
    m6_store_who bad = w;
    bad.rank = 2;
    assert_int_equal(open_as_(&bad, run, 9, &s, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, want));
    assert_int_equal(open_as_(&w, run, 8, &s, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, want));
    assert_int_equal(open_as_(&w, run + 1, 9, &s, msg, sizeof msg), -1);
    bad.rank = 0;
    assert_int_equal(open_as_(&bad, run, 9, &s, msg, sizeof msg), -1);
    bad = w;
    bad.secret[0] ^= 1;
    assert_int_equal(open_as_(&bad, run, 9, &s, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, want));
    bad = w;
    bad.node_uuid[0] = 'a';
    assert_int_equal(open_as_(&bad, run, 9, &s, msg, sizeof msg), -1);
    /* a node of two devices holding ranks 2-3 (m6d --devices 2): it opens
     * as either, not as 1 or 4 */
    assert_int_equal(state_node_set_ranks(g.st, id, run, 2, 2), 0);
    for (int r = 1; r <= 4; r++) {
        m6_store_who as = w;
        as.rank = r;
        int rc = open_as_(&as, run, 9, &s, msg, sizeof msg);
        assert_int_equal(rc, r == 2 || r == 3 ? 0 : -1);
        if (rc == 0) m6_store_tcp_close(&s);
        else assert_non_null(strstr(msg, want));
    }
    /* the coordinator holding ranks 0-1: rank 1 of the run's latest
     * generation too, never rank 2 */
    node_row self;
    assert_int_equal(state_node_find(g.st, 'u', g.who.node_uuid, &self), 0);
    m6_store_who c1 = g.who;
    c1.rank = 1;
    assert_int_equal(open_as_(&c1, run, 9, &s, msg, sizeof msg), -1);
    assert_int_equal(state_node_set_ranks(g.st, self.id, run, 0, 2), 0);
    assert_int_equal(open_as_(&c1, run, 9, &s, msg, sizeof msg), 0);
    m6_store_tcp_close(&s);
    assert_int_equal(open_as_(&c1, run, 8, &s, msg, sizeof msg), -1);
    c1.rank = 2;
    assert_int_equal(open_as_(&c1, run, 9, &s, msg, sizeof msg), -1);
    assert_int_equal(state_node_set_run(g.st, self.id, 0, 0), 0);
    /* stale generations: rank 0's open of generation 10 frees 9's keys */
    void *v;
    size_t len;
    m6_err e = M6_ERR_NONE;
    assert_int_equal(open_as_(&g.who, run, 9, &r0, msg, sizeof msg), 0);
    assert_int_equal(r0.get(r0.ctx, "hash/1", &v, &len, 0, &e), 0);
    free(v);
    m6_store_tcp_close(&r0);
    assert_int_equal(open_as_(&g.who, run, 10, &r0, msg, sizeof msg), 0);
    m6_store_tcp_close(&r0);
    assert_int_equal(open_as_(&g.who, run, 9, &r0, msg, sizeof msg), 0);
    assert_int_equal(r0.get(r0.ctx, "hash/1", &v, &len, 0, &e), -1);
    assert_int_equal(e.code, M6_ECANCELLED);
    m6_err_free(&e);
    m6_store_tcp_close(&r0);
}

/* A lost rank as the coordinator keeps it (cluster_coord_rank_lost): a
 * worker of two devices (ranks 2-3, generation 9) whose rank 3 sets
 * "failed/3" is named by its node, rank 3, local rank 1 and its error
 * (all by hand); a second failure of that generation does not replace
 * the first; a newer generation has none, and the wait for one ends at
 * its bound. */
static void test_lost(void **st)
{
    (void)st;
    int64_t run = state_run_insert(g.st, "lost", "{}", 10, 0, NULL);
    assert_true(run > 0);
    m6_store_who w;
    int64_t id = worker_node_("w2", 3, 0x44, &w);
    assert_int_equal(state_node_set_ranks(g.st, id, run, 2, 2), 0);
    assert_int_equal(cluster_coord_assign_ranks(g.co, id, run, "{}", 2, 2, 4,
                                                 9, 1000), 0);
    run_lost l;
    assert_int_equal(cluster_coord_rank_lost(g.co, run, 0, &l), 0);
    m6_store s;
    m6_err e = M6_ERR_NONE;
    char msg[512];
    assert_int_equal(open_as_(&w, run, 9, &s, msg, sizeof msg), 0);
    assert_int_equal(s.set(s.ctx, "failed/3", "disk on fire", 12, &e), 0);
    assert_int_equal(s.set(s.ctx, "failed/3", "second", 6, &e), 0);
    m6_store_tcp_close(&s);
    assert_int_equal(cluster_coord_rank_lost(g.co, run, 1000, &l), 1);
    assert_int_equal(l.node_id, id);
    assert_string_equal(l.hostname, "w2");
    assert_int_equal(l.rank, 3);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.ranks, 1);
    assert_string_equal(l.why, "disk on fire");
    /* generation 10: nothing lost yet; the wait gives up after 200 ms */
    assert_int_equal(cluster_coord_assign_ranks(g.co, id, run, "{}", 2, 2, 4,
                                                 10, 1000), 0);
    double t0 = now_s_();
    assert_int_equal(cluster_coord_rank_lost(g.co, run, 200, &l), 0);
    double took = now_s_() - t0;
    assert_true(took >= 0.19 && took < 2.0);
    assert_int_equal(state_node_set_run(g.st, id, 0, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_namespaces_and_timeouts),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_nodes_fit),
        cmocka_unit_test(test_owners),
        cmocka_unit_test(test_lost),
    };
    return cmocka_run_group_tests(tests, setup_, teardown_);
}
