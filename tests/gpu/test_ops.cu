/*
 * test_ops.cu — every CUDA op against the CPU reference (kernels/cpu/) on the
 * same inputs, forward and backward. Exit 0 all passed, 1 a check failed,
 * 77 no CUDA device.
 *
 * Inputs are drawn in fp32, rounded to bf16, and the rounded values go to
 * both backends, so the only differences are the GPU's bf16 outputs and
 * summation order. Error measure (ggml's test-backend-ops style): the
 * normalised L2 error  ||got - want|| / ||want||  with a per-check limit.
 * Backward ops accumulate: gradient buffers start from random values and
 * the check compares the increments (got - start vs want - start), so an op
 * that overwrote instead of adding would fail. Their *_first variants write
 * the activation gradient: it starts as NaN (an op that read it would
 * fail) and is compared with the CPU op's from zero, while the weight
 * gradients start random and must still accumulate; same tolerances, the
 * arithmetic being the same less one add.
 *
 * Tolerances and their reasons:
 *  TOL_BF16 1e-2  one bf16 rounding of each output (relative 2^-9 = 0.2%)
 *                 plus fp32 summation-order noise; 5x margin.
 *  TOL_ATT  2e-2  attention backward also uses the bf16-rounded forward
 *                 output for D = dout.out and recomputes probabilities from
 *                 a saved log-sum-exp: two more roundings of ~0.2%.
 *  TOL_F32  1e-4  fp32 outputs from identical inputs (LayerNorm statistics,
 *                 losses, AdamW state): order of summation and FMA only.
 *  Attention on the tensor cores (test_attention_impls_):
 *  TOL_ATT_TC_OUT 1e-2  the probabilities go into P V as bf16 (one more
 *                 2^-9 rounding per weight, averaged over the keys) and the
 *                 output is rounded once: TOL_BF16.
 *  TOL_ATT_TC_LSE 1e-4  the lse is fp32 from exact bf16 products (the
 *                 tensor cores' fp32 sums), against double: order only.
 *  TOL_ATT_TC_BWD 2e-2  as TOL_ATT, plus P and dS rounded to bf16 as
 *                 operands of dV, dK and dQ (two more 2^-9 roundings).
 * The CPU matmul needs CBLAS; the GEMM reference here is a plain loop in
 * double, so this test links with any kernels/cpu build.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels.h"
}
#include "cuda_check.h"
#include "expect_path.h"
#include "kernels_cuda.h"

#define TOL_BF16 1e-2
#define TOL_ATT 2e-2
#define TOL_F32 1e-4
#define TOL_ATT_TC_OUT 1e-2
#define TOL_ATT_TC_LSE 1e-4
#define TOL_ATT_TC_BWD 2e-2

#include "op_check.cuh"
#include "adamw_sr_check.cuh" /* test_adamw_sr_, test_adamw_sr_small_,
                                 * test_adafactor_sr_ */

/* the path taken, against $env (expect_path.h) */
static void check_path_(const char *env, const char *what, const char *got)
{
    n_checks++;
    n_failed += !expect_path_(env, what, got);
}

/* ------------------------------------------------ GEMM reference (double) */

static void ref_matmul_forward_(float *out, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += (double)inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = (float)s;
        }
}

static void ref_matmul_backward_(float *dinp, float *dw, float *dbias,
                                 const float *dout, const float *inp,
                                 const float *w, int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++)
                s += (double)dout[(size_t)n * OC + o] * w[(size_t)o * C + c];
            dinp[(size_t)n * C + c] += (float)s;
        }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += (double)dout[(size_t)n * OC + o] * inp[(size_t)n * C + c];
            dw[(size_t)o * C + c] += (float)s;
        }
        if (dbias) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += dout[(size_t)n * OC + o];
            dbias[o] += (float)s;
        }
    }
}

/* ------------------------------------------------------------- tests */

static void test_encoder_(void)
{
    const int B = 2, T = 37, C = 64, V = 50, N = B * T;
    printf("encoder (B=%d T=%d C=%d V=%d)\n", B, T, C, V);
    int32_t *inp = (int32_t *)malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) /* few distinct tokens: many repeats */
        inp[i] = (int32_t)(urand_() * 12) * 4;
    float *wte = hrand_((size_t)V * C, -1, 1), *wpe = hrand_((size_t)T * C, -1, 1);
    float *want = (float *)malloc((size_t)N * C * sizeof(float));
    encoder_forward(want, inp, wte, wpe, B, T, C);
    int32_t *d_inp = dcopy_(inp, N);
    bf16 *d_wte = dbf_(wte, (size_t)V * C), *d_wpe = dbf_(wpe, (size_t)T * C);
    bf16 *d_out = dnan_bf16_((size_t)N * C);
    encoder_forward_cuda(d_out, d_inp, d_wte, d_wpe, B, T, C, st);
    float *got = hbf_(d_out, (size_t)N * C);
    check_("encoder_forward out", got, want, NULL, (size_t)N * C, TOL_BF16);

    float *dout = hrand_((size_t)N * C, -1, 1);
    float *dwte0 = hrand_((size_t)V * C, -1, 1), *dwpe0 = hrand_((size_t)T * C, -1, 1);
    float *dwte = hcopy_(dwte0, (size_t)V * C), *dwpe = hcopy_(dwpe0, (size_t)T * C);
    encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    int32_t *plan = (int32_t *)malloc(encoder_plan_ints(N) * sizeof(int32_t));
    int nseg = encoder_backward_plan(plan, inp, N, V);
    check_true_("encoder_backward_plan segments", nseg > 0 && nseg <= 12);
    int32_t *d_plan = dcopy_(plan, encoder_plan_ints(N));
    bf16 *d_dout = dbf_(dout, (size_t)N * C);
    bf16 *d_dwte = dbf_(dwte0, (size_t)V * C), *d_dwpe = dbf_(dwpe0, (size_t)T * C);
    encoder_backward_cuda(d_dwte, d_dwpe, d_dout, d_plan, nseg, B, T, C, st);
    float *g1 = hbf_(d_dwte, (size_t)V * C), *g2 = hbf_(d_dwpe, (size_t)T * C);
    check_("encoder_backward dwte", g1, dwte, dwte0, (size_t)V * C, TOL_BF16);
    check_("encoder_backward dwpe", g2, dwpe, dwpe0, (size_t)T * C, TOL_BF16);
    /* nseg -1 (a graph's launch: B*T block columns, those past the plan's
     * count return): the same bits */
    bf16 *e_dwte = dbf_(dwte0, (size_t)V * C), *e_dwpe = dbf_(dwpe0, (size_t)T * C);
    encoder_backward_cuda(e_dwte, e_dwpe, d_dout, d_plan, -1, B, T, C, st);
    float *e1 = hbf_(e_dwte, (size_t)V * C), *e2 = hbf_(e_dwpe, (size_t)T * C);
    check_true_("encoder_backward nseg -1 = nseg, bit for bit",
                !memcmp(e1, g1, (size_t)V * C * sizeof(float)) &&
                !memcmp(e2, g2, (size_t)T * C * sizeof(float)));
    free(e1); free(e2); cudaFree(e_dwte); cudaFree(e_dwpe);
    free(inp); free(wte); free(wpe); free(want); free(got); free(dout);
    free(dwte0); free(dwpe0); free(dwte); free(dwpe); free(plan); free(g1); free(g2);
    cudaFree(d_inp); cudaFree(d_wte); cudaFree(d_wpe); cudaFree(d_out);
    cudaFree(d_plan); cudaFree(d_dout); cudaFree(d_dwte); cudaFree(d_dwpe);
}

