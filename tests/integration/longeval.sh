#!/usr/bin/env bash
# longeval.sh — a validation pass of many batches (train.eval_batches at
# its cap, 10^6: minutes on the test model) does not hold the operator's
# commands or SIGTERM. Run a (eval_every 5) is paused during the pass of
# step 5: it pauses within seconds, step 5 has no val_loss and an
# eval.interrupted event says the pass is owed; resumed, it redoes that
# pass (no step 6), and `m6ctl stop` during the redo ends it within
# seconds. Run b on a second m6d: SIGTERM during the pass of step 5 ends
# m6d within seconds (exit 0); the next m6d redoes the pass before step 6,
# and a stop during it lands too. A spec over the cap is refused naming
# the key and the limit. Every wait is bounded: a pass that is not
# interrupted fails the test, it does not stall it.
. "$(dirname "$0")/lib.sh"

BOUND=${LONGEVAL_BOUND:-10}  # seconds a command may take to land
tctl() { timeout 10 "$M6CTL" --socket "$SOCK" "$@"; }

prepare_data "$T/data"
for n in a b; do
    write_spec "$T/$n.json" "$n" 100 0
    sed -i 's/"eval_every": 10, "seed": 7}/"eval_every": 5, "eval_batches": 1000000, "seed": 7}/' "$T/$n.json"
    grep -q '"eval_batches": 1000000' "$T/$n.json" || fail "spec $n not written"
done
sed 's/"eval_batches": 1000000/"eval_batches": 2000000000/' "$T/a.json" >"$T/big.json"

# in_pass RUN DIR: the run committed step 4 and is in step 5's pass (steps
# 1-4 have none; step 5's row is committed only after its pass)
in_pass() {
    wait_step "$1" 4 60
    nap 1
    [ "$(db "$2" "select step from runs where id=$1")" = 4 ] \
        || fail "run $1: past step 4 within 1 s, not in a long validation pass"
}

# no_val RUN DIR STEP N: the step's row has no val_loss, and N events say
# its pass was interrupted and is owed
no_val() {
    [ "$(db "$2" "select val_loss is null from metrics where run=$1 and step=$3")" = 1 ] \
        || fail "run $1: step $3 has a val_loss ($(db "$2" "select val_loss from metrics where run=$1 and step=$3")) or no row"
    local n
    n=$(db "$2" "select detail from events where run=$1 and kind='eval.interrupted'" \
        | grep -c "^step=$3 validation pass interrupted after [0-9]* of 1000000 batches: redone before the next step") || true
    [ "$n" = "$4" ] \
        || fail "run $1: $n eval.interrupted events for step $3, want $4: $(db "$2" "select kind, detail from events where run=$1")"
}

# redoing RUN DIR: resumed at step 5, the run redoes its pass (no step 6)
redoing() {
    nap 1
    [ "$(db "$2" "select step from runs where id=$1")" = 5 ] \
        || fail "run $1: at step $(db "$2" "select step from runs where id=$1") 1 s after it went on, want 5 (the owed pass redone first)"
    [ "$(db "$2" "select count(*) from metrics where run=$1 and step>5")" = 0 ] \
        || fail "run $1: trained past step 5 without redoing its pass"
}

# stop_in_redo RUN DIR NAME: the run (NAME in the log) redoes its owed
# pass (redoing); `m6ctl stop` during it lands within BOUND, and the pass
# is owed again (no_val: its second interruption)
stop_in_redo() {
    redoing "$1" "$2"
    local t0=$SECONDS
    tctl stop "$1" >/dev/null || fail "stop of run $1 refused"
    wait_state "$1" stopped "$BOUND"
    log "run $3: stopped during the redone pass of step 5 in $((SECONDS - t0)) s"
    no_val "$1" "$2" 5 2
}

start_daemon "$T/s"

# the tester's spec: refused at submit, naming the key and the limit
out=$(tctl submit "$T/big.json" 2>&1) && fail "eval_batches 2e9 accepted: $out"
echo "$out" | has "train.eval_batches: must be in \[1, 1000000\], got 2000000000" \
    || fail "eval_batches 2e9: refusal does not name the key and the limit: $out"

A=$(tctl submit "$T/a.json")
in_pass "$A" "$T/s"
t0=$SECONDS
tctl pause "$A" >/dev/null || fail "pause of run $A refused"
wait_state "$A" paused "$BOUND"
log "run a: paused during the pass of step 5 in $((SECONDS - t0)) s"
no_val "$A" "$T/s" 5 1
[ "$(db "$T/s" "select step from runs where id=$A")" = 5 ] || fail "run a: paused at step $(db "$T/s" "select step from runs where id=$A"), want 5"

tctl resume "$A" >/dev/null || fail "resume of run $A refused"
stop_in_redo "$A" "$T/s" a
stop_daemon

# SIGTERM during the pass: m6d exits within the bound, exit status 0
start_daemon "$T/s2"
B=$(tctl submit "$T/b.json")
in_pass "$B" "$T/s2"
t0=$SECONDS
kill -TERM "$DAEMON_PID"
wait_gone "$DAEMON_PID" "$BOUND" "m6d, SIGTERM'd during a validation pass,"
rc=0
wait "$DAEMON_PID" || rc=$?
DAEMON_PID=
[ "$rc" = 0 ] || fail "m6d exited $rc after SIGTERM during a validation pass"
log "run b: m6d ended by SIGTERM during the pass of step 5 in $((SECONDS - t0)) s"
no_val "$B" "$T/s2" 5 1

# the next m6d redoes the pass before step 6; a stop during it lands
start_daemon "$T/s2"
stop_in_redo "$B" "$T/s2" b
stop_daemon
echo "PASS"
