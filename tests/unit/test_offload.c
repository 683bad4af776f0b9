/*
 * test_offload.c — granular offloading at run time: training with
 * offloaded slots against the same training fully resident (bitwise, where
 * the method promises it), across delink, gradient accumulation and
 * save/resume; the preflight errors (budget, pinning, host memory); the
 * scheduler's bytes moved against the plan; share maps; the pools. The
 * planner's byte counts are tested in test_offload_plan.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gpt.h"
#include "offload/offload.h"
#include "offload/test_hooks.h"
#include "train/data.h"
#include "train/trainer.h"
#define FIXTURE_NAME "offload"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

/* ---------------------------------------------------------- data */

/* 6 layers so that "most slots offloaded" means 5 of 6. */
static run_spec spec6_(long steps, long pseudo_steps)
{
    run_spec s = synth_tiny_spec(tmpdir_, 6, steps, pseudo_steps);
    s.pseudo.share_groups = 2;
    s.offload.prefetch = 2;
    s.offload.host_threads = 2;
    s.device.threads = 1; /* CPUs here are shared: OpenMP barriers that spin
                           * against the copy and host threads only slow
                           * the test; results do not depend on it */
    return s;
}

/* ---------------------------------------------------------- 1. bitwise */

/* 50 steps with delink at 20: a budget that keeps 1 of 6 Real slots on the
 * device gives the same losses and final weights, bit for bit, as the run
 * with no budget; the device pool never goes past the budget. Run with
 * clipping (host AdamW after the global norm) and without (host AdamW as
 * soon as each offloaded gradient is final). */
static void check_offload_bitwise_(float clip)
{
    run_spec plain = spec6_(50, 20);
    plain.train.grad_clip = clip;
    run_spec off = plain;
    off.device.memory_budget = fixture_budget_for(&plain, 1);

    float a[50];
    trainer *ta, *tb;
    fixture_train_same(&plain, &off, 50, a, &ta, &tb);
    assert_true(a[49] < a[0]);

    offload_stats st;
    assert_int_equal(trainer_offload_stats(ta, &st), -1);
    assert_int_equal(st.n_resident, 6);
    assert_int_equal(trainer_offload_stats(tb, &st), 0);
    assert_int_equal(st.n_slots, 6);
    assert_int_equal(st.n_resident, 1);
    assert_int_equal(st.n_offloaded, 5);
    assert_int_equal(st.device.capacity, off.device.memory_budget);
    assert_true(st.device.peak <= off.device.memory_budget);
    /* the planned peak is exactly what the pool saw (Real > Pseudo) */
    assert_int_equal(st.device.peak, st.predicted_peak_bytes);
    assert_true(st.h2d_bytes > 0 && st.d2h_bytes > 0);
    assert_true(st.hidden_fraction >= 0 && st.hidden_fraction <= 1);
    assert_true(st.host.in_use > 0);
    trainer_free(ta);
    trainer_free(tb);
}

static void test_offload_bitwise_50_steps_with_delink(void **state)
{
    (void)state;
    check_offload_bitwise_(1.0f);
}

static void test_offload_bitwise_no_clip(void **state)
{
    (void)state;
    check_offload_bitwise_(0.0f);
}

/* 20 steps with the delink at 8 of a model with MoE in every `every`-th
 * block (E = 4 in k = 2 prototypes, synth_tiny_moe), with a budget that
 * keeps 1 Real slot resident, give the resident run's losses and final
 * weights and moments bit for bit, and the pool's peak stays within the
 * budget; in device.precision prec; the 20 losses into losses (NULL: not
 * kept), the offloaded run's statistics into *st. */
static void moe_bitwise_(int every, precision_kind prec, float *losses,
                         offload_stats *st)
{
    run_spec plain = spec6_(20, 8);
    synth_tiny_moe(&plain.model, every, 32, 1.0f);
    plain.device.precision = prec;
    run_spec off = plain;
    off.device.memory_budget = fixture_budget_for(&plain, 1);
    trainer *ta, *tb;
    fixture_train_same(&plain, &off, 20, losses, &ta, &tb);
    assert_int_equal(trainer_offload_stats(tb, st), 0);
    assert_true(st->device.peak <= off.device.memory_budget);
    trainer_free(ta);
    trainer_free(tb);
}

/* MoE in every block: 5 of 6 Real slots offloaded, the pool within the
 * budget. */
static void test_offload_moe_bitwise(void **state)
{
    (void)state;
    offload_stats st;
    moe_bitwise_(1, PRECISION_FP32, NULL, &st);
    assert_int_equal(st.n_resident, 1);
}

/* moe_bitwise_'s model in device.precision bf16 (GEMM inputs rounded,
 * kernels.h): the offloaded run's losses, weights and moments are the
 * resident bf16 run's bit for bit, across the delink, and its losses are
 * not the fp32 run's. */
static void test_offload_moe_bf16_bitwise(void **state)
{
    (void)state;
    float a[20], c[20];
    offload_stats st;
    moe_bitwise_(1, PRECISION_BF16, a, &st);
    run_spec f32 = spec6_(20, 8);
    synth_tiny_moe(&f32.model, 1, 32, 1.0f);
    trainer *tc = fixture_trainer(&f32);
    fixture_run_steps(tc, &f32, 20, c, NULL);
    assert_memory_not_equal(a, c, sizeof a);
    trainer_free(tc);
}

/* A mixed model (MoE in blocks 1, 3, 5 of 6; a pseudo phase of one dense
 * and one MoE slot): the pool's peak is the planned one and within the
 * budget. */
static void test_offload_mixed_bitwise(void **state)
{
    (void)state;
    offload_stats st;
    moe_bitwise_(2, PRECISION_FP32, NULL, &st);
    assert_true(st.n_resident >= 1 && st.n_offloaded >= 4);
    assert_int_equal(st.device.peak, st.predicted_peak_bytes);
}

/* ---------------------------------------------------------- 2. accumulation */

