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
#include "cpu_math.h"

/* x rounded to bf16 (8 significant bits), to nearest, ties to even, kept
 * as the upper half of a float: the one rounding of GEMM inputs in bf16
 * mode. NaN stays NaN (quiet); overflow rounds to infinity as IEEE does. */
static inline uint16_t bf16_bits_(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t nan = (u >> 16) | 0x40u;                 /* quieted */
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* a select, not a branch: the packing loop vectorises */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}

float gemm_bf16_round(float x)
{
    uint32_t u = (uint32_t)bf16_bits_(x) << 16;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- bf16 packing: rows x cols of src (row stride ld floats) rounded
 * into dst (rows of cols), each element as bf16_bits_ rounds it. Every
 * bf16 GEMM call packs its two operands (about a sixth of a bf16 step's
 * time went to it, bench/RESULTS.md), so where the CPU has AVX512-BF16 a
 * vcvtneps2bf16 rounds 16 floats at once. That instruction rounds to
 * nearest even and quiets NaN as bf16_bits_ does, but reads subnormal
 * inputs as zero (Intel SDM, VCVTNEPS2BF16): a vector holding one goes
 * through bf16_bits_ instead, so both packers give the same bits for
 * every input (test_gemm compares them over every sign, exponent and
 * leading mantissa bits). */

/* the portable packer (integer arithmetic: every SIMD clone gives the
 * same bits) */
M6_SIMD_CLONES static void pack_plain_(uint16_t *dst, const float *src,
                                       int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * ld;
        uint16_t *d = dst + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            d[c] = bf16_bits_(s[c]);
    }
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 10)
#include <immintrin.h>
#define PACK_NATIVE_ 1

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void pack_native_(uint16_t *dst, const float *src, int rows, int cols,
                         int ld)
{
    const __m512i exp_bits = _mm512_set1_epi32(0x7f800000);
    const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * ld;
        uint16_t *d = dst + (size_t)r * cols;
        int c = 0;
        for (; c + 16 <= cols; c += 16) {
            __m512 x = _mm512_loadu_ps(s + c);
            __m512i u = _mm512_castps_si512(x);
            /* subnormal: exponent bits 0, magnitude not 0 */
            __mmask16 sub = _mm512_testn_epi32_mask(u, exp_bits) &
                            _mm512_test_epi32_mask(u, abs_bits);
            if (sub) {
                for (int i = 0; i < 16; i++)
                    d[c + i] = bf16_bits_(s[c + i]);
                continue;
            }
            __m256bh y = _mm512_cvtneps_pbh(x);
            _mm256_storeu_si256((__m256i *)(d + c), (__m256i)y);
        }
        for (; c < cols; c++)
            d[c] = bf16_bits_(s[c]);
    }
}
#else
#define PACK_NATIVE_ 0
#endif

/* 1 when this CPU runs pack_native_ (bits of the CPU model that libgcc's
 * constructor read once: no CPUID here) */
