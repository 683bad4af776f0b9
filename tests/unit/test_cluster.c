/*
 * test_cluster.c — daemon/cluster's pieces without a network: HOST:PORT
 * parsing, the token file's checks and comparison, the node id file, and
 * the nodes table of m6.db (state.c, schema 0006) that the coordinator
 * keeps, and the rank board's reading of a rank that waits in a
 * collective. The TCP side is tested with real m6d processes
 * (tests/integration/nodes.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "common/rankboard.h"
#include "state/state.h"
#include "../common/test_main.h"

static char dir_[256];

static int setup_(void **st)
{
    (void)st;
    snprintf(dir_, sizeof dir_, "/tmp/m6-test-cluster.XXXXXX");
    return mkdtemp(dir_) ? 0 : -1;
}

static int teardown_(void **st)
{
    (void)st;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file_(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_parse_addr(void **st)
{
    (void)st;
    char host[64], err[256];
    int port;
    assert_int_equal(cluster_parse_addr("127.0.0.1:7070", 0, host, sizeof host,
                                        &port, err, sizeof err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7070);
    assert_int_equal(cluster_parse_addr("[::1]:9", 0, host, sizeof host, &port,
                                        err, sizeof err), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 9);
    assert_int_equal(cluster_parse_addr("node-a.example:1", 0, host,
                                        sizeof host, &port, err, sizeof err), 0);
    assert_string_equal(host, "node-a.example");
    /* port 0: only where allowed (the coordinator's "any free port") */
    assert_int_equal(cluster_parse_addr("127.0.0.1:0", 1, host, sizeof host,
                                        &port, err, sizeof err), 0);
    assert_int_equal(port, 0);
    const char *bad[] = {"127.0.0.1", "127.0.0.1:", ":7070", "::1:7070",
                         "h:70000", "h:7x", "[::1]7070", "h:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        assert_int_equal(cluster_parse_addr(bad[i], 0, host, sizeof host,
                                            &port, err, sizeof err), -1);
        assert_non_null(strstr(err, bad[i]));  /* the text is named */
    }
    assert_int_equal(cluster_parse_addr("h:0", 0, host, sizeof host, &port,
                                        err, sizeof err), -1);
    assert_non_null(strstr(err, "port must be 1..65535"));
}

static void test_token(void **st)
{
    (void)st;
    char path[300], err[512];
    cluster_token t;
    snprintf(path, sizeof path, "%s/token", dir_);
    write_file_(path, "0123456789abcdef0123\n", 0600);
    assert_int_equal(cluster_token_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.len, 20);  /* the newline is not part of it */
    assert_true(cluster_token_matches(&t, "0123456789abcdef0123", 20));
    assert_false(cluster_token_matches(&t, "0123456789abcdef0123\n", 21));
    assert_false(cluster_token_matches(&t, "0123456789abcdef012", 19));
    assert_false(cluster_token_matches(&t, "0123456789abcdef0124", 20));
    assert_false(cluster_token_matches(&t, "", 0));
    /* the TLS PSK: HKDF-SHA256 (RFC 5869) of the token, salt and info of
     * cluster.h; the value computed apart with Python's hmac module:
     * prk = HMAC(salt, token), okm = HMAC(prk, info || 0x01) */
    static const char want_psk[] =
        "80bd8d630cfe7da48d86610a99f272f0b7c2bf49cfcbfdcc267c4c77ee06dcde";
    char got_psk[2 * CLUSTER_PSK_LEN + 1];
    for (int i = 0; i < CLUSTER_PSK_LEN; i++)
        snprintf(got_psk + 2 * i, 3, "%02x", t.psk[i]);
    assert_string_equal(got_psk, want_psk);
    /* group-readable is allowed (a group of operators); world is not */
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(cluster_token_load(path, &t, err, sizeof err), 0);
    assert_int_equal(chmod(path, 0604), 0);
    assert_int_equal(cluster_token_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "has mode 0604"));
    assert_non_null(strstr(err, path));
    write_file_(path, "short\n", 0600);
    assert_int_equal(cluster_token_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "the token is 5 bytes; want at least 16"));
    snprintf(path, sizeof path, "%s/none", dir_);
    assert_int_equal(cluster_token_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(cluster_token_load(dir_, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));
}

