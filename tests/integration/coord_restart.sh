#!/usr/bin/env bash
# coord_restart.sh — the coordinator of a 2-rank run restarted mid-run
# (issue 14, "many nodes"): a coordinator m6d (rank 0, --listen on a fixed
# loopback port, a token file) and a worker m6d (--join, rank 1), each with
# its own state dir, train nodes.world_size 2 on the fortunes shards with
# checkpoints every 5 steps.
#  (a) kill -9 of the coordinator mid-run, with an operator delink it had
#      acknowledged but not applied (the boundary held by
#      M6_TEST_HOLD_BOUNDARY): the worker leaves its collective within
#      nodes.timeout (the closed Gloo connection) and keeps running,
#      rejoining every heartbeat interval; m6.db still has the run
#      (running) and the delink (pending). Restarted on the same state dir
#      and port, the coordinator takes the run up from its last complete
#      checkpoint by itself (it was running), waits for the worker, which
#      rejoins; the replayed delink happens at the checkpoint's step on
#      both ranks (rank 0 delinks, the worker takes the delinked state by
#      broadcast), exactly once; the run completes with one metrics row per
#      step, and its losses equal those of an uninterrupted 2-rank run
#      whose spec delinks at that step, bit for bit (the same world, the
#      same bucket: Gloo's sums are deterministic, and every group starts
#      from rank 0's checkpointed state, rebroadcast).
#  (b) SIGTERM of the coordinator mid-run: it finishes the step, writes a
#      checkpoint (interrupted) and exits 0 within a bound; the worker
#      leaves its collective. The worker is stopped too, so the restarted
#      coordinator takes the run up and waits for it as at a start
#      (nodes.wait, no step trained alone); once the worker is back the run
#      goes on from that checkpoint by itself, and the losses equal the
#      uninterrupted run's, bit for bit.
# Every wait is bounded (timeouts of a few seconds: nodes.timeout and
# --node-timeout 3 s), so a hang fails the test instead of stalling it.
. "$(dirname "$0")/lib.sh"
TMO=3   # --node-timeout and nodes.timeout, seconds

M6D_ARGS="--node-timeout $TMO"  # every m6d start_m6d (lib.sh) starts

# wait_exit NAME SECONDS: the process ends within SECONDS (else the test
# fails: it hung); its exit status in EXIT_RC
wait_exit() {
    local pid=${M6D_PIDS[$1]}
    wait_gone "$pid" "$2" "m6d $1"
    EXIT_RC=0
    wait "$pid" || EXIT_RC=$?
    unset "M6D_PIDS[$1]"
}
# log_count NAME ERE: how many lines of m6d NAME's log match ERE
log_count() { grep -Ec "$2" "$T/m6d-$1.log" || true; }
# wait_log NAME ERE SECONDS [N]: more than N (default 0) lines of m6d
# NAME's log match ERE within SECONDS
wait_log() {
    for _ in $(seq 1 $(($3 * 20))); do
        [ "$(log_count "$1" "$2")" -gt "${4:-0}" ] && return 0
        nap 0.05
    done
    fail "m6d $1 did not log '$2' within $3 s"
}
# watch_run RUN: until the run ends, at most 90 s; fails unless completed
watch_run() {
    timeout 90 "$M6CTL" --socket "$SOCK" watch "$1" >/dev/null \
        || fail "run $1 did not complete: $(ctl status "$1" 2>&1 | head -5)"
}
# start_coord: the coordinator on the fixed port, its socket answering
start_coord() {
    start_m6d c --role coordinator --listen "$ADDR" --token-file "$T/token"
    for _ in $(seq 1 200); do
        ctl list >/dev/null 2>&1 && return 0
        kill -0 "${M6D_PIDS[c]}" 2>/dev/null || fail "the coordinator exited at start"
        nap 0.05
    done
    fail "the coordinator did not answer"
}
pending() { db "$T/c" "select count(*) from commands where run=$1 and state='pending'"; }
events_of() { db "$T/c" "select count(*) from events where run=$1 and kind='$2'"; }
# rows_whole RUN: one metrics row per step 1..train.steps
rows_whole() {
    [ "$(db "$T/c" "select count(*), min(step), max(step), count(distinct step) from metrics where run=$1")" \
        = "30|1|30|30" ] || fail "run $1's metrics rows: $(db "$T/c" "select count(*), min(step), max(step), count(distinct step) from metrics where run=$1"), want 30|1|30|30"
}

prepare_data "$T/data"
write_token "$T/token"
# a fixed port, outside the ephemeral range (a connection's own port could
# otherwise take the coordinator's while it is down), free now
PORT=$(free_port)
ADDR=127.0.0.1:$PORT
SOCK=$T/c/m6d.sock
HOLD=$HOLD_FILE  # lib.sh hold_boundary
NODES="\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
CKPT_EVERY=5 write_spec "$T/late.json" late 30 25 "$NODES"

