/*
 * test_state.c — the SQLite state module: migrations (idempotent, recorded
 * in user_version, WAL), runs/metrics/phases/events/checkpoints CRUD,
 * the offload columns of schema 0002 on a fresh and an upgraded database.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "state/schema.h"
#include "state/state.h"
#include "../common/test_main.h"
#include "../common/state_db.h"

static char dbpath[256];

static int setup(void **st)
{
    (void)st;
    state_db_path(dbpath, sizeof dbpath, "state");
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    state_db_remove(dbpath);
    return 0;
}

static void test_migrations(void **s)
{
    (void)s;
    char err[256];
    state *st = state_db_open(dbpath);
    assert_int_equal(state_user_version(st), schema_n_migrations);
    state_close(st);
    /* again: nothing to apply, same version, data kept */
    st = state_db_open(dbpath);
    assert_int_equal(state_user_version(st), schema_n_migrations);
    assert_true(state_run_insert(st, "x", "{}", 10, 0, NULL) > 0);
    state_close(st);
    st = state_open(dbpath, err, sizeof err);
    run_row *rows;
    int n;
    assert_int_equal(state_run_list(st, &rows, &n), 0);
    assert_int_equal(n, 1);
    free(rows);
    state_close(st);

    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    sqlite3_stmt *q;
    sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &q, NULL);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0), "wal");
    sqlite3_finalize(q);
    /* a newer schema than this binary knows is refused */
    sqlite3_exec(db, "PRAGMA user_version = 999", NULL, NULL, NULL);
    sqlite3_close(db);
    st = state_open(dbpath, err, sizeof err);
    assert_null(st);
    assert_non_null(strstr(err, "newer"));
}

/* A database with a page overwritten is refused at open, with a message
 * naming the file and saying it is damaged (a fresh-eyes test found m6d
 * serving a damaged m6.db). */
