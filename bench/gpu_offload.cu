/*
 * gpu_offload.cu — what granular CPU offloading costs on one GPU (issue #5,
 * item 5). In one process, on the same tokens:
 *   1. the plain pinned-copy peak: cudaMemcpyAsync of a 1 GiB cudaHostAlloc
 *      buffer host->device (and back), best of a few, GB/s;
 *   2. the model all resident: warm-up steps, then timed steps, tokens/s;
 *   3. the same model with slots [n_resident, L) offloaded (default
 *      n_resident = L/3: two thirds offloaded), the same steps, tokens/s,
 *      and from gpt_cuda_get_offload_stats over the timed steps: the copy
 *      stream's achieved host->device GB/s, the fraction of the wall time
 *      the compute stream stalled on fetches, the host threads' gradient
 *      accumulation and AdamW time.
 * Targets (issue #5): offloaded/resident tokens/s >= 0.85 and achieved
 * h2d / pinned peak >= 0.8. Every step: step_begin, train_microbatch per
 * microbatch, AdamW with clipping (max_norm 1); --no-clip then times both
 * models again without clipping, where offloaded slots update during
 * backward (early updates). Defaults: GPT-2 1.5B shapes (L 48, C 1600,
 * NH 25: head size 64; V 50257, T 1024), B 8.
 *
 * --largest: instead of 2 and 3, the biggest model that fits this GPU plus
 * host memory with offloading (C 5120, NH 40, T 1024, B 1 unless given):
 * L from cudaMemGetInfo and MemAvailable (lowered to a memory cgroup's
 * limit; raised by --host-gib where the VM's memory grows as it is used),
 * each resident slot costing 16 B per parameter on the device (bf16
 * weights and gradient, fp32 master, m, v), each offloaded one 20 B on the
 * host (16 pageable, 4 pinned), every layer its activations; a few steps,
 * parameters and model TFLOP/s (model_flops_per_token, model/facts.h).
 * Its key line is printed once the model is made (largest_tflops na) and
 * again after the steps, so a run cut short still reports the size.
 *
 * Random tokens (throughput does not depend on the data). Exit 77 without
 * a CUDA device. Ends with one line (na: not run):
 *   tokens_per_s_resident=… tokens_per_s_offload=… ratio=… h2d_gbps=…
 *   pinned_peak_gbps=… copy_ratio=… stall_frac=… d2h_gbps=…
 *   tokens_per_s_offload_noclip=… ratio_noclip=… largest_params=…
 *   largest_layers=… largest_tflops=…
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_args.h"
#include "common/clock.h"
#include "cuda_check.h"
#include "model/cuda/gpt_cuda.h"
#include "model/facts.h"
#include "kernels_cuda.h"

#define GIB 1073741824.0
static const float LR = 3e-4f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f;
static const float WD = 0.1f, CLIP = 1.0f;
#define RATIO_TARGET 0.85
#define COPY_TARGET 0.8
#define P_ "gpu_offload" /* program name in messages */

/* ------------------------------------------------------------- copy peak */

/* Best GB/s (1e9) of `reps` copies of a pinned host buffer of `bytes` to
 * the device (*d2h: back), one cudaMemcpyAsync each, event-timed. 0 when
 * the buffer cannot be pinned. */
static double pinned_peak_gbps_(size_t bytes, int reps, double *d2h)
{
    void *h = NULL, *d = NULL;
    *d2h = 0;
    if (cudaHostAlloc(&h, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        printf("gpu_offload: cannot pin %.2f GiB for the copy peak\n",
               bytes / GIB);
        return 0;
    }
    CUDA_CHECK(cudaMalloc(&d, bytes));
    memset(h, 1, bytes); /* touch every page */
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double best[2] = {0, 0};
    for (int dir = 0; dir < 2; dir++)
        for (int r = 0; r < reps + 1; r++) { /* the first warms up */
            CUDA_CHECK(cudaEventRecord(e0, st));
            if (dir == 0)
                CUDA_CHECK(cudaMemcpyAsync(d, h, bytes,
                                           cudaMemcpyHostToDevice, st));
            else
                CUDA_CHECK(cudaMemcpyAsync(h, d, bytes,
                                           cudaMemcpyDeviceToHost, st));
            CUDA_CHECK(cudaEventRecord(e1, st));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            double gbps = bytes / (ms * 1e-3) / 1e9;
            if (r > 0 && gbps > best[dir])
                best[dir] = gbps;
        }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaStreamDestroy(st));
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaFreeHost(h));
    *d2h = best[1];
    return best[0];
}

