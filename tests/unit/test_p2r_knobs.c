/*
 * test_p2r_knobs.c — the pseudo phase's two engine options (issue 21):
 * pseudo.grad_scale mean and pseudo.lr_scale, through the trainer on the
 * CPU backend, against independent references:
 *   - grad_scale mean: one step of a shared model (S = 1 and S = 2 of
 *     L = 3) against the same step computed here by hand in double from
 *     an unshared model holding the same weights in every layer: the
 *     per-layer gradients averaged over each slot's layers, the global
 *     norm, the clip and AdamW's first moments, second moments and
 *     weights;
 *   - grad_scale mean with offloaded slots (speculative update on and off)
 *     bit for bit as fully resident, through the delink;
 *   - the delink still preserves the function bitwise after a pseudo
 *     phase trained with mean;
 *   - lr_scale: the lr of every step against the schedule computed here,
 *     times lr_scale in the pseudo phase only, and the update it makes
 *     scaled by exactly that factor.
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
#include "offload/offload.h"
#include "train/data.h"
#include "train/trainer.h"
#define FIXTURE_NAME "p2r_knobs"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

/* max |a - b| over n, and max |b| (the reference) into *ref. */
static double maxdiff_(const float *a, const double *b, size_t n, double *ref)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        r = fmax(r, fabs(b[i]));
    }
    *ref = r;
    return d;
}

/* The tiny spec at L = 3 on one thread (the CPUs here are shared; the
 * results do not depend on it). */
static run_spec spec3_(long steps, long pseudo_steps)
{
    run_spec s = synth_tiny_spec(tmpdir_, 3, steps, pseudo_steps);
    s.device.threads = 1;
    return s;
}

/* ---------------------------------------------------------- grad_scale */

/* One pseudo step with grad_scale mean (S slots of L = 3, share map
 * l*S/L; clip: the spec's grad_clip) against the hand computation. */
