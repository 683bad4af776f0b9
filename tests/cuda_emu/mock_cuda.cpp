/*
 * mock_cuda.cpp — the mock CUDA runtime of cuda_runtime.h (this folder): a
 * simulated GPU of a few threads that run stream operations, each stream in
 * order, the streams in random order, with events that keep the real
 * record / wait semantics. One mutex guards everything; operations run
 * outside it. Device and pinned memory are ordinary malloc'ed blocks, known
 * to the mock so that copies and frees can be checked.
 *
 * The GPU threads start with mock_start (the offload test: its seed, thread
 * count and latencies; misuse is counted for it to check) or, for a program
 * that never calls it (the CUDA programs of tests/cuda_emu), at the first
 * stream operation: two threads, the seed $M6_EMU_SEED (default 1), added
 * latencies of up to $M6_EMU_DELAY_US microseconds (default 0: none), and
 * misuse is fatal (printed, then exit 1), as a GPU fault would end the
 * program.
 *
 * Devices: $M6_EMU_DEVICES of them (1 to MOCK_DEVICES_MAX, default 1),
 * of which CUDA_VISIBLE_DEVICES shows a list as the real runtime does
 * (renumbered from 0; the list ends at its first unknown entry). Each has
 * MOCK_DEVICE_BYTES of memory ($M6_EMU_DEVICE_MIB to change it), and
 * every thread a current device (cudaSetDevice; 0 at first). Streams,
 * events and allocations belong to the device current when they were
 * made; as on a GPU, a kernel launched on a stream of another device than
 * the current one and an event recorded on another device's stream are
 * errors (copies may use any stream), cudaDeviceSynchronize and the
 * legacy stream wait for the current device's streams, and cudaMemGetInfo
 * reports the current device. One pool of GPU threads runs them all.
 * With $M6_EMU_DEVICE_LOG set, a program that exits normally writes each
 * device's peak bytes in use there ("device D peak_bytes N" lines), so a
 * test can see which devices a process used.
 */
#include "cuda_runtime.h"
#include "emu_counts.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <deque>
#include <map>
#include <random>
#include <set>
#include <vector>

enum { OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_KERNEL };

struct op_ {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    cudaEvent_t ev;
    long seq;                   /* RECORD: the record; WAIT: the one awaited */
    void (*fn)(void *);
    void *arg;
    void (*drop)(void *);       /* KERNEL: frees arg after fn; NULL: fn
                                 * does, or a graph owns it */
    int64_t not_before;         /* ns, CLOCK_MONOTONIC: its random latency */
};

struct mock_graph_ {
    std::vector<op_> ops;       /* captured, in stream order */
    int refs;                   /* the graph and its instances */
};

struct mock_graph_exec_ {
    mock_graph_ *g;
};

struct mock_stream_ {
    std::deque<op_> q;
    int device;                 /* current when it was made */
    mock_graph_ *cap;           /* capturing into it, or NULL */
    int cap_mode;               /* cap: its cudaStreamCaptureMode */
    pthread_t cap_thread;       /* cap: the thread that began it */
    int busy;                   /* its front operation is running */
    int dead;                   /* destroyed */
    int nonblocking;            /* cudaStreamNonBlocking: not synchronised
                                 * with the legacy default stream */
};

struct mock_event_ {
    unsigned flags;
    int device;                 /* current when it was made */
    long issued;                /* records made */
    std::set<long> pending;     /* records not yet reached by their stream */
    int dead;
};

enum { MEM_DEVICE, MEM_PINNED };
struct block_ {
    size_t n;
    int kind;
    int device;                 /* MEM_DEVICE: whose memory */
};

static pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_;      /* on CLOCK_MONOTONIC (init_cv_) */
/* Made once and never destroyed: GPU threads still running when the
 * program exits must not find them torn down by static destructors. */
static std::vector<mock_stream_ *> &streams_ =
    *new std::vector<mock_stream_ *>();
static std::vector<mock_event_ *> &events_ = *new std::vector<mock_event_ *>();
static std::map<uintptr_t, block_> &blocks_ =   /* by start address */
    *new std::map<uintptr_t, block_>();
