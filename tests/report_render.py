#!/usr/bin/env python3
"""report_render.py MHC_BINARY WORKDIR -- render `mhc diff --report` pages in headless Chromium.

Plants a fault (h_pre of tokens 256..511 scaled by 1.001, nothing recomputed) in a golden
run, writes the HTML report of `mhc diff bad.h5 cpu:fp64` (exit 1) and of a clean
`mhc diff out.h5 cpu` (exit 0), and checks:
  - each page is self-contained: no script, link, src=, url(), @import, no http(s) address
    other than the SVG namespace;
  - the DOM Chromium builds (--dump-dom): the verdict, the stage table (one row per stage,
    h_pre diverged), an SVG heatmap of h_pre whose cells for tokens 256..511 are above the
    limit and the others below it; the clean page: match, every stage ok, no heatmap;
  - the screenshot (--screenshot, decoded here with zlib + numpy): a solid red block of
    heatmap cells with a pale block of the same height above it (tokens 0..255), the pink
    verdict box; the clean page: the green verdict box and no red at all.
Prints one line per check and "N passed, M failed"; exit status 1 on any failure, and
when Chromium (Debian's `chromium`, or $MHC_CHROMIUM) is missing.
"""
import html.parser
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

SHAPE = (512, 4, 256)  # T, n, D
BAD_FROM = 256         # tokens BAD_FROM..T-1 of h_pre are scaled
STAGES = ["inv_rms", "h_mix", "h_pre", "h_post", "h_res", "h_in", "dh_pre", "dh_mix", "dinv_rms", "dvecX", "dx",
          "dphi", "dalpha", "dbias", "dgamma"]
WINDOW = (1200, 1600)
CHROMIUM_TIMEOUT = 60

passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'' if ok or not detail else ': ' + detail}", flush=True)
    return ok


def finish():
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


def fatal(name, detail):
    check(name, False, detail)
    finish()


