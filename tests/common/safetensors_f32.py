"""safetensors_f32.py — the Python oracles' one reader of the safetensors
files m6 writes (daemon/ckpt/checkpoint.c safetensors_write: an 8-byte
little-endian header length, a JSON header, then the tensors; every tensor
F32). Parsed by hand so that the oracles depend on nothing of m6's and on
no safetensors package.

Imported by tests/unit/torch_reference.py, tests/unit/torch_adafactor.py
and tests/export/hf_reference.py, each of which turns the raw bytes into
its own library's arrays.
"""
import json
import math
import struct


def read_f32(path):
    """({name: (shape, raw little-endian float32 bytes)}, metadata dict).

    Fails (AssertionError naming the tensor) on a dtype other than F32 or a
    byte range that does not hold shape's element count."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = buf[8 + n:]
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        numel = math.prod(e["shape"]) if e["shape"] else 1
        assert b - a == 4 * numel, (name, e)
        out[name] = (e["shape"], data[a:b])
    return out, meta
