/*
 * cublasLt.h — mock for tests/unit/offload_mock: only what cuda_check.h's
 * CUBLAS_CHECK names (the offload runtime makes no cuBLASLt call).
 */
#ifndef M6_MOCK_CUBLASLT_H
#define M6_MOCK_CUBLASLT_H

typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0

static inline const char *cublasLtGetStatusName(cublasStatus_t st)
{
    (void)st;
    return "CUBLAS_STATUS_MOCK";
}

static inline const char *cublasLtGetStatusString(cublasStatus_t st)
{
    (void)st;
    return "mock cuBLASLt";
}

#endif /* M6_MOCK_CUBLASLT_H */
