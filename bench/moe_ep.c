/*
 * moe_ep.c — one expert-parallel MoE layer (train/moe_ep.h) at P = 1, 2
 * and 4 ranks on this machine: forked processes meeting over Gloo on
 * loopback, each with N tokens of its own and 1/P of the E experts.
 *
 * For each P it prints the layer's training tokens per second (forward and
 * backward of all P N tokens a step), the share of a step spent inside the
 * all-to-alls (timed by the layer itself, moe_ep_stats) apart from the
 * compute, the bytes a rank sends per step against model_ep_alltoall_bytes
 * (the rule `m6ctl plan` prints at scale: uniform routing, nothing
 * dropped), and the expert bytes a rank holds, against P = 1.
 *
 * The all-to-all time is also predicted, by the model `m6ctl plan --p2r`
 * prices it with (model_ep_alltoall_seconds: latency per call plus bytes
 * over the link) on this machine's link, measured first by the ranks
 * themselves with plain all-to-alls and no MoE (plain_alltoall_: each
 * after compute and a barrier, as in a step; the mean call): the latency
 * from calls of 4 bytes a peer, the rate from the extra time of calls of 4
 * MiB a peer. The ratio measured /
 * predicted says how well the plan's figure holds here (`m6ctl plan ...
 * --p2r --nvlink-gbps R --alltoall-latency-us L` with the printed R and L
 * gives the same prediction for a run of these shapes). Each P runs twice:
 * as the engine runs (tokens/s, and the time inside the all-to-alls, which
 * includes waiting for the rank that arrives last), then with a barrier
 * before each all-to-all timed apart (moe_ep_set_timing_barrier), whose
 * transfer time is what the prediction is compared with.
 *
 * Forced routing, last, at the largest P: rank 0's router input is
 * constant (every token the same row), so all its tokens choose the same
 * expert of each prototype; each step is timed, and the slowest rank's
 * median and worst step are printed against the uniform run's median
 * (the bound: no step over twice the median).
 *
 * usage: moe_ep [--embd C] [--experts E] [--prototypes k] [--tokens N]
 *               [--capacity F] [--steps S] [--warmup W] [--max-ranks P]
 *               [--threads T] [--forced-steps S]
 * Ends with one key=value line. Exit 1 when a rank fails, or when a rank
 * at the largest P holds more than 0.3 of the expert bytes of P = 1 (the
 * layout's promise).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_ranks.h"
#include "common/clock.h"
#include "dist/collectives.h"
#include "kernels.h"
#include "model/facts.h"
#include "train/moe_ep.h"
#include "../tests/common/file_store.h"

typedef struct {
    int C, E, k, N, steps, warmup, threads;
    double cf;
    int timing_barrier;   /* moe_ep_set_timing_barrier for this pass */
    int forced;           /* rank 0's router input constant: all its
                           * tokens choose the same expert of each
                           * prototype */
} shape_;

#define MAX_STEPS 256

/* One rank's figures, as it writes them to the pipe. */
typedef struct {
    double step_s, a2a_s, wait_s, bytes, expert_bytes;
    double link_latency_s, link_Bps;  /* the plain all-to-alls' */
    int dropped;
    double step_med_s, step_max_s;    /* of its timed steps, one by one */
} figures_;

