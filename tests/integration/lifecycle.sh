#!/usr/bin/env bash
# lifecycle.sh — submit -> pause -> delink (by command) -> resume -> stop on a
# real m6d; the queue (one run at a time, submit order); phases/events rows;
# a concurrent sqlite3 reader, opened as OPERATIONS.md tells dashboards to
# (read-only, with a busy timeout), that must never fail.
# LIFECYCLE_STEPS (default 400; the pseudo phase half of it) is smaller
# for the run under valgrind (M6D_VALGRIND=1, lib.sh).
. "$(dirname "$0")/lib.sh"

N=${LIFECYCLE_STEPS:-400}
H=$((N / 2))
prepare_data "$T/data"
write_spec "$T/a.json" life-a "$N" "$H"
write_spec "$T/b.json" life-b "$N" "$H"
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"  # lib.sh hold_boundary

# A dashboard polling the DB all along, as the run writes. A WAL reader
# without a busy timeout may see SQLITE_BUSY when it races the writer's
# update of the WAL index (wal.c rereads a torn header under the write
# lock), so the reader is the documented one, and it must never fail.
( while [ ! -f "$T/stop-reader" ]; do
      sqlite3 -readonly -cmd '.timeout 1000' "$T/s/m6.db" 'select count(*) from metrics; select count(*) from events;' \
          >/dev/null 2>>"$T/reader.err" || echo "rc=$? at $(date +%H:%M:%S.%N)" >>"$T/reader.err"
      nap 0.01
  done ) &
READER=$!

# Pause once the runner owns the run (until then it is queued and a pause is
# refused), held at its boundary after step 1: it stops well before the
# spec's delink whatever the speed of a step.
hold_at_step 1 nowait
A=$(ctl submit "$T/a.json")
wait_held
ctl pause "$A" >/dev/null || fail "pause of run $A refused"
release_boundary
B=$(ctl submit "$T/b.json")
[ "$A" = 1 ] && [ "$B" = 2 ] || fail "run ids $A $B"
wait_state "$A" paused
[ "$(field "$B" state)" = queued ] || fail "run $B should wait in the queue"
ctl pause "$B" 2>"$T/err" && fail "pausing a queued run should be refused"
grep -q "queued" "$T/err" || fail "pause of a queued run: $(cat "$T/err")"

P=$(field "$A" step)
nap 0.3
[ "$(field "$A" step)" = "$P" ] || fail "run advanced while paused"
[ "$P" -lt "$H" ] || fail "paused too late (step $P)"
[ "$(db "$T/s" "select count(*) from checkpoints where run=$A and step=$P")" = 1 ] \
    || fail "no checkpoint at the pause step $P"
ctl pause "$A" 2>"$T/err" && fail "second pause should be refused"
grep -q "already paused" "$T/err" || fail "second pause: $(cat "$T/err")"

# Delink by command while paused: takes effect at this boundary.
ctl delink "$A" >/dev/null
for _ in $(seq 100); do [ "$(field "$A" phase)" = real ] && break; nap 0.05; done
[ "$(field "$A" phase)" = real ] || fail "no delink after the command"
[ "$(db "$T/s" "select from_step from phases where run=$A and phase='real'")" = "$P" ] \
    || fail "phases row: $(db "$T/s" "select * from phases")"
db "$T/s" "select detail from events where run=$A and kind='delink'" | has "step=$P reason=operator" \
    || fail "delink event: $(db "$T/s" "select * from events where run=$A")"
ctl delink "$A" 2>"$T/err" && fail "second delink should be refused"
grep -q "already in the real phase" "$T/err" || fail "second delink: $(cat "$T/err")"

hold_at_step $((P + 2)) nowait  # alive for the stop, however short its steps
ctl resume "$A" >"$T/resume.out"
# the step the reply names is the one it resumed at (the paused step), not
# wherever the run got to before the reply was written
grep -qx "run $A resumed at step $P" "$T/resume.out" || fail "resume reply: $(cat "$T/resume.out") (paused at $P)"
wait_state "$A" running
wait_held
[ "$(db "$T/s" "select phase from metrics where run=$A and step=$((P + 1))")" = real ] \
    || fail "step after delink not in the real phase"

ctl stop "$A" >/dev/null
release_boundary
rc=0; ctl watch "$A" >"$T/watch-a.out" || rc=$?
[ "$rc" = 3 ] || fail "watch of a stopped run should exit 3, got $rc"
[ "$(field "$A" state)" = stopped ] || fail "run $A not stopped"
S=$(field "$A" step)
[ "$(db "$T/s" "select max(step) from checkpoints where run=$A")" = "$S" ] \
    || fail "no checkpoint at the stop step $S"

# m6ctl events: the run's history as the events table holds it, in order
# (text and --json alike).
ctl events "$A" --json | python3 -c '
import json, sqlite3, sys
got = json.load(sys.stdin)
want = sqlite3.connect(sys.argv[1]).execute(
    "select id, kind, detail from events where run=? order by id", (int(sys.argv[2]),)).fetchall()
assert [(e["id"], e["kind"], e["detail"]) for e in got] == want, (got, want)
kinds = [e["kind"] for e in got]
for k in ("submit", "start", "pause", "delink", "resume", "stop"):
    assert k in kinds, (k, kinds)
