/*
 * test_offload_mock.cpp — CPU-only test of the GPU offload runtime,
 * daemon/offload/cuda/gpt_cuda_offload.cu, on the mock CUDA runtime of this
 * folder (no GPU, no CUDA toolkit).
 *
 * Each seed draws a model (layers, shared slots, width), a placement
 * (resident slots), the staging buffers, host threads, microbatches and the
 * simulated GPU's timing, then drives the runtime as gpt_cuda.cu does
 * (create, step_begin, train_microbatch or forward + backward, grad_norm,
 * adamw, forward-only evaluation, synchronize, statistics, free) with fake
 * "kernels" on the compute stream, and checks against a serial reference:
 *   - the weights every kernel reads from a staging buffer (bit for bit,
 *     padding included): fetch ordering against AdamW and buffer reuse;
 *   - the fp32 gradient accumulated on the host (bit for bit) and its sum
 *     of squares: zeroing, drains and accumulation ordering;
 *   - master weights, m and v after every AdamW (bit for bit), the bf16
 *     working copies, the per-slot step counts, early updates vs clipped;
 *   - copy byte counts and memory figures of the statistics, no sticky
 *     error left behind, no misuse of the CUDA API (mock_cuda.cpp);
 *   - an early step whose last microbatch makes one offloaded slot's
 *     gradient infinite: that slot's update skipped (state and step count
 *     kept, counted in update_skips), the others made;
 *   - streamed gradients (a third of the seeds whose slots are used by
 *     adjacent layers): no accumulator, 1 to 3 pooled landing buffers, all
 *     back in the pool at the end, the same state bit for bit.
 * Fake gradients are small multiples of 2^-12 so that bf16 sums on the
 * "device" and fp32 sums on the host are exact: any difference is an
 * ordering bug, not rounding.
 *
 * Usage: test_offload_mock [-v] [-j JOBS] [-t SECONDS] [-f FIRST] SEEDS
 *        test_offload_mock --one SEED    (in this process, for a debugger)
 * Every seed runs in a child process (output kept, shown if it fails;
 * killed after -t seconds, default 60). Ends with one summary line; exit 0
 * when every seed passed. A seed fixes the configuration and the mock's
 * choices, not the host threads' timing: a failure may need a few reruns.
 */
#include "common.cuh"             /* the mock: first (see there) */
#include "model/cuda/gpt_cuda_impl.cuh"
#include "model/cuda/gpt_offload.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <math.h>
#include <random>
#include <string>
#include <vector>

/* gpt_cuda.cu's, for gpt_cuda_get_offload_stats: no device state here. */
void gpt_cuda_get_info(const gpt_cuda *g, gpt_cuda_info *info)
{
    (void)g;
    memset(info, 0, sizeof *info);
}

/* ------------------------------------------------------------ one seed */

static std::atomic<long> errors_{0};

#define FAIL(...)                                                             \
    do {                                                                      \
        if (errors_++ < 20)                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
    } while (0)

/* what a seed draws */
typedef struct {
    int L, S, C, n_res, n_staging, threads, M, steps;
    int map;            /* 0: layer l uses slot l*S/L; 1: random slots;
                         * 2: random resident slots only (the offloaded
                         * ones unused: their AdamW overlaps the next step) */
    int gpu_threads, delay_us;
    int spec;           /* speculative clipped update (second buffers) */
    int gbufs;          /* streamed gradients: landing buffers (0: off);
                         * then one microbatch trained whole (no discarded
                         * step, no separate backward), early updates,
                         * slots used in adjacent layers only (maps 0, 2) */
} config_;

/* speculative steps and redone ones expected so far */
static long spec_steps_, redo_steps_;

/* the serial reference of one offloaded slot */
typedef struct {
    std::vector<float> master, m, v, g;
    long t;
} ref_;

static size_t used_;                        /* elements of a slot before
                                             * its padding */
static std::vector<std::vector<uint16_t>> exp_w;   /* [S] bf16 weights the
                                                    * kernels must read */