static int cmp_double_(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per call of `reps` plain all-to-alls sending `per_peer` bytes to
 * every other rank, each as a step makes it: after GAP_S of computing
 * (the ranks' threads busy, not asleep) and a barrier, which are not
 * timed. Back to back, calls cost a fraction of that on a machine where
 * waking a thread is dear (a VM: 0.1-0.3 ms against about 1 ms here). -1
 * on an error (err set). */
#define GAP_S 2e-3
static double plain_alltoall_(m6_coll *g, int rank, int P, size_t per_peer,
                              int reps, m6_err *err)
{
    size_t sb[16], rb[16];
    for (int q = 0; q < P; q++)
        sb[q] = rb[q] = q == rank ? 0 : per_peer;
    char *s = calloc((size_t)P, per_peer ? per_peer : 1);
    char *r = calloc((size_t)P, per_peer ? per_peer : 1);
    double t = -1;
    if (s && r && m6_coll_alltoallv(g, s, sb, r, rb, err) == 0 &&
        m6_coll_barrier(g, err) == 0) {  /* one untimed: connections warm */
        double ts[64];
        int i = 0;
        reps = reps < 64 ? reps : 64;
        for (; i < reps; i++) {
            double t0 = clock_mono_s() + GAP_S;
            while (clock_mono_s() < t0)
                ;  /* compute stands in for the layer's */
            if (m6_coll_barrier(g, err) != 0)
                break;
            t0 = clock_mono_s();
            if (m6_coll_alltoallv(g, s, sb, r, rb, err) != 0)
                break;
            ts[i] = clock_mono_s() - t0;
        }
        if (i == reps) {  /* the mean: a step pays its slow calls too */
            t = 0;
            for (int j = 0; j < reps; j++)
                t += ts[j] / reps;
        }
    }
    free(s);
    free(r);
    return t;
}

static float *randn_(size_t n, unsigned seed, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p)
        return NULL;
    srandom(seed);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * ((float)random() / (float)RAND_MAX - 0.5f);
    return p;
}

static int rank_main_(int rank, int P, const char *dir, int out_fd,
                      const void *arg)
{
    const shape_ *s = arg;
    omp_set_num_threads(s->threads);
    file_store fs;
    snprintf(fs.dir, sizeof fs.dir, "%s", dir);
    m6_store st = file_store_table(&fs);
    m6_err err = M6_ERR_NONE;
    m6_coll_config cfg = {"gloo", rank, P, &st, "moe-ep", 60000,
                          "127.0.0.1", 0};
    m6_coll *g = m6_coll_init(&cfg, &err);
    int H = 4 * s->C / s->k;  /* active weights per token: the dense 4C MLP */
    moe_dims d = {s->N, s->C, s->E, s->k, H,
                  moe_capacity(s->cf, s->N, s->E, s->k), 0};
    moe_ep *m = g ? moe_ep_create(&d, g, &err) : NULL;
    if (!m) {
        fprintf(stderr, "moe_ep: rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    int first, El = moe_ep_local_experts(m, &first);
    size_t C = (size_t)s->C, N = (size_t)s->N, E = (size_t)s->E, Hz = H;
    size_t n_w1 = (size_t)El * Hz * C, n_b1 = (size_t)El * Hz;
    size_t n_w2 = (size_t)El * C * Hz, n_b2 = (size_t)El * C;
    float *x = randn_(N * C, 100u + rank, 2.0f);
    if (x && s->forced && rank == 0)  /* every token rank 0's first */
        for (size_t i = 1; i < N; i++)
            memcpy(x + i * C, x, C * sizeof(float));
    float *dout = randn_(N * C, 200u + rank, 0.02f);
    float *wg = randn_(E * C, 7u, 0.5f), *bg = randn_(E, 8u, 0.1f);
    float *w1 = randn_(n_w1, 300u + first, 0.1f);
    float *b1 = randn_(n_b1, 400u + first, 0.1f);
    float *w2 = randn_(n_w2, 500u + first, 0.1f);
    float *b2 = randn_(n_b2, 600u + first, 0.1f);
    float *out = calloc(N * C, sizeof(float)), *dx = calloc(N * C, sizeof(float));
    float *dwg = calloc(E * C, sizeof(float)), *dbg = calloc(E, sizeof(float));
    float *dw1 = calloc(n_w1 + 1, sizeof(float)), *db1 = calloc(n_b1 + 1, sizeof(float));
    float *dw2 = calloc(n_w2 + 1, sizeof(float)), *db2 = calloc(n_b2 + 1, sizeof(float));
    if (!x || !dout || !wg || !bg || !w1 || !b1 || !w2 || !b2 || !out ||
        !dx || !dwg || !dbg || !dw1 || !db1 || !dw2 || !db2) {
        fprintf(stderr, "moe_ep: rank %d: out of memory\n", rank);
        return 1;
    }
    /* the link: latency from tiny calls, the rate from 4 MiB a peer */
    double lat = 0, big = 0, bw = 0;
    const size_t big_b = (size_t)4 << 20;
    if (P > 1) {
        lat = plain_alltoall_(g, rank, P, 4, 30, &err);
        big = lat >= 0 ? plain_alltoall_(g, rank, P, big_b, 15, &err) : -1;
        if (big < 0) {
            fprintf(stderr, "moe_ep: rank %d: %s\n", rank, m6_err_msg(&err));
            return 1;
        }
        bw = (double)big_b * (P - 1) / fmax(big - lat, 1e-9);
    }
    moe_ep_set_timing_barrier(m, s->timing_barrier);
    moe_ep_stats a, b;
    double t0 = 0, ts = 0, step_t[MAX_STEPS];
    int dropped = 0;
    for (int it = 0; it < s->warmup + s->steps; it++) {
        if (it == s->warmup) {
            if (m6_coll_barrier(g, &err) != 0)
                break;
            moe_ep_get_stats(m, &a);
            t0 = clock_mono_s();
        }
        if (it > s->warmup)
            step_t[it - s->warmup - 1] = clock_mono_s() - ts;
        ts = clock_mono_s();
        float aux, z;
        int drop;
        if (moe_ep_forward(m, out, &aux, &z, &drop, x, wg, bg, w1, b1, w2,
                           b2, &err) != 0 ||
            moe_ep_backward(m, dx, dwg, dbg, dw1, db1, dw2, db2, dout, x, wg,
                            w1, w2, 0.01f, 0.001f, &err) != 0)
            break;
        if (it >= s->warmup)
            dropped += drop;
    }
    double t1 = clock_mono_s();
    step_t[s->steps - 1] = t1 - ts;
    moe_ep_get_stats(m, &b);
    qsort(step_t, (size_t)s->steps, sizeof step_t[0], cmp_double_);
    if (err.code != M6_OK) {
        fprintf(stderr, "moe_ep: rank %d: %s\n", rank, m6_err_msg(&err));
        return 1;
    }
    figures_ f = {
        (t1 - t0) / s->steps, (b.seconds - a.seconds) / s->steps,
        (b.wait_seconds - a.wait_seconds) / s->steps,
        (double)(b.bytes_sent - a.bytes_sent) / s->steps,
        (double)(n_w1 + n_b1 + n_w2 + n_b2) * sizeof(float), lat, bw,
        dropped, step_t[s->steps / 2], step_t[s->steps - 1]};
    if (write(out_fd, &f, sizeof f) != (ssize_t)sizeof f)
        return 1;
    moe_ep_free(m);
    m6_coll_destroy(g);
    return 0;
}

/* The P ranks of one configuration; their figures into f[0..P). 0, or 1
 * (a rank failed). */
static int run_(int P, const shape_ *s, figures_ *f)
{
    char dir[] = "/tmp/m6-bench-moe-ep-XXXXXX";
    int in_fd;
    pid_t pids[16];
    int rc = bench_ranks_fork(dir, P, pids, &in_fd, rank_main_, s);
    if (rc != 0)
        return rc;
    int got = 0;
    figures_ one;
    while (got < P && read(in_fd, &one, sizeof one) == (ssize_t)sizeof one)
        f[got++] = one;
    close(in_fd);
    return bench_ranks_end(pids, P, dir) || got != P;
}

static const char usage_[] =
    "usage: moe_ep [--embd C (256)] [--experts E (16)] [--prototypes k (2)]\n"
    "              [--tokens N per rank (512)] [--capacity F (2)]\n"
    "              [--steps S (5)] [--warmup W (1)] [--max-ranks P (4)]\n"
    "              [--threads T per rank (1)] [--forced-steps S (20)]\n";

int main(int argc, char **argv)
{
    shape_ s = {256, 16, 2, 512, 5, 1, 1, 2.0, 0, 0};
    int max_ranks = 4, forced_steps = 20;
    const bench_opt opts[] = {
        BENCH_INT("embd", &s.C, 2), BENCH_INT("experts", &s.E, 1),
        BENCH_INT("prototypes", &s.k, 1), BENCH_INT("tokens", &s.N, 1),
        BENCH_REAL("capacity", &s.cf, 0.01, 1e6),
        BENCH_INT("steps", &s.steps, 1), BENCH_INT("warmup", &s.warmup, 0),
        BENCH_INT("forced-steps", &forced_steps, 1),
        BENCH_INT("max-ranks", &max_ranks, 1),
        BENCH_INT("threads", &s.threads, 1)};
    bench_parse("moe_ep", argc, argv, opts, 10, usage_);
    if (s.E % s.k || (4 * s.C) % s.k || max_ranks > 16 || max_ranks > s.E ||
        s.steps > MAX_STEPS || forced_steps > MAX_STEPS) {
        fprintf(stderr, "moe_ep: --prototypes must divide --experts and "
                "4 --embd; --max-ranks at most 16 and at most --experts; "
                "--steps and --forced-steps at most %d\n", MAX_STEPS);
        return 2;
    }
    printf("moe_ep: one MoE layer, C %d, E %d in k %d prototypes, H %d, "
           "%d tokens per rank, capacity factor %.2f, %d thread(s) a rank, "
           "%d timed steps (forward + backward), Gloo on loopback\n", s.C,
           s.E, s.k, 4 * s.C / s.k, s.N, s.cf, s.threads, s.steps);
    printf("%3s %12s %10s %10s %14s %14s %7s %14s %8s %8s | %9s %9s %9s "
           "%9s %10s %7s\n", "P", "tokens/s", "step_ms", "a2a_ms",
           "sent_B/step", "predicted_B", "ratio", "expert_B/rank", "vs_P=1",
           "dropped", "link_us", "link_GB/s", "wait_ms", "xfer_ms",
           "xfer_pred_ms", "ratio");
    char kv[1280];
    int kn = 0, bad = 0;
    double expert1 = 0, worst_share = 0, uniform_med = 0;
    for (int P = 1; P <= max_ranks; P *= 2) {
        figures_ f[16], fb[16];
        shape_ sb = s;
        sb.timing_barrier = 1;
        if (run_(P, &s, f) != 0 || (P > 1 && run_(P, &sb, fb) != 0)) {
            fprintf(stderr, "moe_ep: P = %d failed\n", P);
            return 1;
        }
        double step = 0, a2a = 0, sent = 0, pred = 0, ebytes = 0;
        double lat = 0, bw = 0, xfer = 0, wait = 0;
        int dropped = 0;
        for (int r = 0; r < P; r++) {
            step = fmax(step, f[r].step_s);
            a2a += f[r].a2a_s / P;
            if (P > 1) {
                lat += fb[r].link_latency_s / P;
                bw += fb[r].link_Bps / P;
                xfer += fb[r].a2a_s / P;
                wait += fb[r].wait_s / P;
            }
            sent += f[r].bytes / P;
            pred += model_ep_alltoall_bytes(s.N, s.k, s.C, s.E, P, r,
                                            sizeof(float)) / P;
            ebytes = fmax(ebytes, f[r].expert_bytes);
            dropped += f[r].dropped;
        }
        if (P == 1)
            expert1 = ebytes;
        double share = ebytes / expert1, tok_s = (double)P * s.N / step;
        double ratio = pred > 0 ? sent / pred : 1.0;
        /* the plan's model on this link: one node of P ranks */
        double a2a_pred = P > 1 ? model_ep_alltoall_seconds(
                                      pred, MODEL_EP_ALLTOALLS, P, P, bw, bw,
                                      lat)
                                : 0;
        double tratio = a2a_pred > 0 ? xfer / a2a_pred : 1.0;
        worst_share = share;
        uniform_med = 0;
        for (int r = 0; r < P; r++)
            uniform_med = fmax(uniform_med, f[r].step_med_s);
        printf("%3d %12.0f %10.2f %10.2f %14.0f %14.0f %7.3f %14.0f %8.3f "
               "%8d | %9.1f %9.3f %9.2f %9.2f %10.2f %7.3f\n", P, tok_s,
               step * 1e3, a2a * 1e3, sent, pred, ratio, ebytes, share,
               dropped, lat * 1e6, bw / 1e9, wait * 1e3, xfer * 1e3,
               a2a_pred * 1e3, tratio);
        kn += snprintf(kv + kn, sizeof kv - (size_t)kn,
                       "%stok_s_p%d=%.0f a2a_frac_p%d=%.3f bytes_ratio_p%d=%.3f "
                       "expert_share_p%d=%.3f a2a_time_ratio_p%d=%.3f",
                       kn ? " " : "", P, tok_s, P,
                       step > 0 ? a2a / step : 0, P, ratio, P, share, P,
                       tratio);
        if (kn >= (int)sizeof kv)
            kn = (int)sizeof kv - 1;
    }
    /* forced routing at the largest P: rank 0's router input constant, so
     * its N tokens all choose one expert of each prototype (the capacity
     * keeps that expert's rows and drops the rest); each step's time, the
     * slowest rank's median and maximum over the timed steps, against
     * the uniform run's median */
    int Pf = 1;
    while (Pf * 2 <= max_ranks)
        Pf *= 2;
    shape_ sf = s;
    sf.forced = 1;
    sf.steps = forced_steps;
    figures_ ff[16];
    if (run_(Pf, &sf, ff) != 0) {
        fprintf(stderr, "moe_ep: forced routing at P = %d failed\n", Pf);
        return 1;
    }
    double fmed = 0, fmax_s = 0;
    int fdrop = 0;
    for (int r = 0; r < Pf; r++) {
        fmed = fmax(fmed, ff[r].step_med_s);
        fmax_s = fmax(fmax_s, ff[r].step_max_s);
        fdrop += ff[r].dropped;
    }
    printf("forced routing, P = %d, %d steps: rank 0's %d tokens to one "
           "expert a prototype; step median %.2f ms, max %.2f ms (max / "
           "median %.2f), the uniform run's median %.2f ms (%.2fx); %d "
           "pairs dropped\n", Pf, forced_steps, s.N, fmed * 1e3,
           fmax_s * 1e3, fmax_s / fmed, uniform_med * 1e3, fmed / uniform_med,
           fdrop);
    kn += snprintf(kv + kn, sizeof kv - (size_t)kn,
                   " forced_max_over_median_p%d=%.2f forced_vs_uniform_p%d=%.2f "
                   "forced_dropped_p%d=%d", Pf, fmax_s / fmed, Pf,
                   fmed / uniform_med, Pf, fdrop);
    if (kn >= (int)sizeof kv)
        kn = (int)sizeof kv - 1;
    if (max_ranks >= 4 && worst_share > 0.3) {
        printf("moe_ep: a rank at the largest P holds %.3f of P = 1's expert "
               "bytes (> 0.3)\n", worst_share);
        bad = 1;
    }
    printf("%s\n", kv);
    return bad;
}
