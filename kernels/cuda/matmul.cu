/*
 * matmul.cu — fully connected layer through cuBLASLt: bf16 A, B, C, D with
 * fp32 compute (CUBLAS_COMPUTE_32F), bias and GELU fused as epilogues.
 *
 * Row-major (ours) vs column-major (cuBLAS): a row-major (r,c) matrix is a
 * column-major (c,r) one with the same leading dimension c. So
 *   out (N,OC) = inp (N,C) @ W(OC,C)^T   is  D(OC,N) = op_T(W as (C,OC)) @ inp as (C,N)
 *   dinp (N,C) += dout (N,OC) @ W        is  D(C,N)  = W as (C,OC) @ dout as (OC,N)
 *   dW (OC,C) += dout^T @ inp            is  D(C,OC) = inp as (C,N) @ op_T(dout as (OC,N))
 * Accumulation (+=) is beta = 1 with C = D. The bias of the forward is the
 * BIAS epilogue (one value per row of D = per output channel). The bias
 * gradient is an own deterministic column-sum kernel (partials per fixed
 * row chunk, then a fixed-order sum) that accumulates like every backward.
 *
 * The backward of a matmul whose input is a GELU's output can take the
 * GELU's backward into its dinp GEMM: the DGELU epilogue, with the GELU's
 * input (what the forward's GELU_AUX saved) as the aux matrix.
 *
 * The matmul descriptor, the three matrix layouts and the algorithm of a
 * GEMM are made once per configuration (lt_cache_: shapes, epilogue,
 * alignments) and kept until matmul_cuda_fini; a call only sets the bias
 * and aux pointers when they differ from the last ones, so a steady-state
 * training step makes no cuBLASLt descriptor at all.
 *
 * If cuBLASLt returns no algorithm for an epilogue, the launcher falls back
 * to the plain GEMM plus own bias/GELU kernels (and says so once). The
 * *_supported functions ask the heuristic ahead (gpt_cuda does at creation,
 * for every GEMM it will make) without running anything; the answers are
 * kept, so the calls that follow take the same path.
 */
#include <pthread.h>
#include <string.h>

#include "common.cuh"


/* A cuBLASLt handle and workspace per device, made on the device's first
 * GEMM (matmul_cuda_init): each rank of a node runs on its own device,
 * from its own thread, and a workspace is device memory. */
#define LT_DEVICES 64
typedef struct {
    cublasLtHandle_t h;
    void *ws;                 /* MM_WORKSPACE bytes on the device */
} lt_device_;
static lt_device_ lt_dev_[LT_DEVICES];
static pthread_mutex_t lt_dev_mu_ = PTHREAD_MUTEX_INITIALIZER;
static int warned_fallback_;
static long n_fused_, n_separate_;  /* forward epilogues, by path */

/* The heuristic's answer for a configuration, kept with the descriptors
 * it was asked with: asking costs tens of microseconds of host time, and
 * making the descriptors (one matmul descriptor, three layouts) a few
 * more, while a training step makes the same few hundred GEMMs every time
 * (attention alone: a few per sequence or head of every layer). The key is
 * everything the heuristic sees: shapes, layouts, batch, types, epilogue,
 * and the alignment of every pointer. The bias and aux pointers live in
 * the matmul descriptor but not in the key (each layer has its own, and
 * gpt_cuda asks for every layer and batch size at creation): a call sets
 * them when they differ from the entry's last ones, and holds the entry's
 * lock from there through cublasLtMatmul, which reads the descriptor
 * during the call only. A full table just stops keeping new answers:
 * those calls make and free their descriptors as before. */
typedef struct {
    int device;                   /* the heuristic asked that device's */
    int ta, tb, m, n, k, lda, ldb, ldd, batch, d_f32, epi, aux_ld;
    long long sA, sB, sD;
    uint32_t al[4], al_bias, al_aux;
} lt_key_;

