/*
 * spec_write.c — the run spec written out from its key table: the JSON of
 * every key (spec_to_json: defaults included, floats that read back to
 * the same bits), the hash over it (spec_hash), and the keys' markdown
 * table (spec_keys_markdown, for docs/OPERATIONS.md). The
 * table and the parser are spec.c's.
 */
#include "spec/spec_internal.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Canonical JSON                                                            */
/* ------------------------------------------------------------------------ */

/* One value as canonical JSON text, appended to out. 0 or -1. */
static int value_text_(FILE *out, const run_spec *s, const key_ *k)
{
    const char *src = (const char *)s + k->off;
    switch (k->kind) {
    case K_STR: {
        json_t *j = json_stringn(src, strnlen(src, k->size));
        char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        if (!t) return -1;  /* not UTF-8 */
        fputs(t, out);
        free(t);
        return 0;
    }
    case K_INT: { int x; memcpy(&x, src, sizeof x); fprintf(out, "%d", x); return 0; }
    case K_LONG: { long x; memcpy(&x, src, sizeof x); fprintf(out, "%ld", x); return 0; }
    case K_U64: {
        uint64_t x;
        memcpy(&x, src, sizeof x);
        /* above INT64_MAX as a decimal string: JSON integers stop there here */
        fprintf(out, x <= (uint64_t)INT64_MAX ? "%llu" : "\"%llu\"",
                (unsigned long long)x);
        return 0;
    }
    case K_FLOAT: {
        float f;
        memcpy(&f, src, sizeof f);
        if (!isfinite(f)) return -1;
        char t[48];
        spec_float_text_(f, t, sizeof t);
        fputs(t, out);
        return 0;
    }
    case K_ENUM: {
        int i, n = 0;
        memcpy(&i, src, sizeof i);
        while (k->names[n]) n++;
        if (i < 0 || i >= n) return -1;
        fprintf(out, "\"%s\"", k->names[i]);
        return 0;
    }
    case K_SIZE: {
        size_t x;
        memcpy(&x, src, sizeof x);
        if (x > (size_t)INT64_MAX) return -1;
        fprintf(out, "%zu", x);
        return 0;
    }
    }
    return -1;
}

/* Whether key k is written: model.moe's keys only for an MoE model (a dense
 * spec's canonical JSON, and so its hash, is what it was before MoE), and
 * train.max_bad_steps only when set to other than its default. */
static int written_(const run_spec *s, const key_ *k)
{
    /* delink.policy and its keys only for `plateau`: the hash of a spec
     * with the `step` policy is what it was before the policy existed */
    if (k->section && strcmp(k->section, "delink") == 0 &&
        (strcmp(k->key, "policy") == 0 || strcmp(k->key, "min_delta") == 0 ||
         strcmp(k->key, "patience") == 0))
        return s->delink.policy != DELINK_AT_STEP;
    /* pseudo.grad_scale and lr_scale only when not their defaults: older
     * specs, their hashes and checkpoints stay as they were */
    if (k->off == OFF(pseudo.grad_scale))
        return s->pseudo.grad_scale != GRAD_SCALE_SUM;
    if (k->off == OFF(pseudo.lr_scale))
        return s->pseudo.lr_scale != 1.0f;
    /* optimizer.master only when bf16: an fp32 spec's hash is what it was
     * before the key existed */
    if (k->off == OFF(optimizer.master))
        return s->optimizer.master != MASTER_FP32;
    /* optimizer.shard only when set: an unsharded spec's hash is what it
     * was before the key existed */
    if (k->off == OFF(optimizer.shard))
        return s->optimizer.shard != 0;
    /* optimizer.* only for Adafactor: an AdamW spec's hash is what it was
     * before the key existed */
    if (k->section && strcmp(k->section, "optimizer") == 0)
        return s->optimizer.name != OPTIMIZER_ADAMW;
    /* init.from only when set: the hash of a spec without it is unchanged */
    if (k->section && strcmp(k->section, "init") == 0)
        return s->init.from[0] != 0;
    /* offload.speculative only when not auto: older specs keep their hash */
    if (k->section && strcmp(k->section, "offload") == 0 && k->key &&
        strcmp(k->key, "speculative") == 0)
        return s->offload.speculative != SPEC_SPECULATIVE_AUTO;
    /* offload.stream_grads only when set: older specs keep their hash */
    if (k->off == OFF(offload.stream_grads))
        return s->offload.stream_grads != 0;
    /* model.moe.capacity_scope only when group: older MoE specs keep
     * their hash */
    if (k->off == OFF(model.moe_capacity_scope))
        return s->model.moe_capacity_scope != MOE_SCOPE_RANK;
    /* nodes.expert_parallel only when set: specs without expert
     * parallelism keep their hash */
    if (k->off == OFF(nodes.expert_parallel))
        return s->nodes.expert_parallel != 1;
    if (k->section && strcmp(k->section, "nodes") == 0) {
        /* nodes only when not all defaults: a one-node spec's hash is
         * what it was before data parallelism */
        run_spec d;
        spec_defaults(&d);
        return memcmp(&s->nodes, &d.nodes, sizeof s->nodes) != 0;
    }
    /* device.precision only when not fp32: older specs keep their hash */
    if (k->off == OFF(device.precision))
        return s->device.precision != PRECISION_FP32;
    /* train.max_bad_steps only when not its default: specs, and so their
     * hashes and checkpoints, from before it existed stay as they were */
    if (k->off == OFF(train.max_bad_steps))
        return s->train.max_bad_steps != SPEC_MAX_BAD_STEPS;
    /* train.expert_idle_steps the same way */
    if (k->off == OFF(train.expert_idle_steps))
        return s->train.expert_idle_steps != SPEC_EXPERT_IDLE_STEPS;
    return !k->section || strcmp(k->section, "model.moe") != 0 ||
           s->model.moe_experts > 0;
}

