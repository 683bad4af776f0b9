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

#endif /* M6_OFFLOAD_TEST_HOOKS_H */
