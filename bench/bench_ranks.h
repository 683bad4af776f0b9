/*
 * bench_ranks.h — the common start of a benchmark whose ranks are forked
 * processes meeting over Gloo through a file store (bench/allreduce,
 * bench/allreduce_hier).
 */
#ifndef M6_BENCH_RANKS_H
#define M6_BENCH_RANKS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dist/collectives.h"

/* Check for Gloo, make the file store's directory (dir: a mkdtemp
 * template, e.g. "/tmp/m6-bench-XXXXXX", rewritten in place) and the pipe
 * the ranks report through (pfd). 0 when all is ready; otherwise the
 * exit status, the reason printed: 77 (SKIP) without Gloo, 1 when the
 * directory or the pipe cannot be made. */
static inline int bench_ranks_begin(char *dir, int pfd[2])
{
    if (!m6_coll_available("gloo")) {
        printf("SKIP: m6 was built without Gloo\n");
        return 77;
    }
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    if (pipe(pfd) != 0) {
        perror("pipe");
        return 1;
    }
    return 0;
}

#endif /* M6_BENCH_RANKS_H */
