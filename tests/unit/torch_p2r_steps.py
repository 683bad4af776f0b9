#!/usr/bin/python3
"""torch_p2r_steps.py — Pseudo-to-Real training steps against PyTorch, with
the pseudo phase's options on (issue 21): pseudo.grad_scale and
pseudo.lr_scale.

Runs tests/unit/dump_p2r_steps (the C trainer: 8 steps of L = 3 layers,
the delink at step 4 with the moments copied), then redoes every step
here in float64 from the dumped initial weights and batches: the GPT of
torch_reference.py with layers reading their slot's shared nn.Parameters
(autograd sums a slot's gradient over its layers), the gradient of the
mean loss over the step's microbatches, with grad_scale mean each slot's
gradient divided by the layers sharing it, the global norm and the clip
(torch.nn.utils.clip_grad_norm_), torch.optim.AdamW (decay on 2-D tensors
only) at the lr of the schedule (warmup, cosine, times lr_scale in the
pseudo phase, the re-warm after the delink); at the delink every layer
gets a copy of its slot's weights and AdamW state. Compared: each step's
lr and gradient norm, and the final weights and both moments of every
tensor.

Tolerances (float64 reference, so the differences are the engine's fp32):
lr relative 1e-6 (float rounding of the schedule); gradient norm relative
1e-4 (fp32 gradients of weights that have taken fp32 steps); weights
max|diff| < 2e-5 absolute (|update| <= lr ~ 3e-3 per step; fp32 weights
near 1 round at 6e-8, and AdamW's m/sqrt(v) carries the gradients' 1e-5
relative error into each update); each moment tensor max|diff| / max|ref|
< 1e-3 (v is quadratic, and after the first steps m, v mix gradients of
slightly different fp32 weights). A negative control redoes the mean case
with the sum (and the lr_scale case at scale 1): the engine must then be
far outside these tolerances, so the reference can tell the options
apart.

Needs Debian's python3-torch (run with /usr/bin/python3); exit 77 without.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: python3-torch not installed (apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import block, read_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)

TOL_LR, TOL_NORM, TOL_W, TOL_MOM = 1e-6, 1e-4, 2e-5, 1e-3


def lr_at(cfg, k, lr_scale):
    """The schedule at 0-based step k (trainer.c lr_at_, written here)."""
    W, N, P, R = cfg["warmup"], cfg["steps"], cfg["pseudo_steps"], cfg["rewarm"]
    if k < W:
        lr = cfg["lr"] * (k + 1) / W
    else:
        p = min(1.0, (k - W) / (N - W)) if N > W else 1.0
        lr = cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * p)) * (
            cfg["lr"] - cfg["min_lr"])
    if k < P:
        return lr * lr_scale
    if k - P < R:
        lr *= (k - P + 1) / R
    return lr


def loss_of(params, slot_of, cfg, inp, tgt):
    T = inp.shape[1]
    x = params["wte"][inp] + params["wpe"][:T]
    for l in range(cfg["L"]):
        pre = f"slots.{slot_of[l]}."
        x = block(x, {k[len(pre):]: v for k, v in params.items()
                      if k.startswith(pre)}, cfg["NH"])
    x = F.layer_norm(x, (cfg["C"],), params["ln_f.weight"],
                     params["ln_f.bias"], 1e-5)
    logits = x @ params["wte"].T
    return F.cross_entropy(logits.view(-1, cfg["V"]), tgt.reshape(-1))


def make_opt(params, cfg):
    decay = [p for p in params.values() if p.dim() == 2]
    plain = [p for p in params.values() if p.dim() != 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["wd"]},
         {"params": plain, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])


def simulate(out, cfg, grad_scale, lr_scale):
    """The run in PyTorch: (lrs, norms, params, optimizer)."""
    init = read_safetensors(os.path.join(out, "init", "model.safetensors"))
    batches = read_safetensors(os.path.join(out, "batches.safetensors"))
    L, S, P, A, B = cfg["L"], cfg["S"], cfg["pseudo_steps"], cfg["A"], cfg["B"]
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    slot_of = [l * S // L for l in range(L)]
    opt = make_opt(params, cfg)
    lrs, norms = [], []
    for k in range(cfg["steps"]):
        if k == P and P > 0:  # delink: each layer a copy of its slot
            new = {n: p for n, p in params.items() if not n.startswith("slots.")}
            for l in range(L):
                pre = f"slots.{slot_of[l]}."
                for n, p in params.items():
                    if n.startswith(pre):
                        q = p.detach().clone().requires_grad_(True)
                        new[f"slots.{l}." + n[len(pre):]] = q
            old_state = {id(p): opt.state[p] for p in params.values()}
            src = {}
            for n, q in new.items():
                if n.startswith("slots."):
                    l = int(n.split(".")[1])
                    src[id(q)] = params[f"slots.{slot_of[l]}." +
                                        n.split(".", 2)[2]]
                else:
                    src[id(q)] = q
            opt2 = make_opt(new, cfg)
            for q in new.values():
                st = old_state[id(src[id(q)])]
                opt2.state[q] = {kk: vv.clone() for kk, vv in st.items()}
            params, opt, slot_of = new, opt2, list(range(L))
        pseudo = k < P
        inp = batches[f"step{k}.inputs"].long()
        tgt = batches[f"step{k}.targets"].long()
        opt.zero_grad()
        for a in range(A):
            loss = loss_of(params, slot_of, cfg, inp[a * B:(a + 1) * B],
                           tgt[a * B:(a + 1) * B]) / A
            loss.backward()
        if pseudo and grad_scale == "mean":
            for n, p in params.items():
                if n.startswith("slots."):
                    s = int(n.split(".")[1])
                    p.grad /= slot_of.count(s)
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()),
                                              cfg["clip"])
        norms.append(norm.item())
        lr = lr_at(cfg, k, lr_scale if pseudo else 1.0)
        lrs.append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    return lrs, norms, params, opt


def compare(out, cfg, sim, quiet=False):
    """Number of failures of the engine's run against sim."""
    lrs, norms, params, opt = sim
    final = read_safetensors(os.path.join(out, "final", "model.safetensors"))
    moments = read_safetensors(os.path.join(out, "final",
                                            "optimizer.safetensors"))
    fails = 0

    def bad(msg):
        nonlocal fails
        fails += 1
        if not quiet:
            print("FAIL:", msg)

    for k in range(cfg["steps"]):
        dl = abs(cfg["step_lr"][k] - lrs[k]) / lrs[k]
        dn = abs(cfg["step_norm"][k] - norms[k]) / norms[k]
        if not quiet:
            print(f"  step {k + 1}: lr m6 {cfg['step_lr'][k]:.6e} torch "
                  f"{lrs[k]:.6e}; norm m6 {cfg['step_norm'][k]:.6f} torch "
                  f"{norms[k]:.6f} (rel {dn:.1e})")
        if dl > TOL_LR:
            bad(f"step {k + 1}: lr relative error {dl:.2e} (tol {TOL_LR})")
        if dn > TOL_NORM:
            bad(f"step {k + 1}: grad norm relative error {dn:.2e} "
                f"(tol {TOL_NORM})")
    worst_w = worst_m = 0.0
    for n, p in params.items():
        if n not in final:
            bad(f"{n}: not in the engine's final checkpoint")
            continue
        dw = (final[n] - p.detach()).abs().max().item()
        worst_w = max(worst_w, dw)
        if dw > TOL_W:
            bad(f"weights {n}: max |diff| {dw:.2e} (tol {TOL_W})")
        st = opt.state[p]
        for key, ref in (("exp_avg.", st["exp_avg"]),
                         ("exp_avg_sq.", st["exp_avg_sq"])):
            scale = max(ref.abs().max().item(), 1e-30)
            dm = (moments[key + n] - ref).abs().max().item() / scale
            worst_m = max(worst_m, dm)
            if dm > TOL_MOM:
                bad(f"{key}{n}: normalised max error {dm:.2e} (tol {TOL_MOM})")
    if not quiet:
        print(f"  {len(params)} tensors: worst weight |diff| {worst_w:.2e}, "
              f"worst normalised moment error {worst_m:.2e}")
    return fails


