/*
 * gemm.c — the CPU engine's GEMM (cpu_gemm.h): the one place that decides
 * which library multiplies, what the rest of m6 is told about it
 * (gemm_describe), and the start-up self-check that keeps a wrong library
 * from training (gemm_selfcheck, gemm_ready; declared in kernels.h).
 *
 * The library is oneDNN (libdnnl): dnnl_sgemm JIT-compiles its kernels for
 * the instruction set CPUID reports (AVX2, AVX-512, ...), so no table of
 * CPU models can send it to a slow path, which is what OpenBLAS 0.3.21 did
 * on CPUs newer than its table (Prescott kernels on a recent Xeon, Haswell
 * on an AVX-512 EPYC). Measured against OpenBLAS in bench/RESULTS.md.
 * dnnl_sgemm creates no primitive: its JIT kernels are generated once per
 * process, inside the library, on the first call. Called from inside an
 * OpenMP parallel region it runs on the calling thread alone.
 *
 * -DM6_NO_GEMM_LIB: plain loops instead (slow, same results up to
 * summation order), for builds without oneDNN (bench/gpu-check.sh).
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "cpu_gemm.h"

#ifndef M6_NO_GEMM_LIB
#include <oneapi/dnnl/dnnl.h>

static void gemm_lib_(gemm_op ta, gemm_op tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
    if (M == 0 || N == 0)
        return;
    dnnl_status_t st = dnnl_sgemm(ta == GEMM_T ? 'T' : 'N',
                                  tb == GEMM_T ? 'T' : 'N', M, N, K, alpha,
                                  A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success) {
        fprintf(stderr, "m6: dnnl_sgemm(%c%c, M=%d N=%d K=%d, lda=%d ldb=%d "
                "ldc=%d) failed with status %d\n", ta == GEMM_T ? 'T' : 'N',
                tb == GEMM_T ? 'T' : 'N', M, N, K, lda, ldb, ldc, (int)st);
        abort();
    }
}

/* oneDNN's name of the ISA it dispatches to on this CPU (after
 * ONEDNN_MAX_CPU_ISA, if set) */
static const char *isa_name_(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_all: return "none";   /* no JIT: reference code */
    default: return "unknown";
    }
}

void gemm_describe(gemm_info *info)
{
    const dnnl_version_t *v = dnnl_version();
    memset(info, 0, sizeof *info);
    info->library = "onednn";
    snprintf(info->version, sizeof info->version, "%d.%d.%d", v->major,
             v->minor, v->patch);
    info->isa = isa_name_();
}

#else /* M6_NO_GEMM_LIB */

static void gemm_lib_(gemm_op ta, gemm_op tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = ta == GEMM_T ? A[(size_t)k * lda + i]
                                       : A[(size_t)i * lda + k];
                float b = tb == GEMM_T ? B[(size_t)j * ldb + k]
                                       : B[(size_t)k * ldb + j];
                s += a * b;
            }
            float *c = C + (size_t)i * ldc + j;
            *c = alpha * s + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}

void gemm_describe(gemm_info *info)
{
    memset(info, 0, sizeof *info);
    info->library = "loops";
    snprintf(info->version, sizeof info->version, "none");
    info->isa = "none";
}

#endif /* M6_NO_GEMM_LIB */

static gemm_f32_fn gemm_impl_ = gemm_lib_;

