#!/usr/bin/env bash
# lostckpt.sh — a run whose checkpoint directories are gone when m6d
# restarts (kill -9, then the directory moved away) loses nothing: with
# none older to load it is paused with the directory named, its metrics
# rows, checkpoint rows and step kept (also across a SIGTERM restart, which
# must not write a step-0 checkpoint over them); put back, `resume` takes
# it up from them and it ends with the uninterrupted run's losses; or
# `resume --from-scratch` starts it over, said in events. With only the
# newest gone, the run goes on from the older one, said in an event.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE
N=40
write_spec "$T/ref.json" ref $N 20 '"device": {"threads": 1}'
reference_losses "$T/ref" "$T/ref.json" "$T/ref.csv"
[ "$(wc -l <"$T/ref.csv")" = $((N + 1)) ] || fail "reference rows: $(wc -l <"$T/ref.csv")"

# killed_at DIR STEP: a fresh m6d on DIR runs ref.json (its id into R),
# is killed -9 at the boundary after STEP; the checkpoints are every 10
killed_at() {
    start_daemon "$1"
    hold_at_step "$2" nowait
    R=$(ctl submit "$T/ref.json")
    wait_held
    kill9_daemon
    release_boundary
}
# rows DIR RUN: "<metrics rows> <checkpoint rows> <runs.step>"
rows() {
    echo "$(db "$1" "select count(*) from metrics where run=$2") \
$(db "$1" "select count(*) from checkpoints where run=$2") \
$(db "$1" "select step from runs where id=$2")"
}

