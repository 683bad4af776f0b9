#!/usr/bin/python3
"""torch_adafactor.py — m6's Adafactor against an independent float64
reference written here from the paper (Shazeer & Stern 2018, arXiv
1804.04235, Algorithm 4 for a matrix, Algorithm 5 for a vector, the
increasing decay beta2_t = 1 - t^-0.8, update clipping, the optional first
moment when beta1 > 0), in the paper's own form: R and
C are row and column SUMS of g^2 + eps1 and vhat = R C^T / (1^T R) (m6
keeps means; the value is the same), with the learning rate explicit and
decoupled weight decay on 2-D tensors as m6 documents (kernels.h
adafactor_update_spans).

Runs tests/unit/dump_adafactor (STEPS steps of a small GPT through
gpt_adafactor: every matrix and vector of the model, an MoE variant with
per-expert matrices), then redoes the optimizer here from the dumped
initial weights with the dumped per-step gradients and clip factors (the
gradients are m6's fp32 ones at m6's weights: this checks the optimizer,
not backward), and compares every final parameter.

Tolerance: every parameter within 1e-6 relative, |m6 - ref| <= 1e-6 *
max(|ref|, RMS of its tensor): m6 keeps weights and state in fp32 (2^-24 =
6e-8 relative per rounding) over ten steps, measured worst 5e-7. The floor
at the tensor's RMS only matters for a weight that the updates bring near
zero: its error is the fp32 rounding it picked up while it was of the
tensor's size (measured up to 8e-9 absolute on weights of RMS 0.02 that
end at 1e-6, a "relative" 7e-3 without the floor).
Each case must also see the update clipping fire (RMS(U) > d) in some
tensor, or the case fails: the clipping would be untested. A negative
control (the reference without clipping) must fail the tolerance.

Needs numpy (python3-numpy); exit 77 without.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: python3-numpy not installed")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "common"))
from safetensors_f32 import read_f32  # noqa: E402

STEPS = 10
TOL = 1e-6


def read_safetensors(path):
    """{name: float64 array} of the F32 safetensors file at path."""
    tensors, _ = read_f32(path)
    return {name: np.frombuffer(raw, dtype=np.float32).reshape(shape)
            .astype(np.float64) for name, (shape, raw) in tensors.items()}


def reference(d, hp, clip_updates=True):
    """The paper's Adafactor over every tensor; returns (final, clipped)."""
    names = [k[len("init."):] for k in d if k.startswith("init.")]
    x = {n: d["init." + n].copy() for n in names}
    st = {}
    for n in names:
        if x[n].ndim == 2:
            st[n] = [np.zeros(x[n].shape[0]), np.zeros(x[n].shape[1])]
        else:
            st[n] = [np.zeros(x[n].shape)]
    m = {n: np.zeros(x[n].shape) for n in names}
    clipped = 0
    c, d_clip = hp["decay_rate"], hp["clip_threshold"]
    eps1, eps2, lr, wd, b1 = (hp["eps1"], hp["eps2"], hp["lr"], hp["wd"],
                              hp["beta1"])
    for k in range(hp["steps"]):
        t = k + 1
        beta2 = 1.0 - t ** (-c)
        scale = d["scale%d" % k][0]
        for n in names:
            g = d["grad%d.%s" % (k, n)] * scale
            g2 = g * g + eps1
            if g.ndim == 2:
                R, C = st[n]
                R = beta2 * R + (1 - beta2) * g2.sum(axis=1)   # G^2 1_m
                C = beta2 * C + (1 - beta2) * g2.sum(axis=0)   # 1_n^T G^2
                st[n] = [R, C]
                vhat = np.outer(R, C) / R.sum()
            else:
                V = beta2 * st[n][0] + (1 - beta2) * g2
                st[n] = [V]
                vhat = V
            U = g / np.sqrt(vhat)
            rms_u = np.sqrt(np.mean(U * U))
            if rms_u > d_clip:
                clipped += 1
            u = U / max(1.0, rms_u / d_clip) if clip_updates else U
            if b1 > 0:
                m[n] = b1 * m[n] + (1 - b1) * u
                u = m[n]
            alpha = lr
            if hp["scale_parameter"]:
                alpha = lr * max(eps2, np.sqrt(np.mean(x[n] * x[n])))
            decay = wd if x[n].ndim == 2 else 0.0
            x[n] = x[n] - alpha * u - lr * decay * x[n]
    return x, clipped


def worst(d, x):
    w, where = 0.0, None
    for n, ref in x.items():
        got = d["final." + n]
        rms = np.sqrt(np.mean(ref * ref))
        rel = np.abs(got - ref) / np.maximum(np.abs(ref), rms)
        i = int(np.argmax(rel))
        if rel.flat[i] > w:
            w, where = float(rel.flat[i]), n
    return w, where


def case(exe, tmp, beta1, clip, scale_param, moe):
    out = os.path.join(tmp, "b%s_d%s_s%d_m%d" % (beta1, clip, scale_param,
                                                 moe))
    subprocess.run([exe, out, str(STEPS), str(beta1), str(clip),
                    str(scale_param), str(moe)], check=True)
    d = read_safetensors(os.path.join(out, "steps.safetensors"))
    hp = json.load(open(os.path.join(out, "run.json")))
    x, clipped = reference(d, hp)
    w, where = worst(d, x)
    label = ("beta1 %s, d %s, scale_parameter %d, %s" %
             (beta1, clip, scale_param, "MoE" if moe else "dense"))
    nmat = sum(1 for n in x if x[n].ndim == 2)
    print("%s: %d tensors (%d matrices), max relative error %.3g (%s), "
          "update clipped %d times" % (label, len(x), nmat, w, where,
                                       clipped))
    ok = True
    if w > TOL:
        print("FAIL: %s: %s off by %.3g relative (> %g)" % (label, where, w,
                                                            TOL))
        ok = False
    if clipped == 0:
        print("FAIL: %s: the update clipping never fired" % label)
        ok = False
    # negative control: without the clipping the reference must disagree
    xn, _ = reference(d, hp, clip_updates=False)
    wn, _ = worst(d, xn)
    if wn <= TOL:
        print("FAIL: %s: the reference without clipping agrees too (%.3g): "
              "the check cannot tell" % (label, wn))
        ok = False
    return ok


def main():
    exe = sys.argv[1]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ok &= case(exe, tmp, 0.0, 1.0, 0, 0)
        ok &= case(exe, tmp, 0.9, 1.0, 0, 0)
        ok &= case(exe, tmp, 0.0, 1.0, 0, 1)
        ok &= case(exe, tmp, 0.9, 0.5, 1, 1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
