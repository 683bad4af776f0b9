/*
 * trainer_fixture.h — what the engine's cmocka tests share: a group fixture
 * (synthetic shards in a fresh temporary directory, tmpdir_, removed after
 * the group) and trainer helpers that fail the test instead of returning an
 * error. Include after cmocka.h, with FIXTURE_NAME defined to the test's
 * name (the directory is /tmp/m6-test-FIXTURE_NAME-XXXXXX).
 */
#ifndef M6_TESTS_TRAINER_FIXTURE_H
#define M6_TESTS_TRAINER_FIXTURE_H

#ifndef FIXTURE_NAME
#error "define FIXTURE_NAME before including trainer_fixture.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "synth_data.h"
#include "err_into.h"

static char tmpdir_[256];

/* cmocka group setup: 20000 tokens of synthetic shards in tmpdir_. */
static int setup_data(void **state)
{
    (void)state;
    snprintf(tmpdir_, sizeof tmpdir_, "/tmp/m6-test-" FIXTURE_NAME "-XXXXXX");
    return synth_shards(tmpdir_, 20000);
}

static int teardown_data(void **state)
{
    (void)state;
    return synth_remove(tmpdir_);
}

/* The spec base (a spec's JSON without its closing brace) with `more`
 * appended (", more"; "" or NULL: nothing) parsed into *s, failing the
 * test with the error. */
static inline void fixture_spec_parse(run_spec *s, const char *base,
                                      const char *more)
{
    char js[2048], err[512];
    snprintf(js, sizeof js, "%s%s%s}", base, more && *more ? ", " : "",
             more ? more : "");
    if (spec_parse(s, js, strlen(js), err, sizeof err) != 0)
        fail_msg("%s: %s", js, err);
}

/* The optimizer members opt (JSON, "{...}") accepted with base on cuda's
 * resident slots (no memory budget) and on cpu with a budget (offloaded
 * slots): both parsed, keeping opt's name and master. */
static inline void fixture_optimizer_accepted(const char *base,
                                              const char *opt)
{
    static const char *const where[2] = {
        "\"device\": {\"backend\": \"cuda\"}",
        "\"device\": {\"memory_budget\": \"1GiB\"}"};
    run_spec plain, s;
    char more[512];
    snprintf(more, sizeof more, "\"optimizer\": %s", opt);
    fixture_spec_parse(&plain, base, more);
    for (int i = 0; i < 2; i++) {
        snprintf(more, sizeof more, "\"optimizer\": %s, %s", opt, where[i]);
        fixture_spec_parse(&s, base, more);
        assert_int_equal(s.optimizer.name, plain.optimizer.name);
        assert_int_equal(s.optimizer.master, plain.optimizer.master);
    }
}

/* Each of the n specs base + ", " + bad[i][0] refused by spec_parse with
 * an error containing bad[i][1] (what it must name). */
static inline void fixture_spec_refusals(const char *base,
                                         const char *const bad[][2], size_t n)
{
    char js[2048], err[512];
    run_spec s;
    for (size_t i = 0; i < n; i++) {
        snprintf(js, sizeof js, "%s, %s}", base, bad[i][0]);
        assert_int_not_equal(spec_parse(&s, js, strlen(js), err, sizeof err),
                             0);
        if (!strstr(err, bad[i][1]))
            fail_msg("%s: error '%s' does not name '%s'", bad[i][0], err,
                     bad[i][1]);
    }
}

/* trainer_create, failing the test with its error. */
static inline trainer *fixture_trainer(const run_spec *s)
{
    char err[512];
    trainer *t = ERR_INTO(err, trainer_create(s, &err_));
    if (!t)
        fail_msg("trainer_create: %s", err);
    return t;
}

/* trainer_save of t to dir: its byte count, failing the test with the
 * error when the save fails. */
static inline long fixture_save(trainer *t, const char *dir)
{
    char err[512];
    long bytes = ERR_INTO(err, trainer_save(t, dir, &err_));
    if (bytes < 0)
        fail_msg("save: %s", err);
    return bytes;
}

/* trainer_load of dir into t, failing the test with its error. */
static inline void fixture_load(trainer *t, const char *dir)
{
    char err[512];
    if (ERR_INTO(err, trainer_load(t, dir, &err_)) != 0)
        fail_msg("load: %s", err);
}

/* A new run of `to` that takes its weights from the checkpoint in dir
 * (init.from: a fresh optimizer, every optimizer step count 0, checked
 * here) into *a (spec into *to_from), and a trainer of `from` that loaded
 * dir into *w, to compare the weights with; the caller frees both. */