/* The descriptors of one configuration: op holds the transposes, the
 * epilogue and its pointers; la, lb, ld the layouts of A, B and C = D. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
} lt_descs_;

#define LT_CACHE 4096   /* a few hundred configurations per device, 8 devices */
#define LT_LOCKS 64               /* entry i uses lt_lock_[i % LT_LOCKS] */
static struct {
    lt_key_ key;
    int used, found;          /* found: an algorithm, else none */
    cublasLtMatmulAlgo_t algo;
    lt_descs_ d;              /* found only; else all NULL */
    const void *bias, *aux;   /* the pointers d.op holds now (its lock) */
} lt_cache_[LT_CACHE];
static pthread_mutex_t lt_cache_mu_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lt_lock_[LT_LOCKS];
static pthread_once_t lt_lock_once_ = PTHREAD_ONCE_INIT;

static void lt_lock_init_(void)
{
    for (int i = 0; i < LT_LOCKS; i++)
        pthread_mutex_init(&lt_lock_[i], NULL);
}

static size_t lt_hash_(const lt_key_ *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)(h % LT_CACHE);
}

/* 1 (algorithm in *algo, the entry's index in *at) or 0 (none) when
 * known, -1 when not asked yet */
static int lt_cache_get_(const lt_key_ *k, cublasLtMatmulAlgo_t *algo,
                         size_t *at)
{
    int r = -1;
    pthread_mutex_lock(&lt_cache_mu_);
    for (size_t i = lt_hash_(k), n = 0; n < LT_CACHE && lt_cache_[i].used;
         i = (i + 1) % LT_CACHE, n++)
        if (!memcmp(&lt_cache_[i].key, k, sizeof *k)) {
            r = lt_cache_[i].found;
            *algo = lt_cache_[i].algo;
            *at = i;
            break;
        }
    pthread_mutex_unlock(&lt_cache_mu_);
    return r;
}

/* Keep the answer for k, with d (made with bias and aux) when found: the
 * table owns d then. 1 kept with d (its index in *at); 0 not (no
 * algorithm, a full table, or another thread kept k first): the caller
 * still owns d. */
static int lt_cache_put_(const lt_key_ *k, int found,
                         const cublasLtMatmulAlgo_t *algo, const lt_descs_ *d,
                         const void *bias, const void *aux, size_t *at)
{
    int kept = 0;
    pthread_mutex_lock(&lt_cache_mu_);
    for (size_t i = lt_hash_(k), n = 0; n < LT_CACHE;
         i = (i + 1) % LT_CACHE, n++) {
        if (lt_cache_[i].used) {
            if (!memcmp(&lt_cache_[i].key, k, sizeof *k))
                break; /* asked meanwhile by another thread */
            continue;
        }
        lt_cache_[i].key = *k;
        lt_cache_[i].used = 1;
        lt_cache_[i].found = found;
        lt_cache_[i].algo = *algo;
        if (found) {
            lt_cache_[i].d = *d;
            lt_cache_[i].bias = bias;
            lt_cache_[i].aux = aux;
        }
        *at = i;
        kept = 1;
        break;
    }
    pthread_mutex_unlock(&lt_cache_mu_);
    return kept && found;
}

static void lt_descs_destroy_(lt_descs_ *d)
{
    if (d->la) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->la));
    if (d->lb) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->lb));
    if (d->ld) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->ld));
    if (d->op) CUBLAS_CHECK(cublasLtMatmulDescDestroy(d->op));
    memset(d, 0, sizeof *d);
}

/* The calling thread's current device's handle and workspace, made on
 * its first use; *device its index. */