static void test_layernorm_(int N, int C)
{
    size_t NC = (size_t)N * C;
    printf("layernorm (N=%d C=%d)\n", N, C);
    float *inp = hrand_(NC, -2, 3), *w = hrand_(C, 0.5f, 1.5f), *b = hrand_(C, -1, 1);
    float *out = (float *)malloc(NC * sizeof(float));
    float *mean = (float *)malloc(N * sizeof(float)), *rstd = (float *)malloc(N * sizeof(float));
    layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    bf16 *d_inp = dbf_(inp, NC), *d_w = dbf_(w, C), *d_b = dbf_(b, C);
    bf16 *d_out = dnan_bf16_(NC);
    float *d_mean = dnan_f32_(N), *d_rstd = dnan_f32_(N);
    layernorm_forward_cuda(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, st);
    float *g = hbf_(d_out, NC);
    float *gm = hcopy_dev_(d_mean, N), *gr = hcopy_dev_(d_rstd, N);
    check_("layernorm_forward out", g, out, NULL, NC, TOL_BF16);
    check_("layernorm_forward mean", gm, mean, NULL, N, TOL_F32);
    check_("layernorm_forward rstd", gr, rstd, NULL, N, TOL_F32);

    float *dout = hrand_(NC, -1, 1);
    float *dinp0 = hrand_(NC, -1, 1), *dw0 = hrand_(C, -1, 1), *db0 = hrand_(C, -1, 1);
    float *dinp = hcopy_(dinp0, NC), *dw = hcopy_(dw0, C), *db = hcopy_(db0, C);
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    bf16 *d_dout = dbf_(dout, NC), *d_dinp = dbf_(dinp0, NC);
    bf16 *d_dw = dbf_(dw0, C), *d_db = dbf_(db0, C);
    float *scratch = dnan_f32_(layernorm_backward_scratch_floats(N, C));
    layernorm_backward_cuda(d_dinp, d_dw, d_db, scratch, d_dout, d_inp, d_w,
                            d_mean, d_rstd, N, C, st);
    float *g1 = hbf_(d_dinp, NC), *g2 = hbf_(d_dw, C), *g3 = hbf_(d_db, C);
    check_("layernorm_backward dinp", g1, dinp, dinp0, NC, TOL_BF16);
    check_("layernorm_backward dweight", g2, dw, dw0, C, TOL_BF16);
    check_("layernorm_backward dbias", g3, db, db0, C, TOL_BF16);
    {   /* _first: dinp written from NaN, dweight and dbias += */
        float *zi = (float *)calloc(NC, sizeof(float));
        float *zw = hcopy_(dw0, C), *zb = hcopy_(db0, C);
        layernorm_backward(zi, zw, zb, dout, inp, w, mean, rstd, N, C);
        bf16 *f_dinp = dnan_bf16_(NC), *f_dw = dbf_(dw0, C), *f_db = dbf_(db0, C);
        layernorm_backward_first_cuda(f_dinp, f_dw, f_db, scratch, d_dout,
                                      d_inp, d_w, d_mean, d_rstd, N, C, st);
        float *h1 = hbf_(f_dinp, NC), *h2 = hbf_(f_dw, C), *h3 = hbf_(f_db, C);
        check_("layernorm_backward_first dinp", h1, zi, NULL, NC, TOL_BF16);
        check_("layernorm_backward_first dweight", h2, zw, dw0, C, TOL_BF16);
        check_("layernorm_backward_first dbias", h3, zb, db0, C, TOL_BF16);
        free(zi); free(zw); free(zb); free(h1); free(h2); free(h3);
        cudaFree(f_dinp); cudaFree(f_dw); cudaFree(f_db);
    }
    {   /* residual + LayerNorm in one pass, res over b (in place, as the
         * model's res2) and into its own buffer: against residual_forward
         * then layernorm_forward of the bf16-rounded sum */
        float *ra = hrand_(NC, -2, 2), *rb = hrand_(NC, -1, 1);
        float *rs = (float *)malloc(NC * sizeof(float));
        float *ro = (float *)malloc(NC * sizeof(float));
        float *rm = (float *)malloc(N * sizeof(float));
        float *rr = (float *)malloc(N * sizeof(float));
        residual_forward(rs, ra, rb, NC);
        for (size_t i = 0; i < NC; i++)
            rs[i] = bf_(rs[i]);
        layernorm_forward(ro, rm, rr, rs, w, b, N, C);
        bf16 *d_a = dbf_(ra, NC), *d_bb = dbf_(rb, NC);
        bf16 *d_res = dnan_bf16_(NC), *d_o2 = dnan_bf16_(NC);
        for (int inplace = 0; inplace < 2; inplace++) {
            bf16 *dst = inplace ? d_bb : d_res;
            CUDA_CHECK(cudaMemset(d_o2, 0xff, NC * sizeof(bf16)));
            CUDA_CHECK(cudaMemset(d_mean, 0xff, N * sizeof(float)));
            residual_layernorm_forward_cuda(dst, d_o2, d_mean, d_rstd, d_a,
                                            d_bb, d_w, d_b, N, C, st);
            float *h1 = hbf_(dst, NC), *h2 = hbf_(d_o2, NC);
            float *h3 = hcopy_dev_(d_mean, N), *h4 = hcopy_dev_(d_rstd, N);
            const char *tag = inplace ? " (in place)" : "";
            char what[80];
            snprintf(what, sizeof what, "residual_layernorm res%s", tag);
            check_(what, h1, rs, NULL, NC, TOL_BF16);
            snprintf(what, sizeof what, "residual_layernorm out%s", tag);
            check_(what, h2, ro, NULL, NC, TOL_BF16);
            snprintf(what, sizeof what, "residual_layernorm mean%s", tag);
            check_(what, h3, rm, NULL, N, TOL_F32);
            snprintf(what, sizeof what, "residual_layernorm rstd%s", tag);
            check_(what, h4, rr, NULL, N, TOL_F32);
            free(h1); free(h2); free(h3); free(h4);
        }
        free(ra); free(rb); free(rs); free(ro); free(rm); free(rr);
        cudaFree(d_a); cudaFree(d_bb); cudaFree(d_res); cudaFree(d_o2);
    }
    free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(g);
    free(gm); free(gr); free(dout); free(dinp0); free(dw0); free(db0);
    free(dinp); free(dw); free(db); free(g1); free(g2); free(g3);
    cudaFree(d_inp); cudaFree(d_w); cudaFree(d_b); cudaFree(d_out);
    cudaFree(d_mean); cudaFree(d_rstd); cudaFree(d_dout); cudaFree(d_dinp);
    cudaFree(d_dw); cudaFree(d_db); cudaFree(scratch);
}

static void test_matmul_(int N, int C, int OC, int with_bias, int gelu)
{
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    printf("matmul%s (N=%d C=%d OC=%d bias=%d)\n", gelu ? "+gelu" : "", N, C,
           OC, with_bias);
    float *inp = hrand_(NC, -1, 1), *w = hrand_(OCC, -0.2f, 0.2f);
    float *bias = with_bias ? hrand_(OC, -1, 1) : NULL;
    float *pre = (float *)malloc(NO * sizeof(float));
    ref_matmul_forward_(pre, inp, w, bias, N, C, OC);
    bf16 *d_inp = dbf_(inp, NC), *d_w = dbf_(w, OCC);
    bf16 *d_bias = bias ? dbf_(bias, OC) : NULL;
    bf16 *d_out = dnan_bf16_(NO), *d_pre = dnan_bf16_(NO);
    long fused0, sep0, fused1, sep1;
    matmul_cuda_paths(&fused0, &sep0);
    if (gelu) {
        float *act = (float *)malloc(NO * sizeof(float));
        gelu_forward(act, pre, NO);
        matmul_forward_gelu_cuda(d_out, d_pre, d_inp, d_w, d_bias, N, C, OC, st);
        float *g1 = hbf_(d_out, NO), *g2 = hbf_(d_pre, NO);
        check_("matmul_forward_gelu out", g1, act, NULL, NO, TOL_BF16);
        check_("matmul_forward_gelu pre", g2, pre, NULL, NO, TOL_BF16);
        free(act); free(g1); free(g2);
    } else {
        matmul_forward_cuda(d_out, d_inp, d_w, d_bias, N, C, OC, st);
        float *g = hbf_(d_out, NO);
        check_("matmul_forward out", g, pre, NULL, NO, TOL_BF16);
        free(g);
    }
    matmul_cuda_paths(&fused1, &sep1);
    if (with_bias || gelu) { /* which path the epilogue took: one */
        check_true_("matmul_forward epilogue counted",
                    (fused1 > fused0) + (sep1 > sep0) >= 1);
        check_path_("M6_TEST_EXPECT_EPI", "matmul_forward epilogue path",
                    sep1 > sep0 ? "separate" : "fused");
    }
    if (!gelu) {
        float *dout = hrand_(NO, -1, 1);
        float *dinp0 = hrand_(NC, -1, 1), *dw0 = hrand_(OCC, -1, 1);
        float *db0 = hrand_(OC, -1, 1);
        float *dinp = hcopy_(dinp0, NC), *dw = hcopy_(dw0, OCC), *db = hcopy_(db0, OC);
        ref_matmul_backward_(dinp, dw, with_bias ? db : NULL, dout, inp, w, N,
                             C, OC);
        bf16 *d_dout = dbf_(dout, NO), *d_dinp = dbf_(dinp0, NC);
        bf16 *d_dw = dbf_(dw0, OCC), *d_db = dbf_(db0, OC);
        float *scratch = dnan_f32_(matmul_backward_scratch_floats(N, OC));
        matmul_backward_cuda(d_dinp, d_dw, with_bias ? d_db : NULL, scratch,
                             d_dout, d_inp, d_w, N, C, OC, st);
        float *g1 = hbf_(d_dinp, NC), *g2 = hbf_(d_dw, OCC), *g3 = hbf_(d_db, OC);
        check_("matmul_backward dinp", g1, dinp, dinp0, NC, TOL_BF16);
        check_("matmul_backward dweight", g2, dw, dw0, OCC, TOL_BF16);
        if (with_bias)
            check_("matmul_backward dbias", g3, db, db0, OC, TOL_BF16);
        else
            check_true_("matmul_backward dbias untouched",
                        nerr_(g3, db0, NULL, OC) == 0.0);
        /* _first: dinp written from NaN (beta 0), dweight, dbias += */
        float *zi = (float *)calloc(NC, sizeof(float));
        float *zw = hcopy_(dw0, OCC), *zb = hcopy_(db0, OC);
        ref_matmul_backward_(zi, zw, with_bias ? zb : NULL, dout, inp, w, N,
                             C, OC);
        bf16 *f_dinp = dnan_bf16_(NC), *f_dw = dbf_(dw0, OCC);
        bf16 *f_db = dbf_(db0, OC);
        matmul_backward_first_cuda(f_dinp, f_dw, with_bias ? f_db : NULL,
                                   scratch, d_dout, d_inp, d_w, N, C, OC, st);
        float *h1 = hbf_(f_dinp, NC), *h2 = hbf_(f_dw, OCC);
        float *h3 = hbf_(f_db, OC);
        check_("matmul_backward_first dinp", h1, zi, NULL, NC, TOL_BF16);
        check_("matmul_backward_first dweight", h2, zw, dw0, OCC, TOL_BF16);
        if (with_bias)
            check_("matmul_backward_first dbias", h3, zb, db0, OC, TOL_BF16);
        free(zi); free(zw); free(zb); free(h1); free(h2); free(h3);
        cudaFree(f_dinp); cudaFree(f_dw); cudaFree(f_db);
        free(dout); free(dinp0); free(dw0); free(db0); free(dinp); free(dw);
        free(db); free(g1); free(g2); free(g3);
        cudaFree(d_dout); cudaFree(d_dinp); cudaFree(d_dw); cudaFree(d_db);
        cudaFree(scratch);
    }
    free(inp); free(w); free(bias); free(pre);
    cudaFree(d_inp); cudaFree(d_w); cudaFree(d_bias); cudaFree(d_out);
    cudaFree(d_pre);
}

