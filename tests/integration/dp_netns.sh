#!/usr/bin/env bash
# dp_netns.sh — one run across two hosts in network namespaces (issue 14,
# the wiring): the coordinator (rank 0) in one namespace, a worker (rank 1)
# in another, joined by a veth pair with addresses that exist only inside
# the two namespaces (192.0.2.0/24, TEST-NET-1), made and removed here.
# The 2-rank run trains across the veth (Gloo on 192.0.2.1 and 192.0.2.2,
# read from the namespaces' sockets: no wildcard, no 127.0.0.1);
# cutting the worker's link pauses it within nodes.timeout with an event
# naming the node, and no process hangs; restoring the link and `m6ctl
# resume` finish the run with the single node's losses (to the tolerance
# of dp_nodes.sh, for the same reason: float rounding of the gradient sum).
# Skips (77) where namespaces cannot be made (no root, no iproute2).
# NETNS_EP=1 (ep_netns.sh): the same with expert parallelism, P = 2 over
# the two hosts (ep_spec's MoE model: tokens cross the veth by all-to-all).
. "$(dirname "$0")/lib.sh"
TMO=2
PREFIX=m6d
. "$(dirname "$0")/netns.sh"

prepare_data "$T/data"
write_token "$T/token"
if [ "${NETNS_EP:-0}" = 1 ]; then
    STEPS=16
    ep_spec "$T/one.json" one
    ep_spec "$T/two.json" two "\"world_size\": 2, \"expert_parallel\": 2, \"timeout\": $TMO"
else
    STEPS=30
    CKPT_EVERY=5 write_spec "$T/one.json" one $STEPS 10
    CKPT_EVERY=5 write_spec "$T/two.json" two $STEPS 10 \
        "\"nodes\": {\"world_size\": 2, \"timeout\": $TMO}"
fi
M6D_ARGS="--node-timeout $TMO"
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE M6_TEST_STEP_DELAY_MS=60 M6D_PREFIX="ip netns exec $NC" start_m6d c --role coordinator \
    --listen 192.0.2.1:7070 --token-file "$T/token"
CPID=$M6D_PID
SOCK=$T/c/m6d.sock  # a Unix socket: any namespace
wait_m6d "$SOCK" "$CPID" "the coordinator"
M6D_PREFIX="ip netns exec $NW" start_m6d w --join 192.0.2.1:7070 --token-file "$T/token" \
    --node-name netw
WPID=$M6D_PID

# the single-node reference, on the coordinator itself (world size 1)
R1=$(ctl submit "$T/one.json")
ctl watch "$R1" >/dev/null || fail "the single-node run did not complete"
# the collectives bind the cluster addresses. Gloo's listeners live only
# while a group forms (this run forms two, before and after its delink),
# so the proof has three parts: each rank logs the address its group
# binds (cluster.group local=); while rank 0 is held at its boundary
# after step 13 (the worker waiting in the step's all-reduce), each side
# holds a Gloo connection between 192.0.2.2 and a Gloo port of 192.0.2.1
# (read from both namespaces' sockets); and a poller in each namespace
# lists m6d's listening TCP sockets until then: whatever it sees (it can
# miss a short-lived listener on a loaded machine) is on the namespace's
# veth address, never a wildcard nor 127.0.0.1 (unreachable for the
# remote peer).
POLLERS=
for ns in "$NC" "$NW"; do
    ip netns exec "$ns" bash -c 'while [ ! -e "$1" ]; do ss -Htlnp; done' sh "$T/ss.stop" |
        awk '/m6d/ {print $4}' >"$T/listen-$ns" &
    POLLERS="$POLLERS $!"
done
hold_at_step 13 nowait  # mid-run for the cut, whatever the speed of a step
RUN=$(ctl submit "$T/two.json")
wait_held
touch "$T/ss.stop"
ip netns exec "$NW" ss -Htnp state established | awk '/m6d/ {print $3, $4}' >"$T/conn-w"
ip netns exec "$NC" ss -Htnp state established | awk '/m6d/ {print $4, $3}' >"$T/conn-c"
# cut the worker's link while rank 0 holds: the run pauses within the
# timeout once rank 0 goes on into the collective the worker cannot reach
ip -n "$NW" link set "$VW" down
t0=$EPOCHREALTIME
release_boundary
wait_paused_within "$RUN" "$t0" $((TMO + 2)) "the cut"
wait_event "$RUN" 'nodes.rank_lost +node=[0-9]+ hostname=netw rank=1'
log "paused ${TOOK}s after the cut: $(field "$RUN" error | cut -c1-160)"
kill -0 "$CPID" || fail "the coordinator died"
kill -0 "$WPID" || fail "the worker died"
timeout 5 "$M6CTL" --socket "$T/w/m6d.sock" list >/dev/null || fail "the worker's control socket hangs"

