/*
 * test_model.c — the model and trainer: sharing, delink, determinism,
 * checkpoint round trips. References are independent of the code under
 * test: per-layer gradients from an unshared model, AdamW by hand in double,
 * bitwise equality where the method promises it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gpt.h"
#include "train/data.h"
#include "train/trainer.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

static const model_config small_ = {.vocab_size = 29, .n_layer = 3,
                                    .n_head = 2, .n_embd = 16, .seq_len = 8};

static void random_batch_(int32_t *inp, int32_t *tgt, int n, int V,
                          uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        inp[i] = (int32_t)((seed >> 33) % (uint64_t)V);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tgt[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
}

/* ---------------------------------------------------------- sharing */

/* S=1: the shared slot's gradient equals the sum of the per-layer gradients
 * of an unshared model holding the same weights in every layer, and one
 * AdamW step equals the update computed by hand from that summed gradient. */
static void test_shared_gradient_and_update(void **state)
{
    (void)state;
    const int B = 2, T = small_.seq_len, L = small_.n_layer;
    gpt_model sh, un;
    assert_int_equal(gpt_create(&sh, &small_, 1, B), 0);
    assert_int_equal(gpt_create(&un, &small_, L, B), 0);
    /* exactly one set of weights and moments */
    assert_int_equal(sh.n_params, sh.n_global + sh.slot_size);
    gpt_init_weights(&sh, 5);
    memcpy(un.params, sh.params, sh.n_global * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(gpt_slot_ptr(&un, un.params, l), gpt_slot_ptr(&sh, sh.params, 0),
               sh.slot_size * sizeof(float));
    int32_t inp[2 * 8], tgt[2 * 8];
    random_batch_(inp, tgt, B * T, small_.vocab_size, 11);

    gpt_zero_grad(&sh);
    gpt_zero_grad(&un);
    float l1 = gpt_forward(&sh, inp, tgt, B);
    float l2 = gpt_forward(&un, inp, tgt, B);
    assert_true(l1 == l2); /* same function, same ops: bitwise */
    gpt_backward(&sh, inp, tgt, B, 1.0f / (B * T));
    gpt_backward(&un, inp, tgt, B, 1.0f / (B * T));

    /* summed per-layer gradient, in double */
    size_t ns = sh.slot_size;
    double *gsum = calloc(ns, sizeof(double));
    for (int l = 0; l < L; l++) {
        const float *gl = gpt_slot_ptr(&un, un.grads, l);
        for (size_t i = 0; i < ns; i++)
            gsum[i] += gl[i];
    }
    const float *gs = gpt_slot_ptr(&sh, sh.grads, 0);
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < ns; i++) {
        maxref = fmax(maxref, fabs(gsum[i]));
        maxdiff = fmax(maxdiff, fabs(gsum[i] - gs[i]));
    }
    /* fp32 sums in a different order: relative 1e-5 */
    assert_true(maxref > 0);
    assert_true(maxdiff <= 1e-5 * maxref);

    /* one AdamW step by hand (t=1: mhat = g, vhat = g^2) */
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *before = malloc(ns * sizeof(float));
    memcpy(before, gpt_slot_ptr(&sh, sh.params, 0), ns * sizeof(float));
    gpt_adamw(&sh, lr, b1, b2, eps, wd, 1.0f);
    assert_int_equal(sh.adam_t_slot[0], 1);
    const float *after = gpt_slot_ptr(&sh, sh.params, 0);
    for (int k = 0; k < SLOT_NTENSORS; k++) {
        const gpt_tensor *t = &sh.slot[k];
        for (size_t j = 0; j < t->numel; j++) {
            size_t i = t->offset + j;
            double g = gsum[i], p = before[i];
            double m = (1 - b1) * g, v = (1 - b2) * g * g;
            double mh = m / (1 - b1), vh = v / (1 - b2);
            double want = p - lr * (mh / (sqrt(vh) + eps) +
                                    (t->decay ? wd : 0) * p);
            /* |update| <= lr; fp32 grad error makes g/|g| flip only for
             * |g| ~ 1e-9, which these shapes do not produce. */
            assert_true(fabs(after[i] - want) <= 1e-5 * fmax(1.0, fabs(want)));
        }
    }
    free(before);
    free(gsum);
    gpt_free(&sh);
    gpt_free(&un);
}

/* ---------------------------------------------------------- delink */

