/*
 * trainer.c — one training run: data sampling, the step (microbatches,
 * clipping, AdamW), the LR schedule, evaluation, delink and checkpoints.
 * See trainer.h for the contract and DESIGN.md §1 for the method.
 */
#include "train/trainer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model/gpt.h"
#include "offload/offload.h"
#include "train/checkpoint.h"
#include "train/data.h"

#define CKPT_VERSION 1

struct trainer {
    run_spec spec;
    gpt_model model;
    token_set train, val;
    uint64_t data_rng;     /* state of the training-batch sampler */
    long step;             /* optimizer steps completed */
    long delink_step;      /* step at which delink happened, -1 if none */
    train_phase phase;
    int32_t *inp, *tgt;    /* (B,T) */
    int32_t *window;       /* (T+1) */
    offload_ctx *off;      /* NULL unless device.memory_budget > 0 */
};

static double now_s_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* xorshift64* (Vigna 2016): the data sampler's generator; its whole state is
 * one u64, stored in checkpoints. */
static uint64_t rng_next_(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* ------------------------------------------------------------- create */

static int check_backend_(const run_spec *spec, char *err, size_t errlen)
{
    if (spec->device.backend == BACKEND_CPU)
        return 0;
    /* kernels/cuda/ and gpt_cuda exist but are not driven by the trainer
     * yet: refuse rather than silently train on the CPU. */
    snprintf(err, errlen, "device.backend: 'cuda' runs are not supported by "
             "this m6d yet (use 'cpu')");
    return -1;
}

int trainer_check_spec(const run_spec *spec, char *err, size_t errlen)
{
    if (check_backend_(spec, err, errlen) != 0)
        return -1;
    const char *keys[2] = {"data.train", "data.val"};
    const char *globs[2] = {spec->data.train, spec->data.val};
    char e2[768];
    for (int i = 0; i < 2; i++) {
        token_set ts;
        if (token_set_open(&ts, globs[i], spec->model.vocab_size, e2,
                           sizeof e2) != 0) {
            snprintf(err, errlen, "%s: %s", keys[i], e2);
            return -1;
        }
        size_t total = ts.total;
        token_set_close(&ts);
        if (total < (size_t)spec->model.seq_len + 2) {
            snprintf(err, errlen, "%s: %zu tokens, need more than seq_len+1 "
                     "= %d", keys[i], total, spec->model.seq_len + 1);
            return -1;
        }
    }
    /* the memory plan must fit; pinning failure is only a warning here
     * (the host pool says so again when it allocates) */
    char warn[512];
    if (spec->device.memory_budget > 0 &&
        offload_check(spec, 0, 0, NULL, warn, sizeof warn, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "device.memory_budget: %s", e2);
        return -1;
    }
    return 0;
}

trainer *trainer_create(const run_spec *spec, char *err, size_t errlen)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->spec = *spec;
    t->delink_step = -1;
    if (check_backend_(spec, err, errlen) != 0) {
        free(t);
        return NULL;
    }
    /* OpenMP threads run the kernels; each GEMM block runs single-threaded
     * OpenBLAS inside them (kernels/cpu/matmul.c). */
    if (spec->device.threads > 0)
        omp_set_num_threads(spec->device.threads);
    const model_config *mc = &spec->model;
    int T = mc->seq_len, B = spec->train.batch_size;
    if (token_set_open(&t->train, spec->data.train, mc->vocab_size, err,
                       errlen) != 0)
        goto fail;
    if (token_set_open(&t->val, spec->data.val, mc->vocab_size, err, errlen) != 0)
        goto fail;
    if (t->train.total < (size_t)T + 2 || t->val.total < (size_t)T + 2) {
        snprintf(err, errlen,
                 "data too small: train %zu tokens, val %zu tokens; need > "
                 "seq_len+1 = %d each", t->train.total, t->val.total, T + 1);
        goto fail;
    }
    t->phase = spec->pseudo.steps > 0 ? PHASE_PSEUDO : PHASE_REAL;
    int S = t->phase == PHASE_PSEUDO ? spec->pseudo.share_groups : mc->n_layer;
    if (spec->device.memory_budget > 0 &&
        !(t->off = offload_create(spec, err, errlen)))
        goto fail;
    if (gpt_create_with(&t->model, mc, S, B,
                        t->off ? offload_storage(t->off) : NULL) != 0) {
        if (t->off && offload_last_error(t->off)[0])
            snprintf(err, errlen, "cannot place the model: %s",
                     offload_last_error(t->off));
        else
            snprintf(err, errlen, "cannot allocate the model: %s",
                     strerror(errno));
        goto fail;
    }
    gpt_init_weights(&t->model, spec->train.seed);
    t->data_rng = spec->train.seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
    if (!t->data_rng)
        t->data_rng = 1;
    t->inp = malloc((size_t)B * T * sizeof(int32_t));
    t->tgt = malloc((size_t)B * T * sizeof(int32_t));
    t->window = malloc(((size_t)T + 1) * sizeof(int32_t));
    if (!t->inp || !t->tgt || !t->window) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(trainer *t)
{
    if (!t)
        return;
    gpt_free(&t->model);
    offload_free(t->off);
    token_set_close(&t->train);
    token_set_close(&t->val);
    free(t->inp);
    free(t->tgt);
    free(t->window);
    free(t);
}

/* ------------------------------------------------------------- batches */

/* Row b of the batch = tokens [pos, pos+T] of the set. */
static void fill_row_(trainer *t, const token_set *ts, int b, size_t pos)
{
    int T = t->spec.model.seq_len;
    token_set_window(ts, pos, t->window, (size_t)T + 1);
    memcpy(t->inp + (size_t)b * T, t->window, T * sizeof(int32_t));
    memcpy(t->tgt + (size_t)b * T, t->window + 1, T * sizeof(int32_t));
}

/* Training batch: B windows at uniformly random offsets. */
static void next_train_batch_(trainer *t)
{
    size_t span = t->train.total - (size_t)t->spec.model.seq_len - 1;
    for (int b = 0; b < t->spec.train.batch_size; b++)
        fill_row_(t, &t->train, b, rng_next_(&t->data_rng) % span);
}

/* Validation batch i: fixed, consecutive windows (the same every eval). */
static void val_batch_(trainer *t, int i)
{
    int B = t->spec.train.batch_size, T = t->spec.model.seq_len;
    size_t span = t->val.total - (size_t)T - 1;
    for (int b = 0; b < B; b++)
        fill_row_(t, &t->val, b, ((size_t)i * B + b) * T % span);
}

/* ------------------------------------------------------------- schedule */

/* Learning rate for 0-based step s: linear warmup to lr over warmup_steps,
 * cosine decay to min_lr at train.steps (Loshchilov & Hutter 2017, SGDR
 * without restarts); after delink, optionally scaled by a linear re-warmup
 * over delink.rewarm_steps. */
static float lr_at_(const trainer *t, long s)
{
    const run_spec *sp = &t->spec;
    double lr;
    long W = sp->train.warmup_steps, N = sp->train.steps;
    if (s < W) {
        lr = sp->train.lr * (double)(s + 1) / (double)W;
    } else {
        double p = N > W ? (double)(s - W) / (double)(N - W) : 1.0;
        if (p > 1.0)
            p = 1.0;
        lr = sp->train.min_lr +
             0.5 * (1.0 + cos(M_PI * p)) * (sp->train.lr - sp->train.min_lr);
    }
    long R = sp->delink.rewarm_steps;
    if (t->delink_step >= 0 && R > 0 && s - t->delink_step < R)
        lr *= (double)(s - t->delink_step + 1) / (double)R;
    return (float)lr;
}

/* ------------------------------------------------------------- step */

int trainer_step(trainer *t, step_result *res, char *err, size_t errlen)
{
    const run_spec *sp = &t->spec;
    int B = sp->train.batch_size, T = sp->model.seq_len;
    int accum = sp->train.grad_accum;
    double t0 = now_s_();

    memset(res, 0, sizeof *res);
    res->phase = t->phase;
    float clip = sp->train.grad_clip;
    float lr = lr_at_(t, t->step);
    offload_adam adam = {lr, sp->train.beta1, sp->train.beta2, sp->train.eps,
                         sp->train.weight_decay, 1.0f};
    /* without clipping the scale is 1 and known now: offloaded slots are
     * updated as soon as their gradients are final */
    if (t->off)
        offload_step_begin(t->off, clip > 0 ? NULL : &adam);
    gpt_zero_grad(&t->model);
    double loss_sum = 0;
    for (int k = 0; k < accum; k++) {
        if (t->off)
            offload_microbatch(t->off, k);
        next_train_batch_(t);
        loss_sum += gpt_forward(&t->model, t->inp, t->tgt, B);
        gpt_backward(&t->model, t->inp, t->tgt, B,
                     1.0f / ((float)B * (float)T * (float)accum));
    }
    if (t->off)
        offload_wait_grads(t->off);
    float loss = (float)(loss_sum / accum);
    float norm = gpt_grad_norm(&t->model);
    if (!isfinite(loss) || !isfinite(norm)) {
        snprintf(err, errlen, "step %ld: non-finite %s (loss %g, grad norm %g)",
                 t->step + 1, isfinite(loss) ? "gradient" : "loss", loss, norm);
        return -1;
    }
    float scale = (clip > 0 && norm > clip) ? clip / norm : 1.0f;
    if (t->off) { /* host threads update offloaded slots meanwhile */
        adam.grad_scale = scale;
        offload_adamw(t->off, &adam);
    }
    gpt_adamw(&t->model, lr, sp->train.beta1, sp->train.beta2, sp->train.eps,
              sp->train.weight_decay, scale);
    t->step++;
    double dt = now_s_() - t0;

    res->step = t->step;
    res->train_loss = loss;
    res->lr = lr;
    res->grad_norm = norm;
    res->step_ms = dt * 1e3;
    res->tokens_per_s = (double)B * T * accum / dt;
    res->val_loss = NAN;
    long ev = sp->train.eval_every;
    if ((ev > 0 && t->step % ev == 0) || t->step == sp->train.steps)
        res->val_loss = trainer_eval(t);
    return 0;
}

float trainer_eval(trainer *t)
{
    double sum = 0;
    int n = t->spec.train.eval_batches;
    for (int i = 0; i < n; i++)
        sum += trainer_probe_loss(t, i);
    return (float)(sum / n);
}

float trainer_probe_loss(trainer *t, int batch_index)
{
    val_batch_(t, batch_index);
    return gpt_forward(&t->model, t->inp, t->tgt, t->spec.train.batch_size);
}

/* ------------------------------------------------------------- delink */

int trainer_delink(trainer *t, char *err, size_t errlen)
{
    gpt_model *g = &t->model;
    int L = g->cfg.n_layer;
    if (t->phase == PHASE_REAL)
        return 0;
    if (t->off)
        offload_sync(t->off);
    int *slot_of = malloc((size_t)L * sizeof(int));
    int *src = malloc((size_t)L * sizeof(int));
    if (!slot_of || !src) {
        free(slot_of);
        free(src);
        snprintf(err, errlen, "delink: out of memory");
        return -1;
    }
    for (int l = 0; l < L; l++) {
        slot_of[l] = l;
        src[l] = g->slot_of[l];
    }
    int rc = gpt_reslot(g, L, slot_of, src,
                        t->spec.delink.optimizer == DELINK_OPT_RESET);
    free(slot_of);
    free(src);
    if (rc != 0) {
        snprintf(err, errlen, "delink: cannot allocate %d slots: %s", L,
                 t->off && offload_last_error(t->off)[0]
                     ? offload_last_error(t->off) : strerror(errno));
        return -1;
    }
    t->phase = PHASE_REAL;
    t->delink_step = t->step;
    return 0;
}

/* ------------------------------------------------------------- queries */

long trainer_step_count(const trainer *t) { return t->step; }
train_phase trainer_phase(const trainer *t) { return t->phase; }
int trainer_n_slots(const trainer *t) { return t->model.S; }
long trainer_delink_step(const trainer *t) { return t->delink_step; }
size_t trainer_param_count(const trainer *t)
{
    return gpt_compute_params(&t->model);
}

double trainer_flops_per_token(const trainer *t)
{
    const model_config *c = &t->spec.model;
    return 6.0 * (double)gpt_compute_params(&t->model) +
           6.0 * c->n_layer * (double)c->n_embd * c->seq_len;
}

/* ------------------------------------------------------------- checkpoints */

/* The state buffers a checkpoint holds. */
typedef enum { BUF_PARAMS, BUF_M, BUF_V } state_buf_;

static float *glob_buf_(const gpt_model *g, state_buf_ b)
{
    return b == BUF_PARAMS ? g->params : b == BUF_M ? g->m : g->v;
}

static float *slot_buf_(const gpt_model *g, state_buf_ b, int s)
{
    const gpt_slot_state *st = &g->slots[s];
    return b == BUF_PARAMS ? st->params : b == BUF_M ? st->m : st->v;
}

/* Enumerate every tensor of the model over buffer b (params, m or v; each
 * slot wherever it lives, offloaded slots in host memory) with the given
 * name prefix. Returns the count; names malloc'd into names[]. */
static int collect_tensors_(const gpt_model *g, state_buf_ b,
                            const char *prefix, st_tensor *out, char **names)
{
    int n = 0;
    float *buf = glob_buf_(g, b);
    char nm[160];
    for (int i = 0; i < GLOB_NTENSORS; i++, n++) {
        const gpt_tensor *gt = &g->glob[i];
        snprintf(nm, sizeof nm, "%s%s", prefix, gt->name);
        names[n] = strdup(nm);
        out[n] = (st_tensor){names[n], buf + gt->offset, gt->cols ? 2 : 1,
                             {gt->rows, gt->cols}};
    }
    for (int s = 0; s < g->S; s++) {
        for (int i = 0; i < SLOT_NTENSORS; i++, n++) {
            const gpt_tensor *st = &g->slot[i];
            snprintf(nm, sizeof nm, "%sslots.%d.%s", prefix, s, st->name);
            names[n] = strdup(nm);
            out[n] = (st_tensor){names[n],
                                 slot_buf_(g, b, s) + st->offset,
                                 st->cols ? 2 : 1, {st->rows, st->cols}};
        }
    }
    return n;
}

static long write_tensors_file_(const char *path, const gpt_model *g,
                                const state_buf_ *bufs,
                                const char *const *prefixes,
                                int nbufs, char *err, size_t errlen)
{
    int per = GLOB_NTENSORS + g->S * SLOT_NTENSORS;
    st_tensor *ts = calloc((size_t)per * nbufs, sizeof *ts);
    char **names = calloc((size_t)per * nbufs, sizeof *names);
    long rc = -1;
    if (!ts || !names) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    int n = 0;
    for (int b = 0; b < nbufs; b++)
        n += collect_tensors_(g, bufs[b], prefixes[b], ts + n, names + n);
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto out;
    }
    char e2[256];
    rc = safetensors_write(f, ts, n, e2, sizeof e2);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, e2);
    else if (fsync(fileno(f)) != 0) {
        snprintf(err, errlen, "%s: fsync: %s", path, strerror(errno));
        rc = -1;
    }
    if (fclose(f) != 0 && rc >= 0) {
        snprintf(err, errlen, "%s: close: %s", path, strerror(errno));
        rc = -1;
    }