static const lt_device_ *lt_this_(int *device)
{
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    if (d < 0 || d >= LT_DEVICES) {
        fprintf(stderr, "matmul: CUDA device %d: cuBLASLt state is kept "
                        "for devices 0..%d\n", d, LT_DEVICES - 1);
        exit(1);
    }
    *device = d;
    lt_device_ *v = &lt_dev_[d];
    if (__atomic_load_n(&v->h, __ATOMIC_ACQUIRE))
        return v;
    pthread_mutex_lock(&lt_dev_mu_);
    if (!v->h) {
        cublasLtHandle_t h;
        CUDA_CHECK(cudaMalloc(&v->ws, MM_WORKSPACE));
        CUBLAS_CHECK(cublasLtCreate(&h));
        __atomic_store_n(&v->h, h, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lt_dev_mu_);
    return v;
}

void matmul_cuda_init(void)
{
    int d;
    (void)lt_this_(&d);
}

void matmul_cuda_fini(void)
{
    pthread_mutex_lock(&lt_dev_mu_);
    for (int d = 0; d < LT_DEVICES; d++) {
        if (!lt_dev_[d].h)
            continue;
        CUDA_CHECK(cudaFree(lt_dev_[d].ws));
        CUBLAS_CHECK(cublasLtDestroy(lt_dev_[d].h));
        lt_dev_[d].h = NULL;
        lt_dev_[d].ws = NULL;
    }
    pthread_mutex_unlock(&lt_dev_mu_);
    pthread_mutex_lock(&lt_cache_mu_);
    for (size_t i = 0; i < LT_CACHE; i++)
        lt_descs_destroy_(&lt_cache_[i].d);
    memset(lt_cache_, 0, sizeof lt_cache_);
    pthread_mutex_unlock(&lt_cache_mu_);
}

/* ------------------------------------------------------------- kernels */

/* out (N,OC) += bias broadcast over rows (epilogue fallback) */
__global__ void add_bias_kernel(bf16 *out, const bf16 *bias, int OC,
                                size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        out[i] = st(ld(out[i]) + ld(bias[i % OC]));
}

/* grid (ceil(OC/blockDim), nchunks): scratch (nchunks, OC) column partials */
__global__ void colsum_partial_kernel(float *scratch, const bf16 *dout, int N,
                                      int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (c >= OC)
        return;
    int r0 = chunk * MM_ROWS, r1 = min(r0 + MM_ROWS, N);
    float s = 0.0f;
    for (int n = r0; n < r1; n++)
        s += ld(dout[(size_t)n * OC + c]);
    scratch[(size_t)chunk * OC + c] = s;
}

__global__ void colsum_final_kernel(bf16 *dbias, const float *scratch,
                                    int nchunks, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++)
        s += scratch[(size_t)k * OC + c];
    add_bf16(&dbias[c], s);
}

/* ------------------------------------------------------------- cuBLASLt */

/* The alignment of p in bytes, up to 256: the largest power of two that
 * divides the address. */
static uint32_t align_of_(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    while (al < 256 && a % (2 * al) == 0)
        al *= 2;
    return al;
}

/* The alignment of every matrix of a strided batch: of the first, and of
 * the stride (bytes). */
static uint32_t batch_align_(const void *p, long long stride_bytes, int batch)
{
    uint32_t al = align_of_(p);
    if (batch > 1) {
        uint32_t as = align_of_((const void *)(uintptr_t)stride_bytes);
        if (as < al)
            al = as;
    }
    return al;
}

/* A column-major layout of `rows` x `cols` (leading dimension ld), of
 * `batch` matrices `stride` elements apart. */
static cublasLtMatrixLayout_t layout_(cudaDataType_t type, int rows, int cols,
                                      int ld, int batch, long long stride)
{
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
    if (batch > 1) {
        int32_t bc = batch;
        int64_t st = stride;
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st));
    }
    return l;
}

/* The descriptors of g with epilogue epi (its bias, aux and aux_ld). */
static void lt_descs_make_(const gemm_batched_args *g, int batch,
                           cublasLtEpilogue_t epi, const bf16 *bias,
                           bf16 *aux, int aux_ld, lt_descs_ *d)
{
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F));
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d->op,
                                                CUBLASLT_MATMUL_DESC_TRANSA,
                                                &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d->op,
                                                CUBLASLT_MATMUL_DESC_TRANSB,
                                                &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        int64_t ld64 = aux_ld;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
            sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld64, sizeof ld64));
    }
    cudaDataType_t dtype = g->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
    d->la = layout_(CUDA_R_16BF, g->ta ? g->k : g->m, g->ta ? g->m : g->k,
                    g->lda, batch, g->sA);
    d->lb = layout_(CUDA_R_16BF, g->tb ? g->n : g->k, g->tb ? g->k : g->n,
                    g->ldb, batch, g->sB);
    d->ld = layout_(dtype, g->m, g->n, g->ldd, batch, g->sD);
}

