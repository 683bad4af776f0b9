#!/usr/bin/env bash
# nofile.sh — a run holds one file descriptor per shard, so a corpus of many
# small shards meets RLIMIT_NOFILE. m6d raises its soft limit to the hard
# one at start and logs both. Under a hard limit too low for a corpus, a
# submit is refused and a run taken up at a start is paused, each with
# "too many open files (limit N)" naming the shard, while m6d keeps serving
# and other runs train as before; under a higher limit the same run resumes
# with the losses of an uninterrupted one, also after a data error (the
# shards are opened again without holding the old set open meanwhile).
. "$(dirname "$0")/lib.sh"

HARD=$(ulimit -H -n)
if [ "$HARD" != unlimited ] && [ "$HARD" -lt 1024 ]; then
    echo "SKIP: hard RLIMIT_NOFILE $HARD, this test wants at least 1024"
    exit 77
fi
[ -f "$FORTUNES/computers" ] || { echo "SKIP: no $FORTUNES/computers"; exit 77; }

# One run on ordinary data (a train and a val shard), one on ~220 train and
# ~12 val shards of 1024 tokens each.
prepare_data "$T/data"
CKPT_EVERY=500 write_spec "$T/small.json" small 600 0 '"device": {"threads": 1}'
"$M6CTL" data prepare --out "$T/many" --val-fraction 0.05 --shard-tokens 1024 \
    "$FORTUNES/computers" >"$T/many.out" 2>&1 || fail "data prepare (many): $(cat "$T/many.out")"
NT=$(compgen -G "$T/many/train_*.bin" | wc -l)
NV=$(compgen -G "$T/many/val_*.bin" | wc -l)
[ "$NT" -gt 100 ] && [ "$NV" -ge 1 ] || fail "want > 100 train shards, got $NT (+ $NV val)"
cp -r "$T/many" "$T/many.orig"
CKPT_EVERY=500 write_spec "$T/many.json" many 600 0 '"device": {"threads": 1}'
sed -i "s|$T/data/|$T/many/|g" "$T/many.json"

