#!/bin/bash
# tests/fuzz/run.sh [--seconds S] [--quiet] [TARGET...] — build the libFuzzer
# targets with clang (AddressSanitizer + UndefinedBehaviorSanitizer, in
# $M6_FUZZ_BUILD, default build-fuzz/) and run each for S seconds (default
# 60) on a scratch copy of its seed corpus (tests/fuzz/corpus/TARGET).
# Prints executions and crashes per target and a key=value summary line;
# exit 0 when no target crashed, 1 when one did (its input is named; copy
# it into the corpus as a regression input once fixed), 77 without clang's
# libFuzzer (the test then reads SKIP).
set -u
cd "$(dirname "$0")/../.."
secs=60 quiet=0 targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) secs=$2; shift 2 ;;
        --quiet) quiet=1; shift ;;
        -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_spec fuzz_shard fuzz_dispatch fuzz_ckpt fuzz_llmc fuzz_cluster)
build=${M6_FUZZ_BUILD:-build-fuzz}

if ! command -v clang >/dev/null ||
   ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
     clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
    echo "fuzz: SKIP: clang with libFuzzer (packages clang, libclang-rt-14-dev) not found"
    exit 77
fi
if [ ! -f "$build/build.ninja" ]; then
    setup_log=$(mktemp)
    CC=clang CXX=clang++ meson setup "$build" --buildtype=debugoptimized \
        -Dfuzz=true -Dcuda=disabled -Db_sanitize=address,undefined \
        -Db_lundef=false >"$setup_log" 2>&1 ||
        { echo "fuzz: meson setup failed:"; tail -20 "$setup_log"; rm -f "$setup_log"; exit 1; }
    rm -f "$setup_log"
fi
for t in "${targets[@]}"; do
    ninja -C "$build" "tests/fuzz/$t" >"$build/ninja-$t.log" 2>&1 ||
        { echo "fuzz: building $t failed:"; tail -30 "$build/ninja-$t.log"; exit 1; }
done

# tmpfs where there is one: fuzz_dispatch makes m6.db afresh often
if [ -d /dev/shm ] && [ -w /dev/shm ]; then work=$(mktemp -d -p /dev/shm); else work=$(mktemp -d); fi
trap 'rm -rf "$work"' EXIT
# the targets' scratch files (TMPDIR) go in here, so two runs at once
# (the test and bench/fuzz.sh) never remove each other's
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp
total=0 crashes=0 summary=""
for t in "${targets[@]}"; do
    mkdir -p "$work/$t/corpus" "$work/$t/crashes"
    cp tests/fuzz/corpus/"${t#fuzz_}"/* "$work/$t/corpus/"
    log="$work/$t/log"
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ASAN_OPTIONS=detect_leaks=1 \
    "$build/tests/fuzz/$t" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="$work/$t/crashes/" "$work/$t/corpus" \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    execs=${execs:-0}
    found=$(ls "$work/$t/crashes" | wc -l)
    total=$((total + execs)); crashes=$((crashes + found))
    echo "fuzz: $t: $execs executions in ${secs}s, $found crashes (exit $rc)"
    if [ "$found" -gt 0 ] || [ $rc -ne 0 ]; then
        grep -m 20 -E 'ERROR|SUMMARY|fuzz_[a-z]+:|runtime error' "$log"
        for c in "$work/$t/crashes"/*; do
            [ -e "$c" ] || continue
            keep="tests/fuzz/found-$t-$(basename "$c")"
            cp "$c" "$keep"; echo "fuzz: input kept as $keep"
        done
        crashes=$((crashes + (found == 0)))
    elif [ $quiet = 0 ]; then
        tail -3 "$log"
    fi
    summary="$summary ${t}_execs=$execs ${t}_crashes=$found"
done
echo "fuzz:$summary total_execs=$total crashes=$crashes"
[ "$crashes" -eq 0 ]
