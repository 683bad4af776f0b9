# netns.sh — two hosts in network namespaces for the many-node tests
# (sourced after lib.sh): namespaces $NC (coordinator) and $NW (worker)
# joined by a veth pair $VC/$VW with 192.0.2.1 and 192.0.2.2/24 (TEST-NET-1,
# addresses that exist only inside the two namespaces), made here and
# removed at exit together with the processes $CPID and $WPID. Skips (77)
# where namespaces cannot be made (no root, no iproute2). PREFIX names the
# namespaces and links of one test (unique per process).
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
NC=${PREFIX}c-$$ NW=${PREFIX}w-$$ VC=${PREFIX}vc$$ VW=${PREFIX}vw$$
CPID= WPID=
netns_cleanup_() {
    for p in $CPID $WPID; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$NC" 2>/dev/null || true
    ip netns del "$NW" 2>/dev/null || true
    cleanup_
}
trap netns_cleanup_ EXIT
if ! ip netns add "$NC" 2>"$T/netns.err"; then
    echo "SKIP: cannot make a network namespace: $(cat "$T/netns.err")"
    exit 77
fi
ip netns add "$NW"
ip link add "$VC" type veth peer name "$VW"
ip link set "$VC" netns "$NC"
ip link set "$VW" netns "$NW"
ip -n "$NC" addr add 192.0.2.1/24 dev "$VC"
ip -n "$NW" addr add 192.0.2.2/24 dev "$VW"
for ns in "$NC" "$NW"; do ip -n "$ns" link set lo up; done
ip -n "$NC" link set "$VC" up
ip -n "$NW" link set "$VW" up
