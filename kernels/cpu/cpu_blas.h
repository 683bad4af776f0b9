/*
 * cpu_blas.h — the CBLAS entry points the CPU kernels use (internal; not
 * part of the kernels.h interface), and how they are threaded.
 *
 * The kernels call single-threaded sgemm from inside their own OpenMP
 * regions, each thread on its own block. OpenBLAS's thread pool is set to
 * 1 thread on first use: two pools (OpenMP for the other kernels, OpenBLAS
 * for GEMMs) busy-waiting on the same cores starved each other (GEMMs fell
 * to a third of peak between OpenMP regions).
 *
 * -DM6_NO_CBLAS replaces sgemm by plain loops (slow, same results up to
 * summation order) for machines without a BLAS, e.g. the GPU check
 * (bench/gpu-check.sh) that builds the CPU model as a reference with gcc.
 */
#ifndef M6_CPU_BLAS_H
#define M6_CPU_BLAS_H

#include <stddef.h>

#ifndef M6_NO_CBLAS
#include <cblas.h>
#else
enum { CblasRowMajor, CblasNoTrans, CblasTrans };
static inline void openblas_set_num_threads(int n) { (void)n; }
/* Row-major C (M,N) = alpha op(A) (M,K) op(B) (K,N) + beta C, one thread,
 * like the single-threaded BLAS; beta 0 does not read C. */
static inline void cblas_sgemm(int order, int ta, int tb, int M, int N, int K,
                               float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *Cm,
                               int ldc)
{
    (void)order;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = ta == CblasTrans ? A[(size_t)k * lda + i]
                                           : A[(size_t)i * lda + k];
                float b = tb == CblasTrans ? B[(size_t)j * ldb + k]
                                           : B[(size_t)k * ldb + j];
                s += a * b;
            }
            float *c = Cm + (size_t)i * ldc + j;
            *c = alpha * s + (beta != 0.0f ? beta * *c : 0.0f);
        }
    }
}
#endif

/* OpenBLAS runs inside our OpenMP threads, one thread each; call before
 * the first sgemm of a kernel. */
static inline void blas_single_thread_(void)
{
    static int done;
    if (!done) {
        openblas_set_num_threads(1);
        done = 1;
    }
}

#endif /* M6_CPU_BLAS_H */