/* ------------------------------------------------------------- timing */

typedef struct {
    int B, accum;
    int32_t *inp, *tgt;     /* accum microbatches of (B, T) */
} batch_;

typedef struct {
    double wall_s, tok_s;
    float loss;
    gpt_cuda_offload_stats d; /* deltas over the timed steps */
} result_;

static void stats_delta_(gpt_cuda_offload_stats *d,
                         const gpt_cuda_offload_stats *a,
                         const gpt_cuda_offload_stats *b)
{
    *d = *b;
    d->h2d_bytes = b->h2d_bytes - a->h2d_bytes;
    d->d2h_bytes = b->d2h_bytes - a->d2h_bytes;
    d->h2d_s = b->h2d_s - a->h2d_s;
    d->d2h_s = b->d2h_s - a->d2h_s;
    d->stall_s = b->stall_s - a->stall_s;
    d->accum_s = b->accum_s - a->accum_s;
    d->adam_s = b->adam_s - a->adam_s;
}

/* `warmup` untimed then `steps` timed optimizer steps; each: step_begin,
 * train_microbatch per microbatch, adamw. The timed span ends when every
 * host job has finished. */
static result_ time_steps_(gpt_cuda *g, const model_config *c,
                           const batch_ *bt, int warmup, int steps,
                           float max_norm, const char *label)
{
    const size_t BT = (size_t)bt->B * c->seq_len;
    gpt_cuda_offload_stats s0, s1;
    result_ r;
    memset(&r, 0, sizeof r);
    double t0 = clock_mono_s();
    memset(&s0, 0, sizeof s0);
    for (int k = 0; k < warmup + steps; k++) {
        if (k == warmup) {
            gpt_cuda_synchronize(g);
            gpt_cuda_get_offload_stats(g, &s0);
            t0 = clock_mono_s();
        }
        double ts = clock_mono_s(), lsum = 0;
        gpt_cuda_step_begin(g, LR, BETA1, BETA2, EPS, WD, max_norm);
        for (int a = 0; a < bt->accum; a++)
            lsum += gpt_cuda_train_microbatch(
                g, bt->inp + a * BT, bt->tgt + a * BT, bt->B,
                1.0f / ((float)BT * bt->accum), a == bt->accum - 1);
        gpt_cuda_adamw(g, LR, BETA1, BETA2, EPS, WD, max_norm);
        float norm = gpt_cuda_last_grad_norm(g); /* waits for the device */
        r.loss = (float)(lsum / bt->accum);
        printf("  %s step %2d%s loss %.4f norm %.3f  %.1f ms\n", label,
               k + 1, k < warmup ? " (warm-up)" : "", r.loss, norm,
               (clock_mono_s() - ts) * 1e3);
    }
    gpt_cuda_synchronize(g); /* host AdamW of the last step included */
    r.wall_s = clock_mono_s() - t0;
    gpt_cuda_get_offload_stats(g, &s1);
    stats_delta_(&r.d, &s0, &s1);
    r.tok_s = (double)BT * bt->accum * steps / r.wall_s;
    return r;
}

static void print_offload_(const result_ *r, int steps, int threads,
                           double peak)
{
    const gpt_cuda_offload_stats *d = &r->d;
    double h2d = d->h2d_s > 0 ? d->h2d_bytes / d->h2d_s / 1e9 : 0;
    double d2h = d->d2h_s > 0 ? d->d2h_bytes / d->d2h_s / 1e9 : 0;
    printf("  copies per step: h2d %.2f GB in %.1f ms = %.1f GB/s (%.0f%% of "
           "the pinned peak), d2h %.2f GB in %.1f ms = %.1f GB/s\n",
           d->h2d_bytes / 1e9 / steps, d->h2d_s * 1e3 / steps, h2d,
           peak > 0 ? 100 * h2d / peak : 0, d->d2h_bytes / 1e9 / steps,
           d->d2h_s * 1e3 / steps, d2h);
    printf("  per step: wall %.1f ms, compute stalled on fetches %.1f ms "
           "(%.1f%%); host threads (%d): accumulation %.1f ms, AdamW %.1f "
           "ms (thread time; %.0f%% busy)\n", r->wall_s * 1e3 / steps,
           d->stall_s * 1e3 / steps, 100 * d->stall_s / r->wall_s, threads,
           d->accum_s * 1e3 / steps, d->adam_s * 1e3 / steps,
           100 * (d->accum_s + d->adam_s) / (r->wall_s * threads));
}

