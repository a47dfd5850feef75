#!/usr/bin/env python3
"""kernel.py — an independent float32 implementation of the mHC pre operator, forward and
backward with hand-written backward formulas (no autograd), written from docs/schema.md.
It behaves like a user's kernel for testing `mhc diff`: it reads a case's /inputs and
writes every stage to an HDF5 file in mhc's schema.

    /usr/bin/python3 tests/indep/kernel.py IN.h5 OUT.h5 [--order seq|rev|tile64|tile256|splitk|blas]
        [--gemm fp32|tf32|bf16] [--bug NAME] [--norm-first] [--dx dvecX|fused|textbook] [--dphi after|xgamma]
        [--stages all|forward|backward|none|STAGE,...]
        [--rename OLD=NEW] [--dtype-override STAGE=float16] [--reshape STAGE]

--order   summation order of every reduction (over K = n*D, D, n, N, and over tokens):
          seq = one sequential float32 chain; rev = the same chain from the last index down
          (a term last in seq is first in rev); tile64/tile256 = chains within tiles of that
          length, then a sequential sum of the tile partials; splitk = 4 contiguous split
          partials, each a chain, added as a pairwise tree; blas = torch.matmul / torch.sum.
--gemm    tf32: GEMM operands (phi*gamma in h_mix; dh_mix and phi in dvecX; dh_mix in dphi)
          truncated to TF32 as tensor cores do; bf16: rounded to bf16 (RNE). Sums stay fp32.
--bug     plants one bug (see BUGS); the other stages are computed correctly from it.
--norm-first  the gates' argument t as (v inv_rms) (phi*gamma)^T, normalised x first: another
          correct order of operations (h_mix itself is still v (phi*gamma)^T).
--dx      fused: dx = dh_mix (phi*gamma) + ..., gamma folded into the weights; textbook: the
          norm's backward inv_rms (dxn - xn <dxn,xn>/K) + ..., dxn = G (phi*gamma), xn = v inv_rms;
          both correct orders of operations (dvecX is still dumped as dh_mix phi; --gemm rounds
          dh_mix in fused, not phi*gamma).
--dphi    xgamma: dphi = dh_mix^T (v*gamma), autograd's form, whose GEMM reads v*gamma (rounded
          by --gemm like dh_mix); after (default): gamma applied after the GEMM of v, exact in TF32.
--stages (none: only /inputs), --rename, --dtype-override, --reshape simulate format
          mistakes in the dump.

All stages are float32 datasets in the token layout of x ([T,..] or [B,S,..]); h_in and
dx are rounded to bf16 (RNE) and stored as float32 holding bf16 values; /inputs is copied
verbatim. Formulation (per token, v = x flattened to K, G = gradient of t = h_mix*inv_rms):
    inv_rms = 1/sqrt(sum(v^2)/K + norm_eps)     h_mix = v (phi*gamma)^T   (gamma folded into phi)
    h_pre = sigmoid(z_pre) + hc_eps, z_pre = alpha0 t[:n] + bias[:n]; h_post, h_res as in the schema
    dh_mix = G inv_rms    dinv_rms = G . h_mix    dvecX = dh_mix phi
    dx = dvecX*gamma - dinv_rms inv_rms^3 / K * v + h_pre[i] dh_in[d]
    dphi = (sum_t dh_mix^T v) * gamma    dgamma = sum_t v * dvecX    dalpha, dbias: sum_t g (.t)
Every bug changes one stage; the stages after it are computed correctly from the buggy
values (dh_res_T transposes dh_res only where dh_mix is formed).
"""
import argparse
import math
import os
import sys

import h5py
import numpy
import torch

