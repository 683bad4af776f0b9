/*
 * test_collectives.c — the collectives interface (daemon/dist/collectives.h)
 * over Gloo on loopback, 2 and 3 ranks, each a separate process (this
 * program run again as "rank SCENARIO DIR RANK WORLD"), bootstrapped
 * through a file store (tests/common/file_store.h).
 *
 *   sum        all-reduce against the sum computed by hand (values small
 *              integers, so the float sums are exact and checked exactly),
 *              several lengths; broadcast from a non-zero root; a barrier
 *              that only returns once every rank has arrived (each rank
 *              leaves a marker file before it enters; the last one comes
 *              late; after the barrier every marker must be there);
 *              all-gather in place of uneven parts (one empty) and
 *              reduce-scatter against the values by hand; all-to-all of
 *              sizes and of bytes (parts of several sizes, some empty, a
 *              rank sending nothing), byte for byte, and one where nothing
 *              moves that every rank still enters
 *   missing    a world of 3 where rank 2 never starts: init fails on the
 *              others within the timeout, naming the store key not set
 *   killed     rank 2 dies (SIGKILL) before an all-reduce: the others fail
 *              within the timeout, and their next call fails at once
 *   stopped    rank 2 stops (SIGSTOP) before an all-reduce: the others
 *              time out (M6_ECANCELLED) within the timeout
 *   midkill    the ranks run 64 MiB all-reduces in a loop and the driver
 *              kills rank 2 (SIGKILL) in the middle of them: the others
 *              leave their all-reduce with an error within the timeout
 *   config     bad configurations refused with M6_EINVALID (in process)
 *
 * Exit 77 when m6 was built without Gloo.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/collectives.h"
#include "../common/file_store.h"
#include "../common/self_exe.h"

#define TIMEOUT_MS 2000
/* what a failure may take beyond the timeout: process start, the kernel
 * closing the dead rank's sockets, a loaded 2-core machine */
#define SLACK_S 4.0

static double now_(void) { return file_store_now_(); }

#define FAIL(...) do { fprintf(stderr, "rank %d: ", rank); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

static m6_coll *init_(file_store *fs, m6_store *st, int rank, int world,
                      int timeout_ms, m6_err *err)
{
    *st = file_store_table(fs);
    m6_coll_config cfg = {"gloo", rank, world, st, "test/g0", timeout_ms,
                          "127.0.0.1", 0};
    return m6_coll_init(&cfg, err);
}

/* The all-to-all case's bytes from rank r to rank j: 0 from rank 1 and
 * where r + j is a multiple of 3, else a few hundred; and byte k of that
 * part. */
static size_t a2a_bytes_(int r, int j)
{
    return r == 1 || (r + j) % 3 == 0 ? 0 : (size_t)(100 + 37 * r + 11 * j);
}

static unsigned char a2a_byte_(int r, int j, size_t k)
{
    return (unsigned char)(r * 31 + j * 17 + (int)k);
}

