/*
 * test_kernels.c — unit tests of the CPU reference kernels (kernels/cpu/).
 *
 * Every op is checked against an independent double-precision reference
 * forward written here from the math (plain loops; nothing from the code
 * under test). With a fixed random R and the scalar objective
 *     L(x) = sum(out(x) ⊙ R),
 * dL/dx is taken by central differences on the double reference (h = 1e-5:
 * truncation ~h^2 and round-off ~1e-16/h, both ~1e-10, far below fp32
 * noise) and compared with the fp32 backward seeded with dout = R.
 * Inputs and R are drawn as floats, so the fp32 and double runs see exactly
 * the same numbers; any difference is the fp32 arithmetic (or a bug).
 *
 * Errors are max|got - ref| / max|ref| (normalised by the largest reference
 * value, so tiny entries don't blow up a relative error). Each op states its
 * tolerance and why next to its test.
 *
 * Also: accumulation (+=) semantics of every backward, attention causality,
 * softmax rows summing to 1, the cross-entropy loss against -log p by hand,
 * and bitwise determinism across runs and thread counts. The optimizer's
 * ops (AdamW, grad_sumsq, the offloaded slots' host loops) are tested in
 * test_optimizer_ops.c.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "cpu/cpu_math.h"      /* the internal exp_, tested on its own */
#include "../common/rand_fill.h"
#include "../common/test_main.h"

/* shapes: small so the finite differences are quick */
enum { B = 2, T = 5, C = 8, NH = 2, V = 11, OC = 12, MAXT = 7, N = B * T };

#define FD_H 1e-5

/* ------------------------------------------------------------- helpers */

/* forwards overwrite their outputs: start them from stale values */
static void stale(float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = 7.0f;
}

/* the _first backwards must not read their output: start it from NaN */
static void poison(float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = NAN;
}

/* max|got - ref| / max|ref| */
static double nerr(const float *got, const double *ref, size_t n)
{
    double maxref = 1e-30, maxdiff = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= maxdiff)) maxdiff = d;     /* NaN propagates as failure */
    }
    return maxdiff / maxref;
}

static void check_(const char *what, const float *got, const double *ref,
                   size_t n, double tol)
{
    double e = nerr(got, ref, n);
    printf("    %-28s err %.2e (tol %.0e)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: normalised error %.3e > %.1e", what, e, tol);
}

static double dotR(const double *out, const double *R, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += out[i] * R[i];
    return s;
}

/* central differences of f(ctx) w.r.t. every x[i] */
typedef double (*objective_fn)(void *ctx);
static void fd_grad(objective_fn f, void *ctx, double *x, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = f(ctx);
        x[i] = x0 - FD_H;
        double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * FD_H);
    }
}

/*
 * Accumulation semantics of a backward: with g1 = bwd from zeroed grads,
 *   bwd twice from zero   == 2 g1
 *   bwd onto prefilled P  == P + g1
 * (to 1e-5 of the largest value: the kernels may round the sum differently,
 * e.g. sgemm with beta = 1, but overwriting instead of adding is off by O(1)).
 */
typedef void (*bwd_fn)(void *ctx, float **grads);
static void check_accumulation(const char *name, bwd_fn bwd, void *ctx,
                               int ngrad, const size_t *sizes)
{
    float *g1[4], *g2[4], *g3[4], *pre[4];
    for (int k = 0; k < ngrad; k++) {
        g1[k] = falloc(sizes[k]);
        g2[k] = falloc(sizes[k]);
        g3[k] = falloc(sizes[k]);
        pre[k] = falloc(sizes[k]);
        fill(pre[k], NULL, sizes[k], -1.0f, 1.0f);
        memcpy(g3[k], pre[k], sizes[k] * sizeof(float));
    }
    bwd(ctx, g1);
    bwd(ctx, g2);
    bwd(ctx, g2);
    bwd(ctx, g3);
    for (int k = 0; k < ngrad; k++) {
        double *twice = dalloc(sizes[k]), *added = dalloc(sizes[k]);
        double maxg = 0.0;
        for (size_t i = 0; i < sizes[k]; i++) {
            twice[i] = 2.0 * g1[k][i];
            added[i] = (double)pre[k][i] + g1[k][i];
            if (fabs(g1[k][i]) > maxg) maxg = fabs(g1[k][i]);
        }
        char what[64];
        if (maxg == 0.0)
            fail_msg("%s grad %d: all zero, accumulation untested", name, k);
        snprintf(what, sizeof what, "%s accum twice [%d]", name, k);
        check_(what, g2[k], twice, sizes[k], 1e-5);
        snprintf(what, sizeof what, "%s accum prefill [%d]", name, k);
        check_(what, g3[k], added, sizes[k], 1e-5);
        free(twice); free(added);
        free(g1[k]); free(g2[k]); free(g3[k]); free(pre[k]);
    }
}

/* One input of an op, for check_backward_: its gradient's name, its double
 * copy (which the objective reads and central differences move), its
 * length, and the tolerance of its gradient. */
typedef struct { const char *name; double *x; size_t n; double tol; } grad_in;

