#!/usr/bin/env bash
# nodes_netns.sh — two hosts in network namespaces (issue 14, part B): a
# coordinator in one namespace, a worker in another, joined by a veth pair
# with addresses that exist only inside the two namespaces (192.0.2.0/24,
# TEST-NET-1); the test makes them and removes them. The worker joins over
# the veth; cutting its link (link down inside its namespace) makes it lost
# within the heartbeat timeout, with an event naming it; no process hangs;
# restoring the link brings it back as a reconnect of the same node.
# Skips (77) where namespaces cannot be made (no root, no iproute2).
. "$(dirname "$0")/lib.sh"
TMO=1
PREFIX=m6
. "$(dirname "$0")/netns.sh"

write_token "$T/token"
M6D_ARGS="--node-timeout $TMO"
M6D_PREFIX="ip netns exec $NC" start_m6d c --role coordinator --listen 192.0.2.1:7070 \
    --token-file "$T/token"
CPID=$M6D_PID
c_ctl() { "$M6CTL" --socket "$T/c/m6d.sock" "$@"; }  # a Unix socket: any namespace
wait_m6d "$T/c/m6d.sock" "$CPID" "the coordinator"
# the coordinator's address exists in the namespaces only
tcp_probe='import socket, sys; socket.create_connection(("192.0.2.1", 7070), timeout=1)'
! python3 -c "$tcp_probe" 2>/dev/null || fail "192.0.2.1:7070 answers outside the namespaces"
ip netns exec "$NW" python3 -c "$tcp_probe" || fail "no route from the worker's namespace to 192.0.2.1:7070"
M6D_PREFIX="ip netns exec $NW" start_m6d w --join 192.0.2.1:7070 --token-file "$T/token" \
    --node-name netw
WPID=$M6D_PID
wait_node netw live 10 >/dev/null
c_ctl nodes --json | has '"address": "192.0.2.2:' || fail "netw did not join from 192.0.2.2"

# cut the worker's link: no heartbeat arrives, lost within the timeout
ip -n "$NW" link set "$VW" down
took=$(wait_node netw lost $((TMO + 2)))
log "netw lost ${took}s after its link went down (timeout ${TMO}s)"
db "$T/c" "select detail from events where kind = 'node.lost'" | has 'hostname=netw .*no heartbeat for' \
    || fail "no node.lost event naming netw: $(db "$T/c" 'select kind, detail from events')"
kill -0 "$CPID" || fail "the coordinator died"
kill -0 "$WPID" || fail "the worker died"
timeout 5 "$M6CTL" --socket "$T/w/m6d.sock" list >/dev/null || fail "the worker's control socket hangs"
# restore it: the worker rejoins as the same node
ip -n "$NW" link set "$VW" up
wait_node netw live 10 >/dev/null
grep -q 'node.reconnect node=[0-9]* hostname=netw peer=192.0.2.2' "$T/m6d-c.log" || fail "netw back, but not as a reconnect"

kill -TERM "$WPID"; timeout 20 tail --pid="$WPID" -f /dev/null || fail "worker hangs at SIGTERM"
WPID=
[ "$(node_field netw state)" = left ] || fail "netw after SIGTERM: $(node_field netw state)"
kill -TERM "$CPID"; timeout 20 tail --pid="$CPID" -f /dev/null || fail "coordinator hangs at SIGTERM"
CPID=
echo "nodes_netns: ok"
