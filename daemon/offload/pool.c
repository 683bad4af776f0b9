/*
 * pool.c — the two memory pools of offloading: a budgeted "device" pool
 * (in CPU builds ordinary memory standing in for device memory) and a
 * pinned host pool that grows by page-locked chunks. Both suballocate their
 * chunks first-fit with 64-byte alignment and coalesce freed neighbours;
 * allocations are few and large (a device block, a slot, a staging buffer),
 * so plain linked lists are enough.
 */
#include "offload/offload.h"
#include "offload/test_hooks.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define ALIGN_ 64

/* A free or used range of a chunk: [off, off+size). */
typedef struct range_ {
    size_t off, size;
    size_t asked;          /* used: the bytes the caller asked for */
    struct range_ *next;
} range_;

typedef struct chunk_ {
    char *base;
    size_t size;
    int pinned;
    range_ *free;          /* sorted by offset, coalesced */
    range_ *used;
    size_t in_use;
    struct chunk_ *next;
} chunk_;

struct offload_pool {
    int is_host;
    size_t budget;         /* device: hard limit */
    size_t chunk_bytes;    /* host: minimum chunk */
    size_t max_chunk;      /* host: largest chunk (but for one request) */
    size_t requested;      /* bytes asked for by the blocks out now */
    chunk_ *chunks;
    size_t in_use, peak;
    int warned;            /* host: pinning warning printed */
    pthread_mutex_t mu;
};

static size_t round_up_(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ------------------------------------------------------------- pinning */

static size_t pin_override_ = SIZE_MAX;

void offload_test_set_pin_limit(size_t bytes) { pin_override_ = bytes; }

/* CAP_IPC_LOCK (bit 14) in the effective set: mlock ignores the rlimit. */
static int has_cap_ipc_lock_(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int has = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "CapEff:", 7) == 0) {
            unsigned long long caps = strtoull(line + 7, NULL, 16);
            has = (caps >> 14) & 1;
            break;
        }
    fclose(f);
    return has;
}

size_t offload_pin_limit(void)
{
    if (pin_override_ != SIZE_MAX)
        return pin_override_;
    if (has_cap_ipc_lock_())
        return SIZE_MAX;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return SIZE_MAX;
    return (size_t)rl.rlim_cur;
}

static size_t pinned_total_(const offload_pool *p)
{
    size_t n = 0;
    for (const chunk_ *c = p->chunks; c; c = c->next)
        n += c->pinned ? c->size : 0;
    return n;
}

/* Lock a new host chunk; on failure warn once and keep it pageable. */
static void pin_chunk_(offload_pool *p, chunk_ *c)
{
    int err = 0;
    if (pin_override_ != SIZE_MAX && pinned_total_(p) + c->size > pin_override_)
        err = ENOMEM; /* as mlock fails past RLIMIT_MEMLOCK */
    else /* in pieces of at most max_chunk (one request may be larger) */
        for (size_t at = 0; at < c->size && !err; at += p->max_chunk) {
            size_t n = c->size - at < p->max_chunk ? c->size - at
                                                   : p->max_chunk;
            if (mlock(c->base + at, n) != 0) {
                err = errno;
                if (at)
                    munlock(c->base, at);
            }
        }
    c->pinned = err == 0;
    if (err && !p->warned) {
        size_t lim = offload_pin_limit();
        char lims[32];
        if (lim == SIZE_MAX)
            snprintf(lims, sizeof lims, "unlimited");
        else
            snprintf(lims, sizeof lims, "%zu bytes", lim);
        fprintf(stderr,
                "m6: offload: warning: cannot pin %zu bytes of host memory "
                "(mlock: %s; RLIMIT_MEMLOCK %s); using pageable memory, "
                "host-device copies will be slower\n",
                c->size, strerror(err), lims);
        p->warned = 1;
    }
}

/* ------------------------------------------------------------- chunks */

static chunk_ *chunk_new_(size_t size, int reserve_only)
{
    chunk_ *c = calloc(1, sizeof *c);
    range_ *r = calloc(1, sizeof *r);
    if (!c || !r)
        goto fail;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (reserve_only ? MAP_NORESERVE : 0);
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (m == MAP_FAILED)
        goto fail;
    c->base = m;
    c->size = size;
    r->off = 0;
    r->size = size;
    c->free = r;
    return c;
fail:
    free(c);
    free(r);
    return NULL;
}