/* ------------------------------------------------------------- helpers */

static void random_tokens_(batch_ *bt, const model_config *c)
{
    size_t n = (size_t)bt->accum * bt->B * c->seq_len;
    bt->inp = (int32_t *)malloc(n * sizeof(int32_t));
    bt->tgt = (int32_t *)malloc(n * sizeof(int32_t));
    if (!bt->inp || !bt->tgt) {
        fprintf(stderr, "gpu_offload: out of host memory\n");
        exit(1);
    }
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        bt->inp[i] = (int32_t)((s >> 33) % c->vocab_size);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        bt->tgt[i] = (int32_t)((s >> 33) % c->vocab_size);
    }
}


/* The first number in file `path` (bytes); -1 when absent or "max". */
static double read_bytes_(const char *path)
{
    FILE *f = fopen(path, "r");
    unsigned long long v;
    int ok = f && fscanf(f, "%llu", &v) == 1;
    if (f)
        fclose(f);
    return ok ? (double)v : -1;
}

/* Host memory this process may still use, bytes (0 when unknown), and
 * *total the memory it may use at most: MemAvailable and MemTotal of
 * /proc/meminfo, lowered to the memory cgroup's limit (v2 memory.max, v1
 * memory.limit_in_bytes) less its usage where there is one, since a
 * container's /proc/meminfo shows the whole host and past the limit the
 * OOM killer ends the run. gib > 0: the machine has gib GiB, more than
 * MemTotal says (a VM whose memory grows as it is used): total = gib GiB,
 * available = that less what is in use now (MemTotal - MemAvailable). */
static double host_available_(double *total, double gib)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double avail = 0;
    *total = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            avail = kb * 1024.0;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            *total = kb * 1024.0;
    }
    fclose(f);
    if (gib > 0 && avail > 0) {
        double used = *total - avail;
        *total = gib * GIB;
        avail = *total - used;
    }
    double lim = read_bytes_("/sys/fs/cgroup/memory.max");
    double use = read_bytes_("/sys/fs/cgroup/memory.current");
    if (lim < 0) {
        lim = read_bytes_("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        use = read_bytes_("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (lim > 0 && lim < *total) { /* v1 "no limit" is a huge number */
        printf("gpu_offload: memory cgroup limit %.1f GiB, %.1f GiB in use\n",
               lim / GIB, use > 0 ? use / GIB : 0);
        *total = lim;
        if (use >= 0 && lim - use < avail)
            avail = lim - use;
    }
    return avail > 0 ? avail : 0;
}

static gpt_cuda *create_(const model_config *c, int B,
                         const gpt_cuda_offload *off, const char *what)
{
    double t0 = clock_mono_s();
    gpt_cuda *g = off ? gpt_cuda_create_offload(c, c->n_layer, B, off)
                      : gpt_cuda_create(c, c->n_layer, B);
    if (!g) {
        fprintf(stderr, "gpu_offload: creating the %s model failed\n", what);
        return NULL;
    }
    double t1 = clock_mono_s();
    gpt_cuda_init_weights(g, 1);
    gpt_cuda_synchronize(g);
    printf("gpu_offload: %s model created in %.1f s, initialised in %.1f "
           "s\n", what, t1 - t0, clock_mono_s() - t1);
    return g;
}

static void print_plan_(gpt_cuda *g, const char *what)
{
    gpt_cuda_offload_stats s;
    gpt_cuda_get_offload_stats(g, &s);
    printf("gpu_offload: %s: %d slots, %d resident, %d offloaded, %d "
           "staging; device %.2f GiB (staging %.3f), host %.2f GiB (pinned "
           "%.2f)\n", what, s.n_slots, s.n_resident, s.n_offloaded,
           s.n_staging, s.device_bytes / GIB, s.staging_bytes / GIB,
           s.host_bytes / GIB, s.pinned_bytes / GIB);
}

/* ------------------------------------------------------------- --largest */

typedef struct {
    int layers, n_resident;
    double params, tflops, tok_s;
} largest_;

/* kB fields of /proc/self/status (VmLck: mlock'ed, VmPin: pinned where the
 * kernel counts it, VmRSS), in bytes; -1 when absent */
typedef struct { long long lck, pin, rss; } procmem_;

static procmem_ procmem_now_(void)
{
    procmem_ m = {-1, -1, -1};
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmLck: %lld kB", &kb) == 1) m.lck = kb * 1024;
        if (sscanf(line, "VmPin: %lld kB", &kb) == 1) m.pin = kb * 1024;
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss = kb * 1024;
    }
    if (f)
        fclose(f);
    return m;
}

