#!/usr/bin/env bash
# zerod.sh — optimizer.shard (ZeRO stage 1) across m6d nodes: a
# coordinator (rank 0, which alone saves) and a worker (rank 1) on
# loopback, world_size 2, each rank keeping half the optimizer state.
# Every save and the delink happen at a step boundary where rank 0 asks
# every rank to gather the state first (trainer_sync_boundary), so what
# rank 0 writes is the whole, unsharded state. The reference is the same
# spec unsharded, on the same two nodes.
#  (a) the sharded run through a checkpoint.every save (step 5, pseudo
#      phase), the spec's delink (step 6) and a pause at step 8 (not a
#      multiple of checkpoint.every): the pause's checkpoint exists and its
#      model and optimizer files are byte for byte the unsharded run's
#      checkpoint of step 8 (paused there too): the whole state, not rank
#      0's half;
#  (b) resumed, held at the boundary after step 9, the worker killed (kill
#      -9) and a pause sent: rank 0 cannot gather, so it writes nothing
#      (no step-9 checkpoint: rank 0 holds only its own shard),
#      the run pauses and its event says why and from which checkpoint it
#      resumes;
#  (c) the worker restarts, the run resumes from the step-8 checkpoint;
#      held at the boundary after step 13, the coordinator gets SIGTERM:
#      it saves step 13 (gathered) and exits; restarted on the same port,
#      it resumes the run from that checkpoint with the worker, and the run
#      completes. Every step's train and validation loss (steps 1-8 of the
#      first life, 9-13 rebuilt from step 8, 14-20 from step 13) equals
#      the unsharded run's bit for bit: sharding changes no float
#      operation (the gradient is the same all-reduce, AdamW is
#      elementwise; test_zero shows the same at the trainer level), and a
#      checkpoint missing rank 1's half of the state changes the losses
#      after it.
#  (d) the train shard truncated under a second sharded run: every rank
#      fails that step alike, the worker stays for the gather, and rank 0
#      pauses with a checkpoint of the step (a pause saved, as on one
#      node); the shard restored, resume completes with the same losses.
#  (e) sharded with offloading (device.memory_budget at the plan's
#      minimum: the real phase's two slots offloaded, the optimizer state
#      each rank's half on its host, apart from the slots): paused at step
#      8, its checkpoint byte for byte the unsharded run's; resumed, it
#      completes with the unsharded run's losses bit for bit (offloading
#      changes no float operation on the cpu backend either).
# A resume at another world size is the trainer's (test_zero: a sharded
# checkpoint of 2 ranks resumed on 4, and unsharded): m6d keeps a run's
# spec, and so its world size, across a resume.
. "$(dirname "$0")/lib.sh"
TMO=2   # --node-timeout and nodes.timeout, seconds

M6D_ARGS="--node-timeout $TMO"

prepare_data "$T/data"
write_token "$T/token"
NODES="\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
CKPT_EVERY=5 write_spec "$T/ref.json" ref 20 6 "$NODES"
CKPT_EVERY=5 write_spec "$T/z.json" z 20 6 "$NODES, \"optimizer\": {\"shard\": true}"
# (e): the budget m6ctl plan gives as the least (every slot offloaded)
CKPT_EVERY=5 write_spec "$T/zo.json" zo 20 6 "$NODES, \"optimizer\": {\"shard\": true},
  \"offload\": {\"prefetch\": 1}, \"device\": {\"memory_budget\": 1048576}"
MIN=$({ "$M6CTL" plan "$T/zo.json" 2>&1 || true; } | sed -n 's/.*even with all 2 slots offloaded it needs [^(]*(\([0-9]*\) bytes).*/\1/p')
[ -n "$MIN" ] || fail "m6ctl plan gave no least budget for zo.json: $("$M6CTL" plan "$T/zo.json" 2>&1)"
sed -i "s/\"memory_budget\": 1048576/\"memory_budget\": $MIN/" "$T/zo.json"
"$M6CTL" plan "$T/zo.json" | grep -Eq '^real +2 +- +0-1 ' \
    || fail "the plan of zo.json does not offload the real phase's slots: $("$M6CTL" plan "$T/zo.json")"

