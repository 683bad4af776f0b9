/*
 * test_nonfinite.c — non-finite steps (issue 16 item 5): a NaN batch, an
 * Inf gradient in one slot (resident and offloaded, with and without
 * clipping) and an lr that blows up each skip the update. Checked against
 * copies of the state taken before the step: weights, AdamW moments and
 * AdamW's step counts bitwise untouched, the step counted, the LR schedule
 * moved on as in a run without the fault, the consecutive count reset by a
 * good step, and both counts carried by a checkpoint.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "offload/offload.h"
#include "train/test_hooks.h"
#include "train/trainer.h"
#define FIXTURE_NAME "nonfinite"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

static run_spec spec_(void)
{
    run_spec s = synth_tiny_spec(tmpdir_, 4, 20, 0);
    s.device.threads = 1;
    s.offload.prefetch = 2;
    s.offload.host_threads = 2;
    return s;
}

/* A budget that keeps one slot on the device (the rest offloaded). */
static size_t budget_one_(const run_spec *s)
{
    offload_plan p;
    char err[512];
    if (offload_plan_for_spec(s, 0, &p, err, sizeof err) != 0)
        fail_msg("plan: %s", err);
    size_t b = p.min_budget_bytes + p.slot_bytes;
    offload_plan_free(&p);
    return b;
}

static void step_(trainer *t, step_result *r)
{
    char err[512];
    if (ERR_INTO(err, trainer_step(t, r, &err_)) != 0)
        fail_msg("step: %s", err);
}

/* Everything a skipped step must leave alone. */
typedef struct {
    float *w[3];
    size_t n;
    long adam[64];
    int na;
} snap;

static snap snap_(trainer *t)
{
    snap s = {.n = trainer_copy_state(t, 0, NULL)};
    for (int k = 0; k < 3; k++) {
        s.w[k] = malloc(s.n * sizeof(float));
        assert_non_null(s.w[k]);
        assert_int_equal(trainer_copy_state(t, k, s.w[k]), s.n);
    }
    s.na = trainer_copy_adam_steps(t, s.adam);
    return s;
}

static void snap_equal_(const snap *a, const snap *b)
{
    assert_int_equal(a->n, b->n);
    for (int k = 0; k < 3; k++)
        assert_memory_equal(a->w[k], b->w[k], a->n * sizeof(float));
    assert_int_equal(a->na, b->na);
    assert_memory_equal(a->adam, b->adam, (size_t)a->na * sizeof(long));
}

static int snap_differs_(const snap *a, const snap *b)
{
    return memcmp(a->w[0], b->w[0], a->n * sizeof(float)) != 0;
}

static void snap_free_(snap *s)
{
    for (int k = 0; k < 3; k++)
        free(s->w[k]);
}

/* Train 3 good steps, arm `fault` for step 4 (and 5 with two), and check
 * each faulted step changes nothing, then that step 6 trains (AdamW count
 * + 1, weights change) and clears the consecutive count. */
static void check_fault_(run_spec *s, trainer_fault fault, int slot)
{
    trainer *t = fixture_trainer(s);
    step_result r;
    for (int i = 0; i < 3; i++) {
        step_(t, &r);
        assert_false(r.skipped);
        assert_int_equal(r.bad_steps, 0);
    }
    if (s->device.memory_budget > 0) {
        offload_stats st;
        assert_int_equal(trainer_offload_stats(t, &st), 0);
        assert_true(st.n_offloaded >= 1);
    }
    trainer_test_fault(t, fault, 4, 2, slot);
    snap before = snap_(t);
    for (int i = 0; i < 2; i++) {
        step_(t, &r);
        assert_int_equal(r.step, 4 + i);
        assert_true(r.skipped);
        assert_int_equal(r.bad_steps, i + 1);
        assert_int_equal(r.skipped_total, i + 1);
        if (fault == TRAINER_FAULT_NAN_BATCH)
            assert_true(isnan(r.train_loss));
        else
            assert_true(isfinite(r.train_loss) && isinf(r.grad_norm));
        snap after = snap_(t);
        snap_equal_(&before, &after);
        snap_free_(&after);
    }
    assert_int_equal(trainer_step_count(t), 5);
    /* the schedule moved on: step 6's lr is an unfaulted run's step-6 lr */
    trainer *u = fixture_trainer(s);
    step_result ru;
    for (int i = 0; i < 6; i++)
        step_(u, &ru);
    trainer_free(u);
    step_(t, &r);
    assert_int_equal(r.step, 6);
    assert_memory_equal(&r.lr, &ru.lr, sizeof(float));
    assert_false(r.skipped);
    assert_int_equal(r.bad_steps, 0);
    assert_int_equal(r.skipped_total, 2);
    assert_true(isfinite(r.train_loss) && isfinite(r.grad_norm));
    snap good = snap_(t);
    assert_true(snap_differs_(&before, &good));
    for (int i = 0; i < good.na; i++)
        assert_int_equal(good.adam[i], before.adam[i] + 1);
    snap_free_(&good);
    snap_free_(&before);
    trainer_free(t);
}

static void test_nan_batch_resident(void **state)
{
    (void)state;
    run_spec s = spec_();
    check_fault_(&s, TRAINER_FAULT_NAN_BATCH, 0);
}

