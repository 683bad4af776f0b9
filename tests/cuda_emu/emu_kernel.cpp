/*
 * emu_kernel.cpp — kernel execution for the CPU emulation of CUDA
 * (emu_kernel.h): a grid's blocks one after the other, a block's threads as
 * fibers on the OS thread that runs the launch (a GPU thread of
 * mock_cuda.cpp, or the caller for stream 0).
 *
 * A thread runs until it finishes or waits: at __syncthreads() for every
 * thread of its block still running, in a shuffle or mma.sync for every
 * lane of its warp. Then the next ready thread runs, its own warp's lanes
 * first: a fiber switches straight to another, and a thread that finishes
 * hands its stack to the next one that has not started (a kernel without
 * barriers runs its threads one after the other without a switch). The
 * last lane of a warp to arrive at a shuffle releases the warp. When no
 * thread is ready, the scheduler releases __syncthreads() if every thread
 * still running waits there; if nothing can be released, the block is
 * stuck (a barrier some threads skip, a shuffle some lanes skip):
 * reported (fatal unless the mock was started by mock_start).
 *
 * Threads run on "workers": fiber stacks that each run one thread after
 * another and are kept per OS thread; the scheduler is a worker too, on
 * the OS thread's own stack. Switching between two workers saves the
 * callee-saved registers and swaps stack pointers (a few
 * instructions of assembly on x86-64; elsewhere ucontext for the first
 * entry and _setjmp/_longjmp after it), with no system call, which is what
 * makes a launch of a million threads cheap.
 */
#undef _FORTIFY_SOURCE /* its longjmp check refuses jumps between stacks */
#include "cuda_runtime.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <map>
#include <vector>

#if defined(__x86_64__)
/* emu_switch(&save_sp, new_sp): push the callee-saved registers (System V
 * ABI), store the stack pointer in save_sp, load new_sp, pop, return there.
 * MXCSR and the x87 control word are callee-saved too, but nothing here
 * changes them. */
extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n"
    "  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n"
    "  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");
#define EMU_ASM_SWITCH 1
#endif

/* AddressSanitizer must be told when the stack changes under it. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

namespace emu {
namespace {

enum { READY, AT_BLOCK, AT_WARP, DONE };

enum { STACK_BYTES = 64 << 10, MAX_THREADS = 1024 };

struct worker {
#ifdef EMU_ASM_SWITCH
    void *sp;                   /* its saved stack pointer */
#else
    jmp_buf jb;                 /* where it continues when resumed */
    ucontext_t uc;              /* its first entry only */
#endif
    char *stack;
    int started;
};

struct fiber {
    uint3 tid;
    int lin;                    /* linear thread index in the block */
    int state;
    unsigned shuffles;          /* warp exchanges made so far */
    worker *w;                  /* while started and not done */
};

struct block_run {
    dim3 grid, block;
    uint3 bid;
    const std::function<void()> *body;
    std::vector<fiber> fibers;
    int ready;                  /* fibers in state READY */
    int arrived[MAX_THREADS / 32]; /* lanes of each warp at AT_WARP */
    std::vector<worker *> free_workers; /* started, their thread done */
    int n_workers;              /* of this OS thread's, in use this block */
    /* shuffle values by linear thread index, two sets used in turn: a lane
     * may publish its next value while the others still read this one */
    uint64_t xchg[2][MAX_THREADS];
    /* mma.sync operands (a[4], b[2]) by linear thread index, in turn too */
    uint32_t mma[2][MAX_THREADS][6];
    /* a warp's mma operands as floats, A (16 x 16) and B (16 x 8), decoded
     * by the first of its lanes to go on past the exchange and read by the
     * other 31; valid for the block (epoch) and the warp's collective call
     * (its lanes' shuffle count) they were decoded at */
    float mma_af[MAX_THREADS / 32][16][16];
    float mma_bf[MAX_THREADS / 32][16][8];
    unsigned long mma_epoch[MAX_THREADS / 32];
    int mma_call[MAX_THREADS / 32];
    int stuck;
};

/* Per OS thread: the block it runs, the thread running, the scheduler (a
 * worker whose stack is the OS thread's own), the workers (created on
 * first need, kept). */
