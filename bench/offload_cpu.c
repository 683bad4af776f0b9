/*
 * offload_cpu.c — what granular offloading costs on the CPU build: training
 * tokens/s fully resident vs with most slots offloaded, in the same process
 * on the same data, and the copy thread's GB/s against a plain memcpy of
 * the same size. Not a test: it prints figures.
 *
 * Ends with: resident_tok_s=… offloaded_tok_s=… ratio=… h2d_gbps=…
 *            d2h_gbps=… memcpy_gbps=… hidden=…
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_util.h"
#include "offload/offload.h"
#include "client/corpus/corpus.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../tests/common/err_into.h"

#define P_ "offload_cpu" /* program name in messages */

/* The trainer's error err on stderr, then exit 1. */
static void die_(const char *err)
{
    fprintf(stderr, P_ ": %s\n", err);
    exit(1);
}

static double run_(const run_spec *s, int steps, offload_stats *st)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t)
        die_(err);
    step_result r;
    if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0) /* warm-up */
        die_(err);
    double t0 = clock_mono_s();
    for (int i = 0; i < steps; i++)
        if (ERR_INTO(err, trainer_step(t, &r, &err_)) != 0)
            die_(err);
    double dt = clock_mono_s() - t0;
    trainer_offload_stats(t, st);
    trainer_free(t);
    return (double)steps * s->train.batch_size * s->train.grad_accum *
           s->model.seq_len / dt;
}

static double memcpy_gbps_(size_t bytes, int reps)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_mono_s();
        memcpy(b, a, bytes);
        double dt = clock_mono_s() - t0;
        if (dt > 0 && bytes / dt / 1e9 > best)
            best = bytes / dt / 1e9;
    }
    free(a);
    free(b);
    return best;
}

/* The resident run, then the offloaded one (resident slots kept on the
 * device), on shards written into dir. 0, or 1 after saying why. */
static int bench_(const run_spec *sp, int resident, int steps,
                  const char *dir)
{
    run_spec s = *sp;
    char path[700], err[256];
    size_t n = 200000;
    uint16_t *tok = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint16_t)("offloading granular slots "[i % 26]);
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    int bad = shard_write(path, tok, n, err, sizeof err) != 0;
    snprintf(path, sizeof path, "%s/val_000000.bin", dir);
    bad = bad || shard_write(path, tok, n / 4, err, sizeof err) != 0;
    free(tok);
    if (bad) {
        fprintf(stderr, P_ ": %s\n", err);
        return 1;
    }
    snprintf(s.data.train, sizeof s.data.train, "%s/train_*.bin", dir);
    snprintf(s.data.val, sizeof s.data.val, "%s/val_*.bin", dir);

    offload_plan p;
    if (offload_plan_for_spec(&s, 0, &p, err, sizeof err) != 0) {
        fprintf(stderr, P_ ": %s\n", err);
        return 1;
    }
    run_spec off = s;
    off.device.memory_budget = p.min_budget_bytes +
                               (size_t)resident * p.slot_bytes;
    offload_plan_free(&p);
    if (offload_plan_for_spec(&off, 0, &p, err, sizeof err) != 0) {
        fprintf(stderr, P_ ": %s\n", err);
        return 1;
    }
    offload_plan_print(stdout, &p, 0);

    offload_stats rs, os;
    double tr = run_(&s, steps, &rs);
    double to = run_(&off, steps, &os);
    double mc = memcpy_gbps_(p.staging_bytes / 2, 50);
    offload_plan_free(&p);
    printf("resident  %.0f tokens/s\n", tr);
    printf("offloaded %.0f tokens/s (%d of %d slots offloaded, %d staging)\n",
           to, os.n_offloaded, os.n_slots, os.n_staging);
    printf("copies: h2d %.2f GB/s, d2h %.2f GB/s (memcpy of one slot %.2f "
           "GB/s); %.0f%% of copy time hidden; host AdamW %.3f s\n",
           os.h2d_gbps, os.d2h_gbps, mc, 100 * os.hidden_fraction, os.adam_s);
    printf("device peak %zu of budget %zu bytes; host pinned %zu bytes\n",
           os.device.peak, os.budget_bytes, os.host.pinned);
    printf("resident_tok_s=%.0f offloaded_tok_s=%.0f ratio=%.3f h2d_gbps=%.2f "
           "d2h_gbps=%.2f memcpy_gbps=%.2f hidden=%.3f\n",
           tr, to, to / tr, os.h2d_gbps, os.d2h_gbps, mc,
           os.hidden_fraction);
    return 0;
}

int main(int argc, char **argv)
{
    run_spec s;
    spec_defaults(&s);
    s.model = (model_config){.vocab_size = 256, .n_layer = 8, .n_head = 4,
                             .n_embd = 256, .seq_len = 64};
    s.train.batch_size = 4;
    s.train.grad_accum = 1;
    s.train.eval_every = 0;
    s.train.steps = 100000;
    int steps = 10, resident = 2;
    const bench_opt opts[] = {
        BENCH_INT("layers", &s.model.n_layer, 1),
        BENCH_INT("embd", &s.model.n_embd, 1),
        BENCH_INT("seq", &s.model.seq_len, 1),
        BENCH_INT("batch", &s.train.batch_size, 1),
        BENCH_INT("steps", &steps, 1),
        BENCH_INT("resident", &resident, 0),
        BENCH_INT("prefetch", &s.offload.prefetch, 1),
        BENCH_INT("threads", &s.device.threads, 1)};
    bench_parse(P_, argc, argv, opts, 8, "usage: offload_cpu [--layers L] "
                "[--embd C] [--seq T] [--batch B] [--steps N] [--resident R] "
                "[--prefetch P] [--threads N]\n");
    if (bench_shape_check(P_, &s.model, s.model.n_layer) < 0)
        return 2;
    if (resident >= s.model.n_layer) {
        fprintf(stderr, P_ ": --resident %d: must be below --layers (%d); "
                "the benchmark offloads the other slots\n", resident,
                s.model.n_layer);
        return 2;
    }

    /* the shards in a directory of its own under $TMPDIR, removed at exit */
    const char *tmp = getenv("TMPDIR");
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/m6-bench-offload-XXXXXX",
             tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror(P_ ": mkdtemp");
        return 1;
    }
    int rc = bench_(&s, resident, steps, dir);
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/val_000000.bin", dir);
    unlink(path);
    rmdir(dir);
    return rc;
}
