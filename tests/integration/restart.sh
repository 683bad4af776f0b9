#!/usr/bin/env bash
# restart.sh — m6d restarts mid-run resume to the same losses as an
# uninterrupted run (compared bitwise as %.9g): after SIGTERM, after kill -9,
# after kill -9 during a checkpoint write (whose partial dir must never be
# used), and an operator delink replayed after a crash.
. "$(dirname "$0")/lib.sh"

# ref_held DIR STEP: a fresh m6d on state dir DIR runs ref.json (its id
# into R) and holds at the step boundary after STEP
ref_held() {
    start_daemon "$1"
    hold_at_step "$2" nowait
    R=$(ctl submit "$T/ref.json")
    wait_held
}
# ref_killed DIR STEP: ref_held, then m6d killed -9 while it holds
ref_killed() {
    ref_held "$1" "$2"
    kill9_daemon
    release_boundary
}

prepare_data "$T/data"
# The run is alive when the test interrupts it by design, whatever the speed
# of a step: every m6d here honours the boundary hold (lib.sh), and the test
# holds the worker at its boundary before it stops, kills or watches it.
# Each m6d restarted to finish a run starts with the boundary released.
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE
# N steps, the delink at 60: every interruption below comes at a step
# boundary the test holds (up to step 65 + 5), so no run can end before it.
N=100
spec() {
    write_spec "$1" "$2" $N 60 '"device": {"threads": 1}'
}

# watch_bg NAME RUN: m6ctl watch in the background (WATCH_PID), output in
# $T/watch-NAME.{out,err}, exit status in $T/watch-NAME.rc.
watch_bg() {
    (rc=0; ctl watch "$2" --interval 0.05 >"$T/watch-$1.out" 2>"$T/watch-$1.err" || rc=$?
     echo "$rc" >"$T/watch-$1.rc") &
    WATCH_PID=$!
    # until it has shown the run once (a fixed sleep let the run end first)
    for _ in $(seq 1 1000); do [ -s "$T/watch-$1.out" ] && break; nap 0.01; done
    [ -s "$T/watch-$1.out" ] || fail "watch of run $2 showed nothing in 10 s: $(cat "$T/watch-$1.err")"
}

# 1. The reference: uninterrupted.
spec "$T/ref.json" ref
reference_losses "$T/ref" "$T/ref.json" "$T/ref.csv"
[ "$(wc -l <"$T/ref.csv")" = $((N + 1)) ] || fail "reference rows: $(wc -l <"$T/ref.csv")"

# 2. SIGTERM mid-run: the step ends, a checkpoint is written, the run stays
#    'running' and resumes at the next start.
ref_held "$T/term" 15
# A watch started now rides out the restart (m6ctl watch --reconnect).
watch_bg term "$R"
stop_daemon
rc=0; ctl list >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 4 ] || fail "m6ctl with no m6d should exit 4, got $rc"
grep -q "cannot reach m6d" "$T/err" || fail "unreachable message: $(cat "$T/err")"
rc=0; ctl watch "$R" --reconnect 0 >/dev/null 2>&1 || rc=$?
[ "$rc" = 4 ] || fail "watch --reconnect 0 with no m6d should exit 4, got $rc"
K=$(db "$T/term" "select step from runs where id=$R")
[ "$K" -lt $N ] || fail "run finished before SIGTERM; make the spec bigger"
[ "$(db "$T/term" "select state from runs where id=$R")" = running ] || fail "state after SIGTERM"
[ "$(db "$T/term" "select max(step) from checkpoints where run=$R")" = "$K" ] \
    || fail "no checkpoint at the SIGTERM step $K"
db "$T/term" "select kind from events where run=$R" | has -x interrupted || fail "no interrupted event"
release_boundary
nap 1.2  # the watch retries while m6d is away: it must see it unreachable
start_daemon "$T/term"
ctl watch "$R" >/dev/null || fail "resumed run (SIGTERM) did not complete"
wait "$WATCH_PID"
[ "$(cat "$T/watch-term.rc")" = 0 ] || fail "watch across the restart exited $(cat "$T/watch-term.rc"): $(cat "$T/watch-term.err")"
grep -q "m6d unreachable; retrying" "$T/watch-term.err" && grep -q "reconnected to m6d" "$T/watch-term.err" \
    || fail "watch across the restart: $(cat "$T/watch-term.err")"
grep -q "completed at step $N" "$T/watch-term.out" || fail "watch across the restart: $(tail -2 "$T/watch-term.out")"
same_losses "$R" "$T/ref.csv" "losses differ after SIGTERM at $K"
stop_daemon
log "SIGTERM at step $K: same losses"

# 3. kill -9 past the delink, between checkpoints: resume from the newest
#    complete checkpoint, drop the metrics rows after it, redo them.
ref_killed "$T/k9" 65
resume_after_kill9 "$T/k9" "$R" "$N" "$T/ref.csv" "kill -9 past the delink"
[ "$(db "$T/k9" "select count(*) from phases where run=$R")" = 2 ] || fail "phases rows after resume"
stop_daemon
log "kill -9 at step $K (checkpoint $C): same losses"

