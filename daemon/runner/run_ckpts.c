/*
 * run_ckpts.c — a run's checkpoints on disk and in m6.db (see run_ckpts.h).
 */
#include "runner/run_ckpts.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/paths.h"

/* ------------------------------------------------------------ entry names
 * The one owner of the names in a run's checkpoint directory:
 *   step-N          the checkpoint of step N (run_ckpts_save)
 *   step-N.bad      one set aside (run_ckpts_quarantine); step-N.bad-K,
 *                   K = 2, 3, ..., when that name is taken */

enum { NAME_OTHER_ = 0, NAME_STEP_ = 1, NAME_ASIDE_ = 2 };

/* What the entry name is: NAME_STEP_ (step-N, nothing after N),
 * NAME_ASIDE_ (step-N.bad or step-N.bad-K) with N into *step, else
 * NAME_OTHER_. */
static int name_kind_(const char *name, long long *step)
{
    int end = 0;
    if (sscanf(name, "step-%lld%n", step, &end) != 1 || end == 0)
        return NAME_OTHER_;
    const char *rest = name + end;
    if (!*rest)
        return NAME_STEP_;
    if (strncmp(rest, ".bad", 4) == 0 && (!rest[4] || rest[4] == '-'))
        return NAME_ASIDE_;
    return NAME_OTHER_;
}

/* buf = <dir>/step-<step> */
static void step_path_(char *buf, size_t len, const char *dir, long step)
{
    snprintf(buf, len, "%s/step-%ld", dir, step);
}

/* buf = the k-th name (k >= 1) for setting path (a step-N) aside */
static void aside_path_(char *buf, size_t len, const char *path, int k)
{
    if (k == 1)
        snprintf(buf, len, "%s.bad", path);
    else
        snprintf(buf, len, "%s.bad-%d", path, k);
}

/* ---------------------------------------------------------------- helpers */

static int rm_entry_(const char *path, const struct stat *sb, int flag,
                     struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) < 0 && errno != ENOENT)
        log_warn("fs.remove", "path=%s err=\"%s\"", path, strerror(errno));
    return 0;
}

static void rm_rf_(const char *path)
{
    nftw(path, rm_entry_, 16, FTW_DEPTH | FTW_PHYS);
}

/* Remove a complete checkpoint directory so that a crash half-way never
 * leaves a step-N directory that fails to load: renamed first to a
 * *.tmp-del-<pid> name (one rename: the step-N name is gone whole), which
 * the next start's reconcile removes if this one does not finish. */
static void discard_(const char *path)
{
    char tmp[8300];
    snprintf(tmp, sizeof tmp, "%s.tmp-del-%d", path, (int)getpid());
    if (rename(path, tmp) == 0)
        rm_rf_(tmp);
    else
        rm_rf_(path);
}

static long long du_total_;
static int du_entry_(const char *path, const struct stat *sb, int flag,
                     struct FTW *ftw)
{
    (void)path; (void)ftw;
    if (flag == FTW_F) du_total_ += sb->st_size;
    return 0;
}

static int64_t du_(const char *path)  /* only from the runner / init */
{
    du_total_ = 0;
    nftw(path, du_entry_, 16, FTW_PHYS);
    return du_total_;
}

int run_ckpts_on_disk(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* 1: a directory at p; 0: none (not there, or something else there); -1:
 * m6d may not look (EACCES, EIO...: errno), which is not gone. */
static int dir_state_(const char *p)
{
    struct stat sb;
    if (stat(p, &sb) == 0) return S_ISDIR(sb.st_mode);
    return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
}

void run_ckpts_dir(const run_ckpts *s, int64_t run, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%lld/checkpoints", s->runs_dir, (long long)run);
}

/* How many checkpoints of run are set aside (step-N.bad, step-N.bad-K in
 * its checkpoint directory); *newest: the name of the one of the highest
 * step ("" none). */
static int set_aside_(const run_ckpts *s, int64_t run, char *newest,
                      size_t len)
{
    char dir[4096];
    run_ckpts_dir(s, run, dir, sizeof dir);
    newest[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        if (name_kind_(e->d_name, &step) != NAME_ASIDE_)
            continue;
        n++;
        if (step > best) {
            best = step;
            snprintf(newest, len, "%s", e->d_name);
        }
    }
    closedir(d);
    return n;
}

/* Whether path names a step-N entry of run's checkpoint directory
 * (<runs_dir>/<run>/checkpoints/step-N, nothing after N): the only paths
 * run_ckpts removes or renames. A row of m6.db only says where its
 * checkpoint is, and m6.db has other writers (dashboards, an operator's
 * sqlite3): a row naming anything else must not make m6d delete it. */
static int in_dir_(const run_ckpts *s, int64_t run, const char *path)
{
    char dir[4096];
    run_ckpts_dir(s, run, dir, sizeof dir);
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) != 0 || path[n] != '/')
        return 0;
    const char *name = path + n + 1;
    long long step;
    return !strchr(name, '/') && name_kind_(name, &step) == NAME_STEP_;
}

