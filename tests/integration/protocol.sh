#!/usr/bin/env bash
# protocol.sh — bad input on the control socket while a run trains: garbage
# and oversized frames, an unknown request type, a bad protocol version, an
# unknown run id, specs with a bad key, a bad data glob or a token id past the
# vocabulary. Each gets a clear error; the daemon keeps serving; the run is
# unaffected (same losses as a quiet run). A shard that goes bad while its run
# is queued fails the run at its start, saying why. Then the socket's latency
# while a big step runs and while submits check corpora of billions of tokens.
. "$(dirname "$0")/lib.sh"

prepare_data "$T/data"
# the default model whatever M6_TEST_MODEL says: the checks below edit its
# text and size it
M6_TEST_MODEL= write_spec "$T/spec.json" proto 150 75

reference_losses "$T/quiet" "$T/spec.json" "$T/quiet.csv" "quiet run"

M6_TEST_HOLD_BOUNDARY=$HOLD_FILE start_daemon "$T/s"
[ "$(stat -c %a "$SOCK")" = 660 ] || fail "socket mode $(stat -c %a "$SOCK")"
# the run held at its first boundary until it is seen running (lib.sh
# hold_boundary): then it trains while the bad input comes, however short
# its steps
hold_boundary nowait
R=$(ctl submit "$T/spec.json")
wait_state "$R" running
release_boundary

python3 "$(dirname "$0")/rawclient.py" "$SOCK" >"$T/raw.out" 2>&1 || fail "rawclient: $(cat "$T/raw.out")"
cat "$T/raw.out" >&2

ctl status 4242 2>"$T/err" && fail "status of an unknown run should fail"
grep -q "no run with id 4242" "$T/err" || fail "unknown run message: $(cat "$T/err")"
ctl pause 4242 2>/dev/null && fail "pause of an unknown run should fail"

# submit_refused NAME SED BRE WHAT: spec.json edited by the sed script SED
# (into NAME.json) is refused at submit with an error matching BRE
submit_refused() {
    sed "$2" "$T/spec.json" >"$T/$1.json"
    ctl submit "$T/$1.json" 2>"$T/err" && fail "$4 was accepted"
    grep -q -- "$3" "$T/err" || fail "$4: refusal not matching '$3': $(cat "$T/err")"
}
submit_refused badkey 's/"seq_len": 32/"seq_len": 32, "n_lyer": 3/' \
    "n_lyer" "a spec with a bad key"
submit_refused badval 's/"seed": 7/"seed": 7, "lr": -1/' \
    "train.lr" "a spec with lr -1"
submit_refused toobig 's/"seq_len": 32/"seq_len": 100000/' \
    "host memory: training needs .* GiB" "a spec needing ~900 GiB"
submit_refused badglob "s#$T/data/train_\*.bin#$T/nowhere/*.bin#" \
    "data.train" "a spec with a bad glob"
# A cuda spec is refused at submit, saying why, by an m6d built without CUDA
# or one that sees no CUDA device (CI). Where a GPU is visible it would run
# (tests/gpu/test_trainer.c covers that), so the check is skipped there.
sed 's/"seed": 7/"seed": 7}, "device": {"backend": "cuda"/' "$T/spec.json" >"$T/cuda.json"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "protocol: a CUDA device is visible; cuda-spec refusal not checked"
else
    ctl submit "$T/cuda.json" 2>"$T/err" && fail "a cuda spec was accepted by a daemon that cannot run it"
    grep -q "device.backend" "$T/err" || fail "cuda refusal not named: $(cat "$T/err")"
    grep -Eq "device.backend: 'cuda': (no CUDA device \(cudaGetDeviceCount: .+\); device.backend \"cpu\" trains without one|this m6d was built without CUDA)" "$T/err" \
        || fail "cuda refusal does not say why: $(cat "$T/err")"
