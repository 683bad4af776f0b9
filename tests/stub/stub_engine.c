/*
 * stub_engine.c — a stand-in for the engine (spec.h, data.h, trainer.h) so
 * m6d and m6ctl can be built and tested before daemon/model and daemon/train
 * land. Built only with -Dstub_engine=true; never linked into a release.
 *
 * It keeps the contract's observable behaviour: specs parsed with jansson,
 * unknown keys refused naming the key; llm.c shards; a "trainer" whose losses
 * are a deterministic float function of its state and the data, so resume
 * from a checkpoint reproduces them bitwise; checkpoints written to
 * dir.tmp-<pid>, fsynced, renamed. Env: M6_STUB_STEP_MS (sleep per step,
 * default 10), M6_STUB_SAVE_MS (sleep while a checkpoint is half written).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "train/data.h"
#include "train/spec.h"
#include "train/trainer.h"

/* -------------------------------------------------------------------- spec */

void spec_defaults(run_spec *s)
{
    memset(s, 0, sizeof *s);
    s->model = (model_config){256, 4, 4, 64, 64};
    s->pseudo.share_groups = 1;
    s->pseudo.steps = 100;
    s->train.steps = 200;
    s->train.batch_size = 4;
    s->train.grad_accum = 1;
    s->train.lr = 1e-3f;
    s->train.min_lr = 1e-4f;
    s->train.warmup_steps = 10;
    s->train.weight_decay = 0.1f;
    s->train.grad_clip = 1.0f;
    s->train.beta1 = 0.9f;
    s->train.beta2 = 0.95f;
    s->train.eps = 1e-8f;
    s->train.seed = 1337;
    s->train.eval_batches = 4;
    s->checkpoint.every = 50;
    s->checkpoint.keep = 3;
    s->offload.prefetch = 1;
}

typedef enum { K_INT, K_LONG, K_FLOAT, K_STR, K_U64 } kind_;
typedef struct { const char *key; kind_ kind; size_t off; size_t len; double lo; } field_;

#define F(k, kind, member, lo) {k, kind, offsetof(run_spec, member), sizeof(((run_spec *)0)->member), lo}
static const field_ fields_[] = {
    F("name", K_STR, name, 0),
    F("data.train", K_STR, data.train, 0),
    F("data.val", K_STR, data.val, 0),
    F("model.vocab_size", K_INT, model.vocab_size, 1),
    F("model.n_layer", K_INT, model.n_layer, 1),
    F("model.n_head", K_INT, model.n_head, 1),
    F("model.n_embd", K_INT, model.n_embd, 1),
    F("model.seq_len", K_INT, model.seq_len, 1),
    F("pseudo.share_groups", K_INT, pseudo.share_groups, 1),
    F("pseudo.steps", K_LONG, pseudo.steps, 0),
    F("delink.rewarm_steps", K_LONG, delink.rewarm_steps, 0),
    F("train.steps", K_LONG, train.steps, 1),
    F("train.batch_size", K_INT, train.batch_size, 1),
    F("train.grad_accum", K_INT, train.grad_accum, 1),
    F("train.lr", K_FLOAT, train.lr, 1e-12),
    F("train.min_lr", K_FLOAT, train.min_lr, 0),
    F("train.warmup_steps", K_LONG, train.warmup_steps, 0),
    F("train.weight_decay", K_FLOAT, train.weight_decay, 0),
    F("train.grad_clip", K_FLOAT, train.grad_clip, 0),
    F("train.beta1", K_FLOAT, train.beta1, 0),
    F("train.beta2", K_FLOAT, train.beta2, 0),
    F("train.eps", K_FLOAT, train.eps, 0),
    F("train.seed", K_U64, train.seed, 0),
    F("train.eval_every", K_LONG, train.eval_every, 0),
    F("train.eval_batches", K_INT, train.eval_batches, 1),
    F("checkpoint.every", K_LONG, checkpoint.every, 0),
    F("checkpoint.keep", K_INT, checkpoint.keep, 1),
    F("device.threads", K_INT, device.threads, 0),
    F("offload.prefetch", K_INT, offload.prefetch, 0),
    F("offload.host_threads", K_INT, offload.host_threads, 0),
};
#define N_FIELDS (sizeof fields_ / sizeof fields_[0])