export M6_TEST_STEP_DELAY_MS=60  # rank 0's steps: time to act mid-run
export M6_TEST_HOLD_BOUNDARY=$HOLD
start_coord
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
wait_log w1 'cluster.joined' 20

# ---- (a) kill -9 with an acknowledged delink
hold_at_step 11 nowait  # before its delink at 25, whatever the speed of a step
R1=$(ctl submit "$T/late.json")
wait_held
k=$(db "$T/c" "select step from runs where id=$R1")
ctl delink "$R1" >/dev/null || fail "delink not acknowledged"
kill -9 "${M6D_PIDS[c]}"
t0=$EPOCHREALTIME
wait "${M6D_PIDS[c]}" 2>/dev/null || true
unset 'M6D_PIDS[c]'
rm -f "$HOLD"
[ "$(pending "$R1")" = 1 ] || fail "the acknowledged delink is not pending in m6.db: $(db "$T/c" "select * from commands where run=$R1")"
[ "$(events_of "$R1" delink)" = 0 ] || fail "the delink was applied before the kill (the boundary was held)"
CK=$(db "$T/c" "select max(step) from checkpoints where run=$R1")
log "(a) delink acknowledged at step $k, coordinator killed; last checkpoint step $CK"
# the worker leaves its collective (it does not hang in it) and lives on
wait_log w1 "cluster.rank_left run=$R1 rank=1" $((TMO + 2))
took=$(python3 -c "print(round($EPOCHREALTIME - $t0, 2))")
kill -0 "${M6D_PIDS[w1]}" 2>/dev/null || fail "the worker died with its coordinator"
wait_log w1 'cluster.coordinator_lost' $((TMO + 2))
log "(a) the worker left its collective ${took}s after the kill: $(grep "cluster.rank_left run=$R1" "$T/m6d-w1.log" | sed 's/.*why=//' | cut -c1-100)"
[ "$(db "$T/c" "select state from runs where id=$R1")" = running ] \
    || fail "m6.db lost the running run: $(db "$T/c" "select id, state from runs")"
[ "$(db "$T/c" "select count(*) from commands where run=$R1 and kind='submit' and state='applied'")" = 1 ] \
    || fail "the submit is not in the command log: $(db "$T/c" "select * from commands where run=$R1")"

# the restart: same state dir, same port, the boundary not held (no
# file); (b) holds it again
rejoins=$(log_count w1 'cluster.rejoined')
start_coord
wait_log w1 'cluster.rejoined' $((TMO * 2)) "$rejoins"  # one heartbeat interval
watch_run "$R1"
ctl events "$R1" >"$T/events1.txt"
grep -q "resume.restart *step=$CK " "$T/events1.txt" \
    || fail "run $R1 not taken up from checkpoint $CK: $(grep resume "$T/events1.txt")"
[ "$(events_of "$R1" delink)" = 1 ] || fail "$(events_of "$R1" delink) delink events, want 1: $(cat "$T/events1.txt")"
db "$T/c" "select detail from events where run=$R1 and kind='delink'" | has 'reason=operator' \
    || fail "delink event: $(db "$T/c" "select detail from events where run=$R1 and kind='delink'")"
K=$(field "$R1" delink_step)
[ "$K" = "$CK" ] || fail "the replayed delink is at step $K, not at the checkpoint's step $CK"
[ "$(db "$T/c" "select count(*) from phases where run=$R1 and phase='real'")" = 1 ] || fail "not one real phase"
[ "$(pending "$R1")" = 0 ] || fail "commands still pending: $(db "$T/c" "select * from commands where run=$R1")"
[ "$(db "$T/c" "select state || ' ' || step from commands where run=$R1 and kind='delink'")" = "applied $K" ] \
    || fail "the delink command: $(db "$T/c" "select * from commands where run=$R1 and kind='delink'")"
grep -Eq "nodes.group +world_size=2 step=$K( |\$)" "$T/events1.txt" \
    || fail "no group at step $K after the restart: $(grep nodes. "$T/events1.txt")"
grep -q "cluster.rank run=$R1 rank=1 world_size=2 step=$K" "$T/m6d-w1.log" \
    || fail "rank 1 did not continue from step $K: $(grep "cluster.rank" "$T/m6d-w1.log" | tail -3)"
grep -q "cluster.rank_done run=$R1 rank=1 step=30" "$T/m6d-w1.log" \
    || fail "rank 1 did not train to step 30: $(grep "cluster." "$T/m6d-w1.log" | tail -3)"
