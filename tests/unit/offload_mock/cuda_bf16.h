/*
 * cuda_bf16.h — tripwire for tests/unit/offload_mock: only the real
 * kernels/cuda/common.cuh and kernels_cuda.h include it. Reaching it means
 * the mock common.cuh no longer stands in for the real one (see there).
 */
#error "offload_mock: the real kernels/cuda/common.cuh (or kernels_cuda.h) was included; include the mock common.cuh first and keep its guard name M6_CUDA_COMMON_CUH equal to the real header's"