static void check_mean_step_(int S, float clip)
{
    run_spec s = synth_tiny_spec(tmpdir_, 3, 10, 5);
    s.pseudo.share_groups = S;
    s.pseudo.grad_scale = GRAD_SCALE_MEAN;
    s.train.grad_clip = clip;
    s.device.threads = 1;
    const int L = s.model.n_layer, B = s.train.batch_size,
              T = s.model.seq_len, A = s.train.grad_accum;
    trainer *t = fixture_trainer(&s);
    float *p0 = fixture_copy_state(t, 0);
    step_result r;
    fixture_step(t, &r);
    assert_false(r.skipped);
    float *p1 = fixture_copy_state(t, 0), *m1 = fixture_copy_state(t, 1),
          *v1 = fixture_copy_state(t, 2);

    /* the reference: an unshared model, every layer holding its slot's
     * weights, on the step's windows (read from the shards here) */
    gpt_model un;
    assert_int_equal(gpt_create(&un, &s.model, L, B), 0);
    size_t ng = un.n_global, ns = un.slot_size;
    assert_int_equal(trainer_copy_state(t, 0, NULL), ng + (size_t)S * ns);
    memcpy(un.params, p0, ng * sizeof(float));
    int slot_of[8], share[8] = {0};
    for (int l = 0; l < L; l++) {
        slot_of[l] = l * S / L;
        share[slot_of[l]]++;
        memcpy(gpt_slot_ptr(&un, un.params, l), p0 + ng + slot_of[l] * ns,
               ns * sizeof(float));
    }
    size_t win[64];
    assert_int_equal(trainer_step_windows(t, win), (size_t)A * B);
    token_set ts;
    char err[256];
    if (token_set_open_buf(&ts, s.data.train, s.model.vocab_size, err,
                           sizeof err) != 0)
        fail_msg("%s", err);
    int32_t *inp = malloc((size_t)B * T * sizeof *inp),
            *tgt = malloc((size_t)B * T * sizeof *tgt);
    uint16_t row[64];
    gpt_zero_grad(&un);
    for (int k = 0; k < A; k++) {
        for (int b = 0; b < B; b++) {
            if (token_set_read_buf(&ts, win[k * B + b], row, (size_t)T + 1,
                                   err, sizeof err) != 0)
                fail_msg("%s", err);
            for (int j = 0; j < T; j++) {
                inp[b * T + j] = row[j];
                tgt[b * T + j] = row[j + 1];
            }
        }
        gpt_forward(&un, inp, tgt, B);
        gpt_backward(&un, inp, tgt, B, 1.0f / ((float)B * T * A));
    }
    token_set_close(&ts);

    /* gradient: globals as they are, slot s the mean of its layers' */
    size_t n = ng + (size_t)S * ns;
    double *g = calloc(n, sizeof *g);
    for (size_t i = 0; i < ng; i++)
        g[i] = un.grads[i];
    for (int l = 0; l < L; l++) {
        const float *gl = gpt_slot_ptr(&un, un.grads, l);
        for (size_t i = 0; i < ns; i++)
            g[ng + slot_of[l] * ns + i] += gl[i] / share[slot_of[l]];
    }
    double sq = 0, sq_sum = 0;
    for (size_t i = 0; i < n; i++) {
        sq += g[i] * g[i];
        double gs = i < ng ? g[i] : g[i] * share[(i - ng) / ns];
        sq_sum += gs * gs;
    }
    double norm = sqrt(sq);
    /* the norm the trainer reports is the mean's, not the sum's */
    assert_true(fabs(r.grad_norm - norm) <= 1e-5 * norm);
    if (S == 1)
        assert_true(sqrt(sq_sum) > 1.5 * norm);
    double c = clip > 0 && norm > clip ? clip / norm : 1.0;
    if (clip > 0)
        assert_true(c < 1.0); /* these cases are meant to clip */

    /* AdamW, step 1: m = (1-b1) c g, v = (1-b2) (c g)^2, mhat = c g,
     * vhat = (c g)^2 */
    const double b1 = s.train.beta1, b2 = s.train.beta2, eps = s.train.eps,
                 wd = s.train.weight_decay, lr = r.lr;
    double *mw = malloc(n * sizeof *mw), *vw = malloc(n * sizeof *vw),
           *pw = malloc(n * sizeof *pw);
    for (size_t i = 0; i < n; i++) {
        double gc = c * g[i];
        mw[i] = (1 - b1) * gc;
        vw[i] = (1 - b2) * gc * gc;
    }
    /* the weights, per tensor (decay on 2-D tensors only) */
    for (int k = 0; k < GLOB_NTENSORS; k++)
        for (size_t j = 0; j < un.glob[k].numel; j++) {
            size_t i = un.glob[k].offset + j;
            double gc = c * g[i];
            pw[i] = p0[i] - lr * (gc / (fabs(gc) + eps) +
                                  (un.glob[k].decay ? wd : 0) * p0[i]);
        }
    for (int sl = 0; sl < S; sl++)
        for (int k = 0; k < SLOT_NTENSORS; k++)
            for (size_t j = 0; j < un.slot[k].numel; j++) {
                size_t i = ng + sl * ns + un.slot[k].offset + j;
                double gc = c * g[i];
                pw[i] = p0[i] - lr * (gc / (fabs(gc) + eps) +
                                      (un.slot[k].decay ? wd : 0) * p0[i]);
            }
    /* fp32 gradients summed in another order (relative 1e-5 of the
     * largest); v is quadratic in them (2e-5) */
    double ref, d;
    d = maxdiff_(m1, mw, ng, &ref);
    assert_true(ref > 0 && d <= 1e-5 * ref);
    d = maxdiff_(v1, vw, ng, &ref);
    assert_true(ref > 0 && d <= 2e-5 * ref);
    for (int sl = 0; sl < S; sl++) {
        size_t o = ng + sl * ns;
        d = maxdiff_(m1 + o, mw + o, ns, &ref);
        if (!(ref > 0 && d <= 1e-5 * ref))
            fail_msg("slot %d (of %d layers): m differs by %g (max %g)", sl,
                     share[sl], d, ref);
        d = maxdiff_(v1 + o, vw + o, ns, &ref);
        assert_true(ref > 0 && d <= 2e-5 * ref);
    }
    /* |update| <= lr (1 + wd |p|); g/|g| flips only for |g| ~ eps */
    for (size_t i = 0; i < n; i++)
        if (fabs(p1[i] - pw[i]) > 1e-5 * fmax(1.0, fabs(pw[i])))
            fail_msg("weight %zu: %.9g, want %.9g", i, p1[i], pw[i]);
    free(g);
    free(mw);
    free(vw);
    free(pw);
    free(inp);
    free(tgt);
    free(p0);
    free(p1);
    free(m1);
    free(v1);
    gpt_free(&un);
    trainer_free(t);
}

