#!/bin/sh
# run_bench.sh BENCH ARGS... — run a benchmark of bench/ on the emulated GPU
# (tests/cuda_emu): passes when it exits 0 and its last line is its
# key=value summary (first key tokens_per_s or tokens_per_s_resident).
out=$("$@") || { rc=$?; printf '%s\n' "$out"; echo "run_bench: $1 exited $rc"; exit 1; }
printf '%s\n' "$out"
last=$(printf '%s\n' "$out" | tail -n 1)
case "$last" in
tokens_per_s=*|tokens_per_s_resident=*) exit 0 ;;
esac
echo "run_bench: the last line is not the key=value summary: $last"
exit 1