static std::vector<pthread_t> &gpu_ = *new std::vector<pthread_t>();
static int quit_, max_delay_us_;
static std::mt19937 &rng_ = *new std::mt19937();
static long errors_;
static int started_, explicit_start_;
#define MOCK_DEVICES_MAX 8
#define MOCK_DEVICE_BYTES ((size_t)1 << 30)
static size_t device_in_use_[MOCK_DEVICES_MAX]; /* bytes in cudaMalloc blocks */
static size_t device_peak_[MOCK_DEVICES_MAX];   /* the most in use so far */
static EMU_TLS int cur_;   /* the thread's current device */
static EMU_TLS cudaError_t last_ = cudaSuccess;
static int sticky_;             /* an injected kernel fault has happened */
static long launches_;          /* kernel launches (M6_EMU_FAULT_LAUNCH) */
static long host_waits_;        /* emu_host_waits (emu_counts.h) */
static long stream_ops_;        /* emu_stream_ops */
static long captures_, graph_launches_; /* emu_graph_captures, _launches */
static int global_captures_;    /* captures now in cudaStreamCaptureModeGlobal
                                 * (lock held) */
static EMU_TLS int my_captures_; /* this thread's, global or thread-local */

static void start_locked_(unsigned seed, int gpu_threads, int max_delay_us);
static cudaError_t event_sync_(cudaEvent_t e);
static int device_count_(void);

/* $M6_EMU_DEVICE_LOG: each device's peak, at a normal exit */
static void log_peaks_(void)
{
    const char *path = getenv("M6_EMU_DEVICE_LOG");
    FILE *f = path && *path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    /* exit(1) may come from a thread holding the lock (a fatal misuse):
     * then read the peaks without it, rather than hang */
    int locked = pthread_mutex_trylock(&mu_) == 0;
    for (int d = 0; d < device_count_(); d++)
        fprintf(f, "device %d peak_bytes %zu\n", d, device_peak_[d]);
    if (locked)
        pthread_mutex_unlock(&mu_);
    fclose(f);
}

__attribute__((constructor)) static void init_cv_(void)
{
    atexit(log_peaks_);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cv_, &ca);
    pthread_condattr_destroy(&ca);
}

/* ------------------------------------------------------------ helpers */

/* Report a misuse of the API: printed, counted (atomically: callers may
 * hold the lock or not), returned and remembered as the real errors are. */
static cudaError_t misuse_(cudaError_t e, const char *what)
{
    __atomic_add_fetch(&errors_, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "MOCK: %s\n", what);
    if (!__atomic_load_n(&explicit_start_, __ATOMIC_RELAXED)) {
        fprintf(stderr, "MOCK: misuse of the CUDA API or of a kernel: "
                        "exiting\n");
        exit(1);
    }
    last_ = e;
    return e;
}

static void count_wait_(void)
{
    __atomic_add_fetch(&host_waits_, 1, __ATOMIC_RELAXED);
}

long emu_host_waits(void)
{
    return __atomic_load_n(&host_waits_, __ATOMIC_RELAXED);
}

long emu_stream_ops(void)
{
    return __atomic_load_n(&stream_ops_, __ATOMIC_RELAXED);
}

long emu_graph_captures(void)
{
    return __atomic_load_n(&captures_, __ATOMIC_RELAXED);
}

long emu_graph_launches(void)
{
    return __atomic_load_n(&graph_launches_, __ATOMIC_RELAXED);
}

/* What the real runtime refuses while a stream captures: allocating or
 * freeing memory and the legacy default stream, from the thread that
 * began a capture in the global or thread-local mode, and from every
 * thread while any capture in the global mode is on; and the legacy
 * stream (legacy 1) from any thread while a blocking stream of the
 * current device captures, whose capture it would join implicitly
 * (cudaErrorStreamCaptureImplicit). A thread-local capture, m6's, leaves
 * the other threads free otherwise: the ranks of a node capture and
 * allocate at once, each on its own device. */
static cudaError_t capture_refuses_(const char *what, int legacy = 0)
{
    pthread_mutex_lock(&mu_);
    int n = global_captures_ + my_captures_;
    for (size_t i = 0; legacy && i < streams_.size(); i++) {
        const mock_stream_ *s = streams_[i];
        n += s->cap && !s->dead && !s->nonblocking && s->device == cur_;
    }
    pthread_mutex_unlock(&mu_);
    if (!n)
        return cudaSuccess;
    char msg[160];
    snprintf(msg, sizeof msg, "%s while a stream captures (refused by the "
             "runtime in a capture)", what);
    return misuse_(cudaErrorStreamCaptureUnsupported, msg);
}

void mock_misuse(const char *what)
{
    misuse_(cudaErrorInvalidValue, what);
}

void mock_bad_launch(void)
{
    last_ = cudaErrorInvalidConfiguration;
}

