#!/usr/bin/env python3
"""gen_llmc_corpus.py [DIR] — writes the seed corpus of fuzz_llmc (default
tests/fuzz/corpus/llmc/): llm.c GPT-2 checkpoints (train_gpt2.c's layout:
256 int32 header, magic 20240326, version 3 fp32 or 5 bf16, then the 16
parameter tensors) of a tiny model, sized by hand from llm.c's layout (not
from m6's reader), plus headers that go wrong."""
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus", "llmc")


def llmc(maxT, V, L, NH, C, Vp, version=3, magic=20240326, extra=0):
    hdr = [0] * 256
    hdr[:8] = [magic, version, maxT, V, L, NH, C, Vp]
    n = (Vp * C + maxT * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C
                                  + 4 * C * C + 4 * C + 4 * C * C + C) + C + C)
    n += extra
    esz = 4 if version == 3 else 2
    body = bytes((i * 37 + 11) & 0xFF for i in range(n * esz))
    return struct.pack("<256i", *hdr) + body


seeds = {
    "fp32": llmc(4, 8, 1, 1, 4, 128),
    "bf16": llmc(4, 8, 2, 2, 4, 128, version=5),
    "trailing": llmc(4, 8, 1, 1, 4, 128, extra=1),
    "bad_magic": llmc(4, 8, 1, 1, 4, 128, magic=20240520),
    "bad_version": llmc(4, 8, 1, 1, 4, 128, version=4),
    "truncated": llmc(4, 8, 1, 1, 4, 128)[:1500],
    "huge_header": llmc(4, 8, 1, 1, 4, 128)[:1024].replace(
        struct.pack("<5i", 4, 8, 1, 1, 4), struct.pack("<5i", 1 << 20, 1 << 24, 4096, 1, 1 << 16)),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
