/*
 * test_gemm.c — the CPU engine's GEMM and its self-check (kernels/cpu/
 * gemm.c), in both precisions: the real library passes; GEMMs made wrong
 * on purpose (a dropped term, a wrong transpose in one shape class only,
 * inputs rounded to bf16 in fp32 or left unrounded in bf16, rounding
 * by truncation, a C read where beta 0 says not to, results that change
 * between calls) fail it, the reason naming the shape class and the
 * precision; and a trainer on such a GEMM is refused with that reason,
 * while the real one trains.
 *
 * The bf16 GEMM's values are also checked here against this file's own
 * double loop on inputs rounded by this file's own bf16_ (at the engine's
 * shapes, all three transposes), gemm_bf16_round against hand-worked
 * values, and both of gemm.c's bf16 packers against this file's own
 * rounding on every sign, exponent and leading mantissa bits. The kernels' products are test_kernels' and torch_reference's
 * (PyTorch) business.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cpu/cpu_gemm.h"
#include "train/trainer.h"
#include "../common/synth_data.h"

static char dir_[256];
static gemm_f32_fn reals_[GEMM_N_PRECISIONS];  /* built-in, saved by main */
static gemm_f32_fn real_;      /* the built-in GEMM of the precision under
                                * test (the faults wrap it) */
static int calls_;

/* ---------------------------------------------------------- the faults */

/* drops the last term of every sum (K - 1 of K) */
static void drop_term_(gemm_op ta, gemm_op tb, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc)
{
    real_(ta, tb, M, N, K > 1 ? K - 1 : K, alpha, A, lda, B, ldb, beta, C,
          ldc);
}

/* TN computed as NN of the same stored A: wrong in that class alone
 * (square shapes hide nothing: the self-check's TN shapes are not) */
static void tn_as_nn_(gemm_op ta, gemm_op tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
    if (ta == GEMM_T && tb == GEMM_N && M <= lda) {
        /* read A as (M,K) rows of K out of the (K,M) storage: M*K floats,
         * within its K*lda */
        real_(GEMM_N, GEMM_N, M, N, K, alpha, A, K, B, ldb, beta, C, ldc);
        return;
    }
    real_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static float bf16_(float x)     /* round to nearest even, 8 bits kept */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* gemm on copies of A and B with every element passed through narrow: the
 * wrong GEMMs that change the inputs' precision */
static void rounded_inputs_(float (*narrow)(float), gemm_f32_fn gemm,
                            gemm_op ta, gemm_op tb, int M, int N, int K,
                            float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C,
                            int ldc)
{
    int ar = ta == GEMM_N ? M : K, br = tb == GEMM_N ? K : N;
    float *a = malloc(sizeof(float) * (size_t)ar * lda);
    float *b = malloc(sizeof(float) * (size_t)br * ldb);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < (size_t)ar * lda; i++)
        a[i] = narrow(A[i]);
    for (size_t i = 0; i < (size_t)br * ldb; i++)
        b[i] = narrow(B[i]);
    gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    free(a);
    free(b);
}

