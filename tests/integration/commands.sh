#!/usr/bin/env bash
# commands.sh — operator commands that race each other or a SIGTERM: what
# m6d acknowledged holds. A stop or pause answered just before SIGTERM is
# still in effect after the restart; pause then resume at once both
# succeed and the run trains on; two resumes at once both succeed; a resume
# in flight at SIGTERM gets its answer, not a dropped connection.
# Steps are made slow enough (tens of ms) that a command and a signal sent
# back to back meet at the same step boundary.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
write_spec "$T/slow.json" slow 1000000 0 '"device": {"threads": 1}'
sed -i 's/"n_embd": 32, "n_head": 2, "seq_len": 32/"n_embd": 256, "n_head": 4, "seq_len": 128/' "$T/slow.json"
grep -q '"n_embd": 256' "$T/slow.json" || fail "slow spec not written"

# sigterm_and_restart: SIGTERM m6d at once, wait for its exit (0), start
# it again on the same state.
sigterm_and_restart() {
    kill -TERM "$DAEMON_PID"
    local rc=0
    wait "$DAEMON_PID" || rc=$?
    [ "$rc" = 0 ] || fail "m6d exited $rc after SIGTERM"
    start_daemon "$T/s"
}

start_daemon "$T/s"

# 1. stop, answered, then SIGTERM before the boundary: stopped for good.
R=$(ctl submit "$T/slow.json")
wait_step "$R" 3
ctl stop "$R" >/dev/null || fail "stop"
sigterm_and_restart
[ "$(field "$R" state)" = stopped ] || fail "stop then SIGTERM: run $R is $(field "$R" state) after the restart"
[ "$(db "$T/s" "select count(*) from events where run=$R and kind='stop'")" = 1 ] || fail "no stop event"
log "stop then SIGTERM: stopped"

# 2. pause, answered, then SIGTERM: paused after the restart, not training.
P=$(ctl submit "$T/slow.json")
wait_step "$P" 3
ctl pause "$P" >/dev/null || fail "pause"
sigterm_and_restart
[ "$(field "$P" state)" = paused ] || fail "pause then SIGTERM: run $P is $(field "$P" state) after the restart"
K=$(field "$P" step)
sleep 0.5
[ "$(field "$P" step)" = "$K" ] || fail "run $P trained after its pause and a restart"
log "pause then SIGTERM: paused at step $K"

# 3. pause then resume at once, five times: both answered 0, and the run
#    trains on (whether the resume cancelled the pending pause, waited for
#    the pause's checkpoint or resumed the paused run).
ctl resume "$P" >/dev/null || fail "resume after the restart"
for i in 1 2 3 4 5; do
    ctl pause "$P" >/dev/null || fail "pause ($i)"
    out=$(ctl resume "$P" 2>&1) || fail "resume right after a pause ($i): $out"
    wait_state "$P" running 10
done
K=$(field "$P" step)
wait_step "$P" $((K + 3))
log "pause + resume x5: the run trains on ('$out')"

# 4. two resumes of a paused run at once: both answered 0.
ctl pause "$P" >/dev/null
wait_state "$P" paused
ctl resume "$P" >"$T/r1" 2>&1 & r1=$!
ctl resume "$P" >"$T/r2" 2>&1 & r2=$!
wait $r1 || fail "first of two resumes: $(cat "$T/r1")"
wait $r2 || fail "second of two resumes: $(cat "$T/r2")"
wait_state "$P" running 10
log "two resumes at once: '$(cat "$T/r1")' / '$(cat "$T/r2")'"

# 5. a resume in flight when SIGTERM comes: answered (0, or 1 "m6d is
#    stopping"), not exit 4 (m6d unreachable).
ctl pause "$P" >/dev/null
wait_state "$P" paused
ctl resume "$P" >"$T/r3" 2>&1 & r3=$!
sleep 0.005
sigterm_and_restart
rc=0; wait $r3 || rc=$?
[ "$rc" = 0 ] || { [ "$rc" = 1 ] && grep -q "m6d is stopping" "$T/r3"; } \
    || fail "resume in flight at SIGTERM: exit $rc: $(cat "$T/r3")"
log "resume in flight at SIGTERM: exit $rc '$(cat "$T/r3")'"

ctl stop "$P" >/dev/null
stop_daemon
echo "ok commands"
