/*
 * cublaslt_emu.cpp — the emulated cuBLASLt of cublasLt.h: descriptors as
 * plain structs, the GEMM as a loop queued on the stream like a kernel.
 * Every argument is checked as cuBLASLt would reject it (or as a GPU would
 * fault on it): a misuse is reported through mock_misuse and returns
 * CUBLAS_STATUS_INVALID_VALUE.
 *
 * The heuristic can be made to refuse (no algorithm, as a real cuBLASLt may
 * for a shape, type or epilogue), to test the callers' fallbacks:
 *   M6_EMU_CUBLASLT_REFUSE=epilogue    every GEMM with an epilogue (bias,
 *                                      GELU, DGELU);
 *                                      M6_EMU_CUBLASLT_NO_EPILOGUE=1
 *                                      is the same
 *   M6_EMU_CUBLASLT_REFUSE=attention   every strided-batched GEMM (batch
 *                                      count > 1) and every GEMM with an
 *                                      fp32 D: attention's (the model's
 *                                      other GEMMs are single, bf16 D)
 *   M6_EMU_CUBLASLT_REFUSE=epilogue,attention   both: all that can fall back
 *   M6_EMU_CUBLASLT_REFUSE=plain       every other GEMM (single, bf16 D, no
 *                                      epilogue), which has no fallback
 * The words combine with commas; an unknown word is a misuse.
 */
#include "cublasLt.h"
#include "cuda_bf16.h"
#include "emu_counts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

struct emu_lt_handle_ {
    int no_epilogue;            /* M6_EMU_CUBLASLT_NO_EPILOGUE=1 */
    int no_attention, no_plain; /* M6_EMU_CUBLASLT_REFUSE (see the top) */
};

struct emu_lt_desc_ {
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epi;
    const __nv_bfloat16 *bias;
    __nv_bfloat16 *aux;
    int64_t aux_ld;
};

struct emu_lt_layout_ {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;              /* BATCH_COUNT */
    int64_t stride;             /* STRIDED_BATCH_OFFSET, elements */
};

struct emu_lt_pref_ {
    uint64_t max_workspace;
    uint32_t align[4];          /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
};

static long desc_creates_, layout_creates_, matmuls_; /* emu_counts.h */

long emu_lt_matmuls(void)
{
    return __atomic_load_n(&matmuls_, __ATOMIC_RELAXED);
}

long emu_lt_desc_creates(void)
{
    return __atomic_load_n(&desc_creates_, __ATOMIC_RELAXED);
}

long emu_lt_layout_creates(void)
{
    return __atomic_load_n(&layout_creates_, __ATOMIC_RELAXED);
}