static int rank_sum_(file_store *fs, int rank, int world)
{
    m6_store st;
    m6_err err = M6_ERR_NONE;
    m6_coll *c = init_(fs, &st, rank, world, 20000, &err);
    if (!c)
        FAIL("init: %s", m6_err_msg(&err));
    if (m6_coll_rank(c) != rank || m6_coll_world_size(c) != world ||
        strcmp(m6_coll_backend(c), "gloo") != 0)
        FAIL("rank/world/backend accessors wrong");
    /* all-reduce: x[i] = (r+1) * (i % 1000 - 500); sum over r is
     * (i % 1000 - 500) * W(W+1)/2, exact in fp32 */
    const size_t lens[] = {1, 7, 1000, 262147};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        float *x = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1) * (float)((long)(i % 1000) - 500);
        if (m6_coll_allreduce_sum(c, x, n, &err) != 0)
            FAIL("all-reduce of %zu: %s", n, m6_err_msg(&err));
        float tri = (float)(world * (world + 1) / 2);
        for (size_t i = 0; i < n; i++) {
            float want = tri * (float)((long)(i % 1000) - 500);
            if (x[i] != want)
                FAIL("all-reduce of %zu: x[%zu] = %g, want %g", n, i,
                     (double)x[i], (double)want);
        }
        free(x);
    }
    /* broadcast from the last rank: 100003 bytes of its pattern */
    int root = world - 1;
    size_t nb = 100003;
    unsigned char *b = malloc(nb);
    for (size_t i = 0; i < nb; i++)
        b[i] = rank == root ? (unsigned char)(i * 7 + 3) : 0;
    if (m6_coll_broadcast(c, b, nb, root, &err) != 0)
        FAIL("broadcast: %s", m6_err_msg(&err));
    for (size_t i = 0; i < nb; i++)
        if (b[i] != (unsigned char)(i * 7 + 3))
            FAIL("broadcast: byte %zu = %d, want %d", i, b[i],
                 (unsigned char)(i * 7 + 3));
    free(b);
    /* barrier: the last rank arrives 0.5 s late */
    if (rank == world - 1) {
        struct timespec ts = {0, 500000000};
        nanosleep(&ts, NULL);
    }
    char mark[64];
    snprintf(mark, sizeof mark, "barrier-%d", rank);
    if (st.set(st.ctx, mark, "1", 1, &err) != 0)
        FAIL("marker: %s", m6_err_msg(&err));
    if (m6_coll_barrier(c, &err) != 0)
        FAIL("barrier: %s", m6_err_msg(&err));
    for (int r = 0; r < world; r++) {
        void *v;
        size_t len;
        snprintf(mark, sizeof mark, "barrier-%d", r);
        if (st.get(st.ctx, mark, &v, &len, 0, &err) != 0)
            FAIL("left the barrier before rank %d entered it", r);
        free(v);
    }
    /* all-gather in place, uneven counts, one rank's empty: rank r's part
     * holds 1000 r + i (exact), the rest garbage (-1) before the call */
    {
        size_t counts[8], n = 0, off = 0;
        for (int r = 0; r < world; r++)
            n += counts[r] = r == 1 ? 0 : (size_t)(1000 + 17 * r);
        float *x = malloc(n * sizeof(float));
        for (int r = 0; r < world; r++) {
            for (size_t i = 0; i < counts[r]; i++)
                x[off + i] = r == rank ? (float)(1000 * r + (int)i) : -1.0f;
            off += counts[r];
        }
        if (m6_coll_allgather(c, x, counts, &err) != 0)
            FAIL("all-gather: %s", m6_err_msg(&err));
        off = 0;
        for (int r = 0; r < world; r++) {
            for (size_t i = 0; i < counts[r]; i++)
                if (x[off + i] != (float)(1000 * r + (int)i))
                    FAIL("all-gather: rank %d's element %zu = %g, want %d",
                         r, i, (double)x[off + i], 1000 * r + (int)i);
            off += counts[r];
        }
        /* reduce-scatter: this rank's part holds the sums (as the
         * all-reduce above, exact); counts not adding up are refused */
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1) * (float)((long)(i % 1000) - 500);
        if (m6_coll_reduce_scatter_sum(c, x, n, counts, &err) != 0)
            FAIL("reduce-scatter: %s", m6_err_msg(&err));
        off = 0;
        for (int r = 0; r < rank; r++)
            off += counts[r];
        float tri = (float)(world * (world + 1) / 2);
        for (size_t i = off; i < off + counts[rank]; i++)
            if (x[i] != tri * (float)((long)(i % 1000) - 500))
                FAIL("reduce-scatter: x[%zu] = %g, want %g", i, (double)x[i],
                     (double)(tri * (float)((long)(i % 1000) - 500)));
        if (m6_coll_reduce_scatter_sum(c, x, n + 1, counts, &err) == 0 ||
            err.code != M6_EINVALID)
            FAIL("reduce-scatter with counts not adding up accepted");
        free(x);
    }
    /* all-to-all of sizes, then of bytes: rank r sends a2a_bytes_(r, j)
     * bytes to rank j (some 0; rank 1 sends nothing at all), byte k of
     * that part a2a_byte_(r, j, k); then one where nothing moves, which
     * every rank still enters (a barrier after it must not hang) */
    {
        uint64_t want[8], got[8];
        size_t sb[8], rb[8], st = 0, rt = 0;
        for (int j = 0; j < world; j++) {
            st += sb[j] = a2a_bytes_(rank, j);
            want[j] = a2a_bytes_(j, rank);
        }
        uint64_t sizes[8];
        for (int j = 0; j < world; j++)
            sizes[j] = sb[j];
        if (m6_coll_alltoall_sizes(c, sizes, got, &err) != 0)
            FAIL("all-to-all of sizes: %s", m6_err_msg(&err));
        for (int i = 0; i < world; i++) {
            if (got[i] != want[i])
                FAIL("all-to-all of sizes: from rank %d %llu, want %llu", i,
                     (unsigned long long)got[i], (unsigned long long)want[i]);
            rt += rb[i] = (size_t)got[i];
        }
        unsigned char *out = malloc(st + 1), *in = malloc(rt + 1);
        for (int j = 0, o = 0; j < world; j++)
            for (size_t k = 0; k < sb[j]; k++)
                out[o++] = a2a_byte_(rank, j, k);
        memset(in, 0xEE, rt + 1);
        if (m6_coll_alltoallv(c, out, sb, in, rb, &err) != 0)
            FAIL("all-to-all: %s", m6_err_msg(&err));
        size_t o = 0;
        for (int i = 0; i < world; i++)
            for (size_t k = 0; k < rb[i]; k++, o++)
                if (in[o] != a2a_byte_(i, rank, k))
                    FAIL("all-to-all: byte %zu from rank %d = %d, want %d", k,
                         i, in[o], a2a_byte_(i, rank, k));
        if (in[rt] != 0xEE)
            FAIL("all-to-all wrote past its %zu bytes", rt);
        size_t zero[8] = {0};
        if (m6_coll_alltoallv(c, out, zero, in, zero, &err) != 0)
            FAIL("all-to-all of nothing: %s", m6_err_msg(&err));
        if (m6_coll_barrier(c, &err) != 0)
            FAIL("barrier after the all-to-all of nothing: %s",
                 m6_err_msg(&err));
        free(out);
        free(in);
    }
    /* a bad root is refused and leaves the group usable */
    if (m6_coll_broadcast(c, mark, 1, world, &err) == 0 ||
        err.code != M6_EINVALID)
        FAIL("broadcast from root %d accepted", world);
    if (m6_coll_barrier(c, &err) != 0)
        FAIL("barrier after a refused call: %s", m6_err_msg(&err));
    m6_coll_destroy(c);
    m6_err_free(&err);
    return 0;
}

