#!/usr/bin/env bash
# ep_nodes.sh — expert parallelism run by m6d: nodes.expert_parallel 2 over
# two m6d nodes (a coordinator, rank 0, and a worker, rank 1) on loopback,
# Gloo over TCP, a Pseudo-to-Real MoE model (E = 4 experts in k = 2
# prototypes, every block MoE) on the fortunes shards. Each rank holds 2 of
# each MoE slot's 4 experts; every save of the runner gathers them to rank 0
# first, so every checkpoint is the one-rank model's.
#  (a) a pause at step 3 (its save gathers the experts), a resume (the
#      group forms again, rank 0's state broadcast and re-laid), the delink
#      at step 6 (gathered, delinked, regrouped), a kill -9 of the worker
#      at step 9: the run pauses within nodes.timeout naming the node; the
#      worker restarts, `m6ctl resume` goes on from the checkpoint of step
#      8 (written gathered), and the run completes (its end save gathered);
#  (b) nodes.pseudo_world_size 1: the pseudo phase on rank 0 alone, the
#      worker joins at the delink and the experts are split then;
#  (c) world 4 as 2 replicas of P = 2 (ranks 1-3 on one worker m6d with
#      --devices 3), offloading: each rank's two expert sub-groups made with
#      the group, each rank's slots placed by its own model's plan;
#  (d) a stop of such a run at step 5: its save gathers every expert;
#  (e) (run between (b) and (c)) `m6ctl resume RUN --world-size 1`: a
#      MoE run of (a)'s spec and a dense one, paused at step 5 of world 2,
#      go on alone from that checkpoint (a layout event, run.recover) with
#      the losses of world-2 runs of their specs ((a)'s; an uninterrupted
#      dense one); (f) a run interrupted by the coordinator's restart,
#      waiting for its worker, paused and resumed alone the same way;
#      (g, after (d)) (a)'s spec paused at world 2, resumed at world 4;
#  and the per-step train and validation losses and gradient norms of
#  every expert-parallel run equal the one-rank run's with the same global
#  batch
#  (batch_size 4, grad_accum 4: every rank whole microbatches of the
#  four, so routing and capacity see the one-rank run's microbatches)
#  within 1e-6 relative. Only the order of float additions differs (the
#  ranks' gradients summed by the all-reduce where one rank accumulates
#  its microbatches; an expert's gradient one GEMM over every sender's
#  rows; the norm's squares summed per rank), ~1e-7 relative here.
. "$(dirname "$0")/lib.sh"
TMO=2   # --node-timeout and nodes.timeout, seconds
WAIT=120  # the most any whole run may take here, seconds
ep_setup
ep_spec "$T/late.json" late "\"world_size\": 2, \"pseudo_world_size\": 1, \"expert_parallel\": 2, \"timeout\": $TMO"
ep_spec "$T/four.json" four "\"world_size\": 4, \"expert_parallel\": 2, \"timeout\": $TMO"
# (c) and (d) offload: device.memory_budget the whole model's minimum (all
# of its slots on the host); a rank's slots hold only its experts, and its
# own plan keeps one of its two real slots resident
MIN=$("$M6CTL" plan "$T/four.json" --json | jq .min_budget_bytes) || fail "plan --json"
jq --argjson b "$MIN" '.device.memory_budget = $b' "$T/four.json" >"$T/four.tmp" &&
    mv "$T/four.tmp" "$T/four.json" || fail "four.json with a budget"

# layout_is RUN W P TEXT: status --json's world_size and expert_parallel
# (list --json's the same), and the text's layout line ("" none: one rank)
layout_is() {
    local got
    got="$(ctl status "$1" --json | jqr '"\(.world_size) \(.expert_parallel)"') $(ctl list --json | jqr ".[] | select(.id == $1) | \"\(.world_size) \(.expert_parallel)\"")"
    [ "$got" = "$2 $3 $2 $3" ] || fail "run $1's layout in status and list: $got, want $2 $3 (twice)"
    got=$(ctl status "$1" | sed -n 's/^layout: *//p')
    [ "$got" = "$4" ] || fail "run $1's status layout line: '$got', want '$4'"
}

# ---- the one-rank reference (same global batch)
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "the one-rank run"

# ---- the coordinator (its boundary held by the test hook where the test
# acts mid-run) and the worker
start_coordinator c
worker() { start_m6d "$1" --join "$ADDR" --token-file "$T/token" --node-name "$1"; }
worker w1
wait_node w1 live 10 >/dev/null
# watch RUN WHAT: until RUN completes, at most WAIT s
watch_done() {
    timeout "$WAIT" "$M6CTL" --socket "$SOCK" watch "$1" >/dev/null \
        || fail "$2 did not complete within ${WAIT}s: $(ctl status "$1")"
}

# saved_at SPEC STEP CMD STATE: SPEC submitted and held at the boundary
# after STEP, CMD (pause, stop) sent there; waits for STATE and checks the
# checkpoint CMD's save wrote at STEP (trainer_save refuses a rank's part
# of the experts: without the gather there is none). The run's id in RUN.
saved_at() {
    hold_at_step "$2" nowait
    RUN=$(ctl submit "$1") || fail "$1 refused by m6d"
    WAIT_RUN=$RUN
    wait_held
    ctl "$3" "$RUN" >/dev/null || fail "$3 of run $RUN refused"
    release_boundary
    wait_state "$RUN" "$4" 30
    [ "$(db "$T/c" "select count(*) from checkpoints where run=$RUN and step=$2")" = 1 ] \
        || fail "no checkpoint of the $3 at step $2: $(db "$T/c" "select step from checkpoints where run=$RUN")"
}

# ---- (a) pause, resume, delink, kill -9, resume
saved_at "$T/ep.json" 3 pause paused
hold_at_step 9 nowait
ctl resume "$RUN" >/dev/null || fail "resume after the pause refused"
wait_held
kill -9 "${M6D_PIDS[w1]}"; wait "${M6D_PIDS[w1]}" 2>/dev/null || true
t0=$EPOCHREALTIME
release_boundary
wait_paused_within "$RUN" "$t0" $((TMO + 2)) "kill -9"
wait_event "$RUN" 'nodes.rank_lost +node=[0-9]+ hostname=w1 rank=1'
log "(a) paused ${TOOK}s after kill -9: $(field "$RUN" error)"
worker w1
wait_node w1 live 10 >/dev/null
ctl resume "$RUN" >/dev/null || fail "resume after kill -9 refused"
watch_done "$RUN" "the expert-parallel run"
grep -q "run.recover run=$RUN step=8" "$T/m6d-c.log" \
    || fail "did not resume from the checkpoint of step 8: $(grep run.recover "$T/m6d-c.log")"
ctl events "$RUN" >"$T/events.txt"
grep -q 'delink.*step=6' "$T/events.txt" || fail "no delink at step 6: $(cat "$T/events.txt")"
[ "$(grep -c 'nodes.group.*world_size=2' "$T/events.txt")" -ge 4 ] \
    || fail "want a group at the start, the resume, the delink and the resume: $(cat "$T/events.txt")"
[ "$(db "$T/c" "select max(step) from checkpoints where run=$RUN")" = 16 ] \
    || fail "no checkpoint of the run's end"
losses "$RUN" >"$T/ep.csv"
rel_close "$T/ep.csv" "$T/one.csv" 1e-6 || fail "the expert-parallel run's losses differ from the one-rank run's"

# ---- (b) the pseudo phase alone, the experts split at the delink
R2=$(ctl submit "$T/late.json") || fail "pseudo_world_size 1 with expert_parallel 2 refused"
watch_done "$R2" "the late-join expert-parallel run"
ctl events "$R2" | grep nodes.group >"$T/groups.txt" || true
[ "$(grep -c . "$T/groups.txt")" = 1 ] && has 'world_size=2 step=6' <"$T/groups.txt" \
    || fail "want one group, at the delink (step 6): $(cat "$T/groups.txt")"
