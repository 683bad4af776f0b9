/*
 * trainer_ckpt.c — the trainer's checkpoints: the tensors of the model and
 * its AdamW moments in the plain layout of gpt.h, meta.json, save (a
 * temporary directory renamed into place) and load (shapes, spec hash and
 * share map checked), the init.from weights, and the state copies of
 * trainer.h (trainer_copy_state, trainer_copy_adam_steps). The format is
 * the same on every backend.
 */
#include "train/trainer_internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/init_from.h"
#include "common/crashpoint.h"
#include "common/durable.h"
#include "common/log.h"

#define CKPT_VERSION 1

/* ------------------------------------------------------------- checkpoints */

/* Checkpoint files are written from, and read into, the backend's state
 * regions (backend.h: between state_begin and state_end), tensor by tensor
 * in the plain layout of gpt.h: the same files on every backend. */
/* Each slot's kind (1 MoE) under the backend's share map into kinds[S]
 * (malloc'd); NULL when out of memory. */
unsigned char *trainer_slot_kinds_(const trainer *t)
{
    int S = n_slots_(t);
    unsigned char *k = malloc((size_t)S);
    if (k && gpt_slot_kinds(&t->spec.model, S,
                            t->be.iface->slot_of(t->be.ctx), k, NULL, 0) != 0)
        memset(k, t->spec.model.moe_experts > 0, (size_t)S);
    return k;
}

/* Tensors per buffer in a checkpoint of t's current layout
 * (gpt_slot_ckpt_tensors per slot); -1 when out of memory. */
static int ckpt_count_(const trainer *t)
{
    unsigned char *k = trainer_slot_kinds_(t);
    if (!k)
        return -1;
    int n = GLOB_NTENSORS, per[2];
    for (int kd = 0; kd < 2; kd++)
        per[kd] = gpt_slot_ckpt_tensors(&t->spec.model, kd, NULL);
    for (int s = 0; s < n_slots_(t); s++)
        n += per[k[s]];
    free(k);
    return n;
}

/* Adafactor's second moment (gpt_af_tensors) of one region as checkpoint
 * tensors, appended at out: a matrix's row means as exp_avg_sq_row.<name>
 * (rows) and column means as exp_avg_sq_col.<name> (cols), a vector's as
 * exp_avg_sq.<name> (rows), name the tensor's (names[i] its checkpoint
 * name, without "slots.<s>." for a slot: prefixed here). Returns the
 * count appended, or -1 out of memory. */
static int collect_af_region_(const trainer *t, int s, int kind, float *v,
                              const char *const *names, st_tensor *out,
                              char **onames)
{
    int na = gpt_af_tensors(&t->spec.model, s < 0 ? -1 : kind, NULL, NULL);
    gpt_af_tensor *af = na < 0 ? NULL : malloc((size_t)na * sizeof *af);
    if (!af)
        return -1;
    gpt_af_tensors(&t->spec.model, s < 0 ? -1 : kind, af, NULL);
    char nm[200], slot[32] = "";
    if (s >= 0)
        snprintf(slot, sizeof slot, "slots.%d.", s);
    int n = 0;
    for (int i = 0; i < na; i++) {
        const char *pre[2] = {af[i].cols ? "exp_avg_sq_row." : "exp_avg_sq.",
                              "exp_avg_sq_col."};
        int dim[2] = {af[i].rows, af[i].cols};
        size_t off[2] = {af[i].state_off, af[i].state_off + af[i].rows};
        for (int k = 0; k < (af[i].cols ? 2 : 1); k++, n++) {
            snprintf(nm, sizeof nm, "%s%s%s", pre[k], slot, names[i]);
            onames[n] = strdup(nm);
            out[n] = (st_tensor){onames[n], v + off[k], 1, {dim[k], 0}};
        }
    }
    free(af);
    return n;
}

/* Enumerate every tensor of the model over buffer b (params, m or v) with
 * the given name prefix: the globals, then each slot's checkpoint tensors
 * (gpt_slot_ckpt_tensors: per expert and per prototype gate in an MoE
 * slot). Returns the count (-1 out of memory); names malloc'd into names[]. */