LOG=$T/m6d-s.log
# start LIMITS: m6d on $T/s under `ulimit LIMITS`; life_log: this life's log
start() {
    LIFE_FROM=$(( $( (cat "$LOG" 2>/dev/null || true) | wc -l) + 1 ))
    release_boundary
    ULIMIT="$1" M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"
}
life_log() { tail -n +"$LIFE_FROM" "$LOG"; }
alive() { kill -0 "$DAEMON_PID" 2>/dev/null && ctl list >/dev/null || fail "m6d stopped serving: $1"; }
runs() { ctl list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
# wait_completed RUN: until the run completes; a pause with an error or a
# failure on the way is a failure here (watch would wait on a paused run).
wait_completed() {
    local s=
    for _ in $(seq 1 2400); do
        s=$(field "$1" state)
        case $s in
        completed) return 0 ;;
        failed|stopped) fail "run $1 $s: $(field "$1" error)" ;;
        paused) [ -z "$(field "$1" error)" ] || fail "run $1 paused: $(field "$1" error)" ;;
        esac
        nap 0.05
    done
    fail "run $1 did not complete within 120 s; last state: $(run_state "$1")"
}
# poison_all / restore_all: every train shard's tokens 999 in place (the
# same size and inode) / the original bytes back in place.
poison_all() {
    python3 - "$T/many" <<'PY'
import glob, os, sys
for p in glob.glob(sys.argv[1] + "/train_*.bin"):
    with open(p, "r+b") as f:
        f.seek(1024)
        f.write(b"\xe7\x03" * ((os.path.getsize(p) - 1024) // 2))
PY
}
restore_all() {
    local f
    for f in "$T/many.orig"/train_*.bin; do cat "$f" >"$T/many/$(basename "$f")"; done
}

# 1. Soft limit 64, the hard one as it is: m6d raises the soft limit and
#    says so; a run over all those shards trains to the end (the
#    reference), and so does the small one.
start "-S -n 64"
life_log | has "info daemon.nofile old=64 new=$HARD$" \
    || fail "no daemon.nofile line raising 64 to $HARD: '$(life_log | grep nofile)'"
M=$(ctl submit "$T/many.json") || fail "submit over $NT+$NV shards after the raise"
ctl watch "$M" >/dev/null || fail "the many-shard run did not complete after the raise"
losses "$M" >"$T/many-ref.csv"
S=$(ctl submit "$T/small.json")
ctl watch "$S" >/dev/null || fail "small reference run"
losses "$S" >"$T/small-ref.csv"
stop_daemon
log "soft 64 raised to $HARD: a run over $NT+$NV shards completed"

# 2. Hard limit 64 (nothing to raise): a submit over the many shards is
#    refused with the cause and leaves nothing queued, next to a small run
#    that trains on and ends with its reference losses.
start "-n 64"
life_log | has "info daemon.nofile old=64 new=64$" \
    || fail "no daemon.nofile line at hard 64: '$(life_log | grep nofile)'"
S2=$(ctl submit "$T/small.json")
wait_step "$S2" 5
n0=$(runs)
rc=0; ctl submit "$T/many.json" >"$T/submit.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "submit over $NT shards under 64 files: exit $rc, want 1: $(cat "$T/submit.out")"
grep -Eq "not queued: data.train: too many open files \(limit 64\): $T/many/train_[0-9]+\.bin: open: shard [0-9]+ of $NT; a run keeps every shard open: raise m6d's open-file limit" "$T/submit.out" \
    || fail "submit refused without the cause: $(cat "$T/submit.out")"
[ "$(runs)" = "$n0" ] || fail "a refused submit left a run"
alive "after the refused submit"
ctl watch "$S2" >/dev/null || fail "the small run did not complete next to the refused submit"
same_losses "$S2" "$T/small-ref.csv" "small run's losses changed"
stop_daemon
log "hard 64: submit refused ('$(tail -n 1 "$T/submit.out" | cut -c1-160)...'); run $S2 unaffected"

# 3. The many-shard run left running when m6d stops, taken up again under
#    hard 64: it cannot open its shards, so it pauses (not fails) with the
#    limit in its error; a resume under the same limit is refused.
start "-S -n 64"
hold_at_step 30 nowait
M2=$(ctl submit "$T/many.json")
wait_held  # running when m6d stops, however short its steps
stop_daemon
start "-n 64"
want="^data.train: too many open files \(limit 64\): $T/many/train_[0-9]+\.bin: open: shard [0-9]+ of $NT; a run keeps every shard open: .*; once m6d can open them, .m6ctl resume. reopens the data$"
ERR=$(wait_paused_error "$M2" "$want")
[ "$(db "$T/s" "select count(*) from events where run=$M2 and kind='failed'")" = 0 ] \
    || fail "run $M2 failed at the start"
K=$(field "$M2" step)
ctl status "$M2" | has "too many open files (limit 64)" || fail "status does not show the cause"
resume_refused "$M2" "too many open files \\(limit 64\\)" >/dev/null
wait_paused_error "$M2" "$want" >/dev/null
[ "$(field "$M2" step)" = "$K" ] || fail "run $M2 moved without its data: $K -> $(field "$M2" step)"
stop_daemon
log "hard 64 at the start: run $M2 paused at step $K: '$ERR'"

# 4. A hard limit that holds the run's shards once but not twice: resumed,
#    the run trains; every train shard goes bad under it and it pauses;
#    restored, resume opens the shards again (closing the old set first)
#    and the run completes with the reference's losses.
LIM=$((NT + NV + 60))
start "-n $LIM"
life_log | has "info daemon.nofile old=$LIM new=$LIM$" || fail "no daemon.nofile line at $LIM"
[ "$(field "$M2" state)" = paused ] || fail "run $M2 not paused at the start: $(field "$M2" state)"
hold_at_step $((K + 20)) nowait  # the poison meets a training run, however short its steps
ctl resume "$M2" >/dev/null || fail "resume under $LIM files"
wait_held
poison_all
release_boundary
ERR=$(wait_paused_error "$M2" "^data.train: $T/many/train_[0-9]+\.bin: token 999 at index [0-9]+ >= vocab_size 256")
restore_all
ctl resume "$M2" >/dev/null || fail "resume (restored) under $LIM files"
wait_completed "$M2"
same_losses "$M2" "$T/many-ref.csv" "run $M2's losses differ from the reference"
alive "at the end"
stop_daemon
log "hard $LIM: resumed, paused on bad shards, restored: completed with the reference's losses"
echo "ok nofile"
