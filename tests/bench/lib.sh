# lib.sh — helpers of the benchmark tests (tests/bench/*.sh), sourced by
# each: failures are counted in fails (the test checks on and exits 1 at
# its end when any failed) and printed as "FAIL: ...".
fails=0

# fail WHAT: count a failure and say what it was.
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# want RC ERE CMD...: CMD exits RC and a line of its stderr matches ERE
# (its stdout is dropped); otherwise a failure naming both.
want() {
    local rc_want=$1 re=$2 rc=0 err; shift 2
    err=$("$@" 2>&1 >/dev/null) || rc=$?
    if [ "$rc" != "$rc_want" ] || ! grep -Eq -- "$re" <<<"$err"; then
        fail "$*: exit $rc (want $rc_want), stderr '$err' (want /$re/)"
    fi
}
