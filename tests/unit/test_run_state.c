/*
 * test_run_state.c — the one table of a run's states (common/run_state.c)
 * against what old files and old clients hold, each read independently of
 * the table:
 *  1. proto/m6.proto's RunState, through the descriptor protoc-c generated
 *     from it: every value but UNSPECIFIED is a recorded state with the
 *     same number and the name RUN_STATE_<NAME>, and every recorded state
 *     is one of its values.
 *  2. The six names m6.db files hold (written out here, as schema
 *     0001_init.sql's CHECK has them): exactly the recorded states; the
 *     transient four are not recorded.
 *  3. m6.db itself: each recorded state written through state.c is stored
 *     as its literal name (read back with sqlite3, not state.c) and read
 *     back as the same state; a transient state is refused by the schema.
 */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/run_state.h"
#include "m6.pb-c.h"
#include "state/state.h"
#include "../common/test_main.h"
#include "../common/state_db.h"

/* The names m6.db files hold in runs.state, in m6.proto's order. */
static const char *const db_names_[] = {"queued", "running", "paused",
                                        "completed", "failed", "stopped"};
#define N_DB_NAMES (sizeof db_names_ / sizeof *db_names_)

static void test_proto_agrees(void **s)
{
    (void)s;
    const ProtobufCEnumDescriptor *d = &m6__run_state__descriptor;
    assert_string_equal(d->name, "m6.RunState");
    int recorded = 0;
    for (int i = 0; i < RUN_STATE_COUNT; i++)
        recorded += run_state_recorded((run_state)i);
    /* every proto value but UNSPECIFIED is one recorded state */
    assert_int_equal((int)d->n_values, recorded + 1);
    for (unsigned i = 0; i < d->n_values; i++) {
        const ProtobufCEnumValue *v = &d->values[i];
        if (v->value == 0) {
            assert_string_equal(v->name, "RUN_STATE_UNSPECIFIED");
            assert_int_equal(run_state_from_wire(0), -1);
            continue;
        }
        int st = run_state_from_wire(v->value);
        assert_true(st >= 0);
        assert_true(run_state_recorded((run_state)st));
        assert_int_equal(run_state_wire((run_state)st), v->value);
        char want[64];
        int n = snprintf(want, sizeof want, "RUN_STATE_%s",
                         run_state_name((run_state)st));
        for (int k = 10; k < n; k++) want[k] = (char)toupper(want[k]);
        assert_string_equal(v->name, want);
    }
    /* ... and every recorded state is a proto value */
    for (int i = 0; i < RUN_STATE_COUNT; i++) {
        int w = run_state_wire((run_state)i);
        if (!run_state_recorded((run_state)i)) {
            assert_int_equal(w, 0);
            continue;
        }
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, w);
        assert_non_null(v);
        assert_int_equal(run_state_from_wire(w), i);
    }
}

static void test_db_names(void **s)
{
    (void)s;
    int recorded = 0;
    for (int i = 0; i < RUN_STATE_COUNT; i++) {
        const char *name = run_state_name((run_state)i);
        assert_int_equal(run_state_parse(name), i);  /* names are distinct */
        int in_db = 0;
        for (size_t k = 0; k < N_DB_NAMES; k++)
            in_db |= strcmp(name, db_names_[k]) == 0;
        assert_int_equal(run_state_recorded((run_state)i), in_db);
        recorded += in_db;
    }
    assert_int_equal(recorded, (int)N_DB_NAMES);
    /* m6.proto numbers them 1..6 in this order (checked against the
     * descriptor above) */
    for (size_t k = 0; k < N_DB_NAMES; k++)
        assert_int_equal(run_state_wire((run_state)run_state_parse(
                             db_names_[k])), (int)k + 1);
    assert_int_equal(run_state_parse("bogus"), -1);
    assert_int_equal(run_state_parse(NULL), -1);
    assert_string_equal(run_state_name((run_state)RUN_STATE_COUNT), "unknown");
    assert_int_equal(run_state_wire((run_state)RUN_STATE_COUNT), 0);
    assert_int_equal(run_state_from_wire((int)N_DB_NAMES + 1), -1);
}

static char dbpath_[256];

static void test_db_stores_names(void **s)
{
    (void)s;
    state_db_path(dbpath_, sizeof dbpath_, "run-state");
    state *st = state_db_open(dbpath_);
    int64_t id = state_run_insert(st, "r", "{}", 10, 0, NULL);
    assert_true(id > 0);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(dbpath_, &db), SQLITE_OK);
    for (int i = 0; i < RUN_STATE_COUNT; i++) {
        run_state rs = (run_state)i;
        if (!run_state_recorded(rs)) {
            /* never recorded: runs.state's CHECK refuses it (the
             * sqlite.error lines logged here are expected) */
            assert_int_equal(state_run_set_state(st, id, rs, NULL), -1);
            continue;
        }
        assert_int_equal(state_run_set_state(st, id, rs, NULL), 0);
        sqlite3_stmt *q;
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT state FROM runs "
                                            "WHERE id = ?", -1, &q, NULL),
                         SQLITE_OK);
        sqlite3_bind_int64(q, 1, id);
        assert_int_equal(sqlite3_step(q), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(q, 0),
                            db_names_[run_state_wire(rs) - 1]);
        sqlite3_finalize(q);
        run_row row;
        assert_int_equal(state_run_get(st, id, &row), 0);
        assert_int_equal(row.state, rs);
        run_row_clear(&row);
    }
    sqlite3_close(db);
    state_close(st);
    state_db_remove(dbpath_);
}

TEST_MAIN(
    cmocka_unit_test(test_proto_agrees),
    cmocka_unit_test(test_db_names),
    cmocka_unit_test(test_db_stores_names))
