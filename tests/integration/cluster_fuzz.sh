#!/usr/bin/env bash
# cluster_fuzz.sh PORT_FUZZ_PY — the coordinator's TCP port fuzzed from
# outside, black-box, on loopback (port_fuzz.py: mutated ClientHellos,
# frames and random bytes before TLS; mutated join and store frames inside
# TLS, through m6tls): for FUZZ_S seconds (default 10; longer by hand:
# FUZZ_S=600) beside a joined
# worker, m6d does not crash (its pid is checked after every batch), no
# connection before TLS is held past the handshake deadline, and after it
# the coordinator answers m6ctl, w1 is still live under the same id, and
# m6d stops cleanly on SIGTERM. The in-process fuzzer of the same frames
# is tests/fuzz/fuzz_cluster.c.
. "$(dirname "$0")/lib.sh"
: "${M6TLS:?set M6TLS to the m6tls binary}"
FUZZER=${1:?usage: cluster_fuzz.sh port_fuzz.py}
CORPUS=$(cd "$(dirname "$0")/../fuzz/corpus/cluster" && pwd)
FUZZ_S=${FUZZ_S:-10}
TMO=2
M6D_ARGS="--node-timeout $TMO"

write_token "$T/token"
start_m6d c --role coordinator --listen 127.0.0.1:0 --token-file "$T/token"
C=$M6D_PID
SOCK=$T/c/m6d.sock
wait_listen c
start_m6d w1 --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name w1
W1=$M6D_PID
wait_node w1 live 10 >/dev/null
W1_ID=$(node_field w1 id)
ulimit -n 4096 2>/dev/null || true

/usr/bin/python3 "$FUZZER" "$PORT" "$T/token" "$T/c" "$CORPUS" "$C" "$FUZZ_S" \
    >"$T/fuzz.out" 2>&1 || fail "port_fuzz: $(tail -5 "$T/fuzz.out")"
log "$(grep 'port_fuzz: [0-9]* inputs' "$T/fuzz.out")"
kill -0 "$C" || fail "the coordinator died"
ctl list >/dev/null || fail "the coordinator does not answer m6ctl after the fuzzing"
wait_node w1 live 10 >/dev/null
[ "$(node_field w1 id)" = "$W1_ID" ] || fail "w1 lost its id under the fuzzing: $(ctl nodes)"
kill -0 "$W1" || fail "w1 died"
log "the coordinator logged $(grep -c 'cluster.refused' "$T/m6d-c.log" || true) refusal lines"
for n in w1 c; do
    kill -TERM "${M6D_PIDS[$n]}"; wait "${M6D_PIDS[$n]}" || fail "$n exit after SIGTERM"
done
M6D_PIDS=()
echo "cluster_fuzz: ok"
