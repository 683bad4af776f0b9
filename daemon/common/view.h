/*
 * view.h — one renderer for everything m6 prints as data. A view is a table
 * of fields (JSON/CSV name, text header or label, type, text format,
 * accessor); the functions below render rows of any view as an aligned
 * text table, "label: value" records, one line, CSV or JSON. m6ctl's
 * views (list, status, metrics, events, watch's line) and the memory plan
 * (offload/plan.c) are such tables, so each of them is written once.
 *
 * Numbers are written in their shortest round-trip form wherever the
 * field's format does not say otherwise: a float32 with the fewest digits
 * (%.1g .. %.9g) that read back as the same float32, a double likewise up
 * to 17 digits. Unknown values (NaN, or a count < 0 where the field says
 * so) are null in JSON, empty in CSV and "-" in text.
 */
#ifndef M6_VIEW_H
#define M6_VIEW_H

#include <stdio.h>

#include <jansson.h>

/* The type of a field's value, as its accessor fills it. */
typedef enum {
    VIEW_INT,  /* i */
    VIEW_F32,  /* d, holding a float32 value */
    VIEW_F64,  /* d */
    VIEW_STR,  /* s */
    VIEW_JSON, /* j: a JSON value built by the accessor (new reference,
                * the renderer releases it); text shows .text */
    VIEW_SUB,  /* sub/sub_row: a nested object, another view of a row
                * (JSON only); sub NULL: unknown */
} view_type;

/* How text shows a value (JSON and CSV always show the plain value). */
typedef enum {
    VF_PLAIN = 0, /* integers as they are, floats shortest, strings */
    VF_LOSS,      /* %.4f */
    VF_RATE,      /* %.0f (tokens/s) */
    VF_G3,        /* %.3g (GB/s) */
    VF_PCT,       /* a fraction 0..1 as %.0f%% */
    VF_BYTES,     /* "157.1 MiB" (%.4g of powers of 1024) */
    VF_SECONDS,   /* a duration: "42s", "3m05s", "2h07m" */
    VF_UTC,       /* unix seconds as 2026-12-01T14:05:59Z */
} view_fmt;

typedef struct view view;

/* One value, filled by a field's accessor. null: unknown. text: the text
 * form when it is not the format's rendering of the value (buf is the
 * accessor's scratch for it or for s). color: an ANSI colour for text on a
 * tty ("" none). */
typedef struct {
    int null;
    long long i;
    double d;
    const char *s;
    json_t *j;
    const view *sub;
    const void *sub_row;
    const char *text;
    const char *color;
    _Alignas(16) char buf[128]; /* also holds a VIEW_SUB row if need be */
} view_val;

typedef void (*view_get)(const void *row, view_val *v);

enum {
    VIEW_NEG_NULL = 1,  /* VIEW_INT: a value < 0 is unknown */
    VIEW_OMIT_NULL = 2, /* records: no line when the value is unknown */
    VIEW_CUT = 4,       /* text table: cut the value to the column width */
    VIEW_JSON_OMIT_NULL = 8, /* JSON: no key when the value is unknown */
};

typedef struct {
    const char *name;  /* JSON key and CSV column; NULL: text only */
    const char *head;  /* text table: column header; NULL: not a column */
    const char *label; /* records and lines: the label; NULL: not shown */
    int width;         /* text table: column width, < 0 left-aligned; 0 for
                        * the last column (not padded) */
    view_type type;
    view_fmt fmt;
    int flags;         /* VIEW_* above */
    view_get get;
} view_field;

struct view {
    const view_field *fields;
    int n;
};

#define VIEW_OF(table) {(table), (int)(sizeof(table) / sizeof((table)[0]))}

/* How a stream of rows is written. */
typedef enum {
    VIEW_TABLE,       /* header line, then one aligned line per row */
    VIEW_RECORDS,     /* per row: one "label:   value" line per field */
    VIEW_LINE,        /* per row: "label value label value ..." on one line
                       * (no newline: the caller ends it) */
    VIEW_CSV,         /* header line, then one comma-separated line per row */
    VIEW_JSON_ARRAY,  /* one indented JSON array of objects */
    VIEW_JSON_OBJECT, /* one indented JSON object (one row) */
    VIEW_JSON_LINES,  /* one compact JSON object per line */
} view_form;

/* A stream of rows of one view into f. Fill f, v, form (and color: ANSI
 * colours in text forms), then view_begin, view_row per row, view_end. */
typedef struct {
    FILE *f;
    const view *v;
    view_form form;
    int color;
    long rows; /* written so far */
} view_out;

/* Headers (table, CSV) or the opening bracket (JSON array). */
void view_begin(view_out *o);
/* One row; row is what the fields' accessors read. */
void view_row(view_out *o, const void *row);
/* The closing bracket of a JSON array (an empty one: "[]"). */
void view_end(view_out *o);

/* A float32 (f32 1) or a double in its shortest round-trip form, "%.Ng" with
 * the smallest N (1..9, 1..17) that reads back as the same value; where
 * that N would make %g write an exponent for a number with no more
 * integer digits than the type has (3e+03), the digits are written out
 * (3000). Into buf (>= 32 bytes), which is returned. NaN and infinities
 * as "nan", "inf", "-inf". */
const char *view_shortest(char *buf, size_t len, double v, int f32);

/* Bytes in binary units: n scaled by 1024 until below 1024 or EiB, then
 *   VIEW_BYTES_SIG4   "157.1 MiB", "512 B"   (%.4g; VF_BYTES, m6ctl)
 *   VIEW_BYTES_2DP    "1.50 MiB", "512 B"    (%.2f, bytes as a whole)
 *   VIEW_BYTES_EXACT  "1.50 MiB (1572864 bytes)", "1 byte", "512 bytes"
 * The one byte formatter of m6d and m6ctl (plans, views). Into buf, which
 * is returned. */
typedef enum { VIEW_BYTES_SIG4, VIEW_BYTES_2DP, VIEW_BYTES_EXACT } view_bytes_form;
const char *view_bytes(char *buf, size_t len, double n, view_bytes_form form);

/* The field of v called name (its JSON key); NULL when none. */
const view_field *view_field_named(const view *v, const char *name);

/* A field's value as its text form (the format applied; "-" when
 * unknown), into buf; for callers that write free text around values. */
const char *view_text(char *buf, size_t len, const view_field *fd,
                      const void *row);

#endif /* M6_VIEW_H */
