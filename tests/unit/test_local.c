/*
 * test_local.c — the node-local engine (daemon/dist/local.h): local ranks
 * as threads of this process.
 *
 *   sum        3 and 4 local ranks, random values, random arrival order
 *              (each thread sleeps a random time before each call): every
 *              rank's result bitwise equal to the sum written out here in
 *              local rank order (((b0 + b1) + b2) + b3), and within
 *              P * 6e-8 * (sum of |terms|) of the double-precision
 *              sum; lengths below the number of ranks (some slices
 *              empty) and odd ones
 *   hier       2 nodes x 2 local ranks: the leaders' Gloo group over a file
 *              store; every rank's result bitwise (b0 + b1) + (b2 + b3)
 *              (two leaders: Gloo adds one term to the other, exact either
 *              way round)
 *   fail       a local rank that fails (m6_local_fail), one that leaves,
 *              one that never arrives: the others return -1 within the
 *              timeout (+ slack) naming that local rank; the next call
 *              fails at once
 *   config     bad joins refused with M6_EINVALID
 *
 * hier is skipped (saying so) only when m6 was built without Gloo; the
 * others always run.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/local.h"
#include "../common/file_store.h"

#define TIMEOUT_MS 1500
#define SLACK_S 3.0

static int failures_;
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", \
    __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
    failures_++; } } while (0)

static double now_(void) { return file_store_now_(); }

static uint32_t rng_(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* ------------------------------------------------------------------ sum */

typedef struct {
    const char *name;
    int rank, size;
    float *buf;
    size_t n;
    int rc;
    uint32_t seed;
    m6_coll *leaders;   /* hier */
    int hier;
} arg_;

static void *sum_main_(void *p)
{
    arg_ *a = p;
    m6_err e = M6_ERR_NONE;
    m6_local *h = m6_local_join(a->name, a->rank, a->size, TIMEOUT_MS, &e);
    if (!h) {
        fprintf(stderr, "join: %s\n", m6_err_msg(&e));
        a->rc = -1;
        return NULL;
    }
    usleep(rng_(&a->seed) % 20000);
    a->rc = a->hier ? m6_local_hier_allreduce_sum(h, a->leaders, a->buf,
                                                  a->n, &e)
                    : m6_local_allreduce_sum(h, a->buf, a->n, &e);
    if (a->rc != 0)
        fprintf(stderr, "local rank %d: %s\n", a->rank, m6_err_msg(&e));
    m6_err_free(&e);
    m6_local_leave(h);
    return NULL;
}

static void test_sum_(int P, size_t n, uint32_t seed)
{
    char name[64];
    snprintf(name, sizeof name, "test/sum/%d/%zu/%u", P, n, seed);
    float *in[8], *out[8];
    arg_ a[8];
    pthread_t th[8];
    uint32_t s = seed;
    for (int r = 0; r < P; r++) {
        in[r] = malloc((n ? n : 1) * sizeof(float));
        out[r] = malloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            in[r][i] = ((float)(rng_(&s) % 2000001) - 1e6f) * 1.37e-3f;
        memcpy(out[r], in[r], n * sizeof(float));
        a[r] = (arg_){name, r, P, out[r], n, -2, seed + 7u * (uint32_t)r,
                      NULL, 0};
        pthread_create(&th[r], NULL, sum_main_, &a[r]);
    }
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < P; r++)
        CHECK(a[r].rc == 0, "P=%d n=%zu: local rank %d returned %d", P, n, r,
              a[r].rc);
    for (size_t i = 0; i < n && bad < 5; i++) {
        float want = in[0][i];
        double d = in[0][i], mag = fabs(in[0][i]);
        for (int r = 1; r < P; r++) {
            want += in[r][i];
            d += in[r][i];
            mag += fabs(in[r][i]);
        }
        for (int r = 0; r < P; r++)
            if (memcmp(&out[r][i], &want, sizeof want) != 0) {
                CHECK(0, "P=%d n=%zu: local rank %d element %zu is %.9g, "
                      "the sum in rank order %.9g", P, n, r, i,
                      (double)out[r][i], (double)want);
                bad++;
            }
        /* P-1 roundings, each within half an ulp of a partial sum whose
         * size is at most the terms' sum of magnitudes */
        double tol = (double)P * 6e-8 * mag;
        if (fabs((double)want - d) > tol) {
            CHECK(0, "element %zu: %.9g vs double %.9g", i, (double)want, d);
            bad++;
        }
    }
    for (int r = 0; r < P; r++) {
        free(in[r]);
        free(out[r]);
    }
}

