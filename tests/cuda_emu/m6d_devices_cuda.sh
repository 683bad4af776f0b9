#!/usr/bin/env bash
# m6d_devices_cuda.sh — each m6d drives every GPU of its node: a
# `device.backend: cuda` run with nodes.world_size 4 on a coordinator and a
# worker with two emulated devices each (M6_EMU_DEVICES=2,
# tests/cuda_emu/mock_cuda.cpp), m6d_emu as M6D.
#  - CUDA_VISIBLE_DEVICES is respected: with one device visible,
#    --devices 2 is refused naming the count;
#  - with no --devices, each m6d runs one rank per visible GPU (m6ctl
#    nodes: 2 devices each; the coordinator places 2 ranks on the worker),
#    local rank r on GPU r: every GPU holds a rank's model and cuBLASLt
#    workspace at its peak (M6_EMU_DEVICE_LOG), each device has room for
#    one rank (M6_EMU_DEVICE_MIB), and the emulator refuses a kernel
#    launched on a stream of another device than the calling thread's
#    current one, and a GEMM whose operands or workspace are another
#    device's;
#  - the run trains through a delink with grad_accum split across the four
#    ranks (Gloo: m6d_emu has no NCCL), its train losses within 2e-3 nats
#    of the single-rank cuda run with the same global batch (as
#    m6d_dp_cuda.sh, where the two ranks are two m6d).
WORLD=4
. "$(dirname "$0")/dp_cuda_common.sh"  # one.json, two.json, one.csv
export M6_EMU_DEVICES=2

out=$(CUDA_VISIBLE_DEVICES=1 timeout 30 "$M6D" --state-dir "$T/v" \
      --role coordinator --listen 127.0.0.1:0 --token-file "$T/token" \
      --devices 2 2>&1) \
    && fail "--devices 2 with one visible GPU accepted"
echo "$out" | has 'devices 2: this node has 1 visible CUDA device (CUDA_VISIBLE_DEVICES=1)' \
    || fail "--devices 2 with CUDA_VISIBLE_DEVICES=1: '$out'"

# room for one rank's model and workspace on each device
export M6_EMU_DEVICE_MIB=48
M6_EMU_DEVICE_LOG=$T/devices-c.log start_m6d c --role coordinator \
    --listen 127.0.0.1:0 --token-file "$T/token"
SOCK=$T/c/m6d.sock
wait_listen c 200
M6_EMU_DEVICE_LOG=$T/devices-w.log start_m6d w --join "127.0.0.1:$PORT" \
    --token-file "$T/token" --node-name w
wait_node w live 60
for n in c w; do
    grep -q 'cluster.devices local_ranks=2' "$T/m6d-$n.log" \
        || fail "m6d $n does not run a rank per GPU: $(grep cluster. "$T/m6d-$n.log" | head -5)"
done
[ "$(db "$T/c" "select devices from nodes where role='coordinator'")" = 2 ] \
    || fail "the coordinator does not report 2 devices: $(ctl nodes)"
RUN=$(ctl submit "$T/two.json") || fail "submit of the 4-rank cuda spec"
timeout "${WAIT:-300}" "$M6CTL" --socket "$SOCK" watch "$RUN" >"$T/watch.out" \
    || fail "the 4-rank cuda run did not complete: $(ctl status "$RUN"; ctl events "$RUN" | tail -3; grep -i 'memory\|MOCK' "$T"/m6d-*.log | head -5)"
ctl events "$RUN" | has 'nodes.group.*world_size=4' || fail "no group: $(ctl events "$RUN")"
[ "$(db "$T/c" "select devices from nodes where hostname='w'")" = 2 ] \
    || fail "the worker does not report 2 devices: $(ctl nodes)"
grep -q 'cluster.rank_done run='"$RUN"' rank=1 step=8' "$T/m6d-c.log" \
    || fail "the coordinator's local rank 1 did not train to step 8: $(grep cluster. "$T/m6d-c.log" | tail -5)"
for r in 2 3; do
    grep -q 'cluster.rank_done run='"$RUN"' rank='$r' step=8' "$T/m6d-w.log" \
        || fail "the worker's rank $r did not train to step 8: $(grep cluster. "$T/m6d-w.log" | tail -5)"
done
losses "$RUN" >"$T/two.csv"
losses_close "$T/one.csv" "$T/two.csv" 8 2e-3 || fail "4-GPU cuda losses vs the single rank's"

# each GPU held one rank at its peak: a cuBLASLt workspace (32 MiB) and a
# model; device 1 as much as device 0 within a factor of 2, on both nodes
for n in w c; do
    kill -TERM "${M6D_PIDS[$n]}"
    wait "${M6D_PIDS[$n]}" || fail "m6d $n exited $? after SIGTERM"
    read -r p0 p1 < <(awk '{p[$2] = $4} END {print p[0] + 0, p[1] + 0}' "$T/devices-$n.log")
    [ "$p1" -gt $((32 << 20)) ] && [ "$p1" -le $((2 * p0)) ] && [ "$p0" -le $((2 * p1)) ] \
        || fail "m6d $n: the ranks' peak device memory is not one rank per GPU: $(cat "$T/devices-$n.log")"
done
