#!/usr/bin/env bash
# db_lock.sh — other writers on m6.db (issue 16, item 8). A sqlite3 shell
# holding a write transaction (BEGIN IMMEDIATE) for 10 s mid-run must not
# stop training: m6d holds the step records in memory and writes them once
# the lock goes, so the run's metrics rows are complete (one per step), its
# losses are bitwise those of an undisturbed run of the same spec (CPU,
# one thread), and no pause is recorded. A stop of a queued run sent
# during the lock is refused (after m6d's 5 s wait), naming the lock, and
# the run stays queued until a stop after the lock. With a short hold limit
# (--db-hold-limit 2) and a lock of 5 s the run pauses itself, and the
# pause, its reason and every step's row are in m6.db once the lock goes;
# resumed, it ends with the undisturbed losses. Under umask 000 m6d's
# dir, socket and m6.db are 02750, 0660, 0640; a state dir or socket dir
# that others may write (o+w) is refused at start, naming mode and fix.
. "$(dirname "$0")/lib.sh"

command -v sqlite3 >/dev/null || { echo "SKIP: no sqlite3 shell"; exit 77; }

# lock_db STATE_DIR SECONDS: a sqlite3 shell (another process, as an
# operator's would be) takes m6.db's write lock and holds it SECONDS, in
# the background (LOCK_PID); returns once it holds the lock.
lock_db() {
    rm -f "$T/locked"
    { printf '.timeout 20000\n.bail on\nBEGIN IMMEDIATE;\n.system touch %s\n' \
          "$T/locked"
      sleep "$2"
      printf 'COMMIT;\n'; } | sqlite3 "$1/m6.db" >"$T/locker.out" 2>&1 &
    LOCK_PID=$!
    for _ in $(seq 1 400); do
        [ -e "$T/locked" ] && return 0
        kill -0 "$LOCK_PID" 2>/dev/null \
            || fail "sqlite3 could not take m6.db's write lock: $(cat "$T/locker.out")"
        nap 0.05
    done
    fail "sqlite3 did not take m6.db's write lock in 20 s"
}

prepare_data "$T/data"
CKPT_EVERY=1000 write_spec "$T/s.json" lk 1000 100 '"device": {"threads": 1}'

# --- the undisturbed reference, then the same run under a 10 s lock,
# taken while the run is held at its boundary after step 200 (lib.sh
# hold_at_step): it trains through the lock however short its steps
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/st"
REF=$(ctl submit "$T/s.json")
ctl watch "$REF" >/dev/null || fail "reference run did not complete"
losses "$REF" >"$T/ref.csv"
[ "$(wc -l <"$T/ref.csv")" -gt 1000 ] || fail "reference: $(wc -l <"$T/ref.csv") loss lines"

hold_at_step 200 nowait
R=$(ctl submit "$T/s.json")
Q=$(ctl submit "$T/s.json")  # queued behind R
wait_held
lock_db "$T/st" 10  # past the stop below and its 5 s wait
release_boundary
at_lock=$(db "$T/st" "select count(*) from metrics where run=$R")
log "m6.db locked at $at_lock rows of run $R"
ctl status "$R" >/dev/null || fail "status while m6.db is locked"
# a stop of the queued run: m6d's event loop waits 5 s for the lock, then
# refuses, saying why; the run stays queued (nothing acknowledged)
out=$(ctl stop "$Q" 2>&1) && fail "stop of queued run $Q during the lock: acknowledged ($out)"
grep -q "not stopped, still queued: writing m6.db failed (.*locked" <<<"$out" \
    || fail "stop of run $Q during the lock: $out"
log "stop of queued run $Q during the lock refused: $out"
wait "$LOCK_PID" || fail "the locker failed: $(cat "$T/locker.out")"
st=$(db "$T/st" "select state from runs where id=$Q")
[ "$st" = queued ] || fail "run $Q after its refused stop: $st"
out=$(ctl stop "$Q" 2>&1) || fail "stop of queued run $Q after the lock: $out"
wait_state "$R" completed 60
grep -q "warn state.held" "$T/m6d-st.log" || fail "no state.held warning while m6.db was locked"
held=$(sed -n 's/.* state.unheld .*records=\([0-9]*\).*/\1/p' "$T/m6d-st.log" | tail -1)
[ -n "$held" ] && [ "$held" -ge 40 ] \
    || fail "run $R did not train while m6.db was locked (records held: ${held:-none})"