/* World 3, rank 2 never started. */
static int rank_missing_(file_store *fs, int rank, int world)
{
    m6_store st;
    m6_err err = M6_ERR_NONE;
    double t0 = now_();
    m6_coll *c = init_(fs, &st, rank, world, 1500, &err);
    double dt = now_() - t0;
    if (c)
        FAIL("init succeeded without rank 2");
    fprintf(stderr, "rank %d: init failed after %.2f s as it should: %s\n",
            rank, dt, m6_err_msg(&err));
    if (err.code != M6_ECANCELLED)
        FAIL("code %d, want M6_ECANCELLED", err.code);
    if (!strstr(m6_err_msg(&err), "not set after 1500 ms") ||
        !strstr(m6_err_msg(&err), "gloo init"))
        FAIL("message does not say what timed out");
    if (dt > 1.5 + SLACK_S)
        FAIL("took %.2f s, timeout 1.5 s", dt);
    m6_err_free(&err);
    return 0;
}

/* Rank 2 dies (how: SIGKILL or SIGSTOP) before the second all-reduce. */
static int rank_fail_(file_store *fs, int rank, int world, int sig)
{
    m6_store st;
    m6_err err = M6_ERR_NONE;
    m6_coll *c = init_(fs, &st, rank, world, TIMEOUT_MS, &err);
    if (!c)
        FAIL("init: %s", m6_err_msg(&err));
    size_t n = 1 << 20;
    float *x = calloc(n, sizeof(float));
    if (m6_coll_allreduce_sum(c, x, n, &err) != 0)
        FAIL("first all-reduce: %s", m6_err_msg(&err));
    if (rank == 2)
        raise(sig);  /* SIGSTOP: the driver kills it later */
    double t0 = now_();
    int rc = m6_coll_allreduce_sum(c, x, n, &err);
    double dt = now_() - t0;
    if (rc == 0)
        FAIL("all-reduce succeeded without rank 2");
    fprintf(stderr, "rank %d: all-reduce failed after %.2f s as it "
            "should: %s\n", rank, dt, m6_err_msg(&err));
    if (dt > TIMEOUT_MS / 1e3 + SLACK_S)
        FAIL("took %.2f s, timeout %.1f s", dt, TIMEOUT_MS / 1e3);
    if (sig == SIGSTOP && err.code != M6_ECANCELLED)
        FAIL("a silent peer: code %d, want M6_ECANCELLED", err.code);
    if (!strstr(m6_err_msg(&err), "gloo all-reduce (rank"))
        FAIL("message does not name the operation and rank");
    t0 = now_();
    if (m6_coll_barrier(c, &err) == 0 || !strstr(m6_err_msg(&err), "broken"))
        FAIL("a broken group's next call did not fail as broken");
    if (now_() - t0 > 0.5)
        FAIL("a broken group's next call waited");
    m6_coll_destroy(c);
    free(x);
    m6_err_free(&err);
    return 0;
}