static int collect_tensors_(const trainer *t, backend_buf b,
                            const char *prefix, st_tensor *out, char **names)
{
    const backend_iface *be = t->be.iface;
    int n = 0, S = n_slots_(t);
    float *buf = be->state_region(t->be.ctx, b, -1);
    char nm[160];
    gpt_ckpt_tensor *tab[2] = {NULL, NULL};
    int nt[2];
    unsigned char *kind = trainer_slot_kinds_(t);
    for (int kd = 0; kd < 2; kd++) {
        nt[kd] = gpt_slot_ckpt_tensors(&t->spec.model, kd, NULL);
        tab[kd] = malloc((size_t)nt[kd] * sizeof *tab[kd]);
        if (tab[kd])
            gpt_slot_ckpt_tensors(&t->spec.model, kd, tab[kd]);
    }
    if (!kind || !tab[0] || !tab[1]) {
        free(kind);
        free(tab[0]);
        free(tab[1]);
        return -1;
    }
    if (b == BACKEND_V && t->spec.optimizer.name == OPTIMIZER_ADAFACTOR) {
        /* Adafactor's second moment: its own tensors, 1 or 2 per tensor */
        const char *gn[GLOB_NTENSORS];
        for (int i = 0; i < GLOB_NTENSORS; i++)
            gn[i] = t->glob[i].name;
        n = collect_af_region_(t, -1, 0, buf, gn, out, names);
        for (int s = 0; s < S && n >= 0; s++) {
            const char **sn = malloc((size_t)nt[kind[s]] * sizeof *sn);
            int k = -1;
            if (sn) {
                for (int i = 0; i < nt[kind[s]]; i++)
                    sn[i] = tab[kind[s]][i].name;
                k = collect_af_region_(t, s, kind[s],
                                       be->state_region(t->be.ctx, b, s), sn,
                                       out + n, names + n);
            }
            free(sn);
            n = k < 0 ? -1 : n + k;
        }
        free(kind);
        free(tab[0]);
        free(tab[1]);
        return n;
    }
    for (int i = 0; i < GLOB_NTENSORS; i++, n++) {
        const gpt_tensor *gt = &t->glob[i];
        gpt_tensor_name(nm, sizeof nm, prefix, -1, gt);
        names[n] = strdup(nm);
        out[n] = (st_tensor){names[n], buf + gt->offset, gt->cols ? 2 : 1,
                             {gt->rows, gt->cols}};
    }
    for (int s = 0; s < S; s++) {
        float *sbuf = be->state_region(t->be.ctx, b, s);
        const gpt_ckpt_tensor *ct = tab[kind[s]];
        for (int i = 0; i < nt[kind[s]]; i++, n++) {
            snprintf(nm, sizeof nm, "%sslots.%d.%s", prefix, s, ct[i].name);
            names[n] = strdup(nm);
            out[n] = (st_tensor){names[n], sbuf + ct[i].offset,
                                 ct[i].cols ? 2 : 1,
                                 {ct[i].rows, ct[i].cols}};
        }
    }
    free(kind);
    free(tab[0]);
    free(tab[1]);
    return n;
}

/* Whether buffer b is stored as BF16: the master weights of a run with
 * optimizer.master bf16 (the optimizer state is fp32 either way). */
static int buf_bf16_(const trainer *t, backend_buf b)
{
    return b == BACKEND_PARAMS && t->spec.optimizer.master == MASTER_BF16;
}

static long write_tensors_file_(const char *path, const trainer *t,
                                const backend_buf *bufs,
                                const char *const *prefixes,
                                int nbufs, m6_err *err)
{
    /* Adafactor's second moment: up to 2 tensors (row and column) each */
    int per = ckpt_count_(t);
    per = per < 0 ? -1 : 2 * per;
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per * nbufs, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per * nbufs, sizeof *names);
    unsigned char *bf16 = NULL; /* [n] tensor i stored as BF16 */
    long rc = -1;
    if (!ts || !names) {
        per = 0;
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    int n = 0;
    bf16 = calloc((size_t)per * nbufs + 1, 1);
    if (!bf16) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    for (int b = 0; b < nbufs; b++) {
        int nb = collect_tensors_(t, bufs[b], prefixes[b], ts + n, names + n);
        if (nb < 0) {
            m6_err_set(err, M6_EINTERNAL, "out of memory");
            goto out;
        }
        memset(bf16 + n, buf_bf16_(t, bufs[b]), (size_t)nb);
        n += nb;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, strerror(errno));
        goto out;
    }
    char e2[256];  /* safetensors_write's own words: no path */
    rc = safetensors_write_dtypes(f, ts, bf16, n, e2, sizeof e2);
    if (rc < 0)
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, e2);
    else if (fsync(fileno(f)) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: fsync: %s", path, strerror(errno));
        rc = -1;
    }
    if (fclose(f) != 0 && rc >= 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: close: %s", path, strerror(errno));
        rc = -1;
    }
