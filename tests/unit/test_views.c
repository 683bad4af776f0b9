/*
 * test_views.c — m6ctl's run views (proto/views.c) on hand-made RunInfos:
 * what status, list and watch say of states, pending commands, phases,
 * times and memory; the metrics rows of an MoE run. Expected texts are
 * written out by hand.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/views.h"
#include "../common/test_main.h"
#include "../common/view_render.h"

/* A run as m6d describes it: running, step 5 of 100, Pseudo until 40. */
static M6__RunInfo run_(void)
{
    M6__RunInfo r = M6__RUN_INFO__INIT;
    r.id = 7;
    r.name = (char *)"demo";
    r.state = M6__RUN_STATE__RUN_STATE_RUNNING;
    r.phase = M6__PHASE__PHASE_PSEUDO;
    r.step = 5;
    r.total_steps = 100;
    r.train_loss = 2.5f;
    r.val_loss = NAN;
    r.tokens_per_s = 1234.4;
    r.lr = 0.0008f;
    r.delink_step = -1;
    r.pseudo_steps = 40;
    r.created = 1796134308.25; /* date -u -d @1796134308: 2026-12-01T14:11:48Z */
    r.updated = 0;
    r.error = (char *)"";
    r.eta_s = 95;
    r.checkpoint_step = -1;
    r.resident_slots = 2;
    r.peak_device_bytes = 1855488; /* 1.7695 MiB */
    r.h2d_gbps = r.d2h_gbps = r.copy_hidden_fraction = NAN;
    r.pending = (char *)"";
    r.backend = (char *)"cpu";
    return r;
}

/* The run rendered in form (caller frees). */
static char *render_(const view *v, view_form form, const M6__RunInfo *r, double eta)
{
    views_run_row row = {.r = r, .watch_eta = eta};
    const void *rows[1] = {&row};
    return view_render(v, form, rows, 1);
}

/* status's line for label, e.g. "phase", without the label ("" none) */
static char *line_(const M6__RunInfo *r, const char *label, char *out, size_t n)
{
    char *s = render_(&views_run, VIEW_RECORDS, r, -1);
    size_t k = strlen(label);
    out[0] = 0;
    for (const char *p = s; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len >= 14 && strncmp(p, label, k) == 0 && p[k] == ':')
            snprintf(out, n, "%.*s", (int)(len - 14), p + 14); /* the label column */
        p = nl ? nl + 1 : NULL;
    }
    free(s);
    return out;
}

