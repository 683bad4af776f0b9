#!/usr/bin/env bash
# import.sh — m6ctl import llmc and init.from: llm.c checkpoints written by
# the independent PyTorch model (hf_reference.py write-llmc, random weights;
# version 3 fp32 and 5 bf16); import -> export --format llmc -> import gives
# the same tensors bitwise; a run with init.from has as its first loss the
# PyTorch model's loss for the same weights and batch; bad files and shape
# mismatches are refused naming what is wrong. Needs /usr/bin/python3 with
# torch.
. "$(dirname "$0")/../integration/lib.sh"
: "${HF_REF:?}"
PY=/usr/bin/python3
$PY -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' ||
    { echo "SKIP: /usr/bin/python3 has no torch"; exit 77; }

# V L NH C T
$PY "$HF_REF" write-llmc "$T/a3.bin" 3 1 256 2 2 32 16 || fail "write-llmc 3"
$PY "$HF_REF" write-llmc "$T/a5.bin" 5 2 256 2 2 32 16 || fail "write-llmc 5"
# no daemon needed
"$M6CTL" import llmc "$T/a3.bin" --out "$T/d3" >"$T/out" || fail "import: $(cat "$T/out")"
grep -q "V 256, T 16, L 2, NH 2, C 32" "$T/out" || fail "import message: $(cat "$T/out")"
"$M6CTL" export "$T/d3" --format llmc --out "$T/b3.bin" >/dev/null || fail "export llmc"
cmp "$T/a3.bin" "$T/b3.bin" || fail "fp32 llm.c file changed through import and export"
rc=0; "$M6CTL" export "$T/d3" --step 3 --format llmc --out "$T/x.bin" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "step names a checkpoint of a RUN" "$T/err" || fail "--step with a DIR: $rc $(cat "$T/err")"
rc=0; "$M6CTL" export "$T/nosuch/" --out "$T/x" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "nosuch/: No such file" "$T/err" && [ ! -e "$T/x" ] || fail "export of a missing DIR: $rc $(cat "$T/err")"
"$M6CTL" import llmc "$T/b3.bin" --out "$T/d3b" >/dev/null || fail "import again"
cmp "$T/d3/model.safetensors" "$T/d3b/model.safetensors" || fail "import -> export -> import differs"
# bf16: widened exactly; the fp32 file written back holds the same values
"$M6CTL" import llmc "$T/a5.bin" --out "$T/d5" >/dev/null || fail "import bf16"
"$M6CTL" export "$T/d5" --format llmc --out "$T/b5.bin" >/dev/null || fail "export bf16 as llmc"
"$M6CTL" import llmc "$T/b5.bin" --out "$T/d5b" >/dev/null || fail "import bf16 again"
cmp "$T/d5/model.safetensors" "$T/d5b/model.safetensors" || fail "bf16 round trip differs"
$PY - "$T/a5.bin" "$T/b5.bin" "$T/d5/model.safetensors" <<'PY' || fail "bf16 values"
import os, sys; sys.path.insert(0, os.path.dirname(os.environ["HF_REF"]))
from hf_reference import read_llmc_as_hf, read_safetensors
import torch
a, _ = read_llmc_as_hf(sys.argv[1]); b, _ = read_llmc_as_hf(sys.argv[2])
assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
m, _ = read_safetensors(sys.argv[3])
# m6's names and (out, in) weights against llm.c's, by the HF layout
assert torch.equal(m["wte"], a["transformer.wte.weight"])
assert torch.equal(m["slots.1.mlp.c_fc.weight"], a["transformer.h.1.mlp.c_fc.weight"].T)
assert torch.equal(m["slots.0.attn.c_attn.bias"], a["transformer.h.0.attn.c_attn.bias"])
PY

# bad files: refused naming what is wrong, nothing written
bad() {  # FILE ERE
    local rc=0
    "$M6CTL" import llmc "$1" --out "$T/bad" >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = 1 ] || fail "import of $1: exit $rc, want 1"
    grep -Eq "$2" "$T/err" || fail "import of $1: '$(cat "$T/err")' does not match '$2'"
    [ ! -e "$T/bad" ] || fail "a refused import wrote $T/bad"
}
head -c 500 "$T/a3.bin" >"$T/short.bin"
bad "$T/short.bin" 'truncated header: 500 bytes'
head -c 5000 "$T/a3.bin" >"$T/trunc.bin"
bad "$T/trunc.bin" 'truncated: 5000 bytes, the header.s model .* needs [0-9]+'
cp "$T/a3.bin" "$T/long.bin"; printf 'xx' >>"$T/long.bin"
bad "$T/long.bin" 'trailing bytes after the parameters'
$PY -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[0] ^= 1; open(sys.argv[2], "wb").write(b)' "$T/a3.bin" "$T/magic.bin"
bad "$T/magic.bin" 'bad magic 20240327, want 20240326'
$PY -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[4] = 4; open(sys.argv[2], "wb").write(b)' "$T/a3.bin" "$T/v4.bin"
bad "$T/v4.bin" 'version 4: want 3 \(fp32\) or 5 \(bf16\)'
$PY -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[20] = 3; open(sys.argv[2], "wb").write(b)' "$T/a3.bin" "$T/nh.bin"
bad "$T/nh.bin" 'bad num_heads'
bad "$T/nosuch.bin" 'nosuch.bin: No such file'
rc=0; "$M6CTL" import llmc "$T/a3.bin" --out "$T/d3" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "already exists" "$T/err" || fail "import over an existing dir: $rc $(cat "$T/err")"

