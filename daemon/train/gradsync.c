/*
 * gradsync.c — the trainer's data-parallel gradient sum: the virtual
 * gradient vector cut into buckets, their all-reduce (host group, or in
 * device memory over a gradient group), the overlap thread that sums the
 * last microbatch's finished slots while its backward goes on, validation
 * and MoE figures over the ranks, the group's setup
 * (trainer_set_collectives) and the state broadcast that makes every rank
 * start from root's state. The step that calls it is trainer.c's.
 */
#include "train/trainer_internal.h"
#include "common/threads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The router sums of all W ranks' microbatches: each rank's nine sums and
 * two extremes, as exact float pairs (hi, lo = x - hi) in the rank's own
 * columns of one all-reduce, so every element is one rank's value plus
 * zeros and arrives unrounded; then added in double in rank order. *st is
 * this rank's on entry, the group's on return. 0, or -1 with err. */
#define MOE_FIELDS_ 11
int gradsync_moe_gather_(trainer *t, gpt_moe_stats *st, m6_err *err)
{
    int W = t->world;
    size_t n = (size_t)W * MOE_FIELDS_ * 2;
    float *v = calloc(n, sizeof(float));
    if (!v) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (MoE figures)");
        return -1;
    }
    double mine[MOE_FIELDS_] = {
        st->aux_sum, st->z_sum, (double)st->layers, (double)st->dropped,
        (double)st->pairs, st->load_sum, st->load_sumsq, (double)st->load_n,
        (double)st->empty, (double)st->load_min, (double)st->load_max};
    float *row = v + (size_t)t->rank * MOE_FIELDS_ * 2;
    for (int f = 0; f < MOE_FIELDS_; f++) {
        row[2 * f] = (float)mine[f];
        row[2 * f + 1] = (float)(mine[f] - (double)row[2 * f]);
    }
    if (m6_coll_allreduce_sum(t->coll, v, n, err) != 0) {
        free(v);
        return -1;
    }
    double sum[MOE_FIELDS_] = {0}, lo = INFINITY, hi = 0;
    for (int r = 0; r < W; r++) {
        const float *q = v + (size_t)r * MOE_FIELDS_ * 2;
        double x[MOE_FIELDS_];
        for (int f = 0; f < MOE_FIELDS_; f++)
            x[f] = (double)q[2 * f] + (double)q[2 * f + 1];
        for (int f = 0; f < 9; f++)
            sum[f] += x[f];
        if (x[7] > 0) {  /* a rank with MoE passes: its extremes count */
            lo = x[9] < lo ? x[9] : lo;
            hi = x[10] > hi ? x[10] : hi;
        }
    }
    free(v);
    st->aux_sum = sum[0];
    st->z_sum = sum[1];
    st->layers = (long)sum[2];
    st->dropped = (long)sum[3];
    st->pairs = (long)sum[4];
    st->load_sum = sum[5];
    st->load_sumsq = sum[6];
    st->load_n = (long)sum[7];
    st->empty = (long)sum[8];
    st->load_min = isfinite(lo) ? (long)lo : 0;
    st->load_max = (long)hi;
    return 0;
}

/* ------------------------------------------------------------- data parallel */

/* Whether any rank failed (failed: this one did), by an all-reduce of the
 * count: 1 some rank failed (err says why: this rank's own error, or that
 * another's read of key failed), 0 none, -1 the collective failed (err). */
int gradsync_agree_(trainer *t, int failed, const char *key, m6_err *err)
{
    float f = failed ? 1.0f : 0.0f;
    m6_err e2 = M6_ERR_NONE;
    if (m6_coll_allreduce_sum(t->coll, &f, 1, &e2) != 0) {
        m6_err_free(err);
        *err = e2;
        return -1;
    }
    if (f > 0 && !failed)
        m6_err_set(err, M6_EDATA, "%s: %g of %d ranks could not read their "
                   "share of the batch (this rank could)", key, (double)f,
                   t->world);
    return f > 0;
}

/* Floats of one slot of each kind ([0] dense, [1] MoE): a mixed model's
 * dense slots are smaller than its MoE slots (gpt.h "MoE blocks"). */
static void kind_floats_(const trainer *t, size_t sz[2])
{
    gpt_tensor tab[SLOT_NTENSORS_MAX];
    sz[0] = sz[1] = t->slot_size;
    for (int k = 0; k < 2; k++)
        if (k == 0 || t->bmodel.moe_experts > 0)
            gpt_slot_layout(&t->bmodel, k, tab, &sz[k]);
}

/* The virtual gradient vector all-reduced each step:
 *     [loss | globals | slot 0 | ... | slot S-1]
 * region 0 the step's loss sum (1 float), region 1 the globals' gradient
 * (n_global), region 2+s slot s's (its kind's size; under expert
 * parallelism an MoE slot's without its local experts,
 * trainer_ep_hole_), cut into buckets of
 * bucket_floats from its start. dp_layout_ sets the regions' starts for
 * the current slots (once per step: a delink changes them); 0, or -1 out
 * of memory. Then its length, the region holding element x, and the
 * first element of region r: */