rows_whole "$R1"
log "(a) taken up from step $CK, the delink replayed there on both ranks, completed"

# the reference: the same run uninterrupted, delinking at step K by spec
CKPT_EVERY=5 write_spec "$T/ref.json" ref 30 "$K" "$NODES"
R0=$(ctl submit "$T/ref.json")
watch_run "$R0"
losses "$R0" >"$T/ref.csv"
losses "$R1" >"$T/r1.csv"
cmp -s "$T/ref.csv" "$T/r1.csv" \
    || fail "run $R1's losses differ from the uninterrupted 2-rank run's: $(diff "$T/ref.csv" "$T/r1.csv" | head -6)"
log "(a) losses equal the uninterrupted 2-rank run's bit for bit ($(wc -l <"$T/ref.csv") rows)"

# ---- (b) SIGTERM mid-run, restart: the run goes on by itself
hold_at_step $((K + 3)) nowait  # mid-run when SIGTERM comes, whatever the speed of a step
R2=$(ctl submit "$T/ref.json")
wait_held
left=$(log_count w1 "cluster.rank_left run=$R2 rank=1")  # the delink's regroup
kill -TERM "${M6D_PIDS[c]}"
wait_exit c 20
release_boundary
[ "$EXIT_RC" = 0 ] || fail "the coordinator exited $EXIT_RC after SIGTERM"
S=$(db "$T/c" "select detail from events where run=$R2 and kind='interrupted'" | sed -n 's/^step=\([0-9]*\).*/\1/p')
[ -n "$S" ] || fail "no interrupted event: $(db "$T/c" "select kind, detail from events where run=$R2")"
[ -n "$(db "$T/c" "select step from checkpoints where run=$R2 and step=$S")" ] || fail "no checkpoint at step $S"
wait_log w1 "cluster.rank_left run=$R2 rank=1" $((TMO + 2)) "$left"
log "(b) SIGTERM: checkpoint at step $S, the worker left its collective"
# the worker stops too: the restarted coordinator waits for it, as at a start
kill -TERM "${M6D_PIDS[w1]}"
wait_exit w1 20
[ "$EXIT_RC" = 0 ] || fail "the worker exited $EXIT_RC after SIGTERM"
last=$(db "$T/c" "select max(id) from events")
start_coord
for _ in $(seq 1 200); do
    db "$T/c" "select detail from events where run=$R2 and kind='nodes.wait' and id>$last" \
        | has 'waiting for 2 live nodes, have 1' && break
    nap 0.05
done
db "$T/c" "select detail from events where run=$R2 and kind='nodes.wait' and id>$last" \
    | has 'waiting for 2 live nodes, have 1' \
    || fail "the restarted coordinator does not say it waits for the worker: $(ctl events "$R2" | tail -4)"
# the cluster is attached before the runner takes the run up: no event of
# this life says the m6d is no coordinator
db "$T/c" "select detail from events where run=$R2 and id>$last" | has "needs this m6d to be the coordinator" \
    && fail "the restarted coordinator took the run up before its cluster: $(ctl events "$R2" | tail -4)"
[ "$(field "$R2" state)" = running ] || fail "run $R2 is $(field "$R2" state) after the restart, want running"
nap 1
[ "$(db "$T/c" "select step from runs where id=$R2")" = "$S" ] || fail "run $R2 trained without its worker"
log "(b) restarted without the worker: $(ctl status "$R2" | grep -o 'waiting for [^)]*)')"
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
watch_run "$R2"
ctl events "$R2" | has "resume.restart *step=$S " || fail "run $R2 not taken up at step $S: $(ctl events "$R2")"
[ "$(grep -c "cluster.rank run=$R2 rank=1 world_size=2 step=$S" "$T/m6d-w1.log")" = 1 ] \
    || fail "rank 1 did not continue from step $S once: $(grep "cluster.rank" "$T/m6d-w1.log" | tail -3)"
rows_whole "$R2"
losses "$R2" >"$T/r2.csv"
cmp -s "$T/ref.csv" "$T/r2.csv" \
    || fail "run $R2's losses differ from the uninterrupted 2-rank run's: $(diff "$T/ref.csv" "$T/r2.csv" | head -6)"
log "(b) resumed at step $S by itself, losses equal bit for bit"

# ---- both stop cleanly, within a bound
kill -TERM "${M6D_PIDS[w1]}" "${M6D_PIDS[c]}"
wait_exit w1 20
[ "$EXIT_RC" = 0 ] || fail "the worker exited $EXIT_RC after SIGTERM"
wait_exit c 20
[ "$EXIT_RC" = 0 ] || fail "the coordinator exited $EXIT_RC after SIGTERM"
echo "ok"