losses "$R2" >"$T/late.csv"
rel_close "$T/late.csv" "$T/one.csv" 1e-6 || fail "the late-join run's losses differ from the one-rank run's"

# ---- (e) m6ctl resume RUN --world-size 1: a MoE run (expert_parallel 2)
# and a dense one paused at step 5 of world 2 continue alone from that
# checkpoint, with the uninterrupted world-2 runs' losses (the MoE one's:
# (a)'s) within 1e-6 relative
ep_spec "$T/dense.json" dense "\"world_size\": 2, \"timeout\": $TMO"
sed -i 's/, "moe": {[^}]*}//' "$T/dense.json"
! grep -q moe "$T/dense.json" || fail "the dense spec has MoE blocks: $(cat "$T/dense.json")"
RD=$(ctl submit "$T/dense.json")
watch_done "$RD" "the dense world-2 run"
losses "$RD" >"$T/dense.csv"
for s in ep dense; do
    saved_at "$T/$s.json" 5 pause paused
    # a layout the spec checks refuse: named, the run stays paused as it was
    out=$(ctl resume "$RUN" --world-size 1 --expert-parallel 2 2>&1) \
        && fail "resume at world size 1 with expert_parallel 2 accepted: $out"
    has 'could not resume, it stays paused: the layout nodes.world_size 1, nodes.expert_parallel 2: nodes.expert_parallel: 2' <<<"$out" \
        || fail "the refused layout is not named: $out"
    [ "$(field "$RUN" state)" = paused ] && ! ctl events "$RUN" | has layout \
        || fail "a refused layout changed run $RUN: $(field "$RUN" state) $(ctl events "$RUN" | grep layout)"
    out=$(ctl resume "$RUN" --world-size 1) || fail "resume of run $RUN at world size 1: $out"
    watch_done "$RUN" "the $s run resumed at world size 1"
    ctl events "$RUN" | has -E "layout +nodes.world_size 2 -> 1, nodes.expert_parallel ([12]) -> 1" \
        || fail "no layout event: $(ctl events "$RUN")"
    layout_is "$RUN" 1 1 ""
    grep -q "run.recover run=$RUN step=5" "$T/m6d-c.log" \
        || fail "run $RUN did not continue from its checkpoint of step 5: $(grep run.recover "$T/m6d-c.log")"
    losses "$RUN" >"$T/$s-at1.csv"
    rel_close "$T/$s-at1.csv" "$T/$s.csv" 1e-6 || fail "the $s run resumed at world size 1 differs from the world-2 run"
done
out=$(ctl resume "$RUN" --expert-parallel 2 2>&1) && fail "--expert-parallel without --world-size accepted: $out"

# ---- (f) an interrupted run: the coordinator stops (SIGTERM: a
# checkpoint) at step 4 of a world-2 run and starts again on another
# port, which the worker does not know: the run waits for 2 live nodes;
# paused there, it goes on alone at world size 1 from step 4
hold_at_step 4 nowait
RF=$(ctl submit "$T/ep.json")
wait_held
kill -TERM "${M6D_PIDS[c]}"; wait "${M6D_PIDS[c]}" || fail "coordinator exit after SIGTERM"
release_boundary
mv "$T/m6d-c.log" "$T/m6d-c1.log"  # wait_listen reads the new life's port
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_m6d c --role coordinator --listen 127.0.0.1:0 \
    --token-file "$T/token"
wait_listen c
ADDR=127.0.0.1:$PORT
wait_event "$RF" 'nodes.wait.*waiting for 2 live nodes, have 1' 10
ctl pause "$RF" >/dev/null || fail "pause of the waiting run refused"
wait_state "$RF" paused 30
out=$(ctl resume "$RF" --world-size 1) || fail "resume of the interrupted run at world size 1: $out"
watch_done "$RF" "the interrupted run resumed at world size 1"
[ "$(grep -c "run.recover run=$RF step=4" "$T/m6d-c.log")" = 2 ] \
    || fail "run $RF did not go on from step 4 at the restart and at the layout: $(grep run.recover "$T/m6d-c.log")"
