/*
 * test_moe.cu — the CUDA MoE ops (kernels/cuda/moe.cu) against the CPU ops
 * (kernels/cpu/moe.c, themselves checked against brute force and finite
 * differences by tests/unit/test_moe.c) on the same inputs. Exit 0 all
 * passed, 1 a check failed, 77 no CUDA device. Runs on the H200 and on the
 * CUDA emulation (emu_gpu_moe).
 *
 * Inputs are drawn in fp32 and rounded to bf16; both backends get the
 * rounded values. Every output and scratch buffer of the GPU op starts as
 * NaN; gradients start from random values and are compared as increments.
 *
 * What must agree exactly: every routing decision (the chosen expert of
 * each (token, prototype), processed or dropped, counts, routed, dropped
 * total). The inputs are drawn with a margin between each prototype's top
 * two logits (> 1e-2), far above the fp32 summation-order noise of the
 * gate GEMM (~1e-6), so both backends see the same argmax.
 *
 * Tolerances (normalised L2 error, as test_ops.cu):
 *  TOL_F32  1e-5  probs and lse: fp32 from the same bf16 inputs; only the
 *                 GEMM's summation order and expf/logf differ.
 *  TOL_LOSS 1e-5  aux and z: fp32 sums of those (relative).
 *  TOL_OUT  2e-2  out: bf16 rounding of xe (exact), hpre, hact, ye and out
 *                 (4 roundings of 2^-9) after fp32 GEMMs; 5x margin.
 *  TOL_GRAD 3e-2  gradients: the backward reads the bf16-rounded forward
 *                 values and rounds dye, dh (twice: GEMM output and GELU'),
 *                 dxe and dlogits once more each; plus bf16 accumulation.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cuda_check.h"
#include "kernels_cuda.h"

#define TOL_F32 1e-5
#define TOL_LOSS 1e-5
#define TOL_OUT 2e-2
#define TOL_GRAD 3e-2

#include "op_check.cuh"

/* the host copy of a device array (any element type) */
template <typename X> static X *hget_(const X *d, size_t n)
{
    return hcopy_dev_(d, n);
}

/* ---------------------------------------------------------------- case */

/* Draw x and Wg until every (token, prototype)'s top-two logits (as the
 * CPU computes them) differ by more than 1e-2. */
static void draw_router_(float *x, float *wg, float *bg, const moe_dims *d,
                         int empty_bias)
{
    const int N = d->N, C = d->C, E = d->E, Ep = E / d->k;
    for (int tries = 0; tries < 1000; tries++) {
        for (size_t i = 0; i < (size_t)N * C; i++) x[i] = bf_(2 * urand_() - 1);
        for (size_t i = 0; i < (size_t)E * C; i++) wg[i] = bf_(2 * urand_() - 1);
        for (int e = 0; e < E; e++) bg[e] = bf_(0.4f * urand_() - 0.2f);
        if (empty_bias) bg[1] = bg[E - 2] = bf_(-1e4f);
        double margin = INFINITY;
        for (int n = 0; n < N; n++)
            for (int p = 0; p < d->k; p++) {
                double a = -INFINITY, b = -INFINITY;
                for (int j = 0; j < Ep; j++) {
                    int e = p * Ep + j;
                    double z = bg[e];
                    for (int c = 0; c < C; c++) z += (double)x[n * C + c] * wg[e * C + c];
                    if (z > a) b = a, a = z;
                    else if (z > b) b = z;
                }
                if (a - b < margin) margin = a - b;
            }
        if (margin > 1e-2) return;
    }
    fprintf(stderr, "test_moe: no draw with a routing margin\n");
    exit(1);
}

/* empty: experts 1 and E-2 get a gate bias of -1e4 (no tokens); ties: a
 * zero gate with experts 1 and 2 of every prototype tied at the top (bias
 * 0.5, the others 0): every token must go to expert 1 of each prototype. */
