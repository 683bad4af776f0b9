#!/bin/sh
# tests/run.sh — set up (Debian packages, build), run the whole test suite,
# then the unit and integration suites again in a build with
# AddressSanitizer and UndefinedBehaviorSanitizer (./build-san; the CUDA
# emulation's tests, which run under ASan already, and the valgrind test
# are left out there). Ends with one line "N passed, N failed" over both
# (skipped tests are listed above it). With arguments (meson test's: test
# names, --suite ...) or M6_SANITIZE=0, only the release build's tests run.
set -eu
cd "$(dirname "$0")/.."
.ci/setup
rc=0
meson test -C build --print-errorlogs --num-processes 1 "$@" || rc=$?
logs=build/meson-logs/testlog.json
if [ "$#" -eq 0 ] && [ "${M6_SANITIZE:-1}" != 0 ]; then
    log=$(mktemp)
    if { [ -f build-san/build.ninja ] ||
         meson setup build-san --buildtype=debugoptimized \
             -Db_sanitize=address,undefined -Db_lundef=false \
             -Dcuda=disabled -Demu=false; } >"$log" 2>&1 &&
       ninja -C build-san >>"$log" 2>&1; then
        rm -f "$log"
        echo "tests: the unit and integration suites under ASan+UBSan (build-san)"
        # halt_on_error: an undefined-behaviour report fails its test, as an
        # ASan report (or a leak at exit) does
        ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        meson test -C build-san --print-errorlogs --num-processes 1 \
            --suite unit --suite integration --no-suite emu \
            --no-suite valgrind --timeout-multiplier 3 || rc=$?
        logs="$logs build-san/meson-logs/testlog.json"
    else
        echo "tests: the sanitized build failed:" >&2
        grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 40 >&2
        rm -f "$log"
        rc=1
        logs="$logs build-failed"
    fi
fi
/usr/bin/python3 - $logs <<'PY'
import json, sys
passed = failed = skipped = 0
for i, path in enumerate(sys.argv[1:]):
    if path == "build-failed":
        failed += 1
        print("failed: build-san (the sanitized build; its log is above)")
        continue
    tag = "" if i == 0 else "asan+ubsan: "
    for line in open(path):
        r = json.loads(line)
        res = r["result"]
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
            print(f"skipped: {tag}{r['name']}")
        else:
            failed += 1
            print(f"failed: {tag}{r['name']} ({res})")
if skipped:
    print(f"({skipped} skipped: no GPU or missing optional tool; see above)")
print(f"{passed} passed, {failed} failed")
PY
exit $rc
