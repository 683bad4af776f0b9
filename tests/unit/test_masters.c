/*
 * test_masters.c — bf16 master weights (optimizer.master bf16): the
 * stochastic rounding (kernels/cpu/sround.c) against what it must be by
 * hand — unbiased, E[sr(x)] = x, and updates far below bf16's resolution
 * still moving the weights by their fp32 sum on average, through AdamW's
 * and Adafactor's kernels, the same bits on any thread count — and what
 * the trainer must do with it: weights that stay bf16 values, a
 * checkpoint of BF16 weights that resumes bitwise across a delink,
 * checkpoints of the other master dtype refused by name (init.from takes
 * them, rounded to nearest), the spec's key and its refusals.
 */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt/checkpoint.h"
#include "kernels.h"
#include "model/gpt.h"
#include "spec/spec.h"
#include "train/trainer.h"

#define FIXTURE_NAME "masters"
#include "../common/trainer_fixture.h"
#include "../common/synth_data.h"
#include "../common/err_into.h"

/* ------------------------------------------------------------ by hand */

static uint32_t bits_(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float from_bits_(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* x a bf16 value: its low 16 bits zero */
static int is_bf16_(float x) { return (bits_(x) & 0xffffu) == 0; }

/* The two bf16 values around x (same sign, by magnitude: down toward
 * zero, up away from it), worked out from the bit pattern by hand. */
static void bf16_around_(float x, double *down, double *up)
{
    uint32_t u = bits_(x) & 0xffff0000u;
    *down = from_bits_(u);
    *up = from_bits_(u + 0x10000u);
}

/* Nearest bf16, ties to even, by hand (finite x): what init.from must
 * make of fp32 weights. */
static float rne_by_hand_(float x)
{
    double d, u;
    bf16_around_(x, &d, &u);
    double dd = fabs((double)x - d), du = fabs(u - (double)x);
    if (dd < du)
        return (float)d;
    if (du < dd)
        return (float)u;
    return (bits_((float)d) >> 16) & 1 ? (float)u : (float)d;
}

/* ------------------------------------------------------------ the rounding */

/* E[sr(x)] = x: the mean over 400000 elements' bits within 5 standard
 * deviations of a Bernoulli(p) step of one ulp, p = (x - down) / ulp
 * worked out here; each result is down or up; a bf16 value stays. */
static void test_sr_unbiased(void **state)
{
    (void)state;
    const float xs[] = {1.0f + 0.3f * 0.0078125f, -1.0f - 0.7f * 0.0078125f,
                        3.14159265f, -2.5e-3f, 1e-20f, 0.5f + 1e-6f,
                        1.0f /* a bf16 value */};
    const size_t N = 400000;
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        float x = xs[k];
        double down, up;
        bf16_around_(x, &down, &up);
        double ulp = fabs(up - down);
        double p = fabs((double)x - down) / ulp;
        double sum = 0.0;
        long n_up = 0;
        for (size_t i = 0; i < N; i++) {
            float r = sr_round_bf16(x, sr_bits(0x1234 + k, 7, i));
            assert_true(is_bf16_(r));
            assert_true((double)r == down || (double)r == up);
            n_up += (double)r == up;
            sum += r;
        }
        double mean = sum / (double)N;
        double sd = ulp * sqrt(p * (1.0 - p) / (double)N);
        printf("x %.9g: p %.4f, up %.4f of %zu, mean - x %.3g (sd %.3g)\n",
               (double)x, p, (double)n_up / (double)N, N,
               mean - (double)x, sd);
        if (p == 0.0) {
            assert_int_equal(n_up, 0);
            continue;
        }
        if (fabs(mean - (double)x) > 5.0 * sd)
            fail_msg("x %.9g: mean %.12g is %.1f sd from x", (double)x, mean,
                     fabs(mean - (double)x) / sd);
    }
    /* NaN stays NaN, infinities stay */
    assert_true(isnan(sr_round_bf16(NAN, 0xffffu)));
    assert_true(sr_round_bf16(INFINITY, 0xffffu) == INFINITY);
}

/* AdamW with a constant gradient g: mhat = g, vhat = g^2 at every step,
 * each step moves a weight by lr * g / (|g| + eps), here 2e-4 against
 * 1.0's half ulp of 2e-3 (round-to-nearest keeps every weight at 1.0).
 * After K steps the mean weight must have moved by the fp32 steps' sum,
 * computed here in double, within 5 sd of the rounding's noise (each step
 * adds at most ulp^2/4 of variance). Likewise Adafactor (a matrix, no
 * first moment), whose step is lr * g / sqrt(g^2 + eps1) unclipped. */
static void sr_moves_(int adafactor, int threads)
{
    const int R = 256, C = 1024, K = 40;
    const size_t N = (size_t)R * C;
    const float lr = 2e-4f, g0 = 0.5f, eps = 1e-8f;
    float *p = malloc(N * sizeof *p), *g = malloc(N * sizeof *g);
    float *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
    float *r = calloc((size_t)R, sizeof *r), *c = calloc((size_t)C, sizeof *c);
    assert_true(p && g && m && v && r && c);
    for (size_t i = 0; i < N; i++) {
        p[i] = 1.0f;
        g[i] = g0;
    }
    omp_set_num_threads(threads);
    double want = 0.0; /* the fp32 updates' sum, in double */
    adafactor_hparams h = {lr, 0.0f, 0.8f, 1.0f, 1e-30f, 1e-3f, 0, 1.0f};
    for (long t = 1; t <= K; t++) {
        if (adafactor) {
            adafactor_span sp = {p, g, NULL, r, c, R, C, 0.0f, t,
                                 sr_span_key(42, 0, 0)};
            assert_int_equal(adafactor_update_spans(&sp, 1, &h), 0);
            double u = g0 / sqrt((double)g0 * g0 + 1e-30);
            want += lr * u / fmax(1.0, fabs(u) / 1.0);
        } else {
            adamw_span sp = {p, g, m, v, N, 0.0f, t, sr_span_key(42, 0, 0),
                             0};
            adamw_update_spans(&sp, 1, lr, 0.9f, 0.999f, eps, 1.0f);
            want += lr * g0 / (g0 + eps);
        }
    }
    omp_set_num_threads(omp_get_num_procs());
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        assert_true(is_bf16_(p[i]));
        sum += 1.0 - p[i];
    }
    double moved = sum / (double)N;
    double ulp = 0.0078125; /* at 1.0 and above; 2^-8 below: the larger */
    double sd = sqrt((double)K) * ulp / 2.0 / sqrt((double)N);
    printf("%s, %d threads: moved %.6g on average, fp32 sum %.6g, 5 sd "
           "%.3g\n", adafactor ? "Adafactor" : "AdamW", threads, moved, want,
           5 * sd);
    assert_true(lr < 0.25 * ulp / 2.0); /* every step below half an ulp */
    if (fabs(moved - want) > 5.0 * sd)
        fail_msg("moved %.6g, want %.6g (5 sd %.3g)", moved, want, 5 * sd);
    free(p);
    free(g);
    free(m);
    free(v);
    free(r);
    free(c);
}

