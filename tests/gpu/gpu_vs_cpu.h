/*
 * gpu_vs_cpu.h — the harness of the GPU trainer tests that train the cuda
 * backend and the cpu engine from the same spec and compare them
 * (test_adafactor.c, test_masters.c): a run's end state, STEPS steps with
 * the delink at pseudo.steps, checkpoints into dir_, the update error.
 * Include after cuda_fixture.h and err_into.h; defines STEPS (from
 * STEPS_MAX 8; main sets it with fixture_gpu_steps) and dir_.
 */
#ifndef M6_TESTS_GPU_VS_CPU_H
#define M6_TESTS_GPU_VS_CPU_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "report.h"

/* 8 steps, the delink at 4; M6_TEST_STEPS=N (even, 4 to 8) runs N */
#define STEPS_MAX 8
static int STEPS = STEPS_MAX;

static char dir_[256];

/* A run's losses, state buffers (0 weights, 1 m, 2 v; n[i] floats) and
 * step counts. */
typedef struct {
    float loss[STEPS_MAX];
    float *buf[3];
    size_t n[3];
    long steps[64];
    int n_steps;
    size_t dev[2];      /* trainer_device_bytes: pseudo phase, real */
    size_t host;        /* offloading: the host bytes gpt_cuda holds at
                         * the end (trainer_offload_stats), else 0 */
    int n_offloaded;    /* ... and the slots it offloads */
} run_;

static void state_get_(trainer *t, run_ *r)
{
    for (int i = 0; i < 3; i++) {
        r->n[i] = trainer_copy_state(t, i, NULL);
        r->buf[i] = malloc((r->n[i] ? r->n[i] : 1) * sizeof(float));
        if (!r->buf[i]) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        if (r->n[i])
            trainer_copy_state(t, i, r->buf[i]);
    }
    r->n_steps = trainer_copy_adam_steps(t, r->steps);
}

static void run_free_(run_ *r)
{
    for (int i = 0; i < 3; i++)
        free(r->buf[i]);
}

/* The test's step 0: the cuda spec sb passes trainer_check_spec, with a
 * memory budget (offloading) too; `what` names it. */
static void spec_check_(run_spec sb, const char *what)
{
    char err[512], name[160];
    printf("0. the spec\n");
    int ok = ERR_INTO(err, trainer_check_spec(&sb, &err_)) == 0;
    sb.device.memory_budget = (size_t)64 << 20;
    ok = ok && ERR_INTO(err, trainer_check_spec(&sb, &err_)) == 0;
    if (!ok)
        printf("  trainer_check_spec: %s\n", err);
    snprintf(name, sizeof name, "%s on cuda accepted, with a memory budget "
             "too", what);
    check_true_(ok, name);
}

/* A device.memory_budget for s (no budget in it) that keeps one slot of
 * the real phase resident: the least budget of the planner plus one
 * slot. */
static size_t one_resident_(const run_spec *s)
{
    run_spec u = *s;
    char err[512];
    offload_plan p;
    u.device.memory_budget = 0;
    if (offload_plan_for_spec(&u, 0, &p, err, sizeof err) != 0) {
        fprintf(stderr, "offload_plan_for_spec: %s\n", err);
        exit(1);
    }
    size_t b = p.min_budget_bytes + p.slot_bytes;
    offload_plan_free(&p);
    return b;
}

/* A case's cuda spec sg made MoE (capacity factor 2, as case_pair_ makes
 * it) and offloaded (one_resident_'s budget, printed) as asked. */
static void case_spec_(run_spec *sg, int moe, int offload)
{
    if (moe)
        synth_cuda_moe(sg, 1, 2.0f);
    if (offload) {
        sg->device.memory_budget = one_resident_(sg);
        printf("   device.memory_budget %zu bytes\n",
               sg->device.memory_budget);
    }
}

/* Checkpoint `name` of trainer t written into dir_; exits 1 on an
 * error. */
static void save_(trainer *t, const char *name)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    if (ERR_INTO(err, trainer_save(t, path, &err_)) < 0) {
        fprintf(stderr, "trainer_save: %s\n", err);
        exit(1);
    }
}

/* STEPS steps of spec s from a fresh trainer, delinking at pseudo.steps;
 * the end state in *r, the initial weights in *w0 (malloc'd, *n0 floats)
 * when w0 is not NULL; the checkpoint `save` written at the end when not
 * NULL, and with mid `save` with "-mid" before the last step. Exits 1 on
 * an error. */
