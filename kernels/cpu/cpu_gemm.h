/*
 * cpu_gemm.h — the one GEMM entry point of the CPU kernels (internal; not
 * part of the kernels.h interface, which declares what the rest of m6 may
 * ask about it: gemm_describe, gemm_selfcheck, gemm_ready).
 *
 * Every product of the CPU engine (matmul.c's dense layers, attention.c's
 * per-head products, moe.c's experts through matmul.c) calls gemm_f32_ from
 * inside its own OpenMP region, each thread on its own block: the call is
 * single-threaded and deterministic (same bits for the same arguments), so
 * the kernels' fixed block layout fixes the result for a thread count.
 *
 * The precision (fp32, or bf16 inputs with fp32 sums) is gemm.c's too:
 * the kernels do not know it.
 *
 * Which library runs is decided in gemm.c alone: oneDNN's sgemm (it
 * JIT-compiles for the ISA that CPUID reports), or, built with
 * -DM6_NO_GEMM_LIB (the GPU check, bench/gpu-check.sh, which builds the CPU
 * model as a reference with plain gcc), plain loops.
 */
#ifndef M6_CPU_GEMM_H
#define M6_CPU_GEMM_H

#include <stdint.h>

#include "kernels.h"

/* Whether an operand is read as stored (N) or transposed (T). */
typedef enum { GEMM_N = 0, GEMM_T = 1 } gemm_op;

/* Row-major C (M,N) = alpha op(A) (M,K) op(B) (K,N) + beta C, float32
 * operands in memory, float32 out, on the calling thread, in the precision
 * gemm_set_precision chose (kernels.h): GEMM_BF16 rounds A and B to bf16
 * first and sums in fp32 (oneDNN's matmul primitive, one per shape and
 * thread, made on the first call of the shape). lda, ldb, ldc are row strides in
 * floats (of A and B as stored). beta 0 does not read C (it may hold
 * NaN). M, N or K 0 is allowed (K 0: C = beta C). A library error (only
 * bad arguments) aborts with a message: the kernels never pass them. */
typedef void (*gemm_f32_fn)(gemm_op ta, gemm_op tb, int M, int N, int K,
                            float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C,
                            int ldc);

void gemm_f32_(gemm_op ta, gemm_op tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc);

/* Tests only: makes fn the GEMM that gemm_f32_ and the self-check run in
 * precision p (NULL: the built-in one again) and forgets gemm_ready's
 * verdict for p, so the next gemm_ready(p) checks fn. Returns the previous
 * one. Not thread-safe:
 * call before any kernel runs. */
gemm_f32_fn gemm_swap_for_test(gemm_precision p, gemm_f32_fn fn);

/* Tests only: rows x cols of src (row stride ld floats) rounded to bf16
 * (gemm_bf16_round's rounding, as bits) into dst (rows of cols) by one of
 * the packers the bf16 GEMM uses: native 1 the AVX512-BF16 one, native 0
 * the portable one. 0, or -1 when native is asked and this CPU (or the
 * compiler) has no AVX512-BF16. */
int gemm_pack_bf16_for_test(uint16_t *dst, const float *src, int rows,
                            int cols, int ld, int native);

#endif /* M6_CPU_GEMM_H */
