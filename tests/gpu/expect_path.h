/*
 * expect_path.h — which path the GPU code took, against what the test's
 * environment says it must be. The emulation's tests make cuBLASLt refuse
 * some GEMMs (tests/cuda_emu/cublaslt_emu.cpp) and name the path the code
 * must then take:
 *   M6_TEST_EXPECT_ATT=gemm|flash|tc    attention: cuBLASLt's tensor-core
 *                                       GEMMs, the CUDA-core flash kernels,
 *                                       or (a model's) flash kernels on the
 *                                       tensor cores
 *   M6_TEST_EXPECT_EPI=fused|separate   forward bias / GELU: in cuBLASLt's
 *                                       epilogue or on the own kernels
 * Unset (a run on a GPU): whatever path is taken passes. C and CUDA C++.
 */
#ifndef M6_TESTS_GPU_EXPECT_PATH_H
#define M6_TESTS_GPU_EXPECT_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when the path `got` of `what` is the one $env names (or env is
 * unset); prints the comparison either way. */
static int expect_path_(const char *env, const char *what, const char *got)
{
    const char *want = getenv(env);
    int ok = !want || !*want || strcmp(want, got) == 0;
    printf("  %-50s %s (%s=%s) %s\n", what, got, env,
           want && *want ? want : "any", ok ? "ok" : "FAIL");
    return ok;
}

#endif /* M6_TESTS_GPU_EXPECT_PATH_H */
