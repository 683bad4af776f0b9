/*
 * spec.c — the run spec (spec.h): JSON text ⇄ run_spec, with every key
 * range-checked and named in errors. One table lists every key once; parsing,
 * validation and the canonical serialisation all walk it.
 */
#include "spec/spec_internal.h"

#include "common/cpus.h"
#include "common/node_share.h"
#include "common/durable.h"
#include "common/err.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(delink_optimizer) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(delink_policy) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(backend_kind) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(grad_scale_mode) == sizeof(int), "enum is not int-sized");
_Static_assert(sizeof(optimizer_kind) == sizeof(int), "enum is not int-sized");


static const char *const sections_[] = {
    "data", "model", "pseudo", "delink", "train", "optimizer", "checkpoint",
    "device", "offload", "init", "nodes",
};
#define N_SECTIONS (sizeof sections_ / sizeof sections_[0])

static const key_ *find_key_(const char *section, const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_ *k = &spec_keys_[i];
        if ((section == NULL) != (k->section == NULL)) continue;
        if (section && strcmp(section, k->section) != 0) continue;
        if (strcmp(key, k->key) == 0) return k;
    }
    return NULL;
}

static int is_section_(const char *name)
{
    for (size_t i = 0; i < N_SECTIONS; i++)
        if (strcmp(name, sections_[i]) == 0) return 1;
    return 0;
}

/* "section.key" or "key" */
void spec_path_of_(const key_ *k, char *buf, size_t len)
{
    if (k->section) snprintf(buf, len, "%s.%s", k->section, k->key);
    else snprintf(buf, len, "%s", k->key);
}

/* ------------------------------------------------------------------------ */
/* Suggestions for unknown keys                                              */
/* ------------------------------------------------------------------------ */

/* Optimal string alignment distance (insertions, deletions, substitutions
 * and swaps of two neighbours, each 1), ignoring case; strings longer than
 * 63 bytes count as far from everything. */
static int distance_(const char *a, const char *b)
{
    enum { N = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= N || m >= N) return INT_MAX / 2;
    int d[N][N];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]);
            int cb = tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                cb == tolower((unsigned char)a[i - 2]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

/* Names from other trainers that no spelling distance leads to ours. */
static const struct { const char *alias, *path; } synonyms_[] = {
    { "learning_rate", "train.lr" },
    { "min_learning_rate", "train.min_lr" },
    { "max_steps", "train.steps" },
    { "max_iters", "train.steps" },
    { "micro_batch_size", "train.batch_size" },
    { "gradient_accumulation_steps", "train.grad_accum" },
    { "max_grad_norm", "train.grad_clip" },
    { "clip_grad_norm", "train.grad_clip" },
    { "epsilon", "train.eps" },
    { "adam_eps", "train.eps" },
    { "wd", "train.weight_decay" },
    { "eval_interval", "train.eval_every" },
    { "eval_iters", "train.eval_batches" },
    { "num_layers", "model.n_layer" },
    { "num_heads", "model.n_head" },
    { "hidden_size", "model.n_embd" },
    { "d_model", "model.n_embd" },
    { "block_size", "model.seq_len" },
    { "context_length", "model.seq_len" },
    { "delink_step", "pseudo.steps" },
    { "pseudo_steps", "pseudo.steps" },
};

/* The known key nearest to an unknown one: section (NULL at the top level)
 * and key as written. A key of the same section at distance d, or one of
 * another section at d + 1, counts when d is at most a third of the key's
 * length (at least 1); at the top level a section name counts too. Writes
 * "section.key" (or "key") to buf, or "" when nothing is near. */
static void suggest_(const char *section, const char *key, char *buf,
                     size_t len)
{
    buf[0] = 0;
    for (size_t i = 0; i < sizeof synonyms_ / sizeof synonyms_[0]; i++)
        if (strcasecmp(key, synonyms_[i].alias) == 0) {
            snprintf(buf, len, "%s", synonyms_[i].path);
            return;
        }
    int limit = (int)strlen(key) / 3;
    if (limit < 1) limit = 1;
    int best = limit + 1;
    if (!section)
        for (size_t i = 0; i < N_SECTIONS; i++) {
            int d = distance_(key, sections_[i]);
            if (d < best) {
                best = d;
                snprintf(buf, len, "%s", sections_[i]);
            }
        }
    for (int pass = 0; pass < 2; pass++)  /* own section first: it wins ties */
        for (size_t i = 0; i < N_KEYS; i++) {
            const key_ *k = &spec_keys_[i];
            int same = (section == NULL) == (k->section == NULL) &&
                       (!section || strcmp(section, k->section) == 0);
            if (same != (pass == 0)) continue;
            int d = distance_(key, k->key) + !same;
            if (d < best) {
                best = d;
                spec_path_of_(k, buf, len);
            }
        }
}

/* "unknown key 'train.learning_rate' (did you mean 'train.lr'?)" */
static void unknown_key_(const char *section, const char *key, char *err,
                         size_t errlen)
{
    char near[96];
    suggest_(section, key, near, sizeof near);
    const char *dot = section ? "." : "";
    if (near[0])
        seterr_(err, errlen, "unknown key '%s%s%s' (did you mean '%s'?)",
                section ? section : "", dot, key, near);
    else
        seterr_(err, errlen, "unknown key '%s%s%s'", section ? section : "",
                dot, key);
}

/* ------------------------------------------------------------------------ */
/* Defaults                                                                  */
/* ------------------------------------------------------------------------ */

void spec_defaults(run_spec *s)
{
    memset(s, 0, sizeof *s);  /* padding and string tails too: memcmp-stable */
    strcpy(s->name, "run");
    s->model = (model_config){ .vocab_size = 256, .n_layer = 6, .n_head = 4,
                               .n_embd = 128, .seq_len = 128,
                               .moe_experts = 0, .moe_prototypes = 1,
                               .moe_every = 1, .moe_hidden = 0,
                               .moe_capacity_factor = 1.25f,
                               .moe_eval_capacity_factor = 2.0f,
                               .moe_aux_coef = 0.01f, .moe_z_coef = 0.001f };
    s->nodes.world_size = 1;
    s->nodes.pseudo_world_size = 0;
    s->nodes.expert_parallel = 1;
    s->nodes.timeout = 30;
    s->pseudo.share_groups = 1;
    s->pseudo.steps = 0;
    s->pseudo.grad_scale = GRAD_SCALE_SUM;
    s->pseudo.lr_scale = 1.0f;
    s->delink.optimizer = DELINK_OPT_COPY;
    s->delink.rewarm_steps = 0;
    s->delink.policy = DELINK_AT_STEP;
    s->delink.min_delta = 0.01f;
    s->delink.patience = 3;
    s->train.steps = 1000;
    s->train.batch_size = 16;
    s->train.grad_accum = 1;
    s->train.lr = 1e-3f;
    s->train.min_lr = 1e-4f;
    s->train.warmup_steps = 50;
    s->train.weight_decay = 0.1f;
    s->train.grad_clip = 1.0f;
    s->train.beta1 = 0.9f;
    s->train.beta2 = 0.95f;
    s->train.eps = 1e-8f;
    s->train.seed = 1337;
    s->train.eval_every = 100;
    s->train.eval_batches = 8;
    s->train.max_bad_steps = SPEC_MAX_BAD_STEPS;
    s->train.expert_idle_steps = SPEC_EXPERT_IDLE_STEPS;
    s->optimizer.name = OPTIMIZER_ADAMW;
    s->optimizer.beta1 = 0.0f;
    s->optimizer.decay_rate = 0.8f;
    s->optimizer.clip_threshold = 1.0f;
    s->optimizer.eps1 = 1e-30f;
    s->optimizer.eps2 = 1e-3f;
    s->optimizer.scale_parameter = 0;
    s->optimizer.master = MASTER_FP32;
    s->checkpoint.every = 0;
    s->checkpoint.keep = 2;
    s->device.backend = BACKEND_CPU;
    s->device.threads = 0;
    s->device.memory_budget = 0;
    s->device.precision = PRECISION_FP32;
    s->offload.prefetch = 2;
    s->offload.host_threads = 0; /* auto: spec_host_threads */
    s->offload.speculative = SPEC_SPECULATIVE_AUTO;
}

int spec_host_threads(const run_spec *s)
{
    if (s->offload.host_threads > 0)
        return s->offload.host_threads;
    /* auto is the node's: each of its ranks of this run takes its share */
    int k = node_share_ranks(s->nodes.world_size);
    if (s->device.backend != BACKEND_CUDA)
        return node_share_split(2, k); /* the CPU backend's compute
                                        * threads use the cores */
    long n = cpus_available(); /* affinity, capped by the cgroup quota */
    n -= 2; /* the thread that drives the GPU, and m6d's event loop */
    return node_share_split(n < 1 ? 1 : n > 64 ? 64 : (int)n, k);
}

/* ------------------------------------------------------------------------ */
/* Parsing one value                                                         */
/* ------------------------------------------------------------------------ */

/* A JSON value as the operator wrote it, shortened for messages. */
static void show_(const json_t *v, char *buf, size_t len)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT |
                            JSON_REAL_PRECISION(9));
    if (!t) {
        snprintf(buf, len, "(value)");
        return;
    }
    if (strlen(t) > 60) strcpy(t + 57, "...");
    snprintf(buf, len, "%s", t);
    free(t);
}