/* The sampler draws rows in order, so 4 microbatches of 2 and 1 of 8 see the
 * same 8 windows, each scaled by 1/(8T): no batch hook is needed. */
static float *params_after_(int B, int accum, int offload, int steps)
{
    run_spec s = spec6_(1000, 0); /* Real from step 0, no eval */
    s.train.batch_size = B;
    s.train.grad_accum = accum;
    s.train.eval_every = 0;
    if (offload)
        s.device.memory_budget = fixture_budget_for(&s, 1);
    trainer *t = fixture_trainer(&s);
    float l[8];
    fixture_run_steps(t, &s, steps, l, NULL);
    if (offload) {
        offload_stats st;
        assert_int_equal(trainer_offload_stats(t, &st), 0);
        assert_int_equal(st.n_offloaded, 5);
        assert_true(st.device.peak <= s.device.memory_budget);
    }
    float *p = fixture_copy_state(t, 0);
    trainer_free(t);
    return p;
}

/* max |a[i] - b[i]| over n floats, in double. */
static double max_abs_diff_(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void test_grad_accum_offloaded_equals_big_batch(void **state)
{
    (void)state;
    const int steps = 3;
    float *acc_off = params_after_(2, 4, 1, steps);
    float *acc_on = params_after_(2, 4, 0, steps);
    float *big_off = params_after_(8, 1, 1, steps);
    float *big_on = params_after_(8, 1, 0, steps);
    run_spec s = spec6_(1, 0);
    size_t n = 0;
    {
        size_t ng, ss;
        gpt_layout_sizes(&s.model, &ng, &ss);
        n = ng + (size_t)s.model.n_layer * ss;
    }
    /* offloading changes nothing: same kernels, same order */
    assert_memory_equal(acc_off, acc_on, n * sizeof(float));
    assert_memory_equal(big_off, big_on, n * sizeof(float));
    /* 4x2 vs 1x8: the gradient sums run in another order (fp32 rounding,
     * relative ~1e-6), which AdamW turns into an update difference of at
     * most lr * that; over 3 steps of lr 3e-3 the weights agree to 1e-6. */
    double maxd = max_abs_diff_(acc_off, big_off, n);
    printf("# max |4x2 - 1x8| after %d steps: %.3g\n", steps, maxd);
    assert_true(maxd <= 1e-6);
    /* 1e-6 must see an accumulation that loses a microbatch: one step of
     * 3x2 (the first 6 of the 8 windows: the sampler draws them in order)
     * lands far from one step of 1x8, where one step of 4x2 does not. At
     * AdamW's first step a weight moves by about lr * sign(g), so another
     * gradient flips signs: a difference of order lr (3e-3 warming up). */
    float *one_acc = params_after_(2, 4, 1, 1), *one_big = params_after_(8, 1, 1, 1);
    float *one_lost = params_after_(2, 3, 1, 1);
    double d_acc = max_abs_diff_(one_acc, one_big, n);
    double d_lost = max_abs_diff_(one_lost, one_big, n);
    printf("# one step: max |4x2 - 1x8| %.3g, max |3x2 - 1x8| %.3g\n", d_acc, d_lost);
    assert_true(d_acc <= 1e-6);
    assert_true(d_lost >= 100 * 1e-6);
    free(one_acc);
    free(one_big);
    free(one_lost);
    free(acc_off);
    free(acc_on);
    free(big_off);
    free(big_on);
}

/* ---------------------------------------------------------- 3. resume */

static void test_save_resume_offloaded(void **state)
{
    (void)state;
    run_spec s = spec6_(30, 10);
    s.device.memory_budget = fixture_budget_for(&s, 2);
    float a[30];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-offload-15", tmpdir_);
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 15, a, NULL);
    offload_stats st;
    trainer_offload_stats(t, &st);
    assert_int_equal(st.n_offloaded, 4);
    size_t n = trainer_copy_state(t, 0, NULL);
    float *saved[3];
    for (int w = 0; w < 3; w++)
        saved[w] = fixture_copy_state(t, w);
    long steps_saved[8], steps_loaded[8];
    assert_int_equal(trainer_copy_adam_steps(t, steps_saved), 7);
    fixture_save(t, dir);
    fixture_run_steps(t, &s, 30, a, NULL);
    trainer_free(t);

    /* a fresh process: Pseudo phase, 2 slots, until the load */
    t = fixture_resume(&s, dir, 15);
    assert_int_equal(trainer_n_slots(t), 6);
    trainer_offload_stats(t, &st);
    assert_int_equal(st.n_offloaded, 4);
    assert_int_equal(trainer_copy_state(t, 0, NULL), n);
    for (int w = 0; w < 3; w++) {
        float *p = fixture_copy_state(t, w);
        assert_memory_equal(saved[w], p, n * sizeof(float));
        free(p);
        free(saved[w]);
    }
    assert_int_equal(trainer_copy_adam_steps(t, steps_loaded), 7);
    assert_memory_equal(steps_saved, steps_loaded, 7 * sizeof(long));
    fixture_finish_same(t, &s, 30, a);
}

/* ---------------------------------------------------------- 4. errors */

static void test_budget_too_small_errors(void **state)
{
    (void)state;
    run_spec s = spec6_(10, 0);
    offload_plan p;
    char err[1024], warn[512];
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    size_t min = p.min_budget_bytes;
    offload_plan_free(&p);

    s.device.memory_budget = min - 1;
    assert_int_equal(offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                   sizeof err), -1);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "device memory budget"));
    assert_non_null(strstr(err, "too small"));
    assert_non_null(strstr(err, "even with all 6 slots offloaded"));
    char want[64];
    snprintf(want, sizeof want, "(%zu bytes)", min);
    assert_non_null(strstr(err, want)); /* the minimum, exactly */
    /* refused at submit, and by the trainer, with the same reason */
    assert_int_equal(ERR_INTO(err, trainer_check_spec(&s, &err_)), -1);
    assert_non_null(strstr(err, "device.memory_budget: device memory budget"));
    assert_non_null(strstr(err, "too small"));
    assert_null(ERR_INTO(err, trainer_create(&s, &err_)));
    assert_non_null(strstr(err, "too small"));
    /* exactly the minimum works: everything offloaded */
    s.device.memory_budget = min;
    assert_int_equal(ERR_INTO(err, trainer_check_spec(&s, &err_)), 0);
    assert_int_equal(offload_check(&s, 0, 0, &p, warn, sizeof warn, err,
                                   sizeof err), 0);
    assert_int_equal(p.n_resident, 0);
    assert_int_equal(p.peak_device_bytes, min);
    offload_plan_free(&p);
}

