/*
 * offload_tu.cpp — daemon/offload/cuda/gpt_cuda_offload.cu compiled as C++ on top
 * of the mock CUDA runtime (tests/unit/offload_mock). MIN_CHUNK is small so
 * that the test's small slots still split into several host jobs.
 */
#define MIN_CHUNK (1u << 10)
#include "common.cuh"             /* the mock: first (see there) */
#include "offload/cuda/gpt_cuda_offload.cu"
