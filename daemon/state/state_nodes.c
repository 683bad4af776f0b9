/*
 * state_nodes.c — the nodes table of m6.db: the coordinator's registry of
 * the nodes that joined it (state, facts, heartbeats, the run each holds).
 */
#include "state/state_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ------------------------------------------------------------------- nodes */

static const char *const node_state_names_[] = {"joining", "live", "lost",
                                                "left"};

const char *node_state_name(node_state s)
{
    return (unsigned)s < 4 ? node_state_names_[s] : "unknown";
}

static node_state node_state_parse_(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, node_state_names_[i]) == 0) return (node_state)i;
    return NODE_LOST;
}

#define NODE_COLS                                                          \
    "id, hostname, node_uuid, role, backend, devices, memory, "            \
    "free_device_memory, state, run, rank, address, detail, "              \
    "last_heartbeat, joined, updated, gemm, secret_sha256, ranks"

static void node_fill_(sqlite3_stmt *s, void *elem)
{
    node_row *n = elem;
    memset(n, 0, sizeof *n);
    n->id = sqlite3_column_int64(s, 0);
    state_copy_text_(n->hostname, sizeof n->hostname, sqlite3_column_text(s, 1));
    state_copy_text_(n->node_uuid, sizeof n->node_uuid, sqlite3_column_text(s, 2));
    const unsigned char *role = sqlite3_column_text(s, 3);
    n->coordinator = role && strcmp((const char *)role, "coordinator") == 0;
    state_copy_text_(n->backend, sizeof n->backend, sqlite3_column_text(s, 4));
    n->devices = sqlite3_column_int(s, 5);
    n->memory = (uint64_t)sqlite3_column_int64(s, 6);
    n->free_device_memory = (uint64_t)sqlite3_column_int64(s, 7);
    n->state = node_state_parse_((const char *)sqlite3_column_text(s, 8));
    n->run = sqlite3_column_type(s, 9) == SQLITE_NULL
                 ? 0 : sqlite3_column_int64(s, 9);
    n->rank = sqlite3_column_type(s, 10) == SQLITE_NULL
                  ? -1 : sqlite3_column_int(s, 10);
    state_copy_text_(n->address, sizeof n->address, sqlite3_column_text(s, 11));
    state_copy_text_(n->detail, sizeof n->detail, sqlite3_column_text(s, 12));
    n->last_heartbeat = sqlite3_column_double(s, 13);
    n->joined = sqlite3_column_double(s, 14);
    n->updated = sqlite3_column_double(s, 15);
    state_copy_text_(n->gemm, sizeof n->gemm, sqlite3_column_text(s, 16));
    state_copy_text_(n->secret_sha256, sizeof n->secret_sha256,
                     sqlite3_column_text(s, 17));
    n->ranks = n->rank < 0 ? 0
               : sqlite3_column_type(s, 18) == SQLITE_NULL
                   ? 1 : sqlite3_column_int(s, 18);
}

/* The values of a node_row's fields, in the order of the columns
 * hostname, node_uuid, role, backend, devices, memory, free_device_memory,
 * state, address, detail, gemm, secret_sha256 (insert and update both
 * write them). */
#define NODE_FIELDS_(n)                                                    \
    A_TEXT((n)->hostname), A_TEXT((n)->node_uuid),                         \
        A_TEXT((n)->coordinator ? "coordinator" : "worker"),               \
        A_TEXT((n)->backend), A_INT((n)->devices),                         \
        A_INT((int64_t)(n)->memory),                                       \
        A_INT((int64_t)(n)->free_device_memory),                           \
        A_TEXT(node_state_name((n)->state)),                               \
        A_TEXT((n)->address[0] ? (n)->address : NULL),                     \
        A_TEXT((n)->detail[0] ? (n)->detail : NULL),                       \
        A_TEXT((n)->gemm[0] ? (n)->gemm : NULL),                           \
        A_TEXT((n)->secret_sha256[0] ? (n)->secret_sha256 : NULL)