static void test_nan_batch_offloaded_noclip(void **state)
{
    (void)state;
    run_spec s = spec_();
    s.train.grad_clip = 0; /* formerly: offloaded slots updated early */
    s.device.memory_budget = budget_one_(&s);
    check_fault_(&s, TRAINER_FAULT_NAN_BATCH, 0);
}

static void test_inf_grad_resident_slot(void **state)
{
    (void)state;
    run_spec s = spec_();
    check_fault_(&s, TRAINER_FAULT_INF_GRAD, 1);
}

/* Offloaded slots are taken from the end of the stack: slot 3 of 4 with
 * one resident. With clipping and without. */
static void test_inf_grad_offloaded_slot(void **state)
{
    (void)state;
    for (int clip = 0; clip < 2; clip++) {
        run_spec s = spec_();
        s.train.grad_clip = clip ? 1.0f : 0.0f;
        s.device.memory_budget = budget_one_(&s);
        check_fault_(&s, TRAINER_FAULT_INF_GRAD, 3);
        /* and the resident slot of the same placement */
        check_fault_(&s, TRAINER_FAULT_INF_GRAD, 0);
    }
}

/* An lr of 1e30: the first update sends the weights to ~1e30, the next
 * forward overflows and every step after it is skipped, the state frozen
 * at the one after step 1. */
static void test_lr_blows_up(void **state)
{
    (void)state;
    run_spec s = spec_();
    s.train.lr = 1e30f;
    s.train.min_lr = 0;
    s.train.warmup_steps = 0;
    s.train.grad_clip = 0;
    trainer *t = fixture_trainer(&s);
    step_result r;
    step_(t, &r);
    assert_false(r.skipped);
    snap first = snap_(t);
    long bad = 0;
    for (int i = 0; i < 6; i++) {
        step_(t, &r);
        if (r.skipped)
            bad++;
        else
            assert_int_equal(bad, 0); /* no good step after a bad one */
        assert_int_equal(r.bad_steps, bad);
    }
    assert_true(bad >= 5);
    assert_int_equal(trainer_bad_steps(t), bad);
    if (bad == 6) {
        snap now = snap_(t);
        snap_equal_(&first, &now);
        snap_free_(&now);
    }
    snap_free_(&first);
    trainer_free(t);
}

/* The counts travel with a checkpoint; trainer_clear_bad_steps clears only
 * the consecutive one. */
static void test_counts_in_checkpoint(void **state)
{
    (void)state;
    run_spec s = spec_();
    trainer *t = fixture_trainer(&s);
    step_result r;
    step_(t, &r);
    trainer_test_fault(t, TRAINER_FAULT_NAN_BATCH, 2, 3, 0);
    for (int i = 0; i < 3; i++)
        step_(t, &r);
    assert_int_equal(trainer_bad_steps(t), 3);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir_);
    assert_true(fixture_save(t, dir) > 0);
    trainer *u = fixture_trainer(&s);
    fixture_load(u, dir);
    assert_int_equal(trainer_bad_steps(u), 3);
    assert_int_equal(trainer_skipped_steps(u), 3);
    trainer_clear_bad_steps(u);
    assert_int_equal(trainer_bad_steps(u), 0);
    assert_int_equal(trainer_skipped_steps(u), 3);
    /* the next step of both is the same good step */
    step_result ru;
    step_(t, &r);
    step_(u, &ru);
    assert_false(r.skipped);
    assert_memory_equal(&r.train_loss, &ru.train_loss, sizeof(float));
    trainer_free(u);
    trainer_free(t);
    assert_int_equal(synth_remove(dir), 0);
}

static void test_fault_parse(void **state)
{
    (void)state;
    trainer_fault k;
    long first, count;
    int slot;
    assert_int_equal(trainer_test_fault_parse("nan_batch@4x3", &k, &first,
                                              &count, &slot), 0);
    assert_int_equal(k, TRAINER_FAULT_NAN_BATCH);
    assert_int_equal(first, 4);
    assert_int_equal(count, 3);
    assert_int_equal(trainer_test_fault_parse("inf_grad@2/1", &k, &first,
                                              &count, &slot), 0);
    assert_int_equal(k, TRAINER_FAULT_INF_GRAD);
    assert_int_equal(first, 2);
    assert_int_equal(count, 1);
    assert_int_equal(slot, 1);
    assert_int_equal(trainer_test_fault_parse("stop_a2a@10", &k, &first,
                                              &count, &slot), 0);
    assert_int_equal(k, TRAINER_FAULT_STOP_A2A);
    assert_int_equal(first, 10);
    assert_int_equal(count, 1);
    const char *bad[] = {"nan_batch", "nan@3", "nan_batch@0", "inf_grad@2x",
                         "inf_grad@2/1z", "stop_a2a", "stop@3", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(trainer_test_fault_parse(bad[i], &k, &first,
                                                  &count, &slot), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_parse),
        cmocka_unit_test(test_nan_batch_resident),
        cmocka_unit_test(test_nan_batch_offloaded_noclip),
        cmocka_unit_test(test_inf_grad_resident_slot),
        cmocka_unit_test(test_inf_grad_offloaded_slot),
        cmocka_unit_test(test_lr_blows_up),
        cmocka_unit_test(test_counts_in_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
