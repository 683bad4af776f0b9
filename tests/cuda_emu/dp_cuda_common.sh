#!/usr/bin/env bash
# dp_cuda_common.sh — sourced by the 2-rank cuda tests (m6d_dp_cuda.sh,
# m6d_devices_cuda.sh): lib.sh, the data, a cuda spec of one rank
# ($T/one.json) and of nodes.world_size WORLD ($T/two.json; WORLD 2 unless
# the test sets it) with the same global batch (grad_accum WORLD: one
# microbatch a rank), a delink at step 4, the single-rank run's losses in
# $T/one.csv, and $T/token.
. "$(dirname "$0")/../integration/lib.sh"
TMO=30
M6D_ARGS="--node-timeout $TMO" # every m6d lib.sh's start_m6d starts here

prepare_data "$T/data"
cuda_spec() { # FILE NAME [nodes]
    spec_file "$1" "$2" <<JSON
  "model": $(tiny_model 3),
  "pseudo": {"steps": 4},
  "train": {"steps": 8, "batch_size": 2, "grad_accum": ${WORLD:-2}, "eval_every": 4, "seed": 5},
  "device": {"backend": "cuda"}${3:+, $3}
JSON
}
cuda_spec "$T/one.json" one
cuda_spec "$T/two.json" two "\"nodes\": {\"world_size\": ${WORLD:-2}, \"timeout\": $TMO}"
reference_losses "$T/solo" "$T/one.json" "$T/one.csv" "single-rank cuda run"
write_token "$T/token"