out:
    if (names)
        for (int i = 0; i < per * nbufs; i++)
            free(names[i]);
    free(names);
    free(ts);
    return rc;
}

static char *meta_json_(const trainer *t)
{
    const gpt_model *g = &t->model;
    json_t *slot_of = json_array(), *adam_t = json_array();
    for (int l = 0; l < g->cfg.n_layer; l++)
        json_array_append_new(slot_of, json_integer(g->slot_of[l]));
    for (int s = 0; s < g->S; s++)
        json_array_append_new(adam_t, json_integer(g->adam_t_slot[s]));
    char rng[32], hash[32];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->data_rng);
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)spec_hash(&t->spec));
    json_t *m = json_pack(
        "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
        "format", "m6-checkpoint", "version", CKPT_VERSION,
        "step", (json_int_t)t->step,
        "phase", t->phase == PHASE_PSEUDO ? "pseudo" : "real",
        "n_slots", g->S, "slot_of", slot_of,
        "delink_step", (json_int_t)t->delink_step,
        "adam_t_global", (json_int_t)g->adam_t_global,
        "adam_t_slot", adam_t,
        "data_rng", rng, "spec_hash", hash);
    char *s = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(m);
    return s;
}

long trainer_save(trainer *t, const char *dir, char *err, size_t errlen)
{
    char tmp[PATH_MAX], path[PATH_MAX + 64];
    struct stat st;
    if (stat(dir, &st) == 0) {
        snprintf(err, errlen, "%s: already exists", dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    if (mkdir(tmp, 0755) != 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    gpt_model *g = &t->model;
    long total = 0, rc;
    if (t->off) /* offloaded slots are read from host memory, settled */
        offload_sync(t->off);
    const state_buf_ pb[] = {BUF_PARAMS};
    const char *pp[] = {""};
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if ((rc = write_tensors_file_(path, g, pb, pp, 1, err, errlen)) < 0)
        return -1;
    total += rc;
    const state_buf_ ob[] = {BUF_M, BUF_V};
    const char *op[] = {"exp_avg.", "exp_avg_sq."};
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if ((rc = write_tensors_file_(path, g, ob, op, 2, err, errlen)) < 0)
        return -1;
    total += rc;
    char *meta = meta_json_(t);
    snprintf(path, sizeof path, "%s/meta.json", tmp);
    rc = meta ? write_file_durable(path, meta, strlen(meta), err, errlen) : -1;
    free(meta);
    if (rc < 0)
        return -1;
    total += rc;
    if (fsync_path(tmp) != 0 || rename(tmp, dir) != 0) {
        snprintf(err, errlen, "%s: commit failed: %s", dir, strerror(errno));
        return -1;
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        fsync_path(parent);
    } else if (!slash) {
        fsync_path(".");
    }
    return total;
}

static int load_tensors_(const char *path, gpt_model *g, const state_buf_ *bufs,
                         const char *const *prefixes, int nbufs, char *err,
                         size_t errlen)
{
    st_file sf;
    if (safetensors_open(&sf, path, err, errlen) != 0)
        return -1;
    int per = GLOB_NTENSORS + g->S * SLOT_NTENSORS, rc = 0;
    st_tensor *ts = calloc((size_t)per, sizeof *ts);
    char **names = calloc((size_t)per, sizeof *names);
    char e2[256];
    for (int b = 0; b < nbufs && rc == 0; b++) {
        int n = collect_tensors_(g, bufs[b], prefixes[b], ts, names);
        for (int i = 0; i < n; i++) {
            size_t numel = (size_t)ts[i].shape[0] *
                           (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
            if (rc == 0 && safetensors_get(&sf, ts[i].name, (float *)ts[i].data,
                                           numel, e2, sizeof e2) != 0) {
                snprintf(err, errlen, "%s: %s", path, e2);
                rc = -1;
            }
            free(names[i]);
        }
    }
    free(names);
    free(ts);
    safetensors_close(&sf);
    return rc;
}

int trainer_load(trainer *t, const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    json_error_t je;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    json_t *m = json_load_file(path, 0, &je);
    if (!m) {
        snprintf(err, errlen, "%s: %s (line %d)", path, je.text, je.line);
        return -1;
    }
    gpt_model *g = &t->model;
    int L = g->cfg.n_layer, version = 0, n_slots = 0, rc = -1;
    if (t->off)
        offload_sync(t->off);
    json_int_t step, delink_step, adam_t_global;
    const char *phase, *rng, *hash, *format;
    json_t *slot_of, *adam_t;
    if (json_unpack_ex(m, &je, 0,
            "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
            "format", &format, "version", &version, "step", &step,
            "phase", &phase, "n_slots", &n_slots, "slot_of", &slot_of,
            "delink_step", &delink_step, "adam_t_global", &adam_t_global,
            "adam_t_slot", &adam_t, "data_rng", &rng, "spec_hash", &hash) != 0) {
        snprintf(err, errlen, "%s: %s", path, je.text);
        goto out;
    }
    if (strcmp(format, "m6-checkpoint") != 0 || version != CKPT_VERSION) {
        snprintf(err, errlen, "%s: not an m6 checkpoint of version %d", path,
                 CKPT_VERSION);
        goto out;
    }
    char want[32];
    snprintf(want, sizeof want, "%016llx",
             (unsigned long long)spec_hash(&t->spec));
    if (strcmp(hash, want) != 0) {
        snprintf(err, errlen, "%s: spec hash %s does not match this run's %s",
                 path, hash, want);
        goto out;
    }
    if (n_slots < 1 || n_slots > L || json_array_size(slot_of) != (size_t)L ||
        json_array_size(adam_t) != (size_t)n_slots) {
        snprintf(err, errlen, "%s: bad share map", path);
        goto out;
    }
    int *map = malloc((size_t)L * sizeof(int)), *src = calloc((size_t)n_slots, sizeof(int));
    for (int l = 0; l < L; l++) {
        map[l] = (int)json_integer_value(json_array_get(slot_of, l));
        if (map[l] < 0 || map[l] >= n_slots) {
            snprintf(err, errlen, "%s: slot_of[%d] out of range", path, l);
            free(map);
            free(src);
            goto out;
        }
    }
    /* Re-lay to the checkpoint's slot count; values are overwritten below. */
    int ok = gpt_reslot(g, n_slots, map, src, 1) == 0;
    free(map);
    free(src);
    if (!ok) {
        snprintf(err, errlen, "out of memory loading %s", dir);
        goto out;
    }
    const state_buf_ pb[] = {BUF_PARAMS};
    const char *pp[] = {""};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (load_tensors_(path, g, pb, pp, 1, err, errlen) != 0)
        goto out;
    const state_buf_ ob[] = {BUF_M, BUF_V};
    const char *op[] = {"exp_avg.", "exp_avg_sq."};
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (load_tensors_(path, g, ob, op, 2, err, errlen) != 0)
        goto out;
    for (int s = 0; s < n_slots; s++)
        g->adam_t_slot[s] = (long)json_integer_value(json_array_get(adam_t, s));
    g->adam_t_global = (long)adam_t_global;
    t->step = (long)step;
    t->delink_step = (long)delink_step;
    t->phase = strcmp(phase, "pseudo") == 0 ? PHASE_PSEUDO : PHASE_REAL;
    t->data_rng = strtoull(rng, NULL, 16);
    rc = 0;
out:
    json_decref(m);
    return rc;
}

/* ------------------------------------------------------------- state access */

size_t trainer_copy_state(trainer *t, int which, float *dst)
{
    const gpt_model *g = &t->model;
    if (!dst)
        return g->n_params;
    if (t->off)
        offload_sync(t->off);
    state_buf_ b = which == 0 ? BUF_PARAMS : which == 1 ? BUF_M : BUF_V;
    memcpy(dst, glob_buf_(g, b), g->n_global * sizeof(float));
    for (int s = 0; s < g->S; s++)
        memcpy(dst + g->n_global + (size_t)s * g->slot_size, slot_buf_(g, b, s),
               g->slot_size * sizeof(float));
    return g->n_params;
}

int trainer_copy_adam_steps(trainer *t, long *dst)
{
    const gpt_model *g = &t->model;
    if (t->off)
        offload_sync(t->off);
    dst[0] = g->adam_t_global;
    memcpy(dst + 1, g->adam_t_slot, (size_t)g->S * sizeof(long));
    return g->S + 1;
}

int trainer_offload_stats(trainer *t, offload_stats *st)
{
    if (!t->off) {
        memset(st, 0, sizeof *st);
        st->n_slots = st->n_resident = t->model.S;
        return -1;
    }
    offload_get_stats(t->off, st);
    return 0;
}