static inline void fixture_init_from(const run_spec *to, const run_spec *from,
                                     const char *dir, run_spec *to_from,
                                     trainer **a, trainer **w)
{
    *to_from = *to;
    snprintf(to_from->init.from, sizeof to_from->init.from, "%s", dir);
    *a = fixture_trainer(to_from);
    *w = fixture_trainer(from);
    fixture_load(*w, dir);
    int n = trainer_n_slots(*a) + 1;
    long *steps = malloc((size_t)n * sizeof *steps);
    assert_non_null(steps);
    assert_int_equal(trainer_copy_adam_steps(*a, steps), n);
    for (int k = 0; k < n; k++)
        assert_int_equal(steps[k], 0);
    free(steps);
}

/* A fresh trainer for s (a new process, as far as the trainer knows)
 * that has loaded the checkpoint in dir and stands at step `at`; fails
 * the test otherwise. */
static inline trainer *fixture_resume(const run_spec *s, const char *dir,
                                      long at)
{
    trainer *t = fixture_trainer(s);
    fixture_load(t, dir);
    assert_int_equal(trainer_step_count(t), at);
    return t;
}

/* The JSON header of the checkpoint in dir (its model.safetensors after
 * the 8-byte length), up to 64 KiB, in a static buffer. */
static inline const char *fixture_ckpt_header(const char *dir)
{
    static char head[65536];
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    memset(head, 0, sizeof head);
    assert_true(fread(head, 1, sizeof head - 1, f) > 8);
    fclose(f);
    return head + 8;
}

/* trainer_step, failing the test with its error. */
static inline void fixture_step(trainer *t, step_result *r)
{
    char err[256];
    if (ERR_INTO(err, trainer_step(t, r, &err_)) != 0)
        fail_msg("step: %s", err);
}

/* Drive t as the runner does until its step count is `until`:
 * delink when the count reaches s->pseudo.steps in the pseudo phase, then
 * step; the training loss and learning rate of step k into losses[k-1]
 * and lrs[k-1] (either NULL: not kept). Fails the test on an error. */
static inline void fixture_run_steps(trainer *t, const run_spec *s,
                                     long until, float *losses, float *lrs)
{
    char err[256];
    while (trainer_step_count(t) < until) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == s->pseudo.steps)
            if (trainer_delink(t, err, sizeof err) != 0)
                fail_msg("delink: %s", err);
        step_result r;
        fixture_step(t, &r);
        if (losses)
            losses[r.step - 1] = r.train_loss;
        if (lrs)
            lrs[r.step - 1] = r.lr;
    }
}

/* Trains t (from its step count k) on to `until` and requires the losses
 * of steps k+1 .. until to equal want[k .. until-1] bit for bit (want: the
 * uninterrupted run's losses); then frees t. */
static inline void fixture_finish_same(trainer *t, const run_spec *s,
                                       long until, const float *want)
{
    long k = trainer_step_count(t);
    float *got = calloc((size_t)until, sizeof(float));
    assert_non_null(got);
    fixture_run_steps(t, s, until, got, NULL);
    assert_memory_equal(want + k, got + k, (size_t)(until - k) * sizeof(float));
    free(got);
    trainer_free(t);
}

/* Delinks t, which must hold slots_before slots, and requires
 * slots_after slots and the same loss on val batch 0 bit for bit before
 * and after (the delink is function-preserving). */
static inline void fixture_delink_keeps_loss(trainer *t, int slots_before,
                                             int slots_after)
{
    char err[256];
    assert_int_equal(trainer_n_slots(t), slots_before);
    float before = trainer_probe_loss(t, 0);
    if (trainer_delink(t, err, sizeof err) != 0)
        fail_msg("delink: %s", err);
    assert_int_equal(trainer_n_slots(t), slots_after);
    float after = trainer_probe_loss(t, 0);
    assert_true(before == after);
}

/* A malloc'd copy of state buffer `which` (trainer_copy_state), all of it. */
static inline float *fixture_copy_state(trainer *t, int which)
{
    size_t n = trainer_copy_state(t, which, NULL);
    float *p = malloc(n * sizeof(float));
    assert_non_null(p);
    assert_int_equal(trainer_copy_state(t, which, p), n);
    return p;
}

/* a and b hold the same state bit for bit: parameters, AdamW m and v
 * (trainer_copy_state) and the AdamW step counts; fails the test
 * otherwise. */