static void test_node_uuid(void **st)
{
    (void)st;
    char a[33], b[33], err[512], path[300];
    assert_int_equal(cluster_node_uuid(dir_, a, err, sizeof err), 0);
    assert_int_equal(strlen(a), 32);
    assert_int_equal(strspn(a, "0123456789abcdef"), 32);
    assert_int_equal(cluster_node_uuid(dir_, b, err, sizeof err), 0);
    assert_string_equal(a, b);  /* kept in STATE_DIR/node-id */
    snprintf(path, sizeof path, "%s/node-id", dir_);
    write_file_(path, "not hex\n", 0600);
    assert_int_equal(cluster_node_uuid(dir_, b, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a node id"));
}

/* STATE_DIR/node-secret: saved 0600 and read back byte for byte; none
 * yet is 1; a file others may read, or of the wrong size, is refused;
 * ensure makes one once and then keeps it; the hash is SHA-256 (the
 * value of "abc" from FIPS 180-2). */
static void test_node_secret(void **st)
{
    (void)st;
    char err[512], path[300], h1[65], h2[65];
    uint8_t a[CLUSTER_SECRET_LEN], b[CLUSTER_SECRET_LEN];
    assert_int_equal(cluster_node_secret_load(dir_, a, err, sizeof err), 1);
    for (int i = 0; i < CLUSTER_SECRET_LEN; i++) a[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(cluster_node_secret_save(dir_, a, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/node-secret", dir_);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(sb.st_size, CLUSTER_SECRET_LEN);
    assert_int_equal(cluster_node_secret_load(dir_, b, err, sizeof err), 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(cluster_node_secret_load(dir_, b, err, sizeof err), -1);
    assert_non_null(strstr(err, "has mode 0640"));
    write_file_(path, "short", 0600);
    assert_int_equal(cluster_node_secret_load(dir_, b, err, sizeof err), -1);
    assert_non_null(strstr(err, "the wrong size"));
    unlink(path);
    assert_int_equal(cluster_node_secret_ensure(dir_, h1, err, sizeof err), 0);
    assert_int_equal(cluster_node_secret_ensure(dir_, h2, err, sizeof err), 0);
    assert_string_equal(h1, h2);  /* made once, then kept */
    assert_int_equal(cluster_node_secret_load(dir_, b, err, sizeof err), 0);
    cluster_secret_hash(b, sizeof b, h2);
    assert_string_equal(h1, h2);
    cluster_secret_hash("abc", 3, h1);
    assert_string_equal(h1, "ba7816bf8f01cfea414140de5dae2223"
                            "b00361a396177a9cb410ff61f20015ad");
}

static void test_facts(void **st)
{
    (void)st;
    cluster_facts f;
    cluster_facts_get(&f, "w7", 1);
    assert_string_equal(f.hostname, "w7");
    assert_true(f.memory > 0);
    assert_true(f.devices >= 1);
    /* cpu: MemAvailable, never above MemTotal */
    if (strcmp(f.backend, "cpu") == 0)
        assert_true(f.free_device_memory > 0 && f.free_device_memory <= f.memory);
    cluster_facts_get(&f, NULL, 0);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    assert_string_equal(f.hostname, host);
}

/* cluster_ranks_place against placements worked out by hand */
static void test_ranks_place(void **st)
{
    (void)st;
    /* each case: the nodes' slots, the world, and by hand the nodes that
     * take ranks, each node's first rank and count, and the slots in all */
    static const struct {
        const char *what;
        int n, slots[3], world, used, first[3], count[3], have;
    } cases[] = {
        {"one device per node: rank i on node i", 3, {1, 1, 1}, 3, 3,
         {0, 1, 2}, {1, 1, 1}, 3},
        {"coordinator 2, worker 2: 0,1 | 2,3", 2, {2, 2}, 4, 2, {0, 2},
         {2, 2}, 4},
        {"world 3 on {1, 2}: 0 | 1,2", 2, {1, 2}, 3, 2, {0, 1}, {1, 2}, 3},
        {"world 3 on {2, 2, 4}: 0,1 | 2 | none", 3, {2, 2, 4}, 3, 2,
         {0, 2, 0}, {2, 1, 0}, 8},
        {"world 2 on one node of 2: the coordinator alone", 1, {2}, 2, 1,
         {0}, {2}, 2},
        {"3 devices for world 4 (slots < 1 count 1): none", 2, {2, 0}, 4, 0,
         {0}, {0}, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int first[3] = {-1, -1, -1}, count[3] = {-1, -1, -1}, have = -1;
        int used = cluster_ranks_place(cases[c].slots, cases[c].n,
                                       cases[c].world, first, count, &have);
        if (used != cases[c].used || have != cases[c].have)
            fail_msg("%s: %d nodes used, %d slots; want %d, %d",
                     cases[c].what, used, have, cases[c].used, cases[c].have);
        /* every node's count (0 past the ones used), a used one's first */
        for (int i = 0; used > 0 && i < cases[c].n; i++)
            if (count[i] != cases[c].count[i] ||
                (count[i] > 0 && first[i] != cases[c].first[i]))
                fail_msg("%s: node %d ranks %d+%d, want %d+%d", cases[c].what,
                         i, first[i], count[i], cases[c].first[i],
                         cases[c].count[i]);
    }
    /* threads per local rank: the node's share, at least 1 */
    assert_int_equal(cluster_rank_threads(16, 2), 8);
    assert_int_equal(cluster_rank_threads(2, 2), 1);
    assert_int_equal(cluster_rank_threads(3, 2), 1);
    assert_int_equal(cluster_rank_threads(1, 4), 1);
    assert_int_equal(cluster_rank_threads(8, 1), 8);
}

static void test_nodes_table(void **st)
{
    (void)st;
    char db[300], err[512];
    snprintf(db, sizeof db, "%s/m6.db", dir_);
    state *s = state_open(db, err, sizeof err);
    assert_non_null(s);
    node_row n = {0}, got;
    snprintf(n.hostname, sizeof n.hostname, "w1");
    snprintf(n.node_uuid, sizeof n.node_uuid, "%032d", 1);
    snprintf(n.backend, sizeof n.backend, "cpu");
    snprintf(n.address, sizeof n.address, "127.0.0.1:5000");
    snprintf(n.gemm, sizeof n.gemm, "onednn avx512_core_bf16");
    n.devices = 1;
    n.memory = 1ull << 34;
    n.free_device_memory = 1ull << 33;
    n.state = NODE_JOINING;
    int64_t id, id1;
    assert_int_equal(state_node_insert(s, &n, &id1), 0);
    id = id1;
    assert_int_equal(state_node_find(s, 'h', "w1", &got), 0);
    assert_int_equal(got.id, id1);
    assert_string_equal(got.node_uuid, n.node_uuid);
    assert_int_equal(got.state, NODE_JOINING);
    assert_int_equal(got.run, 0);
    assert_int_equal(got.rank, -1);
    assert_true(got.memory == 1ull << 34);
    assert_string_equal(got.address, "127.0.0.1:5000");
    assert_string_equal(got.gemm, "onednn avx512_core_bf16");
    /* a second node of the same hostname: the UNIQUE constraint refuses it
     * (the coordinator checks first and says why) */
    node_row dup = n;
    snprintf(dup.node_uuid, sizeof dup.node_uuid, "%032d", 2);
    assert_int_equal(state_node_insert(s, &dup, &id), -1);
    assert_int_equal(state_node_find(s, 'u', dup.node_uuid, &got), 1);
    /* the first heartbeat makes it live, with its free memory */
    assert_int_equal(state_node_heartbeat(s, id1, 42), 0);
    assert_int_equal(state_node_find(s, 'u', n.node_uuid, &got), 0);
    assert_int_equal(got.state, NODE_LIVE);
    assert_true(got.free_device_memory == 42);
    assert_int_equal(state_node_set_state(s, got.id, NODE_LOST, "no heartbeat"), 0);
    assert_int_equal(state_node_find(s, 'u', n.node_uuid, &got), 0);
    assert_int_equal(got.state, NODE_LOST);
    assert_string_equal(got.detail, "no heartbeat");
    /* a heartbeat does not revive a lost node: only a new join does */
    assert_int_equal(state_node_heartbeat(s, got.id, 7), 0);
    assert_int_equal(state_node_find(s, 'u', n.node_uuid, &got), 0);
    assert_int_equal(got.state, NODE_LOST);
    /* a coordinator's restart: live workers become lost, itself not */
    node_row self = n;
    snprintf(self.hostname, sizeof self.hostname, "coord");
    snprintf(self.node_uuid, sizeof self.node_uuid, "%032d", 3);
    self.coordinator = 1;
    self.state = NODE_LIVE;
    int64_t sid;
    assert_int_equal(state_node_insert(s, &self, &sid), 0);
    n.state = NODE_LIVE;
    assert_int_equal(state_node_update(s, got.id, &n), 0);
    assert_int_equal(state_nodes_mark(s, NODE_LIVE, NODE_LOST, "restarted"), 1);
    node_row *rows;
    int nr;
    assert_int_equal(state_nodes_list(s, &rows, &nr), 0);
    assert_int_equal(nr, 2);
    assert_int_equal(rows[0].state, NODE_LOST);
    assert_false(rows[0].coordinator);
    assert_int_equal(rows[1].state, NODE_LIVE);
    assert_true(rows[1].coordinator);
    free(rows);
    /* a node's ranks in a run: rank .. rank + ranks - 1; one rank when set
     * by state_node_set_run; none once cleared */
    int64_t run = state_run_insert(s, "ranks", "{}", 10, 0, NULL);
    assert_true(run > 0);
    assert_int_equal(state_node_set_ranks(s, sid, run, 0, 2), 0);
    assert_int_equal(state_node_set_run(s, id1, run, 2), 0);
    assert_int_equal(state_node_find(s, 'h', "coord", &got), 0);
    assert_int_equal(got.run, run);
    assert_int_equal(got.rank, 0);
    assert_int_equal(got.ranks, 2);
    assert_int_equal(state_node_find(s, 'h', "w1", &got), 0);
    assert_int_equal(got.rank, 2);
    assert_int_equal(got.ranks, 1);
    assert_int_equal(state_nodes_clear_run(s, run), 0);
    assert_int_equal(state_node_find(s, 'h', "coord", &got), 0);
    assert_int_equal(got.rank, -1);
    assert_int_equal(got.ranks, 0);
    assert_int_equal(state_node_set_state(s, 999, NODE_LEFT, NULL), 1);
    state_close(s);
}

/* The rank board's waiting (rankboard_wait_clock): a training rank whose
 * clock says it entered a collective 1.5 s ago reads waiting, with how
 * long; 0.2 s ago, or no clock, it reads as published; a rank that left
 * is never waiting. The clock is set by hand, as m6_coll_wait_begin
 * would (CLOCK_MONOTONIC ms). */
static void test_rankboard_waiting(void **st)
{
    (void)st;
    rankboard_reset();
    int64_t *clk = rankboard_wait_clock(1);
    assert_non_null(clk);
    assert_null(rankboard_wait_clock(RANKBOARD_DEVICES_MAX));
    assert_null(rankboard_wait_clock(-1));
    rankboard_set(5, 1, 1, 4, RANK_TRAINING, NULL);
    rankboard_set(5, 2, 2, 4, RANK_LEFT, "gone");
    int64_t *clk2 = rankboard_wait_clock(2);
    rank_entry e[4];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    *clk = now - 1500;
    *clk2 = now - 1500;
    assert_int_equal(rankboard_local(e, 4), 2);
    assert_int_equal(e[0].state, RANK_WAITING);
    assert_string_equal(rankboard_state_name(e[0].state), "waiting");
    assert_non_null(strstr(e[0].reason, "in a collective for 1."));
    assert_non_null(strstr(e[0].reason, "(training)"));
    assert_int_equal(e[1].state, RANK_LEFT);
    assert_string_equal(e[1].reason, "gone");
    assert_int_equal(rankboard_run(5, e, 4), 2);
    assert_int_equal(e[0].state, RANK_WAITING);
    *clk = now - 200;
    assert_int_equal(rankboard_local(e, 4), 2);
    assert_int_equal(e[0].state, RANK_TRAINING);
    assert_string_equal(e[0].reason, "");
    *clk = 0;
    *clk2 = 0;
    assert_int_equal(rankboard_run(5, e, 4), 2);
    assert_int_equal(e[0].state, RANK_TRAINING);
    rankboard_reset();
}

TEST_MAIN(
    cmocka_unit_test(test_parse_addr),
    cmocka_unit_test_setup_teardown(test_token, setup_, teardown_),
    cmocka_unit_test_setup_teardown(test_node_uuid, setup_, teardown_),
    cmocka_unit_test_setup_teardown(test_node_secret, setup_, teardown_),
    cmocka_unit_test(test_facts),
    cmocka_unit_test(test_ranks_place),
    cmocka_unit_test_setup_teardown(test_nodes_table, setup_, teardown_),
    cmocka_unit_test(test_rankboard_waiting))