static int set_field_(run_spec *s, const field_ *f, json_t *v, char *err,
                      size_t errlen)
{
    char *p = (char *)s + f->off;
    if (f->kind == K_STR) {
        if (!json_is_string(v)) goto type;
        snprintf(p, f->len, "%s", json_string_value(v));
        return 0;
    }
    if (!json_is_number(v)) goto type;
    double d = json_number_value(v);
    if (d < f->lo) {
        snprintf(err, errlen, "%s: must be >= %g, got %g", f->key, f->lo, d);
        return -1;
    }
    switch (f->kind) {
    case K_INT: *(int *)p = (int)d; break;
    case K_LONG: *(long *)p = (long)d; break;
    case K_FLOAT: *(float *)p = (float)d; break;
    case K_U64: *(uint64_t *)p = (uint64_t)d; break;
    default: break;
    }
    return 0;
type:
    snprintf(err, errlen, "%s: wrong type", f->key);
    return -1;
}

static int walk_(run_spec *s, json_t *obj, const char *prefix, char *err,
                 size_t errlen)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", k);
        if (json_is_object(v)) {
            if (walk_(s, v, key, err, errlen) < 0) return -1;
            continue;
        }
        if (strcmp(key, "delink.optimizer") == 0) {
            const char *o = json_string_value(v);
            if (o && strcmp(o, "copy") == 0) s->delink.optimizer = DELINK_OPT_COPY;
            else if (o && strcmp(o, "reset") == 0) s->delink.optimizer = DELINK_OPT_RESET;
            else { snprintf(err, errlen, "%s: must be \"copy\" or \"reset\"", key); return -1; }
            continue;
        }
        if (strcmp(key, "device.backend") == 0) {
            const char *o = json_string_value(v);
            if (o && strcmp(o, "cpu") == 0) s->device.backend = BACKEND_CPU;
            else { snprintf(err, errlen, "%s: must be \"cpu\"", key); return -1; }
            continue;
        }
        size_t i;
        for (i = 0; i < N_FIELDS; i++)
            if (strcmp(fields_[i].key, key) == 0) break;
        if (i == N_FIELDS) {
            snprintf(err, errlen, "%s: unknown key", key);
            return -1;
        }
        if (set_field_(s, &fields_[i], v, err, errlen) < 0) return -1;
    }
    return 0;
}

int spec_parse(run_spec *s, const char *json, size_t len, char *err,
               size_t errlen)
{
    spec_defaults(s);
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) {
        snprintf(err, errlen, "line %d: %s", je.line, je.text);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "spec must be a JSON object");
    } else if (walk_(s, root, "", err, errlen) == 0) {
        if (!s->data.train[0])
            snprintf(err, errlen, "data.train: required");
        else if (s->model.n_embd % s->model.n_head)
            snprintf(err, errlen, "model.n_head: must divide model.n_embd");
        else if (s->pseudo.steps > s->train.steps)
            snprintf(err, errlen, "pseudo.steps: must be <= train.steps");
        else
            rc = 0;
    }
    json_decref(root);
    return rc;
}

int spec_load_file(run_spec *s, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char e[512];
    if (spec_parse(s, buf, n, e, sizeof e) < 0) {
        snprintf(err, errlen, "%s: %s", path, e);
        return -1;
    }
    return 0;
}

char *spec_to_json(const run_spec *s)
{
    json_t *root = json_object();
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_ *f = &fields_[i];
        const char *p = (const char *)s + f->off;
        json_t *v = NULL;
        switch (f->kind) {
        case K_STR: v = json_string(p); break;
        case K_INT: v = json_integer(*(const int *)p); break;
        case K_LONG: v = json_integer(*(const long *)p); break;
        case K_FLOAT: v = json_real(*(const float *)p); break;
        case K_U64: v = json_integer((json_int_t)*(const uint64_t *)p); break;
        }
        char sect[64];
        const char *dot = strchr(f->key, '.');
        if (!dot) { json_object_set_new(root, f->key, v); continue; }
        snprintf(sect, sizeof sect, "%.*s", (int)(dot - f->key), f->key);
        json_t *o = json_object_get(root, sect);
        if (!o) { o = json_object(); json_object_set_new(root, sect, o); }
        json_object_set_new(o, dot + 1, v);
    }
    char *out = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(root);
    return out;
}

uint64_t spec_hash(const run_spec *s)
{
    char *j = spec_to_json(s);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = j; p && *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    free(j);
    return h;
}

