#!/bin/sh
# tests/run.sh [--quick | --long] [meson test arguments] — set up (Debian
# packages, the release build in ./build), run the test suite, end with one
# line "N passed, N failed".
#
# Modes (which test runs in which: the table test_where in
# tests/meson.build, read through meson suites):
#   --quick   release build only: the unit tests and the fast integration
#             tests (suite quick), for the inner loop
#   (none)    the README's test command and CI (.ci/run): every test but
#             the long and sanonly ones in the release build, then the unit
#             and integration suites in a build with AddressSanitizer and
#             UndefinedBehaviorSanitizer (./build-san), less what that pass
#             cannot check better (suite nosan: fuzz, TSan, valgrind, the
#             GPU-check build; the CUDA emulation is not built there). The
#             sanonly tests (the slower integration tests, the multi-rank
#             training tests) run there only: the same checks, sanitized.
#   --long    the same plus the long suite (slow and redundant with a check
#             the default run makes: valgrind memcheck next to ASan+LSan)
#             and the sanonly tests in the release build too
# With other arguments (test names, --suite ...) or M6_SANITIZE=0, only the
# release build's tests run, those named.
#
# Tests run M6_TEST_JOBS at a time (default: the number of CPUs, nproc,
# and one more in the sanitized pass), the longest first (test_priority in
# tests/meson.build): no test depends on how fast a run trains, or on the
# machine being otherwise idle.
#
# A skip is not a pass: the GPU tests (suite gpu, no CUDA device here) are
# the only ones that may skip. Any other test that skips (a missing oracle:
# python3-torch, Gloo, valgrind, promtool...) counts as failed, its reason
# named; M6_ALLOW_SKIP=1 lets them skip on a developer's machine (refused
# under CI=true). The line above the last says how many skipped and why.
set -eu
cd "$(dirname "$0")/.."
mode=default
case "${1:-}" in
--quick) mode=quick; shift ;;
--long) mode=long; shift ;;
esac
allow_skip=${M6_ALLOW_SKIP:-0}
if [ "${CI:-}" = true ] && [ "$allow_skip" != 0 ]; then
    echo "tests: M6_ALLOW_SKIP ignored under CI=true: a skip is not a pass"
    allow_skip=0
fi
if [ "$#" -gt 0 ] && [ "$mode" != quick ]; then
    echo "tests: mode named: the release build's tests, meson test $*"
else case $mode in
quick) echo "tests: mode quick: release build, suite quick (unit and fast integration tests)${1:+, meson test $*}" ;;
default) echo "tests: mode default: release build without the long suite, then unit and integration under ASan+UBSan" ;;
long) echo "tests: mode long: every test in the release build, then unit and integration under ASan+UBSan" ;;
esac
fi
if ! .ci/setup; then
    echo "failed: the build (.ci/setup; its log is above)"
    echo "0 passed, 1 failed"
    exit 1
fi
jobs=${M6_TEST_JOBS:-$(nproc)}
# The sanitized pass waits on timeouts, locks and held boundaries (one
# of its integration tests alone leaves about half of the CPU idle), so it
# runs one test more than there are CPUs; two more were slower (the CPU
# then 88% busy, a third of it in the kernel: bench/RESULTS.md).
san_jobs=${M6_TEST_JOBS:-$(($(nproc) + 1))}
rc=0
named=$#
case $mode in
quick) set -- --suite quick "$@" ;;
default)
    # the sanonly suite runs once, in the sanitized pass, unless there is
    # none (M6_SANITIZE=0)
    if [ "$#" -eq 0 ]; then
        set -- --no-suite long
        [ "${M6_SANITIZE:-1}" = 0 ] || set -- "$@" --no-suite sanonly
    fi ;;
esac
meson test -C build --print-errorlogs --num-processes "$jobs" "$@" || rc=$?
logs=build/meson-logs/testlog.json
if [ "$mode" != quick ] && [ "$named" -eq 0 ] && [ "${M6_SANITIZE:-1}" != 0 ]; then
    log=$(mktemp)
    if { [ -f build-san/build.ninja ] ||
         meson setup build-san --buildtype=debugoptimized \
             -Db_sanitize=address,undefined -Db_lundef=false \
             -Dcuda=disabled -Demu=false; } >"$log" 2>&1 &&
       ninja -C build-san >>"$log" 2>&1; then
        rm -f "$log"
        echo "tests: the unit and integration suites under ASan+UBSan (build-san)"
        long=--no-suite=long
        [ "$mode" = long ] && long=
        # halt_on_error: an undefined-behaviour report fails its test, as an
        # ASan report (or a leak at exit) does
        ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        meson test -C build-san --print-errorlogs --num-processes "$san_jobs" \
            --suite unit --suite integration --no-suite nosan --no-suite emu $long \
            --timeout-multiplier 3 || rc=$?
        logs="$logs build-san/meson-logs/testlog.json"
    else
        echo "tests: the sanitized build failed:" >&2
        grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 40 >&2
        rm -f "$log"
        rc=1
        logs="$logs build-failed"
    fi
fi
# the summary; exit 3: a test other than a GPU one skipped
src=0
M6_ALLOW_SKIP=$allow_skip /usr/bin/python3 - $logs <<'PY' || src=$?
import json, os, sys
allow = os.environ.get("M6_ALLOW_SKIP", "0") != "0"
passed = failed = 0
skips = {}  # reason -> names
bad_skip = False
def reason_(r):
    """The skip's reason: the last line of the test's output that says
    SKIP or skip, else its last line."""
    out = (r.get("stdout") or "") + "\n" + (r.get("stderr") or "")
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    said = [l for l in lines if "skip" in l.lower() or "no cuda device" in l.lower()]
    why = (said or lines or ["(no output)"])[-1]
    if "SKIP" in why:  # "test_ops: SKIP: no CUDA device": one reason for all
        why = why[why.index("SKIP"):]
    return why[:160]
for i, path in enumerate(sys.argv[1:]):
    if path == "build-failed":
        failed += 1
        print("failed: build-san (the sanitized build; its log is above)")
        continue
    tag = "" if i == 0 else "asan+ubsan: "
    if not os.path.exists(path):
        failed += 1
        print(f"failed: {tag}no test log ({path}): meson test did not run")
        continue
    for line in open(path):
        r = json.loads(line)
        res = r["result"]
        name = tag + r["name"]
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            why = reason_(r)
            # the name is "project:suite+suite / test"
            suites = r["name"].split(" / ")[0].split(":")[-1].split("+")
            gpu = "gpu" in suites
            if gpu or allow:
                skips.setdefault(why, []).append(name)
                print(f"skipped: {name}: {why}")
            else:
                failed += 1
                bad_skip = True
                print(f"failed: {name} skipped, and only GPU tests may skip: {why}")
        else:
            failed += 1
            print(f"failed: {name} ({res})")
if bad_skip:
    print("(a missing oracle or tool fails the run: install it, see .ci/setup;"
          " M6_ALLOW_SKIP=1 lets it skip outside CI)")
n = sum(len(v) for v in skips.values())
print(f"{n} skipped" + ("" if not n else ": " + "; ".join(
    f"{len(v)} {why}" for why, v in skips.items())))
print(f"{passed} passed, {failed} failed")
sys.exit(3 if bad_skip else 0)
PY
[ "$src" -eq 0 ] || rc=1
exit $rc