/* A row naming a path outside the run's checkpoint directory (in_dir_):
 * said, and left on disk; the caller drops the row. */
static void outside_(const run_ckpts *s, int64_t run, const ckpt_row *r,
                     const char *action)
{
    log_warn("checkpoint.outside", "run=%lld step=%lld path=%s action=%s",
             (long long)run, (long long)r->step, r->path, action);
    state_event(s->st, run, "checkpoint.outside", "step=%lld names %s, "
                "outside the run's checkpoint directory: %s",
                (long long)r->step, r->path, action);
}

/* -------------------------------------------------------------- reconcile */

/* For one run: remove *.tmp-* leftovers of an interrupted trainer_save, add
 * complete step-N dirs the DB missed (crash between rename and insert).
 * A row whose directory is gone is kept for a run that may train again
 * (live: running or paused; run_ckpts_restore decides) and dropped, with an
 * event, for one that has ended. */
static void reconcile_run_(const run_ckpts *s, int64_t run, int live)
{
    char dir[4096];
    run_ckpts_dir(s, run, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char p[8192];
            long long step;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (strstr(e->d_name, ".tmp-")) {
                log_warn("checkpoint.stray", "run=%lld path=%s action=removed",
                         (long long)run, p);
                state_event(s->st, run, "checkpoint.stray", "removed %s",
                            e->d_name);
                rm_rf_(p);
            } else if (name_kind_(e->d_name, &step) == NAME_STEP_) {
                ckpt_row *rows;
                int n, found = 0;
                if (state_checkpoints_list(s->st, run, &rows, &n) == 0) {
                    for (int i = 0; i < n; i++) found |= rows[i].step == step;
                    free(rows);
                }
                if (!found) {
                    log_info("checkpoint.adopt", "run=%lld step=%lld",
                             (long long)run, step);
                    state_checkpoint_add(s->st, run, step, p, du_(p));
                }
            }
        }
        closedir(d);
    }
    ckpt_row *rows;
    int n;
    if (state_checkpoints_list(s->st, run, &rows, &n) == 0) {
        for (int i = 0; i < n; i++) {
            int ds = dir_state_(rows[i].path);
            if (ds == 0) {
                log_warn("checkpoint.missing", "run=%lld step=%lld path=%s "
                         "action=%s", (long long)run, (long long)rows[i].step,
                         rows[i].path, live ? "kept" : "row_dropped");
                if (!live) {
                    state_event(s->st, run, "checkpoint.missing", "step=%lld "
                                "%s is gone; the run has ended: its row is "
                                "dropped", (long long)rows[i].step,
                                rows[i].path);
                    state_checkpoint_delete(s->st, run, rows[i].step);
                }
            } else if (ds < 0) {
                log_warn("checkpoint.unreadable", "run=%lld step=%lld path=%s "
                         "err=\"%s\" action=kept", (long long)run,
                         (long long)rows[i].step, rows[i].path,
                         strerror(errno));
            }
        }
        free(rows);
    }
}

void run_ckpts_reconcile(const run_ckpts *s)
{
    run_row *runs;
    int n;
    if (state_run_list(s->st, &runs, &n) < 0) return;
    for (int i = 0; i < n; i++)
        reconcile_run_(s, runs[i].id, runs[i].state == RUN_RUNNING ||
                                          runs[i].state == RUN_PAUSED);
    run_rows_free(runs, n);
}

/* ------------------------------------------------------------- save, prune */

static void prune_(const run_ckpts *s, int64_t run, int keep)
{
    ckpt_row *rows;
    int n;
    if (state_checkpoints_list(s->st, run, &rows, &n) < 0) return;
    if (keep < 1) keep = 1;
    /* the newest keep that are there count; a row whose directory is gone
     * (deleted by hand, not yet back) keeps its row but not a place, so
     * it cannot leave the run with fewer than keep checkpoints on disk */
    int cut = 0, held = 0;  /* fewer than keep there: cut ends at 0 */
    for (int i = n - 1; i >= 0 && held < keep; i--) {
        held += in_dir_(s, run, rows[i].path) && run_ckpts_on_disk(rows[i].path);
        cut = i;
    }
    for (int i = 0; i < cut; i++) {
        if (in_dir_(s, run, rows[i].path))
            discard_(rows[i].path);
        else
            outside_(s, run, &rows[i], "row dropped, path not removed");
        state_checkpoint_delete(s->st, run, rows[i].step);
        log_debug("checkpoint.prune", "run=%lld step=%lld", (long long)run,
                  (long long)rows[i].step);
    }
    free(rows);
}