static void test_pinning_failure(void **state)
{
    (void)state;
    run_spec s = spec6_(10, 0);
    s.train.eval_every = 0;
    s.device.memory_budget = fixture_budget_for(&s, 1);
    char err[1024], warn[1024];

    /* simulated: an unprivileged daemon with RLIMIT_MEMLOCK 0 */
    offload_test_set_pin_limit(0);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), -1);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "pinning: offloading 5 slots pins"));
    assert_non_null(strstr(err, "RLIMIT_MEMLOCK"));
    assert_non_null(strstr(err, "LimitMEMLOCK="));
    /* without the requirement: a warning, and the run works unpinned */
    assert_int_equal(offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                   sizeof err), 0);
    assert_non_null(strstr(warn, "pageable memory"));
    trainer *t = fixture_trainer(&s);
    float l[2];
    fixture_run_steps(t, &s, 2, l, NULL);
    offload_stats st;
    trainer_offload_stats(t, &st);
    assert_int_equal(st.host.pinned, 0);
    assert_true(st.host.in_use > 0);
    trainer_free(t);
    offload_test_set_pin_limit(SIZE_MAX);

    /* a spec with nothing offloaded needs no pinning */
    run_spec r = s;
    r.device.memory_budget = 0;
    offload_test_set_pin_limit(0);
    assert_int_equal(offload_check(&r, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), 0);
    offload_test_set_pin_limit(SIZE_MAX);

    /* for real, in a child: RLIMIT_MEMLOCK 0 (meaningless with
     * CAP_IPC_LOCK, which lets root lock anyway) */
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
            _exit(3);
        if (offload_pin_limit() == SIZE_MAX)
            _exit(2);
        int rc = offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                               sizeof warn, err, sizeof err);
        _exit(rc == -1 && strstr(err, "RLIMIT_MEMLOCK") ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 2)
        printf("# real RLIMIT_MEMLOCK check skipped: process has "
               "CAP_IPC_LOCK\n");
    else
        assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---------------------------------------------------------- 5. preflight */

/* offload_check on a cuda spec: the pin limit is held against the pinned
 * bytes only, MemAvailable against all host bytes. */
static void test_check_cuda_pinned_vs_host(void **state)
{
    (void)state;
    run_spec s = spec6_(10, 0);
    s.device.backend = BACKEND_CUDA;
    s.model = (model_config){.vocab_size = 256, .n_layer = 6, .n_head = 2,
                             .n_embd = 64, .seq_len = 16};
    s.device.memory_budget = fixture_budget_for(&s, 1);
    offload_plan p;
    char err[1024], warn[1024];
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    assert_int_equal(p.n_offloaded, 5);
    size_t pinned = p.pinned_bytes, host = p.host_bytes;
    assert_true(pinned > 0 && host == 5 * pinned); /* 20 vs 4 bytes */
    offload_plan_free(&p);

    /* may lock the pinned bytes, not the whole host side: fine */
    offload_test_set_pin_limit(pinned);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), 0);
    assert_string_equal(warn, "");
    /* one byte short: refused (or warned), naming the pinned bytes */
    offload_test_set_pin_limit(pinned - 1);
    assert_int_equal(offload_check(&s, 0, OFFLOAD_REQUIRE_PINNED, NULL, warn,
                                   sizeof warn, err, sizeof err), -1);
    printf("# %s\n", err);
    char want[64];
    snprintf(want, sizeof want, "(%zu bytes) of host memory", pinned);
    assert_non_null(strstr(err, "pinning: offloading 5 slots pins"));
    assert_non_null(strstr(err, want));
    assert_int_equal(offload_check(&s, 0, 0, NULL, warn, sizeof warn, err,
                                   sizeof err), 0);
    assert_non_null(strstr(warn, "pageable memory"));
    offload_test_set_pin_limit(SIZE_MAX);

    /* a model whose offloaded slots need more host memory than any machine
     * here has (64 layers of width 8192: ~16 GB each at 20 bytes per
     * parameter), with a budget that fits everything offloaded */
    run_spec big = s;
    big.model = (model_config){.vocab_size = 256, .n_layer = 64,
                               .n_head = 64, .n_embd = 8192, .seq_len = 16};
    big.train.batch_size = 1;
    big.device.memory_budget = 0;
    assert_int_equal(offload_plan_for_spec(&big, 0, &p, err, sizeof err), 0);
    big.device.memory_budget = p.min_budget_bytes;
    offload_plan_free(&p);
    int rc = offload_check(&big, 0, 0, NULL, warn, sizeof warn, err,
                           sizeof err);
    FILE *mi = fopen("/proc/meminfo", "r");
    if (!mi) {
        printf("# no /proc/meminfo: MemAvailable check not exercised\n");
        return;
    }
    fclose(mi);
    assert_int_equal(rc, -1);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "host memory: offloading 64 slots needs"));
    assert_non_null(strstr(err, "of it pinned"));
}

/* The scheduler moves exactly the planned bytes: 3 training steps without
 * evaluation move 3 times the plan's per-step figures. */
