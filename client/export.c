/*
 * export.c — m6 weights read from checkpoints and written as Hugging Face
 * GPT-2, m6 safetensors or llm.c files; llm.c files read (export.h).
 */
#include "client/export.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/durable.h"

#include "ckpt/checkpoint.h"

#define LLMC_MAGIC 20240326
#define LLMC_HEADER_INTS 256

/* ---------------------------------------------------------------- weights */

static int weights_alloc_(m6_weights *w, const model_config *cfg, int S,
                          char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    w->S = S;
    w->step = -1;
    /* a mixed model's slot region is its larger (MoE) kind's; a dense
     * slot uses the front of it, as in gpt.c */
    gpt_layout(cfg, w->glob, w->slot, &w->n_global, &w->slot_size);
    size_t n = w->n_global + (size_t)S * w->slot_size;
    w->params = calloc(n, sizeof(float));
    w->slot_of = calloc((size_t)cfg->n_layer, sizeof(int));
    w->slot_moe = calloc((size_t)S, 1);
    if (!w->params || !w->slot_of || !w->slot_moe) {
        snprintf(err, errlen, "out of memory for %zu parameters", n);
        weights_free(w);
        return -1;
    }
    if (gpt_default_share_map(cfg, S, w->slot_of) != 0 ||
        gpt_slot_kinds(cfg, S, w->slot_of, w->slot_moe, err, errlen) != 0) {
        snprintf(err, errlen, "%d slots cannot hold this model (a mixed MoE "
                 "model needs at least one slot of each kind)", S);
        weights_free(w);
        return -1;
    }
    return 0;
}

void weights_free(m6_weights *w)
{
    free(w->params);
    free(w->slot_of);
    free(w->slot_moe);
    memset(w, 0, sizeof *w);
}

/* Tensor t of region s (-1: the globals) inside w->params. */
static float *tensor_(const m6_weights *w, int s, const gpt_tensor *t)
{
    return w->params + (s < 0 ? 0 : w->n_global + (size_t)s * w->slot_size) +
           t->offset;
}

/* The model of an m6-model.json, or of a spec-like "model" object. */
static int model_from_json_(const json_t *m, model_config *cfg, char *err,
                            size_t errlen, const char *path)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->moe_every = 1;
    cfg->moe_prototypes = 1;
    if (json_unpack((json_t *)m, "{s:i, s:i, s:i, s:i, s:i}", "vocab_size",
                    &cfg->vocab_size, "n_layer", &cfg->n_layer, "n_head",
                    &cfg->n_head, "n_embd", &cfg->n_embd, "seq_len",
                    &cfg->seq_len) != 0 ||
        cfg->vocab_size < 1 || cfg->n_layer < 1 || cfg->n_head < 1 ||
        cfg->n_embd < 1 || cfg->seq_len < 1 || cfg->n_embd % cfg->n_head) {
        snprintf(err, errlen, "%s: model: want vocab_size, n_layer, n_head, "
                 "n_embd, seq_len (whole numbers >= 1, n_head dividing n_embd)",
                 path);
        return -1;
    }
    json_t *moe = json_object_get(m, "moe");
    if (moe && (json_unpack(moe, "{s:i, s:i, s:i, s?i}", "num_experts",
                            &cfg->moe_experts, "prototypes",
                            &cfg->moe_prototypes, "expert_hidden",
                            &cfg->moe_hidden, "every", &cfg->moe_every) != 0 ||
                cfg->moe_experts < 1 || cfg->moe_prototypes < 1 ||
                cfg->moe_experts % cfg->moe_prototypes ||
                cfg->moe_hidden < 1 || cfg->moe_every < 1 ||
                cfg->moe_every > cfg->n_layer)) {
        snprintf(err, errlen, "%s: model.moe: want num_experts, prototypes "
                 "(dividing it), expert_hidden and optionally every (1 to "
                 "n_layer), whole numbers >= 1", path);
        return -1;
    }
    return 0;
}

