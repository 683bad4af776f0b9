#!/usr/bin/env bash
# ep_stop.sh — a rank that stops answering inside an expert-parallel step:
# nodes.expert_parallel 2 over two m6d on loopback (a coordinator, rank 0,
# and a worker w1, rank 1; ep_spec's MoE model, nodes.timeout 2 s), the
# worker frozen with SIGSTOP while the run trains. Its sockets stay open,
# so no peer sees a connection close: only the timeouts can end the wait
# (the kill -9 variant, where the connections close, is ep_nodes' (a)).
#  (a) the worker stops itself (M6_TEST_FAULT stop_a2a, test_hooks.h)
#      before step 10's first all-to-all, which rank 0 enters and waits
#      in: the run pauses within 2x nodes.timeout, its reason naming rank
#      1 of w1 and the all-to-all, status and `lost` naming them too; the
#      worker continued (SIGCONT) comes back as a live node, `m6ctl
#      resume` goes on from the checkpoint of step 8, and the run
#      completes with the one-rank run's losses and gradient norms
#      (rel_close, 1e-6 relative);
#  (b) rank 0 held at the boundary after step 5, the worker stopped
#      (SIGSTOP from here) there, and `m6ctl stop` sent before rank 0 goes
#      on (the boundary's command: its save cannot gather the frozen
#      rank's experts, so the run pauses, "stop not done", naming rank 1)
#      and, in a second run, 0.5 s after (rank 0 waiting in the
#      boundary's agreement): each stop answers within a second, the run
#      leaves running within 2x nodes.timeout, stopped or paused so; the
#      paused one is stopped by the same stop, none sent again (an
#      acknowledged command holds); the newest checkpoint is the last one
#      written before, step 4. Then the worker continued,
#      both m6d end on SIGTERM within nodes.timeout (nothing of the run
#      left waiting).
. "$(dirname "$0")/lib.sh"
TMO=2   # --node-timeout and nodes.timeout, seconds
WAIT=60   # the most any whole run may take here, seconds
ep_setup

# ---- the one-rank reference (same global batch)
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "the one-rank run"

# ---- the coordinator (its boundary held by the test hook) and the worker
start_coordinator c
M6_TEST_FAULT=stop_a2a@10 start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
W=${M6D_PIDS[w1]}
wait_node w1 live 10 >/dev/null

# stopped_ PID: the process is stopped (state T); else says its state
stopped_() {
    local st
    st=$(cut -d' ' -f3 "/proc/$1/stat") || return 1
    [ "$st" = T ] || { echo "process $1 in state $st"; return 1; }
}
# stop_bounded RUN: `m6ctl stop RUN` answers within a second
stop_bounded() {
    local t1=$EPOCHREALTIME out took
    out=$(timeout 10 "$M6CTL" --socket "$SOCK" stop "$1" 2>&1) \
        || fail "m6ctl stop of run $1 with a frozen rank: exit $?: $out"
    took=$(since "$t1")
    le "$took" 1 \
        || fail "m6ctl stop of run $1 took ${took}s, want <= 1 s"
}
# not_running_ RUN: the run is in another state than running (says which)
not_running_() {
    local s
    s=$(field "$1" state)
    [ "$s" != running ] || { echo "run $1 running"; return 1; }
}
# stop_at STEP WHEN: a run of ep.json (its id in RUN) held at the
# boundary after STEP, the worker stopped (SIGSTOP) there (T0 the time;
# with WHEN before, the time rank 0 is let go: it waits from then on),
# `m6ctl stop` sent (stop_bounded) before rank 0 is let go into the
# boundary's agreement (WHEN before: the stop is this boundary's command)
# or 0.5 s after (WHEN after: rank 0 waits in the agreement); then, within
# 2x nodes.timeout of T0 (by m6d's event time, within_), the run is
# stopped, or paused because its stop could not save (the frozen rank's
# experts cannot be gathered) or by the lost rank, naming rank 1 of w1,
# and then stopped at its last whole checkpoint by that same stop (no
# second one is sent); its newest checkpoint is the last one written
# before, step 4. OUTCOME says which.
stop_at() {
    hold_at_step "$1" nowait
    RUN=$(ctl submit "$T/ep.json") || fail "$T/ep.json refused by m6d"
    WAIT_RUN=$RUN
    wait_held
    nap 0.2  # the worker's rank into its next collective (or about to)
    kill -STOP "$W"
    T0=$EPOCHREALTIME
    local what="SIGSTOP"
    if [ "$2" = before ]; then
        stop_bounded "$RUN"
        release_boundary
        T0=$EPOCHREALTIME
        what="rank 0's release into the frozen rank's collective"
    else
        release_boundary
        nap 0.5
        stop_bounded "$RUN"
    fi
    wait_for "run $RUN to leave running after its stop" $((2 * TMO + 5)) not_running_ "$RUN"
    within_ "$RUN" "$T0" $((2 * TMO)) "$what"
    OUTCOME="stopped ${TOOK}s after $what"
    # the one stop holds: no second stop is sent
    wait_state "$RUN" stopped 10
    local ev
    ev=$(ctl events "$RUN" | grep 'paused.error' || true)
    if [ -n "$ev" ]; then
        has -F "rank 1 was lost (node w1, id " <<<"$ev" \
            || fail "run $RUN paused, not naming rank 1 of w1: $ev"
        OUTCOME="paused ${TOOK}s after $what, then stopped by the same stop: $(cut -c1-140 <<<"$ev")"
    fi
    [ "$(db "$T/c" "select max(step) from checkpoints where run=$RUN")" = 4 ] \
        || fail "want the checkpoint of step 4 kept: $(db "$T/c" "select step from checkpoints where run=$RUN")"
}
# cont_worker: the stopped worker goes on, and is a live node again
cont_worker() {
    kill -CONT "$W"
    wait_node w1 live $((5 * TMO)) >/dev/null
}

