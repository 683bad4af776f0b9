#!/usr/bin/env bash
# cluster_flood.sh — unauthenticated peers cannot starve authenticated ones
# (daemon/cluster/coordinator.c, make_room_ and log_refusal_), on loopback:
#  - a 2-rank run (the coordinator and worker w1) trains throughout; its
#    step rate is measured over RATE_S seconds quiet, then while a client
#    at 127.0.0.2 keeps 1000 idle TCP connections open to the
#    coordinator's port (opening a new one for every one closed), then
#    quiet again: the run goes on stepping through the flood (a step rate
#    above 0; a ratio of rates is a figure of the machine's load as much
#    as of m6d, and a test two at a time on 2 cores saw 0.48); the ratio
#    itself is a measured figure (the flood_rate_ratio line;
#    bench/RESULTS.md), not a timed pass/fail;
#  - during that flood a worker w2 from 127.0.0.1 joins within 5 s, the
#    coordinator answers m6ctl, and its log grows by a few lines, not one
#    per connection;
#  - the same flood from 250 addresses (4 connections each: the limit in
#    all evicts, not the one per address): a worker w3 joins within 5 s,
#    and the log gets at most 33 refusal lines per 10 s;
#  - then clients keep starting TLS handshakes with a garbage ClientHello
#    for CHURN_S seconds, half of them at 127.0.0.3 and half from 250
#    addresses of 127.0.4.0/24 in turn: each is refused, and the log gets
#    at most one line per CLUSTER_REFUSAL_LOG_MS (10 s) for 127.0.0.3
#    (with a count), not one per handshake, and at most
#    CLUSTER_REFUSAL_LOG_SLOTS + 1 (33) lines per 10 s in all, however
#    many addresses; the step rate beside them is logged.
# Bounded: 1000 connections at a time, about 30 s. A shared machine makes rates
# noisy: the quiet rate is the mean of a window before and one after. The
# hostile clients run at nice 19: on a cluster they are other machines,
# here they share the run's cores, and what is measured is what the
# coordinator's handling of them costs the run (the CPU each side used in
# the window is logged).
# And a wildcard --listen is refused.
. "$(dirname "$0")/lib.sh"
RATE_S=3      # each step-rate window, seconds
HOLD_MAX=15   # the idle flood, seconds at most (it ends when told)
CHURN_S=5     # the garbage handshakes, seconds

write_token "$T/token"
# a wildcard --listen is refused before m6d touches its state: rank 0's
# collectives bind the --listen host, and no worker can reach 127.0.0.1
for w in 0.0.0.0:0 "[::]:0"; do
    rc=0
    "$M6D" --state-dir "$T/wild" --role coordinator --listen "$w" \
        --token-file "$T/token" 2>"$T/wild.err" || rc=$?
    [ "$rc" = 2 ] && grep -q "not a wildcard" "$T/wild.err" \
        || fail "--listen $w: rc $rc, $(cat "$T/wild.err")"
    [ ! -e "$T/wild" ] || fail "--listen $w was refused after m6d made its state dir"
done

prepare_data "$T/data"
start_daemon "$T/c" --role coordinator --listen 127.0.0.1:0 --token-file "$T/token" \
    --node-timeout 5
wait_listen c
ulimit -n 4096 2>/dev/null || true

# node_live NAME: the coordinator's nodes table has NAME live
node_live() {
    [ "$(node_field "$1" state 2>/dev/null || true)" = live ]
}
# steps_now: "STEP TIME" of the flood run, from the coordinator's runs table
steps_now() { echo "$(db "$T/c" "select step from runs where id=$RUN") $EPOCHREALTIME"; }
# cpu_s PID: the CPU seconds (user + system, all threads) PID has used
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# rate_since "STEP TIME": steps per second from then to now
rate_since() {
    local a
    a=$(steps_now)
    /usr/bin/python3 -c 'import sys; s0, t0, s1, t1 = map(float, sys.argv[1:5]); print("%.2f" % ((s1 - s0) / (t1 - t0)))' $1 $a
}

start_m6d w1 --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name w1 \
    --node-timeout 5
W1=$M6D_PID
wait_for "w1 live" 5 node_live w1
spec_file "$T/two.json" flood <<JSON
  "model": $(tiny_model),
  "pseudo": {"steps": 1000000},
  "train": {"steps": 1000000, "batch_size": 4, "eval_every": 1000000, "seed": 7},
  "checkpoint": {"every": 1000000, "keep": 1},
  "nodes": {"world_size": 2, "timeout": 5}
JSON
RUN=$(ctl submit "$T/two.json")
wait_step "$RUN" 20 20
a=$(steps_now); nap "$RATE_S"; quiet1=$(rate_since "$a")

