#!/usr/bin/env bash
# conn_limits.sh — idle and piled-up connections on the control socket
# (server.h's limits): with 200 idle connections open, `m6ctl status RUN`
# still gets its answer (the run's name, state and step) at once, and so
# does `m6ctl list`; past SERVER_CONN_MAX (512) connections a new one is
# answered STATUS_BUSY (14) naming the limit and closed; connections idle
# past --conn-idle-timeout are closed by m6d, after which m6ctl is served
# again. Bounded: at most 530 connections, each wait a few seconds.
. "$(dirname "$0")/lib.sh"

start_daemon "$T/s" --conn-idle-timeout 2
ulimit -n 4096 2>/dev/null || true
# a finished run for `m6ctl status` to show
prepare_data "$T/data"
MARK=idle$RANDOM
write_spec "$T/run.json" "$MARK" 4 2
RUN=$(ctl submit "$T/run.json")
ctl watch "$RUN" >/dev/null || fail "run $RUN did not complete"
STEP=$(field "$RUN" step)
[ "$(field "$RUN" state)" = completed ] && [ "$STEP" = 4 ] || fail "run $RUN: $(ctl status "$RUN")"
WIRE_DIR=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH=$WIRE_DIR /usr/bin/python3 - "$SOCK" "$M6CTL" "$RUN" "$MARK" <<'PY' || fail "connection limits (above)"
import json, socket, subprocess, sys, time
from m6wire import parse_response, recv_exact
SOCK, M6CTL, RUN, MARK = sys.argv[1:5]
CONN_MAX, BUSY = 512, 14

def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK)
    return s

def ctl_list():
    t0 = time.monotonic()
    r = subprocess.run([M6CTL, "--socket", SOCK, "list"], capture_output=True, text=True, timeout=30)
    return r.returncode, time.monotonic() - t0, r.stderr.strip()

def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

def still_open(socks):
    n = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_DONTWAIT) != b"":
                fail("m6d sent bytes on an idle connection")
        except BlockingIOError:
            n += 1
    return n

idle = [conn() for _ in range(200)]
t0 = time.monotonic()
r = subprocess.run([M6CTL, "--socket", SOCK, "status", RUN, "--json"],
                   capture_output=True, text=True, timeout=30)
dt = time.monotonic() - t0
if r.returncode != 0 or dt > 2.0:
    fail("with 200 idle connections m6ctl status %s gave exit %d after %.2f s: %s"
         % (RUN, r.returncode, dt, r.stderr.strip()))
st = json.loads(r.stdout)
if (st.get("name"), st.get("state"), st.get("step")) != (MARK, "completed", 4):
    fail("m6ctl status %s beside 200 idle connections: %r" % (RUN, r.stdout[:300]))
n_open = still_open(idle)
if n_open != len(idle):
    fail("only %d of 200 idle connections were still open when m6ctl status "
         "answered (%.2f s; the idle timeout is 2 s)" % (n_open, dt))
print("# 200 idle connections open: m6ctl status answered in %.3f s" % dt, file=sys.stderr)
rc, dt, err = ctl_list()
if rc != 0 or dt > 2.0:
    fail("with 200 idle connections m6ctl list gave exit %d after %.2f s: %s" % (rc, dt, err))
print("# 200 idle connections: m6ctl list answered in %.3f s" % dt, file=sys.stderr)

# up to the cap and past it: each of the ones past it gets STATUS_BUSY
idle += [conn() for _ in range(CONN_MAX - 200)]
extra = [conn() for _ in range(10)]
busy = 0
for s in extra:
    s.settimeout(5)
    try:
        n = int.from_bytes(recv_exact(s, 4), "big")
        st, msg = parse_response(recv_exact(s, n))
    except (EOFError, socket.timeout, ConnectionResetError) as e:
        fail("a connection past %d was not answered: %s" % (CONN_MAX, e))
    if st != BUSY or "at most %d" % CONN_MAX not in msg:
        fail("a connection past %d: status %d, %r (want %d naming the limit)" % (CONN_MAX, st, msg, BUSY))
    busy += 1
    try:
        if s.recv(1) != b"":
            fail("a refused connection was not closed")
    except socket.timeout:
        fail("a refused connection was not closed within 5 s")
print("# %d connections past %d: STATUS_BUSY, closed (%s)" % (busy, CONN_MAX, msg), file=sys.stderr)

# idle past --conn-idle-timeout 2: m6d closes them (the sweep runs every
# tenth of the timeout, so within 2.2 s of the last byte; allow 6 s)
t0 = time.monotonic()
closed = 0
for s in idle:
    s.settimeout(max(0.1, 6 - (time.monotonic() - t0)))
    try:
        if s.recv(1) == b"":
            closed += 1
    except socket.timeout:
        pass
if closed != len(idle):
    fail("%d of %d idle connections closed by m6d within 6 s" % (closed, len(idle)))
print("# %d idle connections closed by m6d after %.1f s" % (closed, time.monotonic() - t0), file=sys.stderr)
rc, dt, err = ctl_list()
if rc != 0:
    fail("after the idle connections went, m6ctl list gave exit %d: %s" % (rc, err))
PY
kill -0 "$DAEMON_PID" || fail "m6d died"
n=$(grep -c 'conn.refused' "$T/m6d-s.log" || true)
[ "$n" -le 3 ] || fail "10 refusals in about a second wrote $n conn.refused log lines (want a count, at most a few lines)"
stop_daemon
echo "conn_limits: ok"
