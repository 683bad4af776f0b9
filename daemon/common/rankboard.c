/*
 * rankboard.c — where each rank of a run stands (see rankboard.h).
 */
#include "common/rankboard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

static pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
static rank_entry board_[RANKBOARD_MAX];
static int n_;

/* this m6d's local ranks' wait clocks (rankboard_wait_clock) */
static int64_t clocks_[RANKBOARD_DEVICES_MAX];

static const char *const names_[RANK_STATE_N] = {
    [RANK_GROUPING] = "grouping", [RANK_TRAINING] = "training",
    [RANK_BOUNDARY] = "boundary", [RANK_LEFT] = "left",
    [RANK_DONE] = "done",         [RANK_FAILED] = "failed",
    [RANK_WAITING] = "waiting",
};

const char *rankboard_state_name(rank_state s)
{
    return (unsigned)s < RANK_STATE_N ? names_[s] : "unknown";
}

int rankboard_state_parse(const char *s)
{
    for (int i = 0; s && i < RANK_STATE_N; i++)
        if (strcmp(s, names_[i]) == 0) return i;
    return -1;
}

void rankboard_set(int64_t run, int rank, int local_rank, int64_t step,
                   rank_state st, const char *reason)
{
    pthread_mutex_lock(&mu_);
    int i = 0;
    while (i < n_ && !(board_[i].node_id == 0 &&
                       board_[i].local_rank == local_rank))
        i++;
    if (i == n_ && n_ < RANKBOARD_MAX) n_++;
    if (i < n_) {
        rank_entry *e = &board_[i];
        *e = (rank_entry){.node_id = 0, .run = run, .rank = rank,
                          .local_rank = local_rank, .step = step,
                          .state = st};
        snprintf(e->reason, sizeof e->reason, "%s", reason ? reason : "");
    }
    pthread_mutex_unlock(&mu_);
}

int64_t *rankboard_wait_clock(int local_rank)
{
    return local_rank >= 0 && local_rank < RANKBOARD_DEVICES_MAX
               ? &clocks_[local_rank] : NULL;
}

/* e as it reads now: one of this m6d's ranks blocked in a collective for
 * RANKBOARD_WAIT_MS or more while training or at the boundary is
 * RANK_WAITING, the wait's length its reason. */
static void read_waiting_(rank_entry *e, int64_t now_ms)
{
    if (e->node_id != 0 || e->local_rank < 0 ||
        e->local_rank >= RANKBOARD_DEVICES_MAX ||
        (e->state != RANK_TRAINING && e->state != RANK_BOUNDARY))
        return;
    int64_t since = __atomic_load_n(&clocks_[e->local_rank],
                                    __ATOMIC_RELAXED);
    if (since <= 0 || now_ms - since < RANKBOARD_WAIT_MS) return;
    snprintf(e->reason, sizeof e->reason, "in a collective for %.1f s (%s)",
             (double)(now_ms - since) / 1000.0, names_[e->state]);
    e->state = RANK_WAITING;
}

/* qsort: by run, then rank (then node and local rank) */
static int by_rank_(const void *a, const void *b)
{
    const rank_entry *x = a, *y = b;
    if (x->run != y->run) return x->run < y->run ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->node_id != y->node_id) return x->node_id < y->node_id ? -1 : 1;
    return (x->local_rank > y->local_rank) - (x->local_rank < y->local_rank);
}

int rankboard_local(rank_entry *out, int max)
{
    int k = 0;
    pthread_mutex_lock(&mu_);
    int64_t now = clock_mono_ms();
    for (int i = 0; i < n_ && k < max; i++)
        if (board_[i].node_id == 0) {
            out[k] = board_[i];
            read_waiting_(&out[k++], now);
        }
    pthread_mutex_unlock(&mu_);
    qsort(out, (size_t)k, sizeof *out, by_rank_);
    return k;
}

void rankboard_put_node(int64_t node_id, const rank_entry *e, int n)
{
    if (node_id <= 0) return;
    pthread_mutex_lock(&mu_);
    int k = 0;
    for (int i = 0; i < n_; i++)   /* drop its old entries */
        if (board_[i].node_id != node_id) board_[k++] = board_[i];
    for (int i = 0; i < n && k < RANKBOARD_MAX; i++) {
        board_[k] = e[i];
        board_[k].node_id = node_id;
        board_[k].reason[RANKBOARD_REASON_MAX - 1] = 0;
        k++;
    }
    n_ = k;
    pthread_mutex_unlock(&mu_);
}

int rankboard_run(int64_t run, rank_entry *out, int max)
{
    int k = 0;
    pthread_mutex_lock(&mu_);
    int64_t now = clock_mono_ms();
    for (int i = 0; i < n_ && k < max; i++)
        if (board_[i].run == run) {
            out[k] = board_[i];
            read_waiting_(&out[k++], now);
        }
    pthread_mutex_unlock(&mu_);
    qsort(out, (size_t)k, sizeof *out, by_rank_);
    return k;
}

void rankboard_reset(void)
{
    pthread_mutex_lock(&mu_);
    n_ = 0;
    pthread_mutex_unlock(&mu_);
}