static void test_sr_moves_small_updates(void **state)
{
    (void)state;
    sr_moves_(0, 2);
    sr_moves_(1, 2);
}

/* The same bits on 1 and 3 threads (the bits are a hash of the element's
 * place, not of a generator's state). */
static void test_sr_threads_bitwise(void **state)
{
    (void)state;
    const size_t N = 100003;
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    float *g = malloc(N * sizeof *g), *m[2], *v[2];
    assert_true(a && b && g);
    for (int k = 0; k < 2; k++) {
        m[k] = calloc(N, sizeof(float));
        v[k] = calloc(N, sizeof(float));
        assert_true(m[k] && v[k]);
    }
    for (size_t i = 0; i < N; i++) {
        a[i] = b[i] = rne_by_hand_(sinf((float)i));
        g[i] = cosf(0.37f * (float)i);
    }
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k ? 3 : 1);
        for (long t = 1; t <= 3; t++) {
            adamw_span sp = {k ? b : a, g, m[k], v[k], N, 0.1f, t,
                             sr_span_key(7, 3, 16), 0};
            adamw_update_spans(&sp, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f);
        }
    }
    omp_set_num_threads(omp_get_num_procs());
    assert_memory_equal(a, b, N * sizeof *a);
    /* and they moved */
    int moved = 0;
    for (size_t i = 0; i < N; i++)
        moved |= a[i] != rne_by_hand_(sinf((float)i));
    assert_true(moved);
    free(a);
    free(b);
    free(g);
    for (int k = 0; k < 2; k++) {
        free(m[k]);
        free(v[k]);
    }
}