/*
 * An op's backward against central differences of its double objective
 * obj: bwd, from zeroed gradients, gives the gradient of each of the n
 * inputs to its tolerance; then the accumulation semantics
 * (check_accumulation). Input k's finite-difference gradient comes back
 * in fd[k] (caller frees) when fd is not NULL.
 */
static void check_backward_(const char *op, objective_fn obj, bwd_fn bwd,
                            void *ctx, int n, const grad_in *in, double **fd)
{
    float *g[4];
    double *ref[4];
    size_t sizes[4];
    for (int k = 0; k < n; k++) {
        sizes[k] = in[k].n;
        ref[k] = dalloc(in[k].n);
        fd_grad(obj, ctx, in[k].x, in[k].n, ref[k]);
        g[k] = falloc(in[k].n);
    }
    bwd(ctx, g);
    for (int k = 0; k < n; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s", op, in[k].name);
        check_(what, g[k], ref[k], in[k].n, in[k].tol);
        free(g[k]);
        if (fd)
            fd[k] = ref[k];
        else
            free(ref[k]);
    }
    check_accumulation(op, bwd, ctx, n, sizes);
}

/* ------------------------------------------- double reference forwards */

static void ref_encoder(double *out, const int32_t *inp, const double *wte,
                        const double *wpe)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[(b * T + t) * C + c] = wte[inp[b * T + t] * C + c] + wpe[t * C + c];
}

static void ref_layernorm(double *out, const double *x, const double *w,
                          const double *bias)
{
    for (int n = 0; n < N; n++) {
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) mean += x[n * C + c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
        var /= C;
        for (int c = 0; c < C; c++)
            out[n * C + c] = (x[n * C + c] - mean) / sqrt(var + 1e-5) * w[c] + bias[c];
    }
}

static void ref_matmul(double *out, const double *x, const double *w,
                       const double *bias)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
            out[n * OC + o] = s;
        }
}

/* out (Bn,Tn,Cn), att (Bn,NHn,Tn,Tn) (may be NULL) for any shape; with R,
 * returns L = sum(out ⊙ R) (0 without R); out may be NULL when R is given */
static double ref_attention_shape(double *out, double *att, const double *qkv,
                                  const double *R, int Bn, int Tn, int Cn,
                                  int NHn)
{
    int hs = Cn / NHn;
    double L = 0.0;
    double *p = malloc((size_t)Tn * sizeof *p);
    assert_non_null(p);
    for (int b = 0; b < Bn; b++)
        for (int h = 0; h < NHn; h++)
            for (int t = 0; t < Tn; t++) {
                const double *q = qkv + (size_t)(b * Tn + t) * 3 * Cn + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int s = 0; s < Tn; s++) {
                    if (s > t) { p[s] = -INFINITY; continue; }
                    const double *k = qkv + (size_t)(b * Tn + s) * 3 * Cn + Cn + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++)
                        d += q[i] * k[i];
                    p[s] = d / sqrt((double)hs);
                    if (p[s] > mx) mx = p[s];
                }
                for (int s = 0; s < Tn; s++) { p[s] = exp(p[s] - mx); sum += p[s]; }
                for (int s = 0; s < Tn; s++) {
                    p[s] /= sum;
                    if (att) att[((size_t)(b * NHn + h) * Tn + t) * Tn + s] = p[s];
                }
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int s = 0; s < Tn; s++)
                        o += p[s] * qkv[(size_t)(b * Tn + s) * 3 * Cn + 2 * Cn + h * hs + i];
                    size_t at = (size_t)(b * Tn + t) * Cn + h * hs + i;
                    if (out) out[at] = o;
                    if (R) L += o * R[at];
                }
            }
    free(p);
    return L;
}

/* out (B,T,C), att (B,NH,T,T) at the file's shape */
static void ref_attention(double *out, double *att, const double *qkv)
{
    ref_attention_shape(out, att, qkv, NULL, B, T, C, NH);
}

static double ref_gelu1(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* losses (N), probs (N,V): -log of the softmax probability of the target */
static void ref_crossentropy(double *losses, double *probs, const double *z,
                             const int32_t *y)
{
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < V; j++) if (z[n * V + j] > mx) mx = z[n * V + j];
        for (int j = 0; j < V; j++) sum += exp(z[n * V + j] - mx);
        for (int j = 0; j < V; j++) {
            double p = exp(z[n * V + j] - mx) / sum;
            if (probs) probs[n * V + j] = p;
        }
        losses[n] = -log(exp(z[n * V + y[n]] - mx) / sum);
    }
}

/* -------------------------------------------------------------- encoder */

typedef struct {
    int32_t inp[N];
    float wte[V * C], wpe[MAXT * C], dout[N * C];
    double wte_d[V * C], wpe_d[MAXT * C], R[N * C], out_d[N * C];
} enc_ctx;

static double enc_obj(void *p)
{
    enc_ctx *x = p;
    ref_encoder(x->out_d, x->inp, x->wte_d, x->wpe_d);
    return dotR(x->out_d, x->R, N * C);
}

static void enc_bwd(void *p, float **g)
{
    enc_ctx *x = p;
    encoder_backward(g[0], g[1], x->dout, x->inp, B, T, C);
}

