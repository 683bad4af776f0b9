/*
 * test_nccl.c — the "nccl" engine of daemon/dist/collectives.h on GPUs,
 * bootstrapped through a file store (tests/common/file_store.h):
 *
 *   one GPU    world 1: all-reduce and broadcast of device buffers leave
 *              the values as they were (compared with the host copy),
 *              barrier returns; then a world of 2 with rank 1 never
 *              started: init fails within the timeout (M6_ECANCELLED)
 *   two GPUs   world 2 as two processes on devices 0 and 1: the sums of
 *              small integers, exact in fp32, against the hand-computed
 *              values; broadcast from rank 1
 *
 * Skips (77) without a CUDA device, and the two-GPU part says it is
 * skipped on a machine with one. Built where nccl.h is (meson option nccl).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "dist/collectives.h"
#include "../common/file_store.h"

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); \
    fputc('\n', stderr); return 1; } while (0)

static m6_coll *group_(const char *dir, const char *prefix, int rank,
                       int world, int timeout_ms, file_store *fs,
                       m6_store *st, m6_err *err)
{
    snprintf(fs->dir, sizeof fs->dir, "%s", dir);
    *st = file_store_table(fs);
    m6_coll_config cfg = {"nccl", rank, world, st, prefix, timeout_ms, NULL,
                          rank};
    return m6_coll_init(&cfg, err);
}

/* rank r of world w: x[i] = (r+1)*(i%100 - 50) summed, exact */
static int sums_(const char *dir, int rank, int world)
{
    file_store fs;
    m6_store st;
    m6_err err = M6_ERR_NONE;
    m6_coll *c = group_(dir, "two", rank, world, 60000, &fs, &st, &err);
    if (!c)
        FAIL("rank %d: init: %s", rank, m6_err_msg(&err));
    size_t n = 1000003;
    float *h = malloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(rank + 1) * (float)((long)(i % 100) - 50);
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if (m6_coll_allreduce_sum(c, d, n, &err) != 0)
        FAIL("rank %d: all-reduce: %s", rank, m6_err_msg(&err));
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    float tri = (float)(world * (world + 1) / 2);
    for (size_t i = 0; i < n; i++)
        if (h[i] != tri * (float)((long)(i % 100) - 50))
            FAIL("rank %d: x[%zu] = %g", rank, i, (double)h[i]);
    for (size_t i = 0; i < n; i++)
        h[i] = rank == 1 ? (float)i : -1.0f;
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if (m6_coll_broadcast(c, d, n * sizeof(float), 1, &err) != 0 ||
        m6_coll_barrier(c, &err) != 0)
        FAIL("rank %d: broadcast/barrier: %s", rank, m6_err_msg(&err));
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++)
        if (h[i] != (float)i)
            FAIL("rank %d: broadcast x[%zu] = %g", rank, i, (double)h[i]);
    cudaFree(d);
    free(h);
    m6_coll_destroy(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "rank") == 0)
        return sums_(argv[2], atoi(argv[3]), 2);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 77;
    }
    char dir[] = "/tmp/m6-nccl-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    file_store fs;
    m6_store st;
    m6_err err = M6_ERR_NONE;
    /* world 1 */
    m6_coll *c = group_(dir, "one", 0, 1, 30000, &fs, &st, &err);
    if (!c)
        FAIL("world 1 init: %s", m6_err_msg(&err));
    if (!m6_coll_device_buffers(c) || strcmp(m6_coll_backend(c), "nccl"))
        FAIL("nccl group: wrong backend facts");
    size_t n = 4099;
    float *h = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i * 0.25f - 7.0f;
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if (m6_coll_allreduce_sum(c, d, n, &err) != 0 ||
        m6_coll_broadcast(c, d, n * sizeof(float), 0, &err) != 0 ||
        m6_coll_barrier(c, &err) != 0)
        FAIL("world 1: %s", m6_err_msg(&err));
    cudaMemcpy(g, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    if (memcmp(g, h, n * sizeof(float)) != 0)
        FAIL("world 1: all-reduce changed the values");
    cudaFree(d);
    m6_coll_destroy(c);
    printf("world 1: ok\n");
    /* rank 1 of 2 never starts */
    double t0 = file_store_now_();
    c = group_(dir, "missing", 0, 2, 3000, &fs, &st, &err);
    double dt = file_store_now_() - t0;
    if (c)
        FAIL("init of 2 ranks succeeded with one");
    printf("missing rank: init failed after %.2f s: %s\n", dt,
           m6_err_msg(&err));
    if (err.code != M6_ECANCELLED || dt > 3.0 + 10.0)
        FAIL("missing rank: code %d after %.2f s (timeout 3 s)", err.code,
             dt);
    /* two GPUs */
    if (ndev < 2) {
        printf("two GPUs: skipped, this machine has %d (the multi-GPU path "
               "is untested here)\n", ndev);
    } else {
        pid_t p[2];
        for (int r = 0; r < 2; r++)
            if ((p[r] = fork()) == 0) {
                char rs[8];
                snprintf(rs, sizeof rs, "%d", r);
                execl("/proc/self/exe", argv[0], "rank", dir, rs,
                      (char *)NULL);
                _exit(127);
            }
        int bad = 0;
        for (int r = 0; r < 2; r++) {
            int status;
            waitpid(p[r], &status, 0);
            bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        if (bad)
            FAIL("two GPUs: a rank failed");
        printf("two GPUs: ok\n");
    }
    free(h);
    free(g);
    m6_err_free(&err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