fi
mkfifo "$T/fifo.bin"
sed "s#$T/data/train_\*.bin#$T/fifo.bin#" "$T/spec.json" >"$T/fifo.json"
timeout 10 "$M6CTL" --socket "$SOCK" submit "$T/fifo.json" 2>"$T/err" && fail "a FIFO as a shard was accepted"
grep -q "is a FIFO, not a regular file" "$T/err" || fail "FIFO shard: $(cat "$T/err")"
# A token id >= vocab_size: refused at submit, naming the shard, the token
# and its index (the check runs on libuv's thread pool: see server.c).
mkdir "$T/badtok"
python3 - "$T/data/train_000000.bin" "$T/badtok/train_000000.bin" <<'PY2'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[1024 + 2 * 17:1024 + 2 * 18] = (300).to_bytes(2, "little")
open(sys.argv[2], "wb").write(b)
PY2
sed "s#$T/data/train_\*.bin#$T/badtok/train_*.bin#" "$T/spec.json" >"$T/badtok.json"
ctl submit "$T/badtok.json" 2>"$T/err" && fail "a shard with token 300 >= vocab_size 256 was accepted"
grep -q "data.train: $T/badtok/train_000000.bin: token 300 at index 17 >= vocab_size 256" "$T/err" \
    || fail "bad token not named: $(cat "$T/err")"
kill -HUP "$DAEMON_PID"; nap 0.2
ctl list >/dev/null || fail "m6d did not survive SIGHUP"
grep -q "signal=SIGHUP action=ignored" "$T"/m6d-*.log || fail "SIGHUP not logged"
echo '{"name": ' >"$T/broken.json"
ctl submit "$T/broken.json" 2>/dev/null && fail "broken JSON accepted"
ctl plan "$T/spec.json" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
for k in ("resident_slots", "offloaded_slots", "peak_device_bytes", "h2d_bytes_per_step",
          "d2h_bytes_per_step", "min_budget_bytes"):
    assert k in p, k
assert p["offloaded_slots"] == [] and p["h2d_bytes_per_step"] == 0, p
' || fail "plan --json"
ctl plan "$T/spec.json" --device-memory 1KiB 2>"$T/err" && fail "plan with a 1 KiB budget should fail"
grep -q "too small" "$T/err" || fail "plan budget error: $(cat "$T/err")"
# a unit m6 does not know is named with the ones it does; overflow is said
rc=0; ctl plan "$T/spec.json" --device-memory 1PiB 2>"$T/err" || rc=$?
[ "$rc" = 2 ] || fail "plan --device-memory 1PiB: exit $rc, want 2 (usage)"
grep -q 'got "1PiB"' "$T/err" && grep -q "TiB" "$T/err" || fail "unknown unit error: $(cat "$T/err")"
ctl plan "$T/spec.json" --device-memory 99999999999TiB 2>"$T/err" && fail "plan with an overflowing size should fail"
grep -q '"99999999999TiB" is too large' "$T/err" || fail "overflow error: $(cat "$T/err")"
# m6d's plan (PlanQuery) is the local plan, table and JSON, with a budget too.
for a in "" "--json" "--device-memory 1700KiB" "--json --device-memory 1700KiB"; do
    ctl plan "$T/spec.json" $a >"$T/plan.local" || fail "plan $a"
    ctl plan "$T/spec.json" $a --daemon >"$T/plan.daemon" 2>"$T/err" || fail "plan $a --daemon: $(cat "$T/err")"
    diff "$T/plan.local" "$T/plan.daemon" >"$T/diff" || fail "plan $a: m6d and m6ctl differ: $(head "$T/diff")"
done
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["offloaded_slots"]' "$T/plan.daemon" \
    || fail "a 1700 KiB budget offloaded nothing: $(cat "$T/plan.daemon")"
