/*
 * node_share.c — a node's host resources divided among its ranks (see
 * node_share.h).
 */
#include "common/node_share.h"

#include <stdint.h>
#include <stdio.h>

/* written once at start, before any reader (node_share.h) */
static int node_ranks_ = 1;
static char name_[256] = "this node";

void node_share_set(const char *name, int ranks)
{
    if (name && *name) snprintf(name_, sizeof name_, "node %s", name);
    __atomic_store_n(&node_ranks_, ranks < 1 ? 1 : ranks, __ATOMIC_RELEASE);
}

const char *node_share_name(void)
{
    (void)node_share_node_ranks();  /* the store's release: name_ is set */
    return name_;
}

int node_share_node_ranks(void)
{
    return __atomic_load_n(&node_ranks_, __ATOMIC_ACQUIRE);
}

int node_share_ranks(int world)
{
    int n = node_share_node_ranks();
    int w = world < 1 ? 1 : world;
    return n < w ? n : w;
}

int node_share_split(int total, int k)
{
    int t = total / (k < 1 ? 1 : k);
    return t < 1 ? 1 : t;
}

size_t node_share_bytes(size_t bytes, int k)
{
    if (bytes == SIZE_MAX) return SIZE_MAX;
    return bytes / (size_t)(k < 1 ? 1 : k);
}