int mock_launch_faults(void)
{
    static long fault_at = -2;  /* -2 not read yet, -1 none */
    long n = __atomic_add_fetch(&launches_, 1, __ATOMIC_RELAXED);
    if (fault_at == -2) {
        const char *e = getenv("M6_EMU_FAULT_LAUNCH");
        fault_at = e ? strtol(e, NULL, 10) : -1;
    }
    return n == fault_at;
}

static void fault_(void *unused)
{
    (void)unused;
    __atomic_store_n(&sticky_, 1, __ATOMIC_RELAXED);
}

void mock_launch_fault(cudaStream_t s)
{
    mock_launch(s, fault_, NULL);
}

/* A synchronising call's result once its wait is over: the sticky fault,
 * if one has happened, else e. */
static cudaError_t synced_(cudaError_t e)
{
    if (__atomic_load_n(&sticky_, __ATOMIC_RELAXED))
        return cudaErrorIllegalAddress;
    return e;
}

static cudaError_t ret_(cudaError_t e)
{
    if (e != cudaSuccess)
        last_ = e;
    return e;
}

long mock_errors(void)
{
    return __atomic_load_n(&errors_, __ATOMIC_RELAXED);
}

/* The allocation holding [p, p + n) whole, or NULL. Lock held. */
static const block_ *block_of_(const void *p, size_t n, uintptr_t *start)
{
    uintptr_t a = (uintptr_t)p;
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin())
        return NULL;
    --it;
    if (a + n > it->first + it->second.n)
        return NULL;
    if (start)
        *start = it->first;
    return &it->second;
}

/* Whether [p, p + n) overlaps any device allocation. Lock held. */
static int touches_device_(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, b = a + n;
    auto it = blocks_.lower_bound(b);
    while (it != blocks_.begin()) {
        --it;
        if (it->first + it->second.n <= a)
            break;
        if (it->second.kind == MEM_DEVICE)
            return 1;
    }
    return 0;
}

static int is_device_(const void *p, size_t n)
{
    const block_ *b = block_of_(p, n, NULL);
    return b && b->kind == MEM_DEVICE;
}

int mock_is_device(const void *p, size_t n)
{
    pthread_mutex_lock(&mu_);
    const block_ *b = block_of_(p, n, NULL);
    int r = b && b->kind == MEM_DEVICE && b->device == cur_;
    pthread_mutex_unlock(&mu_);
    return r;
}

/* Whether [p, p + n) lies in one device or one pinned allocation. Lock
 * held. */
static int pinned_or_device_(const void *p, size_t n)
{
    return block_of_(p, n, NULL) != NULL;
}

static int stream_ok_(cudaStream_t s)
{
    return s && !s->dead;
}

static int event_ok_(cudaEvent_t e)
{
    return e && !e->dead;
}

/* $M6_EMU_DEVICES (physical) through CUDA_VISIBLE_DEVICES: how many
 * devices are visible */
static int visible_(void)
{
    const char *s = getenv("M6_EMU_DEVICES");
    char *end;
    long n = s && *s ? strtol(s, &end, 10) : 1;
    if (s && *s && (*end || n < 1 || n > MOCK_DEVICES_MAX)) {
        fprintf(stderr, "MOCK: M6_EMU_DEVICES=%s: want 1 to %d\n", s,
                MOCK_DEVICES_MAX);
        exit(1);
    }
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return (int)n;
    int k = 0;
    while (*v && k < MOCK_DEVICES_MAX) {
        long d = strtol(v, &end, 10);
        if (end == v || d < 0 || d >= n) break;  /* the list ends here */
        k++;
        if (*end != ',') break;
        v = end + 1;
    }
    return k;
}

/* The devices' environment, read once: how many are visible, and each
 * one's memory ($M6_EMU_DEVICE_MIB, else MOCK_DEVICE_BYTES). */
static int n_devices_;
static size_t device_bytes_v_;
static pthread_once_t env_once_ = PTHREAD_ONCE_INIT;

static void env_read_(void)
{
    n_devices_ = visible_();
    const char *s = getenv("M6_EMU_DEVICE_MIB");
    long mib = s && *s ? atol(s) : 0;
    device_bytes_v_ = mib > 0 ? (size_t)mib << 20 : MOCK_DEVICE_BYTES;
}

static int device_count_(void)
{
    pthread_once(&env_once_, env_read_);
    return n_devices_;
}

static size_t device_bytes_(void)
{
    pthread_once(&env_once_, env_read_);
    return device_bytes_v_;
}

/* Whether every stream (blocking_only: every stream the legacy default
 * stream synchronises with) is idle. Lock held. */
static int all_idle_(int blocking_only = 0, int device = -1)
{
    for (mock_stream_ *s : streams_)
        if ((!s->q.empty() || s->busy) && !(blocking_only && s->nonblocking)
            && (device < 0 || s->device == device))
            return 0;
    return 1;
}

