/*
 * adamw_hparams.h — the AdamW settings the GPU model tests (test_model,
 * test_model_moe, test_offload, test_offload_moe) train both the GPU model
 * and its CPU reference with: lr, beta1, beta2, eps, weight decay and the
 * gradient-norm clip. C and CUDA C++.
 */
#ifndef M6_TESTS_GPU_ADAMW_HPARAMS_H
#define M6_TESTS_GPU_ADAMW_HPARAMS_H

static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f;
static const float WD = 0.1f, CLIP = 1.0f;

#endif /* M6_TESTS_GPU_ADAMW_HPARAMS_H */
