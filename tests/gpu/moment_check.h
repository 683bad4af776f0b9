/*
 * moment_check.h — the GPU model tests' per-tensor comparison of AdamW
 * first moments against the CPU model's (test_model, test_model_moe,
 * test_offload_moe). CUDA C++ or C; include after report.h, model/gpt.h
 * (within extern "C" in C++) and model/cuda/gpt_cuda.h.
 */
#ifndef M6_TESTS_GPU_MOMENT_CHECK_H
#define M6_TESTS_GPU_MOMENT_CHECK_H

#include <stdio.h>
#include <stdlib.h>


/* g's AdamW first moments (fetched in c's CPU layout; exits 1 when they
 * cannot be) against the CPU model c's c->m, tensor by tensor (the globals, then each slot's, dense or
 * MoE): a tensor passes when its nerr_ <= tol_dense, or <= tol_expert for
 * an MoE slot's expert tensors (SLOT_FC_W .. SLOT_FCPROJ_B). Prints a line
 * per failing tensor and one check_ line "when: worst first moment nerr
 * (tensor)", which fails (n_failed + 1) when any tensor failed. */
static inline void check_first_moments_(const gpt_model *c, gpt_cuda *g,
                                        const char *when, double tol_dense,
                                        double tol_expert)
{
    float *m = (float *)malloc(c->n_params * sizeof(float));
    gpt_cuda_synchronize(g);
    if (!m || gpt_cuda_get_state(g, 1, m, c->n_params) != 0) {
        fprintf(stderr, "%s: gpt_cuda_get_state of the first moments "
                "failed\n", when);
        exit(1);
    }
    double worst = 0;
    char name[128], worst_name[128] = "";
    int bad = 0;
    for (int s = -1; s < c->S; s++) {
        int nt = s < 0 ? (int)GLOB_NTENSORS : gpt_slot_ntensors_of(c, s);
        for (int i = 0; i < nt; i++) {
            const gpt_tensor *t = s < 0 ? &c->glob[i]
                                        : &gpt_slot_tensors(c, s)[i];
            size_t off = t->offset + (s < 0 ? 0 : c->n_global +
                                                      c->slot_off[s]);
            double e = nerr_(m + off, c->m + off, t->numel);
            double tol = s >= 0 && c->slot_moe[s] && i >= SLOT_FC_W &&
                                 i <= SLOT_FCPROJ_B
                             ? tol_expert : tol_dense;
            gpt_tensor_name(name, sizeof name, "", s, t);
            if (!(e <= tol)) {
                printf("  first moment of %-32s nerr %.3e (tol %.0e) "
                       "FAIL\n", name, e, tol);
                bad = 1;
            }
            if (!(e <= worst)) {
                worst = e;
                snprintf(worst_name, sizeof worst_name, "%s", name);
            }
        }
    }
    char what[200];
    snprintf(what, sizeof what, "%s: worst first moment nerr (%s)", when,
             worst_name);
    check_(!bad, what, worst, 0, tol_dense);
    free(m);
}

#endif /* M6_TESTS_GPU_MOMENT_CHECK_H */
