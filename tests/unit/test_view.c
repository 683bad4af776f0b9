/*
 * test_view.c — the field-table renderer (daemon/common/view.c): the
 * shortest round-trip form of floats, and one view rendered as a table,
 * records, CSV and JSON. Expected texts are written out by hand.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/view.h"
#include "../common/test_main.h"
#include "../common/view_render.h"

static void expect_f32_(float v, const char *want)
{
    char buf[48];
    assert_string_equal(view_shortest(buf, sizeof buf, v, 1), want);
}

static void expect_f64_(double v, const char *want)
{
    char buf[48];
    assert_string_equal(view_shortest(buf, sizeof buf, v, 0), want);
}

/* float32(0.0008) is 0.000799999979790300130844116210937500: %.17g of it
 * is what m6ctl printed before; the shortest text that reads back as the
 * same float32 is 0.0008. */
static void test_shortest(void **state)
{
    (void)state;
    expect_f32_(0.0008f, "0.0008");
    expect_f32_(1e-4f, "0.0001");      /* was 9.99999975e-05 in CSV */
    expect_f32_(2.500001f, "2.500001"); /* 7 digits: 2.5 is another float */
    expect_f32_(2.7f, "2.7");
    expect_f32_(0.1f, "0.1");
    expect_f32_(1.0f / 3.0f, "0.33333334"); /* 8 digits */
    expect_f32_(16777217.0f, "16777216");  /* 2^24 + 1 is not a float32 */
    expect_f32_(3000.0f, "3000");          /* not 3e+03 */
    expect_f32_(1e10f, "1e+10");           /* more integer digits than 9 */
    expect_f32_(-0.5f, "-0.5");
    expect_f32_(0.0f, "0");
    expect_f32_(1e-7f, "1e-07");
    expect_f64_(0.1, "0.1");
    expect_f64_(1.0 / 3.0, "0.3333333333333333"); /* 16 digits */
    expect_f64_(0.1 + 0.2, "0.30000000000000004"); /* 17 */
    expect_f64_(12345.5, "12345.5");
    expect_f64_(1796134308.25, "1796134308.25");
    expect_f64_(1e300, "1e+300");
    /* every float32 of a sweep reads back as itself, in at most 9 digits */
    char buf[48];
    for (float x = 1e-6f; x < 1e6f; x *= 1.0001234f) {
        view_shortest(buf, sizeof buf, x, 1);
        assert_true(strtof(buf, NULL) == x);
        assert_true(strlen(buf) <= 16);
    }
}

/* ---- a small view: a name, a float32 loss, a count that may be unknown */

typedef struct {
    const char *name;
    float loss;
    long long bytes;
} row_;

static void g_name_(const void *row, view_val *v) { v->s = ((const row_ *)row)->name; }
static void g_loss_(const void *row, view_val *v) { v->d = ((const row_ *)row)->loss; }
static void g_bytes_(const void *row, view_val *v) { v->i = ((const row_ *)row)->bytes; }

static const view_field fields_[] = {
    {"name", "NAME", "name", -6, VIEW_STR, VF_PLAIN, 0, g_name_},
    {"loss", "LOSS", "loss", -7, VIEW_F32, VF_LOSS, 0, g_loss_},
    {"bytes", "BYTES", "bytes", 0, VIEW_INT, VF_BYTES, VIEW_NEG_NULL | VIEW_OMIT_NULL,
     g_bytes_},
};
static const view view_ = VIEW_OF(fields_);

/* The rows rendered in form, as a string (caller frees). */
static char *render_(view_form form, const row_ *rows, int n)
{
    const void *p[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++)
        p[i] = &rows[i];
    return view_render(&view_, form, p, n);
}

static void expect_render_(view_form form, const row_ *rows, int n, const char *want)
{
    char *got = render_(form, rows, n);
    assert_string_equal(got, want);
    free(got);
}

static void test_forms(void **state)
{
    (void)state;
    const row_ rows[] = {{"a,b", 0.0008f, 1536}, {"c\"d", NAN, -1}};
    expect_render_(VIEW_TABLE, rows, 2,
                   "NAME   LOSS    BYTES\n"
                   "a,b    0.0008  1.5 KiB\n"
                   "c\"d    -       -\n");
    expect_render_(VIEW_CSV, rows, 2,
                   "name,loss,bytes\n"
                   "\"a,b\",0.0008,1536\n"
                   "\"c\"\"d\",,\n");
    expect_render_(VIEW_RECORDS, rows, 2,
                   "name:         a,b\n"
                   "loss:         0.0008\n"
                   "bytes:        1.5 KiB\n"
                   "name:         c\"d\n"
                   "loss:         -\n");
    expect_render_(VIEW_JSON_LINES, rows, 2,
                   "{\"name\":\"a,b\",\"loss\":0.0008,\"bytes\":1536}\n"
                   "{\"name\":\"c\\\"d\",\"loss\":null,\"bytes\":null}\n");
    expect_render_(VIEW_JSON_ARRAY, rows, 1,
                   "[\n"
                   "  {\n"
                   "    \"name\": \"a,b\",\n"
                   "    \"loss\": 0.0008,\n"
                   "    \"bytes\": 1536\n"
                   "  }\n"
                   "]\n");
    expect_render_(VIEW_JSON_ARRAY, rows, 0, "[]\n");
    /* the JSON parses back to the same values */
    char *js = render_(VIEW_JSON_ARRAY, rows, 2);
    json_error_t je;
    json_t *j = json_loads(js, 0, &je);
    free(js);
    assert_non_null(j);
    assert_int_equal(json_array_size(j), 2);
    assert_true(json_real_value(json_object_get(json_array_get(j, 0), "loss")) == 0.0008);
    assert_true(json_is_null(json_object_get(json_array_get(j, 1), "loss")));
    json_decref(j);
}

/* view_bytes, each form against values worked out by hand: 1572864 =
 * 1.5 * 1024^2; 1024^6 = 1 EiB, and 1024^7 stays in EiB (1024 EiB). */
static void test_bytes(void **state)
{
    (void)state;
    const double eib = 1152921504606846976.0; /* 1024^6 */
    const struct {
        double v;
        view_bytes_form form;
        const char *want;
    } cases[] = {
        {1572864, VIEW_BYTES_EXACT, "1.50 MiB (1572864 bytes)"},
        {1, VIEW_BYTES_EXACT, "1 byte"},
        {512, VIEW_BYTES_EXACT, "512 bytes"},
        {1572864, VIEW_BYTES_2DP, "1.50 MiB"},
        {512, VIEW_BYTES_2DP, "512 B"},
        {1023, VIEW_BYTES_2DP, "1023 B"},
        {1024, VIEW_BYTES_2DP, "1.00 KiB"},
        {164731290, VIEW_BYTES_SIG4, "157.1 MiB"},
        {512, VIEW_BYTES_SIG4, "512 B"},
        {eib, VIEW_BYTES_2DP, "1.00 EiB"},
        {eib * 1024, VIEW_BYTES_2DP, "1024.00 EiB"},
    };
    char b[64];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_string_equal(view_bytes(b, sizeof b, cases[i].v, cases[i].form),
                            cases[i].want);
}

TEST_MAIN(
    cmocka_unit_test(test_shortest),
    cmocka_unit_test(test_forms),
    cmocka_unit_test(test_bytes))