# a fixed port, outside the ephemeral range, free now: the coordinator
# restarts on it in (c), and the worker finds it there again
PORT=$(free_port)
ADDR=127.0.0.1:$PORT
# rank 0's steps 40 ms longer, so the hold at a step's boundary is set
# before the run gets there whatever the machine's speed
export M6_TEST_STEP_DELAY_MS=40
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE
SOCK=$T/c/m6d.sock
start_coord() {
    start_m6d c --role coordinator --listen "$ADDR" --token-file "$T/token"
    wait_listen c
}
start_coord
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
wait_live() {
    for _ in $(seq 1 200); do
        [ "$(db "$T/c" "select state from nodes where hostname='w1'")" = live ] && return 0
        nap 0.05
    done
    fail "the worker w1 did not join"
}
wait_live
ckpts() { ls "$T/c/runs/$1/checkpoints"; }

# ---- the unsharded reference, paused at step 8 for its checkpoint
submit_paused_at "$T/ref.json" 8
REF=$RUN
# kept aside: checkpoint.keep 3 drops it before the run ends
cp -r "$T/c/runs/$REF/checkpoints/step-8" "$T/ref-step-8" \
    || fail "no step-8 checkpoint of the reference: $(ckpts "$REF")"
ctl resume "$REF" >/dev/null || fail "resume of the reference"
ctl watch "$REF" >/dev/null || fail "the unsharded run did not complete: $(ctl status "$REF")"
losses "$REF" >"$T/ref.csv"

# ---- (a) sharded: saved at 5, delinked at 6, paused at 8
submit_paused_at "$T/z.json" 8   # fails naming a refused submit
Z=$RUN
ctl events "$Z" >"$T/events1.txt"
grep -q 'nodes.group.*world_size=2 step=0' "$T/events1.txt" || fail "no 2-rank group: $(cat "$T/events1.txt")"
grep -Eq 'delink +step=6 ' "$T/events1.txt" || fail "no delink at step 6: $(cat "$T/events1.txt")"
grep -q 'nodes.group.*world_size=2 step=6' "$T/events1.txt" || fail "no regroup at the delink: $(cat "$T/events1.txt")"
[ "$(ckpts "$Z" | tr '\n' ' ')" = "step-5 step-8 " ] \
    || fail "want the checkpoints of steps 5 and 8: $(ckpts "$Z")"
for f in model.safetensors optimizer.safetensors; do
    cmp -s "$T/ref-step-8/$f" "$T/c/runs/$Z/checkpoints/step-8/$f" \
        || fail "the sharded run's step-8 $f differs from the unsharded run's (the state saved is not the whole state)"
done
log "(a) sharded run paused at step 8: its checkpoint is the unsharded run's, byte for byte"

# ---- (b) the worker lost at a boundary where rank 0 would save
hold_at_step 9 nowait
ctl resume "$Z" >/dev/null || fail "resume of the sharded run"
wait_held
kill -9 "${M6D_PIDS[w1]}"; wait "${M6D_PIDS[w1]}" 2>/dev/null || true
unset 'M6D_PIDS[w1]'
ctl pause "$Z" >/dev/null || fail "pause after the kill refused"
release_boundary
wait_event "$Z" 'paused.error +step=9 .*a rank of the run.s 2-rank group failed.*nothing is saved after the last whole checkpoint \(step 8\), resume starts from it' 20
[ "$(ckpts "$Z" | tr '\n' ' ')" = "step-5 step-8 " ] \
    || fail "a checkpoint was written after the worker was lost: $(ckpts "$Z")"
grep -q "run.group_lost run=$Z step=9" "$T/m6d-c.log" || fail "no run.group_lost log line"
wait_state "$Z" paused
log "(b) worker lost: $(ctl events "$Z" | grep paused.error | tail -1 | cut -c1-150)..."

# ---- (c) the worker back; resumed from step 8; SIGTERM at step 13
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
wait_live
hold_at_step 13 nowait
ctl resume "$Z" >/dev/null || fail "resume after the worker came back"
wait_held
ctl events "$Z" | has 'nodes.group.*world_size=2 step=8' \
    || fail "the run did not regroup at step 8 (its checkpoint): $(ctl events "$Z")"
