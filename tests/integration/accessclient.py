#!/usr/bin/env python3
"""accessclient.py SOCKET REQUEST... — one connection to m6d, Hello first,
then each REQUEST in turn; prints one line per request, "NAME STATUS
MESSAGE" (STATUS the Response's status number), or "NAME closed" when m6d
closed the connection (nothing more is sent then). Hand-made protobuf
frames (proto/m6.proto field numbers), so no protobuf library is needed and
names m6ctl refuses on its side (".." "/" absolute paths) reach m6d.

REQUEST: list | status:ID | status-name:NAME | stop-name:NAME |
pause-name:NAME | pause:ID | submit:SPECFILE[:ORIGIN]"""
import socket
import struct
import sys


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fbytes(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def fvarint(num, v):
    return varint(num << 3) + varint(v)


def read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def parse_response(buf):
    i, status, msg = 0, 0, ""
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
            if num == 1:
                status = v
        elif wt == 2:
            ln, i = read_varint(buf, i)
            if num == 2:
                msg = buf[i:i + ln].decode(errors="replace")
            i += ln
        elif wt == 5:
            i += 4
        elif wt == 1:
            i += 8
        else:
            raise ValueError("wire type %d" % wt)
    return status, msg


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def run_ref(by_id=None, name=None):
    return fvarint(1, by_id) if by_id is not None else fbytes(2, name.encode())


def request(spec):
    kind, _, arg = spec.partition(":")
    if kind == "hello":
        return fbytes(1, fvarint(1, 1) + fbytes(2, b"accessclient"))
    if kind == "list":
        return fbytes(3, b"")
    if kind == "status":
        return fbytes(4, run_ref(by_id=int(arg)))
    if kind == "status-name":
        return fbytes(4, run_ref(name=arg))
    if kind == "pause":
        return fbytes(5, run_ref(by_id=int(arg)))
    if kind == "pause-name":
        return fbytes(5, run_ref(name=arg))
    if kind == "stop-name":
        return fbytes(8, run_ref(name=arg))
    if kind == "submit":
        path, _, origin = arg.partition(":")
        with open(path, "rb") as f:
            body = fbytes(1, f.read()) + fbytes(2, (origin or path).encode())
        return fbytes(2, body)
    raise SystemExit("unknown request %r" % spec)


def main():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sys.argv[1])
    for spec in ["hello"] + sys.argv[2:]:
        payload = request(spec)
        try:
            s.sendall(struct.pack(">I", len(payload)) + payload)
            (n,) = struct.unpack(">I", recv_exact(s, 4))
            status, msg = parse_response(recv_exact(s, n))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            print(spec.partition(":")[0], "closed", flush=True)
            return
        print(spec.partition(":")[0], status, msg.replace("\n", " "), flush=True)


main()