static inline void fixture_assert_same_state(trainer *a, trainer *b)
{
    for (int w = 0; w < 3; w++) {
        /* each buffer its own length: Adafactor's v is factored, its m
         * absent without a first moment */
        size_t n = trainer_copy_state(a, w, NULL);
        assert_int_equal(n, trainer_copy_state(b, w, NULL));
        if (!n)
            continue;
        float *pa = fixture_copy_state(a, w), *pb = fixture_copy_state(b, w);
        assert_memory_equal(pa, pb, n * sizeof(float));
        free(pa);
        free(pb);
    }
    int slots = trainer_n_slots(a);
    assert_int_equal(slots, trainer_n_slots(b));
    long *sa = malloc((size_t)(slots + 1) * sizeof(long));
    long *sb = malloc((size_t)(slots + 1) * sizeof(long));
    assert_non_null(sa);
    assert_non_null(sb);
    assert_int_equal(trainer_copy_adam_steps(a, sa), slots + 1);
    assert_int_equal(trainer_copy_adam_steps(b, sb), slots + 1);
    assert_memory_equal(sa, sb, (size_t)(slots + 1) * sizeof(long));
    free(sa);
    free(sb);
}

/* Resume is bitwise: t, which saved its checkpoint in dir at step `at`,
 * trains on to `until` (its losses into losses[at .. until-1], the
 * earlier ones kept); a fresh trainer of s loading dir must give the same
 * losses bit for bit and the same state at `until`
 * (fixture_assert_same_state). */
static inline void fixture_resume_same(trainer *t, const run_spec *s,
                                       const char *dir, long at, long until,
                                       float *losses)
{
    fixture_run_steps(t, s, until, losses, NULL);
    trainer *r = fixture_resume(s, dir, at);
    float *b = malloc((size_t)until * sizeof *b);
    assert_non_null(b);
    memcpy(b, losses, (size_t)until * sizeof *b);
    fixture_run_steps(r, s, until, b, NULL);
    assert_memory_equal(losses, b, (size_t)until * sizeof *b);
    fixture_assert_same_state(t, r);
    trainer_free(r);
    free(b);
}

/* Trains a (a spec with no device budget) and b (the same spec with one
 * that offloads) side by side from step 0 to `until`: their losses must
 * be equal bit for bit, and so must their parameters and AdamW state
 * (fixture_assert_same_state). The two trainers come back in *ta and *tb
 * (caller frees them); a's losses of steps 1 .. until into losses[0 ..
 * until-1] (NULL: not kept). */
static inline void fixture_train_same(const run_spec *a, const run_spec *b,
                                      long until, float *losses,
                                      trainer **ta, trainer **tb)
{
    float *la = calloc((size_t)until, sizeof *la);
    float *lb = calloc((size_t)until, sizeof *lb);
    assert_non_null(la);
    assert_non_null(lb);
    *ta = fixture_trainer(a);
    *tb = fixture_trainer(b);
    fixture_run_steps(*ta, a, until, la, NULL);
    fixture_run_steps(*tb, b, until, lb, NULL);
    assert_memory_equal(la, lb, (size_t)until * sizeof *la);
    fixture_assert_same_state(*ta, *tb);
    if (losses)
        memcpy(losses, la, (size_t)until * sizeof *la);
    free(la);
    free(lb);
}

/* Two runs that must not resume each other's checkpoints: each of sp[0]
 * and sp[1] trains 3 steps and saves into dir[i] (set here to
 * tmpdir_/TAG-i); then a trainer of sp[i] loading dir[1 - i] must fail
 * with an error containing want[i]. */
static inline void fixture_cross_load_refused(const run_spec sp[2],
                                              const char *tag,
                                              char dir[2][512],
                                              const char *const want[2])
{
    char err[512];
    for (int i = 0; i < 2; i++) {
        snprintf(dir[i], 512, "%s/%s-%d", tmpdir_, tag, i);
        trainer *t = fixture_trainer(&sp[i]);
        fixture_run_steps(t, &sp[i], 3, NULL, NULL);
        assert_true(fixture_save(t, dir[i]) > 0);
        trainer_free(t);
    }
    for (int i = 0; i < 2; i++) {
        trainer *t = fixture_trainer(&sp[i]);
        assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir[1 - i],
                                                        &err_)), 0);
        if (!strstr(err, want[i]))
            fail_msg("error '%s' does not say '%s'", err, want[i]);
        trainer_free(t);
    }
}

/* The device.memory_budget that leaves `resident` slots of s's real phase
 * on the device: the planner's minimum plus that many slots. */
static inline size_t fixture_budget_for(const run_spec *s, int resident)
{
    offload_plan p;
    char err[512];
    if (offload_plan_for_spec(s, 0, &p, err, sizeof err) != 0)
        fail_msg("plan: %s", err);
    size_t b = p.min_budget_bytes + (size_t)resident * p.slot_bytes;
    offload_plan_free(&p);
    return b;
}

#endif /* M6_TESTS_TRAINER_FIXTURE_H */