FORWARD = ["inv_rms", "h_mix", "h_pre", "h_post", "h_res", "h_in"]
BACKWARD = ["dh_pre", "dh_mix", "dinv_rms", "dvecX", "dx", "dphi", "dalpha", "dbias", "dgamma"]
ORDERS = ["seq", "rev", "tile64", "tile256", "splitk", "blas"]
SPLITS = 4  # split-K partials of --order splitk
BUG_ULPS = 64  # hres_ulps' bias (--bug-ulps)
BUGS = {
    "tail_tile": "h_mix drops the last partial K tile of 64 columns (K % 64 != 0)",
    "gamma_fwd": "h_mix ignores gamma (the backward still uses it)",
    "late_tokens": "tokens >= 256: the sigmoid argument of h_pre is 1e-3 too large (relative)",
    "dh_res_T": "dh_mix is formed from dh_res transposed in each token's n x n block",
    "trunc_h_in": "h_in rounded to bf16 by truncation",
    "double_h_in": "h_in rounded to TF32 (RNE) first, then to bf16 (RNE)",
    "trunc_dx": "dx rounded to bf16 by truncation",
    "trunc_dx_tok": "dx of one token (token 5, or the last where T <= 5) rounded to bf16 by truncation",
    "up_dx": "dx rounded to bf16 toward +inf (__float2bfloat16_ru)",
    "up_dx_tok": "dx of one token (token 5, or the last where T <= 5) rounded to bf16 toward +inf",
    "up_dx_tile": "dx at d = 64..127 of every stream (one tile's epilogue) rounded to bf16 toward +inf",
    "trunc_dx_third": "dx of every third token from token 256 on (256, 259, ...) rounded to bf16 by truncation",
    "dphi_half": "dphi summed over the first half of the tokens only",
    "dx_no_hpre": "dx misses the h_pre[i] dh_in[d] term",
    "rms_over_D": "inv_rms divides the sum of squares by D instead of n*D",
    "rms_Km1": "inv_rms divides the sum of squares by K - 1 instead of K (1.2e-4 relative at K = 4096)",
    "hmix_1e4": "h_mix 1e-4 too large (relative), the stages after it computed from it",
    "inv_tok0_1e3": "inv_rms of token 0 1e-3 too large (relative), the stages after it computed from it",
    "hmix_tok3_1e3": "h_mix of token 3 1e-3 too large (relative), the stages after it computed from it",
    "hres_ulps": "h_res too large by --bug-ulps fp32 ulps (x (1 + U 2^-23); U = 64 is about its limit at K = 4096)",
    "dalpha_sign": "dalpha[1] has its sign flipped",
    "n6_index": "n = 6 only: h_post reads its columns of h_mix one to the right (an index bug for one n)",
    "fixed_eps": "norm_eps and hc_eps fixed at 1e-6, the file's attributes ignored",
    "post_bias_pre": "h_post's sigmoid argument adds the pre gates' bias slice",
    "pre_bias_post": "h_pre's sigmoid argument adds the post gates' bias slice",
}


# ---------------------------------------------------------------- rounding

def bits(t):  # float32 tensor -> its int32 bit pattern
    return t.contiguous().view(torch.int32)


def from_bits(b):
    return b.view(torch.float32)


def bf16_rne(t):
    return t.to(torch.bfloat16).to(torch.float32)


def bf16_trunc(t):
    return from_bits(bits(t) & -0x10000)


def tf32_trunc(t):  # keep 10 mantissa bits
    return from_bits(bits(t) & ~0x1FFF)


def tf32_rne(t):
    b = bits(t)
    return from_bits((b + 0xFFF + ((b >> 13) & 1)) & ~0x1FFF)


def gemm_round(t, gemm):
    """Rounds a GEMM operand as the --gemm mode's tensor cores would see it."""
    return {"fp32": lambda u: u, "tf32": tf32_trunc, "bf16": bf16_rne}[gemm](t)


# ---------------------------------------------------------------- ordered reductions

def block_length(order, L):
    """Length of the chains that run side by side (the rest of the order is the combine)."""
    if order == "seq":
        return L
    if order in ("tile64", "tile256"):
        return min(int(order[4:]), L)
    if order == "splitk":
        return math.ceil(L / SPLITS)
    raise ValueError(f"unknown order {order}")


def combine(order, partials):
    """partials: [nb, ...] chain results -> [...], added in the order's fixed order."""
    if order == "splitk":  # pairwise tree: ((p0 + p1) + (p2 + p3))
        parts = list(partials)
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    total = partials[0].clone()
    for p in partials[1:]:  # sequential sum of tile partials
        total += p
    return total


def pad_leading(t, length):  # t: [L, ...] -> [length, ...], zero rows appended (adding 0 is exact)
    if t.shape[0] == length:
        return t
    return torch.cat([t, t.new_zeros(length - t.shape[0], *t.shape[1:])])