/* Wait until every stream is idle. Lock held. */
static void wait_idle_locked_(void)
{
    while (!all_idle_())
        pthread_cond_wait(&cv_, &mu_);
}

/* Wait as an operation on the legacy default stream does: for the work
 * queued on every stream not created with cudaStreamNonBlocking. Lock
 * held. (Stricter than a GPU: that work queued later, while it waits, is
 * waited for too.) */
static void wait_legacy_locked_(void)
{
    while (!all_idle_(1, cur_))
        pthread_cond_wait(&cv_, &mu_);
}

/* ------------------------------------------------------------ the GPU */

static int64_t now_ns_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Carry out one queued operation (a copy, a memset or a kernel, whose
 * argument block is then dropped), without the lock. */
static void exec_op_(const op_ &o)
{
    switch (o.kind) {
    case OP_COPY:
        memcpy(o.dst, o.src, o.n);
        break;
    case OP_SET:
        memset(o.dst, o.value, o.n);
        break;
    case OP_KERNEL:
        o.fn(o.arg);
        if (o.drop)
            o.drop(o.arg);
        break;
    default:
        break;
    }
}

/* Each GPU thread: take the front operation of a random stream that may
 * start (not running, its latency passed, its awaited event complete), run
 * it outside the lock, retire it. */
static void *gpu_main_(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&mu_);
    for (;;) {
        std::vector<mock_stream_ *> ready;
        int64_t now = now_ns_(), wake = INT64_MAX;
        for (mock_stream_ *s : streams_) {
            if (s->busy || s->q.empty())
                continue;
            const op_ &o = s->q.front();
            if (o.kind == OP_WAIT && o.ev->pending.count(o.seq))
                continue;
            if (o.not_before > now) {
                if (o.not_before < wake)
                    wake = o.not_before;
                continue;
            }
            ready.push_back(s);
        }
        if (ready.empty()) {
            if (quit_)
                break;
            if (wake == INT64_MAX) {
                pthread_cond_wait(&cv_, &mu_);
            } else {
                struct timespec ts = {(time_t)(wake / 1000000000),
                                      (long)(wake % 1000000000)};
                pthread_cond_timedwait(&cv_, &mu_, &ts);
            }
            continue;
        }
        mock_stream_ *s = ready[rng_() % ready.size()];
        op_ o = s->q.front();
        s->busy = 1;
        pthread_mutex_unlock(&mu_);
        exec_op_(o);
        pthread_mutex_lock(&mu_);
        if (o.kind == OP_RECORD)
            o.ev->pending.erase(o.seq);
        s->q.pop_front();
        s->busy = 0;
        pthread_cond_broadcast(&cv_);
    }
    pthread_mutex_unlock(&mu_);
    return NULL;
}

/* Lock held; the new threads wait for it. */
static void start_locked_(unsigned seed, int gpu_threads, int max_delay_us)
{
    rng_.seed(seed);
    max_delay_us_ = max_delay_us;
    quit_ = 0;
    gpu_.resize(gpu_threads < 1 ? 1 : (size_t)gpu_threads);
    for (pthread_t &t : gpu_)
        if (pthread_create(&t, NULL, gpu_main_, NULL) != 0) {
            fprintf(stderr, "MOCK: cannot start a GPU thread\n");
            exit(1);
        }
    started_ = 1;
}

void mock_start(unsigned seed, int gpu_threads, int max_delay_us)
{
    pthread_mutex_lock(&mu_);
    __atomic_store_n(&explicit_start_, 1, __ATOMIC_RELAXED);
    start_locked_(seed, gpu_threads, max_delay_us);
    pthread_mutex_unlock(&mu_);
}

void mock_stop(void)
{
    pthread_mutex_lock(&mu_);
    wait_idle_locked_();
    quit_ = 1;
    pthread_cond_broadcast(&cv_);
    pthread_mutex_unlock(&mu_);
    for (pthread_t &t : gpu_)
        pthread_join(t, NULL);
    gpu_.clear();
    for (mock_stream_ *s : streams_)
        delete s;
    streams_.clear();
    for (mock_event_ *e : events_)
        delete e;
    events_.clear();
    started_ = 0;
}

/* Queue o on s with a random latency: half the operations may start at
 * once, the others up to max_delay_us later. Lock held. */