static void test_encoder(void **state)
{
    rng_seed(1);
    enc_ctx *x = calloc(1, sizeof *x);
    /* tokens from a small range so rows of dwte receive several scatters;
     * rows >= 4 of wte and rows >= T of wpe are never used (grad stays 0) */
    for (int i = 0; i < N; i++) x->inp[i] = rng_int(4);
    x->inp[0] = x->inp[1] = x->inp[N - 1];
    fill(x->wte, x->wte_d, V * C, -1, 1);
    fill(x->wpe, x->wpe_d, MAXT * C, -1, 1);
    fill(x->dout, x->R, N * C, -1, 1);

    /* forward: a single fp32 add per element, so exact to 1 ulp (6e-8) */
    float out[N * C];
    stale(out, N * C);
    encoder_forward(out, x->inp, x->wte, x->wpe, B, T, C);
    enc_obj(x);
    check_("encoder fwd", out, x->out_d, N * C, 1e-7);

    /* backward: sums of at most N fp32 values of |R| <= 1: 1e-6 covers it */
    const grad_in in[] = { { "dwte", x->wte_d, V * C, 1e-6 },
                           { "dwpe", x->wpe_d, MAXT * C, 1e-6 } };
    check_backward_("encoder", enc_obj, enc_bwd, x, 2, in, NULL);
    free(x);
    (void)state;
}

/* ------------------------------------------------------------ layernorm */

typedef struct {
    float x[N * C], w[C], b[C], dout[N * C], mean[N], rstd[N];
    double x_d[N * C], w_d[C], b_d[C], R[N * C], out_d[N * C];
} ln_ctx;

static double ln_obj(void *p)
{
    ln_ctx *x = p;
    ref_layernorm(x->out_d, x->x_d, x->w_d, x->b_d);
    return dotR(x->out_d, x->R, N * C);
}

static void ln_bwd(void *p, float **g)
{
    ln_ctx *x = p;
    layernorm_backward(g[0], g[1], g[2], x->dout, x->x, x->w, x->mean,
                       x->rstd, N, C);
}

static void test_layernorm(void **state)
{
    rng_seed(2);
    ln_ctx *x = calloc(1, sizeof *x);
    fill(x->x, x->x_d, N * C, -2, 3);        /* non-zero mean */
    fill(x->w, x->w_d, C, 0.5, 1.5);
    fill(x->b, x->b_d, C, -0.5, 0.5);
    fill(x->dout, x->R, N * C, -1, 1);

    /* forward: mean/var/rstd in fp32 over C values: a few ulp, 1e-6 */
    float out[N * C];
    stale(out, N * C);
    layernorm_forward(out, x->mean, x->rstd, x->x, x->w, x->b, N, C);
    ln_obj(x);
    check_("layernorm fwd", out, x->out_d, N * C, 1e-6);
    for (int n = 0; n < N; n++) {
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x->x_d[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x->x_d[n * C + c] - m) * (x->x_d[n * C + c] - m);
        v /= C;
        assert_true(fabs(x->mean[n] - m) <= 1e-6 * (1.0 + fabs(m)));
        assert_true(fabs(x->rstd[n] - 1.0 / sqrt(v + 1e-5)) <= 1e-5 / sqrt(v + 1e-5));
    }

    /* backward: dinp subtracts two row means from g (cancellation), so fp32
     * error grows beyond a plain sum: ~1e-7 of max|g| seen, 2e-6 allowed.
     * dweight/dbias are sums over N rows: 1e-6. */
    const grad_in in[] = { { "dinp", x->x_d, N * C, 2e-6 },
                           { "dweight", x->w_d, C, 1e-6 },
                           { "dbias", x->b_d, C, 1e-6 } };
    check_backward_("layernorm", ln_obj, ln_bwd, x, 3, in, NULL);
    free(x);
    (void)state;
}

/* --------------------------------------------------------------- matmul */

typedef struct {
    float x[N * C], w[OC * C], b[OC], dout[N * OC];
    double x_d[N * C], w_d[OC * C], b_d[OC], R[N * OC], out_d[N * OC];
    int use_bias;
} mm_ctx;

static double mm_obj(void *p)
{
    mm_ctx *x = p;
    ref_matmul(x->out_d, x->x_d, x->w_d, x->use_bias ? x->b_d : NULL);
    return dotR(x->out_d, x->R, N * OC);
}

static void mm_bwd(void *p, float **g)
{
    mm_ctx *x = p;
    matmul_backward(g[0], g[1], g[2], x->dout, x->x, x->w, N, C, OC);
}

