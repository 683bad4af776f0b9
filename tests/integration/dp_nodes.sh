#!/usr/bin/env bash
# dp_nodes.sh — one run across two m6d nodes (issue 14, the wiring): a
# coordinator (rank 0) and a worker (rank 1), each with its own state dir,
# on loopback, Gloo over TCP, the fortunes shards.
#  (c) a run with nodes.world_size 2 submitted before any worker joined
#      waits, saying why (event nodes.wait, the run's error in status);
#  (a) once the worker joins, the run trains as 2 ranks, through a delink,
#      and its train/val losses equal the single-node run's with the same
#      global batch (batch_size 4) to a relative 1e-4: the two ranks sum
#      two half-batch gradients where one node sums one batch, so the
#      additions differ in order (float rounding, ~1e-7 relative per step,
#      measured by the collectives' test over 10 steps), which AdamW
#      carries on; 1e-4 is far below what a wrong gradient changes (the
#      loss moves by ~1e-2 a step here);
#  (b) kill -9 of the worker mid-run: the run pauses within nodes.timeout
#      with an event naming the node, the coordinator keeps serving; the
#      worker restarts, `m6ctl resume` continues from the last checkpoint
#      and the run completes with the losses of the uninterrupted 2-rank
#      run, bit for bit (both are rank 0's checkpointed state, rebroadcast);
#  (d) nodes.pseudo_world_size 1: the worker joins at the delink;
#  (e) a worker whose hash differs is refused before any collective;
#  (f) 3 ranks with grad_accum 3 against one node;
#  (g) an operator delink delinks every rank at the same step;
#  (h) a NaN batch on the worker alone: both ranks skip the step, and the
#      coordinator's step.skipped event and log line name rank 1 and its
#      node;
#  (i) the worker's own gradient scaled 1000x for 105 steps (the fault hook
#      grad_scale): a grad.outlier event and log line name rank 1 and its
#      node, never rank 0, at most once per 100 steps (steps 3 and 103).
. "$(dirname "$0")/lib.sh"
TMO=2   # --node-timeout and nodes.timeout, seconds

M6D_ARGS="--node-timeout $TMO"  # every m6d start_m6d (lib.sh) starts

# close_enough A.csv B.csv: same steps, train/val losses within rel 1e-4
close_enough() {
    python3 - "$1" "$2" <<'PY'
import csv, math, sys
a = list(csv.reader(open(sys.argv[1])))
b = list(csv.reader(open(sys.argv[2])))
assert a[0] == b[0], (a[0], b[0])
h = a[0]
assert len(a) == len(b) and len(a) > 20, ("rows", len(a), len(b))
cols = [h.index(c) for c in ("train_loss", "val_loss")]
worst = 0.0
for ra, rb in zip(a[1:], b[1:]):
    assert ra[0] == rb[0], ("step", ra[0], rb[0])
    assert ra[1] == rb[1], ("phase", ra, rb)
    for c in cols:
        if ra[c] in ("", "nan") and rb[c] in ("", "nan"):
            continue
        x, y = float(ra[c]), float(rb[c])
        d = abs(x - y) / max(abs(y), 1e-12)
        worst = max(worst, d)
        assert d <= 1e-4, ("step", ra[0], h[c], x, y, d)
print(f"# worst relative difference {worst:.3g} over {len(a) - 1} steps")
PY
}

prepare_data "$T/data"
write_token "$T/token"
CKPT_EVERY=5 write_spec "$T/one.json" one 30 10
CKPT_EVERY=5 write_spec "$T/two.json" two 30 10 \
    "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"

# ---- the single-node reference (same global batch)
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "single-node run"
head -3 "$T/one.csv" >&2

# ---- (c) the coordinator alone: the 2-rank run waits, saying why
# rank 0's steps 60 ms longer, and its boundary held (lib.sh
# hold_boundary) while the test kills the worker mid-run, so the run is
# alive for that whatever the speed of a step
export M6_TEST_STEP_DELAY_MS=60
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_m6d c --role coordinator --listen 127.0.0.1:0 \
    --token-file "$T/token"
SOCK=$T/c/m6d.sock
wait_listen c
ADDR=127.0.0.1:$PORT
RUN=$(ctl submit "$T/two.json")
wait_event "$RUN" 'nodes.wait.*waiting for 2 live nodes, have 1'
ctl status "$RUN" | has 'waiting for 2 live nodes, have 1' \
    || fail "status does not say why the run waits: $(ctl status "$RUN")"