# ---- (a) the worker frozen before its all-to-all, pause naming it,
# SIGCONT, resume
RUN=$(ctl submit "$T/ep.json") || fail "$T/ep.json refused by m6d"
WAIT_RUN=$RUN
wait_for "the worker to stop itself in step 10" 60 stopped_ "$W"
T0=$EPOCHREALTIME
log_has "$T/m6d-w1.log" 'test.stop fault=stop_a2a' >/dev/null \
    || fail "the worker stopped, but not by its stop_a2a fault"
wait_paused_within "$RUN" "$T0" $((2 * TMO)) "the worker's SIGSTOP"
lost_is "$RUN" "1 0 1 w1"
field "$RUN" error | has -E 'failed in the step: .*all-to-all' \
    || fail "the pause's reason does not name the step's all-to-all: $(field "$RUN" error)"
wait_event "$RUN" 'nodes.rank_lost +node=[0-9]+ hostname=w1 rank=1 '
log "(a) paused ${TOOK}s after SIGSTOP: $(field "$RUN" error | cut -c1-300)"
cont_worker
ctl resume "$RUN" >/dev/null || fail "resume after SIGCONT refused"
timeout "$WAIT" "$M6CTL" --socket "$SOCK" watch "$RUN" >/dev/null \
    || fail "the resumed run did not complete within ${WAIT}s: $(ctl status "$RUN")"
grep -q "run.recover run=$RUN step=8" "$T/m6d-c.log" \
    || fail "did not resume from the checkpoint of step 8: $(grep run.recover "$T/m6d-c.log")"
[ "$(ctl events "$RUN" | grep -c 'nodes.group.*world_size=2')" -ge 3 ] \
    || fail "want a group at the start, the delink and the resume: $(ctl events "$RUN")"
losses "$RUN" >"$T/a.csv"
rel_close "$T/a.csv" "$T/one.csv" 1e-6 || fail "the run stopped and resumed differs from the one-rank run"

# ---- (b) SIGSTOP at step 5, m6ctl stop before and while rank 0 waits
stop_at 5 before
[ "$(field "$RUN" state)" = stopped ] && has -F "stop not done" <<<"$OUTCOME" \
    || fail "the stop at the boundary: want it paused (its save not done), then stopped: $OUTCOME"
log "(b) stop at the boundary: $OUTCOME"
cont_worker
stop_at 5 after
log "(b) stop in the agreement: $OUTCOME"
cont_worker
kill -TERM "$W" "${M6D_PIDS[c]}"
wait_gone "$W" "$TMO" "the worker m6d after SIGTERM"
wait_gone "${M6D_PIDS[c]}" "$TMO" "the coordinator m6d after SIGTERM"
wait "${M6D_PIDS[c]}" || fail "coordinator exit after SIGTERM"
wait "$W" || fail "worker exit after SIGTERM"
unset 'M6D_PIDS[c]' 'M6D_PIDS[w1]'
echo "ok"
