/*
 * self_exe.h — the path of the running test binary, for the tests that
 * start their ranks by executing themselves again (test_dp,
 * test_collectives).
 */
#ifndef M6_TEST_SELF_EXE_H
#define M6_TEST_SELF_EXE_H

#include <unistd.h>

/* /proc/self/exe resolved, in a static buffer; NULL when it cannot be
 * read. */
static inline const char *self_exe(void)
{
    static char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = 0;
    return exe;
}

#endif /* M6_TEST_SELF_EXE_H */
