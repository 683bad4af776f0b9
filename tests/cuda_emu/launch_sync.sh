#!/bin/sh
# launch_sync.sh EXE — M6_CUDA_SYNC=1 (kernels/cuda/cuda_check.h) on the
# emulation, with EXE = emu_test_gpu_ops, run from the build root:
#  1. the switch on, nothing injected: every launch is followed by a
#     synchronize and a check, and the test still passes;
#  2. the switch on, the 3rd kernel launch made to fault
#     (M6_EMU_FAULT_LAUNCH=3: a sticky cudaErrorIllegalAddress, as a kernel
#     reading past its buffer would leave): the program exits 1 naming the
#     file:line of a CUDA_CHECK_LAUNCH() in kernels/cuda/, the launch;
#  3. the switch off, the same fault: the program still exits 1 with
#     cudaErrorIllegalAddress (wherever the next check is).
exe=$1
fail() { echo "launch_sync: FAIL: $*"; exit 1; }

out=$(M6_CUDA_SYNC=1 "$exe" 2>&1) || { echo "$out" | tail -20; fail "M6_CUDA_SYNC=1 alone: the test failed"; }
echo "$out" | tail -1
echo "launch_sync: 1. M6_CUDA_SYNC=1 without a fault passes: ok"

out=$(M6_CUDA_SYNC=1 M6_EMU_FAULT_LAUNCH=3 "$exe" 2>&1) && fail "the injected fault went unnoticed"
line=$(echo "$out" | grep "cudaErrorIllegalAddress" | head -1)
echo "$line"
[ -n "$line" ] || { echo "$out" | tail -20; fail "no cudaErrorIllegalAddress reported"; }
at=$(echo "$line" | sed -n 's/.* at \([^ ]*\.cu\):\([0-9]*\): .*/\1 \2/p')
[ -n "$at" ] || fail "the report names no .cu file:line"
set -- $at
case $1 in */kernels/cuda/*) ;; *) fail "reported at $1, not in kernels/cuda/";; esac
[ -f "$1" ] || fail "$1: no such file (run from the build root)"
src=$(sed -n "$2p" "$1")
echo "$src" | grep -q "CUDA_CHECK_LAUNCH()" ||
    fail "$1:$2 is not a launch check: $src"
echo "launch_sync: 2. with M6_CUDA_SYNC=1 the fault is reported at its launch ($1:$2): ok"

out=$(M6_EMU_FAULT_LAUNCH=3 "$exe" 2>&1) && fail "without M6_CUDA_SYNC the fault went unnoticed"
echo "$out" | grep -q "cudaErrorIllegalAddress" || fail "without M6_CUDA_SYNC: no cudaErrorIllegalAddress"
echo "launch_sync: 3. without it the fault is still reported: ok"
