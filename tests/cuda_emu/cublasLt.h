/*
 * cublasLt.h — the CPU emulation of the part of cuBLASLt that
 * kernels/cuda/matmul.cu calls (tests/cuda_emu, cublaslt_emu.cpp).
 *
 * cublasLtMatmul queues, on its stream, D = alpha op(A) op(B) + beta C and
 * the epilogue, column-major as cuBLAS, for each matrix of a strided batch
 * (BATCH_COUNT, STRIDED_BATCH_OFFSET: the same count on every layout), bf16
 * A and B, bf16 or fp32 C and D (of one type), with an fp32 accumulator
 * (CUBLAS_COMPUTE_32F, fp32 alpha/beta), summed in k order:
 *   DEFAULT        D = acc
 *   BIAS           D = acc + bias[row]                 (bias: bf16, m values)
 *   GELU_AUX       aux = acc;         D = gelu_tanh(aux)
 *   GELU_AUX_BIAS  aux = acc + bias;  D = gelu_tanh(aux) (aux: bf16, ld AUX_LD)
 * with gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) on
 * the fp32 value, each output rounded once to bf16. That is our reading of
 * the cuBLASLt documentation, not a measurement of it: this emulation
 * checks how matmul.cu calls cuBLASLt (layouts, transposes, leading
 * dimensions, pointers inside device allocations, workspace), while only a
 * GPU run (tests/gpu) checks cuBLASLt itself.
 *
 * Alignment, as cuBLASLt documents it: the heuristic cannot see A, B, C
 * and D, so it picks an algorithm for the alignment the preference states
 * (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, default 256 bytes),
 * and cublasLtMatmul with a matrix less aligned than that "will fail". The
 * emulated algorithm carries those four alignments and cublasLtMatmul
 * refuses a pointer that does not meet one (a misuse), whatever the real
 * algorithm would have needed.
 *
 * With the environment variable M6_EMU_CUBLASLT_NO_EPILOGUE=1 the heuristic
 * offers no algorithm for an epilogue other than DEFAULT (as cuBLASLt may),
 * so that matmul.cu's fallback kernels run.
 */
#ifndef M6_EMU_CUBLASLT_H
#define M6_EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>
#include "cuda_runtime.h"

typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define CUBLAS_STATUS_INVALID_VALUE 7
#define CUBLAS_STATUS_NOT_SUPPORTED 15

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
} cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 10,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 11,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct emu_lt_handle_ *cublasLtHandle_t;
typedef struct emu_lt_desc_ *cublasLtMatmulDesc_t;
typedef struct emu_lt_layout_ *cublasLtMatrixLayout_t;
typedef struct emu_lt_pref_ *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d,
                                        cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(
    cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
    const void *buf, size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l,
                                          cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(
    cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
    const void *buf, size_t size);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
    const void *buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
    cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int requested,
    cublasLtMatmulHeuristicResult_t *results, int *returned);
cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
    const void *A, cublasLtMatrixLayout_t a, const void *B,
    cublasLtMatrixLayout_t b, const void *beta, const void *C,
    cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
    const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size,
    cudaStream_t stream);

static inline const char *cublasLtGetStatusName(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

static inline const char *cublasLtGetStatusString(cublasStatus_t st)
{
    return st == CUBLAS_STATUS_SUCCESS ? "success"
           : st == CUBLAS_STATUS_NOT_INITIALIZED
               ? "cuBLASLt could not be loaded: (emulated, "
                 "M6_EMU_CUBLASLT_UNLOADABLE)"
               : "emulated cuBLASLt error";
}

#endif /* M6_EMU_CUBLASLT_H */
