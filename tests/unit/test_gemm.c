/*
 * test_gemm.c — the CPU engine's GEMM and its self-check (kernels/cpu/
 * gemm.c): the real library passes; GEMMs made wrong on purpose (a dropped
 * term, a wrong transpose in one shape class only, inputs rounded to bf16,
 * a C read where beta 0 says not to, results that change between calls)
 * fail it, the reason naming the shape class; and a trainer on such a GEMM
 * is refused with that reason, while the real one trains.
 *
 * The oracle of the library's values here is the self-check's double
 * loop; the loop itself is checked by the faults it must catch, and the
 * kernels' products by test_kernels and torch_reference (PyTorch).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cpu/cpu_gemm.h"
#include "train/trainer.h"
#include "../common/synth_data.h"

static char dir_[256];
static gemm_f32_fn real_;      /* the built-in GEMM, saved by main */
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
    if (ta == GEMM_T && tb == GEMM_N && M <= lda && K <= lda) {
        /* read A row-major (M,K) out of the (K,M) storage */
        real_(GEMM_N, GEMM_N, M, N, K, alpha, A, K < lda ? lda : K, B, ldb,
              beta, C, ldc);
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

/* rounds both inputs to bf16 and multiplies those: a silent bf16 path */
static void bf16_inputs_(gemm_op ta, gemm_op tb, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc)
{
    int ar = ta == GEMM_N ? M : K, br = tb == GEMM_N ? K : N;
    float *a = malloc(sizeof(float) * (size_t)ar * lda);
    float *b = malloc(sizeof(float) * (size_t)br * ldb);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < (size_t)ar * lda; i++)
        a[i] = bf16_(A[i]);
    for (size_t i = 0; i < (size_t)br * ldb; i++)
        b[i] = bf16_(B[i]);
    real_(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    free(a);
    free(b);
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
    char why[512] = "untouched";
    assert_int_equal(gemm_selfcheck(why, sizeof why), 0);
    assert_string_equal(why, "");
    assert_int_equal(gemm_ready(why, sizeof why), 0);
}

/* fn fails the self-check; the reason names want (a shape class or a
 * phrase) and the library */
static void expect_refused_(gemm_f32_fn fn, const char *name,
                            const char *want)
{
    char why[512] = "";
    gemm_swap_for_test(fn);
    int rc = gemm_selfcheck(why, sizeof why);
    int ready = gemm_ready(why, sizeof why);
    gemm_swap_for_test(NULL);
    printf("%s: %s\n", name, why);
    assert_int_equal(rc, -1);
    assert_int_equal(ready, -1);
    assert_non_null(strstr(why, "self-check"));
    assert_non_null(strstr(why, "onednn"));
    if (!strstr(why, want))
        fail_msg("%s: reason does not name '%s': %s", name, want, why);
}

static void test_wrong_gemms_refused(void **unused)
{
    (void)unused;
    expect_refused_(drop_term_, "dropped term", "NT 64x96x384");
    expect_refused_(tn_as_nn_, "TN as NN", "TN ");
    expect_refused_(bf16_inputs_, "bf16 inputs", "NT 64x96x384");
    expect_refused_(reads_c_, "reads C at beta 0", "beta 0");
    expect_refused_(unsteady_, "unsteady", "different bits");
    /* and the real one passes again */
    char why[512];
    assert_int_equal(gemm_ready(why, sizeof why), 0);
}

static void test_training_refused(void **unused)
{
    (void)unused;
    run_spec s = synth_tiny_spec(dir_, 2, 10, 0);
    m6_err err = M6_ERR_NONE;
    gemm_swap_for_test(drop_term_);
    trainer *t = trainer_create(&s, &err);
    gemm_swap_for_test(NULL);
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

int main(void)
{
    real_ = gemm_swap_for_test(NULL);
    snprintf(dir_, sizeof dir_, "/tmp/m6-gemm.XXXXXX");
    if (synth_shards(dir_, 20000) != 0) {
        fprintf(stderr, "test_gemm: cannot make temporary data\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_passes),
        cmocka_unit_test(test_wrong_gemms_refused),
        cmocka_unit_test(test_training_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    synth_remove(dir_);
    return rc;
}
