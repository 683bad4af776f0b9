#!/usr/bin/env bash
# cluster_tls.sh PEER_PY — the control channel authenticated and private
# (daemon/cluster/tls.h, coordinator.h), on loopback:
#  (a) a proxy between a worker and the coordinator records every byte
#      both ways during the worker's join and a 2-rank run (its NodeJoin,
#      heartbeats, the RunAssign with the spec, its rendezvous store
#      traffic): neither the token nor any of the spec's text is in it;
#      and the recorded bytes from the worker, replayed to the coordinator
#      connection by connection, join nothing: each replay is refused in
#      its handshake (TLS 1.3 keys every session afresh) and logged;
#  (b) a forged coordinator — a listener speaking the old plaintext
#      protocol, which answers any join with a NodeJoinReply and a
#      RunAssign, or a real m6d holding another token — is refused by the
#      worker at once, with a log line saying why, and nothing it sent is
#      taken (no join, no assignment);
#  (c) a join with a stolen node id but without its node secret (none, or
#      a wrong one) is refused, and the live node keeps its place (live,
#      same row, same connection); the node's own restart rejoins with its
#      secret (a reconnect); the secret file is 32 bytes, mode 0600;
#  (d) a store write to another rank's key is refused, and a node cannot
#      open the store as a rank it does not hold;
#  (e) the channel is standard TLS 1.3: openssl s_client with the PSK
#      computed apart (Python's hmac, RFC 5869) gets in, with another
#      token's PSK it does not.
. "$(dirname "$0")/lib.sh"
: "${M6STORE:?set M6STORE to the m6store binary}"
PEER=${1:?usage: cluster_tls.sh nodes_peer.py}
TMO=2
M6D_ARGS="--node-timeout $TMO"
c_ctl() { "$M6CTL" --socket "$T/c/m6d.sock" "$@"; }

write_token "$T/token"
write_token "$T/token-other"
prepare_data "$T/data"
MARK=specmark$RANDOM$RANDOM
CKPT_EVERY=5 write_spec "$T/two.json" "$MARK" 12 6 \
    "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"

start_m6d c --role coordinator --listen 127.0.0.1:0 --token-file "$T/token"
SOCK=$T/c/m6d.sock
wait_listen c
ADDR=127.0.0.1:$PORT

# ---- (a) the proxy: every byte both ways, into one file per direction
# (cap.up.N and cap.down.N for the Nth connection)
/usr/bin/python3 - "$PORT" "$T/proxy.port" "$T/cap" <<'PY' >"$T/proxy.log" 2>&1 &
import socket, sys, threading
up, portfile, cap = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
lock = threading.Lock()
def pump(a, b, path):
    while True:
        try:
            d = a.recv(65536)
        except OSError:
            d = b""
        if not d:
            break
        with lock, open(path, "ab") as f:
            f.write(d)
        try:
            b.sendall(d)
        except OSError:
            break
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
open(portfile + ".tmp", "w").write(str(ls.getsockname()[1]))
import os; os.rename(portfile + ".tmp", portfile)
n = 0
while True:
    c, _ = ls.accept()
    u = socket.create_connection(("127.0.0.1", up))
    threading.Thread(target=pump, args=(c, u, "%s.up.%d" % (cap, n)), daemon=True).start()
    threading.Thread(target=pump, args=(u, c, "%s.down.%d" % (cap, n)), daemon=True).start()
    n += 1
PY
PROXY=$!
for _ in $(seq 1 100); do [ -e "$T/proxy.port" ] && break; nap 0.05; done
[ -e "$T/proxy.port" ] || fail "the proxy did not start"
PADDR=127.0.0.1:$(cat "$T/proxy.port")