static std::vector<ref_> ref;              /* [S], offloaded slots only */
static long fetches_, drains_;             /* expected copies so far */
/* an early (unclipped) step's poisoned slot: element 0 of its gradient
 * infinite, from one layer of the step's last microbatch; its update must
 * be skipped (-1: none this step) */
static int poison_slot_ = -1, poison_step_ = -1, poison_layer_ = -1,
           poison_mb_ = -1;
static long skips_;                        /* expected skipped updates */

/* a "kernel": reads the staging weights; in backward, adds the layer's
 * gradient to the staging gradient (bf16, as the real kernels) */
typedef struct {
    const uint16_t *w;
    uint16_t *dw;
    int slot, layer, mb, step, pos;
    size_t n;
    int poison;         /* k_grad_: element 0 +inf (decided at launch) */
} karg_;
static std::vector<karg_ *> kargs_;

static float grad_of_(size_t i, int l, int mb, int step)
{
    return (float)((long)((i * 7 + (size_t)l * 3 + (size_t)mb * 5 +
                           (size_t)step) % 9) - 4) * (1.0f / 4096);
}

static void k_check_(void *arg)
{
    const karg_ *a = (const karg_ *)arg;
    const uint16_t *e = exp_w[a->slot].data();
    for (size_t i = 0; i < a->n; i++)
        if (a->w[i] != e[i]) {
            FAIL("WEIGHTS: step %d mb %d pos %d slot %d element %zu: "
                 "kernel reads %04x, expected %04x\n", a->step, a->mb,
                 a->pos, a->slot, i, a->w[i], e[i]);
            return;
        }
}

static void k_grad_(void *arg)
{
    const karg_ *a = (const karg_ *)arg;
    for (size_t i = 0; i < used_; i++)
        a->dw[i] = bf16_from_f32(bf16_to_f32(a->dw[i]) + grad_of_(i, a->layer, a->mb,
                                                    a->step));
    if (a->poison)
        a->dw[0] = 0x7f80; /* +inf */
}

static void launch_(gpt_cuda *g, void (*fn)(void *), const bf16 *w, bf16 *dw,
                    int s, int l, int mb, int step, int p, size_t n)
{
    int poison = s == poison_slot_ && step == poison_step_ &&
                 l == poison_layer_ && mb == poison_mb_;
    karg_ *a = new karg_{w, dw, s, l, mb, step, p, n, poison};
    kargs_.push_back(a);
    mock_launch(g->stream, fn, a);
}

/* gpt_cuda.cu's run_pass_ with fake layers; counts the intervals (maximal
 * runs of positions of one offloaded slot) it should fetch and drain */
static void run_pass_(gpt_cuda *g, int p0, int p1, int last, int mb, int step)
{
    const int L = g->cfg.n_layer;
    int off = g->n_res < g->S, prev = -1, prev_bwd = 0;
    if (off)
        gpt_offload_pass_begin(g, p0, p1, last);
    for (int p = p0; p < p1; p++) {
        int l = p < L ? p : 2 * L - 1 - p, s = g->slot_of[l];
        if (s < g->n_res) {
            if (off)
                gpt_offload_poll(g);
            launch_(g, k_check_, NULL, NULL, s, l, mb, step, p, 0);
            if (prev >= 0 && prev_bwd)
                drains_++;
            prev = -1;
            continue;
        }
        if (s != prev) {
            if (prev >= 0 && prev_bwd)
                drains_++;
            fetches_++;
            prev_bwd = 0;
        }
        prev = s;
        prev_bwd |= p >= L;
        bf16 *w, *dw;
        gpt_offload_enter(g, p, &w, &dw);
        launch_(g, k_check_, w, dw, s, l, mb, step, p, g->slot_size);
        if (p >= L)
            launch_(g, k_grad_, w, dw, s, l, mb, step, p, g->slot_size);
        gpt_offload_leave(g, p);
    }
    if (prev >= 0 && prev_bwd)
        drains_++;
}