/* The share map of meta.json / m6-model.json into w (S already set). */
static int share_map_(m6_weights *w, const json_t *m, const char *path,
                      char *err, size_t errlen)
{
    json_t *so = json_object_get(m, "slot_of");
    int L = w->cfg.n_layer;
    if (!json_is_array(so) || json_array_size(so) != (size_t)L) {
        snprintf(err, errlen, "%s: slot_of: want %d entries", path, L);
        return -1;
    }
    for (int l = 0; l < L; l++) {
        json_t *v = json_array_get(so, (size_t)l);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= w->S) {
            snprintf(err, errlen, "%s: slot_of[%d] is not a slot in [0, %d)",
                     path, l, w->S);
            return -1;
        }
        w->slot_of[l] = (int)json_integer_value(v);
    }
    if (gpt_slot_kinds(&w->cfg, w->S, w->slot_of, w->slot_moe, NULL, 0) != 0) {
        snprintf(err, errlen, "%s: slot_of: a slot is shared by dense and MoE "
                 "blocks, or used by no block", path);
        return -1;
    }
    json_t *st = json_object_get(m, "step"), *ph = json_object_get(m, "phase");
    if (json_is_integer(st))
        w->step = (long)json_integer_value(st);
    snprintf(w->phase, sizeof w->phase, "%s",
             json_is_string(ph) ? json_string_value(ph) : "");
    return 0;
}

/* A slot's tensors as checkpoints name them (gpt_slot_ckpt_tensors: an
 * MoE slot (moe 1) per expert and per gate prototype; a dense slot its
 * layout's), as gpt_tensors whose names point into *ck. Returns the count,
 * or -1 (out of memory); the caller frees *t and *ck. */
static int ckpt_slot_tensors_(const model_config *c, int moe, gpt_tensor **t,
                              gpt_ckpt_tensor **ck)
{
    int n = gpt_slot_ckpt_tensors(c, moe, NULL);
    *ck = calloc((size_t)n, sizeof **ck);
    *t = calloc((size_t)n, sizeof **t);
    if (!*ck || !*t) {
        free(*ck);
        free(*t);
        *ck = NULL;
        *t = NULL;
        return -1;
    }
    gpt_slot_ckpt_tensors(c, moe, *ck);
    for (int i = 0; i < n; i++) {
        const gpt_ckpt_tensor *k = &(*ck)[i];
        (*t)[i] = (gpt_tensor){k->name, k->offset,
                               (size_t)k->rows * (size_t)(k->cols ? k->cols : 1),
                               k->rows, k->cols, k->cols != 0};
    }
    return n;
}

/* Both kinds' checkpoint tensor tables ([0] dense, [1] MoE: n 0 for a
 * kind the model has none of). */
typedef struct {
    gpt_tensor *t[2];
    gpt_ckpt_tensor *ck[2];
    int n[2];
} slot_tables_;

static void slot_tables_free_(slot_tables_ *tab)
{
    for (int k = 0; k < 2; k++) {
        free(tab->t[k]);
        free(tab->ck[k]);
    }
    memset(tab, 0, sizeof *tab);
}

/* 0, or -1 (out of memory, nothing held). */
static int slot_tables_get_(slot_tables_ *tab, const model_config *c)
{
    memset(tab, 0, sizeof *tab);
    for (int k = 0; k < 2; k++) {
        if (k == 1 && c->moe_experts == 0)
            break;
        if ((tab->n[k] = ckpt_slot_tensors_(c, k, &tab->t[k],
                                            &tab->ck[k])) < 0) {
            tab->n[k] = 0;
            slot_tables_free_(tab);
            return -1;
        }
    }
    return 0;
}

/* One tensor of the layout from the file: present, F32 or BF16, its shape. */
static int read_tensor_(const st_file *sf, const char *path, const m6_weights *w,
                        int s, const gpt_tensor *t, char *err, size_t errlen)
{
    char name[160], dtype[16], e[256];
    int ndim;
    long shape[4];
    gpt_tensor_name(name, sizeof name, "", s, t);
    int rc = safetensors_info(sf, name, dtype, &ndim, shape, e, sizeof e);
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s", path, rc == 1 ? "missing tensor" : e);
        if (rc == 1)
            snprintf(err + strlen(err), errlen - strlen(err), " %s", name);
        return -1;
    }
    int wn = t->cols ? 2 : 1;
    if ((strcmp(dtype, "F32") != 0 && strcmp(dtype, "BF16") != 0) ||
        ndim != wn || shape[0] != t->rows ||
        (wn == 2 && shape[1] != t->cols)) {
        snprintf(err, errlen, "%s: tensor %s is %s of %d dims (%ld, %ld), the "
                 "model wants F32 or BF16 (%d, %d)", path, name, dtype, ndim, shape[0],
                 ndim > 1 ? shape[1] : 0L, t->rows, t->cols);
        return -1;
    }
    if (safetensors_get(sf, name, tensor_(w, s, t), t->numel, e, sizeof e) != 0) {
        snprintf(err, errlen, "%s: %s", path, e);
        return -1;
    }
    return 0;
}

