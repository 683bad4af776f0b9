#!/usr/bin/env python3
"""accessclient.py SOCKET REQUEST... — one connection to m6d, Hello first,
then each REQUEST in turn; prints one line per request, "NAME STATUS
MESSAGE" (STATUS the Response's status number), or "NAME closed" when m6d
closed the connection (nothing more is sent then). Hand-made protobuf
frames (proto/m6.proto field numbers), so no protobuf library is needed and
names m6ctl refuses on its side (".." "/" absolute paths) reach m6d.

REQUEST: list | status:ID | status-name:NAME | stop-name:NAME |
pause-name:NAME | pause:ID | submit:SPECFILE[:ORIGIN] | big:N (a frame
header announcing N bytes and 16 of them, the rest never sent: m6d must
answer from the header; "big timeout" when it waits 5 s for the rest).
With -n first, no Hello is sent."""
import socket
import struct
import sys

from m6wire import field_bytes as fbytes, field_varint as fvarint
from m6wire import parse_response, recv_exact


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
    args = sys.argv[2:]
    first = ["hello"]
    if args[:1] == ["-n"]:
        args, first = args[1:], []
    for spec in first + args:
        try:
            if spec.startswith("big:"):
                s.settimeout(5)
                s.sendall(struct.pack(">I", int(spec[4:])) + b"\x1a" * 16)
            else:
                payload = request(spec)
                s.sendall(struct.pack(">I", len(payload)) + payload)
            (n,) = struct.unpack(">I", recv_exact(s, 4))
            status, msg = parse_response(recv_exact(s, n))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            print(spec.partition(":")[0], "closed", flush=True)
            return
        except socket.timeout:
            print(spec.partition(":")[0], "timeout", flush=True)
            return
        print(spec.partition(":")[0], status, msg.replace("\n", " "), flush=True)


main()
