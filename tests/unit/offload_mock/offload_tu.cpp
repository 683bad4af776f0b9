/*
 * offload_tu.cpp — daemon/offload/cuda/gpt_cuda_offload.cu compiled as C++ on top
 * of the mock CUDA runtime (tests/unit/offload_mock). MIN_CHUNK is small so
 * that the test's small slots still split into several host jobs.
 */
#define MIN_CHUNK (1u << 10)
#include "common.cuh"             /* the mock: first (see there) */
#include "offload/cuda/gpt_cuda_offload.cu"

/* The host Adafactor job (optimizer.name adafactor) and bf16 masters are
 * not driven here: the mock's models keep AdamW's fp32-master state (g->af
 * and g->mbf 0), so these are never called; emu_gpu_adafactor and
 * emu_gpu_masters run those paths on the real kernels. */
#include <stdlib.h>
extern "C" int gpt_af_tensors(const model_config *, int, gpt_af_tensor *,
                              size_t *)
{
    abort();
}
extern "C" int adafactor_update_spans(const adafactor_span *, int,
                                      const adafactor_hparams *)
{
    abort();
}
/* nor bf16 masters (g->mbf 0): no key is asked */
uint64_t gpt_cuda_sr_key_(const gpt_cuda *, int, size_t)
{
    abort();
}
