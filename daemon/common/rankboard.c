/*
 * rankboard.c — where each rank of a run stands (see rankboard.h).
 */
#include "common/rankboard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
static rank_entry board_[RANKBOARD_MAX];
static int n_;

static const char *const names_[RANK_STATE_N] = {
    [RANK_GROUPING] = "grouping", [RANK_TRAINING] = "training",
    [RANK_BOUNDARY] = "boundary", [RANK_LEFT] = "left",
    [RANK_DONE] = "done",         [RANK_FAILED] = "failed",
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
    for (int i = 0; i < n_ && k < max; i++)
        if (board_[i].node_id == 0) out[k++] = board_[i];
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
    for (int i = 0; i < n_ && k < max; i++)
        if (board_[i].run == run) out[k++] = board_[i];
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