static void queue_(cudaStream_t s, op_ o)
{
    if (!started_) { /* M6_EMU_SEED, M6_EMU_DELAY_US: see the top */
        const char *seed = getenv("M6_EMU_SEED");
        const char *delay = getenv("M6_EMU_DELAY_US");
        start_locked_(seed ? (unsigned)strtoul(seed, NULL, 10) : 1, 2,
                      delay ? atoi(delay) : 0);
    }
    o.not_before = 0;
    if (max_delay_us_ > 0 && rng_() % 2)
        o.not_before = now_ns_() +
                       (int64_t)(rng_() % (unsigned)max_delay_us_) * 1000;
    s->q.push_back(o);
    pthread_cond_broadcast(&cv_);
}

/* An operation on the legacy default stream (stream 0): once every stream
 * is idle, run it here. */
static void run_legacy_(const op_ &o)
{
    pthread_mutex_lock(&mu_);
    wait_legacy_locked_();
    pthread_mutex_unlock(&mu_);
    exec_op_(o);
}

static cudaError_t push_(cudaStream_t s, const op_ &o)
{
    if (!s) {
        if (o.kind != OP_RECORD && o.kind != OP_WAIT &&
            capture_refuses_("an operation on the legacy default stream",
                             1) !=
                cudaSuccess)
            return last_;
        __atomic_add_fetch(&stream_ops_, 1, __ATOMIC_RELAXED);
        run_legacy_(o);
        return cudaSuccess;
    }
    pthread_mutex_lock(&mu_);
    if (!stream_ok_(s)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "operation on a destroyed or null stream");
    }
    if (o.kind == OP_KERNEL && s->device != cur_) {
        int sd = s->device;
        pthread_mutex_unlock(&mu_);
        char what[160];
        snprintf(what, sizeof what, "kernel launched on a stream of device "
                 "%d while device %d is current (cudaSetDevice first)", sd,
                 cur_);
        return misuse_(cudaErrorInvalidResourceHandle, what);
    }
    if (s->cap) { /* captured: run at each launch of the graph */
        if (o.kind == OP_KERNEL && !o.drop) {
            pthread_mutex_unlock(&mu_);
            return misuse_(cudaErrorStreamCaptureUnsupported,
                           "capture of a mock_launch whose function frees "
                           "its argument (use mock_launch_kept)");
        }
        if (o.kind == OP_COPY && (!pinned_or_device_(o.dst, o.n) ||
                                  !pinned_or_device_(o.src, o.n))) {
            pthread_mutex_unlock(&mu_);
            return misuse_(cudaErrorStreamCaptureUnsupported,
                           "capture of a copy to or from pageable host "
                           "memory (a graph's copies need pinned memory)");
        }
        s->cap->ops.push_back(o);
        pthread_mutex_unlock(&mu_);
        return cudaSuccess;
    }
    if (o.kind == OP_COPY || o.kind == OP_SET || o.kind == OP_KERNEL)
        __atomic_add_fetch(&stream_ops_, 1, __ATOMIC_RELAXED);
    queue_(s, o);
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

void mock_launch(cudaStream_t s, void (*fn)(void *), void *arg)
{
    op_ o = {};
    o.kind = OP_KERNEL;
    o.fn = fn;
    o.arg = arg;
    push_(s, o);
}

void mock_launch_kept(cudaStream_t s, void (*fn)(void *),
                      void (*drop)(void *), void *arg)
{
    op_ o = {};
    o.kind = OP_KERNEL;
    o.fn = fn;
    o.arg = arg;
    o.drop = drop;
    push_(s, o);
}

/* ------------------------------------------------------------ graphs */

/* A capturing stream refuses what the mock does not capture: event
 * records and waits (the real runtime turns them into dependencies
 * between captured streams) and synchronisation. Lock held. */
