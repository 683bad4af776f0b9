/*
 * cuda_check.h — the always-on error checks of the CUDA backend (STYLE.md
 * "one check macro per API family"): every CUDA runtime and cuBLASLt call
 * goes through CUDA_CHECK / CUBLAS_CHECK, every kernel launch is followed by
 * CUDA_CHECK_LAUNCH(). On error they print the library's own error name and
 * string, the failing statement and file:line, then exit(1): a GPU error in
 * the middle of a step leaves no state worth recovering.
 *
 * M6_CUDA_SYNC=1 (environment, read once per file): every
 * CUDA_CHECK_LAUNCH() also waits for the device and checks, so that an
 * error inside a kernel (an illegal address) is reported at the file:line
 * of its launch, not at the next synchronising call. A debugging switch:
 * it serialises the host with the device and the streams with each other.
 *
 * cuda_device_or_skip(): the test/bench prologue. Exit code 77 (the
 * meson/automake "skipped" code) with "no CUDA device" when there is none.
 */
#ifndef M6_CUDA_CHECK_H
#define M6_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

/* The one failure report of the checks below: "<lib> error <name>
 * (<string>) at file:line: <what>" on stderr, then exit(1). */
__attribute__((noreturn)) static inline void
cuda_check_fail_(const char *lib, const char *name, const char *str,
                 const char *file, int line, const char *what)
{
    fprintf(stderr, "%s error %s (%s) at %s:%d: %s\n", lib, name, str, file,
            line, what);
    exit(1);
}

#define CUDA_CHECK(call)                                                      \
    do {                                                                      \
        cudaError_t err_ = (call);                                            \
        if (err_ != cudaSuccess)                                              \
            cuda_check_fail_("CUDA", cudaGetErrorName(err_),                  \
                             cudaGetErrorString(err_), __FILE__, __LINE__,    \
                             #call);                                          \
    } while (0)

/* 1 when M6_CUDA_SYNC=1 is set (read at the first call of this file). */
static inline int cuda_sync_launches(void)
{
    static int on = -1; /* a benign race: every thread reads the same */
    if (on < 0) {
        const char *e = getenv("M6_CUDA_SYNC");
        on = e && e[0] == '1' && e[1] == 0;
    }
    return on;
}

/* After a <<<...>>> launch: catches bad launch configurations at once, and
 * with M6_CUDA_SYNC=1 the kernel's own errors too. */
#define CUDA_CHECK_LAUNCH()                                                   \
    do {                                                                      \
        CUDA_CHECK(cudaGetLastError());                                       \
        if (cuda_sync_launches()) {                                           \
            cudaError_t sync_ = cudaDeviceSynchronize();                      \
            if (sync_ != cudaSuccess)                                         \
                cuda_check_fail_("CUDA", cudaGetErrorName(sync_),             \
                                 cudaGetErrorString(sync_), __FILE__,         \
                                 __LINE__, "in the kernel launched here "     \
                                 "(M6_CUDA_SYNC=1)");                         \
        }                                                                     \
    } while (0)

#define CUBLAS_CHECK(call)                                                    \
    do {                                                                      \
        cublasStatus_t st_ = (call);                                          \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                     \
            cuda_check_fail_("cuBLASLt", cublasLtGetStatusName(st_),          \
                             cublasLtGetStatusString(st_), __FILE__,          \
                             __LINE__, #call);                                \
    } while (0)

#define CUDA_SKIP_EXIT 77

/* Returns when a CUDA device is usable; otherwise prints why on stdout and
 * exits with 77. `who` names the program in the message. */
static inline void cuda_device_or_skip(const char *who)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("%s: SKIP: no CUDA device (%s)\n", who,
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        fflush(stdout);
        exit(CUDA_SKIP_EXIT);
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s: device 0: %s, sm_%d%d, %.1f GiB\n", who, p.name, p.major,
           p.minor, (double)p.totalGlobalMem / (1 << 30));
    if (p.major < 9) { /* the build is sm_90 + compute_90 PTX only */
        printf("%s: SKIP: no CUDA device of compute capability 9.0+ "
               "(this build targets sm_90)\n", who);
        exit(CUDA_SKIP_EXIT);
    }
}

#endif /* M6_CUDA_CHECK_H */