static void test_matmul(void **state)
{
    rng_seed(3);
    mm_ctx *x = calloc(1, sizeof *x);
    fill(x->x, x->x_d, N * C, -1, 1);
    fill(x->w, x->w_d, OC * C, -1, 1);
    fill(x->b, x->b_d, OC, -1, 1);
    fill(x->dout, x->R, N * OC, -1, 1);

    /* forward: dot products of C (or N) fp32 terms of magnitude <= 1 (sgemm
     * may use FMA and any summation order): ~C ulp of the result; 1e-6 */
    float out[N * OC];
    for (int ub = 0; ub <= 1; ub++) {
        x->use_bias = ub;
        stale(out, N * OC);
        matmul_forward(out, x->x, x->w, ub ? x->b : NULL, N, C, OC);
        mm_obj(x);
        check_(ub ? "matmul fwd (bias)" : "matmul fwd (no bias)", out,
               x->out_d, N * OC, 1e-6);
    }

    /* backward (same reasoning): 1e-6 */
    const grad_in in[] = { { "dinp", x->x_d, N * C, 1e-6 },
                           { "dweight", x->w_d, OC * C, 1e-6 },
                           { "dbias", x->b_d, OC, 1e-6 } };
    double *fd[3];
    check_backward_("matmul", mm_obj, mm_bwd, x, 3, in, fd);

    /* dinp == NULL and dbias == NULL: the rest is computed the same */
    float *dw = falloc(OC * C);
    matmul_backward(NULL, dw, NULL, x->dout, x->x, x->w, N, C, OC);
    check_("matmul dweight (NULLs)", dw, fd[1], OC * C, 1e-6);
    free(dw); free(fd[0]); free(fd[1]); free(fd[2]); free(x);
    (void)state;
}

/* matmul cuts its GEMM outputs into 16-aligned blocks, one per thread; at
 * the shapes above every block but the first is empty. Here C and OC span
 * several blocks (and end mid-block); gradients of this linear op are
 * written out in double (dinp = dout W, dweight = dout^T x, dbias = column
 * sums), with the same 1e-6 tolerance as above. The _gelu backward takes
 * GELU's derivative over 16-aligned row blocks after the GEMMs: MN spans
 * three of them; its reference derivative is a central difference of the
 * double GELU. */
static void test_matmul_blocks(void **state)
{
    enum { MN = 37, MC = 41, MOC = 53 };
    rng_seed(11);
    float *x = falloc(MN * MC), *w = falloc(MOC * MC), *b = falloc(MOC);
    float *d = falloc(MN * MOC), *out = falloc(MN * MOC);
    float *dx = falloc(MN * MC), *dw = falloc(MOC * MC), *db = falloc(MOC);
    double *rout = dalloc(MN * MOC), *rdx = dalloc(MN * MC);
    double *rdw = dalloc(MOC * MC), *rdb = dalloc(MOC);
    fill(x, NULL, MN * MC, -1, 1);
    fill(w, NULL, MOC * MC, -1, 1);
    fill(b, NULL, MOC, -1, 1);
    fill(d, NULL, MN * MOC, -1, 1);
    for (int n = 0; n < MN; n++)
        for (int o = 0; o < MOC; o++) {
            double s = b[o];
            for (int c = 0; c < MC; c++) s += (double)x[n * MC + c] * w[o * MC + c];
            rout[n * MOC + o] = s;
            rdb[o] += d[n * MOC + o];
            for (int c = 0; c < MC; c++) {
                rdx[n * MC + c] += (double)d[n * MOC + o] * w[o * MC + c];
                rdw[o * MC + c] += (double)d[n * MOC + o] * x[n * MC + c];
            }
        }
    float *pre = falloc(MN * MC), *dpre = falloc(MN * MC);
    double *rdpre = dalloc(MN * MC);
    fill(pre, NULL, MN * MC, -3, 3);
    for (int i = 0; i < MN * MC; i++) {
        double h = 1e-4, p = pre[i];
        rdpre[i] = (ref_gelu1(p + h) - ref_gelu1(p - h)) / (2 * h) * rdx[i];
    }
    /* 1 thread does both GEMMs; 2, 3 and 4 split them between the input
     * gradient's threads and the weight gradient's (3: one and two) */
    int nt = omp_get_max_threads();
    for (int th = 1; th <= 4; th++) {
        omp_set_num_threads(th);
        printf("    %d threads\n", th);
        stale(out, MN * MOC);
        memset(dx, 0, MN * MC * sizeof(float));
        memset(dw, 0, MOC * MC * sizeof(float));
        memset(db, 0, MOC * sizeof(float));
        matmul_forward(out, x, w, b, MN, MC, MOC);
        matmul_backward(dx, dw, db, d, x, w, MN, MC, MOC);
        check_("matmul blocks fwd", out, rout, MN * MOC, 1e-6);
        check_("matmul blocks dinp", dx, rdx, MN * MC, 1e-6);
        check_("matmul blocks dweight", dw, rdw, MOC * MC, 1e-6);
        check_("matmul blocks dbias", db, rdb, MOC, 1e-6);
        /* _first: dinp written over NaN; dweight, dbias still added */
        poison(dx, MN * MC);
        memset(dw, 0, MOC * MC * sizeof(float));
        memset(db, 0, MOC * sizeof(float));
        matmul_backward_first(dx, dw, db, d, x, w, MN, MC, MOC, 0);
        check_("matmul blocks dinp (first)", dx, rdx, MN * MC, 1e-6);
        check_("matmul blocks dweight (first)", dw, rdw, MOC * MC, 1e-6);
        check_("matmul blocks dbias (first)", db, rdb, MOC, 1e-6);
        /* dw_store: dweight written over NaN too; dbias still added */
        poison(dx, MN * MC);
        poison(dw, MOC * MC);
        memset(db, 0, MOC * sizeof(float));
        matmul_backward_first(dx, dw, db, d, x, w, MN, MC, MOC, 1);
        check_("matmul blocks dinp (first, store)", dx, rdx, MN * MC, 1e-6);
        check_("matmul blocks dweight (first, store)", dw, rdw, MOC * MC,
               1e-6);
        check_("matmul blocks dbias (first, store)", db, rdb, MOC, 1e-6);
        /* _gelu: x stands for the activation, pre for its pre-activation */
        poison(dx, MN * MC);
        poison(dpre, MN * MC);
        memset(dw, 0, MOC * MC * sizeof(float));
        memset(db, 0, MOC * sizeof(float));
        matmul_backward_gelu(dpre, dx, dw, db, d, x, pre, w, MN, MC, MOC, 0);
        check_("matmul blocks dact (gelu)", dx, rdx, MN * MC, 1e-6);
        check_("matmul blocks dpre (gelu)", dpre, rdpre, MN * MC, 1e-6);
        check_("matmul blocks dweight (gelu)", dw, rdw, MOC * MC, 1e-6);
        check_("matmul blocks dbias (gelu)", db, rdb, MOC, 1e-6);
        poison(dx, MN * MC);
        poison(dpre, MN * MC);
        poison(dw, MOC * MC);
        memset(db, 0, MOC * sizeof(float));
        matmul_backward_gelu(dpre, dx, dw, db, d, x, pre, w, MN, MC, MOC, 1);
        check_("matmul blocks dpre (gelu, store)", dpre, rdpre, MN * MC, 1e-6);
        check_("matmul blocks dweight (gelu, store)", dw, rdw, MOC * MC,
               1e-6);
    }
    omp_set_num_threads(nt);
    free(x); free(w); free(b); free(d); free(out); free(dx); free(dw); free(db);
    free(rout); free(rdx); free(rdw); free(rdb); free(pre); free(dpre);
    free(rdpre);
    (void)state;
}