/* gpt_cuda_synchronize */
static void synchronize_(gpt_cuda *g)
{
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (g->off.enabled) {
        CUDA_CHECK(cudaStreamSynchronize(g->off.copy));
        CUDA_CHECK(cudaStreamSynchronize(g->off.drain));
        gpt_offload_wait_idle(g);
    }
}

/* After synchronize_: host state of every offloaded slot = the reference. */
static void check_state_(gpt_cuda *g, const char *when, int step)
{
    size_t ss = g->slot_size;
    for (int s = g->n_res; s < g->S; s++) {
        const hslot_ *h = &g->off.hs[s - g->n_res];
        const ref_ &R = ref[s];
        if (memcmp(h->master, R.master.data(), ss * sizeof(float)))
            FAIL("STATE %s step %d slot %d: master differs\n", when, step, s);
        if (memcmp(h->m, R.m.data(), ss * sizeof(float)))
            FAIL("STATE %s step %d slot %d: m differs\n", when, step, s);
        if (memcmp(h->v, R.v.data(), ss * sizeof(float)))
            FAIL("STATE %s step %d slot %d: v differs\n", when, step, s);
        for (size_t i = 0; i < ss; i++)
            if (h->wbf[i] != bf16_from_f32(R.master[i])) {
                FAIL("WBF %s step %d slot %d element %zu: %04x, expected "
                     "%04x\n", when, step, s, i, h->wbf[i],
                     bf16_from_f32(R.master[i]));
                break;
            }
        if (g->adam_t_slot[s] != R.t)
            FAIL("T %s step %d slot %d: %ld, expected %ld\n", when, step, s,
                 g->adam_t_slot[s], R.t);
    }
}

/* gpt_cuda_get_offload_stats against what the passes should have copied */
static void check_stats_(gpt_cuda *g, const config_ *c)
{
    gpt_cuda_offload_stats st;
    size_t ss = g->slot_size, n_off = (size_t)(c->S - c->n_res);
    int n_stg = c->n_staging < TIMING_RING / 2 ? c->n_staging
                                               : TIMING_RING / 2;
    gpt_cuda_get_offload_stats(g, &st);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        FAIL("STATS: sticky error %s after gpt_cuda_get_offload_stats\n",
             cudaGetErrorName(e));
    if (st.n_slots != c->S || st.n_resident != c->n_res ||
        st.n_offloaded != (int)n_off || st.n_staging != n_stg)
        FAIL("STATS: slots %d/%d/%d staging %d, expected %d/%d/%zu %d\n",
             st.n_slots, st.n_resident, st.n_offloaded, st.n_staging, c->S,
             c->n_res, n_off, n_stg);
    size_t stg = n_off ? (size_t)n_stg * 2 * ss * sizeof(bf16) : 0;
    if (st.staging_bytes != stg || st.device_bytes != stg)
        FAIL("STATS: staging %zu device %zu bytes, expected %zu\n",
             st.staging_bytes, st.device_bytes, stg);
    /* streamed: no accumulator and no landing buffer per slot, the pool's
     * buffers instead (while a slot is offloaded) */
    size_t pin = (c->gbufs ? 1 : 2) * ss * sizeof(uint16_t);
    size_t pool = n_off ? (size_t)c->gbufs * ss * sizeof(uint16_t) : 0;
    size_t fl = c->gbufs ? 3 : 4;
    if (st.host_bytes != n_off * (fl * ss * sizeof(float) + pin) + pool ||
        st.pinned_bytes != n_off * pin + pool)
        FAIL("STATS: host %zu pinned %zu bytes, expected %zu %zu\n",
             st.host_bytes, st.pinned_bytes,
             n_off * (fl * ss * sizeof(float) + pin) + pool,
             n_off * pin + pool);
    if (st.n_grad_bufs != (n_off ? c->gbufs : 0) ||
        st.grad_buf_bytes != pool)
        FAIL("STATS: %d streamed gradient buffers of %zu bytes, expected "
             "%d, %zu\n", st.n_grad_bufs, st.grad_buf_bytes,
             n_off ? c->gbufs : 0, pool);

    size_t sb = c->spec ? n_off * (3 * ss * sizeof(float) + ss * 2) : 0;
    if (st.spec_bytes != sb || st.spec_pinned_bytes != (c->spec ? n_off * ss * 2 : 0))
        FAIL("STATS: second buffers %zu bytes (%zu pinned), expected %zu "
             "(14 per parameter)\n", st.spec_bytes, st.spec_pinned_bytes,
             sb);
    if (st.update_skips != (uint64_t)skips_)
        FAIL("STATS: %llu early updates skipped, expected %ld\n",
             (unsigned long long)st.update_skips, skips_);
    if (st.spec_steps != (uint64_t)spec_steps_ ||
        st.redo_steps != (uint64_t)redo_steps_)
        FAIL("STATS: %llu speculative steps, %llu redone; expected %ld, "
             "%ld\n", (unsigned long long)st.spec_steps,
             (unsigned long long)st.redo_steps, spec_steps_, redo_steps_);
    if (st.h2d_bytes != (uint64_t)fetches_ * ss * sizeof(bf16) ||
        st.d2h_bytes != (uint64_t)drains_ * ss * sizeof(bf16))
        FAIL("STATS: h2d %llu d2h %llu bytes, expected %ld and %ld slot "
             "copies of %zu\n", (unsigned long long)st.h2d_bytes,
             (unsigned long long)st.d2h_bytes, fetches_, drains_,
             ss * sizeof(bf16));
}