static const char *type_name_(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

int spec_name_ok(const char *s)
{
    if (!*s || *s == '.' || *s == '-') return 0;
    if (strspn(s, "0123456789") == strlen(s)) return 0;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* "4GiB", "1.5 MiB", "512MB", "1024" → bytes (a fraction of a larger unit
 * rounds down to whole bytes; one of a byte, "1.5", is bad text). 0 ok, -1
 * bad text, -2 overflow */
int spec_parse_size(const char *s, size_t *out)
{
    static const struct { const char *sfx; unsigned long long mult; } units[] = {
        { "", 1 }, { "B", 1 },
        { "KiB", 1ULL << 10 }, { "MiB", 1ULL << 20 }, { "GiB", 1ULL << 30 },
        { "TiB", 1ULL << 40 },
        { "KB", 1000ULL }, { "MB", 1000000ULL }, { "GB", 1000000000ULL },
        { "TB", 1000000000000ULL },
    };
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    unsigned long long whole = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (whole > (ULLONG_MAX - 9) / 10) return -2;
        whole = whole * 10 + (unsigned)(*p - '0');
    }
    const char *frac = NULL;
    size_t nfrac = 0;
    if (*p == '.') {
        frac = ++p;
        for (; *p >= '0' && *p <= '9'; p++) nfrac++;
        if (nfrac == 0) return -1;
    }
    if (*p == ' ') p++;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (strcasecmp(p, units[u].sfx) != 0) continue;
        unsigned long long m = units[u].mult;
        /* a fraction of a byte ("1.5", "2.25B") is a typo, not a size */
        if (frac && m == 1 && strspn(frac, "0") < nfrac) return -1;
        if (whole > (unsigned long long)INT64_MAX / m) return -2;
        unsigned long long v = whole * m;
        if (frac) {  /* fraction of the unit, rounded down to whole bytes */
            long double f = 0, scale = 1;
            for (size_t i = 0; i < nfrac; i++) {
                scale /= 10;
                f += (frac[i] - '0') * scale;
            }
            unsigned long long extra = (unsigned long long)(f * (long double)m);
            if (v > (unsigned long long)INT64_MAX - extra) return -2;
            v += extra;
        }
        if (v > SIZE_MAX) return -2;
        *out = (size_t)v;
        return 0;
    }
    return -1;
}

