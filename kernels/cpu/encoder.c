/*
 * encoder.c — token + learned position embedding (GPT-2 input layer), CPU
 * reference. out[b,t,:] = wte[inp[b,t],:] + wpe[t,:].
 *
 * Backward scatters dout into the rows of dwte picked by the tokens. Two
 * positions with the same token hit the same row, so instead of atomics the
 * channels are cut into fixed blocks: each thread owns whole channel blocks
 * and walks every (b,t) in order. Each dwte/dwpe element is therefore summed
 * by exactly one thread in (b,t) order — bitwise identical for any number of
 * threads.
 */
#include "kernels.h"

/* channels per block in encoder_backward (a few cache lines per row) */
#define ENC_CBLOCK 64

void encoder_forward(float *out, const int32_t *inp, const float *wte,
                     const float *wpe, int B, int T, int C)
{
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        float *o = out + (size_t)bt * C;
        const float *we = wte + (size_t)inp[bt] * C;
        const float *pe = wpe + (size_t)t * C;
        for (int c = 0; c < C; c++)
            o[c] = we[c] + pe[c];
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout,
                      const int32_t *inp, int B, int T, int C)
{
    int nblk = (C + ENC_CBLOCK - 1) / ENC_CBLOCK;
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * ENC_CBLOCK;
        int c1 = c0 + ENC_CBLOCK < C ? c0 + ENC_CBLOCK : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)inp[b * T + t] * C;
                float *pe = dwpe + (size_t)t * C;
                for (int c = c0; c < c1; c++) {
                    we[c] += d[c];
                    pe[c] += d[c];
                }
            }
        }
    }
}
