#!/usr/bin/env bash
# devices.sh — one m6d runs several data-parallel ranks (m6d --devices N
# on the cpu backend): the coordinator places a run's ranks node by node,
# local ranks contiguous (cluster_ranks_place), its own ranks past 0 and a
# worker's ranks on rank threads, each with its share of the cores.
#  (a) a coordinator with --devices 2 alone runs a nodes.world_size 2 run
#      (ranks 0-1 on it): the per-step losses of one rank with the same
#      global batch, to dp_nodes.sh's tolerance (two half-batch gradients
#      summed in another order than one batch: float rounding carried by
#      AdamW, far below what a wrong gradient or a repeated data slice
#      moves, ~1e-2 a step), and bit for bit those of a coordinator and a
#      worker of one device each (the first sums in the node-local group,
#      the second over Gloo: with two terms a+b is b+a, so the bits
#      agree), in fp32 and in bf16 (the GEMMs' precision is one setting
#      of the process, which its two ranks' passes share); its --threads
#      2 split one per rank;
#  (b) a world 4 run waits, saying it has 2 devices of 4; a worker with
#      --devices 2 joins: the run (0-1 on the coordinator, 2-3 on the
#      worker; `m6ctl nodes` shows them) trains to the end with the same
#      losses; with optimizer.shard, the unsharded run's losses bit for bit;
#  (c) kill -9 of the worker holding ranks 2-3 mid-run: the run pauses
#      within 2x nodes.timeout, its reason naming the node and its local
#      ranks, which status also shows as fields (RunInfo.lost: the node's
#      id as `m6ctl nodes` has it, its hostname, ranks and local ranks)
#      beside an event; the worker restarts, `m6ctl resume` completes the
#      run with the uninterrupted world-4 run's losses, bit for bit (both
#      continue from rank 0's checkpointed state, rebroadcast), and the
#      lost fields are gone once the group forms again;
#  (d) one rank thread of the worker fails: the run pauses within 2x
#      nodes.timeout of the failure, its reason and RunInfo.lost naming
#      the node, the rank and the local rank, beside an event; the resumed
#      run completes with the uninterrupted run's losses;
#      A rank made loud (its gradient 1000x, M6_TEST_FAULT_RANK 3): the
#      grad.outlier event names its node, though it is w's second rank;
#  (e) one rank thread of the coordinator fails: likewise, naming the
#      coordinator's own node and local rank 1.
# A node's host memory is divided among the ranks a run has on it: m6d's
# check (m6ctl plan --daemon, as at submit) of a model larger than any
# machine here refuses a 2-rank run on the 2-device coordinator naming the
# node, its 2 ranks and each one's bytes, half of what m6d may use; a run
# of one rank there is held against all of it.
# Throughout, `m6ctl status` (text and --json) shows where each rank
# stands (rank, local rank, node, step, state): held at a step by rank 0's
# boundary (lib.sh hold_at_step), every rank has completed that step and
# waits in the next one's all-reduce, "waiting" once it has for a second
# (rankboard.h RANKBOARD_WAIT_MS), its reason saying how long; a lost
# node's ranks are "lost", a failed rank "failed" with its error.
. "$(dirname "$0")/lib.sh"
TMO=2   # --node-timeout and nodes.timeout, seconds
M6D_ARGS="--node-timeout $TMO"
STEPS=16
PSEUDO=6

prepare_data "$T/data"
write_token "$T/token"
CKPT_EVERY=4 write_spec "$T/one.json" one $STEPS $PSEUDO
for w in 2 4; do
    CKPT_EVERY=4 write_spec "$T/w$w.json" "w$w" $STEPS $PSEUDO \
        "\"nodes\": {\"world_size\": $w, \"timeout\": $TMO}"
done
# (a) again in bf16: the GEMMs' precision is one setting for the process,
# which the two ranks of one m6d pass in side by side
CKPT_EVERY=4 write_spec "$T/w2b.json" w2b $STEPS $PSEUDO \
    "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}, \"device\": {\"precision\": \"bf16\"}"