EMU_TLS block_run *blk_;
EMU_TLS fiber *cur_;
EMU_TLS worker sched_w_;
EMU_TLS std::vector<worker *> *workers_;
EMU_TLS unsigned long block_epoch_;    /* blocks run on this thread */
EMU_TLS std::map<void *, unsigned long> *fresh_; /* shared_fresh */
#ifdef EMU_ASAN
EMU_TLS const void *sched_bottom_; /* the scheduler's stack */
EMU_TLS size_t sched_size_;
#endif

/* AddressSanitizer's side of a switch: before it, where to; after it, back
 * on the stack that switched away. No-ops without ASan. */
inline void asan_leave_(void **fake, const worker *to)
{
#ifdef EMU_ASAN
    if (to == &sched_w_)
        __sanitizer_start_switch_fiber(fake, sched_bottom_, sched_size_);
    else
        __sanitizer_start_switch_fiber(fake, to->stack, STACK_BYTES);
#else
    (void)fake, (void)to;
#endif
}

inline void asan_back_(void *fake)
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)fake;
#endif
}

void worker_main_(void);

/* From the code running on worker `from` (a fiber's, or the scheduler's)
 * to worker `to`, entering worker_main_ if `to` has not started; returns
 * when something switches back to `from`. */
void switch_(worker *from, worker *to)
{
#ifdef EMU_ASM_SWITCH
    if (!to->started) {
        /* a frame that emu_switch's pops and ret enter worker_main_ with,
         * the stack aligned as after a call */
        uintptr_t top = ((uintptr_t)to->stack + STACK_BYTES) & ~(uintptr_t)15;
        void **sp = (void **)top;
        *--sp = NULL;                       /* worker_main_'s return address */
        *--sp = (void *)worker_main_;       /* where ret goes */
        for (int i = 0; i < 6; i++)
            *--sp = NULL;                   /* rbp rbx r12 r13 r14 r15 */
        to->sp = sp;
        to->started = 1;
    }
    void *fake = NULL;
    asan_leave_(&fake, to);
    emu_switch(&from->sp, to->sp);
    asan_back_(fake);
#else
    if (_setjmp(from->jb))
        return; /* switched back to */
    if (to->started)
        _longjmp(to->jb, 1);
    to->started = 1;
    getcontext(&to->uc);
    to->uc.uc_stack.ss_sp = to->stack;
    to->uc.uc_stack.ss_size = STACK_BYTES;
    to->uc.uc_link = NULL;
    makecontext(&to->uc, worker_main_, 0);
    setcontext(&to->uc);
#endif
}

worker *worker_(int i)
{
    if (!workers_)
        workers_ = new std::vector<worker *>();
    while ((int)workers_->size() <= i) {
        worker *w = new worker();
        w->stack = (char *)malloc(STACK_BYTES);
        if (!w->stack) {
            fprintf(stderr, "EMU: out of memory for fiber stacks\n");
            abort();
        }
        w->started = 0;
        workers_->push_back(w);
    }
    return (*workers_)[i];
}

/* A worker for fiber f, which has none: one whose thread is done, else the
 * next of this OS thread's. */
void give_worker_(block_run *b, fiber *f)
{
    if (!b->free_workers.empty()) {
        f->w = b->free_workers.back();
        b->free_workers.pop_back();
    } else {
        f->w = worker_(b->n_workers++);
    }
}

/* The fiber to run after f has waited or finished: the next ready lane of
 * f's warp after it, then before it (a warp's lanes run together, their
 * stacks warm), then the later warps, then the earlier ones; NULL when
 * none is ready (the scheduler's turn: a barrier to release, or the end) */
fiber *next_ready_(block_run *b, fiber *f)
{
    if (b->ready == 0)
        return NULL;
    int n = (int)b->fibers.size();
    int base = f->lin - f->lin % 32, end = base + 32 < n ? base + 32 : n;
    for (int i = f->lin + 1; i < end; i++)
        if (b->fibers[i].state == READY)
            return &b->fibers[i];
    for (int i = base; i < f->lin; i++)
        if (b->fibers[i].state == READY)
            return &b->fibers[i];
    for (int i = end; i < n; i++)
        if (b->fibers[i].state == READY)
            return &b->fibers[i];
    for (int i = 0; i < base; i++)
        if (b->fibers[i].state == READY)
            return &b->fibers[i];
    return NULL;
}