static void run_case_(int N, int C, int E, int k, int H, double cf,
                      int empty, int ties = 0)
{
    moe_dims d = {N, C, E, k, H, moe_capacity(cf, N, E, k), 0};
    const int cap = d.capacity, rows = E * cap;
    const size_t NK = (size_t)N * k;
    printf("moe N=%d C=%d E=%d k=%d H=%d cf=%.2f cap=%d%s\n", N, C, E, k, H,
           cf, cap, empty ? " (two empty experts)" : "");

    float *x = (float *)malloc((size_t)N * C * sizeof(float));
    float *wg = (float *)malloc((size_t)E * C * sizeof(float));
    float *bg = (float *)malloc((size_t)E * sizeof(float));
    draw_router_(x, wg, bg, &d, empty);
    if (ties) {
        memset(wg, 0, (size_t)E * C * sizeof *wg);
        for (int e = 0; e < E; e++)
            bg[e] = (e % (E / k) == 1 || e % (E / k) == 2) ? 0.5f : 0.0f;
    }
    float *w1 = hrand_((size_t)E * H * C, -0.5f, 0.5f), *b1 = hrand_((size_t)E * H, -0.2f, 0.2f);
    float *w2 = hrand_((size_t)E * C * H, -0.5f, 0.5f), *b2 = hrand_((size_t)E * C, -0.2f, 0.2f);
    float *dout = hrand_((size_t)N * C, -1, 1);
    /* large enough that a missing aux or z term shows above TOL_GRAD */
    const float daux = 0.5f, dz = 0.5f;

    /* ---- CPU reference (compact dispatch) */
    float *probs = (float *)malloc((size_t)N * E * 4), *lse = (float *)malloc(NK * 4);
    int32_t *expert = (int32_t *)malloc(NK * 4), *slot = (int32_t *)malloc(NK * 4);
    int32_t *counts = (int32_t *)malloc(E * 4), *routed = (int32_t *)malloc(E * 4);
    int32_t *offset = (int32_t *)malloc((E + 1) * 4), *row_token = (int32_t *)malloc(NK * 4);
    float *xe = (float *)malloc(NK * C * 4), *hpre = (float *)malloc(NK * H * 4);
    float *hact = (float *)malloc(NK * H * 4), *ye = (float *)malloc(NK * C * 4);
    float *out = (float *)malloc((size_t)N * C * 4);
    int dropped = moe_route(probs, lse, expert, slot, counts, routed, offset,
                            row_token, x, wg, bg, &d);
    moe_forward(out, xe, hpre, hact, ye, x, probs, expert, slot, offset,
                row_token, w1, b1, w2, b2, &d);
    float aux[2];
    moe_aux_losses(&aux[0], &aux[1], probs, lse, routed, &d);
    size_t gsz[7] = {(size_t)N * C, (size_t)E * C, (size_t)E,
                     (size_t)E * H * C, (size_t)E * H, (size_t)E * C * H,
                     (size_t)E * C};
    static const char *gname[7] = {"dx", "dwg", "dbg", "dw1", "db1", "dw2", "db2"};
    float *g0[7], *gc[7];
    for (int i = 0; i < 7; i++) {
        g0[i] = hrand_(gsz[i], -0.1f, 0.1f);
        gc[i] = (float *)malloc(gsz[i] * 4);
        memcpy(gc[i], g0[i], gsz[i] * 4);
    }
    float *s_dye = (float *)malloc(NK * C * 4), *s_dh1 = (float *)malloc(NK * H * 4);
    float *s_dh2 = (float *)malloc(NK * H * 4), *s_dxe = (float *)malloc(NK * C * 4);
    float *s_dl = (float *)malloc((size_t)N * E * 4);
    moe_backward(gc[0], gc[1], gc[2], gc[3], gc[4], gc[5], gc[6], s_dye, s_dh1,
                 s_dh2, s_dxe, s_dl, dout, x, probs, lse, expert, slot, routed,
                 offset, xe, hpre, hact, ye, wg, w1, w2, daux, dz, &d);

    /* ---- GPU, every output and scratch NaN to start */
    bf16 *dx_ = dbf_(x, (size_t)N * C), *dwg_ = dbf_(wg, (size_t)E * C), *dbg_ = dbf_(bg, E);
    bf16 *dw1_ = dbf_(w1, gsz[3]), *db1_ = dbf_(b1, gsz[4]);
    bf16 *dw2_ = dbf_(w2, gsz[5]), *db2_ = dbf_(b2, gsz[6]);
    float *gprobs = dnan_<float>((size_t)N * E), *glse = dnan_<float>(NK);
    int32_t *gexpert = dnan_<int32_t>(NK), *gslot = dnan_<int32_t>(NK);
    int32_t *gcounts = dnan_<int32_t>(E), *grouted = dnan_<int32_t>(E);
    int32_t *growtok = dnan_<int32_t>(rows), *gdropped = dnan_<int32_t>(1);
    moe_route_cuda(gprobs, glse, gexpert, gslot, gcounts, grouted, growtok,
                   gdropped, dx_, dwg_, dbg_, &d, st);
    bf16 *gxe = dnan_<bf16>((size_t)rows * C), *ghpre = dnan_<bf16>((size_t)rows * H);
    bf16 *ghact = dnan_<bf16>((size_t)rows * H), *gye = dnan_<bf16>((size_t)rows * C);
    bf16 *gout = dnan_<bf16>((size_t)N * C);
    moe_forward_cuda(gout, gxe, ghpre, ghact, gye, dx_, gprobs, gexpert, gslot,
                     growtok, dw1_, db1_, dw2_, db2_, &d, st);
    float *gaux = dnan_<float>(2);
    moe_aux_losses_cuda(gaux, gprobs, glse, grouted, &d, st);
    bf16 *gg[7];
    for (int i = 0; i < 7; i++) gg[i] = dbf_(g0[i], gsz[i]);
    bf16 *gdout = dbf_(dout, (size_t)N * C);
    void *scratch = dnan_<char>(moe_backward_scratch_bytes(&d));
    const moe_saved_cuda sv = {gprobs, glse, gexpert, gslot, grouted,
                               growtok, gxe, ghpre, ghact, gye};
    moe_backward_cuda(gg[0], gg[1], gg[2], gg[3], gg[4], gg[5], gg[6], scratch,
                      gdout, dx_, &sv, dwg_, dw1_, dw2_, daux, dz, &d, st);

    /* ---- routing: exact */
    int32_t *he = hget_(gexpert, NK), *hs = hget_(gslot, NK);
    int32_t *hc = hget_(gcounts, E), *hr = hget_(grouted, E), *hd = hget_(gdropped, 1);
    int same = 1;
    for (size_t i = 0; i < NK; i++)
        same &= he[i] == expert[i] && (hs[i] >= 0) == (slot[i] >= 0);
    check_true_("routing decisions equal", same);
    same = hd[0] == dropped;
    for (int e = 0; e < E; e++) same &= hc[e] == counts[e] && hr[e] == routed[e];
    check_true_("counts, routed, dropped equal", same);
    printf("  (dropped %d of %zu pairs)\n", dropped, NK);
    /* a used slot holds a row of its expert's block */
    same = 1;
    for (size_t i = 0; i < NK; i++)
        if (hs[i] >= 0) same &= hs[i] / cap == he[i];
    check_true_("slots inside their expert", same);
    if (ties) {
        same = 1;
        for (size_t i = 0; i < NK; i++)
            same &= he[i] == (int)(i % k) * (E / k) + 1;
        check_true_("ties to the lowest index", same);
    }

    float *hp = hget_(gprobs, (size_t)N * E), *hl = hget_(glse, NK), *ha = hget_(gaux, 2);
    check_("probs", hp, probs, NULL, (size_t)N * E, TOL_F32);
    check_("lse", hl, lse, NULL, NK, TOL_F32);
    check_("aux, z", ha, aux, NULL, 2, TOL_LOSS);
    float *ho = hbf_(gout, (size_t)N * C);
    check_("out", ho, out, NULL, (size_t)N * C, TOL_OUT);
    for (int i = 0; i < 7; i++) {
        float *h = hbf_(gg[i], gsz[i]);
        char what[64];
        snprintf(what, sizeof what, "%s (increment)", gname[i]);
        check_(what, h, gc[i], g0[i], gsz[i], TOL_GRAD);
        if (i >= 3 && (empty || ties)) { /* experts no token reached (the
                       * CPU's routing): untouched, to the bit, though every
                       * scratch buffer started as NaN */
            int per = (int)(gsz[i] / E), z = 1, none = 0;
            for (int e = 0; e < E; e++) {
                if (routed[e] != 0)
                    continue;
                none++;
                for (int j = 0; j < per; j++)
                    z &= h[(size_t)e * per + j] == g0[i][(size_t)e * per + j];
            }
            /* the cases that make them: two empty experts; ties, every
             * token on expert 1 of its prototype */
            int want = empty ? 2 : E - k;
            snprintf(what, sizeof what, "%s of %d experts without tokens "
                     "exact", gname[i], none);
            check_true_(what, z && none == want);
        }
        free(h);
    }

    /* moe_backward_first_cuda: dx written over NaN (the CPU's increment),
     * the weight gradients still added */
    bf16 *fg[7];
    fg[0] = dnan_<bf16>(gsz[0]);
    for (int i = 1; i < 7; i++) fg[i] = dbf_(g0[i], gsz[i]);
    moe_backward_first_cuda(fg[0], fg[1], fg[2], fg[3], fg[4], fg[5], fg[6],
                            scratch, gdout, dx_, &sv, dwg_, dw1_, dw2_, daux,
                            dz, &d, st);
    float *want_dx = (float *)malloc(gsz[0] * 4);
    for (size_t j = 0; j < gsz[0]; j++)
        want_dx[j] = gc[0][j] - g0[0][j];
    for (int i = 0; i < 7; i++) {
        float *h = hbf_(fg[i], gsz[i]);
        char what[64];
        snprintf(what, sizeof what, "%s (first: %s)", gname[i],
                 i ? "increment" : "written");
        if (i == 0)
            check_(what, h, want_dx, NULL, gsz[i], TOL_GRAD);
        else
            check_(what, h, gc[i], g0[i], gsz[i], TOL_GRAD);
        free(h);
        cudaFree(fg[i]);
    }
    free(want_dx);
    free(he), free(hs), free(hc), free(hr), free(hd), free(hp), free(hl);
    free(ha), free(ho);
}

int main(void)
{
    cuda_device_or_skip("test_moe");
    CUDA_CHECK(cudaStreamCreate(&st));
    run_case_(64, 32, 8, 2, 48, 1.0, 0);   /* some drops */
    run_case_(48, 16, 8, 1, 32, 2.0, 0);   /* k = 1: Switch */
    run_case_(40, 24, 16, 4, 16, 0.5, 0);  /* many drops */
    run_case_(300, 16, 8, 2, 16, 1.25, 0); /* N > one capacity chunk (256) */
    run_case_(32, 16, 8, 2, 16, 1.5, 1);   /* empty experts, NaN buffers */
    run_case_(24, 16, 8, 2, 16, 1.0, 0, 1); /* exact ties, heavy drops:
                                             * forced routing */
    matmul_cuda_fini();
    printf("%d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