int gradsync_layout_(trainer *t)
{
    int S = n_slots_(t), n = S + 3;
    size_t *st = t->dp_nstart >= n ? t->dp_start
                                   : realloc(t->dp_start, (size_t)n *
                                                          sizeof(size_t));
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!st || !kind) {
        free(kind);
        return -1;
    }
    t->dp_start = st;
    t->dp_nstart = n;
    size_t sz[2], h0;
    kind_floats_(t, sz);
    st[0] = 0;
    st[1] = 1;
    st[2] = 1 + t->n_global;
    for (int s = 0; s < S; s++)
        st[3 + s] = st[2 + s] + sz[kind[s]] - trainer_ep_hole_(t, kind[s],
                                                               &h0);
    free(t->dp_kind);
    t->dp_kind = kind;
    return 0;
}

static size_t dp_total_(const trainer *t)
{
    return t->dp_start[n_slots_(t) + 2];
}

static int dp_region_of_(const trainer *t, size_t x)
{
    int r = 0;
    while (r + 1 < n_slots_(t) + 2 && t->dp_start[r + 1] <= x)
        r++;
    return r;
}

static size_t dp_region_start_(const trainer *t, int r)
{
    return t->dp_start[r];
}

/* Copy elements [start, start+len) of the virtual vector into buf (out 1)
 * or back from it (out 0); loss is region 0. */
/* k floats between buf and a region reg from its virtual offset off
 * (out 1: into buf), skipping the region's hole [h0, h0 + hl) */
static void region_copy_(float *reg, size_t off, float *buf, size_t k,
                         size_t h0, size_t hl, int out)
{
    while (k > 0) {
        size_t mem = off < h0 || !hl ? off : off + hl;
        size_t n = off < h0 && hl && h0 - off < k ? h0 - off : k;
        if (out)
            memcpy(buf, reg + mem, n * sizeof(float));
        else
            memcpy(reg + mem, buf, n * sizeof(float));
        off += n;
        buf += n;
        k -= n;
    }
}

static void grad_span_(trainer *t, size_t start, size_t len, float *buf,
                       float *loss, int out)
{
    const backend_iface *be = t->be.iface;
    int S = n_slots_(t);
    size_t base = 0, end = start + len;
    for (int r = 0; r < S + 2 && start < end; r++) {
        size_t rlen = t->dp_start[r + 1] - t->dp_start[r];
        float *reg = r == 0 ? loss : be->grad_region(t->be.ctx, r - 2);
        if (start < base + rlen) {
            size_t off = start - base, h0 = 0, hl = 0;
            size_t k = rlen - off < end - start ? rlen - off : end - start;
            if (r >= 2)
                hl = trainer_ep_hole_(t, t->dp_kind[r - 2], &h0);
            region_copy_(reg, off, buf, k, h0, hl, out);
            buf += k;
            start += k;
        }
        base += rlen;
    }
}

/* This rank's gradient elements g[0..n) into dp_local_*: the finite
 * ones' sum of squares, the count of the others. */
static void local_stats_(trainer *t, const float *g, size_t n)
{
    double ss = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(g[i]))
            ss += (double)g[i] * g[i];
        else
            bad += 1;
    }
    t->dp_local_sumsq += ss;
    t->dp_local_nonfinite += bad;
}

/* Every rank's dp_local_* into dp_rank_stats, by one all-reduce of
 * 2*world floats (each rank fills its own pair, zeros elsewhere: the sum
 * is exact), entered by every rank after its last bucket. 0, or -1 with
 * err. */
static int gather_rank_stats_(trainer *t, m6_err *err)
{
    int W = t->world;
    memset(t->dp_rank_stats, 0, 2 * (size_t)W * sizeof(float));
    t->dp_rank_stats[2 * t->rank] = (float)t->dp_local_sumsq;
    t->dp_rank_stats[2 * t->rank + 1] = (float)t->dp_local_nonfinite;
    if (m6_coll_allreduce_sum(t->coll, t->dp_rank_stats, 2 * (size_t)W,
                              err) != 0)
        return -1;
    t->dp_stats_valid = 1;
    return 0;
}