static void test_measured_bytes_match_plan(void **state)
{
    (void)state;
    run_spec s = spec6_(1000, 0);
    s.train.eval_every = 0;
    s.device.memory_budget = fixture_budget_for(&s, 2);
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_spec(&s, 0, &p, err, sizeof err), 0);
    trainer *t = fixture_trainer(&s);
    float l[3];
    fixture_run_steps(t, &s, 3, l, NULL);
    offload_stats st;
    trainer_offload_stats(t, &st);
    assert_int_equal(st.n_offloaded, p.n_offloaded);
    assert_int_equal(st.h2d_bytes, 3 * p.h2d_bytes_per_step);
    assert_int_equal(st.d2h_bytes, 3 * p.d2h_bytes_per_step);
    assert_int_equal(st.device.peak, p.peak_device_bytes);
    offload_plan_free(&p);
    trainer_free(t);
}

/* ---------------------------------------------------------- share maps */

/* One step as trainer_step drives it (o NULL: plain model); early: no
 * clipping, offloaded slots updated as soon as their gradient is final. */
static float model_step_lr_(gpt_model *g, offload_ctx *o, int accum, int B,
                            uint64_t seed, float lr, int early)
{
    int T = g->cfg.seq_len;
    int32_t inp[256], tgt[256];
    offload_adam a = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                      .weight_decay = 0.1f, .grad_scale = 1.0f};
    if (o)
        offload_step_begin(o, early ? &a : NULL);
    gpt_zero_grad(g);
    float loss = 0;
    for (int k = 0; k < accum; k++) {
        synth_random_batch(inp, tgt, B * T, g->cfg.vocab_size,
                           seed * 31 + k);
        if (o)
            offload_microbatch(o, k);
        loss += gpt_forward(g, inp, tgt, B);
        gpt_backward(g, inp, tgt, B, 1.0f / (float)(B * T * accum));
    }
    if (o)
        offload_wait_grads(o);
    float norm = gpt_grad_norm(g);
    a.grad_scale = !early && norm > 0.5f ? 0.5f / norm : 1.0f;
    if (o)
        offload_adamw(o, &a);
    gpt_adamw(g, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale);
    return loss;
}

static float model_step_(gpt_model *g, offload_ctx *o, int accum, int B,
                         uint64_t seed)
{
    return model_step_lr_(g, o, accum, B, seed, 1e-2f, 0);
}

/* A CPU spec of cfg (microbatch B, accum microbatches, `prefetch`
 * staging buffers) whose device budget, counted here from the layout
 * (4 fp32 buffers of the globals and of a slot, the activations, 2 fp32
 * buffers a staging buffer), holds one real slot resident; the spec into
 * *s, the slot size in floats into *ss, and its offload context. */
static offload_ctx *one_resident_ctx_(const model_config *cfg, int B,
                                      int accum, int prefetch, run_spec *s,
                                      size_t *ss)
{
    spec_defaults(s);
    s->model = *cfg;
    s->train.batch_size = B;
    s->train.grad_accum = accum;
    s->offload.prefetch = prefetch;
    size_t ng;
    gpt_layout_sizes(cfg, &ng, ss);
    s->device.memory_budget = 4 * ng * 4 + gpt_act_floats(cfg, B) * 4 +
                              4 * *ss * 4 + prefetch * 2 * *ss * 4;
    char err[512];
    offload_plan_input in = offload_plan_input_of(s);
    offload_ctx *o = offload_create(&in, spec_host_threads(s), NULL, err,
                                    sizeof err);
    if (!o)
        fail_msg("offload_create: %s", err);
    return o;
}

/* a plain, b on o's storage: the same model of cfg (S slots, B rows),
 * both initialised from seed. */
static void twin_models_(gpt_model *a, gpt_model *b, const model_config *cfg,
                         int S, int B, offload_ctx *o, uint64_t seed)
{
    assert_int_equal(gpt_create(a, cfg, S, B), 0);
    if (gpt_create_with(b, cfg, S, B, offload_storage(o)) != 0)
        fail_msg("create: %s", offload_last_error(o));
    gpt_init_weights(a, seed);
    gpt_init_weights(b, seed);
}

/* A share map the trainer never makes, layers 0..5 -> slots 0,3,1,2,1,0,
 * re-slotted from a 1-slot model, slot 0 resident, 1-3 offloaded, three
 * staging buffers. Backward runs slots 1,2,1,3: slot 1's second backward
 * interval lands in another buffer than its first and must start from the
 * partial gradient the first one drained, while the copy thread is free to
 * run ahead. Offloaded and plain models agree bitwise, forward-only passes
 * in between included. */
static void test_interleaved_share_map(void **state)
{
    (void)state;
    /* layers heavy enough that the copy thread runs ahead of compute */
    const model_config cfg = {.vocab_size = 29, .n_layer = 6, .n_head = 2,
                              .n_embd = 64, .seq_len = 32};
    const int B = 2, accum = 2;
    run_spec s;
    size_t ss;
    offload_ctx *o = one_resident_ctx_(&cfg, B, accum, 3, &s, &ss);
    gpt_model a, b;
    twin_models_(&a, &b, &cfg, 1, B, o, 7);
    for (int i = 0; i < 2; i++)
        assert_true(model_step_(&a, NULL, accum, B, i) ==
                    model_step_(&b, o, accum, B, i));
    int map[6] = {0, 3, 1, 2, 1, 0}, src[4] = {0, 0, 0, 0};
    assert_int_equal(gpt_reslot(&a, 4, map, src, 0), 0);
    assert_int_equal(gpt_reslot(&b, 4, map, src, 0), 0);
    assert_int_equal(offload_current_plan(o)->n_offloaded, 3);
    assert_int_equal(offload_current_plan(o)->n_staging, 3);
    assert_int_equal(b.offloaded[0], 0);
    assert_int_equal(b.offloaded[1], 1);
    int32_t inp[64], tgt[64];
    for (int i = 2; i < 8; i++) {
        assert_true(model_step_(&a, NULL, accum, B, i) ==
                    model_step_(&b, o, accum, B, i));
        synth_random_batch(inp, tgt, B * cfg.seq_len, cfg.vocab_size,
                           1000 + i);
        assert_true(gpt_forward(&a, inp, tgt, B) == gpt_forward(&b, inp, tgt, B));
    }
    offload_sync(o);
    for (int sl = 0; sl < 4; sl++) {
        assert_memory_equal(a.slots[sl].params, b.slots[sl].params,
                            ss * sizeof(float));
        assert_memory_equal(a.slots[sl].v, b.slots[sl].v, ss * sizeof(float));
        assert_int_equal(a.adam_t_slot[sl], b.adam_t_slot[sl]);
    }
    offload_stats st;
    offload_get_stats(o, &st);
    assert_true(st.device.peak <= s.device.memory_budget);
    gpt_free(&a);
    gpt_free(&b);
    offload_free(o);
}