/* All-reduces in a loop until one fails (rank 2 is killed meanwhile by
 * the driver, once it has left the marker "ready" in the store). */
static int rank_midkill_(file_store *fs, int rank, int world)
{
    m6_store st;
    m6_err err = M6_ERR_NONE;
    m6_coll *c = init_(fs, &st, rank, world, TIMEOUT_MS, &err);
    if (!c)
        FAIL("init: %s", m6_err_msg(&err));
    size_t n = (size_t)16 << 20;
    float *x = calloc(n, sizeof(float));
    if (m6_coll_allreduce_sum(c, x, n, &err) != 0)
        FAIL("first all-reduce: %s", m6_err_msg(&err));
    if (rank == 2 && st.set(st.ctx, "ready", "1", 1, &err) != 0)
        FAIL("marker: %s", m6_err_msg(&err));
    for (int i = 0; i < 100000; i++)
        if (m6_coll_allreduce_sum(c, x, n, &err) != 0) {
            fprintf(stderr, "rank %d: all-reduce %d failed as it should: "
                    "%s\n", rank, i + 2, m6_err_msg(&err));
            m6_coll_destroy(c);
            free(x);
            m6_err_free(&err);
            return 0;
        }
    FAIL("all-reduces kept succeeding without rank 2");
}

/* ------------------------------------------------------------ driver */

static const char *self_;

/* Start ranks [0, started) of a world, wait for them (at most limit_s;
 * stragglers are killed). skip: a rank whose exit is not checked (the one
 * that dies). 0 when every checked rank exits 0. */