out:
    if (names)
        for (int i = 0; i < per * nbufs; i++)
            free(names[i]);
    free(names);
    free(ts);
    free(bf16);
    return rc;
}

/* The spec hash a checkpoint carries (form 0): the spec's, with
 * device.backend taken as 'cpu', so checkpoints move between backends,
 * optimizer.shard as false and nodes.expert_parallel as 1 (the state is
 * saved whole, and resumes sharded or not, at any P), the nodes.* layout
 * (world_size, pseudo_world_size, timeout) as the defaults, since a
 * checkpoint resumes at any world that splits the batch, and where the
 * state lives as the defaults too (device.memory_budget, offload.*: a
 * checkpoint holds every slot's state whole, offloaded or not, and
 * resumes under any budget the planner accepts). The hashes checkpoints
 * carried before, still accepted: form 1 with device.memory_budget and
 * offload.* in it, form 2 with the nodes.* layout in it too. */
static uint64_t ckpt_hash_(const run_spec *spec, int form)
{
    run_spec s = *spec, d;
    spec_defaults(&d);
    s.device.backend = BACKEND_CPU;
    s.optimizer.shard = 0;  /* changes no float: saved whole */
    s.nodes.expert_parallel = 1;  /* the same: every expert saved */
    if (form < 2)
        s.nodes = d.nodes;
    if (form < 1) {
        s.device.memory_budget = d.device.memory_budget;
        s.offload = d.offload;
    }
    return spec_hash(&s);
}

static char *meta_json_(const trainer *t)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    const int *map = be->slot_of(t->be.ctx);
    long *steps = malloc(((size_t)S + 1) * sizeof(long));
    if (!steps)
        return NULL;
    be->get_adam_steps(t->be.ctx, steps);
    json_t *slot_of = json_array(), *adam_t = json_array();
    for (int l = 0; l < t->spec.model.n_layer; l++)
        json_array_append_new(slot_of, json_integer(map[l]));
    for (int s = 0; s < S; s++)
        json_array_append_new(adam_t, json_integer(steps[s + 1]));
    char rng[32], hash[32];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->data_rng);
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)ckpt_hash_(&t->spec, 0));
    json_t *m = json_pack(
        "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
        "format", "m6-checkpoint", "version", CKPT_VERSION,
        "step", (json_int_t)t->step,
        "phase", phase_name(t->phase),
        "n_slots", S, "slot_of", slot_of,
        "delink_step", (json_int_t)t->delink_step,
        "adam_t_global", (json_int_t)steps[0],
        "adam_t_slot", adam_t,
        "data_rng", rng, "spec_hash", hash);
    /* the optimizer whose state optimizer.safetensors holds (a
     * checkpoint without it is AdamW's) */
    json_object_set_new(m, "optimizer", json_string(
                            spec_optimizer_name(t->spec.optimizer.name)));
    /* the master weights' dtype, only when bf16 (a checkpoint without it
     * holds fp32 ones) */
    if (t->spec.optimizer.master != MASTER_FP32)
        json_object_set_new(m, "master", json_string(
                                spec_master_name(t->spec.optimizer.master)));
    /* the token counts the batches were drawn from (0: split not open) */
    json_object_set_new(m, "train_tokens", json_integer((json_int_t)t->data_total[0]));
    json_object_set_new(m, "val_tokens", json_integer((json_int_t)t->data_total[1]));
    /* the data-parallel world that wrote it (only when > 1: a one-node
     * checkpoint is what it was). The state is replicated and the sampler
     * is the one-node sampler, so it loads at any world size that splits
     * the batch. */
    if (t->world > 1)
        json_object_set_new(m, "world_size", json_integer(t->world));
    /* non-finite steps skipped: in a row up to now, and all */
    json_object_set_new(m, "bad_steps", json_integer((json_int_t)t->bad_steps));
    json_object_set_new(m, "skipped_steps",
                        json_integer((json_int_t)t->skipped_steps));
    free(steps);
    char *s = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(m);
    return s;
}

