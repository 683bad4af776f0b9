#!/usr/bin/env bash
# masters.sh — optimizer.master bf16 through m6d: a run killed -9 past the
# delink resumes from its checkpoint to the losses of an uninterrupted run
# digit for digit; its checkpoints hold BF16 weights and say master bf16;
# m6ctl export reads them; a spec asking for bf16 masters on the cuda
# backend with the speculative offloaded update is refused at submit
# naming the keys.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
export M6_TEST_HOLD_BOUNDARY=$HOLD_FILE
N=40
CKPT_EVERY=7 write_spec "$T/ref.json" ref $N 12 \
    '"optimizer": {"master": "bf16"}, "device": {"threads": 1}'

# 1. the reference: uninterrupted
reference_losses "$T/ref" "$T/ref.json" "$T/ref.csv"
[ "$(wc -l <"$T/ref.csv")" = $((N + 1)) ] || fail "reference rows: $(wc -l <"$T/ref.csv")"

# 2. kill -9 past the delink: resumed from the newest checkpoint, the same
#    losses
start_daemon "$T/k9"
hold_at_step 25 nowait
R=$(ctl submit "$T/ref.json")
wait_held
kill9_daemon
release_boundary
resume_after_kill9 "$T/k9" "$R" "$N" "$T/ref.csv" "bf16 masters"
log "kill -9 at step $K (checkpoint $C): same losses"

# 3. the checkpoint: BF16 weights, master bf16 in meta.json, fp32 state
D=$(ls -d "$T/k9/runs/$R/checkpoints/"*/ | tail -1)
python3 - "$D" <<'PY' || fail "checkpoint files"
import json, struct, sys
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
assert meta.get("master") == "bf16", meta
for f, want in (("model", "BF16"), ("optimizer", "F32")):
    b = open(d + "/%s.safetensors" % f, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    dt = {v["dtype"] for v in h.values()}
    assert dt == {want}, (f, dt)
    if want == "BF16":  # 2 bytes an element
        for k, v in h.items():
            a, e = v["data_offsets"]
            n_el = 1
            for s in v["shape"]:
                n_el *= s
            assert e - a == 2 * n_el, (k, v)
PY
ctl export "$R" --format safetensors --out "$T/exp" >/dev/null 2>"$T/exp.err" \
    || fail "export of a bf16 run: $(cat "$T/exp.err")"

# 4. refused at submit by name: bf16 masters on the cuda backend with
# offload.speculative on (the speculative update's second buffers are
# fp32 masters')
write_spec "$T/off.json" off 10 0 \
    '"optimizer": {"master": "bf16"}, "device": {"backend": "cuda", "memory_budget": "1GiB"}, "offload": {"speculative": "on"}'
rc=0; ctl submit "$T/off.json" >/dev/null 2>"$T/off.err" || rc=$?
[ "$rc" != 0 ] &&
    grep -q 'optimizer.master "bf16" on device.backend "cuda" with offload.speculative "on"' "$T/off.err" \
    || fail "bf16 on cuda: rc $rc: $(cat "$T/off.err")"
stop_daemon
echo "PASS"
