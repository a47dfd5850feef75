#!/usr/bin/python3
"""fuzz.py — a seeded fuzzer for `mhc inspect`, `mhc run` and `mhc diff` on hostile files.

    fuzz.py MHC_BINARY WORKDIR [--seed S] [--cases N] [--timeout SEC] [--jobs J]
            [--keep-failures DIR] [--only I,J,..] [--files H5..] [--results JSONL]
            [--strict-hdf5] [-v]

Case i of seed S draws everything from random.Random(f"{S}:{i}"), so a (seed, case)
pair names one input file. Three generators:

  struct   an h5py-written case around a small valid one (T=8 n=4 D=8, [B,S]=[2,3] n=4
           D=8, T=5 n=1 D=3; the values of `mhc gen` + `mhc run`), with 1-3 hostile
           changes: dtype class of a dataset (int, float16/32/64, big-endian, 80-bit,
           bf16, off-bias bf16, 24- and 8-bit floats, fixed/vlen string, compound, enum,
           vlen, opaque, array), dataspace (scalar, null, zero-size, rank 0..5, wrong
           shape, declared dims up to 2^63-1, chunked and never written: the file stays small),
           norm_eps/hc_eps and root string attributes (array, string, empty or unwritten
           vlen string, NaN, Inf, negative, 0, int, null space), links (dangling and
           cyclic soft links, hard duplicates, external links to missing files, a group
           or a named type where a dataset belongs), storage (compact, contiguous,
           chunked; gzip, shuffle, fletcher32, lzf, scaleoffset, nbit, szip, raw data in
           a missing external file), file format (libver latest/earliest, user block),
           missing and unknown datasets and groups, NaN/Inf/huge values, all-zero x with
           norm_eps = 0, outputs of another shape, outputs changed by a known amount;
  bytes    a byte mutator (bit flips, byte runs, magic integers, chunk duplication and
           insertion, deletion, truncation) over valid files written by `mhc gen`,
           `mhc run` and h5py (gzip+shuffle+fletcher32 chunked, compact, libver latest);
  special  not a regular HDF5 file: FIFO, directory, empty, signature only, symlink loop.

Each case runs `mhc inspect F`, `mhc run [opts] F OUT` (OUT in an empty directory) and,
when F has outputs, `mhc diff [opts] F cpu`, `mhc diff F F` and `mhc diff F REF` (REF: the
valid file F was made from), each under --timeout with ENV (ASan/UBSan options, one
thread, MHC_MAX_MEMORY); opts are drawn per case (--strict, --precision fp64, --json,
--tokens, --dump-diff/--report, ...). A case fails on: a signal, a timeout, an exit status
outside {0,1,2}, a sanitizer report in mhc (reports inside libhdf5 itself are listed apart;
--strict-hdf5 counts them), an exit 2 whose stderr is not one `mhc: error:` line (warnings
aside; diff's own "invalid" verdict is on stdout), stray stderr (an HDF5 error stack), a
partial or temporary output left behind, a modified input, and on what is known of F:
- F valid (only harmless changes): any command not exiting 0;
- F's outputs known to differ from what its inputs give: `diff F cpu`/`diff F REF` exit 0;
- all-zero x with norm_eps = 0: `run` exit 0 with non-finite outputs;
- a byte mutant: `inspect` exit 0 while HDF5's own walk of F fails, or listing another
  number of datasets than that walk finds;
- an intact (h5py-written) file: an error blaming corruption; one hostile link or filter
  on dataset P: an error that does not name P.

Prints one line per failing case and `N passed, M failed`; exit 1 on any failure.
`--files F..` runs the same checks (every option set) on given files, e.g. repro/*.h5.
Deterministic for a seed; mhc-written templates carry HDF5 timestamps, so byte-mutated
cases over them agree with another run up to those bytes.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t, h5z

SHAPES = ["8,4,8", "2,3,4,8", "5,1,3"]
ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:allocator_may_return_null=1:"
                    "max_allocation_size_mb=2048:hard_rss_limit_mb=3072",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    "OMP_NUM_THREADS": "1",
    "MHC_MAX_MEMORY": "1000000000",  # mhc's own limit, below ASan's 2 GiB: the same on any machine
}
INPUTS = ["x", "phi", "alpha", "bias", "gamma", "dh_in", "dh_post", "dh_res"]
FORWARD = ["inv_rms", "h_mix", "h_pre", "h_post", "h_res", "h_in"]
BACKWARD = ["dh_pre", "dh_mix", "dinv_rms", "dvecX", "dx", "dphi", "dalpha", "dbias", "dgamma"]
GROUP_OF = {**{s: "inputs" for s in INPUTS}, **{s: "forward" for s in FORWARD},
            **{s: "backward" for s in BACKWARD}}
STAGE_PATHS = [f"/{GROUP_OF[s]}/{s}" for s in INPUTS + FORWARD + BACKWARD]


# ---------------------------------------------------------------- HDF5 types

def custom_float(size, spos, epos, esize, mpos, msize, ebias):
    """An HDF5 float type with the given layout (bf16, 24-bit, 8-bit, ...)."""
    t = h5t.IEEE_F32LE.copy() if size <= 4 else h5t.IEEE_F64LE.copy()
    t.set_fields(spos, epos, esize, mpos, msize)
    t.set_precision(size * 8)
    t.set_size(size)
    t.set_ebias(ebias)
    return t


def padded_f64():
    t = h5t.IEEE_F64LE.copy()
    t.set_size(16)
    return t


FLOAT_KINDS = {  # file type; written from float64 through HDF5's conversion
    "bf16": lambda: custom_float(2, 15, 7, 8, 0, 7, 127),
    "bf16_bias": lambda: custom_float(2, 15, 7, 8, 0, 7, 120),
    "f16": lambda: h5t.IEEE_F16LE.copy(),
    "f32": lambda: h5t.IEEE_F32LE.copy(),
    "f64": lambda: h5t.IEEE_F64LE.copy(),
    "f32be": lambda: h5t.IEEE_F32BE.copy(),
    "f64be": lambda: h5t.IEEE_F64BE.copy(),
    "f80": lambda: h5t.py_create(np.dtype(np.longdouble)),
    "f64pad": padded_f64,
    "f24": lambda: custom_float(3, 23, 16, 7, 0, 16, 63),
    "f8": lambda: custom_float(1, 7, 3, 4, 0, 3, 7),
}
NUMPY_KINDS = {  # numpy dtype; values converted in numpy
    "i8": np.dtype("i1"), "i32": np.dtype("<i4"), "i64be": np.dtype(">i8"), "u64": np.dtype("<u8"),
    "bool": np.dtype("bool"), "str_fixed": np.dtype("S12"), "str_vlen": h5py.string_dtype(),
    "compound": np.dtype([("re", "<f4"), ("im", "<f4")]), "compound1": np.dtype([("v", "<f4")]),
    "enum": h5py.enum_dtype({"lo": 0, "hi": 1}, basetype="i1"), "vlen_f32": h5py.vlen_dtype(np.float32),
    "opaque": np.dtype("V4"), "array_f32": np.dtype(("<f4", (2,))),
}
ALL_KINDS = sorted(FLOAT_KINDS) + sorted(NUMPY_KINDS)


def bf16_like(tid):
    return isinstance(tid, h5t.TypeFloatID) and tid.get_size() == 2 and tid.get_fields() == (15, 7, 8, 0, 7)


def memory_buffer(kind, values):
    """(numpy buffer, memory type) holding `values` (float64) for a dataset of `kind`."""
    if kind in FLOAT_KINDS:
        return np.ascontiguousarray(values, "<f8"), h5t.NATIVE_DOUBLE
    dt = NUMPY_KINDS[kind]
    v = np.nan_to_num(values, nan=0.0, posinf=1e3, neginf=-1e3)
    if kind.startswith(("i", "u")):
        info = np.iinfo(dt)
        buf = np.clip(np.round(v), info.min, info.max).astype(dt)
    elif kind in ("bool", "enum"):
        buf = (v > 0).astype(np.int8 if kind == "enum" else bool)
    elif kind == "str_fixed":
        buf = np.array([b"%.6g" % x for x in v.ravel()], dtype=dt).reshape(v.shape)
    elif kind == "str_vlen":
        buf = np.array(["%.6g" % x for x in v.ravel()] or [], dtype=object).reshape(v.shape)
    elif kind.startswith("compound"):
        buf = np.zeros(v.shape, dt)
        for name in dt.names:
            buf[name] = v
    elif kind == "vlen_f32":
        buf = np.empty(v.shape, object)
        for i, x in np.ndenumerate(v):
            buf[i] = np.full(1 + i[-1] % 3 if i else 1, x, np.float32)
    elif kind == "opaque":
        buf = v.astype("<f4").view("V4").reshape(v.shape)
    else:  # array_f32: file type H5T_ARRAY of 2 floats per element
        buf = np.ascontiguousarray(np.stack([v, -v], -1).astype("<f4"))
        return buf, h5t.array_create(h5t.NATIVE_FLOAT, (2,))
    return np.ascontiguousarray(buf), h5t.py_create(dt, logical=True)


def file_type(kind):
    if kind in FLOAT_KINDS:
        return FLOAT_KINDS[kind]()
    if kind == "array_f32":
        return h5t.array_create(h5t.IEEE_F32LE, (2,))
    return h5t.py_create(NUMPY_KINDS[kind], logical=True)


# ---------------------------------------------------------------- writing a case spec

def declared_bytes(ds):
    return 0 if ds["space"] != "simple" else int(np.prod(ds["shape"], dtype=np.float64)) * 8


def make_dcpl(ds):
    if declared_bytes(ds) > 1 << 22 and (ds["layout"] != "chunked" or ds.get("alloc_early")):
        ds = dict(ds, layout="chunked", chunks=[max(1, min(s, 4)) for s in ds["shape"]], alloc_early=False)
    dcpl = h5p.create(h5p.DATASET_CREATE)
    if ds["layout"] == "compact":
        dcpl.set_layout(h5d.COMPACT)
    elif ds["layout"] == "chunked":
        dcpl.set_chunk(tuple(ds["chunks"]))
        for f in ds["filters"] if not ds["kind"].startswith(("str_vlen", "vlen")) else []:
            add_filter(dcpl, f, ds["kind"])
    if ds.get("external") and ds["layout"] == "contiguous":
        dcpl.set_external(ds["external"].encode(), 0, h5s.UNLIMITED)
    if ds.get("alloc_early"):
        dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    return dcpl


def add_filter(dcpl, f, kind):
    if f == "gzip":
        dcpl.set_deflate(4)
    elif f == "shuffle":
        dcpl.set_shuffle()
    elif f == "fletcher32":
        dcpl.set_fletcher32()
    elif f == "lzf":
        dcpl.set_filter(h5z.FILTER_LZF, h5z.FLAG_OPTIONAL)
    elif f == "scaleoffset" and kind in ("f32", "f64", "f32be", "f64be"):
        dcpl.set_scaleoffset(h5z.SO_FLOAT_DSCALE, 2)
    elif f == "scaleoffset" and kind in ("i8", "i32", "i64be", "u64"):
        dcpl.set_scaleoffset(h5z.SO_INT, 0)
    elif f == "nbit":
        dcpl.set_filter(h5z.FILTER_NBIT, h5z.FLAG_OPTIONAL)
    elif f == "szip":
        dcpl.set_szip(h5z.SZIP_NN_OPTION_MASK, 2)


def make_space(ds):
    if ds["space"] == "null":
        return h5s.create(h5s.NULL)
    if ds["space"] == "scalar":
        return h5s.create(h5s.SCALAR)
    maxshape = ds.get("maxshape")
    if maxshape is not None:
        maxshape = tuple(h5s.UNLIMITED if m is None else m for m in maxshape)
    return h5s.create_simple(tuple(ds["shape"]), maxshape)


def write_dataset(f, path, ds):
    parent, name = path.rsplit("/", 1)
    g = f.require_group(parent) if parent else f
    tid = file_type(ds["kind"])
    dsid = h5d.create(g.id, name.encode(), tid, make_space(ds), dcpl=make_dcpl(ds))
    values = ds["values"]
    if values is None or ds["space"] == "null" or not ds.get("write", True):
        return
    shape = () if ds["space"] == "scalar" else tuple(ds["shape"])
    if int(np.prod(shape, dtype=np.float64)) == 0:
        return
    values = np.resize(np.asarray(values, np.float64), shape) if values.shape != shape else values
    buf, mtype = memory_buffer(ds["kind"], values)
    if ds["kind"] in FLOAT_KINDS:
        dsid.write(h5s.ALL, h5s.ALL, buf, mtype=mtype)
    else:
        h5py.Dataset(dsid)[...] = buf


def write_attr(obj, name, spec):
    """spec: ("value", numpy value) | ("vlen", str) | ("unwritten_vlen",) | ("null", dtype)."""
    if spec[0] == "value":
        obj.attrs.create(name, spec[1])
    elif spec[0] == "vlen":
        obj.attrs.create(name, spec[1], dtype=h5py.string_dtype())
    elif spec[0] == "unwritten_vlen":  # vlen string with a NULL pointer: created, never written
        h5py.h5a.create(obj.id, name.encode(), h5t.py_create(h5py.string_dtype(), logical=True),
                        h5s.create(h5s.SCALAR))
    elif spec[0] == "null":
        obj.attrs.create(name, h5py.Empty(spec[1]))


def write_link(f, path, link):
    parent = path.rsplit("/", 1)[0]
    if parent:
        f.require_group(parent)
    kind = link[0]
    if kind == "soft":
        f[path] = h5py.SoftLink(link[1])
    elif kind == "external":
        f[path] = h5py.ExternalLink(link[1], link[2])
    elif kind == "hard":
        if link[1] in f:
            f[path] = f[link[1]]
    elif kind == "group":
        f.require_group(path)
    elif kind == "datatype":
        f[path] = np.dtype("<f4")


EXTERNAL_RAW = "missing-raw.bin"  # relative to the writer's cwd: written there, then removed


def write_case(path, c):
    """Writes the spec with h5py from path's directory (external raw data lands there)."""
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path)))
    try:
        write_h5(os.path.basename(path), c)
    finally:
        if os.path.exists(EXTERNAL_RAW):
            os.unlink(EXTERNAL_RAW)
        os.chdir(cwd)