static int capturing_(cudaStream_t s)
{
    return s && stream_ok_(s) && s->cap;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    pthread_mutex_lock(&mu_);
    const char *bad = !s || !stream_ok_(s) ? "cudaStreamBeginCapture of the "
                                             "legacy or a destroyed stream"
                      : s->cap             ? "cudaStreamBeginCapture of a "
                                             "capturing stream"
                                           : NULL;
    if (!bad) {
        s->cap = new mock_graph_{std::vector<op_>(), 1};
        s->cap_mode = mode;
        s->cap_thread = pthread_self();
        global_captures_ += mode == cudaStreamCaptureModeGlobal;
        my_captures_ += mode != cudaStreamCaptureModeRelaxed;
        captures_++;
    }
    pthread_mutex_unlock(&mu_);
    return bad ? misuse_(cudaErrorStreamCaptureUnsupported, bad)
               : cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    pthread_mutex_lock(&mu_);
    if (!capturing_(s)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorIllegalState,
                       "cudaStreamEndCapture of a stream not capturing");
    }
    if (s->cap_mode != cudaStreamCaptureModeRelaxed &&
        !pthread_equal(s->cap_thread, pthread_self())) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorIllegalState,
                       "cudaStreamEndCapture from another thread than the "
                       "one that began a global or thread-local capture");
    }
    *g = s->cap;
    s->cap = NULL;
    global_captures_ -= s->cap_mode == cudaStreamCaptureModeGlobal;
    my_captures_ -= s->cap_mode != cudaStreamCaptureModeRelaxed;
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                  cudaStreamCaptureStatus *status)
{
    pthread_mutex_lock(&mu_);
    *status = capturing_(s) ? cudaStreamCaptureStatusActive
                            : cudaStreamCaptureStatusNone;
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g,
                                 unsigned long long flags)
{
    (void)flags;
    pthread_mutex_lock(&mu_);
    g->refs++;
    pthread_mutex_unlock(&mu_);
    *e = new mock_graph_exec_{g};
    return cudaSuccess;
}

/* The captured operations queued again on s, in their order; each kernel
 * runs on the arguments it was captured with (a graph's copies read and
 * write the same addresses at every launch). */
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    pthread_mutex_lock(&mu_);
    if (!s || !stream_ok_(s) || s->cap || s->device != cur_) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaGraphLaunch on the legacy, a destroyed, a "
                       "capturing stream (not emulated) or one of another "
                       "device than the current one");
    }
    graph_launches_++;
    for (op_ o : e->g->ops) {
        o.drop = NULL; /* the graph's */
        queue_(s, o);
    }
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

/* Lock held: one reference less; the last frees the kernels' arguments
 * once every stream is idle (a launch may still be running them). */
static void graph_unref_locked_(mock_graph_ *g)
{
    if (--g->refs > 0)
        return;
    wait_idle_locked_();
    for (const op_ &o : g->ops)
        if (o.kind == OP_KERNEL && o.drop)
            o.drop(o.arg);
    delete g;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    pthread_mutex_lock(&mu_);
    graph_unref_locked_(e->g);
    pthread_mutex_unlock(&mu_);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    pthread_mutex_lock(&mu_);
    graph_unref_locked_(g);
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

/* ------------------------------------------------------------ device */

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = device_count_();
    return *n > 0 ? cudaSuccess : ret_(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (device < 0 || device >= device_count_())
        return ret_(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "mock GPU %d", device);
    p->major = 9;
    p->totalGlobalMem = device_bytes_();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = cur_;
    return cudaSuccess;
}

/* As the real one: an index outside the visible devices is an error
 * returned (cudaErrorInvalidDevice), not a misuse. */
cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count_())
        return ret_(cudaErrorInvalidDevice);
    cur_ = device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_;
    last_ = cudaSuccess;
    return synced_(e); /* a sticky fault is never cleared */
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    if (e == cudaErrorIllegalAddress)
        return "an illegal memory access was encountered (injected: "
               "M6_EMU_FAULT_LAUNCH)";
    return e == cudaSuccess ? "no error" : "mock CUDA runtime error";
}

/* ------------------------------------------------------------ memory */

static cudaError_t alloc_(void **p, size_t n, int kind)
{
    if (capture_refuses_("an allocation") != cudaSuccess)
        return last_;
    if (kind == MEM_DEVICE) {
        pthread_mutex_lock(&mu_);
        int full = n > device_bytes_() - device_in_use_[cur_];
        if (!full && (device_in_use_[cur_] += n) > device_peak_[cur_])
            device_peak_[cur_] = device_in_use_[cur_];
        pthread_mutex_unlock(&mu_);
        if (full)
            return ret_(cudaErrorMemoryAllocation);
    }
    /* aligned as CUDA documents: any address an allocation routine
     * returns is aligned to at least 256 bytes (cudaHostAlloc: a page) */
    size_t align = kind == MEM_DEVICE ? 256 : 4096;
    *p = aligned_alloc(align, (n + align - 1) / align * align + (n ? 0 : align));
    if (!*p)
        return ret_(cudaErrorMemoryAllocation);
    if (kind == MEM_DEVICE)
        memset(*p, 0xff, n); /* NaN for whoever reads it unwritten */
    pthread_mutex_lock(&mu_);
    blocks_[(uintptr_t)*p] = block_{n, kind, cur_};
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

/* Free a block of the kind given, after the device has gone idle (as the
 * real cudaFree and cudaFreeHost synchronise). */
static cudaError_t free_(void *p, int kind)
{
    if (!p)
        return cudaSuccess;
    if (capture_refuses_("freeing memory") != cudaSuccess)
        return last_;
    pthread_mutex_lock(&mu_);
    auto it = blocks_.find((uintptr_t)p);
    if (it == blocks_.end() || it->second.kind != kind) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidValue,
                       kind == MEM_DEVICE ? "cudaFree of a pointer not from "
                                            "cudaMalloc"
                                          : "cudaFreeHost of a pointer not "
                                            "from cudaHostAlloc");
    }
    wait_idle_locked_();
    if (kind == MEM_DEVICE)
        device_in_use_[it->second.device] -= it->second.n;
    blocks_.erase(it);
    pthread_mutex_unlock(&mu_);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&mu_);
    *free_bytes = device_bytes_() - device_in_use_[cur_];
    *total = device_bytes_();
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    return alloc_(p, n, MEM_DEVICE);
}

