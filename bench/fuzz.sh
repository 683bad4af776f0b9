#!/bin/sh
# bench/fuzz.sh [SECONDS] [TARGET...] — run the libFuzzer targets of
# tests/fuzz for SECONDS each (default 600), printing executions and crashes
# per target and ending with a key=value line (tests/fuzz/run.sh does the
# work; CI runs it for 10 s per target as the test `fuzz`).
cd "$(dirname "$0")/.." || exit 1
secs=${1:-600}
[ $# -gt 0 ] && shift
exec tests/fuzz/run.sh --seconds "$secs" "$@"