/* A span that is the second part of a tensor (sr_base its first
 * element there: a rank's experts) rounds as the whole tensor's update
 * rounds those elements; with base 0 it rounds otherwise. */
static void test_sr_base_part_of_tensor(void **state)
{
    (void)state;
    const size_t N = 4096, K = 1536;
    float *w = malloc(N * sizeof *w), *p = malloc(N * sizeof *p);
    float *q = malloc(N * sizeof *q), *g = malloc(N * sizeof *g);
    float *m = calloc(3 * N, sizeof *m), *v = calloc(3 * N, sizeof *v);
    assert_true(w && p && q && g && m && v);
    for (size_t i = 0; i < N; i++) {
        w[i] = p[i] = q[i] = rne_by_hand_(sinf((float)i));
        g[i] = cosf(0.37f * (float)i);
    }
    uint64_t key = sr_span_key(7, 2, 64);
    adamw_span whole = {w, g, m, v, N, 0.1f, 1, key, 0};
    adamw_span part = {p + K, g + K, m + N + K, v + N + K, N - K, 0.1f, 1,
                       key, K};
    adamw_span nobase = {q + K, g + K, m + 2 * N + K, v + 2 * N + K, N - K,
                         0.1f, 1, key, 0};
    adamw_update_spans(&whole, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f);
    adamw_update_spans(&part, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f);
    adamw_update_spans(&nobase, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 1.0f);
    assert_memory_equal(w + K, p + K, (N - K) * sizeof *w);
    size_t differ = 0;
    for (size_t i = K; i < N; i++)
        differ += q[i] != w[i];
    assert_true(differ > (N - K) / 8);  /* half the roundings, about */
    free(w);
    free(p);
    free(q);
    free(g);
    free(m);
    free(v);
}

/* ------------------------------------------------------------ the spec */

