/*
 * gelu.c — GELU activation, tanh approximation (Hendrycks & Gimpel 2016),
 * CPU reference, elementwise:
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 * Since 1 + tanh(u) = 2 sigmoid(2u), with s = 1 / (1 + exp(-2u)):
 *   gelu(x)  = x s
 *   gelu'(x) = s + 2 x s (1 - s) du/dx,  1 - s = exp(-2u) s,  du/dx = sqrt(2/pi) (1 + 3*0.044715 x^2)
 * The same function, but one exp instead of tanh: exp_ vectorises, glibc's
 * tanhf is a ~17 ns scalar call that made GELU cost a third of a step.
 */
#include "kernels.h"
#include "cpu_math.h"

void gelu_forward(float *out, const float *inp, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        out[i] = gelu_(inp[i]);
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        dinp[i] += gelu_grad_(inp[i]) * dout[i];
}