int weights_load(m6_weights *w, const char *dir, const model_config *cfg,
                 char *err, size_t errlen)
{
    char path[PATH_MAX + 32];
    json_error_t je;
    memset(w, 0, sizeof *w);
    snprintf(path, sizeof path, "%s/m6-model.json", dir);
    json_t *m = json_load_file(path, 0, &je);
    model_config own;
    struct stat mst;
    if (!m && stat(path, &mst) == 0) {
        /* there, but not JSON (or unreadable): say so, not "no file" */
        snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path,
                 je.text, je.line);
        return -1;
    }
    if (m) {  /* a directory of weights_write_m6: its own model */
        if (model_from_json_(json_object_get(m, "model"), &own, err, errlen,
                             path) != 0)
            goto fail_json;
        if (cfg && (cfg->vocab_size != own.vocab_size ||
                    cfg->n_layer != own.n_layer || cfg->n_head != own.n_head ||
                    cfg->n_embd != own.n_embd || cfg->seq_len != own.seq_len ||
                    cfg->moe_experts != own.moe_experts ||
                    (own.moe_experts > 0 &&
                     (cfg->moe_prototypes != own.moe_prototypes ||
                      model_moe_hidden(cfg) != model_moe_hidden(&own) ||
                      cfg->moe_every != own.moe_every)))) {
            snprintf(err, errlen, "%s: the model differs from the run's", path);
            goto fail_json;
        }
        if (!cfg)
            cfg = &own;
    } else {
        snprintf(path, sizeof path, "%s/meta.json", dir);
        m = json_load_file(path, 0, &je);
        if (!m) {
            struct stat st;
            if (stat(dir, &st) != 0)
                snprintf(err, errlen, "%s: %s", dir, strerror(errno));
            else
                snprintf(err, errlen, "%s: unreadable checkpoint: no "
                         "m6-model.json or meta.json (%s)", dir, je.text);
            return -1;
        }
        if (!cfg) {
            snprintf(err, errlen, "%s: an m6d checkpoint (meta.json) without "
                     "its model: export it by its RUN, whose spec has the "
                     "model", dir);
            goto fail_json;
        }
    }
    json_t *ns = json_object_get(m, "n_slots");
    if (!json_is_integer(ns) || json_integer_value(ns) < 1 ||
        json_integer_value(ns) > cfg->n_layer) {
        snprintf(err, errlen, "%s: n_slots: want a whole number in [1, %d]",
                 path, cfg->n_layer);
        goto fail_json;
    }
    if (weights_alloc_(w, cfg, (int)json_integer_value(ns), err, errlen) != 0)
        goto fail_json;
    if (share_map_(w, m, path, err, errlen) != 0)
        goto fail;
    json_decref(m);
    m = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file sf;
    char e[PATH_MAX + 512];
    if (safetensors_open(&sf, path, e, sizeof e) != 0) {
        snprintf(err, errlen, "unreadable checkpoint: %s", e);
        goto fail;
    }
    slot_tables_ tab;
    int rc = slot_tables_get_(&tab, &w->cfg);
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
    for (int i = 0; i < GLOB_NTENSORS && rc == 0; i++)
        rc = read_tensor_(&sf, path, w, -1, &w->glob[i], err, errlen);
    for (int s = 0; s < w->S && rc == 0; s++) {
        int kind = w->slot_moe[s];
        for (int i = 0; i < tab.n[kind] && rc == 0; i++)
            rc = read_tensor_(&sf, path, w, s, &tab.t[kind][i], err, errlen);
    }
    slot_tables_free_(&tab);
    safetensors_close(&sf);
    if (rc != 0)
        goto fail;
    return 0;
fail_json:
    json_decref(m);
    return -1;