static int cmp_float_(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int grad_outlier_rank(const float *sumsq, int world, float ratio,
                      float *ratio_out)
{
    *ratio_out = 0;
    if (world < 2) return -1;
    int top = 0;
    for (int r = 1; r < world; r++)
        if (sumsq[r] > sumsq[top]) top = r;
    /* the others' norms, sorted: their median */
    float *o = malloc((size_t)(world - 1) * sizeof *o);
    if (!o) return -1;
    for (int r = 0, k = 0; r < world; r++)
        if (r != top) o[k++] = sqrtf(sumsq[r]);
    int n = world - 1;
    qsort(o, (size_t)n, sizeof *o, cmp_float_);
    float med = n % 2 ? o[n / 2] : 0.5f * (o[n / 2 - 1] + o[n / 2]);
    free(o);
    float norm = sqrtf(sumsq[top]);
    if (!(med > 0) || !(norm > ratio * med)) return -1;
    *ratio_out = norm / med;
    return top;
}

/* Sum the virtual vector over the ranks (*loss its region 0): one
 * all-reduce per bucket, the last bucket first and the first (the loss
 * and the globals) last, so the order is fixed, and backward's order
 * (the last layers' slots are final first). wait 1 (the communication
 * thread): each bucket waits until dp_ready says its regions are final.
 * Each bucket is the same all-reduce whether overlapped or not: the sums
 * are the same bits. 0, or -1 with err (the collective's). */
static int reduce_buckets_(trainer *t, float *loss, int wait, m6_err *err)
{
    size_t total = dp_total_(t), bf = t->bucket_floats;
    size_t nb = (total + bf - 1) / bf;
    size_t grads_from = dp_region_start_(t, 1); /* region 0: the loss */
    t->dp_local_sumsq = t->dp_local_nonfinite = 0;
    for (size_t b = nb; b-- > 0;) {
        size_t start = b * bf;
        size_t len = total - start < bf ? total - start : bf;
        if (wait) {
            int r0 = dp_region_of_(t, start);
            int r1 = dp_region_of_(t, start + len - 1);
            pthread_mutex_lock(&t->dp_mu);
            for (int r = r0; r <= r1; r++)
                while (!t->dp_ready[r])
                    pthread_cond_wait(&t->dp_cv, &t->dp_mu);
            t->dp_early += !t->dp_mb_done;
            t->dp_buckets++;
            pthread_mutex_unlock(&t->dp_mu);
        }
        grad_span_(t, start, len, t->bucket, loss, 1);
        size_t skip = start < grads_from ? grads_from - start : 0;
        local_stats_(t, t->bucket + (skip < len ? skip : len),
                     skip < len ? len - skip : 0);
        int rc = t->local ? m6_local_hier_allreduce_sum(t->local, t->leaders,
                                                        t->bucket, len, err)
                          : m6_coll_allreduce_sum(t->coll, t->bucket, len,
                                                  err);
        if (rc != 0)
            return -1;
        grad_span_(t, start, len, t->bucket, loss, 0);
        /* a slot starting in this bucket is summed now (its later
         * buckets went before): the backend may start on it. Expert
         * replicas: its experts are not (trainer_ep_reduce_experts_
         * reports every slot after their sums) */
        if (t->be.iface->grad_summed && !trainer_ep_replica_group_(t))
            for (int r = dp_region_of_(t, start + len - 1);
                 r >= 2 && dp_region_start_(t, r) >= start; r--)
                t->be.iface->grad_summed(t->be.ctx, r - 2);
    }
    return gather_rank_stats_(t, err);
}

/* Sum the step's gradient and *loss_sum over the ranks, after the
 * microbatches (no overlap). 0, or -1 with err. */
int gradsync_allreduce_host_(trainer *t, double *loss_sum, m6_err *err)
{
    float loss = (float)*loss_sum;
    if (reduce_buckets_(t, &loss, 0, err) != 0)
        return -1;
    *loss_sum = loss;
    return 0;
}

/* The step's gradient and *loss_sum over the ranks with a device-memory
 * group (trainer_adopt_grad_group): the loss over the host group, the
 * backend's device buffer (backend.h device_grads) in place over gcoll,
 * in buckets of bucket_floats, the last bucket first, as reduce_buckets_
 * does. 0, or -1 with err. */
int gradsync_allreduce_device_(trainer *t, double *loss_sum, m6_err *err)
{
    float loss = (float)*loss_sum;
    if (m6_coll_allreduce_sum(t->coll, &loss, 1, err) != 0)
        return -1;
    *loss_sum = loss;
    size_t n = 0, bf = t->bucket_floats;
    float *g = t->be.iface->device_grads(t->be.ctx, &n);
    if (!g) {
        m6_err_set(err, M6_EINTERNAL, "the %s backend has no device buffer "
                   "of the step's gradient (out of device memory)",
                   t->be.iface->name);
        return -1;
    }
    for (size_t b = (n + bf - 1) / bf; b-- > 0;) {
        size_t start = b * bf, len = n - start < bf ? n - start : bf;
        if (m6_coll_allreduce_sum(t->gcoll, g + start, len, err) != 0)
            return -1;
    }
    return 0;
}

/* The backend's report (backend.h data_parallel): slot s's gradient is
 * final. From the training thread or a backend thread. */
static void dp_ready_(void *ctx, int s)
{
    trainer *t = ctx;
    pthread_mutex_lock(&t->dp_mu);
    if (t->dp_active && s >= 0 && s + 2 < t->dp_nreg && !t->dp_ready[s + 2]) {
        t->dp_ready[s + 2] = 1;
        t->dp_reported++;
        pthread_cond_broadcast(&t->dp_cv);
    }
    pthread_mutex_unlock(&t->dp_mu);
}

static void *dp_comm_main_(void *arg)
{
    trainer *t = arg;
    m6_err e = M6_ERR_NONE;
    /* region 0, dp_loss, is read once dp_ready[0] says it is set */
    int rc = reduce_buckets_(t, &t->dp_loss, 1, &e);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_rc = rc;
    t->dp_err = e;
    pthread_mutex_unlock(&t->dp_mu);
    return NULL;
}

/* Start the step's communication thread, before its last microbatch: 1
 * started, 0 not (out of memory, no thread: the step all-reduces after
 * the microbatches instead). */
int gradsync_overlap_start_(trainer *t, pthread_t *th)
{
    int nreg = n_slots_(t) + 2;
    unsigned char *r = realloc(t->dp_ready, (size_t)nreg);
    if (!r)
        return 0;
    memset(r, 0, (size_t)nreg);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_ready = r;
    t->dp_nreg = nreg;
    t->dp_rc = 0;
    t->dp_loss = 0;
    t->dp_active = 1;
    t->dp_mb_done = 0;
    t->dp_reported = t->dp_early = t->dp_buckets = 0;
    pthread_mutex_unlock(&t->dp_mu);
    if (threads_start(th, dp_comm_main_, t) != 0) {
        pthread_mutex_lock(&t->dp_mu);
        t->dp_active = 0;
        pthread_mutex_unlock(&t->dp_mu);
        return 0;
    }
    return 1;
}

/* After the last microbatch: every region is final now (the loss sum
 * too); wait for the thread's last buckets. 0, or -1 with err. */
int gradsync_overlap_finish_(trainer *t, pthread_t th, double *loss_sum,
                             m6_err *err)
{
    pthread_mutex_lock(&t->dp_mu);
    t->dp_loss = (float)*loss_sum;
    t->dp_mb_done = 1;
    memset(t->dp_ready, 1, (size_t)t->dp_nreg);
    pthread_cond_broadcast(&t->dp_cv);
    pthread_mutex_unlock(&t->dp_mu);
    pthread_join(th, NULL);
    pthread_mutex_lock(&t->dp_mu);
    t->dp_active = 0;
    int rc = t->dp_rc;
    m6_err e = t->dp_err;
    t->dp_err = M6_ERR_NONE;
    pthread_mutex_unlock(&t->dp_mu);
    if (rc != 0) {
        m6_err_free(err);
        *err = e;
        return -1;
    }
    *loss_sum = t->dp_loss;
    return 0;
}

/* Validation on W ranks: rank r the spec's batches r, r+W, ...; the sums
 * (and a count of ranks whose read failed) all-reduced. */
int gradsync_eval_(trainer *t, float *loss, m6_err *err)
{
    int n = t->spec.train.eval_batches, failed = 0;
    double sum = 0;
    for (int i = t->rank; i < n && !failed; i += t->world) {
        if (trainer_val_batch_(t, i, err) != 0)
            failed = 1;
        else
            sum += t->be.iface->loss(t->be.ctx, t->inp, t->tgt,
                                     t->spec.train.batch_size);
    }
    float v[2] = {(float)sum, failed ? 1.0f : 0.0f};
    m6_err e2 = M6_ERR_NONE;
    if (m6_coll_allreduce_sum(t->coll, v, 2, &e2) != 0) {
        m6_err_free(err);
        *err = e2;
        return TRAINER_ECOLL;
    }
    if (v[1] > 0) {
        if (!failed)
            m6_err_set(err, M6_EDATA, "data.val: %g of %d ranks could not "
                       "read their validation batches (this rank could)",
                       (double)v[1], t->world);
        return TRAINER_EDATA;
    }
    *loss = (float)((double)v[0] / n);
    return 0;
}

void gradsync_backend_(trainer *t)
{
    const backend_iface *be = t->be.iface;
    if (be->dp_device)
        be->dp_device(t->be.ctx, t->world > 1 && t->gcoll);
    if (!be->data_parallel)
        return;
    if (t->world > 1)
        be->data_parallel(t->be.ctx, t->accum_rank,
                          t->dp_overlap ? dp_ready_ : NULL, t);
    else
        be->data_parallel(t->be.ctx, 0, NULL, NULL);
}

/* trainer_adopt_grad_group; any_memory 1 (test_hooks.h): a group of
 * host memory too. */
static int adopt_(trainer *t, m6_coll *dev, int any_memory, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int mem_ok = dev && (any_memory || m6_coll_device_buffers(dev));
    if (!dev || !mem_ok || !be->dp_device || !be->device_grads) {
        if (dev)
            m6_err_set(err, M6_EINVALID, "collectives: %s",
                       !mem_ok
                           ? "a gradient group must reduce device memory "
                             "(nccl); a host group is trainer_set_collectives'"
                           : "the backend's gradients are not in device "
                             "memory (use gloo)");
        else
            m6_err_set(err, M6_EINVALID, "collectives: no group");
        m6_coll_destroy(dev);
        return -1;
    }
    m6_coll_destroy(t->gcoll);
    t->gcoll = dev;
    return 0;
}

int trainer_adopt_node_groups(trainer *t, m6_local *local, m6_coll *leaders,
                              m6_err *err)
{
    if (!local && leaders) {
        m6_err_set(err, M6_EINVALID, "collectives: the leaders' group "
                   "without a node-local group");
        m6_coll_destroy(leaders);
        return -1;
    }
    if (local && t->gcoll) {
        m6_err_set(err, M6_EINVALID, "collectives: the gradient is summed in "
                   "device memory (trainer_adopt_grad_group); a node-local "
                   "group sums host memory");
        m6_local_leave(local);
        m6_coll_destroy(leaders);
        return -1;
    }
    if (leaders && m6_local_rank(local) != 0) {
        m6_err_set(err, M6_EINVALID, "collectives: local rank %d is not its "
                   "node's leader (local rank 0) but was given the leaders' "
                   "group", m6_local_rank(local));
        m6_local_leave(local);
        m6_coll_destroy(leaders);
        return -1;
    }
    m6_local_leave(t->local);
    m6_coll_destroy(t->leaders);
    t->local = local;
    t->leaders = leaders;
    return 0;
}

int trainer_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err)
{
    return adopt_(t, dev, 0, err);
}

