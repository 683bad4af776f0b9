/*
 * gpu_train.cu — training throughput of the GPU model (gpt_cuda) and its MFU,
 * against the H100/H200 dense bf16 peak (989 TFLOP/s) and against a cuBLASLt
 * bf16 GEMM peak measured in the same run, on pseudo-random inputs (a GEMM
 * on zeros draws less power, runs faster and would inflate mfu_vs_gemm).
 *
 * model FLOPs per token: model_flops_per_token (model/facts.h, 6N + 12LCT).
 * Random tokens (throughput does not depend on the data). Each step: zero
 * grads, `accum` microbatches of forward + backward, AdamW with clipping.
 * Before the model, one layer's attention forward + backward alone at the
 * model's shape on each path: the flash kernels on the tensor cores
 * (attention_tc_*, what the model uses where the head size allows), the
 * flash kernels on the CUDA cores (attention_core_*) and the cuBLASLt path
 * (attention_gemm_*, the model's previous path).
 * Exit 77 without a CUDA device. Ends with one line:
 *   tokens_per_s=… ms_per_step=… mfu=… mfu_vs_gemm=… gemm_tflops=… loss=…
 *   att_ms_flash=… att_ms_gemm=… att_speedup=… att_ms_tc=… att_tc_speedup=…
 * (att_ms_flash: the CUDA-core flash kernels; att_speedup = flash / gemm;
 * att_tc_speedup = the previous path (gemm where offered, else the
 * CUDA-core kernels) / tc.)
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_args.h"
#include "common/clock.h"
#include "cuda_check.h"
#include "model/cuda/gpt_cuda.h"
#include "model/facts.h"
#include "kernels_cuda.h"

#define PEAK_BF16_TFLOPS 989.0 /* H100/H200 SXM dense bf16 */

/* x[i] (n) = a pseudo-random bf16, uniform in [-1, 1): splitmix64 of
 * seed + i, so the values depend on (seed, i) only, not on the launch. */
__global__ void fill_random_bf16_kernel(bf16 *x, size_t n, uint64_t seed)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = __float2bfloat16_rn((float)(z >> 40) * (2.0f / 16777216.0f) -
                               1.0f);
}

/* Fill x (n bf16, device) as fill_random_bf16_kernel, then check its first
 * values on the host against the uniform distribution on [-1, 1) (mean 0,
 * standard deviation 1/sqrt(3)): a fill that left zeros or constants
 * would inflate the GEMM peak (zeros draw less power). Exits 1 if not. */
static void fill_random_(bf16 *x, size_t n, uint64_t seed)
{
    const unsigned bs = 256;
    fill_random_bf16_kernel<<<(unsigned)((n + bs - 1) / bs), bs>>>(x, n,
                                                                    seed);
    CUDA_CHECK_LAUNCH();
    size_t m = n < 4096 ? n : 4096;
    bf16 *h = (bf16 *)malloc(m * sizeof(bf16));
    CUDA_CHECK(cudaMemcpy(h, x, m * sizeof(bf16), cudaMemcpyDeviceToHost));
    double s = 0, s2 = 0;
    int bad = 0;
    for (size_t i = 0; i < m; i++) {
        float v = __bfloat162float(h[i]);
        bad += !(v >= -1.0f && v <= 1.0f);
        s += v;
        s2 += (double)v * v;
    }
    free(h);
    double mean = s / m, sd = sqrt(s2 / m - mean * mean);
    if (bad || m < 1024 || fabs(mean) > 0.1 || fabs(sd - 0.57735) > 0.05) {
        fprintf(stderr, "gpu_train: the random GEMM inputs are not uniform "
                        "on [-1,1): %d of %zu outside, mean %.3f, sd %.3f "
                        "(want 0, 0.577)\n", bad, m, mean, sd);
        exit(1);
    }
}