/* the reference AdamW of slot s: adam_range_'s arithmetic, serially */
static void ref_adamw_(const gpt_cuda *g, int s, float lr, float b1, float b2,
                       float eps, float wd, float scale)
{
    ref_ &R = ref[s];
    long t = ++R.t;
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    for (int k = 0; k < SLOT_NTENSORS; k++) {
        float w = g->slot[k].two_d ? wd : 0.0f;
        size_t a = g->slot[k].off, b = a + g->slot[k].numel;
        for (size_t i = a; i < b; i++) {
            float gr = R.g[i] * scale;
            float mi = b1 * R.m[i] + (1.0f - b1) * gr;
            float vi = b2 * R.v[i] + (1.0f - b2) * gr * gr;
            float mhat = mi / bc1, vhat = vi / bc2;
            float p = R.master[i];
            p -= lr * (mhat / (sqrtf(vhat) + eps) + w * p);
            R.m[i] = mi;
            R.v[i] = vi;
            R.master[i] = p;
        }
    }
}

/* gpt_cuda.cu's slot layout (the same inline function) */
static void layout_(gpt_cuda *g)
{
    used_ = slot_layout_(g);
}

static int run_seed_(unsigned seed)
{
    std::mt19937 r(seed);
    config_ c;
    static const int delays_us[] = {0, 20, 100, 300};
    c.L = 1 + (int)(r() % 8);
    c.S = 1 + (int)(r() % (unsigned)c.L);
    c.C = 8 * (1 + (int)(r() % 4));
    /* mostly some slots offloaded; now and then none (runtime idle) */
    c.n_res = r() % 10 == 0 ? c.S : (int)(r() % (unsigned)c.S);
    c.n_staging = 1 + (int)(r() % 4);
    c.threads = 1 + (int)(r() % 4);
    c.M = 1 + (int)(r() % 4);
    c.steps = 3 + (int)(r() % 4);
    c.map = r() % 6 == 0 ? 2 : (int)(r() % 2);
    if (c.map == 2 && c.n_res == 0)
        c.map = 1;
    c.gpu_threads = 2 + (int)(r() % 2);
    c.delay_us = delays_us[r() % 4];
    /* a stream of its own, so that each seed's other draws are what they
     * were before speculation existed */
    std::mt19937 r2(seed ^ 0x5bd1e995u);
    c.spec = (int)(r2() % 2);
    spec_steps_ = redo_steps_ = skips_ = 0;
    /* and one more for streaming, drawn last */
    std::mt19937 r3(seed ^ 0x9e3779b9u);
    c.gbufs = r3() % 3 == 0 && c.map != 1 ? 1 + (int)(r3() % 3) : 0;
    if (c.gbufs) {
        c.M = 1;
        c.spec = 0;
    }

    gpt_cuda *g = (gpt_cuda *)calloc(1, sizeof *g);
    g->cfg.n_layer = c.L;
    g->cfg.n_embd = c.C;
    g->cfg.n_head = 1;
    g->cfg.vocab_size = 16;
    g->cfg.seq_len = 4;
    layout_(g);
    g->slot_of = (int *)calloc((size_t)c.L, sizeof(int));
    for (int l = 0; l < c.L; l++) /* maps 1, 2: some slots go unused */
        g->slot_of[l] = c.map == 0 ? (int)((long)l * c.S / c.L)
                        : (int)(r() % (unsigned)(c.map == 1 ? c.S : c.n_res));
    size_t ss = g->slot_size;
    printf("seed %u: L=%d S=%d C=%d slot=%zu (used %zu) n_res=%d "
           "staging=%d threads=%d M=%d gpu_threads=%d delay=%dus spec=%d "
           "gbufs=%d map=", seed, c.L, c.S, c.C, ss, used_, c.n_res,
           c.n_staging, c.threads, c.M, c.gpu_threads, c.delay_us, c.spec,
           c.gbufs);
    for (int l = 0; l < c.L; l++)
        printf("%d", g->slot_of[l]);
    printf("\n");

    /* gpt_cuda_create_offload */
    mock_start(seed, c.gpu_threads, c.delay_us);
    CUDA_CHECK(cudaStreamCreate(&g->stream));
    gpt_cuda_offload oc = {c.n_res, c.n_staging, c.threads, c.spec, c.gbufs};
    if (gpt_offload_init(g, &oc) != 0) {
        FAIL("gpt_offload_init failed\n");
        return 1;
    }
    printf("  chunk %zu elements\n", g->off.chunk);
    int failed = 0;
    hslot_ *hs = gpt_offload_alloc_slots(g, c.S, c.n_res, NULL, &failed);
    if (failed) {
        FAIL("gpt_offload_alloc_slots failed\n");
        return 1;
    }
    g->S = c.S;
    g->n_res = c.n_res;
    g->off.hs = hs;
    g->adam_t_slot = (long *)calloc((size_t)c.S, sizeof(long));
    if (c.n_res < c.S && gpt_offload_set_staging(g, 1) != 0) {
        FAIL("gpt_offload_set_staging failed\n");
        return 1;
    }
    /* gpt_cuda_set_state: masters (padding zero), then the bf16 copies */
    ref.assign((size_t)c.S, ref_());
    exp_w.assign((size_t)c.S, std::vector<uint16_t>(ss, 0));
    for (int s = c.n_res; s < c.S; s++) {
        hslot_ *h = &hs[s - c.n_res];
        ref_ &R = ref[s];
        R.master.assign(ss, 0.0f);
        R.m.assign(ss, 0.0f);
        R.v.assign(ss, 0.0f);
        R.g.assign(ss, 0.0f);
        R.t = 0;
        for (size_t i = 0; i < used_; i++)
            h->master[i] = R.master[i] =
                0.01f * (float)((i * 13 + (size_t)s) % 17) - 0.08f;
        gpt_offload_refresh_bf16(g, s);
        for (size_t i = 0; i < ss; i++)
            exp_w[s][i] = bf16_from_f32(R.master[i]);
    }

    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const int L = c.L, off = c.n_res < c.S;
    for (int step = 0; step < c.steps; step++) {
        /* gpt_cuda_step_begin: max_norm 0 means early updates (always,
         * streamed) */
        int early = (int)(r() % 2) || c.gbufs;
        /* discarded: microbatches without last, then the next step_begin
         * (as tests/gpu/test_offload.cu around a delink) */
        int discard = step < c.steps - 1 && r() % 5 == 0 && !c.gbufs;
        float max_norm = early ? 0.0f : (r() % 2 ? 1e-3f : 100.0f);
        /* failed: a clipped step whose last microbatch ran (its
         * speculative updates queued) but that never reaches adamw, as
         * when its norm is not finite */
        int failed = !early && !discard && step < c.steps - 1 &&
                     r2() % 5 == 0;
        g->off.early = 0; /* gpt_cuda_zero_grad */
        g->off.speculate = 0;
        if (off)
            gpt_offload_step_begin(g);
        g->off.early = max_norm <= 0.0f;
        g->off.speculate = !g->off.early && g->off.speculative && off;
        g->off.lr = lr;
        g->off.beta1 = b1;
        g->off.beta2 = b2;
        g->off.eps = eps;
        g->off.wd = wd;
        for (int s = c.n_res; s < c.S; s++)
            std::fill(ref[s].g.begin(), ref[s].g.end(), 0.0f);
        /* now and then an early step poisons one offloaded slot in its
         * last microbatch (a layer that uses it) */
        poison_slot_ = poison_step_ = poison_layer_ = -1;
        poison_mb_ = c.M - 1;
        if (early && !discard && off && r3() % 4 == 0) {
            int l = (int)(r3() % (unsigned)L);
            if (g->slot_of[l] >= c.n_res) {
                poison_slot_ = g->slot_of[l];
                poison_layer_ = l;
                poison_step_ = step;
            }
        }
        for (int mb = 0; mb < c.M; mb++) {
            int last = mb == c.M - 1 && !discard;
            /* streamed: gpt_cuda_train_microbatch only (a drain by
             * gpt_cuda_backward is not final: the runtime refuses it) */
            int fused = r() % 3 != 0 || c.gbufs;
            /* a poisoned slot's update is skipped on the early path only
             * (gpt_cuda_backward's drains are not final: gpt_offload_adamw
             * updates, and only once the trainer found the norm finite) */
            if (mb == c.M - 1 && !fused)
                poison_slot_ = -1;
            if (fused) { /* gpt_cuda_train_microbatch */
                run_pass_(g, 0, 2 * L, last, mb, step);
                CUDA_CHECK(cudaStreamSynchronize(g->stream));
            } else {            /* gpt_cuda_forward + gpt_cuda_backward */
                run_pass_(g, 0, L, 0, mb, step);
                CUDA_CHECK(cudaStreamSynchronize(g->stream)); /* loss */
                run_pass_(g, L, 2 * L, 0, mb, step); /* no wait after */
            }
            for (int l = 0; l < L; l++) {
                int s = g->slot_of[l];
                if (s >= c.n_res)
                    for (size_t i = 0; i < used_; i++)
                        ref[s].g[i] += grad_of_(i, l, mb, step);
            }
            if (poison_slot_ >= 0 && mb == c.M - 1)
                ref[poison_slot_].g[0] = INFINITY;
        }
        if (discard)
            continue;
        if (failed) {
            if (r2() % 2) { /* a checkpoint read after the failed step */
                synchronize_(g);
                check_state_(g, "after a failed step", step);
            }
            continue;
        }
        double rtot = 0.0;
        for (int s = c.n_res; s < c.S; s++)
            for (size_t i = 0; i < ss; i++)
                rtot += (double)ref[s].g[i] * ref[s].g[i];
        if (r() % 3 == 0 && off) { /* gpt_cuda_grad_norm in between */
            CUDA_CHECK(cudaStreamSynchronize(g->stream));
            double tot = gpt_offload_grad_sumsq(g);
            if (fabs(tot - rtot) > 1e-9 * (1.0 + rtot))
                FAIL("SUMSQ (grad_norm) step %d: %.17g, expected %.17g\n",
                     step, tot, rtot);
        }
        /* gpt_cuda_adamw */
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        double tot = off ? gpt_offload_grad_sumsq(g) : 0.0;
        if (fabs(tot - rtot) > 1e-9 * (1.0 + rtot))
            FAIL("SUMSQ step %d: %.17g, expected %.17g\n", step, tot, rtot);
        for (int s = c.n_res; s < c.S && !c.gbufs; s++) {
            /* the slot's gradient: the fp32 accumulator, or the landed
             * bf16 one where the slot was drained once this step
             * (streamed, the buffer may be back in the pool already: the
             * weights after the update check it) */
            const hslot_ *h = &g->off.hs[s - c.n_res];
            for (size_t i = 0; i < ss; i++) {
                float ga = h->g_in_bf ? bf16_to_f32(h->gbf[i]) : h->gacc[i];
                if (memcmp(&ga, &ref[s].g[i], sizeof(float))) {
                    FAIL("GRAD step %d slot %d element %zu: accumulated "
                         "%.9g, expected %.9g (%s)\n", step, s, i, ga,
                         ref[s].g[i], h->g_in_bf ? "gbf" : "gacc");
                    break;
                }
            }
        }
        float norm = sqrtf((float)tot), scale = 1.0f;
        if (max_norm > 0.0f && norm > max_norm)
            scale = max_norm / norm;
        if (off && g->off.speculate) {
            spec_steps_++;
            redo_steps_ += scale != 1.0f;
        }
        if (off)
            gpt_offload_adamw(g, lr, b1, b2, eps, wd, scale);
        for (int s = c.n_res; s < c.S; s++) {
            if (s == poison_slot_) /* skipped: state and count kept */
                skips_++;
            else
                ref_adamw_(g, s, lr, b1, b2, eps, wd, scale);
            if (g->adam_t_slot[s] != ref[s].t)
                FAIL("T step %d slot %d: %ld, expected %ld\n", step, s,
                     g->adam_t_slot[s], ref[s].t);
            /* what kernels read from now on (none is queued: the
             * stream was synchronised above) */
            for (size_t i = 0; i < ss; i++)
                exp_w[s][i] = bf16_from_f32(ref[s].master[i]);
        }
        if (r() % 2) { /* evaluation: gpt_cuda_forward right after */
            run_pass_(g, 0, L, 0, -1, step);
            CUDA_CHECK(cudaStreamSynchronize(g->stream));
        }
        if (r() % 2) { /* gpt_cuda_synchronize, then read the state */
            synchronize_(g);
            check_state_(g, "after adamw", step);
        }
        if (off && r() % 2)
            check_stats_(g, &c);
    }

    /* gpt_cuda_free */
    synchronize_(g);
    check_state_(g, "final", c.steps);
    check_stats_(g, &c);
    if (c.n_res < c.S && g->off.n_gfree != c.gbufs) /* streamed, idle */
        FAIL("POOL: %d streamed gradient buffers back, expected %d\n",
             g->off.n_gfree, c.gbufs);
    gpt_offload_free_slots(g, g->off.hs, c.S - c.n_res);
    gpt_offload_fini(g);
    free(g->adam_t_slot);
    CUDA_CHECK(cudaStreamDestroy(g->stream));
    free(g->slot_of);
    free(g);
    mock_stop();
    long me = mock_errors();
    printf("  %ld fetches, %ld drains, %zu kernels; errors %ld, CUDA API "
           "misuses %ld\n", fetches_, drains_, kargs_.size(), (long)errors_,
           me);
    for (karg_ *a : kargs_)
        delete a;
    kargs_.clear();
    return errors_ != 0 || me != 0;
}

