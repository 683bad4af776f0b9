/*
 * bench_util.h — shared by the CPU benchmarks: the GEMM library's own
 * square GEMM peak, fp32 (sgemm) or bf16 (oneDNN's matmul on bf16 inputs,
 * fp32 sums), measured in the same run (timing: common/clock.h).
 */
#ifndef M6_BENCH_UTIL_H
#define M6_BENCH_UTIL_H

#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
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

/* Best-of-reps GFLOP/s of an n x n x n matmul with bf16 inputs and fp32
 * output (2 n^3 FLOPs) by oneDNN's matmul primitive, on all the OpenMP
 * threads (oneDNN threads itself): the peak of bf16 runs. The inputs are
 * bf16 already (the engine's rounding of its operands is not in it), and
 * the primitive is made before the timing. 0 when oneDNN has no bf16
 * matmul on this CPU (below avx512_core in oneDNN 2.6). */
static inline double bench_gemm_peak_bf16_gflops(int n, int reps)
{
    dnnl_engine_t eng = NULL;
    dnnl_stream_t str = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    double best = 0;
    uint16_t *a = malloc(sizeof(uint16_t) * n * n);
    uint16_t *b = malloc(sizeof(uint16_t) * n * n);
    float *c = malloc(sizeof(float) * n * n);
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_dims_t dims = {n, n};
    dnnl_matmul_desc_t md;
    if (!a || !b || !c)
        goto out;
    for (long i = 0; i < (long)n * n; i++) {
        a[i] = 0x3dcd;  /* about 0.1 */
        b[i] = 0x3e4d;  /* about 0.2 */
    }
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&str, eng, dnnl_stream_default_flags) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ad, 2, dims, dnnl_bf16, dnnl_ab) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&bd, 2, dims, dnnl_bf16, dnnl_ba) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&cd, 2, dims, dnnl_f32, dnnl_ab) !=
            dnnl_success ||
        dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) !=
            dnnl_success ||
        dnnl_primitive_create(&prim, pd) != dnnl_success ||
        dnnl_memory_create(&ma, &ad, eng, a) != dnnl_success ||
        dnnl_memory_create(&mb, &bd, eng, b) != dnnl_success ||
        dnnl_memory_create(&mc, &cd, eng, c) != dnnl_success)
        goto out;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb},
                               {DNNL_ARG_DST, mc}};
    for (int r = 0; r < reps + 1; r++) {
        double t0 = clock_mono_s();
        if (dnnl_primitive_execute(prim, str, 3, args) != dnnl_success ||
            dnnl_stream_wait(str) != dnnl_success) {
            best = 0;
            break;
        }
        double dt = clock_mono_s() - t0;
        double gf = 2.0 * n * (double)n * n / dt / 1e9;
        if (r > 0 && gf > best) /* first run warms up */
            best = gf;
    }
out:
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (str) dnnl_stream_destroy(str);
    if (eng) dnnl_engine_destroy(eng);
    free(a);
    free(b);
    free(c);
    return best;
}

#endif