/* -------------------------------------------------------------------- data */

int token_set_open(token_set *ts, const char *pattern, int vocab_size,
                   char *err, size_t errlen)
{
    memset(ts, 0, sizeof *ts);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        snprintf(err, errlen, "%s: no files match", pattern);
        return -1;
    }
    int n = (int)g.gl_pathc;
    ts->tokens = calloc(n, sizeof *ts->tokens);
    ts->n_tokens = calloc(n, sizeof *ts->n_tokens);
    ts->maps = calloc(n, sizeof *ts->maps);
    ts->map_len = calloc(n, sizeof *ts->map_len);
    ts->paths = calloc(n, sizeof *ts->paths);
    for (int i = 0; i < n; i++) {
        const char *path = g.gl_pathv[i];
        int fd = open(path, O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) < 0 || sb.st_size < 1024) {
            snprintf(err, errlen, "%s: cannot open or too short", path);
            if (fd >= 0) close(fd);
            goto fail;
        }
        void *m = mmap(NULL, sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        const int32_t *h = m;
        ts->maps[i] = m;
        ts->map_len[i] = sb.st_size;
        ts->paths[i] = strdup(path);
        ts->n_shards = i + 1;
        if (h[0] != SHARD_MAGIC) {
            snprintf(err, errlen, "%s: bad magic %d (want %d)", path, h[0], SHARD_MAGIC);
            goto fail;
        }
        size_t cnt = (size_t)h[2];
        if (1024 + cnt * 2 > (size_t)sb.st_size) {
            snprintf(err, errlen, "%s: truncated", path);
            goto fail;
        }
        ts->tokens[i] = (const uint16_t *)((const char *)m + 1024);
        ts->n_tokens[i] = cnt;
        for (size_t j = 0; j < cnt; j++)
            if (ts->tokens[i][j] >= vocab_size) {
                snprintf(err, errlen, "%s: token %u at index %zu >= vocab_size %d",
                         path, ts->tokens[i][j], j, vocab_size);
                goto fail;
            }
        ts->total += cnt;
    }
    globfree(&g);
    return 0;
fail:
    globfree(&g);
    token_set_close(ts);
    return -1;
}

void token_set_close(token_set *ts)
{
    for (int i = 0; i < ts->n_shards; i++) {
        if (ts->maps[i]) munmap(ts->maps[i], ts->map_len[i]);
        free(ts->paths[i]);
    }
    free(ts->tokens); free(ts->n_tokens); free(ts->maps); free(ts->map_len);
    free(ts->paths);
    memset(ts, 0, sizeof *ts);
}

uint16_t token_set_at(const token_set *ts, size_t i)
{
    for (int s = 0; s < ts->n_shards; s++) {
        if (i < ts->n_tokens[s]) return ts->tokens[s][i];
        i -= ts->n_tokens[s];
    }
    return 0;
}

void token_set_window(const token_set *ts, size_t pos, int32_t *buf, size_t n)
{
    for (size_t k = 0; k < n; k++) buf[k] = token_set_at(ts, (pos + k) % ts->total);
}

int shard_write(const char *path, const uint16_t *tokens, size_t n, char *err,
                size_t errlen)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { snprintf(err, errlen, "%s: %s", tmp, strerror(errno)); return -1; }
    int32_t h[SHARD_HEADER_INTS] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)n};
    fwrite(h, sizeof h, 1, f);
    fwrite(tokens, 2, n, f);
    fflush(f);
    fsync(fileno(f));
    fclose(f);
    return rename(tmp, path);
}

static int read_file_(const char *path, unsigned char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 65536, n = 0;
    unsigned char *b = malloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    *data = b;
    *len = n;
    return 0;
}

typedef struct { uint16_t *v; size_t n, cap; } tokbuf_;
static void push_(tokbuf_ *t, const unsigned char *d, size_t n)
{
    if (t->n + n > t->cap) {
        while (t->n + n > t->cap) t->cap = t->cap ? t->cap * 2 : 65536;
        t->v = realloc(t->v, t->cap * 2);
    }
    for (size_t i = 0; i < n; i++) t->v[t->n++] = byte_token(d[i]);
}