def write_h5(path, c):
    kw = {"libver": c["libver"]} if c.get("libver") else {}
    if c.get("userblock"):
        kw["userblock_size"] = c["userblock"]
    with h5py.File(path, "w", **kw) as f:
        for g in c["groups"]:
            f.require_group(g)
        for p in sorted(c["datasets"]):
            write_dataset(f, p, c["datasets"][p])
        for p in sorted(c["links"], key=lambda p: c["links"][p][0] == "hard"):
            if p not in f or c["links"][p][0] != "group":
                write_link(f, p, c["links"][p])
        for obj in sorted(c["attrs"]):
            target = f.require_group(obj) if obj not in f else f[obj]
            for name, spec in sorted(c["attrs"][obj].items()):
                if name in target.attrs:
                    del target.attrs[name]
                write_attr(target, name, spec)


# ---------------------------------------------------------------- the valid base cases

def read_tree(path):
    """Every stage dataset of an mhc file as float64 values plus kind, and the attributes."""
    base = {"datasets": {}, "attrs": {}, "path": path}
    with h5py.File(path, "r") as f:
        for p in STAGE_PATHS:
            if p in f:
                d = f[p]
                kind = "bf16" if bf16_like(d.id.get_type()) else {4: "f32", 8: "f64"}[d.dtype.itemsize]
                base["datasets"][p] = {"values": d[()].astype(np.float64), "kind": kind, "shape": d.shape}
        base["attrs"]["/inputs"] = {k: float(v) for k, v in f["inputs"].attrs.items()}
        base["attrs"]["/"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return base


def base_spec(tree, outputs):
    """A case spec (what write_case writes) of the base tree, every dataset contiguous."""
    c = {"datasets": {}, "links": {}, "groups": ["/inputs"], "attrs": {"/inputs": {}, "/": {}},
         "libver": None, "labels": [], "preserving": True, "changed_outputs": False,
         "zero_x_eps0": False, "outputs": outputs}
    for p, d in tree["datasets"].items():
        if outputs or p.startswith("/inputs/"):
            c["datasets"][p] = {"values": d["values"], "kind": d["kind"], "space": "simple",
                                "shape": list(d["shape"]), "layout": "contiguous", "chunks": None, "filters": []}
    for k, v in tree["attrs"]["/inputs"].items():
        c["attrs"]["/inputs"][k] = ("value", np.float64(v))
    for k, v in tree["attrs"]["/"].items():
        c["attrs"]["/"][k] = ("value", np.int32(v)) if k == "schema_version" else ("vlen", str(v))
    if outputs:
        c["groups"] += ["/forward", "/backward"]
    return c


def set_storage(c, layout, filters=(), libver=None):
    c["libver"] = libver
    for d in c["datasets"].values():
        d["layout"], d["filters"] = layout, list(filters)
        d["chunks"] = [max(1, s // 2) for s in d["shape"]] if layout == "chunked" else None
    return c


def build_templates(mhc, workdir):
    """mhc gen/run files per base shape, their trees, and h5py-written variants (for `bytes`)."""
    tdir = os.path.join(workdir, "templates")
    os.makedirs(tdir, exist_ok=True)
    trees, files = {}, []
    for shape in SHAPES:
        gen, run = (os.path.join(tdir, f"{shape}.{k}.h5") for k in ("gen", "run"))
        for p in (gen, run):
            if os.path.exists(p):
                os.unlink(p)
        subprocess.run([mhc, "gen", "--shape", shape, "--seed", "1", gen], check=True, env=env(),
                       stdout=subprocess.DEVNULL)
        subprocess.run([mhc, "run", "-q", gen, run], check=True, env=env(), stdout=subprocess.DEVNULL)
        trees[shape] = read_tree(run)
        files += [(f"mhc-gen:{shape}", gen, False), (f"mhc-run:{shape}", run, True)]
        for name, layout, filters, libver in [("h5py-gzip", "chunked", ["shuffle", "gzip", "fletcher32"], None),
                                              ("h5py-compact", "compact", [], "earliest"),
                                              ("h5py-latest", "chunked", [], "latest")]:
            p = os.path.join(tdir, f"{shape}.{name}.h5")
            write_case(p, set_storage(base_spec(trees[shape], True), layout, filters, libver))
            files.append((f"{name}:{shape}", p, True))
    return trees, files


# ---------------------------------------------------------------- structured mutations

def pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def pick_dataset(rng, c, prefix=""):
    names = sorted(p for p in c["datasets"] if p.startswith(prefix))
    return pick(rng, names) if names else None


def is_input(path):
    return path.startswith("/inputs/")


def lossless_kinds(d):
    """Kinds that hold d's values exactly (widening)."""
    return {"bf16": ["f32", "f64", "f32be", "f64be", "f80", "f64pad"],
            "f32": ["f64", "f64be", "f80", "f64pad"]}.get(d["kind"], [])


def m_dtype(rng, c):
    p = pick_dataset(rng, c)
    if not p:
        return "dtype:none"
    d = c["datasets"][p]
    kind = pick(rng, ALL_KINDS + ["f32", "f64"] * 3)
    if kind not in lossless_kinds(d):
        c["preserving"] = False
    d["kind"] = kind
    if kind not in FLOAT_KINDS and d["layout"] == "chunked":
        d["filters"] = [f for f in d["filters"] if f != "scaleoffset"]
    return f"dtype:{p}={kind}"


def huge_shape(rng, shape):
    s = list(shape) or [1]
    i = rng.randrange(len(s))
    s[i] = pick(rng, [2 ** 20, 2 ** 25, 2 ** 31, 2 ** 32 + 1, 2 ** 40, 2 ** 56, 2 ** 61, 2 ** 63 - 1])
    if rng.random() < 0.3:
        j = rng.randrange(len(s))
        s[j] = max(s[j], pick(rng, [2 ** 16, 2 ** 21, 2 ** 30]))
    return s


def m_space(rng, c):
    p = pick_dataset(rng, c)
    if not p:
        return "space:none"
    d = c["datasets"][p]
    c["preserving"] = False
    how = pick(rng, ["scalar", "null", "zero", "rank", "offbyone", "huge", "huge", "swap", "unlimited"])
    d["maxshape"] = None
    if how in ("scalar", "null"):
        d["space"], d["layout"], d["shape"] = how, "contiguous", []
        return f"space:{p}={how}"
    if how == "zero":
        zero = rng.randrange(max(1, len(d["shape"])))
        d["shape"] = [0 if i == zero else s for i, s in enumerate(d["shape"])] or [0]
    elif how == "rank":
        d["shape"] = [rng.randint(1, 5) for _ in range(rng.randint(0, 5))]
    elif how == "offbyone":
        if not d["shape"]:  # an earlier change made it a scalar: give it one axis
            d["shape"] = [1]
        i = rng.randrange(len(d["shape"]))
        d["shape"][i] = max(0, d["shape"][i] + pick(rng, [-1, 1]))
    elif how == "swap":
        d["shape"] = d["shape"][::-1]
    elif how == "unlimited":
        d["maxshape"] = [None] * len(d["shape"])
    else:
        d["shape"] = huge_shape(rng, d["shape"])
        d["write"] = False
    if how in ("huge", "unlimited") or d["layout"] == "chunked":
        d["layout"] = "chunked"
        if 0 in d["shape"]:
            d["maxshape"] = [None] * len(d["shape"])
        d["chunks"] = [max(1, min(s, 4)) for s in d["shape"]] or None
        if not d["chunks"]:
            d["layout"], d["filters"] = "contiguous", []
    if d["layout"] == "compact" and how == "huge":
        d["layout"] = "chunked"
    return f"space:{p}={how}{d['shape']}"


EPS_VALUES = [
    ("array", ("value", np.full(2, 1e-6))),
    ("array1000", ("value", np.full(1000, 1e-6))),
    ("zero_size", ("value", np.zeros(0))),
    ("string", ("value", np.bytes_(b"1e-6"))),
    ("vlen", ("vlen", "1e-6")),
    ("empty_vlen", ("vlen", "")),
    ("unwritten_vlen", ("unwritten_vlen",)),
    ("nan", ("value", np.float64("nan"))),
    ("inf", ("value", np.float64("inf"))),
    ("negative", ("value", np.float64(-1e-6))),
    ("zero", ("value", np.float64(0))),
    ("int", ("value", np.int64(1))),
    ("huge", ("value", np.float64(1e308))),
    ("float16", ("value", np.float16(1e-3))),
    ("compound", ("value", np.array((1e-6, 2.0), dtype=[("a", "<f8"), ("b", "<f8")]))),
    ("null", ("null", "<f8")),
    ("2d", ("value", np.full((3, 3), 1e-6))),
]


def m_eps(rng, c):
    name = pick(rng, ["norm_eps", "hc_eps"])
    label, spec = pick(rng, EPS_VALUES)
    c["attrs"].setdefault("/inputs", {})[name] = spec
    c["preserving"] = False
    return f"attr:{name}={label}"


ROOT_VALUES = [  # (label, spec, harmless): a harmless one leaves a valid case valid
    ("vlen", ("vlen", "cpu"), True),
    ("empty_vlen", ("vlen", ""), True),
    ("unwritten_vlen", ("unwritten_vlen",), False),
    ("fixed", ("value", np.bytes_(b"cuda")), True),
    ("long", ("vlen", "x" * 60000), True),
    ("utf8", ("vlen", "\u00e9\u4e2d\U0001f600"), True),
    ("nonutf8", ("value", np.bytes_(b"\xff\xfe\x00abc")), True),
    ("newline", ("vlen", "a\nb"), True),
    ("int", ("value", np.int64(7)), True),
    ("float", ("value", np.float64(1.5)), True),
    ("array", ("value", np.array([b"a", b"b"])), False),
    ("null", ("null", h5py.string_dtype()), False),
    ("vlen_array", ("value", np.array(["a", ""], dtype=h5py.string_dtype())), False),
]


def m_root_attr(rng, c):
    name = pick(rng, ["producer", "version", "backend", "precision", "device", "schema_version", "generator"])
    label, spec, harmless = pick(rng, ROOT_VALUES)
    c["attrs"].setdefault("/", {})[name] = spec
    if not harmless:
        c["preserving"] = False
    return f"rootattr:{name}={label}"


def m_link(rng, c):
    p = pick_dataset(rng, c)
    if not p:
        return "link:none"
    how = pick(rng, ["dangling", "cycle", "hard_dup", "external_missing", "group", "datatype",
                     "soft_ok", "external_raw", "inputs_soft", "group_cycle", "self_soft"])
    d = c["datasets"].pop(p)
    c["preserving"] = how in ("soft_ok", "inputs_soft", "group_cycle")
    if how in ("dangling", "cycle", "self_soft", "external_missing", "group", "datatype", "external_raw"):
        c["named"] = p  # an error about it must name it
    if how == "dangling":
        c["links"][p] = ("soft", "/nowhere/at/all")
    elif how == "cycle":
        c["links"][p] = ("soft", p + "_a")
        c["links"][p + "_a"] = ("soft", p)
    elif how == "self_soft":
        c["links"][p] = ("soft", p)
    elif how == "hard_dup":
        other = pick_dataset(rng, c) or "/"
        c["links"][p] = ("hard", other)
    elif how == "external_missing":
        c["links"][p] = ("external", "missing-file.h5", "/x")
    elif how == "group":
        c["links"][p] = ("group",)
        c["datasets"][p + "/inner"] = d
    elif how == "datatype":
        c["links"][p] = ("datatype",)
    elif how == "soft_ok":
        c["datasets"]["/stash" + p] = d
        c["links"][p] = ("soft", "/stash" + p)
    elif how == "external_raw":
        d.update(layout="contiguous", filters=[], external=EXTERNAL_RAW, space="simple")
        c["datasets"][p] = d
    elif how == "inputs_soft":
        c["datasets"][p] = d
        for q in [q for q in c["datasets"] if is_input(q)]:
            c["datasets"]["/stash" + q] = c["datasets"].pop(q)
        c["groups"] = [g for g in c["groups"] if g != "/inputs"] + ["/stash/inputs"]
        c["attrs"]["/stash/inputs"] = c["attrs"].pop("/inputs", {})
        c["links"]["/inputs"] = ("soft", "/stash/inputs")
        return "link:/inputs=soft"
    elif how == "group_cycle":
        c["datasets"][p] = d
        c["links"][p.rsplit("/", 1)[0] + "/loop"] = ("hard", "/")
    return f"link:{p}={how}"


FILTER_SETS = [["gzip"], ["shuffle"], ["fletcher32"], ["shuffle", "gzip", "fletcher32"], ["lzf"],
               ["scaleoffset"], ["nbit"], ["szip"], ["shuffle", "lzf"], []]


def m_storage(rng, c):
    targets = sorted(c["datasets"]) if rng.random() < 0.3 else [pick_dataset(rng, c)]
    layout = pick(rng, ["compact", "contiguous", "chunked", "chunked", "chunked"])
    filters = pick(rng, FILTER_SETS) if layout == "chunked" else []
    labels = []
    for p in filter(None, targets):
        d = c["datasets"][p]
        if d["space"] != "simple" or not d["shape"] or 0 in d["shape"] or not d.get("write", True):
            continue
        d["layout"], d["filters"] = layout, list(filters)
        d["chunks"] = [rng.randint(1, max(1, s)) for s in d["shape"]] if layout == "chunked" else None
        if rng.random() < 0.1:
            d["alloc_early"], d["write"] = True, False
            c["preserving"] = False
        labels.append(p)
    if {"lzf", "scaleoffset"} & set(filters):
        c["preserving"] = False
    if "lzf" in filters:  # lzf only applies to a chunk it can compress: make the values so
        for p in labels:
            d = c["datasets"][p]
            d["values"] = np.resize(np.asarray(d["values"]).ravel()[:1], np.shape(d["values"]))
        c["named"] = labels[0] if len(labels) == 1 else None
    where = "all" if len(labels) > 1 else (labels[0] if labels else "none")
    return f"storage:{where}={layout}+{'+'.join(filters) or '-'}"


def m_file(rng, c):
    how = pick(rng, ["latest", "earliest", "userblock", "latest+userblock"])
    c["libver"] = "latest" if "latest" in how else ("earliest" if how == "earliest" else None)
    c["userblock"] = 1024 if "userblock" in how else None
    return f"file:{how}"


def m_missing(rng, c):
    c["preserving"] = False
    if rng.random() < 0.2:
        g = pick(rng, ["/inputs", "/forward", "/backward"])
        for p in [p for p in c["datasets"] if p.startswith(g + "/")]:
            del c["datasets"][p]
        c["groups"] = [x for x in c["groups"] if x != g]
        c["attrs"].pop(g, None)
        return f"missing:{g}"
    p = pick_dataset(rng, c)
    if p:
        del c["datasets"][p]
    return f"missing:{p}"


EXTRA_NAMES = ["extra", "h_mix2", "X", "a\nb", "tab\there", "\u00e9t\u00e9", "n" * 300, " ", "h_mix "]


def m_extra(rng, c):
    group = pick(rng, ["/inputs", "/forward", "/backward", "", "/mine", "/mine/deep/er"])
    name = pick(rng, EXTRA_NAMES)
    kind = pick(rng, ["f32", "f64", "bf16", "i32", "str_vlen", "compound", "opaque"])
    huge = rng.random() < 0.25
    shape = huge_shape(rng, [4, 4]) if huge else [rng.randint(0, 6) for _ in range(rng.randint(0, 3))]
    d = {"values": np.arange(max(1, int(np.prod(shape[:3]) if not huge else 1)), dtype=np.float64),
         "kind": kind, "space": "simple", "shape": shape, "layout": "chunked" if huge else "contiguous",
         "chunks": [max(1, min(s, 4)) for s in shape] if huge else None, "filters": [], "write": not huge}
    if d["layout"] == "chunked" and not d["chunks"]:
        d["layout"] = "contiguous"
    c["datasets"][f"{group}/{name}"] = d
    if group in ("/inputs", "/forward", "/backward", "") or huge:
        c["preserving"] = False
    return f"extra:{group}/{name[:24]!r}:{kind}{shape}"


def m_deep(rng, c):
    """Deep group nesting and a long path holding a valid dataset: harmless for the schema."""
    path = "/mine" + "/g" * rng.randint(20, 200) + "/leaf"
    c["datasets"][path] = {"values": np.ones(3), "kind": "f32", "space": "simple", "shape": [3],
                           "layout": "contiguous", "chunks": None, "filters": []}
    return f"deep:{path.count('/')}"


def m_values(rng, c):
    how = pick(rng, ["nan", "inf", "huge", "denormal", "zero_x_eps0", "zero_x", "negative_alpha", "zero_phi"])
    c["preserving"] = False
    if how in ("zero_x_eps0", "zero_x"):
        if "/inputs/x" in c["datasets"]:
            x = c["datasets"]["/inputs/x"]
            x["values"] = np.zeros_like(x["values"])
        if how == "zero_x_eps0":
            c["attrs"].setdefault("/inputs", {})["norm_eps"] = ("value", np.float64(0))
            c["zero_x_eps0"] = "/inputs/x" in c["datasets"]
        return f"values:{how}"
    if how in ("negative_alpha", "zero_phi"):
        p = "/inputs/alpha" if how == "negative_alpha" else "/inputs/phi"
        if p in c["datasets"]:
            c["datasets"][p]["values"] = -c["datasets"][p]["values"] if how == "negative_alpha" else \
                np.zeros_like(c["datasets"][p]["values"])
        return f"values:{how}"
    p = pick_dataset(rng, c)
    if not p:
        return "values:none"
    d = c["datasets"][p]
    v = np.array(d["values"], np.float64, copy=True)
    if v.size:
        idx = tuple(rng.randrange(s) for s in v.shape) if v.ndim else ()
        v[idx] = {"nan": np.nan, "inf": -np.inf, "huge": 3e38, "denormal": 1e-42}[how]
    d["values"] = v
    return f"values:{p}={how}"


def m_change_output(rng, c):
    """Moves one output element far from its value: `diff F cpu` must not say match."""
    p = pick_dataset(rng, c, "/forward/") if rng.random() < 0.5 else pick_dataset(rng, c, "/backward/")
    if not p:
        return "change:none"
    d = c["datasets"][p]
    v = np.array(d["values"], np.float64, copy=True)
    rms = float(np.sqrt(np.mean(v ** 2))) if v.size else 0.0
    idx = tuple(rng.randrange(s) for s in v.shape)
    v[idx] += pick(rng, [1, -1]) * (0.5 * abs(v[idx]) + max(rms, 1e-3))
    d["values"] = v
    c["preserving"] = False
    c["changed_outputs"] = True
    return f"change:{p}{list(idx)}"


def m_mix(rng, c, trees):
    """Outputs (or one input) taken from another base shape."""
    other = trees[pick(rng, SHAPES)]["datasets"]
    p = pick(rng, sorted(other))
    src = other[p]
    c["datasets"][p] = {"values": src["values"], "kind": src["kind"], "space": "simple",
                        "shape": list(src["shape"]), "layout": "contiguous", "chunks": None, "filters": []}
    c["groups"].append(p.rsplit("/", 1)[0])
    c["preserving"] = False
    return f"mix:{p}{list(src['shape'])}"


STRUCT_MUTATIONS = [(m_dtype, 15), (m_space, 15), (m_eps, 10), (m_root_attr, 6), (m_link, 12),
                    (m_storage, 10), (m_file, 4), (m_missing, 6), (m_extra, 8), (m_deep, 1),
                    (m_values, 8), (m_change_output, 5), (m_mix, 6)]


def weighted(rng, table):
    total = sum(w for _, w in table)
    r = rng.uniform(0, total)
    for item, w in table:
        r -= w
        if r <= 0:
            return item
    return table[-1][0]


def struct_case(rng, trees, path):
    shape = pick(rng, SHAPES)
    c = base_spec(trees[shape], rng.random() < 0.6)
    c["ref"] = trees[shape]["path"]
    labels = [f"struct:{shape}{'+out' if c['outputs'] else ''}"]
    others_preserve = True  # a known output change is claimed only beside harmless changes
    count = pick(rng, [1, 1, 1, 2, 2, 3])
    for _ in range(count):
        m = weighted(rng, STRUCT_MUTATIONS)
        before, c["preserving"] = c["preserving"], True
        labels.append(m(rng, c, trees) if m is m_mix else m(rng, c))
        others_preserve &= c["preserving"] or m is m_change_output
        c["preserving"] &= before
    c["changed_outputs"] &= others_preserve
    c["must_name"] = c.pop("named", None) if count == 1 else None
    c["intact"] = True
    try:
        write_case(path, c)
    except Exception as e:  # a combination h5py refuses: write the valid base instead
        labels.append(f"unwritable({type(e).__name__})")
        c = dict(base_spec(trees[shape], c["outputs"]), ref=c["ref"])
        write_case(path, c)
    return c, " ".join(labels)


# ---------------------------------------------------------------- byte mutations

MAGIC = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
         2 ** 40, 2 ** 63 - 1, 2 ** 64 - 1]


def mutate_bytes(rng, data):
    """Applies 1-4 seeded mutations to a bytearray in place; returns their labels."""
    labels = []
    for _ in range(rng.randint(1, 4)):
        n = len(data)
        if n < 16:
            break
        hot = min(n, 4096)
        pos = rng.randrange(hot if rng.random() < 0.6 else n)
        op = pick(rng, ["flip", "flip", "flip", "run", "magic", "magic", "dup", "insert", "delete", "truncate"])
        if op == "flip":
            k = rng.randint(1, 8)
            for _ in range(k):
                q = rng.randrange(hot)
                data[q] ^= 1 << rng.randrange(8)
            labels.append(f"flip{k}")
        elif op == "run":
            ln, val = rng.randint(1, 64), pick(rng, [0, 0xFF, rng.randrange(256)])
            data[pos:pos + ln] = bytes([val]) * len(data[pos:pos + ln])
            labels.append(f"run@{pos}+{ln}={val:#x}")
        elif op == "magic":
            width, val = pick(rng, [1, 2, 4, 8]), pick(rng, MAGIC)
            data[pos:pos + width] = (val % (1 << 8 * width)).to_bytes(width, "little")[:len(data[pos:pos + width])]
            labels.append(f"magic@{pos}={val:#x}/{width}")
        elif op in ("dup", "insert"):
            src, ln = rng.randrange(n), rng.randint(8, 512)
            chunk = bytes(data[src:src + ln])
            if op == "dup":
                data[pos:pos + len(chunk)] = chunk
            else:
                data[pos:pos] = chunk
            labels.append(f"{op}{src}+{len(chunk)}@{pos}")
        elif op == "delete":
            ln = rng.randint(1, 256)
            del data[pos:pos + ln]
            labels.append(f"delete@{pos}+{ln}")
        else:
            cut = rng.randrange(n)
            del data[cut:]
            labels.append(f"truncate@{cut}")
            break
    return labels


def bytes_case(rng, templates, path):
    name, src, outputs = pick(rng, templates)
    with open(src, "rb") as f:
        data = bytearray(f.read())
    labels = mutate_bytes(rng, data)
    with open(path, "wb") as f:
        f.write(data)
    # h5py reads the mutant in a child: HDF5 itself may crash on it
    changed, walk = in_child(lambda: (bool(outputs and outputs_changed(src, path)), walk_datasets(path)),
                             default=(False, None))
    c = {"outputs": outputs, "preserving": False, "zero_x_eps0": False, "ref": src if outputs else None,
         "changed_outputs": changed, "walk": walk}
    return c, f"bytes:{name} " + ",".join(labels)


def in_child(fn, default, timeout=60):
    """fn() computed in a forked child (its result pickled back), or `default` when the
    child crashes or takes longer than `timeout` seconds."""
    import pickle
    import select
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.write(w, pickle.dumps(fn()))
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.time() + timeout
    while time.time() < deadline and select.select([r], [], [], max(0.0, deadline - time.time()))[0]:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    if time.time() >= deadline:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    try:
        return pickle.loads(data) if os.WIFEXITED(status) and data else default
    except Exception:
        return default


def read_stages(path):
    """{path: (type, values)} of every stage dataset and the /inputs attributes, or None."""
    try:
        with h5py.File(path, "r") as f:
            out = {p: (f[p].id.get_type(), f[p][()]) for p in STAGE_PATHS
                   if p in f and isinstance(f.get(p, getlink=True), h5py.HardLink) and isinstance(f[p], h5py.Dataset)}
            attrs = {k: repr(v) for k, v in f["inputs"].attrs.items()}
            return out, attrs
    except Exception:
        return None


def walk_datasets(path):
    """How many datasets HDF5's object walk finds (h5py, the same library as mhc), -1 when
    the walk itself fails, None when h5py cannot open the file at all."""
    try:
        f = h5py.File(path, "r")
    except Exception:
        return None
    found = []
    try:
        h5py.h5o.visit(f.id, lambda name, info: found.append(info.type == h5py.h5o.TYPE_DATASET) and None, info=True)
        return sum(found)
    except Exception:
        return -1
    finally:
        f.close()


def far_apart(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    if np.any(np.isnan(a) != np.isnan(b)) or np.any(np.isinf(a) & (a != b)) or np.any(np.isinf(b) & (a != b)):
        return True
    fin = np.isfinite(a) & np.isfinite(b)
    rms = float(np.sqrt(np.mean(b[fin] ** 2))) if fin.any() else 0.0
    return bool(np.any(np.abs(a[fin] - b[fin]) > 0.1 * rms + 1e-30))


def outputs_changed(template, mutant):
    """True only when h5py reads the mutant's inputs exactly as the template's (same types,
    values, attributes) and some output stage, same type and shape, far from its value."""
    t, m = read_stages(template), read_stages(mutant)
    if t is None or m is None or t[1] != m[1]:
        return False
    changed = False
    for p, (ttype, tval) in t[0].items():
        if p not in m[0] or m[0][p][0] != ttype or np.shape(m[0][p][1]) != np.shape(tval):
            if is_input(p):
                return False
            continue
        mval = m[0][p][1]
        if is_input(p):
            if not np.array_equal(tval, mval, equal_nan=True):
                return False
        elif far_apart(mval, tval):
            changed = True
    return changed


# ---------------------------------------------------------------- special files

def special_case(rng, path):
    how = pick(rng, ["fifo", "directory", "empty", "signature", "signature+zeros", "text", "symlink_loop",
                     "dev_null", "userblock_garbage"])
    sig = b"\x89HDF\r\n\x1a\n"
    if how == "fifo":
        os.mkfifo(path)
    elif how == "directory":
        os.mkdir(path)
    elif how == "symlink_loop":
        os.symlink(os.path.basename(path), path)
    elif how == "dev_null":
        os.symlink("/dev/null", path)
    else:
        body = {"empty": b"", "signature": sig, "signature+zeros": sig + bytes(4088), "text": b"hello\n" * 100,
                "userblock_garbage": bytes(rng.randrange(256) for _ in range(512)) + sig + bytes(600)}[how]
        with open(path, "wb") as f:
            f.write(body)
    return {"outputs": True, "preserving": False, "zero_x_eps0": False, "changed_outputs": False}, f"special:{how}"


# ---------------------------------------------------------------- running and checking

def env():
    e = dict(os.environ)
    e.update(ENV)
    return e


def run_cmd(argv, timeout, cwd):
    """(rc, stdout, stderr, timed_out): rc < 0 is the signal that killed it."""
    p = subprocess.Popen(argv, cwd=cwd, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), True


SANITIZER = re.compile(r"(AddressSanitizer|LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer)")
INFO_LINE = re.compile(r"^mhc( diff)?: (warning|comparing|no input file)|^mhc diff: ")


MHC_FRAME = re.compile(r"#\d+ 0x[0-9a-f]+ in (.+?) \S*?/src/((?:common|cli|cpu|diff|cuda)/[^\s:]+:\d+)")


def stack_top(err):
    """The first frame of the sanitizer stack in mhc's own sources, as file:line (function)."""
    frames = [m for m in MHC_FRAME.finditer(err) if not m.group(2).startswith("common/tensor.h")] \
        or list(MHC_FRAME.finditer(err))  # an allocation: name the tensor's maker, not Tensor()
    if frames:
        m = frames[0]
        return f"{m.group(2)} ({m.group(1).split('(')[0][:60]})"
    m = re.search(r"/src/((?:common|cli|cpu|diff|cuda)/\S+:\d+:\d+): runtime error", err)
    return m.group(1) if m else ""


HDF5_C = re.compile(r"libhdf5(_serial)?\.so")           # the C library, not its C++ wrapper
NOT_OURS = re.compile(r"libsanitizer|sysdeps/|csu/|libc\.so")  # sanitizer and libc frames


def frames(text):
    return [l for l in text.splitlines() if re.match(r"\s+#\d+ ", l) and not NOT_OURS.search(l)]


def inside_hdf5(err):
    """True when an AddressSanitizer report is HDF5's own bug: the faulting frame is in the
    HDF5 C library, every frame above mhc's code in HDF5 (C or C++ API), and the memory is
    HDF5's (heap allocated there, not a stack variable or buffer of mhc's; none for a SEGV).
    Conservative: anything else counts against mhc."""
    report = err[err.find("ERROR: AddressSanitizer"):]
    fault, _, rest = report.partition("allocated by thread")
    if "located in stack of thread" in report:
        owner = frames(report.split("located in stack of thread", 1)[1])[:1]
        if not owner or MHC_FRAME.search(owner[0]) or not HDF5_C.search(owner[0]):
            return False
    above = []
    for line in frames(fault):
        if MHC_FRAME.search(line):
            break
        above.append(line)
    if not above or not HDF5_C.search(above[0]) or not all("libhdf5" in l for l in above):
        return False
    alloc = frames(rest)[:1]
    return not rest or bool(alloc and HDF5_C.search(alloc[0]))


def first_line(err):
    for line in err.splitlines():
        if SANITIZER.search(line) or line.startswith("mhc: "):
            return line.strip()[:200]
    lines = [l for l in err.splitlines() if l.strip()]
    return lines[0][:200] if lines else ""


def judge(rc, out, err, timed_out):
    """The failure reason of one command's outcome, or None. `diff` reports an invalid
    comparison (exit 2) with its table and an `invalid:` verdict on stdout, not as an error."""
    if timed_out:
        return "timeout"
    if "hard rss limit exhausted" in err:
        return "memory > 3 GiB"
    if "ERROR: AddressSanitizer" not in err:  # a malloc over the cap that returned NULL: C code (HDF5)
        err = "\n".join(l for l in err.splitlines() if "WARNING: AddressSanitizer failed to allocate" not in l)
    m = SANITIZER.search(err)
    if m:
        kind = re.search(r"SUMMARY: AddressSanitizer: ([\w-]+)", err) or re.search(r"AddressSanitizer: ([\w-]+)", err)
        where = " inside libhdf5" if inside_hdf5(err) else ""
        ub = re.search(r"runtime error: ([^:\d]+)", err)
        what = kind.group(1) if kind else ub.group(1).strip() if ub else m.group(1)
        return f"sanitizer{where}: {what}"
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    if rc not in (0, 1, 2):
        return f"exit {rc}"
    lines = [l for l in err.splitlines() if l.strip() and not INFO_LINE.match(l)]
    if rc == 2 and not lines and re.search(r'^invalid: |^\{"schema": \d+, "verdict": "invalid"', out, re.M):
        return None
    if rc == 2 and (len(lines) != 1 or not lines[0].startswith("mhc: error:")):
        return f"exit 2 with {len(lines)} stderr lines" if lines else "exit 2 without a message"
    if rc != 2 and lines:
        return "stray stderr"
    return None


def check_outputs(name, argv, case_dir, rc, err):
    """What a command left in out/: everything it names on success, nothing on an error."""
    left = sorted(os.listdir(os.path.join(case_dir, "out")))
    wanted = sorted(os.path.basename(a) for a in argv if a.startswith("out/"))
    failed = rc not in (0, 1) and any(l.startswith("mhc: error:") for l in err.splitlines())
    if rc == 0 and name == "run" and left != wanted:
        return f"exit 0 left {left}, expected {wanted}"
    if failed and left:
        return f"partial output {left}"
    if any(f.startswith(".") for f in left):
        return f"temporary file left {left}"
    return None


def nonfinite_outputs(path):
    try:
        with h5py.File(path, "r") as f:
            return any(not np.all(np.isfinite(f[p][()])) for p in STAGE_PATHS if p in f and not is_input(p))
    except Exception:
        return False


def file_hash(path):
    try:
        st = os.lstat(path)
    except OSError:
        return "absent"
    if not stat.S_ISREG(st.st_mode):
        return f"mode {st.st_mode:o}"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


RUN_OPTIONS = [[], [], [], ["--allow-nonfinite"], ["--precision", "fp64"], ["--strict"], ["--backend", "cpu:fp64"]]
DIFF_OPTIONS = [[], [], [], ["--json"], ["--tokens", "0:1"], ["--tolerance", "fixed"], ["--accept", "bf16"],
                ["--dump-diff", "out/d.h5", "--report", "out/r.html"]]


def unique(options):
    return [list(o) for o in dict.fromkeys(tuple(o) for o in options)]


def commands(mhc, c, rng):
    """(name, argv) of each command to run on case.h5, options drawn from rng (every
    option set when rng is None)."""
    runs = unique(RUN_OPTIONS) if rng is None else [pick(rng, RUN_OPTIONS)]
    diffs = unique(DIFF_OPTIONS) if rng is None else [pick(rng, DIFF_OPTIONS)]
    cmds = [("inspect", [mhc, "inspect", "case.h5"])]
    cmds += [("run", [mhc, "run", *o, "case.h5", "out/out.h5"]) for o in runs]
    if c["outputs"]:
        cmds += [("diff-cpu", [mhc, "diff", *o, "case.h5", "cpu"]) for o in diffs]
        cmds.append(("diff-self", [mhc, "diff", "case.h5", "case.h5"]))
    if c["outputs"] and c.get("ref"):
        cmds.append(("diff-ref", [mhc, "diff", "case.h5", c["ref"]]))
    return cmds


def expectation(name, argv, rc, out, err, c, case_dir):
    """Failures of meaning rather than of robustness: valid files, known differences (a
    token slice or the bf16 class may legitimately miss them; --allow-nonfinite allows NaN)."""
    if c["preserving"] and rc != 0:
        return f"valid file: exit {rc}, expected 0"
    if name == "inspect" and rc == 0 and c.get("walk") is not None:
        listed = len(re.findall(r"^/", out.split("\ndataset", 1)[-1], re.M))
        if c["walk"] < 0:
            return "exit 0 though HDF5's walk of the file fails"
        if listed != c["walk"]:
            return f"lists {listed} datasets, HDF5's walk finds {c['walk']}"
    named = c.get("must_name")
    error = [l for l in err.splitlines() if l.startswith("mhc: error:")]
    if rc == 2 and named and error and named not in error[0]:
        return f"message does not name {named}"
    if rc == 2 and error and c.get("intact") and "corrupt" in error[0]:
        return "blames corruption, but the file is intact HDF5 (written by h5py)"
    lenient = "--tokens" in argv or "bf16" in argv
    if name in ("diff-cpu", "diff-ref") and c["changed_outputs"] and rc == 0 and not lenient:
        return "match on outputs known to differ"
    if name == "run" and rc == 0 and c["zero_x_eps0"] and "--allow-nonfinite" not in argv \
            and in_child(lambda: nonfinite_outputs(os.path.join(case_dir, "out/out.h5")), default=False):
        return "exit 0 with non-finite outputs (zero x, norm_eps = 0)"
    return None


def check_case(mhc, c, case_dir, timeout, rng):
    """Runs every command on case.h5; a list of (command, reason, first stderr line, stack top)."""
    path = os.path.join(case_dir, "case.h5")
    before = file_hash(path)
    failures = []
    for name, argv in commands(mhc, c, rng):
        rc, out, err, timed_out = run_cmd(argv, timeout, case_dir)
        reason = judge(rc, out, err, timed_out) or check_outputs(name, argv, case_dir, rc, err) \
            or expectation(name, argv, rc, out, err, c, case_dir)
        if reason:
            failures.append((" ".join(argv[1:]), reason, first_line(err), stack_top(err)))
        shutil.rmtree(os.path.join(case_dir, "out"), ignore_errors=True)
        os.mkdir(os.path.join(case_dir, "out"))
    if file_hash(path) != before:
        failures.append(("all", "input modified", "", ""))
    return failures


def make_case(seed, index, trees, templates, path):
    rng = random.Random(f"{seed}:{index}")
    r = rng.random()
    if r < 0.04:
        return special_case(rng, path)
    if r < 0.45:
        return bytes_case(rng, templates, path)
    return struct_case(rng, trees, path)


STATE = {}


def init_worker(mhc, workdir, timeout, keep, strict_hdf5):
    STATE.update(mhc=mhc, workdir=workdir, timeout=timeout, keep=keep, strict_hdf5=strict_hdf5)
    STATE["trees"] = {s: read_tree(os.path.join(workdir, "templates", f"{s}.run.h5")) for s in SHAPES}
    STATE["templates"] = template_list(workdir)


def template_list(workdir):
    out = []
    for s in SHAPES:
        for name, outputs in [("mhc-gen", False), ("mhc-run", True), ("h5py-gzip", True),
                              ("h5py-compact", True), ("h5py-latest", True)]:
            stem = {"mhc-gen": "gen", "mhc-run": "run"}.get(name, name)
            out.append((f"{name}:{s}", os.path.join(workdir, "templates", f"{s}.{stem}.h5"), outputs))
    return out


def split_hdf5(failures):
    """(failures, HDF5's own sanitizer reports): the latter are listed, not failures,
    unless --strict-hdf5."""
    if STATE["strict_hdf5"]:
        return failures, []
    return [f for f in failures if "inside libhdf5" not in f[1]], [f for f in failures if "inside libhdf5" in f[1]]


def do_case(job):
    seed, index = job
    case_dir = os.path.join(STATE["workdir"], "cases", f"{seed}-{index}")
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(os.path.join(case_dir, "out"))
    t0 = time.time()
    c, label = make_case(seed, index, STATE["trees"], STATE["templates"], os.path.join(case_dir, "case.h5"))
    failures = check_case(STATE["mhc"], c, case_dir, STATE["timeout"], random.Random(f"{seed}:{index}:options"))
    failures, hdf5 = split_hdf5(failures)
    if (failures or hdf5) and STATE["keep"]:
        keep_failure(case_dir, STATE["keep"], seed, index, label, failures + hdf5)
    shutil.rmtree(case_dir, ignore_errors=True)
    return {"seed": seed, "case": index, "label": label, "failures": failures, "hdf5": hdf5,
            "secs": time.time() - t0}


def has_outputs(path):
    try:
        with h5py.File(path, "r") as f:
            return "forward" in f or "backward" in f
    except Exception:
        return True


def do_file(path):
    """Runs the robustness checks on a given file (a regression input, e.g. repro/*.h5)."""
    case_dir = os.path.join(STATE["workdir"], "files", os.path.basename(path))
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(os.path.join(case_dir, "out"))
    shutil.copyfile(path, os.path.join(case_dir, "case.h5"))
    t0 = time.time()
    c = {"outputs": in_child(lambda: has_outputs(path), default=True), "preserving": False, "zero_x_eps0": False,
         "changed_outputs": False}
    failures, hdf5 = split_hdf5(check_case(STATE["mhc"], c, case_dir, STATE["timeout"], None))
    shutil.rmtree(case_dir, ignore_errors=True)
    return {"seed": "file", "case": os.path.basename(path), "label": path, "secs": time.time() - t0,
            "failures": failures, "hdf5": hdf5}


def run_job(job):
    return do_file(job) if isinstance(job, str) else do_case(job)


def keep_failure(case_dir, keep, seed, index, label, failures):
    os.makedirs(keep, exist_ok=True)
    src, dst = os.path.join(case_dir, "case.h5"), os.path.join(keep, f"{seed}-{index}.h5")
    if os.path.isfile(src) and not os.path.islink(src):
        shutil.copyfile(src, dst)
    with open(os.path.join(keep, f"{seed}-{index}.txt"), "w") as f:
        f.write(f"seed {seed} case {index}: {label}\n")
        for cmd, reason, line, top in failures:
            f.write(f"  {cmd}: {reason}: {line} {top}\n")


def report_line(r, key="failures", tag="FAIL"):
    cmd, reason, line, top = r[key][0]
    more = f" (+{len(r[key]) - 1} more)" if len(r[key]) > 1 else ""
    at = f" at {top}" if top else ""
    return f"{tag} seed={r['seed']} case={r['case']} [{r['label']}] {cmd}: {reason}{at}{more} | {line}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mhc")
    ap.add_argument("workdir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep-failures", metavar="DIR")
    ap.add_argument("--only", help="comma-separated case indices to run (replay)")
    ap.add_argument("--files", nargs="+", metavar="H5", help="check these files instead of generated cases")
    ap.add_argument("--results", help="append one JSON line per case to this file")
    ap.add_argument("--strict-hdf5", action="store_true",
                    help="count sanitizer reports inside libhdf5 (HDF5's own bugs) as failures")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    a = ap.parse_args()
    mhc, workdir = os.path.abspath(a.mhc), os.path.abspath(a.workdir)
    keep = os.path.abspath(a.keep_failures) if a.keep_failures else None
    os.makedirs(workdir, exist_ok=True)
    t0 = time.time()
    build_templates(mhc, workdir)
    indices = [int(i) for i in a.only.split(",")] if a.only else range(a.cases)
    jobs = [os.path.abspath(p) for p in a.files] if a.files else [(a.seed, i) for i in indices]
    passed = failed = hdf5 = 0
    signatures = {}
    log = open(a.results, "a") if a.results else None
    with ProcessPoolExecutor(a.jobs, initializer=init_worker, initargs=(mhc, workdir, a.timeout, keep, a.strict_hdf5)) as pool:
        for r in pool.map(run_job, jobs):  # BrokenProcessPool (a worker killed) ends the run: exit 1
            if log:
                log.write(json.dumps(r) + "\n")
            if r["hdf5"]:
                hdf5 += 1
                print(report_line(r, "hdf5", "HDF5"), flush=True)
            if r["failures"]:
                failed += 1
                print(report_line(r), flush=True)
                for cmd, reason, _, top in r["failures"]:
                    signatures.setdefault((reason, top), []).append(f"{r['seed']}:{r['case']}")
            else:
                passed += 1
                if a.verbose:
                    print(f"ok   seed={r['seed']} case={r['case']} [{r['label']}] {r['secs']:.1f}s", flush=True)
    if signatures:
        print("distinct failure signatures (reason, stack top): cases")
        for (reason, top), cases in sorted(signatures.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(cases):5d}  {reason}{' at ' + top if top else ''}: {' '.join(cases[:5])}")
    note = f"; {hdf5} with a sanitizer report inside libhdf5 (HDF5 lines; not failures without --strict-hdf5)" \
        if hdf5 else ""
    print(f"{passed} passed, {failed} failed ({time.time() - t0:.0f} s, seed {a.seed}){note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
