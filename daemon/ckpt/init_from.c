/*
 * init_from.c — checks of a run's init.from directory (init_from.h).
 */
#include "ckpt/init_from.h"

#include "common/durable.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
 * slot_of, checked against S slots over L layers as want[] (the model's
 * default share map, gpt_default_share_map). */
static int check_share_map_(const char *dir, int L, int S, const int *want,
                            m6_err *err)
{
    /* meta.json (a checkpoint) or m6-model.json (an export): the first that
     * exists; one that exists but is not a readable regular file of JSON is
     * named as such, not taken for a missing one */
    static const char *const names[] = {"meta.json", "m6-model.json"};
    char path[PATH_MAX + 32], e[PATH_MAX + 128];
    json_t *m = NULL;
    for (int i = 0; i < 2 && !m; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        int fd = open_regular(path, 0, NULL, e, sizeof e);
        if (fd < 0) {
            if (errno == ENOENT)
                continue;
            m6_err_set(err, M6_EINVALID, "init.from: %s", e);
            return -1;
        }
        json_error_t je;
        m = json_loadfd(fd, 0, &je);
        close(fd);
        if (!m) {
            m6_err_set(err, M6_EINVALID, "init.from: %s: not valid JSON "
                       "(line %d: %s)", path, je.line, je.text);
            return -1;
        }
    }
    if (!m) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: neither meta.json nor "
                   "m6-model.json: not an m6 checkpoint directory", dir);
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
            if (!json_is_integer(v) || json_integer_value(v) != want[l]) {
                m6_err_set(err, M6_EINVALID, "init.from: %s: slot_of[%d] is "
                           "not %d (only the default share map is built)",
                           dir, l, want[l]);
                rc = -1;
            }
        }
    }
    json_decref(m);
    return rc;
}

/* Tensor name present, F32 or BF16, of shape (rows, cols; cols 0: 1-D). */
static int check_tensor_(const init_src *src, const char *dir,
                         const char *name, int rows, int cols, m6_err *err)
{
    char dtype[16], e[256], got[96], want[96];
    int ndim;
    long shape[4];
    int rc = safetensors_info(&src->sf, name, dtype, &ndim, shape, e, sizeof e);
    if (rc == 1) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: no tensor %s", dir, name);
        return -1;
    }
    if (rc < 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: %s", dir, e);
        return -1;
    }
    long ws[2] = {rows, cols};
    int wn = cols ? 2 : 1;
    if (strcmp(dtype, "F32") != 0 && strcmp(dtype, "BF16") != 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s: tensor %s is %s, want "
                   "F32 or BF16 (bf16 master weights)", dir, name, dtype);
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
    int S = spec_slots_of_phase(spec, spec_starts_pseudo(spec));
    memset(src, 0, sizeof *src);
    int *map = malloc((size_t)L * sizeof(int));
    unsigned char *kind = malloc((size_t)S);
    gpt_ckpt_tensor *ck[2] = {NULL, NULL};
    int nk[2] = {0, 0};
    if (!map || !kind) {
        m6_err_set(err, M6_EINTERNAL, "init.from: out of memory");
        goto fail_mem;
    }
    if (gpt_default_share_map(mc, S, map) != 0 ||
        gpt_slot_kinds(mc, S, map, kind, NULL, 0) != 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %d slots cannot hold the "
                   "model", S);
        goto fail_mem;
    }
    struct stat sb;  /* a FIFO or a file named: said, not "Not a directory" */
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        m6_err_set(err, M6_EINVALID, "init.from: %s is %s, not a directory "
                   "(want an m6 checkpoint directory)", dir,
                   file_kind_name((unsigned)sb.st_mode));
        goto fail_mem;
    }
    if (check_share_map_(dir, L, S, map, err) != 0)
        goto fail_mem;
    /* checkpoint names: an MoE slot's per expert and per gate prototype */
    for (int k = 0; k < 2 && (k == 0 || mc->moe_experts > 0); k++) {
        nk[k] = gpt_slot_ckpt_tensors(mc, k, NULL);
        if (!(ck[k] = calloc((size_t)nk[k], sizeof *ck[k]))) {
            m6_err_set(err, M6_EINTERNAL, "init.from: out of memory");
            goto fail_mem;
        }
        gpt_slot_ckpt_tensors(mc, k, ck[k]);
    }
    char path[PATH_MAX + 32], e[PATH_MAX + 512], name[160];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (safetensors_open(&src->sf, path, e, sizeof e) != 0) {
        m6_err_set(err, M6_EINVALID, "init.from: %s", e);
        goto fail_mem;
    }
    src->n_slots = S;
    gpt_tensor glob[GLOB_NTENSORS], slot[SLOT_NTENSORS_MAX];
    size_t ng, ss;
    gpt_layout(mc, glob, slot, &ng, &ss);
    for (int i = 0; i < GLOB_NTENSORS; i++) {
        gpt_tensor_name(name, sizeof name, "", -1, &glob[i]);
        if (check_tensor_(src, dir, name, glob[i].rows, glob[i].cols,
                          err) != 0)
            goto fail;
    }
    for (int s = 0; s < S; s++)
        for (int i = 0; i < nk[kind[s]]; i++) {
            const gpt_ckpt_tensor *t = &ck[kind[s]][i];
            snprintf(name, sizeof name, "slots.%d.%s", s, t->name);
            if (check_tensor_(src, dir, name, t->rows, t->cols, err) != 0)
                goto fail;
        }
    free(map);
    free(kind);
    free(ck[0]);
    free(ck[1]);
    return 0;
fail:
    init_from_close(src);
fail_mem:
    free(map);
    free(kind);
    free(ck[0]);
    free(ck[1]);
    return -1;
}

void init_from_close(init_src *src)
{
    safetensors_close(&src->sf);
}
