/*
 * cpu_train.c — training throughput of the CPU engine, and its MFU against
 * the GEMM library's own peak (oneDNN's square sgemm on all the threads)
 * measured in the same run.
 *
 * model FLOPs per token: model_flops_per_token (model/facts.h, 6N + 12LCT),
 * printed as flops_per_token=… before the rounds.
 * The run is cut in --rounds rounds, each an sgemm peak measurement and then
 * --steps training steps, and the ratio is taken per round: on a shared or
 * virtual machine the speed of both drifts by 10-20% over seconds, and a
 * peak measured once, before all the steps, made the ratio swing with it.
 * Ends with: tokens_per_s=… model_gflops=… gemm_peak_gflops=… ratio=…
 * ratio_min=… ratio_max=… rounds=… gemm=… gemm_version=… gemm_isa=…
 * precision=… gemm_bf16=… gemm_peak_precision=…
 * (ratio, the peak and model_gflops: medians over the rounds; tokens_per_s:
 * over all timed steps; gemm*: what the engine's GEMMs ran on,
 * gemm_describe in kernels.h; precision: of the engine's GEMMs,
 * --precision; gemm_bf16: native or emulated bf16 instructions). The peak
 * is oneDNN's own square GEMM in the run's precision: sgemm for fp32, its
 * matmul on bf16 inputs for bf16 (bench_util.h), so a bf16 run is held to
 * the bf16 peak; where oneDNN has no bf16 matmul the fp32 peak stands in
 * (gemm_peak_precision= says which).
 */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"
#include "bench_util.h"
#include "kernels.h"
#include "model/facts.h"
#include "model/gpt.h"

static void usage_(void)
{
    printf("usage: cpu_train [options]\n"
           "  --layers L    n_layer (6)        --embd C    n_embd (384)\n"
           "  --heads NH    n_head (6)         --seq T     seq_len (64)\n"
           "  --batch B     batch (4)          --vocab V   vocab (256)\n"
           "  --share S     parameter slots (L = unshared)\n"
           "  --steps N     timed steps a round (20)\n"
           "  --warmup N    untimed steps (3)  --rounds R  rounds (5)\n"
           "  --threads N   OpenMP threads (all cores)\n"
           "  --peak-n N    size of the square sgemm for the peak (2048)\n"
           "  --precision P fp32 or bf16: the GEMMs' inputs (fp32)\n");
}

enum { MAX_ROUNDS = 1000 };

/* One training step; with t, adds its forward, backward and optimizer
 * seconds to t[0..2]. */
static void step_(gpt_model *g, const int32_t *inp, const int32_t *tgt,
                  int B, double *t)
{
    int BT = B * g->T;
    double a = clock_mono_s();
    gpt_zero_grad(g);
    gpt_forward(g, inp, tgt, B);
    double b = clock_mono_s();
    gpt_backward(g, inp, tgt, B, 1.0f / BT);
    double d = clock_mono_s();
    float norm = gpt_grad_norm(g);
    gpt_adamw(g, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, norm > 1 ? 1 / norm : 1);
    double e = clock_mono_s();
    if (t) {
        t[0] += b - a;
        t[1] += d - b;
        t[2] += e - d;
    }
}