/* Leave fiber f (state already set, not READY) for the next ready fiber,
 * or the scheduler when none is; back here when f runs again. */
void leave_(fiber *f)
{
    block_run *b = blk_;
    fiber *g = next_ready_(b, f);
    if (!g) {
        switch_(f->w, &sched_w_);
        return;
    }
    if (!g->w)
        give_worker_(b, g);
    cur_ = g;
    switch_(f->w, g->w);
}

/* The running thread waits (state AT_BLOCK or AT_WARP) until released. */
void wait_(int state)
{
    fiber *f = cur_;
    f->state = state;
    blk_->ready--;
    leave_(f);
}

/* A worker's life: run the thread it is given; when it finishes, run the
 * next ready thread that has not started on the same stack (no switch),
 * or hand the stack back and go to the next ready one, or to the
 * scheduler. Never returns. */
void worker_main_(void)
{
#ifdef EMU_ASAN
    /* the first worker of this OS thread starts from the scheduler */
    const void *old_bottom;
    size_t old_size;
    __sanitizer_finish_switch_fiber(NULL, &old_bottom, &old_size);
    if (!sched_bottom_) {
        sched_bottom_ = old_bottom;
        sched_size_ = old_size;
    }
#endif
    for (;;) {
        fiber *f = cur_;
        (*blk_->body)();
        block_run *b = blk_;
        f->state = DONE;
        b->ready--;
        worker *w = f->w;
        f->w = NULL;
        fiber *g = next_ready_(b, f);
        if (g && !g->w) {
            g->w = w; /* the same stack, from its top */
            cur_ = g;
            continue;
        }
        b->free_workers.push_back(w);
        if (g)
            cur_ = g;
        switch_(w, g ? g->w : &sched_w_);
    }
}

/* The scheduler's side: run ready fibers until none is; returns whether
 * any ran. */
int run_ready_(block_run *b)
{
    for (fiber &f : b->fibers) {
        if (f.state != READY)
            continue;
        if (!f.w)
            give_worker_(b, &f);
        cur_ = &f;
        switch_(&sched_w_, f.w);
        return 1;
    }
    return 0;
}

/* Lanes base..end-1 of a warp, all at AT_WARP: whether they are at the same
 * shuffle call (else reported, the block stuck); if so, released. */
int release_warp_(block_run *b, int base, int end)
{
    for (int i = base; i < end; i++)
        if (b->fibers[i].shuffles != b->fibers[base].shuffles) {
            mock_misuse("warp shuffles that disagree: lanes of one warp "
                        "at different shuffle calls");
            b->stuck = 1;
            return 0;
        }
    for (int i = base; i < end; i++)
        b->fibers[i].state = READY;
    b->ready += end - base;
    b->arrived[base / 32] = 0;
    return 1;
}

/* Release what can be released; returns whether any thread became ready. */
int release_(block_run *b)
{
    int n = (int)b->fibers.size(), released = 0;
    int waiting_block = 0, running = 0;
    for (fiber &f : b->fibers) {
        if (f.state != DONE)
            running++;
        if (f.state == AT_BLOCK)
            waiting_block++;
    }
    if (running > 0 && waiting_block == running) {
        for (fiber &f : b->fibers)
            if (f.state == AT_BLOCK)
                f.state = READY;
        b->ready += waiting_block;
        return 1;
    }
    for (int w = 0; w < n; w += 32) {
        int end = w + 32 < n ? w + 32 : n, all = 1, any = 0;
        for (int i = w; i < end; i++) {
            if (b->fibers[i].state == AT_WARP)
                any = 1;
            else
                all = 0;
        }
        if (!any)
            continue;
        if (!all) {
            /* a lane that exited or waits at __syncthreads() never joins */
            int blocked = 0;
            for (int i = w; i < end; i++)
                if (b->fibers[i].state == READY)
                    blocked = 1;
            if (blocked)
                continue;
            mock_misuse("warp shuffle in a warp whose lanes do not all take "
                        "part (a lane has exited, waits at __syncthreads(), "
                        "or the block is not a multiple of 32 threads)");
            b->stuck = 1;
            return 0;
        }
        if (!release_warp_(b, w, end))
            return 0;
        released = 1;
    }
    return released;
}

