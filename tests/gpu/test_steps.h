/*
 * test_steps.h — how many training steps the GPU model tests (test_model,
 * test_offload) run before the delink: 10 on a GPU; M6_TEST_STEPS=N (1 to
 * 10) runs N through the same code, as the CUDA emulation (tests/cuda_emu)
 * does, where every step costs seconds. C and CUDA C++.
 */
#ifndef M6_TESTS_GPU_TEST_STEPS_H
#define M6_TESTS_GPU_TEST_STEPS_H

#include <stdio.h>
#include <stdlib.h>

/* 10, or M6_TEST_STEPS when set; a value outside 1 to 10 exits 1 naming
 * prog. */
static inline int test_steps_before_delink(const char *prog)
{
    const char *steps = getenv("M6_TEST_STEPS");
    if (!steps)
        return 10;
    int n = atoi(steps);
    if (n < 1 || n > 10) {
        fprintf(stderr, "%s: M6_TEST_STEPS=%s: want 1 to 10\n", prog, steps);
        exit(1);
    }
    return n;
}

#endif /* M6_TESTS_GPU_TEST_STEPS_H */