/* Shortest "%.Ng" that reads back (as spec_parse reads it: strtod, then a
 * float cast) to exactly f; 9 digits always do. Keeps a '.' or exponent so
 * the value stays a JSON real. */
void spec_float_text_(float f, char *buf, size_t len)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, len, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", len - strlen(buf) - 1);
}

/* Print a float range like "> 0", ">= 0" or "in [0, 1)". */
static void range_text_(const key_ *k, char *buf, size_t len)
{
    if (isinf(k->fhi))
        snprintf(buf, len, "%s %g", k->lo_open ? ">" : ">=", k->flo);
    else
        snprintf(buf, len, "in %c%g, %g%c", k->lo_open ? '(' : '[', k->flo,
                 k->fhi, k->hi_open ? ')' : ']');
}

static int set_value_(run_spec *s, const key_ *k, const json_t *v, char *err,
                      size_t errlen)
{
    char path[64], shown[80];
    spec_path_of_(k, path, sizeof path);
    show_(v, shown, sizeof shown);
    char *dst = (char *)s + k->off;

    switch (k->kind) {
    case K_STR: {
        if (!json_is_string(v)) {
            seterr_(err, errlen, "%s: must be a string, got %s", path, shown);
            return -1;
        }
        size_t n = json_string_length(v);
        if (n >= k->size) {
            seterr_(err, errlen, "%s: too long (%zu bytes, at most %zu)", path,
                    n, k->size - 1);
            return -1;
        }
        const char *str = json_string_value(v);
        if (k->section == NULL && !spec_name_ok(str)) {
            seterr_(err, errlen,
                    "%s: must be letters, digits, '.', '_' or '-', not starting "
                    "with '.' or '-' and not all digits (those are run ids), "
                    "got %s", path, shown);
            return -1;
        }
        memset(dst, 0, k->size);
        memcpy(dst, str, n);
        return 0;
    }
    case K_INT:
    case K_LONG: {
        if (json_is_boolean(v) && k->ilo == 0 && k->ihi == 1) {
            int x = json_is_true(v); /* a 0|1 key also takes false|true */
            memcpy(dst, &x, sizeof x);
            return 0;
        }
        if (!json_is_integer(v)) {
            if (k->ilo == 0 && k->ihi == 1)
                seterr_(err, errlen, "%s: must be true or false (or 1, 0), "
                        "got %s", path, shown);
            else
                seterr_(err, errlen, "%s: must be an integer, got %s", path,
                        shown);
            return -1;
        }
        long long x = json_integer_value(v);
        if (x < k->ilo || x > k->ihi) {
            if (x < k->ilo && (k->ihi == INT_MAX || k->ihi == LONG_MAX))
                seterr_(err, errlen, "%s: must be >= %lld, got %lld", path,
                        k->ilo, x);
            else
                seterr_(err, errlen, "%s: must be in [%lld, %lld], got %lld",
                        path, k->ilo, k->ihi, x);
            return -1;
        }
        if (k->kind == K_INT) { int y = (int)x; memcpy(dst, &y, sizeof y); }
        else { long y = (long)x; memcpy(dst, &y, sizeof y); }
        return 0;
    }
    case K_U64: {
        uint64_t x;
        if (json_is_integer(v) && json_integer_value(v) >= 0) {
            x = (uint64_t)json_integer_value(v);
        } else if (json_is_string(v)) {  /* full uint64 range */
            const char *t = json_string_value(v);
            char *end;
            errno = 0;
            unsigned long long y = strtoull(t, &end, 10);
            if (*t < '0' || *t > '9' || *end || errno == ERANGE) {
                seterr_(err, errlen, "%s: must be an integer in [0, 2^64), got %s",
                        path, shown);
                return -1;
            }
            x = (uint64_t)y;
        } else {
            seterr_(err, errlen, "%s: must be an integer in [0, 2^64), got %s",
                    path, shown);
            return -1;
        }
        memcpy(dst, &x, sizeof x);
        return 0;
    }
    case K_FLOAT: {
        if (!json_is_number(v)) {
            seterr_(err, errlen, "%s: must be a number, got %s", path, shown);
            return -1;
        }
        double d = json_number_value(v);
        if (!(fabs(d) <= FLT_MAX)) {
            seterr_(err, errlen, "%s: %s is out of range for a 32-bit float",
                    path, shown);
            return -1;
        }
        float f = (float)d;
        int ok = (k->lo_open ? f > k->flo : f >= k->flo) &&
                 (k->hi_open ? f < k->fhi : f <= k->fhi);
        if (!ok) {
            char range[64];
            range_text_(k, range, sizeof range);
            if ((double)f != d) {
                char ft[48];
                spec_float_text_(f, ft, sizeof ft);
                seterr_(err, errlen, "%s: must be %s, got %s (%s as a "
                        "32-bit float)", path, range, shown, ft);
            }
            else
                seterr_(err, errlen, "%s: must be %s, got %s", path, range,
                        shown);
            return -1;
        }
        memcpy(dst, &f, sizeof f);
        return 0;
    }
    case K_ENUM: {
        if (json_is_string(v)) {
            for (int i = 0; k->names[i]; i++)
                if (strcmp(json_string_value(v), k->names[i]) == 0) {
                    memcpy(dst, &i, sizeof i);
                    return 0;
                }
        }
        char want[128] = "";
        for (int i = 0; k->names[i]; i++) {
            size_t len = strlen(want);
            snprintf(want + len, sizeof want - len, "%s\"%s\"",
                     i == 0 ? "" : k->names[i + 1] ? ", " : " or ",
                     k->names[i]);
        }
        seterr_(err, errlen, "%s: must be %s, got %s", path, want, shown);
        return -1;
    }
    case K_SIZE: {
        size_t bytes;
        if (json_is_integer(v)) {
            if (json_integer_value(v) < 0) {
                seterr_(err, errlen, "%s: must be >= 0, got %s", path, shown);
                return -1;
            }
            bytes = (size_t)json_integer_value(v);
        } else if (json_is_string(v)) {
            int rc = spec_parse_size(json_string_value(v), &bytes);
            if (rc == -2) {
                seterr_(err, errlen, "%s: %s is too large", path, shown);
                return -1;
            }
            if (rc != 0) {
                seterr_(err, errlen, "%s: bad size %s (want bytes, or a number "
                        "with a suffix: " SPEC_SIZE_UNITS ")", path, shown);
                return -1;
            }
        } else {
            seterr_(err, errlen, "%s: must be bytes (an integer) or a string "
                    "like \"8GiB\", got %s", path, shown);
            return -1;
        }
        memcpy(dst, &bytes, sizeof bytes);
        return 0;
    }
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Parsing a spec                                                            */
/* ------------------------------------------------------------------------ */

/* delink.policy's rules between keys. With the `step` policy min_delta and
 * patience stay at their defaults: the canonical JSON omits them then, so a
 * spec without a policy keeps the hash it had before the policy existed. */
static int policy_check_(const run_spec *s, char *err, size_t errlen)
{
    run_spec d;
    spec_defaults(&d);
    if (s->delink.policy == DELINK_AT_STEP) {
        if (s->delink.min_delta != d.delink.min_delta ||
            s->delink.patience != d.delink.patience) {
            seterr_(err, errlen, "delink.%s: set, but delink.policy is "
                    "\"step\" (it applies to \"plateau\" only); set "
                    "delink.policy to \"plateau\" or remove it",
                    s->delink.min_delta != d.delink.min_delta ? "min_delta"
                                                             : "patience");
            return -1;
        }
        return 0;
    }
    if (s->pseudo.steps == 0) {
        seterr_(err, errlen, "delink.policy: \"plateau\" needs a pseudo "
                "phase, but pseudo.steps is 0 (the run trains the real model "
                "from scratch); set pseudo.steps, the latest delink step");
        return -1;
    }
    if (s->train.eval_every == 0) {
        seterr_(err, errlen, "delink.policy: \"plateau\" watches the "
                "validation loss, but train.eval_every is 0 (only a pass "
                "after the last step); set train.eval_every");
        return -1;
    }
    return 0;
}

/* model.moe's rules between keys. A dense model (num_experts 0) leaves the
 * other keys at their defaults: the canonical JSON omits the section then,
 * so a dense spec keeps the hash it had before MoE existed. */
static int moe_check_(const run_spec *s, char *err, size_t errlen)
{
    const model_config *m = &s->model;
    if (m->moe_experts == 0) {
        run_spec d;
        spec_defaults(&d);
        for (size_t i = 0; i < N_KEYS; i++) {
            const key_ *k = &spec_keys_[i];
            if (!k->section || strcmp(k->section, "model.moe") != 0 ||
                strcmp(k->key, "num_experts") == 0)
                continue;
            if (memcmp((const char *)s + k->off, (const char *)&d + k->off,
                       k->size) != 0) {
                seterr_(err, errlen, "model.moe.%s: set, but "
                        "model.moe.num_experts is 0 (a dense model); set "
                        "num_experts or remove it", k->key);
                return -1;
            }
        }
        return 0;
    }
    if (m->moe_experts % m->moe_prototypes != 0) {
        seterr_(err, errlen, "model.moe.prototypes: must divide "
                "model.moe.num_experts (%d %% %d != 0)", m->moe_experts,
                m->moe_prototypes);
        return -1;
    }
    if (m->moe_every > m->n_layer) {
        seterr_(err, errlen, "model.moe.every: must be in [1, model.n_layer "
                "= %d], got %d", m->n_layer, m->moe_every);
        return -1;
    }
    /* the expert tensors have E*H and E*C rows (gpt_tensor's rows are an
     * int): keep both products in range here, where the keys are named */
    long long EH = (long long)m->moe_experts * model_moe_hidden(m),
              EC = (long long)m->moe_experts * m->n_embd;
    if (EH > INT_MAX || EC > INT_MAX) {
        seterr_(err, errlen, "model.moe.num_experts: %d experts of %s %lld "
                "rows make %lld rows in one expert tensor, more than %d",
                m->moe_experts,
                EH > INT_MAX ? "model.moe.expert_hidden" : "model.n_embd",
                (long long)(EH > INT_MAX ? model_moe_hidden(m) : m->n_embd),
                EH > INT_MAX ? EH : EC, INT_MAX);
        return -1;
    }
    int n_moe = m->n_layer / m->moe_every;  /* layers l with (l+1) % n == 0 */
    if (n_moe < m->n_layer) {
        /* a mixed model: a slot holds blocks of one kind */
        if (s->pseudo.steps > 0 && s->pseudo.share_groups < 2) {
            seterr_(err, errlen, "pseudo.share_groups: model.moe.every = %d "
                    "mixes dense and MoE blocks, and a slot holds blocks of "
                    "one kind, so the pseudo model needs at least 2 slots "
                    "(one of each kind), got %d", m->moe_every,
                    s->pseudo.share_groups);
            return -1;
        }
    }
    return 0;
}

int spec_dp_split(const run_spec *s, int world, int *B_rank,
                  int *accum_rank)
{
    int B = s->train.batch_size, A = s->train.grad_accum;
    if (world < 1)
        return -1;
    if (A % world == 0) {
        *B_rank = B;
        *accum_rank = A / world;
        return 0;
    }
    if (B % world == 0) {
        *B_rank = B / world;
        *accum_rank = A;
        return 0;
    }
    return -1;
}

int spec_world_of_phase(const run_spec *s, int pseudo)
{
    return pseudo && s->nodes.pseudo_world_size > 0
               ? s->nodes.pseudo_world_size : s->nodes.world_size;
}

int spec_shard_world_of_phase(const run_spec *s, int pseudo)
{
    int W = spec_world_of_phase(s, pseudo), P = s->nodes.expert_parallel;
    return P > 1 ? (W >= P ? W / P : 1) : W;
}

int spec_state_split(const run_spec *s)
{
    return s->optimizer.shard || s->nodes.expert_parallel > 1;
}


precision_kind spec_precision(const run_spec *s)
{
    return s->device.backend == BACKEND_CUDA ? PRECISION_BF16
                                             : s->device.precision;
}



/* optimizer.master bf16: where it is not implemented, refused by name
 * (on cpu offloaded slots are bf16 masters too: the host AdamW rounds
 * them stochastically as gpt_adamw does the resident ones; on cuda
 * resident slots only). */
static int master_check_(const run_spec *s, char *err, size_t errlen)
{
    if (s->device.backend != BACKEND_CUDA)
        return 0;
    if (s->device.memory_budget <= 0)
        return 0;
    /* offloaded slots: host updates of the bf16 masters; the speculative
     * update keeps fp32 masters */
    if (s->offload.speculative != SPEC_SPECULATIVE_ON)
        return 0;
    seterr_(err, errlen, "optimizer.master \"bf16\" on device.backend "
            "\"cuda\" with offload.speculative \"on\" is not supported "
            "yet (the speculative update's second buffers are fp32 "
            "masters'); set it to \"auto\" or \"off\", or use "
            "device.backend \"cpu\" or optimizer.master \"fp32\"");
    return -1;
}

/* optimizer.shard: where it is not implemented, refused by name, with
 * the other setting that would do and the way out of sharding. */
static int shard_check_(const run_spec *s, char *err, size_t errlen)
{
    const char *why = NULL, *instead = NULL;
    if (s->device.backend == BACKEND_CUDA) {
        why = "on device.backend \"cuda\" (the CUDA backend keeps the "
              "whole state)";
        instead = "device.backend to \"cpu\"";
    } else if (s->device.memory_budget > 0 &&
               s->offload.speculative == SPEC_SPECULATIVE_ON) {
        why = "with offload.speculative \"on\" (the speculative update "
              "keeps a copy of an offloaded slot's state, which lives "
              "apart, sharded)";
        instead = "offload.speculative to \"auto\" or \"off\"";
    } else if (s->optimizer.name == OPTIMIZER_ADAFACTOR &&
               s->model.moe_experts > 0) {
        why = "with optimizer.name \"adafactor\" on an MoE model (an MoE "
              "slot's Adafactor statistics are not laid out in its "
              "tensors' order, so whole tensors make no contiguous shard)";
        instead = "optimizer.name to \"adamw\"";
    }
    if (!why)
        return 0;
    seterr_(err, errlen, "optimizer.shard %s is not supported yet; set %s, "
            "or optimizer.shard to false", why, instead);
    return -1;
}

/* optimizer.*: Adafactor's knobs only with it, and what it does not run
 * on yet refused by name. */
static int optimizer_check_(const run_spec *s, char *err, size_t errlen)
{
    if (s->optimizer.master == MASTER_BF16 &&
        master_check_(s, err, errlen) != 0)
        return -1;
    if (s->optimizer.shard && shard_check_(s, err, errlen) != 0)
        return -1;
    if (s->optimizer.name == OPTIMIZER_ADAMW) {
        run_spec d;
        spec_defaults(&d);
        d.optimizer.master = s->optimizer.master; /* either optimizer's */
        d.optimizer.shard = s->optimizer.shard;
        if (memcmp(&s->optimizer, &d.optimizer, sizeof s->optimizer) != 0) {
            seterr_(err, errlen, "optimizer: its keys other than name are "
                    "Adafactor's; set optimizer.name to \"adafactor\" or "
                    "remove them (AdamW's are train.beta1, beta2, eps)");
            return -1;
        }
        return 0;
    }
    /* offloaded slots get host Adafactor; the speculative update's second
     * buffers are AdamW's */
    if (s->device.memory_budget > 0 &&
        s->offload.speculative == SPEC_SPECULATIVE_ON) {
        seterr_(err, errlen, "optimizer.name \"adafactor\" with "
                "offload.speculative \"on\" is not supported yet (the "
                "speculative update keeps AdamW's state only); set "
                "offload.speculative to \"auto\" or \"off\"");
        return -1;
    }
    return 0;
}


int spec_slots_of_phase(const run_spec *s, int pseudo)
{
    return pseudo ? s->pseudo.share_groups : s->model.n_layer;
}

int spec_has_first_moment(const run_spec *s)
{
    return s->optimizer.name != OPTIMIZER_ADAFACTOR || s->optimizer.beta1 > 0;
}

gpt_optim spec_gpt_optim(const run_spec *s)
{
    int af = s->optimizer.name == OPTIMIZER_ADAFACTOR;
    /* sharded with offloading: the state on the host, apart from the
     * placed slots (the cpu backend: the spec refuses the rest) */
    int soh = s->optimizer.shard && s->device.memory_budget > 0 &&
              s->device.backend == BACKEND_CPU;
    return (gpt_optim){af, af && spec_has_first_moment(s),
                       s->optimizer.master == MASTER_BF16, s->train.seed,
                       soh};
}

/* nodes.expert_parallel: P divides the world, at most E, MoE blocks to
 * split; P > 1 only where the engine builds it (world_size/P groups of P
 * ranks on the CPU backend, offloading or not; a pseudo phase alone or in
 * groups of P too), the rest refused by name. */
static int ep_check_(const run_spec *s, char *err, size_t errlen)
{
    int P = s->nodes.expert_parallel, W = s->nodes.world_size;
    int E = s->model.moe_experts, pw = s->nodes.pseudo_world_size;
    if (P == 1)
        return 0;
    if (E == 0) {
        seterr_(err, errlen, "nodes.expert_parallel: %d, but the model has "
                "no MoE blocks (model.moe.num_experts is 0); remove it", P);
        return -1;
    }
    if (P > E) {
        seterr_(err, errlen, "nodes.expert_parallel: at most "
                "model.moe.num_experts (%d), got %d: every rank holds at "
                "least one expert of each MoE slot", E, P);
        return -1;
    }
    if (W % P != 0) {
        seterr_(err, errlen, "nodes.expert_parallel: %d must divide "
                "nodes.world_size (%d): the ranks form world_size/P groups "
                "of P", P, W);
        return -1;
    }
    if (s->optimizer.shard && W == P) {
        seterr_(err, errlen, "optimizer.shard with nodes.expert_parallel "
                "%d equal to nodes.world_size: the optimizer state is "
                "sharded over the world_size / P ranks that hold the same "
                "experts, and here each rank is alone with its own; set "
                "optimizer.shard to false, or nodes.world_size to a "
                "multiple of %d (replicas)", P, P);
        return -1;
    }
    const char *why =
        s->device.backend == BACKEND_CUDA
            ? "on device.backend \"cuda\" (the all-to-all runs on host "
              "memory over gloo; use device.backend \"cpu\")"
        : pw > 1 && pw % P != 0
            ? "with a pseudo world that is neither 1 nor a multiple of it "
              "(nodes.pseudo_world_size: the pseudo phase's groups are of "
              "P ranks too)"
            : NULL;
    int eb = s->train.eval_batches;
    if (!why && (eb % W != 0 || (pw > 1 && eb % pw != 0))) {
        /* not a missing feature: every rank enters every all-to-all */
        char pws[64] = "";
        if (pw > 1)
            snprintf(pws, sizeof pws, " and of nodes.pseudo_world_size (%d)",
                     pw);
        seterr_(err, errlen, "nodes.expert_parallel %d: train.eval_batches "
                "(%d) must be a multiple of nodes.world_size (%d)%s: every "
                "rank runs every all-to-all of an evaluation, so each must "
                "evaluate as many batches", P, eb, W, pws);
        return -1;
    }
    if (!why)
        return 0;
    seterr_(err, errlen, "nodes.expert_parallel %d is not supported yet %s",
            P, why);
    return -1;
}

/* nodes.*: the worlds must split the global batch evenly, the pseudo
 * world is at most the real one and needs a pseudo phase, and what the
 * data-parallel step does not do yet is refused by name. */
static int nodes_check_(const run_spec *s, char *err, size_t errlen)
{
    int W = s->nodes.world_size, P = s->nodes.pseudo_world_size, b, a;
    if (P > W) {
        seterr_(err, errlen, "nodes.pseudo_world_size: at most "
                "nodes.world_size (%d), got %d", W, P);
        return -1;
    }
    if (P > 0 && s->pseudo.steps == 0) {
        seterr_(err, errlen, "nodes.pseudo_world_size: set, but the run has "
                "no pseudo phase (pseudo.steps is 0); remove it");
        return -1;
    }
    const char *key[2] = {"nodes.world_size", "nodes.pseudo_world_size"};
    int worlds[2] = {W, P};
    for (int i = 0; i < 2; i++)
        if (worlds[i] > 1 && spec_dp_split(s, worlds[i], &b, &a) != 0) {
            seterr_(err, errlen, "%s: %d must divide train.grad_accum (%d) "
                    "or train.batch_size (%d): every rank takes an equal "
                    "share of each global batch", key[i], worlds[i],
                    s->train.grad_accum, s->train.batch_size);
            return -1;
        }
    if (W > 1 && s->device.backend == BACKEND_CUDA &&
        s->device.memory_budget > 0) {
        seterr_(err, errlen, "nodes.world_size: %d ranks on device.backend "
                "\"cuda\" cannot offload yet (device.memory_budget must be "
                "0: an offloaded slot's host update would need the group's "
                "gradient first)", W);
        return -1;
    }
    return 0;
}

/* offload.stream_grads: what cannot stream is refused by name, never run
 * unstreamed. */
static int stream_check_(const run_spec *s, char *err, size_t errlen)
{
    const char *why =
        s->device.memory_budget == 0
            ? "needs offloading (device.memory_budget > 0): without it no "
              "gradient is kept in host memory; remove offload.stream_grads"
        : s->train.grad_clip > 0
            ? "needs train.grad_clip 0: the global-norm clip needs every "
              "gradient before any update (Adafactor's update clipping, "
              "optimizer.clip_threshold, bounds each update instead)"
        : s->train.grad_accum > 1
            ? "needs train.grad_accum 1: accumulating microbatches keeps "
              "every offloaded slot's gradient for the whole step"
        : s->nodes.world_size > 1 || s->nodes.pseudo_world_size > 1
            ? "with nodes.world_size > 1 is not supported yet (an offloaded "
              "slot's gradient is final only after the all-reduce); set "
              "nodes.world_size to 1"
            : NULL;
    if (!why)
        return 0;
    seterr_(err, errlen, "offload.stream_grads %s", why);
    return -1;
}

/* Checks between keys, once every key is read. */
static int cross_check_(const run_spec *s, char *err, size_t errlen)
{
    if (!s->data.train[0]) {
        seterr_(err, errlen, "data.train: required (a glob of token shards)");
        return -1;
    }
    if (!s->data.val[0]) {
        seterr_(err, errlen, "data.val: required (a glob of token shards)");
        return -1;
    }
    const model_config *m = &s->model;
    if (m->n_embd % m->n_head != 0) {
        seterr_(err, errlen, "model.n_embd: must be divisible by model.n_head "
                "(%d %% %d != 0)", m->n_embd, m->n_head);
        return -1;
    }
    if (moe_check_(s, err, errlen) != 0)
        return -1;
    if (nodes_check_(s, err, errlen) != 0 || ep_check_(s, err, errlen) != 0)
        return -1;
    if (optimizer_check_(s, err, errlen) != 0)
        return -1;
    if (s->offload.stream_grads && stream_check_(s, err, errlen) != 0)
        return -1;
    /* B*T is the row count of every GEMM (an int for CBLAS and cuBLAS) */
    if ((long long)s->train.batch_size * m->seq_len > INT_MAX) {
        seterr_(err, errlen, "train.batch_size * model.seq_len: %lld tokens "
                "per microbatch, at most %d (lower batch_size and raise "
                "grad_accum)", (long long)s->train.batch_size * m->seq_len,
                INT_MAX);
        return -1;
    }
    /* Parameters with their gradients and AdamW moments (16 bytes each) and
     * the activations of one microbatch (attention scores B*NH*T*T per
     * layer): beyond 1 PiB no node holds it, and the byte counts of the
     * planner would be near size_t's limit. Counted in long double. */
    long double L = m->n_layer, C = m->n_embd, T = m->seq_len,
                NH = m->n_head, V = m->vocab_size, B = s->train.batch_size;
    long double params = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
    long double acts = L * B * T * (16 * C + NH * T) + B * T * (3 * V + 14 * C);
    if (m->moe_experts > 0) {  /* MoE blocks: experts and gate */
        long double E = m->moe_experts, H = model_moe_hidden(m),
                    k = m->moe_prototypes, Lm = m->n_layer / m->moe_every;
        params += Lm * (E * (2 * H * C + H + C) + E * C + E - 8 * C * C - 5 * C);
        acts += L * B * T * (k * (2 * C + 2 * H) + E);
    }
    long double bytes = 16 * params + 4 * acts;
    if (bytes > 0x1p50L) {
        seterr_(err, errlen, "model: needs about %.3Lg PiB (%.3Lg parameters "
                "with gradients and AdamW moments, and the activations of a "
                "batch of %d x %d tokens), more than the 1 PiB m6 plans for "
                "on one node", bytes / 0x1p50L, params, s->train.batch_size,
                m->seq_len);
        return -1;
    }
    if (s->pseudo.share_groups > m->n_layer) {
        seterr_(err, errlen, "pseudo.share_groups: must be in [1, model.n_layer "
                "= %d], got %d", m->n_layer, s->pseudo.share_groups);
        return -1;
    }
    if (s->pseudo.steps > s->train.steps) {
        seterr_(err, errlen, "pseudo.steps: must be in [0, train.steps = %ld], "
                "got %ld", s->train.steps, s->pseudo.steps);
        return -1;
    }
    if (policy_check_(s, err, errlen) < 0) return -1;
    if (s->train.min_lr > s->train.lr) {
        char lr[48], min_lr[48];
        spec_float_text_(s->train.lr, lr, sizeof lr);
        spec_float_text_(s->train.min_lr, min_lr, sizeof min_lr);
        seterr_(err, errlen, "train.min_lr: must be in [0, train.lr = %s], "
                "got %s", lr, min_lr);
        return -1;
    }
    return 0;
}

/* The Pseudo-to-Real keys a spec with a pseudo phase leaves out take the
 * best setting of bench/p2r_sweep's grid (issue 21; docs/DESIGN.md "When
 * Pseudo-to-Real pays"): S = L/2 slots (at least 1, or the 2 a model with
 * dense and MoE slots needs), and a re-warmup over 5% of train.steps (at
 * most the real phase). The values then stand in the canonical JSON, so a
 * stored run resumes with them whatever later defaults are. spec_defaults
 * (the C API's starting point, without a model yet) keeps 1 and 0. */
static void p2r_defaults_(run_spec *s, const json_t *root)
{
    if (s->pseudo.steps <= 0)
        return;
    if (!json_object_get(json_object_get(root, "pseudo"), "share_groups")) {
        int S = s->model.n_layer / 2;
        if (s->model.moe_experts > 0 && s->model.moe_every > 1 && S < 2)
            S = 2;
        s->pseudo.share_groups = S < 1 ? 1 : S;
    }
    if (!json_object_get(json_object_get(root, "delink"), "rewarm_steps")) {
        long r = lround(SPEC_P2R_REWARM_FRAC * (double)s->train.steps);
        long room = s->train.steps - s->pseudo.steps;
        s->delink.rewarm_steps = r < room ? r : room < 0 ? 0 : room;
    }
}

/* The dotted key ("train.steps") of the value that ends at byte pos of
 * json, into buf ("" when there is none: the top level). The text before
 * pos parsed (jansson stopped at pos), so a scan of its strings, brackets
 * and colons is enough; array levels add nothing. For the error of a
 * value jansson cannot hold, which names only a line and a column. */
static void key_at_(const char *json, size_t pos, char *buf, size_t len)
{
    enum { DEPTH = 16, KEY = 64 };
    char keys[DEPTH][KEY], last[KEY] = "";
    int d = 0;
    for (size_t i = 0; i < pos; i++) {
        if (json[i] == '"') {  /* a string: the key, if a colon follows */
            size_t k = 0;
            for (i++; i < pos && json[i] != '"'; i++) {
                if (json[i] == '\\') i++;
                else if (k < KEY - 1) last[k++] = json[i];
            }
            last[k] = 0;
        } else if (json[i] == ':' && d > 0 && d <= DEPTH) {
            snprintf(keys[d - 1], KEY, "%s", last);
        } else if (json[i] == '{' || json[i] == '[') {
            if (++d >= 1 && d <= DEPTH) keys[d - 1][0] = 0;
        } else if (json[i] == '}' || json[i] == ']') {
            d--;
        }
    }
    size_t o = 0;
    buf[0] = 0;
    for (int l = 0; l < d && l < DEPTH && o < len; l++)
        if (keys[l][0])
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "." : "",
                                  keys[l]);
}

int spec_parse(run_spec *out, const char *json, size_t len, char *err,
               size_t errlen)
{
    json_error_t jerr;
    if (json && len >= 3 && memcmp(json, "\xef\xbb\xbf", 3) == 0) {
        /* JSON (RFC 8259 section 8.1) has no byte order mark, and jansson's
         * error would show it as an invisible character */
        seterr_(err, errlen, "JSON syntax error at line 1, column 1: the spec "
                "starts with a UTF-8 byte order mark (bytes EF BB BF), which "
                "JSON does not allow: save it without one (e.g. sed -i "
                "'1s/^\\xEF\\xBB\\xBF//' FILE)");
        return -1;
    }
    json_t *root = json_loadb(json ? json : "", json ? len : 0,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char key[256] = "";
        if (json_error_code(&jerr) == json_error_numeric_overflow &&
            jerr.position > 0 && (size_t)jerr.position <= len)
            key_at_(json, (size_t)jerr.position, key, sizeof key);
        /* jansson's words for \u0000 name its flag, not the input */
        const char *text = strstr(jerr.text, "JSON_ALLOW_NUL")
                               ? "\\u0000 (a NUL character) is not allowed "
                                 "in a spec's strings"
                               : jerr.text;
        seterr_(err, errlen, "JSON syntax error at line %d, column %d: %s%s%s%s",
                jerr.line, jerr.column, text,
                key[0] ? " (the value of " : "", key,
                key[0] ? ": an integer must fit in 64 bits)" : "");
        return -1;
    }
    int rc = -1;
    char shown[80];
    if (!json_is_object(root)) {
        show_(root, shown, sizeof shown);
        seterr_(err, errlen, "spec: must be a JSON object, got %s", shown);
        goto out;
    }
    run_spec s;
    spec_defaults(&s);

    const char *name;
    json_t *val;
    json_object_foreach(root, name, val) {  /* document order */
        if (!is_section_(name)) {
            const key_ *k = find_key_(NULL, name);
            if (!k) {
                unknown_key_(NULL, name, err, errlen);
                goto out;
            }
            if (set_value_(&s, k, val, err, errlen) != 0) goto out;
            continue;
        }
        if (!json_is_object(val)) {
            seterr_(err, errlen, "%s: must be an object, got %s", name,
                    type_name_(val));
            goto out;
        }
        const char *key;
        json_t *v;
        json_object_foreach(val, key, v) {
            if (strcmp(name, "model") == 0 && strcmp(key, "moe") == 0) {
                if (!json_is_object(v)) {
                    seterr_(err, errlen, "model.moe: must be an object, got %s",
                            type_name_(v));
                    goto out;
                }
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) {
                    const key_ *k = find_key_("model.moe", mk);
                    if (!k) {
                        unknown_key_("model.moe", mk, err, errlen);
                        goto out;
                    }
                    if (set_value_(&s, k, mv, err, errlen) != 0) goto out;
                }
                continue;
            }
            const key_ *k = find_key_(name, key);
            if (!k) {
                unknown_key_(name, key, err, errlen);
                goto out;
            }
            if (set_value_(&s, k, v, err, errlen) != 0) goto out;
        }
    }
    p2r_defaults_(&s, root);
    if (cross_check_(&s, err, errlen) != 0) goto out;
    /* cuda computes in bf16 only: a spec that asks for fp32 there is
     * refused by name rather than silently trained in bf16 */
    json_t *dev = json_object_get(root, "device");
    if (s.device.backend == BACKEND_CUDA && s.device.precision ==
        PRECISION_FP32 && dev && json_object_get(dev, "precision")) {
        seterr_(err, errlen, "device.precision: \"fp32\" is not available "
                "on device.backend \"cuda\" (its kernels take bf16 inputs "
                "and sum in fp32; optimizer.master chooses the master "
                "weights); use \"bf16\" or the \"cpu\" backend");
        goto out;
    }
    *out = s;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int spec_load_file(run_spec *s, const char *path, char *err, size_t errlen)
{
    enum { MAX_SPEC = 16 << 20 };
    struct stat st;
    int fd = open_regular(path, 0, &st, err, errlen);  /* no FIFO hang */
    if (fd < 0)
        return -1;
    if (st.st_size > MAX_SPEC) {
        seterr_(err, errlen, "%s: %lld bytes is too large for a spec (max %d)",
                path, (long long)st.st_size, MAX_SPEC);
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        seterr_(err, errlen, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    for (;;) {
        if (n == cap) {  /* file grew since fstat */
            seterr_(err, errlen, "%s: changed while being read", path);
            free(buf);
            close(fd);
            return -1;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0) {
            if (errno == EINTR) continue;
            seterr_(err, errlen, "%s: read: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    char msg[1024];
    int rc = spec_parse(s, buf, n, msg, sizeof msg);
    free(buf);
    if (rc != 0) seterr_(err, errlen, "%s: %s", path, msg);
    return rc;
}