log "$held records held in memory during the lock, written after it"
n=$(db "$T/st" "select count(*) || ' ' || min(step) || ' ' || max(step) from metrics where run=$R")
[ "$n" = "1000 1 1000" ] || fail "run $R metrics rows (count min max): $n, want 1000 1 1000"
pauses=$(db "$T/st" "select count(*) from events where run=$R and kind like 'pause%'")
[ "$pauses" = 0 ] || fail "run $R recorded a pause: $(db "$T/st" "select kind, detail from events where run=$R")"
[ -z "$(db "$T/st" "select error from runs where id=$R and error is not null")" ] \
    || fail "run $R has an error recorded"
losses "$R" >"$T/locked.csv"
cmp -s "$T/ref.csv" "$T/locked.csv" || fail "losses under the lock differ from the undisturbed run: $(diff "$T/ref.csv" "$T/locked.csv" | head -5)"
stop_daemon

# --- past the hold limit: the run pauses, recorded once the lock goes.
# Its spec has a million steps, so it is training when the limit passes
# whatever the speed of a step; its losses are compared row for row with
# a run of the same spec stopped after as many steps.
# Both runs are stopped at a held step boundary (lib.sh hold_boundary): a
# stop that lands during a validation pass abandons it (the row keeps no
# val_loss), which the other run's row would not match.
CKPT_EVERY=1000 write_spec "$T/long.json" lkl 1000000 100 '"device": {"threads": 1}'
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/st" --db-hold-limit 2
R3=$(ctl submit "$T/long.json")
wait_step "$R3" 200
lock_db "$T/st" 5
wait "$LOCK_PID" || fail "the locker failed: $(cat "$T/locker.out")"
for _ in $(seq 1 200); do
    [ "$(db "$T/st" "select state from runs where id=$R3")" = paused ] && break
    nap 0.05