int state_node_insert(state *st, const node_row *n, int64_t *id)
{
    double t = state_now_();
    pthread_mutex_lock(&st->mu);
    int rc = SQL_WRITE_LOCKED(st,
        "INSERT INTO nodes(hostname, node_uuid, role, backend, devices, "
        "memory, free_device_memory, state, address, detail, gemm, "
        "secret_sha256, last_heartbeat, joined, updated) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        NODE_FIELDS_(n), A_REAL(t), A_REAL(t), A_REAL(t));
    if (rc >= 0) *id = sqlite3_last_insert_rowid(st->db);
    pthread_mutex_unlock(&st->mu);
    return rc < 0 ? -1 : 0;
}

int state_node_update(state *st, int64_t id, const node_row *n)
{
    double t = state_now_();
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET hostname = ?, node_uuid = ?, role = ?, backend = ?, "
        "devices = ?, memory = ?, free_device_memory = ?, state = ?, "
        "address = ?, detail = ?, gemm = ?, secret_sha256 = ?, "
        "last_heartbeat = ?, "
        "updated = ? "
        "WHERE id = ?",
        NODE_FIELDS_(n), A_REAL(t), A_REAL(t), A_INT(id));
    return rc < 0 ? -1 : rc == 0 ? 1 : 0;
}

int state_node_find(state *st, char by, const char *key, node_row *out)
{
    void *v;
    int n;
    int rc = SQL_LIST(st, &v, &n, sizeof *out, node_fill_,
                      by == 'u' ? "SELECT " NODE_COLS " FROM nodes WHERE node_uuid = ?"
                                : "SELECT " NODE_COLS " FROM nodes WHERE hostname = ?",
                      A_TEXT(key));
    if (rc < 0) return -1;
    if (n > 0) *out = *(node_row *)v;
    free(v);
    return n > 0 ? 0 : 1;
}

int state_node_set_state(state *st, int64_t id, node_state s,
                         const char *detail)
{
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET state = ?, detail = ?, updated = ? WHERE id = ?",
        A_TEXT(node_state_name(s)), A_TEXT(detail), A_REAL(state_now_()),
        A_INT(id));
    return rc < 0 ? -1 : rc == 0 ? 1 : 0;
}

int state_node_set_run(state *st, int64_t id, int64_t run, int rank)
{
    return state_node_set_ranks(st, id, run, rank, 1);
}

int state_node_set_ranks(state *st, int64_t id, int64_t run, int rank,
                         int ranks)
{
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET run = ?, rank = ?, ranks = ?, updated = ? "
        "WHERE id = ?",
        run > 0 ? A_INT(run) : A_NULL, run > 0 ? A_INT(rank) : A_NULL,
        run > 0 ? A_INT(ranks) : A_NULL, A_REAL(state_now_()), A_INT(id));
    return rc < 0 ? -1 : rc == 0 ? 1 : 0;
}

int state_nodes_clear_run(state *st, int64_t run)
{
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET run = NULL, rank = NULL, ranks = NULL, updated = ? "
        "WHERE run = ?",
        A_REAL(state_now_()), A_INT(run));
    return rc < 0 ? -1 : 0;
}

int state_nodes_clear_runs(state *st)
{
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET run = NULL, rank = NULL, ranks = NULL, updated = ? "
        "WHERE run IS NOT NULL OR rank IS NOT NULL", A_REAL(state_now_()));
    return rc < 0 ? -1 : 0;
}

int state_node_heartbeat(state *st, int64_t id, uint64_t free_device_memory)
{
    double t = state_now_();
    int rc = SQL_WRITE(st,
        "UPDATE nodes SET last_heartbeat = ?, free_device_memory = ?, "
        "updated = CASE state WHEN 'joining' THEN ? ELSE updated END, "
        "state = CASE state WHEN 'joining' THEN 'live' ELSE state END "
        "WHERE id = ?",
        A_REAL(t), A_INT((int64_t)free_device_memory), A_REAL(t), A_INT(id));
    return rc < 0 ? -1 : rc == 0 ? 1 : 0;
}

int state_nodes_mark(state *st, node_state from, node_state to,
                     const char *detail)
{
    return SQL_WRITE(st,
        "UPDATE nodes SET state = ?, detail = ?, updated = ? "
        "WHERE state = ? AND role = 'worker'",
        A_TEXT(node_state_name(to)), A_TEXT(detail), A_REAL(state_now_()),
        A_TEXT(node_state_name(from)));
}

int state_nodes_list(state *st, node_row **rows, int *n)
{
    void *v;
    int ret = SQL_LIST(st, &v, n, sizeof **rows, node_fill_,
                       "SELECT " NODE_COLS " FROM nodes ORDER BY id");
    *rows = v;
    return ret;
}
