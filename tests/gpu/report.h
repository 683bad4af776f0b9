/*
 * report.h — the GPU tests' check lines: each check prints what it
 * compared, both values and the tolerance, and "ok" or "FAIL"; failures
 * are counted in n_failed (the test's exit status). C and CUDA C++.
 */
#ifndef M6_TESTS_GPU_REPORT_H
#define M6_TESTS_GPU_REPORT_H

#include <stdio.h>

static int n_failed;

static void check_(int ok, const char *what, double a, double b, double tol)
{
    printf("  %-50s %.7g vs %.7g (tol %.0e) %s\n", what, a, b, tol,
           ok ? "ok" : "FAIL");
    n_failed += !ok;
}

static void check_true_(int ok, const char *what)
{
    printf("  %-50s %s\n", what, ok ? "ok" : "FAIL");
    n_failed += !ok;
}

#endif /* M6_TESTS_GPU_REPORT_H */
