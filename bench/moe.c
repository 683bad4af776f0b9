/*
 * moe.c — throughput of the MoE feed-forward (expert prototyping, M6-T) on
 * the CPU, against the dense GELU MLP at equal active parameters per token,
 * measured in the same run.
 *
 * Each configuration runs one feed-forward layer, forward and backward
 * (kernels.h: moe_route, moe_forward, moe_aux_losses, moe_backward; the
 * dense MLP is matmul + GELU + matmul), on N = B*T tokens of width C. The
 * MoE's expert hidden size is H = 4C/k, so the k experts a token uses hold
 * as many weights as the dense MLP's 8C^2: the same active parameters.
 *
 * model FLOPs per token = 6 * (active weights + C*E of the gate): 2 for the
 * forward GEMMs, 4 for the backward (Kaplan et al. 2020's 6N), not counting
 * dropped pairs. tokens/s counts every token, dropped or not.
 * Ends with one line: E1_k1_tok_s=... E8_k2_ratio=... dense_tok_s=...
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_args.h"
#include "common/clock.h"
#include "kernels.h"

static float *alloc_(size_t n, float scale, uint64_t *rng)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "moe: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = scale * ((float)((*rng >> 40) * (1.0 / 16777216.0)) - 0.5f);
    }
    return p;
}

typedef struct {
    double tok_s, gflops, dropped_frac;
} result;

/* The dense MLP: fc (4C,C), GELU, proj (C,4C), forward and backward. */
static result run_dense_(int N, int C, int steps, int warmup)
{
    uint64_t rng = 1;
    int H = 4 * C;
    float *x = alloc_((size_t)N * C, 2, &rng), *w1 = alloc_((size_t)H * C, 0.1f, &rng);
    float *b1 = alloc_(H, 0.1f, &rng), *w2 = alloc_((size_t)C * H, 0.1f, &rng);
    float *b2 = alloc_(C, 0.1f, &rng), *h = alloc_((size_t)N * H, 0, &rng);
    float *ha = alloc_((size_t)N * H, 0, &rng), *y = alloc_((size_t)N * C, 0, &rng);
    float *dy = alloc_((size_t)N * C, 1, &rng), *dha = alloc_((size_t)N * H, 0, &rng);
    float *dh = alloc_((size_t)N * H, 0, &rng), *dx = alloc_((size_t)N * C, 0, &rng);
    float *dw1 = alloc_((size_t)H * C, 0, &rng), *db1 = alloc_(H, 0, &rng);
    float *dw2 = alloc_((size_t)C * H, 0, &rng), *db2 = alloc_(C, 0, &rng);
    double t0 = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) t0 = clock_mono_s();
        matmul_forward(h, x, w1, b1, N, C, H);
        gelu_forward(ha, h, (size_t)N * H);
        matmul_forward(y, ha, w2, b2, N, H, C);
        memset(dha, 0, (size_t)N * H * sizeof *dha);
        memset(dh, 0, (size_t)N * H * sizeof *dh);
        matmul_backward(dha, dw2, db2, dy, ha, w2, N, H, C);
        gelu_backward(dh, h, dha, (size_t)N * H);
        matmul_backward(dx, dw1, db1, dh, x, w1, N, C, H);
    }
    double dt = clock_mono_s() - t0;
    result r = {(double)N * steps / dt, 6.0 * 2.0 * C * H * N * steps / dt / 1e9, 0};
    float *all[] = {x, w1, b1, w2, b2, h, ha, y, dy, dha, dh, dx, dw1, db1, dw2, db2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    return r;
}