ctl plan "$T/spec.json" --device-memory 1KiB --daemon 2>"$T/err" && fail "m6d plan with a 1 KiB budget should fail"
grep -q "too small" "$T/err" || fail "m6d plan budget error: $(cat "$T/err")"
ctl plan "$T/badkey.json" --daemon 2>"$T/err" && fail "m6d plan of a bad spec should fail"
grep -q "n_lyer" "$T/err" || fail "m6d plan bad key: $(cat "$T/err")"

[ "$(ctl list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1 ] \
    || fail "refused submits left rows"
ctl watch "$R" >/dev/null || fail "the run did not complete after the bad input"
same_losses "$R" "$T/quiet.csv" "losses changed"

# A shard that goes bad after its submit was accepted (rewritten in place
# while the run waits in the queue): the worker checks the data again when
# the run starts (a changed file is read again, an unchanged one is not), so
# the run fails there, with the same message in status and in its events, and
# m6d goes on serving.
write_spec "$T/blocker.json" blocker 1000000 0
K=$(ctl submit "$T/blocker.json")
wait_state "$K" running
cp -r "$T/data" "$T/later"
sed "s#$T/data/train_\*.bin#$T/later/train_*.bin#" "$T/spec.json" >"$T/later.json"
L=$(ctl submit "$T/later.json") || fail "submit over a good corpus"
[ "$(field "$L" state)" = queued ] || fail "run $L: $(field "$L" state), wanted queued"
python3 - "$T/later/train_000000.bin" <<'PY2'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1024 + 2 * 1234)
    f.write((999).to_bytes(2, "little"))
PY2
ctl stop "$K" >/dev/null
rc=0; ctl watch "$L" >"$T/watch.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "watch of a run whose shard went bad exited $rc, wanted 1"
[ "$(field "$L" state)" = failed ] || fail "run $L: $(field "$L" state), wanted failed"
want="data.train: $T/later/train_000000.bin: token 999 at index 1234 >= vocab_size 256"
grep -qF "$want" "$T/watch.out" || fail "watch did not say why: $(tail -1 "$T/watch.out")"
field "$L" error | has -F "$want" || fail "run $L's error: $(field "$L" error)"
db "$T/s" "select detail from events where run = $L and kind = 'failed'" | has -F "$want" \
    || fail "no failed event naming the shard: $(db "$T/s" "select * from events where run = $L")"
ctl list >/dev/null || fail "m6d stopped answering after a run failed on its data"

# Latency: a big step (a bigger model). Steps enough that it still trains
# when the section ends and stops it (4 steps were done before the end on a
# quiet machine, and the stop was refused: "it is completed").
write_spec "$T/big.json" big 100000 0
python3 - "$T/big.json" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p))
s["model"].update(n_layer=4, n_embd=256, n_head=4, seq_len=256); s["train"]["batch_size"] = 16
json.dump(s, open(p, "w"))
PY
stop_daemon
start_daemon "$T/s"
B=$(ctl submit "$T/big.json")
wait_state "$B" running
python3 "$(dirname "$0")/rawclient.py" "$SOCK" "$B" >"$T/lat.out" 2>&1 || fail "latency: $(cat "$T/lat.out")"
tail -1 "$T/lat.out" >&2
# Submits whose corpus takes seconds to check must not hold up the socket
# for others. Corpora of sparse shards (llm.c header, then holes: token 0),
# on tmpfs where one is mounted, so that reading them costs CPU (every token
# is range-checked) but fills no page cache.
HUGE=$T
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    HUGE=$(mktemp -d /dev/shm/m6-it.XXXXXX)
    trap 'rm -rf "$HUGE"; cleanup_' EXIT