/* ----------------------------------------------------------------- hier */

typedef struct {
    char dir[256];
    int node;
    m6_coll *c;
} leader_init_;

static void *leader_init_main_(void *p)
{
    leader_init_ *l = p;
    file_store fs;
    snprintf(fs.dir, sizeof fs.dir, "%s", l->dir);
    static m6_store st[2];
    st[l->node] = file_store_table(&fs);
    m6_err e = M6_ERR_NONE;
    m6_coll_config cfg = {"gloo", l->node, 2, &st[l->node], "test/leaders",
                          TIMEOUT_MS * 4, "127.0.0.1", 0};
    l->c = m6_coll_init(&cfg, &e);
    if (!l->c)
        fprintf(stderr, "leader %d: %s\n", l->node, m6_err_msg(&e));
    m6_err_free(&e);
    return NULL;
}

static int test_hier_(void)
{
    if (!m6_coll_available("gloo")) {
        printf("hier: SKIP, built without Gloo\n");
        return 0;
    }
    char dir[] = "/tmp/m6-test-local-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return 0;
    }
    leader_init_ li[2];
    pthread_t lt[2];
    for (int k = 0; k < 2; k++) {
        snprintf(li[k].dir, sizeof li[k].dir, "%s", dir);
        li[k].node = k;
        pthread_create(&lt[k], NULL, leader_init_main_, &li[k]);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(lt[k], NULL);
    CHECK(li[0].c && li[1].c, "the leaders' Gloo group");
    if (!li[0].c || !li[1].c)
        return 0;
    size_t n = 1003;
    float *in[4], *out[4];
    arg_ a[4];
    pthread_t th[4];
    uint32_t s = 99;
    for (int r = 0; r < 4; r++) {
        in[r] = malloc(n * sizeof(float));
        out[r] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            in[r][i] = ((float)(rng_(&s) % 2000001) - 1e6f) * 1.37e-3f;
        memcpy(out[r], in[r], n * sizeof(float));
        int node = r / 2, lr = r % 2;
        a[r] = (arg_){node ? "test/hier/node1" : "test/hier/node0", lr, 2,
                      out[r], n, -2, 5u + (uint32_t)r,
                      lr == 0 ? li[node].c : NULL, 1};
        pthread_create(&th[r], NULL, sum_main_, &a[r]);
    }
    for (int r = 0; r < 4; r++)
        pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < 4; r++)
        CHECK(a[r].rc == 0, "hier: rank %d returned %d", r, a[r].rc);
    for (size_t i = 0; i < n && bad < 5; i++) {
        float x = in[0][i] + in[1][i], y = in[2][i] + in[3][i];
        float want = x + y;
        for (int r = 0; r < 4; r++)
            if (memcmp(&out[r][i], &want, sizeof want) != 0) {
                CHECK(0, "hier: rank %d element %zu is %.9g, want %.9g", r,
                      i, (double)out[r][i], (double)want);
                bad++;
            }
    }
    for (int r = 0; r < 4; r++) {
        free(in[r]);
        free(out[r]);
    }
    m6_coll_destroy(li[0].c);
    m6_coll_destroy(li[1].c);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return 0;
}

/* ----------------------------------------------------------------- fail */

enum { HOW_FAIL_, HOW_LEAVE_, HOW_ABSENT_ };

typedef struct {
    const char *name;
    int rank, size, how, bad_rank;
    int rc, rc2;
    double took;
    char msg[1200];
} fail_arg_;

