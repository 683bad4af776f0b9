/*
 * gelu.c — GELU activation, tanh approximation (Hendrycks & Gimpel 2016):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
 * CPU reference, elementwise.
 */
#include <math.h>
#include "kernels.h"

#define GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

void gelu_forward(float *out, const float *inp, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] += grad * dout[i];
    }
}