/* ------------------------------------------------------------ attention */

typedef struct {
    float qkv[N * 3 * C], dout[N * C], att[B * NH * T * T];
    double qkv_d[N * 3 * C], R[N * C], out_d[N * C], att_d[B * NH * T * T];
} att_ctx;

static double att_obj(void *p)
{
    att_ctx *x = p;
    ref_attention(x->out_d, x->att_d, x->qkv_d);
    return dotR(x->out_d, x->R, N * C);
}

static void att_bwd(void *p, float **g)
{
    att_ctx *x = p;
    float scratch[B * NH * T * T];
    attention_backward(g[0], scratch, x->dout, x->qkv, x->att, B, T, C, NH);
}

static void test_attention(void **state)
{
    rng_seed(4);
    att_ctx *x = calloc(1, sizeof *x);
    fill(x->qkv, x->qkv_d, N * 3 * C, -2, 2);   /* peaked enough softmaxes */
    fill(x->dout, x->R, N * C, -1, 1);

    /* forward: fp32 dot of hs terms, expf, a normalising sum and a weighted
     * sum of T values: a few ulp each, compounded; 1e-6 */
    float out[N * C];
    stale(x->att, B * NH * T * T);
    stale(out, N * C);
    attention_forward(out, x->att, x->qkv, B, T, C, NH);
    att_obj(x);
    check_("attention fwd out", out, x->out_d, N * C, 1e-6);
    check_("attention fwd att", x->att, x->att_d, B * NH * T * T, 1e-6);

    /* backward: chains dot products, the softmax Jacobian (a difference
     * datt - sum att datt, with cancellation) and two more sums:
     * ~1e-7 seen, 2e-6 allowed */
    const grad_in in[] = { { "dqkv", x->qkv_d, N * 3 * C, 2e-6 } };
    check_backward_("attention", att_obj, att_bwd, x, 1, in, NULL);
    free(x);
    (void)state;
}

/* att rows sum to 1; zeros above the diagonal; a future token's k and v
 * don't change earlier outputs; earlier douts give no gradient to later
 * positions. */
/* Attention at a T that crosses the kernel's row blocks (attention.c,
 * ATT_ROWS = 64): T = 150 is two whole blocks and a partial one, and
 * B*NH = 1 (one task). Forward against a double reference written for any
 * shape; backward by central differences of L = sum(out ⊙ R) on that
 * reference along random directions u of qkv: dL/du = sum(dqkv ⊙ u). */
enum { LB = 1, LT = 150, LC = 16, LNH = 1 };

