/*
 * rankboard.h — where each data-parallel rank of a run stands, for
 * `m6ctl status`: one small table per m6d process under one mutex.
 *
 * Writers: this m6d's rank threads (cluster/dp.c) publish their own
 * entry at each change (a few words under the mutex; nothing reaches
 * SQLite). A worker sends its own entries with every heartbeat; the
 * coordinator keeps each worker's latest ones (rankboard_put_node), and
 * its status handler reads every node's entries of a run (rankboard_run).
 * Rank 0 is the coordinator's runner, whose step and state are the run's
 * own (the runs table): it is not on the board.
 */
#ifndef M6_RANKBOARD_H
#define M6_RANKBOARD_H

#include <stddef.h>
#include <stdint.h>

/* What a rank is doing. */
typedef enum {
    RANK_GROUPING = 0, /* rendezvous with the other ranks, rank 0's state
                        * broadcast to it */
    RANK_TRAINING,     /* in a step: computing, or waiting for the other
                        * ranks at the step's gradient all-reduce */
    RANK_BOUNDARY,     /* at the step boundary's agreement with rank 0
                        * (optimizer.shard) */
    RANK_LEFT,         /* left the group: rank 0 paused, delinked or
                        * stopped, or another rank was lost (reason) */
    RANK_DONE,         /* trained to the run's last step */
    RANK_FAILED,       /* failed (reason) */
    RANK_WAITING,      /* training or at the boundary, blocked in a
                        * collective for RANKBOARD_WAIT_MS or longer
                        * (reason: since when); never set, only read: see
                        * rankboard_wait_clock */
    RANK_STATE_N
} rank_state;

/* "grouping", "training", "boundary", "left", "done", "failed",
 * "waiting"; "unknown" past the table. */
const char *rankboard_state_name(rank_state s);
/* The state named s (rankboard_state_name), or -1. */
int rankboard_state_parse(const char *s);

/* One rank's entry. node_id 0: a rank of this m6d. */
#define RANKBOARD_REASON_MAX 256
typedef struct {
    int64_t node_id;
    int64_t run;
    int rank, local_rank;
    int64_t step;                      /* steps it has completed */
    rank_state state;
    char reason[RANKBOARD_REASON_MAX]; /* left, failed: why; else "" */
} rank_entry;

/* Most local ranks one node reports (m6d --devices is at most this). */
#define RANKBOARD_DEVICES_MAX 256

/* Most entries the board holds (every node's together); a node whose
 * entries would not fit keeps the ones that do. */
#define RANKBOARD_MAX 1024

/* Publish this m6d's local rank local_rank: it now holds rank `rank` of
 * run `run`, has completed `step` steps and is in state st (reason: NULL
 * or "" unless st is RANK_LEFT or RANK_FAILED; cut at
 * RANKBOARD_REASON_MAX - 1 bytes). Replaces that local rank's entry. */
void rankboard_set(int64_t run, int rank, int local_rank, int64_t step,
                   rank_state st, const char *reason);

/* How long a rank blocks in a collective before the board says
 * "waiting" rather than what it published: longer than a step's own
 * all-reduce takes at the sizes m6 trains here, short beside
 * nodes.timeout. */
#define RANKBOARD_WAIT_MS 1000

/* This m6d's local rank local_rank's wait clock (0 <= local_rank <
 * RANKBOARD_DEVICES_MAX), for its rank thread to hand to
 * m6_coll_wait_clock (dist/collectives.h): while it holds the
 * CLOCK_MONOTONIC ms a collective call began, and that was at least
 * RANKBOARD_WAIT_MS ago, the rank's entry reads as RANK_WAITING (if it
 * was RANK_TRAINING or RANK_BOUNDARY) with the wait's length as its
 * reason. NULL out of range. */
int64_t *rankboard_wait_clock(int local_rank);

/* A copy of this m6d's own entries (node_id 0), up to max, by local rank;
 * returns how many. */
int rankboard_local(rank_entry *out, int max);

/* The coordinator: node node_id's (> 0) entries are now these n (from
 * its heartbeat); node_id on each is set to node_id. n 0 forgets them. */
void rankboard_put_node(int64_t node_id, const rank_entry *e, int n);

/* Every entry of run `run` (this m6d's and the nodes'), up to max, by
 * rank; returns how many. */
int rankboard_run(int64_t run, rank_entry *out, int max);

/* Forget every entry (tests). */
void rankboard_reset(void);

#endif /* M6_RANKBOARD_H */