static int cmp_str_(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_input_(const char *path, tokbuf_ *tr, tokbuf_ *va, double vf,
                       prepare_stats *st,
                       void (*progress)(const char *, size_t, void *), void *ud)
{
    struct stat sb;
    if (stat(path, &sb) < 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return;
        char **names = NULL;
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            names = realloc(names, (n + 1) * sizeof *names);
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str_);
        for (int i = 0; i < n; i++) {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]);
            add_input_(sub, tr, va, vf, st, progress, ud);
            free(names[i]);
        }
        free(names);
        return;
    }
    unsigned char *data;
    size_t len;
    if (read_file_(path, &data, &len) < 0) return;
    size_t probe = len < 8192 ? len : 8192;
    if (memchr(data, 0, probe)) {
        st->skipped++;
        free(data);
        return;
    }
    size_t nv = (size_t)(len * vf);
    push_(tr, data, len - nv);
    push_(va, data + len - nv, nv);
    st->files++;
    if (progress) progress(path, len, ud);
    free(data);
}

static int write_shards_(const char *dir, const char *prefix, tokbuf_ *t,
                         size_t per, size_t *count, char *err, size_t errlen)
{
    for (size_t off = 0, i = 0; off < t->n || i == 0; off += per, i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s_%06zu.bin", dir, prefix, i);
        size_t n = t->n - off < per ? t->n - off : per;
        if (shard_write(path, t->v + off, n, err, errlen) < 0) return -1;
        (*count)++;
        if (n == 0) break;
    }
    return 0;
}

int data_prepare(const char *out_dir, const char *const *inputs, int n_inputs,
                 double val_fraction, size_t shard_tokens, prepare_stats *st,
                 void (*progress)(const char *file, size_t bytes, void *ud),
                 void *ud, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    if (mkdir(out_dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: %s", out_dir, strerror(errno));
        return -1;
    }
    tokbuf_ tr = {0}, va = {0};
    for (int i = 0; i < n_inputs; i++) {
        struct stat sb;
        if (stat(inputs[i], &sb) < 0) {
            snprintf(err, errlen, "%s: %s", inputs[i], strerror(errno));
            free(tr.v); free(va.v);
            return -1;
        }
        add_input_(inputs[i], &tr, &va, val_fraction, st, progress, ud);
    }
    if (shard_tokens == 0) shard_tokens = 100u << 20;
    int rc = 0;
    if (write_shards_(out_dir, "train", &tr, shard_tokens, &st->train_shards, err, errlen) < 0 ||
        write_shards_(out_dir, "val", &va, shard_tokens, &st->val_shards, err, errlen) < 0)
        rc = -1;
    st->train_tokens = tr.n;
    st->val_tokens = va.n;
    free(tr.v); free(va.v);
    return rc;
}

/* ----------------------------------------------------------------- trainer */

#define NW 16
struct trainer {
    run_spec spec;
    token_set train, val;
    long step, delink_step;
    int phase;
    float w[NW];
    uint64_t cursor;
};

static void sleep_ms_(const char *env, long dflt)
{
    const char *e = getenv(env);
    long ms = e ? atol(e) : dflt;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

trainer *trainer_create(const run_spec *spec, char *err, size_t errlen)
{
    trainer *t = calloc(1, sizeof *t);
    t->spec = *spec;
    if (token_set_open(&t->train, spec->data.train, spec->model.vocab_size, err, errlen) < 0) {
        free(t);
        return NULL;
    }
    const char *vg = spec->data.val[0] ? spec->data.val : spec->data.train;
    if (token_set_open(&t->val, vg, spec->model.vocab_size, err, errlen) < 0) {
        token_set_close(&t->train);
        free(t);
        return NULL;
    }
    uint64_t x = spec->train.seed;
    for (int i = 0; i < NW; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t->w[i] = (float)((x >> 40) & 0xffff) / 65536.0f;
    }
    t->phase = spec->pseudo.steps > 0 ? PHASE_PSEUDO : PHASE_REAL;
    t->delink_step = -1;
    return t;
}

void trainer_free(trainer *t)
{
    if (!t) return;
    token_set_close(&t->train);
    token_set_close(&t->val);
    free(t);
}

static float loss_on_(const trainer *t, const token_set *ts, uint64_t pos)
{
    size_t n = (size_t)t->spec.model.seq_len * t->spec.train.batch_size;
    float acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t tok = token_set_at(ts, (pos + i) % ts->total);
        acc += t->w[tok % NW] * (float)(tok & 7) * 0.01f;
    }
    return 5.5f / (1.0f + 0.02f * (float)t->step) + acc / (float)n;
}

float trainer_eval(trainer *t)
{
    float s = 0;
    for (int b = 0; b < t->spec.train.eval_batches; b++)
        s += loss_on_(t, &t->val, (uint64_t)b * 1000);
    return s / (float)t->spec.train.eval_batches;
}

float trainer_probe_loss(trainer *t, int i) { return loss_on_(t, &t->val, (uint64_t)i * 1000); }

int trainer_step(trainer *t, step_result *r, char *err, size_t errlen)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    sleep_ms_("M6_STUB_STEP_MS", 10);
    float loss = loss_on_(t, &t->train, t->cursor);
    size_t n = (size_t)t->spec.model.seq_len * t->spec.train.batch_size;
    float lr = t->spec.train.lr;
    for (int i = 0; i < NW; i++)
        t->w[i] = t->w[i] * (1.0f - lr) + lr * 0.1f * (float)((t->cursor + i) % 5) +
                  (t->phase == PHASE_REAL ? 1e-3f * (float)i : 0.0f);
    t->cursor += n * t->spec.train.grad_accum;
    t->step++;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    r->step = t->step;
    r->phase = t->phase;
    r->train_loss = loss;
    r->lr = lr;
    r->grad_norm = 1.0f / (1.0f + (float)t->step);
    r->step_ms = s * 1e3;
    r->tokens_per_s = s > 0 ? (double)n * t->spec.train.grad_accum / s : 0;
    long ev = t->spec.train.eval_every;
    r->val_loss = ((ev > 0 && t->step % ev == 0) || t->step == t->spec.train.steps)
                      ? trainer_eval(t) : NAN;
    (void)err; (void)errlen;
    return 0;
}

