/*
 * test_masters.c — optimizer.master "bf16" on device.backend "cuda": the
 * bf16 params are the master weights (no fp32 copy on the device), AdamW
 * rounds each update stochastically with the CPU engine's rule and keys
 * (kernels/sround.h; kernels/cuda/adamw.cu through daemon/model/cuda),
 * against the same run on the CPU engine's bf16 masters (kernels/cpu/
 * adamw.c, itself tested in tests/unit/test_masters.c): same spec, same
 * initial weights, same batches. Exit 0 passed, 1 failed, 77 no CUDA
 * device.
 *
 * Each case trains STEPS steps of the trainer tests' small model
 * (tests/common/cuda_fixture.h: 3 layers, one shared slot delinked at
 * STEPS/2, global-norm clipping at 1; V 300, so that the device's wte has
 * padded rows) on both backends and checks:
 *   - every step's loss within TOL_LOSS;
 *   - the weights' change since the start (the whole flat layout) within
 *     TOL_UPDATE (normalised L2 error of the GPU's change against the
 *     CPU's), and the optimizer's moments within TOL_STATE;
 *   - every weight of the GPU run a bf16 value, and the step counts equal;
 *   - the device bytes of each phase (trainer_device_bytes: what gpt_cuda
 *     allocated) equal to the planner's prediction (model_param_bytes_for:
 *     2 bytes of weights per parameter with bf16 masters), and less than
 *     an fp32-master run's by 4 bytes per device parameter at least.
 * Cases: A delink.optimizer copy; C as A with Adafactor (no first
 * moment; kernels/cuda/adafactor.cu rounds as the CPU's
 * adafactor_update_spans); D as A on MoE blocks (the experts' and gates'
 * tensors keyed by their places in the MoE slot); B reset, saved at the
 * end: the
 * checkpoint loads into a fresh cuda trainer and into a cpu trainer with
 * weights (BF16 in the file), moments and step counts bitwise the GPU's;
 * a checkpoint of the cpu run loads into a cuda trainer bitwise too; the
 * checkpoint written before the last step, resumed in a fresh cuda
 * trainer, gives that step's loss and the end state bitwise.
 * (The op itself against the CPU op, bit for bit, and updates below
 * bf16's resolution moving the mean: tests/gpu/test_ops.cu.)
 * E, F and G offloaded (a device.memory_budget that keeps one slot of the
 * real phase resident: host updates of the other two's pinned bf16
 * copies, which are their masters, rounded with the same keys), E as A,
 * F as D, G as C:
 * the same checks against the resident cpu run, the device and host bytes
 * against the planner's, E's host bytes at least a fifth below an
 * fp32-master offloaded run's; E saves before its last step and at the
 * end: the end checkpoint loads bitwise into offloaded cuda and into cpu,
 * and the earlier one resumes with the last step's loss bitwise.
 * The spec with a memory budget passes the trainer's check.
 *
 * Tolerances (tests/gpu/test_trainer.c's, for the same reasons):
 *  TOL_LOSS 5e-2 nats: bf16 activations and gradients on the GPU against
 *    fp32 on the CPU; AdamW normalises each gradient, so bf16 error in
 *    small gradients moves weights by up to lr per step.
 *  TOL_UPDATE 1e-1: test_adafactor's 5e-2 for the bf16 gradients, plus
 *    the rounding: both runs round stochastically with the same bits, but
 *    where the fp32 values before rounding differ (the gradients do) a
 *    decision may differ by one bf16 ulp (2^-8 relative), which at lr
 *    1e-3 over a few steps is of the order of the change itself for a
 *    few weights.
 *  TOL_STATE 5e-2: test_model.cu's TOL_GRAD, the moments are averages of
 *    the gradient and of its square.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#include "model/cuda/gpt_cuda.h"
#include "offload/offload.h"
#include "train/trainer.h"
#include "../common/cuda_fixture.h"
#include "../common/err_into.h"

#define TOL_LOSS 5e-2
#define TOL_UPDATE 1e-1
#define TOL_STATE 5e-2
#define NCASES 7

#include "gpu_vs_cpu.h"

static run_spec spec_(backend_kind backend, delink_optimizer dopt,
                      int adafactor)
{
    run_spec s = synth_cuda_spec(dir_, backend, STEPS, STEPS / 2);
    s.model.vocab_size = 300; /* the device's wte has padded rows */
    synth_cuda_batch(&s, 4, 2, 2, 0);
    s.train.grad_clip = 1.0f;
    s.optimizer.master = MASTER_BF16;
    s.delink.optimizer = dopt;
    if (adafactor) /* without a first moment, clipping at d = 1 */
        s.optimizer.name = OPTIMIZER_ADAFACTOR;
    return s;
}