/* The buffers of optimizer.safetensors and their name prefixes: AdamW's
 * m and v (exp_avg., exp_avg_sq.); Adafactor's second moment (its own
 * names, collect_af_region_) and, with a first moment, m (exp_avg.).
 * Returns their count. */
static int optim_bufs_(const trainer *t, const backend_buf **bufs,
                       const char *const **prefixes)
{
    static const backend_buf adam_b[] = {BACKEND_M, BACKEND_V};
    static const char *const adam_p[] = {"exp_avg.", "exp_avg_sq."};
    static const backend_buf af_b[] = {BACKEND_V, BACKEND_M};
    static const char *const af_p[] = {"", "exp_avg."};
    if (t->spec.optimizer.name != OPTIMIZER_ADAFACTOR) {
        *bufs = adam_b;
        *prefixes = adam_p;
        return 2;
    }
    *bufs = af_b;
    *prefixes = af_p;
    return spec_has_first_moment(&t->spec) ? 2 : 1;
}

/* model.safetensors and optimizer.safetensors into dir: bytes or -1. */
static long write_state_files_(trainer *t, const char *dir, m6_err *err)
{
    char path[PATH_MAX + 64];
    const backend_iface *be = t->be.iface;
    long total = 0, rc;
    /* e.g. offloaded slots settled in host memory, or a GPU's state
     * copied to the host */
    if (be->state_begin(t->be.ctx, 0) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "out of memory reading the %s model's state",
                   be->name);
        return -1;
    }
    const backend_buf pb[] = {BACKEND_PARAMS};
    const char *pp[] = {""};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = write_tensors_file_(path, t, pb, pp, 1, err)) < 0)
        goto out;
    total += rc;
    const backend_buf *ob;
    const char *const *op;
    int nob = optim_bufs_(t, &ob, &op);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if ((rc = write_tensors_file_(path, t, ob, op, nob, err)) < 0)
        goto out;
    total += rc;
out:
    be->state_end(t->be.ctx, 0);
    return rc < 0 ? -1 : total;
}

