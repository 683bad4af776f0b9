/*
 * test_nccl.c — the "nccl" engine of daemon/dist/collectives.h on GPUs,
 * bootstrapped through a file store (tests/common/file_store.h):
 *
 *   one GPU    world 1: all-reduce and broadcast of device buffers leave
 *              the values as they were (compared with the host copy),
 *              barrier returns; then a world of 2 with rank 1 never
 *              started: init fails within the timeout (M6_ECANCELLED)
 *   trainer    (CUDA builds) a device.backend "cuda" run given an NCCL
 *              group of world 1 gives bitwise the losses of the same run
 *              without one (the one-rank path is the one-node path)
 *   grads      (CUDA builds) the cuda backend's NCCL path on one GPU: a
 *              step's bf16 gradients into gpt_cuda_grads_f32's device
 *              buffer, summed in place over an NCCL world of 1, taken
 *              back (gpt_cuda_grads_f32_back): the gradient norm bitwise
 *              the one without the round trip (bf16 -> fp32 is exact, a
 *              one-rank sum the identity, fp32 -> bf16 of a bf16 value
 *              exact); and the host copy (gpt_cuda_get_grads_resident,
 *              the Gloo path) written back the same way. A trainer adopts
 *              an NCCL group (trainer_adopt_grad_group) and drops it with
 *              trainer_set_collectives(NULL). Two GPUs (the path with a
 *              real sum) have never run: no such machine.
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
#ifdef M6_HAVE_CUDA
#include <stdint.h>
#include "model/cuda/gpt_cuda.h"
#include "train/trainer.h"
#include "../common/cuda_fixture.h"

/* 5 steps of a small cuda spec, with group c or alone: losses in out. */
static int train_(const char *data, m6_coll *c, float *out)
{
    run_spec s = synth_cuda_spec(data, BACKEND_CUDA, 5, 0);
    s.model.n_layer = 2;
    s.model.seq_len = 32;
    s.train.batch_size = 4;
    s.train.eval_every = 0;
    s.train.eval_batches = 1;
    m6_err err = M6_ERR_NONE;
    trainer *t = trainer_create(&s, &err);
    if (!t || (c && trainer_set_collectives(t, c, &err) != 0)) {
        fprintf(stderr, "FAIL: trainer: %s\n", m6_err_msg(&err));
        return 1;
    }
    for (int i = 0; i < 5; i++) {
        step_result r;
        if (trainer_step(t, &r, &err) != 0) {
            fprintf(stderr, "FAIL: step %d: %s\n", i + 1, m6_err_msg(&err));
            return 1;
        }
        out[i] = r.train_loss;
    }
    trainer_free(t);
    return 0;
}
#endif

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
    /* the all-to-all to itself: a send and a receive in one group */
    float *d2;
    size_t nb = n * sizeof(float);
    cudaMalloc((void **)&d2, nb);
    cudaMemset(d2, 0, nb);
    if (m6_coll_alltoallv(c, d, &nb, d2, &nb, &err) != 0)
        FAIL("world 1 all-to-all: %s", m6_err_msg(&err));
    cudaMemcpy(g, d2, nb, cudaMemcpyDeviceToHost);
    if (memcmp(g, h, nb) != 0)
        FAIL("world 1: the all-to-all did not copy the values");
    cudaFree(d2);
    cudaFree(d);
    m6_coll_destroy(c);
    printf("world 1: ok\n");
#ifdef M6_HAVE_CUDA
    {
        char data[] = "/tmp/m6-nccl-data-XXXXXX";
        float alone[5], grouped[5];
        c = group_(dir, "trainer", 0, 1, 30000, &fs, &st, &err);
        if (!c || synth_shards(data, 40000) != 0)
            FAIL("trainer: setup: %s", m6_err_msg(&err));
        if (train_(data, NULL, alone) != 0 || train_(data, c, grouped) != 0)
            return 1;
        if (memcmp(alone, grouped, sizeof alone) != 0)
            FAIL("trainer: an NCCL world of 1 changed the losses");
        printf("trainer: NCCL world 1 = alone, bitwise (last loss %.6f)\n",
               (double)alone[4]);
        m6_coll_destroy(c);
        char rm[128];
        snprintf(rm, sizeof rm, "rm -rf '%s'", data);
        if (system(rm) != 0)
            FAIL("cannot remove %s", data);
    }
#endif
#ifdef M6_HAVE_CUDA
    {
        model_config cfg = {.vocab_size = 256, .n_layer = 2, .n_head = 2,
                            .n_embd = 64, .seq_len = 32};
        enum { B = 2, T = 32 };
        int32_t inp[B * T], tgt[B * T];
        for (int i = 0; i < B * T; i++) {
            inp[i] = (i * 37 + 11) % 256;
            tgt[i] = (i * 53 + 5) % 256;
        }
        gpt_cuda *gm = gpt_cuda_create(&cfg, 2, B);
        if (!gm || gpt_cuda_init_weights(gm, 7) != 0)
            FAIL("grads: cannot make the model");
        gpt_cuda_step_begin(gm, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1e30f);
        gpt_cuda_train_microbatch(gm, inp, tgt, B, 1.0f / (B * T), 1);
        float n0 = gpt_cuda_grad_norm(gm), n1, n2;
        size_t nf = 0;
        float *df = gpt_cuda_grads_f32(gm, &nf);
        c = group_(dir, "grads", 0, 1, 30000, &fs, &st, &err);
        if (!c || !df || nf == 0 ||
            m6_coll_allreduce_sum(c, df, nf, &err) != 0)
            FAIL("grads: all-reduce: %s", m6_err_msg(&err));
        gpt_cuda_grads_f32_back(gm);
        n1 = gpt_cuda_grad_norm(gm);
        gpt_cuda_info info;
        gpt_cuda_get_info(gm, &info);
        size_t nh = info.n_params_cpu; /* every slot resident */
        float *hg = malloc(nh * sizeof(float));
        if (!hg || gpt_cuda_get_grads_resident(gm, hg, nh) != 0 ||
            gpt_cuda_set_grads_resident(gm, hg, nh) != 0)
            FAIL("grads: the host copy");
        n2 = gpt_cuda_grad_norm(gm);
        free(hg);
        if (!(n0 > 0) || memcmp(&n0, &n1, sizeof n0) != 0 ||
            memcmp(&n0, &n2, sizeof n0) != 0)
            FAIL("grads: norm %.9g, after the device round trip %.9g, "
                 "after the host one %.9g", (double)n0, (double)n1,
                 (double)n2);
        gpt_cuda_free(gm);
        printf("grads: NCCL world 1 in place and the host copy keep the "
               "norm %.6f bitwise\n", (double)n0);
        run_spec s;
        spec_defaults(&s);
        s.device.backend = BACKEND_CUDA;
        s.model = cfg;
        char data[] = "/tmp/m6-nccl-data2-XXXXXX";
        if (synth_shards(data, 20000) != 0)
            FAIL("grads: data");
        synth_spec_data(&s, data);
        trainer *t = trainer_create(&s, &err);
        if (!t || trainer_adopt_grad_group(t, c, &err) != 0 ||
            trainer_set_collectives(t, NULL, &err) != 0)
            FAIL("grads: adopt: %s", m6_err_msg(&err));
        trainer_free(t); /* c went with the trainer's NULL group */
        char rm[128];
        snprintf(rm, sizeof rm, "rm -rf '%s'", data);
        if (system(rm) != 0)
            FAIL("cannot remove %s", data);
    }
#endif
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