static void test_spec_key_and_refusals(void **state)
{
    (void)state;
    run_spec s;
    char err[512];
    const char *base = "{\"data\": {\"train\": \"t*\", \"val\": \"v*\"}";
    fixture_spec_parse(&s, base, NULL);
    assert_int_equal(s.optimizer.master, MASTER_FP32);
    uint64_t h0 = spec_hash(&s);
    /* fp32 written out is the default: the same hash, no key in the text */
    fixture_spec_parse(&s, base, "\"optimizer\": {\"master\": \"fp32\"}");
    assert_true(spec_hash(&s) == h0);
    char *text = spec_to_json(&s);
    assert_null(strstr(text, "master"));
    free(text);
    /* bf16 with AdamW and with Adafactor: accepted, written, hashed */
    const char *ok[] = {"{\"master\": \"bf16\"}",
                        "{\"name\": \"adafactor\", \"master\": \"bf16\"}"};
    for (int i = 0; i < 2; i++) {
        char more[256];
        snprintf(more, sizeof more, "\"optimizer\": %s", ok[i]);
        fixture_spec_parse(&s, base, more);
        assert_int_equal(s.optimizer.master, MASTER_BF16);
        assert_true(spec_hash(&s) != h0);
        text = spec_to_json(&s);
        assert_non_null(strstr(text, "\"master\": \"bf16\""));
        run_spec back;
        if (spec_parse(&back, text, strlen(text), err, sizeof err) != 0)
            fail_msg("%s: %s", text, err);
        assert_true(spec_hash(&back) == spec_hash(&s));
        free(text);
    }
    const char *const bad[][2] = {
        {"\"optimizer\": {\"master\": \"fp16\"}", "optimizer.master"},
        {"\"optimizer\": {\"master\": \"bf16\"}, \"device\": "
         "{\"backend\": \"cuda\", \"memory_budget\": \"1GiB\"}, "
         "\"offload\": {\"speculative\": \"on\"}",
         "optimizer.master \"bf16\" on device.backend \"cuda\" with "
         "offload.speculative \"on\""},
    };
    fixture_spec_refusals(base, bad, sizeof bad / sizeof bad[0]);
    /* bf16 masters on cuda, offloaded slots too (tests/gpu/test_masters),
     * and offloaded slots on cpu (test_offload.c) */
    fixture_optimizer_accepted(base, "{\"master\": \"bf16\"}");
    fixture_spec_parse(&s, base, "\"optimizer\": {\"master\": \"bf16\", "
                       "\"name\": \"adafactor\"}, \"device\": {\"backend\": "
                       "\"cuda\", \"memory_budget\": \"1GiB\"}");
    assert_int_equal(s.optimizer.master, MASTER_BF16);
    assert_int_equal(s.optimizer.name, OPTIMIZER_ADAFACTOR);
    fixture_optimizer_accepted(base, "{\"master\": \"bf16\", "
                                     "\"name\": \"adafactor\"}");
}

/* ------------------------------------------------------------ trainer */

static run_spec bf16_spec_(long steps, long pseudo, int adafactor)
{
    run_spec s = synth_tiny_spec(tmpdir_, 3, steps, pseudo);
    s.optimizer.master = MASTER_BF16;
    if (adafactor)
        s.optimizer.name = OPTIMIZER_ADAFACTOR;
    s.train.lr = 1e-2f;
    s.train.min_lr = 1e-3f;
    s.device.threads = 2;
    return s;
}

/* Every weight of t a bf16 value. */
static void assert_weights_bf16_(trainer *t)
{
    float *p = fixture_copy_state(t, 0);
    size_t n = trainer_copy_state(t, 0, NULL);
    for (size_t i = 0; i < n; i++)
        if (!is_bf16_(p[i]))
            fail_msg("weight %zu is %.9g, not a bf16 value", i, (double)p[i]);
    free(p);
}

/* Save at 12 (after the delink at 6), run on to 20: a trainer loading the
 * checkpoint (a fresh one) gives the same losses
 * for 13..20 bitwise and the same weights and state at 20; the weights
 * are bf16 values all along and stored as BF16. AdamW, and Adafactor
 * without a first moment. */
static void test_resume_bitwise(void **state)
{
    (void)state;
    for (int af = 0; af < 2; af++) {
        run_spec s = bf16_spec_(20, 6, af);
        float a[20];
        char dir[512];
        snprintf(dir, sizeof dir, "%s/bf16-ckpt-%d", tmpdir_, af);
        trainer *t = fixture_trainer(&s);
        assert_weights_bf16_(t);
        fixture_run_steps(t, &s, 12, a, NULL);
        assert_weights_bf16_(t);
        assert_true(fixture_save(t, dir) > 0);
        const char *head = fixture_ckpt_header(dir);
        assert_non_null(strstr(head, "\"dtype\":\"BF16\""));
        assert_null(strstr(head, "\"dtype\":\"F32\""));
        fixture_resume_same(t, &s, dir, 12, 20, a);
        assert_true(a[19] < a[0]); /* it learns */
        assert_weights_bf16_(t);
        trainer_free(t);
    }
}

/* The delink copies the pseudo slot's bf16 masters into every layer's
 * slot bit for bit (the globals kept), with AdamW and with Adafactor: the
 * loss on a batch is the same before and after, and training goes on. */
