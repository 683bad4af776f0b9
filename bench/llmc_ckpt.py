#!/usr/bin/python3
"""llmc_ckpt.py — writes the inputs llm.c's train_gpt2.c needs to train a GPT-2
of any shape, so that its speed can be compared with bench/cpu_train's at the
same L, C, NH, T, B, V:

  gpt2_124M.bin    a random-initialised fp32 checkpoint in llm.c's layout
                   (256 int32 header: magic 20240326, version 3, maxT, V, L,
                   NH, C, Vp; then the 16 parameter tensors in llm.c's order)
  <data>_train.bin, <data>_val.bin
                   token files in llm.c's layout (256 int32 header: magic
                   20240520, version 1, token count; then uint16 tokens),
                   tokens uniform in [0, V)

train_gpt2.c opens these names relative to its working directory
(dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin), so run it from
OUT. The layout is written from llm.c's, not from m6's reader. Initialisation
follows GPT-2's: weights normal(0, 0.02), layernorm gains 1, biases 0; the
values do not matter for speed.

usage: llmc_ckpt.py OUT [--layers 6] [--embd 384] [--heads 6] [--max-seq 64]
                        [--vocab 256] [--tokens 1000000] [--seed 1]
Vp (the padded vocabulary) is V rounded up to a multiple of 128, as llm.c pads.
"""
import argparse
import os
import struct

import numpy as np


def param_shapes_(L, C, maxT, Vp):
    """llm.c's 16 parameter tensors, in file order: (name, element count)."""
    return [("wte", Vp * C), ("wpe", maxT * C),
            ("ln1w", L * C), ("ln1b", L * C),
            ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C),
            ("attprojw", L * C * C), ("attprojb", L * C),
            ("ln2w", L * C), ("ln2b", L * C),
            ("fcw", L * 4 * C * C), ("fcb", L * 4 * C),
            ("fcprojw", L * C * 4 * C), ("fcprojb", L * C),
            ("lnfw", C), ("lnfb", C)]


def write_ckpt_(path, L, C, NH, maxT, V, rng):
    Vp = (V + 127) // 128 * 128
    hdr = [0] * 256
    hdr[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        for name, n in param_shapes_(L, C, maxT, Vp):
            if name.endswith("b"):
                x = np.zeros(n, np.float32)
            elif name in ("ln1w", "ln2w", "lnfw"):
                x = np.ones(n, np.float32)
            else:
                x = rng.normal(0.0, 0.02, n).astype(np.float32)
            f.write(x.astype("<f4").tobytes())


def write_tokens_(path, n, V, rng):
    hdr = [0] * 256
    hdr[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(rng.integers(0, V, n).astype("<u2").tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--max-seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=1000000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if min(a.layers, a.embd, a.heads, a.max_seq, a.vocab, a.tokens) < 1:
        raise SystemExit("llmc_ckpt: every size must be at least 1")
    if a.embd % a.heads:
        raise SystemExit(f"llmc_ckpt: C {a.embd} is not a multiple of NH {a.heads}")
    if a.vocab > 65536:
        raise SystemExit(f"llmc_ckpt: vocab {a.vocab} does not fit llm.c's uint16 tokens")
    rng = np.random.default_rng(a.seed)
    data = os.path.join(a.out, "dev", "data", "tinyshakespeare")
    os.makedirs(data, exist_ok=True)
    write_ckpt_(os.path.join(a.out, "gpt2_124M.bin"), a.layers, a.embd,
                a.heads, a.max_seq, a.vocab, rng)
    for split in ("train", "val"):
        write_tokens_(os.path.join(data, f"tiny_shakespeare_{split}.bin"),
                      a.tokens, a.vocab, rng)
    print(f"llmc_ckpt: L {a.layers} C {a.embd} NH {a.heads} maxT {a.max_seq} "
          f"V {a.vocab} in {a.out}")


if __name__ == "__main__":
    main()
