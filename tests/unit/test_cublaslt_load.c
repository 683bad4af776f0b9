/*
 * test_cublaslt_load.c — kernels/cuda/cublaslt_load.c: cuBLASLt is not in
 * the process until the backend's first call, then every call reaches the
 * toolkit's library; when the library cannot be opened, calls fail with
 * CUBLAS_STATUS_NOT_INITIALIZED and the status string says why. Needs the
 * CUDA toolkit's libraries, not a GPU (layouts are host objects).
 *
 * Built twice: as is, and with CUBLASLT_SONAME naming a library that does
 * not exist (MISSING defined), which runs the failure case alone.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "cublaslt_load.h"   /* CUBLASLT_SONAME: the library it opens */

#ifndef MISSING
static void test_opened_on_first_call(void **unused)
{
    (void)unused;
    /* linked, the library would be here before main */
    void *h = dlopen(CUBLASLT_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        fail_msg("%s is loaded before any cuBLASLt call", CUBLASLT_SONAME);

    cublasLtMatrixLayout_t l = NULL;
    assert_int_equal(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 4, 8, 4),
                     CUBLAS_STATUS_SUCCESS);
    assert_non_null(l);
    int32_t batch = 3;
    assert_int_equal(cublasLtMatrixLayoutSetAttribute(
                         l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                         sizeof batch), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
    /* the library's own names, not the loader's fallbacks */
    assert_string_equal(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS),
                        "CUBLAS_STATUS_SUCCESS");
    assert_string_equal(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE),
                        "CUBLAS_STATUS_INVALID_VALUE");

    h = dlopen(CUBLASLT_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        fail_msg("%s is not loaded after the first call", CUBLASLT_SONAME);
    dlclose(h);
}
#else
static void test_missing_library(void **unused)
{
    (void)unused;
    cublasLtHandle_t h = NULL;
    assert_int_equal(cublasLtCreate(&h), CUBLAS_STATUS_NOT_INITIALIZED);
    cublasLtMatrixLayout_t l = NULL;
    assert_int_equal(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 4, 8, 4),
                     CUBLAS_STATUS_NOT_INITIALIZED);
    const char *why = cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);
    printf("why: %s\n", why);
    assert_non_null(strstr(why, "cuBLASLt could not be loaded"));
    assert_non_null(strstr(why, CUBLASLT_SONAME));
    assert_string_equal(cublasLtGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED),
                        "CUBLAS_STATUS_NOT_INITIALIZED");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
#ifndef MISSING
        cmocka_unit_test(test_opened_on_first_call),
#else
        cmocka_unit_test(test_missing_library),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