static void test_status(void **state)
{
    (void)state;
    char b[160];
    M6__RunInfo r = run_();
    char *s = render_(&views_run, VIEW_RECORDS, &r, -1);
    printf("%s", s);
    assert_string_equal(s,
                        "id:           7\n"
                        "name:         demo\n"
                        "state:        running\n"
                        "phase:        pseudo (delink at step 40)\n"
                        "step:         5/100\n"
                        "train_loss:   2.5000\n"
                        "val_loss:     -\n"
                        "tokens_per_s: 1234\n"
                        "eta:          1m35s\n"
                        "offload:      off (no budget): 2/2 slots resident, memory pool "
                        "1.77 MiB\n"
                        "backend:      cpu\n"
                        "created:      2026-12-01T14:11:48Z\n"
                        "updated:      1970-01-01T00:00:00Z\n");
    free(s);
    /* a pending command shows next to the state */
    r.pending = (char *)"pausing";
    assert_string_equal(line_(&r, "state", b, sizeof b), "running (pausing)");
    /* a run that ended in the Pseudo phase will not delink any more */
    r.pending = (char *)"";
    r.state = M6__RUN_STATE__RUN_STATE_STOPPED;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "pseudo");
    r.state = M6__RUN_STATE__RUN_STATE_PAUSED;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "pseudo (delink at step 40)");
    /* delink.policy plateau: pseudo_steps is the latest step; an operator
     * delink pending is still "at step N" */
    r.delink_policy = (char *)"plateau";
    r.next_delink_step = r.pseudo_steps;
    assert_string_equal(line_(&r, "phase", b, sizeof b),
                        "pseudo (delink on a plateau, at step 40 at the latest)");
    r.next_delink_step = 5;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "pseudo (delink at step 5)");
    r.delink_policy = (char *)"";
    r.next_delink_step = 0;
    /* delinked */
    r.state = M6__RUN_STATE__RUN_STATE_COMPLETED;
    r.phase = M6__PHASE__PHASE_REAL;
    r.delink_step = 40;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "real (delinked at step 40)");
    /* from scratch: no Pseudo phase, never delinked (delink_step -1; 0 from
     * an m6d that had no column for it) */
    r.pseudo_steps = 0;
    r.delink_step = -1;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "real (trained from scratch)");
    r.delink_step = 0;
    assert_string_equal(line_(&r, "phase", b, sizeof b), "real (trained from scratch)");
    /* a GPU's memory is the device's; with a budget, the rates */
    r.backend = (char *)"cuda";
    assert_string_equal(line_(&r, "offload", b, sizeof b),
                        "off (no budget): 2/2 slots resident, device 1.77 MiB");
    r.device_budget_bytes = 2 << 20;
    r.resident_slots = 1;
    r.offloaded_slots = 1;
    r.h2d_gbps = 3.21;
    r.copy_hidden_fraction = 0.875;
    assert_string_equal(line_(&r, "offload", b, sizeof b),
                        "1/2 slots offloaded, peak 1.77 MiB of 2 MiB budget, h2d 3.21 GB/s, "
                        "88% of copy time hidden");
    /* unknown: no line */
    r.resident_slots = r.offloaded_slots = 0;
    assert_string_equal(line_(&r, "offload", b, sizeof b), "");
    r.checkpoint_step = 30;
    assert_string_equal(line_(&r, "checkpoint", b, sizeof b), "step 30");
}

static void test_json_and_lines(void **state)
{
    (void)state;
    M6__RunInfo r = run_();
    char *s = render_(&views_run, VIEW_JSON_OBJECT, &r, -1);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    assert_non_null(j);
    assert_non_null(strstr(s, "\n  \"lr\": 0.0008,\n"));
    assert_non_null(strstr(s, "\n  \"train_loss\": 2.5,\n"));
    assert_true(json_is_null(json_object_get(j, "pending")));
    assert_true(json_is_null(json_object_get(j, "delink_step")));
    assert_true(json_is_null(json_object_get(j, "val_loss")));
    assert_true(json_is_null(json_object_get(j, "error")));
    assert_null(json_object_get(j, "message")); /* only in the commands' replies */
    assert_string_equal(json_string_value(json_object_get(j, "backend")), "cpu");
    assert_int_equal(json_integer_value(json_object_get(j, "total_steps")), 100);
    json_decref(j);
    free(s);
    /* watch's line, with watch's own ETA */
    r.pending = (char *)"pausing";
    s = render_(&views_watch_line, VIEW_LINE, &r, 100.4);
    assert_string_equal(s, "step 5/100 running (pausing) pseudo loss 2.5000 val - tok/s 1234 "
                           "eta 1m40s");
    free(s);
    /* list's row */
    s = render_(&views_run, VIEW_TABLE, &r, -1);
    assert_string_equal(s,
                        "ID    NAME                 STATE               PHASE   STEP          "
                        "LOSS      VAL       TOK/S\n"
                        "7     demo                 running (pausing)   pseudo  5/100         "
                        "2.5000    -         1234\n");
    free(s);
}

/* Rows of `m6ctl metrics` for an MoE run (views_metrics_moe) in form
 * (caller frees). */
static char *metrics_render_(view_form form, M6__MetricRow *const *rows,
                             int n)
{
    return view_render(&views_metrics_moe, form, (const void *const *)rows,
                       n);
}