/* Run g (kernels_cuda.h) with an epilogue (bias, aux: see there), or
 * with run 0 only ask (and keep) whether cuBLASLt has an algorithm for it.
 * Returns 0, or -1 when cuBLASLt has no algorithm for this configuration
 * (only then; every other failure exits through CUBLAS_CHECK). */
static int lt_run_(const gemm_batched_args *g, cublasLtEpilogue_t epi,
                   const bf16 *bias, bf16 *aux, int aux_ld,
                   cudaStream_t stream, int run)
{
    int device;
    const lt_device_ *dv = lt_this_(&device);
    int batch = g->batch > 0 ? g->batch : 1;
    size_t dsize = g->d_f32 ? sizeof(float) : sizeof(bf16);
    /* The heuristic does not see A, B, C and D: it assumes 256-byte
     * alignment unless told, and an algorithm chosen so fails on a less
     * aligned matrix (cublasLt.h). Tensors inside a slot are not all 256-
     * aligned (C 1600: the attention projection's weight is 128-aligned),
     * nor are the heads of a strided batch, so state each one's real
     * alignment, as PyTorch does. */
    const uint32_t al[4] = {
        batch_align_(g->A, g->sA * (long long)sizeof(bf16), batch),
        batch_align_(g->B, g->sB * (long long)sizeof(bf16), batch),
        batch_align_(g->D, g->sD * (long long)dsize, batch),
        batch_align_(g->D, g->sD * (long long)dsize, batch)};
    lt_key_ key;
    memset(&key, 0, sizeof key); /* padding too: keys compare as bytes */
    key.device = device;
    key.ta = g->ta; key.tb = g->tb; key.m = g->m; key.n = g->n; key.k = g->k;
    key.lda = g->lda; key.ldb = g->ldb; key.ldd = g->ldd; key.batch = batch;
    key.d_f32 = g->d_f32; key.epi = (int)epi; key.aux_ld = aux_ld;
    key.sA = g->sA; key.sB = g->sB; key.sD = g->sD;
    for (int i = 0; i < 4; i++)
        key.al[i] = al[i];
    key.al_bias = bias ? align_of_(bias) : 0; /* the heuristic reads both */
    key.al_aux = aux ? align_of_(aux) : 0;
    cublasLtMatmulAlgo_t algo;
    memset(&algo, 0, sizeof algo); /* kept as it is when there is none */
    lt_descs_ d;                   /* made here when not kept: freed here */
    memset(&d, 0, sizeof d);
    size_t at = 0;
    int found = lt_cache_get_(&key, &algo, &at), kept = found > 0;
    if (found < 0) { /* not asked yet: the preference is only for this */
        lt_descs_make_(g, batch, epi, bias, aux, aux_ld, &d);
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = MM_WORKSPACE;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
                pref, align_attr[i], &al[i], sizeof al[i]));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(
            dv->h, d.op, d.la, d.lb, d.ld, d.ld, pref, 1, &res, &nres);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        if (hst != CUBLAS_STATUS_SUCCESS && hst != CUBLAS_STATUS_NOT_SUPPORTED)
            CUBLAS_CHECK(hst);
        found = hst == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (found)
            algo = res.algo;
        kept = lt_cache_put_(&key, found, &algo, &d, bias, aux, &at);
    }
    int rc = found ? 0 : -1;
    if (found && run) {
        pthread_mutex_t *mu = NULL;
        const lt_descs_ *use = &d;
        if (kept) { /* the entry's descriptors, with this call's pointers */
            pthread_once(&lt_lock_once_, lt_lock_init_);
            mu = &lt_lock_[at % LT_LOCKS];
            pthread_mutex_lock(mu);
            use = &lt_cache_[at].d;
            if (bias && lt_cache_[at].bias != (const void *)bias) {
                CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                    use->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                    sizeof bias));
                lt_cache_[at].bias = bias;
            }
            if (aux && lt_cache_[at].aux != (const void *)aux) {
                CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                    use->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                    sizeof aux));
                lt_cache_[at].aux = aux;
            }
        }
        cublasStatus_t st = cublasLtMatmul(
            dv->h, use->op, &g->alpha, g->A, use->la, g->B, use->lb,
            &g->beta, g->D, use->ld, g->D, use->ld, &algo, dv->ws,
            MM_WORKSPACE, stream);
        if (mu)
            pthread_mutex_unlock(mu);
        CUBLAS_CHECK(st);
        CUDA_CHECK_LAUNCH(); /* M6_CUDA_SYNC=1: its kernels checked here */
    }
    if (!kept)
        lt_descs_destroy_(&d);
    return rc;
}

