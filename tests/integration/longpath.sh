#!/usr/bin/env bash
# longpath.sh — a shard on a very long path (about 3000 bytes: twelve nested
# directories of 248 bytes) goes bad under a running run: the error reaches
# the operator whole, never cut. `m6ctl status` (text and --json), `m6ctl
# events`, the refused `resume` and the state DB's runs.error all carry the
# shard's full path and the problem after it; the edge's advice follows.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
# the spec's glob (at most 1023 bytes) reaches the shard through wildcards
D=$T/deep
GLOB=$T/deep
for k in $(seq -w 1 12); do
    D=$D/$(printf "d%s%0245d" "$k" 0)
    GLOB=$GLOB/d$k*
done
mkdir -p "$D"
TRAIN=$D/train_000000.bin
cp "$T/data/train_000000.bin" "$TRAIN"
[ "${#TRAIN}" -ge 3000 ] || fail "the shard's path is ${#TRAIN} bytes, want >= 3000"
N=$(( ($(stat -c %s "$TRAIN") - 1024) / 2 ))
CKPT_EVERY=500 write_spec "$T/spec.json" longpath 1000000 0 '"device": {"threads": 1}'
sed -i "s|\"train\": \"$T/data/train_\*.bin\"|\"train\": \"$GLOB/train_*.bin\"|" "$T/spec.json"
grep -q "\"train\": \"$T/deep/d01" "$T/spec.json" || fail "spec not rewritten: $(cat "$T/spec.json")"

# A run no machine finishes in the test's lifetime (the test stops it),
# held at its boundary (lib.sh hold_boundary) when its shard is truncated:
# training when that happens, however short its steps
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"
hold_at_step 20 nowait
A=$(ctl submit "$T/spec.json") || fail "submit of a spec with a long shard path"
wait_held
truncate -s $((1024 + 2 * 1000)) "$TRAIN"
release_boundary
PROBLEM="truncated while in use: now 1000 tokens, was $N"
WANT="data.train: $TRAIN: $PROBLEM; once the shard is fixed, \`m6ctl resume\` reopens the data"
ERR=$(wait_paused_error "$A" "truncated while in use")
[ "$ERR" = "$WANT" ] || fail "status --json error is not whole (${#ERR} bytes, want ${#WANT}): '$ERR'"
kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died"

# status as text: the whole error on its line
ctl status "$A" >"$T/status.out" || fail "status"
grep -qF -- "$TRAIN: $PROBLEM" "$T/status.out" \
    || fail "status text lacks the full path and the problem: $(cat "$T/status.out")"
# events: the paused.error event's detail, whole
ctl events "$A" >"$T/events.out" || fail "events"
grep -F -- "$TRAIN: $PROBLEM" "$T/events.out" | has "paused.error" \
    || fail "events lack the full path and the problem: $(cat "$T/events.out")"
ctl events "$A" --json >"$T/events.json" || fail "events --json"
python3 - "$T/events.json" "data.train: $TRAIN: $PROBLEM" <<'PY' || fail "events --json: detail not whole"
import json, sys
text = open(sys.argv[1]).read()
want = sys.argv[2]
try:
    rows = json.loads(text)
except ValueError:
    rows = [json.loads(l) for l in text.splitlines() if l.strip()]
if isinstance(rows, dict):
    rows = rows.get("events", [rows])
details = [r.get("detail", "") for r in rows if r.get("kind") == "paused.error"]
sys.exit(0 if any(d.endswith(want) for d in details) else 1)
PY
# the state DB keeps the reason whole
[ "$(db "$T/s" "select error from runs where id=$A")" = "data.train: $TRAIN: $PROBLEM" ] \
    || fail "runs.error not whole: $(db "$T/s" "select length(error) from runs where id=$A") bytes"
# a resume with the shard still short: refused with the whole cause
OUT=$(resume_refused "$A" "truncated")
# (reopened, the shard now fails the open's check)
echo "$OUT" | has -F -- "data.train: $TRAIN: truncated: header says $N tokens, file holds 1000; once the shard is fixed, \`m6ctl resume\` reopens the data" \
    || fail "refused resume not whole: '$OUT'"
# m6d's log line of the pause, whole too
grep -F -- "$TRAIN: $PROBLEM" "$T/m6d-s.log" | has "run.paused run=$A" \
    || fail "the run.paused log line is cut"
log "error of ${#ERR} bytes whole in status, events, the DB and resume (path ${#TRAIN} bytes)"

# restored, the run goes on
cp "$T/data/train_000000.bin" "$TRAIN"
ctl resume "$A" >/dev/null || fail "resume (restored)"
wait_state "$A" running 30
ctl stop "$A" >/dev/null || fail "stop"
wait_state "$A" stopped 60
stop_daemon
echo "ok longpath"