int trainer_test_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err)
{
    return adopt_(t, dev, 1, err);
}

int trainer_set_collectives(trainer *t, m6_coll *c, m6_err *err)
{
    int W = c ? m6_coll_world_size(c) : 1, B_r, A_r;
    int pseudo = t->phase == PHASE_PSEUDO;
    int want = spec_world_of_phase(&t->spec, pseudo);
    if (c && W != want) {  /* leaving a group (c NULL) is always allowed */
        m6_err_set(err, M6_EINVALID, "collectives: a group of %d rank%s, but "
                   "the spec's %s phase has %s %d", W, W == 1 ? "" : "s",
                   pseudo ? "pseudo" : "real",
                   pseudo && t->spec.nodes.pseudo_world_size > 0
                       ? "nodes.pseudo_world_size" : "nodes.world_size",
                   want);
        return -1;
    }
    const backend_iface *be = t->be.iface;
    if (t->sharded) {
        m6_err_set(err, M6_EINVALID, "collectives: the optimizer state is "
                   "sharded over the old group; trainer_gather_optim on "
                   "every rank first");
        return -1;
    }
    if (W > 1) {
        if (m6_coll_device_buffers(c)) {
            m6_err_set(err, M6_EINVALID, "collectives: backend '%s' reduces "
                       "device memory, but the trainer's group carries host "
                       "memory (the loss, the state broadcast; use gloo, "
                       "and trainer_adopt_grad_group for the %s gradients)",
                       m6_coll_backend(c), be->name);
            return -1;
        }
        if (t->gcoll && (m6_coll_world_size(t->gcoll) != W ||
                         m6_coll_rank(t->gcoll) != m6_coll_rank(c))) {
            m6_err_set(err, M6_EINVALID, "collectives: the gradient group is "
                       "rank %d of %d, the host group rank %d of %d",
                       m6_coll_rank(t->gcoll), m6_coll_world_size(t->gcoll),
                       m6_coll_rank(c), W);
            return -1;
        }
        if (!be->data_parallel ||
            (t->gcoll ? !be->device_grads(t->be.ctx, NULL)
                      : !be->grad_region || !be->grad_region(t->be.ctx, -1))) {
            m6_err_set(err, M6_EINVALID, "collectives: the %s backend "
                       "cannot train data-parallel%s", be->name,
                       !be->data_parallel ? ""
                       : t->planned && t->plan.n_offloaded > 0
                           ? " with offloaded slots (device.memory_budget)"
                           : " (out of memory for the gradient's copy)");
            return -1;
        }
        if (spec_dp_split(&t->spec, W, &B_r, &A_r) != 0) {
            m6_err_set(err, M6_EINVALID, "collectives: %d ranks must divide "
                       "train.grad_accum (%d) or train.batch_size (%d)", W,
                       t->spec.train.grad_accum, t->spec.train.batch_size);
            return -1;
        }
        if (!t->bucket &&
            !(t->bucket = malloc(t->bucket_floats * sizeof(float)))) {
            m6_err_set(err, M6_EINTERNAL, "out of memory (all-reduce "
                       "bucket of %zu floats)", t->bucket_floats);
            return -1;
        }
        if (t->dp_rank_stats_world != W) {
            float *s = realloc(t->dp_rank_stats, 2 * (size_t)W * sizeof *s);
            if (!s) {
                m6_err_set(err, M6_EINTERNAL, "out of memory (per-rank "
                           "gradient statistics)");
                return -1;
            }
            t->dp_rank_stats = s;
            t->dp_rank_stats_world = W;
        }
        if (!t->dp_sync) {
            pthread_mutex_init(&t->dp_mu, NULL);
            pthread_cond_init(&t->dp_cv, NULL);
            t->dp_sync = 1;
        }
    } else {
        B_r = t->spec.train.batch_size;
        A_r = t->spec.train.grad_accum;
    }
    if (W <= 1 && t->gcoll) { /* alone: the gradient group goes too */
        m6_coll_destroy(t->gcoll);
        t->gcoll = NULL;
    }
    if (W <= 1 && t->local) { /* and the node's groups (its peers' waits
                               * fail at once: it left) */
        m6_local_leave(t->local);
        m6_coll_destroy(t->leaders);
        t->local = NULL;
        t->leaders = NULL;
    }
    /* expert parallelism: the model re-laid to this rank's experts on
     * the first group; a later group takes over the all-to-alls; without
     * one the trainer cannot step (it holds only its experts) */
    if (t->ep)
        trainer_ep_regroup_(t, W > 1 ? c : NULL);
    else if (W > 1 && trainer_ep_start_(t, c, err) != 0)
        return -1;
    if (W <= 1) /* alone: the expert groups go too */
        trainer_ep_groups_free_(t);
    t->coll = c;
    t->world = W;
    t->rank = c ? m6_coll_rank(c) : 0;
    t->B_rank = B_r;
    t->accum_rank = A_r;
    gradsync_backend_(t);  /* a new backend under expert parallelism */
    return gradsync_shard_(t, err);
}

