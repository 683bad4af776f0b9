#!/usr/bin/env bash
# cli.sh — m6ctl's user-facing contract: exit codes (the same for the same
# mistake in every command), argument checks that name the option, and
# what data prepare leaves behind and says.
. "$(dirname "$0")/lib.sh"

# expect_rc WANT CMD...: run CMD (stderr in $T/err), assert its exit status.
expect_rc() {
    local want=$1 rc=0; shift
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = "$want" ] || fail "$* exited $rc, want $want: $(cat "$T/err")"
}

prepare_data "$T/data"
write_spec "$T/spec.json" cli 100000 10
start_daemon "$T/s"

# A malformed RUN is a usage error (2) and an unknown one m6d's refusal (1),
# whichever command names it.
for c in status watch pause resume delink stop metrics; do
    expect_rc 2 ctl "$c" 0
    grep -q 'RUN must be an id > 0' "$T/err" || fail "$c 0: $(cat "$T/err")"
    expect_rc 2 ctl "$c" 99999999999999999999
    expect_rc 1 ctl "$c" 4242
    grep -q 'no run with id 4242' "$T/err" || fail "$c 4242: $(cat "$T/err")"
done

stop_daemon
echo "cli: ok"