done
row=$(db "$T/st" "select state || '|' || step || '|' || coalesce(error, '') from runs where id=$R3")
case "$row" in
paused\|*\|*"locked by another process"*) ;;
*) fail "run $R3 after the limit (state|step|error): '$row'" ;;
esac
step=${row#paused|}; step=${step%%|*}
ev=$(db "$T/st" "select count(*) from events where run=$R3 and kind='paused.error' and detail like '%locked by another process%'")
[ "$ev" = 1 ] || fail "run $R3: paused.error events naming the lock: $ev: $(db "$T/st" "select kind, detail from events where run=$R3")"
n=$(db "$T/st" "select count(*) || ' ' || max(step) from metrics where run=$R3")
[ "$n" = "$step $step" ] || fail "run $R3 paused at step $step: metrics rows (count max) $n"
[ "$step" -lt 1000000 ] || fail "run $R3 finished before the hold limit"
log "run $R3 paused at step $step past the hold limit; all its rows written"
hold_at_step $((step + 50)) nowait
ctl resume "$R3" >/dev/null || fail "resume of run $R3"
wait_held
ctl stop "$R3" >/dev/null || fail "stop of run $R3"
release_boundary
wait_state "$R3" stopped 30
n=$(db "$T/st" "select step from runs where id=$R3")
hold_at_step "$n" nowait
R4=$(ctl submit "$T/long.json")
wait_held
ctl stop "$R4" >/dev/null || fail "stop of run $R4"
release_boundary
wait_state "$R4" stopped 30
losses "$R3" >"$T/paused.csv"
losses "$R4" >"$T/r4.csv"
head -n $((n + 1)) "$T/r4.csv" >"$T/ref-long.csv"
[ "$(wc -l <"$T/paused.csv")" = $((n + 1)) ] || fail "run $R3: $(wc -l <"$T/paused.csv") loss lines, want $((n + 1))"
cmp -s "$T/ref-long.csv" "$T/paused.csv" \
    || fail "losses after the hold-limit pause differ from the undisturbed run's: $(diff "$T/ref-long.csv" "$T/paused.csv" | head -5)"
stop_daemon

# --- kill -9 while records are held: a checkpoint written meanwhile is
# taken up at the restart, and the steps whose rows were lost with m6d are
# named (event metrics.gap), not silently missing
# (trained from scratch: a delink recorded under the lock is another
# case, whose step depends on the speed of the run)
CKPT_EVERY=20 write_spec "$T/g.json" gap 100000 0 '"device": {"threads": 1}'
start_daemon "$T/st"
G=$(ctl submit "$T/g.json")
wait_step "$G" 100
lock_db "$T/st" 6
last=$(db "$T/st" "select max(step) from metrics where run=$G")
ck=0
for _ in $(seq 1 100); do   # a checkpoint past the last row, on disk
    ck=$(ls "$T/st/runs/$G/checkpoints" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
    [ -n "$ck" ] && [ "$ck" -gt $((last + 1)) ] && break
    nap 0.05
done
[ -n "$ck" ] && [ "$ck" -gt $((last + 1)) ] || fail "no checkpoint past step $last during the lock"
kill -9 "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
wait "$LOCK_PID" || fail "the locker failed: $(cat "$T/locker.out")"
last=$(db "$T/st" "select max(step) from metrics where run=$G")
start_daemon "$T/st"
# the resume's event, not the state: m6d records the run running first
wait_event "$G" 'resume\.restart' 30
took=$(db "$T/st" "select detail from events where run=$G and kind='resume.restart'")
took=${took#step=}; took=${took%% *}
[ "$took" -gt "$((last + 1))" ] || fail "run $G resumed at step $took, the last row is $last: no gap to name"
gap=$(db "$T/st" "select detail from events where run=$G and kind='metrics.gap'")
grep -q "^steps $((last + 1))-$took have no metrics rows" <<<"$gap" \
    || fail "run $G: resumed at $took after row $last; metrics.gap event: '$gap'"
log "run $G: rows to $last, resumed at $took: $gap"
ctl stop "$G" >/dev/null || fail "stop of run $G"
stop_daemon

# --- modes do not depend on the caller's umask (also without root)
M6D_UMASK=000 start_daemon "$T/um"
ctl list >/dev/null || fail "m6d under umask 000 did not answer"
modes=$(stat -c %a "$T/um" "$SOCK" "$T/um/m6.db" "$T/um/m6d.lock" | tr '\n' ' ')
[ "$modes" = "2750 660 640 600 " ] || fail "under umask 000: dir, socket, m6.db, lock modes $modes, want 2750 660 640 600 (the lock: no group member may hold it)"
stop_daemon

# --- directories others may write are refused at start
mkdir -p "$T/ow" "$T/ok" "$T/owsock"
chmod 0777 "$T/ow"
chmod 1777 "$T/owsock"
rc=0
timeout 10 "$M6D" --state-dir "$T/ow" 2>"$T/ow.err" || rc=$?
[ "$rc" = 1 ] || fail "state dir of mode 0777: m6d exited $rc, want 1"
grep -q "state dir $T/ow has mode 0777" "$T/ow.err" && grep -q "chmod o-w $T/ow" "$T/ow.err" \
    || fail "state dir of mode 0777: message does not name the mode and the fix: $(cat "$T/ow.err")"
[ ! -e "$T/ow/m6.db" ] || fail "m6d created m6.db in a state dir of mode 0777"
rc=0
timeout 10 "$M6D" --state-dir "$T/ok" --socket "$T/owsock/m6d.sock" 2>"$T/ows.err" || rc=$?
[ "$rc" = 1 ] || fail "socket dir of mode 1777: m6d exited $rc, want 1"
grep -q "socket dir $T/owsock has mode 1777" "$T/ows.err" \
    || fail "socket dir of mode 1777: message does not name it: $(cat "$T/ows.err")"
# a sticky directory is shared by design (/tmp): the fix is another
# directory, never a chmod of it
grep -q "Fix: give --socket a path in a directory of m6d's own" "$T/ows.err" &&
    ! grep -q "chmod" "$T/ows.err" \
    || fail "socket dir of mode 1777: the fix should be another directory, not a chmod: $(cat "$T/ows.err")"
[ ! -e "$T/owsock/m6d.sock" ] || fail "m6d made a socket in a directory of mode 1777"
echo "PASS: db_lock"
