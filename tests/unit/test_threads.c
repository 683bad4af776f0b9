/*
 * test_threads.c — threads_start (daemon/common/threads.h): the thread it
 * starts blocks the asynchronous signals (read back from the kernel's own
 * record, /proc/self/task/TID/status SigBlk), the caller's mask is left as
 * it was, and a process-directed signal that the caller also blocks waits
 * for the caller rather than running its handler on the new thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/threads.h"
#include "../common/test_main.h"

static pid_t tid_(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* The kernel's blocked-signal mask of thread tid (SigBlk, hex: bit n-1 is
 * signal n). */
static unsigned long long sigblk_(pid_t tid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    unsigned long long m = 0;
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &m) == 1) {
            found = 1;
            break;
        }
    fclose(f);
    assert_true(found);
    return m;
}

static int blocked_(unsigned long long mask, int sig)
{
    return (int)((mask >> (sig - 1)) & 1);
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t tid;
    int release;
} probe;

static void *probe_main_(void *arg)
{
    probe *p = arg;
    pthread_mutex_lock(&p->mu);
    p->tid = tid_();
    pthread_cond_broadcast(&p->cv);
    while (!p->release) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static pid_t start_probe_(probe *p, pthread_t *t)
{
    *p = (probe){.mu = PTHREAD_MUTEX_INITIALIZER,
                 .cv = PTHREAD_COND_INITIALIZER};
    assert_int_equal(threads_start(t, probe_main_, p), 0);
    pthread_mutex_lock(&p->mu);
    while (!p->tid) pthread_cond_wait(&p->cv, &p->mu);
    pid_t tid = p->tid;
    pthread_mutex_unlock(&p->mu);
    return tid;
}

static void stop_probe_(probe *p, pthread_t t)
{
    pthread_mutex_lock(&p->mu);
    p->release = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(t, NULL);
}

static void new_thread_blocks_async_signals(void **state)
{
    (void)state;
    unsigned long long before = sigblk_(tid_());
    assert_false(blocked_(before, SIGINT));
    probe p;
    pthread_t t;
    pid_t tid = start_probe_(&p, &t);
    unsigned long long m = sigblk_(tid);
    const int async[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof async / sizeof *async; i++)
        if (!blocked_(m, async[i]))
            fail_msg("signal %d (%s) not blocked in the new thread (SigBlk "
                     "%llx)", async[i], strsignal(async[i]), m);
    /* a fault belongs to the thread that faults */
    assert_false(blocked_(m, SIGSEGV));
    assert_false(blocked_(m, SIGBUS));
    /* the caller's mask as it was */
    assert_true(sigblk_(tid_()) == before);
    stop_probe_(&p, t);
}

static volatile sig_atomic_t handled_on_main_ = -1;
static pthread_t main_thread_;

static void on_usr1_(int sig)
{
    (void)sig;
    handled_on_main_ = pthread_equal(pthread_self(), main_thread_) ? 1 : 0;
}

/* SIGUSR1 sent to the process while the caller blocks it: with the new
 * thread blocking it too, it stays pending until the caller unblocks it,
 * and its handler runs there. A thread that did not block it would take
 * it at once. */
static void signal_waits_for_the_caller(void **state)
{
    (void)state;
    main_thread_ = pthread_self();
    struct sigaction sa = {.sa_handler = on_usr1_};
    sigemptyset(&sa.sa_mask);
    struct sigaction old_sa;
    assert_int_equal(sigaction(SIGUSR1, &sa, &old_sa), 0);
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, &old);
    probe p;
    pthread_t t;
    start_probe_(&p, &t);
    handled_on_main_ = -1;
    assert_int_equal(kill(getpid(), SIGUSR1), 0);
    usleep(50 * 1000);  /* time for another thread to take it, if it could */
    sigset_t pend;
    sigpending(&pend);
    int pending = sigismember(&pend, SIGUSR1);
    int early = handled_on_main_;
    pthread_sigmask(SIG_SETMASK, &old, NULL);  /* delivered here, now */
    stop_probe_(&p, t);
    sigaction(SIGUSR1, &old_sa, NULL);
    if (early != -1)
        fail_msg("SIGUSR1 handled on another thread while the caller blocked "
                 "it");
    assert_true(pending);
    assert_int_equal(handled_on_main_, 1);
}

TEST_MAIN(
    cmocka_unit_test(new_thread_blocks_async_signals),
    cmocka_unit_test(signal_waits_for_the_caller))