static void test_delink_copies_masters(void **state)
{
    (void)state;
    for (int af = 0; af < 2; af++) {
        run_spec s = bf16_spec_(8, 4, af);
        trainer *t = fixture_trainer(&s);
        fixture_run_steps(t, &s, 4, NULL, NULL);
        size_t n0 = trainer_copy_state(t, 0, NULL);
        float *p0 = fixture_copy_state(t, 0);
        fixture_delink_keeps_loss(t, 1, 3);
        size_t n1 = trainer_copy_state(t, 0, NULL);
        float *p1 = fixture_copy_state(t, 0);
        /* plain layout: globals, then the slots; 1 slot before, 3 after */
        size_t slot = (n1 - n0) / 2, glob = n0 - slot;
        assert_int_equal(n1, glob + 3 * slot);
        assert_memory_equal(p0, p1, glob * sizeof(float));
        for (int k = 0; k < 3; k++)
            assert_memory_equal(p1 + glob + k * slot, p0 + glob,
                                slot * sizeof(float));
        fixture_run_steps(t, &s, 8, NULL, NULL);
        assert_weights_bf16_(t);
        free(p0);
        free(p1);
        trainer_free(t);
    }
}

/* The master weights change the run: bf16's losses are not fp32's (the
 * two specs differ in that key alone). */
static void test_bf16_differs_from_fp32(void **state)
{
    (void)state;
    run_spec s[2] = {bf16_spec_(4, 0, 0), bf16_spec_(4, 0, 0)};
    s[0].optimizer.master = MASTER_FP32;
    float l[2][4];
    for (int i = 0; i < 2; i++) {
        trainer *t = fixture_trainer(&s[i]);
        fixture_run_steps(t, &s[i], 4, l[i], NULL);
        trainer_free(t);
    }
    assert_true(memcmp(l[0], l[1], sizeof l[0]) != 0);
    /* but close: bf16 weights of the same run */
    assert_true(fabsf(l[0][3] - l[1][3]) < 0.05f * l[0][3]);
}

/* An fp32-master checkpoint into a bf16 run and the reverse: refused by
 * name. init.from the fp32 one into a bf16 run: its weights rounded to
 * the nearest bf16 (by hand here), the optimizer fresh, and it trains. */
static void test_other_master_refused(void **state)
{
    (void)state;
    char dir[2][512];
    run_spec sp[2] = {bf16_spec_(10, 0, 0), bf16_spec_(10, 0, 0)};
    sp[0].optimizer.master = MASTER_FP32;
    const char *const want[2] = {
        "holds bf16 master weights and this run uses optimizer.master "
        "\"fp32\"",
        "holds fp32 master weights and this run uses optimizer.master "
        "\"bf16\""};
    fixture_cross_load_refused(sp, "master", dir, want);
    run_spec si;
    trainer *a, *w;
    fixture_init_from(&sp[1], &sp[0], dir[0], &si, &a, &w);
    size_t n = trainer_copy_state(a, 0, NULL);
    float *pa = fixture_copy_state(a, 0), *pw = fixture_copy_state(w, 0);
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) {
        if (pa[i] != rne_by_hand_(pw[i]))
            fail_msg("weight %zu: %.9g, the nearest bf16 of %.9g is %.9g", i,
                     (double)pa[i], (double)pw[i],
                     (double)rne_by_hand_(pw[i]));
        changed += pa[i] != pw[i];
    }
    assert_true(changed > n / 2); /* fp32 weights, mostly not bf16 ones */
    fixture_run_steps(a, &si, 3, NULL, NULL);
    free(pa);
    free(pw);
    trainer_free(a);
    trainer_free(w);
}

/* safetensors with BF16 tensors: written 2 bytes an element, read back
 * widened exactly; a value that is not a bf16 one refused, not rounded. */