/* An early update still queued when the next step begins keeps its own
 * step's learning rate (regression: the queue used to read the current
 * one). The host threads are held so the update is certainly late. */
static void test_late_update_keeps_its_step(void **state)
{
    (void)state;
    const model_config cfg = {.vocab_size = 29, .n_layer = 3, .n_head = 2,
                              .n_embd = 16, .seq_len = 8};
    run_spec s;
    size_t ss;
    offload_ctx *o = one_resident_ctx_(&cfg, 2, 1, 2, &s, &ss);
    gpt_model a, b;
    twin_models_(&a, &b, &cfg, 3, 2, o, 9);
    assert_int_equal(offload_current_plan(o)->n_offloaded, 2);
    offload_test_hold_updates(o, 1);
    model_step_lr_(&a, NULL, 1, 2, 1, 1e-2f, 1);
    model_step_lr_(&b, o, 1, 2, 1, 1e-2f, 1);
    offload_adam next = {.lr = 5e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                         .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 1.0f};
    offload_step_begin(o, &next); /* the next step begins */
    offload_test_hold_updates(o, 0);
    offload_sync(o);
    for (int sl = 0; sl < 3; sl++)
        assert_memory_equal(a.slots[sl].params, b.slots[sl].params,
                            ss * sizeof(float));
    gpt_free(&a);
    gpt_free(&b);
    offload_free(o);
}

/* ---------------------------------------------------------- streamed */

/* *off unclipped (its grad_clip set to 0) against itself with
 * offload.stream_grads 1 (into *str unless NULL): 20 steps, the same
 * losses and state bit for bit (fixture_train_same); the trainers into
 * *ta, *tb, the streamed one's statistics into *st unless NULL. */
static void streamed_same_(run_spec *off, run_spec *str, trainer **ta,
                           trainer **tb, offload_stats *st)
{
    off->train.grad_clip = 0;
    run_spec s = *off;
    s.offload.stream_grads = 1;
    fixture_train_same(off, &s, 20, NULL, ta, tb);
    if (str)
        *str = s;
    offload_stats mine;
    assert_int_equal(trainer_offload_stats(*tb, st ? st : &mine), 0);
    assert_int_equal((st ? st : &mine)->stream_grads, 1);
}

/* offload.stream_grads against the same run unstreamed (n_layer layers,
 * all but one offloaded, no clip, one microbatch): 20 steps with the delink at 8 give the same
 * losses and final weights and moments bit for bit (the same AdamW on the
 * same gradient, only sooner). Then what the pools measured: the
 * offloaded slots keep params, m, v (3 blocks, not 4) and the gradients
 * in flight never took more than the plan's n_grad_bufs blocks of a slot;
 * the plan's host bytes are within 10% of the measured ones. */
static void check_stream_same_(int n_layer, int host_threads)
{
    run_spec off = spec6_(20, 8);
    off.model.n_layer = n_layer;
    off.train.grad_clip = 0;
    off.train.grad_accum = 1;
    off.offload.host_threads = host_threads;
    off.device.memory_budget = fixture_budget_for(&off, 1);
    run_spec str;
    trainer *ta, *tb;
    streamed_same_(&off, &str, &ta, &tb, NULL);

    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_spec(&str, 0, &p, err, sizeof err), 0);
    assert_int_equal(p.stream_grads, 1);
    int k = n_layer - 1; /* offloaded */
    assert_int_equal(p.n_offloaded, k);
    /* default map, one microbatch: no partial gradient; a buffer per host
     * thread and one landing */
    assert_int_equal(p.n_grad_bufs, host_threads + 1);
    size_t ss;
    size_t ng;
    gpt_layout_sizes(&str.model, &ng, &ss);
    size_t slot = ss * sizeof(float);
    offload_stats su, ss_;
    assert_int_equal(trainer_offload_stats(ta, &su), 0);
    assert_int_equal(trainer_offload_stats(tb, &ss_), 0);
    assert_int_equal(su.stream_grads, 0);
    assert_int_equal(ss_.stream_grads, 1);
    assert_int_equal(ss_.n_grad_bufs, p.n_grad_bufs);
    assert_int_equal(su.host.in_use, (size_t)k * 4 * slot);
    assert_int_equal(ss_.host.in_use, (size_t)k * 3 * slot);
    assert_true(ss_.grads.peak > 0);
    assert_true(ss_.grads.peak <= (size_t)p.n_grad_bufs * slot);
    assert_int_equal(ss_.grads.in_use, 0); /* every update has given back */
    size_t measured = ss_.host.in_use + ss_.grads.peak;
    printf("# stream L %d host_threads %d: host measured %zu (slots %zu + "
           "gradients in flight peak %zu = %.2f slot gradients), planned "
           "%zu (%d buffers); unstreamed measured %zu\n", n_layer,
           host_threads,
           measured, ss_.host.in_use, ss_.grads.peak,
           (double)ss_.grads.peak / (double)slot, p.host_bytes,
           p.n_grad_bufs, su.host.in_use);
    assert_true(p.host_bytes >= measured);
    assert_true((double)p.host_bytes <= 1.10 * (double)measured);
    offload_plan_free(&p);
    trainer_free(ta);
    trainer_free(tb);
}

/* bf16 master weights (optimizer.master) on offloaded slots: the host
 * AdamW rounds them stochastically with the same keys as gpt_adamw does
 * resident ones, so 20 steps with the delink at 8, clipped, give the
 * resident run's losses and state bit for bit; and streamed (no clip)
 * the unstreamed offloaded run's. The weights are bf16 values. */