/* rounds both inputs to bf16 and multiplies those: a silent bf16 path */
static void bf16_inputs_(gemm_op ta, gemm_op tb, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc)
{
    rounded_inputs_(bf16_, real_, ta, tb, M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
}

/* beta 0 taken as a tiny beta: C is read, a NaN in it comes through */
static void reads_c_(gemm_op ta, gemm_op tb, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc)
{
    real_(ta, tb, M, N, K, alpha, A, lda, B, ldb,
          beta == 0.0f ? 1e-30f : beta, C, ldc);
}

/* right values, but the last bit of C[0,0] flips every other call */
static void unsteady_(gemm_op ta, gemm_op tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
    real_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (M > 0 && N > 0 && (calls_++ & 1))
        C[0] = nextafterf(C[0], INFINITY);
}

/* bf16 only: the inputs left as they are (an fp32 GEMM called bf16) */
static void unrounded_(gemm_op ta, gemm_op tb, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc)
{
    reals_[GEMM_FP32](ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static float trunc16_(float x)  /* towards zero, 8 bits kept */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* bf16 only: inputs truncated to bf16 rather than rounded to nearest */
static void truncated_(gemm_op ta, gemm_op tb, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc)
{
    rounded_inputs_(trunc16_, reals_[GEMM_FP32], ta, tb, M, N, K, alpha, A,
                    lda, B, ldb, beta, C, ldc);
}

/* ----------------------------------------------------------- the tests */

static void test_library_passes(void **unused)
{
    (void)unused;
    gemm_info gi;
    gemm_describe(&gi);
    printf("gemm: library=%s version=%s isa=%s\n", gi.library, gi.version,
           gi.isa);
    assert_string_equal(gi.library, "onednn");
    assert_non_null(strchr(gi.version, '.'));
    assert_string_not_equal(gi.isa, "unknown");
    for (int p = 0; p < GEMM_N_PRECISIONS; p++) {
        char why[512] = "untouched";
        assert_int_equal(gemm_selfcheck((gemm_precision)p, why, sizeof why),
                         0);
        assert_string_equal(why, "");
        assert_int_equal(gemm_ready((gemm_precision)p, why, sizeof why), 0);
    }
}

/* fn fails the self-check; the reason names want (a shape class or a
 * phrase) and the library */
static void expect_refused_(gemm_precision p, gemm_f32_fn fn,
                            const char *name, const char *want)
{
    char why[512] = "";
    real_ = reals_[p];
    gemm_swap_for_test(p, fn);
    int rc = gemm_selfcheck(p, why, sizeof why);
    int ready = gemm_ready(p, why, sizeof why);
    /* the other precision is untouched */
    char other[512];
    int other_ready = gemm_ready(p == GEMM_FP32 ? GEMM_BF16 : GEMM_FP32,
                                 other, sizeof other);
    gemm_swap_for_test(p, NULL);
    printf("%s %s: %s\n", gemm_precision_name(p), name, why);
    assert_int_equal(rc, -1);
    assert_int_equal(ready, -1);
    assert_int_equal(other_ready, 0);
    assert_non_null(strstr(why, "self-check"));
    assert_non_null(strstr(why, gemm_precision_name(p)));
    assert_non_null(strstr(why, "onednn"));
    if (!strstr(why, want))
        fail_msg("%s: reason does not name '%s': %s", name, want, why);
}

/* The wrong GEMMs, in the order they are tried, with the precisions
 * they are wrong for (ON_FP32, ON_BF16: an fp32 GEMM with bf16 inputs is
 * wrong, a bf16 one is not), the name printed and the shape class or
 * phrase the self-check's reason must name. */
enum { ON_FP32 = 1 << GEMM_FP32, ON_BF16 = 1 << GEMM_BF16 };
static const struct {
    gemm_f32_fn fn;
    int on;
    const char *name, *want;
} wrong_[] = {
    {drop_term_, ON_FP32 | ON_BF16, "dropped term", "NT 64x96x384"},
    {tn_as_nn_, ON_FP32 | ON_BF16, "TN as NN", "TN "},
    {bf16_inputs_, ON_FP32, "bf16 inputs", "NT 64x96x384"},
    {unrounded_, ON_BF16, "unrounded inputs", "NT 64x96x384"},
    {truncated_, ON_BF16, "truncated inputs", "NT 64x96x384"},
    {reads_c_, ON_FP32 | ON_BF16, "reads C at beta 0", "beta 0"},
    {unsteady_, ON_FP32 | ON_BF16, "unsteady", "different bits"},
};

/* For each precision: every wrong GEMM of it refused, then the real one
 * passes again. */
static void test_wrong_gemms_refused(void **unused)
{
    (void)unused;
    for (int p = 0; p < GEMM_N_PRECISIONS; p++) {
        for (size_t i = 0; i < sizeof wrong_ / sizeof *wrong_; i++)
            if (wrong_[i].on & (1 << p))
                expect_refused_((gemm_precision)p, wrong_[i].fn,
                                wrong_[i].name, wrong_[i].want);
        char why[512];
        assert_int_equal(gemm_ready((gemm_precision)p, why, sizeof why), 0);
    }
}

/* gemm_bf16_round against values worked by hand: bf16 keeps 8
 * significant bits, so near 1 its step is 2^-7 */
static void test_bf16_round(void **unused)
{
    (void)unused;
    float e = ldexpf(1.0f, -8);   /* half a step at 1 */
    assert_true(gemm_bf16_round(1.0f) == 1.0f);
    assert_true(gemm_bf16_round(1.0f + e) == 1.0f);            /* tie: even */
    assert_true(gemm_bf16_round(1.0f + 3 * e) == 1.0f + 4 * e); /* tie: even */
    assert_true(gemm_bf16_round(1.0f + e + ldexpf(1.0f, -20)) ==
                1.0f + 2 * e);                                  /* above half */
    assert_true(gemm_bf16_round(-(1.0f + e)) == -1.0f);
    assert_true(gemm_bf16_round(3.14159265f) == 3.140625f);     /* 201/64 */
    assert_true(gemm_bf16_round(ldexpf(1.0f, -130)) == ldexpf(1.0f, -130));
    assert_true(isinf(gemm_bf16_round(3.4e38f)));               /* overflow */
    assert_true(isnan(gemm_bf16_round(NAN)));
    /* a NaN whose payload lies in the dropped half stays NaN */
    uint32_t u = 0x7f800001u;
    float n;
    memcpy(&n, &u, 4);
    assert_true(isnan(gemm_bf16_round(n)));
}

/* bf16 bits of x by this file's own rule, worked another way than gemm.c's
 * integer sum: the two bf16 neighbours of |x| (truncated, and one step up,
 * 2^128 above the largest finite), the nearer in double, a tie to the one
 * with an even last bit; NaN: its upper half, quieted */
static uint16_t bf16_ref_bits_(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
    float flo;
    memcpy(&flo, &lo, 4);
    double dlo = flo, dhi, dx = fabs((double)x);
    if (hi >= 0x7f800000u) {
        dhi = ldexp(1.0, 128);
    } else {
        float fhi;
        memcpy(&fhi, &hi, 4);
        dhi = fhi;
    }
    uint32_t pick = dx - dlo < dhi - dx   ? lo
                    : dx - dlo > dhi - dx ? hi
                    : (lo & 0x10000u)     ? hi : lo;
    if (mag == 0x7f800000u)
        pick = mag;   /* infinity stays */
    return (uint16_t)((sign | pick) >> 16);
}

/* Both of gemm.c's bf16 packers (the portable one, and the AVX512-BF16 one
 * where this CPU has it) against bf16_ref_bits_ on every sign, exponent and
 * top 7 mantissa bits, each with 8 lower halves (0, 1, just under, at and
 * just over the tie, ...), packed as rows as they come, in rows with a
 * tail and a row stride wider than the row, and shuffled (so that vectors
 * mix subnormals, NaN and normals). */
static void test_bf16_packers(void **unused)
{
    (void)unused;
    static const uint16_t lows[8] = {0x0000, 0x0001, 0x7fff, 0x8000,
                                     0x8001, 0xc000, 0xffff, 0x5a3c};
    enum { NV = 65536 * 8, COLS = 128 };
    float *x = malloc(NV * sizeof *x), *y = malloc(NV * sizeof *y);
    uint16_t *want = malloc(NV * sizeof *want), *got = malloc(NV * sizeof *got);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(want);
    assert_non_null(got);
    for (uint32_t i = 0; i < NV; i++) {
        uint32_t u = (i / 8) << 16 | lows[i % 8];
        memcpy(&x[i], &u, 4);
        /* an odd multiplier permutes [0, 2^19) */
        y[(uint32_t)((uint64_t)i * 2654435761u) % NV] = x[i];
    }
    const float *srcs[2] = {x, y};
    for (int native = 0; native <= 1; native++) {
        long bad = 0;
        for (int v = 0; v < 2; v++) {
            const float *src = srcs[v];
            for (uint32_t i = 0; i < NV; i++)
                want[i] = bf16_ref_bits_(src[i]);
            /* every element, rows of COLS */
            memset(got, 0, NV * sizeof *got);
            if (gemm_pack_bf16_for_test(got, src, NV / COLS, COLS, COLS,
                                        native) != 0) {
                assert_int_equal(native, 1);
                print_message("bf16 packer native: this CPU has no "
                              "AVX512-BF16 (portable one checked)\n");
                goto next;
            }
            for (uint32_t i = 0; i < NV; i++)
                if (got[i] != want[i] && bad++ < 5)
                    print_message("%s packer: %08x -> %04x, want %04x\n",
                                  native ? "native" : "portable",
                                  (unsigned)((uint32_t *)src)[i], got[i],
                                  want[i]);
            /* rows of COLS - 3 (a tail) out of a stride of COLS */
            int c = COLS - 3, rows = NV / COLS;
            assert_int_equal(gemm_pack_bf16_for_test(got, src, rows, c, COLS,
                                                     native), 0);
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < c; k++)
                    if (got[(size_t)r * c + k] != want[(size_t)r * COLS + k] &&
                        bad++ < 5)
                        print_message("%s packer, strided: row %d col %d\n",
                                      native ? "native" : "portable", r, k);
        }
        print_message("bf16 packer %s: %d inputs, %ld wrong\n",
                      native ? "native" : "portable", 2 * NV, bad);
        assert_int_equal(bad, 0);
    next:;
    }
    free(x);
    free(y);
    free(want);
    free(got);
}

/* ---------------------------------------------- the precision of passes */

enum { PASSES_ = 300, LOOKS_ = 8 };

typedef struct {
    gemm_precision p;
    int bad;              /* looks that saw another precision */
    volatile int *go;
} pass_arg_;

/* PASSES_ passes in a->p, each looking at the precision LOOKS_ times with
 * a yield between looks (the GEMMs of a pass) */
static void *passes_(void *v)
{
    pass_arg_ *a = v;
    while (!*a->go)
        sched_yield();
    for (int i = 0; i < PASSES_; i++) {
        gemm_precision_enter(a->p);
        for (int j = 0; j < LOOKS_; j++) {
            if (gemm_get_precision() != a->p)
                a->bad++;
            sched_yield();
        }
        gemm_precision_leave();
        sched_yield();
    }
    return NULL;
}

/* Two ranks of one process (m6d --devices 2) each pass in bf16 when they
 * will: neither may see fp32 inside a pass (a pass that set the
 * precision and put the previous one back afterwards let one rank's end
 * turn the other's GEMMs back to fp32 halfway, and runs of the same spec
 * differed); a third thread in fp32 waits for them and sees fp32 only;
 * after all of them, the precision outside passes again. */
static void test_precision_of_passes(void **unused)
{
    (void)unused;
    assert_int_equal(gemm_set_precision(GEMM_FP32), GEMM_FP32);
    volatile int go = 0;
    pass_arg_ a[3] = {{GEMM_BF16, 0, &go}, {GEMM_BF16, 0, &go},
                      {GEMM_FP32, 0, &go}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, passes_, &a[i]), 0);
    go = 1;
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    print_message("passes that saw another precision: bf16 %d, %d; "
                  "fp32 %d (of %d looks each)\n", a[0].bad, a[1].bad,
                  a[2].bad, PASSES_ * LOOKS_);
    assert_int_equal(a[0].bad + a[1].bad + a[2].bad, 0);
    assert_int_equal(gemm_get_precision(), GEMM_FP32);
}

/* The bf16 GEMM (gemm_f32_ under GEMM_BF16) at the engine's shapes (the
 * benchmark model, B4 T64 C384: N = 256 rows, 3C = 1152 and 4C = 1536
 * outputs cut in thread blocks as matmul.c cuts them; attention's
 * 64 x 64 x 64 head products with alpha 1/8), all three transposes,
 * against this file's double loop on inputs rounded by its own bf16_.
 * Tolerance: 2e-6 of each element's scale (sum over k of |a b| + |beta
 * c|), as gemm.c's GEMM_TOL_BF16; measured largest printed. */
static void test_bf16_values(void **unused)
{
    (void)unused;
    static const struct { gemm_op ta, tb; int M, N, K; float alpha, beta; }
    cs[] = {
        {GEMM_N, GEMM_T, 256, 576, 384, 1.0f, 1.0f},   /* qkv forward */
        {GEMM_N, GEMM_N, 256, 192, 1536, 1.0f, 1.0f},  /* fc proj dinp */
        {GEMM_T, GEMM_N, 768, 384, 256, 1.0f, 1.0f},   /* fc dweight */
        {GEMM_N, GEMM_T, 64, 64, 64, 0.125f, 0.0f},    /* q k^T */
        {GEMM_T, GEMM_N, 64, 64, 64, 1.0f, 0.0f},      /* dv */
    };
    gemm_precision was = gemm_set_precision(GEMM_BF16);
    double worst = 0;
    for (size_t n = 0; n < sizeof cs / sizeof cs[0]; n++) {
        int M = cs[n].M, N = cs[n].N, K = cs[n].K;
        int ar = cs[n].ta == GEMM_N ? M : K, ac = cs[n].ta == GEMM_N ? K : M;
        int br = cs[n].tb == GEMM_N ? K : N, bc = cs[n].tb == GEMM_N ? N : K;
        int lda = ac + 3, ldb = bc + 1, ldc = N + 2;
        float *A = malloc(sizeof(float) * (size_t)ar * lda);
        float *B = malloc(sizeof(float) * (size_t)br * ldb);
        float *C = malloc(sizeof(float) * (size_t)M * ldc);
        float *C0 = malloc(sizeof(float) * (size_t)M * ldc);
        assert_non_null(A);
        assert_non_null(B);
        assert_non_null(C);
        assert_non_null(C0);
        uint64_t st = 99 + n;
        for (size_t i = 0; i < (size_t)ar * lda; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            A[i] = (float)((double)(st >> 11) / 9007199254740992.0 - 0.5);
        }
        for (size_t i = 0; i < (size_t)br * ldb; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            B[i] = (float)((double)(st >> 11) / 9007199254740992.0 - 0.5) * 3;
        }
        for (size_t i = 0; i < (size_t)M * ldc; i++)
            C0[i] = C[i] = (float)(i % 13) * 0.25f - 1.5f;
        #pragma omp parallel num_threads(1)
        gemm_f32_(cs[n].ta, cs[n].tb, M, N, K, cs[n].alpha, A, lda, B, ldb,
                  cs[n].beta, C, ldc);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double sum = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double a = bf16_(cs[n].ta == GEMM_N
                                         ? A[(size_t)i * lda + k]
                                         : A[(size_t)k * lda + i]);
                    double b = bf16_(cs[n].tb == GEMM_N
                                         ? B[(size_t)k * ldb + j]
                                         : B[(size_t)j * ldb + k]);
                    sum += a * b;
                    mag += fabs(a * b);
                }
                double c0 = C0[(size_t)i * ldc + j];
                double ref = cs[n].alpha * sum + cs[n].beta * c0;
                double scale = fabs(cs[n].alpha) * mag + fabs(cs[n].beta * c0);
                double err = fabs(C[(size_t)i * ldc + j] - ref) / scale;
                if (err > worst)
                    worst = err;
                if (!(err <= 2e-6))
                    fail_msg("bf16 case %zu C[%d,%d] = %.9g, double loop on "
                             "bf16 inputs %.9g: %.3g of the scale", n, i, j,
                             (double)C[(size_t)i * ldc + j], ref, err);
            }
        /* the padding between rows of C is untouched */
        for (int i = 0; i < M; i++)
            for (int j = N; j < ldc; j++)
                assert_true(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
        free(A);
        free(B);
        free(C);
        free(C0);
    }
    gemm_set_precision(was);
    printf("bf16 GEMM: largest error %.3g of the scale (tolerance 2e-6)\n",
           worst);
}