static int run_(const char *scenario, int world, int started, int skip,
                double limit_s)
{
    char dir[] = "/tmp/m6-coll-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    pid_t pids[8];
    for (int r = 0; r < started; r++) {
        char rs[16], ws[16];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(ws, sizeof ws, "%d", world);
        if ((pids[r] = fork()) == 0) {
            execl(self_, self_, "rank", scenario, dir, rs, ws, (char *)NULL);
            _exit(127);
        }
    }
    int bad = 0, left = started;
    int done[8] = {0};
    double end = now_() + limit_s, killed_at = -1;
    int midkill = strcmp(scenario, "midkill") == 0;
    while (left > 0) {
        char ready[600];
        struct stat sb;
        snprintf(ready, sizeof ready, "%s/ready", dir);
        if (midkill && killed_at < 0 && stat(ready, &sb) == 0) {
            struct timespec ts = {0, 300000000};  /* into the next ones */
            nanosleep(&ts, NULL);
            kill(pids[2], SIGKILL);
            killed_at = now_();
        }
        for (int r = 0; r < started; r++) {
            int status;
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            done[r] = 1;
            left--;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (midkill && r != skip && killed_at > 0 &&
                now_() - killed_at > TIMEOUT_MS / 1e3 + SLACK_S) {
                fprintf(stderr, "midkill: rank %d left %.2f s after the "
                        "kill, timeout %.1f s\n", r, now_() - killed_at,
                        TIMEOUT_MS / 1e3);
                bad = 1;
            }
            if (r != skip && !ok) {
                fprintf(stderr, "%s world %d: rank %d failed (status 0x%x)\n",
                        scenario, world, r, status);
                bad = 1;
            }
        }
        /* the stopped rank stays stopped until the others are done */
        int others = 0;
        for (int r = 0; r < started; r++)
            others += !done[r] && r != skip;
        if (others == 0 && skip >= 0 && !done[skip])
            kill(pids[skip], SIGKILL);
        if (left > 0 && now_() > end) {
            fprintf(stderr, "%s world %d: ranks still running after %.0f s "
                    "(hung): killed\n", scenario, world, limit_s);
            for (int r = 0; r < started; r++)
                if (!done[r])
                    kill(pids[r], SIGKILL);
            bad = 1;
            end = now_() + 60;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    printf("%-8s world %d: %s\n", scenario, world, bad ? "FAILED" : "ok");
    return bad;
}

static int config_(void)
{
    file_store fs = {"/nonexistent"};
    m6_store st = file_store_table(&fs);
    m6_err err = M6_ERR_NONE;
    int bad = 0;
    struct { m6_coll_config cfg; const char *want; } cases[] = {
        {{"mpi", 0, 2, &st, NULL, 1000, NULL, 0}, "unknown backend 'mpi'"},
        {{"gloo", 2, 2, &st, NULL, 1000, NULL, 0}, "rank 2 is not in"},
        {{"gloo", -1, 2, &st, NULL, 1000, NULL, 0}, "rank -1 is not in"},
        {{"gloo", 0, 2, &st, NULL, 0, NULL, 0}, "timeout must be > 0"},
        {{"gloo", 0, 2, NULL, NULL, 1000, NULL, 0}, "no bootstrap store"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        m6_coll *c = m6_coll_init(&cases[i].cfg, &err);
        if (c || err.code != M6_EINVALID ||
            !strstr(m6_err_msg(&err), cases[i].want)) {
            fprintf(stderr, "config case %zu: got '%s', want '%s'\n", i,
                    m6_err_msg(&err), cases[i].want);
            bad = 1;
            m6_coll_destroy(c);
        }
    }
    if (!m6_coll_available("nccl")) {
        m6_coll_config cfg = {"nccl", 0, 1, &st, NULL, 1000, NULL, 0};
        if (m6_coll_init(&cfg, &err) || !strstr(m6_err_msg(&err), "without NCCL")) {
            fprintf(stderr, "nccl absent: '%s'\n", m6_err_msg(&err));
            bad = 1;
        }
    }
    m6_err_free(&err);
    printf("config: %s\n", bad ? "FAILED" : "ok");
    return bad;
}

int main(int argc, char **argv)
{
    self_ = "/proc/self/exe";
    if (argc == 6 && strcmp(argv[1], "rank") == 0) {
        file_store fs;
        snprintf(fs.dir, sizeof fs.dir, "%s", argv[3]);
        int rank = atoi(argv[4]), world = atoi(argv[5]);
        srandom((unsigned)getpid());
        if (strcmp(argv[2], "sum") == 0)
            return rank_sum_(&fs, rank, world);
        if (strcmp(argv[2], "missing") == 0)
            return rank_missing_(&fs, rank, world);
        if (strcmp(argv[2], "killed") == 0)
            return rank_fail_(&fs, rank, world, SIGKILL);
        if (strcmp(argv[2], "stopped") == 0)
            return rank_fail_(&fs, rank, world, SIGSTOP);
        if (strcmp(argv[2], "midkill") == 0)
            return rank_midkill_(&fs, rank, world);
        return 2;
    }
    if (!m6_coll_available("gloo")) {
        printf("SKIP: m6 was built without Gloo (meson option gloo; "
               "libgloo-dev)\n");
        return 77;
    }
    self_ = self_exe();
    if (!self_)
        return 1;
    int bad = config_();
    bad |= run_("sum", 2, 2, -1, 60);
    bad |= run_("sum", 3, 3, -1, 60);
    bad |= run_("missing", 3, 2, -1, 30);
    bad |= run_("killed", 3, 3, 2, 30);
    bad |= run_("stopped", 3, 3, 2, 30);
    bad |= run_("midkill", 3, 3, 2, 60);
    return bad;
}