int run_ckpts_save(const run_ckpts *s, int64_t run, trainer *t, int keep,
                   const char *why, m6_err *err)
{
    long step = trainer_step_count(t);
    char dir[4096], path[4200];
    run_ckpts_dir(s, run, dir, sizeof dir);
    if (paths_mkdir_p(dir, 0755) < 0) {
        m6_err_set(err, M6_EINTERNAL, "checkpoint failed: %s: %s", dir,
                   strerror(errno));
        return -1;
    }
    step_path_(path, sizeof path, dir, step);
    if (run_ckpts_on_disk(path)) discard_(path);  /* stale, from a trajectory we left */
    long bytes = trainer_save(t, path, err);
    if (bytes < 0) {
        m6_err_prefix(err, "checkpoint failed");
        return -1;
    }
    if (state_checkpoint_add(s->st, run, step, path, bytes) < 0) {
        /* The directory is complete; the next start adopts it. Removing it
         * keeps this life's view (the DB list) and the disk the same. */
        char e[256];
        state_last_error(s->st, e, sizeof e);
        rm_rf_(path);
        m6_err_set(err, M6_EINTERNAL,
                   "checkpoint step %ld not recorded: state DB: %s", step, e);
        return -1;
    }
    state_event(s->st, run, "checkpoint", "step=%ld bytes=%ld why=%s", step,
                bytes, why);
    log_info("checkpoint.saved", "run=%lld step=%ld bytes=%ld why=%s",
             (long long)run, step, bytes, why);
    prune_(s, run, keep);
    return 0;
}

/* ---------------------------------------------------------------- restore */

void run_ckpts_quarantine(const char *path, char *kept, size_t keptlen)
{
    for (int k = 1; k < 100; k++) {
        char to[4200];
        aside_path_(to, sizeof to, path, k);
        if (access(to, F_OK) == 0)
            continue;
        if (rename(path, to) == 0) {
            snprintf(kept, keptlen, "%s", to);
            return;
        }
        break;
    }
    snprintf(kept, keptlen, "%s", path);
}

/* run_ckpts_restore's mark on its copy of a row whose directory is gone
 * (its bytes: never a size). */
enum { GONE_ = -1 };

/* The recorded checkpoints of run whose directory is gone (rows[0..n),
 * oldest first, marked GONE_), as m6_err code M6_ECKPTGONE into *lost: the
 * directory that holds them when it is gone whole, else each step's. */
static void gone_(const run_ckpts *s, int64_t run, const ckpt_row *rows,
                  int n, m6_err *lost)
{
    char dir[4096], steps[512] = "";
    run_ckpts_dir(s, run, dir, sizeof dir);
    int whole = dir_state_(dir) == 0, ng = 0;
    const char *newest = NULL;
    for (int i = 0; i < n; i++) {
        if (rows[i].bytes != GONE_) continue;
        size_t k = strlen(steps);
        snprintf(steps + k, sizeof steps - k, "%s%lld", ng ? ", " : "",
                 (long long)rows[i].step);
        newest = rows[i].path;
        ng++;
    }
    if (whole)
        m6_err_set(lost, M6_ECKPTGONE, "run %lld's checkpoint directory %s "
                   "is gone (it held the checkpoint%s of step %s); nothing "
                   "was dropped and the run does not start over by itself",
                   (long long)run, dir, ng > 1 ? "s" : "", steps);
    else
        m6_err_set(lost, M6_ECKPTGONE, "run %lld's checkpoint%s of step %s "
                   "%s gone (the newest was %s) and no older one loads; "
                   "nothing was dropped and the run does not start over by "
                   "itself", (long long)run, ng > 1 ? "s" : "", steps,
                   ng > 1 ? "are" : "is", newest);
}

/* The rows of run's checkpoints whose directory is gone, dropped at the
 * operator's word (resume --from-scratch): said in an event each. */
static void forget_gone_(const run_ckpts *s, int64_t run, const ckpt_row *rows,
                         int n)
{
    for (int i = 0; i < n; i++) {
        if (dir_state_(rows[i].path) != 0) continue;
        log_warn("checkpoint.forgotten", "run=%lld step=%lld path=%s",
                 (long long)run, (long long)rows[i].step, rows[i].path);
        state_event(s->st, run, "checkpoint.forgotten", "step=%lld %s is "
                    "gone; its row is dropped at the operator's word "
                    "(resume --from-scratch)", (long long)rows[i].step,
                    rows[i].path);
        state_checkpoint_delete(s->st, run, rows[i].step);
    }
}