def ordered_sum(order, operands, factors, blas):
    """Sum over l of prod(factors(operands[.][l])) in float32, in the summation order `order`.

    operands: tensors [L, ...] whose leading axis is the reduced one (made contiguous here).
    factors: maps a slice [nb, ...] of each operand (element p of every block) to one or two
    tensors that broadcast to [nb, *out]; their product is one float32 multiply per term.
    blas: the torch.matmul / torch.sum version, for --order blas.
    Chains run block-wise: block j covers l in [j*B, (j+1)*B); the nb chains advance together.
    """
    if order == "blas":
        return blas()
    if order == "rev":
        operands, order = [o.flip(0) for o in operands], "seq"
    L = operands[0].shape[0]
    B = block_length(order, L)
    nb = math.ceil(L / B)
    ops = [pad_leading(o.contiguous(), nb * B).reshape(nb, B, *o.shape[1:]) for o in operands]
    acc = buf = None
    for p in range(B):
        f = factors(*[o[:, p] for o in ops])
        if len(f) == 2:
            if buf is None:
                buf = torch.empty(torch.broadcast_shapes(f[0].shape, f[1].shape))
            term = torch.mul(f[0], f[1], out=buf)
        else:
            term = f[0]
        if acc is None:
            acc = term.clone()
        else:
            acc += term
    return combine(order, acc)


# ---------------------------------------------------------------- the operator

def forward(inp, order, gemm, bug, norm_first=False):
    """inp: x [T,n,D], phi [N,K], alpha [3], bias [N], gamma [n,D] (float32, tokens flat).
    Returns the forward stages (tokens flat) and the sigmoids the backward needs."""
    x, phi, alpha, bias, gamma = (inp[k] for k in ("x", "phi", "alpha", "bias", "gamma"))
    T, n, D = x.shape
    K, N = n * D, phi.shape[0]
    v = x.reshape(T, K)  # [T,K]
    vT = v.t().contiguous()  # [K,T]: the reduced axis leads

    ss = ordered_sum(order, [vT], lambda a: (a, a), lambda: (v * v).sum(1))  # [T]
    ms = ss / (D if bug == "rms_over_D" else K - 1 if bug == "rms_Km1" else K)
    inv_rms = 1.0 / torch.sqrt(ms + inp["norm_eps"])  # [T]
    if bug == "inv_tok0_1e3":
        inv_rms[0] *= 1 + 1e-3

    w = phi if bug == "gamma_fwd" else phi * gamma.reshape(1, K)  # [N,K]: gamma folded into phi
    w = gemm_round(w, gemm)
    k_used = K - K % 64 if bug == "tail_tile" else K
    wT = w[:, :k_used].t().contiguous()  # [k_used,N]
    h_mix = ordered_sum(order, [vT[:k_used], wT], lambda a, b: (a[:, :, None], b[:, None, :]),
                        lambda: v[:, :k_used] @ wT)  # [T,N]
    if bug == "hmix_1e4":
        h_mix = h_mix * (1 + 1e-4)
    if bug == "hmix_tok3_1e3":
        h_mix[3] *= 1 + 1e-3

    if norm_first:  # x normalised first, then the GEMM: t = (x inv_rms) w^T, another correct order of operations
        vn = v[:, :k_used] * inv_rms[:, None]
        t = ordered_sum(order, [vn.t().contiguous(), wT], lambda a, b: (a[:, :, None], b[:, None, :]), lambda: vn @ wT)
    else:
        t = h_mix * inv_rms[:, None]  # [T,N]
    z_pre = t[:, :n] * alpha[0] + (bias[n:2 * n] if bug == "pre_bias_post" else bias[:n])
    if bug == "late_tokens":
        z_pre[256:] *= 1 + 1e-3
    s_pre = torch.sigmoid(z_pre)  # [T,n]
    post = slice(n + 1, 2 * n + 1) if bug == "n6_index" and n == 6 else slice(n, 2 * n)
    s_post = torch.sigmoid(t[:, post] * alpha[1] + (bias[:n] if bug == "post_bias_pre" else bias[n:2 * n]))  # [T,n]
    h_pre = s_pre + inp["hc_eps"]
    h_post = 2 * s_post
    h_res = (t[:, 2 * n:] * alpha[2] + bias[2 * n:]).reshape(T, n, n)
    if bug == "hres_ulps":
        h_res = h_res * (1 + BUG_ULPS * 2.0 ** -23)

    h_in = ordered_sum(order, [h_pre.t(), x.transpose(0, 1)], lambda a, b: (a[:, :, None], b),
                       lambda: torch.bmm(h_pre[:, None, :], x)[:, 0])  # [T,D]
    h_in = round_h_in(h_in, bug)
    fwd = {"inv_rms": inv_rms, "h_mix": h_mix, "h_pre": h_pre, "h_post": h_post, "h_res": h_res, "h_in": h_in}
    return fwd, {"t": t, "s_pre": s_pre, "s_post": s_post}


