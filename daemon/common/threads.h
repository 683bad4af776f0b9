/*
 * threads.h — which thread runs m6d's signal handlers.
 *
 * A process-directed signal (SIGTERM from systemd, Ctrl-C, SIGHUP) is
 * delivered to any thread that does not block it, and its handler runs on
 * that thread's stack. m6d handles them in its event loop only (libuv's
 * handler takes a pipe lock and writes to the loop's pipe), so every other
 * thread — m6d's own, and those libraries start (OpenMP, oneDNN, libuv's
 * pool, libmicrohttpd, Gloo) — blocks them: a burst of signals then lands
 * on the loop thread, never inside a GEMM's worker or a thread that a
 * sanitizer or a library runs on a stack of its own.
 */
#ifndef M6_THREADS_H
#define M6_THREADS_H

#include <pthread.h>
#include <signal.h>

/* The asynchronous signals m6 handles or ignores on its loop thread:
 * SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2. Synchronous ones
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, and SIGPIPE, which m6d ignores) are
 * never in it: they belong to the thread that raised them. */
void threads_async_signals(sigset_t *set);

/* pthread_create(t, NULL, fn, arg) with threads_async_signals blocked in
 * the new thread (and in the threads it starts), the caller's mask left as
 * it was. Returns pthread_create's result (0, or an errno value). */
int threads_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* Block threads_async_signals in the calling thread, the previous mask
 * into *old; threads_restore puts it back. For code that makes a library
 * start its threads (libuv's pool, libmicrohttpd), which inherit the mask
 * of the thread that creates them. */
void threads_block(sigset_t *old);
void threads_restore(const sigset_t *old);

#endif /* M6_THREADS_H */
