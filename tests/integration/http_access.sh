#!/usr/bin/env bash
# http_access.sh — who may ask m6d's HTTP API (daemon/http): --metrics-listen
# PORT binds loopback only; a request whose Host is a name of someone
# else's (a DNS-rebinding page: Host: evil.example) is refused 421, IP
# literals, localhost and --metrics-host names are served; one client
# address holding many idle connections does not starve /metrics for
# another (HTTP_PER_ADDRESS_MAX); with --metrics-token-file every request
# needs the bearer token (401 without); the refusals of libmicrohttpd are
# logged once per 10 s, not once each. Bounded: 64 connections, a few
# seconds each; and a client that stops sending, before or in the middle
# of its request headers, is closed after HTTP_TIMEOUT_S (15 s), and one
# that trickles its headers a byte every 2 s (never idle) after
# HTTP_HEADERS_DEADLINE_S (15 s): the check runs beside the others and
# waits at most 22 s.
. "$(dirname "$0")/lib.sh"
HTTP_TIMEOUT_S=15           # daemon/http/http.h
HTTP_HEADERS_DEADLINE_S=15  # daemon/http/http.h

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_daemon "$T/s" --metrics-listen "$PORT" --metrics-host dash.example,other.example

# the silent clients, from 127.0.0.5, watched in the background: one sends
# nothing, one half a request's headers; each must be closed by m6d
# between HTTP_TIMEOUT_S - 1 and HTTP_TIMEOUT_S + 7 s after its last byte.
# And one from 127.0.0.6 that sends a byte of its headers every 2 s: closed
# between HTTP_HEADERS_DEADLINE_S - 1 and + 7 s after its first
/usr/bin/python3 - "$PORT" "$HTTP_TIMEOUT_S" "$HTTP_HEADERS_DEADLINE_S" >"$T/silent.out" 2>&1 <<'PY' &
import socket, sys, threading, time
PORT, TMO, DEADLINE = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
trickled = [None]
def trickle():
    s = socket.socket()
    s.bind(("127.0.0.6", 0))
    s.connect(("127.0.0.1", PORT))
    t0 = time.monotonic()
    req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 100
    try:
        for b in req:
            s.sendall(bytes([b]))
            s.settimeout(2)
            try:
                if not s.recv(4096):
                    break
            except socket.timeout:
                pass
            if time.monotonic() - t0 > DEADLINE + 7:
                break
        else:
            pass
    except (BrokenPipeError, ConnectionResetError):
        pass
    trickled[0] = time.monotonic() - t0
    s.close()