# the idle flood
lines0=$(wc -l <"$T/m6d-c.log")
# flood.py PORT MARK HOLD STOP SRC: 1000 idle connections from SRC (an
# address, or A.B.C.* for A.B.C.1-250 in turn), each closed one reopened,
# until STOP exists or HOLD seconds passed
cat >"$T/flood.py" <<'PY'
import os, selectors, socket, sys, time
PORT, MARK, HOLD, STOP = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
SRC = sys.argv[5]
N = 1000
sel = selectors.DefaultSelector()
opened = closed = 0
def open_one():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.bind((SRC.replace("*", str(1 + opened % 250)), 0))
    try:
        s.connect(("127.0.0.1", PORT))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        return
    sel.register(s, selectors.EVENT_READ)
    opened += 1
for _ in range(N):
    open_one()
open(MARK, "w").close()
end = time.monotonic() + HOLD
while time.monotonic() < end and not os.path.exists(STOP):
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:  # closed by the coordinator: open another
            sel.unregister(s)
            s.close()
            closed += 1
            open_one()
print("flood: %d connections opened, %d closed by the coordinator, %d held at the end"
      % (opened, closed, len(sel.get_map())))
PY
# flood_then_join ADDRS OUT NAME: the idle flood from ADDRS (its summary
# in OUT, its pid in FLOOD), then worker NAME started through it (pid in
# WPID): live within 5 s (LIVE 1, else empty), after TOOK seconds
flood_then_join() {
    rm -f "$T/flooding" "$T/flood.stop"
    nice -n 19 /usr/bin/python3 "$T/flood.py" "$PORT" "$T/flooding" "$HOLD_MAX" "$T/flood.stop" "$1" \
        >"$2" 2>&1 &
    FLOOD=$!
    for _ in $(seq 1 200); do [ -e "$T/flooding" ] && break; nap 0.05; done
    [ -e "$T/flooding" ] || fail "the flood from $1 did not start"
    nap 1
    local t0=$EPOCHREALTIME
    start_m6d "$3" --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name "$3" \
        --node-timeout 5
    WPID=$M6D_PID
    LIVE=
    for _ in $(seq 1 100); do
        node_live "$3" && { LIVE=1; break; }
        nap 0.05
    done
    TOOK=$(/usr/bin/python3 -c "print(round($EPOCHREALTIME - $t0, 2))")
}

# a worker joins through the flood
flood_then_join 127.0.0.2 "$T/flood.out" w2
W2=$WPID live=$LIVE took=$TOOK
[ -n "$live" ] || { kill -9 "$W2"; fail "w2 did not join within 5 s of the flood (coordinator log: $(tail -3 "$T/m6d-c.log"))"; }
log "w2 joined in ${took} s beside 1000 hostile connections"
ctl list >/dev/null || fail "the coordinator does not answer m6ctl during the flood"
# the run's rate while the 1000 connections are held (w2's start is over)
c0=$(cpu_s "$DAEMON_PID"); f0=$(cpu_s "$FLOOD")
a=$(steps_now); nap "$RATE_S"; flooded=$(rate_since "$a")
c1=$(cpu_s "$DAEMON_PID"); f1=$(cpu_s "$FLOOD")
kill -0 "$FLOOD" 2>/dev/null || fail "the flood ended (after ${HOLD_MAX} s) before the rate was measured"
touch "$T/flood.stop"
wait "$FLOOD" || fail "the flood client failed: $(cat "$T/flood.out")"
log "$(cat "$T/flood.out")"
lines=$(( $(wc -l <"$T/m6d-c.log") - lines0 ))
refusals=$(tail -n +"$((lines0 + 1))" "$T/m6d-c.log" | grep -c 'cluster.refused' || true)
log "the coordinator logged $lines lines during the flood ($refusals cluster.refused)"
[ "$refusals" -le 10 ] || fail "$refusals cluster.refused lines in the flood from one address (want a few, with counts)"
a=$(steps_now); nap "$RATE_S"; quiet2=$(rate_since "$a")
log "steps/s of the 2-rank run: quiet $quiet1, 1000 connections held $flooded, quiet $quiet2 (a shared machine: noisy)"
log "in the ${RATE_S} s of the flood the coordinator (rank 0 and its loop) used $(echo "$c1 - $c0" | bc) s of CPU, the flood client $(echo "$f1 - $f0" | bc) s"
ratio=$(/usr/bin/python3 -c 'import sys; q1, f, q2 = map(float, sys.argv[1:]); q = (q1 + q2) / 2; print("%.3f" % (f / q if q > 0 else 0))' \
    "$quiet1" "$flooded" "$quiet2")
log "flood_rate_ratio=$ratio quiet1=$quiet1 flooded=$flooded quiet2=$quiet2"
/usr/bin/python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$flooded" \
    || fail "the run made no step in ${RATE_S} s of the flood (quiet: $quiet1/s, $quiet2/s)"

