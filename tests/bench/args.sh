#!/usr/bin/env bash
# args.sh — the training benchmarks refuse bad options before any work,
# exit 2 (usage) and name the option and what was wrong with it.
# $1: cpu_train; $2 (optional): the emulated gpu_train, gpu_offload.
set -u
fails=0
# want RC ERE CMD...: CMD exits RC and its stderr matches ERE
want() {
    local rc_want=$1 re=$2 rc=0; shift 2
    err=$("$@" 2>&1 >/dev/null) || rc=$?
    if [ "$rc" != "$rc_want" ] || ! grep -Eq -- "$re" <<<"$err"; then
        echo "FAIL: $*: exit $rc (want $rc_want), stderr '$err' (want /$re/)"
        fails=$((fails + 1))
    fi
}
for b in "$@"; do
    n=$(basename "$b")
    n=${n#emu_bench_}
    want 2 "^$n: --layers: want an integer >= 1, got \"x\"$" "$b" --layers x
    want 2 "^$n: --batch: want an integer >= 1, got \"0\"$" "$b" --batch 0
    want 2 "^$n: --seq: want an integer >= 1, got \"12k\"$" "$b" --seq 12k
    want 2 "^$n: --vocab: want an integer >= 2, got \"99999999999\"$" "$b" --vocab 99999999999
    want 2 "^$n: --embd 100 is not a multiple of --heads 6$" "$b" --embd 100 --heads 6 --layers 2
done
want 2 "^cpu_train: --share 9: at most --layers \(6\) slots$" "$1" --layers 6 --share 9
want 2 "^cpu_train: --threads: want an integer >= 1, got \"-1\"$" "$1" --threads -1
[ "$fails" = 0 ] || exit 1
echo "bench args: ok"
