#!/usr/bin/env bash
# badsteps.sh — non-finite steps through m6d (issue 16 item 5). m6d runs
# with the test fault M6_TEST_FAULT=nan_batch@4x4 (daemon/train/
# test_hooks.h): steps 4 to 7 of every run have a NaN loss and NaN
# gradients. A run with the default train.max_bad_steps (5) skips their
# updates and completes, every step recorded (4 skipped rows, 4
# step.skipped events); a run with max_bad_steps 3 pauses itself after
# step 6 with a paused.error event that says why, and `m6ctl resume` gives
# it 3 more: step 7 is skipped again, then it trains to the end. A run
# whose lr blows up pauses itself after 5 skipped steps.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
write_spec "$T/a.json" a 20 0
write_spec "$T/b.json" b 20 0
sed -i 's/"seed": 7}/"seed": 7, "max_bad_steps": 3}/' "$T/b.json"
grep -q '"max_bad_steps": 3' "$T/b.json" || fail "spec b not written"

export M6_TEST_FAULT=nan_batch@4x4
start_daemon "$T/s"
unset M6_TEST_FAULT

A=$(ctl submit "$T/a.json")
ctl watch "$A" >/dev/null || fail "run a did not complete"
[ "$(db "$T/s" "select count(*) from metrics where run=$A")" = 20 ] \
    || fail "run a: $(db "$T/s" "select count(*) from metrics where run=$A") metrics rows, want 20"
[ "$(db "$T/s" "select group_concat(step) from metrics where run=$A and skipped=1")" = "4,5,6,7" ] \
    || fail "run a: skipped rows $(db "$T/s" "select group_concat(step) from metrics where run=$A and skipped=1"), want 4,5,6,7"
[ "$(db "$T/s" "select train_loss is null from metrics where run=$A and step=4")" = 1 ] \
    || fail "run a: step 4's loss is not NaN (NULL)"
[ "$(db "$T/s" "select skipped_total from metrics where run=$A and step=20")" = 4 ] \
    || fail "run a: skipped_total at step 20 is not 4"
[ "$(db "$T/s" "select count(*) from events where run=$A and kind='step.skipped'")" = 4 ] \
    || fail "run a: not 4 step.skipped events"
db "$T/s" "select detail from events where run=$A and kind='step.skipped'" | head -1 \
    | has "step=4 loss=nan grad_norm=nan bad_steps=1" \
    || fail "run a: step.skipped event: $(db "$T/s" "select detail from events where run=$A and kind='step.skipped'" | head -1)"
[ "$(field "$A" skipped_steps)" = 4 ] || fail "run a: status skipped_steps $(field "$A" skipped_steps), want 4"
log "run a: steps 4-7 skipped, completed"

B=$(ctl submit "$T/b.json")
e=$(wait_paused_error "$B" "3 non-finite steps in a row \(train.max_bad_steps 3\), the last step 6")
[ "$(field "$B" step)" = 6 ] || fail "run b paused at step $(field "$B" step), want 6"
db "$T/s" "select detail from events where run=$B and kind='paused.error'" | has "non-finite steps in a row" \
    || fail "run b: no paused.error event saying why"
nap 0.3
[ "$(field "$B" step)" = 6 ] || fail "run b trained on after its pause"
# the pause took a checkpoint of step 6 (the weights before step 4): a
# crash before the resume trains no step again
[ "$(db "$T/s" "select max(step) from checkpoints where run=$B")" = 6 ] \
    || fail "run b: no checkpoint at its pause (step 6): $(db "$T/s" "select group_concat(step) from checkpoints where run=$B")"
log "run b: paused after 3 bad steps: $e"
ctl resume "$B" >/dev/null || fail "resume of run b"
ctl watch "$B" >/dev/null || fail "run b did not complete after the resume"
[ "$(db "$T/s" "select group_concat(step) from metrics where run=$B and skipped=1")" = "4,5,6,7" ] \
    || fail "run b: skipped rows $(db "$T/s" "select group_concat(step) from metrics where run=$B and skipped=1")"
[ "$(db "$T/s" "select count(*) from metrics where run=$B")" = 20 ] || fail "run b: not 20 rows"
# the same faults, the same run: a's and b's losses agree bitwise
losses "$A" >"$T/a.csv"
losses "$B" >"$T/b.csv"
cmp -s "$T/a.csv" "$T/b.csv" || fail "runs a and b differ: $(diff "$T/a.csv" "$T/b.csv" | head -5)"
stop_daemon

# An lr that blows up (1e30, no warmup, no clipping), without any fault:
# the first update sends the weights to ~1e30, every step after it is
# non-finite, and the run pauses itself after max_bad_steps (5) of them,
# its rows and events recorded.
write_spec "$T/c.json" c 40 0
sed -i 's/"seed": 7}/"seed": 7, "lr": 1e30, "min_lr": 0, "warmup_steps": 0, "grad_clip": 0}/' "$T/c.json"
grep -q '"lr": 1e30' "$T/c.json" || fail "spec c not written"
start_daemon "$T/s"
C=$(ctl submit "$T/c.json")
wait_paused_error "$C" "5 non-finite steps in a row \(train.max_bad_steps 5\)" >/dev/null
K=$(field "$C" step)
[ "$(db "$T/s" "select count(*) from metrics where run=$C and skipped=1")" = 5 ] \
    || fail "run c: $(db "$T/s" "select count(*) from metrics where run=$C and skipped=1") skipped rows, want 5"
[ "$(db "$T/s" "select min(step) from metrics where run=$C and skipped=1")" = $((K - 4)) ] \
    || fail "run c: the skipped steps are not the last 5 before step $K"
[ "$(db "$T/s" "select count(*) from events where run=$C and kind='step.skipped'")" = 5 ] \
    || fail "run c: not 5 step.skipped events"
log "run c (lr 1e30): paused at step $K after 5 skipped steps"
stop_daemon
echo "PASS"
