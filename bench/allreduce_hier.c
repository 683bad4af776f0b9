/*
 * allreduce_hier.c — the gradient sum's two ways on this machine: flat
 * (Gloo over every rank, daemon/dist/collectives.h) against hierarchical
 * (the node-local engine inside each node, Gloo among one leader per
 * node, back inside the node: dist/local.h m6_local_hier_allreduce_sum),
 * for N nodes (processes) of L ranks each (threads of one process, as
 * m6d --devices L runs them), on loopback.
 *
 * Sizes are the gradient sync's buckets (trainer_set_bucket_floats; the
 * default 4 Mi floats = 16 MiB): 1, 4 and 16 MiB by default. Each size:
 * best of --reps timed calls of each way after one warm-up, the two ways
 * alternating (so a noisy neighbour hurts both alike), every call started
 * together (a Gloo barrier over all ranks). Every result is checked
 * against the sum by hand (small integers: exact in fp32).
 *
 * Ends with one key=value line (the largest size). Exit 77 without Gloo,
 * 1 when a rank fails or a sum is wrong.
 *
 *   allreduce_hier [--nodes N] [--local L] [--mib A,B,...] [--reps R]
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_ranks.h"
#include "common/clock.h"
#include "dist/collectives.h"
#include "dist/local.h"
#include "../tests/common/file_store.h"

#define MAX_SIZES 8

typedef struct {
    const char *dir;
    int node, nodes, local, L, reps, nsizes;
    const int *mib;
    FILE *out;          /* rank 0 writes "MIB FLAT_S HIER_S" lines */
    int rc;
} rank_arg_;

static void *rank_main_(void *p)
{
    rank_arg_ *a = p;
    int R = a->nodes * a->L, rank = a->node * a->L + a->local;
    file_store fs;
    snprintf(fs.dir, sizeof fs.dir, "%s", a->dir);
    m6_store st = file_store_table(&fs);
    m6_err err = M6_ERR_NONE;
    m6_coll_config cfg = {"gloo", rank, R, &st, "flat", 60000, "127.0.0.1",
                          0};
    m6_coll *flat = m6_coll_init(&cfg, &err), *lead = NULL;
    char name[64];
    snprintf(name, sizeof name, "bench/node%d", a->node);
    m6_local *lg = flat ? m6_local_join(name, a->local, a->L, 60000, &err)
                        : NULL;
    if (lg && a->local == 0 && a->nodes > 1) {
        m6_coll_config lc = {"gloo", a->node, a->nodes, &st, "leaders",
                             60000, "127.0.0.1", 0};
        lead = m6_coll_init(&lc, &err);
    }
    if (!flat || !lg || (a->local == 0 && a->nodes > 1 && !lead)) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        a->rc = 1;
        return NULL;
    }
    size_t max_n = 0;
    for (int s = 0; s < a->nsizes; s++)
        if (((size_t)a->mib[s] << 18) > max_n)
            max_n = (size_t)a->mib[s] << 18;
    float *x = malloc(max_n * sizeof(float));
    if (!x) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        a->rc = 1;
        return NULL;
    }
    /* element i of rank r: (i + r) % 7, summed by hand over the ranks */
    for (int s = 0; s < a->nsizes && !a->rc; s++) {
        size_t n = (size_t)a->mib[s] << 18;
        double best[2] = {1e30, 1e30};
        for (int rep = 0; rep <= a->reps && !a->rc; rep++)
            for (int way = 0; way < 2 && !a->rc; way++) {
                for (size_t i = 0; i < n; i++)
                    x[i] = (float)((i + (size_t)rank) % 7);
                if (m6_coll_barrier(flat, &err) != 0) {
                    a->rc = 1;
                    break;
                }
                double t0 = clock_mono_s();
                int rc = way == 0
                             ? m6_coll_allreduce_sum(flat, x, n, &err)
                             : m6_local_hier_allreduce_sum(lg, lead, x, n,
                                                           &err);
                double dt = clock_mono_s() - t0;
                if (rc != 0) {
                    a->rc = 1;
                    break;
                }
                for (size_t i = 0; i < n; i += 4099) {
                    float want = 0;
                    for (int r = 0; r < R; r++)
                        want += (float)((i + (size_t)r) % 7);
                    if (x[i] != want) {
                        fprintf(stderr, "rank %d: %s element %zu is %g, "
                                "want %g\n", rank, way ? "hier" : "flat", i,
                                (double)x[i], (double)want);
                        a->rc = 1;
                        break;
                    }
                }
                if (rep > 0 && dt < best[way])  /* the first warms up */
                    best[way] = dt;
            }
        if (a->out && !a->rc)
            fprintf(a->out, "%d %.9f %.9f\n", a->mib[s], best[0], best[1]);
    }
    if (a->rc)
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
    m6_err_free(&err);
    free(x);
    m6_coll_destroy(lead);
    m6_local_leave(lg);
    m6_coll_destroy(flat);
    return NULL;
}

