#!/usr/bin/env bash
# cluster_flood.sh — unauthenticated peers cannot starve authenticated ones
# (daemon/cluster/coordinator.c, make_room_ and log_refusal_): a client at
# 127.0.0.2 keeps 1000 idle TCP connections open to the coordinator's port,
# opening a new one for every one closed, for 12 s; meanwhile a worker
# from 127.0.0.1 joins within 5 s, the coordinator answers m6ctl, and its
# log grows by a few lines, not one per connection. Bounded: 1000
# connections, 12 s. And a wildcard --listen is refused.
. "$(dirname "$0")/lib.sh"

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

start_daemon "$T/c" --role coordinator --listen 127.0.0.1:0 --token-file "$T/token" \
    --node-timeout 5
wait_listen c
ulimit -n 4096 2>/dev/null || true

lines0=$(wc -l <"$T/m6d-c.log")
/usr/bin/python3 - "$PORT" "$T/flooding" >"$T/flood.out" 2>&1 <<'PY' &
import os, selectors, socket, sys, time
PORT, MARK = int(sys.argv[1]), sys.argv[2]
N, HOLD = 1000, 12.0
sel = selectors.DefaultSelector()
opened = closed = 0
def open_one():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.bind(("127.0.0.2", 0))
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
while time.monotonic() < end:
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
FLOOD=$!
for _ in $(seq 1 200); do [ -e "$T/flooding" ] && break; sleep 0.05; done
[ -e "$T/flooding" ] || fail "the flood did not start"
sleep 1

# a worker joins through the flood
t0=$EPOCHREALTIME
start_m6d w1 --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name w1 \
    --node-timeout 5
W1=$M6D_PID
live=
for _ in $(seq 1 100); do
    live=$("$M6CTL" --socket "$T/c/m6d.sock" nodes --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
print(any(n["hostname"] == "w1" and n["state"] == "live" for n in json.load(sys.stdin)))' || true)
    [ "$live" = True ] && break
    sleep 0.05
done
took=$(/usr/bin/python3 -c "print(round($EPOCHREALTIME - $t0, 2))")
[ "$live" = True ] || { kill -9 "$W1"; fail "w1 did not join within 5 s of the flood (coordinator log: $(tail -3 "$T/m6d-c.log"))"; }
log "w1 joined in ${took} s beside 1000 hostile connections"
ctl list >/dev/null || fail "the coordinator does not answer m6ctl during the flood"
wait "$FLOOD" || fail "the flood client failed: $(cat "$T/flood.out")"
log "$(cat "$T/flood.out")"
lines=$(( $(wc -l <"$T/m6d-c.log") - lines0 ))
refusals=$(tail -n +"$((lines0 + 1))" "$T/m6d-c.log" | grep -c 'cluster.refused' || true)
log "the coordinator logged $lines lines during the flood ($refusals cluster.refused)"
[ "$refusals" -le 10 ] || fail "$refusals cluster.refused lines in 12 s of flood from one address (want a few, with counts)"
kill -TERM "$W1"; wait "$W1" || true
stop_daemon
echo "cluster_flood: ok"
