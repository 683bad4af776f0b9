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

/* Rendezvous as rank of world for (run, gen) through the store at addr:
 * the hash check, Gloo's group, rank 0's state on every rank. The group,
 * or NULL with err. */
static m6_coll *group_(const char *addr, const cluster_token *token,
                       const char *state_dir,
                       int64_t run, int64_t gen, int rank, int world,
                       int timeout_ms, const char *host, trainer *t,
                       const run_spec *spec, const char *hash, m6_err *err)
{
    char engine[16] = "gloo";
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
        if (!strcmp(verdict, "ok")) {
            char why[256];
            const char *e = grad_engine_(spec, why, sizeof why);
            if (!e)
                snprintf(verdict, sizeof verdict, "%s", why);
            else {
                snprintf(engine, sizeof engine, "%s", e);
                if (st.set(st.ctx, "engine", engine, strlen(engine), err) < 0)
                    goto out;
            }
        }
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
    int rc = trainer_broadcast_state(t, g, 0, err);
    if (rc != 0) {
        m6_err_prefix(err, "broadcasting rank 0's state");
        m6_coll_destroy(g);
        g = NULL;
        goto out;
    }
    if (!strcmp(engine, "nccl")) {
        /* the gradients' own group, of GPU 0 of this node: the trainer
         * owns it (trainer_adopt_grad_group) */
        char np[80];
        snprintf(np, sizeof np, "%s/nccl", prefix);
        m6_coll_config nc = {.backend = "nccl", .rank = rank,
                             .world_size = world, .store = &st,
                             .prefix = np, .timeout_ms = timeout_ms,
                             .device = 0};
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
                   int world, int timeout_ms, int64_t *gen_out, char *why,
                   size_t len);

int cluster_dp_coord_group(void *ud, int64_t id, const run_spec *spec,
                           trainer *t, int world, m6_coll **out, char *why,
                           size_t len)
{
    cluster_dp_coord *d = ud;
    *out = NULL;
    int timeout_ms = spec->nodes.timeout > 0 ? spec->nodes.timeout * 1000
                                             : 30000;
    int64_t gen = 0;
    pthread_mutex_lock(&d->mu);
    int rc = assign_(d, id, spec, world, timeout_ms, &gen, why, len);
    pthread_mutex_unlock(&d->mu);
    if (rc != 1) return rc;
    char hash[65];
    cluster_dp_hash(spec, t, world, hash);
    m6_err e = M6_ERR_NONE;
    m6_coll *g = group_(d->store_addr, d->token, d->state_dir, id, gen, 0,
                        world,
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
                   int world, int timeout_ms, int64_t *gen_out, char *why,
                   size_t len)
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
    int64_t ids[256];
    if (world - 1 > 256) {
        snprintf(why, len, "nodes.world_size %d: at most 257 ranks", world);
        return -1;
    }
    int k = cluster_coord_nodes_fit(d->co, 0, ids, world - 1);
    if (k < 0) {
        snprintf(why, len, "nodes table: database error");
        return -1;
    }
    if (k < world - 1) {
        snprintf(why, len, "waiting for %d live nodes, have %d (this "
                 "coordinator and %d worker%s)", world, k + 1, k,
                 k == 1 ? "" : "s");
        return 0;
    }
    /* unique across this coordinator's lives: the store starts empty at
     * every start, and a worker may still hold an old assignment */
    int64_t gen = (int64_t)time(NULL) * 1000;
    if (gen <= d->gen) gen = d->gen + 1;
    d->gen = gen;
    char *json = spec_to_json(spec);
    if (!json) {
        snprintf(why, len, "out of memory");
        return -1;
    }
    state_nodes_clear_run(d->st, id);
    for (int r = 1; r < world; r++) {
        char host[256] = "?";
        state_node_set_run(d->st, ids[r - 1], id, r);
        if (cluster_coord_assign(d->co, ids[r - 1], id, json, r, world, gen,
                                 timeout_ms) < 0) {
            free(json);
            snprintf(why, len, "out of memory");
            return -1;
        }
        int64_t nid = ids[r - 1];
        node_row *rows;
        int n;
        if (state_nodes_list(d->st, &rows, &n) == 0) {
            for (int i = 0; i < n; i++)
                if (rows[i].id == nid)
                    snprintf(host, sizeof host, "%s", rows[i].hostname);
            free(rows);
        }
        state_event(d->st, id, "nodes.assign", "node=%lld hostname=%s "
                    "rank=%d world_size=%d generation=%lld", (long long)nid,
                    host, r, world, (long long)gen);
    }
    free(json);
    state_event(d->st, id, "nodes.assign", "node=self rank=0 world_size=%d "
                "generation=%lld", world, (long long)gen);
    *gen_out = gen;
    return 1;
}

void cluster_dp_coord_ungroup(void *ud, int64_t id)
{
    cluster_dp_coord *d = ud;
    state_nodes_clear_run(d->st, id);
}

/* ---------------------------------------------------------- a worker node */

typedef struct {
    int64_t run, gen;
    char *spec;
    int rank, world, timeout_ms;
    char host[64];
} assignment;

struct cluster_dp_worker {
    char addr[300];
    const cluster_token *token;
    char state_dir[4096];
    int threads;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    assignment next;   /* next.spec NULL: none */
};

/* Train one assignment until its last step or a failed collective. */
static void train_rank_(cluster_dp_worker *w, const assignment *a)
{
    char err[1024];
    run_spec spec;
    m6_err e = M6_ERR_NONE;
    trainer *t = NULL;
    m6_coll *g = NULL;
    if (spec_parse(&spec, a->spec, strlen(a->spec), err, sizeof err) < 0) {
        log_error("cluster.rank_failed", "run=%lld rank=%d err=\"spec: %s\"",
                  (long long)a->run, a->rank, err);
        return;
    }
    if (w->threads > 0) spec.device.threads = w->threads;
    t = trainer_create(&spec, &e);
    if (!t) goto failed;
    char hash[65];
    /* the real phase's share map when rank 0 delinked already: the
     * broadcast reslots; the hash is of the phase the run starts in */
    cluster_dp_hash(&spec, t, a->world, hash);
    g = group_(w->addr, w->token, w->state_dir, a->run, a->gen, a->rank,
               a->world,
               a->timeout_ms, a->host, t, &spec, hash, &e);
    if (!g) goto failed;
    if (trainer_set_collectives(t, g, &e) < 0) goto failed;
    log_info("cluster.rank", "run=%lld rank=%d world_size=%d step=%ld",
             (long long)a->run, a->rank, a->world, trainer_step_count(t));
    while (trainer_step_count(t) < spec.train.steps) {
        pthread_mutex_lock(&w->mu);
        int stop = w->stop || w->next.spec;  /* a newer assignment */
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        /* optimizer.shard: rank 0 may want the state whole here (a save,
         * a delink): the boundary's agreement, before every step */
        int rc = trainer_sync_boundary(t, 0, &e);
        step_result res;
        if (rc >= 0) rc = trainer_step(t, &res, &e);
        if (rc == TRAINER_ECOLL) {
            /* rank 0 paused, delinked or stopped, or a rank died */
            log_info("cluster.rank_left", "run=%lld rank=%d step=%ld "
                     "why=\"%s\"", (long long)a->run, a->rank,
                     trainer_step_count(t), m6_err_msg(&e));
            m6_err_free(&e);
            goto done;
        }
        if ((rc == TRAINER_EDATA || rc == TRAINER_ENOFILE) &&
            spec.optimizer.shard) {
            /* every rank failed the step alike (the ranks agree on it):
             * rank 0 pauses and saves, for which it gathers the sharded
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
    if (trainer_step_count(t) >= spec.train.steps &&
        trainer_sync_boundary(t, 0, &e) < 0) {
        log_info("cluster.rank_left", "run=%lld rank=%d step=%ld "
                 "why=\"%s\"", (long long)a->run, a->rank,
                 trainer_step_count(t), m6_err_msg(&e));
        m6_err_free(&e);
        goto done;
    }
    log_info("cluster.rank_done", "run=%lld rank=%d step=%ld",
             (long long)a->run, a->rank, trainer_step_count(t));
    goto done;
failed:
    log_error("cluster.rank_failed", "run=%lld rank=%d err=\"%s\"",
              (long long)a->run, a->rank, m6_err_msg(&e));
    m6_err_free(&e);
done:
    if (t && g) {
        m6_err e2 = M6_ERR_NONE;
        trainer_set_collectives(t, NULL, &e2);
        m6_err_free(&e2);
    }
    m6_coll_destroy(g);
    trainer_free(t);
}

static void *worker_main_(void *arg)
{
    cluster_dp_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !w->next.spec) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        assignment a = w->next;
        w->next.spec = NULL;
        pthread_mutex_unlock(&w->mu);
        train_rank_(w, &a);
        free(a.spec);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cluster_dp_worker *cluster_dp_worker_start(const char *coord_addr,
                                           const cluster_token *token,
                                           const char *state_dir,
                                           int threads)
{
    cluster_dp_worker *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    snprintf(w->state_dir, sizeof w->state_dir, "%s", state_dir);
    snprintf(w->addr, sizeof w->addr, "%s", coord_addr);
    w->token = token;
    w->threads = threads;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (threads_start(&w->thread, worker_main_, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

void cluster_dp_assign(cluster_dp_worker *w, const cluster_assign *a)
{
    if (!w) return;
    char *spec = strdup(a->spec ? a->spec : "");
    if (!spec) {
        log_error("cluster.rank_failed", "run=%lld rank=%d err=\"out of "
                  "memory\"", (long long)a->run_id, a->rank);
        return;
    }
    pthread_mutex_lock(&w->mu);
    free(w->next.spec);
    w->next = (assignment){.run = a->run_id, .gen = a->generation,
                           .spec = spec, .rank = a->rank,
                           .world = a->world_size,
                           .timeout_ms = a->timeout_ms > 0 ? a->timeout_ms
                                                           : 30000};
    snprintf(w->next.host, sizeof w->next.host, "%s", a->local_host);
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
    pthread_join(w->thread, NULL);
    free(w->next.spec);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
