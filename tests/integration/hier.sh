#!/usr/bin/env bash
# hier.sh — the hierarchical gradient all-reduce through m6d: world 4 over
# a coordinator and a worker with --devices 2 each (ranks 0-1 and 2-3),
# trained three ways, with the same global batch:
#   one rank   a single m6d of one device (the reference);
#   flat       M6_DP_ALLREDUCE=flat on the coordinator: Gloo over the 4
#              ranks (its log says mode=flat);
#   hier       unset (the rule): two ranks per node, so each node sums
#              its ranks in shared memory, the two leaders over Gloo, then
#              back (mode=hier on rank 0 and on the worker's leader);
#              again with M6_DP_ALLREDUCE=hier: the same bits (one fixed
#              sum order, (a+b)+(c+d)).
# flat and hier each within 6e-4 nats of one rank's losses (devices.sh's
# tolerance: four quarter-batch gradients summed in another order than
# one batch, rounding carried by AdamW; a sum that dropped or doubled a
# rank's gradient moves the loss by ~1e-2 a step); hier within 1e-5 nats
# of flat: they add the same four terms in another order (Gloo's ring
# starts each chunk on another rank, hier is (a+b)+(c+d)), so float
# rounding alone separates them (measured 6e-7 over these 10 steps), not
# always to the same bits.
. "$(dirname "$0")/lib.sh"
TMO=5
M6D_ARGS="--node-timeout $TMO"
STEPS=10
PSEUDO=4

prepare_data "$T/data"
write_token "$T/token"
write_spec "$T/one.json" one $STEPS $PSEUDO
write_spec "$T/w4.json" w4 $STEPS $PSEUDO \
    "\"nodes\": {\"world_size\": 4, \"timeout\": $TMO}"
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "single-rank run"
N=$(wc -l <"$T/one.csv" | awk '{print $1 - 1}')

# node_live HOSTNAME: the node is live at the coordinator on $SOCK
node_live() {
    [ "$(ctl nodes --json | jqr 'map(select(.hostname == $h and .state == "live")) | length' \
        --arg h "$1")" -gt 0 ]
}

# run4 NAME MODE: a coordinator (M6_DP_ALLREDUCE=MODE; "" unset) and a
# worker of 2 devices each train w4.json; its losses in $T/NAME.csv
run4() {
    local name=$1 mode=$2
    if [ -n "$mode" ]; then
        M6_DP_ALLREDUCE=$mode start_m6d "c$name" --role coordinator --listen 127.0.0.1:0 \
            --token-file "$T/token" --devices 2
    else
        start_m6d "c$name" --role coordinator --listen 127.0.0.1:0 \
            --token-file "$T/token" --devices 2
    fi
    wait_listen "c$name"
    SOCK=$T/c$name/m6d.sock
    start_m6d "w$name" --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name "w$name" --devices 2
    wait_for "worker w$name to be live" 20 node_live "w$name"
    local r
    r=$(ctl submit "$T/w4.json")
    ctl watch "$r" >/dev/null || fail "$name: the world-4 run did not complete: $(ctl status "$r")"
    losses "$r" >"$T/$name.csv"
    kill -TERM "${M6D_PIDS[w$name]}" "${M6D_PIDS[c$name]}"
    wait "${M6D_PIDS[c$name]}" || fail "$name: coordinator exit"
    wait "${M6D_PIDS[w$name]}" || fail "$name: worker exit"
    unset "M6D_PIDS[c$name]" "M6D_PIDS[w$name]"
}

# close A B WHAT [TOL]: A's train losses within TOL (6e-4) nats of B's
close() {
    losses_close "$T/$1.csv" "$T/$2.csv" "$N" "${4:-6e-4}" >"$T/close.out" 2>&1 \
        || fail "$3: $(tail -3 "$T/close.out")"
    log "$3: $(cat "$T/close.out")"
}

run4 flat flat
grep -q "cluster.allreduce run=[0-9]* rank=0 mode=flat nodes=2 max_local_ranks=2" "$T/m6d-cflat.log" \
    || fail "flat: rank 0 did not sum flat: $(grep cluster.allreduce "$T/m6d-cflat.log")"
run4 auto ""
for f in cauto:0 wauto:2; do
    grep -q "cluster.allreduce run=[0-9]* rank=${f#*:} mode=hier nodes=2 max_local_ranks=2" "$T/m6d-${f%:*}.log" \
        || fail "auto: rank ${f#*:} did not sum hierarchically: $(grep cluster.allreduce "$T/m6d-${f%:*}.log")"
done
run4 hier hier
close flat one "flat, world 4 vs one rank"
close auto one "hier, world 4 vs one rank"
close auto flat "hier vs flat, world 4" 1e-5
cmp -s "$T/auto.csv" "$T/hier.csv" \
    || fail "the rule's hier and M6_DP_ALLREDUCE=hier differ: $(diff "$T/auto.csv" "$T/hier.csv" | head -4)"
cmp -s "$T/auto.csv" "$T/flat.csv" && log "note: flat and hier gave the same bits"
# a bad value is refused by name (the run waits, saying why)
M6_DP_ALLREDUCE=ring start_m6d cbad --role coordinator --listen 127.0.0.1:0 --token-file "$T/token" --devices 2
wait_listen cbad
SOCK=$T/cbad/m6d.sock
r=$(ctl submit "$T/w4.json")
start_m6d wbad --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name wbad --devices 2
bad_named() { ctl events "$r" | has 'M6_DP_ALLREDUCE=ring: expected flat, hier or auto'; }
wait_for "the bad M6_DP_ALLREDUCE to be named in run $r's events" 30 bad_named
echo "ok"