void trainer_set_eval_interrupt(trainer *t, int (*fn)(void *ud), void *ud)
{
    t->eval_stop = fn;
    t->eval_stop_ud = ud;
}

void trainer_set_dp_overlap(trainer *t, int on)
{
    /* expert parallelism: the backward's all-to-alls use the group */
    t->dp_overlap = on != 0 && !t->ep;
    gradsync_backend_(t);
}

void trainer_dp_overlap_counts(const trainer *t, long *reported, long *early,
                               long *buckets)
{
    *reported = t->dp_reported;
    *early = t->dp_early;
    *buckets = t->dp_buckets;
}

void trainer_set_bucket_floats(trainer *t, size_t n)
{
    if (n < 1 || n == t->bucket_floats)
        return;
    free(t->bucket);
    t->bucket = NULL;
    t->bucket_floats = n;
    if (t->world > 1 && !(t->bucket = malloc(n * sizeof(float)))) {
        t->bucket_floats = DEFAULT_BUCKET_FLOATS;  /* next try allocates */
        t->bucket = malloc(t->bucket_floats * sizeof(float));
    }
}

size_t trainer_step_windows(const trainer *t, size_t *dst)
{
    if (dst)
        memcpy(dst, t->win_pos, t->n_win * sizeof(size_t));
    return t->n_win;
}