static void test_mean_step_s1(void **state)
{
    (void)state;
    check_mean_step_(1, 0.0f);
}

static void test_mean_step_s1_clipped(void **state)
{
    (void)state;
    check_mean_step_(1, 0.05f);
}

static void test_mean_step_s2_clipped(void **state)
{
    (void)state;
    check_mean_step_(2, 0.05f);
}

/* The real phase is untouched by mean (one layer per slot), and a run from
 * scratch with mean is the run with sum, bit for bit. */
static void test_mean_no_effect_from_scratch(void **state)
{
    (void)state;
    run_spec a = spec3_(8, 0);
    run_spec b = a;
    b.pseudo.grad_scale = GRAD_SCALE_MEAN;
    trainer *ta, *tb;
    fixture_train_same(&a, &b, 8, NULL, &ta, &tb);
    trainer_free(ta);
    trainer_free(tb);
}

/* The delink after a pseudo phase trained with mean keeps the loss on the
 * same batch bitwise (function-preserving), and mean did change the
 * pseudo phase's training. */
static void test_mean_delink_preserves_function(void **state)
{
    (void)state;
    run_spec s = spec3_(20, 10);
    run_spec sum = s;
    s.pseudo.grad_scale = GRAD_SCALE_MEAN;
    float l[20], ls[20];
    trainer *t = fixture_trainer(&s), *ts = fixture_trainer(&sum);
    fixture_run_steps(t, &s, 10, l, NULL);
    fixture_run_steps(ts, &sum, 10, ls, NULL);
    assert_true(memcmp(l, ls, sizeof(float) * 10) != 0);
    fixture_delink_keeps_loss(t, 1, 3);
    fixture_run_steps(t, &s, 20, l, NULL);
    assert_true(l[19] < l[0]);
    trainer_free(t);
    trainer_free(ts);
}

/* grad_scale mean with offloaded slots (L 6, S 2 in the pseudo phase, a
 * budget that offloads a pseudo slot) gives the resident run's losses,
 * weights and moments bit for bit through the delink, with the
 * speculative clipped update on and off. */
static void check_mean_offload_(int speculative)
{
    run_spec plain = synth_tiny_spec(tmpdir_, 6, 16, 8);
    plain.pseudo.share_groups = 2;
    plain.pseudo.grad_scale = GRAD_SCALE_MEAN;
    plain.offload.prefetch = 2;
    plain.offload.host_threads = 2;
    plain.offload.speculative = speculative;
    plain.train.grad_clip = 0.5f;
    plain.device.threads = 1;
    run_spec off = plain;
    off.device.memory_budget = fixture_budget_for(&plain, 0);
    float a[16], b[16];
    trainer *ta = fixture_trainer(&plain), *tb = fixture_trainer(&off);
    fixture_run_steps(ta, &plain, 8, a, NULL);
    fixture_run_steps(tb, &off, 8, b, NULL);
    offload_stats st;
    assert_int_equal(trainer_offload_stats(tb, &st), 0);
    assert_int_equal(st.n_slots, 2);
    assert_true(st.n_offloaded >= 1); /* the pseudo phase offloads */
    if (speculative == SPEC_SPECULATIVE_ON)
        assert_true(st.spec_steps > 0);
    fixture_run_steps(ta, &plain, 16, a, NULL);
    fixture_run_steps(tb, &off, 16, b, NULL);
    assert_memory_equal(a, b, sizeof a);
    fixture_assert_same_state(ta, tb);
    trainer_free(ta);
    trainer_free(tb);

    /* and mean is not sum there */
    off.pseudo.grad_scale = GRAD_SCALE_SUM;
    float c[16];
    trainer *tc = fixture_trainer(&off);
    fixture_run_steps(tc, &off, 8, c, NULL);
    assert_true(memcmp(c + 1, b + 1, 7 * sizeof(float)) != 0);
    trainer_free(tc);
}

static void test_mean_offload_bitwise(void **state)
{
    (void)state;
    check_mean_offload_(SPEC_SPECULATIVE_OFF);
}

static void test_mean_offload_speculative_bitwise(void **state)
{
    (void)state;
    check_mean_offload_(SPEC_SPECULATIVE_ON);
}

/* ---------------------------------------------------------- lr_scale */