static int pack_native_ok_(void)
{
#if PACK_NATIVE_
    return __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* native 0: the portable packer; 1: the native one, or -1 where this CPU
 * (or the compiler) has none */
static int pack_with_(uint16_t *dst, const float *src, int rows, int cols,
                      int ld, int native)
{
    if (!native) {
        pack_plain_(dst, src, rows, cols, ld);
        return 0;
    }
#if PACK_NATIVE_
    if (pack_native_ok_()) {
        pack_native_(dst, src, rows, cols, ld);
        return 0;
    }
#endif
    return -1;
}

int gemm_pack_bf16_for_test(uint16_t *dst, const float *src, int rows,
                            int cols, int ld, int native)
{
    return pack_with_(dst, src, rows, cols, ld, native);
}

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

/* ---- bf16: oneDNN's matmul primitive, bf16 src and weights, f32 dst.
 *
 * Each thread packs its operands into bf16 (gemm_bf16_round's rounding,
 * tight rows, the transpose kept) and runs a primitive made for the call's
 * shape. Primitives are made once per shape and thread and kept in that
 * thread's cache (BF16_CACHE entries, the least recently made one
 * replaced): a model has a few dozen shapes per thread (each dense
 * layer's three, and attention's per row block of T: measured under 64
 * at T 512 on 2 threads, the same count after 2 steps as after 4), so
 * after the first step no call creates one. A primitive runs on the calling thread
 * (oneDNN's OpenMP regions do not nest inside the kernels'), with its own
 * scratchpad, so threads share nothing but the engine.
 *
 * Without bf16 instructions (below avx512_core_bf16) oneDNN emulates them
 * with fp32 ones on avx512_core; below that it has no bf16 matmul at all,
 * and the inputs, rounded to bf16 and widened back, go through sgemm:
 * the same arithmetic, since a product of two bf16 numbers is exact in
 * fp32. gemm_describe's bf16_native tells the two cases from native. */

#define BF16_CACHE 256

typedef struct {
    int used;
    gemm_op ta, tb;
    int M, N, K, ldc;
    float alpha, beta;        /* beta: 0 (C not read) or the sum's scale */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, pad;  /* pad: the scratchpad (NULL: none) */
    void *pad_buf;
} bf16_prim_;

typedef struct {
    bf16_prim_ e[BF16_CACHE];
    int next;                 /* the entry replaced next */
    dnnl_stream_t stream;
    void *buf;                /* packed A then B */
    size_t cap;               /* bytes of buf */
} bf16_tls_;

static dnnl_engine_t engine_;
static pthread_once_t engine_once_ = PTHREAD_ONCE_INIT;
static pthread_key_t tls_key_;

static void prim_free_(bf16_prim_ *p)
{
    if (!p->used)
        return;
    dnnl_primitive_destroy(p->prim);
    dnnl_memory_destroy(p->a);
    dnnl_memory_destroy(p->b);
    dnnl_memory_destroy(p->c);
    if (p->pad)
        dnnl_memory_destroy(p->pad);
    free(p->pad_buf);
    memset(p, 0, sizeof *p);
}

static void tls_free_(void *v)
{
    bf16_tls_ *t = v;
    for (int i = 0; i < BF16_CACHE; i++)
        prim_free_(&t->e[i]);
    if (t->stream)
        dnnl_stream_destroy(t->stream);
    free(t->buf);
    free(t);
}

static void engine_init_(void)
{
    if (dnnl_engine_create(&engine_, dnnl_cpu, 0) != dnnl_success ||
        pthread_key_create(&tls_key_, tls_free_) != 0) {
        fprintf(stderr, "m6: cannot create oneDNN's CPU engine\n");
        abort();
    }
}

static void dnnl_check_(dnnl_status_t st, const char *what, const bf16_prim_ *p)
{
    if (st == dnnl_success)
        return;
    fprintf(stderr, "m6: oneDNN bf16 matmul: %s failed with status %d "
            "(M=%d N=%d K=%d ldc=%d)\n", what, (int)st, p->M, p->N, p->K,
            p->ldc);
    abort();
}

/* Set when oneDNN has no bf16 matmul for this CPU (below avx512_core, in
 * oneDNN 2.6): bf16 GEMMs then run as sgemm on inputs rounded to bf16,
 * which is the same arithmetic (bf16 products are exact in fp32). */
static int bf16_via_sgemm_;

/* Makes the primitive of the call described by *p (its key fields set).
 * 0, or -1 when oneDNN has no bf16 matmul on this CPU. */
static int prim_make_(bf16_prim_ *p)
{
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {p->M, p->K}, bd = {p->K, p->N}, cd = {p->M, p->N};
    /* packed A is (M,K) rows, or (K,M) rows when transposed; B likewise */
    dnnl_dims_t as = {p->ta == GEMM_N ? p->K : 1, p->ta == GEMM_N ? 1 : p->M};
    dnnl_dims_t bs = {p->tb == GEMM_N ? p->N : 1, p->tb == GEMM_N ? 1 : p->K};
    dnnl_dims_t cs = {p->ldc, 1};
    dnnl_check_(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as),
                "src desc", p);
    dnnl_check_(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs),
                "weights desc", p);
    dnnl_check_(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs),
                "dst desc", p);
    dnnl_matmul_desc_t md;
    dnnl_check_(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd),
                "desc", p);
    dnnl_primitive_attr_t attr;
    dnnl_check_(dnnl_primitive_attr_create(&attr), "attr", p);
    dnnl_check_(dnnl_primitive_attr_set_scratchpad_mode(
                    attr, dnnl_scratchpad_mode_user), "scratchpad mode", p);
    if (p->alpha != 1.0f)
        dnnl_check_(dnnl_primitive_attr_set_output_scales(attr, 1, 0,
                                                          &p->alpha),
                    "alpha", p);
    dnnl_post_ops_t po = NULL;
    if (p->beta != 0.0f) {
        dnnl_check_(dnnl_post_ops_create(&po), "post-ops", p);
        dnnl_check_(dnnl_post_ops_append_sum(po, p->beta), "beta", p);
        dnnl_check_(dnnl_primitive_attr_set_post_ops(attr, po), "beta", p);
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, engine_,
                                                  NULL);
    if (st == dnnl_unimplemented) {
        if (po)
            dnnl_post_ops_destroy(po);
        dnnl_primitive_attr_destroy(attr);
        return -1;
    }
    dnnl_check_(st, "primitive desc", p);
    dnnl_check_(dnnl_primitive_create(&p->prim, pd), "primitive", p);
    const dnnl_memory_desc_t *sp =
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t spn = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (spn > 0) {
        if (posix_memalign(&p->pad_buf, 64, spn) != 0) {
            fprintf(stderr, "m6: out of memory for a bf16 matmul\n");
            abort();
        }
        dnnl_check_(dnnl_memory_create(&p->pad, sp, engine_, p->pad_buf),
                    "scratchpad", p);
    }
    dnnl_check_(dnnl_memory_create(&p->a, &amd, engine_, DNNL_MEMORY_NONE),
                "src memory", p);
    dnnl_check_(dnnl_memory_create(&p->b, &bmd, engine_, DNNL_MEMORY_NONE),
                "weights memory", p);
    dnnl_check_(dnnl_memory_create(&p->c, &cmd, engine_, DNNL_MEMORY_NONE),
                "dst memory", p);
    dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    p->used = 1;
    return 0;
}