/* The checkpoint `name` (written before the last step of run want) into
 * a fresh trainer of spec s, one step: the loss and the end state bitwise
 * want's (the stochastic rounding's bits come from the step counts in the
 * checkpoint, so a resumed run rounds as the uninterrupted one). */
static void resume_check_(const run_spec *s, const char *name,
                          const run_ *want, const char *what)
{
    load_check_steps_(s, name, want, what, 1);
}

/* x is a bf16 value: its low 16 bits zero (checked by hand, not by the
 * code under test's conversion). */
static int is_bf16_(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0xffffu) == 0;
}

/* The checks of one case: cuda run g against cpu run c from weights w0:
 * the shared ones, and the cuda weights bf16 values that moved. */
static void compare_(const char *name, const run_ *g, const run_ *c,
                     const float *w0)
{
    char what[160];
    compare_runs_(name, g, c, w0);
    size_t not_bf16 = 0, moved = 0;
    for (size_t i = 0; i < g->n[0]; i++) {
        not_bf16 += !is_bf16_(g->buf[0][i]);
        moved += g->buf[0][i] != w0[i];
    }
    snprintf(what, sizeof what, "%s: cuda weights not bf16 values", name);
    check_(not_bf16 == 0, what, (double)not_bf16, 0, 0);
    snprintf(what, sizeof what, "%s: cuda weights that moved", name);
    check_(moved > g->n[0] / 2, what, (double)moved, (double)(g->n[0] / 2),
           0);
}

/* An offloaded cuda run g: its device and host bytes and offloaded slots
 * against the planner's (plan_check_), 2 slots of 3 offloaded in the real
 * phase, and (f not NULL) its host bytes against fp32-master run f's: an offloaded
 * slot keeps no fp32 master, 4 bytes a parameter less (model_param_bytes_
 * for), at least a fifth of f's (AdamW: 20 bytes a parameter, 16 without
 * the master; Adafactor's slots are smaller, so saved more than a fifth). */
static void host_bytes_check_(const run_spec *s, const run_ *g,
                              const run_ *f, const char *name)
{
    char what[160];
    plan_check_(s, g, name);
    snprintf(what, sizeof what, "%s: real phase slots offloaded", name);
    check_(g->n_offloaded == 2, what, g->n_offloaded, 2, 0);
    if (!f)
        return;
    snprintf(what, sizeof what, "%s: host bytes saved vs fp32 masters", name);
    double saved = (double)f->host - (double)g->host;
    check_(f->n_offloaded == 2 && saved >= (double)f->host / 5.0, what,
           saved, (double)f->host / 5.0, 0);
}

/* The cuda run g's device bytes in each phase against the planner's
 * prediction for spec s, and against fp32-master run f's: smaller by 4
 * bytes per parameter of the device block at least (n[i] parameters in
 * phase i: the state's floats). */
static void bytes_check_(const run_spec *s, const run_ *g, const run_ *f,
                         const size_t n[2], const char *name)
{
    char what[160];
    static const char *phase[2] = {"pseudo", "real"};
    plan_check_(s, g, name);
    for (int i = 0; i < 2; i++) {
        snprintf(what, sizeof what, "%s: %s bytes saved vs fp32 masters",
                 name, phase[i]);
        double saved = (double)f->dev[i] - (double)g->dev[i];
        check_(saved >= 4.0 * (double)n[i], what, saved, 4.0 * (double)n[i],
               0);
    }
}