/* One bf16 GEMM, not batched, alpha 1: D (m,n col-major, ldd) =
 * op(A) op(B) + beta D. A is (m,k) if !ta else stored (k,m); B is (k,n)
 * if !tb else stored (n,k). */
static gemm_batched_args plain_(bool ta, bool tb, int m, int n, int k,
                                const bf16 *A, int lda, const bf16 *B,
                                int ldb, bf16 *D, int ldd, float beta)
{
    gemm_batched_args g = {ta, tb, m, n, k, A, lda, 0, B, ldb, 0, D, ldd, 0,
                           0, 1.0f, beta, 1};
    return g;
}

/* plain_ with an epilogue: 0, or -1 when cuBLASLt has no algorithm
 * (lt_run_). */
static int lt_gemm_(bool ta, bool tb, int m, int n, int k, const bf16 *A,
                    int lda, const bf16 *B, int ldb, bf16 *D, int ldd,
                    float beta, cublasLtEpilogue_t epi, const bf16 *bias,
                    bf16 *aux, int aux_ld, cudaStream_t stream)
{
    gemm_batched_args g = plain_(ta, tb, m, n, k, A, lda, B, ldb, D, ldd, beta);
    return lt_run_(&g, epi, bias, aux, aux_ld, stream, 1);
}

void gemm_batched_cuda(const gemm_batched_args *g, cudaStream_t stream)
{
    if (lt_run_(g, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, stream, 1) != 0) {
        fprintf(stderr, "matmul: cuBLASLt has no algorithm for a bf16 GEMM "
                        "m=%d n=%d k=%d (ta=%d tb=%d, batch %d, D %s)\n",
                g->m, g->n, g->k, g->ta, g->tb, g->batch,
                g->d_f32 ? "fp32" : "bf16");
        exit(1);
    }
}

/* a GEMM without epilogue must always have an algorithm */
static void lt_gemm_plain_(bool ta, bool tb, int m, int n, int k,
                           const bf16 *A, int lda, const bf16 *B, int ldb,
                           bf16 *D, int ldd, float beta, cudaStream_t stream)
{
    gemm_batched_args g = plain_(ta, tb, m, n, k, A, lda, B, ldb, D, ldd, beta);
    gemm_batched_cuda(&g, stream);
}

static void warn_fallback_(const char *what)
{
    if (!warned_fallback_)
        fprintf(stderr, "matmul: cuBLASLt offers no %s epilogue here; "
                        "using separate kernels\n", what);
    warned_fallback_ = 1;
}

/* ------------------------------------------------------------- probes */

int gemm_batched_supported(const gemm_batched_args *g)
{
    return lt_run_(g, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, 0, 0) == 0;
}

/* The epilogue of matmul_forward_cuda (gelu 0) or of
 * matmul_forward_gelu_cuda (gelu 1) for these tensors, asked, not run. */