/* The backward of a matmul through the GELU before it (the MLP's fcproj):
 * inp = GELU(pre) (N,C), out = inp weight^T + bias. Against the CPU ops:
 * d(inp) by the double GEMM loop, then gelu_backward from zero into
 * d(pre); dweight and dbias added to random starts; d(pre) written from
 * NaN. TOL_BF16: the fused DGELU rounds d(pre) once from fp32, the
 * fallback (plain GEMM, then the GELU backward in place) once more. */
static void test_matmul_dgelu_(int N, int C, int OC)
{
    size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    printf("matmul backward through gelu (N=%d C=%d OC=%d)\n", N, C, OC);
    float *pre = hrand_(NC, -3, 3), *inp = (float *)malloc(NC * sizeof(float));
    gelu_forward(inp, pre, NC);
    for (size_t i = 0; i < NC; i++)
        inp[i] = bf_(inp[i]); /* the bf16 activation the GPU keeps */
    float *w = hrand_(OCC, -0.2f, 0.2f), *dout = hrand_(NO, -1, 1);
    float *dw0 = hrand_(OCC, -1, 1), *db0 = hrand_(OC, -1, 1);
    float *dinp = (float *)calloc(NC, sizeof(float));
    float *dpre = (float *)calloc(NC, sizeof(float));
    float *dw = hcopy_(dw0, OCC), *db = hcopy_(db0, OC);
    ref_matmul_backward_(dinp, dw, db, dout, inp, w, N, C, OC);
    gelu_backward(dpre, pre, dinp, NC);
    bf16 *d_pre = dbf_(pre, NC), *d_inp = dbf_(inp, NC), *d_w = dbf_(w, OCC);
    bf16 *d_dout = dbf_(dout, NO), *d_dpre = dnan_bf16_(NC);
    bf16 *d_dw = dbf_(dw0, OCC), *d_db = dbf_(db0, OC);
    float *scratch = dnan_f32_(matmul_backward_scratch_floats(N, OC));
    int fused = matmul_backward_dgelu_supported(d_dpre, d_pre, d_dout, d_w, N,
                                                C, OC);
    long f0, s0, f1, s1;
    matmul_cuda_paths(&f0, &s0);
    matmul_backward_dgelu_first_cuda(d_dpre, d_dw, d_db, scratch, d_dout,
                                     d_inp, d_pre, d_w, N, C, OC, st);
    matmul_cuda_paths(&f1, &s1);
    float *g1 = hbf_(d_dpre, NC), *g2 = hbf_(d_dw, OCC), *g3 = hbf_(d_db, OC);
    check_("matmul_backward_dgelu_first dpre", g1, dpre, NULL, NC, TOL_BF16);
    check_("matmul_backward_dgelu_first dweight", g2, dw, dw0, OCC, TOL_BF16);
    check_("matmul_backward_dgelu_first dbias", g3, db, db0, OC, TOL_BF16);
    check_true_("dgelu path as matmul_backward_dgelu_supported said",
                fused ? f1 == f0 + 1 && s1 == s0 : s1 == s0 + 1 && f1 == f0);
    check_path_("M6_TEST_EXPECT_EPI", "matmul backward dgelu path",
                fused ? "fused" : "separate");
    free(pre); free(inp); free(w); free(dout); free(dw0); free(db0);
    free(dinp); free(dpre); free(dw); free(db); free(g1); free(g2); free(g3);
    cudaFree(d_pre); cudaFree(d_inp); cudaFree(d_w); cudaFree(d_dout);
    cudaFree(d_dpre); cudaFree(d_dw); cudaFree(d_db); cudaFree(scratch);
}

/* lse (B,NH,T) by hand: log sum_{s<=t} exp(scale q_t.k_s) of the bf16
 * inputs qb (B,T,3C), in double */
static void ref_lse_(float *rl, const float *qb, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double *sc = (double *)malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qb + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    const float *k = qb + ((size_t)b * T + u) * 3 * C + C +
                                     h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += (double)q[i] * k[i];
                    sc[u] = d / sqrt((double)hs);
                    if (sc[u] > mx) mx = sc[u];
                }
                double sum = 0;
                for (int u = 0; u <= t; u++)
                    sum += exp(sc[u] - mx);
                rl[((size_t)b * NH + h) * T + t] = (float)(mx + log(sum));
            }
    free(sc);
}