assert kinds.index("pause") < kinds.index("delink") < kinds.index("resume") < kinds.index("stop"), kinds
' "$T/s/m6.db" "$A" || fail "events --json: $(ctl events "$A" --json)"
ctl events "$A" >"$T/events.txt" || fail "events"
[ "$(head -1 "$T/events.txt" | tr -s ' ')" = "TIME (UTC) KIND DETAIL" ] || fail "events header: $(head -1 "$T/events.txt")"
grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z +delink +step=$P reason=operator( |$)" "$T/events.txt" \
    || fail "events: no delink line: $(cat "$T/events.txt")"
[ "$(($(wc -l <"$T/events.txt") - 1))" = "$(db "$T/s" "select count(*) from events where run=$A")" ] \
    || fail "events: $(wc -l <"$T/events.txt") lines for $(db "$T/s" "select count(*) from events where run=$A") events"

# The queue moves on: B runs to the end, through the spec's delink.
rc=0; ctl watch "$B" --interval 0.05 >"$T/watch-b.out" || rc=$?
[ "$rc" = 0 ] || fail "watch B exit $rc: $(tail -3 "$T/watch-b.out")"
grep -q "delinked at step $H" "$T/watch-b.out" || fail "watch did not report the delink: $(cat "$T/watch-b.out")"
[ "$(db "$T/s" "select from_step from phases where run=$B and phase='real'")" = "$H" ] || fail "B phases"
db "$T/s" "select detail from events where run=$B and kind='delink'" | has "reason=spec" || fail "B delink event"
[ "$(db "$T/s" "select count(*) from metrics where run=$B")" = "$N" ] || fail "B metrics rows"
[ "$(db "$T/s" "select count(*) from checkpoints where run=$B")" -le 3 ] || fail "checkpoint.keep not honoured"
[ "$(ls "$T/s/runs/$B/checkpoints" | wc -l)" -le 3 ] || fail "old checkpoint dirs left"

# --json field names are stable.
ctl list --json | python3 -c '
import json, sys
runs = json.load(sys.stdin)
for k in ("id","name","state","phase","step","total_steps","train_loss","val_loss","tokens_per_s"):
    assert k in runs[0], k
assert [r["state"] for r in runs] == ["stopped", "completed"], runs
' || fail "list --json"
# list and status describe a finished run alike, field for field
for id in "$A" "$B"; do
    ctl list --json | python3 -c 'import json,sys; r=[r for r in json.load(sys.stdin) if r["id"]==int(sys.argv[1])][0]; print(json.dumps(r, sort_keys=True))' "$id" >"$T/l.json"
    ctl status "$id" --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), sort_keys=True))' >"$T/s.json"
    diff "$T/l.json" "$T/s.json" >"$T/diff" || fail "list and status differ for run $id: $(cat "$T/diff")"
done

# A run trained from scratch (pseudo.steps 0) never delinked: delink_step
# is null in --json and NULL in m6.db, and neither status nor watch says
# "delinked"; B, which delinked by its spec, has its step stored.
write_spec "$T/c.json" life-scratch 30 0
C=$(ctl submit "$T/c.json")
rc=0; ctl watch "$C" --interval 0.05 >"$T/watch-c.out" || rc=$?
[ "$rc" = 0 ] || fail "watch of the from-scratch run exit $rc: $(tail -3 "$T/watch-c.out")"
ctl status "$C" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["phase"] == "real" and r["delink_step"] is None, r
' || fail "from-scratch status --json: $(ctl status "$C" --json)"
ctl status "$C" >"$T/status-c.txt" || fail "status of the from-scratch run"
if grep -q "delinked" "$T/status-c.txt" "$T/watch-c.out"; then
    fail "from-scratch run said delinked: $(grep delinked "$T/status-c.txt" "$T/watch-c.out")"
fi
[ "$(db "$T/s" "select delink_step is null from runs where id=$C")" = 1 ] \
    || fail "runs.delink_step of the from-scratch run: $(db "$T/s" "select delink_step from runs where id=$C")"
[ "$(db "$T/s" "select delink_step from runs where id=$B")" = "$H" ] \
    || fail "runs.delink_step of run $B: $(db "$T/s" "select delink_step from runs where id=$B")"
ctl status "$B" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["delink_step"] == int(sys.argv[1]), r' "$H" \
    || fail "run $B's delink_step: $(ctl status "$B" --json)"

# An operator's delink of a running run, sent at a held boundary: status
# names the step it is taken at, and the delink happens there.
write_spec "$T/op.json" life-op "$N" "$H"
hold_at_step 2 nowait
O=$(ctl submit "$T/op.json")
wait_held
ctl delink "$O" >/dev/null || fail "delink of running run $O refused"
D=$(ctl status "$O" | sed -n 's/^phase: *pseudo (delink at step \([0-9]*\))$/\1/p')
[ -n "$D" ] && [ "$D" -lt "$H" ] || fail "status of the pending delink: $(ctl status "$O")"
release_boundary
for _ in $(seq 200); do [ "$(field "$O" phase)" = real ] && break; nap 0.05; done
db "$T/s" "select detail from events where run=$O and kind='delink'" | has "step=$D reason=operator" \
    || fail "status said the delink comes at step $D: $(db "$T/s" "select detail from events where run=$O and kind='delink'")"
ctl stop "$O" >/dev/null || fail "stop of run $O"
wait_state "$O" stopped 30

touch "$T/stop-reader"; wait "$READER"
if [ -s "$T/reader.err" ]; then fail "concurrent reader: $(sort -u "$T/reader.err" | head -3)"; fi
stop_daemon
echo "ok lifecycle (paused at $P, stopped at $S)"