static void train_steps_(gpt_model *g, int n, int B, uint64_t seed)
{
    int T = g->cfg.seq_len;
    int32_t *inp = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
    for (int s = 0; s < n; s++) {
        random_batch_(inp, tgt, B * T, g->cfg.vocab_size, seed + s);
        gpt_zero_grad(g);
        gpt_forward(g, inp, tgt, B);
        gpt_backward(g, inp, tgt, B, 1.0f / (B * T));
        gpt_adamw(g, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
    }
    free(inp);
    free(tgt);
}

static void test_delink_preserves_function(void **state)
{
    (void)state;
    const int B = 2, T = small_.seq_len, L = small_.n_layer;
    gpt_model g;
    assert_int_equal(gpt_create(&g, &small_, 1, B), 0);
    gpt_init_weights(&g, 3);
    train_steps_(&g, 3, B, 100);
    int32_t inp[16], tgt[16];
    random_batch_(inp, tgt, B * T, small_.vocab_size, 999);
    float before = gpt_forward(&g, inp, tgt, B);
    long t_before = g.adam_t_slot[0];

    int map[3] = {0, 1, 2}, src[3] = {0, 0, 0};
    assert_int_equal(gpt_reslot(&g, L, map, src, 0), 0);
    assert_int_equal(g.S, L);
    for (int l = 0; l < L; l++)
        assert_int_equal(g.adam_t_slot[l], t_before);
    float after = gpt_forward(&g, inp, tgt, B);
    assert_true(before == after); /* bitwise */

    train_steps_(&g, 1, B, 200);
    assert_true(memcmp(gpt_slot_ptr(&g, g.params, 0), gpt_slot_ptr(&g, g.params, 1),
                       g.slot_size * sizeof(float)) != 0);
    /* changing layer 0 leaves layer 1 untouched */
    float *copy1 = malloc(g.slot_size * sizeof(float));
    memcpy(copy1, gpt_slot_ptr(&g, g.params, 1), g.slot_size * sizeof(float));
    float l_a = gpt_forward(&g, inp, tgt, B);
    gpt_slot_ptr(&g, g.params, 0)[g.slot[SLOT_FC_W].offset] += 1.0f;
    assert_memory_equal(copy1, gpt_slot_ptr(&g, g.params, 1),
                        g.slot_size * sizeof(float));
    assert_true(gpt_forward(&g, inp, tgt, B) != l_a);
    free(copy1);
    gpt_free(&g);
}

static void test_delink_reset_zeroes_moments(void **state)
{
    (void)state;
    gpt_model g;
    assert_int_equal(gpt_create(&g, &small_, 1, 2), 0);
    gpt_init_weights(&g, 3);
    train_steps_(&g, 2, 2, 1);
    int map[3] = {0, 1, 2}, src[3] = {0, 0, 0};
    assert_int_equal(gpt_reslot(&g, 3, map, src, 1), 0);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(g.adam_t_slot[s], 0);
        const float *m = gpt_slot_ptr(&g, g.m, s);
        for (size_t i = 0; i < g.slot_size; i++)
            assert_true(m[i] == 0.0f);
    }
    assert_int_equal(g.adam_t_global, 2); /* globals are not delinked */
    gpt_free(&g);
}

/* ---------------------------------------------------------- trainer */

static char tmpdir_[256];

static int setup_data(void **state)
{
    (void)state;
    snprintf(tmpdir_, sizeof tmpdir_, "/tmp/m6-test-model-XXXXXX");
    return synth_shards(tmpdir_, 20000);
}

static int teardown_data(void **state)
{
    (void)state;
    return synth_remove(tmpdir_);
}

static run_spec tiny_spec_(long steps, long pseudo_steps)
{
    return synth_tiny_spec(tmpdir_, 3, steps, pseudo_steps);
}

/* Drive a run the way the coordinator does: delink when step == pseudo.steps. */
static void run_steps_(trainer *t, const run_spec *s, long until, float *losses)
{
    char err[256];
    while (trainer_step_count(t) < until) {
        if (trainer_phase(t) == PHASE_PSEUDO &&
            trainer_step_count(t) == s->pseudo.steps)
            assert_int_equal(trainer_delink(t, err, sizeof err), 0);
        step_result r;
        assert_int_equal(ERR_INTO(err, trainer_step(t, &r, &err_)), 0);
        losses[r.step - 1] = r.train_loss;
    }
}

static void test_determinism_50_steps(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(50, 20);
    float a[50], b[50];
    char err[256];
    trainer *t1 = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t1);
    run_steps_(t1, &s, 50, a);
    trainer *t2 = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t2);
    run_steps_(t2, &s, 50, b);
    assert_memory_equal(a, b, sizeof a);
    assert_true(a[49] < a[0]); /* it learns */
    assert_int_equal(trainer_phase(t1), PHASE_REAL);
    assert_int_equal(trainer_delink_step(t1), 20);
    trainer_free(t1);
    trainer_free(t2);
}

static void test_delink_keeps_loss_in_trainer(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(20, 10);
    float l[20];
    char err[256];
    trainer *t = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t);
    run_steps_(t, &s, 10, l);
    assert_int_equal(trainer_n_slots(t), 1);
    float before = trainer_probe_loss(t, 0);
    assert_int_equal(trainer_delink(t, err, sizeof err), 0);
    assert_int_equal(trainer_n_slots(t), 3);
    float after = trainer_probe_loss(t, 0);
    assert_true(before == after);
    trainer_free(t);
}

