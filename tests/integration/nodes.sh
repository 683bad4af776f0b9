#!/usr/bin/env bash
# nodes.sh PEER_PY — many nodes, part B (issue 14): a coordinator m6d and
# worker m6d processes, each with its own state dir, on loopback only.
#  - a token file others may read is refused at start, naming its mode;
#  - two workers join; `m6ctl nodes` (text and --json) shows both live with
#    their fields, checked against /proc/meminfo and the test's own clock;
#  - kill -9 of a worker: lost at once (its socket closes), with the event;
#    SIGSTOP of a worker: lost within the timeout (no heartbeat), and after
#    SIGCONT it rejoins as a reconnect of the same node;
#  - a worker with a wrong token fails the TLS handshake, and is logged
#    with its address; the coordinator keeps serving (a good worker then
#    joins); a duplicate hostname is refused without the live node's id;
#  - before TLS: garbage, a huge length, half a frame, a Hello, the old
#    plaintext StoreOpen with the right token, no handshake, a wrong PSK;
#    inside TLS: no first frame, a huge length, a Hello, garbage after a
#    StoreOpen; and a flood of idle connections on the TCP port: each
#    refused and closed (at once before TLS, within the first-frame
#    timeout otherwise); the coordinator serves on;
#  - the rendezvous store across two clients (set on one, get/wait on the
#    other), a get that times out naming the key, generations kept apart;
#  - a join (and a store) to an address nobody listens on fails within the
#    timeout with a clear message; SIGTERM makes a worker "left"; a
#    restarted coordinator marks its nodes lost until they reconnect;
#  - the coordinator trains a run through all of it: the same losses as on
#    a quiet m6d (a join during a run loses nothing).
. "$(dirname "$0")/lib.sh"
: "${M6STORE:?set M6STORE to the m6store binary}"
PEER=${1:?usage: nodes.sh nodes_peer.py}
TMO=1           # --node-timeout, seconds: heartbeats every 333 ms
export MAX_S=3  # the first-frame timeout is min(5 s, TMO), plus slack

M6D_ARGS="--node-timeout $TMO"  # every m6d start_m6d (lib.sh) starts
c_ctl() { "$M6CTL" --socket "$T/c/m6d.sock" "$@"; }

# ---- the token file
write_token "$T/token"
cp "$T/token" "$T/token-wide"; chmod 644 "$T/token-wide"
rc=0; "$M6D" --state-dir "$T/wide" --role coordinator --listen 127.0.0.1:0 \
    --token-file "$T/token-wide" 2>"$T/wide.err" || rc=$?
[ "$rc" = 1 ] || fail "a token file of mode 0644 was accepted (rc $rc)"
grep -q "token file $T/token-wide has mode 0644" "$T/wide.err" || fail "mode not named: $(cat "$T/wide.err")"
[ ! -e "$T/wide/m6.db" ] || fail "m6d refused the token but created m6.db first"
rc=0; "$M6D" --state-dir "$T/notoken" --role coordinator --listen 127.0.0.1:0 2>"$T/nt.err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--listen needs --token-file" "$T/nt.err" || fail "--listen without a token: rc $rc $(cat "$T/nt.err")"
write_token "$T/token-bad" 24

# ---- one node: a plain m6d is both roles and lists itself
start_m6d solo
wait_m6d "$T/solo/m6d.sock" "$M6D_PID" "the solo m6d"
"$M6CTL" --socket "$T/solo/m6d.sock" nodes --json | python3 -c '
import json, socket, sys
n = json.load(sys.stdin)
assert len(n) == 1 and n[0]["role"] == "coordinator" and n[0]["state"] == "live", n
assert n[0]["hostname"] == socket.gethostname(), n
' || fail "a single m6d does not list itself as the live coordinator"
grep -q "cluster.listen" "$T/m6d-solo.log" && fail "a single m6d listens on TCP"
kill -TERM "${M6D_PIDS[solo]}"; wait "${M6D_PIDS[solo]}" || fail "solo m6d exit"
unset 'M6D_PIDS[solo]'
[ "$(db "$T/solo" "select state from nodes")" = left ] || fail "solo m6d not left after SIGTERM"

# ---- a run on the coordinator while nodes join and peers misbehave: it
# ends with the losses of the same run on a quiet m6d
prepare_data "$T/data"
spec_file "$T/run.json" during <<JSON
  "model": $(tiny_model),
  "pseudo": {"steps": 1000},
  "train": {"steps": 2000, "batch_size": 4, "eval_every": 500, "seed": 7},
  "checkpoint": {"every": 1000, "keep": 2}