static void *fail_main_(void *p)
{
    fail_arg_ *a = p;
    m6_err e = M6_ERR_NONE;
    float buf[64] = {0};
    if (a->rank == a->bad_rank && a->how == HOW_ABSENT_)
        return NULL;
    m6_local *h = m6_local_join(a->name, a->rank, a->size, TIMEOUT_MS, &e);
    if (!h) {
        snprintf(a->msg, sizeof a->msg, "join: %s", m6_err_msg(&e));
        m6_err_free(&e);
        return NULL;
    }
    if (a->rank == a->bad_rank) {
        usleep(200000);  /* the others wait in the barrier by now */
        if (a->how == HOW_FAIL_)
            m6_local_fail(h, "out of memory (a test)");
        m6_local_leave(h);
        return NULL;
    }
    double t0 = now_();
    a->rc = m6_local_allreduce_sum(h, buf, 64, &e);
    a->took = now_() - t0;
    snprintf(a->msg, sizeof a->msg, "%s", m6_err_msg(&e));
    m6_err_free(&e);
    a->rc2 = m6_local_allreduce_sum(h, buf, 64, &e);
    m6_err_free(&e);
    m6_local_leave(h);
    return NULL;
}

static void test_fail_(int how, const char *want)
{
    static const char *names[] = {"test/fail/fail", "test/fail/leave",
                                  "test/fail/absent"};
    fail_arg_ a[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        a[r] = (fail_arg_){names[how], r, 3, how, 1, -2, -2, 0, ""};
        pthread_create(&th[r], NULL, fail_main_, &a[r]);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r += 2) {
        CHECK(a[r].rc == -1, "%s: local rank %d returned %d", names[how], r,
              a[r].rc);
        CHECK(a[r].took < TIMEOUT_MS / 1000.0 + SLACK_S, "%s: local rank %d "
              "took %.2f s", names[how], r, a[r].took);
        CHECK(strstr(a[r].msg, want) != NULL, "%s: local rank %d's error "
              "\"%s\" does not say \"%s\"", names[how], r, a[r].msg, want);
        CHECK(a[r].rc2 == -1, "%s: local rank %d's next call returned %d",
              names[how], r, a[r].rc2);
    }
}

/* --------------------------------------------------------------- config */

static void test_config_(void)
{
    m6_err e = M6_ERR_NONE;
    CHECK(!m6_local_join("c", 3, 3, 100, &e) && e.code == M6_EINVALID,
          "rank 3 of 3");
    m6_err_free(&e);
    CHECK(!m6_local_join("c", 0, 2, 0, &e) && e.code == M6_EINVALID,
          "timeout 0");
    m6_err_free(&e);
    m6_local *h = m6_local_join("c", 0, 2, 100, &e);
    CHECK(h != NULL, "join");
    CHECK(!m6_local_join("c", 1, 3, 100, &e) && e.code == M6_EINVALID &&
          strstr(m6_err_msg(&e), "size 3"), "another size");
    m6_err_free(&e);
    CHECK(!m6_local_join("c", 0, 2, 100, &e) && e.code == M6_EINVALID,
          "rank 0 twice");
    m6_err_free(&e);
    m6_local_leave(h);
}

int main(void)
{
    test_config_();
    for (int P = 3; P <= 4; P++) {
        size_t lens[] = {1, 2, 5, 1000, 65537};
        for (int k = 0; k < 5; k++)
            for (uint32_t seed = 1; seed <= 3; seed++)
                test_sum_(P, lens[k], seed * 1234567u);
    }
    test_hier_();
    test_fail_(HOW_FAIL_, "local rank 1 failed: out of memory (a test)");
    test_fail_(HOW_LEAVE_, "local rank 1 left");
    test_fail_(HOW_ABSENT_, "for local rank 1");
    if (failures_) {
        fprintf(stderr, "%d failures\n", failures_);
        return 1;
    }
    printf("ok\n");
    return 0;
}
