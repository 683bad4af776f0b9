/*
 * bench_util.h — shared by the CPU benchmarks: the GEMM library's own
 * square sgemm peak, measured in the same run (timing: common/clock.h).
 */
#ifndef M6_BENCH_UTIL_H
#define M6_BENCH_UTIL_H

#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"

/* Best-of-reps GFLOP/s of an n x n x n fp32 GEMM (2 n^3 FLOPs) by oneDNN
 * itself, on all the OpenMP threads (called outside a parallel region,
 * dnnl_sgemm threads itself): the peak the model's FLOP rate is compared
 * with. The library the engine's GEMMs run on (kernels/cpu/gemm.c). */
static inline double bench_gemm_peak_gflops(int n, int reps)
{
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n);
    float *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
        c[i] = 0;
    }
    double best = 0;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = clock_mono_s();
        dnnl_sgemm('N', 'T', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = clock_mono_s() - t0;
        double gf = 2.0 * n * (double)n * n / dt / 1e9;
        if (r > 0 && gf > best) /* first run warms up */
            best = gf;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

#endif