static void test_attention_blocks(void **state)
{
    (void)state;
    enum { NQ = LB * LT * 3 * LC, NO = LB * LT * LC, NA = LB * LNH * LT * LT };
    rng_seed(11);
    float *qkv = falloc(NQ), *out = falloc(NO), *dout = falloc(NO);
    float *att = falloc(NA), *scratch = falloc(NA), *dqkv = falloc(NQ);
    double *qkv_d = dalloc(NQ), *R = dalloc(NO), *out_d = dalloc(NO);
    fill(qkv, qkv_d, NQ, -2, 2);
    fill(dout, R, NO, -1, 1);
    stale(out, NO);
    stale(att, NA);
    attention_forward(out, att, qkv, LB, LT, LC, LNH);
    ref_attention_shape(out_d, NULL, qkv_d, R, LB, LT, LC, LNH);
    /* as test_attention, with sums of up to 150 terms: 1e-6 */
    check_("attention T=150 fwd out", out, out_d, NO, 1e-6);
    for (int t = 0; t < LT; t++)
        for (int s = t + 1; s < LT; s++)
            assert_true(att[(size_t)t * LT + s] == 0.0f);

    /* dirs 0-3: attention_backward into zeros; 4-7: attention_backward_first
     * over NaN (it must zero, not read, its output) */
    double *u = dalloc(NQ), *xp = dalloc(NQ);
    for (int dir = 0; dir < 8; dir++) {
        if (dir == 0) {
            memset(dqkv, 0, NQ * sizeof(float));
            attention_backward(dqkv, scratch, dout, qkv, att, LB, LT, LC, LNH);
        } else if (dir == 4) {
            poison(dqkv, NQ);
            attention_backward_first(dqkv, scratch, dout, qkv, att, LB, LT,
                                     LC, LNH);
        }
        double got = 0.0, norm = 0.0;
        for (int i = 0; i < NQ; i++) {
            u[i] = rng_float(-1, 1);
            got += dqkv[i] * u[i];
        }
        for (int i = 0; i < NQ; i++) xp[i] = qkv_d[i] + FD_H * u[i];
        double lp = ref_attention_shape(NULL, NULL, xp, R, LB, LT, LC, LNH);
        for (int i = 0; i < NQ; i++) xp[i] = qkv_d[i] - FD_H * u[i];
        double lm = ref_attention_shape(NULL, NULL, xp, R, LB, LT, LC, LNH);
        double fd = (lp - lm) / (2 * FD_H);
        for (int i = 0; i < NQ; i++) norm += fabs(dqkv[i] * u[i]);
        /* fp32 gradient of 7200 terms against an exact directional
         * derivative: relative to sum|g u|, 1e-5 (1e-7 per term seen at
         * T = 5, times the longer sums) */
        double e = fabs(got - fd) / norm;
        printf("    attention T=150 dqkv%s dir %d  err %.2e (tol 1e-05)\n",
               dir < 4 ? "" : " (first)", dir % 4, e);
        assert_true(e < 1e-5);
    }
    free(qkv); free(out); free(dout); free(att); free(scratch); free(dqkv);
    free(qkv_d); free(R); free(out_d); free(u); free(xp);
}

static void test_attention_causal(void **state)
{
    rng_seed(5);
    enum { T0 = 3 };
    float *qkv = falloc(N * 3 * C), *out1 = falloc(N * C), *out2 = falloc(N * C);
    float *att = falloc(B * NH * T * T);
    fill(qkv, NULL, N * 3 * C, -2, 2);
    fill(att, NULL, B * NH * T * T, 1, 2);      /* forward must overwrite */
    attention_forward(out1, att, qkv, B, T, C, NH);
    for (int r = 0; r < B * NH * T; r++) {
        int t = r % T;
        double sum = 0.0;
        for (int s = 0; s < T; s++) {
            sum += att[r * T + s];
            if (s > t) assert_true(att[r * T + s] == 0.0f);
            else assert_true(att[r * T + s] > 0.0f);
        }
        assert_true(fabs(sum - 1.0) < 1e-6);
    }

    /* perturb k and v (all heads) of position T0 in every batch row */
    for (int b = 0; b < B; b++)
        for (int c = C; c < 3 * C; c++)
            qkv[(b * T + T0) * 3 * C + c] += 0.75f;
    attention_forward(out2, att, qkv, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int same = memcmp(out1 + (b * T + t) * C, out2 + (b * T + t) * C,
                              C * sizeof(float)) == 0;
            if (t < T0) assert_true(same);      /* the past is untouched */
            else assert_false(same);            /* the present/future sees it */
        }

    /* dout only at positions < T0: no gradient reaches positions >= T0 */
    float *dout = falloc(N * C), *dqkv = falloc(N * 3 * C);
    float *scratch = falloc(B * NH * T * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T0; t++)
            for (int c = 0; c < C; c++)
                dout[(b * T + t) * C + c] = rng_float(-1, 1);
    attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < 3 * C; c++) {
                float gv = dqkv[(b * T + t) * 3 * C + c];
                if (t >= T0) assert_true(gv == 0.0f);
            }
    free(qkv); free(out1); free(out2); free(att);
    free(dout); free(dqkv); free(scratch);
    (void)state;
}

/* ----------------------------------------------------------------- gelu */

typedef struct {
    float x[N * C], dout[N * C];
    double x_d[N * C], R[N * C];
} gelu_ctx;

static double gelu_obj(void *p)
{
    gelu_ctx *x = p;
    double s = 0.0;
    for (int i = 0; i < N * C; i++) s += ref_gelu1(x->x_d[i]) * x->R[i];
    return s;
}

static void gelu_bwd(void *p, float **g)
{
    gelu_ctx *x = p;
    gelu_backward(g[0], x->x, x->dout, N * C);
}

