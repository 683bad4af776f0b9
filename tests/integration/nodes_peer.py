#!/usr/bin/env python3
"""nodes_peer.py PORT CASE [ARG] — a hostile or wrong peer on the
coordinator's TCP port (tests/integration/nodes.sh), with hand-made frames
(no protobuf library). Each case checks what the coordinator answers and
that it closes the connection within MAX_S; exits non-zero on the first
failed check.

The port speaks TLS 1.3 keyed by the token (daemon/cluster/tls.h), which
python's ssl module cannot (no external PSKs): the cases inside TLS run
through m6tls (env M6TLS), which does the handshake and relays plaintext.

Before TLS (plain TCP, no handshake): garbage, huge, half, hello (a
control-socket Hello), plainjoin TOKEN_FILE (the old protocol: a StoreOpen
with the right token in clear) — each closed at once with at most a TLS
alert, never a Response; silent (nothing sent) — closed at the first-frame
timeout with nothing. wrongpsk TOKEN_FILE: m6tls with another token fails
the handshake. Inside TLS (TOKEN_FILE the right token): tlssilent,
tlshuge, tlshello — refused with a status; authgarbage TOKEN_FILE
STATE_DIR (a good StoreOpen as the coordinator's node, rank 0, whose
node-id and node-secret STATE_DIR holds; then garbage). flood N SECONDS (N idle connections held open that long;
those past the coordinator's limit must be closed at once)."""
import os
import select
import socket
import struct
import subprocess
import sys
import time

from m6wire import field_bytes, field_varint, parse_response

PORT = int(sys.argv[1])
CASE = sys.argv[2]
MAX_S = float(os.environ.get("MAX_S", "4"))
# proto/m6.proto's Status
UNAUTHENTICATED, TOO_LARGE = 12, 5


def connect():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=MAX_S + 2)
    return s