# shellcheck disable=SC2086
wait $POLLERS
sort -u -o "$T/listen-$NC" "$T/listen-$NC"; sort -u -o "$T/listen-$NW" "$T/listen-$NW"
log "m6d listened on: coordinator $(tr '\n' ' ' <"$T/listen-$NC")| worker $(tr '\n' ' ' <"$T/listen-$NW")"
! grep -vE '^192\.0\.2\.1:[0-9]+$' "$T/listen-$NC" | grep -q . \
    || fail "the coordinator listened beyond 192.0.2.1: $(cat "$T/listen-$NC")"
! grep -vE '^192\.0\.2\.2:[0-9]+$' "$T/listen-$NW" | grep -q . \
    || fail "the worker listened beyond 192.0.2.2: $(cat "$T/listen-$NW")"
for side in w c; do
    # as (worker end, coordinator end); the coordinator's end is not its
    # cluster port: a Gloo connection, whichever side opened it
    grep -E '^192\.0\.2\.2:[0-9]+ 192\.0\.2\.1:[0-9]+$' "$T/conn-$side" | grep -qv ':7070$' \
        || fail "no Gloo connection between 192.0.2.2 and 192.0.2.1 seen from side $side: $(cat "$T/conn-$side")"
done
grep -qE "cluster.group run=$RUN .*rank=0 world_size=2 local=192\.0\.2\.1$" "$T/m6d-c.log" \
    || fail "rank 0 did not log binding 192.0.2.1: $(grep cluster.group "$T/m6d-c.log")"
grep -qE "cluster.group run=$RUN .*rank=1 world_size=2 local=192\.0\.2\.2$" "$T/m6d-w.log" \
    || fail "rank 1 did not log binding 192.0.2.2: $(grep cluster.group "$T/m6d-w.log")"
grep -q "cluster.rank run=$RUN rank=1 world_size=2" "$T/m6d-w.log" || fail "netw is not rank 1"
ctl events "$RUN" | has -E 'nodes.assign +node=[0-9]+ hostname=netw rank=1' || fail "no assignment of netw"

grep -q "cluster.assign coordinator=192.0.2.1:7070 run=$RUN rank=1 .* local=192.0.2.2" "$T/m6d-w.log" \
    || fail "the worker did not log binding 192.0.2.2: $(grep cluster.assign "$T/m6d-w.log")"

# restore the link, resume: the run completes with the single node's losses
ip -n "$NW" link set "$VW" up
for _ in $(seq 1 200); do
    [ "$(db "$T/c" "select state from nodes where hostname='netw'")" = live ] && break
    nap 0.05
done
[ "$(db "$T/c" "select state from nodes where hostname='netw'")" = live ] || fail "netw not back"
ctl resume "$RUN" >/dev/null || fail "resume refused"
ctl watch "$RUN" >/dev/null || fail "the resumed run did not complete: $(ctl status "$RUN")"
losses "$R1" >"$T/one.csv"
losses "$RUN" >"$T/two.csv"
python3 - "$T/two.csv" "$T/one.csv" "$STEPS" <<'PY' || fail "losses differ from the single node's"
import csv, sys
a = list(csv.reader(open(sys.argv[1])))
b = list(csv.reader(open(sys.argv[2])))
h = a[0]
assert a[0] == b[0] and len(a) == len(b) == int(sys.argv[3]) + 1, (len(a), len(b))
worst = 0.0
for ra, rb in zip(a[1:], b[1:]):
    assert ra[:2] == rb[:2], (ra, rb)
    for c in (h.index("train_loss"), h.index("val_loss")):
        if ra[c] == rb[c] == "":
            continue
        d = abs(float(ra[c]) - float(rb[c])) / abs(float(rb[c]))
        worst = max(worst, d)
        assert d <= 1e-4, (ra[0], h[c], ra[c], rb[c])
print(f"# worst relative difference {worst:.3g} over {len(a) - 1} steps")
PY
kill -TERM "$WPID"; timeout 20 tail --pid="$WPID" -f /dev/null || fail "worker hangs at SIGTERM"
WPID=
kill -TERM "$CPID"; timeout 20 tail --pid="$CPID" -f /dev/null || fail "coordinator hangs at SIGTERM"
CPID=
echo "dp_netns${NETNS_EP:+ (expert parallel)}: ok"