static int epilogue_supported_(bf16 *out, bf16 *pre, const bf16 *inp,
                               const bf16 *weight, const bf16 *bias, int N,
                               int C, int OC, int gelu)
{
    gemm_batched_args g = plain_(true, false, OC, N, C, weight, C, inp, C,
                                 out, OC, 0.0f);
    if (!gelu)
        return lt_run_(&g, CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0, 0, 0) == 0;
    if (OC % 8)
        return 0; /* the aux matrix's ld must be a multiple of 8 */
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : CUBLASLT_EPILOGUE_GELU_AUX;
    return lt_run_(&g, epi, bias, pre, OC, 0, 0) == 0;
}

/* The dinp GEMM of matmul_backward_dgelu_first_cuda with its DGELU
 * epilogue, as run (beta 0, aux = pre of ld C): the arguments, or asked
 * only (run 0). 0, or -1 when cuBLASLt has none. */
static int dgelu_gemm_(bf16 *dinp, const bf16 *pre, const bf16 *dout,
                       const bf16 *weight, int N, int C, int OC,
                       cudaStream_t stream, int run)
{
    if (C % 8)
        return -1; /* the aux matrix's ld must be a multiple of 8 */
    gemm_batched_args g = plain_(false, false, C, N, OC, weight, C, dout, OC,
                                 dinp, C, 0.0f);
    return lt_run_(&g, CUBLASLT_EPILOGUE_DGELU, NULL, (bf16 *)pre, C, stream,
                   run);
}

int matmul_backward_dgelu_supported(bf16 *dinp, const bf16 *pre,
                                    const bf16 *dout, const bf16 *weight,
                                    int N, int C, int OC)
{
    int ok = dgelu_gemm_(dinp, pre, dout, weight, N, C, OC, 0, 0) == 0;
    if (!ok)
        warned_fallback_ = 1; /* the caller has said so */
    return ok;
}

int matmul_forward_fused_supported(bf16 *out, bf16 *pre, const bf16 *inp,
                                   const bf16 *weight, const bf16 *bias,
                                   int N, int C, int OC, int gelu)
{
    int ok = epilogue_supported_(out, pre, inp, weight, bias, N, C, OC, gelu);
    if (!ok)
        warned_fallback_ = 1; /* the caller has said so */
    return ok;
}

int matmul_plain_supported(const bf16 *out, const bf16 *inp,
                           const bf16 *weight, bf16 *dinp, bf16 *dweight,
                           const bf16 *dout, int N, int C, int OC,
                           char *why, size_t whylen)
{
    /* forward (also the epilogues' fallback), backward dinp, dweight */
    gemm_batched_args g[3] = {
        plain_(true, false, OC, N, C, weight, C, inp, C, (bf16 *)out, OC,
               0.0f),
        plain_(false, false, C, N, OC, weight, C, dout, OC, dinp, C, 1.0f),
        plain_(false, true, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f)};
    static const char *name[3] = {"forward", "backward dinp",
                                  "backward dweight"};
    for (int i = 0; i < 3; i++)
        if ((i != 1 || dinp) && !gemm_batched_supported(&g[i])) {
            snprintf(why, whylen, "cuBLASLt has no algorithm for the bf16 "
                     "GEMM of the matmul %s (N=%d C=%d OC=%d: m=%d n=%d "
                     "k=%d)", name[i], N, C, OC, g[i].m, g[i].n, g[i].k);
            return 0;
        }
    return 1;
}

void matmul_cuda_paths(long *fused, long *separate)
{
    *fused = __atomic_load_n(&n_fused_, __ATOMIC_RELAXED);
    *separate = __atomic_load_n(&n_separate_, __ATOMIC_RELAXED);
}

