/*
 * test_hooks.h — hooks for tests only, not part of offload.h's interface:
 * the daemon never calls them. tests/unit/test_offload.c does.
 */
#ifndef M6_OFFLOAD_TEST_HOOKS_H
#define M6_OFFLOAD_TEST_HOOKS_H

#include <stddef.h>
#include "offload/offload.h"

/* Tests: pretend RLIMIT_MEMLOCK is `bytes` and CAP_IPC_LOCK is absent, so
 * that pinning beyond it fails as it would for an unprivileged daemon.
 * SIZE_MAX restores the real limits. */
void offload_test_set_pin_limit(size_t bytes);

/* Tests: hold (1) or release (0) the host AdamW threads, so that queued
 * updates stay queued. A fetch of a held slot waits: release first. */
void offload_test_hold_updates(offload_ctx *o, int hold);

/* Tests: with wait 1, offload_adamw first waits for every speculative
 * update of the step to finish, so that each redo restores the old state
 * from the second buffers (offload_stats.spec_restores) instead of
 * re-scaling a job still queued. 0: as the daemon runs. Process-wide. */
void offload_test_spec_wait(int wait);

/* Tests: every gradient drain (device -> host) waits usec microseconds
 * before its copy, as a loaded host's copy thread may, so that a reader
 * that does not wait for the drains (offload_wait_grads) reads a gradient
 * half landed every time rather than now and then. 0: as the daemon runs.
 * Process-wide. */
void offload_test_slow_drains(unsigned usec);

#endif /* M6_OFFLOAD_TEST_HOOKS_H */
