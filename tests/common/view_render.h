/*
 * view_render.h — a view's rows rendered into a string, for the tests that
 * compare m6ctl's output forms (text, CSV, JSON) with texts written by hand.
 */
#ifndef M6_TESTS_VIEW_RENDER_H
#define M6_TESTS_VIEW_RENDER_H

#include <stdio.h>

#include "common/view.h"

/* rows[0..n) rendered by view v in form, as view_begin, view_row and
 * view_end write them (a malloc'd string, caller frees). */
static inline char *view_render(const view *v, view_form form,
                                const void *const *rows, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    view_out o = {.f = f, .v = v, .form = form};
    view_begin(&o);
    for (int i = 0; i < n; i++)
        view_row(&o, rows[i]);
    view_end(&o);
    fclose(f);
    return buf;
}

#endif /* M6_TESTS_VIEW_RENDER_H */
