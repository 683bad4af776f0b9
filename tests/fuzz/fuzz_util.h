/*
 * fuzz_util.h — what the libFuzzer targets (tests/fuzz/fuzz_*.c) share:
 * their scratch directory, writing an input to a file for the readers that
 * take a path, and the rule that a refusal says why.
 */
#ifndef M6_TESTS_FUZZ_UTIL_H
#define M6_TESTS_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* The directory for the targets' files: $TMPDIR (run.sh gives each run its
 * own), else /tmp. */
static inline const char *fuzz_tmpdir(void)
{
    const char *tmp = getenv("TMPDIR");
    return tmp ? tmp : "/tmp";
}

/* The size bytes of data written to path (created or truncated): 0, or -1
 * when they could not all be written (the target then skips the input). */
static inline int fuzz_write_file(const char *path, const void *data,
                                  size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, size, f);
    return fclose(f) == 0 && w == size ? 0 : -1;
}

/* A reader that refused its input must say why: aborts (libFuzzer reports
 * the input as a crash), naming target, when err is empty. */
static inline void fuzz_refusal_says_why(const char *target, const char *err)
{
    if (!err[0]) {
        fprintf(stderr, "%s: refused without a message\n", target);
        abort();
    }
}

#endif /* M6_TESTS_FUZZ_UTIL_H */