static void test_training_refused(void **unused)
{
    (void)unused;
    run_spec s = synth_tiny_spec(dir_, 2, 10, 0);
    m6_err err = M6_ERR_NONE;
    real_ = reals_[GEMM_FP32];
    gemm_swap_for_test(GEMM_FP32, drop_term_);
    trainer *t = trainer_create(&s, &err);
    gemm_swap_for_test(GEMM_FP32, NULL);
    assert_null(t);
    printf("refused: %s\n", m6_err_msg(&err));
    assert_non_null(strstr(m6_err_msg(&err), "refusing to train on the CPU"));
    assert_non_null(strstr(m6_err_msg(&err), "NT 64x96x384"));
    m6_err_free(&err);

    t = trainer_create(&s, &err);
    if (!t)
        fail_msg("trainer_create on the real GEMM: %s", m6_err_msg(&err));
    step_result r;
    assert_int_equal(trainer_step(t, &r, &err), 0);
    trainer_free(t);
}

/* a wrong bf16 GEMM refuses bf16 runs, saying why, and leaves fp32 runs
 * training */
static void test_bf16_training_refused(void **unused)
{
    (void)unused;
    run_spec s = synth_tiny_spec(dir_, 2, 10, 0);
    s.device.precision = PRECISION_BF16;
    m6_err err = M6_ERR_NONE;
    gemm_swap_for_test(GEMM_BF16, unrounded_);
    trainer *t = trainer_create(&s, &err);
    s.device.precision = PRECISION_FP32;
    m6_err err32 = M6_ERR_NONE;
    trainer *t32 = trainer_create(&s, &err32);
    gemm_swap_for_test(GEMM_BF16, NULL);
    assert_null(t);
    printf("refused: %s\n", m6_err_msg(&err));
    assert_non_null(strstr(m6_err_msg(&err), "refusing to train on the CPU "
                                             "in bf16"));
    assert_non_null(strstr(m6_err_msg(&err), "NT 64x96x384"));
    m6_err_free(&err);
    if (!t32)
        fail_msg("fp32 refused for a bf16 fault: %s", m6_err_msg(&err32));
    trainer_free(t32);

    s.device.precision = PRECISION_BF16;
    t = trainer_create(&s, &err);
    if (!t)
        fail_msg("trainer_create on the real bf16 GEMM: %s",
                 m6_err_msg(&err));
    step_result r;
    assert_int_equal(trainer_step(t, &r, &err), 0);
    trainer_free(t);
}

int main(void)
{
    for (int p = 0; p < GEMM_N_PRECISIONS; p++)
        reals_[p] = gemm_swap_for_test((gemm_precision)p, NULL);
    if (synth_shards_tmp(dir_, sizeof dir_, "test_gemm", 20000) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_passes),
        cmocka_unit_test(test_wrong_gemms_refused),
        cmocka_unit_test(test_bf16_round),
        cmocka_unit_test(test_bf16_packers),
        cmocka_unit_test(test_precision_of_passes),
        cmocka_unit_test(test_bf16_values),
        cmocka_unit_test(test_training_refused),
        cmocka_unit_test(test_bf16_training_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    synth_remove(dir_);
    return rc;
}