static void test_damaged_refused(void **s)
{
    (void)s;
    char err[1024], spec[2048];
    memset(spec, 'x', sizeof spec - 1);
    spec[sizeof spec - 1] = 0;
    state *st = state_db_open(dbpath);
    for (int i = 0; i < 100; i++) /* some 50 pages of runs */
        assert_true(state_run_insert(st, "x", spec, 10, 0, NULL) > 0);
    state_close(st); /* the last connection: the WAL goes into the file */
    st = state_open(dbpath, err, sizeof err); /* intact: opens */
    assert_non_null(st);
    state_close(st);
    FILE *f = fopen(dbpath, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    assert_true(size > 16 * 4096);
    char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(i * 131 + 7);
    fseek(f, size / 2 / 4096 * 4096, SEEK_SET); /* a page in the middle */
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    st = state_open(dbpath, err, sizeof err);
    printf("    %s\n", err);
    assert_null(st);
    assert_non_null(strstr(err, dbpath));
    assert_non_null(strstr(err, "damaged"));

    /* cut short (a disk that filled, a bad copy): the salvage hint too */
    assert_int_equal(truncate(dbpath, 30 * 4096 + 100), 0);
    st = state_open(dbpath, err, sizeof err);
    printf("    %s\n", err);
    assert_null(st);
    assert_non_null(strstr(err, dbpath));
    assert_non_null(strstr(err, ".recover"));
}

static void test_runs_crud(void **s)
{
    (void)s;
    state *st = state_db_open(dbpath);
    int64_t a = state_run_insert(st, "alpha", "{\"a\":1}", 60, 0, NULL);
    int64_t b = state_run_insert(st, "", "{}", 30, 1, NULL);
    assert_true(a > 0 && b > a);
    run_row r;
    assert_int_equal(state_run_get(st, b, &r), 0);
    assert_string_equal(r.name, "run-2");
    assert_int_equal(r.state, RUN_QUEUED);
    assert_int_equal(r.phase, 1);
    run_row_clear(&r);
    assert_int_equal(state_run_get(st, 99, &r), 1);

    int64_t id;
    char ids_[64], want[64];
    assert_int_equal(state_run_find_name(st, "alpha", &id, ids_, sizeof ids_), 0);
    assert_int_equal(id, a);
    assert_int_equal(state_run_find_name(st, "nope", &id, ids_, sizeof ids_), 1);
    int64_t a2 = state_run_insert(st, "alpha", "{}", 1, 0, NULL);
    assert_int_equal(state_run_find_name(st, "alpha", &id, ids_, sizeof ids_), 2); /* 2 live */
    snprintf(want, sizeof want, "%lld, %lld", (long long)a, (long long)a2);
    assert_string_equal(ids_, want);  /* both, for the refusal */
    /* the name finds the one live run among ended ones (a spec submitted
     * again after its run was stopped), whichever is newer */
    assert_int_equal(state_run_set_state(st, a2, RUN_STOPPED, NULL), 0);
    id = 0;
    assert_int_equal(state_run_find_name(st, "alpha", &id, ids_, sizeof ids_), 0);
    assert_int_equal(id, a);
    int64_t a3 = state_run_insert(st, "alpha", "{}", 1, 0, NULL);
    assert_int_equal(state_run_set_state(st, a, RUN_COMPLETED, NULL), 0);
    assert_int_equal(state_run_set_state(st, a3, RUN_PAUSED, NULL), 0);
    assert_int_equal(state_run_find_name(st, "alpha", &id, ids_, sizeof ids_), 0);
    assert_int_equal(id, a3);
    /* no live one, several ended: ambiguous */
    assert_int_equal(state_run_set_state(st, a3, RUN_FAILED, "x"), 0);
    assert_int_equal(state_run_find_name(st, "alpha", &id, ids_, sizeof ids_), 2);
    snprintf(want, sizeof want, "%lld, %lld, %lld", (long long)a,
             (long long)a2, (long long)a3);
    assert_string_equal(ids_, want);
    assert_int_equal(state_run_set_state(st, a2, RUN_QUEUED, NULL), 0);

    assert_int_equal(state_run_set_state(st, a, RUN_FAILED, "boom"), 0);
    assert_int_equal(state_run_get(st, a, &r), 0);
    assert_int_equal(r.state, RUN_FAILED);
    assert_string_equal(r.error, "boom");
    assert_string_equal(r.spec, "{\"a\":1}");
    run_row_clear(&r);
    assert_int_equal(state_run_set_state(st, 12345, RUN_FAILED, NULL), 1);

    int64_t *ids;
    int n;
    assert_int_equal(state_run_ids(st, RUN_QUEUED, &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_true(ids[0] < ids[1]);
    free(ids);
    /* more than fit: cut, and said to be */
    char few[32];
    int64_t first = state_run_insert(st, "many", "{}", 1, 0, NULL);
    for (int i = 0; i < 9; i++) state_run_insert(st, "many", "{}", 1, 0, NULL);
    assert_int_equal(state_run_find_name(st, "many", &id, few, sizeof few), 2);
    snprintf(want, sizeof want, "%lld, ", (long long)first);
    assert_memory_equal(few, want, strlen(want));
    assert_non_null(strstr(few, ", ..."));
    assert_true(strlen(few) < sizeof few);
    state_close(st);
}

static void test_metrics_phases_checkpoints(void **s)
{
    (void)s;
    char err[256];
    state *st = state_open(dbpath, err, sizeof err);
    int64_t a = state_run_insert(st, "m", "{}", 10, 0, NULL);
    for (int i = 1; i <= 10; i++) {
        metric_row m = {.step = i, .phase = i > 5, .train_loss = 1.0 / i,
                        .val_loss = i % 5 ? NAN : 2.0 / i, .lr = 1e-3,
                        .tokens_per_s = 100, .grad_norm = 0.5};
        assert_int_equal(state_record_step(st, a, &m), 0);
    }
    run_row r;
    state_run_get(st, a, &r);
    assert_int_equal(r.step, 10);
    assert_int_equal(r.phase, 1);
    run_row_clear(&r);
    metric_row last;
    double lv;
    assert_int_equal(state_metric_last(st, a, &last, &lv), 0);
    assert_int_equal(last.step, 10);
    assert_true(lv == 2.0 / 10);
    assert_int_equal(state_metrics_truncate(st, a, 6), 4);
    metric_row *rows;
    int n;
    assert_int_equal(state_metrics_list(st, a, 0, &rows, &n), 0);
    assert_int_equal(n, 6);
    assert_true(isnan(rows[0].val_loss));
    assert_true(rows[0].train_loss == 1.0);  /* bitwise */
    assert_int_equal(rows[5].phase, 1);
    free(rows);

    int64_t from;
    assert_int_equal(state_phase_get(st, a, 1, &from), 1);
    state_phase_set(st, a, 0, 0);
    state_phase_set(st, a, 1, 5);
    assert_int_equal(state_phase_get(st, a, 1, &from), 0);
    assert_int_equal(from, 5);
    state_phase_delete(st, a, 1);
    assert_int_equal(state_phase_get(st, a, 1, &from), 1);

    assert_int_equal(state_event(st, a, "delink", "step=%d", 5), 0);
    assert_int_equal(state_event(st, 0, "daemon", "start"), 0);

    state_checkpoint_add(st, a, 20, "/x/step-20", 100);
    state_checkpoint_add(st, a, 10, "/x/step-10", 100);
    ckpt_row *ck;
    assert_int_equal(state_checkpoints_list(st, a, &ck, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ck[0].step, 10);
    assert_string_equal(ck[1].path, "/x/step-20");
    free(ck);
    state_checkpoint_delete(st, a, 10);
    state_checkpoints_list(st, a, &ck, &n);
    assert_int_equal(n, 1);
    free(ck);
    state_close(st);
}

/* Schema 0002: the offload columns round-trip, unknown (-1 / NaN) is NULL,
 * and a version-1 database with rows is upgraded in place, its old rows
 * reading back as not recorded. */
static void test_offload_columns(void **s)
{
    (void)s;
    /* A database left by an m6d that knew only 0001, with one metrics row. */
    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    assert_true(schema_n_migrations >= 2);
    assert_string_equal(schema_migrations[1].name, "0002_offload_metrics.sql");
    assert_int_equal(sqlite3_exec(db, schema_migrations[0].sql, NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
        "PRAGMA user_version = 1;"
        "INSERT INTO runs(name, spec, total_steps, created, updated) "
        "VALUES ('old', '{}', 5, 0, 0);"
        "INSERT INTO metrics(run, step, phase, train_loss) "
        "VALUES (1, 1, 'pseudo', 2.5);", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    state *st = state_db_open(dbpath);
    assert_int_equal(state_user_version(st), schema_n_migrations);
    metric_row m = {.step = 2, .phase = 1, .train_loss = 2.25, .val_loss = NAN,
                    .lr = 1e-3, .tokens_per_s = 10, .grad_norm = 1,
                    .resident_slots = 1, .offloaded_slots = 5,
                    .peak_device_bytes = 3043328, .h2d_gbps = 17.5,
                    .d2h_gbps = 14.25, .copy_hidden_fraction = 0.875};
    assert_int_equal(state_record_step(st, 1, &m), 0);
    metric_row u = {.step = 3, .phase = 1, .train_loss = 2, .val_loss = NAN,
                    .lr = 1e-3, .tokens_per_s = 10, .grad_norm = 1,
                    .resident_slots = 6, .offloaded_slots = 0,
                    .peak_device_bytes = -1, .h2d_gbps = NAN, .d2h_gbps = NAN,
                    .copy_hidden_fraction = NAN};
    assert_int_equal(state_record_step(st, 1, &u), 0);

    metric_row *rows;
    int n;
    assert_int_equal(state_metrics_list(st, 1, 0, &rows, &n), 0);
    assert_int_equal(n, 3);
    /* the pre-0002 row: not recorded */
    assert_true(rows[0].train_loss == 2.5);
    assert_int_equal(rows[0].resident_slots, -1);
    assert_int_equal(rows[0].offloaded_slots, -1);
    assert_int_equal(rows[0].peak_device_bytes, -1);
    assert_true(isnan(rows[0].h2d_gbps) && isnan(rows[0].d2h_gbps));
    assert_true(isnan(rows[0].copy_hidden_fraction));
    /* a recorded row, exactly */
    assert_int_equal(rows[1].resident_slots, 1);
    assert_int_equal(rows[1].offloaded_slots, 5);
    assert_int_equal(rows[1].peak_device_bytes, 3043328);
    assert_true(rows[1].h2d_gbps == 17.5 && rows[1].d2h_gbps == 14.25);
    assert_true(rows[1].copy_hidden_fraction == 0.875);
    /* unknowns stored as NULL */
    assert_int_equal(rows[2].offloaded_slots, 0);
    assert_int_equal(rows[2].peak_device_bytes, -1);
    assert_true(isnan(rows[2].h2d_gbps) && isnan(rows[2].copy_hidden_fraction));
    free(rows);

    metric_row last;
    double lv;
    assert_int_equal(state_metric_last(st, 1, &last, &lv), 0);
    assert_int_equal(last.step, 3);
    assert_int_equal(last.resident_slots, 6);

    /* schema 0005: an MoE row's router figures exactly; the older rows
     * (written before it, or dense) read back NULL */
    metric_row e = u;
    e.step = 4;
    e.h2d_gbps = 1; /* not among the NULL h2d rows counted below */
    e.moe_aux_loss = 1.125;
    e.moe_z_loss = 0.5;
    e.moe_dropped_fraction = 0.0625;
    e.moe_load_min = 3;
    e.moe_load_max = 40;
    e.moe_load_cv = 0.25;
    e.moe_experts_empty = 1.5;
    assert_int_equal(state_record_step(st, 1, &e), 0);
    metric_row d = u;
    d.step = 5;
    d.h2d_gbps = 1;
    d.moe_aux_loss = d.moe_z_loss = d.moe_dropped_fraction = NAN;
    d.moe_load_min = d.moe_load_max = d.moe_load_cv = NAN;
    d.moe_experts_empty = NAN;
    assert_int_equal(state_record_step(st, 1, &d), 0);
    assert_int_equal(state_metrics_list(st, 1, 0, &rows, &n), 0);
    assert_int_equal(n, 5);
    assert_true(isnan(rows[0].moe_aux_loss) && isnan(rows[0].moe_experts_empty));
    assert_true(rows[3].moe_aux_loss == 1.125 && rows[3].moe_z_loss == 0.5);
    assert_true(rows[3].moe_dropped_fraction == 0.0625);
    assert_true(rows[3].moe_load_min == 3 && rows[3].moe_load_max == 40);
    assert_true(rows[3].moe_load_cv == 0.25 && rows[3].moe_experts_empty == 1.5);
    assert_true(isnan(rows[4].moe_aux_loss) && isnan(rows[4].moe_load_cv));
    free(rows);

    /* schema 0014: the whole step's per-expert counts exactly (an idle
     * count of 0 is a count), -1 (NULL) for a dense row and for the row
     * written before the migration */
    metric_row w = e;
    w.step = 6;
    w.moe_step_tokens_min = 0;
    w.moe_step_tokens_max = 3000000000LL; /* beyond 32 bits */
    w.moe_step_experts_empty = 3;
    w.moe_step_dropped = 17;
    w.moe_experts_idle = 0;
    assert_int_equal(state_record_step(st, 1, &w), 0);
    d.step = 7;
    d.moe_step_tokens_min = d.moe_step_tokens_max = -1;
    d.moe_step_experts_empty = d.moe_step_dropped = d.moe_experts_idle = -1;
    assert_int_equal(state_record_step(st, 1, &d), 0);
    assert_int_equal(state_metrics_list(st, 1, 5, &rows, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(rows[0].moe_step_tokens_min, 0);
    assert_true(rows[0].moe_step_tokens_max == 3000000000LL);
    assert_int_equal(rows[0].moe_step_experts_empty, 3);
    assert_int_equal(rows[0].moe_step_dropped, 17);
    assert_int_equal(rows[0].moe_experts_idle, 0);
    assert_true(rows[0].moe_aux_loss == 1.125 && rows[0].moe_load_max == 40);
    assert_int_equal(rows[1].moe_step_tokens_min, -1);
    assert_int_equal(rows[1].moe_step_tokens_max, -1);
    assert_int_equal(rows[1].moe_step_experts_empty, -1);
    assert_int_equal(rows[1].moe_step_dropped, -1);
    assert_int_equal(rows[1].moe_experts_idle, -1);
    free(rows);
    assert_int_equal(state_metrics_list(st, 1, 0, &rows, &n), 0);
    assert_int_equal(rows[0].moe_step_tokens_max, -1);  /* the v1 row */
    assert_int_equal(rows[0].moe_experts_idle, -1);
    free(rows);
    state_close(st);

    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    sqlite3_stmt *q;
    sqlite3_prepare_v2(db, "SELECT count(*) FROM metrics WHERE h2d_gbps IS NULL",
                       -1, &q, NULL);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 2);
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* Schema 0004: runs.delink_step, filled at the migration from the phases
 * table only for runs that really delinked (a pseudo row, then a real
 * one); a from-scratch run (a real row alone) and a pseudo run get NULL,
 * read back as -1; state_run_set_delink writes it and -1 clears it. */
static void test_delink_step_column(void **s)
{
    (void)s;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    assert_true(schema_n_migrations >= 4);
    assert_string_equal(schema_migrations[3].name, "0004_runs_delink_step.sql");
    for (int i = 0; i < 3; i++)
        assert_int_equal(sqlite3_exec(db, schema_migrations[i].sql, NULL, NULL,
                                      NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
        "PRAGMA user_version = 3;"
        "INSERT INTO runs(name, spec, phase, total_steps, created, updated) "
        "VALUES ('delinked', '{}', 'real', 100, 0, 0),"
        "       ('scratch', '{}', 'real', 100, 0, 0),"
        "       ('pseudo', '{}', 'pseudo', 100, 0, 0);"
        "INSERT INTO phases(run, phase, from_step, at) VALUES"
        " (1, 'pseudo', 0, 0), (1, 'real', 40, 0),"
        " (2, 'real', 0, 0), (3, 'pseudo', 0, 0);", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);

    state *st = state_db_open(dbpath);
    run_row r;
    assert_int_equal(state_run_get(st, 1, &r), 0);
    assert_int_equal(r.delink_step, 40);
    run_row_clear(&r);
    assert_int_equal(state_run_get(st, 2, &r), 0);
    assert_int_equal(r.delink_step, -1);
    run_row_clear(&r);
    assert_int_equal(state_run_get(st, 3, &r), 0);
    assert_int_equal(r.delink_step, -1);
    run_row_clear(&r);
    run_row *rows;
    int n;
    assert_int_equal(state_run_list(st, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].delink_step, 40);
    assert_int_equal(rows[1].delink_step, -1);
    free(rows);

    assert_int_equal(state_run_set_delink(st, 3, 25), 0);
    assert_int_equal(state_run_get(st, 3, &r), 0);
    assert_int_equal(r.delink_step, 25);
    run_row_clear(&r);
    assert_int_equal(state_run_set_delink(st, 3, -1), 0);
    assert_int_equal(state_run_get(st, 3, &r), 0);
    assert_int_equal(r.delink_step, -1);
    run_row_clear(&r);
    assert_int_equal(state_run_set_delink(st, 99, 5), 1);
    state_close(st);
}

/* The spec summary columns (schema 0009): a run submitted with them reads
 * them back from get and list; one inserted without, and a row from a
 * database of before 0009 (migrated from user_version 8), has none
 * (have_summary 0: the caller reads its spec), its other fields intact. */
static void test_summary_columns(void **s)
{
    (void)s;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath, &db), SQLITE_OK);
    assert_true(schema_n_migrations >= 9);
    assert_string_equal(schema_migrations[8].name,
                        "0009_runs_spec_summary.sql");
    for (int i = 0; i < 8; i++)
        assert_int_equal(sqlite3_exec(db, schema_migrations[i].sql, NULL, NULL,
                                      NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
        "PRAGMA user_version = 8;"
        "INSERT INTO runs(name, spec, phase, step, total_steps, created, "
        "updated) VALUES ('old', '{\"pseudo\": {\"steps\": 7}}', 'pseudo', "
        "3, 100, 0, 0);", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    state *st = state_db_open(dbpath);
    assert_int_equal(state_user_version(st), schema_n_migrations);
    run_summary sum = {.pseudo_steps = 40, .device_budget = 3LL << 30,
                       .backend = "cuda", .delink_policy = "plateau"};
    int64_t b = state_run_insert(st, "new", "{}", 60, 0, &sum);
    int64_t c = state_run_insert(st, "none", "{}", 60, 0, NULL);
    assert_true(b == 2 && c == 3);
    run_row r;
    assert_int_equal(state_run_get(st, 1, &r), 0);
    assert_false(r.have_summary);
    assert_string_equal(r.name, "old");
    assert_int_equal(r.step, 3);
    assert_string_equal(r.spec, "{\"pseudo\": {\"steps\": 7}}");
    run_row_clear(&r);
    assert_int_equal(state_run_get(st, b, &r), 0);
    assert_true(r.have_summary);
    assert_int_equal(r.pseudo_steps, 40);
    assert_int_equal(r.device_budget, 3LL << 30);
    assert_string_equal(r.backend, "cuda");
    assert_string_equal(r.delink_policy, "plateau");
    run_row_clear(&r);
    run_row *rows;
    int n;
    assert_int_equal(state_run_list(st, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_false(rows[0].have_summary);
    assert_true(rows[1].have_summary);
    assert_int_equal(rows[1].pseudo_steps, 40);
    assert_int_equal(rows[1].device_budget, 3LL << 30);
    assert_string_equal(rows[1].backend, "cuda");
    assert_string_equal(rows[1].delink_policy, "plateau");
    assert_false(rows[2].have_summary);
    run_rows_free(rows, n);
    state_close(st);
}

/* A run's reason and an event's detail of any length are stored and read
 * back whole (a data error naming a shard on a path of thousands of
 * bytes). */
/* The command log (schema 0007): pending commands listed in order; a
 * commit writes the state, the event and the marks together and marks
 * only the kinds it was given; a failed commit (no such run for the
 * phase's foreign key) leaves nothing; a dropped command is gone. */
static void test_command_log(void **s)
{
    (void)s;
    state *st = state_db_open(dbpath);
    int64_t r = state_run_insert(st, "c", "{}", 100, 0, NULL);
    assert_true(r > 0);
    int64_t sub = state_command_add(st, r, "submit", 1, 0);
    int64_t p = state_command_add(st, r, "pause", 0, 0);
    int64_t d = state_command_add(st, r, "delink", 0, 0);
    int64_t q = state_command_add(st, r, "resume", 0, 0);
    assert_true(sub > 0 && p > sub && d > p && q > d);
    assert_int_equal(state_command_add(st, r, "reboot", 0, 0), -1); /* CHECK */
    command_row *rows;
    int n;
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(rows[0].kind, "pause");
    assert_string_equal(rows[1].kind, "delink");
    assert_string_equal(rows[2].kind, "resume");
    assert_true(rows[0].id == p && rows[2].id == q);
    free(rows);
    /* the delink up to d: only the delink is marked */
    state_commit dl = {.delink = 1, .event_kind = "delink",
                       .event_detail = "step=7 reason=operator", .step = 7,
                       .cmd_upto = q, .cmd_kinds = STATE_CMD_DELINK};
    assert_int_equal(state_commit_run(st, r, &dl), 0);
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].kind, "pause");
    free(rows);
    run_row row;
    assert_int_equal(state_run_get(st, r, &row), 0);
    assert_int_equal(row.phase, 1);
    assert_int_equal(row.delink_step, 7);
    assert_int_equal(row.step, 7);
    run_row_clear(&row);
    int64_t from;
    assert_int_equal(state_phase_get(st, r, 1, &from), 0);
    assert_int_equal(from, 7);
    /* a commit that cannot be done (the phase row of a run that is not
     * there) writes none of its parts */
    state_commit bad = {.set_state = 1, .state = RUN_PAUSED, .delink = 1,
                        .event_kind = "pause", .event_detail = "x", .step = 9,
                        .cmd_upto = q, .cmd_kinds = STATE_CMD_ALL};
    assert_int_equal(state_commit_run(st, r + 100, &bad), -1);
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 2);
    free(rows);
    /* the pause: state, event and the state machine's commands */
    state_commit pz = {.set_state = 1, .state = RUN_PAUSED,
                       .event_kind = "pause", .event_detail = "step=7",
                       .step = 7, .cmd_upto = p,
                       .cmd_kinds = STATE_CMD_NOT_DELINK};
    assert_int_equal(state_commit_run(st, r, &pz), 0);
    assert_int_equal(state_run_get(st, r, &row), 0);
    assert_int_equal(row.state, RUN_PAUSED);
    run_row_clear(&row);
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_true(rows[0].id == q);
    free(rows);
    event_row *ev;
    assert_int_equal(state_events_list(st, r, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ev[0].kind, "delink");
    assert_string_equal(ev[1].kind, "pause");
    event_rows_free(ev, n);
    assert_int_equal(state_command_drop(st, q), 0);
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 0);
    free(rows);
    int64_t k = state_command_add(st, r, "stop", 0, 0);
    assert_int_equal(state_commands_mark(st, r, k, 8), 0);
    assert_int_equal(state_commands_pending(st, r, &rows, &n), 0);
    assert_int_equal(n, 0);
    free(rows);
    state_close(st);
}

static void test_long_text_whole(void **unused)
{
    (void)unused;
    state *st = state_db_open(dbpath);
    int64_t a = state_run_insert(st, "long", "{}", 10, 0, NULL);
    assert_true(a > 0);
    enum { N = 5000 };
    char *why = malloc(N + 32);
    assert_non_null(why);
    memset(why, 'p', N);
    strcpy(why + N, ": truncated while in use");
    assert_int_equal(state_run_set_state(st, a, RUN_PAUSED, why), 0);
    run_row r;
    assert_int_equal(state_run_get(st, a, &r), 0);
    assert_non_null(r.error);
    assert_int_equal(strlen(r.error), N + strlen(": truncated while in use"));
    assert_string_equal(r.error, why);
    run_row_clear(&r);
    run_row *rows;
    int n;
    assert_int_equal(state_run_list(st, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].error, why);
    run_rows_free(rows, n);
    assert_int_equal(state_event(st, a, "paused.error", "step=%d %s", 7, why),
                     0);
    event_row *ev;
    assert_int_equal(state_events_list(st, a, 0, 10, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(strlen(ev[0].detail), strlen("step=7 ") + strlen(why));
    assert_true(strncmp(ev[0].detail, "step=7 ", 7) == 0);
    assert_string_equal(ev[0].detail + 7, why);
    event_rows_free(ev, n);
    free(why);
    state_close(st);
}

/* Another process holding m6.db's write lock (issue 16, item 8): step
 * records are held in memory, in order, not failed, and written once the
 * lock goes; a state change waits, then fails naming the lock; past the
 * hold limit state_hold_overdue says so. The other writer is a second,
 * independent SQLite connection in BEGIN IMMEDIATE. */
static void test_other_writer_held(void **s)
{
    (void)s;
    char err[256];
    state *st = state_db_open(dbpath);
    int64_t id = state_run_insert(st, "held", "{}", 100, 0, NULL);
    assert_true(id > 0);
    sqlite3 *other;
    assert_int_equal(sqlite3_open(dbpath, &other), SQLITE_OK);
    sqlite3_busy_timeout(other, 5000);
    assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL),
                     SQLITE_OK);
    state_set_hold_limit(st, 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 1; i <= 5; i++) {
        metric_row m = {.step = i, .phase = 0, .train_loss = 1.0 / i,
                        .val_loss = NAN, .lr = 1e-3, .tokens_per_s = NAN,
                        .grad_norm = NAN, .resident_slots = -1,
                        .offloaded_slots = -1, .peak_device_bytes = -1,
                        .h2d_gbps = NAN, .d2h_gbps = NAN,
                        .copy_hidden_fraction = NAN, .moe_aux_loss = NAN,
                        .moe_z_loss = NAN, .moe_dropped_fraction = NAN,
                        .moe_load_min = NAN, .moe_load_max = NAN,
                        .moe_load_cv = NAN, .moe_experts_empty = NAN};
        assert_int_equal(state_record_step(st, id, &m), 0);
    }
    assert_int_equal(state_event(st, id, "test.held", "after step %d", 5), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* never waited for the lock: one 100 ms try, then held at once */
    double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(dt < 1.0);
    double age;
    assert_int_equal(state_held(st, &age), 11); /* 5 x (row, progress) + 1 */
    char msg[1024] = "";
    assert_int_equal(state_hold_overdue(st, msg, sizeof msg), 0);
    /* a state change waits (up to the 1 s limit), then fails naming it */
    assert_int_equal(state_run_set_state(st, id, RUN_RUNNING, NULL), -1);
    state_last_error(st, err, sizeof err);
    assert_non_null(strstr(err, "locked"));
    assert_int_equal(state_hold_overdue(st, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "locked by another process"));
    assert_non_null(strstr(msg, "11 step records"));
    /* the other writer's view: nothing of ours yet */
    sqlite3_stmt *q;
    sqlite3_prepare_v2(other, "SELECT count(*) FROM metrics", -1, &q, NULL);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(q, 0), 0);
    sqlite3_finalize(q);
    assert_int_equal(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL),
                     SQLITE_OK);
    /* the flusher writes them within a few of its 50 ms tries */
    for (int i = 0; i < 100 && state_held(st, NULL) > 0; i++)
        usleep(20000);
    assert_int_equal(state_held(st, NULL), 0);
    metric_row *rows;
    int n;
    assert_int_equal(state_metrics_list(st, id, 0, &rows, &n), 0);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) {
        assert_int_equal(rows[i].step, i + 1);
        assert_true(rows[i].train_loss == 1.0 / (i + 1));
    }
    free(rows);
    run_row r;
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.step, 5);
    assert_int_equal(r.state, RUN_QUEUED); /* the failed change left none */
    run_row_clear(&r);
    event_row *ev;
    assert_int_equal(state_events_list(st, id, 0, 100, &ev, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ev[0].kind, "test.held");
    assert_string_equal(ev[0].detail, "after step 5");
    event_rows_free(ev, n);
    assert_int_equal(state_run_set_state(st, id, RUN_RUNNING, NULL), 0);
    assert_int_equal(state_hold_overdue(st, msg, sizeof msg), 0);
    sqlite3_close(other);
    state_close(st);
}

/* The lost ranks of a run (schema 0013): none on a new run; set, read
 * back field by field (hostname and why are not stored); cleared by NULL
 * and by node_id 0; both lists (get and list) read them. */
static void test_lost_columns(void **s)
{
    (void)s;
    state *st = state_db_open(dbpath);
    int64_t id = state_run_insert(st, "lost", "{}", 10, 0, NULL);
    assert_true(id > 0);
    run_row r;
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.lost.node_id, 0);
    run_row_clear(&r);
    run_lost l = {.node_id = 7, .rank = 3, .local_rank = 1, .ranks = 2};
    snprintf(l.hostname, sizeof l.hostname, "w");
    snprintf(l.why, sizeof l.why, "gone");
    assert_int_equal(state_run_set_lost(st, id, &l), 0);
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.lost.node_id, 7);
    assert_int_equal(r.lost.rank, 3);
    assert_int_equal(r.lost.local_rank, 1);
    assert_int_equal(r.lost.ranks, 2);
    assert_string_equal(r.lost.hostname, "");
    assert_string_equal(r.lost.why, "");
    run_row_clear(&r);
    run_row *rows;
    int n;
    assert_int_equal(state_run_list(st, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].lost.node_id, 7);
    assert_int_equal(rows[0].lost.local_rank, 1);
    run_rows_free(rows, n);
    assert_int_equal(state_run_set_lost(st, id, NULL), 0);
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.lost.node_id, 0);
    assert_int_equal(r.lost.ranks, 0);
    run_row_clear(&r);
    assert_int_equal(state_run_set_lost(st, id, &l), 0);
    l.node_id = 0;
    assert_int_equal(state_run_set_lost(st, id, &l), 0);
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.lost.node_id, 0);
    run_row_clear(&r);
    state_close(st);
}

TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_migrations, setup, teardown),
    cmocka_unit_test_setup_teardown(test_damaged_refused, setup, teardown),
    cmocka_unit_test_setup_teardown(test_runs_crud, setup, teardown),
    cmocka_unit_test_setup_teardown(test_metrics_phases_checkpoints, setup, teardown),
    cmocka_unit_test_setup_teardown(test_offload_columns, setup, teardown),
    cmocka_unit_test_setup_teardown(test_delink_step_column, setup, teardown),
    cmocka_unit_test_setup_teardown(test_summary_columns, setup, teardown),
    cmocka_unit_test_setup_teardown(test_long_text_whole, setup, teardown),
    cmocka_unit_test_setup_teardown(test_other_writer_held, setup, teardown),
    cmocka_unit_test_setup_teardown(test_command_log, setup, teardown),
    cmocka_unit_test_setup_teardown(test_lost_columns, setup, teardown))
