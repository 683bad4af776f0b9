"""m6wire.py — the protobuf wire format by hand, for the test clients that
must send what no protobuf library would (garbage, half frames, unknown
fields): varints, length-delimited and varint fields, m6's frames (a 4-byte
big-endian length, then the message) and a Response's status and message
(fields 1 and 2 of proto/m6.proto's Response). Imported by rawclient.py,
accessclient.py, nodes_peer.py and tests/fuzz/gen_dispatch_corpus.py."""
import struct


def varint(n):
    n &= (1 << 64) - 1  # negative int64: ten bytes, as protobuf does
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_bytes(num, payload):
    """A length-delimited field (wire type 2)."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def field_varint(num, v):
    """A varint field (wire type 0)."""
    return varint(num << 3) + varint(v)


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def read_varint(buf, i):
    """-> (value, the index after it)."""
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def parse_response(buf):
    """-> (status, message) from a Response's fields 1 and 2; the other
    fields are skipped."""
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
    """n bytes from socket s; EOFError when it closes first."""
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf
