#!/usr/bin/python3
"""hf_reference.py — an independent PyTorch GPT-2 in Hugging Face's layout
(GPT2LMHeadModel's state dict and GPT2Config), for the export tests. It is
written against HF's layout, not against m6's code: Conv1D weights are
(in, out) and applied as x @ W + b; c_attn's output splits into Q, K, V
along the last dim, each split into heads (NH, hs); the LM head is wte
itself. The safetensors file is read by tests/common/safetensors_f32.py
(parsed by hand, no safetensors module).

  check HF_DIR M6_LOGITS.f32 TOKEN...     the exported directory's logits
      against m6's (tests/export/m6_logits.c) within 1e-4; exact key set,
      shapes and config checked first.
  write-llmc OUT.bin VERSION SEED V L NH C T   random weights written in
      llm.c's GPT-2 checkpoint layout (version 3 fp32, 5 bf16).
  llmc-loss FILE.bin SHARD_GLOB SEED B   the mean loss of the llm.c
      weights on m6's first training batch (spec train.seed SEED, B
      windows of T+1 tokens drawn by m6's documented sampler).
"""
import glob
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float32)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "common"))
from safetensors_f32 import read_f32  # noqa: E402

HF_LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def read_safetensors(path):
    """({name: float32 tensor}, metadata) of a safetensors file (F32 only)."""
    tensors, meta = read_f32(path)
    return {name: torch.frombuffer(bytearray(raw), dtype=torch.float32)
            .reshape(shape).clone()
            for name, (shape, raw) in tensors.items()}, meta


def hf_shapes(cfg):
    """The state dict GPT2LMHeadModel expects (persistent tensors; the LM
    head tied to wte is not stored)."""
    C, L, V, T = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
    inner = cfg.get("n_inner") or 4 * C
    want = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C),
            "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
    per = {"ln_1.weight": (C,), "ln_1.bias": (C,),
           "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
           "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
           "ln_2.weight": (C,), "ln_2.bias": (C,),
           "mlp.c_fc.weight": (C, inner), "mlp.c_fc.bias": (inner,),
           "mlp.c_proj.weight": (inner, C), "mlp.c_proj.bias": (C,)}
    for l in range(L):
        for k, s in per.items():
            want[f"transformer.h.{l}.{k}"] = s
    return want


def gelu(x, kind):
    if kind == "gelu_new":  # the tanh approximation
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "gelu":
        return torch.nn.functional.gelu(x)
    raise SystemExit(f"activation_function {kind!r} not handled")


def hf_forward(sd, cfg, ids):
    """logits (B, T, V) of GPT2LMHeadModel with state dict sd, in float64
    (so the reference's own rounding is far below the tolerance)."""
    sd = {k: v.double() for k, v in sd.items()}
    B, T = ids.shape
    C, NH = cfg["n_embd"], cfg["n_head"]
    hs = C // NH
    eps = cfg["layer_norm_epsilon"]
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), sd[p + ".weight"], sd[p + ".bias"], eps)
    conv1d = lambda x, p: x @ sd[p + ".weight"] + sd[p + ".bias"]
    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + "attn.c_proj")
        h = gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), cfg["activation_function"])
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ sd["transformer.wte.weight"].T


def check(argv):
    d, m6_logits = argv[0], argv[1]
    ids = torch.tensor([[int(t) for t in argv[2:]]])
    cfg = json.load(open(f"{d}/config.json"))
    for k, v in {"model_type": "gpt2", "activation_function": "gelu_new",
                 "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}.items():
        assert cfg.get(k) == v, f"config.json: {k} = {cfg.get(k)!r}, want {v!r}"
    for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "n_inner"):
        assert isinstance(cfg.get(k), int), f"config.json: no {k}"
    assert cfg["n_inner"] == 4 * cfg["n_embd"]
    sd, meta = read_safetensors(f"{d}/model.safetensors")
    assert meta.get("format") == "pt", meta
    want = hf_shapes(cfg)
    missing, unexpected = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    assert not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"
    for k, s in want.items():
        assert tuple(sd[k].shape) == s, f"{k}: shape {tuple(sd[k].shape)}, want {s}"
    T, V = ids.shape[1], cfg["vocab_size"]
    ref = hf_forward(sd, cfg, ids)[0]
    got = torch.frombuffer(bytearray(open(m6_logits, "rb").read()), dtype=torch.float32)
    got = got.reshape(T, V).double()
    err = (ref - got).abs().max().item()
    print(f"max |logits_ref - logits_m6| = {err:.3g} over ({T}, {V}); "
          f"logit range {ref.min().item():.3g}..{ref.max().item():.3g}")
    assert err <= 1e-4, f"logits differ by {err}"
    # the tensors really differ across layers (a real-phase model) or
    # repeat (a pseudo one): report for the test log
    print("layers identical to layer 0:",
          sum(torch.equal(sd[f"transformer.h.{l}.attn.c_attn.weight"],
                          sd["transformer.h.0.attn.c_attn.weight"])
              for l in range(cfg["n_layer"])))