class TlsPeer:
    """A connection inside the port's TLS: m6tls as a subprocess, with the
    socket's sendall/recv."""

    def __init__(self, token_file):
        self.p = subprocess.Popen([os.environ["M6TLS"], "127.0.0.1:%d" % PORT, token_file],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

    def sendall(self, b):
        self.p.stdin.write(b)
        self.p.stdin.flush()

    def recv(self, n):
        fd = self.p.stdout.fileno()
        r, _, _ = select.select([fd], [], [], MAX_S + 2)
        if not r:
            raise socket.timeout()
        return os.read(fd, n)

    def err(self):
        self.p.wait(timeout=MAX_S + 2)
        return self.p.returncode, self.p.stderr.read().decode(errors="replace")


def read_to_close(s, what, t0, limit, timeout_msg, reset_ends=False):
    """Every byte s sends until it closes (a reset too when reset_ends),
    within limit s of t0; else exits naming what. Returns (bytes, took)."""
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            sys.exit("%s: %s within %.1f s" % (what, timeout_msg, MAX_S + 2))
        except ConnectionResetError:
            if not reset_ends:
                raise
            break
        if not chunk:
            break
        buf += chunk
    took = time.monotonic() - t0
    if took > limit:
        sys.exit("%s: closed after %.1f s, limit %.1f s" % (what, took, limit))
    return buf, took


def expect_refusal(s, want_status, what, t0):
    """One Response with want_status, then EOF, all within MAX_S of t0."""
    buf, took = read_to_close(s, what, t0, MAX_S, "no answer and no close")
    if len(buf) < 4:
        sys.exit("%s: closed without a refusal status (%d bytes)" % (what, len(buf)))
    n = struct.unpack(">I", buf[:4])[0]
    if len(buf) != 4 + n:
        sys.exit("%s: %d bytes after the refusal frame" % (what, len(buf) - 4 - n))
    st, msg = parse_response(buf[4:4 + n])
    if st != want_status:
        sys.exit("%s: status %d (%s), want %d" % (what, st, msg, want_status))
    print("%s: refused with status %d (%s) and closed after %.2f s" % (what, st, msg, took))


def expect_tls_close(s, what, t0, limit):
    """Closed within limit s of t0 with nothing but TLS alerts (records of
    type 21): a peer that does not speak the port's TLS gets no Response."""
    buf, took = read_to_close(s, what, t0, limit, "not closed", reset_ends=True)
    i = 0
    while i < len(buf):
        if buf[i] != 21 or i + 5 > len(buf):
            sys.exit("%s: got %r, not only TLS alerts" % (what, buf[:64]))
        i += 5 + struct.unpack(">H", buf[i + 3:i + 5])[0]
    print("%s: closed after %.2f s with %d bytes of TLS alert" % (what, took, len(buf)))


t0 = time.monotonic()
# a refusal before TLS is at once; 1 s leaves room for a busy machine
AT_ONCE = min(1.0, MAX_S)
if CASE == "garbage":
    s = connect()
    s.sendall(struct.pack(">I", 32) + os.urandom(32))
    expect_tls_close(s, "garbage", t0, AT_ONCE)
elif CASE == "huge":
    s = connect()
    s.sendall(b"\xff\xff\xff\xff" + b"x" * 100)
    expect_tls_close(s, "huge length", t0, AT_ONCE)
elif CASE == "half":
    s = connect()
    s.sendall(struct.pack(">I", 200) + b"\x12\x05hello")  # 7 of 200 bytes
    expect_tls_close(s, "half frame", t0, AT_ONCE)
elif CASE == "silent":
    s = connect()
    expect_tls_close(s, "no handshake", t0, MAX_S)
elif CASE == "hello":
    hello = field_bytes(1, field_varint(1, 1) + field_bytes(2, b"peer"))
    s = connect()
    s.sendall(struct.pack(">I", len(hello)) + hello)
    expect_tls_close(s, "Hello as first frame", t0, AT_ONCE)
elif CASE == "plainjoin":
    # the protocol before TLS: Request.store_open (20) with protocol_version
    # 1, the right token in clear (field 2, now reserved), run 1
    tok = open(sys.argv[3], "rb").read().rstrip(b"\n")
    so = field_varint(1, 1) + field_bytes(2, tok) + field_varint(3, 1)
    rq = field_bytes(20, so)
    s = connect()
    s.sendall(struct.pack(">I", len(rq)) + rq)
    expect_tls_close(s, "StoreOpen in clear with the right token", t0, AT_ONCE)
elif CASE == "wrongpsk":
    p = TlsPeer(sys.argv[3])
    rc, err = p.err()
    took = time.monotonic() - t0
    if rc != 1 or "TLS handshake failed" not in err:
        sys.exit("wrongpsk: m6tls rc %d: %s" % (rc, err))
    if took > AT_ONCE + 1:
        sys.exit("wrongpsk: refused after %.1f s" % took)
    print("wrongpsk: %s" % err.strip())
elif CASE == "tlssilent":
    expect_refusal(TlsPeer(sys.argv[3]), UNAUTHENTICATED, "TLS, then no first frame", t0)
elif CASE == "tlshuge":
    p = TlsPeer(sys.argv[3])
    p.sendall(b"\xff\xff\xff\xff" + b"x" * 100)
    expect_refusal(p, TOO_LARGE, "TLS, then a huge length", t0)
elif CASE == "tlshello":
    hello = field_bytes(1, field_varint(1, 1) + field_bytes(2, b"peer"))
    p = TlsPeer(sys.argv[3])
    p.sendall(struct.pack(">I", len(hello)) + hello)
    expect_refusal(p, UNAUTHENTICATED, "TLS, then a Hello as first frame", t0)
elif CASE == "authgarbage":
    # inside TLS, a good StoreOpen, then a frame that is not a Request:
    # refused BAD_REQUEST and closed; an authenticated peer is not trusted
    # with malformed input either
    # as rank 0, with the coordinator's node id and secret (STATE_DIR)
    sd = sys.argv[4]
    uuid = open(os.path.join(sd, "node-id"), "rb").read().strip()
    secret = open(os.path.join(sd, "node-secret"), "rb").read()
    so = field_varint(1, 1) + field_varint(3, 1) + field_bytes(5, uuid) + field_bytes(6, secret)
    rq = field_bytes(20, so)
    s = TlsPeer(sys.argv[3])
    s.sendall(struct.pack(">I", len(rq)) + rq)
    hdr = s.recv(4)
    n = struct.unpack(">I", hdr)[0]
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    st, msg = parse_response(body)
    if st != 0:
        sys.exit("authgarbage: StoreOpen inside TLS refused: %d %s" % (st, msg))
    t0 = time.monotonic()
    s.sendall(struct.pack(">I", 8) + b"\xff" * 8)
    expect_refusal(s, 1, "garbage after a good StoreOpen", t0)  # BAD_REQUEST
elif CASE == "flood":
    n, hold = int(sys.argv[3]), float(sys.argv[4])
    socks = [connect() for _ in range(n)]
    time.sleep(0.3)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
    if closed < n - 64:
        sys.exit("flood: %d of %d idle connections closed at once, want >= %d" % (closed, n, n - 64))
    print("flood: %d idle connections, %d closed at once (over the limit of 64)" % (n, closed))
    open(sys.argv[5], "w").close() if len(sys.argv) > 5 else None  # "holding" marker
    time.sleep(hold)
else:
    sys.exit("unknown case " + CASE)