static int cmp_double_(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of v[0..n) (n <= MAX_ROUNDS; v unchanged) */
static double median_(const double *v, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double_);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double min_(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static double max_(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

int main(int argc, char **argv)
{
    model_config c = {.vocab_size = 256, .n_layer = 6, .n_head = 6,
                      .n_embd = 384, .seq_len = 64};
    int B = 4, steps = 20, warmup = 3, threads = 0, S = 0, peak_n = 2048;
    int rounds = 5;
    gemm_precision prec = GEMM_FP32;
    static const struct option opts[] = {
        BENCH_SHAPE_OPTIONS,
        {"threads", 1, 0, 't'}, {"rounds", 1, 0, 'r'}, {"help", 0, 0, 'h'},
        {"precision", 1, 0, 'P'},
        {0, 0, 0, 0}};
    int o;
    while ((o = bench_next_option("cpu_train", argc, argv, opts, &c, &B, &S,
                                  &steps, &warmup, &peak_n)) != -1) {
        switch (o) {
        case 't':
            threads = bench_int_arg("cpu_train", "threads", optarg, 1);
            break;
        case 'r':
            rounds = bench_int_arg("cpu_train", "rounds", optarg, 1);
            if (rounds > MAX_ROUNDS) {
                fprintf(stderr, "cpu_train: --rounds: at most %d, got %d\n",
                        MAX_ROUNDS, rounds);
                return 2;
            }
            break;
        case 'P':
            prec = bench_choice_arg("cpu_train", "precision", optarg,
                                    gemm_precision_name(GEMM_FP32),
                                    gemm_precision_name(GEMM_BF16))
                       ? GEMM_BF16 : GEMM_FP32;
            break;
        default: bench_usage_exit(o, usage_);
        }
    }
    if (bench_shape_done("cpu_train", argc, argv, &c, &S) < 0)
        return 2;
    if (peak_n < 1) {
        fprintf(stderr, "cpu_train: --peak-n: want >= 1 (the peak is the "
                        "baseline of ratio=)\n");
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    char why[512];
    if (gemm_ready(prec, why, sizeof why) != 0) {  /* wrong has no speed */
        fprintf(stderr, "cpu_train: %s\n", why);
        return 1;
    }
    gemm_set_precision(prec);
    gpt_model g;
    if (gpt_create(&g, &c, S, B) != 0) {
        perror("cpu_train: gpt_create");
        return 1;
    }
    gpt_init_weights(&g, 1);
    int BT = B * c.seq_len;
    int32_t *inp = malloc(BT * sizeof(int32_t)), *tgt = malloc(BT * sizeof(int32_t));
    uint64_t s = 1;
    for (int i = 0; i < BT; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        inp[i] = (int32_t)((s >> 33) % (uint64_t)c.vocab_size);
        tgt[i] = (int32_t)((s >> 17) % (uint64_t)c.vocab_size);
    }
    printf("cpu_train: L=%d C=%d NH=%d T=%d B=%d V=%d S=%d threads=%d "
           "precision=%s\n", c.n_layer, c.n_embd, c.n_head, c.seq_len, B,
           c.vocab_size, S, omp_get_max_threads(), gemm_precision_name(prec));
    double n_params = model_active_params(&c);
    double flops_tok = model_flops_per_token(&c);
    printf("params (per token) %.2fM, %.1f MFLOP/token\n", n_params / 1e6,
           flops_tok / 1e6);
    printf("flops_per_token=%.0f\n", flops_tok);
    for (int i = 0; i < warmup; i++)
        step_(&g, inp, tgt, B, NULL);
    double peak[MAX_ROUNDS], gflops[MAX_ROUNDS], ratio[MAX_ROUNDS];
    /* the bf16 peak where oneDNN has a bf16 matmul (a tiny probe) */
    int peak_bf16 = prec == GEMM_BF16 && bench_gemm_peak_bf16_gflops(16, 1) > 0;
    double t[3] = {0, 0, 0}, dt = 0;
    for (int r = 0; r < rounds; r++) {
        /* the peak on every thread; the training GEMMs run one a thread,
         * inside the kernels' OpenMP blocks */
        peak[r] = peak_bf16 ? bench_gemm_peak_bf16_gflops(peak_n, 2)
                            : bench_gemm_peak_gflops(peak_n, 2);
        double t0 = clock_mono_s();
        for (int i = 0; i < steps; i++)
            step_(&g, inp, tgt, B, t);
        double d = clock_mono_s() - t0;
        dt += d;
        gflops[r] = flops_tok * (double)BT * steps / d / 1e9;
        ratio[r] = gflops[r] / peak[r];
        printf("round %d: %.0f tokens/s, %.2f model GFLOP/s, peak %.2f, "
               "ratio %.3f\n", r + 1, (double)BT * steps / d, gflops[r],
               peak[r], ratio[r]);
    }
    int n = steps * rounds;
    double tok_s = (double)BT * n / dt;
    printf("step %.2f ms: forward %.2f, backward %.2f, optimizer %.2f\n",
           dt / n * 1e3, t[0] / n * 1e3, t[1] / n * 1e3, t[2] / n * 1e3);
    printf("training: %.0f tokens/s over %d rounds of %d steps\n", tok_s,
           rounds, steps);
    gemm_info gi;
    gemm_describe(&gi);
    printf("GEMM peak: %s %s %s %dx%dx%d (isa %s), best of 2 before "
           "each round\n", gi.library, gi.version,
           peak_bf16 ? "bf16 matmul" : "sgemm", peak_n, peak_n, peak_n,
           gi.isa);
    printf("tokens_per_s=%.0f model_gflops=%.2f gemm_peak_gflops=%.2f "
           "ratio=%.3f ratio_min=%.3f ratio_max=%.3f rounds=%d gemm=%s "
           "gemm_version=%s gemm_isa=%s precision=%s gemm_bf16=%s "
           "gemm_peak_precision=%s\n",
           tok_s, median_(gflops, rounds), median_(peak, rounds),
           median_(ratio, rounds), min_(ratio, rounds), max_(ratio, rounds),
           rounds, gi.library, gi.version, gi.isa, gemm_precision_name(prec),
           gi.bf16_native ? "native" : "emulated",
           peak_bf16 ? "bf16" : "fp32");
    gpt_free(&g);
    free(inp);
    free(tgt);
    return 0;
}