# ---------------------------------------------------------------- llm.c

def llmc_tensors(V, Vp, L, C, T):
    """(name, shape) of llm.c's 16 parameter tensors in file order."""
    return [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
            ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
            ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
            ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]


def write_llmc(argv):
    out, version, seed = argv[0], int(argv[1]), int(argv[2])
    V, L, NH, C, T = (int(a) for a in argv[3:8])
    Vp = (V + 127) // 128 * 128
    g = torch.Generator().manual_seed(seed)
    hdr = [0] * 256
    hdr[:8] = [20240326, version, T, V, L, NH, C, Vp]
    blob = struct.pack("<256i", *hdr)
    for name, shape in llmc_tensors(V, Vp, L, C, T):
        if name.endswith("w") and len(shape) <= 2 and name.startswith("ln"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)      # LayerNorm gains
        elif name.endswith("b"):
            t = 0.05 * torch.randn(shape, generator=g)           # biases
        else:
            t = 0.08 * torch.randn(shape, generator=g)           # weights
        if name == "wte":
            t[V:] = 0  # llm.c's padding rows
        t = t.float().contiguous()
        if version == 5:
            blob += t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            blob += t.numpy().tobytes()
    open(out, "wb").write(blob)


def read_llmc_as_hf(path):
    """llm.c's file as an HF GPT-2 state dict and config (its own parse)."""
    raw = open(path, "rb").read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[0] == 20240326 and hdr[1] in (3, 5), hdr[:2]
    T, V, L, NH, C, Vp = hdr[2:8]
    esz, off, p = (4 if hdr[1] == 3 else 2), 1024, {}
    for name, shape in llmc_tensors(V, Vp, L, C, T):
        n = math.prod(shape)
        b = bytearray(raw[off:off + n * esz])
        off += n * esz
        if esz == 4:
            t = torch.frombuffer(b, dtype=torch.float32)
        else:
            t = torch.frombuffer(b, dtype=torch.bfloat16).float()
        p[name] = t.reshape(shape).clone()
    assert off == len(raw)
    sd = {"transformer.wte.weight": p["wte"][:V], "transformer.wpe.weight": p["wpe"],
          "transformer.ln_f.weight": p["lnfw"], "transformer.ln_f.bias": p["lnfb"]}
    for l in range(L):
        h = f"transformer.h.{l}."
        sd[h + "ln_1.weight"], sd[h + "ln_1.bias"] = p["ln1w"][l], p["ln1b"][l]
        sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"] = p["qkvw"][l].T, p["qkvb"][l]
        sd[h + "attn.c_proj.weight"], sd[h + "attn.c_proj.bias"] = p["attprojw"][l].T, p["attprojb"][l]
        sd[h + "ln_2.weight"], sd[h + "ln_2.bias"] = p["ln2w"][l], p["ln2b"][l]
        sd[h + "mlp.c_fc.weight"], sd[h + "mlp.c_fc.bias"] = p["fcw"][l].T, p["fcb"][l]
        sd[h + "mlp.c_proj.weight"], sd[h + "mlp.c_proj.bias"] = p["fcprojw"][l].T, p["fcprojb"][l]
    cfg = {"n_embd": C, "n_head": NH, "n_layer": L, "vocab_size": V, "n_positions": T,
           "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
    return sd, cfg


def first_batch(shard_glob, seed, B, T):
    """m6's first training batch (daemon/train/trainer.c, read_step_batches_):
    the shards concatenated in glob order; data_rng = seed * 0x9E3779B97F4A7C15
    + 0xD1B54A32D192ED03 (mod 2^64); each window at xorshift64*(rng) %
    (total - T - 1), T+1 tokens."""
    toks = []
    for path in sorted(glob.glob(shard_glob)):
        raw = open(path, "rb").read()
        hdr = struct.unpack("<256i", raw[:1024])
        assert hdr[0] == 20240520, path
        toks += list(struct.unpack(f"<{hdr[2]}H", raw[1024:1024 + 2 * hdr[2]]))
    M = (1 << 64) - 1
    s = (seed * 0x9E3779B97F4A7C15 + 0xD1B54A32D192ED03) & M or 1
    span = len(toks) - T - 1
    rows = []
    for _ in range(B):
        s ^= s >> 12
        s ^= (s << 25) & M
        s ^= s >> 27
        pos = ((s * 0x2545F4914F6CDD1D) & M) % span
        rows.append(toks[pos:pos + T + 1])
    w = torch.tensor(rows)
    return w[:, :-1], w[:, 1:]


def llmc_loss(argv):
    sd, cfg = read_llmc_as_hf(argv[0])
    inp, tgt = first_batch(argv[1], int(argv[2]), int(argv[3]), cfg["n_positions"])
    logits = hf_forward(sd, cfg, inp)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]),
                                             tgt.reshape(-1))
    print(f"{loss.item():.9g}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"check": check, "write-llmc": write_llmc, "llmc-loss": llmc_loss}[cmd](sys.argv[2:])