fail:
    json_decref(m);
    weights_free(w);
    return -1;
}

/* ------------------------------------------------------------ output dirs */

/* An output directory is written as <out>.tmp-XXXXXX (mkdtemp), then
 * renamed to out
 * (or, with force over an existing out, its files moved in one by one). */
typedef struct {
    char out[PATH_MAX], tmp[PATH_MAX + 32];
    int replace;   /* out exists (force) */
} out_dir;

static int out_begin_(out_dir *o, const char *out, int force, char *err,
                      size_t errlen)
{
    struct stat st;
    memset(o, 0, sizeof *o);
    if (strlen(out) >= sizeof o->out) {
        snprintf(err, errlen, "--out: path too long");
        return -1;
    }
    snprintf(o->out, sizeof o->out, "%s", out);
    /* "dir/": the temporary name goes beside dir, not inside it */
    for (size_t n = strlen(o->out); n > 1 && o->out[n - 1] == '/'; n--)
        o->out[n - 1] = 0;
    out = o->out;
    if (stat(out, &st) == 0) {
        if (!force) {
            snprintf(err, errlen, "%s: already exists (--force replaces its "
                     "files)", out);
            return -1;
        }
        if (!S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%s: exists and is not a directory", out);
            return -1;
        }
        o->replace = 1;
    }
    return create_temp_dir_beside(out, 0755, o->tmp, sizeof o->tmp, err,
                                  errlen);
}

/* Move the finished files in place (names: the files written, NULL-ended). */
static int out_commit_(out_dir *o, const char *const *names, char *err,
                       size_t errlen)
{
    if (!o->replace) {
        if (rename(o->tmp, o->out) != 0) {
            snprintf(err, errlen, "%s: %s", o->out, strerror(errno));
            remove_temp_dir(o->tmp);
            return -1;
        }
        return 0;
    }
    char a[PATH_MAX + 300], b[PATH_MAX + 300];
    for (int i = 0; names[i]; i++) {
        snprintf(a, sizeof a, "%s/%s", o->tmp, names[i]);
        snprintf(b, sizeof b, "%s/%s", o->out, names[i]);
        if (rename(a, b) != 0) {
            snprintf(err, errlen, "%s: %s", b, strerror(errno));
            remove_temp_dir(o->tmp);
            return -1;
        }
    }
    remove_temp_dir(o->tmp);
    return 0;
}

static void out_abort_(out_dir *o) { remove_temp_dir(o->tmp); }

