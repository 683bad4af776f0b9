#!/bin/sh
# tests/run.sh — set up (Debian packages, build) and run the whole test suite.
# Ends with one line "N passed, N failed" (skipped tests are listed above it).
set -eu
cd "$(dirname "$0")/.."
.ci/setup
rc=0
meson test -C build --print-errorlogs --num-processes 1 "$@" || rc=$?
/usr/bin/python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    res = r["result"]
    if res in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif res == "SKIP":
        skipped += 1
        print(f"skipped: {r['name']}")
    else:
        failed += 1
        print(f"failed: {r['name']} ({res})")
if skipped:
    print(f"({skipped} skipped: no GPU or missing optional tool; see above)")
print(f"{passed} passed, {failed} failed")
PY
exit $rc