[ "$(db "$T/c" "select step from runs where id=$RUN")" = 0 ] || fail "the run trained alone"
nap 1
[ "$(db "$T/c" "select step from runs where id=$RUN")" = 0 ] || fail "the run trained alone"
log "(c) waits: $(ctl events "$RUN" | grep nodes.wait | head -1)"

# worker NAME: starts worker NAME joined to the coordinator (a fault hook
# or a hash salt in the environment of the call applies to it alone)
worker() { start_m6d "$1" --join "$ADDR" --token-file "$T/token" --node-name "$1"; }
# stop_worker NAME: SIGTERM, and it exits 0
stop_worker() {
    kill -TERM "${M6D_PIDS[$1]}"; wait "${M6D_PIDS[$1]}" || fail "$1 exit after SIGTERM"
    unset "M6D_PIDS[$1]"
}

# run_two TAG STEPS PSEUDO WHAT: write_spec's run TAG at world size 2
# ($T/TAG.json, a checkpoint every 10 steps) submitted and watched to its
# end (else fails naming WHAT); its id in R2
run_two() {
    CKPT_EVERY=10 write_spec "$T/$1.json" "$1" "$2" "$3" \
        "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
    R2=$(ctl submit "$T/$1.json")
    ctl watch "$R2" >/dev/null || fail "$4 did not complete: $(ctl status "$R2")"
}

# ---- (a) a worker joins: the run trains as 2 ranks
worker w1
ctl watch "$RUN" >/dev/null || fail "the 2-rank run did not complete: $(ctl status "$RUN")"
ctl events "$RUN" >"$T/events1.txt"
grep -Eq 'nodes.assign +node=[0-9]+ hostname=w1 rank=1 world_size=2' "$T/events1.txt" \
    || fail "no assignment of w1: $(cat "$T/events1.txt")"
grep -q 'nodes.group.*world_size=2' "$T/events1.txt" || fail "no group: $(cat "$T/events1.txt")"
grep -q 'delink' "$T/events1.txt" || fail "no delink: $(cat "$T/events1.txt")"
grep -q 'cluster.rank_done run='"$RUN"' rank=1 step=30' "$T/m6d-w1.log" \
    || fail "rank 1 did not train to step 30: $(grep cluster. "$T/m6d-w1.log" | tail -5)"
losses "$RUN" >"$T/two.csv"
close_enough "$T/two.csv" "$T/one.csv" || fail "2-rank losses differ from the single node's"
[ -z "$(ls "$T/w1/runs" 2>/dev/null)" ] || fail "the worker wrote run state: $(ls "$T/w1/runs")"
# a worker takes no run of its own (it would share the node with the
# coordinator's ranks, unplanned): a submit to it is refused, naming why
out=$("$M6CTL" --socket "$T/w1/m6d.sock" submit "$T/one.json" 2>&1) \
    && fail "the worker took a run of its own: $out"
has "is a worker of the coordinator at $ADDR (--join)" <<<"$out" \
    || fail "the worker's refusal does not say why: $out"
[ -z "$(db "$T/w1" "select id from runs")" ] || fail "the worker recorded a run"

# ---- (b) kill -9 of the worker mid-run, restart, resume
hold_at_step 12 nowait  # mid-run for the kill, whatever the speed of a step
RUN2=$(ctl submit "$T/two.json")
wait_held
[ "$(db "$T/c" "select run || ' ' || rank from nodes where hostname='w1'")" = "$RUN2 1" ] \
    || fail "the nodes table does not hold w1's run and rank: $(db "$T/c" "select * from nodes")"
kill -9 "${M6D_PIDS[w1]}"; wait "${M6D_PIDS[w1]}" 2>/dev/null || true
t0=$EPOCHREALTIME
release_boundary
wait_paused_within "$RUN2" "$t0" $((TMO + 1)) "kill -9"
# the loss and the failed collective race
wait_event "$RUN2" 'nodes.rank_lost +node=[0-9]+ hostname=w1 rank=1'
ctl list >/dev/null || fail "the coordinator stopped serving"
log "(b) paused ${TOOK}s after kill -9: $(field "$RUN2" error)"
worker w1
wait_node w1 live 10 >/dev/null  # else the resumed run would wait for it
ctl resume "$RUN2" >/dev/null || fail "resume refused"
ctl watch "$RUN2" >/dev/null || fail "the resumed run did not complete: $(ctl status "$RUN2")"
losses "$RUN2" >"$T/two2.csv"
cmp -s "$T/two.csv" "$T/two2.csv" || fail "the resumed run's losses differ from the uninterrupted 2-rank run: $(diff "$T/two.csv" "$T/two2.csv" | head -6)"
log "(b) resumed and completed with the uninterrupted run's losses"
# ---- (d) nodes.pseudo_world_size 1: the pseudo phase on rank 0 alone, the
# worker joins at the delink (rank 0's delinked weights and moments by
# broadcast) and the run goes on as 2 ranks: the single node's losses to
# the same tolerance as (a)
CKPT_EVERY=5 write_spec "$T/late.json" late 30 10 \
    "\"nodes\": {\"world_size\": 2, \"pseudo_world_size\": 1, \"timeout\": $TMO}"
