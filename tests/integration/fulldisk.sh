#!/usr/bin/env bash
# fulldisk.sh — the state dir's disk fills up mid-run: the run pauses at a
# step boundary with an error naming the cause, the daemon keeps answering,
# the log does not fill with one line per step, no *.tmp-* dir is left; once
# the space is back, `m6ctl resume` finishes the run with the same losses as
# an uninterrupted one. Needs root to mount a small tmpfs (else skipped).
. "$(dirname "$0")/lib.sh"

MNT=$T/mnt
mkdir -p "$MNT"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=8M tmpfs "$MNT" 2>"$T/mount.err"; then
    echo "SKIP: cannot mount a tmpfs (needs root): $(cat "$T/mount.err" 2>/dev/null)"
    exit 77
fi
CK=$T/ck/runs/1/checkpoints   # stage 5: checkpoints alone on a small disk
umount_() {
    [ -n "$DAEMON_PID" ] && kill -9 "$DAEMON_PID" 2>/dev/null
    DAEMON_PID=
    umount "$CK" 2>/dev/null || true
    umount "$MNT" 2>/dev/null || true
    cleanup_
}
trap umount_ EXIT

prepare_data "$T/data"   # outside the small disk
write_spec "$T/spec.json" fd 600 0 '"device": {"threads": 1}'

# 1. The reference: uninterrupted, on the big disk.
reference_losses "$T/ref" "$T/spec.json" "$T/ref.csv"

# 2. The same run on the small disk; pause it, fill the disk, resume.
S=$MNT/s
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$S"
LOG=$T/m6d-s.log
submit_paused_at "$T/spec.json" 1  # alive for the pause, however short its steps
R=$RUN
P=$(field "$R" step)
dd if=/dev/zero of="$MNT/filler" bs=64k 2>/dev/null || true  # until ENOSPC
before=$(wc -l <"$LOG")
# the resume itself may already meet the full disk (recording it)
out=$(ctl resume "$R" 2>&1) || echo "$out" \
    | has -E "could not resume, it stays paused: .*(No space left on device|disk is full)" \
    || fail "resume (disk full): $out"
for _ in $(seq 1 200); do
    [ -n "$(field "$R" error)" ] && break
    nap 0.05
done
wait_state "$R" paused 10
ERR=$(field "$R" error)
echo "$ERR" | has -E "No space left on device|disk is full" \
    || fail "status error does not name the cause: '$ERR'"
K=$(field "$R" step)
[ "$K" -lt 600 ] || fail "run reached the end on a full disk"
[ "$K" -le $((P + 10)) ] || fail "run trained on to step $K after the disk filled at $P"
ctl list >/dev/null || fail "daemon does not answer on a full disk"
nap 1  # a looping or step-spamming runner would show now
[ "$(field "$R" step)" = "$K" ] || fail "paused run moved on: $K -> $(field "$R" step)"
errs=$(tail -n +"$((before + 1))" "$LOG" | grep -c " error " || true)
[ "$errs" -le 8 ] || fail "$errs error lines for one full disk: $(tail -n +"$((before + 1))" "$LOG")"
grep -q "run.paused run=$R" "$LOG" || fail "no run.paused line"
compgen -G "$S/runs/$R/checkpoints/*.tmp-*" >/dev/null && fail "failed checkpoint left a *.tmp-* dir"
log "disk full at step $K: paused, error '$ERR', $errs error lines"

# 3. Resuming on a still-full disk is refused with the error; still paused.
resume_refused "$R" "No space left on device|disk is full" >/dev/null
wait_state "$R" paused 10
field "$R" error | has -E "No space left on device|disk is full" || fail "second pause without the cause"
[ "$(field "$R" step)" = "$K" ] || fail "run trained on a still-full disk"

# 4. Space back: resume finishes the run, the curve is the uninterrupted one.
rm -f "$MNT/filler"
resume_to_reference "$R" "space back after the full disk"
[ -z "$(field "$R" error)" ] || fail "error kept after completion: $(field "$R" error)"
stop_daemon
log "space back: completed with the reference's losses"

# 5. Only the checkpoints' disk is full (the DB is fine): the third
#    checkpoint (~430 KB each, keep 3) does not fit in 1 MB. The error names
#    the file and ENOSPC; a retry on the still-full disk says the same (no
#    "File exists" from a leftover *.tmp-*); more room, resume, same curve.
mkdir -p "$CK"
mount -t tmpfs -o size=1M tmpfs "$CK" || fail "mount the checkpoints tmpfs"
start_daemon "$T/ck"
R=$(ctl submit "$T/spec.json")
[ "$R" = 1 ] || fail "expected run 1, got $R"
wait_state "$R" paused 60
ERR=$(field "$R" error)
echo "$ERR" | has "checkpoint failed: .*safetensors.*No space left on device" \
    || fail "checkpoint error does not name the file and the cause: '$ERR'"
[ "$(db "$T/ck" "select state from runs where id=$R")" = paused ] || fail "paused not recorded"
db "$T/ck" "select error from runs where id=$R" | has "No space left on device" \
    || fail "error not recorded in runs.error"
compgen -G "$CK/*.tmp-*" >/dev/null && fail "failed checkpoint left a *.tmp-* dir"
resume_refused "$R" "checkpoint failed: .*No space left on device" >/dev/null
wait_state "$R" paused 10
field "$R" error | has "No space left on device" || fail "retry: '$(field "$R" error)'"
mount -o remount,size=8M "$CK" || fail "remount bigger"
resume_to_reference "$R" "checkpoints disk grown after the checkpoint failure"
stop_daemon
log "checkpoints disk full: '$ERR'; completed with the reference's losses"
echo "ok fulldisk"