/* ------------------------------------------------------------ ZeRO stage 1 */

/* The group the state is sharded over: the trainer's ranks, or under
 * expert parallelism the ranks holding this rank's experts (the same
 * local layout; world/P of them, NULL alone), *rank and *world this
 * rank's place in it. */
static m6_coll *zgroup_(const trainer *t, int *rank, int *world)
{
    if (!t->ep) {
        *rank = t->rank;
        *world = t->world;
        return t->coll;
    }
    m6_coll *c = trainer_ep_replica_group_(t);
    *rank = c ? m6_coll_rank(c) : 0;
    *world = c ? m6_coll_world_size(c) : 1;
    return c;
}

/* Each rank's floats of buffer b under the backend's partition (the
 * model owns it: gpt_set_shard) over the shard group, malloc'd [its
 * world]; NULL when out of memory or the backend cannot say. */
static size_t *shard_counts_(const trainer *t, backend_buf b)
{
    int zr, zw;
    zgroup_(t, &zr, &zw);
    size_t *counts = malloc((size_t)zw * sizeof *counts);
    if (counts && t->be.iface->shard_counts(t->be.ctx, zw, b, counts) != 0) {
        free(counts);
        return NULL;
    }
    return counts;
}

int gradsync_shard_(trainer *t, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int zr, zw;
    zgroup_(t, &zr, &zw);
    if (!t->spec.optimizer.shard || zw <= 1 || t->sharded)
        return 0;
    char e2[512];
    if (!be->shard || !be->flat || !be->shard_counts) {
        m6_err_set(err, M6_EINVALID, "optimizer.shard: the %s backend "
                   "cannot shard its optimizer state", be->name);
        return -1;
    }
    if (be->shard(t->be.ctx, zr, zw, e2, sizeof e2) != 0) {
        m6_err_set(err, M6_EINTERNAL, "optimizer.shard: %s", e2);
        return -1;
    }
    t->sharded = 1;
    return 0;
}

int gradsync_unshard_(trainer *t, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    if (!t->sharded)
        return 0;
    char e2[512];
    /* whole, this rank's range in place, then everyone's */
    if (be->shard(t->be.ctx, 0, 1, e2, sizeof e2) != 0) {
        m6_err_set(err, M6_EINTERNAL, "gathering the sharded optimizer "
                   "state: %s", e2);
        return -1;
    }
    t->sharded = 0;
    /* m, then v (Adafactor without a first moment has no m) */
    int rc = 0;
    for (int b = BACKEND_M; b <= BACKEND_V && rc == 0; b++) {
        size_t n = 0;
        float *buf = be->flat(t->be.ctx, (backend_buf)b, &n);
        if (!buf && b == BACKEND_M)
            continue;
        size_t *counts = buf ? shard_counts_(t, (backend_buf)b) : NULL;
        if (!counts) {
            m6_err_set(err, M6_EINTERNAL, "gathering the sharded optimizer "
                       "state: out of memory");
            return -1;
        }
        int zr, zw;
        rc = m6_coll_allgather(zgroup_(t, &zr, &zw), buf, counts, err);
        free(counts);
    }
    return rc;
}

/* The sharded optimizer state whole on rank 0 alone (a save or a delink
 * that only rank 0 makes): rank 0 unshards (its range in place, first in
 * the layout) and every other rank sends it its part by one all-to-all
 * per buffer, keeping its shard; the next trainer_step shards rank 0
 * again. Every rank enters the same all-to-alls (m only where the
 * optimizer keeps one: the spec says, the same on every rank). */
