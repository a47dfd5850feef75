#!/usr/bin/env python3
"""torch_reference.py — an independent golden: the mHC pre operator written in PyTorch,
differentiated by autograd in float64, written in mhc's HDF5 schema through h5py.

    python3 tests/torch_reference.py OUTDIR

writes OUTDIR/torch_<shape>.h5 for every shape below: /inputs (x and dh_in as float32
holding bf16 values), /forward and /backward (float64), and OUTDIR/torch_sat_<shape>.h5 with
saturated gates: pre bias[i] near -25 for even i (sigmoid ~1e-11, far below hc_eps), near +30 for
odd i (sigmoid 1 - 1e-13: 1 + hc_eps rounds in float32); post bias[n + i] near +30 for even i and
+38 for odd i (h_post / 2 = 1 - 1e-13 and 1 - 3e-17), near -25 for the last. Nothing here comes
from mhc.
"""
import sys

import h5py
import torch

SHAPES = [(5, 4, 7), (3, 6, 16), (2, 8, 5), (4, 4, 1), (1, 4, 9), (2, 3, 4, 6), (17, 1, 3)]
SATURATED = [(64, 4, 32)]
NORM_EPS, HC_EPS = 1e-6, 1e-6


def bf16_values(t):
    return t.to(torch.bfloat16).to(torch.float64)


def make_inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    *tok, n, d = shape
    k, nmix = n * d, n * n + 2 * n
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return {
        "x": bf16_values(r(*tok, n, d)),
        "phi": (r(nmix, k) / k ** 0.5).float().double(),
        "alpha": (0.5 + torch.rand(3, generator=g, dtype=torch.float64)).float().double(),
        "bias": (0.1 * r(nmix)).float().double(),
        "gamma": (1 + 0.1 * r(n, d)).float().double(),
        "dh_in": bf16_values(r(*tok, d)),
        "dh_post": r(*tok, n).float().double(),
        "dh_res": r(*tok, n, n).float().double(),
    }


def forward_backward(inp):
    x, phi, alpha, bias, gamma = (inp[k].clone().requires_grad_() for k in ("x", "phi", "alpha", "bias", "gamma"))
    *tok, n, d = x.shape
    v = x.reshape(*tok, n * d)
    xg = v * gamma.reshape(n * d)
    xg.retain_grad()
    h_mix = xg @ phi.T
    h_mix.retain_grad()
    inv_rms = torch.rsqrt(v.pow(2).mean(-1) + NORM_EPS)
    inv_rms.retain_grad()
    t = h_mix * inv_rms[..., None]
    # 1 / (1 + exp(-z)), not torch.sigmoid: its backward, s (1 - s) from the saved s, cancels where
    # s ~ 1 (1e-3 relative at z = 30 in float64); the quotient's is exp(-z) / (1 + exp(-z))^2
    h_pre = 1 / (1 + torch.exp(-(alpha[0] * t[..., :n] + bias[:n]))) + HC_EPS
    h_pre.retain_grad()
    h_post = 2 / (1 + torch.exp(-(alpha[1] * t[..., n:2 * n] + bias[n:2 * n])))
    h_res = (alpha[2] * t[..., 2 * n:] + bias[2 * n:]).reshape(*tok, n, n)
    h_in = torch.einsum("...i,...id->...d", h_pre, x)
    loss = (h_in * inp["dh_in"]).sum() + (h_post * inp["dh_post"]).sum() + (h_res * inp["dh_res"]).sum()
    loss.backward()
    forward = {"inv_rms": inv_rms, "h_mix": h_mix, "h_pre": h_pre, "h_post": h_post, "h_res": h_res, "h_in": h_in}
    backward = {"dh_pre": h_pre.grad, "dh_mix": h_mix.grad, "dinv_rms": inv_rms.grad,
                "dvecX": xg.grad.reshape(*tok, n, d), "dx": x.grad, "dphi": phi.grad,
                "dalpha": alpha.grad, "dbias": bias.grad, "dgamma": gamma.grad}
    return forward, backward


def write(path, inp, forward, backward):
    with h5py.File(path, "w") as f:
        f.attrs["producer"] = "torch_reference.py"
        f.attrs["backend"] = "pytorch-autograd"
        f.attrs["precision"] = "fp64"
        g = f.create_group("inputs")
        g.attrs["norm_eps"], g.attrs["hc_eps"] = NORM_EPS, HC_EPS
        for k, t in inp.items():
            g[k] = t.numpy().astype("float32")  # bf16/fp32 values, exact in float32
        for grp, tensors in (("forward", forward), ("backward", backward)):
            h = f.create_group(grp)
            for k, t in tensors.items():
                h[k] = t.detach().numpy()


def main():
    out = sys.argv[1]
    for i, shape in enumerate(SHAPES):
        inp = make_inputs(shape, 100 + i)
        fwd, bwd = forward_backward(inp)
        write(f"{out}/torch_{'x'.join(map(str, shape))}.h5", inp, fwd, bwd)
    for i, shape in enumerate(SATURATED):
        inp = make_inputs(shape, 200 + i)
        n = shape[-2]
        r = torch.rand(n, generator=torch.Generator().manual_seed(300 + i), dtype=torch.float64)
        inp["bias"][:n] = torch.where(torch.arange(n) % 2 == 0, -25 - r, 30 + r).float().double()
        post = torch.where(torch.arange(n) % 2 == 0, 30 + r, 38 + r)
        post[-1] = -25 - r[-1]
        inp["bias"][n:2 * n] = post.float().double()
        fwd, bwd = forward_backward(inp)
        write(f"{out}/torch_sat_{'x'.join(map(str, shape))}.h5", inp, fwd, bwd)
    print(f"wrote {len(SHAPES) + len(SATURATED)} autograd references to {out}")


if __name__ == "__main__":
    main()