# garbage ClientHellos from 127.0.0.3 and from 127.0.4.1-250: every one
# refused, the log rate-limited per address and in all
lines0=$(wc -l <"$T/m6d-c.log")
a=$(steps_now)
nice -n 19 /usr/bin/python3 - "$PORT" "$CHURN_S" >"$T/churn.out" 2>&1 <<'PY' || fail "the handshake client failed: $(cat "$T/churn.out")"
import os, socket, sys, threading, time
PORT, SECS = int(sys.argv[1]), float(sys.argv[2])
# a TLS record of type handshake (22), TLS 1.0 framing, holding a
# ClientHello (1) whose body is random bytes
body = b"\x01\x00\x00\x3c" + os.urandom(60)
hello = b"\x16\x03\x01" + len(body).to_bytes(2, "big") + body
counts = {"sent": 0, "refused": 0}
lock = threading.Lock()
end = time.monotonic() + SECS
def churn(k):
    n = 0
    while time.monotonic() < end:
        s = socket.socket()
        s.settimeout(2)
        n += 1
        try:
            s.bind(("127.0.0.3", 0) if k < 4 else ("127.0.4.%d" % (1 + (n * 4 + k) % 250), 0))
            s.connect(("127.0.0.1", PORT))
            s.sendall(hello)
            while s.recv(4096):  # an alert at most, then the close
                pass
            ok = 1
        except (ConnectionResetError, BrokenPipeError):
            ok = 1
        except OSError:
            ok = 0
        finally:
            s.close()
        with lock:
            counts["sent"] += 1
            counts["refused"] += ok
th = [threading.Thread(target=churn, args=(k,)) for k in range(8)]
for t in th: t.start()
for t in th: t.join()
print("churn: %d garbage ClientHellos, %d closed by the coordinator" % (counts["sent"], counts["refused"]))
sys.exit(not (counts["sent"] >= 50 and counts["refused"] == counts["sent"]))
PY
churned=$(rate_since "$a")
log "$(cat "$T/churn.out"); steps/s beside them $churned"
new=$(tail -n +"$((lines0 + 1))" "$T/m6d-c.log")
mine=$(grep -c '127\.0\.0\.3' <<<"$new" || true)
log "the coordinator logged $(grep -c . <<<"$new" || true) lines during the handshakes, $mine naming 127.0.0.3: $(grep -m1 '127\.0\.0\.3' <<<"$new" | cut -c1-200)"
[ "$mine" -ge 1 ] || fail "no refusal logged for 127.0.0.3's handshakes"
[ "$mine" -le $(( CHURN_S * 1000 / 10000 + 1 )) ] \
    || fail "$mine log lines for 127.0.0.3 in ${CHURN_S} s (want one per 10 s, with a count)"
many=$(grep -c '127\.0\.4\.' <<<"$new" || true)
all=$(grep -c 'cluster.refused' <<<"$new" || true)
log "$many lines name an address of 127.0.4.0/24, $all cluster.refused lines in all"
[ "$all" -le $(( (CHURN_S * 1000 / 10000 + 1) * (32 + 1) )) ] \
    || fail "$all cluster.refused lines in ${CHURN_S} s from 251 addresses (want at most 33 per 10 s)"

# the idle flood again from 250 addresses of 127.0.5.0/24 (4 each, under
# the per-address limit: the coordinator's limit in all evicts the oldest
# pending peer): a worker w3 still joins within 5 s, and the log gets at
# most 33 refusal lines per 10 s in all
lines0=$(wc -l <"$T/m6d-c.log")
flood_then_join '127.0.5.*' "$T/flood2.out" w3
W3=$WPID live=$LIVE took=$TOOK
touch "$T/flood.stop"
wait "$FLOOD" || fail "the flood client failed: $(cat "$T/flood2.out")"
[ -n "$live" ] || { kill -9 "$W3"; fail "w3 did not join within 5 s of the flood from 250 addresses (coordinator log: $(tail -3 "$T/m6d-c.log"))"; }
new=$(tail -n +"$((lines0 + 1))" "$T/m6d-c.log")
all=$(grep -c 'cluster.refused' <<<"$new" || true)
log "w3 joined in ${took} s beside 1000 connections from 250 addresses; $(cat "$T/flood2.out"); $all cluster.refused lines"
[ "$all" -le $(( (HOLD_MAX * 1000 / 10000 + 1) * (32 + 1) )) ] \
    || fail "$all cluster.refused lines during the flood from 250 addresses (want at most 33 per 10 s)"

ctl stop "$RUN" >/dev/null || fail "stop refused"
kill -TERM "$W1" "$W2" "$W3"; wait "$W1" || true; wait "$W2" || true; wait "$W3" || true
stop_daemon
echo "cluster_flood: ok"