def round_h_in(h, bug):  # h: [T,D] float32 -> bf16 values
    if bug == "trunc_h_in":
        return bf16_trunc(h)
    if bug == "double_h_in":
        return bf16_rne(tf32_rne(h))
    return bf16_rne(h)


def backward(inp, fwd, aux, order, gemm, bug, dx_form="dvecX", dphi_form="after"):
    """Hand-written gradients of L = <h_in,dh_in> + <h_post,dh_post> + <h_res,dh_res>.
    inp: as forward plus dh_in [T,D], dh_post [T,n], dh_res [T,n,n]; fwd/aux from forward."""
    x, phi, alpha, gamma = inp["x"], inp["phi"], inp["alpha"], inp["gamma"]
    dh_in, dh_post, dh_res = inp["dh_in"], inp["dh_post"], inp["dh_res"]
    T, n, D = x.shape
    K, N = n * D, phi.shape[0]
    v = x.reshape(T, K)  # [T,K]
    inv_rms, h_mix, h_pre, t = fwd["inv_rms"], fwd["h_mix"], fwd["h_pre"], aux["t"]
    s_pre, s_post = aux["s_pre"], aux["s_post"]

    dh_pre = ordered_sum(order, [dh_in.t(), x.permute(2, 0, 1)], lambda a, b: (a[:, :, None], b),
                         lambda: torch.bmm(x, dh_in[:, :, None])[:, :, 0])  # [T,n]

    g_pre = dh_pre * (s_pre * (1 - s_pre))  # gradients of the sigmoid arguments, [T,n]
    g_post = dh_post * (2 * (s_post * (1 - s_post)))
    g_res = dh_res.reshape(T, n * n)
    g = torch.cat([g_pre, g_post, g_res], 1)  # [T,N]
    gate = torch.cat([alpha[0].expand(n), alpha[1].expand(n), alpha[2].expand(n * n)])  # [N]
    G = g * gate  # gradient of t, [T,N]
    G_mix = G
    if bug == "dh_res_T":
        G_mix = torch.cat([G[:, :2 * n], (g_res.reshape(T, n, n).transpose(1, 2).reshape(T, n * n) * alpha[2])], 1)
    dh_mix = G_mix * inv_rms[:, None]  # [T,N]
    dinv_rms = ordered_sum(order, [G.t(), h_mix.t()], lambda a, b: (a, b), lambda: (G * h_mix).sum(1))  # [T]

    dm, ph = gemm_round(dh_mix, gemm), gemm_round(phi, gemm)
    dvecX = ordered_sum(order, [dm.t(), ph], lambda a, b: (a[:, :, None], b[:, None, :]), lambda: dm @ ph)  # [T,K]

    c = -(dinv_rms * (inv_rms * inv_rms * inv_rms)) / K  # d inv_rms / d v = -inv_rms^3 v / K, [T]
    if dx_form == "fused":  # gamma folded into the GEMM's weights, not applied to dvecX
        dx = dm @ (phi * gamma.reshape(1, K)) + c[:, None] * v
    elif dx_form == "textbook":  # the norm's textbook backward: inv_rms (dxn - xn <dxn, xn> / K)
        dxn, xn = G_mix @ (phi * gamma.reshape(1, K)), v * inv_rms[:, None]
        dx = inv_rms[:, None] * (dxn - xn * ((dxn * xn).sum(1) / K)[:, None])
    else:
        dx = dvecX * gamma.reshape(1, K) + c[:, None] * v
    if bug != "dx_no_hpre":
        dx = dx + (h_pre[:, :, None] * dh_in[:, None, :]).reshape(T, K)
    rounded = bf16_trunc(dx) if bug == "trunc_dx" else bf16_rne(dx)
    if bug == "trunc_dx_tok":
        rounded[min(5, T - 1)] = bf16_trunc(dx[min(5, T - 1)])
    if bug in ("up_dx", "up_dx_tok", "up_dx_tile"):  # the nearest-even value, one step up where it lies below dx
        up = torch.where(rounded < dx, torch.nextafter(rounded.to(torch.bfloat16), torch.tensor(float("inf"), dtype=torch.bfloat16)).to(torch.float32), rounded)
        where = torch.zeros(T, n, D, dtype=torch.bool)
        if bug == "up_dx":
            where[:] = True
        elif bug == "up_dx_tok":
            where[min(5, T - 1)] = True
        else:
            where[:, :, 64:128] = True
        rounded = torch.where(where.reshape(T, K), up, rounded)
    if bug == "trunc_dx_third":
        rounded[256::3] = bf16_trunc(dx[256::3])
    dx = rounded.reshape(T, n, D)

    t_used = T // 2 if bug == "dphi_half" else T
    if dphi_form == "xgamma":  # autograd's form: the GEMM reads x*gamma, rounded as its operand
        vg = gemm_round(v[:t_used] * gamma.reshape(1, K), gemm)
        dphi = ordered_sum(order, [dm[:t_used], vg], lambda a, b: (a[:, :, None], b[:, None, :]),
                           lambda: dm[:t_used].t() @ vg)  # [N,K]
    else:
        dphi = ordered_sum(order, [dm[:t_used], v[:t_used]], lambda a, b: (a[:, :, None], b[:, None, :]),
                           lambda: dm[:t_used].t() @ v[:t_used]) * gamma.reshape(1, K)  # [N,K]

    groups = [(0, n), (n, 2 * n), (2 * n, N)]  # pre, post, res
    q = torch.stack([ordered_sum(order, [g[:, a:b].t(), t[:, a:b].t()], lambda u, w: (u, w),
                                 lambda: (g[:, a:b] * t[:, a:b]).sum(1)) for a, b in groups], 1)  # [T,3]
    dalpha = ordered_sum(order, [q], lambda u: (u,), lambda: q.sum(0))  # [3]
    if bug == "dalpha_sign":
        dalpha[1] = -dalpha[1]
    dbias = ordered_sum(order, [g], lambda u: (u,), lambda: g.sum(0))  # [N]
    dgamma = ordered_sum(order, [v, dvecX], lambda a, b: (a, b), lambda: (v * dvecX).sum(0)).reshape(n, D)

    return {"dh_pre": dh_pre, "dh_mix": dh_mix, "dinv_rms": dinv_rms, "dvecX": dvecX.reshape(T, n, D),
            "dx": dx, "dphi": dphi, "dalpha": dalpha, "dbias": dbias, "dgamma": dgamma}