/* One node: L rank threads. 0, or 1 when one failed. */
typedef struct { int L, reps, nsizes; const int *mib; } args_;

static int node_main_(int node, int nodes, const char *dir, int out_fd,
                      const void *arg)
{
    const args_ *ar = arg;
    int L = ar->L, reps = ar->reps, nsizes = ar->nsizes;
    const int *mib = ar->mib;
    rank_arg_ a[64];
    pthread_t th[64];
    FILE *out = node == 0 ? fdopen(out_fd, "w") : NULL;
    for (int l = 0; l < L; l++) {
        a[l] = (rank_arg_){dir, node, nodes, l, L, reps, nsizes, mib,
                           l == 0 ? out : NULL, 0};
        if (pthread_create(&th[l], NULL, rank_main_, &a[l]) != 0)
            return 1;
    }
    int bad = 0;
    for (int l = 0; l < L; l++) {
        pthread_join(th[l], NULL);
        bad |= a[l].rc;
    }
    if (out)
        fclose(out);
    return bad;
}

int main(int argc, char **argv)
{
    int N = 2, L = 2, reps = 5, mib[MAX_SIZES] = {1, 4, 16}, nsizes = 3;
    const char *mib_list = NULL;
    const bench_opt opts[] = {
        BENCH_INT("nodes", &N, 1), BENCH_INT("local", &L, 1),
        BENCH_TEXT("mib", &mib_list), BENCH_INT("reps", &reps, 1)};
    bench_parse(argv[0], argc, argv, opts, 4, "usage: allreduce_hier "
                "[--nodes N] [--local L] [--mib A,B,...] [--reps R]\n");
    if (mib_list) {
        nsizes = 0;
        const char *s = mib_list;
        char *end;
        while (*s && nsizes < MAX_SIZES) {
            long v = strtol(s, &end, 10);
            if (end == s || v < 1 || v > 1024 || (*end && *end != ',')) {
                fprintf(stderr, "%s: --mib: want sizes 1..1024 separated "
                        "by commas, got \"%s\"\n", argv[0], mib_list);
                return 2;
            }
            mib[nsizes++] = (int)v;
            s = *end ? end + 1 : end;
        }
        if (nsizes == 0 || *s) {
            fprintf(stderr, "%s: --mib: 1 to %d sizes\n", argv[0],
                    MAX_SIZES);
            return 2;
        }
    }
    if (N > 16 || L > 64 || N * L < 2) {
        fprintf(stderr, "%s: --nodes at most 16, --local at most 64, 2 ranks "
                "at least\n", argv[0]);
        return 2;
    }
    char dir[] = "/tmp/m6-bench-hier-XXXXXX";
    int in_fd;
    pid_t pids[16];
    args_ args = {L, reps, nsizes, mib};
    int rc0 = bench_ranks_fork(dir, N, pids, &in_fd, node_main_, &args);
    if (rc0 != 0)
        return rc0;
    printf("fp32 sum, %d node%s x %d rank%s (processes x threads) on "
           "loopback, best of %d\n", N, N == 1 ? "" : "s", L,
           L == 1 ? "" : "s", reps);
    printf("%10s %12s %12s %9s\n", "bucket", "flat_ms", "hier_ms",
           "flat/hier");
    FILE *in = fdopen(in_fd, "r");
    int m, last_mib = 0;
    double f, h, last_f = 0, last_h = 0;
    while (fscanf(in, "%d %lf %lf", &m, &f, &h) == 3) {
        printf("%6d MiB %12.3f %12.3f %9.2f\n", m, f * 1e3, h * 1e3, f / h);
        fflush(stdout);
        last_mib = m;
        last_f = f;
        last_h = h;
    }
    fclose(in);
    if (bench_ranks_end(pids, N, dir) != 0)
        return 1;
    if (last_mib == 0) {
        fprintf(stderr, "no figures came back from the ranks\n");
        return 1;
    }
    printf("bench=allreduce_hier nodes=%d local=%d mib=%d flat_ms=%.3f "
           "hier_ms=%.3f speedup=%.2f\n", N, L, last_mib, last_f * 1e3,
           last_h * 1e3, last_f / last_h);
    return 0;
}