int run_ckpts_restore(const run_ckpts *s, int64_t run, const run_spec *spec,
                      trainer **t, int *data_rc, long *step, int forget_gone,
                      m6_err *err, m6_err *lost)
{
    ckpt_row *rows;
    int n;
    *step = -1;
    m6_err_free(lost);
    m6_err newest = M6_ERR_NONE;  /* why the newest does not load */
    if (state_checkpoints_list(s->st, run, &rows, &n) < 0) n = 0, rows = NULL;
    if (forget_gone) {
        forget_gone_(s, run, rows, n);
        free(rows);
        if (state_checkpoints_list(s->st, run, &rows, &n) < 0)
            n = 0, rows = NULL;
    }
    int gone = 0;  /* rows whose directory is gone, newer than the loaded */
    for (int i = n - 1; i >= 0; i--) {
        char kept[4200];
        m6_err le = M6_ERR_NONE;
        if (dir_state_(rows[i].path) == 0) {
            gone++;  /* not there to load: not set aside, row kept */
            rows[i].bytes = GONE_;
            continue;
        }
        if (trainer_load(*t, rows[i].path, &le) == 0) {
            *step = trainer_step_count(*t);
            log_info("run.restore", "run=%lld step=%ld path=%s",
                     (long long)run, *step, rows[i].path);
            break;
        }
        if (in_dir_(s, run, rows[i].path)) {
            run_ckpts_quarantine(rows[i].path, kept, sizeof kept);
        } else {
            outside_(s, run, &rows[i], "row dropped, path not renamed");
            snprintf(kept, sizeof kept, "%s", rows[i].path);
        }
        log_warn("checkpoint.bad", "run=%lld path=%s err=\"%s\" "
                 "action=set_aside kept=%s", (long long)run, rows[i].path,
                 m6_err_msg(&le), kept);
        state_event(s->st, run, "checkpoint.bad", "step=%lld %s; kept as %s",
                    (long long)rows[i].step, m6_err_msg(&le), kept);
        if (i == n - 1) /* the newest: what the run has lost */
            m6_err_set(&newest, M6_ENOCKPT, "checkpoint of step %lld does not "
                       "load (%s; kept as %s)", (long long)rows[i].step,
                       m6_err_msg(&le), kept);
        m6_err_free(&le);
        state_checkpoint_delete(s->st, run, rows[i].step);
        /* A failed load may have half-filled the trainer: start afresh. */
        trainer_free(*t);
        *t = data_rc ? trainer_create_resumable(spec, data_rc, err)
                     : trainer_create(spec, err);
        if (!*t) {
            free(rows);
            m6_err_free(&newest);
            return -1;
        }
    }
    if (gone && *step < 0) {
        /* nothing older loads: paused, the rows kept for when the
         * directories are back */
        gone_(s, run, rows, n, lost);
        free(rows);
        m6_err_free(&newest);
        return 2;
    }
    for (int i = n - 1; gone && i >= 0 && rows[i].step > *step; i--) {
        /* an older one loads: the run goes on from it, as from a newest
         * that does not load (checkpoint.bad) */
        if (rows[i].bytes != GONE_) continue;
        log_warn("checkpoint.missing", "run=%lld step=%lld path=%s "
                 "action=resumes_from step=%ld", (long long)run,
                 (long long)rows[i].step, rows[i].path, *step);
        state_event(s->st, run, "checkpoint.missing", "step=%lld %s is gone; "
                    "the run goes on from the checkpoint of step %ld (the "
                    "steps after it are trained again)",
                    (long long)rows[i].step, rows[i].path, *step);
        state_checkpoint_delete(s->st, run, rows[i].step);
    }
    free(rows);
    if (*step < 0 && trainer_init_error(*t)) {
        /* nothing of its own loaded, and not its init.from either */
        m6_err_set(err, M6_EINVALID, "no checkpoint of run %lld loads, and "
                   "%s", (long long)run, trainer_init_error(*t));
        m6_err_free(&newest);
        trainer_free(*t);
        *t = NULL;
        return -1;
    }
    if (n > 0 && *step < 0) {
        /* what happened only; what the operator can do about it is the
         * edge's (M6_ENOCKPT) */
        m6_err_set(lost, M6_ENOCKPT, "no checkpoint of run %lld loads: %s, "
                   "nor does any older one", (long long)run,
                   m6_err_msg(&newest));
        m6_err_free(&newest);
        return 1;
    }
    char aside[512];
    int na;
    if (n == 0 && data_rc && !forget_gone &&
        (na = set_aside_(s, run, aside, sizeof aside)) > 0) {
        /* taken up again (an m6d restart) after every checkpoint failed
         * to load: still none to go on from, and starting over is the
         * operator's word (forget_gone), not a restart's */
        m6_err_set(lost, M6_ENOCKPT, "no checkpoint of run %lld loads: "
                   "every one it had was set aside (%d, the newest as %s)",
                   (long long)run, na, aside);
        m6_err_free(&newest);
        return 1;
    }
    m6_err_free(&newest); /* an older checkpoint loaded: the run goes on */
    return 0;
}