cudaError_t cudaFree(void *p)
{
    if (p)
        count_wait_();
    return free_(p, MEM_DEVICE);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    return alloc_(p, n, MEM_PINNED);
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    return alloc_(p, n, MEM_PINNED);
}

cudaError_t cudaFreeHost(void *p)
{
    if (p)
        count_wait_();
    return free_(p, MEM_PINNED);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            cudaMemcpyKind kind, cudaStream_t s)
{
    const char *bad = NULL;
    pthread_mutex_lock(&mu_);
    int dd = is_device_(dst, n), sd = is_device_(src, n);
    int dt = touches_device_(dst, n), st = touches_device_(src, n);
    pthread_mutex_unlock(&mu_);
    if (kind == cudaMemcpyDefault) /* unified addressing: from the pointers */
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    switch (kind) {
    case cudaMemcpyHostToDevice:
        if (!dd || st)
            bad = "host-to-device copy not into one device allocation or "
                  "not from host memory";
        break;
    case cudaMemcpyDeviceToHost:
        if (!sd || dt)
            bad = "device-to-host copy not from one device allocation or "
                  "not into host memory";
        break;
    case cudaMemcpyDeviceToDevice:
        if (!dd || !sd)
            bad = "device-to-device copy outside the device allocations";
        break;
    case cudaMemcpyHostToHost:
        if (dt || st)
            bad = "host-to-host copy touching device memory";
        break;
    default:
        bad = "cudaMemcpyAsync kind not supported by the mock";
        break;
    }
    if (bad)
        return misuse_(cudaErrorInvalidValue, bad);
    op_ o = {};
    o.kind = OP_COPY;
    o.dst = dst;
    o.src = src;
    o.n = n;
    return ret_(push_(s, o));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                       cudaMemcpyKind kind)
{
    count_wait_();
    return synced_(cudaMemcpyAsync(dst, src, n, kind, 0));
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    count_wait_();
    return synced_(cudaMemsetAsync(dst, value, n, 0));
}

cudaError_t cudaDeviceSynchronize(void)
{
    count_wait_();
    pthread_mutex_lock(&mu_);
    while (!all_idle_(0, cur_)) /* the current device's streams */
        pthread_cond_wait(&cv_, &mu_);
    pthread_mutex_unlock(&mu_);
    return synced_(cudaSuccess);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s)
{
    pthread_mutex_lock(&mu_);
    int ok = is_device_(dst, n);
    pthread_mutex_unlock(&mu_);
    if (!ok)
        return misuse_(cudaErrorInvalidValue,
                       "cudaMemsetAsync outside the device allocations");
    op_ o = {};
    o.kind = OP_SET;
    o.dst = dst;
    o.value = value;
    o.n = n;
    return ret_(push_(s, o));
}

/* ------------------------------------------------------------ streams */

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    mock_stream_ *st = new mock_stream_();
    st->busy = st->dead = st->nonblocking = 0;
    st->device = cur_;
    pthread_mutex_lock(&mu_);
    streams_.push_back(st);
    pthread_mutex_unlock(&mu_);
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    cudaError_t e = cudaStreamCreate(s);
    if (e == cudaSuccess && (flags & cudaStreamNonBlocking)) {
        pthread_mutex_lock(&mu_);
        (*s)->nonblocking = 1;
        pthread_mutex_unlock(&mu_);
    }
    return e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!s)
        return cudaDeviceSynchronize();
    count_wait_();
    pthread_mutex_lock(&mu_);
    if (!stream_ok_(s)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaStreamSynchronize of a destroyed stream");
    }
    if (s->cap) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorStreamCaptureUnsupported,
                       "cudaStreamSynchronize of a capturing stream");
    }
    while (!s->q.empty() || s->busy)
        pthread_cond_wait(&cv_, &mu_);
    pthread_mutex_unlock(&mu_);
    return synced_(cudaSuccess);
}

