/*
 * cpu_train.c — training throughput of the CPU engine, and its MFU against
 * the machine's own BLAS peak measured in the same run.
 *
 * model FLOPs per token = 6N + 6 L C T (N = parameters of the compute path).
 * Ends with: tokens_per_s=… model_gflops=… blas_peak_gflops=… ratio=…
 */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"
#include "bench_util.h"
#include "model/gpt.h"

static void usage_(void)
{
    printf("usage: cpu_train [options]\n"
           "  --layers L    n_layer (6)        --embd C    n_embd (384)\n"
           "  --heads NH    n_head (6)         --seq T     seq_len (64)\n"
           "  --batch B     batch (4)          --vocab V   vocab (256)\n"
           "  --share S     parameter slots (L = unshared)\n"
           "  --steps N     timed steps (20)   --warmup N  untimed steps (3)\n"
           "  --threads N   OpenMP/BLAS threads (all cores)\n"
           "  --peak-n N    size of the square sgemm for the peak (2048)\n");
}

int main(int argc, char **argv)
{
    model_config c = {.vocab_size = 256, .n_layer = 6, .n_head = 6,
                      .n_embd = 384, .seq_len = 64};
    int B = 4, steps = 20, warmup = 3, threads = 0, S = 0, peak_n = 2048;
    static const struct option opts[] = {
        BENCH_SHAPE_OPTIONS,
        {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (bench_shape_option("cpu_train", o, optarg, &c, &B, &S, &steps,
                               &warmup, &peak_n))
            continue;
        switch (o) {
        case 't':
            threads = bench_int_arg("cpu_train", "threads", optarg, 1);
            break;
        case 'h': usage_(); return 0;
        default: usage_(); return 2;
        }
    }
    bench_no_operands("cpu_train", argc, argv);
    if (S <= 0)
        S = c.n_layer;
    if (bench_shape_check("cpu_train", &c, S) < 0)
        return 2;
    if (peak_n < 1) {
        fprintf(stderr, "cpu_train: --peak-n: want >= 1 (the peak is the "
                        "baseline of ratio=)\n");
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    /* The peak first, with OpenBLAS's own threads on every core (the
     * training GEMMs later run single-threaded BLAS inside OpenMP blocks). */
    openblas_set_num_threads(omp_get_max_threads());
    double peak = bench_sgemm_peak_gflops(peak_n, 3);
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
    printf("cpu_train: L=%d C=%d NH=%d T=%d B=%d V=%d S=%d threads=%d\n",
           c.n_layer, c.n_embd, c.n_head, c.seq_len, B, c.vocab_size, S,
           omp_get_max_threads());
    double t_fwd = 0, t_bwd = 0, t_opt = 0, t0 = 0;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup)
            t0 = clock_mono_s();
        double a = clock_mono_s();
        gpt_zero_grad(&g);
        gpt_forward(&g, inp, tgt, B);
        double b = clock_mono_s();
        gpt_backward(&g, inp, tgt, B, 1.0f / BT);
        double d = clock_mono_s();
        float norm = gpt_grad_norm(&g);
        gpt_adamw(&g, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, norm > 1 ? 1 / norm : 1);
        double e = clock_mono_s();
        if (i >= warmup) {
            t_fwd += b - a;
            t_bwd += d - b;
            t_opt += e - d;
        }
    }
    double dt = clock_mono_s() - t0;
    double tok_s = (double)BT * steps / dt;
    double n_params = (double)gpt_compute_params(&g);
    double flops_tok = 6.0 * n_params + 6.0 * c.n_layer * (double)c.n_embd * c.seq_len;
    double model_gflops = flops_tok * tok_s / 1e9;
    printf("params (compute path) %.2fM, %.1f MFLOP/token\n", n_params / 1e6,
           flops_tok / 1e6);
    printf("step %.2f ms: forward %.2f, backward %.2f, optimizer %.2f\n",
           dt / steps * 1e3, t_fwd / steps * 1e3, t_bwd / steps * 1e3,
           t_opt / steps * 1e3);
    printf("training: %.0f tokens/s, %.2f model GFLOP/s\n", tok_s, model_gflops);
    printf("BLAS peak: %.2f GFLOP/s (sgemm %dx%dx%d, best of 3)\n", peak,
           peak_n, peak_n, peak_n);
    printf("tokens_per_s=%.0f model_gflops=%.2f blas_peak_gflops=%.2f ratio=%.3f\n",
           tok_s, model_gflops, peak, model_gflops / peak);
    gpt_free(&g);
    free(inp);
    free(tgt);
    return 0;
}
