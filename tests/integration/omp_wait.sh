#!/usr/bin/env bash
# omp_wait.sh — m6d's OpenMP threads wait passively (issue 20): started
# without a policy, m6d sets OMP_WAIT_POLICY=passive and executes itself
# again before OpenMP reads it, keeping its pid; a policy the operator set
# (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is left as it is. Checked from the
# process's own environment (/proc/PID/environ) and m6d's start line, and a
# run still trains to its end under the re-executed m6d.
. "$(dirname "$0")/lib.sh"

env_of() {  # env_of PID NAME -> the value in PID's environment, or ""
    tr '\0' '\n' <"/proc/$1/environ" | sed -n "s/^$2=//p"
}

unset OMP_WAIT_POLICY GOMP_SPINCOUNT
start_daemon "$T/a"
[ "$(env_of "$DAEMON_PID" OMP_WAIT_POLICY)" = passive ] \
    || fail "m6d without a policy: OMP_WAIT_POLICY='$(env_of "$DAEMON_PID" OMP_WAIT_POLICY)', want passive"
# the same process, still named m6d (not "exe": ps, pgrep and systemd)
[ "$(ps -o comm= -p "$DAEMON_PID")" = m6d ] || fail "pid $DAEMON_PID is $(ps -o comm= -p "$DAEMON_PID"), not m6d"
grep -q "daemon.start .*pid=$DAEMON_PID .*omp_wait_policy=passive" "$T/m6d-a.log" \
    || fail "start line: $(grep daemon.start "$T/m6d-a.log")"
prepare_data "$T/data"
write_spec "$T/s.json" omp 6 3
R=$(ctl submit "$T/s.json") || fail "submit"
ctl watch "$R" >/dev/null || fail "run $R did not complete under the re-executed m6d"
stop_daemon

OMP_WAIT_POLICY=active start_daemon "$T/b"
[ "$(env_of "$DAEMON_PID" OMP_WAIT_POLICY)" = active ] \
    || fail "the operator's OMP_WAIT_POLICY=active became '$(env_of "$DAEMON_PID" OMP_WAIT_POLICY)'"
stop_daemon

GOMP_SPINCOUNT=1000 start_daemon "$T/c"
[ -z "$(env_of "$DAEMON_PID" OMP_WAIT_POLICY)" ] \
    || fail "GOMP_SPINCOUNT set: m6d still set OMP_WAIT_POLICY"
grep -q "omp_wait_policy=GOMP_SPINCOUNT" "$T/m6d-c.log" || fail "start line with GOMP_SPINCOUNT"
stop_daemon
echo "PASS: omp_wait"