static void test_gelu(void **state)
{
    rng_seed(6);
    gelu_ctx *x = calloc(1, sizeof *x);
    fill(x->x, x->x_d, N * C, -4, 4);
    fill(x->dout, x->R, N * C, -1, 1);

    /* forward: tanhf (≤ 2 ulp) and a few fp32 ops per element: 1e-6 */
    float out[N * C];
    double ref[N * C];
    stale(out, N * C);
    gelu_forward(out, x->x, N * C);
    for (int i = 0; i < N * C; i++) ref[i] = ref_gelu1(x->x_d[i]);
    check_("gelu fwd", out, ref, N * C, 1e-6);

    /* backward: GELU' from the same few fp32 ops, times dout: 1e-6 */
    const grad_in in[] = { { "dinp", x->x_d, N * C, 1e-6 } };
    check_backward_("gelu", gelu_obj, gelu_bwd, x, 1, in, NULL);
    free(x);
    (void)state;
}

/* ------------------------------------------------------------- residual */

typedef struct {
    float a[N * C], b[N * C], dout[N * C];
    double a_d[N * C], b_d[N * C], R[N * C];
} res_ctx;

static double res_obj(void *p)
{
    res_ctx *x = p;
    double s = 0.0;
    for (int i = 0; i < N * C; i++) s += (x->a_d[i] + x->b_d[i]) * x->R[i];
    return s;
}

static void res_bwd(void *p, float **g)
{
    res_ctx *x = p;
    residual_backward(g[0], g[1], x->dout, N * C);
}

static void test_residual(void **state)
{
    rng_seed(7);
    res_ctx *x = calloc(1, sizeof *x);
    fill(x->a, x->a_d, N * C, -1, 1);
    fill(x->b, x->b_d, N * C, -1, 1);
    fill(x->dout, x->R, N * C, -1, 1);

    /* forward: one fp32 add, correctly rounded: 1e-7 */
    float out[N * C];
    double ref[N * C];
    stale(out, N * C);
    residual_forward(out, x->a, x->b, N * C);
    for (int i = 0; i < N * C; i++) ref[i] = x->a_d[i] + x->b_d[i];
    check_("residual fwd", out, ref, N * C, 1e-7);

    /* backward: a copy of dout; only the FD error remains (~1e-10): 1e-7 */
    const grad_in in[] = { { "da", x->a_d, N * C, 1e-7 },
                           { "db", x->b_d, N * C, 1e-7 } };
    check_backward_("residual", res_obj, res_bwd, x, 2, in, NULL);
    free(x);
    (void)state;
}

/* -------------------------------------------------------- cross-entropy */

typedef struct {
    int32_t y[N];
    float z[N * V], dl[N], probs[N * V];
    double z_d[N * V], R[N], loss_d[N];
} ce_ctx;

static double ce_obj(void *p)
{
    ce_ctx *x = p;
    ref_crossentropy(x->loss_d, NULL, x->z_d, x->y);
    return dotR(x->loss_d, x->R, N);
}

static void ce_bwd(void *p, float **g)
{
    ce_ctx *x = p;
    softmax_crossentropy_backward(g[0], x->probs, x->y, x->dl, N, V);
}

static void test_crossentropy(void **state)
{
    rng_seed(8);
    ce_ctx *x = calloc(1, sizeof *x);
    for (int i = 0; i < N; i++) x->y[i] = rng_int(V);
    fill(x->z, x->z_d, N * V, -3, 3);
    fill(x->dl, x->R, N, 0, 1);

    /* forward: expf, a sum of V terms and logf: a few ulp; 1e-6 */
    float losses[N];
    double probs_d[N * V];
    stale(losses, N);
    stale(x->probs, N * V);
    softmax_crossentropy_forward(losses, x->probs, x->z, x->y, N, V);
    ref_crossentropy(x->loss_d, probs_d, x->z_d, x->y);
    check_("crossentropy loss", losses, x->loss_d, N, 1e-6);
    check_("crossentropy probs", x->probs, probs_d, N * V, 1e-6);
    for (int i = 0; i < N; i++) {
        double s = 0.0;
        for (int j = 0; j < V; j++) s += x->probs[i * V + j];
        assert_true(fabs(s - 1.0) < 1e-6);
    }

    /* backward: (probs - onehot) * dloss, one rounding each: 1e-6 */
    const grad_in in[] = { { "dlogits", x->z_d, N * V, 1e-6 } };
    double *gz;
    check_backward_("crossentropy", ce_obj, ce_bwd, x, 1, in, &gz);
    float *g = falloc(N * V);
    poison(g, N * V);
    softmax_crossentropy_backward_first(g, x->probs, x->y, x->dl, N, V);
    check_("crossentropy dlogits (first)", g, gz, N * V, 1e-6);
    free(g); free(gz); free(x);
    (void)state;
}

/* The loss is -log p(target), worked out by hand for three rows: an easy
 * one, one with huge logits (needs the max subtraction), and one whose
 * target probability underflows fp32 (e^-200) yet must give a finite loss. */