RUN3=$(ctl submit "$T/late.json") || fail "pseudo_world_size 1 refused"
ctl watch "$RUN3" >/dev/null || fail "the late-join run did not complete: $(ctl status "$RUN3")"
ctl events "$RUN3" >"$T/events3.txt"
first=$(grep -E 'nodes.group' "$T/events3.txt" | head -1)
echo "$first" | has 'world_size=2 step=10' || fail "the worker did not join at the delink (step 10): $(cat "$T/events3.txt")"
[ "$(grep -c 'nodes.group' "$T/events3.txt")" = 1 ] || fail "more than one group: $(cat "$T/events3.txt")"
losses "$RUN3" >"$T/late.csv"
close_enough "$T/late.csv" "$T/one.csv" || fail "late-join losses differ from the single node's"
log "(d) the worker joined at the delink: $first"
# ---- (e) a worker whose hash differs (M6_TEST_DP_HASH_SALT: as another
# build or spec would) is refused before any collective, both hashes named
stop_worker w1
M6_TEST_DP_HASH_SALT=other worker w2
RUN4=$(ctl submit "$T/two.json")
wait_event "$RUN4" "nodes.refused +refused: rank 1's hash [0-9a-f]{64} differs from the coordinator's [0-9a-f]{64}" 10
grep -q 'cluster.rank_failed run='"$RUN4"' rank=1 err="refused by the coordinator' "$T/m6d-w2.log" \
    || fail "the worker did not log its refusal: $(grep cluster. "$T/m6d-w2.log" | tail -3)"
grep -q 'cluster.rank run='"$RUN4" "$T/m6d-w2.log" && fail "the refused worker joined the group"
[ "$(db "$T/c" "select step from runs where id=$RUN4")" = 0 ] || fail "run $RUN4 trained with a refused rank"
ctl stop "$RUN4" >/dev/null || fail "stop of the refused run"
wait_state "$RUN4" stopped 20
ctl list >/dev/null || fail "the coordinator stopped serving"
log "(e) refused: $(ctl events "$RUN4" | grep nodes.refused | head -1 | cut -c1-120)..."
# ---- (f) 3 ranks with gradient accumulation 3 (one microbatch of 4 per
# rank) against the same spec at world size 1 on the coordinator (3
# microbatches of 4), same tolerance as (a)
stop_worker w2
worker w1
worker w3
CKPT_EVERY=10 write_spec "$T/acc1.json" acc1 24 8
CKPT_EVERY=10 write_spec "$T/acc3.json" acc3 24 8 \
    "\"nodes\": {\"world_size\": 3, \"timeout\": $TMO}"
sed -i 's/"batch_size": 4,/"batch_size": 4, "grad_accum": 3,/' "$T/acc1.json" "$T/acc3.json"
R1=$(ctl submit "$T/acc1.json")
ctl watch "$R1" >/dev/null || fail "the 1-rank accumulation run did not complete"
R3=$(ctl submit "$T/acc3.json")
ctl watch "$R3" >/dev/null || fail "the 3-rank run did not complete: $(ctl status "$R3")"
ctl events "$R3" | has -E 'nodes.assign +node=[0-9]+ hostname=w3 rank=2 world_size=3' \
    || fail "w3 not rank 2: $(ctl events "$R3")"
losses "$R1" >"$T/acc1.csv"
losses "$R3" >"$T/acc3.csv"
close_enough "$T/acc3.csv" "$T/acc1.csv" || fail "3-rank losses differ from one node's"
log "(f) 3 ranks, grad_accum 3: the single node's losses"
# ---- (g) an operator delink on the coordinator is a barrier: every rank
# delinks at the same step (rank 0 regroups, the workers take its delinked
# state), so the run equals one whose spec delinks at that step
stop_worker w3
CKPT_EVERY=10 write_spec "$T/op.json" op 24 23 \
    "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