tr = threading.Thread(target=trickle)
tr.start()
socks = []
for what, data in (("no bytes", b""),
                   ("half the headers", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Ag")):
    s = socket.socket()
    s.bind(("127.0.0.5", 0))
    s.connect(("127.0.0.1", PORT))
    s.sendall(data)
    socks.append((what, s, time.monotonic()))
bad = 0
for what, s, t0 in socks:
    s.settimeout(max(0.1, TMO + 7 - (time.monotonic() - t0)))
    try:
        got = s.recv(4096)
        while got:  # an error response at most, then the close
            got = s.recv(4096)
        took = time.monotonic() - t0
    except socket.timeout:
        print("a client that sent %s is still open after %.0f s" % (what, TMO + 7))
        bad = 1
        continue
    except ConnectionResetError:
        took = time.monotonic() - t0
    if took < TMO - 1:
        print("a client that sent %s was closed after %.1f s, before the %g s timeout" % (what, took, TMO))
        bad = 1
    else:
        print("a client that sent %s: closed after %.1f s" % (what, took))
tr.join()
if not DEADLINE - 1 <= trickled[0] <= DEADLINE + 7:
    print("a client trickling its headers a byte every 2 s was closed after %.1f s, "
          "want %g s" % (trickled[0], DEADLINE))
    bad = 1
else:
    print("a client trickling its headers a byte every 2 s: closed after %.1f s" % trickled[0])
sys.exit(bad)
PY
SILENT=$!

# loopback by default: the listening socket is 127.0.0.1's
command -v ss >/dev/null || fail "ss (iproute2) is needed to read the listening address"
ss -ltnH "sport = :$PORT" >"$T/ss.out"
grep -q "127.0.0.1:$PORT" "$T/ss.out" || fail "--metrics-listen $PORT is not bound to loopback: $(cat "$T/ss.out")"

/usr/bin/python3 - "$PORT" <<'PY' || fail "HTTP access checks (above)"
import http.client, socket, sys, time
PORT = int(sys.argv[1])

def get(host_header, path="/metrics", src="127.0.0.1", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5, source_address=(src, 0))
    c.putrequest("GET", path, skip_host=True)
    if host_header is not None:
        c.putheader("Host", host_header)
    for k, v in (headers or {}).items():
        c.putheader(k, v)
    c.endheaders()
    r = c.getresponse()
    body = r.read().decode(errors="replace")
    c.close()
    return r.status, body

def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

for host, want in [("evil.example", 421), ("evil.example:%d" % PORT, 421),
                   ("127.0.0.1:%d" % PORT, 200), ("localhost:%d" % PORT, 200),
                   ("[::1]:%d" % PORT, 200), ("dash.example", 200),
                   ("OTHER.example:%d" % PORT, 200), ("dash.example.evil", 421)]:
    st, body = get(host, "/api/runs")
    if st != want:
        fail("Host: %s gave %d, want %d: %s" % (host, st, want, body[:200]))
    if want == 421 and "is not a name of this server" not in body:
        fail("the 421 does not say why: %r" % body[:200])
print("# Host check: evil.example refused 421, IP literals, localhost and --metrics-host served", file=sys.stderr)

# 64 idle connections from 127.0.0.2 (the whole of 127/8 is loopback):
# /metrics from 127.0.0.1 is still served at once
idle = []
for _ in range(64):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", PORT))
        idle.append(s)
    except OSError:
        break
time.sleep(0.3)
t0 = time.monotonic()
try:
    st, body = get("127.0.0.1:%d" % PORT)
except (OSError, http.client.HTTPException) as e:
    fail("with 64 idle connections from 127.0.0.2, /metrics from 127.0.0.1 failed: %r" % e)
dt = time.monotonic() - t0
if st != 200 or dt > 2:
    fail("with 64 idle connections from 127.0.0.2, /metrics from 127.0.0.1: %d after %.2f s" % (st, dt))
# how many of the 64 the server kept: at most the per-address limit
alive = 0
for s in idle:
    s.settimeout(0.2)
    try:
        if s.recv(1) != b"":
            alive += 1
    except socket.timeout:
        alive += 1
    except OSError:
        pass
if alive > 8:
    fail("%d idle connections from one address are held, want at most 8" % alive)
print("# 64 idle connections from 127.0.0.2: %d held; /metrics from 127.0.0.1 in %.3f s" % (alive, dt), file=sys.stderr)
PY
# libmicrohttpd refused the 56 connections past the per-address limit,
# saying so for each: m6d logs the message once per HTTP_LOG_INTERVAL_S
n=$(grep -c 'http.error msg=".*connection limit' "$T/m6d-s.log" || true)
[ "$n" -ge 1 ] && [ "$n" -le 2 ] \
    || fail "$n http.error lines for 56 refused connections (want 1 or 2: one per 10 s)"
wait "$SILENT" || fail "silent HTTP clients: $(cat "$T/silent.out")"
log "$(tr '\n' ';' <"$T/silent.out")"
stop_daemon

# a bearer token
write_token "$T/http.token" 24
start_daemon "$T/s" --metrics-listen "127.0.0.1:$PORT" --metrics-token-file "$T/http.token"
/usr/bin/python3 - "$PORT" "$(cat "$T/http.token")" <<'PY' || fail "HTTP token checks (above)"
import http.client, sys
PORT, TOKEN = int(sys.argv[1]), sys.argv[2]
def get(headers):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    c.request("GET", "/metrics", headers=headers)
    r = c.getresponse(); r.read(); c.close()
    return r.status, r.getheader("WWW-Authenticate")
for hdr, want in [({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                  ({"Authorization": "Bearer " + TOKEN[:-1]}, 401),
                  ({"Authorization": "Bearer " + TOKEN}, 200)]:
    st, www = get(hdr)
    if st != want:
        print("FAIL: %r gave %d, want %d" % (hdr, st, want), file=sys.stderr); sys.exit(1)
    if st == 401 and www != "Bearer":
        print("FAIL: 401 without WWW-Authenticate: Bearer", file=sys.stderr); sys.exit(1)
print("# bearer token: 401 without it or with a wrong one, 200 with it", file=sys.stderr)
PY
stop_daemon
echo "http_access: ok"
