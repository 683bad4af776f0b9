#!/usr/bin/env python3
"""gen_dispatch_corpus.py [DIR] — writes the seed corpus of fuzz_dispatch
(default tests/fuzz/corpus/dispatch/): one byte stream per request type of
proto/m6.proto, each a valid Hello frame and then valid frames of that type
naming the fuzz state's runs (by id 1..5 and by name), plus a few that go
wrong on purpose (no Hello, bad version, oversized length, half a frame).
Hand-encoded protobuf (tests/integration/m6wire.py; no protobuf library
needed); field numbers as in
proto/m6.proto. Run it again after the protocol gains a request type."""
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus", "dispatch")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "integration"))
from m6wire import field_bytes as fb, field_varint as fv, frame  # noqa: E402


def hello(version=1):
    return frame(fb(1, fv(1, version) + fb(2, b"seed")))


def ref(run_id=0, name=None):
    return (fv(1, run_id) if run_id else b"") + (fb(2, name.encode()) if name else b"")


SPEC = b'{"name": "s", "data": {"train": "t/*.bin", "val": "v/*.bin"}}'
REF_TYPES = {"status": 4, "pause": 5, "resume": 6, "delink": 7, "stop": 8}

seeds = {}
seeds["hello"] = hello()
seeds["hello_bad_version"] = hello(7)
seeds["no_hello"] = frame(fb(4, ref(1)))
seeds["list"] = hello() + frame(fb(3, b""))
for kind, num in REF_TYPES.items():
    body = b"".join(frame(fb(num, ref(i))) for i in range(1, 6))
    body += frame(fb(num, ref(0, "beta"))) + frame(fb(num, ref(0, "gamma")))
    body += frame(fb(num, ref(-1))) + frame(fb(num, ref(99)))
    seeds[kind] = hello() + body
seeds["metrics"] = hello() + b"".join(
    frame(fb(9, fb(1, ref(r)) + fv(2, after) + fv(3, limit)))
    for r, after, limit in [(1, 0, 0), (1, 5, 2), (2, 0, 1), (1, -1, 0), (1, 0, 20000)])
seeds["events"] = hello() + b"".join(
    frame(fb(16, fb(1, ref(r)) + fv(2, after))) for r, after in [(1, 0), (1, 1), (3, 0)])
seeds["checkpoints"] = hello() + frame(fb(14, fb(1, ref(1)))) + frame(fb(14, fb(1, ref(0, "delta"))))
seeds["plan"] = hello() + frame(fb(10, fb(1, SPEC))) + frame(fb(10, fb(1, SPEC) + fv(2, 1 << 30)))
seeds["submit"] = hello() + frame(fb(2, fb(1, SPEC) + fb(2, b"s.json"))) + frame(fb(2, fb(1, b"{")))
seeds["unknown_type"] = hello() + frame(fb(13, b""))
seeds["garbage"] = hello() + frame(b"\xff\xff\xff\xff")
seeds["too_large"] = hello() + struct.pack(">I", 0x7FFFFFFF) + b"x"
seeds["half_frame"] = hello() + frame(fb(3, b""))[:3]

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
