/*
 * delink_check.h — the GPU model tests' check that a delink keeps the
 * model (test_model, test_model_moe): every layer given a slot of its own,
 * a copy of the slot it shared, the loss on the same batch is unchanged.
 * CUDA C++; include after report.h and model/cuda/gpt_cuda.h.
 */
#ifndef M6_TESTS_GPU_DELINK_CHECK_H
#define M6_TESTS_GPU_DELINK_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Delink every layer of g (L layers) to a slot of its own: slot_of[l] = l,
 * a copy of the slot it shared (src_of[l], g's share map before); both
 * maps (L ints) are left filled so that the caller can delink its CPU
 * model alike. The loss of g on inp/tgt (B sequences) after the delink
 * against before it is one check line within tol. Exits 1 when the
 * reslot fails. */
static inline void delink_check_(gpt_cuda *g, int L, int *slot_of,
                                 int *src_of, const int32_t *inp,
                                 const int32_t *tgt, int B, double tol)
{
    float before = gpt_cuda_forward(g, inp, tgt, B);
    for (int l = 0; l < L; l++) {
        slot_of[l] = l;
        src_of[l] = gpt_cuda_slot_of(g)[l];
    }
    if (gpt_cuda_reslot(g, L, slot_of, src_of, 0) != 0) {
        printf("  reslot failed\n");
        exit(1);
    }
    float after = gpt_cuda_forward(g, inp, tgt, B);
    check_(fabs(after - before) <= tol,
           "delink: loss on batch 0 after vs before", after, before, tol);
}

#endif /* M6_TESTS_GPU_DELINK_CHECK_H */