static result run_moe_(int N, int C, int E, int k, double cf, int steps,
                       int warmup)
{
    uint64_t rng = 2;
    int H = 4 * C / k;
    moe_dims d = {N, C, E, k, H, moe_capacity(cf, N, E, k), 0};
    size_t NK = (size_t)N * k;
    float *x = alloc_((size_t)N * C, 2, &rng), *wg = alloc_((size_t)E * C, 0.5f, &rng);
    float *bg = alloc_(E, 0, &rng), *w1 = alloc_((size_t)E * H * C, 0.1f, &rng);
    float *b1 = alloc_((size_t)E * H, 0.1f, &rng), *w2 = alloc_((size_t)E * C * H, 0.1f, &rng);
    float *b2 = alloc_((size_t)E * C, 0.1f, &rng);
    float *probs = alloc_((size_t)N * E, 0, &rng), *lse = alloc_(NK, 0, &rng);
    int32_t *ints = calloc(4 * NK + 3 * (size_t)E + 1, sizeof *ints);
    if (!ints) exit(1);
    int32_t *expert = ints, *slot = ints + NK, *row_token = ints + 2 * NK;
    int32_t *counts = ints + 3 * NK, *routed = counts + E, *offset = routed + E;
    float *xe = alloc_(NK * C, 0, &rng), *hpre = alloc_(NK * H, 0, &rng);
    float *hact = alloc_(NK * H, 0, &rng), *ye = alloc_(NK * C, 0, &rng);
    float *out = alloc_((size_t)N * C, 0, &rng), *dout = alloc_((size_t)N * C, 1, &rng);
    float *dx = alloc_((size_t)N * C, 0, &rng), *dwg = alloc_((size_t)E * C, 0, &rng);
    float *dbg = alloc_(E, 0, &rng), *dw1 = alloc_((size_t)E * H * C, 0, &rng);
    float *db1 = alloc_((size_t)E * H, 0, &rng), *dw2 = alloc_((size_t)E * C * H, 0, &rng);
    float *db2 = alloc_((size_t)E * C, 0, &rng);
    float *dye = alloc_(NK * C, 0, &rng), *dh1 = alloc_(NK * H, 0, &rng);
    float *dh2 = alloc_(NK * H, 0, &rng), *dxe = alloc_(NK * C, 0, &rng);
    float *dl = alloc_((size_t)N * E, 0, &rng);
    double t0 = 0;
    long dropped = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) t0 = clock_mono_s(), dropped = 0;
        dropped += moe_route(probs, lse, expert, slot, counts, routed, offset,
                             row_token, x, wg, bg, &d);
        moe_forward(out, xe, hpre, hact, ye, x, probs, expert, slot, offset,
                    row_token, w1, b1, w2, b2, &d);
        float aux, z;
        moe_aux_losses(&aux, &z, probs, lse, routed, &d);
        moe_backward(dx, dwg, dbg, dw1, db1, dw2, db2, dye, dh1, dh2, dxe, dl,
                     dout, x, probs, lse, expert, slot, routed, offset, xe,
                     hpre, hact, ye, wg, w1, w2, 0.01f, 0.001f, &d);
    }
    double dt = clock_mono_s() - t0;
    if (E == 1 && cf >= 1.0) {
        /* one expert takes every token with probability 1: the layer is
         * the dense MLP on the same weights (a check that the benchmark
         * times the real op; exit 1 if not) */
        float *hd = alloc_((size_t)N * H, 0, &rng), *yd = alloc_((size_t)N * C, 0, &rng);
        matmul_forward(hd, x, w1, b1, N, C, H);
        gelu_forward(hd, hd, (size_t)N * H);
        matmul_forward(yd, hd, w2, b2, N, H, C);
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)N * C; i++) {
            num += ((double)out[i] - yd[i]) * ((double)out[i] - yd[i]);
            den += (double)yd[i] * yd[i];
        }
        if (!(sqrt(num / den) < 1e-5)) {
            fprintf(stderr, "moe: E 1 differs from the dense MLP on the same "
                    "weights: relative L2 %.3e\n", sqrt(num / den));
            exit(1);
        }
        free(hd), free(yd);
    }
    double active = (double)k * 2.0 * C * H + (double)C * E;
    result r = {(double)N * steps / dt, 6.0 * active * N * steps / dt / 1e9,
                (double)dropped / ((double)NK * steps)};
    float *all[] = {x, wg, bg, w1, b1, w2, b2, probs, lse, xe, hpre, hact, ye,
                    out, dout, dx, dwg, dbg, dw1, db1, dw2, db2, dye, dh1, dh2,
                    dxe, dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(ints);
    return r;
}

static const char usage_[] =
    "usage: moe [options]\n"
    "  --embd C       width (256)           --tokens N  tokens (B*T) per step (1024)\n"
    "  --capacity F   capacity factor (1.25)\n"
    "  --steps N      timed steps (5)       --warmup N  untimed steps (1)\n"
    "  --threads N    OpenMP threads (all cores)\n";

int main(int argc, char **argv)
{
    int C = 256, N = 1024, steps = 5, warmup = 1, threads = 0;
    double cf = 1.25;
    const bench_opt opts[] = {
        BENCH_INT("embd", &C, 2), BENCH_INT("tokens", &N, 1),
        BENCH_REAL("capacity", &cf, 0.01, 1e6),
        BENCH_INT("steps", &steps, 1),
        BENCH_INT("warmup", &warmup, 0),
        BENCH_INT("threads", &threads, 1)};
    bench_parse("moe", argc, argv, opts, 6, usage_);
    if (C % 2) {
        fprintf(stderr, "moe: --embd: want an even C (k = 2 halves 4C)\n");
        return 2;
    }
    if (threads) omp_set_num_threads(threads);
    printf("moe: C %d, %d tokens per step, capacity factor %.2f, %d threads, "
           "%d timed steps\n", C, N, cf, omp_get_max_threads(), steps);
    printf("active weights per token: 8C^2 = %.2f M (H = 4C/k)\n",
           8.0 * C * C / 1e6);
    result dense = run_dense_(N, C, steps, warmup);
    printf("%-12s %12s %10s %9s %9s\n", "config", "tokens/s", "GFLOP/s",
           "vs dense", "dropped");
    printf("%-12s %12.0f %10.2f %9.2f %9s\n", "dense 4C", dense.tok_s,
           dense.gflops, 1.0, "-");
    static const int Es[] = {1, 8, 32}, ks[] = {1, 2};
    char kv[1024];
    int kn = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            int E = Es[i], k = ks[j];
            if (E % k) continue; /* E = 1, k = 2: no such layer */
            result r = run_moe_(N, C, E, k, cf, steps, warmup);
            char name[32];
            snprintf(name, sizeof name, "E %d, k %d", E, k);
            printf("%-12s %12.0f %10.2f %9.2f %8.1f%%\n", name, r.tok_s,
                   r.gflops, r.tok_s / dense.tok_s, 100 * r.dropped_frac);
            kn += snprintf(kv + kn, sizeof kv - kn,
                           "E%d_k%d_tok_s=%.0f E%d_k%d_ratio=%.3f ", E, k,
                           r.tok_s, E, k, r.tok_s / dense.tok_s);
        }
    printf("%sdense_tok_s=%.0f dense_gflops=%.2f\n", kv, dense.tok_s,
           dense.gflops);
    return 0;
}