static void count_(long *n)
{
    __atomic_add_fetch(n, 1, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------- launchers */

void matmul_forward_cuda(bf16 *out, const bf16 *inp, const bf16 *weight,
                         const bf16 *bias, int N, int C, int OC,
                         cudaStream_t stream)
{
    if (bias && lt_gemm_(true, false, OC, N, C, weight, C, inp, C, out, OC,
                         0.0f, CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0,
                         stream) == 0) {
        count_(&n_fused_);
        return;
    }
    lt_gemm_plain_(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f,
                   stream);
    if (bias) {
        warn_fallback_("BIAS");
        count_(&n_separate_);
        size_t total = (size_t)N * OC;
        add_bias_kernel<<<ceil_div(total, 256), 256, 0, stream>>>(out, bias,
                                                                  OC, total);
        CUDA_CHECK_LAUNCH();
    }
}

void matmul_forward_gelu_cuda(bf16 *out, bf16 *pre, const bf16 *inp,
                              const bf16 *weight, const bf16 *bias, int N,
                              int C, int OC, cudaStream_t stream)
{
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : CUBLASLT_EPILOGUE_GELU_AUX;
    if (OC % 8 == 0 &&
        lt_gemm_(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, epi,
                 bias, pre, OC, stream) == 0) {
        count_(&n_fused_);
        return;
    }
    warn_fallback_("GELU_AUX_BIAS");
    count_(&n_separate_); /* the GELU; the bias counts in the call below */
    matmul_forward_cuda(pre, inp, weight, bias, N, C, OC, stream);
    gelu_forward_cuda(out, pre, (size_t)N * OC, stream);
}

/* matmul_backward_cuda (dinp_beta 1: dinp +=) and
 * matmul_backward_first_cuda (0: dinp =, not read) */
static void backward_(bf16 *dinp, bf16 *dweight, bf16 *dbias, float *scratch,
                      const bf16 *dout, const bf16 *inp, const bf16 *weight,
                      int N, int C, int OC, float dinp_beta,
                      cudaStream_t stream)
{
    if (dinp)
        lt_gemm_plain_(false, false, C, N, OC, weight, C, dout, OC, dinp, C,
                       dinp_beta, stream);
    lt_gemm_plain_(false, true, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f,
                   stream);
    if (dbias) {
        int nchunks = (int)ceil_div(N, MM_ROWS);
        const int bs = 128;
        dim3 grid(ceil_div(OC, bs), nchunks);
        colsum_partial_kernel<<<grid, bs, 0, stream>>>(scratch, dout, N, OC);
        CUDA_CHECK_LAUNCH();
        colsum_final_kernel<<<ceil_div(OC, bs), bs, 0, stream>>>(
            dbias, scratch, nchunks, OC);
        CUDA_CHECK_LAUNCH();
    }
}

void matmul_backward_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                          float *scratch, const bf16 *dout, const bf16 *inp,
                          const bf16 *weight, int N, int C, int OC,
                          cudaStream_t stream)
{
    backward_(dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC,
              1.0f, stream);
}

void matmul_backward_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                float *scratch, const bf16 *dout,
                                const bf16 *inp, const bf16 *weight, int N,
                                int C, int OC, cudaStream_t stream)
{
    backward_(dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC,
              0.0f, stream);
}

void matmul_backward_dgelu_first_cuda(bf16 *dinp, bf16 *dweight, bf16 *dbias,
                                      float *scratch, const bf16 *dout,
                                      const bf16 *inp, const bf16 *pre,
                                      const bf16 *weight, int N, int C,
                                      int OC, cudaStream_t stream)
{
    if (dgelu_gemm_(dinp, pre, dout, weight, N, C, OC, stream, 1) == 0) {
        count_(&n_fused_);
        backward_(NULL, dweight, dbias, scratch, dout, inp, weight, N, C, OC,
                  0.0f, stream);
        return;
    }
    /* the plain GEMM, then the GELU's backward in place */
    warn_fallback_("DGELU");
    count_(&n_separate_);
    backward_(dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC,
              0.0f, stream);
    gelu_backward_first_cuda(dinp, pre, dinp, (size_t)N * C, stream);
}
