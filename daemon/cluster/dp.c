/*
 * dp.c — one run across several m6d nodes (see dp.h): rank 0's group on
 * the coordinator, the worker node's trainer thread, and the hash check
 * both run before the first collective.
 */
#include "cluster/dp.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/store_client.h"
#include "common/rankboard.h"
#include "common/threads.h"
#include "common/log.h"

#ifndef M6_VERSION
#define M6_VERSION "unknown"
#endif

void cluster_dp_hash(const run_spec *s, const trainer *t, int world,
                     char out[65])
{
    char *json = spec_to_json(s);
    const char *salt = getenv("M6_TEST_DP_HASH_SALT");
    char head[512];
    /* the share map is the spec's (pseudo.*): the trainer derives it, and
     * the state broadcast copies rank 0's, so a delinked rank 0 and a
     * fresh rank agree; the trainer's own figures would not */
    (void)t;
    int hn = snprintf(head, sizeof head, "m6d %s\nworld_size %d\nsalt %s\n",
                      M6_VERSION, world, salt ? salt : "");
    unsigned char md[32];
    unsigned len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(ctx, head, (size_t)hn) == 1 &&
             (!json || EVP_DigestUpdate(ctx, json, strlen(json)) == 1) &&
             EVP_DigestFinal_ex(ctx, md, &len) == 1;
    EVP_MD_CTX_free(ctx);
    free(json);
    if (!ok) memset(md, 0, sizeof md);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* ------------------------------------------------------------ one group */

/* Rank 0's choice of how a run's gradients are summed: "nccl" (in place on
 * the GPUs; trainer_adopt_grad_group) or "gloo" (host memory; the cuda
 * backend stages its gradients there). A cuda run takes nccl when this
 * build has it, unless M6_DP_GRAD_ENGINE says "gloo"; "nccl" there makes
 * a build without it an error. The other ranks follow rank 0 (the store's
 * "engine" key). NULL with why when the operator's choice cannot be met. */
static const char *grad_engine_(const run_spec *s, char *why, size_t len)
{
    const char *want = getenv("M6_DP_GRAD_ENGINE");
    if (want && !*want) want = NULL;
    if (want && strcmp(want, "gloo") && strcmp(want, "nccl") &&
        strcmp(want, "auto")) {
        snprintf(why, len, "M6_DP_GRAD_ENGINE=%s: expected gloo, nccl or "
                 "auto", want);
        return NULL;
    }
    if (s->device.backend != BACKEND_CUDA) {
        if (want && !strcmp(want, "nccl")) {
            snprintf(why, len, "M6_DP_GRAD_ENGINE=nccl: the run's "
                     "device.backend is not \"cuda\"");
            return NULL;
        }
        return "gloo";
    }
    if (want && !strcmp(want, "gloo")) return "gloo";
    if (m6_coll_available("nccl")) return "nccl";
    if (want && !strcmp(want, "nccl")) {
        snprintf(why, len, "M6_DP_GRAD_ENGINE=nccl: this m6d was built "
                 "without NCCL (meson option nccl)");
        return NULL;
    }
    return "gloo";
}

/* every rank of one m6d fits in its node-local group */
_Static_assert(M6_LOCAL_MAX >= RANKBOARD_DEVICES_MAX,
               "dist/local.h's M6_LOCAL_MAX below the ranks one m6d runs");

/* How the gradient buckets are summed: rank 0 reads M6_DP_ALLREDUCE
 * (flat, hier or auto; unset: auto) and passes it on (the store's key
 * "allreduce"), so every rank follows the coordinator's choice. NULL with
 * why for a bad value, or hier with a device-memory engine (nccl: the
 * node-local engine sums host memory). */
static const char *allreduce_mode_(const char *engine, char *why, size_t len)
{
    const char *want = getenv("M6_DP_ALLREDUCE");
    if (!want || !*want) want = "auto";
    if (strcmp(want, "flat") && strcmp(want, "hier") && strcmp(want, "auto")) {
        snprintf(why, len, "M6_DP_ALLREDUCE=%s: expected flat, hier or auto",
                 want);
        return NULL;
    }
    if (strcmp(engine, "gloo") != 0 && !strcmp(want, "hier")) {
        snprintf(why, len, "M6_DP_ALLREDUCE=hier: the gradient is summed "
                 "with %s in device memory; the node-local engine sums host "
                 "memory", engine);
        return NULL;
    }
    return strcmp(engine, "gloo") != 0 ? "flat" : want;
}

/* Rank 0's publication of one choice (the engine, the all-reduce mode):
 * choice non-NULL is copied to out and set under key in the store; NULL
 * makes why the verdict. -1 when the store write failed (err set), else 0. */
static int publish_choice_(m6_store *st, const char *key, const char *choice,
                           const char *why, char *out, size_t out_len,
                           char *verdict, size_t verdict_len, m6_err *err)
{
    if (!choice) {
        snprintf(verdict, verdict_len, "%s", why);
        return 0;
    }
    snprintf(out, out_len, "%s", choice);
    return st->set(st->ctx, key, out, strlen(out), err) < 0 ? -1 : 0;
}

/* The one rule: 1 to sum hierarchically. mode is rank 0's
 * allreduce_mode_; max_local the most ranks one node runs. auto: hier
 * wherever a node runs more than one rank: measured by bench/allreduce_hier
 * on loopback (bench/RESULTS.md), the node-local sum beats Gloo between
 * ranks of one process at every bucket size; with one rank per node the
 * node-local step only adds a copy. */
static int use_hier_(const char *mode, int max_local)
{
    if (!strcmp(mode, "hier")) return 1;
    if (!strcmp(mode, "flat")) return 0;
    return max_local > 1;
}

/* Every rank's node: each rank puts its node's first rank and its local
 * size in its own pair of a 2*world all-reduce over g (zeros elsewhere:
 * exact). Out: the number of nodes, this rank's node index (nodes
 * ordered by their first rank), the most ranks any node runs, and each
 * node's first rank (leader[k], the global rank of node k's leader;
 * world entries). 0, or -1 with err. */
static int node_layout_(m6_coll *g, int rank, int world, int local,
                        int local_size, int *nodes, int *node,
                        int *max_local, int *leader, m6_err *err)
{
    float *v = calloc(2 * (size_t)world, sizeof *v);
    if (!v) {
        m6_err_set(err, M6_EINTERNAL, "out of memory (node layout)");
        return -1;
    }
    int first = rank - local;
    v[2 * rank] = (float)first;
    v[2 * rank + 1] = (float)local_size;
    if (m6_coll_allreduce_sum(g, v, 2 * (size_t)world, err) != 0) {
        free(v);
        return -1;
    }
    *nodes = 0;
    *node = -1;
    *max_local = 1;
    for (int r = 0; r < world; r++) {
        if (r == 0 || v[2 * r] != v[2 * (r - 1)]) leader[(*nodes)++] = r;
        if (r == first) *node = *nodes - 1;
        if ((int)v[2 * r + 1] > *max_local) *max_local = (int)v[2 * r + 1];
    }
    free(v);
    return 0;
}

/* A sub-group's rendezvous store (the nodes' leaders, the expert
 * groups): Gloo names a rank's keys by its rank in the group ("<k>",
 * "rank_<k>"), but the coordinator's store lets only global rank k set a
 * key ending in k (cluster_store_key_owner). The sub-group's rank k is
 * global rank member[k], so its keys go to the store as
 * "<key>/<member[k]>" (every member asks for them the same way). */
typedef struct {
    m6_store *inner;
    const int *member;
    int n;
} members_store_;

/* key, with "/<global rank>" after a last part "<k>" or "rank_<k>",
 * into out. */
static const char *members_key_(const members_store_ *ls, const char *key,
                                char *out, size_t len)
{
    const char *last = strrchr(key, '/');
    last = last ? last + 1 : key;
    int k = -1, n = 0;
    if (!strncmp(last, "rank_", 5)) last += 5;
    if (*last >= '0' && *last <= '9' && sscanf(last, "%d%n", &k, &n) == 1 &&
        last[n] == 0 && k >= 0 && k < ls->n) {
        snprintf(out, len, "%s/%d", key, ls->member[k]);
        return out;
    }
    return key;
}

static int members_set_(void *ctx, const char *key, const void *val,
                        size_t len, m6_err *err)
{
    members_store_ *ls = ctx;
    char k[M6_STORE_KEY_MAX + 16];
    return ls->inner->set(ls->inner->ctx, members_key_(ls, key, k, sizeof k),
                          val, len, err);
}

static int members_get_(void *ctx, const char *key, void **val, size_t *len,
                        int timeout_ms, m6_err *err)
{
    members_store_ *ls = ctx;
    char k[M6_STORE_KEY_MAX + 16];
    return ls->inner->get(ls->inner->ctx, members_key_(ls, key, k, sizeof k),
                          val, len, timeout_ms, err);
}

static int members_wait_(void *ctx, const char *const *keys, size_t n,
                         int timeout_ms, m6_err *err)
{
    members_store_ *ls = ctx;
    char (*k)[M6_STORE_KEY_MAX + 16] = malloc(n ? n * sizeof *k : 1);
    const char **p = malloc(n ? n * sizeof *p : 1);
    int rc = -1;
    if (!k || !p)
        m6_err_set(err, M6_EINTERNAL, "out of memory (store keys)");
    else {
        for (size_t i = 0; i < n; i++)
            p[i] = members_key_(ls, keys[i], k[i], sizeof k[i]);
        rc = ls->inner->wait(ls->inner->ctx, p, n, timeout_ms, err);
    }
    free(k);
    free(p);
    return rc;
}

/* The node-local group of this rank's node and, on its leader (local
 * rank 0) with several nodes, the leaders' Gloo group (prefix
 * "<prefix>/leaders"), handed to the trainer. 0, or -1 with err. */
static int node_groups_(m6_store *st, const char *prefix, int local,
                        int local_size, int node, int nodes,
                        const int *leader, int timeout_ms, const char *host,
                        trainer *t, m6_err *err)
{
    char name[96];
    snprintf(name, sizeof name, "%s/node%d", prefix, node);
    m6_local *lg = m6_local_join(name, local, local_size, timeout_ms, err);
    if (!lg) return -1;
    m6_coll *lead = NULL;
    if (local == 0 && nodes > 1) {
        char lp[96];
        snprintf(lp, sizeof lp, "%s/leaders", prefix);
        members_store_ ls = {st, leader, nodes};
        m6_store lst = {&ls, members_set_, members_get_, members_wait_};
        m6_coll_config lc = {.backend = "gloo", .rank = node,
                             .world_size = nodes, .store = &lst, .prefix = lp,
                             .timeout_ms = timeout_ms, .hostname = host};
        if (!(lead = m6_coll_init(&lc, err))) {
            m6_err_prefix(err, "the nodes' leaders' group");
            m6_local_fail(lg, m6_err_msg(err));
            m6_local_leave(lg);
            return -1;
        }
    }
    return trainer_adopt_node_groups(t, lg, lead, err);
}

/* Expert parallelism with replicas (nodes.expert_parallel P, 1 < P <
 * world): this rank's two sub-groups, adopted by the trainer
 * (trainer_adopt_expert_groups): the expert-parallel group of world ranks
 * d*P .. d*P+P-1 ("<prefix>/ep<d>", d = rank / P) and the ranks q, q+P,
 * ... holding the same experts ("<prefix>/edp<q>", q = rank % P), their
 * store keys those of members' global ranks (members_store_). Every rank
 * makes its ep group first. 0, or -1 with err. */
static int expert_groups_(m6_store *st, const char *prefix, int rank,
                          int world, int P, int timeout_ms, const char *host,
                          trainer *t, m6_err *err)
{
    int D = world / P;
    int *mem = malloc((size_t)(P > D ? P : D) * sizeof *mem);
    m6_coll *g[2] = {NULL, NULL};
    if (!mem)
        m6_err_set(err, M6_EINTERNAL, "out of memory (expert groups)");
    for (int k = 0; k < 2 && mem; k++) {
        int n = k == 0 ? P : D, id = k == 0 ? rank / P : rank % P;
        for (int i = 0; i < n; i++)
            mem[i] = k == 0 ? id * P + i : id + i * P;
        char name[96];
        snprintf(name, sizeof name, "%s/%s%d", prefix, k ? "edp" : "ep", id);
        members_store_ ms = {st, mem, n};
        m6_store mst = {&ms, members_set_, members_get_, members_wait_};
        m6_coll_config cc = {.backend = "gloo",
                             .rank = k == 0 ? rank % P : rank / P,
                             .world_size = n, .store = &mst, .prefix = name,
                             .timeout_ms = timeout_ms, .hostname = host};
        if (!(g[k] = m6_coll_init(&cc, err))) {
            m6_err_prefix(err, k ? "the group of the ranks holding this "
                          "rank's experts" : "the expert-parallel group");
            break;
        }
    }
    free(mem);
    if (!g[0] || !g[1]) {
        m6_coll_destroy(g[0]);
        m6_coll_destroy(g[1]);
        return -1;
    }
    return trainer_adopt_expert_groups(t, g[0], g[1], err);
}

/* Rendezvous as rank of world for (run, gen) through the store at addr:
 * the hash check, Gloo's group, rank 0's state on every rank. The group,
 * or NULL with err. */
static m6_coll *group_(const char *addr, const cluster_token *token,
                       const char *state_dir,
                       int64_t run, int64_t gen, int rank, int world,
                       int local, int local_size,
                       int timeout_ms, const char *host, trainer *t,
                       const run_spec *spec, const char *hash, m6_err *err)
{
    char engine[16] = "gloo", mode[16] = "flat";
    m6_store st = {0};
    m6_store_who who;
    char werr[600];
    if (m6_store_who_load(state_dir, rank, &who, werr, sizeof werr) < 0) {
        m6_err_set(err, M6_EINTERNAL, "rendezvous store: %s", werr);
        return NULL;
    }
    int orc = m6_store_tcp_open(addr, token, &who, run, gen, timeout_ms, &st,
                                err);
    OPENSSL_cleanse(&who, sizeof who);
    if (orc < 0) return NULL;
    char key[64];
    m6_coll *g = NULL;
    snprintf(key, sizeof key, "hash/%d", rank);
    if (st.set(st.ctx, key, hash, strlen(hash), err) < 0) goto out;
    if (rank == 0) {
        char verdict[512] = "ok";
        for (int r = 1; r < world && !strcmp(verdict, "ok"); r++) {
            void *v = NULL;
            size_t n = 0;
            snprintf(key, sizeof key, "hash/%d", r);
            if (st.get(st.ctx, key, &v, &n, timeout_ms, err) < 0) {
                snprintf(verdict, sizeof verdict, "rank %d sent no hash "
                         "within %d ms", r, timeout_ms);
                m6_err e2 = M6_ERR_NONE;  /* the ranks that wait hear it */
                st.set(st.ctx, "verdict", verdict, strlen(verdict), &e2);
                m6_err_free(&e2);
                m6_err_prefix(err, "rank 0: rendezvous");
                goto out;
            }
            if (n != 64 || memcmp(v, hash, 64) != 0)
                snprintf(verdict, sizeof verdict, "rank %d's hash %.*s "
                         "differs from the coordinator's %s (build, model "
                         "configuration, share map, spec or world size)", r,
                         (int)(n < 64 ? n : 64), (const char *)v, hash);
            free(v);
        }
        char why[256];  /* the engine first: the mode depends on it */
        if (!strcmp(verdict, "ok") &&
            publish_choice_(&st, "engine", grad_engine_(spec, why, sizeof why),
                            why, engine, sizeof engine, verdict,
                            sizeof verdict, err) < 0)
            goto out;
        if (!strcmp(verdict, "ok") &&
            publish_choice_(&st, "allreduce",
                            allreduce_mode_(engine, why, sizeof why), why,
                            mode, sizeof mode, verdict, sizeof verdict,
                            err) < 0)
            goto out;
        if (st.set(st.ctx, "verdict", verdict, strlen(verdict), err) < 0)
            goto out;
        if (strcmp(verdict, "ok") != 0) {
            m6_err_set(err, M6_EINVALID, "refused: %s", verdict);
            goto out;
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        if (st.get(st.ctx, "verdict", &v, &n, timeout_ms, err) < 0) goto out;
        int ok = n == 2 && !memcmp(v, "ok", 2);
        if (!ok)
            m6_err_set(err, M6_EINVALID, "refused by the coordinator: %.*s "
                       "(this rank's hash %s)", (int)n, (const char *)v,
                       hash);
        free(v);
        if (!ok) goto out;
        if (st.get(st.ctx, "engine", &v, &n, timeout_ms, err) < 0) goto out;
        snprintf(engine, sizeof engine, "%.*s", (int)(n < 15 ? n : 15),
                 (const char *)v);
        free(v);
        if (st.get(st.ctx, "allreduce", &v, &n, timeout_ms, err) < 0) goto out;
        snprintf(mode, sizeof mode, "%.*s", (int)(n < 15 ? n : 15),
                 (const char *)v);
        free(v);
        if (strcmp(engine, "gloo") &&
            (strcmp(engine, "nccl") || !m6_coll_available("nccl"))) {
            m6_err_set(err, M6_EINVALID, "rank 0 sums the gradients with %s, "
                       "which this m6d was built without (meson option %s; "
                       "or set M6_DP_GRAD_ENGINE=gloo on the coordinator)",
                       engine, engine);
            goto out;
        }
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "run%lld/g%lld", (long long)run,
             (long long)gen);
    m6_coll_config cc = {.backend = "gloo", .rank = rank, .world_size = world,
                         .store = &st, .prefix = prefix,
                         .timeout_ms = timeout_ms, .hostname = host};
    g = m6_coll_init(&cc, err);
    if (!g) goto out;
    /* the address its collectives bound: Gloo's listeners live only while
     * the group forms, so this line is what an operator (or a test) reads */
    log_info("cluster.group", "run=%lld generation=%lld rank=%d "
             "world_size=%d local=%s", (long long)run, (long long)gen, rank,
             world, host ? host : "default");
    int nodes = 1, node = 0, max_local = 1;
    int *leader = malloc((size_t)world * sizeof *leader);
    if (!leader) {
        m6_err_set(err, M6_EINTERNAL, "out of memory");
        m6_coll_destroy(g);
        g = NULL;
        goto out;
    }
    /* a trainer that lives on (rank 0's) keeps no groups of an older
     * generation */
    int lrc = trainer_adopt_node_groups(t, NULL, NULL, err);
    if (lrc == 0)
        lrc = node_layout_(g, rank, world, local, local_size, &nodes, &node,
                           &max_local, leader, err);
    if (lrc == 0 && use_hier_(mode, max_local))
        lrc = node_groups_(&st, prefix, local, local_size, node, nodes,
                           leader, timeout_ms, host, t, err);
    free(leader);
    if (lrc != 0) {
        m6_err_prefix(err, "the nodes' groups");
        m6_coll_destroy(g);
        g = NULL;
        goto out;
    }
    int P = spec->nodes.expert_parallel;
    if (P > 1 && world > P) {
        if (expert_groups_(&st, prefix, rank, world, P, timeout_ms, host, t,
                           err) != 0) {
            m6_coll_destroy(g);
            g = NULL;
            goto out;
        }
        log_info("cluster.expert_groups", "run=%lld rank=%d "
                 "expert_parallel_rank=%d of=%d replica=%d of=%d",
                 (long long)run, rank, rank % P, P, rank / P, world / P);
    }
    if (rank == 0 || local == 0)
        log_info("cluster.allreduce", "run=%lld rank=%d mode=%s nodes=%d "
                 "max_local_ranks=%d", (long long)run, rank,
                 use_hier_(mode, max_local) ? "hier" : "flat", nodes,
                 max_local);
    int rc = trainer_broadcast_state(t, g, 0, err);
    if (rc != 0) {
        m6_err_prefix(err, "broadcasting rank 0's state");
        m6_coll_destroy(g);
        g = NULL;
        goto out;
    }
    if (!strcmp(engine, "nccl")) {
        /* the gradients' own group, on this rank's GPU (its local
         * rank): the trainer owns it (trainer_adopt_grad_group) */
        char np[80];
        snprintf(np, sizeof np, "%s/nccl", prefix);
        m6_coll_config nc = {.backend = "nccl", .rank = rank,
                             .world_size = world, .store = &st,
                             .prefix = np, .timeout_ms = timeout_ms,
                             .device = local};
        m6_coll *n = m6_coll_init(&nc, err);
        if (!n || trainer_adopt_grad_group(t, n, err) != 0) {
            m6_err_prefix(err, "the gradients' NCCL group");
            m6_coll_destroy(g);
            g = NULL;
            goto out;
        }
        log_info("cluster.grad_engine", "run=%lld rank=%d engine=nccl",
                 (long long)run, rank);
    }
out:
    m6_store_tcp_close(&st);
    return g;
}

/* ------------------------------------------------------- the coordinator */

void cluster_dp_coord_init(cluster_dp_coord *d)
{
    pthread_mutex_init(&d->mu, NULL);
    d->co = NULL;
    d->devices = 1;
    d->local = NULL;
}

void cluster_dp_coord_attach(cluster_dp_coord *d, cluster_coord *co)
{
    pthread_mutex_lock(&d->mu);
    d->co = co;
    pthread_mutex_unlock(&d->mu);
}

/* Pick world-1 live worker nodes and assign them ranks 1..world-1 (the
 * nodes table, events, RunAssign), with d->mu held. 1 with *gen, 0 not
 * enough nodes, -1; why set unless 1. */
static int assign_(cluster_dp_coord *d, int64_t id, const run_spec *spec,
                   int world, int timeout_ms, int64_t *gen_out,
                   int *local_out, char *why, size_t len);

/* The run's collectives' and rendezvous' timeout: nodes.timeout, 30 s
 * when unset. */
static int timeout_ms_(const run_spec *spec)
{
    return spec->nodes.timeout > 0 ? spec->nodes.timeout * 1000 : 30000;
}

int cluster_dp_coord_group(void *ud, int64_t id, const run_spec *spec,
                           trainer *t, int world, m6_coll **out, char *why,
                           size_t len)
{
    cluster_dp_coord *d = ud;
    *out = NULL;
    int timeout_ms = timeout_ms_(spec);
    int64_t gen = 0;
    int here = 1;  /* ranks on this m6d: 0..here-1 */
    pthread_mutex_lock(&d->mu);
    int rc = assign_(d, id, spec, world, timeout_ms, &gen, &here, why, len);
    pthread_mutex_unlock(&d->mu);
    if (rc != 1) return rc;
    char hash[65];
    cluster_dp_hash(spec, t, world, hash);
    m6_err e = M6_ERR_NONE;
    m6_coll *g = group_(d->store_addr, d->token, d->state_dir, id, gen, 0,
                        world, 0, here,
                        timeout_ms, d->host, t, spec, hash, &e);
    if (!g) {
        snprintf(why, len, "%s", m6_err_msg(&e));
        m6_err_free(&e);
        state_nodes_clear_run(d->st, id);
        return -1;
    }
    *out = g;
    return 1;
}

static int assign_(cluster_dp_coord *d, int64_t id, const run_spec *spec,
                   int world, int timeout_ms, int64_t *gen_out,
                   int *local_out, char *why, size_t len)
{
    if (!d->co) {
        snprintf(why, len, "nodes.world_size %d needs this m6d to be the "
                 "coordinator (m6d --role coordinator --listen HOST:PORT)",
                 world);
        return 0;
    }
    if (!m6_coll_available("gloo")) {
        snprintf(why, len, "nodes.world_size %d: this m6d was built without "
                 "Gloo (meson option gloo)", world);
        return -1;
    }
    /* node 0 is this m6d, then the live workers by id */
    enum { MAXN = 257 };
    int64_t ids[MAXN];
    int slots[MAXN], first[MAXN], count[MAXN];
    if (world > MAXN) {
        snprintf(why, len, "nodes.world_size %d: at most %d ranks", world,
                 MAXN);
        return -1;
    }
    ids[0] = 0;
    slots[0] = d->devices > 1 ? d->devices : 1;
    int k = cluster_coord_nodes_slots(d->co, ids + 1, slots + 1, world - 1);
    if (k < 0) {
        snprintf(why, len, "nodes table: database error");
        return -1;
    }
    int have = 0, ones = 1;
    for (int i = 0; i <= k; i++) ones &= slots[i] == 1;
    int used = cluster_ranks_place(slots, k + 1, world, first, count, &have);
    if (!used) {
        if (ones)
            snprintf(why, len, "waiting for %d live nodes, have %d (this "
                     "coordinator and %d worker%s)", world, k + 1, k,
                     k == 1 ? "" : "s");
        else
            snprintf(why, len, "waiting for %d devices on live nodes, have "
                     "%d (this coordinator's %d and %d worker%s' %d)", world,
                     have, slots[0], k, k == 1 ? "" : "s", have - slots[0]);
        return 0;
    }
    /* this m6d's own row: its local ranks beyond rank 0 open the store as
     * a worker's do */
    node_row *rows;
    int nrows;
    if (state_nodes_list(d->st, &rows, &nrows) == 0) {
        for (int i = 0; i < nrows; i++)
            if (rows[i].coordinator) ids[0] = rows[i].id;
    } else {
        snprintf(why, len, "nodes table: database error");
        return -1;
    }
    if (count[0] > 1 && (!ids[0] || !d->local)) {
        free(rows);
        snprintf(why, len, "this coordinator's local ranks cannot run "
                 "(no row in its nodes table, or no rank threads)");
        return -1;
    }
    /* unique across this coordinator's lives: the store starts empty at
     * every start, and a worker may still hold an old assignment */
    int64_t gen = (int64_t)time(NULL) * 1000;
    if (gen <= d->gen) gen = d->gen + 1;
    d->gen = gen;
    char *json = spec_to_json(spec);
    if (!json) {
        free(rows);
        snprintf(why, len, "out of memory");
        return -1;
    }
    state_nodes_clear_run(d->st, id);
    for (int i = 1; i < used; i++) {
        int64_t nid = ids[i];
        int r = first[i], c = count[i];
        char host[256] = "?";
        state_node_set_ranks(d->st, nid, id, r, c);
        if (cluster_coord_assign_ranks(d->co, nid, id, json, r, c, world,
                                       gen, timeout_ms) < 0) {
            free(json);
            free(rows);
            snprintf(why, len, "out of memory");
            return -1;
        }
        for (int j = 0; j < nrows; j++)
            if (rows[j].id == nid)
                snprintf(host, sizeof host, "%s", rows[j].hostname);
        if (c > 1)
            state_event(d->st, id, "nodes.assign", "node=%lld hostname=%s "
                        "rank=%d ranks=%d-%d world_size=%d generation=%lld",
                        (long long)nid, host, r, r, r + c - 1, world,
                        (long long)gen);
        else
            state_event(d->st, id, "nodes.assign", "node=%lld hostname=%s "
                        "rank=%d world_size=%d generation=%lld",
                        (long long)nid, host, r, world, (long long)gen);
    }
    free(rows);
    /* m6ctl nodes: this m6d holds ranks 0..count[0]-1 */
    if (ids[0]) state_node_set_ranks(d->st, ids[0], id, 0, count[0]);
    if (count[0] > 1) {
        /* ranks 1..count[0]-1 on this m6d's own rank threads */
        cluster_coord_run_generation(d->co, id, gen);
        cluster_assign la = {.run_id = id, .spec = json, .rank = 1,
                             .world_size = world, .generation = gen,
                             .timeout_ms = timeout_ms,
                             .local_host = d->host,
                             .local_ranks = count[0] - 1};
        cluster_dp_assign(d->local, &la);
        state_event(d->st, id, "nodes.assign", "node=self rank=0 ranks=0-%d "
                    "world_size=%d generation=%lld", count[0] - 1, world,
                    (long long)gen);
    } else {
        state_event(d->st, id, "nodes.assign", "node=self rank=0 "
                    "world_size=%d generation=%lld", world, (long long)gen);
    }
    free(json);
    *gen_out = gen;
    *local_out = count[0];
    return 1;
}

void cluster_dp_coord_ungroup(void *ud, int64_t id)
{
    cluster_dp_coord *d = ud;
    state_nodes_clear_run(d->st, id);
}

int cluster_dp_coord_lost(void *ud, int64_t id, const run_spec *spec,
                          run_lost *out)
{
    cluster_dp_coord *d = ud;
    /* d->mu held: the coordinator is not detached and freed meanwhile
     * (cluster_dp_coord_attach waits, at most the wait) */
    pthread_mutex_lock(&d->mu);
    int rc = d->co ? cluster_coord_rank_lost(d->co, id,
                                             timeout_ms_(spec) / 2, out)
                   : 0;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* ---------------------------------------------------------- a worker node */

typedef struct {
    int64_t run, gen;
    char *spec;
    int rank, world, timeout_ms;
    int local, local_size;  /* its local rank and its node's ranks */
    char host[64];
} assignment;

/* One local rank: its thread and the assignment waiting for it. */
typedef struct {
    cluster_dp_worker *w;
    int local;          /* its local rank, 0..n-1 */
    pthread_t thread;
    int started;
    assignment next;    /* next.spec NULL: none */
} rank_slot;

struct cluster_dp_worker {
    char addr[300];
    const cluster_token *token;
    char state_dir[4096];
    int threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int n;              /* its rank threads */
    int first_local;    /* the first one's local rank (1 on the
                         * coordinator, whose runner is local rank 0) */
    rank_slot *slots;
};

/* Tell the coordinator that this rank failed: its store key
 * "failed/<rank>" holding the error, which the coordinator records as the
 * run's event nodes.rank_failed naming this node and local rank (the run
 * pauses when its collectives time out). Best effort: a coordinator it
 * cannot reach hears of it from the collectives alone. */
static void report_failed_(const cluster_dp_worker *w, const assignment *a,
                           const char *msg)
{
    m6_store st = {0};
    m6_store_who who;
    char werr[600];
    m6_err e = M6_ERR_NONE;
    if (m6_store_who_load(w->state_dir, a->rank, &who, werr, sizeof werr) < 0)
        return;
    int rc = m6_store_tcp_open(w->addr, w->token, &who, a->run, a->gen,
                               a->timeout_ms, &st, &e);
    OPENSSL_cleanse(&who, sizeof who);
    if (rc == 0) {
        char key[32];
        snprintf(key, sizeof key, "failed/%d", a->rank);
        st.set(st.ctx, key, msg, strlen(msg), &e);
        m6_store_tcp_close(&st);
    }
    m6_err_free(&e);
}

/* Test hook: M6_TEST_RANK_FAIL="RANK@STEP" fails rank RANK's thread (as a
 * trainer error would) at step STEP of every assignment. 1 to fail now. */
static int test_fail_(int rank, long step)
{
    const char *f = getenv("M6_TEST_RANK_FAIL");
    int r;
    long at;
    return f && sscanf(f, "%d@%ld", &r, &at) == 2 && r == rank && at == step;
}

/* Train one assignment until its last step or a failed collective. */
static void train_rank_(rank_slot *sl, const assignment *a)
{
    cluster_dp_worker *w = sl->w;
    char err[1024];
    char lr[32] = "";   /* the local rank, on a node that runs several */
    int several = w->first_local + w->n > 1;
    if (several) snprintf(lr, sizeof lr, " local_rank=%d", sl->local);
    run_spec spec;
    m6_err e = M6_ERR_NONE;
    trainer *t = NULL;
    m6_coll *g = NULL;
    rankboard_set(a->run, a->rank, sl->local, 0, RANK_GROUPING, NULL);
    if (spec_parse(&spec, a->spec, strlen(a->spec), err, sizeof err) < 0) {
        log_error("cluster.rank_failed", "run=%lld rank=%d%s err=\"spec: "
                  "%s\"", (long long)a->run, a->rank, lr, err);
        rankboard_set(a->run, a->rank, sl->local, 0, RANK_FAILED, err);
        return;
    }
    /* the hash is of the spec as rank 0 sent it: this node's thread count
     * is its own (every rank computes the same numbers with any) */
    char hash[65];
    cluster_dp_hash(&spec, NULL, a->world, hash);
    if (w->threads > 0) spec.device.threads = w->threads;
    spec.device.index = sl->local;  /* cuda: local rank r on GPU r */
    if (several)
        log_info("cluster.rank_threads", "run=%lld rank=%d local_rank=%d "
                 "threads=%d", (long long)a->run, a->rank, sl->local,
                 spec.device.threads);
    /* its collective calls tell the board how long they block */
    m6_coll_wait_clock(rankboard_wait_clock(sl->local));
    t = trainer_create(&spec, &e);
    if (!t) goto failed;
    g = group_(w->addr, w->token, w->state_dir, a->run, a->gen, a->rank,
               a->world, a->local, a->local_size,
               a->timeout_ms, a->host, t, &spec, hash, &e);
    if (!g) goto failed;
    if (trainer_set_collectives(t, g, &e) < 0) goto failed;
    log_info("cluster.rank", "run=%lld rank=%d world_size=%d step=%ld%s",
             (long long)a->run, a->rank, a->world, trainer_step_count(t), lr);
    /* where it stands, for m6ctl status: before each wait, and after
     * each step */
#define PUBLISH_(st, why) rankboard_set(a->run, a->rank, sl->local, \
                                        trainer_step_count(t), (st), (why))
    while (trainer_step_count(t) < spec.train.steps) {
        pthread_mutex_lock(&w->mu);
        int stop = w->stop || sl->next.spec;  /* a newer assignment */
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        /* split state (optimizer.shard, nodes.expert_parallel): rank 0
         * may want it whole here (a save, a delink): the boundary's
         * agreement, before every step */
        if (spec_state_split(&spec)) PUBLISH_(RANK_BOUNDARY, NULL);
        int rc = trainer_sync_boundary(t, 0, &e);
        step_result res;
        if (rc >= 0 && test_fail_(a->rank, trainer_step_count(t))) {
            m6_err_set(&e, M6_EINTERNAL, "test fault: M6_TEST_RANK_FAIL");
            goto failed;
        }
        if (rc >= 0) {
            PUBLISH_(RANK_TRAINING, NULL);
            rc = trainer_step(t, &res, &e);
            PUBLISH_(RANK_TRAINING, NULL);
        }
        if (rc == TRAINER_ECOLL)
            goto left;
        if ((rc == TRAINER_EDATA || rc == TRAINER_ENOFILE) &&
            spec_state_split(&spec)) {
            /* every rank failed the step alike (the ranks agree on it):
             * rank 0 pauses and saves, for which it gathers the split
             * state at the next boundary, then leaves the group */
            log_info("cluster.rank_data", "run=%lld rank=%d step=%ld "
                     "err=\"%s\"", (long long)a->run, a->rank,
                     trainer_step_count(t), m6_err_msg(&e));
            m6_err_free(&e);
            continue;
        }
        if (rc != 0) goto failed;
    }
    /* the last boundary: rank 0's final save may gather the state */
    if (trainer_step_count(t) >= spec.train.steps && spec_state_split(&spec))
        PUBLISH_(RANK_BOUNDARY, NULL);
    if (trainer_step_count(t) >= spec.train.steps &&
        trainer_sync_boundary(t, 0, &e) < 0)
        goto left;
    log_info("cluster.rank_done", "run=%lld rank=%d step=%ld%s",
             (long long)a->run, a->rank, trainer_step_count(t), lr);
    PUBLISH_(trainer_step_count(t) >= spec.train.steps ? RANK_DONE
                                                       : RANK_LEFT,
             trainer_step_count(t) >= spec.train.steps
                 ? NULL : "a newer assignment, or m6d stopping");
    goto done;
left:  /* rank 0 paused, delinked or stopped, or a rank died */
    {
        /* a worker cannot tell which from its side: the collective that
         * failed says only that a peer went; the coordinator's events and
         * status say why */
        char why[600];
        snprintf(why, sizeof why, "the group ended (rank 0 paused, "
                 "regrouped or stopped, or a rank was lost): %s",
                 m6_err_msg(&e));
        log_info("cluster.rank_left", "run=%lld rank=%d step=%ld%s "
                 "why=\"%s\"", (long long)a->run, a->rank,
                 trainer_step_count(t), lr, why);
        PUBLISH_(RANK_LEFT, why);
    }
    m6_err_free(&e);
#undef PUBLISH_
    goto done;
failed:
    log_error("cluster.rank_failed", "run=%lld rank=%d%s err=\"%s\"",
              (long long)a->run, a->rank, lr, m6_err_msg(&e));
    rankboard_set(a->run, a->rank, sl->local, t ? trainer_step_count(t) : 0,
                  RANK_FAILED, m6_err_msg(&e));
    if (g) {
        /* its collectives first, so that the others' fail at once */
        m6_err e2 = M6_ERR_NONE;
        trainer_set_collectives(t, NULL, &e2);
        m6_err_free(&e2);
        m6_coll_destroy(g);
        g = NULL;
    }
    report_failed_(w, a, m6_err_msg(&e));
    m6_err_free(&e);
done:
    if (t && g) {
        m6_err e2 = M6_ERR_NONE;
        trainer_set_collectives(t, NULL, &e2);
        m6_err_free(&e2);
    }
    m6_coll_destroy(g);
    trainer_free(t);
    m6_coll_wait_clock(NULL);
}

static void *slot_main_(void *arg)
{
    rank_slot *sl = arg;
    cluster_dp_worker *w = sl->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !sl->next.spec) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        assignment a = sl->next;
        sl->next.spec = NULL;
        pthread_mutex_unlock(&w->mu);
        train_rank_(sl, &a);
        free(a.spec);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cluster_dp_worker *cluster_dp_worker_start(const char *coord_addr,
                                           const cluster_token *token,
                                           const char *state_dir,
                                           int threads, int local_ranks,
                                           int first_local)
{
    cluster_dp_worker *w = calloc(1, sizeof *w);
    int n = local_ranks < 1 ? 1 : local_ranks;
    if (!w || !(w->slots = calloc((size_t)n, sizeof *w->slots))) {
        free(w);
        return NULL;
    }
    snprintf(w->state_dir, sizeof w->state_dir, "%s", state_dir);
    snprintf(w->addr, sizeof w->addr, "%s", coord_addr);
    w->token = token;
    w->threads = threads;
    w->n = n;
    w->first_local = first_local;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (int i = 0; i < n; i++) {
        w->slots[i].w = w;
        w->slots[i].local = first_local + i;
        if (threads_start(&w->slots[i].thread, slot_main_, &w->slots[i]) != 0) {
            cluster_dp_worker_stop(w);
            return NULL;
        }
        w->slots[i].started = 1;
    }
    return w;
}

void cluster_dp_assign(cluster_dp_worker *w, const cluster_assign *a)
{
    if (!w) return;
    int k = a->local_ranks > 0 ? a->local_ranks : 1;
    if (k > w->n) {
        /* the coordinator placed more ranks than this node runs: its
         * ranks past w->n never join, and the group times out */
        log_error("cluster.rank_failed", "run=%lld rank=%d err=\"assigned "
                  "%d local ranks, this m6d runs %d (--devices)\"",
                  (long long)a->run_id, a->rank, k, w->n);
        k = w->n;
    }
    for (int i = 0; i < k; i++) {
        char *spec = strdup(a->spec ? a->spec : "");
        if (!spec) {
            log_error("cluster.rank_failed", "run=%lld rank=%d err=\"out of "
                      "memory\"", (long long)a->run_id, a->rank + i);
            return;
        }
        rank_slot *sl = &w->slots[i];
        pthread_mutex_lock(&w->mu);
        free(sl->next.spec);
        sl->next = (assignment){.run = a->run_id, .gen = a->generation,
                                .spec = spec, .rank = a->rank + i,
                                .world = a->world_size,
                                .timeout_ms = a->timeout_ms > 0
                                                  ? a->timeout_ms : 30000,
                                .local = w->first_local + i,
                                .local_size = w->first_local + k};
        snprintf(sl->next.host, sizeof sl->next.host, "%s", a->local_host);
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void cluster_dp_worker_stop(cluster_dp_worker *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->n; i++) {
        if (w->slots[i].started) pthread_join(w->slots[i].thread, NULL);
        free(w->slots[i].next.spec);
    }
    free(w->slots);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
