/*
 * rank_procs.h — test helper for the data-parallel trainer tests (test_dp,
 * test_zero): ranks as processes of the test binary itself over Gloo on
 * loopback, a file store per run, the fortunes text as data.
 *
 * Each rank is `SELF rank SPEC OUT WORLD R STORE EXTRA...`: the test's
 * main hands argv to its rank function when argv[1] is "rank". The
 * directory, the binary and the failure count are the includer's
 * (rank_dir_, rank_self_, failures_, and CHECK to count one).
 */
#ifndef M6_TESTS_RANK_PROCS_H
#define M6_TESTS_RANK_PROCS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/corpus/corpus.h"
#include "dist/collectives.h"
#include "spec/spec.h"
#include "train/trainer.h"
#include "file_store.h"
#include "self_exe.h"

#define RANK_PROCS_FORTUNES "/usr/share/games/fortunes"
#define RANK_PROCS_MAX 8

static char rank_dir_[256];      /* the test's directory: specs, outputs */
static const char *rank_self_;   /* this binary */
static int failures_;

#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "FAIL: "); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures_++; } } \
    while (0)

/* The setup of a test without data: Gloo built in (else 77, skip),
 * rank_self_, a fresh /tmp/m6-NAME-XXXXXX as rank_dir_. 0, 77, or 1 with
 * the reason on stderr. */
static inline int rank_procs_setup_dir(const char *name)
{
    if (!m6_coll_available("gloo")) {
        printf("SKIP: m6 was built without Gloo\n");
        return 77;
    }
    rank_self_ = self_exe();
    if (!rank_self_)
        return 1;
    snprintf(rank_dir_, sizeof rank_dir_, "/tmp/m6-%s-XXXXXX", name);
    if (!mkdtemp(rank_dir_)) {
        perror("mkdtemp");
        return 1;
    }
    return 0;
}

/* The test's setup (rank_procs_setup_dir) with the fortunes text present
 * (else 77, saying so) and prepared into rank_dir_/data (5% val). 0, 77,
 * or 1 with the reason on stderr. */
static inline int rank_procs_setup(const char *name)
{
    struct stat sb;
    if (stat(RANK_PROCS_FORTUNES, &sb) != 0) {
        printf("SKIP: no %s (fortunes-min)\n", RANK_PROCS_FORTUNES);
        return 77;
    }
    int rc = rank_procs_setup_dir(name);
    if (rc != 0)
        return rc;
    char data[300], e[512];
    snprintf(data, sizeof data, "%s/data", rank_dir_);
    const char *in[1] = {RANK_PROCS_FORTUNES};
    prepare_stats ps;
    if (data_prepare(data, in, 1, 0.05, 0, &ps, NULL, NULL, e, sizeof e) != 0) {
        fprintf(stderr, "data prepare: %s\n", e);
        return 1;
    }
    return 0;
}

/* What a test binary's main returns while it is the parent. */
#define RANK_PROCS_PARENT (-1)

/* A test binary's entry. Called as "SELF rank ..." with rank_argc
 * arguments, it is one rank: returns rank_main's exit code. Otherwise it is
 * the parent: the setup (rank_procs_setup when with_data, else
 * rank_procs_setup_dir) runs, and RANK_PROCS_PARENT comes back when it
 * succeeded, else its 77 or 1 for main to return. */
static inline int rank_procs_enter(int argc, char **argv, int rank_argc,
                                   int (*rank_main)(int, char **),
                                   const char *name, int with_data)
{
    if (argc == rank_argc && strcmp(argv[1], "rank") == 0)
        return rank_main(argc, argv);
    int rc = with_data ? rank_procs_setup(name) : rank_procs_setup_dir(name);
    return rc != 0 ? rc : RANK_PROCS_PARENT;
}

/* One life of `world` ranks (world <= RANK_PROCS_MAX) of the spec
 * rank_dir_/SPEC_TAG.json, each writing rank_dir_/TAG-R.out, over a fresh
 * store rank_dir_/store-TAG (removed after), with extra[0..n_extra) after
 * the common arguments. Waits until every rank has exited; past limit_s
 * seconds (0: no limit) the ones left are killed and the life failed. A
 * rank that does not exit 0 fails it, except rank may_die (-1: none).
 * Counts a failure (CHECK) and returns 1 when it failed, else 0. */