# 1. Every checkpoint gone: paused, nothing dropped, nothing restarted.
D=$T/gone
killed_at "$D" 25
CK=$D/runs/$R/checkpoints
before=$(rows "$D" "$R")
[ "$before" = "25 2 25" ] || fail "before the move: metrics, checkpoints, step = $before"
mv "$CK" "$T/moved"
start_daemon "$D"
wait_state "$R" paused 20  # a run that trains on instead fails at once
e=$(wait_paused_error "$R" "is gone")
echo "$e" | has -F "$CK is gone" || fail "the pause does not name the directory: $e"
echo "$e" | has -F "step 10, 20" || fail "the pause does not name the steps: $e"
echo "$e" | has -F "m6ctl resume RUN --from-scratch" || fail "no advice in: $e"
[ "$(field "$R" step)" = 25 ] || fail "status step while gone: $(field "$R" step)"
# m6ctl checkpoints lists the rows kept, each said gone
on_disk() { ctl checkpoints "$R" --json | python3 -c "
import json, sys
print(' '.join('%d:%s' % (c['step'], c['on_disk']) for c in json.load(sys.stdin)))"; }
[ "$(on_disk)" = "10:False 20:False" ] || fail "checkpoints while gone: $(ctl checkpoints "$R")"
ctl checkpoints "$R" | has -E '^ +20 .* gone +/' || fail "checkpoints' table while gone: $(ctl checkpoints "$R")"
[ "$(rows "$D" "$R")" = "$before" ] || fail "rows changed while gone: $(rows "$D" "$R") (were $before)"
out=$(resume_refused "$R" "is gone")
[ "$(rows "$D" "$R")" = "$before" ] || fail "rows changed by a refused resume: $(rows "$D" "$R")"
# a SIGTERM restart: no checkpoint of the fresh trainer is written
stop_daemon
[ ! -e "$CK" ] || fail "m6d wrote $CK while the checkpoints were gone: $(ls "$CK")"
db "$D" "select detail from events where run=$R and kind='interrupted'" | has "step=25 paused" \
    || fail "interrupted event: $(db "$D" "select detail from events where run=$R and kind='interrupted'")"
start_daemon "$D"
wait_paused_error "$R" "is gone" >/dev/null
[ "$(rows "$D" "$R")" = "$before" ] || fail "rows changed by a restart while gone: $(rows "$D" "$R")"
# put back: resume takes it up from step 20 and it ends as the reference
mv "$T/moved" "$CK"
[ "$(on_disk)" = "10:True 20:True" ] || fail "checkpoints put back: $(ctl checkpoints "$R")"
out=$(ctl resume "$R") || fail "resume with the checkpoints back: $out"
echo "$out" | has "resumed at step 20" || fail "resume with the checkpoints back: $out"
db "$D" "select detail from events where run=$R and kind='resume'" | has "step=20" \
    || fail "resume event: $(db "$D" "select detail from events where run=$R and kind='resume'")"
ctl watch "$R" >/dev/null || fail "run $R did not complete after its checkpoints came back"
same_losses "$R" "$T/ref.csv" "losses after the checkpoints came back"
stop_daemon
log "all gone: paused with '$e'; put back: same losses"

# 2. Every checkpoint gone, the operator starts it over (--from-scratch):
#    its old trajectory's operator delink (before the spec's step 20) is not
#    replayed, so it ends as the reference does.
D=$T/scratch
start_daemon "$D"
submit_paused_at "$T/ref.json" 5
R=$RUN
P=$(field "$R" step)
ctl delink "$R" >/dev/null || fail "delink of paused run $R refused"
wait_for "paused run $R to delink" 20 sh -c \
    "[ \"\$(sqlite3 -readonly -cmd '.timeout 5000' '$D/m6.db' \"select phase from runs where id=$R\")\" = real ]"
hold_at_step $((P + 3)) nowait
ctl resume "$R" >/dev/null || fail "resume of run $R refused"
wait_held
kill9_daemon
release_boundary
M=$(db "$D" "select count(*) from metrics where run=$R")
rm -rf "$D/runs/$R/checkpoints"
start_daemon "$D"
wait_state "$R" paused 20
wait_paused_error "$R" "is gone" >/dev/null
[ "$(field "$R" phase)" = real ] || fail "phase while gone: $(field "$R" phase), want the recorded real"
out=$(ctl resume "$R" --from-scratch) || fail "resume --from-scratch: $out"
echo "$out" | has "resumed at step 0" || fail "resume --from-scratch: $out"
events_has "$R" "checkpoint.forgotten.*step=$P" >/dev/null || fail "no checkpoint.forgotten event"
events_has "$R" "resume.from_scratch.*$M metrics rows dropped" >/dev/null \
    || fail "no resume.from_scratch event: $(ctl events "$R")"
events_has "$R" "delink.forgotten.*step $P" >/dev/null || fail "no delink.forgotten event"
ctl watch "$R" >/dev/null || fail "run $R did not complete from scratch"
same_losses "$R" "$T/ref.csv" "losses after --from-scratch"
# --from-scratch on a run that has its checkpoints: refused, nothing done
submit_paused_at "$T/ref.json" 5
R=$RUN
rc=0; out=$(ctl resume "$R" --from-scratch 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "resume --from-scratch of a run with its checkpoints: exit $rc: $out"
echo "$out" | has "only a run paused because its checkpoints are gone" \
    || fail "resume --from-scratch refusal: $out"
[ "$(field "$R" state)" = paused ] || fail "run $R after a refused --from-scratch: $(field "$R" state)"
stop_daemon
log "--from-scratch: same losses as the reference; refused for a sound run"

# 3. Only the newest gone: the run goes on from the older one, said.
D=$T/newest
killed_at "$D" 25
rm -rf "$D/runs/$R/checkpoints/step-20"
start_daemon "$D"
ctl watch "$R" >/dev/null || fail "run $R did not complete with its newest checkpoint gone"
events_has "$R" "checkpoint.missing.*step=20 .*step-20 is gone; the run goes on from the checkpoint of step 10" \
    >/dev/null || fail "no checkpoint.missing event: $(ctl events "$R")"
events_has "$R" "resume.restart.*step=10 metrics_dropped=15" >/dev/null \
    || fail "no resume.restart event saying the rows dropped: $(ctl events "$R")"
same_losses "$R" "$T/ref.csv" "losses after the newest checkpoint went"
stop_daemon
log "newest gone: went on from step 10, said; same losses"

# 4. Gone in the pseudo phase: a delink (of the fresh trainer, over the
#    run's phases) is refused; a stop ends it at its recorded step without
#    writing a checkpoint.
D=$T/pseudo
killed_at "$D" 15
rm -rf "$D/runs/$R/checkpoints"
start_daemon "$D"
wait_state "$R" paused 20
wait_paused_error "$R" "is gone" >/dev/null
rc=0; out=$(ctl delink "$R" 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "delink while the checkpoints are gone: exit $rc: $out"
echo "$out" | has "is not delinked: its checkpoints are gone" || fail "delink refusal: $out"
[ "$(db "$D" "select count(*) from phases where run=$R and phase='real'")" = 0 ] \
    || fail "a delink was recorded while the checkpoints were gone ($out)"
[ "$(field "$R" phase)" = pseudo ] || fail "phase after a refused delink: $(field "$R" phase)"
ctl stop "$R" >/dev/null || fail "stop of run $R while its checkpoints are gone"
wait_state "$R" stopped
[ "$(db "$D" "select step from runs where id=$R")" = 15 ] \
    || fail "stopped at step $(db "$D" "select step from runs where id=$R"), want the recorded 15"
[ "$(db "$D" "select count(*) from metrics where run=$R")" = 15 ] || fail "metrics rows after the stop"
[ ! -e "$D/runs/$R/checkpoints" ] || fail "the stop wrote a checkpoint: $(ls "$D/runs/$R/checkpoints")"
stop_daemon
log "gone in the pseudo phase: delink refused, stop kept step 15"