/* the native packer where the CPU has one, else the portable one */
static void pack_bf16_(uint16_t *dst, const float *src, int rows, int cols,
                       int ld)
{
    if (pack_with_(dst, src, rows, cols, ld, 1) != 0)
        pack_with_(dst, src, rows, cols, ld, 0);
}

static bf16_tls_ *tls_get_(void)
{
    pthread_once(&engine_once_, engine_init_);
    bf16_tls_ *t = pthread_getspecific(tls_key_);
    if (t)
        return t;
    t = calloc(1, sizeof *t);
    if (!t || dnnl_stream_create(&t->stream, engine_,
                                 dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(tls_key_, t) != 0) {
        fprintf(stderr, "m6: cannot set up a bf16 matmul stream\n");
        abort();
    }
    return t;
}

static void gemm_lib_bf16_(gemm_op ta, gemm_op tb, int M, int N, int K,
                           float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C,
                           int ldc)
{
    if (M == 0 || N == 0)
        return;
    if (K == 0) {               /* C = beta C; beta 0 does not read C */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float *c = C + (size_t)i * ldc + j;
                *c = beta != 0.0f ? beta * *c : 0.0f;
            }
        return;
    }
    bf16_tls_ *t = tls_get_();
    size_t na = (size_t)M * K, nb = (size_t)K * N;
    int via_sgemm = __atomic_load_n(&bf16_via_sgemm_, __ATOMIC_RELAXED);
    size_t bytes = (na + nb) * (via_sgemm ? sizeof(float) : sizeof(uint16_t));
    if (bytes > t->cap) {
        free(t->buf);
        t->buf = malloc(bytes);
        if (!t->buf) {
            fprintf(stderr, "m6: out of memory for a bf16 matmul\n");
            abort();
        }
        t->cap = bytes;
    }
    if (via_sgemm) {
        float *fa = t->buf, *fb = fa + na;
        int ac = ta == GEMM_N ? K : M, bc = tb == GEMM_N ? N : K;
        for (int r = 0; r < (ta == GEMM_N ? M : K); r++)
            for (int c = 0; c < ac; c++)
                fa[(size_t)r * ac + c] = gemm_bf16_round(A[(size_t)r * lda + c]);
        for (int r = 0; r < (tb == GEMM_N ? K : N); r++)
            for (int c = 0; c < bc; c++)
                fb[(size_t)r * bc + c] = gemm_bf16_round(B[(size_t)r * ldb + c]);
        gemm_lib_(ta, tb, M, N, K, alpha, fa, ac, fb, bc, beta, C, ldc);
        return;
    }
    uint16_t *a = t->buf, *b = a + na;
    if (ta == GEMM_N)
        pack_bf16_(a, A, M, K, lda);
    else
        pack_bf16_(a, A, K, M, lda);
    if (tb == GEMM_N)
        pack_bf16_(b, B, K, N, ldb);
    else
        pack_bf16_(b, B, N, K, ldb);
    bf16_prim_ *p = NULL;
    for (int i = 0; i < BF16_CACHE && !p; i++) {
        bf16_prim_ *e = &t->e[i];
        if (e->used && e->ta == ta && e->tb == tb && e->M == M &&
            e->N == N && e->K == K && e->ldc == ldc && e->alpha == alpha &&
            e->beta == beta)
            p = e;
    }
    if (!p) {
        p = &t->e[t->next];
        t->next = (t->next + 1) % BF16_CACHE;
        prim_free_(p);
        *p = (bf16_prim_){.ta = ta, .tb = tb, .M = M, .N = N, .K = K,
                          .ldc = ldc, .alpha = alpha, .beta = beta};
        if (prim_make_(p) != 0) {
            __atomic_store_n(&bf16_via_sgemm_, 1, __ATOMIC_RELAXED);
            gemm_lib_bf16_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                           ldc);
            return;
        }
    }
    dnnl_check_(dnnl_memory_set_data_handle(p->a, a), "src handle", p);
    dnnl_check_(dnnl_memory_set_data_handle(p->b, b), "weights handle", p);
    dnnl_check_(dnnl_memory_set_data_handle(p->c, C), "dst handle", p);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c},
        {DNNL_ARG_SCRATCHPAD, p->pad}};
    dnnl_check_(dnnl_primitive_execute(p->prim, t->stream, p->pad ? 4 : 3,
                                       args), "execute", p);
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
    /* bf16 instructions (vdpbf16ps; AMX tiles) from avx512_core_bf16 up;
     * below it oneDNN computes bf16 matmuls with fp32 instructions */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    info->bf16_native = isa == dnnl_cpu_isa_avx512_core_bf16 ||
                        isa == dnnl_cpu_isa_avx512_core_amx;
}