/* pinned bytes the runtime asked cudaHostAlloc for against what the
 * process shows after the model was made */
static void print_pinned_(const char *label, gpt_cuda *g, procmem_ a,
                          procmem_ b)
{
    gpt_cuda_offload_stats st;
    gpt_cuda_get_offload_stats(g, &st);
    size_t req = st.pinned_bytes + st.spec_pinned_bytes;
    printf("gpu_offload: %s: pinned requested %.3f GiB (slots %.3f, second "
           "buffers %.3f); VmPin %+.3f GiB, VmLck %+.3f GiB, VmRSS %+.3f "
           "GiB at creation; host %.3f GiB (+%.3f GiB second buffers)\n",
           label, req / 1073741824.0, st.pinned_bytes / 1073741824.0,
           st.spec_pinned_bytes / 1073741824.0,
           a.pin >= 0 && b.pin >= 0 ? (b.pin - a.pin) / 1073741824.0 : 0.0,
           a.lck >= 0 && b.lck >= 0 ? (b.lck - a.lck) / 1073741824.0 : 0.0,
           a.rss >= 0 && b.rss >= 0 ? (b.rss - a.rss) / 1073741824.0 : 0.0,
           st.host_bytes / 1073741824.0, st.spec_bytes / 1073741824.0);
}

/* The figures of the closing key=value line; what is not had prints na. */
typedef struct {
    double peak;                   /* pinned h2d GB/s, 0: not measured */
    int have_main, have_nc;
    double tok_res, tok_off, tok_res_nc, tok_off_nc, h2d, d2h, stall;
    int have_spec;                 /* --speculative */
    double tok_off_spec, redo_frac;
    largest_ lg;
    int have_lg_size, have_lg;     /* --largest: created; timed */
} figs_;

static void na_or_(char *buf, size_t n, int have, const char *fmt, double v)
{
    if (have)
        snprintf(buf, n, fmt, v);
    else
        snprintf(buf, n, "na");
}

/* The key=value line (gpu-check.sh reads the last one printed). */
static void print_figs_(const figs_ *f)
{
    char v[13][32];
    na_or_(v[0], 32, f->have_main, "%.0f", f->tok_res);
    na_or_(v[1], 32, f->have_main, "%.0f", f->tok_off);
    na_or_(v[2], 32, f->have_main, "%.4f",
           f->have_main ? f->tok_off / f->tok_res : 0);
    na_or_(v[3], 32, f->have_main, "%.2f", f->h2d);
    na_or_(v[4], 32, f->peak > 0, "%.2f", f->peak);
    na_or_(v[5], 32, f->have_main && f->peak > 0, "%.4f",
           f->peak > 0 ? f->h2d / f->peak : 0);
    na_or_(v[6], 32, f->have_main, "%.4f", f->stall);
    na_or_(v[7], 32, f->have_main, "%.2f", f->d2h);
    na_or_(v[8], 32, f->have_nc, "%.0f", f->tok_off_nc);
    na_or_(v[9], 32, f->have_nc, "%.4f",
           f->have_nc ? f->tok_off_nc / f->tok_res_nc : 0);
    na_or_(v[10], 32, f->have_lg_size, "%.0f", f->lg.params);
    na_or_(v[11], 32, f->have_lg_size, "%.0f", f->lg.layers);
    na_or_(v[12], 32, f->have_lg, "%.1f", f->lg.tflops);
    char sp[3][32];
    na_or_(sp[0], 32, f->have_spec, "%.0f", f->tok_off_spec);
    na_or_(sp[1], 32, f->have_spec && f->have_main, "%.4f",
           f->have_main ? f->tok_off_spec / f->tok_res : 0);
    na_or_(sp[2], 32, f->have_spec, "%.3f", f->redo_frac);
    printf("tokens_per_s_resident=%s tokens_per_s_offload=%s ratio=%s "
           "h2d_gbps=%s pinned_peak_gbps=%s copy_ratio=%s stall_frac=%s "
           "d2h_gbps=%s tokens_per_s_offload_noclip=%s ratio_noclip=%s "
           "largest_params=%s largest_layers=%s largest_tflops=%s "
           "tokens_per_s_offload_spec=%s ratio_spec=%s redo_frac=%s\n",
           v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10],
           v[11], v[12], sp[0], sp[1], sp[2]);
    fflush(stdout);
}

