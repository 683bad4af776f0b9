/*
 * cuda_runtime.h — the CPU emulation of the CUDA runtime (tests/cuda_emu):
 * the subset of the runtime API that kernels/cuda/ and tests/gpu/ call,
 * executed on the CPU by mock_cuda.cpp, plus kernel execution (emu_kernel.h,
 * included at the end: blocks of threads as fibers, __syncthreads, warp
 * shuffles). It shadows the real <cuda_runtime.h> through include order
 * (this folder comes first on the include path; nothing here ever includes
 * or links the CUDA toolkit). Users: tests/unit/offload_mock (the offload
 * runtime under random stream timing) and tests/cuda_emu (every CUDA op and
 * the GPU model against the CPU reference, on every machine).
 *
 * Semantics kept from the real runtime, because the offload runtime's
 * correctness rests on them:
 *  - a stream runs its operations in order, one at a time; different streams
 *    run concurrently and in random order (a few simulated "GPU" threads,
 *    random latencies);
 *  - cudaEventRecord captures the stream's work queued so far;
 *    cudaStreamWaitEvent / cudaEventSynchronize / cudaEventQuery wait for
 *    (or test) the most recent record made before the call; an event never
 *    recorded counts as complete;
 *  - cudaMemcpyAsync / cudaMemsetAsync read and write memory when the
 *    stream gets to them, not when they are issued;
 *  - cudaEventElapsedTime fails on an event made with cudaEventDisableTiming,
 *    one never recorded, or one not yet complete;
 *  - cudaFree / cudaFreeHost wait for every stream to go idle;
 *  - the legacy default stream (stream 0, and the synchronous cudaMemcpy /
 *    cudaMemset): an operation there waits until every stream not made
 *    with cudaStreamNonBlocking is idle, then runs before the call returns
 *    (so an ASYNC operation on stream 0 is complete when its call returns:
 *    a host that reads its result without synchronising gets away with it
 *    here, not on a GPU); an event recorded there is complete when the
 *    call returns, a wait there waits on the host;
 *  - cudaMalloc'ed memory starts as 0xff bytes (NaN in bf16 and fp32), so a
 *    kernel that reads memory nobody wrote gives NaN, not a lucky zero;
 *  - errors are returned and remembered for cudaGetLastError;
 *  - a fault inside a kernel (only injected here: M6_EMU_FAULT_LAUNCH=N
 *    makes the N-th kernel launch of the process, counted from 1, fault
 *    instead of running) is sticky, as on a GPU: once its stream has got
 *    to it, cudaGetLastError and every synchronising call
 *    (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
 *    cudaMemcpy, cudaMemset) return cudaErrorIllegalAddress, so the error
 *    surfaces at whichever call comes next, not at the launch.
 * Checked beyond the real runtime (reported as errors): copy directions and
 * ranges against the allocations (a host-to-device copy must land inside one
 * cudaMalloc block and read from outside all of them), memset ranges, use of
 * a destroyed stream or event.
 */
#ifndef M6_MOCK_CUDA_RUNTIME_H
#define M6_MOCK_CUDA_RUNTIME_H

#include <stddef.h>

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorIllegalState = 401,
};
typedef struct mock_stream_ *cudaStream_t;
typedef struct mock_event_ *cudaEvent_t;
typedef struct mock_graph_ *cudaGraph_t;
typedef struct mock_graph_exec_ *cudaGraphExec_t;
typedef enum {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;
typedef enum {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
} cudaStreamCaptureStatus;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice, cudaMemcpyDefault
};
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventBlockingSync 0x1
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
};

/* $M6_EMU_DEVICES devices (default 1) through CUDA_VISIBLE_DEVICES, and a
 * current device per thread: mock_cuda.cpp's opening comment. */
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
/* Each device has 1 GiB ($M6_EMU_DEVICE_MIB; cudaGetDeviceProperties,
 * cudaMemGetInfo); past it cudaMalloc fails with
 * cudaErrorMemoryAllocation. */
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
#ifdef __cplusplus /* the real header's typed overloads */
template <class T>
static inline cudaError_t cudaMalloc(T **p, size_t n)
{
    return cudaMalloc((void **)p, n);
}
template <class T>
static inline cudaError_t cudaHostAlloc(T **p, size_t n, unsigned flags)
{
    return cudaHostAlloc((void **)p, n, flags);
}
template <class T>
static inline cudaError_t cudaMallocHost(T **p, size_t n)
{
    return cudaMallocHost((void **)p, n);
}
#endif

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                unsigned flags);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end);

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                       cudaMemcpyKind kind);
cudaError_t cudaMemset(void *dst, int value, size_t n);
cudaError_t cudaDeviceSynchronize(void);

/* Stream capture and CUDA graphs, as much as the mock keeps: the
 * copies, memsets and kernels queued on one capturing stream (not on the
 * legacy stream) become the graph, in their order; cudaGraphLaunch queues
 * them again on a stream, each kernel with the arguments it was captured
 * with, each copy between the same addresses (a pinned host buffer is
 * read or written at every launch, when the stream gets there). Refused
 * on a capturing stream (misuse): event records and waits (the real
 * runtime makes dependencies between captured streams of them),
 * synchronisation, and a mock_launch whose function frees its argument.
 * Nothing captured runs at capture time. cudaGraphDestroy and
 * cudaGraphExecDestroy of the last reference wait for every stream. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                  cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

/* ---- mock extensions, for the test driver */

/* Start the simulated GPU: gpu_threads threads; with max_delay_us > 0,
 * half the operations (drawn at random) may start only 0..max_delay_us-1
 * microseconds after they were queued, so that streams overtake each other
 * whatever the issue order. Stop it: waits for all queued work, then frees
 * streams and events. */
void mock_start(unsigned seed, int gpu_threads, int max_delay_us);
void mock_stop(void);
/* A "kernel": fn(arg) runs on a GPU thread in stream order. */
void mock_launch(cudaStream_t s, void (*fn)(void *), void *arg);
/* The same with fn leaving arg alone and drop(arg) freeing it after the
 * run, or, when captured into a graph, when the graph goes (so that the
 * graph can run fn(arg) at every launch). */
void mock_launch_kept(cudaStream_t s, void (*fn)(void *),
                      void (*drop)(void *), void *arg);
/* Misuses of the API found so far (each also printed as "MOCK: ..."). */
long mock_errors(void);
/* Whether [p, p + n) lies inside one cudaMalloc block of the calling
 * thread's current device (for cublasLt.h: a GEMM's kernels run there). */
int mock_is_device(const void *p, size_t n);
/* Report a misuse found outside this file (kernel emulation, cuBLASLt). */
void mock_misuse(const char *what);
/* A launch with a bad configuration: cudaErrorInvalidConfiguration for the
 * calling thread's next cudaGetLastError. */
void mock_bad_launch(void);
/* Counts a kernel launch; 1 when it is the one M6_EMU_FAULT_LAUNCH names:
 * the caller then queues mock_launch_fault instead of the kernel. */
int mock_launch_faults(void);
/* A kernel that faults: the sticky cudaErrorIllegalAddress once s gets to
 * it (see the top). */
void mock_launch_fault(cudaStream_t s);

#include "emu_kernel.h"

#endif /* M6_MOCK_CUDA_RUNTIME_H */