# 4. kill -9 while a checkpoint is being written: we try to catch one, and
#    if the writes are too quick to catch (or the write ended between our
#    look and the kill) we leave the partial dir a crash would leave, by hand.
start_daemon "$T/ck"
R=$(ctl submit "$T/ref.json")
caught=
for _ in $(seq 1 4000); do
    if compgen -G "$T/ck/runs/$R/checkpoints/*.tmp-*" >/dev/null; then
        kill9_daemon; caught=1; break
    fi
    [ "$(db "$T/ck" "select state from runs where id=$R")" = completed ] && break
    nap 0.002
done
if ! compgen -G "$T/ck/runs/$R/checkpoints/*.tmp-*" >/dev/null; then
    caught=
    if [ -n "$DAEMON_PID" ]; then kill9_daemon; fi
    C=$(db "$T/ck" "select max(step) from checkpoints where run=$R")
    mkdir -p "$T/ck/runs/$R/checkpoints/step-$((C + 10)).tmp-4242"
    head -c 100 /dev/urandom >"$T/ck/runs/$R/checkpoints/step-$((C + 10)).tmp-4242/model.safetensors"
    sqlite3 -cmd '.timeout 5000' "$T/ck/m6.db" "update runs set state='running' where id=$R"
    log "checkpoint write not caught; planted a partial one"
fi
compgen -G "$T/ck/runs/$R/checkpoints/*.tmp-*" >/dev/null || fail "no partial checkpoint to test with"
# held at its first boundary while the test looks: a resumed run would
# soon write checkpoints of its own (with *.tmp-* dirs while it does)
touch "$HOLD_FILE"
start_daemon "$T/ck"
compgen -G "$T/ck/runs/$R/checkpoints/*.tmp-*" >/dev/null && fail "stray checkpoint dir not cleaned"
grep -q checkpoint.stray "$T/m6d-ck.log" || fail "no checkpoint.stray line"
release_boundary
ctl watch "$R" >/dev/null || fail "resumed run (crash in checkpoint) did not complete"
same_losses "$R" "$T/ref.csv" "losses differ after a crash mid-checkpoint"
stop_daemon
log "kill -9 during a checkpoint write (caught=${caught:-0}): same losses"

# 5. An operator delink, then a crash before the next checkpoint: the delink
#    is replayed at the same step (phases table), the curve is the same.
CKPT_EVERY=1000 spec "$T/op.json" op
start_daemon "$T/op"
submit_paused_at "$T/op.json" 5
R=$RUN
P=$(field "$R" step)
# a paused run delinks at once, at the boundary it is paused at, and stays
# paused
out=$(ctl delink "$R") || fail "delink of paused run $R: $out"
echo "$out" | has "delinks now, at the step boundary it is paused at; it stays paused" \
    || fail "delink of a paused run answered: $out"
# from the reply on, status shows the delink: pending until it is done,
# then the real phase (never the pseudo phase with nothing pending)
ctl status "$R" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)
assert 'delinking' in (s.get('pending') or '') or s['phase'] == 'real', s" \
    || fail "status right after the delink's reply shows neither: $(ctl status "$R")"
wait_for "paused run $R to delink" 20 sh -c \
    "[ \"\$(sqlite3 -cmd '.timeout 5000' '$T/op/m6.db' \"select phase from runs where id=$R\")\" = real ]"
[ "$(field "$R" state)" = paused ] || fail "run $R after a delink while paused: $(field "$R" state)"
hold_at_step $((P + 5)) nowait
ctl resume "$R" >/dev/null
wait_held
kill9_daemon
release_boundary
K=$(db "$T/op" "select step from runs where id=$R")
[ "$K" -lt $N ] || fail "run finished before kill -9 (op)"
sqlite3 -readonly -cmd '.timeout 5000' -csv "$T/op/m6.db" "select step, phase, printf('%.9g', train_loss) from metrics where run=$R order by step" >"$T/op-before.csv"
start_daemon "$T/op"
ctl watch "$R" >/dev/null || fail "op run did not complete"
sqlite3 -readonly -cmd '.timeout 5000' -csv "$T/op/m6.db" "select step, phase, printf('%.9g', train_loss) from metrics where run=$R and step<=$K order by step" >"$T/op-after.csv"
diff "$T/op-before.csv" "$T/op-after.csv" >"$T/diff" || fail "operator-delink replay differs: $(head "$T/diff")"
[ "$(db "$T/op" "select from_step from phases where run=$R and phase='real'")" = "$P" ] || fail "op phases"
db "$T/op" "select detail from events where run=$R and kind='delink'" | has "step=$P reason=replay" \
    || fail "no replayed delink: $(db "$T/op" "select kind, detail from events where run=$R")"
stop_daemon
log "operator delink at $P replayed after kill -9 at $K"

