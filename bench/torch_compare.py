#!/usr/bin/env python3
"""torch_compare.py — mhc's CUDA backend beside PyTorch eager and torch.compile, on the GPU
machine, in one process: the same card, the same clocks, the same cache hygiene.

    python3 bench/torch_compare.py build-gpu/mhc [--shapes 4096,4,2560 16384,4,4096 ...]
                                   [--repeat 20] [--warmup 3] [--no-compile] [--json FILE]
                                   [--torch-from FILE] [--mhc-from FILE]

1. Copy bandwidth: a device-to-device copy of 1 GiB, bytes read + written, median of 10.
2. PyTorch (fp32, TF32 off), eager and torch.compile: the forward (under no_grad) and the
   forward + backward (autograd through h_in, h_post, h_res with given upstream gradients).
   The math is written here from the formulas of docs/schema.md, not taken from mhc.
3. `mhc bench --backend cuda --json` on the same shapes (a subprocess).
Before every timed repeat, torch and mhc alike write a buffer of 4x the L2 size, so no
repeat reads its inputs from L2. The byte floor is mhc's `bytes` (the fewest bytes the pass
must move) over the copy bandwidth; "% copy bw" is mhc's effective bandwidth over it.
--torch-from takes the PyTorch times from an earlier run's --json file (same card model),
to save device time when only mhc changed; the table then says so. --mhc-from takes mhc's
times from a file of `mhc bench --json` lines (bench/device_run.sh's bench.jsonl) instead of
running mhc; with both, nothing is measured and no GPU (nor torch) is needed: the table of a
finished device run, rendered anywhere, each floor from the copy bandwidth that mhc measured.
"""
import argparse
import json
import subprocess
import sys

try:
    import torch
except ImportError:  # enough for --torch-from with --mhc-from
    torch = None

NORM_EPS = HC_EPS = 1e-6  # mhc gen's defaults


def mhc_pre(x, phi, alpha, bias, gamma):
    """x [T,n,D] bf16, phi [N,K], alpha [3], bias [N], gamma [n,D] -> h_in [T,D] bf16,
    h_post [T,n], h_res [T,n,n]; K = n*D, N = n*n + 2n."""
    T, n, D = x.shape
    v = x.float().reshape(T, n * D)
    inv_rms = torch.rsqrt(v.square().mean(dim=1, keepdim=True) + NORM_EPS)  # [T,1]
    t = (v * gamma.reshape(1, -1)) @ phi.t() * inv_rms  # [T,N]
    h_pre = torch.sigmoid(alpha[0] * t[:, :n] + bias[:n]) + HC_EPS
    h_post = 2.0 * torch.sigmoid(alpha[1] * t[:, n:2 * n] + bias[n:2 * n])
    h_res = (alpha[2] * t[:, 2 * n:] + bias[2 * n:]).reshape(T, n, n)
    h_in = (h_pre.unsqueeze(2) * x.float()).sum(dim=1).to(torch.bfloat16)
    return h_in, h_post, h_res


def make_case(T, n, D, dev):
    K, N = n * D, n * n + 2 * n
    g = torch.Generator(device=dev).manual_seed(7)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)
    x = r(T, n, D).bfloat16()
    params = [r(N, K) / K ** 0.5, 0.5 + torch.rand(3, device=dev, generator=g), 0.1 * r(N), 1 + 0.1 * r(n, D)]
    grads = [r(T, D).bfloat16(), r(T, n), r(T, n, n)]
    return x, params, grads


