/*
 * threads.c — threads that leave the asynchronous signals to the loop
 * thread (threads.h).
 */
#include "common/threads.h"

void threads_async_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

void threads_block(sigset_t *old)
{
    sigset_t set;
    threads_async_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

void threads_restore(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

int threads_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t old;
    threads_block(&old);  /* the new thread starts with the caller's mask */
    int rc = pthread_create(t, NULL, fn, arg);
    threads_restore(&old);
    return rc;
}