# 6. watch must not take another m6d's run 1 for its own: the socket it
#    watches on comes back served from another state dir (ids restart).
ref_held "$T/w" 5
watch_bg w "$R"
WSOCK=$SOCK
stop_daemon
release_boundary
start_daemon "$T/ref"   # its run 1: the completed reference run
ln -sf "$SOCK" "$WSOCK"
wait "$WATCH_PID"
[ "$(cat "$T/watch-w.rc")" = 1 ] || fail "watch took another m6d's run for its own: rc $(cat "$T/watch-w.rc"), $(tail -2 "$T/watch-w.out")"
grep -q "is another run" "$T/watch-w.err" || fail "watch, other m6d: $(cat "$T/watch-w.err")"
stop_daemon
# 7. A checkpoint that does not load is set aside as <dir>.bad, never
#    deleted. (a) With an older one (the newest's tensor data damaged),
#    the run goes on from it: same losses.
#    (b) With none, the run is paused with the reason instead of starting
#    over silently from step 0; resume starts it over: same losses (the run
#    is deterministic).
corrupt_ckpt() { truncate -s 100 "$1/model.safetensors"; }
# four bytes of an Inf in the middle of the tensor data: the header still
# parses; only the data's CRC-32 tells
damage_ckpt_data() {
    local f=$1/model.safetensors
    printf '\000\000\200\177' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 2 )) \
        conv=notrunc status=none
}
ref_killed "$T/bad" 45
C=$(db "$T/bad" "select max(step) from checkpoints where run=$R")
PREV=$(db "$T/bad" "select max(step) from checkpoints where run=$R and step<$C")
[ -n "$PREV" ] || fail "want two checkpoints, have $(db "$T/bad" "select group_concat(step) from checkpoints where run=$R")"
damage_ckpt_data "$T/bad/runs/$R/checkpoints/step-$C"
start_daemon "$T/bad"
ctl watch "$R" >/dev/null || fail "run with a bad newest checkpoint did not complete"
[ -d "$T/bad/runs/$R/checkpoints/step-$C.bad" ] || fail "bad checkpoint step-$C not kept as step-$C.bad: $(ls "$T/bad/runs/$R/checkpoints")"
grep -q "checkpoint.bad run=$R .*action=set_aside kept=.*step-$C.bad" "$T/m6d-bad.log" || fail "no checkpoint.bad line: $(grep checkpoint "$T/m6d-bad.log")"
grep -q "run.restore run=$R step=$PREV" "$T/m6d-bad.log" || fail "did not go on from checkpoint $PREV"
grep -q "checkpoint.bad run=$R .*tensor data damaged" "$T/m6d-bad.log" || fail "the bad checkpoint's reason: $(grep checkpoint.bad "$T/m6d-bad.log")"
same_losses "$R" "$T/ref.csv" "losses differ after a bad checkpoint"
stop_daemon
log "newest checkpoint ($C) data damaged: kept as step-$C.bad, went on from $PREV, same losses"

ref_killed "$T/bad2" 15
ROWS=$(db "$T/bad2" "select count(*) from metrics where run=$R")
STEP=$(db "$T/bad2" "select step from runs where id=$R")
for d in "$T/bad2/runs/$R/checkpoints"/step-*; do corrupt_ckpt "$d"; done
start_daemon "$T/bad2"
ERR=$(wait_paused_error "$R" "does not load")
echo "$ERR" | has "nor does any older one: .m6ctl resume. starts the run over from step 0" \
    || fail "no checkpoint loads: error '$ERR'"
compgen -G "$T/bad2/runs/$R/checkpoints/step-*.bad" >/dev/null || fail "bad checkpoints not kept"
# paused, nothing dropped: starting over is the operator's word (resume),
# not the start's, and a stop would keep the run's history; across a
# restart of m6d too
kept_rows() {
    [ "$ROWS" -gt 0 ] && [ "$(db "$T/bad2" "select count(*) from metrics where run=$R")" = "$ROWS" ] \
        && [ "$(db "$T/bad2" "select step from runs where id=$R")" = "$STEP" ] \
        || fail "$1: metrics rows $(db "$T/bad2" "select count(*) from metrics where run=$R") (had $ROWS), step $(db "$T/bad2" "select step from runs where id=$R") (had $STEP)"
}
kept_rows "paused with no checkpoint that loads"
stop_daemon
start_daemon "$T/bad2"
ERR=$(wait_paused_error "$R" "set aside")
echo "$ERR" | has "no checkpoint of run $R loads: every one it had was set aside ([0-9]*, the newest as step-[0-9]*.bad)" \
    || fail "no checkpoint loads, after a restart: error '$ERR'"
kept_rows "the same after a restart"
resume_to_reference "$R" "started over after every checkpoint failed"
events_has "$R" "resume.start_over.*metrics rows dropped" >/dev/null \
    || fail "$(events_has "$R" "resume.start_over")"
stop_daemon
log "every checkpoint bad: paused ('$ERR'), $ROWS metrics rows kept across a restart; resumed from step 0, same losses"
echo "ok restart"