class Timer:
    """Median milliseconds of fn() over CUDA events, the L2 flushed before every repeat."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(4 * l2, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, warmup, repeat):
        ms = []
        for i in range(warmup + repeat):
            self.flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            if i >= warmup:
                ms.append(a.elapsed_time(b))
        ms.sort()
        return ms[len(ms) // 2]


def copy_gbps(timer):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), 2, 10)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def torch_times(shape, compiled, timer, warmup, repeat):
    """{("fwd"|"both", "eager"|"compile"): ms} for one shape."""
    T, n, D = shape
    x, params, grads = make_case(T, n, D, "cuda")
    out = {}
    for mode in ("eager", "compile") if compiled else ("eager",):
        f = torch.compile(mhc_pre, dynamic=False) if mode == "compile" else mhc_pre

        def fwd():
            with torch.no_grad():
                f(x, *params)

        xg = x.clone().requires_grad_()
        pg = [p.clone().requires_grad_() for p in params]

        def both():
            torch.autograd.backward(f(xg, *pg), grads)
            xg.grad = None
            for p in pg:
                p.grad = None

        out["fwd", mode] = timer(fwd, warmup, repeat)
        out["both", mode] = timer(both, warmup, repeat)
    return out


def mhc_bench(binary, shape, pass_, warmup, repeat):
    cmd = [binary, "bench", "--backend", "cuda", "--shape", ",".join(map(str, shape)), "--pass", pass_,
           "--repeat", str(repeat), "--warmup", str(warmup), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"torch_compare: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mhc", nargs="?", help="path to the mhc binary (built with CUDA); not needed with --mhc-from")
    ap.add_argument("--shapes", nargs="+", default=["4096,4,2560", "16384,4,4096", "65536,4,2560", "16384,6,4096",
                                                     "16384,8,4096", "1,4,4096", "128,4,4096"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="eager only (torch.compile takes a while per shape)")
    ap.add_argument("--json", help="also write one JSON object per row to this file")
    ap.add_argument("--torch-from", help="PyTorch times from this earlier --json file instead of measuring them")
    ap.add_argument("--mhc-from", help="mhc's times from this file of `mhc bench --json` lines instead of running mhc")
    a = ap.parse_args()
    if not a.mhc and not a.mhc_from:
        ap.error("give the mhc binary or --mhc-from")
    earlier = {}
    if a.torch_from:
        for line in open(a.torch_from):
            r = json.loads(line)
            earlier[r["shape"], "fwd" if r["pass"] == "fwd" else "both"] = r
    mine = {}
    if a.mhc_from:
        for line in open(a.mhc_from):
            r = json.loads(line)
            mine[r["shape"], r["pass"]] = r
    offline = bool(earlier and mine)
    if offline:
        first = next(iter(earlier.values()))
        name, version = first["device"], first["torch"]
        print(f"{name}: PyTorch {version} times from {a.torch_from}, mhc's from {a.mhc_from}; each floor from the "
              "copy bandwidth mhc measured in its own process")
    else:
        if torch is None:
            sys.exit("torch_compare: no torch here; without it both --torch-from and --mhc-from are needed")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch._dynamo.config.cache_size_limit = 64
        timer = Timer()
        bw = copy_gbps(timer)
        name, version = torch.cuda.get_device_name(0), torch.__version__
        print(f"{name}, torch {version}; copy bandwidth {bw:.0f} GB/s (1 GiB device-to-device, read + write)")
        if earlier:
            print(f"PyTorch times from {a.torch_from} (an earlier run on the same card model), mhc's measured now")
    for src, recs in ((a.torch_from, earlier), (a.mhc_from, mine)):
        for r in recs.values():
            if not r["device"].startswith(name):
                sys.exit(f"torch_compare: {src} was measured on {r['device']}, this is {name}")
    out = open(a.json, "w") if a.json else None
    rows = []
    for s in a.shapes:
        shape = tuple(int(v) for v in s.split(","))
        try:
            if earlier:
                t = {(p, m): earlier[s, p][m + "_ms"] for p in ("fwd", "both") for m in ("eager", "compile")}
            else:
                t = torch_times(shape, not a.no_compile, timer, a.warmup, a.repeat)
            ms = {p: mine[s, p] if mine else mhc_bench(a.mhc, shape, p, a.warmup, a.repeat) for p in ("fwd", "both")}
        except KeyError as e:
            sys.exit(f"torch_compare: no {e} in the --torch-from or --mhc-from file")
        for p in ("fwd", "both"):
            m = ms[p]
            floor = m["bytes"] / ((m["copy_gbps"] if offline else bw) * 1e9) * 1e3
            rows.append({"device": name, "torch": version, "copy_gbps": round(m["copy_gbps"] if offline else bw, 1),
                         "shape": s, "pass": "fwd" if p == "fwd" else "fwd+bwd", "floor_ms": floor,
                         "eager_ms": t[p, "eager"], "compile_ms": t.get((p, "compile")), "mhc_ms": m["median_ms"],
                         "mhc_pct_copy_bw": 100 * floor / m["median_ms"], "mhc_device": m["device"],
                         "torch_from": a.torch_from, "mhc_from": a.mhc_from})
            if out:
                out.write(json.dumps(rows[-1]) + "\n")
                out.flush()
            if not offline:
                print(f"  measured {s} {p}", file=sys.stderr, flush=True)
    fmt = "{:>14} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10}"
    print(fmt.format("T,n,D", "pass", "floor ms", "eager ms", "compile ms", "mhc ms", "% copy bw", "vs eager",
                     "vs compile"))
    for r in rows:
        c = r["compile_ms"]
        print(fmt.format(r["shape"], r["pass"], f"{r['floor_ms']:.4f}", f"{r['eager_ms']:.4f}",
                         f"{c:.4f}" if c else "-", f"{r['mhc_ms']:.4f}", f"{r['mhc_pct_copy_bw']:.1f}",
                         f"{r['eager_ms'] / r['mhc_ms']:.2f}x", f"{c / r['mhc_ms']:.2f}x" if c else "-"))


if __name__ == "__main__":
    main()