joined=$(grep -Ec 'cluster\.(re)?joined' "$T/m6d-w1.log")
kill -TERM "${M6D_PIDS[c]}"
wait "${M6D_PIDS[c]}" || fail "coordinator exit after SIGTERM"
unset 'M6D_PIDS[c]'
release_boundary
[ -d "$T/c/runs/$Z/checkpoints/step-13" ] || fail "no shutdown checkpoint of step 13: $(ckpts "$Z")"
db "$T/c" "select detail from events where run=$Z and kind='interrupted'" | has 'step=13 resumes at next start' \
    || fail "no interrupted event at step 13: $(db "$T/c" "select kind, detail from events where run=$Z")"
start_coord
wait_for "the worker to join the restarted coordinator" 20 \
    log_has "$T/m6d-w1.log" 'cluster\.(re)?joined' $((joined + 1))
ctl watch "$Z" >/dev/null || fail "the sharded run did not complete: $(ctl status "$Z")"
ctl events "$Z" | has 'nodes.group.*world_size=2 step=13' \
    || fail "the run did not regroup at step 13 (its checkpoint): $(ctl events "$Z")"
same_losses "$Z" "$T/ref.csv" "the sharded run's losses differ from the unsharded run's"
[ "$(wc -l <"$T/ref.csv")" = 21 ] || fail "want 20 steps: $(cat "$T/ref.csv")"
grep -q "cluster.rank_done run=$Z rank=1 step=20" "$T/m6d-w1.log" \
    || fail "rank 1 did not train to step 20: $(grep cluster. "$T/m6d-w1.log" | tail -5)"
log "(c) resumed from step 8, saved at SIGTERM (step 13), resumed and completed: every loss the unsharded run's"
# ---- (d) bad data under the sharded run
TRAIN=$T/data/train_000000.bin
cp "$TRAIN" "$T/train.orig"
hold_at_step 11 nowait
D=$(ctl submit "$T/z.json")
wait_held
truncate -s $((1024 + 2 * 1000)) "$TRAIN"
release_boundary
wait_state "$D" paused
db "$T/c" "select detail from events where run=$D and kind='paused.error'" | has 'step=11 .*truncated while in use' \
    || fail "no paused.error event for the truncated shard at step 11: $(ctl events "$D")"
[ -d "$T/c/runs/$D/checkpoints/step-11" ] || fail "no checkpoint at the data error's pause (step 11): $(ckpts "$D")"
grep -q "cluster.rank_data run=$D rank=1 step=11" "$T/m6d-w1.log" \
    || fail "rank 1 did not stay for the gather: $(grep "run=$D" "$T/m6d-w1.log" | tail -3)"
cat "$T/train.orig" >"$TRAIN"
ctl resume "$D" >/dev/null || fail "resume after the shard was restored"
ctl watch "$D" >/dev/null || fail "run $D did not complete: $(ctl status "$D")"
same_losses "$D" "$T/ref.csv" "the sharded run's losses differ from the unsharded run's after bad data"
log "(d) bad data at step 12: paused with a checkpoint of step 11, restored, the unsharded run's losses"
# ---- (e) sharded with offloading: the state on each rank's host
submit_paused_at "$T/zo.json" 8
ZO=$RUN
for f in model.safetensors optimizer.safetensors; do
    cmp -s "$T/ref-step-8/$f" "$T/c/runs/$ZO/checkpoints/step-8/$f" \
        || fail "the sharded offloaded run's step-8 $f differs from the unsharded run's"
done
ctl resume "$ZO" >/dev/null || fail "resume of the sharded offloaded run"
ctl watch "$ZO" >/dev/null || fail "the sharded offloaded run did not complete: $(ctl status "$ZO")"
[ "$(db "$T/c" "select offloaded_slots from metrics where run=$ZO and step=20")" = 2 ] \
    || fail "the sharded offloaded run did not offload its 2 slots: $(db "$T/c" "select step, offloaded_slots from metrics where run=$ZO")"
same_losses "$ZO" "$T/ref.csv" "the sharded offloaded run's losses differ from the unsharded run's"
log "(e) sharded with offloading: checkpoint at step 8 and every loss the unsharded run's"
kill -TERM "${M6D_PIDS[w1]}" "${M6D_PIDS[c]}"
wait "${M6D_PIDS[c]}" || fail "coordinator exit"
unset 'M6D_PIDS[c]'
echo "ok"