# (a) holds rank 0 while status shows the ranks: rank 1 waits in the next
# step's all-reduce, with a timeout the hold cannot reach (w2's numbers)
CKPT_EVERY=4 write_spec "$T/w2h.json" w2 $STEPS $PSEUDO \
    "\"nodes\": {\"world_size\": 2, \"timeout\": 60}"
# (b) holds rank 0 while it reads the nodes table: a timeout the hold
# cannot reach, whatever the machine's load
CKPT_EVERY=4 write_spec "$T/w4live.json" w4live $STEPS $PSEUDO \
    "\"nodes\": {\"world_size\": 4, \"timeout\": 60}"
CKPT_EVERY=4 write_spec "$T/z4.json" z4 $STEPS $PSEUDO \
    "\"nodes\": {\"world_size\": 4, \"timeout\": $TMO}, \"optimizer\": {\"shard\": true}"

# close_to_one CSV WHAT: CSV's train losses are the single rank's within
# dp_nodes.sh's tolerance (1e-4 relative: <= 6e-4 nats at these losses)
# worker_w: (re)starts the worker w with 2 devices, joined to the
# coordinator, and waits until it is live (a fault hook in the call's
# environment applies to it)
worker_w() {
    start_m6d w --join "$ADDR" --token-file "$T/token" --node-name w --devices 2
    wait_node w live 10 >/dev/null
}
# finish_same RUN WHAT: resume RUN, watch it complete, its losses the
# uninterrupted world-4 run's ($T/four.csv) bit for bit
finish_same() {
    ctl resume "$1" >/dev/null || fail "resume refused"
    ctl watch "$1" >/dev/null || fail "$2 did not complete: $(ctl status "$1")"
    losses "$1" >"$T/finish-$1.csv"
    cmp -s "$T/four.csv" "$T/finish-$1.csv" \
        || fail "$2: losses differ from the uninterrupted world-4 run: $(diff "$T/four.csv" "$T/finish-$1.csv" | head -6)"
}