static void train_(const run_spec *s, run_ *r, float **w0, size_t *n0,
                   const char *save, int mid)
{
    char err[512], midname[128];
    trainer *t = fixture_create_or_exit(s);
    r->dev[0] = trainer_device_bytes(t);
    if (w0) {
        size_t n = *n0 = trainer_copy_state(t, 0, NULL);
        *w0 = malloc(n * sizeof(float));
        if (!*w0 || trainer_copy_state(t, 0, *w0) != n) {
            fprintf(stderr, "initial weights: out of memory\n");
            exit(1);
        }
    }
    while (trainer_step_count(t) < STEPS) {
        if (save && mid && trainer_step_count(t) == STEPS - 1) {
            snprintf(midname, sizeof midname, "%s-mid", save);
            save_(t, midname);
        }
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == s->pseudo.steps &&
            trainer_delink(t, err, sizeof err) != 0) {
            fprintf(stderr, "trainer_delink: %s\n", err);
            exit(1);
        }
        step_result st;
        if (ERR_INTO(err, trainer_step(t, &st, &err_)) != 0) {
            fprintf(stderr, "trainer_step: %s\n", err);
            exit(1);
        }
        r->loss[st.step - 1] = st.train_loss;
        printf("    %s step %2ld  loss %.6f  norm %.4f\n",
               s->device.backend == BACKEND_CUDA ? "cuda" : "cpu ", st.step,
               st.train_loss, st.grad_norm);
    }
    state_get_(t, r);
    r->dev[1] = trainer_device_bytes(t);
    offload_stats os;
    if (trainer_offload_stats(t, &os) == 0 && os.enabled) {
        r->host = os.host.in_use;
        r->n_offloaded = os.n_offloaded;
    }
    if (save)
        save_(t, save);
    trainer_free(t);
}

/* The initial weights w0 (n0 floats: the globals and the pseudo phase's
 * one slot) as the real phase lays them out (n floats): malloc'd. */
