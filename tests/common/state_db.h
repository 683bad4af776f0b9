/*
 * state_db.h — the m6.db files of the state tests (test_state,
 * test_run_state): a fresh path per test process, opening it with the test
 * failing on error, and removing the database with its WAL and shared-
 * memory files. Include after cmocka.h and state/state.h.
 */
#ifndef M6_TESTS_STATE_DB_H
#define M6_TESTS_STATE_DB_H

#include <stdio.h>
#include <unistd.h>

/* Remove the database at path and its -wal and -shm files (those missing
 * are no error). */
static inline void state_db_remove(const char *path)
{
    char p[600];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

/* A fresh database path for this process in path (len bytes):
 * /tmp/m6-test-TAG-PID.db, any earlier one removed. */
static inline void state_db_path(char *path, size_t len, const char *tag)
{
    snprintf(path, len, "/tmp/m6-test-%s-%d.db", tag, (int)getpid());
    state_db_remove(path);
}

/* state_open of path; fails the test with state_open's error when it
 * cannot. */
static inline state *state_db_open(const char *path)
{
    char err[256] = "";
    state *st = state_open(path, err, sizeof err);
    if (!st)
        fail_msg("state_open %s: %s", path, err);
    return st;
}

#endif /* M6_TESTS_STATE_DB_H */