#else /* M6_NO_GEMM_LIB */

/* C = alpha op(A) op(B) + beta C in plain loops, fp32 sums; bf16 1: each
 * input rounded to bf16 first (products exact in fp32) */
static void gemm_loops_(gemm_op ta, gemm_op tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc, int bf16)
{
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = ta == GEMM_T ? A[(size_t)k * lda + i]
                                       : A[(size_t)i * lda + k];
                float b = tb == GEMM_T ? B[(size_t)j * ldb + k]
                                       : B[(size_t)k * ldb + j];
                if (bf16) {
                    a = gemm_bf16_round(a);
                    b = gemm_bf16_round(b);
                }
                s += a * b;
            }
            float *c = C + (size_t)i * ldc + j;
            *c = alpha * s + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}

static void gemm_lib_(gemm_op ta, gemm_op tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc)
{
    gemm_loops_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0);
}

static void gemm_lib_bf16_(gemm_op ta, gemm_op tb, int M, int N, int K,
                           float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C,
                           int ldc)
{
    gemm_loops_(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1);
}

void gemm_describe(gemm_info *info)
{
    memset(info, 0, sizeof *info);
    info->library = "loops";
    snprintf(info->version, sizeof info->version, "none");
    info->isa = "none";
    info->bf16_native = 0;
}

#endif /* M6_NO_GEMM_LIB */

/* the GEMM of each precision (gemm_swap_for_test replaces them) */
static gemm_f32_fn gemm_impl_[GEMM_N_PRECISIONS] = {gemm_lib_,
                                                    gemm_lib_bf16_};
static gemm_f32_fn const gemm_builtin_[GEMM_N_PRECISIONS] = {gemm_lib_,
                                                             gemm_lib_bf16_};
