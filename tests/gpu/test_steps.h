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

#define TEST_STEPS_MAX 10  /* the steps before the delink on a GPU */

/* The test's steps before the delink: TEST_STEPS_MAX until main sets it
 * from test_steps_before_delink. */
static int STEPS = TEST_STEPS_MAX;

/* TEST_STEPS_MAX, or M6_TEST_STEPS when set; a value outside 1 to
 * TEST_STEPS_MAX exits 1 naming prog. */
static inline int test_steps_before_delink(const char *prog)
{
    const char *steps = getenv("M6_TEST_STEPS");
    if (!steps)
        return TEST_STEPS_MAX;
    int n = atoi(steps);
    if (n < 1 || n > TEST_STEPS_MAX) {
        fprintf(stderr, "%s: M6_TEST_STEPS=%s: want 1 to %d\n", prog, steps,
                TEST_STEPS_MAX);
        exit(1);
    }
    return n;
}

#endif /* M6_TESTS_GPU_TEST_STEPS_H */
