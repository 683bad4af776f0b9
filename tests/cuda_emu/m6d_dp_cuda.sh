#!/usr/bin/env bash
# m6d_dp_cuda.sh — a `device.backend: cuda` run with nodes.world_size 2
# through the real daemons on the emulated GPU (M6D is m6d_emu): a
# coordinator (rank 0) and a worker (rank 1) on loopback. m6d_emu has no
# NCCL, so rank 0 picks Gloo and the ranks stage their gradients through
# host memory (cluster/dp.c, backend_cuda.c). The run trains through a
# delink with grad_accum split across the ranks, and its train losses are
# within 2e-3 nats of the single-node cuda run with the same global batch
# (one bf16 rounding of each summed gradient element: see
# tests/gpu/test_dp_cuda.c, where 6.5e-5 is measured; a rank training on
# its own half of the batch is off by 6e-3 there).
. "$(dirname "$0")/dp_cuda_common.sh"  # one.json, two.json, one.csv

start_m6d c --role coordinator --listen 127.0.0.1:0 --token-file "$T/token"
SOCK=$T/c/m6d.sock
wait_listen c 200
start_m6d w1 --join "127.0.0.1:$PORT" --token-file "$T/token" --node-name w1
RUN=$(ctl submit "$T/two.json") || fail "submit of the 2-rank cuda spec"
ctl watch "$RUN" >"$T/watch.out" || fail "the 2-rank cuda run did not complete: $(ctl status "$RUN")"
ctl events "$RUN" | has 'nodes.group.*world_size=2' || fail "no group: $(ctl events "$RUN")"
grep -q 'cluster.rank_done run='"$RUN"' rank=1 step=8' "$T/m6d-w1.log" \
    || fail "rank 1 did not train to step 8: $(grep cluster. "$T/m6d-w1.log" | tail -5)"
! grep -q 'cluster.grad_engine' "$T/m6d-c.log" || fail "m6d_emu picked nccl"
losses "$RUN" >"$T/two.csv"
losses_close "$T/one.csv" "$T/two.csv" 8 2e-3 || fail "2-rank cuda losses vs the single node's"
