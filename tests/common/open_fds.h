/*
 * open_fds.h — how many file descriptors this process holds, counted in
 * /proc/self/fd: the oracle of the tests that check a path leaks none.
 * Include after cmocka.h.
 */
#ifndef M6_TESTS_OPEN_FDS_H
#define M6_TESTS_OPEN_FDS_H

#include <dirent.h>

/* Descriptors open now, not counting the one that reads the directory. */
static inline int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

#endif /* M6_TESTS_OPEN_FDS_H */
