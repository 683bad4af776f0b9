#!/usr/bin/env bash
# durable.sh — acknowledged means durable (issue 16 item 7). m6d runs with
# the test hook M6_TEST_HOLD_BOUNDARY=FILE: while FILE exists the runner
# waits at its step boundary. Each command is acknowledged while the
# boundary is held, m6d is killed (-9) before the boundary takes it, and
# started again: the delink, the pause, the resume and the stop each happen
# exactly once (one event each, one real phase), nothing is left pending in
# the command log, and a stop or pause answered is never lost.
# The run has a million steps, more than any machine trains in the test's
# lifetime: it is alive at every hold whatever the speed of a step, and the
# test ends it with its stop (case 4).
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
CKPT_EVERY=5 write_spec "$T/d.json" d 1000000 300
S=$T/s
LOG=$T/m6d-s.log

start_held() { M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$S"; }
WAIT_RUN=  # the run a failing wait_for reports (lib.sh)
pending() { db "$S" "select count(*) from commands where run=$1 and state='pending'"; }
events_of() { db "$S" "select count(*) from events where run=$1 and kind='$2'"; }
# ack_then_kill RUN CMD: CMD acknowledged at a held boundary, recorded
# pending, m6d killed before the boundary, started again (not held)
ack_then_kill() {
    if [ "$2" = resume ]; then hold_boundary nowait; else hold_boundary; fi
    local k out
    k=$(db "$S" "select step from runs where id=$1")
    out=$(ctl "$2" "$1" 2>&1) || fail "$2 run $1 not acknowledged: $out"
    [ "$(pending "$1")" = 1 ] || fail "$2: $(pending "$1") pending commands after the reply, want 1"
    [ "$(events_of "$1" "$2")" = 0 ] || fail "$2 applied before the boundary (held)"
    kill9_daemon
    release_boundary
    log "$2 acknowledged at step $k ('$out'), m6d killed before the boundary"
    start_held
}

start_held
R=$(ctl submit "$T/d.json")
WAIT_RUN=$R
wait_step "$R" 7

# 1. delink
ack_then_kill "$R" delink
delinked() { [ "$(events_of "$R" delink)" -ge 1 ] || { echo "no delink event"; return 1; }; }
wait_for "the replayed delink's event" 10 delinked
[ "$(events_of "$R" delink)" = 1 ] || fail "delink: $(events_of "$R" delink) delink events, want 1"
db "$S" "select detail from events where run=$R and kind='delink'" | has "reason=operator" \
    || fail "delink event: $(db "$S" "select detail from events where run=$R and kind='delink'")"
D=$(db "$S" "select from_step from phases where run=$R and phase='real'")
[ -n "$D" ] || fail "no real phase after the replayed delink"
[ "$(db "$S" "select delink_step from runs where id=$R")" = "$D" ] || fail "runs.delink_step is not the phase's $D"
wait_step "$R" $((D + 3))
[ "$(pending "$R")" = 0 ] || fail "delink still pending after it was applied"
[ "$(db "$S" "select step from commands where run=$R and kind='delink'")" = "$D" ] \
    || fail "delink command not marked applied at step $D"
log "delink applied once, at step $D (the restart's first boundary)"

# 2. pause: paused after the restart, once, and it stays paused
ack_then_kill "$R" pause
wait_state "$R" paused 30
[ "$(events_of "$R" pause)" = 1 ] || fail "pause: $(events_of "$R" pause) pause events, want 1"
P=$(field "$R" step)
nap 0.5  # an absence: no step in 0.5 s (25 steps of 20 ms, hundreds at full speed)
[ "$(field "$R" step)" = "$P" ] || fail "run trained on after its pause was re-applied"
[ "$(pending "$R")" = 0 ] || fail "pause still pending"
log "pause applied once, at step $P"

# 3. resume: answered after its wait (the boundary is held), then killed
ack_then_kill "$R" resume
wait_state "$R" running 30
wait_step "$R" $((P + 3))
[ "$(events_of "$R" resume)" = 1 ] || fail "resume: $(events_of "$R" resume) resume events, want 1"
[ "$(pending "$R")" = 0 ] || fail "resume still pending"
log "resume applied once"

# 4. stop: stopped for good, without setting the run up again (a life
# that died in run.setup, e.g. OOM-killed, would die again)
setups=$(grep -c "run.setup.*run=$R " "$LOG" || true)
ack_then_kill "$R" stop
wait_state "$R" stopped 30
[ "$(grep -c "run.setup.*run=$R " "$LOG" || true)" = "$setups" ] \
    || fail "stop: the run was set up again before its pending stop applied"
[ "$(events_of "$R" stop)" = 1 ] || fail "stop: $(events_of "$R" stop) stop events, want 1"
[ "$(pending "$R")" = 0 ] || fail "stop still pending"

# the history: each command once, the submit too
for k in delink pause resume stop submit; do
    [ "$(db "$S" "select count(*) from commands where run=$R and kind='$k' and state='applied'")" = 1 ] \
        || fail "command log: $k not applied exactly once: $(db "$S" "select id, kind, state, step from commands where run=$R")"
done
[ "$(db "$S" "select count(*) from phases where run=$R and phase='real'")" = 1 ] || fail "phases: not one real phase"
# metrics: one row per step, no gap, no duplicate
[ "$(db "$S" "select count(*), min(step), max(step), count(distinct step) from metrics where run=$R")" \
    = "$(db "$S" "select step, 1, step, step from runs where id=$R")" ] \
    || fail "metrics rows: $(db "$S" "select count(*), min(step), max(step) from metrics where run=$R") for step $(db "$S" "select step from runs where id=$R")"

# 5. submit: answered, killed at once; after the restart the run is there
R2=$(ctl submit "$T/d.json")
kill9_daemon
start_held
[ -n "$(db "$S" "select id from runs where id=$R2")" ] || fail "submitted run $R2 lost by kill -9"
[ "$(db "$S" "select count(*) from commands where run=$R2 and kind='submit' and state='applied'")" = 1 ] \
    || fail "no submit in the command log for run $R2"
ctl stop "$R2" >/dev/null || fail "stop run $R2"
wait_state "$R2" stopped 30
stop_daemon
echo "PASS"