/* The real one returns at once and lets queued work finish; the mock keeps
 * the stream (freed by mock_stop), so letting it finish is the same. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    pthread_mutex_lock(&mu_);
    if (!stream_ok_(s)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaStreamDestroy of a destroyed stream");
    }
    s->dead = 1; /* queued work still runs: the GPU threads don't look */
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    if (!s) /* legacy stream: its later work runs after the event */
        return event_sync_(e); /* a wait here, not the host's on a GPU */
    pthread_mutex_lock(&mu_);
    if (!stream_ok_(s) || !event_ok_(e)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaStreamWaitEvent on a destroyed stream or event");
    }
    if (s->cap) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorStreamCaptureUnsupported,
                       "cudaStreamWaitEvent on a capturing stream (not "
                       "emulated)");
    }
    if (e->issued > 0) { /* never recorded: nothing to wait for */
        op_ o = {};
        o.kind = OP_WAIT;
        o.ev = e;
        o.seq = e->issued;
        queue_(s, o);
    }
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

/* ------------------------------------------------------------ events */

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    mock_event_ *ev = new mock_event_();
    ev->flags = flags;
    ev->device = cur_;
    ev->issued = 0;
    ev->dead = 0;
    pthread_mutex_lock(&mu_);
    events_.push_back(ev);
    pthread_mutex_unlock(&mu_);
    *e = ev;
    return cudaSuccess;
}

/* As the real one, legal with records pending (they still complete); the
 * memory is kept until mock_stop so that later misuse is caught. */
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    pthread_mutex_lock(&mu_);
    if (!event_ok_(e)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventDestroy of a destroyed event");
    }
    e->dead = 1;
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    pthread_mutex_lock(&mu_);
    if (!s && event_ok_(e) && e->device != cur_) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventRecord of an event of one device on "
                       "another device's legacy stream");
    }
    if (!s && event_ok_(e)) { /* legacy stream: complete at once */
        wait_legacy_locked_();
        e->issued++;
        pthread_mutex_unlock(&mu_);
        return cudaSuccess;
    }
    if (!stream_ok_(s) || !event_ok_(e)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventRecord on a destroyed stream or event");
    }
    if (e->device != s->device) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventRecord of an event of one device on a "
                       "stream of another");
    }
    if (s->cap) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorStreamCaptureUnsupported,
                       "cudaEventRecord on a capturing stream (not "
                       "emulated)");
    }
    op_ o = {};
    o.kind = OP_RECORD;
    o.ev = e;
    o.seq = ++e->issued;
    e->pending.insert(o.seq);
    queue_(s, o);
    pthread_mutex_unlock(&mu_);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    count_wait_();
    return event_sync_(e);
}

static cudaError_t event_sync_(cudaEvent_t e)
{
    pthread_mutex_lock(&mu_);
    if (!event_ok_(e)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventSynchronize of a destroyed event");
    }
    long seq = e->issued;
    while (e->pending.count(seq))
        pthread_cond_wait(&cv_, &mu_);
    pthread_mutex_unlock(&mu_);
    return synced_(cudaSuccess);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    pthread_mutex_lock(&mu_);
    if (!event_ok_(e)) {
        pthread_mutex_unlock(&mu_);
        return misuse_(cudaErrorInvalidResourceHandle,
                       "cudaEventQuery of a destroyed event");
    }
    cudaError_t r = e->pending.count(e->issued) ? cudaErrorNotReady
                                                : cudaSuccess;
    pthread_mutex_unlock(&mu_);
    return ret_(r); /* NotReady is remembered too, as by the real runtime */
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    const char *bad = NULL;
    cudaError_t e = cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&mu_);
    if (!event_ok_(a) || !event_ok_(b))
        bad = "cudaEventElapsedTime of a destroyed event";
    else if ((a->flags | b->flags) & cudaEventDisableTiming)
        bad = "cudaEventElapsedTime of an event made with "
              "cudaEventDisableTiming";
    else if (a->issued == 0 || b->issued == 0)
        bad = "cudaEventElapsedTime of an event never recorded";
    else if (a->pending.count(a->issued) || b->pending.count(b->issued)) {
        bad = "cudaEventElapsedTime of an event not complete";
        e = cudaErrorNotReady;
    }
    pthread_mutex_unlock(&mu_);
    if (bad)
        return misuse_(e, bad);
    *ms = 0.001f;
    return cudaSuccess;
}