losses "$RF" >"$T/f.csv"
rel_close "$T/f.csv" "$T/ep.csv" 1e-6 || fail "the interrupted run resumed at world size 1 differs from the world-2 run"

# ---- (c) world 4 as 2 replicas of P = 2: ranks 1-3 on a worker with 3
# devices; each rank's expert-parallel group and the group of the ranks
# holding its experts are made with the run's group
kill -TERM "${M6D_PIDS[w1]}"; wait "${M6D_PIDS[w1]}" || fail "w1 exit after SIGTERM"
unset 'M6D_PIDS[w1]'
start_m6d w3 --join "$ADDR" --token-file "$T/token" --node-name w3 --devices 3
wait_node w3 live 10 >/dev/null
R3=$(ctl submit "$T/four.json") || fail "world 4 with expert_parallel 2 refused"
watch_done "$R3" "the world-4 expert-parallel run"
# at the start and at the delink's regroup: rank r is rank r % 2 of its
# expert-parallel group and r / 2 of its experts' replicas
[ "$(grep -c "cluster.expert_groups run=$R3 rank=0 expert_parallel_rank=0 of=2 replica=0 of=2" "$T/m6d-c.log")" = 2 ] \
    || fail "rank 0 did not make its expert groups twice: $(grep cluster. "$T/m6d-c.log" | tail -3)"
for r in 1 2 3; do
    [ "$(grep -c "cluster.expert_groups run=$R3 rank=$r expert_parallel_rank=$((r % 2)) of=2 replica=$((r / 2)) of=2" "$T/m6d-w3.log")" = 2 ] \
        || fail "rank $r did not make its expert groups twice: $(grep cluster. "$T/m6d-w3.log" | tail -3)"
done
losses "$R3" >"$T/four.csv"
[ "$(db "$T/c" "select offloaded_slots from metrics where run=$R3 and step=16")" = 1 ] \
    || fail "rank 0 of the world-4 run: not 1 of its 2 slots offloaded: $(db "$T/c" "select step, offloaded_slots from metrics where run=$R3")"
rel_close "$T/four.csv" "$T/one.csv" 1e-6 || fail "the world-4 run's losses differ from the one-rank run's"

# ---- (d) a stop at step 5 of the world-4 run: its save gathers every
# rank's experts (trainer_save refuses a rank's part), and the worker's
# ranks leave
saved_at "$T/four.json" 5 stop stopped
wait_for "ranks 1-3 to leave the stopped run" 10 log_has "$T/m6d-w3.log" "cluster.rank_left run=$RUN " 3

# ---- (g) m6ctl resume RUN --world-size 4: (a)'s spec paused at step 5
# of world 2 (ranks 0 and 1: the coordinator and w3) goes on at world 4
# as 2 replicas of P = 2, the expert sub-groups made, with (a)'s losses
saved_at "$T/ep.json" 5 pause paused
out=$(ctl resume "$RUN" --world-size 4) || fail "resume of run $RUN at world size 4: $out"
watch_done "$RUN" "the run resumed at world size 4"
ctl events "$RUN" | has -E "layout +nodes.world_size 2 -> 4, nodes.expert_parallel 2 -> 2" \
    || fail "no layout event: $(ctl events "$RUN")"
layout_is "$RUN" 4 2 "4 ranks: 2 data-parallel replicas x 2 expert-parallel"
log_has "$T/m6d-c.log" "cluster.expert_groups run=$RUN rank=0 " >/dev/null \
    || fail "run $RUN made no expert groups at world size 4"
losses "$RUN" >"$T/g.csv"
rel_close "$T/g.csv" "$T/ep.csv" 1e-6 || fail "the run resumed at world size 4 differs from the world-2 run"
kill -TERM "${M6D_PIDS[w3]}" "${M6D_PIDS[c]}"
wait "${M6D_PIDS[c]}" || fail "coordinator exit"
unset 'M6D_PIDS[c]'
echo "ok"
