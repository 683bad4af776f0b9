#!/usr/bin/env python3
"""nodes_peer.py PORT CASE [ARG] — a hostile or wrong peer on the
coordinator's TCP port (tests/integration/nodes.sh), with hand-made frames
(no protobuf library). Each case checks what the coordinator answers and
that it closes the connection within MAX_S; exits non-zero on the first
failed check.

Cases: garbage, huge, half, silent, hello (a control-socket Hello as first
frame), wrongtoken (a StoreOpen with a wrong token), authgarbage TOKEN_FILE
(a good StoreOpen, then garbage), flood N SECONDS (N
idle connections held open that long; those past the coordinator's limit
must be closed at once)."""
import os
import socket
import struct
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


def expect_refusal(s, want_status, what, t0):
    """One Response with want_status, then EOF, all within MAX_S of t0."""
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            sys.exit("%s: no answer and no close within %.1f s" % (what, MAX_S + 2))
        if not chunk:
            break
        buf += chunk
    took = time.monotonic() - t0
    if took > MAX_S:
        sys.exit("%s: closed after %.1f s, limit %.1f s" % (what, took, MAX_S))
    if len(buf) < 4:
        sys.exit("%s: closed without a refusal status (%d bytes)" % (what, len(buf)))
    n = struct.unpack(">I", buf[:4])[0]
    if len(buf) != 4 + n:
        sys.exit("%s: %d bytes after the refusal frame" % (what, len(buf) - 4 - n))
    st, msg = parse_response(buf[4:4 + n])
    if st != want_status:
        sys.exit("%s: status %d (%s), want %d" % (what, st, msg, want_status))
    print("%s: refused with status %d (%s) and closed after %.2f s" % (what, st, msg, took))


t0 = time.monotonic()
if CASE == "garbage":
    s = connect()
    s.sendall(struct.pack(">I", 32) + os.urandom(32))
    expect_refusal(s, UNAUTHENTICATED, "garbage", t0)
elif CASE == "huge":
    s = connect()
    s.sendall(b"\xff\xff\xff\xff" + b"x" * 100)
    expect_refusal(s, TOO_LARGE, "huge length", t0)
elif CASE == "half":
    s = connect()
    s.sendall(struct.pack(">I", 200) + b"\x12\x05hello")  # 7 of 200 bytes
    expect_refusal(s, UNAUTHENTICATED, "half frame", t0)
elif CASE == "silent":
    s = connect()
    expect_refusal(s, UNAUTHENTICATED, "no first frame", t0)
elif CASE == "hello":
    hello = field_bytes(1, field_varint(1, 1) + field_bytes(2, b"peer"))
    s = connect()
    s.sendall(struct.pack(">I", len(hello)) + hello)
    expect_refusal(s, UNAUTHENTICATED, "Hello as first frame", t0)
elif CASE == "wrongtoken":
    # Request.store_open (20): protocol_version 1, token, run 1, generation 0
    so = field_varint(1, 1) + field_bytes(2, b"not-the-token-at-all") + field_varint(3, 1)
    rq = field_bytes(20, so)
    s = connect()
    s.sendall(struct.pack(">I", len(rq)) + rq)
    expect_refusal(s, UNAUTHENTICATED, "wrong token", t0)
elif CASE == "authgarbage":
    # the right token (a StoreOpen), then a frame that is not a Request:
    # refused BAD_REQUEST and closed; an authenticated peer is not trusted
    # with malformed input either
    tok = open(sys.argv[3], "rb").read().rstrip(b"\n")
    so = field_varint(1, 1) + field_bytes(2, tok) + field_varint(3, 1)
    rq = field_bytes(20, so)
    s = connect()
    s.sendall(struct.pack(">I", len(rq)) + rq)
    n = struct.unpack(">I", s.recv(4))[0]
    st, msg = parse_response(s.recv(n))
    if st != 0:
        sys.exit("authgarbage: StoreOpen with the right token refused: %d %s" % (st, msg))
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