RUN=$(ctl submit "$T/two.json")
start_m6d w1 --join "$PADDR" --token-file "$T/token" --node-name w1
W1=$M6D_PID
ctl watch "$RUN" >/dev/null || fail "the 2-rank run through the proxy did not complete: $(ctl status "$RUN")"
grep -q "cluster.rank_done run=$RUN rank=1" "$T/m6d-w1.log" || fail "rank 1 did not train through the proxy"
ctl events "$RUN" | grep -q 'nodes.assign .*hostname=w1 rank=1' || fail "no assignment of w1"
up=$(cat "$T"/cap.up.* | wc -c); down=$(cat "$T"/cap.down.* | wc -c)
log "(a) captured $up bytes worker->coordinator, $down bytes back, $(ls "$T"/cap.up.* | wc -l) connections"
[ "$up" -gt 1000 ] && [ "$down" -gt 1000 ] || fail "the proxy saw too little traffic: $up / $down bytes"
# the oracle: the token's bytes, the spec's name, and every string value
# and key of the spec file of at least 4 characters, none in clear
/usr/bin/python3 - "$T/token" "$T/two.json" "$MARK" "$T"/cap.up.* "$T"/cap.down.* <<'PY' || fail "(a) the capture holds clear text"
import json, sys
tok = open(sys.argv[1], "rb").read().rstrip(b"\n")
spec = json.load(open(sys.argv[2]))
needles = {"the token": tok, "the token's first half": tok[:len(tok) // 2],
           "the spec's name": sys.argv[3].encode()}
def walk(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if len(k) >= 4:
                needles["spec key " + k] = ('"%s"' % k).encode()
            walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
    elif isinstance(x, str) and len(x) >= 4:
        needles["spec value " + x] = x.encode()
walk(spec)
cap = b"".join(open(f, "rb").read() for f in sys.argv[4:])
bad = [w for w, n in needles.items() if n in cap]
if bad:
    sys.exit("in clear on the wire: " + ", ".join(bad))
print("(a) none of %d needles in %d captured bytes" % (len(needles), len(cap)))
PY

# ---- (a) the captured connections replayed, the Nth from 127.0.1.N (an
# address of its own: refusal lines are one per address per 10 s), all
# its bytes in one go: each is closed by the coordinator, refused in the
# TLS handshake and logged; nothing joins, the nodes are as they were
lines0=$(wc -l <"$T/m6d-c.log")
W1_ROW="$(node_field w1 id) $(node_field w1 state) $(node_field w1 address)"
n_nodes() { c_ctl nodes --json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
NODES0=$(n_nodes)
/usr/bin/python3 - "$PORT" "$T"/cap.up.* <<'PY' >"$T/replay.out" 2>&1 || fail "(a) replay: $(cat "$T/replay.out")"
import socket, sys, time
port = int(sys.argv[1])
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    s = socket.socket()
    s.settimeout(5)
    s.bind(("127.0.1.%d" % (int(path.rsplit(".", 1)[1]) + 1), 0))
    s.connect(("127.0.0.1", port))
    t0 = time.monotonic()
    try:
        s.sendall(data)
    except OSError:
        pass
    got = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
    except socket.timeout:
        sys.exit("%s: the coordinator held a replay open for 5 s" % path)
    except ConnectionResetError:
        pass
    s.close()
    print("%s: %d bytes replayed, %d back, closed after %.2f s"
          % (path.rsplit("/", 1)[1], len(data), len(got), time.monotonic() - t0))
PY
log "(a) replay: $(tr '\n' ';' <"$T/replay.out")"
n_rep=$(ls "$T"/cap.up.* | wc -l)
for _ in $(seq 1 30); do  # the log lines may trail the closes a little
    new=$(tail -n +"$((lines0 + 1))" "$T/m6d-c.log")
    n_ref=$(grep -Ec "cluster\.refused peer=127\.0\.1\.[0-9]+:[0-9]+ reason=\"TLS handshake failed: " <<<"$new" || true)
    [ "$n_ref" -ge "$n_rep" ] && break
    nap 0.1
done
grep -Eq "node\.(join|reconnect|replace) " <<<"$new" && fail "(a) a replayed capture joined: $(grep -E 'node\.' <<<"$new")"
[ "$n_ref" = "$n_rep" ] \
    || fail "(a) $n_ref of $n_rep replays refused in the handshake: $(grep -E '127\.0\.1\.' <<<"$new" | head -5)"
[ "$(node_field w1 id) $(node_field w1 state) $(node_field w1 address)" = "$W1_ROW" ] \
    || fail "(a) w1 changed under the replay: $(c_ctl nodes)"
[ "$(n_nodes)" = "$NODES0" ] \
    || fail "(a) the nodes changed under the replay: $(c_ctl nodes)"
log "(a) $n_rep replays refused, e.g. $(grep -m1 -o 'cluster.refused peer=127.0.1.*' <<<"$new")"

# ---- (c) a stolen node id (w1 still joined through the proxy)
[ -f "$T/w1/node-secret" ] || fail "w1 keeps no node secret"
[ "$(stat -c '%a %s' "$T/w1/node-secret")" = "600 32" ] || fail "node-secret: $(stat -c '%a %s' "$T/w1/node-secret")"
W1_ID=$(node_field w1 id)
W1_ADDR=$(node_field w1 address)
[ -n "$W1_ID" ] && [ "$(node_field w1 state)" = live ] || fail "w1 not live before the theft"
for how in none wrong; do
    rm -rf "$T/thief"; mkdir -p "$T/thief"
    cp "$T/w1/node-id" "$T/thief/node-id"
    [ "$how" = wrong ] && { head -c 32 /dev/urandom >"$T/thief/node-secret"; chmod 600 "$T/thief/node-secret"; }
    for name in w1 thief; do
        rc=0; timeout 10 "$M6D" --state-dir "$T/thief" --threads 1 --node-timeout "$TMO" --join "$ADDR" \
            --token-file "$T/token" --node-name "$name" 2>"$T/thief.err" || rc=$?
        [ "$rc" = 1 ] && grep -q "refused the join: this node id is registered with a node secret that this join did not present" "$T/thief.err" \
            || fail "(c) stolen id ($how secret, name $name): rc $rc $(tail -2 "$T/thief.err")"
        nap 0.3
        [ "$(node_field w1 state)" = live ] && [ "$(node_field w1 id)" = "$W1_ID" ] \
            && [ "$(node_field w1 address)" = "$W1_ADDR" ] \
            || fail "(c) w1 lost its place to a stolen id: $(c_ctl nodes)"
        [ -z "$(node_field thief state)" ] || fail "(c) the thief is in the nodes table"
    done
done
grep -Eq "cluster.refused peer=127\.0\.0\.1:[0-9]+ reason=\"join of node $W1_ID \(w1\) without its node secret\"" "$T/m6d-c.log" \
    || fail "(c) the stolen id is not logged"
grep -q "node.reconnect node=$W1_ID " "$T/m6d-c.log" && fail "(c) a thief's join counted as w1's reconnect"
kill -0 "$W1" || fail "(c) w1 died"
# w1 itself, restarted: rejoins with its secret
kill -TERM "$W1"; wait "$W1" || fail "w1 exit"
kill "$PROXY" 2>/dev/null; wait "$PROXY" 2>/dev/null || true
start_m6d w1 --join "$ADDR" --token-file "$T/token" --node-name w1
W1=$M6D_PID
wait_node w1 live 10 >/dev/null
grep -q "node.reconnect node=$W1_ID hostname=w1" "$T/m6d-c.log" || fail "(c) w1's restart is not a reconnect"
log "(c) a stolen id refused twice, w1 kept its place and rejoined with its secret"

# ---- (b) forged coordinators
PEER_DIR=$(dirname "$PEER") /usr/bin/python3 - "$T/forged.port" <<'PY' >"$T/forged.log" 2>&1 &
import os, socket, struct, sys
sys.path.insert(0, os.environ["PEER_DIR"])
from m6wire import field_bytes, field_varint
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
open(sys.argv[1] + ".tmp", "w").write(str(ls.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
def frame(b):
    return struct.pack(">I", len(b)) + b
# Response.node_join (21): node_id 1, heartbeat 100 ms, timeout 3000 ms;
# then Response.run_assign (27): run 1, a spec, rank 1 of 2, generation 1
join = field_bytes(21, field_varint(1, 1) + field_varint(2, 100) + field_varint(3, 3000))
spec = b'{"name": "forged", "data": {"train": "/etc"}}'
assign = field_bytes(27, field_varint(1, 1) + field_bytes(2, spec) + field_varint(3, 1)
                     + field_varint(4, 2) + field_varint(5, 1) + field_varint(6, 3000))
while True:
    c, _ = ls.accept()
    try:
        c.recv(65536)
        c.sendall(frame(join))
        for _ in range(20):
            c.recv(65536)
            c.sendall(frame(assign))
    except OSError:
        pass
    c.close()
PY
FORGED=$!
for _ in $(seq 1 100); do [ -e "$T/forged.port" ] && break; nap 0.05; done
[ -e "$T/forged.port" ] || fail "the forged coordinator did not start: $(cat "$T/forged.log")"
FADDR=127.0.0.1:$(cat "$T/forged.port")
t0=$EPOCHREALTIME
rc=0; timeout 10 "$M6D" --state-dir "$T/victim" --threads 1 --node-timeout "$TMO" --join "$FADDR" \
    --token-file "$T/token" --node-name victim 2>"$T/victim.err" || rc=$?
took=$(python3 -c "print(round($EPOCHREALTIME - $t0, 2))")
[ "$rc" = 1 ] || fail "(b) a worker took a plaintext coordinator: rc $rc $(tail -3 "$T/victim.err")"
grep -q "cluster.tls_refused coordinator=$FADDR err=\"TLS handshake failed: " "$T/victim.err" \
    || fail "(b) no cluster.tls_refused line: $(tail -3 "$T/victim.err")"
grep -Eq "cluster\.(joined|assign)" "$T/victim.err" && fail "(b) the worker took the forged coordinator's word"
python3 -c "import sys; sys.exit(not ($took < 3))" || fail "(b) refused after ${took}s, not at once"
kill "$FORGED" 2>/dev/null; wait "$FORGED" 2>/dev/null || true
# a real m6d coordinator that holds another token
start_m6d other --role coordinator --listen 127.0.0.1:0 --token-file "$T/token-other"
wait_listen other
OADDR=127.0.0.1:$PORT
rc=0; timeout 10 "$M6D" --state-dir "$T/victim2" --threads 1 --node-timeout "$TMO" --join "$OADDR" \
    --token-file "$T/token" --node-name victim2 2>"$T/victim2.err" || rc=$?
[ "$rc" = 1 ] && grep -q "cluster.tls_refused coordinator=$OADDR err=\"TLS handshake failed: " "$T/victim2.err" \
    || fail "(b) a coordinator with another token: rc $rc $(tail -3 "$T/victim2.err")"
log "(b) plaintext forger refused after ${took}s: $(grep -o 'cluster.tls_refused.*' "$T/victim.err" | head -1)"

# ---- (d) store keys owned by their writer: the coordinator's node is
# rank 0; the keys of rank 1 ("hash/1", Gloo's "run<id>/g<gen>/1") are
# not its to set, a group-wide key is; w1 holds no rank now
st() { "$M6STORE" "$ADDR" "$T/token" "$@"; }
st "$T/c" 0 "$RUN" 1 2000 set verdict ok 2>"$T/d0.err" || fail "(d) rank 0 cannot set its own key: $(cat "$T/d0.err")"
for key in hash/1 "run$RUN/g1/1" "run$RUN/g1/rank_1"; do
    rc=0; st "$T/c" 0 "$RUN" 1 2000 set "$key" forged 2>"$T/d1.err" || rc=$?
    [ "$rc" = 1 ] && grep -q "store key \"$key\" is rank 1's: rank 0 sets only its own keys" "$T/d1.err" \
        || fail "(d) rank 0 set rank 1's key $key: rc $rc $(cat "$T/d1.err")"
done
rc=0; st "$T/c" 0 "$RUN" 1 2000 get hash/1 0 >"$T/d1.out" 2>/dev/null || rc=$?
[ "$rc" != 0 ] || [ "$(cat "$T/d1.out")" != forged ] || fail "(d) rank 1's key holds the forged value"
for rank in 0 1; do
    rc=0; st "$T/w1" "$rank" "$RUN" 1 2000 set "hash/$rank" forged 2>"$T/d2.err" || rc=$?
    [ "$rc" = 1 ] && grep -q "refused the connection: the store takes the ranks of a run only" "$T/d2.err" \
        || fail "(d) w1 opened the store as rank $rank of a run it does not hold: rc $rc $(cat "$T/d2.err")"
done
grep -q 'reason="store set of another rank'"'"'s key"' "$T/m6d-c.log" || fail "(d) the refused set is not logged"
log "(d) rank 0 refused rank 1's keys; w1 refused ranks it does not hold"

# ---- (e) standard TLS 1.3 with the PSK of cluster.h: OpenSSL's own
# client, given the key computed apart (RFC 5869 with Python's hmac),
# completes the handshake on TLS_AES_128_GCM_SHA256 with an (EC)DHE
# exchange; with the key of another token it is refused
psk_of() {
    /usr/bin/python3 -c '
import hashlib, hmac, sys
tok = open(sys.argv[1], "rb").read().rstrip(b"\n")
prk = hmac.new(b"m6 cluster token", tok, hashlib.sha256).digest()
print(hmac.new(prk, b"m6 tls13 external psk v1\x01", hashlib.sha256).hexdigest())' "$1"
}
s_client() {
    (nap 1) | timeout 10 openssl s_client -connect "$ADDR" -tls1_3 -brief \
        -ciphersuites TLS_AES_128_GCM_SHA256 -psk_identity m6-cluster-psk-v1 -psk "$1" 2>&1 || true
}
s_client "$(psk_of "$T/token")" >"$T/sc.out"
grep -q "CONNECTION ESTABLISHED" "$T/sc.out" && grep -q "Protocol version: TLSv1.3" "$T/sc.out" \
    && grep -q "Ciphersuite: TLS_AES_128_GCM_SHA256" "$T/sc.out" && grep -q "Server Temp Key: X25519" "$T/sc.out" \
    || fail "(e) openssl s_client with the token's PSK: $(cat "$T/sc.out")"
s_client "$(psk_of "$T/token-other")" >"$T/sc2.out"
grep -q "CONNECTION ESTABLISHED" "$T/sc2.out" && fail "(e) openssl s_client with another token's PSK got in"
grep -q 'reason="TLS handshake failed: binder does not verify"' "$T/m6d-c.log" || fail "(e) the wrong PSK is not logged"
log "(e) openssl s_client: $(grep -E 'Protocol|Ciphersuite|Temp Key' "$T/sc.out" | tr '\n' ' ')"

# ---- the end
for n in other w1 c; do
    kill -TERM "${M6D_PIDS[$n]}"; wait "${M6D_PIDS[$n]}" || fail "$n exit after SIGTERM"
done
M6D_PIDS=()
echo "cluster_tls: ok"