void run_block_(block_run *b)
{
    int n = (int)(b->block.x * b->block.y * b->block.z);
    block_epoch_++;
    sched_w_.started = 1; /* runs on this OS thread's own stack */
    b->fibers.assign(n, fiber());
    b->stuck = 0;
    b->ready = n;
    b->free_workers.clear();
    b->n_workers = 0;
    for (int i = 0; i < (n + 31) / 32; i++)
        b->arrived[i] = 0;
    for (int i = 0; i < n; i++) {
        fiber &f = b->fibers[i];
        f.lin = i;
        f.tid.x = i % b->block.x;
        f.tid.y = (i / b->block.x) % b->block.y;
        f.tid.z = i / (b->block.x * b->block.y);
        f.state = READY;
        f.shuffles = 0;
        f.w = NULL;
    }
    /* Threads take a worker when they first run and give it back when they
     * finish, so a kernel without barriers needs only one (and runs its
     * threads one after the other on it, without a switch). The fibers
     * switch among themselves; the scheduler is back when none is ready. */
    for (;;) {
        if (!b->stuck && run_ready_(b))
            continue;
        int done = !b->stuck;
        for (fiber &f : b->fibers)
            if (f.state != DONE)
                done = 0;
        if (done)
            break;
        if (b->stuck || !release_(b)) {
            if (!b->stuck)
                mock_misuse("__syncthreads() not reached by every thread of "
                            "the block still running (the block is stuck)");
            b->stuck = 1;
            /* the stuck workers are abandoned: restart them from scratch */
            for (fiber &f : b->fibers)
                if (f.w)
                    f.w->started = 0;
            for (worker *w : b->free_workers)
                w->started = 0;
            break;
        }
    }
    cur_ = NULL;
}

struct launch_ {
    dim3 grid, block;
    std::function<void()> body;
};

void run_grid_(void *arg)
{
    launch_ *l = (launch_ *)arg;
    block_run *b = new block_run();
    block_run *outer = blk_;
    b->grid = l->grid;
    b->block = l->block;
    b->body = &l->body;
    blk_ = b;
    /* the blocks in a shuffled order (Fisher-Yates on a per-thread LCG),
     * so that nothing can rely on one block running before another */
    static EMU_TLS uint64_t rng = 0x9e3779b97f4a7c15ull;
    size_t nb = (size_t)l->grid.x * l->grid.y * l->grid.z;
    std::vector<uint32_t> order(nb);
    for (size_t i = 0; i < nb; i++)
        order[i] = (uint32_t)i;
    for (size_t i = nb; i > 1; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(order[i - 1], order[(rng >> 33) % i]);
    }
    for (size_t i = 0; i < nb && !b->stuck; i++) {
        uint32_t k = order[i];
        b->bid = uint3{k % l->grid.x, (k / l->grid.x) % l->grid.y,
                       k / (l->grid.x * l->grid.y)};
        run_block_(b);
    }
    blk_ = outer;
    delete b;
}

static void drop_grid_(void *arg)
{
    delete (launch_ *)arg;
}

} /* namespace */

const uint3 &thread_idx(void)
{
    return cur_->tid;
}

const uint3 &block_idx(void)
{
    return blk_->bid;
}

const dim3 &block_dim(void)
{
    return blk_->block;
}

const dim3 &grid_dim(void)
{
    return blk_->grid;
}

int lane_id(void)
{
    return cur_->lin % 32;
}

void shared_fresh(void *p, size_t bytes)
{
    if (!fresh_)
        fresh_ = new std::map<void *, unsigned long>();
    unsigned long &seen = (*fresh_)[p];
    if (seen != block_epoch_) {
        memset(p, 0xff, bytes);
        seen = block_epoch_;
    }
}

void sync_block(void)
{
    wait_(AT_BLOCK);
}

/* The running lane waits at its warp's collective call: released at once
 * by the last of the warp's lanes to arrive, which goes on (the others
 * run next, their stacks warm); a warp that never completes is the
 * scheduler's to release or report (release_). */
static void warp_wait_(void)
{
    block_run *b = blk_;
    fiber *f = cur_;
    int base = f->lin - f->lin % 32, n = (int)b->fibers.size();
    int lanes = base + 32 < n ? 32 : n - base;
    if (++b->arrived[base / 32] == lanes) {
        f->state = AT_WARP;
        b->ready--;
        if (!release_warp_(b, base, base + lanes))
            switch_(f->w, &sched_w_); /* stuck: the block ends here */
        return;
    }
    wait_(AT_WARP);
}