/* The whole step's per-expert figures: an MoE step with 3..40 tokens per
 * (block, expert), 2 empty, 17 pairs dropped, 1 idle; and a row without
 * them (-1: before schema 0014, or no idle count): empty in CSV, null in
 * JSON, "-" in the table. Expected texts by hand. */
static void test_metrics_moe_step(void **state)
{
    (void)state;
    M6__MetricRow a = M6__METRIC_ROW__INIT, b;
    a.step = 4;
    a.phase = M6__PHASE__PHASE_REAL;
    a.train_loss = 2.5f;
    a.val_loss = NAN;
    a.lr = 0.5f;
    a.tokens_per_s = 100;
    a.grad_norm = 1;
    a.resident_slots = 2;
    a.peak_device_bytes = -1;
    a.h2d_gbps = a.d2h_gbps = a.copy_hidden_fraction = NAN;
    a.moe_aux_loss = 1.25;
    a.moe_z_loss = 0.5;
    a.moe_dropped_fraction = 0.25;
    a.moe_load_min = 1;
    a.moe_load_max = 20;
    a.moe_load_cv = 0.5;
    a.moe_experts_empty = 0.75;
    a.moe_step_tokens_min = 3;
    a.moe_step_tokens_max = 40;
    a.moe_step_experts_empty = 2;
    a.moe_step_dropped = 17;
    a.moe_experts_idle = 1;
    b = a;
    b.step = 5;
    b.moe_step_tokens_min = b.moe_step_tokens_max = -1;
    b.moe_step_experts_empty = b.moe_step_dropped = b.moe_experts_idle = -1;
    M6__MetricRow *rows[] = {&a, &b};

    char *s = metrics_render_(VIEW_CSV, rows, 2);
    assert_non_null(strstr(s, ",moe_load_cv,moe_experts_empty,moe_step_tokens_min,"
                              "moe_step_tokens_max,moe_step_experts_empty,"
                              "moe_step_dropped,moe_experts_idle\n"));
    assert_non_null(strstr(s, ",0.5,0.75,3,40,2,17,1\n"));
    assert_non_null(strstr(s, ",0.5,0.75,,,,,\n"));
    free(s);

    s = metrics_render_(VIEW_JSON_ARRAY, rows, 2);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    assert_non_null(j);
    json_t *r0 = json_array_get(j, 0), *r1 = json_array_get(j, 1);
    assert_int_equal(json_integer_value(json_object_get(r0, "moe_step_tokens_min")), 3);
    assert_int_equal(json_integer_value(json_object_get(r0, "moe_step_tokens_max")), 40);
    assert_int_equal(json_integer_value(json_object_get(r0, "moe_step_experts_empty")), 2);
    assert_int_equal(json_integer_value(json_object_get(r0, "moe_step_dropped")), 17);
    assert_int_equal(json_integer_value(json_object_get(r0, "moe_experts_idle")), 1);
    const char *k[] = {"moe_step_tokens_min", "moe_step_tokens_max",
                       "moe_step_experts_empty", "moe_step_dropped",
                       "moe_experts_idle"};
    for (int i = 0; i < 5; i++)
        assert_true(json_is_null(json_object_get(r1, k[i])));
    json_decref(j);
    free(s);

    s = metrics_render_(VIEW_TABLE, rows, 2);
    assert_non_null(strstr(s, "LOAD_CV  EMPTY  STEP_MIN  STEP_MAX  STEP_EMPTY  "
                              "STEP_DROP  IDLE\n"));
    assert_non_null(strstr(s, "0.5      0.75   3         40        2           "
                               "17         1\n"));
    assert_non_null(strstr(s, "0.5      0.75   -         -         -           "
                               "-          -\n"));
    free(s);
}

TEST_MAIN(
    cmocka_unit_test(test_status),
    cmocka_unit_test(test_json_and_lines),
    cmocka_unit_test(test_metrics_moe_step))