hold_at_step 6 nowait  # the delink lands mid-run, whatever the speed of a step
RUN5=$(ctl submit "$T/op.json")
wait_held
ctl delink "$RUN5" >/dev/null || fail "delink refused"
release_boundary
ctl watch "$RUN5" >/dev/null || fail "the delinked run did not complete: $(ctl status "$RUN5")"
K=$(field "$RUN5" delink_step)
[ -n "$K" ] && [ "$K" -gt 0 ] && [ "$K" -lt 23 ] || fail "delink step '$K'"
ctl events "$RUN5" | has -E "nodes.group +world_size=2 step=$K" \
    || fail "no regroup at the delink step $K: $(ctl events "$RUN5")"
grep -q "cluster.rank run=$RUN5 rank=1 world_size=2 step=$K" "$T/m6d-w1.log" \
    || fail "rank 1 did not continue from step $K: $(grep cluster.rank "$T/m6d-w1.log" | tail -3)"
CKPT_EVERY=10 write_spec "$T/opref.json" opref 24 "$K"
R6=$(ctl submit "$T/opref.json")
ctl watch "$R6" >/dev/null || fail "the reference of the operator delink did not complete"
losses "$RUN5" >"$T/op.csv"
losses "$R6" >"$T/opref.csv"
close_enough "$T/op.csv" "$T/opref.csv" || fail "operator-delinked 2-rank run differs from one node delinking at step $K"
log "(g) operator delink at step $K on both ranks: the single node's losses"
# ---- (h) a bad batch on the worker alone (its own gradient NaN before the
# sum, the fault hook M6_TEST_FAULT): every rank skips that step, and the
# coordinator's event names rank 1, the worker, as where it came from
stop_worker w1
M6_TEST_FAULT=nan_batch@3 worker w4
run_two bad 6 3 "the run with a bad batch on rank 1"
R7=$R2
ctl events "$R7" | has -E 'step.skipped +step=3 .* nonfinite_rank=1 nonfinite_ranks=1 ranks=1 node=[0-9]+ hostname=w4' \
    || fail "no step.skipped event naming rank 1 on w4: $(ctl events "$R7")"
grep -qE "run.step_skipped run=$R7 step=3 .* nonfinite_rank=1 nonfinite_ranks=1 ranks=1 node=[0-9]+ hostname=w4" "$T/m6d-c.log" \
    || fail "no run.step_skipped log line naming rank 1 on w4: $(grep run.step_skipped "$T/m6d-c.log")"
[ "$(ctl events "$R7" | grep -c 'step.skipped')" = 1 ] \
    || fail "not one skipped step: $(ctl events "$R7")"
log "(h) a NaN batch on rank 1: step 3 skipped on both ranks, the event names rank 1"
# ---- (i) rank 1's own gradient 1000x from step 3 to 107: reported by
# rank and node at steps 3 and 103, the 99 between counted; the steps are
# not skipped (the report changes nothing)
stop_worker w4
M6_TEST_FAULT=grad_scale@3x105 worker w5
run_two loud 110 110 "the run with a loud rank 1"
R8=$R2
ctl events "$R8" | grep grad.outlier >"$T/outlier.ev" || true
[ "$(grep -c . "$T/outlier.ev")" = 2 ] \
    || fail "want 2 grad.outlier events (steps 3 and 103), got: $(cat "$T/outlier.ev")"
has -E 'grad.outlier +step=3 rank=1 node=[0-9]+ hostname=w5: its gradient norm is [0-9.]+ times' <"$T/outlier.ev" \
    || fail "no grad.outlier event at step 3 naming rank 1 on w5: $(cat "$T/outlier.ev")"
has -E 'grad.outlier +step=103 rank=1 node=[0-9]+ hostname=w5: .*\(99 more such steps' <"$T/outlier.ev" \
    || fail "no grad.outlier event at step 103 counting the 99 between: $(cat "$T/outlier.ev")"
! grep -q 'rank=0' "$T/outlier.ev" || fail "rank 0 named as an outlier: $(cat "$T/outlier.ev")"
[ "$(grep -cE "run.grad_outlier run=$R8 step=(3|103) rank=1 node=[0-9]+ hostname=w5 ratio=" "$T/m6d-c.log")" = 2 ] \
    || fail "want 2 run.grad_outlier log lines naming rank 1 on w5: $(grep run.grad_outlier "$T/m6d-c.log")"
! ctl events "$R8" | has step.skipped || fail "a step of the loud run was skipped: $(ctl events "$R8")"
log "(i) rank 1's gradient 1000x: $(head -1 "$T/outlier.ev" | cut -c1-140)"
kill -TERM "${M6D_PIDS[w5]}" "${M6D_PIDS[c]}"
wait "${M6D_PIDS[c]}" || fail "coordinator exit"
unset 'M6D_PIDS[c]'
echo "ok"
