/*
 * dp_scaling.c — data-parallel training throughput on this machine: the
 * same spec (one global batch of B*grad_accum sequences per step) on 1, 2
 * and 3 CPU ranks, each rank a process with its own trainer (one OpenMP
 * thread each, --threads to change), joined by Gloo over loopback.
 *
 * Strong scaling: the global batch is fixed, so each rank computes 1/W of
 * it and the step adds one bucketed gradient all-reduce. Figures: global
 * tokens/s (rank 0's steps after --warmup, timed between barriers),
 * speed-up over one rank and per-rank efficiency (tokens/s / (W * one
 * rank's tokens/s)). Each world of 2 ranks or more runs twice: with the
 * all-reduce overlapped with the last microbatch's backward (the default)
 * and after it (trainer_set_dp_overlap 0), in buckets of --bucket-floats
 * (default 64 Ki floats, 256 KiB: smaller than a slot of the default
 * shape, so there is something to overlap); "early" is rank 0's buckets
 * of the last step whose all-reduce started before backward ended.
 * Each world of 2 ranks or more also runs as m6d --devices W runs it: the
 * ranks as threads of one process (one node), overlapped, summing over
 * Gloo ("threads flat") and through the node-local engine
 * (dist/local.h, trainer_adopt_node_groups: "threads hier"). Ends with
 * one key=value line. Exit 77 without Gloo.
 *
 *   dp_scaling [--layers L] [--embd C] [--seq T] [--batch B] [--steps N]
 *              [--warmup N] [--threads N] [--max-ranks R]
 *              [--bucket-floats N]
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "common/clock.h"
#include "dist/collectives.h"
#include "dist/local.h"
#include "train/trainer.h"
#include "../tests/common/file_store.h"
#include "../tests/common/synth_data.h"

/* How the ranks run: processes over Gloo, or threads of one process
 * over Gloo or through the node-local engine. */
enum { WAY_PROCS_, WAY_THREADS_FLAT_, WAY_THREADS_HIER_ };