void gemm_f32_(gemm_op ta, gemm_op tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc)
{
    gemm_impl_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ------------------------------------------------------------ self-check */

/* One case: C (M,N) = alpha op(A) op(B) + beta C, operands stored with a
 * row stride wider than they need (as attention's head slices are). */
typedef struct {
    gemm_op ta, tb;
    int M, N, K;
    float alpha, beta;
} case_;

/* The shape classes matmul.c runs (NT forward, NN input gradient, TN
 * weight gradient; attention's products are the same three), each at an
 * engine-sized shape (K = 384 = C of the benchmark model), at a tail-heavy
 * one (sizes no vector width divides) and with accumulation (beta 1). */
static const case_ cases_[] = {
    {GEMM_N, GEMM_T, 64, 96, 384, 1.0f, 0.0f},
    {GEMM_N, GEMM_N, 64, 96, 384, 1.0f, 1.0f},
    {GEMM_T, GEMM_N, 96, 64, 384, 1.0f, 1.0f},
    {GEMM_N, GEMM_T, 17, 33, 7, 0.125f, 1.0f},
    {GEMM_N, GEMM_N, 17, 33, 7, 1.0f, 0.0f},
    {GEMM_T, GEMM_N, 33, 17, 7, 1.0f, 0.0f},
};

/* Tolerance on |C - C_double| / scale, scale = sum over k of |alpha a b|
 * + |beta c| for each element. fp32 round-off is at most K u of the scale
 * (u = 2^-24) in the worst case, but with these random-sign operands it
 * stays near u whatever the summation order: oneDNN's largest, measured
 * over the three classes at the engine's shapes (K 7 to 1536) on AVX-512,
 * was 2.6e-7 = 4.4 u. 2e-6 leaves eight times that, and stays well below
 * what a real fault gives: a dropped or repeated term (about 1/K of the
 * scale: 3.5e-3 at K 384), a wrong transpose or stride (order 1), inputs
 * silently rounded to bf16 (5e-5 measured, 25 times the tolerance). */
#define GEMM_TOL_F32 2e-6

static const char *op_name_(gemm_op ta, gemm_op tb)
{
    return ta == GEMM_N ? (tb == GEMM_N ? "NN" : "NT")
                        : (tb == GEMM_N ? "TN" : "TT");
}

/* deterministic values in [-1, 1) */
static float lcg_(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

/* Runs case c on fn (on the calling thread) twice and checks both
 * results against a double-precision loop and each other. 0, or -1 with
 * why; -2 out of memory. */
static int check_case_(gemm_f32_fn fn, const case_ *c, char *why, size_t len)
{
    int M = c->M, N = c->N, K = c->K, pad = 5;
    /* A stored (M,K) or, transposed, (K,M); B (K,N) or (N,K) */
    int ar = c->ta == GEMM_N ? M : K, ac = c->ta == GEMM_N ? K : M;
    int br = c->tb == GEMM_N ? K : N, bc = c->tb == GEMM_N ? N : K;
    int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = malloc(sizeof(float) * (size_t)ar * lda);
    float *B = malloc(sizeof(float) * (size_t)br * ldb);
    float *C0 = malloc(sizeof(float) * (size_t)M * ldc);
    float *C1 = malloc(sizeof(float) * (size_t)M * ldc);
    float *C2 = malloc(sizeof(float) * (size_t)M * ldc);
    int rc = -2;
    if (!A || !B || !C0 || !C1 || !C2)
        goto out;
    uint64_t s = 0x6d36u + (uint64_t)M * 131 + (uint64_t)K;
    for (size_t i = 0; i < (size_t)ar * lda; i++)
        A[i] = lcg_(&s);
    for (size_t i = 0; i < (size_t)br * ldb; i++)
        B[i] = lcg_(&s);
    for (size_t i = 0; i < (size_t)M * ldc; i++)
        C0[i] = c->beta != 0.0f ? lcg_(&s) : NAN;  /* beta 0: never read */
    memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
    memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
    fn(c->ta, c->tb, M, N, K, c->alpha, A, lda, B, ldb, c->beta, C1, ldc);
    fn(c->ta, c->tb, M, N, K, c->alpha, A, lda, B, ldb, c->beta, C2, ldc);
    rc = 0;
    for (int i = 0; i < M && rc == 0; i++) {
        for (int j = 0; j < N; j++) {
            double sum = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                double a = c->ta == GEMM_N ? A[(size_t)i * lda + k]
                                           : A[(size_t)k * lda + i];
                double b = c->tb == GEMM_N ? B[(size_t)k * ldb + j]
                                           : B[(size_t)j * ldb + k];
                sum += a * b;
                mag += fabs(a * b);
            }
            double c0 = c->beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0;
            double ref = c->alpha * sum + c->beta * c0;
            double scale = fabs(c->alpha) * mag + fabs(c->beta * c0);
            double got = C1[(size_t)i * ldc + j];
            double err = fabs(got - ref);
            if (!(err <= GEMM_TOL_F32 * scale + 1e-30)) {
                snprintf(why, len, "%s %dx%dx%d (alpha %g, beta %g): C[%d,%d] "
                         "= %.9g where a double-precision loop gives %.9g; "
                         "error %.3g of the scale %.3g, tolerance %g",
                         op_name_(c->ta, c->tb), M, N, K, (double)c->alpha,
                         (double)c->beta, i, j, got, ref,
                         scale > 0 ? err / scale : err, scale, GEMM_TOL_F32);
                rc = -1;
                break;
            }
        }
    }
    if (rc == 0)
        for (int i = 0; i < M; i++)
            if (memcmp(C1 + (size_t)i * ldc, C2 + (size_t)i * ldc,
                       sizeof(float) * (size_t)N) != 0) {
                snprintf(why, len, "%s %dx%dx%d: two calls with the same "
                         "arguments gave different bits (row %d)",
                         op_name_(c->ta, c->tb), M, N, K, i);
                rc = -1;
                break;
            }
out:
    if (rc == -2)
        snprintf(why, len, "out of memory for the GEMM self-check");
    free(A);
    free(B);
    free(C0);
    free(C1);
    free(C2);
    return rc;
}

int gemm_selfcheck(char *why, size_t len)
{
    int rc = 0;
    char msg[384] = "";
    /* on one thread of a parallel region, as the kernels call it */
    #pragma omp parallel
    #pragma omp single
    for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0] && rc == 0; i++)
        rc = check_case_(gemm_impl_, &cases_[i], msg, sizeof msg);
    if (rc != 0) {
        gemm_info g;
        gemm_describe(&g);
        snprintf(why, len, "the CPU GEMM (%s %s, isa %s) fails its "
                 "self-check: %s", g.library, g.version, g.isa, msg);
        return -1;
    }
    if (len)
        why[0] = '\0';
    return 0;
}

static pthread_mutex_t ready_lock_ = PTHREAD_MUTEX_INITIALIZER;
static int ready_state_;            /* 0 not checked, 1 passed, -1 failed */
static char ready_why_[512];

int gemm_ready(char *why, size_t len)
{
    pthread_mutex_lock(&ready_lock_);
    if (ready_state_ == 0)
        ready_state_ = gemm_selfcheck(ready_why_, sizeof ready_why_) == 0
                       ? 1 : -1;
    int st = ready_state_;
    if (len)
        snprintf(why, len, "%s", st == 1 ? "" : ready_why_);
    pthread_mutex_unlock(&ready_lock_);
    return st == 1 ? 0 : -1;
}

gemm_f32_fn gemm_swap_for_test(gemm_f32_fn fn)
{
    gemm_f32_fn old = gemm_impl_;
    gemm_impl_ = fn ? fn : gemm_lib_;
    pthread_mutex_lock(&ready_lock_);
    ready_state_ = 0;
    pthread_mutex_unlock(&ready_lock_);
    return old;
}
