/*
 * allreduce.c — Gloo all-reduce (fp32 sum, daemon/dist/collectives.h) on
 * loopback: R ranks (default 2) as processes on this machine, buffers of
 * 1 MiB to 256 MiB (doubling), best of --reps timed calls after one warm-up.
 *
 * Figures per size: time, algorithm bandwidth (bytes / time) and bus
 * bandwidth (algbw * 2(R-1)/R: the bytes each rank sends and receives in
 * a ring all-reduce, the figure nccl-tests reports, comparable across R).
 * Ends with one key=value line. Exit 77 without Gloo.
 *
 *   allreduce [--ranks R] [--min-mib A] [--max-mib B] [--reps N]
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_ranks.h"
#include "common/clock.h"
#include "dist/collectives.h"
#include "../tests/common/file_store.h"

typedef struct { int min_mib, max_mib, reps; } args_;

static int rank_main_(int rank, int R, const char *dir, int out_fd,
                      const void *arg)
{
    const args_ *a = arg;
    int min_mib = a->min_mib, max_mib = a->max_mib, reps = a->reps;
    file_store fs;
    snprintf(fs.dir, sizeof fs.dir, "%s", dir);
    m6_store st = file_store_table(&fs);
    m6_err err = M6_ERR_NONE;
    m6_coll_config cfg = {"gloo", rank, R, &st, "bench", 60000, "127.0.0.1",
                          0};
    m6_coll *c = m6_coll_init(&cfg, &err);
    if (!c) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    size_t max_n = (size_t)max_mib << 18;  /* floats */
    float *x = malloc(max_n * sizeof(float));
    if (!x) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        return 1;
    }
    for (size_t i = 0; i < max_n; i++)
        x[i] = (float)(i % 13);
    FILE *out = rank == 0 ? fdopen(out_fd, "w") : NULL;
    for (int mib = min_mib; mib <= max_mib; mib *= 2) {
        size_t n = (size_t)mib << 18;
        double best = 1e30;
        for (int r = 0; r <= reps; r++) {
            if (m6_coll_barrier(c, &err) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
                return 1;
            }
            double t0 = clock_mono_s();
            if (m6_coll_allreduce_sum(c, x, n, &err) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
                return 1;
            }
            double dt = clock_mono_s() - t0;
            if (r > 0 && dt < best)  /* the first warms up */
                best = dt;
        }
        if (out)
            fprintf(out, "%d %.9f\n", mib, best);
    }
    if (out)
        fclose(out);
    m6_coll_destroy(c);
    free(x);
    return 0;
}

int main(int argc, char **argv)
{
    int R = 2, min_mib = 1, max_mib = 256, reps = 3;
    const bench_opt opts[] = {
        BENCH_INT("ranks", &R, 2), BENCH_INT("min-mib", &min_mib, 1),
        BENCH_INT("max-mib", &max_mib, 1), BENCH_INT("reps", &reps, 1)};
    bench_parse(argv[0], argc, argv, opts, 4, "usage: allreduce [--ranks R] "
                "[--min-mib A] [--max-mib B] [--reps N]\n");
    if (R > 16 || max_mib < min_mib || max_mib > 4096) {
        fprintf(stderr, "%s: --ranks at most 16, --min-mib <= --max-mib <= "
                "4096\n", argv[0]);
        return 2;
    }
    char dir[] = "/tmp/m6-bench-allreduce-XXXXXX";
    int in_fd;
    pid_t pids[16];
    args_ args = {min_mib, max_mib, reps};
    int rc0 = bench_ranks_fork(dir, R, pids, &in_fd, rank_main_, &args);
    if (rc0 != 0)
        return rc0;
    printf("Gloo all-reduce (fp32 sum) on loopback, %d ranks, best of %d\n",
           R, reps);
    printf("%10s %12s %12s %12s\n", "size", "time_ms", "algbw_GB/s",
           "busbw_GB/s");
    FILE *in = fdopen(in_fd, "r");
    int mib;
    double dt, last_alg = 0, last_bus = 0, peak_bus = 0;
    int last_mib = 0;
    while (fscanf(in, "%d %lf", &mib, &dt) == 2) {
        double bytes = (double)mib * 1048576.0;
        double alg = bytes / dt / 1e9, bus = alg * 2.0 * (R - 1) / R;
        printf("%7d MiB %12.3f %12.3f %12.3f\n", mib, dt * 1e3, alg, bus);
        fflush(stdout);
        last_alg = alg;
        last_bus = bus;
        last_mib = mib;
        if (bus > peak_bus)
            peak_bus = bus;
    }
    fclose(in);
    if (bench_ranks_end(pids, R, dir) != 0)
        return 1;
    if (last_mib == 0) {
        fprintf(stderr, "no figures came back from the ranks\n");
        return 1;
    }
    printf("backend=gloo ranks=%d max_mib=%d algbw_gbps=%.3f busbw_gbps=%.3f "
           "peak_busbw_gbps=%.3f\n", R, last_mib, last_alg, last_bus,
           peak_bus);
    return 0;
}