/* The precision gemm_f32_ runs in: base_ (gemm_set_precision's) outside
 * any pass, the passes' own while users_ passes are inside
 * gemm_precision_enter. A pass of another precision waits for the last
 * one out (prec_cv_), so a pass never sees its precision change under
 * it: several ranks of one process (m6d --devices N) each enter and leave
 * their passes when they will. */
static int precision_;
static int base_, users_;
static pthread_mutex_t prec_mu_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t prec_cv_ = PTHREAD_COND_INITIALIZER;

const char *gemm_precision_name(gemm_precision p)
{
    return p == GEMM_FP32 ? "fp32" : p == GEMM_BF16 ? "bf16" : "?";
}

gemm_precision gemm_set_precision(gemm_precision p)
{
    pthread_mutex_lock(&prec_mu_);
    int was = base_;
    base_ = (int)p;
    if (users_ == 0)
        __atomic_store_n(&precision_, (int)p, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&prec_mu_);
    return (gemm_precision)was;
}

void gemm_precision_enter(gemm_precision p)
{
    pthread_mutex_lock(&prec_mu_);
    while (users_ > 0 && __atomic_load_n(&precision_, __ATOMIC_RELAXED) !=
                             (int)p)
        pthread_cond_wait(&prec_cv_, &prec_mu_);
    users_++;
    __atomic_store_n(&precision_, (int)p, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&prec_mu_);
}

void gemm_precision_leave(void)
{
    pthread_mutex_lock(&prec_mu_);
    if (users_ > 0 && --users_ == 0) {
        __atomic_store_n(&precision_, base_, __ATOMIC_RELAXED);
        pthread_cond_broadcast(&prec_cv_);
    }
    pthread_mutex_unlock(&prec_mu_);
}

gemm_precision gemm_get_precision(void)
{
    return (gemm_precision)__atomic_load_n(&precision_, __ATOMIC_RELAXED);
}

void gemm_f32_(gemm_op ta, gemm_op tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc)
{
    gemm_impl_[gemm_get_precision()](ta, tb, M, N, K, alpha, A, lda, B, ldb,
                                     beta, C, ldc);
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

/* bf16: the reference is the double loop on the inputs rounded as the
 * GEMM must round them (gemm_bf16_round), so what is left is the fp32
 * accumulation of exact products: the same round-off as fp32, and the
 * same tolerance. oneDNN's bf16 matmul, measured over the six cases:
 * largest 9.0e-8 of the scale (1.5 u) on avx512_core_bf16 and emulated on
 * avx512_core; test_gemm's engine-sized cases 1.2e-7. A GEMM that skips
 * the rounding (plain fp32) is off by 5.0e-5 of the scale (25 times the
 * tolerance), one that truncates instead of rounding to nearest by
 * 2.7e-4; both fail, as does every fp32 fault above. */
#define GEMM_TOL_BF16 2e-6

static const double tol_[GEMM_N_PRECISIONS] = {GEMM_TOL_F32, GEMM_TOL_BF16};

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
static int check_case_(gemm_precision p, gemm_f32_fn fn, const case_ *c,
                       char *why, size_t len)
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
    double *Ad = malloc(sizeof(double) * ((size_t)M * K + 1));
    double *Bd = malloc(sizeof(double) * ((size_t)N * K + 1));
    int rc = -2;
    if (!A || !B || !C0 || !C1 || !C2 || !Ad || !Bd)
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
    /* op(A) (M,K) and op(B)^T (N,K) in double, rounded as the precision
     * rounds them, once: the reference's inner loop is then a plain dot
     * product (this check runs at every m6d start) */
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            float af = c->ta == GEMM_N ? A[(size_t)i * lda + k]
                                       : A[(size_t)k * lda + i];
            Ad[(size_t)i * K + k] = p == GEMM_BF16 ? gemm_bf16_round(af) : af;
        }
    for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++) {
            float bf = c->tb == GEMM_N ? B[(size_t)k * ldb + j]
                                       : B[(size_t)j * ldb + k];
            Bd[(size_t)j * K + k] = p == GEMM_BF16 ? gemm_bf16_round(bf) : bf;
        }
    for (int i = 0; i < M && rc == 0; i++) {
        for (int j = 0; j < N; j++) {
            const double *a = Ad + (size_t)i * K, *b = Bd + (size_t)j * K;
            double sum = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                sum += a[k] * b[k];
                mag += fabs(a[k] * b[k]);
            }
            double c0 = c->beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0;
            double ref = c->alpha * sum + c->beta * c0;
            double scale = fabs(c->alpha) * mag + fabs(c->beta * c0);
            double got = C1[(size_t)i * ldc + j];
            double err = fabs(got - ref);
            if (!(err <= tol_[p] * scale + 1e-30)) {
                snprintf(why, len, "%s %s %dx%dx%d (alpha %g, beta %g): "
                         "C[%d,%d] = %.9g where a double-precision loop%s "
                         "gives %.9g; error %.3g of the scale %.3g, "
                         "tolerance %g", gemm_precision_name(p),
                         op_name_(c->ta, c->tb), M, N, K, (double)c->alpha,
                         (double)c->beta, i, j, got,
                         p == GEMM_BF16 ? " on the bf16-rounded inputs" : "",
                         ref, scale > 0 ? err / scale : err, scale, tol_[p]);
                rc = -1;
                break;
            }
        }
    }
    if (rc == 0)
        for (int i = 0; i < M; i++)
            if (memcmp(C1 + (size_t)i * ldc, C2 + (size_t)i * ldc,
                       sizeof(float) * (size_t)N) != 0) {
                snprintf(why, len, "%s %s %dx%dx%d: two calls with the "
                         "same arguments gave different bits (row %d)",
                         gemm_precision_name(p), op_name_(c->ta, c->tb), M,
                         N, K, i);
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
    free(Ad);
    free(Bd);
    return rc;
}