JSON
reference_losses "$T/quiet" "$T/run.json" "$T/quiet.csv" "quiet run"

# ---- a coordinator and two workers
start_m6d c --role coordinator --listen 127.0.0.1:0 --token-file "$T/token"
wait_listen c
ADDR=127.0.0.1:$PORT
SOCK=$T/c/m6d.sock  # lib.sh's ctl, field, losses
RUN=$(ctl submit "$T/run.json")
wait_state "$RUN" running
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
start_m6d w2 --join "$ADDR" --token-file "$T/token" --node-name w2
# The workers join while the run trains. Should they be slow to join (each
# m6d loads the CUDA libraries twice before it starts, and CI once took
# 2 s for that, longer than the whole run), the run is paused at step 1500
# and resumed once both have joined: they still join a run in progress, and
# the test does not depend on the machine's speed. The coordinator's log
# says when each joined (grep is cheap; m6ctl and Python would not be).
joined() { grep -q "node.join node=[0-9]* hostname=$1 " "$T/m6d-c.log"; }
PAUSED=
for _ in $(seq 1 1000); do
    joined w1 && joined w2 && break
    if [ -z "$PAUSED" ] && [ "$(db "$T/c" "select coalesce(step, 0) from runs where id=$RUN")" -ge "${PAUSE_AT:-1500}" ]; then
        ctl pause "$RUN" >/dev/null || fail "pause while the nodes join"
        PAUSED=1
    fi
    nap 0.01
done
joined w1 && joined w2 || fail "the workers did not join within 10 s"
if [ -n "$PAUSED" ]; then
    log "the nodes took long to join: run $RUN paused for them"
    wait_state "$RUN" paused
    ctl resume "$RUN" >/dev/null || fail "resume after the nodes joined"
fi
# both joins logged before the run ended (a paused run is in progress)
awk -v run="$RUN" '/node.join .*hostname=w[12] / { n++ }
    $0 ~ "run.(completed|failed|stop) run=" run " " && n < 2 { bad = 1 }
    END { exit bad || n < 2 }' "$T/m6d-c.log" || fail "the nodes did not join while run $RUN was in progress"
wait_node w1 live 10 >/dev/null
wait_node w2 live 10 >/dev/null
c_ctl nodes >"$T/nodes.txt"
cat "$T/nodes.txt" >&2
grep -Eq '^ +[0-9]+ w1 +live +worker +cpu +1 ' "$T/nodes.txt" || fail "w1 not listed live: $(cat "$T/nodes.txt")"
grep -Eq '^ +[0-9]+ w2 +live +worker +cpu +1 ' "$T/nodes.txt" || fail "w2 not listed live"
grep -Eq 'live +coordinator' "$T/nodes.txt" || fail "the coordinator does not list itself"
# the run named what multiplies for it: the library and ISA m6d logged at
# start, and the spec's precision (fp32: the key left out)
isa=$(grep -o 'cpu\.gemm library=onednn version=[0-9.]* isa=[a-z0-9_]*' "$T/m6d-c.log" | sed 's/.*isa=//')
[ -n "$isa" ] || fail "no cpu.gemm line at start"
grep -Eq "run\.gemm run=$RUN backend=cpu library=onednn version=[0-9.]+ isa=$isa precision=fp32\$" "$T/m6d-c.log" \
    || fail "no run.gemm line for run $RUN: $(grep run.gemm "$T/m6d-c.log")"