/* save at step 15 (after a delink at 10), continue to 30; a fresh trainer
 * loading the checkpoint gives the same losses for steps 16..30 bitwise. */
static void test_checkpoint_resume_bitwise(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10);
    float a[30], b[30];
    char err[256], dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt-15", tmpdir_);
    trainer *t = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t);
    run_steps_(t, &s, 15, a);
    long bytes = ERR_INTO(err, trainer_save(t, dir, &err_));
    if (bytes < 0)
        fail_msg("save: %s", err);
    assert_true(bytes > 0);
    assert_true(ERR_INTO(err, trainer_save(t, dir, &err_)) < 0); /* exists */
    run_steps_(t, &s, 30, a);
    trainer_free(t);

    t = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t);
    if (ERR_INTO(err, trainer_load(t, dir, &err_)) != 0)
        fail_msg("load: %s", err);
    assert_int_equal(trainer_step_count(t), 15);
    assert_int_equal(trainer_phase(t), PHASE_REAL);
    assert_int_equal(trainer_n_slots(t), 3);
    run_steps_(t, &s, 30, b);
    assert_memory_equal(a + 15, b + 15, 15 * sizeof(float));
    trainer_free(t);

    /* a checkpoint from another spec is refused */
    s.train.lr *= 2;
    t = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir, &err_)), 0);
    assert_non_null(strstr(err, "spec hash"));
    trainer_free(t);
}

/* A run taken up again while its data is away (m6d restarting with the
 * shards moved): trainer_create refuses, trainer_create_resumable builds
 * the trainer without them and says why; the checkpoint loads, a step is
 * TRAINER_EDATA and so is a reopen while the data is still away; once it
 * is back, a reopen and the steps from 16 give the losses of the
 * uninterrupted run bitwise. */
static void test_resumable_without_data(void **state)
{
    (void)state;
    run_spec s = tiny_spec_(30, 10);
    float a[30], b[30];
    char err[512], dir[512], away[300];
    snprintf(dir, sizeof dir, "%s/ckpt-r15", tmpdir_);
    snprintf(away, sizeof away, "%s.away", tmpdir_);
    trainer *t = ERR_INTO(err, trainer_create(&s, &err_));
    assert_non_null(t);
    run_steps_(t, &s, 15, a);
    if (ERR_INTO(err, trainer_save(t, dir, &err_)) < 0)
        fail_msg("save: %s", err);
    run_steps_(t, &s, 30, a);
    trainer_free(t);

    assert_int_equal(rename(tmpdir_, away), 0);
    assert_null(ERR_INTO(err, trainer_create(&s, &err_)));
    assert_non_null(strstr(err, "data.train: no files match"));
    int data_rc = 0;
    err[0] = 0;
    t = ERR_INTO(err, trainer_create_resumable(&s, &data_rc, &err_));
    assert_non_null(t);
    assert_int_equal(data_rc, TRAINER_EDATA);
    assert_non_null(strstr(err, "data.train: no files match"));
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-r15", away);
    if (ERR_INTO(err, trainer_load(t, ckpt, &err_)) != 0)
        fail_msg("load: %s", err);
    assert_int_equal(trainer_step_count(t), 15);
    step_result r;
    assert_int_equal(ERR_INTO(err, trainer_step(t, &r, &err_)), TRAINER_EDATA);
    assert_non_null(strstr(err, "data.train: not open"));
    assert_int_equal(trainer_step_count(t), 15);
    assert_true(isnan(trainer_probe_loss(t, 0)));
    assert_int_equal(ERR_INTO(err, trainer_reopen_data(t, &err_)), TRAINER_EDATA);
    assert_non_null(strstr(err, "no files match"));

    assert_int_equal(rename(away, tmpdir_), 0);
    assert_int_equal(ERR_INTO(err, trainer_reopen_data(t, &err_)), 0);
    run_steps_(t, &s, 30, b);
    assert_memory_equal(a + 15, b + 15, 15 * sizeof(float));
    trainer_free(t);

    /* with its data there, it is trainer_create's trainer */
    data_rc = 1;
    t = ERR_INTO(err, trainer_create_resumable(&s, &data_rc, &err_));
    assert_non_null(t);
    assert_int_equal(data_rc, 0);
    trainer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_gradient_and_update),
        cmocka_unit_test(test_delink_preserves_function),
        cmocka_unit_test(test_delink_reset_zeroes_moments),
        cmocka_unit_test(test_determinism_50_steps),
        cmocka_unit_test(test_delink_keeps_loss_in_trainer),
        cmocka_unit_test(test_checkpoint_resume_bitwise),
        cmocka_unit_test(test_resumable_without_data),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
