#!/usr/bin/python3
"""make.py — rebuilds the reproducers of tests/fuzz/repro/ with fuzz.py's h5py writer.

    make.py MHC_BINARY [OUTDIR]     (OUTDIR defaults to this directory)

Each reproducer is the smallest valid case (T=5 n=1 D=3, from `mhc gen --seed 1` and
`mhc run`; with or without its outputs) with one hostile change;
README lists what each one reproduces. Files found by the byte mutator (the corrupt_*
ones) are kept as found and are not rebuilt here.
"""
import os
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fuzz  # noqa: E402

SMALL = "5,1,3"


def case(trees, shape=SMALL, outputs=False):
    return fuzz.base_spec(trees[shape], outputs)


def huge(c, path, shape, kind=None):
    d = c["datasets"].setdefault(path, {"values": np.zeros(1), "kind": kind or "f64", "space": "simple",
                                        "layout": "chunked", "filters": []})
    d.update(shape=list(shape), layout="chunked", chunks=[1] * len(shape), write=False)
    if kind:
        d["kind"] = kind


def link(c, path, spec, keep_as=None):
    d = c["datasets"].pop(path)
    if keep_as:
        c["datasets"][keep_as] = d
    c["links"][path] = spec


def corrupt_chunk(path, dataset):
    """Flips one bit in the first chunk of `dataset` (its checksum then fails)."""
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def repros(trees):
    """name -> case spec."""
    r = {}
    c = case(trees); c["attrs"]["/inputs"]["norm_eps"] = ("value", np.full(1000, 1e-6)); r["eps_array"] = c
    c = case(trees); c["attrs"]["/inputs"]["hc_eps"] = ("vlen", ""); r["eps_empty_vlen"] = c
    c = case(trees, outputs=True); c["attrs"]["/"]["producer"] = ("unwritten_vlen",); r["root_null_vlen"] = c
    c = case(trees, outputs=True); c["attrs"]["/"]["backend"] = ("vlen", ""); r["root_empty_vlen"] = c
    c = case(trees); huge(c, "/inputs/x", [2 ** 40, 1, 3], "bf16"); r["x_2e40_tokens"] = c
    c = case(trees); huge(c, "/inputs/x", [2 ** 25, 1, 3], "bf16"); r["x_2e25_tokens"] = c
    c = case(trees)
    for p, tail in [("/inputs/x", [1, 3]), ("/inputs/dh_in", [3]), ("/inputs/dh_post", [1]), ("/inputs/dh_res", [1, 1])]:
        huge(c, p, [2 ** 25] + tail, c["datasets"][p]["kind"])
    r["x_2e25_tokens_consistent"] = c
    c = case(trees); huge(c, "/inputs/x", [2 ** 32 + 1, 2 ** 32 + 1, 3], "bf16"); r["x_numel_overflow"] = c
    c = case(trees); huge(c, "/mine/a\nb", [2 ** 63 - 1]); r["name_with_newline"] = c
    c = case(trees); huge(c, "/mine/big", [2 ** 61]); r["numel_bytes_wrap"] = c
    c = case(trees); huge(c, "/inputs/phi", [3, 2 ** 28], "f32"); r["phi_huge_read_before_check"] = c
    c = case(trees, outputs=True); c["datasets"]["/forward/h_mix"]["shape"] = [5, 2]
    c["datasets"]["/forward/h_mix"]["values"] = c["datasets"]["/forward/h_mix"]["values"][:, :2]
    r["replay_short_upstream"] = c
    c = case(trees, outputs=True); c["datasets"]["/forward/inv_rms"].update(space="scalar", values=np.ones(()))
    r["tokens_low_rank_output"] = c
    c = case(trees, outputs=True); c["datasets"]["/forward/h_pre"]["kind"] = "f64pad"; r["float128_output"] = c
    c = case(trees); huge(c, "/mine/unwritten", [2 ** 29]); r["inspect_huge_unwritten"] = c
    c = case(trees); huge(c, "/mine/wide", [2, 2 ** 29]); r["inspect_wide_slab"] = c
    c = case(trees); link(c, "/inputs/phi", ("group",), "/inputs/phi/inner"); r["group_for_dataset"] = c
    c = case(trees); link(c, "/inputs/phi", ("soft", "/nowhere")); r["soft_dangling"] = c
    c = case(trees); link(c, "/inputs/phi", ("soft", "/inputs/phi_a")); c["links"]["/inputs/phi_a"] = ("soft", "/inputs/phi")
    r["soft_cycle"] = c
    c = case(trees); link(c, "/inputs/phi", ("external", "missing-file.h5", "/x")); r["external_link_missing"] = c
    c = case(trees); c["datasets"]["/inputs/phi"].update(external=fuzz.EXTERNAL_RAW); r["external_raw_missing"] = c
    c = case(trees); c["datasets"]["/inputs/phi"].update(layout="chunked", chunks=[3, 3], filters=["lzf"],
                                                       values=np.zeros((3, 3)))  # compressible: lzf applies
    r["filter_lzf"] = c
    c = case(trees); c["datasets"]["/inputs/phi"].update(layout="chunked", chunks=[3, 3], filters=["fletcher32"])
    r["fletcher32_bad"] = c  # a data byte flipped after writing, see corrupt_chunk()
    c = case(trees); x = c["datasets"]["/inputs/x"]; x["values"] = np.zeros_like(x["values"])
    c["attrs"]["/inputs"]["norm_eps"] = ("value", np.float64(0)); r["zero_x_norm_eps_0"] = c
    return r


def main():
    mhc = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        trees, _ = fuzz.build_templates(mhc, tmp)
        for name, c in repros(trees).items():
            path = os.path.join(out, name + ".h5")
            if os.path.exists(path):
                os.unlink(path)
            fuzz.write_case(path, c)
            if name == "fletcher32_bad":
                corrupt_chunk(path, "/inputs/phi")
            print(f"{name}.h5  {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