/* The device and host bytes of the model's parts, measured by creating
 * two tiny-depth models with the real planner: slot and global parameter
 * counts, activation bytes per layer and fixed. */
static int probe_sizes_(const model_config *c, int B, size_t *ss,
                        size_t *n_global, size_t *act_layer,
                        size_t *act_fixed)
{
    model_config c1 = *c, c2 = *c;
    c1.n_layer = 1;
    c2.n_layer = 2;
    gpt_cuda_info i1, i2;
    gpt_cuda *g = gpt_cuda_create(&c1, 1, B);
    if (!g)
        return -1;
    gpt_cuda_get_info(g, &i1);
    gpt_cuda_free(g);
    g = gpt_cuda_create(&c2, 2, B);
    if (!g)
        return -1;
    gpt_cuda_get_info(g, &i2);
    gpt_cuda_free(g);
    *ss = i2.n_params - i1.n_params;
    *n_global = i1.n_params - *ss;
    *act_layer = i2.bytes_acts - i1.bytes_acts;
    *act_fixed = i1.bytes_acts - *act_layer;
    return 0;
}

static int run_largest_(model_config c, int B, int layers_given,
                        int n_staging, int threads, int warmup, int steps,
                        float max_norm, double host_gib, figs_ *fg)
{
    size_t ss, ng, act_l, act_f;
    if (probe_sizes_(&c, B, &ss, &ng, &act_l, &act_f) != 0)
        return -1;
    size_t dev_free, dev_total;
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    double host_total, host_avail = host_available_(&host_total, host_gib);
    /* margins: the device keeps room for the CUDA context's growth and
     * fragmentation; the host for everything else on the machine. Fixed
     * device bytes: globals, activations, staging buffers, and the fp32
     * slot gpt_cuda_init_weights draws offloaded slots in (cudaMalloc'd
     * through CUDA_CHECK: running out there exits) */
    double dev_budget = dev_free - 3.0 * GIB;
    double host_budget = host_avail - fmax(8.0 * GIB, 0.1 * host_total);
    double dev_fixed = ng * 16.0 + act_f + (double)n_staging * ss * 4 +
                       ss * 4.0;
    double res_b = ss * 16.0 + act_l, off_dev = act_l, off_host = ss * 20.0;
    printf("gpu_offload: largest: C=%d NH=%d T=%d B=%d; slot %.1fM params: "
           "resident %.2f GiB device, offloaded %.2f GiB host + %.2f GiB "
           "device activations; fixed %.2f GiB device\n", c.n_embd,
           c.n_head, c.seq_len, B, ss / 1e6, res_b / GIB, off_host / GIB,
           off_dev / GIB, dev_fixed / GIB);
    printf("gpu_offload: largest: device %.1f GiB free of %.1f, host %.1f "
           "GiB available of %.1f; budgets device %.1f GiB, host %.1f GiB\n",
           dev_free / GIB, dev_total / GIB, host_avail / GIB,
           host_total / GIB, dev_budget / GIB, host_budget / GIB);
    if (host_avail <= 0) {
        fprintf(stderr, "gpu_offload: cannot read MemAvailable\n");
        return -1;
    }
    double dev_left = dev_budget - dev_fixed;
    int n_off = host_budget > 0 ? (int)(host_budget / off_host) : 0;
    if (dev_left < 0) {
        fprintf(stderr, "gpu_offload: the globals and activations alone "
                        "exceed the device budget\n");
        return -1;
    }
    if (n_off * off_dev > dev_left)
        n_off = (int)(dev_left / off_dev);
    int n_res = (int)((dev_left - n_off * off_dev) / res_b);
    if (layers_given > 0) { /* depth given: as many resident as fit */
        int fit = (int)((dev_left - layers_given * off_dev) / ss / 16.0);
        n_res = fit < 0 ? 0 : fit < layers_given ? fit : layers_given;
        n_off = layers_given - n_res;
        if (n_off * off_host > host_budget)
            printf("gpu_offload: largest: WARNING: %d offloaded slots need "
                   "%.1f GiB host, over the budget\n", n_off,
                   n_off * off_host / GIB);
    }
    for (int attempt = 0; attempt < 4; attempt++) {
        c.n_layer = n_res + n_off;
        if (c.n_layer < 1) {
            fprintf(stderr, "gpu_offload: not even one layer fits\n");
            return -1;
        }
        double params = ng + (double)c.n_layer * ss;
        printf("gpu_offload: largest: L=%d (%d resident, %d offloaded), "
               "%.2fB parameters; planned device %.1f GiB, host %.1f GiB\n",
               c.n_layer, n_res, n_off, params / 1e9,
               (dev_fixed + n_res * res_b + n_off * off_dev) / GIB,
               n_off * off_host / GIB);
        gpt_cuda_offload off = {n_res, n_staging, threads};
        gpt_cuda *g = create_(&c, B, &off, "largest");
        if (!g) { /* planned too close: one resident slot less */
            if (n_res == 0)
                return -1;
            n_res--;
            continue;
        }
        print_plan_(g, "largest");
        batch_ bt = {B, 1, NULL, NULL};
        random_tokens_(&bt, &c);
        double fpt = model_flops_per_token(&c);
        largest_ *out = &fg->lg;
        out->layers = c.n_layer;
        out->n_resident = n_res;
        out->params = model_active_params(&c);
        /* its size now: the steps (first touch of tens of GiB of host
         * memory, host AdamW) may outlast gpu-check's limit */
        fg->have_lg_size = 1;
        print_figs_(fg);
        result_ r = time_steps_(g, &c, &bt, warmup, steps, max_norm,
                                "largest");
        print_offload_(&r, steps, threads, fg->peak);
        out->tok_s = r.tok_s;
        out->tflops = r.tok_s * fpt / 1e12;
        printf("gpu_offload: largest: %.2fB parameters (compute path), "
               "%.0f tokens/s, %.1f TFLOP/s model (%.3g GFLOP/token)\n",
               out->params / 1e9, r.tok_s, out->tflops, fpt / 1e9);
        gpt_cuda_free(g);
        free(bt.inp);
        free(bt.tgt);
        fg->have_lg = isfinite(r.loss);
        return fg->have_lg ? 0 : -1;
    }
    return -1;
}