int main(void)
{
    STEPS = fixture_gpu_steps("test_masters", 4, STEPS_MAX);
    if (synth_shards_tmp(dir_, sizeof dir_, "test_masters", 40000) != 0)
        return 1;
    spec_check_(spec_(BACKEND_CUDA, DELINK_OPT_COPY, 0), "bf16 masters");

    static const struct {
        const char *name;
        delink_optimizer dopt;
        int adafactor, moe, offload;
    } cases[NCASES] = {
        {"A copy", DELINK_OPT_COPY, 0, 0, 0},
        {"B reset", DELINK_OPT_RESET, 0, 0, 0},
        {"C adafactor", DELINK_OPT_COPY, 1, 0, 0},
        {"D MoE", DELINK_OPT_COPY, 0, 1, 0},
        {"E offloaded", DELINK_OPT_COPY, 0, 0, 1},
        {"F offloaded MoE", DELINK_OPT_COPY, 0, 1, 1},
        {"G offloaded adafactor", DELINK_OPT_COPY, 1, 0, 1},
    };
    run_ g[NCASES], c[NCASES];
    float *w0[NCASES];
    for (int k = 0; k < NCASES; k++) {
        printf("%d. %s: %d steps, delink at %d\n", k + 1, cases[k].name,
               STEPS, STEPS / 2);
        run_spec sg = spec_(BACKEND_CUDA, cases[k].dopt, cases[k].adafactor);
        case_spec_(&sg, cases[k].moe, cases[k].offload);
        run_spec sc;
        size_t n0;
        const char *gsave = k == 1 ? "cuda-b" : k == 4 ? "cuda-e" : NULL;
        case_pair_(&sg, cases[k].moe, &sc, &g[k], &c[k], &w0[k], &n0, gsave,
                   k == 1 ? "cpu-b" : NULL, 1);
        compare_(cases[k].name, &g[k], &c[k], w0[k]);
        if (k == 5 || k == 6) /* bytes against the plan (E measures the
                               * saving against fp32 masters' run) */
            host_bytes_check_(&sg, &g[k], NULL, cases[k].name);
        else if (k != 1) { /* the bytes against the plan and fp32 masters' */
            run_spec sf = sg;
            sf.optimizer.master = MASTER_FP32;
            if (cases[k].offload) /* its own budget: bigger slots */
                sf.device.memory_budget = one_resident_(&sf);
            run_ f;
            train_(&sf, &f, NULL, NULL, NULL, 0);
            size_t n[2] = {n0, g[k].n[0]};
            if (cases[k].offload)
                host_bytes_check_(&sg, &g[k], &f, cases[k].name);
            else
                bytes_check_(&sg, &g[k], &f, n, cases[k].name);
            run_free_(&f);
        }
        if (k == 4)
            offload_load_checks_(&sg, &sc, "cuda-e", &g[k]);
        if (k == 1) {
            load_check_(&sg, "cuda-b", &g[k],
                        "B: cuda checkpoint into cuda, state bitwise");
            load_check_(&sc, "cuda-b", &g[k],
                        "B: cuda checkpoint into cpu, state bitwise");
            load_check_(&sg, "cpu-b", &c[k],
                        "B: cpu checkpoint into cuda, state bitwise");
            resume_check_(&sg, "cuda-b-mid", &g[k],
                          "B: cuda resumed before the last step: its loss "
                          "and state bitwise");
        }
    }
    for (int k = 0; k < NCASES; k++) {
        run_free_(&g[k]);
        run_free_(&c[k]);
        free(w0[k]);
    }
    printf("test_masters: %s (%d failed)\n", n_failed ? "FAIL" : "ok",
           n_failed);
    return n_failed ? 1 : 0;
}
