/*
 * view.c — the one renderer of field tables (view.h): text table, records,
 * one line, CSV and JSON from the same accessors.
 */
#include "common/view.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ numbers */

/* Significant digits of a %g form: its mantissa's digits, leading zeros
 * excepted. */
static int sig_digits_(const char *s)
{
    int n = 0, lead = 1;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (*s == '0' && lead)
            continue;
        lead = 0;
        n++;
    }
    return n ? n : 1;
}

static int round_trips_(const char *s, double v, int f32)
{
    return f32 ? strtof(s, NULL) == (float)v : strtod(s, NULL) == v;
}

/* The first N of 1..max whose %.Ng reads back as v. A float32 carries 24
 * bits (under 7.3 digits), a double 53: when %.6g (%.15g) already
 * round-trips, the smaller N that also does is its count of significant
 * digits (%g drops trailing zeros), so one more print finds it; else N is
 * among the few above. */
static int fewest_digits_(char *buf, size_t len, double v, int f32)
{
    const int mid = f32 ? 6 : 15, max = f32 ? 9 : 17;
    snprintf(buf, len, "%.*g", mid, v);
    if (round_trips_(buf, v, f32))
        return sig_digits_(buf);
    for (int n = mid + 1; n < max; n++) {
        snprintf(buf, len, "%.*g", n, v);
        if (round_trips_(buf, v, f32))
            return n;
    }
    return max;
}

const char *view_shortest(char *buf, size_t len, double v, int f32)
{
    if (isnan(v) || isinf(v)) {
        snprintf(buf, len, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return buf;
    }
    int n = fewest_digits_(buf, len, v, f32);
    /* %g writes an exponent when N is below the number's integer digits
     * (3e+03): write those digits out (3000), the same value, while they
     * are no more than the type's own digits. */
    int e = v == 0 ? 0 : (int)floor(log10(fabs(v)));
    if (e >= n && e < (f32 ? 9 : 17))
        n = e + 1;
    snprintf(buf, len, "%.*g", n, v);
    return buf;
}

const char *view_bytes(char *buf, size_t len, double n, view_bytes_form form)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = n;
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (form == VIEW_BYTES_SIG4)
        snprintf(buf, len, "%.4g %s", v, unit[u]);
    else if (form == VIEW_BYTES_2DP || u > 0)
        snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    else
        snprintf(buf, len, "%.0f byte%s", n, n == 1 ? "" : "s");
    if (form == VIEW_BYTES_EXACT && u > 0) {
        size_t k = strlen(buf);
        snprintf(buf + k, len - k, " (%.0f bytes)", n);
    }
    return buf;
}

/* Seconds as "42s", "3m05s" or "2h07m": rounded to whole seconds (or
 * minutes) first, so 179.6 s is "3m00s", not "2m60s". */
static void fmt_seconds_(char *buf, size_t n, double s)
{
    long long t = llround(s);
    if (t < 60)
        snprintf(buf, n, "%llds", t);
    else if (t < 3600)
        snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else {
        long long m = llround(s / 60);
        snprintf(buf, n, "%lldh%02lldm", m / 60, m % 60);
    }
}

static void fmt_utc_(char *buf, size_t n, double t)
{
    time_t s = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&s, &tm) || !strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, n, "?");
}

/* ------------------------------------------------------------- values */

static int is_float_(view_type t) { return t == VIEW_F32 || t == VIEW_F64; }

/* Run the accessor and settle what is unknown. */
static void get_(const view_field *fd, const void *row, view_val *v)
{
    memset(v, 0, offsetof(view_val, buf));
    v->buf[0] = 0;
    fd->get(row, v);
    if (is_float_(fd->type) && (isnan(v->d) || isinf(v->d)))
        v->null = 1;
    if (fd->type == VIEW_INT && (fd->flags & VIEW_NEG_NULL) && v->i < 0)
        v->null = 1;
    if ((fd->type == VIEW_STR && !v->s) || (fd->type == VIEW_SUB && !v->sub))
        v->null = 1;
}

static void release_(view_val *v)
{
    json_decref(v->j);
    v->j = NULL;
}