# ranks_are RUN WANT: the ranks of `m6ctl status RUN --json`, one line
# each, "RANK LOCAL_RANK HOSTNAME STEP STATE[ REASON]", match the pattern
# WANT (bash [[ == ]]: * for any text); else prints them (for wait_for)
ranks_are() {
    local got
    got=$(ctl status "$1" --json | jqr '(.ranks // [])[]
        | "\(.rank) \(.local_rank) \(.hostname) \(.step) \(.state)"
          + (if (.reason // "") != "" then " \(.reason)" else "" end)')
    [[ "$got" == $2 ]] && return 0
    echo "$got"
    return 1
}

# fault_pause LOG RANK WHAT: a world-4 run (RF) submitted with rank 0
# held after step 9, where rank RANK fails (M6_TEST_RANK_FAIL of its m6d,
# whose log is LOG); released once it has: the run pauses within 2x
# nodes.timeout of the failure
fault_pause() {
    hold_at_step 9 nowait
    RF=$(ctl submit "$T/w4.json")
    wait_held
    wait_for "rank $2 to fail" 20 log_has "$1" "cluster.rank_failed run=$RF rank=$2"
    local t0=$EPOCHREALTIME
    release_boundary
    wait_paused_within "$RF" "$t0" $((2 * TMO)) "$3"
}

close_to_one() {
    losses_close "$1" "$T/one.csv" "$(wc -l <"$T/one.csv" | awk '{print $1 - 1}')" 6e-4 \
        >"$T/close.out" 2>&1 || fail "$2: losses differ from one rank's: $(tail -3 "$T/close.out")"
    log "$2: $(cat "$T/close.out")"
}

# ---- bad flags: refused at start, saying what is wrong
out=$("$M6D" --state-dir "$T/x" --devices 0 2>&1) && fail "--devices 0 accepted"
echo "$out" | has 'devices: want 1..256, got "0"' || fail "--devices 0: '$out'"
out=$("$M6D" --state-dir "$T/x" --devices 2 2>&1) && fail "--devices 2 without --listen or --join accepted"
echo "$out" | has 'needs --role coordinator --listen HOST:PORT or --join' || fail "--devices 2 alone: '$out'"

# ---- the single-rank reference (same global batch)
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "single-rank run"

# ---- (a) one m6d, two ranks
# rank 0's boundary held (lib.sh hold_at_step) while (c) kills the worker
# --threads 2 split 2 ways: each rank (rank 0 too) gets 1
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_m6d c --role coordinator --listen 127.0.0.1:0 --token-file "$T/token" \
    --threads 2 --devices 2
SOCK=$T/c/m6d.sock
wait_listen c
H=$(hostname)   # the coordinator's node name
ADDR=127.0.0.1:$PORT
[ "$(node_field "$(hostname)" devices)" = 2 ] || [ "$(db "$T/c" "select devices from nodes where role='coordinator'")" = 2 ] \
    || fail "the coordinator does not report 2 devices: $(ctl nodes)"
# held after step 3 (rank 0's boundary): rank 1, on this m6d's rank
# thread, has completed step 3 too and waits in step 4's all-reduce
hold_at_step 3 nowait
R2=$(ctl submit "$T/w2h.json")
wait_held
wait_for "status to show both ranks of run $R2 at step 3, rank 1 waiting" 20 ranks_are "$R2" \
    "0 0 $H 3 training
1 1 $H 3 waiting in a collective for * s (training)"
ctl status "$R2" >"$T/status2.txt"
grep -Eq "^ +1 +1 +[0-9]+ +$H +3 +waiting +in a collective for [0-9.]+ s" "$T/status2.txt" \
    || fail "m6ctl status (text) does not show rank 1 at step 3, waiting: $(cat "$T/status2.txt")"
release_boundary
ctl watch "$R2" >/dev/null || fail "the 2-rank run on one m6d did not complete: $(ctl status "$R2")"
ctl events "$R2" | has -E 'nodes.assign +node=self rank=0 ranks=0-1 world_size=2' \
    || fail "no assignment of ranks 0-1 to the coordinator: $(ctl events "$R2")"
grep -q "cluster.rank_done run=$R2 rank=1 step=$STEPS local_rank=1" "$T/m6d-c.log" \
    || fail "rank 1 did not train on the coordinator's rank thread: $(grep cluster. "$T/m6d-c.log" | tail -5)"
grep -q "cluster.devices local_ranks=2 threads=2 per_rank=1" "$T/m6d-c.log" \
    || fail "the coordinator's cores not split between its 2 ranks: $(grep cluster.devices "$T/m6d-c.log")"
grep -q "cluster.rank_threads run=$R2 rank=1 local_rank=1 threads=1" "$T/m6d-c.log" \
    || fail "rank 1 not given its share of the cores: $(grep cluster.rank "$T/m6d-c.log" | tail -3)"
db "$T/c" "select spec from runs where id=$R2" | has '"threads": *1[,}]' \
    || fail "rank 0 not given its share of the cores: $(db "$T/c" "select spec from runs where id=$R2")"
# a run of one rank on the same m6d has all of --threads
R1=$(ctl submit "$T/one.json")
db "$T/c" "select spec from runs where id=$R1" | has '"threads": *2[,}]' \
    || fail "a one-rank run got a rank's share: $(db "$T/c" "select spec from runs where id=$R1")"
# (run to its end, not stopped: a stop sent now may meet it completed)
ctl watch "$R1" >/dev/null || fail "the one-rank run did not complete: $(ctl status "$R1")"
# ... and its host memory split between the 2 ranks of a run (~1 TB of
# parameters: refused on any machine; the words say by how much)
BIG='{"vocab_size": 256, "n_layer": 64, "n_head": 64, "n_embd": 8192, "seq_len": 16}'
M6_TEST_MODEL=$BIG write_spec "$T/big2.json" big2 $STEPS 0 \
    "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
M6_TEST_MODEL=$BIG write_spec "$T/big1.json" big1 $STEPS 0
out=$(ctl plan "$T/big2.json" --daemon 2>&1) && fail "a ~1 TB model planned: $out"
echo "$out" | has "node $H runs 2 ranks of this run, which share its host memory: " \
    || fail "the refusal does not name the node and its 2 ranks: $out"
# each rank's bytes are half of what m6d may use (the clause before it,
# "only X GiB available" or "m6d's cgroup allows X GiB", 2 decimals)
echo "$out" | python3 -c '
import re, sys
t = sys.stdin.read()
u = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
node = re.search(r"(?:only|allows) ([0-9.]+) ([KMGT]iB)", t)
each = re.search(r"\(([0-9]+) bytes\) each", t)
assert node and each, t
n = float(node.group(1)) * u[node.group(2)]
e = int(each.group(1))
assert abs(2 * e - n) <= 0.01 * n, (2 * e, n)' \
    || fail "each rank's bytes are not half of the node's: $out"
out=$(ctl plan "$T/big1.json" --daemon 2>&1) && fail "a ~1 TB model planned: $out"
echo "$out" | has "host memory: training needs" || fail "big1: $out"
echo "$out" | has "ranks of this run" && fail "a run of one rank was given a share: $out"
log "(a) host memory shared by 2 ranks: $(echo "$out" | cut -c1-60)..."
losses "$R2" >"$T/two.csv"
close_to_one "$T/two.csv" "(a) 2 ranks in one m6d"
# ... and the same run on two m6d of one device each (another cluster):
# the same ranks summing the same two gradients, so the same bits
start_m6d c1 --role coordinator --listen 127.0.0.1:0 --token-file "$T/token"
wait_listen c1
start_m6d v --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name v
SOCK=$T/c1/m6d.sock
R11=$(ctl submit "$T/w2.json")
ctl watch "$R11" >/dev/null || fail "the 2-rank run on 2 m6d did not complete: $(ctl status "$R11")"
losses "$R11" >"$T/oneone.csv"
cmp -s "$T/two.csv" "$T/oneone.csv" \
    || fail "2 ranks in one m6d differ from 2 m6d of one rank: $(diff "$T/two.csv" "$T/oneone.csv" | head -6)"
R11B=$(ctl submit "$T/w2b.json")
ctl watch "$R11B" >/dev/null || fail "the bf16 2-rank run on 2 m6d did not complete: $(ctl status "$R11B")"
losses "$R11B" >"$T/oneone-bf16.csv"
# ... the first summed in its node (the rule: a node of 2 ranks), the
# second flat (one rank a node)
grep -q "cluster.allreduce run=$R2 rank=0 mode=hier nodes=1 max_local_ranks=2" "$T/m6d-c.log" \
    || fail "2 ranks in one m6d did not sum in the node: $(grep cluster.allreduce "$T/m6d-c.log")"
grep -q "cluster.allreduce run=$R11 rank=0 mode=flat nodes=2 max_local_ranks=1" "$T/m6d-c1.log" \
    || fail "2 m6d of one rank did not sum flat: $(grep cluster.allreduce "$T/m6d-c1.log")"
kill -TERM "${M6D_PIDS[v]}" "${M6D_PIDS[c1]}"
wait "${M6D_PIDS[c1]}" || fail "the second coordinator's exit"
unset 'M6D_PIDS[c1]' 'M6D_PIDS[v]'
SOCK=$T/c/m6d.sock
# bf16 on the two ranks of c, after its fp32 runs: each rank's passes keep
# bf16 while the other's begin and end
R2B=$(ctl submit "$T/w2b.json")
ctl watch "$R2B" >/dev/null || fail "the bf16 2-rank run on one m6d did not complete: $(ctl status "$R2B")"
losses "$R2B" >"$T/two-bf16.csv"
cmp -s "$T/two-bf16.csv" "$T/oneone-bf16.csv" \
    || fail "bf16: 2 ranks in one m6d differ from 2 m6d of one rank: $(diff "$T/two-bf16.csv" "$T/oneone-bf16.csv" | head -6)"
log "(a) the same bits as a coordinator and a worker of one device each (fp32 and bf16)"

# ---- (b) a worker with two devices: world 4 over two m6d; submitted
# before it joins, the run waits saying how many devices it has and needs
hold_at_step 2 nowait
R4=$(ctl submit "$T/w4live.json")
wait_event "$R4" 'nodes.wait.*waiting for 4 devices on live nodes, have 2 \(this coordinator.s 2 and 0 workers. 0\)'
worker_w
[ "$(node_field w devices)" = 2 ] || fail "the worker does not report 2 devices: $(ctl nodes)"
wait_held  # rank 0 at its boundary after step 2: the run is alive
ctl nodes >"$T/nodes.txt"
[ "$(node_field w ranks)" = 2-3 ] || fail "m6ctl nodes does not show ranks 2-3 on w: $(cat "$T/nodes.txt")"
grep -Eq "coordinator .* 0-1 " "$T/nodes.txt" || fail "m6ctl nodes does not show ranks 0-1 on the coordinator: $(cat "$T/nodes.txt")"
# every rank at step 2: rank 1 on the coordinator's rank thread, 2-3 on
# w as its heartbeats carry them
wait_for "status to show the 4 ranks of run $R4 at step 2, waiting" 20 ranks_are "$R4" \
    "0 0 $H 2 training
1 1 $H 2 waiting in a collective for * s (training)
2 0 w 2 waiting in a collective for * s (training)
3 1 w 2 waiting in a collective for * s (training)"
release_boundary
ctl watch "$R4" >/dev/null || fail "the world-4 run did not complete: $(ctl status "$R4")"
ctl events "$R4" | has -E 'nodes.assign +node=[0-9]+ hostname=w rank=2 ranks=2-3 world_size=4' \
    || fail "no assignment of ranks 2-3 to w: $(ctl events "$R4")"
for r in 2 3; do
    grep -q "cluster.rank_done run=$R4 rank=$r step=$STEPS local_rank=$((r - 2))" "$T/m6d-w.log" \
        || fail "rank $r did not train to the end on w: $(grep cluster. "$T/m6d-w.log" | tail -5)"
done
losses "$R4" >"$T/four.csv"
close_to_one "$T/four.csv" "(b) 2 m6d x 2 ranks"
# ... and with optimizer.shard (each of the 4 ranks keeps a quarter of the
# AdamW state, gathered at every save): the unsharded run's bits, as
# zerod.sh shows across nodes (sharding changes no float operation)
RZ=$(ctl submit "$T/z4.json") || fail "optimizer.shard at world size 4 refused"
ctl watch "$RZ" >/dev/null || fail "the sharded world-4 run did not complete: $(ctl status "$RZ")"
losses "$RZ" >"$T/z4.csv"
cmp -s "$T/four.csv" "$T/z4.csv" \
    || fail "the sharded world-4 run's losses differ from the unsharded: $(diff "$T/four.csv" "$T/z4.csv" | head -6)"
log "(b) optimizer.shard over 2 m6d x 2 ranks: the unsharded run's losses"

# ---- (c) kill -9 of the worker holding ranks 2-3, restart, resume
hold_at_step 9 nowait   # past the delink (step 6) and its regroup
R4b=$(ctl submit "$T/w4.json")
wait_held
kill -9 "${M6D_PIDS[w]}"; wait "${M6D_PIDS[w]}" 2>/dev/null || true
t0=$EPOCHREALTIME
release_boundary
wait_paused_within "$R4b" "$t0" $((2 * TMO)) "kill -9 of the worker holding two ranks"
lost_is "$R4b" "2 0 2 w"
wait_event "$R4b" 'nodes.rank_lost +node=[0-9]+ hostname=w rank=2 ranks=2-3 local_ranks=0-1'
# w's ranks lost with their node (its detail the reason; their step the
# one its last heartbeat carried, whenever that was); rank 1 left the
# group when its all-reduce failed; rank 0 paused, the run back at its
# checkpoint of step 8 (checkpoint.every 4) to resume from
wait_for "status to show run $R4b's ranks after the loss" 20 ranks_are "$R4b" \
    "0 0 $H 8 paused
1 1 $H 9 left *
2 0 w * lost ?*
3 1 w * lost ?*"
log "(c) paused ${TOOK}s after kill -9: $(ctl events "$R4b" | grep rank_lost | head -1 | cut -c1-140); error: $(field "$R4b" error | cut -c1-120)"
worker_w
finish_same "$R4b" "the world-4 run resumed after kill -9"
[ -z "$(field "$R4b" lost)" ] || fail "run $R4b still shows lost ranks after its group formed again: $(field "$R4b" lost)"
log "(c) resumed, completed with the uninterrupted run's losses"
# ---- (d) one rank thread fails (the test hook M6_TEST_RANK_FAIL, as a
# trainer error would): the run pauses, an event naming the node, the rank
# and its local rank; the worker restarted without the fault, a resume
# completes the run
kill -TERM "${M6D_PIDS[w]}"; wait "${M6D_PIDS[w]}" || fail "worker exit after SIGTERM"
M6_TEST_RANK_FAIL=3@9 worker_w
fault_pause "$T/m6d-w.log" 3 "rank 3 (w's local rank 1) failed"
R4c=$RF
lost_is "$R4c" "3 1 1 w"
wait_event "$R4c" 'nodes.rank_failed +node=[0-9]+ hostname=w rank=3 local_rank=1 err="test fault'
wait_for "status to show rank 3 of run $R4c failed" 20 ranks_are "$R4c" \
    "*
3 1 w 9 failed test fault: M6_TEST_RANK_FAIL*"
log "(d) paused ${TOOK}s after rank 3 failed; status: $(ctl status "$R4c" | grep -E '^ *lost:')"
log "(d) $(ctl events "$R4c" | grep rank_failed | head -1 | cut -c1-140); error: $(field "$R4c" error | cut -c1-120)"
kill -TERM "${M6D_PIDS[w]}"; wait "${M6D_PIDS[w]}" || fail "worker exit after SIGTERM"
worker_w
finish_same "$R4c" "the world-4 run resumed after a rank failed"
# ---- rank 3 alone loud (its gradient 1000x at steps 3-4, the fault hook
# on that rank only): the grad.outlier event names w, though rank 3 is the
# second of w's ranks
kill -TERM "${M6D_PIDS[w]}"; wait "${M6D_PIDS[w]}" || fail "worker exit after SIGTERM"
M6_TEST_FAULT=grad_scale@3x2 M6_TEST_FAULT_RANK=3 worker_w
RO=$(ctl submit "$T/w4.json") || fail "the loud-rank run refused"
ctl watch "$RO" >/dev/null || fail "the loud-rank run did not complete: $(ctl status "$RO")"
ctl events "$RO" | has -E 'grad.outlier +step=3 rank=3 node=[0-9]+ hostname=w:' \
    || fail "no grad.outlier event naming rank 3 on w: $(ctl events "$RO" | grep -E 'outlier|skipped')"
log "(d) a loud rank 3: $(ctl events "$RO" | grep grad.outlier | head -1 | cut -c1-110)"
kill -TERM "${M6D_PIDS[w]}"; wait "${M6D_PIDS[w]}" || fail "worker exit after SIGTERM"
worker_w
# ---- (e) a rank thread of the coordinator fails (its local rank 1): the
# pause names the coordinator's own node; restarted on its address with
# the fault hook, the worker reconnecting by itself
kill -TERM "${M6D_PIDS[c]}"; wait "${M6D_PIDS[c]}" || fail "coordinator exit"
M6_TEST_RANK_FAIL=1@9 M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_m6d c --role coordinator \
    --listen "$ADDR" --token-file "$T/token" --threads 2 --devices 2
wait_m6d "$SOCK" "${M6D_PIDS[c]}" "the restarted coordinator"
wait_node w live 10 >/dev/null
fault_pause "$T/m6d-c.log" 1 "rank 1 (the coordinator's local rank 1) failed"
R4e=$RF
lost_is "$R4e" "1 1 1 $H"
log "(e) paused ${TOOK}s after rank 1 failed; status: $(ctl status "$R4e" | grep -E '^ *lost:')"
kill -TERM "${M6D_PIDS[w]}" "${M6D_PIDS[c]}"
wait "${M6D_PIDS[c]}" || fail "coordinator exit"
unset 'M6D_PIDS[c]'
echo "ok"
