/*
 * bench_ranks.h — the common start of a benchmark whose ranks are forked
 * processes meeting over Gloo through a file store (bench/allreduce,
 * bench/allreduce_hier).
 */
#ifndef M6_BENCH_RANKS_H
#define M6_BENCH_RANKS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
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

/* A forked rank's body: rank r of n, the file store in dir, the report
 * pipe's write end out_fd, the benchmark's arguments arg; returns the
 * process's exit status. */
typedef int (*bench_rank_fn)(int r, int n, const char *dir, int out_fd,
                             const void *arg);

/* bench_ranks_begin, then n processes forked (pids[0..n)), rank r running
 * fn (its random() seeded apart); the pipe's read end into *in. 0 when
 * all started; otherwise bench_ranks_begin's exit status. */
static inline int bench_ranks_fork(char *dir, int n, pid_t *pids, int *in,
                                   bench_rank_fn fn, const void *arg)
{
    int pfd[2];
    int rc = bench_ranks_begin(dir, pfd);
    if (rc != 0)
        return rc;
    for (int r = 0; r < n; r++)
        if ((pids[r] = fork()) == 0) {
            close(pfd[0]);
            srandom((unsigned)getpid());
            _exit(fn(r, n, dir, pfd[1], arg));
        }
    close(pfd[1]);
    *in = pfd[0];
    return 0;
}

/* Wait for the n forked ranks (pids) and remove dir. 0 when every rank
 * exited 0, else 1 ("a rank failed" printed). */
static inline int bench_ranks_end(const pid_t *pids, int n, const char *dir)
{
    int bad = 0;
    for (int k = 0; k < n; k++) {
        int status;
        waitpid(pids[k], &status, 0);
        bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    if (bad)
        fprintf(stderr, "a rank failed\n");
    return bad;
}

#endif /* M6_BENCH_RANKS_H */