/* The top-level scope of a section: "model" for "model.moe". */
static int same_top_(const char *a, const char *b)
{
    if (!a || !b) return a == b;
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    return la == lb && strncmp(a, b, la) == 0;
}

char *spec_to_json(const run_spec *s)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out) return NULL;
    int rc = 0;
    size_t idx[N_KEYS], n = 0;
    for (size_t i = 0; i < N_KEYS; i++)
        if (written_(s, &spec_keys_[i])) idx[n++] = i;
    const char *section = NULL;  /* the open section, NULL: top level */
    fputs("{\n", out);
    for (size_t j = 0; j < n && rc == 0; j++) {
        const key_ *k = &spec_keys_[idx[j]];
        const key_ *next = j + 1 < n ? &spec_keys_[idx[j + 1]] : NULL;
        int nested = k->section && strchr(k->section, '.') != NULL;
        if (k->section && (!section || strcmp(section, k->section) != 0)) {
            if (nested)
                fprintf(out, "    \"%s\": {\n", strchr(k->section, '.') + 1);
            else
                fprintf(out, "  \"%s\": {\n", k->section);
        }
        section = k->section;
        fprintf(out, "%s\"%s\": ", nested ? "      " : k->section ? "    " : "  ",
                k->key);
        rc = value_text_(out, s, k);
        int end_sub = nested && (!next || !next->section ||
                                 strcmp(next->section, k->section) != 0);
        int end_top = k->section && (!next || !same_top_(next->section,
                                                         k->section));
        if (end_sub)
            fprintf(out, "\n    }%s", end_top ? "" : ",\n");
        if (end_top)
            fprintf(out, "\n  }%s\n", next ? "," : "");
        else if (!end_sub)
            fputs(next ? ",\n" : "\n", out);
        if (end_top) section = NULL;
    }
    fputs("}\n", out);
    if (fclose(out) != 0) rc = -1;
    if (rc != 0) {
        free(text);
        return NULL;
    }
    return text;
}

uint64_t spec_hash(const run_spec *s)
{
    char *text = spec_to_json(s);
    if (!text) return 0;
    uint64_t h = 14695981039346656037ULL;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    free(text);
    return h;
}

/* ------------------------------------------------------------------------ */
/* The key table as Markdown (docs/OPERATIONS.md)                                     */
/* ------------------------------------------------------------------------ */

/* A Markdown table cell: '|' escaped so it does not end the cell. */
static void cell_(FILE *out, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|') fputc('\\', out);
        fputc(*p, out);
    }
}

/* What values k takes, as the key table's "range" column says it. */
static void range_md_(const key_ *k, char *buf, size_t len)
{
    switch (k->kind) {
    case K_STR:
        snprintf(buf, len, "at most %zu bytes", k->size - 1);
        return;
    case K_INT:
    case K_LONG:
        if (k->ihi == INT_MAX || k->ihi == LONG_MAX)
            snprintf(buf, len, ">= %lld", k->ilo);
        else
            snprintf(buf, len, "%lld to %lld", k->ilo, k->ihi);
        return;
    case K_U64:
        snprintf(buf, len, "0 to 2^64-1");
        return;
    case K_FLOAT:
        if (isinf(k->fhi))
            snprintf(buf, len, "%s %g", k->lo_open ? ">" : ">=", k->flo);
        else
            snprintf(buf, len, "%c%g, %g%c", k->lo_open ? '(' : '[', k->flo,
                     k->fhi, k->hi_open ? ')' : ']');
        return;
    case K_ENUM: {
        buf[0] = 0;
        for (int i = 0; k->names[i]; i++) {
            size_t n = strlen(buf);
            snprintf(buf + n, len - n, "%s`%s`", i ? " | " : "", k->names[i]);
        }
        return;
    }
    case K_SIZE:
        snprintf(buf, len, "bytes, or a size such as `8GiB`");
        return;
    }
    buf[0] = 0;
}

static const char *type_md_(kind_ kind)
{
    switch (kind) {
    case K_STR: case K_ENUM: return "string";
    case K_INT: case K_LONG: case K_U64: return "integer";
    case K_FLOAT: return "number";
    case K_SIZE: return "size";
    }
    return "?";
}

int spec_keys_markdown(FILE *out)
{
    run_spec d;
    spec_defaults(&d);
    fputs("| key | type | default | range | meaning |\n"
          "|---|---|---|---|---|\n", out);
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_ *k = &spec_keys_[i];
        char path[64], range[128], *dflt = NULL;
        size_t dlen = 0;
        spec_path_of_(k, path, sizeof path);
        range_md_(k, range, sizeof range);
        FILE *m = open_memstream(&dflt, &dlen);
        if (!m) return -1;
        int rc = value_text_(m, &d, k);
        if (fclose(m) != 0 || rc != 0) {
            free(dflt);
            return -1;
        }
        fprintf(out, "| `%s` | %s | ", path, type_md_(k->kind));
        if (k->default_rule)
            fputs(k->default_rule, out);
        else if (strcmp(dflt, "\"\"") == 0) fputs("none", out);
        else fprintf(out, "`%s`", dflt);
        fputs(" | ", out);
        cell_(out, range);
        fputs(" | ", out);
        cell_(out, k->doc);
        fputs(" |\n", out);
        free(dflt);
    }
    return ferror(out) ? -1 : 0;
}
