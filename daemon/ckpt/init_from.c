/*
 * init_from.c — checks of a run's init.from directory (init_from.h).
 */
#include "ckpt/init_from.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "model/gpt.h"

/* "(a, b)" or "(a)" into buf. */
static void shape_text_(char *buf, size_t n, int ndim, const long *shape)
{
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%ld", d ? ", " : "", shape[d]);
    if (o < n)
        snprintf(buf + o, n - o, ")");
}

/* The share map of dir: meta.json's or m6-model.json's n_slots and
 * slot_of, checked against S slots over L layers, slot_of[l] = l*S/L. */
static int check_share_map_(const char *dir, int L, int S, m6_err *err)
{
    char path[PATH_MAX + 32];
    json_error_t je;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    json_t *m = json_load_file(path, 0, &je);
    if (!m) {
        snprintf(path, sizeof path, "%s/m6-model.json", dir);
        m = json_load_file(path, 0, &je);
    }
    if (!m) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: neither meta.json nor "
                   "m6-model.json (%s): not an m6 checkpoint directory", dir,
                   je.text);
        return -1;
    }
    json_t *ns = json_object_get(m, "n_slots"), *so = json_object_get(m, "slot_of");
    int rc = -1;
    if (!json_is_integer(ns) || !json_is_array(so)) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: no n_slots and slot_of",
                   path);
    } else if (json_integer_value(ns) != S || json_array_size(so) != (size_t)L) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: the checkpoint has %lld "
                   "slots over %zu layers, the run starts with %d over %d (%s)",
                   dir, (long long)json_integer_value(ns), json_array_size(so),
                   S, L, S < L ? "pseudo.share_groups" : "model.n_layer, "
                   "the real phase: set pseudo.steps 0, or share_groups to "
                   "the checkpoint's slots");
    } else {
        rc = 0;
        for (int l = 0; l < L && rc == 0; l++) {
            json_t *v = json_array_get(so, (size_t)l);
            if (!json_is_integer(v) || json_integer_value(v) != (json_int_t)l * S / L) {
                m6_err_set(err, M6_EINVALID, "init.from: %s: slot_of[%d] is "
                           "not %d (only the contiguous share map is built)",
                           dir, l, l * S / L);
                rc = -1;
            }
        }
    }
    json_decref(m);
    return rc;
}

/* Tensor t (slot s, or -1: a global) present, F32, of t's shape. */
static int check_tensor_(const init_src *src, const char *dir, int s,
                         const gpt_tensor *t, m6_err *err)
{
    char name[160], dtype[16], e[256], got[96], want[96];
    int ndim;
    long shape[4];
    gpt_tensor_name(name, sizeof name, "", s, t);
    int rc = safetensors_info(&src->sf, name, dtype, &ndim, shape, e, sizeof e);
    if (rc == 1) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: no tensor %s", dir, name);
        return -1;
    }
    if (rc < 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: %s", dir, e);
        return -1;
    }
    long ws[2] = {t->rows, t->cols};
    int wn = t->cols ? 2 : 1;
    if (strcmp(dtype, "F32") != 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: tensor %s is %s, want F32",
                   dir, name, dtype);
        return -1;
    }
    if (ndim != wn || shape[0] != ws[0] || (wn == 2 && shape[1] != ws[1])) {
        shape_text_(got, sizeof got, ndim, shape);
        shape_text_(want, sizeof want, wn, ws);
        m6_err_set(err, M6_EINVALID, "init.from: %s: tensor %s has shape %s, "
                   "the model wants %s", dir, name, got, want);
        return -1;
    }
    return 0;
}

int init_from_open(const run_spec *spec, init_src *src, m6_err *err)
{
    const char *dir = spec->init.from;
    const model_config *mc = &spec->model;
    int L = mc->n_layer;
    int S = spec->pseudo.steps > 0 ? spec->pseudo.share_groups : L;
    memset(src, 0, sizeof *src);
    if (check_share_map_(dir, L, S, err) != 0)
        return -1;
    char path[PATH_MAX + 32], e[PATH_MAX + 512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (safetensors_open(&src->sf, path, e, sizeof e) != 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s", e);
        return -1;
    }
    src->n_slots = S;
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t ng, ss;
    gpt_layout(mc, glob, slot, &ng, &ss);
    for (int i = 0; i < GLOB_NTENSORS; i++)
        if (check_tensor_(src, dir, -1, &glob[i], err) != 0)
            goto fail;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < gpt_slot_ntensors(mc); i++)
            if (check_tensor_(src, dir, s, &slot[i], err) != 0)
                goto fail;
    return 0;
fail:
    init_from_close(src);
    return -1;
}

void init_from_close(init_src *src)
{
    safetensors_close(&src->sf);
}