def run(cmd, timeout=300):
    """Runs cmd in its own process group; on timeout kills that group. Returns (rc, stdout, stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


def tail(text, n=6):
    lines = [l for l in text.strip().splitlines() if "dbus" not in l and "unexpected operator" not in l]
    return " | ".join(lines[-n:])


# --- the page -----------------------------------------------------------------------------

def self_contained(name, page):
    bad = []
    if re.search(r"<script", page, re.I): bad.append("<script")
    if re.search(r"<link", page, re.I): bad.append("<link")
    if re.search(r"<(iframe|object|embed|img|video|audio|source)\b", page, re.I): bad.append("embedded element")
    if re.search(r"\bsrc\s*=", page, re.I): bad.append("src= attribute")
    if re.search(r"\bhref\s*=", page, re.I): bad.append("href= attribute")
    if re.search(r"url\s*\(", page, re.I): bad.append("url(")
    if re.search(r"@import", page, re.I): bad.append("@import")
    urls = set(re.findall(r"https?://[^\s\"'<>)]*", page, re.I)) - {"http://www.w3.org/2000/svg"}
    if urls: bad.append("addresses " + ", ".join(sorted(urls)[:3]))
    ns = re.findall(r"(\w+)=\"http://www.w3.org/2000/svg\"", page)
    if any(a != "xmlns" for a in ns): bad.append("SVG namespace outside xmlns")
    check(f"{name}: self-contained (no script, link, src=, href=, url(), @import, external address)", not bad,
          "; ".join(bad))


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag=None):
        for c in self.children:
            if isinstance(c, Node):
                if tag is None or c.tag == tag:
                    yield c
                yield from c.all(tag)

    def first(self, tag):
        return next(self.all(tag), None)


class Tree(html.parser.HTMLParser):
    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        if tag not in self.VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def find_id(root, ident):
    return next((n for n in root.all() if n.attrs.get("id") == ident), None)


def stage_rows(root):
    table = find_id(root, "stages")
    rows = {}
    if table is None:
        return None
    for tr in table.all("tr"):
        cells = [td.text().strip() for td in tr.children if isinstance(td, Node) and td.tag == "td"]
        if cells:
            rows[cells[0]] = cells
    return rows


def heatmaps(root):
    return {n.attrs.get("aria-label", ""): n for n in root.all("svg")}


# --- Chromium ------------------------------------------------------------------------------

def chromium_cmd(exe, profile):
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
            "--no-first-run", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
            "--force-device-scale-factor=1"]


def dump_dom(exe, profile, page):
    rc, out, err = run(chromium_cmd(exe, profile) + ["--dump-dom", "file://" + os.path.abspath(page)],
                       CHROMIUM_TIMEOUT)
    if rc is None:
        fatal(f"chromium --dump-dom {os.path.basename(page)}", f"no result within {CHROMIUM_TIMEOUT} s; {tail(err)}")
    if rc != 0 or "<html" not in out:
        fatal(f"chromium --dump-dom {os.path.basename(page)}", f"exit {rc}, {len(out)} bytes of DOM; {tail(err)}")
    return out


def screenshot(exe, profile, page, png):
    if os.path.exists(png):
        os.remove(png)
    rc, out, err = run(chromium_cmd(exe, profile) + [f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={png}",
                                                     "file://" + os.path.abspath(page)], CHROMIUM_TIMEOUT)
    if rc is None:
        fatal(f"chromium --screenshot {os.path.basename(page)}", f"no result within {CHROMIUM_TIMEOUT} s; {tail(err)}")
    if rc != 0 or not os.path.exists(png):
        fatal(f"chromium --screenshot {os.path.basename(page)}", f"exit {rc}, no {png}; {tail(err)}")
    return read_png(png)


def read_png(path):
    """8-bit RGB/RGBA, non-interlaced PNG -> uint8 array [h, w, 3]."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError(f"{path}: unsupported PNG (bit depth {depth}, colour type {ctype}, interlace {interlace})")
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, stride + 1)
    img = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: running sum per channel, mod 256
            cur = (np.cumsum(line.reshape(w, bpp).astype(np.int64), axis=0) & 255).astype(np.uint8).reshape(stride)
        elif f == 2:  # Up
            cur = line + prev
        elif f in (3, 4):  # Average, Paeth: sequential along the row
            ln, up, out = line.tolist(), prev.tolist(), [0] * stride
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    out[i] = (ln[i] + ((a + b) >> 1)) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    out[i] = (ln[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.array(out, np.uint8)
        else:
            raise ValueError(f"{path}: bad filter {f} in row {y}")
        img[y] = cur
        prev = cur
    return img.reshape(h, w, bpp)[:, :, :3]


def longest_run(mask):
    """Per row of a 2-D bool array: (length, start) of its longest run of True."""
    h, w = mask.shape
    best = np.zeros(h, np.int64)
    start = np.zeros(h, np.int64)
    for y in np.nonzero(mask.any(axis=1))[0]:
        m = np.concatenate(([0], mask[y].astype(np.int8), [0]))
        d = np.diff(m)
        s, e = np.nonzero(d == 1)[0], np.nonzero(d == -1)[0]
        i = int(np.argmax(e - s))
        best[y], start[y] = e[i] - s[i], s[i]
    return best, start


def near(img, rgb, tol=3):
    return (np.abs(img.astype(np.int16) - np.array(rgb, np.int16)) <= tol).all(axis=2)


def is_red(img):
    r, g, b = (img[:, :, i].astype(np.int16) for i in range(3))
    return (r > 100) & (g < 90) & (b < 90) & (r - g > 60)


def is_pale(img):  # white .. light yellow: the heatmap below the limit
    r, g, b = (img[:, :, i].astype(np.int16) for i in range(3))
    return (r > 235) & (g > 200) & (b > 60)


# --- main ----------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 3:
        print("usage: report_render.py MHC_BINARY WORKDIR", file=sys.stderr)
        sys.exit(2)
    mhc, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    exe = os.environ.get("MHC_CHROMIUM") or shutil.which("chromium")
    if not exe:
        fatal("chromium", "not installed: Debian's `chromium` is needed for this test (apt-get install chromium), "
                          "or set MHC_CHROMIUM")
    os.makedirs(work, exist_ok=True)
    f = {k: os.path.join(work, k) for k in ("in.h5", "out.h5", "bad.h5", "bad.html", "ok.html", "bad.png", "ok.png")}
    for p in f.values():
        if os.path.exists(p):
            os.remove(p)
    profile = os.path.join(work, "chromium-profile")
    shutil.rmtree(profile, ignore_errors=True)
    os.makedirs(profile)
    t0 = time.time()

    # 1. a case, its golden run, a planted fault, two reports
    seed = int(os.environ.get("MHC_SEED", random.SystemRandom().randrange(1, 2**31)))
    print(f"case: T,n,D = {SHAPE}, seed {seed}; chromium: {exe}", flush=True)
    rc, out, err = run([mhc, "gen", "--shape", ",".join(map(str, SHAPE)), "--seed", str(seed), f["in.h5"]])
    if rc != 0: fatal("mhc gen", f"exit {rc}: {tail(err)}")
    rc, out, err = run([mhc, "run", f["in.h5"], f["out.h5"], "-q"])
    if rc != 0: fatal("mhc run", f"exit {rc}: {tail(err)}")
    import h5py
    shutil.copyfile(f["out.h5"], f["bad.h5"])
    with h5py.File(f["bad.h5"], "r+") as h:
        d = h["/forward/h_pre"]
        a = d[()]
        a[BAD_FROM:] *= np.float32(1.001)
        d[...] = a
    rc, out, err = run([mhc, "diff", f["bad.h5"], "cpu:fp64", "--report", f["bad.html"]])
    check("mhc diff bad.h5 cpu:fp64 --report: exit 1", rc == 1, f"exit {rc}: {tail(err)}")
    rc2, out, err = run([mhc, "diff", f["out.h5"], "cpu", "--report", f["ok.html"]])
    check("mhc diff out.h5 cpu --report: exit 0", rc2 == 0, f"exit {rc2}: {tail(err)}")
    for k in ("bad.html", "ok.html"):
        if not os.path.exists(f[k]):
            fatal(f"{k} written", "no file")
    pages = {k: open(f[k], encoding="utf-8").read() for k in ("bad.html", "ok.html")}

    # 2. self-contained
    for k, page in pages.items():
        self_contained(k, page)

    # 3. the DOM Chromium builds
    dom = Tree(dump_dom(exe, profile, f["bad.html"])).root
    v = find_id(dom, "verdict")
    vt = v.text().strip() if v is not None else ""
    check("bad.html: verdict says \"diverged: first at h_pre\"", "diverged: first at h_pre" in vt, repr(vt[:120]))
    check("bad.html: verdict has class diverged", v is not None and "diverged" in v.attrs.get("class", "").split(),
          repr(v.attrs.get("class") if v is not None else None))
    rows = stage_rows(dom)
    if not check("bad.html: table#stages present", rows is not None):
        rows = {}
    check("bad.html: one table row per stage", sorted(rows) == sorted(STAGES), f"rows {sorted(rows)}")
    hp = rows.get("h_pre", [])
    check("bad.html: h_pre row's status cell says diverged", len(hp) > 1 and hp[1] == "diverged", repr(hp[:2]))
    check("bad.html: upstream stages inv_rms, h_mix ok",
          all(rows.get(s, [None, None])[1] == "ok" for s in ("inv_rms", "h_mix")))
    h2 = [n.text().strip() for n in dom.all("h2")]
    check("bad.html: an h2 for h_pre", any(t.startswith("h_pre") for t in h2), repr(h2))
    svgs = heatmaps(dom)
    svg = svgs.get("error heatmap of h_pre")
    rects = [r for r in svg.all("rect")] if svg is not None else []
    cells = [r for r in rects if r.first("title") is not None]
    check("bad.html: svg aria-label=\"error heatmap of h_pre\" with rects", svg is not None and len(cells) > 0,
          f"svg labels {sorted(svgs)}, {len(cells)} cells")
    # each cell's tooltip: "token A–B, n C–D: error/limit V"
    wrong = []
    for r in cells:
        m = re.match(r"token (\d+)\D+(\d+).*error/limit (\S+)", r.first("title").text())
        if not m:
            wrong.append("tooltip " + repr(r.first("title").text()))
            continue
        lo, hi, val = int(m.group(1)), int(m.group(2)), float(m.group(3))
        if (lo >= BAD_FROM) != (val > 1) or (hi >= BAD_FROM) != (lo >= BAD_FROM):
            wrong.append(f"tokens {lo}-{hi}: {val}")
    check(f"bad.html: heatmap cells above the limit exactly for tokens {BAD_FROM}..{SHAPE[0] - 1}",
          cells and not wrong, f"{len(wrong)} of {len(cells)} cells wrong, e.g. {wrong[:3]}")

    dom = Tree(dump_dom(exe, profile, f["ok.html"])).root
    v = find_id(dom, "verdict")
    vt = v.text().strip() if v is not None else ""
    check("ok.html: verdict says match, class match",
          vt.startswith("match") and v is not None and "match" in v.attrs.get("class", "").split(), repr(vt[:120]))
    rows = stage_rows(dom) or {}
    check("ok.html: every stage's row says ok", sorted(rows) == sorted(STAGES) and
          all(r[1] == "ok" for r in rows.values()), repr({k: r[1] for k, r in rows.items() if r[1] != "ok"}))
    check("ok.html: no heatmap, no h2", not list(dom.all("svg")) and not list(dom.all("h2")))

    # 4. what is shown: screenshots
    img = screenshot(exe, profile, f["bad.html"], f["bad.png"])
    red = is_red(img)
    check("bad.png: > 200 red pixels", red.sum() > 200, f"{red.sum()} red pixels")
    # the heatmap's red block: rows with a long red run (text never makes one)
    run_len, run_start = longest_run(red)
    block = np.nonzero(run_len >= 100)[0]
    if check("bad.png: a solid red heatmap block (rows with >= 100 red pixels in a run)", len(block) > 0,
             f"longest red run {run_len.max()} px"):
        y0, y1 = block[0], block[-1] + 1           # first contiguous block
        gaps = np.nonzero(np.diff(block) > 1)[0]
        if len(gaps):
            y1 = block[gaps[0]] + 1
        x0, width = int(np.median(run_start[y0:y1])), int(np.median(run_len[y0:y1]))
        x1 = x0 + width
        fill = red[y0:y1, x0:x1].mean()
        check("bad.png: the red block is solid", fill > 0.98, f"{fill:.3f} of [{y0}:{y1}, {x0}:{x1}] red")
        # above it, the tokens below BAD_FROM: a pale block of the same height, same columns
        height = y1 - y0
        pale_rows = 0
        for y in range(y0 - 1, -1, -1):
            if is_pale(img[y:y + 1, x0 + 2:x1 - 2]).mean() > 0.98:
                pale_rows += 1
            else:
                break
        check("bad.png: a pale block of the same height above it (tokens 0..%d below the limit)" % (BAD_FROM - 1),
              abs(pale_rows - height) <= 3, f"red block {height} px high, pale block above it {pale_rows} px")
    pink = near(img, (0xff, 0xdd, 0xdd))
    check("bad.png: the verdict box is pink (#fdd)", longest_run(pink)[0].max() >= 300,
          f"longest #fdd run {longest_run(pink)[0].max()} px")
    check("bad.png: no green verdict box (#dfd)", longest_run(near(img, (0xdd, 0xff, 0xdd)))[0].max() < 50)

    img = screenshot(exe, profile, f["ok.html"], f["ok.png"])
    check("ok.png: no red pixels", is_red(img).sum() == 0, f"{is_red(img).sum()} red pixels")
    green = near(img, (0xdd, 0xff, 0xdd))
    check("ok.png: the verdict box is green (#dfd)", longest_run(green)[0].max() >= 300,
          f"longest #dfd run {longest_run(green)[0].max()} px")
    check("ok.png: no pink verdict box (#fdd)", longest_run(near(img, (0xff, 0xdd, 0xdd)))[0].max() < 50)
    check("ok.png: text is drawn (dark pixels)", (img.max(axis=2) < 100).sum() > 2000,
          f"{(img.max(axis=2) < 100).sum()} dark pixels")

    shutil.rmtree(profile, ignore_errors=True)
    print(f"({time.time() - t0:.1f} s; pages, screenshots in {work})", flush=True)
    finish()


if __name__ == "__main__":
    main()
