#!/usr/bin/env bash
# shards.sh — a shard changes under a running run: truncated in place, or
# rewritten with a token id >= vocab_size (train or val). m6d survives and
# keeps answering, the run pauses with an error naming the file and the
# problem, another run queues behind it; once the shard is restored,
# `m6ctl resume` finishes the run with the losses of an uninterrupted one.
# The same across an m6d restart: a run paused on bad data, or left running
# when m6d stopped and whose data went bad meanwhile, is paused (not
# failed) at the next start with the data error, and resumes as above.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
TRAIN=$T/data/train_000000.bin
VAL=$T/data/val_000000.bin
cp "$TRAIN" "$T/train.orig"
cp "$VAL" "$T/val.orig"
N=$(( ($(stat -c %s "$TRAIN") - 1024) / 2 ))
CKPT_EVERY=500 write_spec "$T/spec.json" shards 600 0 '"device": {"threads": 1}'
# another run, on its own copy of the data
cp -r "$T/data" "$T/data2"
CKPT_EVERY=500 write_spec "$T/small.json" small 20 0 '"device": {"threads": 1}'
sed -i "s|$T/data/|$T/data2/|g" "$T/small.json"

# Every m6d here honours the boundary hold (lib.sh hold_boundary): the test
# holds the worker at its boundary before it damages the data under a
# training run, pauses or restarts it, so the run is alive for that however
# short its steps; the damage then meets the next step.
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE

