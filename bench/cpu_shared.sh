#!/usr/bin/env bash
# cpu_shared.sh [--steps N] [--rounds R] [CPU_TRAIN] — the CPU engine when
# the cores are shared (issue 20): bench/cpu_train alone, then beside a busy process that
# keeps one core loaded (started and stopped here), with libgomp's default
# wait policy (threads spin at barriers) and with OMP_WAIT_POLICY=passive
# (what m6d sets for itself). Prints tokens/s of the four runs and the
# ratios to the quiet default, and ends with one key=value line.
# The goal on 2 cores: beside one busy core, >= 0.45 of the quiet figure.
set -euo pipefail
steps=30 rounds=5
if [ "${1:-}" = --steps ]; then steps=$2; shift 2; fi
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../build/bench/cpu_train}
[ -x "$bin" ] || { echo "cpu_shared: no $bin (build first)" >&2; exit 2; }

tok() {  # tok POLICY: tokens/s of one cpu_train run
    local v
    if [ "$1" = default ]; then
        v=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$bin" --steps "$steps" --rounds "$rounds" | tail -n 1)
    else
        v=$(env -u GOMP_SPINCOUNT OMP_WAIT_POLICY="$1" "$bin" --steps "$steps" --rounds "$rounds" | tail -n 1)
    fi
    echo "$v" | tr ' ' '\n' | sed -n 's/^tokens_per_s=//p'
}

busy=
stop_busy() { [ -n "$busy" ] && kill "$busy" 2>/dev/null; wait 2>/dev/null; busy=; }
trap stop_busy EXIT

q_def=$(tok default)
q_pas=$(tok passive)
( while :; do :; done ) & busy=$!
sleep 0.3
b_def=$(tok default)
b_pas=$(tok passive)
stop_busy

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "cpu_shared: cpu_train --steps $steps --rounds $rounds, $(nproc) CPUs, one busy process in the 'beside' runs"
printf "%-26s %10s %10s\n" "" "default" "passive"
printf "%-26s %10s %10s\n" "quiet tokens/s" "$q_def" "$q_pas"
printf "%-26s %10s %10s\n" "beside a busy core" "$b_def" "$b_pas"
printf "%-26s %10s %10s\n" "ratio to quiet default" "$(ratio "$b_def" "$q_def")" "$(ratio "$b_pas" "$q_def")"
echo "quiet_default_tok_s=$q_def quiet_passive_tok_s=$q_pas busy_default_tok_s=$b_def busy_passive_tok_s=$b_pas busy_ratio_default=$(ratio "$b_def" "$q_def") busy_ratio_passive=$(ratio "$b_pas" "$q_def") quiet_ratio_passive=$(ratio "$q_pas" "$q_def")"
