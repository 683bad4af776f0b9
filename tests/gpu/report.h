/*
 * report.h — the GPU tests' check lines: each check prints what it
 * compared, both values and the tolerance, and "ok" or "FAIL"; failures
 * are counted in n_failed (the test's exit status). With them, the
 * distances the model tests compare against their tolerances. C and CUDA
 * C++.
 */
#ifndef M6_TESTS_GPU_REPORT_H
#define M6_TESTS_GPU_REPORT_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static int n_failed;

static inline void check_(int ok, const char *what, double a, double b, double tol)
{
    printf("  %-50s %.7g vs %.7g (tol %.0e) %s\n", what, a, b, tol,
           ok ? "ok" : "FAIL");
    n_failed += !ok;
}

static inline void check_true_(int ok, const char *what)
{
    printf("  %-50s %s\n", what, ok ? "ok" : "FAIL");
    n_failed += !ok;
}

/* Normalised L2 error ||got - want|| / ||want|| over n floats (the plain
 * norm when want is all zero; infinity when got is not finite). */
static inline double nerr_(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    if (!isfinite(num))
        return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* L2 norm of a - b over n floats. */
static inline double diff_norm_(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        s += d * d;
    }
    return sqrt(s);
}

#endif /* M6_TESTS_GPU_REPORT_H */
