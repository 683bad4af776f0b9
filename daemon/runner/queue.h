/*
 * queue.h — the run queue: runs wait in the state DB in submit order (their
 * ids ascend); one run trains at a time; which one next is decided here.
 *
 * The queue has no memory of its own: the runs table is the queue, so a
 * restart finds it as it was. Callers serialize (runner's mutex).
 */
#ifndef M6_RUNNER_QUEUE_H
#define M6_RUNNER_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "state/state.h"
#include "spec/spec.h"

/* The run the runner should own next: one left running by the last m6d
 * (it resumes), else one left paused (it stays paused: *paused = 1), else
 * the oldest queued. 0 if none (or the DB could not say). */
int64_t queue_next(state *st, int *paused);

/* The runs table's summary of spec (run_summary: what list and status
 * show without parsing the spec), its strings static. */
run_summary queue_summary(const run_spec *spec);

/* Append a checked spec to the queue: stored as canonical JSON
 * (spec_to_json; json as given if that fails), phase pseudo when
 * spec->pseudo.steps > 0, else real; event "submit". The run's id, and
 * its name (the spec's, or "run-<id>") into name. -1 on a DB error. */
int64_t queue_add(state *st, const run_spec *spec, const char *json,
                  char *name, size_t namelen);

/* Take a queued run out of the queue: state stopped, event "stop". 0, or
 * -1 on a DB error. */
int queue_dequeue(state *st, int64_t id);

#endif /* M6_RUNNER_QUEUE_H */