static int gather_root_(trainer *t, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    if (!t->sharded)
        return 0;
    int W = t->world, me = t->rank, rc = 0;
    int has_m = spec_has_first_moment(&t->spec);
    size_t *sb = calloc((size_t)W, sizeof *sb);
    size_t *rb = calloc((size_t)W, sizeof *rb);
    char e2[512];
    if (!sb || !rb) {
        m6_err_set(err, M6_EINTERNAL, "gathering the sharded optimizer "
                   "state: out of memory");
        rc = -1;
    } else if (me == 0 && be->shard(t->be.ctx, 0, 1, e2, sizeof e2) != 0) {
        m6_err_set(err, M6_EINTERNAL, "gathering the sharded optimizer "
                   "state: %s", e2);
        rc = -1;
    } else if (me == 0) {
        t->sharded = 0;
    }
    for (int b = has_m ? BACKEND_M : BACKEND_V; b <= BACKEND_V && rc == 0;
         b++) {
        size_t n = 0, *counts = shard_counts_(t, (backend_buf)b);
        float *buf = be->flat(t->be.ctx, (backend_buf)b, &n);
        if (!counts || !buf) {
            m6_err_set(err, M6_EINTERNAL, "gathering the sharded optimizer "
                       "state: %s", counts ? "no buffer" : "out of memory");
            free(counts);
            rc = -1;
            break;
        }
        memset(sb, 0, (size_t)W * sizeof *sb);
        memset(rb, 0, (size_t)W * sizeof *rb);
        if (me == 0)
            for (int r = 1; r < W; r++)
                rb[r] = counts[r] * sizeof(float);
        else
            sb[0] = counts[me] * sizeof(float);
        /* rank 0's recv starts after its own part, the others' follow in
         * rank order */
        rc = m6_coll_alltoallv(t->coll, buf, sb,
                               me == 0 ? buf + counts[0] : NULL, rb, err);
        free(counts);
    }
    free(sb);
    free(rb);
    return rc;
}

/* The sharded update's weights all-gathered region by region, for a
 * backend whose weights are not one buffer (offloaded slots live apart):
 * the globals, then slot 0, 1, ... at their places in the flat layout
 * (the model's plain one: each slot at its kind's size), each rank's
 * part of a region its range (counts, in rank order) cut to the region,
 * so the ranks' parts are consecutive in it and in rank order: one
 * in-place all-gather a region, entered by every rank in that order.
 * The backend's pending host updates are settled first (state_begin). */
static int allgather_regions_(trainer *t, const size_t *counts, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int zr, zw, S = n_slots_(t), rc = 0;
    m6_coll *c = zgroup_(t, &zr, &zw);
    size_t sz[2], *rc_counts = malloc((size_t)zw * sizeof *rc_counts);
    unsigned char *kind = trainer_slot_kinds_(t);
    if (!rc_counts || !kind || be->state_begin(t->be.ctx, 0) != 0) {
        free(rc_counts);
        free(kind);
        m6_err_set(err, M6_EINTERNAL, "all-gather of the sharded update: "
                   "out of memory");
        return -1;
    }
    kind_floats_(t, sz);
    size_t a = 0;  /* the region's first element in the flat layout */
    for (int s = -1; s < S && rc == 0; s++) {
        size_t b = a + (s < 0 ? t->n_global : sz[kind[s]]), r0 = 0;
        for (int r = 0; r < zw; r++) {
            size_t r1 = r0 + counts[r];
            size_t lo = r0 > a ? r0 : a, hi = r1 < b ? r1 : b;
            rc_counts[r] = lo < hi ? hi - lo : 0;
            r0 = r1;
        }
        float *p = be->state_region(t->be.ctx, BACKEND_PARAMS, s);
        rc = p ? m6_coll_allgather(c, p, rc_counts, err) : -1;
        if (!p)
            m6_err_set(err, M6_EINTERNAL, "all-gather of the sharded "
                       "update: no weights of region %d", s);
        a = b;
    }
    /* received weights are the other ranks' masters already */
    be->state_end(t->be.ctx, 0);
    free(rc_counts);
    free(kind);
    return rc;
}

int gradsync_allgather_params_(trainer *t, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    size_t n = 0;
    float *p = be->flat(t->be.ctx, BACKEND_PARAMS, &n);
    size_t *counts = shard_counts_(t, BACKEND_PARAMS);
    if (!counts) {
        m6_err_set(err, M6_EINTERNAL, "all-gather of the sharded update: "
                   "out of memory");
        return -1;
    }
    int zr, zw;
    int rc = p ? m6_coll_allgather(zgroup_(t, &zr, &zw), p, counts, err)
               : allgather_regions_(t, counts, err);
    free(counts);
    return rc;
}

int trainer_gather_optim(trainer *t, m6_err *err)
{
    return gradsync_unshard_(t, err) != 0 ? TRAINER_ECOLL : 0;
}

int trainer_sync_boundary(trainer *t, int want_whole, m6_err *err)
{
    /* expert parallel: the experts are spread (and sharded, the moments
     * over each expert's replicas); sharded: the masters and moments are */
    int ep = t->ep && t->world > 1;
    if (!ep && (!t->spec.optimizer.shard || t->world <= 1))
        return 0;
    float v = t->rank == 0 && want_whole ? 1.0f : 0.0f;
    if (m6_coll_allreduce_sum(t->coll, &v, 1, err) != 0)
        return TRAINER_ECOLL;
    if (v == 0)
        return 0;
    /* expert parallel: every replica group whole first (each rank in one,
     * at once), then the experts to rank 0 */
    int rc = ep ? (gradsync_unshard_(t, err) != 0
                       ? -1 : trainer_ep_gather_root_(t, err))
                : gather_root_(t, err);
    if (rc != 0)
        return TRAINER_ECOLL;
    return t->rank == 0 ? 1 : 0;
}