/* ------------------------------------------------------------ seeds */

typedef struct {
    pid_t pid;
    unsigned seed;
    FILE *out;
} child_;

static int usage_(const char *argv0)
{
    fprintf(stderr, "usage: %s [-v] [-j JOBS] [-t SECONDS] [-f FIRST] SEEDS\n"
                    "       %s --one SEED\n", argv0, argv0);
    return 2;
}

static child_ spawn_(unsigned seed, int timeout_s)
{
    child_ ch = {0, seed, tmpfile()};
    if (!ch.out) {
        perror("tmpfile");
        exit(2);
    }
    fflush(NULL);
    ch.pid = fork();
    if (ch.pid < 0) {
        perror("fork");
        exit(2);
    }
    if (ch.pid == 0) {
        dup2(fileno(ch.out), 1);
        dup2(fileno(ch.out), 2);
        setvbuf(stdout, NULL, _IOLBF, 0);
        alarm((unsigned)timeout_s);
        int rc = run_seed_(seed);
        fflush(NULL);
        exit(rc); /* exit, not _exit: ThreadSanitizer's report at exit */
    }
    return ch;
}

/* Reap one child; 1 when its seed (*seed) failed, then with its output
 * printed. */
static int reap_(std::vector<child_> &run, int verbose, int timeout_s,
                 unsigned *seed)
{
    int status;
    pid_t pid = wait(&status);
    if (pid < 0) {
        perror("wait");
        exit(2);
    }
    size_t k = 0;
    while (k < run.size() && run[k].pid != pid)
        k++;
    if (k == run.size())
        return 0;
    child_ ch = run[k];
    run.erase(run.begin() + (long)k);
    *seed = ch.seed;
    std::string text;
    char buf[4096];
    size_t n;
    rewind(ch.out);
    while ((n = fread(buf, 1, sizeof buf, ch.out)) > 0)
        text.append(buf, n);
    fclose(ch.out);
    char why[128] = "";
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        snprintf(why, sizeof why, "timed out after %d s (a deadlock?)",
                 timeout_s);
    else if (WIFSIGNALED(status))
        snprintf(why, sizeof why, "killed by signal %d (%s)",
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (WEXITSTATUS(status) != 0)
        snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
    else if (text.find("ThreadSanitizer") != std::string::npos)
        snprintf(why, sizeof why, "ThreadSanitizer report");
    if (why[0]) {
        printf("seed %u: FAILED (%s)\n", ch.seed, why);
        printf("---- output of seed %u\n%s---- end of seed %u\n", ch.seed,
               text.c_str(), ch.seed);
    } else if (verbose) {
        fputs(text.c_str(), stdout);
    }
    fflush(stdout);
    return why[0] != 0;
}

int main(int argc, char **argv)
{
    int verbose = 0, jobs = 1, timeout_s = 60;
    long first = 1, n = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--one") && i + 1 < argc) {
            setvbuf(stdout, NULL, _IOLBF, 0);
            int rc = run_seed_((unsigned)strtoul(argv[i + 1], NULL, 10));
            printf("seed %s: %s\n", argv[i + 1], rc ? "FAILED" : "ok");
            return rc;
        } else if (!strcmp(a, "-v")) {
            verbose = 1;
        } else if (!strcmp(a, "-j") && i + 1 < argc) {
            jobs = atoi(argv[++i]);
        } else if (!strcmp(a, "-t") && i + 1 < argc) {
            timeout_s = atoi(argv[++i]);
        } else if (!strcmp(a, "-f") && i + 1 < argc) {
            first = atol(argv[++i]);
        } else if (a[0] != '-' && n < 0) {
            n = atol(a);
        } else {
            return usage_(argv[0]);
        }
    }
    if (n < 1 || jobs < 1 || timeout_s < 1 || first < 0)
        return usage_(argv[0]);

    std::vector<child_> run;
    std::vector<unsigned> failed;
    unsigned next = (unsigned)first, end = (unsigned)(first + n);
    while (next < end || !run.empty()) {
        while (next < end && (int)run.size() < jobs)
            run.push_back(spawn_(next++, timeout_s));
        unsigned seed;
        if (reap_(run, verbose, timeout_s, &seed))
            failed.push_back(seed);
    }
    std::sort(failed.begin(), failed.end());
    printf("%s: %ld seeds (%ld to %ld), %zu failed", argv[0], n, first,
           first + n - 1, failed.size());
    for (size_t i = 0; i < failed.size(); i++)
        printf("%s%u", i ? " " : ": ", failed[i]);
    printf("\n");
    return failed.empty() ? 0 : 1;
}
