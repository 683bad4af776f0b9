/*
 * common.cuh — mock of kernels/cuda/common.cuh for tests/unit/offload_mock:
 * the host-side part that gpt_cuda_impl.cuh and gpt_cuda_offload.cu use
 * (bf16 as its 16 bits, ceil_div, the CUDA_CHECK macros), none of the
 * device helpers.
 *
 * Include order alone is not relied on to shadow the real header (a
 * "common.cuh" next to an including file is found before any -I; today
 * daemon/model/cuda/gpt_cuda_impl.cuh has none beside it, and finds this
 * folder's first). So every translation unit of the test includes this
 * file first; it
 * defines the real header's guard, M6_CUDA_COMMON_CUH, which turns the real
 * one into nothing. If the guard's name ever changes, the real header is
 * read again and stops the build at this folder's cuda_bf16.h, which says
 * why.
 */
#ifndef M6_MOCK_COMMON_CUH
#define M6_MOCK_COMMON_CUH

#ifdef M6_CUDA_COMMON_CUH
#error "offload_mock: the real kernels/cuda/common.cuh came first; include the mock common.cuh before gpt_cuda_impl.cuh"
#endif
#define M6_CUDA_COMMON_CUH

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "cuda_check.h"   /* the real one, on top of the mock runtime */

typedef uint16_t bf16;    /* bits of a bfloat16 (offload_host.h) */

static inline size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

#endif /* M6_MOCK_COMMON_CUH */