static float *w0_real_(const float *w0, size_t n0, size_t n, int L)
{
    size_t ss = (n - n0) / (size_t)(L - 1), ng = n0 - ss;
    float *w = malloc(n * sizeof(float));
    if (!w || ng + (size_t)L * ss != n) {
        fprintf(stderr, "weights: out of memory or not %d equal slots\n", L);
        exit(1);
    }
    memcpy(w, w0, ng * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(w + ng + (size_t)l * ss, w0 + ng, ss * sizeof(float));
    return w;
}

/* One case of a test: spec sg on cuda (MoE blocks, capacity factor 2,
 * when moe) and the same spec on the cpu engine (*sc), each trained from
 * a fresh trainer: the end states in *g and *c, the initial weights as the
 * real phase lays them out in *w0 (malloc'd), the pseudo phase's count in
 * *n0. gsave, csave: checkpoints of each run at the end (NULL none); mid:
 * gsave's "-mid" too (train_). */
static void case_pair_(run_spec *sg, int moe, run_spec *sc, run_ *g,
                       run_ *c, float **w0, size_t *n0, const char *gsave,
                       const char *csave, int mid)
{
    if (moe) /* capacity factor 2: few tokens dropped, so that a route
              * bf16 flips moves little */
        synth_cuda_moe(sg, 1, 2.0f);
    *sc = *sg;
    sc->device.backend = BACKEND_CPU;
    sc->device.memory_budget = 0; /* the reference: every slot resident */
    train_(sg, g, w0, n0, gsave, mid);
    float *w = w0_real_(*w0, *n0, g->n[0], sg->model.n_layer);
    free(*w0);
    *w0 = w;
    train_(sc, c, NULL, NULL, csave, mid);
}

/* Normalised L2 error of a's change from w0 against b's (n floats). */
static double update_nerr_(const float *a, const float *b, const float *w0,
                           size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double da = (double)a[i] - w0[i], db = (double)b[i] - w0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    if (!isfinite(num) || den == 0)
        return INFINITY;
    return sqrt(num / den);
}

/* The checkpoint `name` into a fresh trainer of spec s, then `steps`
 * steps (0 or 1; 1: from a checkpoint written before the last step of run
 * want, that step's loss bitwise want's): its state and step counts
 * bitwise want's. */
static void load_check_steps_(const run_spec *s, const char *name,
                              const run_ *want, const char *what, int steps)
{
    char err[512], path[512];
    snprintf(path, sizeof path, "%s/%s", dir_, name);
    trainer *t = fixture_create_or_exit(s);
    int ok = ERR_INTO(err, trainer_load(t, path, &err_)) == 0;
    if (!ok)
        printf("  trainer_load: %s\n", err);
    if (steps) {
        step_result st;
        memset(&st, 0, sizeof st);
        if (ok && ERR_INTO(err, trainer_step(t, &st, &err_)) != 0) {
            printf("  trainer_step: %s\n", err);
            ok = 0;
        }
        ok = ok && st.step == STEPS &&
             !memcmp(&st.train_loss, &want->loss[STEPS - 1], sizeof(float));
        printf("  resumed step %ld loss %.9g, uninterrupted %.9g\n", st.step,
               st.train_loss, want->loss[STEPS - 1]);
    }
    run_ got;
    memset(&got, 0, sizeof got);
    if (ok)
        state_get_(t, &got);
    for (int i = 0; ok && i < 3; i++)
        ok = got.n[i] == want->n[i] &&
             !memcmp(got.buf[i], want->buf[i], want->n[i] * sizeof(float));
    ok = ok && got.n_steps == want->n_steps &&
         !memcmp(got.steps, want->steps, (size_t)got.n_steps * sizeof(long));
    check_true_(ok, what);
    if (got.buf[0])
        run_free_(&got);
    trainer_free(t);
}

/* The checkpoint `name` loads into a fresh trainer of spec s with its
 * state bitwise want's. */
static void load_check_(const run_spec *s, const char *name,
                        const run_ *want, const char *what)
{
    load_check_steps_(s, name, want, what, 0);
}

/* An offloaded cuda run's checkpoints (spec sg, its cpu twin sc with no
 * budget): `name` (the end) into an offloaded cuda trainer and into a cpu
 * trainer (of sg's budget: the budget is in the spec hash) with the state
 * bitwise want's; `name`-mid (before the last step) resumed in an
 * offloaded cuda trainer, its last loss and the end state bitwise. */
static void offload_load_checks_(const run_spec *sg, const run_spec *sc,
                                 const char *name, const run_ *want)
{
    char mid[128];
    run_spec so = *sc;
    so.device.memory_budget = sg->device.memory_budget;
    snprintf(mid, sizeof mid, "%s-mid", name);
    load_check_(sg, name, want,
                "offloaded cuda checkpoint into offloaded cuda, state "
                "bitwise");
    load_check_(&so, name, want,
                "offloaded cuda checkpoint into cpu, state bitwise");
    load_check_steps_(sg, mid, want,
                      "offloaded cuda resumed before the last step: its "
                      "loss and the end state bitwise", 1);
}

/* The checks every case shares: cuda run g against cpu run c from weights
 * w0: losses within TOL_LOSS, the weights' change within TOL_UPDATE, the
 * moments (as many floats, within TOL_STATE), equal step counts. TOL_*
 * are the including test's. */
static void compare_runs_(const char *name, const run_ *g, const run_ *c,
                          const float *w0)
{
    char what[160];
    double maxd = 0;
    for (int i = 0; i < STEPS; i++) {
        double d = fabs((double)g->loss[i] - c->loss[i]);
        maxd = isfinite(d) && d <= maxd ? maxd : d;
    }
    snprintf(what, sizeof what, "%s: max |loss cuda - loss cpu|", name);
    check_(maxd <= TOL_LOSS, what, maxd, 0, TOL_LOSS);
    snprintf(what, sizeof what, "%s: weights' change, nerr", name);
    double e = g->n[0] == c->n[0] ? update_nerr_(g->buf[0], c->buf[0], w0,
                                                 g->n[0])
                                  : INFINITY;
    check_(e <= TOL_UPDATE, what, e, 0, TOL_UPDATE);
    static const char *buf_name[3] = {"", "first moment", "second moment"};
    for (int i = 1; i < 3; i++) {
        snprintf(what, sizeof what, "%s: %s floats", name, buf_name[i]);
        check_(g->n[i] == c->n[i], what, (double)g->n[i], (double)c->n[i], 0);
        if (g->n[i] != c->n[i] || g->n[i] == 0)
            continue;
        snprintf(what, sizeof what, "%s: %s, nerr", name, buf_name[i]);
        e = nerr_(g->buf[i], c->buf[i], g->n[i]);
        check_(e <= TOL_STATE, what, e, 0, TOL_STATE);
    }
    snprintf(what, sizeof what, "%s: step counts equal", name);
    check_true_(g->n_steps == c->n_steps &&
                    !memcmp(g->steps, c->steps,
                            (size_t)g->n_steps * sizeof(long)),
                what);
}


/* The cuda run g's device bytes in each phase against the planner's
 * prediction for spec s (offload_plan_for_spec: what gpt_cuda allocates,
 * cuBLASLt's workspace aside), and with offloading the real phase's host
 * bytes and offloaded slots. */
static void plan_check_(const run_spec *s, const run_ *g, const char *name)
{
    char err[512], what[160];
    offload_plan p;
    if (offload_plan_for_spec(s, 0, &p, err, sizeof err) != 0) {
        printf("  offload_plan_for_spec: %s\n", err);
        check_true_(0, "the planner plans the spec");
        return;
    }
    const offload_plan *ph[2] = {p.pseudo, &p};
    static const char *phase[2] = {"pseudo", "real"};
    for (int i = 0; i < 2; i++) {
        size_t want = ph[i] ? ph[i]->peak_device_bytes - ph[i]->workspace_bytes
                            : 0;
        snprintf(what, sizeof what, "%s: %s device bytes vs the plan", name,
                 phase[i]);
        check_(g->dev[i] == want, what, (double)g->dev[i], (double)want, 0);
    }
    if (p.n_offloaded > 0) {
        snprintf(what, sizeof what, "%s: real host bytes vs the plan", name);
        check_(g->host == p.host_bytes, what, (double)g->host,
               (double)p.host_bytes, 0);
        snprintf(what, sizeof what, "%s: slots offloaded vs the plan", name);
        check_(g->n_offloaded == p.n_offloaded, what, g->n_offloaded,
               p.n_offloaded, 0);
    }
    offload_plan_free(&p);
}

#endif /* M6_TESTS_GPU_VS_CPU_H */
