/*
 * cublaslt_load.c — cuBLASLt opened when the CUDA backend first asks for
 * it, not when a program starts.
 *
 * libcublasLt is not linked: these definitions of the cuBLASLt functions
 * m6 calls (the prototypes are cublasLt.h's, so the compiler checks them)
 * dlopen the toolkit's library on the first call and forward to it.
 * Linked, its static initialisers ran in every process that holds the
 * CUDA backend, GPU or not: 0.6 of the 0.75 CPU seconds `m6d --version`
 * took on a 2-core VM (perf: call_init in libcublasLt and the page faults
 * it takes), paid by every m6d start, CPU runs included, and every test
 * program that links the backend. bench/RESULTS.md has the figures.
 *
 * The library is CUBLASLT_SONAME (cublaslt_load.h). When it cannot be
 * opened every call returns CUBLAS_STATUS_NOT_INITIALIZED and
 * cublasLtGetStatusString says why (dlerror's text): a cuda spec is then
 * refused at submit with that reason (backend_cuda_check asks
 * gpt_cuda_blas_ready) before any GEMM setup could meet it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include "cublaslt_load.h"

/* The functions m6 calls that return a status, in one table: (name,
 * parameters, arguments). Each becomes a pointer filled by load_() and a
 * forwarding definition below; the two that return names are written
 * out. */
#define CUBLASLT_FUNCS(X)                                                    \
    X(cublasLtCreate, (cublasLtHandle_t *h), (h))                            \
    X(cublasLtDestroy, (cublasLtHandle_t h), (h))                            \
    X(cublasLtMatmul,                                                        \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,        \
       const void *A, cublasLtMatrixLayout_t Ad, const void *B,              \
       cublasLtMatrixLayout_t Bd, const void *beta, const void *C,           \
       cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,        \
       const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,          \
       cudaStream_t s),                                                      \
      (h, d, alpha, A, Ad, B, Bd, beta, C, Cd, D, Dd, algo, ws, ws_bytes, s)) \
    X(cublasLtMatrixLayoutCreate,                                            \
      (cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,          \
       uint64_t cols, int64_t ld), (l, type, rows, cols, ld))                \
    X(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))          \
    X(cublasLtMatrixLayoutSetAttribute,                                      \
      (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,          \
       const void *buf, size_t n), (l, a, buf, n))                           \
    X(cublasLtMatmulDescCreate,                                              \
      (cublasLtMatmulDesc_t *d, cublasComputeType_t ct,                      \
       cudaDataType_t st), (d, ct, st))                                      \
    X(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))              \
    X(cublasLtMatmulDescSetAttribute,                                        \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,             \
       const void *buf, size_t n), (d, a, buf, n))                           \
    X(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *p), (p))  \
    X(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))  \
    X(cublasLtMatmulPreferenceSetAttribute,                                  \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, \
       const void *buf, size_t n), (p, a, buf, n))                           \
    X(cublasLtMatmulAlgoGetHeuristic,                                        \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, \
       cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,                   \
       cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t p, int want,     \
       cublasLtMatmulHeuristicResult_t res[], int *got),                     \
      (h, d, A, B, C, D, p, want, res, got))

#define POINTER_(name, params, args) \
    static cublasStatus_t (*name##_p) params;
CUBLASLT_FUNCS(POINTER_)
static const char *(*status_name_p)(cublasStatus_t);
static const char *(*status_string_p)(cublasStatus_t);

static pthread_once_t once_ = PTHREAD_ONCE_INIT;
static int loaded_;            /* every pointer above is set */
static char why_[512];         /* else what failed */

static void load_(void)
{
    void *h = dlopen(CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why_, sizeof why_, "cuBLASLt could not be loaded: %s",
                 dlerror());
        return;
    }
    const char *missing = NULL;
#define RESOLVE_(name, params, args)                              \
    if (!missing && !(*(void **)&name##_p = dlsym(h, #name)))     \
        missing = #name;
    CUBLASLT_FUNCS(RESOLVE_)
    if (!missing && !(*(void **)&status_name_p =
                          dlsym(h, "cublasLtGetStatusName")))
        missing = "cublasLtGetStatusName";
    if (!missing && !(*(void **)&status_string_p =
                          dlsym(h, "cublasLtGetStatusString")))
        missing = "cublasLtGetStatusString";
    if (missing) {
        snprintf(why_, sizeof why_, "cuBLASLt (%s) has no %s",
                 CUBLASLT_SONAME, missing);
        dlclose(h);
        return;
    }
    loaded_ = 1;
}

static int ready_(void)
{
    pthread_once(&once_, load_);
    return loaded_;
}

#define FORWARD_(name, params, args)                                   \
    cublasStatus_t CUBLASWINAPI name params                            \
    {                                                                  \
        return ready_() ? name##_p args : CUBLAS_STATUS_NOT_INITIALIZED; \
    }
CUBLASLT_FUNCS(FORWARD_)

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status)
{
    if (ready_())
        return status_name_p(status);
    return status == CUBLAS_STATUS_NOT_INITIALIZED
               ? "CUBLAS_STATUS_NOT_INITIALIZED" : "CUBLAS_STATUS_?";
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status)
{
    return ready_() ? status_string_p(status) : why_;
}