static void test_attention_(int B, int T, int C, int NH)
{
    size_t N3 = (size_t)B * T * 3 * C, NC = (size_t)B * T * C;
    size_t NA = (size_t)B * NH * T * T;
    printf("attention (B=%d T=%d C=%d NH=%d hs=%d)\n", B, T, C, NH, C / NH);
    float *qkv = hrand_(N3, -2, 2);
    float *out = (float *)malloc(NC * sizeof(float));
    float *att = (float *)malloc(NA * sizeof(float));
    attention_forward(out, att, qkv, B, T, C, NH);
    bf16 *d_qkv = dbf_(qkv, N3), *d_out = dnan_bf16_(NC);
    float *d_lse = dnan_f32_((size_t)B * NH * T);
    attention_forward_cuda(d_out, d_lse, d_qkv, B, T, C, NH, st);
    float *g = hbf_(d_out, NC);
    check_("attention_forward out", g, out, NULL, NC, TOL_BF16);

    float *dout = hrand_(NC, -1, 1), *dqkv0 = hrand_(N3, -0.1f, 0.1f);
    float *dqkv = hcopy_(dqkv0, N3);
    float *scr = (float *)malloc(NA * sizeof(float));
    attention_backward(dqkv, scr, dout, qkv, att, B, T, C, NH);
    bf16 *d_dout = dbf_(dout, NC), *d_dqkv = dbf_(dqkv0, N3);
    bf16 *d_dqkv2 = dbf_(dqkv0, N3);
    float *d_scr = dnan_f32_(attention_backward_scratch_floats(B, T, NH));
    attention_backward_cuda(d_dqkv, d_scr, d_dout, d_qkv, d_out, d_lse, B, T,
                            C, NH, st);
    attention_backward_cuda(d_dqkv2, d_scr, d_dout, d_qkv, d_out, d_lse, B, T,
                            C, NH, st);
    float *g1 = hbf_(d_dqkv, N3), *g2 = hbf_(d_dqkv2, N3);
    check_("attention_backward dqkv", g1, dqkv, dqkv0, N3, TOL_ATT);
    check_true_("attention_backward deterministic",
                memcmp(g1, g2, N3 * sizeof(float)) == 0);
    /* _first: dqkv written from NaN; the CPU op's from zero */
    float *dz = (float *)calloc(N3, sizeof(float));
    attention_backward(dz, scr, dout, qkv, att, B, T, C, NH);
    bf16 *d_dqkvf = dnan_bf16_(N3);
    attention_backward_first_cuda(d_dqkvf, d_scr, d_dout, d_qkv, d_out,
                                  d_lse, B, T, C, NH, st);
    float *gf = hbf_(d_dqkvf, N3);
    check_("attention_backward_first dqkv", gf, dz, NULL, N3, TOL_ATT);
    free(gf);
    cudaFree(d_dqkvf);

    /* the tensor-core path, where the head size allows it, against the
     * same CPU reference; its workspace starts as NaN and holds one item
     * less than all (more than one pass), or one */
    size_t wsb = attention_gemm_workspace_bytes(B, T, C, NH);
    int items = B > NH ? B : NH; /* what a full workspace holds */
    if (items > 1)
        wsb = wsb / items * (items - 1);
    float *d_ws = wsb ? dnan_f32_(wsb / sizeof(float)) : NULL;
    char why[256] = "";
    /* where cuBLASLt has no algorithm, the flash kernels above are the
     * path (gpt_cuda's choice), and the GEMM path is not called */
    int gemm_ok = wsb && attention_gemm_supported(d_ws, wsb, d_qkv, d_out,
                                                  d_dqkv, d_dout, B, T, C,
                                                  NH, why, sizeof why);
    if (wsb)
        check_path_("M6_TEST_EXPECT_ATT", "attention path",
                    gemm_ok ? "gemm" : "flash");
    if (wsb && !gemm_ok) {
        printf("  attention_gemm: %s: the flash kernels\n", why);
        cudaFree(d_ws);
    } else if (wsb) {
        float *d_lse2 = dnan_f32_((size_t)B * NH * T);
        bf16 *d_out2 = dnan_bf16_(NC), *d_dqkv3 = dbf_(dqkv0, N3);
        attention_gemm_forward_cuda(d_out2, d_lse2, d_ws, wsb, d_qkv, B, T, C,
                                    NH, st);
        float *go = hbf_(d_out2, NC);
        check_("attention_gemm_forward out", go, out, NULL, NC, TOL_BF16);
        /* lse by hand (ref_lse_) of the bf16 values the GPU read */
        size_t nl = (size_t)B * NH * T;
        float *gl = (float *)malloc(nl * sizeof(float));
        float *rl = (float *)malloc(nl * sizeof(float));
        float *qb = hbf_(d_qkv, N3);
        ref_lse_(rl, qb, B, T, C, NH);
        CUDA_CHECK(cudaMemcpy(gl, d_lse2, nl * sizeof(float),
                              cudaMemcpyDeviceToHost));
        check_("attention_gemm_forward lse", gl, rl, NULL, nl, TOL_BF16);
        bf16 *d_dqkv4 = dbf_(dqkv0, N3);
        attention_gemm_backward_cuda(d_dqkv3, d_scr, d_ws, wsb, d_dout, d_qkv,
                                     d_out2, d_lse2, B, T, C, NH, st);
        attention_gemm_backward_cuda(d_dqkv4, d_scr, d_ws, wsb, d_dout, d_qkv,
                                     d_out2, d_lse2, B, T, C, NH, st);
        float *g3 = hbf_(d_dqkv3, N3), *g4 = hbf_(d_dqkv4, N3);
        check_("attention_gemm_backward dqkv", g3, dqkv, dqkv0, N3, TOL_ATT);
        check_true_("attention_gemm_backward deterministic",
                    memcmp(g3, g4, N3 * sizeof(float)) == 0);
        bf16 *d_dqkv5 = dnan_bf16_(N3);
        attention_gemm_backward_first_cuda(d_dqkv5, d_scr, d_ws, wsb, d_dout,
                                           d_qkv, d_out2, d_lse2, B, T, C,
                                           NH, st);
        float *g5 = hbf_(d_dqkv5, N3);
        check_("attention_gemm_backward_first dqkv", g5, dz, NULL, N3,
               TOL_ATT);
        free(g5);
        cudaFree(d_dqkv5);
        free(go); free(gl); free(rl); free(qb); free(g3); free(g4);
        cudaFree(d_ws); cudaFree(d_lse2); cudaFree(d_out2); cudaFree(d_dqkv3);
        cudaFree(d_dqkv4);
    } else {
        printf("  attention_gemm: head size %d not a multiple of 8, not "
               "offered\n", C / NH);
    }
    free(qkv); free(out); free(att); free(g); free(dout); free(dqkv0);
    free(dqkv); free(scr); free(g1); free(g2); free(dz);
    cudaFree(d_qkv); cudaFree(d_out); cudaFree(d_lse); cudaFree(d_dout);
    cudaFree(d_dqkv); cudaFree(d_dqkv2); cudaFree(d_scr);
}

/* The two flash implementations by name, the tensor-core kernels (head
 * sizes 32, 64, 80, 128) and the CUDA-core reference fallback, each
 * against the CPU op (kernels/cpu/attention.c): out, lse, dqkv (added to
 * a random start), deterministic. */