/* Best TFLOP/s of an n x n x n bf16 GEMM (fp32 compute) through the same
 * cuBLASLt path as the model, on pseudo-random inputs (not zeros: a GEMM
 * on zeros draws less power and runs faster than on real data). 0 when
 * cuBLASLt has no algorithm for it. */
static double gemm_peak_tflops_(int n, int reps)
{
    size_t nn = (size_t)n * n;
    bf16 *a, *b, *c;
    CUDA_CHECK(cudaMalloc(&a, nn * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&b, nn * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&c, nn * sizeof(bf16)));
    fill_random_(a, nn, 1);
    fill_random_(b, nn, 2);
    /* matmul_forward_cuda(c, a, b, NULL, n, n, n): c = a b^T, as cuBLASLt
     * sees it (matmul.cu) */
    gemm_batched_args ga = {1, 0, n, n, n, b, n, 0, a, n, 0, c, n, 0,
                            0, 1.0f, 0.0f, 1};
    if (!gemm_batched_supported(&ga)) {
        printf("gpu_train: cuBLASLt has no algorithm for the %dx%dx%d "
               "peak GEMM: no peak\n", n, n, n);
        CUDA_CHECK(cudaFree(a));
        CUDA_CHECK(cudaFree(b));
        CUDA_CHECK(cudaFree(c));
        return 0;
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double best = 0;
    for (int r = 0; r < reps + 2; r++) {
        CUDA_CHECK(cudaEventRecord(e0, 0));
        matmul_forward_cuda(c, a, b, NULL, n, n, n, 0);
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        double tf = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
        if (r >= 2 && tf > best) /* two warm-up runs */
            best = tf;
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    CUDA_CHECK(cudaFree(c));
    return best;
}

/* Milliseconds of one attention forward + backward of one layer at the
 * model's (B, T, C, NH), best of `reps` after a warm-up, on path `impl`:
 * ATT_IMPL_TC (the tensor-core flash kernels; -1 for a head size they
 * lack), ATT_IMPL_CORE (the CUDA-core flash kernels) or ATT_IMPL_GEMM
 * (cuBLASLt; -1 when the shape has none). */
static double attention_ms_(int impl, int B, int T, int C, int NH, int reps)
{
    int gemm = impl == ATT_IMPL_GEMM, hs = C / NH;
    size_t wsb = attention_gemm_workspace_bytes(B, T, C, NH);
    if (gemm && !wsb)
        return -1;
    if (impl == ATT_IMPL_TC && hs != 32 && hs != 64 && hs != 80 && hs != 128)
        return -1;
    size_t n3 = (size_t)B * T * 3 * C, nc = (size_t)B * T * C;
    bf16 *qkv, *out, *dout, *dqkv;
    float *lse, *scr;
    void *ws = NULL;
    CUDA_CHECK(cudaMalloc(&qkv, n3 * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&dqkv, n3 * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&out, nc * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&dout, nc * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&lse, (size_t)B * NH * T * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&scr, attention_backward_scratch_floats(B, T, NH) *
                                    sizeof(float)));
    if (gemm)
        CUDA_CHECK(cudaMalloc(&ws, wsb));
    CUDA_CHECK(cudaMemset(qkv, 0, n3 * sizeof(bf16))); /* bf16 zeros */
    CUDA_CHECK(cudaMemset(dout, 0, nc * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(dqkv, 0, n3 * sizeof(bf16)));
    char why[256];
    if (gemm && !attention_gemm_supported(ws, wsb, qkv, out, dqkv, dout, B,
                                          T, C, NH, why, sizeof why)) {
        printf("gpu_train: attention_gemm: %s\n", why); /* as gpt_cuda */
        gemm = 0;
        reps = -1; /* none timed */
    }
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    double best = reps < 0 ? -1 : 1e30;
    for (int r = 0; r <= reps; r++) {
        CUDA_CHECK(cudaStreamSynchronize(st));
        double t0 = clock_mono_s();
        if (gemm) {
            attention_gemm_forward_cuda(out, lse, ws, wsb, qkv, B, T, C, NH,
                                        st);
            attention_gemm_backward_cuda(dqkv, scr, ws, wsb, dout, qkv, out,
                                         lse, B, T, C, NH, st);
        } else if (impl == ATT_IMPL_TC) {
            attention_tc_forward_cuda(out, lse, qkv, B, T, C, NH, st);
            attention_tc_backward_cuda(dqkv, scr, dout, qkv, out, lse, B, T,
                                       C, NH, st);
        } else {
            attention_core_forward_cuda(out, lse, qkv, B, T, C, NH, st);
            attention_core_backward_cuda(dqkv, scr, dout, qkv, out, lse, B,
                                         T, C, NH, st);
        }
        CUDA_CHECK(cudaStreamSynchronize(st));
        double dt = (clock_mono_s() - t0) * 1e3;
        if (r > 0 && dt < best) /* the first warms up */
            best = dt;
    }
    CUDA_CHECK(cudaStreamDestroy(st));
    cudaFree(qkv); cudaFree(dqkv); cudaFree(out); cudaFree(dout);
    cudaFree(lse); cudaFree(scr);
    if (ws)
        cudaFree(ws);
    return best;
}

static void usage_(void)
{
    printf("usage: gpu_train [options]   (defaults: GPT-2 124M shapes)\n"
           "  --layers L    n_layer (12)       --embd C    n_embd (768)\n"
           "  --heads NH    n_head (12)        --seq T     seq_len (1024)\n"
           "  --batch B     microbatch (32)    --vocab V   vocab (50257)\n"
           "  --accum A     microbatches per step (1)\n"
           "  --share S     parameter slots (L = Real model, 1 = Pseudo)\n"
           "  --steps N     timed steps (10)   --warmup N  untimed steps (3)\n"
           "  --peak-n N    size of the square GEMM for the peak (8192)\n"
           "  --att-reps N  attention alone on each path (tensor-core and\n"
           "                CUDA-core flash kernels, cuBLASLt), best of N\n"
           "                (5; 0 skips)\n");
}

/* warmup + steps training steps of accum microbatches (inp, tgt: accum
 * microbatches of BT tokens) as the trainer runs them: queued, the losses
 * read once per step (gpt_cuda_step_loss), the norm's wait. Prints each
 * step; *secs the timed steps' wall time. Returns the last mean loss. */
static float timed_steps_(gpt_cuda *g, const int32_t *inp,
                          const int32_t *tgt, int B, int BT, int accum,
                          int warmup, int steps, const char *path,
                          double *secs)
{
    float loss = 0;
    double t0 = 0;
    for (int k = 0; k < warmup + steps; k++) {
        if (k == warmup)
            t0 = clock_mono_s();
        double ts = clock_mono_s();
        gpt_cuda_step_begin(g, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
        for (int a = 0; a < accum; a++)
            gpt_cuda_queue_microbatch(g, inp + (size_t)a * BT,
                                      tgt + (size_t)a * BT, B,
                                      1.0f / ((float)BT * accum),
                                      a == accum - 1);
        float norm = gpt_cuda_grad_norm(g); /* the step's one wait */
        loss = (float)(gpt_cuda_step_loss(g) / accum);
        gpt_cuda_adamw(g, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
        printf("  %s step %2d%s loss %.4f norm %.3f  %.1f ms\n", path, k + 1,
               k < warmup ? " (warm-up)" : "", loss, norm,
               (clock_mono_s() - ts) * 1e3);
    }
    gpt_cuda_synchronize(g);
    *secs = clock_mono_s() - t0;
    return loss;
}

int main(int argc, char **argv)
{
    model_config c = {50257, 12, 12, 768, 1024};
    int B = 32, accum = 1, S = 0, steps = 10, warmup = 3, peak_n = 8192;
    int att_reps = 5;
    static const struct option opts[] = {
        BENCH_SHAPE_OPTIONS,
        {"accum", 1, 0, 'a'}, {"att-reps", 1, 0, 'r'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = bench_next_option("gpu_train", argc, argv, opts, &c, &B, &S,
                                  &steps, &warmup, &peak_n)) != -1) {
        switch (o) {
        case 'a': accum = bench_int_arg("gpu_train", "accum", optarg, 1); break;
        case 'r':
            att_reps = bench_int_arg("gpu_train", "att-reps", optarg, 0);
            break;
        default: bench_usage_exit(o, usage_);
        }
    }
    if (bench_shape_done("gpu_train", argc, argv, &c, &S) < 0)
        return 2;
    cuda_device_or_skip("gpu_train");

    double peak = peak_n > 0 ? gemm_peak_tflops_(peak_n, 10) : 0;
    if (peak_n > 0)
        printf("gpu_train: cuBLASLt bf16 GEMM %dx%dx%d: %.1f TFLOP/s\n",
               peak_n, peak_n, peak_n, peak);

    /* one layer's attention (6 B T^2 C FLOPs forward + backward, the
     * causal half, as the model FLOPs count it) on both paths */
    double att_flash = -1, att_gemm = -1, att_tc = -1;
    if (att_reps > 0) {
        double fl = 6.0 * B * (double)c.seq_len * c.seq_len * c.n_embd;
        att_tc = attention_ms_(ATT_IMPL_TC, B, c.seq_len, c.n_embd,
                               c.n_head, att_reps);
        att_flash = attention_ms_(ATT_IMPL_CORE, B, c.seq_len, c.n_embd,
                                  c.n_head, att_reps);
        att_gemm = attention_ms_(ATT_IMPL_GEMM, B, c.seq_len, c.n_embd,
                                 c.n_head, att_reps);
        if (att_tc > 0)
            printf("gpu_train: one layer's attention forward + backward: "
                   "flash kernels on the tensor cores %.2f ms (%.1f "
                   "TFLOP/s)\n", att_tc, fl / att_tc / 1e9);
        else
            printf("gpu_train: one layer's attention forward + backward: "
                   "no tensor-core flash kernels for head size %d\n",
                   c.n_embd / c.n_head);
        printf("gpu_train: one layer's attention forward + backward: flash "
               "kernels on the CUDA cores %.2f ms (%.1f TFLOP/s), cuBLASLt ",
               att_flash, fl / att_flash / 1e9);
        if (att_gemm > 0)
            printf("%.2f ms (%.1f TFLOP/s): %.2fx\n", att_gemm,
                   fl / att_gemm / 1e9, att_flash / att_gemm);
        else
            printf("not offered (head size, or no cuBLASLt algorithm)\n");
    }

    gpt_cuda *g = gpt_cuda_create(&c, S, B);
    if (!g)
        return 1;
    gpt_cuda_info info;
    gpt_cuda_get_info(g, &info);
    int T = c.seq_len, BT = B * T;
    double flops_tok = model_flops_per_token(&c);
    printf("gpu_train: L=%d C=%d NH=%d T=%d V=%d (Vp=%d) S=%d, B=%d x %d "
           "microbatches = %d tokens/step\n", c.n_layer, c.n_embd, c.n_head,
           T, c.vocab_size, info.Vp, S, B, accum, BT * accum);
    printf("gpu_train: N=%.1fM compute params, %.1fM stored; memory GiB: "
           "params %.2f grads %.2f optimizer %.2f activations %.2f\n",
           model_active_params(&c) / 1e6, info.n_params / 1e6,
           info.bytes_params / 1073741824.0, info.bytes_grads / 1073741824.0,
           info.bytes_opt / 1073741824.0, info.bytes_acts / 1073741824.0);

    int32_t *inp = (int32_t *)malloc((size_t)accum * BT * sizeof(int32_t));
    int32_t *tgt = (int32_t *)malloc((size_t)accum * BT * sizeof(int32_t));
    uint64_t s = 1;
    for (size_t i = 0; i < (size_t)accum * BT; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        inp[i] = (int32_t)((s >> 33) % c.vocab_size);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tgt[i] = (int32_t)((s >> 33) % c.vocab_size);
    }

    /* The same steps twice, on the same weights' trajectory from init:
     * first on the queued path, then through CUDA graphs (the default;
     * gpt_cuda_set_graphs), each with its own warm-up (the graphs are
     * captured there). */
    double dt_q = 0, dt_g = 0;
    float loss = 0, loss_q = 0;
    for (int graphs = 0; graphs <= 1; graphs++) {
        gpt_cuda_init_weights(g, 1);
        gpt_cuda_set_graphs(g, graphs);
        double dt = 0;
        float l = timed_steps_(g, inp, tgt, B, BT, accum, warmup, steps,
                               graphs ? "graphs" : "queued", &dt);
        if (graphs) {
            dt_g = dt;
            loss = l;
        } else {
            dt_q = dt;
            loss_q = l;
        }
    }
    double dt = dt_g;
    double tok_s = (double)BT * accum * steps / dt;
    double tok_s_q = (double)BT * accum * steps / dt_q;
    printf("gpu_train: queued path %.0f tokens/s, CUDA graphs %.0f tokens/s "
           "(%.3fx); last loss queued %.4f graphs %.4f\n", tok_s_q, tok_s,
           tok_s / tok_s_q, loss_q, loss);
    double tflops = tok_s * flops_tok / 1e12;
    double mfu = tflops / PEAK_BF16_TFLOPS;
    double mfu_gemm = peak > 0 ? tflops / peak : 0;
    printf("gpu_train: %.0f tokens/s, %.1f ms/step, %.1f TFLOP/s model "
           "(%.3g GFLOP/token), MFU %.1f%% of %.0f, %.1f%% of measured GEMM "
           "peak\n", tok_s, dt / steps * 1e3, tflops, flops_tok / 1e9,
           100 * mfu, PEAK_BF16_TFLOPS, 100 * mfu_gemm);
    char att[160] = "att_ms_flash=na att_ms_gemm=na att_speedup=na";
    if (att_flash > 0 && att_gemm > 0)
        snprintf(att, sizeof att, "att_ms_flash=%.3f att_ms_gemm=%.3f "
                 "att_speedup=%.2f", att_flash, att_gemm,
                 att_flash / att_gemm);
    else if (att_flash > 0)
        snprintf(att, sizeof att, "att_ms_flash=%.3f att_ms_gemm=na "
                 "att_speedup=na", att_flash);
    /* the tensor-core kernels against the model's previous path */
    double prev = att_gemm > 0 ? att_gemm : att_flash;
    char tc[96] = "att_ms_tc=na att_tc_speedup=na";
    if (att_tc > 0 && prev > 0)
        snprintf(tc, sizeof tc, "att_ms_tc=%.3f att_tc_speedup=%.2f", att_tc,
                 prev / att_tc);
    else if (att_tc > 0)
        snprintf(tc, sizeof tc, "att_ms_tc=%.3f att_tc_speedup=na", att_tc);
    printf("tokens_per_s=%.0f ms_per_step=%.2f mfu=%.4f mfu_vs_gemm=%.4f "
           "gemm_tflops=%.1f loss=%.4f tokens_per_s_queued=%.0f "
           "graph_speedup=%.3f %s %s\n", tok_s, dt / steps * 1e3, mfu,
           mfu_gemm, peak, loss, tok_s_q, tok_s / tok_s_q, att, tc);
    free(inp);
    free(tgt);
    gpt_cuda_free(g);
    matmul_cuda_fini();
    return isfinite(loss) && isfinite(loss_q) ? 0 : 1;
}