/* Write n tensors as dir/name (safetensors). */
static int write_st_(const char *dir, const char *name, const st_tensor *ts,
                     int n, char *err, size_t errlen)
{
    char path[PATH_MAX + 300], e[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    long rc = safetensors_write(f, ts, n, e, sizeof e);
    if (fclose(f) != 0 && rc >= 0) {
        snprintf(e, sizeof e, "close: %s", strerror(errno));
        rc = -1;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s: %s", path, e);
        return -1;
    }
    return 0;
}

static int write_json_(const char *dir, const char *name, json_t *j, char *err,
                       size_t errlen)
{
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (rc != 0)
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return rc == 0 ? 0 : -1;
}

/* An output directory of two files: model.safetensors (k tensors ts) and
 * json_name (j; NULL: out of memory), written and renamed to out, or
 * nothing left behind. 0, or -1 with err. */
static int write_st_json_dir_(const char *out, int force, const char *json_name,
                              const st_tensor *ts, int k, json_t *j,
                              char *err, size_t errlen)
{
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    out_dir o;
    int rc = out_begin_(&o, out, force, err, errlen);
    if (rc != 0)
        return rc;
    const char *const files[] = {"model.safetensors", json_name, NULL};
    rc = write_st_(o.tmp, files[0], ts, k, err, errlen);
    if (rc == 0)
        rc = write_json_(o.tmp, files[1], j, err, errlen);
    if (rc == 0)
        rc = out_commit_(&o, files, err, errlen);
    else
        out_abort_(&o);
    return rc;
}

static int refuse_moe_(const m6_weights *w, const char *format, char *err,
                       size_t errlen)
{
    if (w->cfg.moe_experts <= 0)
        return 0;
    if (w->cfg.moe_every > 1)
        snprintf(err, errlen, "an MoE model (%d experts in every %d-th "
                 "block): no %s layout holds it; --format safetensors keeps "
                 "m6's own", w->cfg.moe_experts, w->cfg.moe_every, format);
    else
        snprintf(err, errlen, "an MoE model (%d experts in every block): no "
                 "%s layout holds it; --format safetensors keeps m6's own",
                 w->cfg.moe_experts, format);
    return -1;
}

/* dst (cols, rows) = src (rows, cols) transposed. */
static void transpose_(float *dst, const float *src, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* ----------------------------------------------------------- HF GPT-2 */

int weights_write_hf_gpt2(const m6_weights *w, const char *out, int force,
                          char *err, size_t errlen)
{
    if (refuse_moe_(w, "Hugging Face GPT-2", err, errlen) != 0)
        return -1;
    const model_config *c = &w->cfg;
    int L = c->n_layer, C = c->n_embd;
    /* per layer: 12 tensors; the four weights transposed into scratch */
    int n = 4 + 12 * L;
    st_tensor *ts = calloc((size_t)n, sizeof *ts);
    char (*names)[96] = calloc((size_t)n, sizeof *names);
    size_t per_layer = (size_t)3 * C * C + (size_t)C * C + 8 * (size_t)C * C;
    float *tw = malloc((size_t)L * per_layer * sizeof(float));
    if (!ts || !names || !tw) {
        snprintf(err, errlen, "out of memory");
        free(ts);
        free(names);
        free(tw);
        return -1;
    }
    int k = 0;
#define PUT_(nm, ptr, nd, r, cc) do { \
        snprintf(names[k], sizeof names[k], "%s", nm); \
        ts[k] = (st_tensor){names[k], ptr, nd, {r, cc}}; k++; } while (0)
    PUT_("transformer.wte.weight", tensor_(w, -1, &w->glob[GLOB_WTE]), 2,
         c->vocab_size, C);
    PUT_("transformer.wpe.weight", tensor_(w, -1, &w->glob[GLOB_WPE]), 2,
         c->seq_len, C);
    char nm[96];
    for (int l = 0; l < L; l++) {
        int s = w->slot_of[l];
        float *qkv = tw + (size_t)l * per_layer, *proj = qkv + 3 * (size_t)C * C;
        float *fc = proj + (size_t)C * C, *fcproj = fc + 4 * (size_t)C * C;
        transpose_(qkv, tensor_(w, s, &w->slot[SLOT_QKV_W]), 3 * C, C);
        transpose_(proj, tensor_(w, s, &w->slot[SLOT_ATTPROJ_W]), C, C);
        transpose_(fc, tensor_(w, s, &w->slot[SLOT_FC_W]), 4 * C, C);
        transpose_(fcproj, tensor_(w, s, &w->slot[SLOT_FCPROJ_W]), C, 4 * C);
#define H_(suffix) (snprintf(nm, sizeof nm, "transformer.h.%d.%s", l, suffix), nm)
        PUT_(H_("ln_1.weight"), tensor_(w, s, &w->slot[SLOT_LN1_W]), 1, C, 0);
        PUT_(H_("ln_1.bias"), tensor_(w, s, &w->slot[SLOT_LN1_B]), 1, C, 0);
        PUT_(H_("attn.c_attn.weight"), qkv, 2, C, 3 * C);
        PUT_(H_("attn.c_attn.bias"), tensor_(w, s, &w->slot[SLOT_QKV_B]), 1,
             3 * C, 0);
        PUT_(H_("attn.c_proj.weight"), proj, 2, C, C);
        PUT_(H_("attn.c_proj.bias"), tensor_(w, s, &w->slot[SLOT_ATTPROJ_B]),
             1, C, 0);
        PUT_(H_("ln_2.weight"), tensor_(w, s, &w->slot[SLOT_LN2_W]), 1, C, 0);
        PUT_(H_("ln_2.bias"), tensor_(w, s, &w->slot[SLOT_LN2_B]), 1, C, 0);
        PUT_(H_("mlp.c_fc.weight"), fc, 2, C, 4 * C);
        PUT_(H_("mlp.c_fc.bias"), tensor_(w, s, &w->slot[SLOT_FC_B]), 1,
             4 * C, 0);
        PUT_(H_("mlp.c_proj.weight"), fcproj, 2, 4 * C, C);
        PUT_(H_("mlp.c_proj.bias"), tensor_(w, s, &w->slot[SLOT_FCPROJ_B]), 1,
             C, 0);
#undef H_
    }
    PUT_("transformer.ln_f.weight", tensor_(w, -1, &w->glob[GLOB_LNF_W]), 1,
         C, 0);
    PUT_("transformer.ln_f.bias", tensor_(w, -1, &w->glob[GLOB_LNF_B]), 1, C,
         0);
#undef PUT_
    /* GPT2Config: the kernels' GELU is the tanh approximation (gelu_new),
     * LayerNorm eps 1e-5 (kernels.h); dropout off */
    json_t *cfg = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:f,"
        " s:f, s:f, s:b, s:b, s:b, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2",
        "vocab_size", c->vocab_size, "n_positions", c->seq_len,
        "n_ctx", c->seq_len, "n_embd", C, "n_layer", L, "n_head", c->n_head,
        "n_inner", 4 * C, "activation_function", "gelu_new",
        "layer_norm_epsilon", 1e-5, "initializer_range", 0.02,
        "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0,
        "scale_attn_weights", 1, "tie_word_embeddings", 1, "use_cache", 1,
        "torch_dtype", "float32");
    int rc = write_st_json_dir_(out, force, "config.json", ts, k, cfg, err,
                                errlen);
    json_decref(cfg);
    free(tw);
    free(names);
    free(ts);
    return rc;
}