static void test_attention_impls_(int B, int T, int C, int NH)
{
    size_t N3 = (size_t)B * T * 3 * C, NC = (size_t)B * T * C;
    size_t NA = (size_t)B * NH * T * T, nl = (size_t)B * NH * T;
    printf("attention tc/core (B=%d T=%d C=%d NH=%d hs=%d)\n", B, T, C, NH,
           C / NH);
    float *qkv = hrand_(N3, -2, 2);
    float *out = (float *)malloc(NC * sizeof(float));
    float *att = (float *)malloc(NA * sizeof(float));
    attention_forward(out, att, qkv, B, T, C, NH);
    float *dout = hrand_(NC, -1, 1), *dqkv0 = hrand_(N3, -0.1f, 0.1f);
    float *dqkv = hcopy_(dqkv0, N3);
    float *scr = (float *)malloc(NA * sizeof(float));
    attention_backward(dqkv, scr, dout, qkv, att, B, T, C, NH);
    bf16 *d_qkv = dbf_(qkv, N3), *d_dout = dbf_(dout, NC);
    float *qb = hbf_(d_qkv, N3), *rl = (float *)malloc(nl * sizeof(float));
    ref_lse_(rl, qb, B, T, C, NH);
    float *d_scr = dnan_f32_(attention_backward_scratch_floats(B, T, NH));
    for (int tc = 1; tc >= 0; tc--) {
        char what[96];
        const char *name = tc ? "attention_tc" : "attention_core";
        bf16 *d_out = dnan_bf16_(NC);
        float *d_lse = dnan_f32_(nl);
        if (tc)
            attention_tc_forward_cuda(d_out, d_lse, d_qkv, B, T, C, NH, st);
        else
            attention_core_forward_cuda(d_out, d_lse, d_qkv, B, T, C, NH, st);
        float *g = hbf_(d_out, NC), *gl = (float *)malloc(nl * sizeof(float));
        CUDA_CHECK(cudaMemcpy(gl, d_lse, nl * sizeof(float),
                              cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s_forward out", name);
        check_(what, g, out, NULL, NC, TOL_ATT_TC_OUT);
        snprintf(what, sizeof what, "%s_forward lse", name);
        check_(what, gl, rl, NULL, nl, TOL_ATT_TC_LSE);
        bf16 *d1 = dbf_(dqkv0, N3), *d2 = dbf_(dqkv0, N3);
        for (int r = 0; r < 2; r++) {
            if (tc)
                attention_tc_backward_cuda(r ? d2 : d1, d_scr, d_dout, d_qkv,
                                           d_out, d_lse, B, T, C, NH, st);
            else
                attention_core_backward_cuda(r ? d2 : d1, d_scr, d_dout,
                                             d_qkv, d_out, d_lse, B, T, C,
                                             NH, st);
        }
        float *g1 = hbf_(d1, N3), *g2 = hbf_(d2, N3);
        snprintf(what, sizeof what, "%s_backward dqkv", name);
        check_(what, g1, dqkv, dqkv0, N3, TOL_ATT_TC_BWD);
        snprintf(what, sizeof what, "%s_backward deterministic", name);
        check_true_(what, memcmp(g1, g2, N3 * sizeof(float)) == 0);
        free(g); free(gl); free(g1); free(g2);
        cudaFree(d_out); cudaFree(d_lse); cudaFree(d1); cudaFree(d2);
    }
    free(qkv); free(out); free(att); free(dout); free(dqkv0); free(dqkv);
    free(scr); free(qb); free(rl);
    cudaFree(d_qkv); cudaFree(d_dout); cudaFree(d_scr);
}

/* a device bf16 copy of h (n) at element off of an allocation of n + off
 * (off odd: not 16-byte aligned, the kernels' one-at-a-time path) */
static bf16 *dbf_at_(const float *h, size_t n, int off)
{
    float *p = (float *)calloc(n + off, sizeof(float));
    memcpy(p + off, h, n * sizeof(float));
    bf16 *d = dbf_(p, n + off);
    free(p);
    return d + off;
}

/* N not a multiple of 8: a tail after the 128-bit groups; off: all the
 * tensors off elements from an aligned base */
static void test_elementwise_(size_t N, int off)
{
    printf("gelu, residual (N=%zu, tensors at +%d elements)\n", N, off);
    float *x = hrand_(N, -5, 5), *y = hrand_(N, -1, 1);
    float *out = (float *)malloc(N * sizeof(float));
    gelu_forward(out, x, N);
    bf16 *d_x = dbf_at_(x, N, off), *d_y = dbf_at_(y, N, off);
    bf16 *d_out = dnan_bf16_(N + off) + off;
    gelu_forward_cuda(d_out, d_x, N, st);
    float *g = hbf_(d_out, N);
    check_("gelu_forward", g, out, NULL, N, TOL_BF16);
    free(g);
    float *d0 = hrand_(N, -1, 1), *d = hcopy_(d0, N);
    gelu_backward(d, x, y, N);
    bf16 *d_d = dbf_at_(d0, N, off);
    gelu_backward_cuda(d_d, d_x, d_y, N, st);
    g = hbf_(d_d, N);
    check_("gelu_backward", g, d, d0, N, TOL_BF16);
    free(g);
    {   /* _first: written from NaN, and in place over dout */
        float *z = (float *)calloc(N, sizeof(float));
        gelu_backward(z, x, y, N);
        bf16 *f = dnan_bf16_(N + off) + off, *f2 = dbf_at_(y, N, off);
        gelu_backward_first_cuda(f, d_x, d_y, N, st);
        gelu_backward_first_cuda(f2, d_x, f2, N, st);
        float *h = hbf_(f, N), *h2 = hbf_(f2, N);
        check_("gelu_backward_first", h, z, NULL, N, TOL_BF16);
        check_("gelu_backward_first in place", h2, z, NULL, N, TOL_BF16);
        free(z); free(h); free(h2);
        cudaFree(f - off); cudaFree(f2 - off);
    }

    residual_forward(out, x, y, N);
    residual_forward_cuda(d_out, d_x, d_y, N, st);
    g = hbf_(d_out, N);
    check_("residual_forward", g, out, NULL, N, TOL_BF16);
    free(g);
    float *a0 = hrand_(N, -1, 1), *b0 = hrand_(N, -1, 1);
    float *a = hcopy_(a0, N), *b = hcopy_(b0, N);
    residual_backward(a, b, y, N);
    bf16 *d_a = dbf_at_(a0, N, off), *d_b = dbf_at_(b0, N, off);
    residual_backward_cuda(d_a, d_b, d_y, N, st);
    float *ga = hbf_(d_a, N), *gb = hbf_(d_b, N);
    check_("residual_backward da", ga, a, a0, N, TOL_BF16);
    check_("residual_backward db", gb, b, b0, N, TOL_BF16);
    free(x); free(y); free(out); free(d0); free(d); free(a0); free(b0);
    free(a); free(b); free(ga); free(gb);
    cudaFree(d_x - off); cudaFree(d_y - off); cudaFree(d_out - off);
    cudaFree(d_d - off); cudaFree(d_a - off); cudaFree(d_b - off);
}

/* A padded (N, Vp) result, fetched: its first V columns of each row
 * against want (N, V) within tol (check_ "what"), and the padding columns
 * V..Vp all zero (check_true_ "what padding 0"). */
static void check_padded_(const char *what, const float *got, const float *want,
                          int N, int V, int Vp, double tol)
{
    float *rows = (float *)malloc((size_t)N * V * sizeof(float));
    int pad_zero = 1;
    for (int i = 0; i < N; i++) {
        memcpy(rows + (size_t)i * V, got + (size_t)i * Vp, V * sizeof(float));
        for (int j = V; j < Vp; j++)
            pad_zero &= got[(size_t)i * Vp + j] == 0.0f;
    }
    check_(what, rows, want, NULL, (size_t)N * V, tol);
    char pad[200];
    snprintf(pad, sizeof pad, "%s padding 0", what);
    check_true_(pad, pad_zero);
    free(rows);
}

/* Random logits for N rows of V classes, as the GPU holds them: rows padded
 * to Vp, the padding garbage (100) that must be ignored (returned; caller
 * frees); the same rows unpadded for the CPU into *logits, and random
 * targets in [0, V) into *tgt (both malloc'd). */
static float *padded_logits_(int N, int V, int Vp, float **logits,
                             int32_t **tgt)
{
    float *lp = hrand_((size_t)N * Vp, -4, 4);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            lp[(size_t)i * Vp + j] = 100.0f;
    *logits = (float *)malloc((size_t)N * V * sizeof(float));
    for (int i = 0; i < N; i++)
        memcpy(*logits + (size_t)i * V, lp + (size_t)i * Vp,
               V * sizeof(float));
    *tgt = (int32_t *)malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        (*tgt)[i] = (int32_t)(urand_() * V);
    return lp;
}

/* The fused classifier against the CPU cross-entropy (forward losses and
 * backward dlogits with the same dloss on every row), in place over
 * padded logits whose padding holds garbage. Tolerances: the losses are
 * fp32 from bf16 logits (TOL_F32); dlogits are rounded to bf16 once
 * (TOL_BF16). */
static void test_crossentropy_fused_(int N, int V, int Vp)
{
    printf("softmax_crossentropy_fused (N=%d V=%d Vp=%d)\n", N, V, Vp);
    float *logits;
    int32_t *tgt;
    float *lp = padded_logits_(N, V, Vp, &logits, &tgt);
    tgt[0] = 0;         /* the first and the last column as targets */
    tgt[N - 1] = V - 1;
    float *losses = (float *)malloc(N * sizeof(float));
    float *probs = (float *)malloc((size_t)N * V * sizeof(float));
    softmax_crossentropy_forward(losses, probs, logits, tgt, N, V);
    const float dloss = 1.0f / (3.0f * N);
    float *dl = (float *)malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        dl[i] = dloss;
    float *dlog = (float *)calloc((size_t)N * V, sizeof(float));
    softmax_crossentropy_backward(dlog, probs, tgt, dl, N, V);

    bf16 *d_logits = dbf_(lp, (size_t)N * Vp);
    int32_t *d_tgt = dcopy_(tgt, N);
    float *d_losses = dnan_f32_(N);
    softmax_crossentropy_fused_cuda(d_losses, d_logits, d_tgt, dloss, N, V,
                                    Vp, st);
    float *gl = hcopy_dev_(d_losses, N), *gd = hbf_(d_logits, (size_t)N * Vp);
    check_("crossentropy_fused losses", gl, losses, NULL, N, TOL_F32);
    check_padded_("crossentropy_fused dlogits", gd, dlog, N, V, Vp, TOL_BF16);
    free(lp); free(logits); free(tgt); free(losses); free(probs); free(dl);
    free(dlog); free(gl); free(gd);
    cudaFree(d_logits); cudaFree(d_tgt); cudaFree(d_losses);
}

static void test_crossentropy_(void)
{
    const int N = 70, V = 200, Vp = 256;
    printf("softmax_crossentropy (N=%d V=%d Vp=%d)\n", N, V, Vp);
    float *logits;
    int32_t *tgt;
    float *lp = padded_logits_(N, V, Vp, &logits, &tgt);
    float *losses = (float *)malloc(N * sizeof(float));
    float *probs = (float *)malloc((size_t)N * V * sizeof(float));
    softmax_crossentropy_forward(losses, probs, logits, tgt, N, V);

    bf16 *d_logits = dbf_(lp, (size_t)N * Vp), *d_probs = dnan_bf16_((size_t)N * Vp);
    int32_t *d_tgt = dcopy_(tgt, N);
    float *d_losses = dnan_f32_(N);
    softmax_crossentropy_forward_cuda(d_losses, d_probs, d_logits, d_tgt, N,
                                      V, Vp, st);
    float *gl = hcopy_dev_(d_losses, N), *gp = hbf_(d_probs, (size_t)N * Vp);
    check_("crossentropy_forward losses", gl, losses, NULL, N, TOL_F32);
    check_padded_("crossentropy_forward probs", gp, probs, N, V, Vp, TOL_BF16);

    float *dl = hrand_(N, 0.1f, 1.0f);
    float *dlog = (float *)calloc((size_t)N * V, sizeof(float));
    softmax_crossentropy_backward(dlog, probs, tgt, dl, N, V);
    float *d_dl = dcopy_(dl, N);
    /* in place, as the model runs it */
    softmax_crossentropy_backward_cuda(d_logits, d_logits, d_tgt, d_dl, N, V,
                                       Vp, st);
    float *gd = hbf_(d_logits, (size_t)N * Vp);
    check_padded_("crossentropy_backward dlogits", gd, dlog, N, V, Vp,
                  TOL_BF16);

    double mean = 0;
    for (int i = 0; i < N; i++)
        mean += gl[i];
    float want_mean = (float)(mean / N);
    float *d_mean = dnan_f32_(1);
    mean_cuda(d_mean, d_losses, N, st);
    float *gm = hcopy_dev_(d_mean, 1);
    check_("mean", gm, &want_mean, NULL, 1, TOL_F32);
    free(lp); free(logits); free(tgt); free(losses); free(probs); free(gl);
    free(gp); free(dl); free(dlog); free(gd); free(gm);
    cudaFree(d_logits); cudaFree(d_probs); cudaFree(d_tgt); cudaFree(d_losses);
    cudaFree(d_dl); cudaFree(d_mean);
}

static void test_adamw_(void)
{
    const size_t n = (1 << 20) + 37; /* more than one grid-stride pass */
    printf("adamw, grad_sumsq (n=%zu)\n", n);
    float *p0 = hrand_(n, -1, 1), *gr = hrand_(n, -0.5f, 0.5f);
    float *m0 = hrand_(n, -0.1f, 0.1f), *v0 = hrand_(n, 0, 0.01f);
    float *p = hcopy_(p0, n), *m = hcopy_(m0, n), *v = hcopy_(v0, n);

    double sumsq = grad_sumsq(gr, n);
    bf16 *d_g = dbf_(gr, n);
    float *d_scr = dnan_f32_(grad_sumsq_scratch_floats()), *d_sc = dnan_f32_(2);
    grad_sumsq_cuda(d_sc, d_scr, d_g, n, st);
    float max_norm = (float)sqrt(sumsq) / 2; /* clipping halves the grads */
    grad_clip_scale_cuda(d_sc + 1, d_sc, max_norm, st);
    float *gs = hcopy_dev_(d_sc, 2);
    float want[2] = {(float)sumsq, 0.5f};
    check_("grad_sumsq", gs, want, NULL, 1, TOL_F32);
    check_("grad_clip_scale", gs + 1, want + 1, NULL, 1, TOL_F32);

    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const long t = 3;
    adamw_update(p, gr, m, v, n, lr, b1, b2, eps, wd, 0.5f, t);
    float *d_p = dcopy_(p0, n), *d_m = dcopy_(m0, n), *d_v = dcopy_(v0, n);
    bf16 *d_pb = dbf_(p0, n);
    adamw_update_cuda(d_p, d_pb, d_g, d_m, d_v, n, lr, b1, b2, eps, wd,
                      d_sc + 1, t, st);
    float *gp = hcopy_dev_(d_p, n), *gm = hcopy_dev_(d_m, n);
    float *gv = hcopy_dev_(d_v, n), *gpb = hbf_(d_pb, n);
    check_("adamw master (update)", gp, p, p0, n, TOL_F32);
    check_("adamw m", gm, m, NULL, n, TOL_F32);
    check_("adamw v", gv, v, NULL, n, TOL_F32);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= gpb[i] == bf_(gp[i]);
    check_true_("adamw bf16 copy = bf16(master)", same);
    free(p0); free(gr); free(m0); free(v0); free(p); free(m); free(v);
    free(gs); free(gp); free(gm); free(gv); free(gpb);
    cudaFree(d_g); cudaFree(d_scr); cudaFree(d_sc); cudaFree(d_p);
    cudaFree(d_m); cudaFree(d_v); cudaFree(d_pb);
}

/* Adafactor (adafactor_update_cuda) against the CPU op
 * (adafactor_update_spans) on the same inputs, the gradient rounded to
 * bf16 first (the CUDA op reads bf16): one tensor of rows x cols (cols 0:
 * a vector) at step t = 3 from random statistics, gradient scale 0.5
 * from device memory. The new master (as an update), r, c and m within
 * TOL_F32, the bf16 copy bf16(master). The CPU's new master into out
 * (n floats) when given. */
static void test_adafactor_case_(int rows, int cols, float beta1, float clip,
                                 int scale_parameter, float *out)
{
    size_t n = (size_t)rows * (cols ? cols : 1), nc = cols ? cols : 1;
    printf("adafactor %dx%d, beta1 %g, d %g%s\n", rows, cols, beta1, clip,
           scale_parameter ? ", scale_parameter" : "");
    float *p0 = hrand_(n, -1, 1), *gr = hrand_(n, -0.5f, 0.5f);
    float *m0 = hrand_(n, -0.1f, 0.1f);
    float *r0 = hrand_(rows, 0.01f, 0.1f), *c0 = hrand_(nc, 0.01f, 0.1f);
    for (size_t i = 0; i < n; i++)
        gr[i] = bf_(gr[i]);
    float *p = hcopy_(p0, n), *m = hcopy_(m0, n), *r = hcopy_(r0, rows);
    float *c = hcopy_(c0, nc);
    const float lr = 1e-2f, wd = 0.1f, half = 0.5f;
    const long t = 3;
    adafactor_span sp = {p, gr, beta1 > 0 ? m : NULL, r, cols ? c : NULL,
                         rows, cols, wd, t, 0};
    adafactor_hparams h = {lr, beta1, 0.8f, clip, 1e-30f, 1e-3f,
                           scale_parameter, half};
    check_true_("adafactor cpu op ran", adafactor_update_spans(&sp, 1, &h)
                                            == 0);
    float *d_p = dcopy_(p0, n), *d_m = dcopy_(m0, n), *d_r = dcopy_(r0, rows);
    float *d_c = dcopy_(c0, nc), *d_sc = dcopy_(&half, 1);
    bf16 *d_g = dbf_(gr, n), *d_pb = dnan_bf16_(n);
    double *d_scr = dnan_<double>(adafactor_scratch_doubles(n));
    adafactor_tensor_step_cuda x = {d_p, d_pb, d_g, beta1 > 0 ? d_m : NULL,
                                    d_r, cols ? d_c : NULL, rows, cols,
                                    adafactor_beta2(t, 0.8f), wd, 0, t};
    adafactor_hparams_cuda hc = {lr, beta1, clip, 1e-30f, 1e-3f,
                                 scale_parameter};
    adafactor_update_cuda(&x, &hc, d_sc, d_scr, st);
    float *gp = hcopy_dev_(d_p, n), *gm = hcopy_dev_(d_m, n);
    float *gr_ = hcopy_dev_(d_r, rows), *gc = hcopy_dev_(d_c, nc);
    float *gpb = hbf_(d_pb, n);
    check_("adafactor master (update)", gp, p, p0, n, TOL_F32);
    check_("adafactor r", gr_, r, NULL, rows, TOL_F32);
    if (cols)
        check_("adafactor c", gc, c, NULL, nc, TOL_F32);
    if (beta1 > 0)
        check_("adafactor m", gm, m, NULL, n, TOL_F32);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= gpb[i] == bf_(gp[i]);
    check_true_("adafactor bf16 copy = bf16(master)", same);
    if (out)
        memcpy(out, p, n * sizeof(float));
    free(p0); free(gr); free(m0); free(r0); free(c0); free(p); free(m);
    free(r); free(c); free(gp); free(gm); free(gr_); free(gc); free(gpb);
    cudaFree(d_p); cudaFree(d_m); cudaFree(d_r); cudaFree(d_c);
    cudaFree(d_sc); cudaFree(d_g); cudaFree(d_pb); cudaFree(d_scr);
}

/* Matrices with rows not a multiple of a block's 8 and cols not of 32,
 * over several chunks of sums; a vector; each with and without the first
 * moment; update clipping that fires (d 0.1: the CPU's update then
 * differs from the unclipped one, d 1e3, by far more than the tolerance,
 * so both paths are compared); scale_parameter. */
static void test_adafactor_(void)
{
    const int R = 300, C = 70;
    float *clipped = (float *)malloc((size_t)R * C * sizeof(float));
    float *free_ = (float *)malloc((size_t)R * C * sizeof(float));
    uint64_t seed = rng_state;
    test_adafactor_case_(R, C, 0.0f, 0.1f, 0, clipped);
    rng_state = seed; /* the same inputs */
    test_adafactor_case_(R, C, 0.0f, 1e3f, 0, free_);
    rng_state = seed; /* their first draw: p0 */
    float *p0 = hrand_((size_t)R * C, -1, 1);
    double upd = nerr_(clipped, free_, p0, (size_t)R * C);
    printf("  (clipped vs unclipped update: nerr %.3e)\n", upd);
    check_true_("adafactor update clipping fires", upd > 0.5);
    test_adafactor_case_(R, C, 0.9f, 1.0f, 0, NULL);
    test_adafactor_case_(R, C, 0.9f, 1.0f, 1, NULL);
    test_adafactor_case_(5003, 0, 0.0f, 1.0f, 0, NULL);
    test_adafactor_case_(5003, 0, 0.9f, 0.1f, 1, NULL);
    free(clipped); free(free_); free(p0);
}

/* Multi-tensor AdamW (adamw_multi_cuda) over nt tensors of the given sizes
 * laid out in one block with 3-element gaps (padding, which must stay as
 * it is), against the CPU AdamW (kernels/cpu) tensor by tensor, with the
 * decay mask and each tensor's region's step count t = 1 + 3 region, and
 * bit for bit against the per-tensor path (adamw_update_cuda with
 * grad_clip_scale_cuda's scale). clip: the max_norm as a multiple of the
 * gradient norm (0.5 clips, 2 does not), 0 for max_norm 0 (no clipping),
 * -1 for no sum of squares at all (sumsq NULL: scale 1). */
static void test_adamw_multi_case_(const char *name, const size_t *sizes,
                                   const int *regions, int nt, int n_regions,
                                   float clip)
{
    const size_t GAP = 3;
    size_t *off = (size_t *)malloc(nt * sizeof(size_t)), n = GAP;
    for (int k = 0; k < nt; k++) {
        off[k] = n;
        n += sizes[k] + GAP;
    }
    printf("adamw_multi %s (%d tensors, %d regions, %zu elements, clip "
           "%g)\n", name, nt, n_regions, n, clip);
    float *p0 = hrand_(n, -1, 1), *gr = hrand_(n, -0.5f, 0.5f);
    float *m0 = hrand_(n, -0.1f, 0.1f), *v0 = hrand_(n, 0, 0.01f);
    float *p = hcopy_(p0, n), *m = hcopy_(m0, n), *v = hcopy_(v0, n);
    adamw_tensor_cuda *ts = (adamw_tensor_cuda *)calloc(nt, sizeof *ts);
    long *t = (long *)malloc(n_regions * sizeof(long));
    for (int r = 0; r < n_regions; r++)
        t[r] = 1 + 3 * r;
    double ssq = 0;
    for (int k = 0; k < nt; k++) {
        ts[k].off = off[k];
        ts[k].numel = sizes[k];
        ts[k].decay = k % 3 != 1; /* a mask that is not all one way */
        ts[k].region = regions[k];
        for (size_t i = 0; i < sizes[k]; i++)
            ssq += (double)gr[off[k] + i] * gr[off[k] + i];
    }
    /* the sum of squares as the device would hold it (fp32); the CPU's
     * scale by the formula of grad_clip_scale_cuda from the same float */
    float sumsq = (float)ssq, norm = sqrtf(sumsq);
    float max_norm = clip > 0 ? norm * clip : 0.0f;
    float scale = (max_norm > 0.0f && norm > max_norm) ? max_norm / norm
                                                       : 1.0f;
    check_true_("clipping as the case asks",
                clip == 0.5f ? scale < 1.0f : scale == 1.0f);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int k = 0; k < nt; k++) {
        size_t o = off[k];
        adamw_update(p + o, gr + o, m + o, v + o, sizes[k], lr, b1, b2, eps,
                     ts[k].decay ? wd : 0.0f, scale, t[ts[k].region]);
    }
    adamw_multi_plan *plan = adamw_multi_plan_create(ts, nt, n_regions);
    check_true_("plan made", plan != NULL);
    if (!plan)
        return;
    bf16 *d_g = dbf_(gr, n);
    float *d_ssq = dcopy_(&sumsq, 1);
    float *d_p = dcopy_(p0, n), *d_m = dcopy_(m0, n), *d_v = dcopy_(v0, n);
    bf16 *d_pb = dbf_(p0, n);
    adamw_multi_cuda(plan, d_p, d_pb, d_g, d_m, d_v, t, lr, b1, b2, eps, wd,
                     clip < 0 ? NULL : d_ssq, max_norm, st);
    float *gp = hcopy_dev_(d_p, n), *gm = hcopy_dev_(d_m, n);
    float *gv = hcopy_dev_(d_v, n), *gpb = hbf_(d_pb, n);
    check_("adamw_multi master (update)", gp, p, p0, n, TOL_F32);
    check_("adamw_multi m", gm, m, NULL, n, TOL_F32);
    check_("adamw_multi v", gv, v, NULL, n, TOL_F32);
    int same = 1, gaps = 1;
    for (size_t i = 0; i < n; i++)
        same &= gpb[i] == bf_(gp[i]);
    check_true_("adamw_multi bf16 copy = bf16(master)", same);
    for (int k = 0; k <= nt; k++) {
        size_t g0 = k ? off[k - 1] + sizes[k - 1] : 0;
        for (size_t i = g0; i < g0 + GAP; i++)
            gaps &= gp[i] == p0[i] && gm[i] == m0[i] && gv[i] == v0[i] &&
                    gpb[i] == p0[i];
    }
    check_true_("adamw_multi padding untouched", gaps);

    /* the per-tensor path on the same inputs: the same bits */
    float *r_p = dcopy_(p0, n), *r_m = dcopy_(m0, n), *r_v = dcopy_(v0, n);
    bf16 *r_pb = dbf_(p0, n);
    float *d_scale = dnan_f32_(1);
    if (clip >= 0)
        grad_clip_scale_cuda(d_scale, d_ssq, max_norm, st);
    for (int k = 0; k < nt; k++) {
        size_t o = off[k];
        adamw_update_cuda(r_p + o, r_pb + o, d_g + o, r_m + o, r_v + o,
                          sizes[k], lr, b1, b2, eps, ts[k].decay ? wd : 0.0f,
                          clip < 0 ? NULL : d_scale, t[ts[k].region], st);
    }
    float *rp = hcopy_dev_(r_p, n), *rm = hcopy_dev_(r_m, n);
    float *rv = hcopy_dev_(r_v, n), *rpb = hbf_(r_pb, n);
    check_true_("adamw_multi = per-tensor path, bit for bit",
                !memcmp(rp, gp, n * sizeof(float)) &&
                !memcmp(rm, gm, n * sizeof(float)) &&
                !memcmp(rv, gv, n * sizeof(float)) &&
                !memcmp(rpb, gpb, n * sizeof(float)));

    /* the step's values from device memory (adamw_multi_dev_cuda, what a
     * CUDA graph replays): the same bits again */
    float *q_p = dcopy_(p0, n), *q_m = dcopy_(m0, n), *q_v = dcopy_(v0, n);
    bf16 *q_pb = dbf_(p0, n);
    size_t na = adamw_multi_args_floats(plan);
    float *args = (float *)malloc(na * sizeof(float));
    adamw_multi_args_fill(plan, args, t, lr, b1, b2, eps, wd, max_norm);
    float *d_args = dcopy_(args, na);
    adamw_multi_dev_cuda(plan, q_p, q_pb, d_g, q_m, q_v, d_args,
                         clip < 0 ? NULL : d_ssq, st);
    float *qp = hcopy_dev_(q_p, n), *qm = hcopy_dev_(q_m, n);
    float *qv = hcopy_dev_(q_v, n), *qpb = hbf_(q_pb, n);
    check_true_("adamw_multi_dev (device args) = per-tensor path, bit for "
                "bit",
                !memcmp(rp, qp, n * sizeof(float)) &&
                !memcmp(rm, qm, n * sizeof(float)) &&
                !memcmp(rv, qv, n * sizeof(float)) &&
                !memcmp(rpb, qpb, n * sizeof(float)));
    free(args); free(qp); free(qm); free(qv); free(qpb);
    cudaFree(q_p); cudaFree(q_m); cudaFree(q_v); cudaFree(q_pb);
    cudaFree(d_args);
    adamw_multi_plan_destroy(plan);
    free(off); free(p0); free(gr); free(m0); free(v0); free(p); free(m);
    free(v); free(ts); free(t); free(gp); free(gm); free(gv); free(gpb);
    free(rp); free(rm); free(rv); free(rpb);
    cudaFree(d_g); cudaFree(d_ssq); cudaFree(d_p); cudaFree(d_m);
    cudaFree(d_v); cudaFree(d_pb); cudaFree(r_p); cudaFree(r_m);
    cudaFree(r_v); cudaFree(r_pb); cudaFree(d_scale);
}

static void test_adamw_multi_(void)
{
    /* odd sizes, one past a block's chunk (1024), an empty tensor, a
     * one-element one; regions as the globals and two slots */
    const size_t sizes[] = {37, 1025, 2053, 0, 1, 4099, 768, 3 * 1024 + 5};
    const int regions[] = {0, 0, 1, 1, 1, 2, 2, 2};
    const int nt = (int)(sizeof sizes / sizeof sizes[0]);
    test_adamw_multi_case_("clipped", sizes, regions, nt, 3, 0.5f);
    test_adamw_multi_case_("norm under max_norm", sizes, regions, nt, 3, 2);
    test_adamw_multi_case_("max_norm 0", sizes, regions, nt, 3, 0);
    test_adamw_multi_case_("no sumsq", sizes, regions, nt, 3, -1);
    /* an empty region in the middle (region 1 has no tensor) */
    const int regions_gap[] = {0, 0, 2, 2, 2, 3, 3, 3};
    test_adamw_multi_case_("empty region", sizes, regions_gap, nt, 4, 0.5f);
    /* more regions than one launch takes (ADAMW_MULTI_REGIONS) */
    enum { NT = 2 * (ADAMW_MULTI_REGIONS + 6) };
    size_t many[NT];
    int many_r[NT];
    for (int k = 0; k < NT; k++) {
        many[k] = 1 + (size_t)(k * 37) % 300;
        many_r[k] = k / 2;
    }
    test_adamw_multi_case_("more regions than a launch", many, many_r, NT,
                           NT / 2, 0.5f);

    printf("adamw_multi_plan_create refusals\n");
    adamw_tensor_cuda bad[2] = {{0, 8, 1, 1, 0}, {8, 8, 1, 0, 0}};
    check_true_("regions out of order refused",
                adamw_multi_plan_create(bad, 2, 2) == NULL);
    bad[1].region = 2;
    check_true_("region out of range refused",
                adamw_multi_plan_create(bad, 2, 2) == NULL);
    check_true_("no tensors refused",
                adamw_multi_plan_create(bad, 0, 2) == NULL);
}

/* cuBLASLt asked (nothing run) for every GEMM shape of the benchmarks'
 * models, as gpt_cuda_create asks at their creation: the attention GEMMs,
 * the epilogues and the plain GEMMs of GPT-2 124M, 350M, 1.5B (gpu_train,
 * gpu_offload) and gpu_offload --largest's width, at their microbatch
 * sizes. The paths against $M6_TEST_EXPECT_*; the plain GEMMs have no
 * fallback and must have an algorithm. The heuristic only sees pointers'
 * alignments: one small allocation (256-aligned) stands for every tensor. */
static void test_bench_shapes_(void)
{
    static const struct { const char *name; int B, T, C, NH, Vp; } m[] = {
        {"124M", 32, 1024, 768, 12, 50304}, {"350M", 32, 1024, 1024, 16, 50304},
        {"1.5B", 8, 1024, 1600, 25, 50304}, {"largest", 1, 1024, 5120, 40, 50304}};
    bf16 *d = dnan_bf16_(4096);
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        int B = m[i].B, T = m[i].T, C = m[i].C, NH = m[i].NH, N = B * T;
        char why[256] = "", what[96];
        printf("cuBLASLt at the %s shapes (B=%d T=%d C=%d NH=%d)\n",
               m[i].name, B, T, C, NH);
        size_t wsb = attention_gemm_workspace_bytes(B, T, C, NH);
        check_true_("attention_gemm offered for the shape", wsb > 0);
        int att = wsb && attention_gemm_supported(d, wsb, d, d, d, d, B, T, C,
                                                  NH, why, sizeof why);
        if (!att)
            printf("  %s\n", why);
        snprintf(what, sizeof what, "%s attention path", m[i].name);
        check_path_("M6_TEST_EXPECT_ATT", what, att ? "gemm" : "flash");
        /* C -> OC of qkv, attproj, fc (GELU), fcproj, LM head (no bias) */
        const int cin[5] = {C, C, C, 4 * C, C};
        const int oc[5] = {3 * C, C, 4 * C, C, m[i].Vp};
        int plain = 1, fused = 0;
        for (int k = 0; k < 5; k++) {
            plain &= matmul_plain_supported(d, d, d, d, d, d, N, cin[k], oc[k],
                                            why, sizeof why);
            if (k < 4)
                fused += matmul_forward_fused_supported(d, d, d, d, d, N,
                                                        cin[k], oc[k], k == 2);
        }
        if (!plain)
            printf("  %s\n", why);
        check_true_("plain GEMMs have algorithms", plain);
        snprintf(what, sizeof what, "%s epilogue path", m[i].name);
        check_path_("M6_TEST_EXPECT_EPI", what,
                    fused == 4 ? "fused" : fused == 0 ? "separate" : "mixed");
    }
    cudaFree(d);
}