static void chunk_delete_(chunk_ *c)
{
    if (c->pinned)
        munlock(c->base, c->size);
    munmap(c->base, c->size);
    for (range_ *r = c->free, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    for (range_ *r = c->used, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    free(c);
}

/* First fit in one chunk; NULL when nothing fits. */
static void *chunk_alloc_(chunk_ *c, size_t size)
{
    for (range_ **pp = &c->free; *pp; pp = &(*pp)->next) {
        range_ *r = *pp;
        if (r->size < size)
            continue;
        range_ *u = malloc(sizeof *u);
        if (!u)
            return NULL;
        u->off = r->off;
        u->size = size;
        u->next = c->used;
        c->used = u;
        r->off += size;
        r->size -= size;
        if (r->size == 0) {
            *pp = r->next;
            free(r);
        }
        c->in_use += size;
        u->asked = size;
        return c->base + u->off;
    }
    return NULL;
}

/* Return [off, off+size) to the free list, merging with its neighbours. */
static void chunk_release_(chunk_ *c, range_ *u)
{
    range_ **pp = &c->free;
    while (*pp && (*pp)->off < u->off)
        pp = &(*pp)->next;
    u->next = *pp;
    *pp = u;
    if (u->next && u->off + u->size == u->next->off) {
        range_ *n = u->next;
        u->size += n->size;
        u->next = n->next;
        free(n);
    }
    /* merge with the predecessor: walk again (lists are short) */
    for (range_ *r = c->free; r && r->next; r = r->next)
        if (r->next == u && r->off + r->size == u->off) {
            r->size += u->size;
            r->next = u->next;
            free(u);
            break;
        }
}

/* ------------------------------------------------------------- pools */

static offload_pool *pool_new_(int is_host)
{
    offload_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->is_host = is_host;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

offload_pool *offload_device_pool_create(size_t budget)
{
    if (budget == 0) {
        errno = EINVAL;
        return NULL;
    }
    offload_pool *p = pool_new_(0);
    if (!p)
        return NULL;
    p->budget = budget;
    /* address space for the budget, but never more than this machine's
     * memory: a budget above it is no limit (the pool would run out of
     * memory first), and reserving 100 TiB of addresses fails */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t reserve = budget;
    if (pages > 0 && page > 0 && (size_t)pages <= SIZE_MAX / (size_t)page &&
        reserve > (size_t)pages * (size_t)page)
        reserve = (size_t)pages * (size_t)page;
    p->chunks = chunk_new_(round_up_(reserve, ALIGN_), 1);
    if (!p->chunks) {
        offload_pool_destroy(p);
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

offload_pool *offload_host_pool_create(size_t chunk_bytes)
{
    return offload_host_pool_create_max(chunk_bytes, OFFLOAD_MAX_CHUNK);
}

offload_pool *offload_host_pool_create_max(size_t chunk_bytes,
                                           size_t max_chunk)
{
    offload_pool *p = pool_new_(1);
    if (!p)
        return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    p->max_chunk = round_up_(max_chunk ? max_chunk : 1, page);
    p->chunk_bytes = round_up_(chunk_bytes ? chunk_bytes : 1, page);
    if (p->chunk_bytes > p->max_chunk)
        p->chunk_bytes = p->max_chunk;
    return p;
}

void *offload_pool_alloc(offload_pool *p, size_t bytes)
{
    size_t size = round_up_(bytes ? bytes : 1, ALIGN_);
    void *ptr = NULL;
    pthread_mutex_lock(&p->mu);
    if (!p->is_host && p->in_use + size > p->budget)
        goto out; /* the budget is the device's memory */
    for (chunk_ *c = p->chunks; c && !ptr; c = c->next)
        ptr = chunk_alloc_(c, size);
    if (!ptr && p->is_host) {
        /* a block never straddles chunks: one larger than the chunk
         * size gets a chunk of its own (pinned in max_chunk pieces) */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t want = size > p->chunk_bytes ? round_up_(size, page)
                                            : p->chunk_bytes;
        chunk_ *c = chunk_new_(want, 0);
        if (c) {
            pin_chunk_(p, c);
            c->next = p->chunks;
            p->chunks = c;
            ptr = chunk_alloc_(c, size);
        }
    }
    if (ptr) {
        memset(ptr, 0, size);
        p->in_use += size;
        p->requested += bytes;
        for (chunk_ *c = p->chunks; c; c = c->next)
            if ((char *)ptr >= c->base && (char *)ptr < c->base + c->size) {
                c->used->asked = bytes; /* chunk_alloc_ put it first */
                break;
            }
        if (p->in_use > p->peak)
            p->peak = p->in_use;
    }
out:
    pthread_mutex_unlock(&p->mu);
    if (!ptr)
        errno = ENOMEM;
    return ptr;
}

void offload_pool_free(offload_pool *p, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&p->mu);
    for (chunk_ *c = p->chunks; c; c = c->next) {
        if ((char *)ptr < c->base || (char *)ptr >= c->base + c->size)
            continue;
        size_t off = (size_t)((char *)ptr - c->base);
        for (range_ **pp = &c->used; *pp; pp = &(*pp)->next)
            if ((*pp)->off == off) {
                range_ *u = *pp;
                *pp = u->next;
                c->in_use -= u->size;
                p->in_use -= u->size;
                p->requested -= u->asked;
                chunk_release_(c, u);
                break;
            }
        break;
    }
    pthread_mutex_unlock(&p->mu);
}

void offload_pool_trim(offload_pool *p)
{
    if (!p->is_host)
        return;
    pthread_mutex_lock(&p->mu);
    for (chunk_ **pp = &p->chunks; *pp;) {
        chunk_ *c = *pp;
        if (c->in_use == 0) {
            *pp = c->next;
            chunk_delete_(c);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

void offload_pool_get_stats(offload_pool *p, offload_pool_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&p->mu);
    st->in_use = p->in_use;
    st->peak = p->peak;
    st->requested = p->requested;
    if (!p->is_host) {
        st->capacity = p->budget;
    } else {
        for (const chunk_ *c = p->chunks; c; c = c->next) {
            st->capacity += c->size;
            st->chunks++;
        }
        st->pinned = pinned_total_(p);
        for (const chunk_ *c = p->chunks; c; c = c->next)
            if (c->size > st->largest_chunk)
                st->largest_chunk = c->size;
    }
    pthread_mutex_unlock(&p->mu);
}

size_t offload_vm_locked(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = SIZE_MAX;
    if (!f)
        return SIZE_MAX;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %zu kB", &kb) == 1)
            break;
    fclose(f);
    return kb == SIZE_MAX ? SIZE_MAX : kb * 1024;
}

void offload_pool_destroy(offload_pool *p)
{
    if (!p)
        return;
    for (chunk_ *c = p->chunks, *n; c; c = n) {
        n = c->next;
        chunk_delete_(c);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}