static void test_safetensors_bf16(void **state)
{
    (void)state;
    char path[600], err[256];
    snprintf(path, sizeof path, "%s/bf16.safetensors", tmpdir_);
    float a[5] = {1.0f, -0.0078125f, 3.0e-20f, 0.0f, 65280.0f};
    a[2] = rne_by_hand_(a[2]);
    float b[3] = {1.5f, 2.0f, -4.0f};
    st_tensor ts[2] = {{"a", a, 1, {5, 0}}, {"b", b, 1, {3, 0}}};
    unsigned char bf[2] = {1, 0};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    long n = safetensors_write_dtypes(f, ts, bf, 2, err, sizeof err);
    fclose(f);
    assert_true(n > 0);
    st_file sf;
    assert_int_equal(safetensors_open(&sf, path, err, sizeof err), 0);
    char dt[16];
    int nd;
    long sh[4];
    assert_int_equal(safetensors_info(&sf, "a", dt, &nd, sh, err, sizeof err),
                     0);
    assert_string_equal(dt, "BF16");
    assert_int_equal(safetensors_info(&sf, "b", dt, &nd, sh, err, sizeof err),
                     0);
    assert_string_equal(dt, "F32");
    float ra[5], rb[3];
    assert_int_equal(safetensors_get(&sf, "a", ra, 5, err, sizeof err), 0);
    assert_int_equal(safetensors_get(&sf, "b", rb, 3, err, sizeof err), 0);
    assert_memory_equal(ra, a, sizeof a);
    assert_memory_equal(rb, b, sizeof b);
    /* the data region: 5 x 2 + 3 x 4 bytes */
    assert_int_equal((long)(sf.len - sf.data_start), 5 * 2 + 3 * 4);
    safetensors_close(&sf);
    /* not a bf16 value: refused, naming the tensor and element */
    a[3] = 1.0f + 1e-6f;
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(safetensors_write_dtypes(f, ts, bf, 2, err, sizeof err),
                     -1);
    fclose(f);
    assert_non_null(strstr(err, "tensor a: element 3 is not a bf16 value"));
}

/* A bf16 run's checkpoint whose weights file is an fp32 run's (same
 * names, meta.json saying bf16): refused naming the tensor's dtype. */
static void test_weights_of_other_dtype_refused(void **state)
{
    (void)state;
    char err[512], dir[2][512], src[700], dst[700];
    run_spec sp[2] = {bf16_spec_(10, 0, 0), bf16_spec_(10, 0, 0)};
    sp[0].optimizer.master = MASTER_FP32;
    for (int i = 0; i < 2; i++) {
        snprintf(dir[i], sizeof dir[i], "%s/dtype-%d", tmpdir_, i);
        trainer *t = fixture_trainer(&sp[i]);
        fixture_run_steps(t, &sp[i], 2, NULL, NULL);
        assert_true(fixture_save(t, dir[i]) > 0);
        trainer_free(t);
    }
    snprintf(src, sizeof src, "%s/model.safetensors", dir[0]);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir[1]);
    assert_int_equal(rename(src, dst), 0);
    trainer *t = fixture_trainer(&sp[1]);
    assert_int_not_equal(ERR_INTO(err, trainer_load(t, dir[1], &err_)), 0);
    if (!strstr(err, "is F32, this run keeps it in BF16"))
        fail_msg("error '%s' does not name the dtype", err);
    trainer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sr_unbiased),
        cmocka_unit_test(test_sr_moves_small_updates),
        cmocka_unit_test(test_sr_threads_bitwise),
        cmocka_unit_test(test_sr_base_part_of_tensor),
        cmocka_unit_test(test_spec_key_and_refusals),
        cmocka_unit_test(test_resume_bitwise),
        cmocka_unit_test(test_delink_copies_masters),
        cmocka_unit_test(test_bf16_differs_from_fp32),
        cmocka_unit_test(test_other_master_refused),
        cmocka_unit_test(test_safetensors_bf16),
        cmocka_unit_test(test_weights_of_other_dtype_refused),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