static void test_crossentropy_by_hand(void **state)
{
    float z[3 * 3] = { 1, 2, 3,   1000, 999, 998,   100, 0, -100 };
    int32_t y[3] = { 0, 1, 2 };
    float losses[3], probs[9];
    softmax_crossentropy_forward(losses, probs, z, y, 3, 3);
    double e1 = exp(1), e2 = exp(2), e3 = exp(3);
    double want0 = -log(e1 / (e1 + e2 + e3));                  /* 2.4076 */
    double want1 = -log(exp(-1) / (1 + exp(-1) + exp(-2)));    /* 1.4076 */
    double want2 = 200 + log(1 + exp(-100) + exp(-200));       /* 200 */
    printf("    losses %.6f %.6f %.6f\n", losses[0], losses[1], losses[2]);
    assert_true(fabs(losses[0] - want0) < 1e-6 * want0);
    assert_true(fabs(losses[1] - want1) < 1e-6 * want1);
    assert_true(fabs(losses[2] - want2) < 1e-6 * want2);
    assert_true(fabs(probs[2] - e3 / (e1 + e2 + e3)) < 1e-6);
    (void)state;
}

/* exp_ (the vectorisable expf of the CPU kernels) against exp in double
 * over its whole unclamped range: within 3 ulp (2^-23 * 3 relative), and
 * exact at 0. */
static void test_exp(void **state)
{
    double worst = 0.0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 2000000.0f;
        double want = exp((double)x);
        double e = fabs(exp_(x) - want) / want;
        if (e > worst) worst = e;
    }
    printf("    exp_ worst relative error %.2e\n", worst);
    assert_true(worst <= 3.0 * 1.1920929e-7);
    assert_true(exp_(0.0f) == 1.0f);
    assert_true(exp_(-INFINITY) >= 0.0f && exp_(-INFINITY) < 1e-37f);
    assert_true(isnan(exp_(NAN)));
    (void)state;
}

/* ---------------------------------------------------------- determinism */

/* The non-GEMM backwards reduce over rows; they must give the same bits on
 * every run and for every thread count. Larger shapes so several threads
 * get work. */
static void test_determinism(void **state)
{
    enum { DB = 3, DT = 17, DC = 96, DNH = 4, DV = 50, DN = DB * DT };
    rng_seed(10);
    int32_t inp[DN];
    for (int i = 0; i < DN; i++) inp[i] = rng_int(5);
    float *dout = falloc(DN * DC), *x = falloc(DN * DC), *w = falloc(DC);
    float *qkv = falloc(DN * 3 * DC), *att = falloc(DB * DNH * DT * DT);
    float *scr = falloc(DB * DNH * DT * DT), *mean = falloc(DN), *rstd = falloc(DN);
    float *tmp = falloc(DN * DC);
    fill(dout, NULL, DN * DC, -1, 1);
    fill(x, NULL, DN * DC, -1, 1);
    fill(w, NULL, DC, -1, 1);
    fill(qkv, NULL, DN * 3 * DC, -1, 1);
    layernorm_forward(tmp, mean, rstd, x, w, w, DN, DC);
    attention_forward(tmp, att, qkv, DB, DT, DC, DNH);

    int nt = omp_get_max_threads();
    float *ref[5] = { NULL };
    const int threads[3] = { 1, 2, 2 };
    for (int run = 0; run < 3; run++) {
        omp_set_num_threads(threads[run]);
        float *dwte = falloc(DV * DC), *dwpe = falloc(DT * DC);
        float *dx = falloc(DN * DC), *dw = falloc(DC), *dbias = falloc(DC);
        float *dqkv = falloc(DN * 3 * DC);
        encoder_backward(dwte, dwpe, dout, inp, DB, DT, DC);
        layernorm_backward(dx, dw, dbias, dout, x, w, mean, rstd, DN, DC);
        attention_backward(dqkv, scr, dout, qkv, att, DB, DT, DC, DNH);
        float *got[5] = { dwte, dx, dw, dqkv, dwpe };
        size_t sz[5] = { DV * DC, DN * DC, DC, DN * 3 * DC, DT * DC };
        for (int k = 0; k < 5; k++) {
            if (run == 0) ref[k] = got[k];
            else {
                assert_memory_equal(ref[k], got[k], sz[k] * sizeof(float));
                free(got[k]);
            }
        }
        free(dbias);
    }
    omp_set_num_threads(nt);
    for (int k = 0; k < 5; k++) free(ref[k]);
    free(dout); free(x); free(w); free(qkv); free(att); free(scr);
    free(mean); free(rstd); free(tmp);
    (void)state;
}

TEST_MAIN(
    cmocka_unit_test(test_encoder),
    cmocka_unit_test(test_layernorm),
    cmocka_unit_test(test_matmul),
    cmocka_unit_test(test_matmul_blocks),
    cmocka_unit_test(test_attention),
    cmocka_unit_test(test_attention_causal),
    cmocka_unit_test(test_attention_blocks),
    cmocka_unit_test(test_gelu),
    cmocka_unit_test(test_residual),
    cmocka_unit_test(test_crossentropy),
    cmocka_unit_test(test_crossentropy_by_hand),
    cmocka_unit_test(test_exp),
    cmocka_unit_test(test_determinism))
