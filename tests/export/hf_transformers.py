#!/usr/bin/env python3
"""hf_transformers.py — the export check with transformers itself: loads an
`m6ctl export --format hf-gpt2` directory with GPT2LMHeadModel.from_pretrained,
requires no missing, unexpected or mismatched keys (and no warning about
them), and compares its logits with m6's (tests/export/m6_logits.c output)
within 1e-4. Exits 77 (skip) where transformers is not installed (Debian has
no package); tests/export/export.sh then says so in its output.

  hf_transformers.py HF_DIR M6_LOGITS.f32 TOKEN...

tests/export/export.sh runs it on both exports when transformers imports;
on another machine, copy the directory and the logits file there (the
device check: KEEP=1 on export.sh keeps them under its temporary folder).
"""
import logging
import sys

try:
    # transformers first: where it is missing, that is known before torch's
    # two seconds of import
    import transformers
    import torch
    from transformers import GPT2LMHeadModel
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def main(argv):
    d, m6_logits = argv[0], argv[1]
    ids = torch.tensor([[int(t) for t in argv[2:]]])
    records = []

    class Keep(logging.Handler):
        def emit(self, r):
            records.append(r.getMessage())

    logging.getLogger("transformers").addHandler(Keep())
    model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{k}: {info[k]}"
    bad = [m for m in records if "were not used" in m or "newly initialized" in m]
    assert not bad, bad
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    model.eval()
    with torch.no_grad():
        ref = model(ids).logits[0].double()
    T, V = ref.shape
    got = torch.frombuffer(bytearray(open(m6_logits, "rb").read()),
                           dtype=torch.float32).reshape(T, V).double()
    err = (ref - got).abs().max().item()
    print(f"transformers {transformers.__version__}: max |logits - m6| = {err:.3g}")
    assert err <= 1e-4, err


if __name__ == "__main__":
    main(sys.argv[1:])