static void test_bf16_masters_offloaded(void **state)
{
    (void)state;
    run_spec plain = spec6_(20, 8);
    plain.train.grad_accum = 1;
    plain.optimizer.master = MASTER_BF16;
    run_spec off = plain;
    off.device.memory_budget = fixture_budget_for(&plain, 1);
    trainer *ta, *tb;
    fixture_train_same(&plain, &off, 20, NULL, &ta, &tb);
    size_t n = trainer_copy_state(tb, 0, NULL);
    float *w = fixture_copy_state(tb, 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], sizeof u);
        if (u & 0xffffu)
            fail_msg("weight %zu is not a bf16 value (0x%08x)", i, u);
    }
    free(w);
    trainer_free(ta);
    trainer_free(tb);
    offload_stats st;
    streamed_same_(&off, NULL, &ta, &tb, &st);
    assert_true(st.grads.peak > 0);
    trainer_free(ta);
    trainer_free(tb);
}

/* Adafactor (with and without a first moment, fp32 and bf16 masters) on
 * offloaded slots: the host update (gpt_adafactor_slot) is gpt_adafactor's
 * per slot, so 20 steps with the delink at 8, clipped, give the resident
 * run's losses and state bit for bit (spec6_'s one OpenMP thread; the
 * host threads run one each), and streamed (no clip) the unstreamed offloaded
 * run's; dense, MoE and mixed models. The offloaded state is
 * Adafactor's: the host pool holds each
 * offloaded slot's params, grads, first moment (if any) and factored
 * second moment, as the plan counts. */
static void check_adafactor_offloaded_(float beta1, int bf16, int moe_every)
{
    run_spec plain = spec6_(20, 8);
    if (moe_every)
        synth_tiny_moe(&plain.model, moe_every, 32, 1.0f);
    plain.train.grad_accum = 1;
    plain.optimizer.name = OPTIMIZER_ADAFACTOR;
    plain.optimizer.beta1 = beta1;
    if (bf16)
        plain.optimizer.master = MASTER_BF16;
    run_spec off = plain;
    off.device.memory_budget = fixture_budget_for(&plain, 1);
    trainer *ta, *tb;
    fixture_train_same(&plain, &off, 20, NULL, &ta, &tb);
    offload_stats st;
    offload_plan p;
    char err[512];
    assert_int_equal(offload_plan_for_spec(&off, 0, &p, err, sizeof err), 0);
    assert_int_equal(trainer_offload_stats(tb, &st), 0);
    assert_true(st.n_offloaded >= 4);
    assert_int_equal(st.n_offloaded, p.n_offloaded);
    assert_int_equal(st.host.in_use, p.host_bytes);
    /* the device pool's peak is the larger phase's plan */
    size_t want = p.peak_device_bytes;
    if (p.pseudo && p.pseudo->peak_device_bytes > want)
        want = p.pseudo->peak_device_bytes;
    assert_int_equal(st.device.peak, want);
    /* Adafactor's factored state: less than AdamW's 16 bytes a parameter */
    size_t ng, ss;
    gpt_layout_sizes(&off.model, &ng, &ss);
    assert_true(st.host.in_use < (size_t)st.n_offloaded * 16 * ss);
    size_t unstreamed = st.host.in_use;
    offload_plan_free(&p);
    trainer_free(ta);
    trainer_free(tb);
    run_spec str;
    streamed_same_(&off, &str, &ta, &tb, &st);
    assert_true(st.grads.peak > 0 && st.grads.peak <= 3 * ss * sizeof(float));
    /* measured against the streamed plan: the slots' state exactly, the
     * gradients in flight at most the plan's buffers (a bound: how many
     * are out at once depends on how far the host threads lag, and with
     * Adafactor's small state they are a large share of the total, so
     * no 10% check here; check_stream_same_ has one where the bound is
     * within 10% whatever the lag) */
    assert_int_equal(offload_plan_for_spec(&str, 0, &p, err, sizeof err), 0);
    size_t bufs = (size_t)p.n_grad_bufs * p.grad_buf_bytes;
    assert_int_equal(st.host.in_use, p.host_bytes - bufs);
    assert_true(st.grads.peak <= bufs);
    size_t measured = st.host.in_use + st.grads.peak;
    printf("# adafactor b1=%.1f %s moe_every %d: streamed host measured %zu "
           "(slots %zu + gradients in flight peak %zu), planned %zu; "
           "unstreamed %zu\n", (double)beta1, bf16 ? "bf16" : "fp32",
           moe_every, measured, st.host.in_use, st.grads.peak, p.host_bytes,
           unstreamed);
    offload_plan_free(&p);
    trainer_free(ta);
    trainer_free(tb);
}

static void test_adafactor_offloaded(void **state)
{
    (void)state;
    check_adafactor_offloaded_(0.0f, 0, 0);
    check_adafactor_offloaded_(0.9f, 0, 0);
    check_adafactor_offloaded_(0.0f, 1, 0);
    check_adafactor_offloaded_(0.9f, 1, 0);
    check_adafactor_offloaded_(0.9f, 0, 1);  /* MoE in every block */
    check_adafactor_offloaded_(0.0f, 1, 2);  /* dense and MoE slots */
}

/* Streamed, bf16 masters: saved at step 12 (after the delink at 8) and
 * resumed in a fresh trainer, the run goes on bit for bit to step 20. */
static void test_stream_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = spec6_(20, 8);
    s.train.grad_accum = 1;
    s.train.grad_clip = 0;
    s.optimizer.master = MASTER_BF16;
    s.device.memory_budget = fixture_budget_for(&s, 1);
    s.offload.stream_grads = 1;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-stream-12", tmpdir_);
    float l[20];
    trainer *t = fixture_trainer(&s);
    fixture_run_steps(t, &s, 12, l, NULL);
    assert_true(fixture_save(t, dir) > 0);
    fixture_resume_same(t, &s, dir, 12, 20, l);
    offload_stats st;
    assert_int_equal(trainer_offload_stats(t, &st), 0);
    assert_int_equal(st.stream_grads, 1);
    trainer_free(t);
}