# restore FILE ORIG: the original bytes back in place (the same inode).
restore() { cat "$2" >"$1"; }
# poison FILE: every token 999, in place, the size unchanged.
poison() {
    python3 - "$1" <<'PY'
import os, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(1024)
    f.write(b"\xe7\x03" * ((os.path.getsize(p) - 1024) // 2))
PY
}
# wait_error RUN: until the run is paused with an error; prints it.
wait_error() {
    local e
    for _ in $(seq 1 600); do
        kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died (run $1)"
        if [ "$(field "$1" state)" = paused ]; then
            e=$(field "$1" error)
            [ -n "$e" ] && { echo "$e"; return 0; }
        fi
        nap 0.05
    done
    fail "run $1 did not pause with an error within 30 s; last state: $(run_state "$1")"
}

# never_failed RUN: no failed event, not failed now.
never_failed() {
    [ "$(field "$1" state)" != failed ] || fail "run $1 failed: $(field "$1" error)"
    [ "$(db "$T/s" "select count(*) from events where run=$1 and kind='failed'")" = 0 ] \
        || fail "run $1 has a failed event: $(db "$T/s" "select detail from events where run=$1 and kind='failed'")"
}
# restart_daemon [CMD ARGS...]: SIGTERM m6d (exit 0 asserted), run CMD
# while it is down, start it again on the same state. life_log: the log of
# the new life only.
restart_daemon() {
    stop_daemon
    release_boundary
    if [ $# -gt 0 ]; then "$@"; fi
    LIFE_FROM=$(( $(wc -l <"$LOG") + 1 ))
    start_daemon "$T/s"
}
life_log() { tail -n +"$LIFE_FROM" "$LOG"; }

# 1. The reference: uninterrupted.
reference_losses "$T/ref" "$T/spec.json" "$T/ref.csv"

# 2. The train shard is truncated in place while the run trains.
start_daemon "$T/s"
LOG=$T/m6d-s.log
hold_at_step 50 nowait
A=$(ctl submit "$T/spec.json")
ctl watch "$A" --interval 0.05 >"$T/watch.out" 2>&1 &
WATCH=$!
wait_held
truncate -s $((1024 + 2 * 1000)) "$TRAIN"
release_boundary
ERR=$(wait_error "$A")
kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died when a shard was truncated"
echo "$ERR" | has "data.train: .*train_000000.bin: truncated while in use: now 1000 tokens, was $N" \
    || fail "error does not name the file and the sizes: '$ERR'"
K=$(field "$A" step)
[ "$K" -lt 600 ] || fail "run completed on a truncated shard"
db "$T/s" "select detail from events where run=$A and kind='paused.error'" \
    | has "truncated while in use" || fail "no paused.error event with the cause"
grep -q "run.paused run=$A" "$LOG" || fail "no run.paused log line"
# m6d keeps serving: another run is taken and queued, status answers
B=$(ctl submit "$T/small.json") || fail "submit while a run is paused on bad data"
[ "$(field "$B" state)" = queued ] || fail "run $B: $(field "$B" state), wanted queued"
ctl list >/dev/null || fail "list"
ctl status "$A" | has "truncated while in use" || fail "status does not show the error"
for _ in $(seq 1 100); do
    grep -q "run $A paused at step $K: data.train: .*truncated while in use" "$T/watch.out" && break
    nap 0.05
done
grep -q "run $A paused at step $K: data.train: .*truncated while in use" "$T/watch.out" \
    || fail "watch does not say why the run paused: $(tail -n 3 "$T/watch.out")"
nap 0.5
[ "$(field "$A" step)" = "$K" ] || fail "paused run moved on: $K -> $(field "$A" step)"
# the pause took a checkpoint of step K, as a plain pause does
[ "$(db "$T/s" "select max(step) from checkpoints where run=$A")" = "$K" ] \
    || fail "no checkpoint at the data error's pause (step $K): $(db "$T/s" "select group_concat(step) from checkpoints where run=$A")"
log "truncated at step $K: '$ERR'"

# 3. Resume with the shard still short: refused with the cause, still paused.
resume_refused "$A" "data.train: .*truncated" >/dev/null
[ "$(db "$T/s" "select count(*) from events where run=$A and kind='resume'")" = 0 ] \
    || fail "a refused resume was recorded as a resume event"
ERR=$(wait_error "$A")
echo "$ERR" | has "truncated" || fail "second pause without the cause: '$ERR'"
[ "$(field "$A" step)" = "$K" ] || fail "run trained on a truncated shard"

# 4. Shard restored: resume finishes with the reference's losses; then B.
restore "$TRAIN" "$T/train.orig"
ctl resume "$A" >/dev/null || fail "resume (restored)"
ctl watch "$A" >/dev/null || fail "run did not complete after the shard came back"
wait "$WATCH" || fail "the watch started before the truncation: exit $?, want 0"
[ -z "$(field "$A" error)" ] || fail "error kept after completion: $(field "$A" error)"
same_losses "$A" "$T/ref.csv" "losses differ after the truncation"
ctl watch "$B" >/dev/null || fail "the queued run did not complete"
log "restored: completed with the reference's losses; the queued run ran"

# 5. A token id >= vocab_size written into the train shard while the run
#    is paused (the fd is open, the shard was checked): resume pauses again
#    naming the file and the token; restored, the run completes as before.
submit_paused_at "$T/spec.json" 30
C=$RUN
K=$(field "$C" step)
poison "$TRAIN"
ctl resume "$C" >/dev/null || fail "resume (poisoned)"
ERR=$(wait_error "$C")
echo "$ERR" | has -E "data.train: .*train_000000.bin: token 999 at index [0-9]+ >= vocab_size 256" \
    || fail "error does not name the file and the token: '$ERR'"
[ "$(field "$C" step)" = "$K" ] || fail "run trained on a bad token: $K -> $(field "$C" step)"
# still bad at resume: the data is checked again as at a start
resume_refused "$C" "train_000000.bin: token 999 at index 0 >= vocab_size 256" >/dev/null
ERR2=$(wait_error "$C")
echo "$ERR2" | has -E "train_000000.bin: token 999 at index 0 >= vocab_size 256" \
    || fail "resume on a still bad shard: '$ERR2'"
restore "$TRAIN" "$T/train.orig"
log "bad train token at step $K: '$ERR'"

# 6. The same in the val shard while the run trains: the step that
#    evaluates is recorded, the run pauses; restored, resume redoes the
#    evaluation (the same val_loss).
hold_at_step $((K + 20)) nowait
ctl resume "$C" >/dev/null || fail "resume (restored train)"
wait_held
poison "$VAL"
release_boundary
ERR=$(wait_error "$C")
echo "$ERR" | has -E "data.val: .*val_000000.bin: token 999 at index [0-9]+ >= vocab_size 256" \
    || fail "val error does not name the file and the token: '$ERR'"
K=$(field "$C" step)
[ $((K % 10)) = 0 ] || fail "val error at step $K, not an eval step"
# the step stands and its pause took a checkpoint of it: a crash before
# the fix does not train it again
[ "$(db "$T/s" "select max(step) from checkpoints where run=$C")" = "$K" ] \
    || fail "no checkpoint at the val error's pause (step $K): $(db "$T/s" "select group_concat(step) from checkpoints where run=$C")"
restore "$VAL" "$T/val.orig"
resume_to_reference "$C" "val restored"
kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died"
log "bad val token at step $K: '$ERR'; completed with the reference's losses"

# 7. Paused on a truncated train shard, then m6d restarts with the shard
#    still short: the run is paused at the start (the data error, checked
#    again, as its message), not failed; m6d keeps serving. A resume with
#    the shard still short pauses again; restored, the run completes with
#    the reference's losses.
hold_at_step 40 nowait
D=$(ctl submit "$T/spec.json")
wait_held
truncate -s $((1024 + 2 * 1000)) "$TRAIN"
release_boundary
wait_error "$D" >/dev/null
K=$(field "$D" step)
restart_daemon
ERR=$(wait_paused_error "$D" "train_000000.bin: truncated: header says $N tokens, file holds 1000")
echo "$ERR" | has "^data.train: $TRAIN: truncated: header says $N tokens, file holds 1000; once the shard is fixed, .m6ctl resume. reopens the data$" \
    || fail "restart on a short shard: error '$ERR'"
never_failed "$D"
[ "$(field "$D" step)" = "$K" ] || fail "run moved at the restart: $K -> $(field "$D" step)"
ctl status "$D" | has "truncated: header says $N tokens, file holds 1000" \
    || fail "status after the restart does not show the data error: $(ctl status "$D")"
life_log | has "run.paused run=$D step=$K reason=\"data.train: .*truncated" \
    || fail "no run.paused log line at the restart: $(life_log | grep "run=$D")"
db "$T/s" "select detail from events where run=$D and kind='paused.error' order by id desc limit 1" \
    | has "step=$K data.train: .*truncated: header says" || fail "no paused.error event at the restart"
ctl list >/dev/null || fail "m6d does not answer after the restart"
resume_refused "$D" "truncated: header says $N tokens, file holds 1000; once the shard is fixed, .m6ctl resume. reopens the data" >/dev/null
ERR=$(wait_paused_error "$D" "truncated")
never_failed "$D"
[ "$(field "$D" step)" = "$K" ] || fail "run trained on a short shard after the restart"
restore "$TRAIN" "$T/train.orig"
resume_to_reference "$D" "restored, after the restart"
log "paused at step $K, restarted with the shard short: paused ('$ERR'); restored: the reference's losses"

# 8. A run left running when m6d stopped, whose train shard went bad while
#    m6d was down: paused at the next start with the data error, not failed
#    (as it would have paused had the shard gone bad under a running m6d);
#    restored, resume completes it with the reference's losses.
hold_at_step 30 nowait
E=$(ctl submit "$T/spec.json")
wait_held
restart_daemon poison "$TRAIN"
ERR=$(wait_paused_error "$E" "token 999")
echo "$ERR" | has "^data.train: $TRAIN: token 999 at index 0 >= vocab_size 256; once the shard is fixed, .m6ctl resume. reopens the data$" \
    || fail "restart of a running run on a bad shard: error '$ERR'"
never_failed "$E"
K=$(field "$E" step)
life_log | has "run.recover run=$E step=$K .*paused=1" || fail "no run.recover paused=1 line: $(life_log | grep "run=$E")"
restore "$TRAIN" "$T/train.orig"
resume_to_reference "$E" "restored, run that was running"
log "running at the stop, shard bad at the start: paused at step $K ('$ERR'); restored: the reference's losses"

# 9. The val shard goes bad under the run (the eval step is recorded
#    without its val_loss and the run pauses), then m6d restarts with it
#    still bad: paused with the val error; restored, resume redoes that
#    step's validation pass, and every loss, val_loss included, is the
#    reference's.
hold_at_step 20 nowait
F=$(ctl submit "$T/spec.json")
wait_held
poison "$VAL"
release_boundary
wait_paused_error "$F" "^data.val: " >/dev/null
K=$(field "$F" step)
[ "$(db "$T/s" "select count(*) from metrics where run=$F and step=$K and val_loss is null")" = 1 ] \
    || fail "the step whose eval failed is not recorded without its val_loss"
restart_daemon
ERR=$(wait_paused_error "$F" "val_000000.bin: token 999 at index 0 >= vocab_size 256; once the shard is fixed")
never_failed "$F"
[ "$(field "$F" step)" = "$K" ] || fail "run moved at the restart: $K -> $(field "$F" step)"
restore "$VAL" "$T/val.orig"
resume_to_reference "$F" "val restored, after the restart"
log "val bad at step $K across a restart: paused ('$ERR'); restored: the reference's losses"

# 10. stop on a run paused by bad data: stopped at once, and the answer
#     does not speak of a failed write (nothing failed to write).
hold_at_step 5 nowait
G=$(ctl submit "$T/spec.json")
wait_held
cp "$TRAIN" "$T/train.orig2"
truncate -s 2000 "$TRAIN"
release_boundary
wait_paused_error "$G" "truncated" >/dev/null
OUT=$(ctl stop "$G") || fail "stop of a run paused on bad data"
echo "$OUT" | has "write failed" && fail "stop speaks of a failed write: $OUT"
for _ in $(seq 1 100); do [ "$(field "$G" state)" = stopped ] && break; nap 0.05; done
[ "$(field "$G" state)" = stopped ] || fail "run paused on bad data not stopped: $(field "$G" state)"
restore "$TRAIN" "$T/train.orig2"
kill -0 "$DAEMON_PID" 2>/dev/null || fail "m6d died"
log "stop of a run paused on bad data: '$OUT'"

# 11. A train shard added while m6d is down: the split holds more tokens
#     than the run's checkpoint was trained on (meta.json train_tokens), so
#     the run would draw other batches. Paused at the start naming both
#     counts, not failed; a resume with the shard still there is refused;
#     once it is gone, resume completes with the reference's losses.
TOT=0
for f in "$T"/data/train_*.bin; do TOT=$((TOT + ($(stat -c %s "$f") - 1024) / 2)); done
hold_at_step 30 nowait
H=$(ctl submit "$T/spec.json")
wait_held
restart_daemon cp "$TRAIN" "$T/data/train_000099.bin"
grep -q "\"train_tokens\": $TOT" "$T"/s/runs/"$H"/checkpoints/*/meta.json \
    || fail "meta.json does not record train_tokens $TOT: $(cat "$T"/s/runs/"$H"/checkpoints/*/meta.json)"
ERR=$(wait_paused_error "$H" "^data.train: $((TOT + N)) tokens now, the run was trained on $TOT ")
never_failed "$H"
resume_refused "$H" "data.train: $((TOT + N)) tokens now, the run was trained on $TOT " >/dev/null
rm "$T/data/train_000099.bin"
resume_to_reference "$H" "extra shard removed"
stop_daemon
log "shard added across a restart: paused ('$ERR'); removed: the reference's losses"
echo "ok shards"