long trainer_save(trainer *t, const char *dir, m6_err *err)
{
    char tmp[PATH_MAX], path[PATH_MAX + 64];
    struct stat st;
    if (!trainer_ep_whole_(t)) {
        m6_err_set(err, M6_EINVALID, "%s: nodes.expert_parallel %d: this "
                   "rank holds only its experts; every rank calls "
                   "trainer_sync_boundary (rank 0 wanting the state whole) "
                   "before rank 0 saves", dir, t->spec.nodes.expert_parallel);
        return -1;
    }
    if (t->sharded) {
        m6_err_set(err, M6_EINVALID, "%s: the optimizer state is sharded "
                   "(optimizer.shard); every rank calls trainer_gather_optim "
                   "before one saves", dir);
        return -1;
    }
    if (stat(dir, &st) == 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: already exists", dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    remove_temp_dir(tmp);  /* ours, left by an earlier failed save */
    if (mkdir(tmp, 0755) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    long total, rc;
    if ((total = write_state_files_(t, tmp, err)) < 0)
        goto fail;
    crashpoint("ckpt");
    char *meta = meta_json_(t);
    snprintf(path, sizeof path, "%s/meta.json", tmp);
    if (!meta)
        m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
    char e4[PATH_MAX + 512];  /* one path (at most PATH_MAX) and a cause */
    rc = meta ? write_file_durable(path, meta, strlen(meta), e4, sizeof e4)
              : -1;
    if (meta && rc < 0)
        m6_err_set(err, M6_EINTERNAL, "%s", e4);
    free(meta);
    if (rc < 0)
        goto fail;
    total += rc;
    if (fsync_path(tmp) != 0 || rename(tmp, dir) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: commit failed: %s", dir, strerror(errno));
        goto fail;
    }
    /* the checkpoint is complete once renamed; a failed fsync of its
     * parent only risks the name on a crash, as before */
    char e3[64];
    fsync_parent_dir(dir, e3, sizeof e3);
    return total;
fail:
    remove_temp_dir(tmp);  /* err already names the file and the cause */
    return -1;
}

static int load_tensors_(const char *path, trainer *t, const backend_buf *bufs,
                         const char *const *prefixes, int nbufs, m6_err *err)
{
    st_file sf;
    char e1[PATH_MAX + 512];  /* one path (at most PATH_MAX) and a cause */
    if (safetensors_open(&sf, path, e1, sizeof e1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s", e1);
        return -1;
    }
    int per = ckpt_count_(t), rc = 0;
    per = per < 0 ? -1 : 2 * per;  /* as write_tensors_file_ */
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per, sizeof *names);
    char e2[256];  /* safetensors_get's words: a tensor name, no path */
    if (!ts || !names) {
        m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
        rc = -1;
    }
    for (int b = 0; b < nbufs && rc == 0; b++) {
        int n = collect_tensors_(t, bufs[b], prefixes[b], ts, names);
        if (n < 0) {
            m6_err_set(err, M6_EINTERNAL, "%s: out of memory", path);
            rc = -1;
        }
        for (int i = 0; i < n; i++) {
            size_t numel = (size_t)ts[i].shape[0] *
                           (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
            /* each tensor in the dtype this run keeps it in (the master
             * weights' per meta.json, checked before): another is refused */
            char dt[16];
            int nd;
            long sh[4];
            const char *want = buf_bf16_(t, bufs[b]) ? "BF16" : "F32";
            if (rc == 0 &&
                safetensors_info(&sf, ts[i].name, dt, &nd, sh, e2,
                                 sizeof e2) == 0 && strcmp(dt, want) != 0) {
                m6_err_set(err, M6_EINTERNAL, "%s: tensor %s is %s, this "
                           "run keeps it in %s", path, ts[i].name, dt, want);
                rc = -1;
            }
            if (rc == 0 && safetensors_get(&sf, ts[i].name, (float *)ts[i].data,
                                           numel, e2, sizeof e2) != 0) {
                m6_err_set(err, M6_EINTERNAL, "%s: %s", path, e2);
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

/* meta.json's string at key, or def where it is absent (a checkpoint
 * written before the key existed) */
static const char *meta_str_(json_t *m, const char *key, const char *def)
{
    json_t *j = json_object_get(m, key);
    return json_is_string(j) ? json_string_value(j) : def;
}

/* The refusal of a checkpoint at path that holds `held` (its optimizer's
 * state, its master weights) where this run's spec key says mine. */
static void refuse_other_(m6_err *err, const char *path, const char *held,
                          const char *key, const char *mine,
                          const char *what)
{
    m6_err_set(err, M6_EINTERNAL,
               "%s: the checkpoint holds %s and this run uses %s \"%s\": "
               "resuming with %s is refused (a new run with init.from takes "
               "its weights with a fresh optimizer)", path, held, key, mine,
               what);
}

int trainer_load(trainer *t, const char *dir, m6_err *err)
{
    char path[PATH_MAX];
    json_error_t je;
    if (t->ep) {
        m6_err_set(err, M6_EINVALID, "%s: nodes.expert_parallel %d: this "
                   "rank holds only its experts; load before "
                   "trainer_set_collectives", dir,
                   t->spec.nodes.expert_parallel);
        return -1;
    }
    snprintf(path, sizeof path, "%s/meta.json", dir);
    json_t *m = json_load_file(path, 0, &je);
    if (!m) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: %s (line %d)", path, je.text, je.line);
        return -1;
    }
    const backend_iface *be = t->be.iface;
    int L = t->spec.model.n_layer, version = 0, n_slots = 0, rc = -1;
    if (t->sharded) {
        json_decref(m);
        m6_err_set(err, M6_EINVALID, "%s: the optimizer state is sharded "
                   "(optimizer.shard); load before trainer_set_collectives",
                   dir);
        return -1;
    }
    long *steps = NULL;
    json_int_t step, delink_step, adam_t_global;
    const char *phase, *rng, *hash, *format;
    json_t *slot_of, *adam_t;
    if (json_unpack_ex(m, &je, 0,
            "{s:s, s:i, s:I, s:s, s:i, s:o, s:I, s:I, s:o, s:s, s:s}",
            "format", &format, "version", &version, "step", &step,
            "phase", &phase, "n_slots", &n_slots, "slot_of", &slot_of,
            "delink_step", &delink_step, "adam_t_global", &adam_t_global,
            "adam_t_slot", &adam_t, "data_rng", &rng, "spec_hash", &hash) != 0) {
        m6_err_set(err, M6_EINTERNAL, "%s: %s", path, je.text);
        goto out;
    }
    if (strcmp(format, "m6-checkpoint") != 0 || version != CKPT_VERSION) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: not an m6 checkpoint of version %d", path,
                   CKPT_VERSION);
        goto out;
    }
    /* another optimizer's state is refused by name before the hash (which
     * differs too): its tensors are not this optimizer's; so are master
     * weights of another dtype: bf16 ones are not the fp32 ones of the
     * run that wrote them, nor fp32 ones bf16 values */
    const char *opt = meta_str_(m, "optimizer", "adamw");
    const char *mine = spec_optimizer_name(t->spec.optimizer.name);
    char held[64];
    snprintf(held, sizeof held, "optimizer \"%s\" state", opt);
    if (strcmp(opt, mine) != 0) {
        refuse_other_(err, path, held, "optimizer.name", mine,
                      "another optimizer");
        goto out;
    }
    const char *master = meta_str_(m, "master", "fp32");
    const char *my_master = spec_master_name(t->spec.optimizer.master);
    snprintf(held, sizeof held, "%s master weights", master);
    if (strcmp(master, my_master) != 0) {
        refuse_other_(err, path, held, "optimizer.master", my_master,
                      "other master weights");
        goto out;
    }
    char want[32];
    snprintf(want, sizeof want, "%016llx",
             (unsigned long long)ckpt_hash_(&t->spec, 0));
    char was[2][32];  /* checkpoints from before (ckpt_hash_'s forms) */
    for (int f = 0; f < 2; f++)
        snprintf(was[f], sizeof was[f], "%016llx",
                 (unsigned long long)ckpt_hash_(&t->spec, f + 1));
    if (strcmp(hash, want) != 0 && strcmp(hash, was[0]) != 0 &&
        strcmp(hash, was[1]) != 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "%s: spec hash %s does not match this run's %s",
                   path, hash, want);
        goto out;
    }
    if (n_slots < 1 || n_slots > L || json_array_size(slot_of) != (size_t)L ||
        json_array_size(adam_t) != (size_t)n_slots) {
        m6_err_set(err, M6_EINTERNAL, "%s: bad share map", path);
        goto out;
    }
    int *map = malloc((size_t)L * sizeof(int)), *src = calloc((size_t)n_slots, sizeof(int));
    if (!map || !src) {
        m6_err_set(err, M6_EINTERNAL, "out of memory loading %s", dir);
        free(map);
        free(src);
        goto out;
    }
    for (int l = 0; l < L; l++) {
        map[l] = (int)json_integer_value(json_array_get(slot_of, l));
        if (map[l] < 0 || map[l] >= n_slots) {
            m6_err_set(err, M6_EINTERNAL,
                       "%s: slot_of[%d] out of range", path, l);
            free(map);
            free(src);
            goto out;
        }
    }
    /* each new slot copies an old slot of its own kind (values are
     * overwritten below); a map that mixes kinds in a slot is refused */
    {
        int oS = n_slots_(t);
        unsigned char *nk = malloc((size_t)n_slots), *ok_ = malloc((size_t)oS);
        char e3[256] = "out of memory";
        int bad = !nk || !ok_ ||
                  gpt_slot_kinds(&t->spec.model, n_slots, map, nk, e3,
                                 sizeof e3) != 0 ||
                  gpt_slot_kinds(&t->spec.model, oS, be->slot_of(t->be.ctx),
                                 ok_, e3, sizeof e3) != 0;
        for (int s = 0; !bad && s < n_slots; s++) {
            src[s] = -1;
            for (int o = 0; o < oS && src[s] < 0; o++)
                if (ok_[o] == nk[s])
                    src[s] = o;
            if (src[s] < 0) {
                snprintf(e3, sizeof e3, "no slot of the kind of slot %d", s);
                bad = 1;
            }
        }
        free(nk);
        free(ok_);
        if (bad) {
            m6_err_set(err, M6_EINTERNAL, "%s: bad share map: %s", path, e3);
            free(map);
            free(src);
            goto out;
        }
    }
    /* Re-lay to the checkpoint's slot count; values are overwritten below. */
    char e2[512];
    int ok = be->reslot(t->be.ctx, n_slots, map, src, 1, e2, sizeof e2) == 0;
    free(map);
    free(src);
    if (!ok) {
        m6_err_set(err, M6_EINTERNAL, "loading %s: %s", dir, e2);
        goto out;
    }
    steps = malloc(((size_t)n_slots + 1) * sizeof(long));
    if (!steps || be->state_begin(t->be.ctx, 1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory loading %s", dir);
        goto out;
    }
    const backend_buf pb[] = {BACKEND_PARAMS};
    const char *pp[] = {""};
    const backend_buf *ob;
    const char *const *op;
    int nob = optim_bufs_(t, &ob, &op);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int lrc = load_tensors_(path, t, pb, pp, 1, err);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (lrc == 0)
        lrc = load_tensors_(path, t, ob, op, nob, err);
    if (be->state_end(t->be.ctx, lrc == 0) != 0 && lrc == 0) {
        m6_err_set(err, M6_EINTERNAL,
                   "loading %s: cannot store the state in the %s "
                   "model", dir, be->name);
        lrc = -1;
    }
    if (lrc != 0)
        goto out;
    steps[0] = (long)adam_t_global;
    for (int s = 0; s < n_slots; s++)
        steps[s + 1] = (long)json_integer_value(json_array_get(adam_t, s));
    be->set_adam_steps(t->be.ctx, steps);
    t->step = (long)step;
    t->delink_step = (long)delink_step;
    t->phase = phase_parse(phase) == PHASE_PSEUDO ? PHASE_PSEUDO : PHASE_REAL;
    t->data_rng = strtoull(rng, NULL, 16);
    /* what the data must hold for the same batches (trainer_check_data);
     * checkpoints before they were recorded, or with a split not open
     * (0), leave the counts of this trainer's open */
    for (int k = 0; k < 2; k++) {
        json_t *n = json_object_get(m, k ? "val_tokens" : "train_tokens");
        if (json_is_integer(n) && json_integer_value(n) > 0)
            t->data_total[k] = (size_t)json_integer_value(n);
    }
    /* checkpoints from before skipped steps were counted: none */
    json_t *bad = json_object_get(m, "bad_steps");
    json_t *skipped = json_object_get(m, "skipped_steps");
    t->bad_steps = json_is_integer(bad) ? (long)json_integer_value(bad) : 0;
    t->skipped_steps = json_is_integer(skipped)
                           ? (long)json_integer_value(skipped) : 0;
    rc = 0;
out:
    free(steps);
    json_decref(m);
    return rc;
}

/* init.from (ckpt/init_from.h): the weights of the spec's directory into
 * the new model, checked first; the optimizer stays fresh. A run taken up
 * again from its own checkpoint loads that over them. 0, or -1 with err. */
int trainer_init_from_load_(trainer *t, m6_err *err)
{
    init_src src;
    if (init_from_open(&t->spec, &src, err) != 0)
        return -1;
    const backend_iface *be = t->be.iface;
    /* the checkpoint's tensors: an MoE slot has 8 + 2k + 4E */
    int per = ckpt_count_(t), rc = 0;
    st_tensor *ts = per < 0 ? NULL : calloc((size_t)per, sizeof *ts);
    char **names = per < 0 ? NULL : calloc((size_t)per, sizeof *names);
    if (!ts || !names || be->state_begin(t->be.ctx, 1) != 0) {
        m6_err_set(err, M6_EINTERNAL, "init.from: out of memory");
        free(ts);
        free(names);
        init_from_close(&src);
        return -1;
    }
    int n = collect_tensors_(t, BACKEND_PARAMS, "", ts, names);
    char e2[256];
    /* weights of the other master dtype: taken (fp32 ones rounded to the
     * nearest bf16 by state_end, bf16 ones widened exactly), said in an
     * event, the optimizer fresh as always with init.from */
    char dt[16] = "";
    int nd;
    long sh[4];
    const char *mine = buf_bf16_(t, BACKEND_PARAMS) ? "BF16" : "F32";
    if (n > 0 && safetensors_info(&src.sf, ts[0].name, dt, &nd, sh, e2,
                                  sizeof e2) == 0 && strcmp(dt, mine) != 0)
        log_event(LOG_INFO, "train.init_from",
                  "weights=%s master=%s conversion=%s optimizer=fresh", dt,
                  spec_master_name(t->spec.optimizer.master),
                  strcmp(mine, "BF16") == 0 ? "rounded_to_nearest_bf16"
                                            : "widened_exactly");
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)ts[i].shape[0] *
                       (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
        if (rc == 0 && safetensors_get(&src.sf, ts[i].name, (float *)ts[i].data,
                                       numel, e2, sizeof e2) != 0) {
            m6_err_set(err, M6_EINVALID, "init.from: %s: %s", t->spec.init.from, e2);
            rc = -1;
        }
        free(names[i]);
    }
    if (be->state_end(t->be.ctx, rc == 0) != 0 && rc == 0) {
        m6_err_set(err, M6_EINTERNAL, "init.from: cannot store the weights "
                   "in the %s model", be->name);
        rc = -1;
    }
    free(names);
    free(ts);
    init_from_close(&src);
    return rc;
}

/* ------------------------------------------------------------- state access */

size_t trainer_copy_state(trainer *t, int which, float *dst)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    if (t->sharded && which != 0)
        return 0;  /* the moments are spread over the ranks */
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!kind)
        return 0;
    size_t ks[2], ng = t->n_global;
    gpt_tensor tab[SLOT_NTENSORS_MAX];
    gpt_slot_layout(&t->bmodel, 0, tab, &ks[0]);
    gpt_slot_layout(&t->bmodel, 1, tab, &ks[1]);
    if (t->spec.optimizer.name == OPTIMIZER_ADAFACTOR && which != 0) {
        /* Adafactor: m as AdamW's, or none; v in the af layout */
        if (which == 1 && !spec_has_first_moment(&t->spec)) {
            free(kind);
            return 0;
        }
        if (which == 2 &&
            (gpt_af_tensors(&t->spec.model, -1, NULL, &ng) < 0 ||
             gpt_af_tensors(&t->spec.model, 0, NULL, &ks[0]) < 0 ||
             gpt_af_tensors(&t->spec.model, t->spec.model.moe_experts > 0,
                            NULL, &ks[1]) < 0)) {
            free(kind);
            return 0;
        }
    }
    size_t n = ng;
    for (int s = 0; s < S; s++)
        n += ks[kind[s]];
    if (!dst) {
        free(kind);
        return n;
    }
    if (be->state_begin(t->be.ctx, 0) != 0) {
        free(kind);
        return 0;
    }
    backend_buf b = which == 0 ? BACKEND_PARAMS : which == 1 ? BACKEND_M : BACKEND_V;
    memcpy(dst, be->state_region(t->be.ctx, b, -1), ng * sizeof(float));
    size_t off = ng;
    for (int s = 0; s < S; s++) {
        memcpy(dst + off, be->state_region(t->be.ctx, b, s),
               ks[kind[s]] * sizeof(float));
        off += ks[kind[s]];
    }
    be->state_end(t->be.ctx, 0);
    free(kind);
    return n;
}

int trainer_copy_adam_steps(trainer *t, long *dst)
{
    t->be.iface->get_adam_steps(t->be.ctx, dst);
    return n_slots_(t) + 1;
}

int trainer_offload_stats(trainer *t, offload_stats *st)
{
    int rc = t->be.iface->offload_stats(t->be.ctx, st);
    if (rc == 0)  /* off_before: zeros until a backend is replaced */
        offload_stats_carry(st, &t->off_before);
    return rc;
}

void trainer_keep_offload_counts_(trainer *t)
{
    offload_stats st;
    if (trainer_offload_stats(t, &st) != 0)
        return;
    t->off_before = st;
}