static void test_stream_grads_same_as_unstreamed(void **state)
{
    (void)state;
    check_stream_same_(12, 2);
}

/* Six layers, one host thread: two buffers for five offloaded slots, so
 * drains wait
 * for updates to give theirs back; still the same bits. */
static void test_stream_grads_one_host_thread(void **state)
{
    (void)state;
    check_stream_same_(6, 1);
}

/* A share map with a slot used by two non-adjacent layers (slot 1, layers
 * 2 and 4): its partial gradient waits on the host in a streamed buffer
 * between its two backward intervals. The plan counts it (one partial +
 * one per host thread + one landing, at most the 3 offloaded slots); the
 * streamed model and the plain one agree bit for bit, gradient norm
 * included, over 8 steps. */
static void test_stream_grads_partial_gradient(void **state)
{
    (void)state;
    const model_config cfg = {.vocab_size = 29, .n_layer = 6, .n_head = 2,
                              .n_embd = 64, .seq_len = 32};
    const int B = 2;
    run_spec s;
    size_t ss;
    spec_defaults(&s);
    s.model = cfg;
    s.train.batch_size = B;
    s.offload.prefetch = 3;
    s.offload.host_threads = 1;
    s.offload.stream_grads = 1;
    size_t ng;
    gpt_layout_sizes(&cfg, &ng, &ss);
    s.device.memory_budget = 4 * ng * 4 + gpt_act_floats(&cfg, B) * 4 +
                             4 * ss * 4 + 3 * 2 * ss * 4;
    char err[512];
    offload_plan_input in = offload_plan_input_of(&s);
    assert_int_equal(in.stream_grads, 1);
    assert_int_equal(in.host_threads, 1);
    offload_ctx *o = offload_create(&in, 1, NULL, err, sizeof err);
    if (!o)
        fail_msg("offload_create: %s", err);
    gpt_model a, b;
    twin_models_(&a, &b, &cfg, 1, B, o, 7);
    int map[6] = {0, 3, 1, 2, 1, 0}, src[4] = {0, 0, 0, 0};
    assert_int_equal(gpt_reslot(&a, 4, map, src, 0), 0);
    assert_int_equal(gpt_reslot(&b, 4, map, src, 0), 0);
    const offload_plan *p = offload_current_plan(o);
    assert_int_equal(p->n_offloaded, 3);
    assert_int_equal(p->stream_grads, 1);
    assert_int_equal(p->n_grad_bufs, 3);
    /* the rule alone, by hand: at most the offloaded slots */
    unsigned char offl1[4] = {0, 1, 0, 0};
    assert_int_equal(offload_stream_grad_bufs(map, 6, offl1, 4, 4), 1);
    /* adjacent layers: no partial gradient, 1 thread + 1 landing */
    int adj[6] = {0, 1, 1, 2, 2, 3};
    unsigned char all[6] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(offload_stream_grad_bufs(adj, 6, all, 4, 1), 2);
    /* 8 layers, slots 0 (layers 0, 7) and 3 (layers 3, 5) are partial at
     * once while layer 4 runs backward: 2 + 1 thread + 1 landing of 6 */
    int two[8] = {0, 1, 2, 3, 4, 3, 5, 0};
    assert_int_equal(offload_stream_grad_bufs(two, 8, all, 6, 1), 4);
    int T = cfg.seq_len;
    int32_t inp[128], tgt[128];
    double sq[4];
    for (int i = 0; i < 8; i++) {
        offload_adam h = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                          .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_scale = 1.0f};
        synth_random_batch(inp, tgt, B * T, cfg.vocab_size, (uint64_t)i);
        offload_step_begin(o, &h);
        gpt_zero_grad(&a);
        gpt_zero_grad(&b);
        offload_microbatch(o, 0);
        float la = gpt_forward(&a, inp, tgt, B);
        float lb = gpt_forward(&b, inp, tgt, B);
        assert_true(la == lb);
        gpt_backward(&a, inp, tgt, B, 1.0f / (float)(B * T));
        gpt_backward(&b, inp, tgt, B, 1.0f / (float)(B * T));
        offload_wait_grads(o);
        assert_int_equal(offload_stream_sumsq(o, sq), 0);
        float na = gpt_grad_norm(&a), nb = gpt_grad_norm_with(&b, sq);
        assert_true(na == nb);
        offload_adamw(o, &h);
        gpt_adamw(&a, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1.0f);
        gpt_adamw(&b, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1.0f);
    }
    offload_sync(o);
    for (int sl = 0; sl < 4; sl++) {
        assert_memory_equal(a.slots[sl].params, b.slots[sl].params,
                            ss * sizeof(float));
        assert_memory_equal(a.slots[sl].m, b.slots[sl].m, ss * sizeof(float));
        assert_memory_equal(a.slots[sl].v, b.slots[sl].v, ss * sizeof(float));
        assert_int_equal(a.adam_t_slot[sl], b.adam_t_slot[sl]);
    }
    offload_stats st;
    offload_get_stats(o, &st);
    assert_true(st.grads.peak <= 3 * ss * sizeof(float));
    assert_int_equal(st.grads.in_use, 0);
    gpt_free(&a);
    gpt_free(&b);
    offload_free(o);
}