# ---------------------------------------------------------------- HDF5

def read_float32(ds):
    """An HDF5 float dataset as a float32 array. bf16 datasets are read as raw 16-bit words
    (HDF5's own bf16 -> float32 conversion is ~10x slower) and widened: exact either way."""
    ftype = ds.id.get_type()
    is_bf16 = isinstance(ftype, h5py.h5t.TypeFloatID) and ftype.get_size() == 2 \
        and ftype.get_fields() == (15, 7, 8, 0, 7) and ftype.get_ebias() == 127
    if is_bf16:
        words = numpy.empty(ds.shape, numpy.uint16)
        ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, words, mtype=ftype)  # same type: no conversion
        if ftype.get_order() == h5py.h5t.ORDER_BE:
            words = words.byteswap()
        return (words.astype(numpy.uint32) << 16).view(numpy.float32)
    return ds[()].astype(numpy.float32)


def read_inputs(path):
    """/inputs as float32 tensors with the tokens flattened; returns (inputs, token shape)."""
    with h5py.File(path, "r") as f:
        g = f["inputs"]
        raw = {k: torch.from_numpy(read_float32(g[k])) for k in g}
        eps = {k: float(g.attrs.get(k, 1e-6)) for k in ("norm_eps", "hc_eps")}
    x = raw["x"]
    tok, (n, D) = tuple(x.shape[:-2]), x.shape[-2:]
    T = math.prod(tok)
    inp = {"x": x.reshape(T, n, D), "phi": raw["phi"], "alpha": raw["alpha"], "bias": raw["bias"],
           "gamma": raw.get("gamma", torch.ones(n, D)), **eps}
    if all(k in raw for k in ("dh_in", "dh_post", "dh_res")):
        inp.update(dh_in=raw["dh_in"].reshape(T, D), dh_post=raw["dh_post"].reshape(T, n),
                   dh_res=raw["dh_res"].reshape(T, n, n))
    return inp, tok