c_ctl nodes --json | python3 -c '
import json, sys, time
nodes = json.load(sys.stdin)
mem = [int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:")][0]
w = {n["hostname"]: n for n in nodes if n["role"] == "worker"}
assert set(w) == {"w1", "w2"}, w
for n in w.values():
    assert n["state"] == "live" and n["backend"] == "cpu" and n["devices"] == 1, n
    assert n["memory"] == mem, (n["memory"], mem)  # /proc/meminfo MemTotal
    assert 0 < n["free_device_memory"] <= mem, n    # MemAvailable on cpu
    assert n["run_id"] is None and n["rank"] is None, n
    assert abs(time.time() - n["last_heartbeat"]) < 3, n  # heartbeats every 333 ms
    assert n["address"].startswith("127.0.0.1:"), n
    assert len(n["node_uuid"]) == 32, n
assert w["w1"]["node_uuid"] != w["w2"]["node_uuid"]
# every node names its GEMM library and ISA: on one machine, what the
# coordinator logged at start (its cpu.gemm line)
isa = [f.split("=", 1)[1] for l in open(sys.argv[1]) if "cpu.gemm" in l
       for f in l.split() if f.startswith("isa=")][0]
for n in nodes:
    assert n["gemm"] == "onednn " + isa, (n["gemm"], isa)
' "$T/m6d-c.log" || fail "nodes --json fields"
[ "$(cat "$T/w1/node-id")" = "$(node_field w1 node_uuid)" ] || fail "w1's node id is not the one in its state dir"
# a worker lists no nodes; it says where they are
"$M6CTL" --socket "$T/w1/m6d.sock" nodes 2>"$T/err" && fail "m6ctl nodes on a worker should be refused"
grep -q "worker node of the coordinator at $ADDR" "$T/err" || fail "worker's nodes refusal: $(cat "$T/err")"

# ---- kill -9: the socket closes, lost at once
kill -9 "${M6D_PIDS[w1]}"; wait "${M6D_PIDS[w1]}" 2>/dev/null || true
took=$(wait_node w1 lost $((TMO + 1)))
log "w1 (kill -9) lost after ${took}s"
db "$T/c" "select detail from events where run is null and kind = 'node.lost'" | has "hostname=w1 .*cause=\"connection closed by the peer\"" \
    || fail "no node.lost event naming w1: $(db "$T/c" 'select kind, detail from events')"
grep -q 'node.lost node=[0-9]* hostname=w1' "$T/m6d-c.log" || fail "node.lost not logged for w1"
# ---- SIGSTOP: silent, lost within the timeout; SIGCONT: a reconnect
kill -STOP "${M6D_PIDS[w2]}"
took=$(wait_node w2 lost $((TMO + 2)))
log "w2 (SIGSTOP) lost after ${took}s (timeout ${TMO}s)"
# the timeout counts from w2's last heartbeat, which can come up to one
# heartbeat interval (TMO/3) before the SIGSTOP: not before 2/3 TMO
python3 -c "import sys; sys.exit(not ($took >= $TMO * 0.6))" || fail "w2 lost after ${took}s, before its timeout"
[ "$(node_field w2 detail)" != "" ] && node_field w2 detail | has "no heartbeat for" || fail "w2's cause: $(node_field w2 detail)"
kill -CONT "${M6D_PIDS[w2]}"
wait_node w2 live 5 >/dev/null
grep -q 'node.reconnect node=[0-9]* hostname=w2' "$T/m6d-c.log" || fail "w2 came back, but not as a reconnect"
grep -q 'cluster.rejoined .*reconnect=1' "$T/m6d-w2.log" || fail "w2 does not log its rejoin"

# ---- a wrong token: refused, logged with the address; the coordinator serves on
rc=0; timeout 10 "$M6D" --state-dir "$T/bad" --threads 1 --node-timeout "$TMO" --join "$ADDR" \
    --token-file "$T/token-bad" --node-name w9 2>"$T/bad.err" || rc=$?
[ "$rc" = 1 ] || fail "a worker with a wrong token: rc $rc"
grep -q "cluster.tls_refused coordinator=$ADDR err=\"TLS handshake failed" "$T/bad.err" \
    && grep -q "the peer at $ADDR is not this cluster's coordinator: TLS handshake failed" "$T/bad.err" \
    || fail "wrong-token worker's message: $(tail -3 "$T/bad.err")"
grep -Eq 'cluster.refused peer=127\.0\.0\.1:[0-9]+ reason="TLS handshake failed: ' "$T/m6d-c.log" || fail "wrong token not logged with the peer address"
[ -z "$(node_field w9 state)" ] || fail "the refused worker is in the nodes table"
start_m6d w3 --join "$ADDR" --token-file "$T/token" --node-name w3
wait_node w3 live 10 >/dev/null
# a duplicate hostname: refused, without the live node's id (a credential
# once) or address; those are in the coordinator's log
rc=0; timeout 10 "$M6D" --state-dir "$T/dup" --threads 1 --node-timeout "$TMO" --join "$ADDR" \
    --token-file "$T/token" --node-name w3 2>"$T/dup.err" || rc=$?
[ "$rc" = 1 ] && grep -q "duplicate hostname: w3 is taken by another node that is joining or live" "$T/dup.err" \
    || fail "duplicate hostname: rc $rc $(tail -2 "$T/dup.err")"
W3_UUID=$(cat "$T/w3/node-id")
W3_ADDR=$(node_field w3 address)
grep -q "refused the join" "$T/dup.err" && ! grep -qF -e "$W3_UUID" -e "$W3_ADDR" "$T/dup.err" \
    || fail "the duplicate-hostname refusal shows w3's node id or address: $(grep 'refused the join' "$T/dup.err")"
grep -Eq "reason=\"duplicate hostname w3: node [0-9]+ \(live, joined from 127\.0\.0\.1:" "$T/m6d-c.log" \
    || fail "the duplicate hostname is not logged with the node that has it"

# ---- hostile peers on the TCP port
for c in garbage huge half silent hello; do
    python3 "$PEER" "$PORT" "$c" >&2 || fail "peer case $c"
done
python3 "$PEER" "$PORT" plainjoin "$T/token" >&2 || fail "peer case plainjoin"
python3 "$PEER" "$PORT" wrongpsk "$T/token-bad" >&2 || fail "peer case wrongpsk"
for c in tlssilent tlshuge tlshello; do
    python3 "$PEER" "$PORT" "$c" "$T/token" >&2 || fail "peer case $c"
done
python3 "$PEER" "$PORT" authgarbage "$T/token" "$T/c" >&2 || fail "peer case authgarbage"
grep -q 'reason="first frame too large"' "$T/m6d-c.log" || fail "huge length not logged"
grep -q 'reason="no first frame in time"' "$T/m6d-c.log" || fail "silent TLS peer not logged"
grep -q 'reason="no TLS handshake in time"' "$T/m6d-c.log" || fail "silent peer not logged"
python3 "$PEER" "$PORT" flood 80 3 "$T/flooding" >&2 &
FLOOD=$!
for _ in $(seq 1 100); do [ -e "$T/flooding" ] && break; nap 0.05; done
# while 64 connections wait to authenticate: the store and the nodes answer
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 1 0 2000 set during-flood yes || fail "store set during the flood"
c_ctl nodes >/dev/null || fail "control socket during the flood"
wait "$FLOOD" || fail "flood case"
[ "$(node_field w3 state)" = live ] || fail "w3 not live after the hostile peers: $(node_field w3 state)"

# ---- the store: set on one client, get/wait on another, in (run, generation)
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 1 2000 get rank0.addr 8000 >"$T/get.out" 2>"$T/get.err" &
G=$!
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 1 2000 wait 8000 k1 k2 2>"$T/wait.err" &
W=$!
nap 0.3
kill -0 "$G" 2>/dev/null || fail "get returned before the key was set: $(cat "$T/get.err")"
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 1 2000 set rank0.addr "tcp://127.0.0.1:29500" || fail "store set"
wait "$G" || fail "store get: $(cat "$T/get.err")"
[ "$(cat "$T/get.out")" = "tcp://127.0.0.1:29500" ] || fail "store get: '$(cat "$T/get.out")'"
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 1 2000 set k1 a
kill -0 "$W" 2>/dev/null || fail "wait returned with k2 unset"
"$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 1 2000 set k2 b
wait "$W" || fail "store wait: $(cat "$T/wait.err")"
# a key of generation 1 is not seen in generation 2; a get times out naming it
t0=$EPOCHREALTIME
rc=0; "$M6STORE" "$ADDR" "$T/token" "$T/c" 0 7 2 2000 get rank0.addr 400 2>"$T/tmo.err" || rc=$?
took=$(python3 -c "print($EPOCHREALTIME - $t0)")
[ "$rc" = 3 ] || fail "store get of an unset key: rc $rc $(cat "$T/tmo.err")"
grep -q 'key "rank0.addr" not set after 400 ms' "$T/tmo.err" || fail "timeout message: $(cat "$T/tmo.err")"
python3 -c "import sys; sys.exit(not (0.35 <= $took < 2.5))" || fail "get with a 400 ms timeout took ${took}s"
rc=0; "$M6STORE" "$ADDR" "$T/token-bad" "$T/c" 0 7 1 2000 get rank0.addr 0 2>"$T/sbad.err" || rc=$?
[ "$rc" = 1 ] && grep -q "refused the connection: authentication failed" "$T/sbad.err" || fail "store with a wrong token: $(cat "$T/sbad.err")"

# ---- nobody listening: the join and the store fail within the timeout
# port 1 (tcpmux): a free port picked now could be taken by another test's
# socket before m6d connects; nobody serves tcpmux
DEAD=127.0.0.1:1
python3 -c 'import socket; socket.create_connection(("127.0.0.1", 1), timeout=1)' 2>/dev/null \
    && fail "something listens on 127.0.0.1:1: this test needs an address nobody listens on"
t0=$EPOCHREALTIME
rc=0; timeout 20 "$M6D" --state-dir "$T/dead" --threads 1 --node-timeout "$TMO" --join "$DEAD" \
    --token-file "$T/token" 2>"$T/dead.err" || rc=$?
took=$(python3 -c "print($EPOCHREALTIME - $t0)")
[ "$rc" = 1 ] || fail "join to $DEAD: rc $rc"
grep -q "cannot join the coordinator at $DEAD within 1.0 s: connection refused" "$T/dead.err" || fail "join to $DEAD: $(tail -2 "$T/dead.err")"
python3 -c "import sys; sys.exit(not ($took < $TMO + 3))" || fail "join to $DEAD took ${took}s"
t0=$EPOCHREALTIME
rc=0; "$M6STORE" "$DEAD" "$T/token" "$T/c" 0 1 0 500 get x 0 2>"$T/sdead.err" || rc=$?
took=$(python3 -c "print($EPOCHREALTIME - $t0)")
[ "$rc" = 1 ] && grep -q "rendezvous store at $DEAD: cannot connect: Connection refused (tried for 0.[5-9]" "$T/sdead.err" \
    || fail "store at $DEAD: rc $rc $(cat "$T/sdead.err")"
python3 -c "import sys; sys.exit(not ($took < 2))" || fail "store at $DEAD took ${took}s"

# ---- the run: not disturbed by any of it
ctl watch "$RUN" >/dev/null || fail "the coordinator's run did not complete"
losses "$RUN" >"$T/during.csv"
cmp -s "$T/quiet.csv" "$T/during.csv" || fail "the run's losses differ from the quiet run's: $(diff "$T/quiet.csv" "$T/during.csv" | head -5)"

# ---- SIGTERM: left; a restarted coordinator: lost until they reconnect
kill -TERM "${M6D_PIDS[w3]}"; wait "${M6D_PIDS[w3]}" || fail "w3 exit after SIGTERM"
[ "$(node_field w3 state)" = left ] || fail "w3 after SIGTERM: $(node_field w3 state)"
kill -TERM "${M6D_PIDS[c]}"; wait "${M6D_PIDS[c]}" || fail "coordinator exit after SIGTERM"
[ "$(db "$T/c" "select state from nodes where hostname = 'w2'")" = live ] || fail "w2 not live in m6.db after the coordinator stopped"
# what a kill -9 mid-run leaves (a run's end clears it): w2 still listed
# as rank 1 of the run; the restarted coordinator must not keep that
sqlite3 -cmd '.timeout 5000' "$T/c/m6.db" "update nodes set run = $RUN, rank = 1 where hostname = 'w2'"
start_m6d c --role coordinator --listen "$ADDR" --token-file "$T/token"
wait_m6d "$T/c/m6d.sock" "$M6D_PID" "the restarted coordinator"
wait_node w2 live 10 >/dev/null
grep -q 'cause="coordinator restarted' "$T/m6d-c.log" || fail "restart: previous life's nodes not marked lost"
[ "$(db "$T/c" "select coalesce(run, 'none') || ' ' || coalesce(rank, 'none') from nodes where hostname = 'w2'")" = "none none" ] \
    || fail "restart: w2 keeps the previous life's assignment: $(db "$T/c" "select run, rank from nodes where hostname = 'w2'")"
[ "$(node_field w3 state)" = left ] || fail "w3 (left) changed at the restart: $(node_field w3 state)"
kill -0 "${M6D_PIDS[w2]}" || fail "w2 died"
kill -TERM "${M6D_PIDS[w2]}"; wait "${M6D_PIDS[w2]}" || fail "w2 exit"
kill -TERM "${M6D_PIDS[c]}"; wait "${M6D_PIDS[c]}" || fail "coordinator exit"
grep -q 'daemon.leak' "$T"/m6d-*.log && fail "handles left open at exit"
M6D_PIDS=()
echo "nodes: ok"
