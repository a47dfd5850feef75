#!/usr/bin/env python3
"""torch_baseline.py — PyTorch eager fp32 timing of the same operator, the baseline mhc's
CPU backend is measured against (docs/perf.md).

    python3 bench/torch_baseline.py T n D [--threads 2] [--repeat 3] [--device cpu|cuda]
"""
import argparse
import time

import torch


def op(x, phi, alpha, bias, gamma, eps=1e-6, hc_eps=1e-6):
    *tok, n, d = x.shape
    v = x.float().reshape(*tok, n * d)
    h_mix = (v * gamma.reshape(-1)) @ phi.T
    inv_rms = torch.rsqrt(v.pow(2).mean(-1) + eps)
    t = h_mix * inv_rms[..., None]
    h_pre = torch.sigmoid(alpha[0] * t[..., :n] + bias[:n]) + hc_eps
    h_post = 2 * torch.sigmoid(alpha[1] * t[..., n:2 * n] + bias[n:2 * n])
    h_res = (alpha[2] * t[..., 2 * n:] + bias[2 * n:]).reshape(*tok, n, n)
    h_in = torch.einsum("...i,...id->...d", h_pre, x.float()).to(x.dtype)
    return h_in, h_post, h_res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", type=int, nargs=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    T, n, D = a.shape
    K, N = n * D, n * n + 2 * n
    dev = a.device
    x = torch.randn(T, n, D, device=dev).bfloat16().requires_grad_()
    params = [torch.randn(N, K, device=dev) / K ** 0.5, torch.rand(3, device=dev) + 0.5,
              0.1 * torch.randn(N, device=dev), 1 + 0.1 * torch.randn(n, D, device=dev)]
    for p in params:
        p.requires_grad_()
    grads = [torch.randn(T, D, device=dev).bfloat16(), torch.randn(T, n, device=dev), torch.randn(T, n, n, device=dev)]

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    for name, backward in (("fwd", False), ("fwd+bwd", True)):
        times = []
        for i in range(a.repeat + 1):
            sync()
            t0 = time.perf_counter()
            outs = op(x, *params)
            if backward:
                torch.autograd.backward(outs, grads)
            sync()
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        print(f"torch {torch.__version__} {dev} {a.threads} threads T={T} n={n} D={D} {name}: "
              f"median {times[len(times) // 2]:.1f} ms (min {times[0]:.1f})")


if __name__ == "__main__":
    main()