def with_tokens(name, t, tok):  # per-token stages get the input's token layout back
    if name in ("dphi", "dalpha", "dbias", "dgamma"):
        return t
    return t.reshape(*tok, *t.shape[1:])


def write_output(args, stages, tok):
    rename = dict(kv.split("=", 1) for kv in args.rename)
    dtypes = dict(kv.split("=", 1) for kv in args.dtype_override)
    tmp = args.output + ".tmp"
    with h5py.File(args.input, "r") as src, h5py.File(tmp, "w") as f:
        f.attrs["producer"] = "tests/indep/kernel.py"
        f.attrs["backend"] = f"indep-torch:{args.order}:{args.gemm}" + (f":bug={args.bug}" if args.bug else "")
        f.attrs["precision"] = "fp32"
        src.copy(src["inputs"], f, "inputs")
        for name, t in stages.items():
            arr = with_tokens(name, t, tok).numpy().astype(dtypes.get(name, "float32"))
            if name in args.reshape:
                arr = arr.reshape(-1)
            group = "forward" if name in FORWARD else "backward"
            f.create_dataset(f"{group}/{rename.get(name, name)}", data=arr)
    os.replace(tmp, args.output)


def selected_stages(spec):
    names = []
    for item in spec.split(","):
        names += {"all": FORWARD + BACKWARD, "forward": FORWARD, "backward": BACKWARD, "none": []}.get(item, [item])
    unknown = [s for s in names if s not in FORWARD + BACKWARD]
    if unknown:
        sys.exit(f"kernel.py: unknown stage(s) in --stages: {', '.join(unknown)}")
    return names


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--order", choices=ORDERS, default="seq")
    p.add_argument("--gemm", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--bug", choices=sorted(BUGS), default=None)
    p.add_argument("--bug-ulps", type=float, default=64, help="the size of hres_ulps' bias, in fp32 ulps")
    p.add_argument("--norm-first", action="store_true", help="the gates from (x inv_rms) w^T, not h_mix inv_rms")
    p.add_argument("--dx", choices=["dvecX", "fused", "textbook"], default="dvecX",
                   help="dx from dvecX*gamma (default), from dh_mix (phi*gamma) (gamma folded into the weights), "
                        "or the norm's textbook backward inv_rms (dxn - xn <dxn,xn>/K); dvecX is dumped as dh_mix phi")
    p.add_argument("--dphi", choices=["after", "xgamma"], default="after",
                   help="dphi as (dh_mix^T x) gamma (default) or as dh_mix^T (x gamma), whose GEMM rounds x*gamma too")
    p.add_argument("--stages", default="all", help="all, forward, backward, none (only /inputs) or a comma list of stages")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    p.add_argument("--dtype-override", action="append", default=[], metavar="STAGE=DTYPE")
    p.add_argument("--reshape", action="append", default=[], metavar="STAGE")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    global BUG_ULPS
    BUG_ULPS = args.bug_ulps
    torch.set_num_threads(1)  # small ops dominate: one thread is faster than two, and robust under load
    inp, tok = read_inputs(args.input)
    if args.bug == "fixed_eps":
        inp.update(norm_eps=1e-6, hc_eps=1e-6)
    want = selected_stages(args.stages)
    with torch.no_grad():
        fwd, aux = forward(inp, args.order, args.gemm, args.bug, args.norm_first)
        stages = dict(fwd)
        if "dh_in" in inp and any(s in BACKWARD for s in want):
            stages.update(backward(inp, fwd, aux, args.order, args.gemm, args.bug, args.dx, args.dphi))
    write_output(args, {k: v for k, v in stages.items() if k in want}, tok)


if __name__ == "__main__":
    main(sys.argv[1:])
