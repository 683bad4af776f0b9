/*
 * test_stats.c — the /metrics figures (daemon/http/stats.c) against
 * hand-computed values: histogram buckets at their bounds, counters by
 * phase, label escaping, unknown gauges left out, requests counted, and
 * FLOP/s and MFU from the FLOPs per token a step carries (the FLOPs
 * themselves are model/facts.h's, tested in test_facts).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/stats.h"
#include "../common/test_main.h"

static char *render_(http_stats *s)
{
    char *out;
    size_t len;
    assert_int_equal(stats_render(s, &out, &len), 0);
    assert_int_equal(strlen(out), len);
    return out;
}

/* The value of the line that starts with `series ` (NAN when none). */
static double value_(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

static stats_step_rec rec_(int phase, long step, double seconds)
{
    return (stats_step_rec){
        .run_id = 3, .name = "r", .phase = phase, .step = step,
        .train_loss = 2.5, .val_loss = NAN, .lr = 1e-3, .grad_norm = 1,
        .tokens_per_s = 1000, .tokens = 256, .step_seconds = seconds,
        .resident_slots = 2, .copy_hidden_fraction = NAN,
        .h2d_bytes = 100, .d2h_bytes = 50,
    };
}

#define L_ "run=\"3\",name=\"r\",node=\"n1\""

static void test_histogram_bounds(void **state)
{
    (void)state;
    http_stats *s = stats_new(1000, "n1", 0);
    double obs[] = {0.25, 0.2500001, 0.1, 0.004, 200};
    for (int i = 0; i < 5; i++) {
        stats_step_rec r = rec_(0, i + 1, obs[i]);
        stats_step(s, &r);
    }
    char *t = render_(s);
    const char *b = "m6_step_duration_seconds_bucket{" L_ ",phase=\"pseudo\",le=";
    char k[256];
    struct { const char *le; double want; } cases[] = {
        {"0.005", 1}, {"0.01", 1}, {"0.1", 2}, {"0.25", 3}, {"0.5", 4},
        {"120", 4}, {"+Inf", 5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(k, sizeof k, "%s\"%s\"}", b, cases[i].le);
        assert_float_equal(value_(t, k), cases[i].want, 0);
    }
    assert_float_equal(value_(t, "m6_step_duration_seconds_count{" L_ ",phase=\"pseudo\"}"), 5, 0);
    assert_float_equal(value_(t, "m6_step_duration_seconds_sum{" L_ ",phase=\"pseudo\"}"),
                       0.25 + 0.2500001 + 0.1 + 0.004 + 200, 1e-12);
    /* the real phase never ran: no series of it */
    assert_null(strstr(t, "phase=\"real\",le="));
    free(t);
    stats_free(s);
}

/* the GEMM library's info gauge: absent until set, then exactly the
 * values set (label values escaped), 1 or 0 for the self-check */
static void test_gemm_info(void **state)
{
    (void)state;
    http_stats *s = stats_new(1000, "n1", 0);
    char *t = render_(s);
    assert_null(strstr(t, "m6_cpu_gemm_info"));
    free(t);
    stats_set_gemm(s, "onednn", "2.6.3", "avx512_core", 0, 1, 0);
    t = render_(s);
    assert_non_null(strstr(t, "# TYPE m6_cpu_gemm_info gauge\n"));
    assert_non_null(strstr(t, "\nm6_cpu_gemm_info{node=\"n1\",library=\"onednn\","
                              "version=\"2.6.3\",isa=\"avx512_core\","
                              "precision=\"fp32\",emulated=\"0\"} 1\n"));
    assert_non_null(strstr(t, "\nm6_cpu_gemm_info{node=\"n1\",library=\"onednn\","
                              "version=\"2.6.3\",isa=\"avx512_core\","
                              "precision=\"bf16\",emulated=\"1\"} 0\n"));
    free(t);
    stats_set_gemm(s, "loops", "none", "a\"b", 1, 0, 1);
    t = render_(s);
    assert_non_null(strstr(t, "\nm6_cpu_gemm_info{node=\"n1\",library=\"loops\","
                              "version=\"none\",isa=\"a\\\"b\",precision=\"fp32\","
                              "emulated=\"0\"} 0\n"));
    assert_non_null(strstr(t, "\nm6_cpu_gemm_info{node=\"n1\",library=\"loops\","
                              "version=\"none\",isa=\"a\\\"b\",precision=\"bf16\","
                              "emulated=\"0\"} 1\n"));
    assert_null(strstr(t, "onednn"));
    free(t);
    stats_free(s);
}

static void test_counters_by_phase(void **state)
{
    (void)state;
    http_stats *s = stats_new(1000, "n1", 1e12);
    for (int i = 1; i <= 7; i++) {
        stats_step_rec r = rec_(i > 4, i, 0.01);
        r.val_loss = i == 4 ? 2.25 : NAN;
        r.flops_per_token = 1e6;
        stats_step(s, &r);
    }
    char *t = render_(s);
    assert_float_equal(value_(t, "m6_steps_total{" L_ ",phase=\"pseudo\"}"), 4, 0);
    assert_float_equal(value_(t, "m6_steps_total{" L_ ",phase=\"real\"}"), 3, 0);
    assert_float_equal(value_(t, "m6_tokens_total{" L_ ",phase=\"real\"}"), 3 * 256, 0);
    assert_float_equal(value_(t, "m6_host_to_device_bytes_total{" L_ ",phase=\"pseudo\"}"), 400, 0);
    assert_float_equal(value_(t, "m6_device_to_host_bytes_total{" L_ ",phase=\"real\"}"), 150, 0);
    assert_float_equal(value_(t, "m6_run_step{" L_ "}"), 7, 0);
    assert_float_equal(value_(t, "m6_run_phase{" L_ ",phase=\"real\"}"), 1, 0);
    assert_float_equal(value_(t, "m6_run_phase{" L_ ",phase=\"pseudo\"}"), 0, 0);
    /* the latest evaluation is kept across steps without one */
    assert_float_equal(value_(t, "m6_val_loss{" L_ "}"), 2.25, 0);
    /* 1e6 FLOPs/token x 1000 tokens/s against a 1e12 peak */
    assert_float_equal(value_(t, "m6_model_flops_per_second{" L_ "}"), 1e9, 0);
    assert_float_equal(value_(t, "m6_mfu_ratio{" L_ "}"), 1e-3, 1e-15);
    /* unknown: left out, never NaN; a dense run has no MoE series */
    assert_null(strstr(t, "m6_copy_hidden_ratio{"));
    assert_null(strstr(t, "m6_moe_aux_loss{"));
    assert_null(strstr(t, "m6_moe_step"));
    assert_null(strstr(t, "NaN"));
    free(t);
    stats_free(s);
}

static void test_labels_and_requests(void **state)
{
    (void)state;
    http_stats *s = stats_new(1796140000, "n\"1", 0);
    stats_step_rec r = rec_(0, 1, 0.01);
    r.name = "a\"b\\c\nd";
    stats_step(s, &r);
    stats_request(s, "status", "ok");
    stats_request(s, "status", "ok");
    stats_request(s, "status", "not_found");
    stats_http(s, 404);
    char *t = render_(s);
    assert_non_null(strstr(t, "m6_run_step{run=\"3\",name=\"a\\\"b\\\\c\\nd\",node=\"n\\\"1\"} 1\n"));
    assert_float_equal(value_(t, "m6_control_requests_total{type=\"status\",status=\"ok\"}"), 2, 0);
    assert_float_equal(value_(t, "m6_control_requests_total{type=\"status\",status=\"not_found\"}"), 1, 0);
    assert_float_equal(value_(t, "m6_http_requests_total{code=\"404\"}"), 1, 0);
    assert_float_equal(value_(t, "process_start_time_seconds"), 1796140000, 0);
    assert_non_null(strstr(t, "# TYPE m6_step_duration_seconds histogram\n"));
    assert_non_null(strstr(t, "# TYPE m6_tokens_total counter\n"));
    /* no MFU without a peak */
    assert_null(strstr(t, "m6_mfu_ratio"));
    free(t);
    stats_free(s);
}

/* An MoE run's latest step: the whole step's per-expert counts as
 * gauges, exactly as published; after a step whose idle count is unknown
 * (-1: train.expert_idle_steps 0) that gauge is left out, the others
 * stay. */
static void test_moe_step_gauges(void **state)
{
    (void)state;
    http_stats *s = stats_new(1000, "n1", 0);
    stats_step_rec r = rec_(0, 1, 0.01);
    r.moe = 1;
    r.moe_aux_loss = 1.5;
    r.moe_dropped_fraction = 0.25;
    r.moe_load_min = 1;
    r.moe_load_max = 9;
    r.moe_load_cv = 0.5;
    r.moe_step_tokens_min = 0;
    r.moe_step_tokens_max = 123456789;
    r.moe_step_experts_empty = 3;
    r.moe_step_dropped = 17;
    r.moe_experts_idle = 2;
    stats_step(s, &r);
    char *t = render_(s);
    assert_float_equal(value_(t, "m6_moe_step_expert_tokens_min{" L_ "}"), 0, 0);
    assert_float_equal(value_(t, "m6_moe_step_expert_tokens_max{" L_ "}"), 123456789, 0);
    assert_float_equal(value_(t, "m6_moe_step_experts_empty{" L_ "}"), 3, 0);
    assert_float_equal(value_(t, "m6_moe_step_dropped_pairs{" L_ "}"), 17, 0);
    assert_float_equal(value_(t, "m6_moe_experts_idle{" L_ "}"), 2, 0);
    assert_non_null(strstr(t, "# TYPE m6_moe_step_dropped_pairs gauge\n"));
    free(t);
    r.step = 2;
    r.moe_experts_idle = -1;
    stats_step(s, &r);
    t = render_(s);
    assert_null(strstr(t, "m6_moe_experts_idle"));
    assert_float_equal(value_(t, "m6_moe_step_experts_empty{" L_ "}"), 3, 0);
    assert_null(strstr(t, "NaN"));
    free(t);
    stats_free(s);
}

TEST_MAIN(
    cmocka_unit_test(test_histogram_bounds),
    cmocka_unit_test(test_moe_step_gauges),
    cmocka_unit_test(test_gemm_info),
    cmocka_unit_test(test_counters_by_phase),
    cmocka_unit_test(test_labels_and_requests))
