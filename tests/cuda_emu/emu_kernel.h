/*
 * emu_kernel.h — CUDA kernels on the CPU (tests/cuda_emu): what a .cu file
 * needs beyond the runtime API to compile as C++ with g++ and run here.
 * Included by this folder's cuda_runtime.h; the launch syntax itself,
 * kernel<<<grid, block, smem, stream>>>(args), is rewritten by cu2cpp.py
 * into ::emu::launch(kernel, grid, block, smem, stream)(args).
 *
 * Execution model (emu_kernel.cpp):
 *  - a launch is one operation on its stream (mock_cuda.cpp), so it is
 *    ordered against copies, events and other launches as on a GPU;
 *  - the blocks of a grid run one after the other, in a shuffled order
 *    (a kernel that needs one block to run before another fails); the
 *    threads of a block run as fibers on one OS thread, each until it
 *    reaches __syncthreads() or a warp shuffle, where it waits for the rest
 *    of its block (or warp);
 *  - __shared__ variables are `static thread_local`: one copy per OS thread,
 *    which runs one block at a time, so every block sees its own; arrays
 *    start each block as 0xff bytes (NaN), as a GPU's hold garbage
 *    (cu2cpp.py adds the shared_fresh call; a scalar __shared__ is not
 *    refilled);
 *  - the launch configuration's sizes are checked (block of 1..1024
 *    threads, z <= 64, grid y and z <= 65535, no empty grid): a bad one
 *    leaves cudaErrorInvalidConfiguration for cudaGetLastError; not
 *    checked: registers, shared memory size, __launch_bounds__ (ptxas
 *    -v on the real build says those);
 *  - misuse that a GPU would turn into a hang or garbage is reported (and
 *    counted by mock_errors()): a __syncthreads() not reached by every
 *    thread of the block still running, a shuffle with a lane that has
 *    exited or does not exist, a mask naming lanes past the end of the
 *    block, lanes of one warp at different numbers of shuffles. A
 *    __syncthreads() that some threads skip by returning is accepted, as
 *    Volta and later GPUs do; so are barriers at different call sites.
 * Not emulated: timing, races between threads of a block (a fiber runs
 * until it waits, so a missing __syncthreads() may go unnoticed), memory
 * spaces (a kernel may read host memory here), tensor-core instructions
 * other than mma.sync m16n8k16 bf16 (mma_m16n8k16_bf16 below), atomics, dynamic shared memory, shuffles with a partial mask (every lane
 * of the warp must take part: all of m6's kernels use full masks), local
 * arrays past ~60 KiB per thread (a fiber's stack is 64 KiB).
 */
#ifndef M6_EMU_KERNEL_H
#define M6_EMU_KERNEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
        : x(x_), y(y_), z(z_) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
/* initial-exec: the emulation links into executables only, and the
 * default TLS model of -fPIC code (meson's static libraries) calls
 * __tls_get_addr at every access, which AddressSanitizer intercepts */
#define EMU_TLS __attribute__((tls_model("initial-exec"))) thread_local
#define __shared__ static EMU_TLS
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define warpSize 32

namespace emu {

/* The running thread's coordinates (valid inside a kernel only). */
const uint3 &thread_idx(void);
const uint3 &block_idx(void);
const dim3 &block_dim(void);
const dim3 &grid_dim(void);
/* Fill a __shared__ array with 0xff bytes (NaN) if no thread of the
 * running block has reached its declaration yet (cu2cpp.py puts the call
 * after every __shared__ array declaration). */
void shared_fresh(void *p, size_t bytes);
/* __syncthreads(): wait for every thread of the block still running. */
void sync_block(void);
/* One warp-wide exchange: every lane of the calling warp publishes `bits`
 * and gets the bits published by lane `src_lane` of the same warp. Every
 * lane named in `mask` must exist and take part (a misuse otherwise). */
uint64_t warp_exchange(uint64_t bits, int src_lane, unsigned mask);
int lane_id(void);
/* PTX mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d as C and
 * D, warp-wide: every lane of a full warp calls it with its own registers,
 * laid out as the PTX ISA documents for m16n8k16 (kernels/cuda/
 * attention_mma.cuh spells it out), and gets its own 4 elements of
 * D = A B + C. The products are exact (bf16 x bf16 fits fp32), summed
 * with C in double and rounded to fp32 once, as a tensor core's wide dot
 * product (whose internal rounding the PTX ISA leaves open). A
 * warp of fewer than 32 threads is a misuse. Counts as a warp exchange. */
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]);

/* Queue a kernel on `stream`: `body` runs once per thread of the grid. */
void submit(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body);

template <class... P>
struct launcher {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    /* Arguments are converted and copied at the launch, as by CUDA. */
    template <class... A>
    void operator()(A &&...a) const
    {
        std::tuple<typename std::decay<P>::type...> args(
            std::forward<A>(a)...);
        void (*k)(P...) = kernel;
        submit(grid, block, smem, stream,
               [k, args]() { std::apply(k, args); });
    }
};

template <class... P>
launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block,
                      size_t smem = 0, cudaStream_t stream = 0)
{
    return launcher<P...>{kernel, grid, block, smem, stream};
}

} /* namespace emu */

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

static inline void __syncthreads(void)
{
    ::emu::sync_block();
}

template <class T>
static inline T emu_shfl_(T v, int src_lane, unsigned mask)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = ::emu::warp_exchange(bits, src_lane, mask);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask,
                                int width = 32)
{
    /* as the PTX shfl.bfly with c = ((32 - width) << 8) | 31: a lane past
     * the end of the caller's segment keeps its own value */
    int lane = ::emu::lane_id();
    int src = lane ^ lane_mask;
    if (src >= (lane / width + 1) * width)
        src = lane;
    return emu_shfl_(v, src, mask);
}

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32)
{
    int lane = ::emu::lane_id();
    return emu_shfl_(v, (lane / width) * width + (src_lane & (width - 1)),
                     mask);
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta,
                                 int width = 32)
{
    int lane = ::emu::lane_id();
    int src = lane + (int)delta;
    if (src / width != lane / width)
        src = lane;
    return emu_shfl_(v, src, mask);
}

/* Device math with no host function of the same name (glibc has __expf and
 * __logf). rsqrtf is exact here (the GPU's is within 2 ulp). */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x)
{
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

/* CUDA's integer min/max overloads take mixed types; so do these. */
template <class A, class B>
static inline typename std::common_type<A, B>::type min(A a, B b)
{
    return b < a ? b : a;
}
template <class A, class B>
static inline typename std::common_type<A, B>::type max(A a, B b)
{
    return a < b ? b : a;
}

#endif /* __cplusplus */
#endif /* M6_EMU_KERNEL_H */