int trainer_delink(trainer *t, char *err, size_t errlen)
{
    if (t->phase == PHASE_REAL) return 0;
    t->phase = PHASE_REAL;
    t->delink_step = t->step;
    return 0;
}

long trainer_step_count(const trainer *t) { return t->step; }
train_phase trainer_phase(const trainer *t) { return t->phase; }
int trainer_n_slots(const trainer *t) { return t->phase == PHASE_REAL ? t->spec.model.n_layer : t->spec.pseudo.share_groups; }
long trainer_delink_step(const trainer *t) { return t->delink_step; }
size_t trainer_param_count(const trainer *t) { return NW; }
double trainer_flops_per_token(const trainer *t) { return 6.0 * NW; }

static int write_all_(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    ssize_t w = write(fd, data, n);
    int rc = (w == (ssize_t)n && fsync(fd) == 0) ? 0 : -1;
    close(fd);
    return rc;
}

long trainer_save(trainer *t, const char *dir, char *err, size_t errlen)
{
    char tmp[4096], path[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    if (mkdir(tmp, 0755) < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.bin", tmp);
    if (write_all_(path, t, sizeof *t) < 0) goto io;
    sleep_ms_("M6_STUB_SAVE_MS", 0);
    char meta[256];
    int n = snprintf(meta, sizeof meta, "{\"step\": %ld, \"phase\": %d, \"spec_hash\": %llu}\n",
                     t->step, t->phase, (unsigned long long)spec_hash(&t->spec));
    snprintf(path, sizeof path, "%s/meta.json", tmp);
    if (write_all_(path, meta, (size_t)n) < 0) goto io;
    if (rename(tmp, dir) < 0) goto io;
    return (long)(sizeof *t + (size_t)n);
io:
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
}

int trainer_load(trainer *t, const char *dir, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    FILE *f = fopen(path, "rb");
    trainer saved;
    if (!f || fread(&saved, sizeof saved, 1, f) != 1) {
        snprintf(err, errlen, "%s: cannot read", path);
        if (f) fclose(f);
        return -1;
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/meta.json", dir);
    if (access(path, R_OK) < 0) {
        snprintf(err, errlen, "%s: missing", path);
        return -1;
    }
    if (spec_hash(&saved.spec) != spec_hash(&t->spec)) {
        snprintf(err, errlen, "%s: spec hash differs", dir);
        return -1;
    }
    memcpy(t->w, saved.w, sizeof t->w);
    t->step = saved.step;
    t->phase = saved.phase;
    t->delink_step = saved.delink_step;
    t->cursor = saved.cursor;
    return 0;
}