/* A value as text (a table cell, a record, a line). */
static const char *text_(const view_field *fd, view_val *v, char *buf, size_t len)
{
    if (v->text)
        return v->text;
    if (v->null)
        return "-";
    double x = fd->type == VIEW_INT ? (double)v->i : v->d;
    switch (fd->fmt) {
    case VF_LOSS: snprintf(buf, len, "%.4f", x); return buf;
    case VF_RATE: snprintf(buf, len, "%.0f", x); return buf;
    case VF_G3: snprintf(buf, len, "%.3g", x); return buf;
    case VF_PCT: snprintf(buf, len, "%.0f%%", 100.0 * x); return buf;
    case VF_BYTES: return view_bytes(buf, len, x, VIEW_BYTES_SIG4);
    case VF_SECONDS: fmt_seconds_(buf, len, x); return buf;
    case VF_UTC: fmt_utc_(buf, len, x); return buf;
    case VF_PLAIN: break;
    }
    switch (fd->type) {
    case VIEW_INT: snprintf(buf, len, "%lld", v->i); return buf;
    case VIEW_F32: return view_shortest(buf, len, v->d, 1);
    case VIEW_F64: return view_shortest(buf, len, v->d, 0);
    case VIEW_STR: return v->s;
    case VIEW_JSON: {
        char *s = v->j ? json_dumps(v->j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        snprintf(buf, len, "%s", s ? s : "-");
        free(s);
        return buf;
    }
    case VIEW_SUB: return "-";
    }
    return "-";
}

const view_field *view_field_named(const view *v, const char *name)
{
    for (int k = 0; k < v->n; k++)
        if (v->fields[k].name && strcmp(v->fields[k].name, name) == 0)
            return &v->fields[k];
    return NULL;
}

const char *view_text(char *buf, size_t len, const view_field *fd, const void *row)
{
    view_val v;
    get_(fd, row, &v);
    const char *t = text_(fd, &v, buf, len);
    if (t != buf)
        snprintf(buf, len, "%s", t);
    release_(&v);
    return buf;
}

/* A number as JSON: shortest; a float keeps a fraction ("2.0"). */
static void json_number_(FILE *f, const view_field *fd, const view_val *v)
{
    char b[48];
    if (fd->type == VIEW_INT) {
        fprintf(f, "%lld", v->i);
        return;
    }
    view_shortest(b, sizeof b, v->d, fd->type == VIEW_F32);
    fputs(b, f);
    if (strspn(b, "-0123456789") == strlen(b))
        fputs(".0", f);
}

static void json_string_(FILE *f, const char *s)
{
    json_t *j = json_string(s);
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(d ? d : "null", f); /* NULL: not UTF-8 */
    free(d);
    json_decref(j);
}

static void indent_(FILE *f, int depth)
{
    for (int i = 0; i < depth; i++)
        fputs("  ", f);
}

/* Text that jansson indented from column 0, placed at depth. */
static void json_nested_(FILE *f, const char *s, int depth)
{
    for (; *s; s++) {
        fputc(*s, f);
        if (*s == '\n')
            indent_(f, depth);
    }
}

static void json_object_(FILE *f, const view *vw, const void *row, int depth, int compact)
{
    int first = 1;
    fputc('{', f);
    for (int k = 0; k < vw->n; k++) {
        const view_field *fd = &vw->fields[k];
        if (!fd->name)
            continue;
        view_val v;
        get_(fd, row, &v);
        if (v.null && (fd->flags & VIEW_JSON_OMIT_NULL)) {
            release_(&v);
            continue;
        }
        if (!first)
            fputc(',', f);
        first = 0;
        if (!compact) {
            fputc('\n', f);
            indent_(f, depth + 1);
        }
        json_string_(f, fd->name);
        fputs(compact ? ":" : ": ", f);
        if (fd->type == VIEW_SUB && v.sub)
            json_object_(f, v.sub, v.sub_row, depth + 1, compact);
        else if (v.null || fd->type == VIEW_SUB)
            fputs("null", f);
        else if (fd->type == VIEW_STR)
            json_string_(f, v.s);
        else if (fd->type == VIEW_JSON) {
            size_t fl = JSON_ENCODE_ANY | JSON_PRESERVE_ORDER |
                        (compact ? JSON_COMPACT : JSON_INDENT(2));
            char *s = v.j ? json_dumps(v.j, fl) : NULL;
            json_nested_(f, s ? s : "null", depth + 1);
            free(s);
        } else
            json_number_(f, fd, &v);
        release_(&v);
    }
    if (!compact && !first) {
        fputc('\n', f);
        indent_(f, depth);
    }
    fputc('}', f);
}

/* A CSV cell: quoted when it holds a comma, a quote or a line break. */
static void csv_cell_(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static int in_csv_(const view_field *fd)
{
    return fd->name && fd->type != VIEW_SUB;
}

/* A padded (and maybe cut) table cell, coloured on a tty. */
static void cell_(view_out *o, const view_field *fd, const char *s, const char *color)
{
    int w = fd->width < 0 ? -fd->width : fd->width;
    int on = o->color && color && *color;
    if (on)
        fputs(color, o->f);
    if (fd->width == 0)
        fputs(s, o->f);
    else if (fd->flags & VIEW_CUT)
        fprintf(o->f, fd->width < 0 ? "%-*.*s" : "%*.*s", w, w, s);
    else
        fprintf(o->f, fd->width < 0 ? "%-*s" : "%*s", w, s);
    if (on)
        fputs("\033[0m", o->f);
}

/* ------------------------------------------------------------- streams */

void view_begin(view_out *o)
{
    const view *vw = o->v;
    int first = 1;
    o->rows = 0;
    switch (o->form) {
    case VIEW_TABLE:
        for (int k = 0; k < vw->n; k++) {
            const view_field *fd = &vw->fields[k];
            if (!fd->head)
                continue;
            if (!first)
                fputc(' ', o->f);
            first = 0;
            cell_(o, fd, fd->head, NULL);
        }
        fputc('\n', o->f);
        break;
    case VIEW_CSV:
        for (int k = 0; k < vw->n; k++) {
            if (!in_csv_(&vw->fields[k]))
                continue;
            if (!first)
                fputc(',', o->f);
            first = 0;
            csv_cell_(o->f, vw->fields[k].name);
        }
        fputc('\n', o->f);
        break;
    case VIEW_JSON_ARRAY:
        fputc('[', o->f);
        break;
    default:
        break;
    }
}

/* One row as text: a table line, "label: value" lines or one line. */
static void text_row_(view_out *o, const void *row)
{
    char buf[160];
    int first = 1;
    for (int k = 0; k < o->v->n; k++) {
        const view_field *fd = &o->v->fields[k];
        const char *key = o->form == VIEW_TABLE ? fd->head : fd->label;
        if (!key)
            continue;
        view_val v;
        get_(fd, row, &v);
        if (o->form == VIEW_RECORDS && v.null && !v.text && (fd->flags & VIEW_OMIT_NULL)) {
            release_(&v);
            continue;
        }
        const char *t = text_(fd, &v, buf, sizeof buf);
        view_field bare = *fd; /* records and lines: not padded */
        bare.width = 0;
        if (o->form == VIEW_RECORDS) {
            char lab[64];
            snprintf(lab, sizeof lab, "%s:", key);
            fprintf(o->f, "%-14s", lab);
            cell_(o, &bare, t, v.color);
            fputc('\n', o->f);
        } else {
            if (!first)
                fputc(' ', o->f);
            if (o->form == VIEW_LINE && *key)
                fprintf(o->f, "%s ", key);
            cell_(o, o->form == VIEW_TABLE ? fd : &bare, t, v.color);
        }
        first = 0;
        release_(&v);
    }
    if (o->form == VIEW_TABLE)
        fputc('\n', o->f);
}

/* One row as a CSV line: unknown values empty. */
static void csv_row_(view_out *o, const void *row)
{
    char buf[48];
    int first = 1;
    for (int k = 0; k < o->v->n; k++) {
        const view_field *fd = &o->v->fields[k];
        if (!in_csv_(fd))
            continue;
        view_val v;
        get_(fd, row, &v);
        if (!first)
            fputc(',', o->f);
        first = 0;
        if (v.null) {
            /* empty */
        } else if (fd->type == VIEW_INT) {
            fprintf(o->f, "%lld", v.i);
        } else if (is_float_(fd->type)) {
            fputs(view_shortest(buf, sizeof buf, v.d, fd->type == VIEW_F32), o->f);
        } else if (fd->type == VIEW_STR) {
            csv_cell_(o->f, v.s);
        } else {
            char *s = v.j ? json_dumps(v.j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            csv_cell_(o->f, s ? s : "");
            free(s);
        }
        release_(&v);
    }
    fputc('\n', o->f);
}

void view_row(view_out *o, const void *row)
{
    switch (o->form) {
    case VIEW_TABLE:
    case VIEW_RECORDS:
    case VIEW_LINE:
        text_row_(o, row);
        break;
    case VIEW_CSV:
        csv_row_(o, row);
        break;
    case VIEW_JSON_ARRAY:
        fputs(o->rows ? ",\n  " : "\n  ", o->f);
        json_object_(o->f, o->v, row, 1, 0);
        break;
    case VIEW_JSON_OBJECT:
    case VIEW_JSON_LINES:
        json_object_(o->f, o->v, row, 0, o->form == VIEW_JSON_LINES);
        fputc('\n', o->f);
        break;
    }
    o->rows++;
}

void view_end(view_out *o)
{
    if (o->form == VIEW_JSON_ARRAY)
        fputs(o->rows ? "\n]\n" : "]\n", o->f);
}
