/*
 * common.cuh — device helpers shared by the CUDA op files: bf16 <-> float,
 * warp and block reductions, launch-size arithmetic. Header-only; every
 * function is static so each .cu file gets its own copy.
 */
#ifndef M6_CUDA_COMMON_CUH
#define M6_CUDA_COMMON_CUH

#include <float.h>
#include <stdint.h>
#include <math.h>
#include "cuda_check.h"
#include "kernels_cuda.h"

static inline __host__ __device__ size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static __device__ __forceinline__ float ld(const bf16 x)
{
    return __bfloat162float(x);
}

static __device__ __forceinline__ bf16 st(float x)
{
    return __float2bfloat16_rn(x);
}

/* x += v for a bf16 element: fp32 add, one rounding. */
static __device__ __forceinline__ void add_bf16(bf16 *x, float v)
{
    *x = st(ld(*x) + v);
}

/* x += v (acc) or x = v (not acc: x not read), one rounding: the
 * backward ops and their *_first variants. */
static __device__ __forceinline__ void put_bf16(bf16 *x, float v, int acc)
{
    *x = st(acc ? ld(*x) + v : v);
}

/* 8 bf16 (16 bytes): one 128-bit load or store. The pointer must be
 * 16-byte aligned (an (N,C) row with C a multiple of 8, from an aligned
 * base). */
struct __align__(16) bf16x8 {
    bf16 v[8];
};

static __device__ __forceinline__ bf16x8 ld8(const bf16 *p)
{
    return *reinterpret_cast<const bf16x8 *>(p);
}

static __device__ __forceinline__ void st8(bf16 *p, const bf16x8 &x)
{
    *reinterpret_cast<bf16x8 *>(p) = x;
}

/* 1 when every pointer given is 16-byte aligned (NULL counts as aligned) */
static inline int aligned16(const void *a, const void *b = NULL,
                            const void *c = NULL)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every
 * thread gets the result. Contains __syncthreads: call from all threads. */
static __device__ float block_sum(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int nwarps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nwarps ? part[lane] : 0.0f;
    return warp_sum(v);
}

#endif /* M6_CUDA_COMMON_CUH */
