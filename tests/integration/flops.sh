#!/usr/bin/env bash
# flops.sh — the model FLOPs per token that three outputs report agree with
# each other and with a hand count: the dashboard's (/metrics
# m6_model_flops_per_second / m6_tokens_per_second, and m6_mfu_ratio
# against --metrics-peak-flops), `m6ctl plan SPEC --p2r --json`'s
# flops_per_token of both phases, and bench/cpu_train's flops_per_token
# (with its model_gflops / tokens_per_s). A dense model (all three) and a
# mixed MoE model (dashboard and plan; cpu_train has no MoE), where only
# k of an MoE block's E experts count.
. "$(dirname "$0")/lib.sh"
PROM="python3 $(dirname "$0")/prom.py"
[ -x "${CPU_TRAIN:-}" ] || fail "CPU_TRAIN (bench/cpu_train) not set"

# Hand counts, 6 N + 12 L C T with V 256, C 32, T 32:
#   LM head V C = 8192; a dense block 12 C^2 + 13 C = 12704;
#   an MoE block (E 4, k 2, H 48): attention and LayerNorms 4 C^2 + 8 C =
#   4352, gate E C + E = 132, k experts k (2 H C + H + C) = 6304 -> 10788
# dense, L 2: N = 8192 + 2 * 12704 = 33600;
#   6 N + 12 * 2 * 32 * 32 = 201600 + 24576 = 226176
# mixed, L 4, MoE every 2nd block: N = 8192 + 2 * 12704 + 2 * 10788 = 55176;
#   6 N + 12 * 4 * 32 * 32 = 331056 + 49152 = 380208
DENSE=226176 MIXED=380208
PEAK=1e12

prepare_data "$T/data"
write_spec "$T/dense.json" dense 400 200
spec_file "$T/mixed.json" mixed <<JSON
  "model": $(tiny_model 4 '"moe": {"num_experts": 4, "prototypes": 2, "every": 2, "expert_hidden": 48}'),
  "pseudo": {"share_groups": 2, "steps": 200},
  "train": {"steps": 400, "batch_size": 4, "eval_every": 100, "seed": 7},
  "checkpoint": {"every": 0}
JSON

# close A B WHAT: |A - B| <= 1e-9 |B|
close() {
    python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-9 * abs(b))" "$1" "$2" \
        || fail "$3: $1, want $2"
}

# m6ctl plan --p2r: both phases
for m in dense:$DENSE mixed:$MIXED; do
    name=${m%%:*} want=${m#*:}
    "$M6CTL" plan "$T/$name.json" --p2r --json >"$T/plan-$name.json" 2>"$T/plan.err" \
        || fail "plan --p2r $name: $(cat "$T/plan.err")"
    for ph in pseudo real; do
        got=$(python3 -c "import json,sys; print(repr(json.load(open(sys.argv[1]))[sys.argv[2]]['flops_per_token']))" \
              "$T/plan-$name.json" $ph) || fail "plan --p2r $name: no $ph.flops_per_token"
        close "$got" "$want" "plan --p2r $name $ph flops_per_token"
    done
done
log "plan --p2r: dense $DENSE, mixed $MIXED FLOPs/token"

# bench/cpu_train, the dense shape
"$CPU_TRAIN" --layers 2 --embd 32 --heads 2 --seq 32 --batch 4 --vocab 256 \
    --steps 2 --warmup 1 --rounds 1 --peak-n 64 --threads 1 >"$T/cpu_train.out" 2>&1 \
    || fail "cpu_train: $(tail -3 "$T/cpu_train.out")"
got=$(sed -n 's/^flops_per_token=//p' "$T/cpu_train.out")
[ -n "$got" ] || fail "cpu_train printed no flops_per_token: $(cat "$T/cpu_train.out")"
close "$got" "$DENSE" "cpu_train flops_per_token"
python3 - "$T/cpu_train.out" "$DENSE" <<'PY' || fail "cpu_train: model_gflops / tokens_per_s is not $DENSE FLOPs/token"
import re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("tokens_per_s=")][-1]
kv = dict(re.findall(r"(\w+)=(\S+)", line))
g, tps, fpt = float(kv["model_gflops"]), float(kv["tokens_per_s"]), float(sys.argv[2])
# model_gflops is printed to 0.01 and tokens_per_s to 1: allow their rounding
tol = 0.005 + 0.5 * fpt / 1e9 + 1e-6 * g
sys.exit(abs(g - fpt * tps / 1e9) > tol)
PY
log "cpu_train: $got FLOPs/token"

# the dashboard: a step of each run
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# each run held at its boundary after step 2 while /metrics is read and
# the stop sent: alive for both, however short its steps
M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s" --metrics-listen "127.0.0.1:$PORT" --metrics-peak-flops $PEAK
for m in dense:$DENSE mixed:$MIXED; do
    name=${m%%:*} want=${m#*:}
    hold_at_step 2 nowait
    R=$(ctl submit "$T/$name.json") || fail "submit $name"
    wait_held
    $PROM fetch "http://127.0.0.1:$PORT/metrics" >"$T/metrics-$name.txt" || fail "GET /metrics ($name)"
    ctl stop "$R" >/dev/null || fail "stop $name"
    release_boundary
    wait_state "$R" stopped 60
    get() { $PROM get "$T/metrics-$name.txt" "$1" "run=$R"; }
    fps=$(get m6_model_flops_per_second) tps=$(get m6_tokens_per_second) mfu=$(get m6_mfu_ratio)
    [ -n "$fps" ] && [ -n "$tps" ] && [ -n "$mfu" ] \
        || fail "$name: /metrics lacks FLOP/s ($fps), tokens/s ($tps) or MFU ($mfu)"
    close "$(python3 -c "print(repr($fps / $tps))")" "$want" "dashboard $name FLOP/s / tokens/s"
    close "$(python3 -c "print(repr($mfu * $PEAK / $tps))")" "$want" "dashboard $name MFU x peak / tokens/s"
    log "dashboard $name: $fps FLOP/s at $tps tokens/s, MFU $mfu"
done
stop_daemon
echo "PASS: flops"