static int rank_(const run_spec *spec, const char *store_dir, int rank,
                 int world, int warmup, int overlap, size_t bucket,
                 int out_fd, int hier)
{
    m6_err err = M6_ERR_NONE;
    trainer *t = trainer_create(spec, &err);
    if (!t) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    trainer_set_bucket_floats(t, bucket);
    trainer_set_dp_overlap(t, overlap);
    file_store fs;
    snprintf(fs.dir, sizeof fs.dir, "%s", store_dir);
    m6_store st = file_store_table(&fs);
    m6_coll *c = NULL;
    if (world > 1) {
        m6_coll_config cfg = {"gloo", rank, world, &st, "dp", 120000,
                              "127.0.0.1", 0};
        if (!(c = m6_coll_init(&cfg, &err)) ||
            trainer_set_collectives(t, c, &err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
        m6_local *lg = NULL;
        if (hier && (!(lg = m6_local_join(store_dir, rank, world, 120000,
                                          &err)) ||
                     trainer_adopt_node_groups(t, lg, NULL, &err) != 0)) {
            fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
    }
    double t0 = 0;
    for (long s = 0; s < spec->train.steps; s++) {
        if (s == warmup) {
            if (c && m6_coll_barrier(c, &err) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
                return 1;
            }
            t0 = clock_mono_s();
        }
        step_result r;
        if (trainer_step(t, &r, &err) != 0) {
            fprintf(stderr, "rank %d: step %ld: %s\n", rank, s + 1,
                    m6_err_msg(&err));
            return 1;
        }
    }
    if (c && m6_coll_barrier(c, &err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    double dt = clock_mono_s() - t0;
    if (rank == 0) {
        char line[128];
        long rep, early, nb;
        trainer_dp_overlap_counts(t, &rep, &early, &nb);
        int n = snprintf(line, sizeof line, "%.9f %ld %ld\n", dt, early, nb);
        if (write(out_fd, line, (size_t)n) != n)
            return 1;
    }
    trainer_free(t);
    m6_coll_destroy(c);
    return 0;
}

typedef struct {
    const run_spec *spec;
    const char *store;
    int rank, world, warmup, out_fd, hier, rc;
    size_t bucket;
} thread_rank_;

static void *thread_rank_main_(void *p)
{
    thread_rank_ *a = p;
    a->rc = rank_(a->spec, a->store, a->rank, a->world, a->warmup, 1,
                  a->bucket, a->out_fd, a->hier);
    return NULL;
}

/* W ranks as threads of this process (a child of the bench's). 0, or 1
 * when one failed. */
static int threads_world_(const run_spec *spec, const char *store, int W,
                          int warmup, size_t bucket, int out_fd, int hier)
{
    thread_rank_ a[16];
    pthread_t th[16];
    int bad = 0;
    for (int r = 0; r < W; r++) {
        a[r] = (thread_rank_){spec, store, r, W, warmup, out_fd, hier, 1,
                              bucket};
        if (pthread_create(&th[r], NULL, thread_rank_main_, &a[r]) != 0)
            _exit(1);  /* the others wait for a rank that never comes */
    }
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        bad |= a[r].rc;
    }
    return bad;
}

/* Seconds of the timed steps with W ranks run way (WAY_*), or -1; rank
 * 0's early and all buckets of its last step into early[2]. */
static double run_world_(run_spec spec, const char *data_dir, int W,
                         int warmup, int overlap, size_t bucket, long *early,
                         int way)
{
    char store[] = "/tmp/m6-dp-scaling-store-XXXXXX";
    if (!mkdtemp(store))
        return -1;
    spec.nodes.world_size = W;
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t pids[16];
    int np = way == WAY_PROCS_ ? W : 1;
    for (int r = 0; r < np; r++)
        if ((pids[r] = fork()) == 0) {
            close(pfd[0]);
            srandom((unsigned)getpid());
            _exit(way == WAY_PROCS_
                      ? rank_(&spec, store, r, W, warmup, overlap, bucket,
                              pfd[1], 0)
                      : threads_world_(&spec, store, W, warmup, bucket,
                                       pfd[1], way == WAY_THREADS_HIER_));
        }
    close(pfd[1]);
    double dt = -1;
    FILE *in = fdopen(pfd[0], "r");
    if (fscanf(in, "%lf %ld %ld", &dt, &early[0], &early[1]) != 3)
        dt = -1;
    fclose(in);
    for (int r = 0; r < np; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            dt = -1;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", store);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", store);
    (void)data_dir;
    return dt;
}

int main(int argc, char **argv)
{
    int L = 4, C = 128, T = 64, B = 12, steps = 8, warmup = 2, threads = 1;
    int max_ranks = 3;
    int bucket_floats = 64 << 10;
    const bench_opt opts[] = {
        BENCH_INT("layers", &L, 1), BENCH_INT("embd", &C, 4),
        BENCH_INT("seq", &T, 1), BENCH_INT("batch", &B, 1),
        BENCH_INT("steps", &steps, 1),
        BENCH_INT("warmup", &warmup, 0),
        BENCH_INT("threads", &threads, 1),
        BENCH_INT("max-ranks", &max_ranks, 1),
        BENCH_INT("bucket-floats", &bucket_floats, 1)};
    bench_parse(argv[0], argc, argv, opts, 9, "usage: dp_scaling [--layers L] "
                "[--embd C] [--seq T] [--batch B] [--steps N] [--warmup N] "
                "[--threads N] [--max-ranks R] [--bucket-floats N]\n");
    size_t bucket = (size_t)bucket_floats;
    if (max_ranks > 16 || C % 4 != 0) {
        fprintf(stderr, "%s: --max-ranks at most 16; --embd a multiple of 4 "
                "(4 heads)\n", argv[0]);
        return 2;
    }
    if (max_ranks > 1 && !m6_coll_available("gloo")) {
        printf("SKIP: m6 was built without Gloo\n");
        return 77;
    }
    char data[] = "/tmp/m6-dp-scaling-XXXXXX";
    if (synth_shards(data, (size_t)1 << 20) != 0)
        return 1;
    run_spec spec;
    spec_defaults(&spec);
    synth_spec_data(&spec, data);
    spec.model.n_layer = L;
    spec.model.n_embd = C;
    spec.model.n_head = 4;
    spec.model.seq_len = T;
    spec.train.batch_size = B;
    spec.train.steps = warmup + steps;
    spec.train.eval_every = 0;
    spec.train.eval_batches = 1;
    spec.device.threads = threads;
    /* the last step evaluates (trainer_step_evaluates): one batch */
    printf("dp_scaling: L=%d C=%d T=%d global batch %d, %d timed steps, "
           "%d thread(s) per rank, Gloo on loopback, buckets of %zu "
           "floats\n", L, C, T, B, steps, threads, bucket);
    printf("%6s %12s %10s %11s %14s %9s %13s %13s\n", "ranks", "tokens/s",
           "speed-up", "efficiency", "no-overlap t/s", "early",
           "threads flat", "threads hier");
    double tps1 = 0, tps[17] = {0}, seq[17] = {0}, tf[17] = {0},
           th[17] = {0};
    int bad = 0;
    for (int W = 1; W <= max_ranks; W++) {
        int b, a;
        if (spec_dp_split(&spec, W, &b, &a) != 0) {
            printf("%6d   (skipped: %d ranks do not divide batch %d)\n", W, W,
                   B);
            continue;
        }
        long early[2] = {0, 0}, e2[2];
        double dt = run_world_(spec, data, W, warmup, 1, bucket, early,
                               WAY_PROCS_);
        double ds = W > 1 ? run_world_(spec, data, W, warmup, 0, bucket, e2,
                                       WAY_PROCS_)
                          : dt;
        double df = W > 1 ? run_world_(spec, data, W, warmup, 1, bucket, e2,
                                       WAY_THREADS_FLAT_)
                          : dt;
        double dh = W > 1 ? run_world_(spec, data, W, warmup, 1, bucket, e2,
                                       WAY_THREADS_HIER_)
                          : dt;
        if (dt <= 0 || ds <= 0 || df <= 0 || dh <= 0) {
            fprintf(stderr, "%d ranks: a rank failed\n", W);
            bad = 1;
            break;
        }
        tps[W] = (double)B * T * steps / dt;
        seq[W] = (double)B * T * steps / ds;
        tf[W] = (double)B * T * steps / df;
        th[W] = (double)B * T * steps / dh;
        if (W == 1)
            tps1 = tps[W];
        char eb[32] = "-";
        if (W > 1)
            snprintf(eb, sizeof eb, "%ld/%ld", early[0], early[1]);
        printf("%6d %12.0f %10.2f %10.0f%% %14.0f %9s %13.0f %13.0f\n", W,
               tps[W], tps[W] / tps1, 100.0 * tps[W] / (W * tps1), seq[W],
               eb, tf[W], th[W]);
        fflush(stdout);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", data);
    if (bad)
        return 1;
    printf("ranks1_tok_s=%.0f ranks2_tok_s=%.0f ranks3_tok_s=%.0f "
           "eff2=%.3f eff3=%.3f ranks2_no_overlap_tok_s=%.0f "
           "ranks3_no_overlap_tok_s=%.0f ranks2_threads_flat_tok_s=%.0f "
           "ranks2_threads_hier_tok_s=%.0f ranks3_threads_flat_tok_s=%.0f "
           "ranks3_threads_hier_tok_s=%.0f bucket_floats=%zu\n", tps[1],
           tps[2], tps[3], tps1 > 0 ? tps[2] / (2 * tps1) : 0,
           tps1 > 0 ? tps[3] / (3 * tps1) : 0, seq[2], seq[3], tf[2], th[2],
           tf[3], th[3], bucket);
    return 0;
}