uint64_t warp_exchange(uint64_t bits, int src_lane, unsigned mask)
{
    block_run *b = blk_;
    fiber *f = cur_;
    int base = f->lin - f->lin % 32, set = f->shuffles++ & 1;
    int lanes = (int)b->fibers.size() - base; /* lanes in this warp */
    if (lanes < 32 && (mask >> lanes) != 0 && f->lin == base)
        mock_misuse("warp shuffle whose mask names lanes past the end of "
                    "the block (a block that is not a multiple of 32)");
    if (!(mask >> (f->lin % 32) & 1))
        mock_misuse("warp shuffle by a lane not in its own mask");
    b->xchg[set][f->lin] = bits;
    warp_wait_();               /* every lane has published */
    int src = base + src_lane;
    if (src_lane < 0 || src_lane >= 32 || src >= (int)b->fibers.size()) {
        mock_misuse("warp shuffle from a lane that does not exist");
        return bits;
    }
    /* Safe without a second wait: a lane can overwrite this set only at
     * its shuffle after next, which needs every lane past the next one. */
    return b->xchg[set][src];
}

/* element (row, k) of the A operand, (k, n) of B, from the warp's
 * registers w[lane][0..3] (A) and [4..5] (B): the PTX ISA's m16n8k16
 * layout, lane = 4 groupID + threadID_in_group */
static float mma_a_(const uint32_t (*w)[6], int row, int k)
{
    uint32_t r = w[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
    uint32_t u = (k & 1 ? r >> 16 : r & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float mma_b_(const uint32_t (*w)[6], int k, int n)
{
    uint32_t r = w[n * 4 + (k % 8) / 2][4 + k / 8];
    uint32_t u = (k & 1 ? r >> 16 : r & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    block_run *bk = blk_;
    fiber *f = cur_;
    int base = f->lin - f->lin % 32, set = f->shuffles++ & 1;
    if (base + 32 > (int)bk->fibers.size()) {
        if (f->lin == base)
            mock_misuse("mma.sync in a warp of fewer than 32 threads");
        return;
    }
    uint32_t *mine = bk->mma[set][f->lin];
    memcpy(mine, a, 4 * sizeof *a);
    memcpy(mine + 4, b, 2 * sizeof *b);
    warp_wait_(); /* every lane has published (safe as warp_exchange) */
    int warp = base / 32;
    if (bk->mma_epoch[warp] != block_epoch_ ||
        bk->mma_call[warp] != f->shuffles) {
        const uint32_t(*w)[6] = bk->mma[set] + base;
        for (int row = 0; row < 16; row++)
            for (int k = 0; k < 16; k++)
                bk->mma_af[warp][row][k] = mma_a_(w, row, k);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++)
                bk->mma_bf[warp][k][n] = mma_b_(w, k, n);
        bk->mma_epoch[warp] = block_epoch_;
        bk->mma_call[warp] = f->shuffles;
    }
    const float(*A)[16] = bk->mma_af[warp];
    const float(*B)[8] = bk->mma_bf[warp];
    int lane = f->lin - base, g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i / 2), col = 2 * c + (i & 1);
        /* the 16 exact products (bf16 x bf16 fits a double's mantissa)
         * summed in double, rounded to fp32 once: as the tensor cores, a
         * wide dot product rather than 16 fp32 roundings (and no libm
         * fmaf call per product, which this build cannot inline) */
        double s = d[i];
        for (int k = 0; k < 16; k++)
            s += (double)A[row][k] * (double)B[k][col];
        d[i] = (float)s;
    }
}

void submit(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body)
{
    (void)smem;
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS || block.z > 64 ||
        grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || grid.x > 0x7fffffffu) {
        mock_bad_launch();
        return;
    }
    if (mock_launch_faults()) { /* M6_EMU_FAULT_LAUNCH */
        mock_launch_fault(stream);
        return;
    }
    launch_ *l = new launch_{grid, block, std::move(body)};
    mock_launch_kept(stream, run_grid_, drop_grid_, l); /* capturable */
}

} /* namespace emu */