fi
# huge_corpus NAME SHARDS: a spec NAME.json over SHARDS shards of
# $HUGE_TOKENS tokens each
huge_corpus() {
    python3 - "$HUGE/$1" "$2" "$HUGE_TOKENS" <<'PY'
import os, struct, sys
os.makedirs(sys.argv[1])
n = int(sys.argv[3])  # tokens per shard (2 bytes each, holes)
for k in range(int(sys.argv[2])):
    with open(os.path.join(sys.argv[1], "train_%06d.bin" % k), "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, n) + bytes(1024 - 12))
        f.truncate(1024 + 2 * n)
PY
    sed "s#$T/data/train_\*.bin#$HUGE/$1/train_*.bin#" "$T/spec.json" >"$T/$1.json"
}
# Tokens to check: under a sanitizer m6d checks them several times
# slower, and an eighth of them still takes seconds (checked below)
if [ "${M6_TEST_SANITIZED:-0}" = 1 ]; then
    HUGE_N=2 MANY_N=1 HUGE_TOKENS=1000000000
else
    HUGE_N=4 MANY_N=2 HUGE_TOKENS=2000000000
fi
huge_corpus huge $HUGE_N
t0=$(date +%s%N)
(ctl submit "$T/huge.json" >"$T/huge.id" 2>"$T/huge.err"; echo $? >"$T/huge.rc"; date +%s%N >"$T/huge.done") &
SUBMIT_PID=$!
nap 0.1
python3 "$(dirname "$0")/rawclient.py" "$SOCK" "$B" "$T/huge.done" >"$T/lat2.out" 2>&1 || fail "latency during a slow submit: $(cat "$T/lat2.out")"
wait "$SUBMIT_PID"
[ "$(cat "$T/huge.rc")" = 0 ] || fail "slow submit: $(cat "$T/huge.err")"
ms=$(( ($(cat "$T/huge.done") - t0) / 1000000 ))
log "slow submit took $ms ms; $(tail -1 "$T/lat2.out")"
[ "$ms" -gt 1500 ] || fail "the slow submit took only $ms ms: make the corpus bigger"
if [ "$ms" -gt 2500 ]; then
    grep -q "checking every shard" "$T/huge.err" || fail "a slow submit said nothing: $(cat "$T/huge.err")"
fi
# Six at once, more than libuv's four pool threads: status still answers.
for k in 1 2 3 4 5 6; do huge_corpus "many$k" $MANY_N; done
(for k in 1 2 3 4 5 6; do
     ctl submit "$T/many$k.json" >"$T/many$k.id" 2>"$T/many$k.err" &
 done
 wait; date +%s%N >"$T/many.done") &
MANY_PID=$!
t0=$(date +%s%N)
nap 0.2
python3 "$(dirname "$0")/rawclient.py" "$SOCK" "$B" "$T/many.done" >"$T/lat3.out" 2>&1 \
    || fail "latency during six slow submits: $(cat "$T/lat3.out")"
wait "$MANY_PID"
for k in 1 2 3 4 5 6; do [ -s "$T/many$k.id" ] || fail "submit many$k: $(cat "$T/many$k.err")"; done
log "six slow submits took $(( ($(cat "$T/many.done") - t0) / 1000000 )) ms; $(tail -1 "$T/lat3.out")"
# A submit whose client goes away while m6d checks the corpus queues nothing.
huge_corpus gone $MANY_N
runs_before=$(ctl list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
"$M6CTL" --socket "$SOCK" submit "$T/gone.json" >/dev/null 2>&1 &
GONE=$!
nap 0.5
kill "$GONE"; wait "$GONE" 2>/dev/null || true
for _ in $(seq 1 300); do grep -q "run.submit_dropped" "$T/m6d-s.log" && break; nap 0.1; done
grep -q "run.submit_dropped" "$T/m6d-s.log" || fail "no run.submit_dropped in the log"
[ "$(ctl list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = "$runs_before" ] \
    || fail "a submit whose client went away was queued"
# B (100,000 steps) still trains and the huge run waits behind it: both
# stops must be taken.
ctl stop "$(cat "$T/huge.id")" >/dev/null
ctl stop "$B" >/dev/null
stop_daemon
echo "ok protocol"