/* ------------------------------------------------------------- m6 layout */

int weights_write_m6(const m6_weights *w, const char *out, int force,
                     char *err, size_t errlen)
{
    const model_config *c = &w->cfg;
    slot_tables_ tab;
    if (slot_tables_get_(&tab, c) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = GLOB_NTENSORS, k = 0;
    for (int s = 0; s < w->S; s++)
        n += tab.n[w->slot_moe[s]];
    st_tensor *ts = calloc((size_t)n, sizeof *ts);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    json_t *so = json_array(), *model = NULL, *meta = NULL;
    if (!ts || !names || !so) {
        snprintf(err, errlen, "out of memory");
        free(ts);
        free(names);
        slot_tables_free_(&tab);
        json_decref(so);
        return -1;
    }
    for (int s = -1; s < w->S; s++) {
        int kind = s < 0 ? 0 : w->slot_moe[s];
        int cnt = s < 0 ? GLOB_NTENSORS : tab.n[kind];
        for (int i = 0; i < cnt; i++, k++) {
            const gpt_tensor *t = s < 0 ? &w->glob[i] : &tab.t[kind][i];
            gpt_tensor_name(names[k], sizeof names[k], "", s, t);
            ts[k] = (st_tensor){names[k], tensor_(w, s, t), t->cols ? 2 : 1,
                                {t->rows, t->cols}};
        }
    }
    for (int l = 0; l < c->n_layer; l++)
        json_array_append_new(so, json_integer(w->slot_of[l]));
    model = json_pack("{s:i, s:i, s:i, s:i, s:i}", "vocab_size", c->vocab_size,
                      "n_layer", c->n_layer, "n_head", c->n_head, "n_embd",
                      c->n_embd, "seq_len", c->seq_len);
    if (model && c->moe_experts > 0)
        json_object_set_new(model, "moe", json_pack("{s:i, s:i, s:i, s:i}",
                            "num_experts", c->moe_experts, "prototypes",
                            c->moe_prototypes, "expert_hidden",
                            model_moe_hidden(c), "every", c->moe_every));
    meta = model ? json_pack("{s:s, s:i, s:O, s:i, s:O, s:I, s:s}", "format",
                             "m6-weights", "version", 1, "model", model,
                             "n_slots", w->S, "slot_of", so, "step",
                             (json_int_t)w->step, "phase",
                             w->phase[0] ? w->phase : "real") : NULL;
    int rc = write_st_json_dir_(out, force, "m6-model.json", ts, k, meta, err,
                                errlen);
    json_decref(meta);
    json_decref(model);
    json_decref(so);
    free(names);
    free(ts);
    slot_tables_free_(&tab);
    return rc;
}

/* ----------------------------------------------------------------- llm.c */

/* The 16 parameter tensors of llm.c's file, in its order: the global or
 * per-layer tensor of m6's layout each one is (slot index, or -1 with g
 * the global index), and its per-layer element count. */
typedef struct { int global, slot; } llmc_tensor_;
static const llmc_tensor_ llmc_order_[16] = {
    {GLOB_WTE, -1}, {GLOB_WPE, -1},
    {-1, SLOT_LN1_W}, {-1, SLOT_LN1_B}, {-1, SLOT_QKV_W}, {-1, SLOT_QKV_B},
    {-1, SLOT_ATTPROJ_W}, {-1, SLOT_ATTPROJ_B}, {-1, SLOT_LN2_W},
    {-1, SLOT_LN2_B}, {-1, SLOT_FC_W}, {-1, SLOT_FC_B}, {-1, SLOT_FCPROJ_W},
    {-1, SLOT_FCPROJ_B}, {GLOB_LNF_W, -1}, {GLOB_LNF_B, -1},
};

/* Floats in the file for model c with padded vocabulary Vp. */
static size_t llmc_floats_(const m6_weights *w, int Vp)
{
    size_t n = 0;
    for (int i = 0; i < 16; i++) {
        const llmc_tensor_ *e = &llmc_order_[i];
        if (e->global == GLOB_WTE)
            n += (size_t)Vp * w->cfg.n_embd;
        else if (e->global >= 0)
            n += w->glob[e->global].numel;
        else
            n += (size_t)w->cfg.n_layer * w->slot[e->slot].numel;
    }
    return n;
}

int weights_write_llmc(const m6_weights *w, const char *out, int force,
                       char *err, size_t errlen)
{
    if (refuse_moe_(w, "llm.c", err, errlen) != 0)
        return -1;
    struct stat st;
    if (stat(out, &st) == 0 && !force) {
        snprintf(err, errlen, "%s: already exists (--force replaces it)", out);
        return -1;
    }
    if (stat(out, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: exists and is not a file", out);
        return -1;
    }
    const model_config *c = &w->cfg;
    int C = c->n_embd, V = c->vocab_size, Vp = (V + 127) / 128 * 128;
    int32_t hdr[LLMC_HEADER_INTS] = {0};
    hdr[0] = LLMC_MAGIC;
    hdr[1] = 3;
    hdr[2] = c->seq_len;
    hdr[3] = V;
    hdr[4] = c->n_layer;
    hdr[5] = c->n_head;
    hdr[6] = C;
    hdr[7] = Vp;
    char tmp[PATH_MAX + 32];
    FILE *f = create_temp_file_beside(out, 0644, tmp, sizeof tmp, err, errlen);
    if (!f)
        return -1;
    int bad = fwrite(hdr, sizeof hdr, 1, f) != 1;
    for (int i = 0; i < 16 && !bad; i++) {
        const llmc_tensor_ *e = &llmc_order_[i];
        if (e->global >= 0) {
            const gpt_tensor *t = &w->glob[e->global];
            bad = fwrite(tensor_(w, -1, t), sizeof(float), t->numel, f) != t->numel;
            if (e->global == GLOB_WTE && !bad) {
                float zero = 0;
                for (size_t j = 0; j < (size_t)(Vp - V) * C && !bad; j++)
                    bad = fwrite(&zero, sizeof zero, 1, f) != 1;
            }
        } else {
            const gpt_tensor *t = &w->slot[e->slot];
            for (int l = 0; l < c->n_layer && !bad; l++)
                bad = fwrite(tensor_(w, w->slot_of[l], t), sizeof(float),
                             t->numel, f) != t->numel;
        }
    }
    if (fclose(f) != 0)
        bad = 1;
    if (bad || rename(tmp, out) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", out, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int weights_read_llmc(m6_weights *w, const char *path, char *err,
                      size_t errlen)
{
    memset(w, 0, sizeof *w);
    struct stat st;
    int fd = open_regular(path, 0, &st, err, errlen);  /* no FIFO hang */
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    int32_t hdr[LLMC_HEADER_INTS];
    if ((size_t)st.st_size < sizeof hdr ||
        fread(hdr, sizeof hdr, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated header: %lld bytes, an llm.c "
                 "checkpoint starts with %zu", path, (long long)st.st_size,
                 sizeof hdr);
        fclose(f);
        return -1;
    }
    if (hdr[0] != LLMC_MAGIC) {
        snprintf(err, errlen, "%s: bad magic %d, want %d (not an llm.c GPT-2 "
                 "checkpoint)", path, hdr[0], LLMC_MAGIC);
        fclose(f);
        return -1;
    }
    int version = hdr[1];
    if (version != 3 && version != 5) {
        snprintf(err, errlen, "%s: version %d: want 3 (fp32) or 5 (bf16)",
                 path, version);
        fclose(f);
        return -1;
    }
    int maxT = hdr[2], V = hdr[3], L = hdr[4], NH = hdr[5], C = hdr[6],
        Vp = hdr[7];
    const char *what = NULL;
    if (maxT < 1 || maxT > (1 << 20)) what = "max_seq_len";
    else if (V < 1 || V > (1 << 24)) what = "vocab_size";
    else if (L < 1 || L > 4096) what = "num_layers";
    else if (C < 1 || C > (1 << 16)) what = "channels";
    else if (NH < 1 || C % NH != 0) what = "num_heads (must divide channels)";
    else if (Vp < V || Vp > (1 << 24)) what = "padded_vocab_size (must be >= vocab_size)";
    if (what) {
        snprintf(err, errlen, "%s: header: bad %s (maxT %d, V %d, L %d, NH %d, "
                 "C %d, Vp %d)", path, what, maxT, V, L, NH, C, Vp);
        fclose(f);
        return -1;
    }
    model_config cfg = {.vocab_size = V, .n_layer = L, .n_head = NH,
                        .n_embd = C, .seq_len = maxT, .moe_prototypes = 1,
                        .moe_every = 1};
    /* The size the header implies, checked before allocating the model:
     * a header's dimensions alone may ask for terabytes (found by
     * tests/fuzz/fuzz_llmc). */
    m6_weights probe = {.cfg = cfg};
    gpt_layout(&cfg, probe.glob, probe.slot, &probe.n_global, &probe.slot_size);
    size_t esz = version == 3 ? 4 : 2, nf = llmc_floats_(&probe, Vp);
    unsigned long long want = sizeof hdr + (unsigned long long)nf * esz;
    if ((unsigned long long)st.st_size != want) {
        snprintf(err, errlen, "%s: %s: %lld bytes, the header's model (maxT %d, "
                 "V %d, Vp %d, L %d, C %d, version %d) needs %llu",
                 path, (unsigned long long)st.st_size < want ? "truncated"
                 : "trailing bytes after the parameters",
                 (long long)st.st_size, maxT, V, Vp, L, C, version, want);
        fclose(f);
        return -1;
    }
    if (weights_alloc_(w, &cfg, L, err, errlen) != 0) {
        fclose(f);
        return -1;
    }
    snprintf(w->phase, sizeof w->phase, "real");
    unsigned char *raw = malloc(nf * esz);
    float *all = malloc(nf * sizeof(float));
    if (!raw || !all || fread(raw, esz, nf, f) != nf) {
        snprintf(err, errlen, "%s: %s", path, raw && all ? "read failed"
                                                         : "out of memory");
        free(raw);
        free(all);
        goto fail;
    }
    for (size_t i = 0; i < nf; i++) {
        if (esz == 4) {
            memcpy(&all[i], raw + 4 * i, 4);
        } else {  /* bf16: the top half of an f32 */
            uint16_t b;
            memcpy(&b, raw + 2 * i, 2);
            uint32_t u = (uint32_t)b << 16;
            memcpy(&all[i], &u, 4);
        }
    }
    free(raw);
    const float *p = all;
    for (int i = 0; i < 16; i++) {
        const llmc_tensor_ *e = &llmc_order_[i];
        if (e->global >= 0) {
            const gpt_tensor *t = &w->glob[e->global];
            memcpy(tensor_(w, -1, t), p, t->numel * sizeof(float));
            p += e->global == GLOB_WTE ? (size_t)Vp * C : t->numel;
        } else {
            const gpt_tensor *t = &w->slot[e->slot];
            for (int l = 0; l < L; l++, p += t->numel)
                memcpy(tensor_(w, l, t), p, t->numel * sizeof(float));
        }
    }
    free(all);
    fclose(f);
    return 0;
fail:
    fclose(f);
    weights_free(w);
    return -1;
}