# init.from: the first loss is the PyTorch model's on m6's first batch
mkdir -p "$T/text"
head -c 30000 "$FORTUNES/art" >"$T/text/art.txt"
"$M6CTL" data prepare --out "$T/data" --val-fraction 0.1 "$T/text/art.txt" >/dev/null 2>&1 \
    || fail "data prepare"
spec() {  # FILE INIT_DIR C PSEUDO_STEPS
    cat >"$1" <<JSON
{"name": "ft", "data": {"train": "$T/data/train_*.bin", "val": "$T/data/val_*.bin"},
 "model": {"vocab_size": 256, "n_layer": 2, "n_embd": $3, "n_head": 2, "seq_len": 16},
 "pseudo": {"steps": $4},
 "train": {"steps": 1, "batch_size": 4, "eval_batches": 1, "seed": 5},
 "init": {"from": "$2"}}
JSON
}
start_daemon "$T/s"
for v in 3 5; do
    spec "$T/ft$v.json" "d$v" 32 0  # relative: to the spec file
    R=$(ctl submit "$T/ft$v.json") || fail "submit with init.from"
    ctl watch "$R" >/dev/null || fail "init.from run $R did not complete: $(field "$R" error)"
    got=$(ctl metrics "$R" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)[0]["train_loss"])')
    want=$($PY "$HF_REF" llmc-loss "$T/a$v.bin" "$T/data/train_*.bin" 5 4) || fail "reference loss"
    log "version $v: first loss m6 $got, PyTorch $want"
    $PY -c "import sys; g, w = float('$got'), float('$want'); sys.exit(abs(g - w) > 1e-5 * max(1, abs(w)))" \
        || fail "first loss $got != reference $want (version $v)"
done
# mismatches refused at submit, naming the tensor and both shapes
refused() {  # SPEC ERE
    local rc=0
    ctl submit "$1" >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = 1 ] || fail "submit $1: exit $rc, want 1: $(cat "$T/out")"
    grep -Eq "$2" "$T/err" || fail "submit $1: '$(cat "$T/err")' does not match '$2'"
}
spec "$T/c64.json" "$T/d3" 64 0
refused "$T/c64.json" 'init.from: .*/d3: tensor wte has shape \(256, 32\), the model wants \(256, 64\)'
spec "$T/pseudo.json" "$T/d3" 32 1
refused "$T/pseudo.json" 'init.from: .*/d3: the checkpoint has 2 slots over 2 layers, the run starts with 1 over 2 \(pseudo.share_groups\)'
spec "$T/none.json" "$T/nosuch" 32 0
refused "$T/none.json" 'init.from: .*/nosuch: neither meta.json nor m6-model.json'
n=$(ctl list --json | $PY -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$n" = 2 ] || fail "refused submits made runs: $n"

# init.from gone at a restart: a run with a checkpoint of its own goes on
# from it; one without any fails naming init.from (it would otherwise train
# from the seed's weights)
cp -r "$T/d3" "$T/dx"; cp -r "$T/d3" "$T/dy"
long() {  # FILE INIT_DIR CKPT_EVERY
    spec "$1" "$2" 32 0
    sed -i "s/\"steps\": 1,/\"steps\": 100000,/; s/\"init\"/\"checkpoint\": {\"every\": $3}, \"init\"/" "$1"
}
long "$T/lx.json" "$T/dx" 2
X=$(ctl submit "$T/lx.json")
wait_step "$X" 3
for _ in $(seq 200); do
    [ -n "$(db "$T/s" "select step from checkpoints where run=$X limit 1")" ] && break
    sleep 0.02
done
kill9_daemon
rm -rf "$T/dx"
start_daemon "$T/s"
for _ in $(seq 100); do [ "$(field "$X" state)" = running ] && break; sleep 0.05; done
[ "$(field "$X" state)" = running ] || fail "run $X after a restart without its init.from: $(field "$X" state) $(field "$X" error)"
ctl stop "$X" >/dev/null
long "$T/ly.json" "$T/dy" 0
Y=$(ctl submit "$T/ly.json")
wait_step "$Y" 3
kill9_daemon
rm -rf "$T/dy"
start_daemon "$T/s"
for _ in $(seq 100); do [ "$(field "$Y" state)" = failed ] && break; sleep 0.05; done
[ "$(field "$Y" state)" = failed ] || fail "run $Y: $(field "$Y" state), want failed"
field "$Y" error | has "no checkpoint of run $Y loads, and init.from: .*/dy: neither meta.json" \
    || fail "run $Y's error: $(field "$Y" error)"
stop_daemon
echo ok