/* ------------------------------------------------------------- main */

static void usage_(void)
{
    printf("usage: gpu_offload [options]   (defaults: GPT-2 1.5B shapes)\n"
           "  --layers L    n_layer (48)       --embd C    n_embd (1600)\n"
           "  --heads NH    n_head (25)        --seq T     seq_len (1024)\n"
           "  --batch B     microbatch (8)     --vocab V   vocab (50257)\n"
           "  --accum A     microbatches per step (1)\n"
           "  --steps N     timed steps (5)    --warmup N  untimed steps (2)\n"
           "  --resident N  resident slots of the offloaded run (L/3)\n"
           "  --staging N   staging buffers (2)\n"
           "  --threads N   host threads (online CPUs - 2)\n"
           "  --copy-mib N  size of the pinned-copy peak buffer (1024)\n"
           "  --speculative also time the offloaded model clipped with the "
           "speculative\n                host AdamW (offload.speculative: on)\n"
           "  --no-clip     also time both models without clipping (early "
           "updates)\n"
           "  --largest     only the largest model that fits device + host\n"
           "                (C 5120, NH 40, T 1024, B 1, steps 2, warm-up 1\n"
           "                unless given; --layers fixes its depth)\n"
           "  --host-gib G  --largest: the host has G GiB, more than\n"
           "                /proc/meminfo says (a VM whose memory grows as\n"
           "                it is used); default: MemAvailable, and the\n"
           "                memory cgroup's limit if lower\n");
}