int main(void)
{
    cuda_device_or_skip("test_ops");
    CUDA_CHECK(cudaStreamCreate(&st));
    test_encoder_();
    test_layernorm_(300, 192); /* N not a multiple of a block's 128 rows */
    test_layernorm_(130, 264); /* C past one 256-column sweep of a warp */
    test_matmul_(96, 64, 192, 1, 0);     /* bias epilogue */
    test_matmul_(96, 128, 256, 0, 0);    /* no bias (the LM head) */
    test_matmul_(96, 64, 256, 1, 1);     /* GELU_AUX_BIAS epilogue */
    test_matmul_dgelu_(96, 256, 64);     /* DGELU epilogue (fcproj) */
    test_attention_(2, 67, 128, 2);      /* hs 64, T not a tile multiple */
    test_attention_(2, 130, 128, 4);     /* hs 32 */
    test_attention_(1, 45, 256, 2);      /* hs 128 */
    test_attention_(3, 33, 64, 4);       /* hs 16 */
    test_attention_(4, 40, 64, 2);       /* B > NH: batched over sequences */
    /* every tensor-core head size, T past one 64-row tile and not a
     * multiple of it (a diagonal tile masked, one above it skipped),
     * B NH = 1 */
    test_attention_impls_(1, 37, 32, 1);   /* hs 32, B NH = 1 */
    test_attention_impls_(2, 70, 128, 2);  /* hs 64, two tiles */
    test_attention_impls_(1, 45, 160, 2);  /* hs 80 */
    test_attention_impls_(1, 67, 128, 1);  /* hs 128, B NH = 1 */
    test_bench_shapes_();
    test_elementwise_(5000, 0); /* 128-bit groups only */
    test_elementwise_(5003, 0); /* and a tail of 3 */
    test_elementwise_(5003, 1); /* unaligned: one at a time */
    test_crossentropy_();
    test_crossentropy_fused_(70, 200, 256);
    test_crossentropy_fused_(3, 1000, 1024); /* V past the block */
    test_adamw_();
    test_adamw_multi_();
    test_adamw_sr_();
    test_adamw_sr_small_();
    test_adafactor_sr_();
    test_adafactor_();
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaStreamDestroy(st));
    matmul_cuda_fini();
    printf("test_ops: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