int gemm_selfcheck(gemm_precision p, char *why, size_t len)
{
    if ((unsigned)p >= GEMM_N_PRECISIONS) {
        snprintf(why, len, "no GEMM precision %d", (int)p);
        return -1;
    }
    int rc = 0;
    char msg[384] = "";
    /* on one thread of a parallel region, as the kernels call it */
    #pragma omp parallel
    #pragma omp single
    for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0] && rc == 0; i++)
        rc = check_case_(p, gemm_impl_[p], &cases_[i], msg, sizeof msg);
    if (rc != 0) {
        gemm_info g;
        gemm_describe(&g);
        snprintf(why, len, "the CPU GEMM in %s (%s %s, isa %s%s) fails its "
                 "self-check: %s", gemm_precision_name(p), g.library,
                 g.version, g.isa, p == GEMM_BF16 && !g.bf16_native
                 ? ", bf16 emulated" : "", msg);
        return -1;
    }
    if (len)
        why[0] = '\0';
    return 0;
}

static pthread_mutex_t ready_lock_ = PTHREAD_MUTEX_INITIALIZER;
/* per precision: 0 not checked, 1 passed, -1 failed */
static int ready_state_[GEMM_N_PRECISIONS];
static char ready_why_[GEMM_N_PRECISIONS][512];

int gemm_ready(gemm_precision p, char *why, size_t len)
{
    if ((unsigned)p >= GEMM_N_PRECISIONS) {
        if (len)
            snprintf(why, len, "no GEMM precision %d", (int)p);
        return -1;
    }
    pthread_mutex_lock(&ready_lock_);
    if (ready_state_[p] == 0)
        ready_state_[p] = gemm_selfcheck(p, ready_why_[p],
                                         sizeof ready_why_[p]) == 0 ? 1 : -1;
    int st = ready_state_[p];
    if (len)
        snprintf(why, len, "%s", st == 1 ? "" : ready_why_[p]);
    pthread_mutex_unlock(&ready_lock_);
    return st == 1 ? 0 : -1;
}

gemm_f32_fn gemm_swap_for_test(gemm_precision p, gemm_f32_fn fn)
{
    gemm_f32_fn old = gemm_impl_[p];
    gemm_impl_[p] = fn ? fn : gemm_builtin_[p];
    pthread_mutex_lock(&ready_lock_);
    ready_state_[p] = 0;
    pthread_mutex_unlock(&ready_lock_);
    return old;
}