/* What trainer_broadcast_state sends before the tensors. */
typedef struct {
    int64_t step, delink_step;
    uint64_t data_rng;
    int32_t phase, n_slots;
} bcast_head_;

size_t trainer_state_floats_(const trainer *t, backend_buf b, int region,
                             size_t n)
{
    if (b == BACKEND_PARAMS || t->spec.optimizer.name != OPTIMIZER_ADAFACTOR)
        return n;
    if (b == BACKEND_M)
        return spec_has_first_moment(&t->spec) ? n : 0;
    size_t v = 0;
    return gpt_af_tensors(&t->spec.model, region, NULL, &v) < 0 ? SIZE_MAX
                                                                 : v;
}

int trainer_broadcast_state(trainer *t, m6_coll *c, int root, m6_err *err)
{
    const backend_iface *be = t->be.iface;
    int L = t->spec.model.n_layer, rc = -1;
    if (!c) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: no group");
        return -1;
    }
    if (t->ep) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: each rank "
                   "holds other experts (nodes.expert_parallel %d); "
                   "broadcast before trainer_set_collectives",
                   t->spec.nodes.expert_parallel);
        return -1;
    }
    if (m6_coll_device_buffers(c)) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: backend '%s' "
                   "moves device memory; the trainer's state regions are "
                   "host memory (use gloo)", m6_coll_backend(c));
        return -1;
    }
    if (t->sharded) {
        m6_err_set(err, M6_EINVALID, "broadcast of the state: the optimizer "
                   "state is sharded; trainer_gather_optim on every rank "
                   "first");
        return -1;
    }
    int me = m6_coll_rank(c);
    bcast_head_ h = {t->step, t->delink_step, t->data_rng, (int32_t)t->phase,
                     n_slots_(t)};
    int32_t *map = malloc((size_t)L * sizeof(int32_t));
    int *imap = malloc((size_t)L * sizeof(int)), *src = NULL;
    long *steps = NULL;
    if (!map || !imap) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    const int *om = be->slot_of(t->be.ctx);
    for (int l = 0; l < L; l++)
        map[l] = om[l];
    if (m6_coll_broadcast(c, &h, sizeof h, root, err) != 0 ||
        m6_coll_broadcast(c, map, (size_t)L * sizeof(int32_t), root, err) != 0) {
        rc = TRAINER_ECOLL;
        goto out;
    }
    /* the receiver takes root's share map first (values overwritten) */
    int S = h.n_slots, same = S == n_slots_(t);
    for (int l = 0; l < L; l++) {
        imap[l] = map[l];
        same = same && om[l] == map[l];
    }
    if (me != root && !same) {
        char e2[512];
        src = calloc((size_t)S, sizeof(int));
        if (!src || be->reslot(t->be.ctx, S, imap, src, 1, e2,
                               sizeof e2) != 0) {
            m6_err_set(err, M6_EINTERNAL, "broadcast of the state: %s",
                       src ? e2 : "out of memory");
            goto out;
        }
    }
    if (be->state_begin(t->be.ctx, me != root) != 0) {
        m6_err_set(err, M6_EINTERNAL, "out of memory reading the %s model's "
                   "state", be->name);
        goto out;
    }
    int crc = 0;
    size_t sz[2];
    kind_floats_(t, sz);
    unsigned char *kind = trainer_slot_kinds_(t);  /* root's share map now */
    if (!kind) {
        be->state_end(t->be.ctx, 0);
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    for (int b = 0; b < 3 && crc == 0; b++)
        for (int s = -1; s < S && crc == 0; s++) {
            size_t n = trainer_state_floats_(t, (backend_buf)b,
                                             s < 0 ? -1 : kind[s],
                                             s < 0 ? t->n_global
                                                   : sz[kind[s]]);
            if (n == SIZE_MAX) {
                crc = -1;
                m6_err_set(err, M6_EINTERNAL, "out of memory");
                break;
            }
            if (n == 0)
                continue;  /* Adafactor without a first moment: no m */
            crc = m6_coll_broadcast(c, be->state_region(t->be.ctx,
                                                        (backend_buf)b, s),
                                    n * sizeof(float), root, err);
        }
    free(kind);
    if (be->state_end(t->be.ctx, me != root && crc == 0) != 0 && crc == 0) {
        m6_err_set(err, M6_EINTERNAL, "broadcast of the state: cannot store "
                   "it in the %s model", be->name);
        goto out;
    }
    steps = malloc(((size_t)S + 1) * sizeof(long));
    if (crc == 0 && steps) {
        be->get_adam_steps(t->be.ctx, steps);
        crc = m6_coll_broadcast(c, steps, ((size_t)S + 1) * sizeof(long),
                                root, err);
    }
    if (crc != 0) {
        rc = TRAINER_ECOLL;
        goto out;
    }
    if (!steps) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        goto out;
    }
    be->set_adam_steps(t->be.ctx, steps);
    t->step = h.step;
    t->delink_step = h.delink_step;
    t->data_rng = h.data_rng;
    t->phase = h.phase == PHASE_PSEUDO ? PHASE_PSEUDO : PHASE_REAL;
    rc = 0;
out:
    free(map);
    free(imap);
    free(src);
    free(steps);
    return rc;
}

int trainer_rank(const trainer *t) { return t->rank; }
int trainer_world_size(const trainer *t) { return t->world; }
