#!/usr/bin/env bash
# args.sh — the training benchmarks refuse bad options before any work,
# exit 2 (usage) and name the option and what was wrong with it.
# $1 cpu_train, $2 offload_cpu, $3 p2r_convergence, $4 offload_host; then
# (optional) the emulated gpu_train, gpu_offload.
set -u
CPU_TRAIN=$1 OFFLOAD_CPU=$2 P2R=$3 OFFLOAD_HOST=$4
shift 4
. "$(dirname "$0")/lib.sh"
for b in "$CPU_TRAIN" "$@"; do
    n=$(basename "$b")
    n=${n#emu_bench_}
    want 2 "^$n: --layers: want an integer >= 1, got \"x\"$" "$b" --layers x
    want 2 "^$n: --batch: want an integer >= 1, got \"0\"$" "$b" --batch 0
    want 2 "^$n: --seq: want an integer >= 1, got \"12k\"$" "$b" --seq 12k
    want 2 "^$n: --vocab: want an integer >= 2, got \"99999999999\"$" "$b" --vocab 99999999999
    want 2 "^$n: --embd 100 is not a multiple of --heads 6$" "$b" --embd 100 --heads 6 --layers 2
done
want 2 "^cpu_train: 9 share groups \(slots\), more than --layers \(6\)$" "$CPU_TRAIN" --layers 6 --share 9
want 2 "^cpu_train: unexpected argument \"10\" \(options only; see --help\)$" "$CPU_TRAIN" --steps 5 10
want 2 "^cpu_train: --threads: want an integer >= 1, got \"-1\"$" "$CPU_TRAIN" --threads -1
want 2 "^offload_cpu: --steps: want an integer >= 1, got \"-1\"$" "$OFFLOAD_CPU" --steps -1
want 2 "^offload_cpu: --threads: want an integer >= 1, got \"0\"$" "$OFFLOAD_CPU" --threads 0
want 2 "^offload_cpu: --resident 2: must be below --layers \(2\)" "$OFFLOAD_CPU" --layers 2 --resident 2
want 2 "^offload_cpu: unexpected argument" "$OFFLOAD_CPU" stray
want 2 "^p2r_convergence: --steps: want an integer >= 2, got \"5x\"$" "$P2R" --steps 5x
want 2 "^p2r_convergence: --pseudo-frac: want a fraction strictly between 0 and 1, got \"1\"$" "$P2R" --pseudo-frac 1
want 2 "^p2r_convergence: --lr: want a number in" "$P2R" --lr abc
want 2 "^p2r_convergence: 9 share groups \(slots\), more than --layers \(6\)$" "$P2R" --share-groups 9
want 2 "^p2r_convergence: --grad-scale: want sum or mean, got \"avg\"$" "$P2R" --grad-scale avg
want 2 "^p2r_convergence: --pseudo-lr-scale: want a number in" "$P2R" --pseudo-lr-scale 0
want 2 "^p2r_convergence: --master: want fp32 or bf16, got \"fp16\"$" "$P2R" --master fp16
want 2 "^offload_host: unexpected argument \"stray\"" "$OFFLOAD_HOST" stray
[ "$fails" = 0 ] || exit 1
echo "bench args: ok"
