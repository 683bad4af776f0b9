/*
 * gpt_internal.h — what model/gpt.c (storage, forward, backward, delink)
 * and model/gpt_optim.c (optimizer steps, ZeRO-1 shards) share about a
 * gpt_model's storage. Private to daemon/model/: nothing else includes it.
 */
#ifndef M6_MODEL_GPT_INTERNAL_H
#define M6_MODEL_GPT_INTERNAL_H

#include <stddef.h>
#include <string.h>

#include "model/gpt.h"

/* floats: every region starts 64-byte aligned */
#define GPT_PAD_FLOATS 16

/* n rounded up to a whole number of GPT_PAD_FLOATS */
static inline size_t gpt_pad_floats(size_t n)
{
    return (n + GPT_PAD_FLOATS - 1) / GPT_PAD_FLOATS * GPT_PAD_FLOATS;
}

/* memcpy of n floats; src or dst may be NULL when n is 0 */
static inline void gpt_copy_floats(float *dst, const float *src, size_t n)
{
    if (n)
        memcpy(dst, src, n * sizeof(float));
}

/* n zeroed floats, 64-byte aligned (free()); NULL when out of memory.
 * From 4 MiB up, 2 MiB aligned and offered transparent huge pages
 * (madvise MADV_HUGEPAGE: taken where the system's THP policy is
 * "madvise" or "always", ignored under "never"): the weights, gradients,
 * moments and activations. With 4 KiB pages bench/cpu_train's model
 * (10.7M parameters) faulted 57,000 times to start, 4,600 with them, and
 * its start took about 0.4 s less CPU; steps as fast (bench/RESULTS.md). */
float *gpt_alloc_floats(size_t n);

/* Floats of v for the whole model: AdamW's the parameters', Adafactor's
 * the af layout's (the globals', then each slot's of its kind). */
size_t gpt_v_floats_total(const gpt_model *g);

/* Clear slot s's weight-matrix gradients if the zero_grad marked them
 * (dw_fresh) instead of clearing them. */
void gpt_settle_slot(const gpt_model *g, int s);

#endif
