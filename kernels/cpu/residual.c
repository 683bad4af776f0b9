/*
 * residual.c — residual connection, CPU reference. out = a + b; the gradient
 * of a sum flows unchanged into both branches.
 */
#include "kernels.h"

void residual_forward(float *out, const float *a, const float *b, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void residual_backward(float *da, float *db, const float *dout, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