static inline int rank_procs_run(const char *tag, const char *spec_tag,
                                 int world, const char *const *extra,
                                 int n_extra, double limit_s, int may_die)
{
    char spec[512], store[512], cmd[700];
    snprintf(spec, sizeof spec, "%s/%s.json", rank_dir_, spec_tag);
    snprintf(store, sizeof store, "%s/store-%s", rank_dir_, tag);
    mkdir(store, 0755);
    pid_t pids[RANK_PROCS_MAX];
    for (int r = 0; r < world; r++) {
        char out[512], ws[16], rs[16];
        snprintf(out, sizeof out, "%s/%s-%d.out", rank_dir_, tag, r);
        snprintf(ws, sizeof ws, "%d", world);
        snprintf(rs, sizeof rs, "%d", r);
        if ((pids[r] = fork()) == 0) {
            const char *argv[8 + 8];
            int a = 0;
            argv[a++] = rank_self_;
            argv[a++] = "rank";
            argv[a++] = spec;
            argv[a++] = out;
            argv[a++] = ws;
            argv[a++] = rs;
            argv[a++] = store;
            for (int i = 0; i < n_extra && i < 8; i++)
                argv[a++] = extra[i];
            argv[a] = NULL;
            execv(rank_self_, (char *const *)argv);
            _exit(127);
        }
    }
    int bad = 0, left = world, done[RANK_PROCS_MAX] = {0};
    double end = limit_s > 0 ? file_store_now_() + limit_s : 0;
    while (left > 0) {
        for (int r = 0; r < world; r++) {
            int status;
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            done[r] = 1;
            left--;
            if (r != may_die &&
                !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                fprintf(stderr, "%s: rank %d failed (status 0x%x)\n", tag, r,
                        status);
                bad = 1;
            }
        }
        if (left > 0 && end > 0 && file_store_now_() > end) {
            fprintf(stderr, "%s: ranks hung after %.0f s: killed\n", tag,
                    limit_s);
            for (int r = 0; r < world; r++)
                if (!done[r])
                    kill(pids[r], SIGKILL);
            bad = 1;
            end = file_store_now_() + 60;
        }
        if (left > 0)
            usleep(20000);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", store);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", store);
    CHECK(!bad, "%s: a rank failed", tag);
    return bad;
}

/* rank_dir_/TAG.json opened for writing with its first members written:
 * the name and the data (rank_dir_/data's shards); the caller writes the
 * rest (starting with a member, ending with the closing brace) and
 * closes it. NULL when it cannot be created (a CHECK counted). */
static inline FILE *rank_procs_spec(const char *tag, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", rank_dir_, tag);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot create %s", path);
    if (f)
        fprintf(f, "{\"name\": \"%s\",\n \"data\": {\"train\": "
                "\"%s/data/train_*.bin\", \"val\": \"%s/data/val_*.bin\"},\n",
                name, rank_dir_, rank_dir_);
    return f;
}

/* In a rank: the spec at spec_path into *spec and a trainer of it; NULL
 * with the reason on stderr (naming the rank). */
static inline trainer *rank_procs_trainer(const char *spec_path, int rank,
                                          run_spec *spec)
{
    char e[1024];
    if (spec_load_file(spec, spec_path, e, sizeof e) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, e);
        return NULL;
    }
    m6_err err = M6_ERR_NONE;
    trainer *t = trainer_create(spec, &err);
    if (!t)
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
    m6_err_free(&err);
    return t;
}

/* In a rank: the arguments rank_procs_run gives every rank (argv[2] the
 * spec, [3] the output file, [4] the world size, [5] the rank, [6] the
 * store directory; the test's own ones from argv[7]), its spec and a
 * trainer of it. */
typedef struct {
    const char *spec_path, *out_path, *store_dir;
    int world, rank;
    run_spec spec;
    trainer *t;
} rank_proc;

/* Fills *rp from argv and creates its trainer; -1 with the reason on
 * stderr (naming the rank). */
static inline int rank_proc_open(rank_proc *rp, char **argv)
{
    rp->spec_path = argv[2];
    rp->out_path = argv[3];
    rp->world = atoi(argv[4]);
    rp->rank = atoi(argv[5]);
    rp->store_dir = argv[6];
    rp->t = rank_procs_trainer(rp->spec_path, rp->rank, &rp->spec);
    return rp->t ? 0 : -1;
}

/* In a rank: its Gloo group on 127.0.0.1 over the file store in
 * store_dir (*fs and *st must outlive the group), keys under prefix;
 * NULL with the reason on stderr. */
static inline m6_coll *rank_procs_group(const char *store_dir,
                                        const char *prefix, int rank,
                                        int world, int timeout_ms,
                                        m6_store *st, file_store *fs)
{
    snprintf(fs->dir, sizeof fs->dir, "%s", store_dir);
    *st = file_store_table(fs);
    m6_coll_config cfg = {"gloo", rank, world, st, prefix, timeout_ms,
                          "127.0.0.1", 0};
    m6_err err = M6_ERR_NONE;
    m6_coll *c = m6_coll_init(&cfg, &err);
    if (!c)
        fprintf(stderr, "rank %d: %s\n", rank, m6_err_msg(&err));
    m6_err_free(&err);
    return c;
}

#endif /* M6_TESTS_RANK_PROCS_H */