/* The schedule of synth_tiny_spec's keys, computed here: warmup, cosine,
 * lr_scale before the delink at P, re-warm after it. */
static double lr_want_(const run_spec *s, long step, long P)
{
    double lr, W = (double)s->train.warmup_steps, N = (double)s->train.steps;
    double peak = s->train.lr, lo = s->train.min_lr;
    if (step < s->train.warmup_steps)
        lr = peak * (step + 1) / W;
    else
        lr = lo + 0.5 * (1 + cos(M_PI * fmin(1.0, (step - W) / (N - W)))) *
                      (peak - lo);
    if (step < P)
        return lr * s->pseudo.lr_scale;
    long R = s->delink.rewarm_steps;
    if (step - P < R)
        lr *= (double)(step - P + 1) / (double)R;
    return lr;
}

/* What the lr-scale tests compare: spec3_(steps, pseudo) at
 * pseudo.lr_scale scale (*s) and at 1 (*one), a trainer on each (*t,
 * *t1). */
static void scale_pair_(long steps, long pseudo, float scale, run_spec *s,
                        run_spec *one, trainer **t, trainer **t1)
{
    *s = spec3_(steps, pseudo);
    s->pseudo.lr_scale = scale;
    *one = *s;
    one->pseudo.lr_scale = 1.0f;
    *t = fixture_trainer(s);
    *t1 = fixture_trainer(one);
}

static void test_lr_scale_schedule(void **state)
{
    (void)state;
    run_spec s, one;
    trainer *t, *t1;
    scale_pair_(16, 7, 0.25f, &s, &one, &t, &t1);
    float lr[16], lr1[16];
    fixture_run_steps(t, &s, 16, NULL, lr);
    fixture_run_steps(t1, &one, 16, NULL, lr1);
    for (long i = 0; i < 16; i++) {
        double w = lr_want_(&s, i, 7), w1 = lr_want_(&one, i, 7);
        if (fabs(lr[i] - w) > 1e-6 * w || fabs(lr1[i] - w1) > 1e-6 * w1)
            fail_msg("step %ld: lr %.9g (want %.9g), at scale 1 %.9g (want "
                     "%.9g)", i + 1, lr[i], w, lr1[i], w1);
        if (i < 7)
            assert_true(fabs(lr[i] - 0.25 * lr1[i]) <= 1e-7 * lr1[i]);
        else /* the real phase: the schedule's, bit for bit */
            assert_true(lr[i] == lr1[i]);
    }
    trainer_free(t);
    trainer_free(t1);
}

/* The first pseudo step's update (AdamW's is linear in the lr) at
 * lr_scale 0.5 is half the update at lr_scale 1, from the same weights
 * and batch. */
static void test_lr_scale_update(void **state)
{
    (void)state;
    run_spec s, one;
    trainer *t, *t1;
    scale_pair_(10, 5, 0.5f, &s, &one, &t, &t1);
    float *p0 = fixture_copy_state(t, 0);
    step_result r, r1;
    fixture_step(t, &r);
    fixture_step(t1, &r1);
    assert_true(r.train_loss == r1.train_loss); /* same weights, batch */
    float *p = fixture_copy_state(t, 0), *p1 = fixture_copy_state(t1, 0);
    size_t n = trainer_copy_state(t, 0, NULL);
    double dmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)p[i] - p0[i], d1 = (double)p1[i] - p0[i];
        dmax = fmax(dmax, fabs(d1));
        /* the differences of fp32 weights near 0.02: 1e-7 * 0.02 / 3e-4 */
        if (fabs(d - 0.5 * d1) > 1e-4 * fabs(d1) + 1e-9)
            fail_msg("weight %zu: update %.9g, want half of %.9g", i, d, d1);
    }
    assert_true(dmax > 0);
    free(p0);
    free(p);
    free(p1);
    trainer_free(t);
    trainer_free(t1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mean_step_s1),
        cmocka_unit_test(test_mean_step_s1_clipped),
        cmocka_unit_test(test_mean_step_s2_clipped),
        cmocka_unit_test(test_mean_no_effect_from_scratch),
        cmocka_unit_test(test_mean_delink_preserves_function),
        cmocka_unit_test(test_mean_offload_bitwise),
        cmocka_unit_test(test_mean_offload_speculative_bitwise),
        cmocka_unit_test(test_lr_scale_schedule),
        cmocka_unit_test(test_lr_scale_update),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