def case(dump_bin, tmp, grad_scale, lr_scale, S, control):
    out = os.path.join(tmp, f"{grad_scale}_{lr_scale}_{S}")
    subprocess.run([dump_bin, out, grad_scale, str(lr_scale), str(S), "8",
                    "4"], check=True)
    cfg = json.load(open(os.path.join(out, "run.json")))
    print(f"grad_scale {grad_scale}, lr_scale {lr_scale}, S {S}:")
    fails = compare(out, cfg, simulate(out, cfg, grad_scale, lr_scale))
    if control:  # the other setting must not pass
        gs, ls = control
        n = compare(out, cfg, simulate(out, cfg, gs, ls), quiet=True)
        print(f"  control (reference with grad_scale {gs}, lr_scale {ls}): "
              f"{n} mismatches")
        if n == 0:
            print("FAIL: the reference cannot tell the options apart")
            fails += 1
    return fails


def main():
    dump_bin = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        fails = case(dump_bin, tmp, "sum", 1.0, 1, None)
        fails += case(dump_bin, tmp, "mean", 1.0, 1, ("sum", 1.0))
        fails += case(dump_bin, tmp, "mean", 0.5, 2, ("mean", 1.0))
        fails += case(dump_bin, tmp, "sum", 0.25, 1, ("sum", 1.0))
    print("torch_p2r_steps:", "OK" if fails == 0 else f"{fails} failures")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