/* What cannot stream is refused at submit, naming the key and why. */
static void test_stream_grads_refusals(void **state)
{
    (void)state;
    const char *base = "{\"data\": {\"train\": \"t*\", \"val\": \"v*\"}";
    const char *ok = "\"offload\": {\"stream_grads\": true}, \"device\": "
                     "{\"memory_budget\": \"1GiB\"}";
    run_spec s;
    char more[512];
    snprintf(more, sizeof more, "%s, \"train\": {\"grad_clip\": 0}", ok);
    fixture_spec_parse(&s, base, more);
    assert_int_equal(s.offload.stream_grads, 1);
    /* on cuda, either optimizer and master (tests/gpu/test_trainer.c) */
    fixture_spec_parse(&s, base, "\"offload\": {\"stream_grads\": true}, "
                       "\"device\": {\"memory_budget\": \"1GiB\", "
                       "\"backend\": \"cuda\"}, \"train\": {\"grad_clip\": "
                       "0}, \"optimizer\": {\"master\": \"bf16\", "
                       "\"name\": \"adafactor\"}");
    assert_int_equal(s.offload.stream_grads, 1);
    assert_int_equal(s.device.backend, BACKEND_CUDA);
    assert_int_equal(s.optimizer.name, OPTIMIZER_ADAFACTOR);
    const char *const bad[][2] = {
        {"\"offload\": {\"stream_grads\": true}, \"train\": "
         "{\"grad_clip\": 0}",
         "offload.stream_grads needs offloading (device.memory_budget > 0)"},
        {"\"offload\": {\"stream_grads\": true}, \"device\": "
         "{\"memory_budget\": \"1GiB\"}",    /* grad_clip's default, 1 */
         "offload.stream_grads needs train.grad_clip 0"},
        {"\"offload\": {\"stream_grads\": true}, \"device\": "
         "{\"memory_budget\": \"1GiB\"}, \"train\": {\"grad_clip\": 0, "
         "\"grad_accum\": 2}", "offload.stream_grads needs train.grad_accum 1"},
        {"\"offload\": {\"stream_grads\": true}, \"device\": "
         "{\"memory_budget\": \"1GiB\"}, \"train\": {\"grad_clip\": 0, "
         "\"batch_size\": 2}, \"nodes\": {\"world_size\": 2}",
         "offload.stream_grads with nodes.world_size > 1"},
        {"\"offload\": {\"stream_grads\": 2}", "offload.stream_grads"},
    };
    fixture_spec_refusals(base, bad, sizeof bad / sizeof bad[0]);
    /* unset, the canonical text has no such key: old hashes stay */
    fixture_spec_parse(&s, base, NULL);
    char *text = spec_to_json(&s);
    assert_null(strstr(text, "stream_grads"));
    free(text);
}

/* ---------------------------------------------------------- pools */

static void test_pools(void **state)
{
    (void)state;
    offload_pool *d = offload_device_pool_create(1000);
    assert_non_null(d);
    void *a = offload_pool_alloc(d, 100); /* rounds to 128 */
    void *b = offload_pool_alloc(d, 640);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_null(offload_pool_alloc(d, 300)); /* 768 + 320 > 1000 */
    offload_pool_stats st;
    offload_pool_get_stats(d, &st);
    assert_int_equal(st.capacity, 1000);
    assert_int_equal(st.in_use, 768);
    offload_pool_free(d, a);
    void *c = offload_pool_alloc(d, 192);
    assert_non_null(c);
    offload_pool_get_stats(d, &st);
    assert_int_equal(st.in_use, 832);
    assert_int_equal(st.peak, 832);
    offload_pool_free(d, b);
    offload_pool_free(d, c);
    offload_pool_get_stats(d, &st);
    assert_int_equal(st.in_use, 0);
    a = offload_pool_alloc(d, 960); /* coalesced again */
    assert_non_null(a);
    offload_pool_destroy(d);

    /* a budget above the machine's memory (and its address space: 2^47
     * bytes of user addresses on x86-64) is no limit: the pool is made,
     * reserving the machine's memory at most, and serves allocations */
    size_t huge = (size_t)1 << 50;  /* 1 PiB */
    d = offload_device_pool_create(huge);
    assert_non_null(d);
    offload_pool_get_stats(d, &st);
    assert_int_equal(st.capacity, huge);
    a = offload_pool_alloc(d, 1 << 20);
    assert_non_null(a);
    offload_pool_free(d, a);
    offload_pool_destroy(d);

    offload_pool *h = offload_host_pool_create(4096);
    a = offload_pool_alloc(h, 1000);
    b = offload_pool_alloc(h, 100000); /* its own chunk */
    assert_non_null(a);
    assert_non_null(b);
    offload_pool_get_stats(h, &st);
    assert_int_equal(st.chunks, 2);
    assert_true(st.capacity >= 4096 + 100000);
    offload_pool_free(h, b);
    offload_pool_trim(h);
    offload_pool_get_stats(h, &st);
    assert_int_equal(st.chunks, 1);
    assert_int_equal(st.in_use, 1024);
    offload_pool_destroy(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_offload_moe_bitwise),
        cmocka_unit_test(test_offload_moe_bf16_bitwise),
        cmocka_unit_test(test_offload_mixed_bitwise),
        cmocka_unit_test(test_check_cuda_pinned_vs_host),
        cmocka_unit_test(test_budget_too_small_errors),
        cmocka_unit_test(test_pinning_failure),
        cmocka_unit_test(test_measured_bytes_match_plan),
        cmocka_unit_test(test_offload_bitwise_50_steps_with_delink),
        cmocka_unit_test(test_offload_bitwise_no_clip),
        cmocka_unit_test(test_grad_accum_offloaded_equals_big_batch),
        cmocka_unit_test(test_save_resume_offloaded),
        cmocka_unit_test(test_interleaved_share_map),
        cmocka_unit_test(test_late_update_keeps_its_step),
        cmocka_unit_test(test_stream_grads_same_as_unstreamed),
        cmocka_unit_test(test_stream_grads_one_host_thread),
        cmocka_unit_test(test_stream_grads_partial_gradient),
        cmocka_unit_test(test_stream_grads_refusals),
        cmocka_unit_test(test_bf16_masters_offloaded),
        cmocka_unit_test(test_stream_resume_bitwise),
        cmocka_unit_test(test_adafactor_offloaded),
    };
    if (getenv("M6_TEST_FILTER")) /* e.g. M6_TEST_FILTER='*no_clip' */
        cmocka_set_test_filter(getenv("M6_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