static cublasStatus_t bad_(const char *what)
{
    char msg[256];
    snprintf(msg, sizeof msg, "cuBLASLt: %s", what);
    mock_misuse(msg);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    const char *e = getenv("M6_EMU_CUBLASLT_NO_EPILOGUE");
    emu_lt_handle_ *lt = new emu_lt_handle_{e && strcmp(e, "1") == 0, 0, 0};
    const char *r = getenv("M6_EMU_CUBLASLT_REFUSE");
    while (r && *r) {
        size_t n = strcspn(r, ",");
        if (n == 8 && !strncmp(r, "epilogue", n))
            lt->no_epilogue = 1;
        else if (n == 9 && !strncmp(r, "attention", n))
            lt->no_attention = 1;
        else if (n == 5 && !strncmp(r, "plain", n))
            lt->no_plain = 1;
        else if (n > 0) {
            delete lt;
            return bad_("M6_EMU_CUBLASLT_REFUSE: a word other than "
                        "epilogue, attention, plain");
        }
        r += n + (r[n] == ',');
    }
    *h = lt;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d,
                                        cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
        return bad_("only CUBLAS_COMPUTE_32F with CUDA_R_32F scale is "
                    "emulated");
    *d = new emu_lt_desc_{CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                          NULL, NULL, 0};
    __atomic_add_fetch(&desc_creates_, 1, __ATOMIC_RELAXED);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

template <class T>
static cublasStatus_t get_(T *dst, const void *buf, size_t size)
{
    if (size != sizeof *dst)
        return bad_("attribute of the wrong size");
    memcpy(dst, buf, sizeof *dst);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(
    cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
    const void *buf, size_t size)
{
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return get_(&d->ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return get_(&d->tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get_(&d->epi, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get_(&d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return get_(&d->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return get_(&d->aux_ld, buf, size);
    }
    return bad_("matmul descriptor attribute not emulated");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l,
                                          cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (type != CUDA_R_16BF && type != CUDA_R_32F)
        return bad_("only CUDA_R_16BF and CUDA_R_32F matrices are emulated");
    if (ld < (int64_t)rows || rows == 0 || cols == 0)
        return bad_("matrix layout with ld < rows or an empty dimension");
    *l = new emu_lt_layout_{type, rows, cols, ld, 1, 0};
    __atomic_add_fetch(&layout_creates_, 1, __ATOMIC_RELAXED);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(
    cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
    const void *buf, size_t size)
{
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
        cublasStatus_t st = get_(&l->batch, buf, size);
        if (st == CUBLAS_STATUS_SUCCESS && l->batch < 1)
            return bad_("a batch count below 1");
        return st;
    }
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        return get_(&l->stride, buf, size);
    }
    return bad_("matrix layout attribute not emulated");
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    /* M6_EMU_CUBLASLT_UNLOADABLE=1: as kernels/cuda/cublaslt_load.c
     * answers when the library cannot be opened */
    const char *u = getenv("M6_EMU_CUBLASLT_UNLOADABLE");
    if (u && strcmp(u, "1") == 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *p = new emu_lt_pref_{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
    const void *buf, size_t size)
{
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return get_(&p->max_workspace, buf, size);
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        uint32_t a = 0;
        cublasStatus_t st = get_(&a, buf, size);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
        if (a == 0 || (a & (a - 1)) != 0)
            return bad_("a minimum alignment that is not a power of two");
        p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
        return CUBLAS_STATUS_SUCCESS;
    }
    return bad_("preference attribute not emulated");
}

/* The shapes of op(A) (m,k), op(B) (k,n), C and D (m,n) agree. */
static int shapes_ok_(const emu_lt_desc_ *d, const emu_lt_layout_ *a,
                      const emu_lt_layout_ *b, const emu_lt_layout_ *c,
                      const emu_lt_layout_ *dl)
{
    uint64_t m = d->ta ? a->cols : a->rows, ka = d->ta ? a->rows : a->cols;
    uint64_t kb = d->tb ? b->cols : b->rows, n = d->tb ? b->rows : b->cols;
    return ka == kb && m == dl->rows && n == dl->cols && c->rows == dl->rows &&
           c->cols == dl->cols && c->ld == dl->ld;
}

/* A and B bf16, C and D of one type; every layout the same batch count. */
static const char *types_batches_bad_(const emu_lt_layout_ *a,
                                      const emu_lt_layout_ *b,
                                      const emu_lt_layout_ *c,
                                      const emu_lt_layout_ *dl)
{
    if (a->type != CUDA_R_16BF || b->type != CUDA_R_16BF ||
        c->type != dl->type)
        return "A and B must be bf16, C and D of one type";
    if (a->batch != dl->batch || b->batch != dl->batch ||
        c->batch != dl->batch)
        return "the layouts' batch counts differ";
    if (c->stride != dl->stride)
        return "C and D batch strides differ";
    return NULL;
}

static int has_bias_(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

/* the aux matrix is an output (the GELU's input, saved) */
static int has_aux_(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

/* DGELU: D = (alpha A B + beta C) * GELU'(aux), the aux matrix an input
 * (what GELU_AUX saved), one rounding of D */
static int is_dgelu_(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_DGELU;
}

/* an (m,n) aux matrix of ld aux_ld is read or written */
static int uses_aux_(cublasLtEpilogue_t e)
{
    return has_aux_(e) || is_dgelu_(e);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
    cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int requested,
    cublasLtMatmulHeuristicResult_t *results, int *returned)
{
    *returned = 0;
    if (requested < 1)
        return bad_("heuristic asked for no result");
    if (!shapes_ok_(d, a, b, c, dl))
        return bad_("heuristic: the layouts of op(A), op(B), C and D do not "
                    "make one (m,k) x (k,n) product");
    if (const char *why = types_batches_bad_(a, b, c, dl))
        return bad_(why);
    if (dl->type == CUDA_R_32F && d->epi != CUBLASLT_EPILOGUE_DEFAULT)
        return bad_("heuristic: fp32 D with an epilogue is not emulated");
    int epi = d->epi != CUBLASLT_EPILOGUE_DEFAULT;
    int att = dl->batch > 1 || dl->type == CUDA_R_32F;
    if ((h->no_epilogue && epi) || (h->no_attention && att) ||
        (h->no_plain && !epi && !att))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++) /* the alignments it was chosen for */
        results[0].algo.data[i] = p->align[i];
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

struct gemm_ {
    emu_lt_desc_ d;
    emu_lt_layout_ a, b, dl;
    float alpha, beta;
    const __nv_bfloat16 *A, *B;
    const void *C;
    void *D;                    /* bf16, or fp32 (dl.type) */
};

/* element (i, j) of batch matrix `bi` of D (or C) as fp32 / written */
static float d_get_(const gemm_ *g, const void *base, uint64_t bi,
                    uint64_t i, uint64_t j)
{
    size_t at = bi * g->dl.stride + i + j * g->dl.ld;
    return g->dl.type == CUDA_R_32F ? ((const float *)base)[at]
                                    : __bfloat162float(
                                          ((const __nv_bfloat16 *)base)[at]);
}

static void d_set_(gemm_ *g, uint64_t bi, uint64_t i, uint64_t j, float v)
{
    size_t at = bi * g->dl.stride + i + j * g->dl.ld;
    if (g->dl.type == CUDA_R_32F)
        ((float *)g->D)[at] = v;
    else
        ((__nv_bfloat16 *)g->D)[at] = __float2bfloat16_rn(v);
}

static float gelu_tanh_(float x)
{
    const float s = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x)));
}

/* d GELU(x) / dx of the tanh approximation, in fp32 */
static float gelu_tanh_grad_(float x)
{
    const float s = 0.7978845608028654f, a = 0.044715f;
    float th = tanhf(s * (x + a * x * x * x));
    float du = s * (1.0f + 3.0f * a * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

static void run_gemm_(void *arg)
{
    gemm_ *g = (gemm_ *)arg;
    const emu_lt_desc_ &d = g->d;
    uint64_t m = g->dl.rows, n = g->dl.cols;
    uint64_t k = d.ta ? g->a.rows : g->a.cols;
    for (uint64_t bi = 0; bi < (uint64_t)g->dl.batch; bi++) {
        const __nv_bfloat16 *A = g->A + bi * g->a.stride;
        const __nv_bfloat16 *B = g->B + bi * g->b.stride;
        /* op(A) as fp32 (k, m), so that the inner loop runs over i: each
         * output still sums its k products in k order */
        std::vector<float> a((size_t)k * m), acc(m);
        for (uint64_t p = 0; p < k; p++)
            for (uint64_t i = 0; i < m; i++)
                a[p * m + i] = __bfloat162float(
                    d.ta ? A[p + i * g->a.ld] : A[i + p * g->a.ld]);
        std::vector<float> out((size_t)m * n), pre;
        if (has_aux_(d.epi))
            pre.resize((size_t)m * n);
        for (uint64_t j = 0; j < n; j++) {
            for (uint64_t i = 0; i < m; i++)
                acc[i] = 0.0f;
            for (uint64_t p = 0; p < k; p++) {
                float y = __bfloat162float(
                    d.tb ? B[j + p * g->b.ld] : B[p + j * g->b.ld]);
                const float *ap = &a[p * m];
                for (uint64_t i = 0; i < m; i++)
                    acc[i] += ap[i] * y;
            }
            for (uint64_t i = 0; i < m; i++) {
                float v = g->alpha * acc[i];
                if (g->beta != 0.0f)
                    v += g->beta * d_get_(g, g->C, bi, i, j);
                if (has_bias_(d.epi))
                    v += __bfloat162float(d.bias[i]);
                if (has_aux_(d.epi)) {
                    pre[i + j * m] = v; /* rounded to bf16 as written */
                    v = gelu_tanh_(v);
                }
                if (is_dgelu_(d.epi))
                    v *= gelu_tanh_grad_(
                        __bfloat162float(d.aux[i + j * d.aux_ld]));
                out[i + j * m] = v;
            }
        }
        /* written after all reads: C may be D */
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                d_set_(g, bi, i, j, out[i + j * m]);
                if (has_aux_(d.epi))
                    d.aux[i + j * d.aux_ld] =
                        __float2bfloat16_rn(pre[i + j * m]);
            }
    }
}

static void drop_gemm_(void *arg)
{
    delete (gemm_ *)arg;
}

/* Bytes a column-major (rows, cols, ld) matrix of elements of `es` bytes
 * spans, with its batch: from the first matrix to the end of the last. */
static size_t span_(const emu_lt_layout_ *l, size_t es)
{
    size_t one = ((l->cols - 1) * (uint64_t)l->ld + l->rows) * es;
    return (size_t)(l->batch - 1) * (size_t)l->stride * es + one;
}

static size_t esize_(const emu_lt_layout_ *l)
{
    return l->type == CUDA_R_32F ? sizeof(float) : sizeof(__nv_bfloat16);
}

cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
    const void *A, cublasLtMatrixLayout_t a, const void *B,
    cublasLtMatrixLayout_t b, const void *beta, const void *C,
    cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
    const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size,
    cudaStream_t stream)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!shapes_ok_(d, a, b, c, dl))
        return bad_("matmul: the layouts of op(A), op(B), C and D do not "
                    "make one (m,k) x (k,n) product");
    if (const char *why = types_batches_bad_(a, b, c, dl))
        return bad_(why);
    /* every matrix of the batch as aligned as the algorithm assumed */
    const void *mats[4] = {A, B, C, D};
    const emu_lt_layout_ *lays[4] = {a, b, c, dl};
    for (int i = 0; i < 4; i++) {
        uint64_t need = algo->data[i];
        if (need == 0)
            return bad_("matmul: an algorithm that no heuristic returned");
        for (int32_t bi = 0; bi < lays[i]->batch; bi++) {
            uintptr_t at = (uintptr_t)mats[i] +
                           (uintptr_t)(bi * lays[i]->stride) * esize_(lays[i]);
            if (at % need == 0)
                continue;
            char msg[240];
            snprintf(msg, sizeof msg, "matmul: %c (batch %d) at %p is not "
                     "aligned to the %llu bytes its algorithm was chosen for "
                     "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES; cuBLASLt "
                     "may fail or fault)", "ABCD"[i], (int)bi, (void *)at,
                     (unsigned long long)need, "ABCD"[i]);
            return bad_(msg);
        }
    }
    if (!mock_is_device(A, span_(a, esize_(a))) ||
        !mock_is_device(B, span_(b, esize_(b))) ||
        !mock_is_device(C, span_(c, esize_(c))) ||
        !mock_is_device(D, span_(dl, esize_(dl))))
        return bad_("matmul: A, B, C or D (with its batch) not inside one "
                    "allocation of the current device");
    if (workspace_size && !mock_is_device(workspace, workspace_size))
        return bad_("matmul: workspace not inside one allocation of the "
                    "current device");
    if (has_bias_(d->epi) &&
        !mock_is_device(d->bias, dl->rows * sizeof(__nv_bfloat16)))
        return bad_("matmul: bias epilogue without m device values");
    if ((has_bias_(d->epi) || uses_aux_(d->epi)) && dl->batch != 1)
        return bad_("matmul: epilogues over a batch are not emulated");
    emu_lt_layout_ aux_l = {CUDA_R_16BF, dl->rows, dl->cols, d->aux_ld, 1, 0};
    if (uses_aux_(d->epi) &&
        (d->aux_ld < (int64_t)dl->rows ||
         !mock_is_device(d->aux, span_(&aux_l, sizeof(__nv_bfloat16)))))
        return bad_("matmul: GELU_AUX or DGELU epilogue without an (m,n) "
                    "device aux matrix of ld >= m");
    if (uses_aux_(d->epi) && d->aux_ld % 8 != 0)
        return bad_("matmul: aux leading dimension not a multiple of 8");
    gemm_ *g = new gemm_{*d, *a, *b, *dl, *(const float *)alpha,
                         *(const float *)beta,
                         (const __nv_bfloat16 *)A, (const __nv_bfloat16 *)B,
                         C, D};
    mock_launch_kept(stream, run_gemm_, drop_gemm_, g); /* capturable */
    __atomic_add_fetch(&matmuls_, 1, __ATOMIC_RELAXED);
    return CUBLAS_STATUS_SUCCESS;
}