int main(int argc, char **argv)
{
    model_config c = {0, 0, 0, 0, 0};
    int B = 0, S = 0, steps = 0, warmup = -1, peak_n = -1, accum = 1;
    int n_res = -1, n_staging = 2, copy_mib = 1024, no_clip = 0, spec = 0;
    int largest = 0;
    double host_gib = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu > 3 ? (int)ncpu - 2 : 1;
    static const struct option opts[] = {
        BENCH_SHAPE_OPTIONS,
        {"accum", 1, 0, 'a'}, {"resident", 1, 0, 'r'},
        {"staging", 1, 0, 'g'}, {"threads", 1, 0, 'j'},
        {"copy-mib", 1, 0, 'm'}, {"no-clip", 0, 0, 'c'},
        {"speculative", 0, 0, 'Q'},
        {"largest", 0, 0, 'X'}, {"host-gib", 1, 0, 'G'},
        {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = bench_next_option(P_, argc, argv, opts, &c, &B, &S,
                                  &steps, &warmup, &peak_n)) != -1) {
        switch (o) {
        case 'a': accum = bench_int_arg(P_, "accum", optarg, 1); break;
        case 'r': n_res = bench_int_arg(P_, "resident", optarg, 0); break;
        case 'g': n_staging = bench_int_arg(P_, "staging", optarg, 1); break;
        case 'j': threads = bench_int_arg(P_, "threads", optarg, 1); break;
        case 'm': copy_mib = bench_int_arg(P_, "copy-mib", optarg, 1); break;
        case 'c': no_clip = 1; break;
        case 'Q': spec = 1; break;
        case 'X': largest = 1; break;
        case 'G': {
            char *end;
            host_gib = strtod(optarg, &end);
            if (end == optarg || *end || !(host_gib > 0)) {
                fprintf(stderr, "gpu_offload: --host-gib: want a number of "
                                "GiB > 0, got \"%s\"\n", optarg);
                return 2;
            }
            break;
        }
        default: bench_usage_exit(o, usage_);
        }
    }
    bench_no_operands(P_, argc, argv);
    if (S != 0 || peak_n != -1) {
        fprintf(stderr, "gpu_offload: --share and --peak-n do not apply "
                        "(Real model; no GEMM peak here)\n");
        return 2;
    }
    int layers_given = c.n_layer;
    /* mode defaults for what was not given */
    if (!c.vocab_size) c.vocab_size = 50257;
    if (!c.n_embd) c.n_embd = largest ? 5120 : 1600;
    if (!c.n_head) c.n_head = largest ? 40 : 25;
    if (!c.seq_len) c.seq_len = 1024;
    if (!c.n_layer) c.n_layer = 48; /* --largest: chosen from memory */
    if (!B) B = largest ? 1 : 8;
    if (!steps) steps = largest ? 2 : 5;
    if (warmup < 0) warmup = largest ? 1 : 2;
    if (n_res < 0) n_res = c.n_layer / 3;
    if (bench_shape_check(P_, &c, c.n_layer) < 0)
        return 2;
    char err[256];
    if (gpt_cuda_check_config(&c, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_offload: gpt_cuda_check_config rejects the "
                        "shapes: %s\n", err);
        return 2;
    }
    printf("gpu_offload: C=%d NH=%d (head size %d) accepted by "
           "gpt_cuda_check_config\n", c.n_embd, c.n_head,
           c.n_embd / c.n_head);
    cuda_device_or_skip("gpu_offload");

    double d2h_peak, peak = pinned_peak_gbps_((size_t)copy_mib << 20, 5,
                                              &d2h_peak);
    printf("gpu_offload: pinned cudaMemcpyAsync of %d MiB: h2d %.1f GB/s, "
           "d2h %.1f GB/s (best of 5)\n", copy_mib, peak, d2h_peak);

    int rc = 0;
    figs_ fg;
    memset(&fg, 0, sizeof fg);
    fg.peak = peak;
    float max_norm = CLIP;

    if (largest) {
        rc = run_largest_(c, B, layers_given, n_staging, threads, warmup,
                          steps, max_norm, host_gib, &fg) == 0 ? 0 : 1;
    } else {
        const int L = c.n_layer;
        if (n_res > L)
            n_res = L;
        batch_ bt = {B, accum, NULL, NULL};
        random_tokens_(&bt, &c);
        printf("gpu_offload: L=%d C=%d NH=%d T=%d V=%d, B=%d x %d "
               "microbatches = %d tokens/step, %d timed steps after %d\n",
               L, c.n_embd, c.n_head, c.seq_len, c.vocab_size, B, accum,
               B * accum * c.seq_len, steps, warmup);

        /* 2. all resident */
        gpt_cuda *g = create_(&c, B, NULL, "resident");
        if (!g) {
            print_figs_(&fg);
            return 1;
        }
        print_plan_(g, "resident");
        double fpt = model_flops_per_token(&c);
        result_ rr = time_steps_(g, &c, &bt, warmup, steps, max_norm,
                                 "resident");
        result_ rr_nc = rr;
        if (no_clip)
            rr_nc = time_steps_(g, &c, &bt, 1, steps, 0.0f,
                                "resident noclip");
        gpt_cuda_free(g);
        printf("gpu_offload: resident: %.0f tokens/s, %.1f ms/step, %.1f "
               "TFLOP/s model\n", rr.tok_s, rr.wall_s * 1e3 / steps,
               rr.tok_s * fpt / 1e12);

        /* 3. offloaded */
        gpt_cuda_offload off = {n_res, n_staging, threads, 0};
        procmem_ pm0 = procmem_now_();
        g = create_(&c, B, &off, "offloaded");
        if (!g) {
            print_figs_(&fg);
            return 1;
        }
        print_plan_(g, "offloaded");
        print_pinned_("offloaded", g, pm0, procmem_now_());
        result_ ro = time_steps_(g, &c, &bt, warmup, steps, max_norm,
                                 "offloaded");
        printf("gpu_offload: offloaded (%d of %d slots): %.0f tokens/s, "
               "%.1f ms/step, %.1f TFLOP/s model\n", L - n_res, L, ro.tok_s,
               ro.wall_s * 1e3 / steps, ro.tok_s * fpt / 1e12);
        print_offload_(&ro, steps, threads, peak);
        result_ ro_nc = ro;
        if (no_clip) {
            ro_nc = time_steps_(g, &c, &bt, 1, steps, 0.0f,
                                "offloaded noclip");
            printf("gpu_offload: offloaded without clipping (early "
                   "updates): %.0f tokens/s, %.1f ms/step\n", ro_nc.tok_s,
                   ro_nc.wall_s * 1e3 / steps);
            print_offload_(&ro_nc, steps, threads, peak);
        }
        gpt_cuda_free(g);
        if (spec) {
            /* 4. the same, clipped, with the speculative host AdamW */
            gpt_cuda_offload offs = {n_res, n_staging, threads, 1};
            procmem_ pm1 = procmem_now_();
            g = create_(&c, B, &offs, "offloaded speculative");
            if (g) {
                print_pinned_("offloaded speculative", g, pm1,
                              procmem_now_());
                gpt_cuda_offload_stats s0, s1;
                gpt_cuda_get_offload_stats(g, &s0);
                result_ rs = time_steps_(g, &c, &bt, warmup, steps, max_norm,
                                         "offloaded spec");
                gpt_cuda_get_offload_stats(g, &s1);
                long ns = (long)(s1.spec_steps - s0.spec_steps);
                long nr = (long)(s1.redo_steps - s0.redo_steps);
                printf("gpu_offload: offloaded, speculative: %.0f tokens/s, "
                       "%.1f ms/step; %ld of %ld steps redone (norm over "
                       "the clip %.1f on these random tokens)\n", rs.tok_s,
                       rs.wall_s * 1e3 / steps, nr, ns, (double)max_norm);
                print_offload_(&rs, steps, threads, peak);
                fg.have_spec = 1;
                fg.tok_off_spec = rs.tok_s;
                fg.redo_frac = ns > 0 ? (double)nr / ns : 0;
                if (!isfinite(rs.loss))
                    rc = 1;
                gpt_cuda_free(g);
            } else {
                rc = 1;
            }
        }
        free(bt.inp);
        free(bt.tgt);

        fg.tok_res = rr.tok_s;
        fg.tok_off = ro.tok_s;
        fg.tok_res_nc = rr_nc.tok_s;
        fg.tok_off_nc = ro_nc.tok_s;
        const gpt_cuda_offload_stats *d = &ro.d;
        fg.h2d = d->h2d_s > 0 ? d->h2d_bytes / d->h2d_s / 1e9 : 0;
        fg.d2h = d->d2h_s > 0 ? d->d2h_bytes / d->d2h_s / 1e9 : 0;
        fg.stall = d->stall_s / ro.wall_s;
        fg.have_main = 1;
        fg.have_nc = no_clip;
        double ratio = fg.tok_off / fg.tok_res;
        double copy = peak > 0 ? fg.h2d / peak : 0;
        printf("gpu_offload: offloaded/resident %.3f (target >= %.2f: %s), "
               "achieved h2d / pinned peak %.3f (target >= %.2f: %s)\n",
               ratio, RATIO_TARGET, ratio >= RATIO_TARGET ? "met" : "NOT met",
               copy, COPY_TARGET, copy >= COPY_TARGET ? "met" : "NOT met");
        if (no_clip)
            printf("gpu_offload: without clipping: offloaded/resident "
                   "%.3f\n", fg.tok_off_nc / fg.tok_res_nc);
        if (!isfinite(rr.loss) || !isfinite(ro.loss) ||
            !isfinite(ro_nc.loss))
            rc = 1;
    }
    print_figs_(&fg);
    matmul_cuda_fini();
    return rc;
}
