/*
 * chain_batch.h — the GPU tests' training data: batch k is Bt sequences of
 * a noisy affine token chain (x -> 7x + 3 mod V, 10% of steps random), so
 * a small model learns it and losses fall; inputs (Bt, T) and next-token
 * targets (Bt, T), int32. Deterministic in k.
 */
#ifndef M6_TESTS_GPU_CHAIN_BATCH_H
#define M6_TESTS_GPU_CHAIN_BATCH_H

#include <stdint.h>

static void chain_batch(int k, int Bt, int T, int V, int32_t *inp,
                        int32_t *tgt)
{
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1);
    for (int b = 0; b < Bt; b++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int x = (int)((s >> 33) % V);
        for (int t = 0; t <= T; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int next = (x * 7 + 3) % V;
            if ((s >> 33) % 10 == 0) /* 10% noise */
                next = (int)((s >> 40) % V);
            if (t < T)
                inp[b * T + t] = x;
            if (t > 0)
                tgt[b * T + t - 1] = x;
            x = next;
        }
    }
}

#endif /* M6_TESTS_GPU_CHAIN_BATCH_H */
