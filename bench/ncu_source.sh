#!/bin/bash
# ncu_source.sh MHC OUTDIR SHAPE KERNEL_REGEX — where one kernel spends its time, per SASS
# instruction: Nsight Compute's full set for the first matching kernel of one forward + backward,
# then its source page as CSV (executed instructions and warp-stall samples per instruction),
# gzipped to OUTDIR/source-KERNEL.csv.gz, and the 25 instructions with the most stall samples
# to stdout. Run on the GPU machine.
set -euo pipefail
mhc=$1 dir=$2 shape=$3 kernel=$4
mkdir -p "$dir"
rep=$(mktemp -d)/rep
ncu --clock-control none -k "regex:$kernel" -c 1 --set full --import-source no -o "$rep" \
  "$mhc" bench --backend cuda --shape "$shape" --pass both --repeat 1 --warmup 0 > "$dir/ncu-source.log" 2>&1
ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv"
gzip -c "$rep.csv" > "$dir/source-${kernel//[^A-Za-z0-9_]/}.csv.gz"
python3 - "$rep.csv" <<'PY'
import csv, sys
f = open(sys.argv[1])
if f.readline().startswith('"Kernel Name"') is False: f.seek(0)  # a first line naming the kernel
rows = list(csv.DictReader(f))
cols = list(rows[0])
key = next((k for k in cols if k.startswith("Warp Stall Sampling (All")), None)
ex = next((k for k in cols if k.startswith("Instructions Executed")), None)
if key is None or ex is None:
    sys.exit("columns: " + " | ".join(cols))
num = lambda v: float(v.replace(",", "") or 0)
total = sum(num(r[key]) for r in rows)
print(f"{len(rows)} SASS instructions, {total:.0f} stall samples, {sum(num(r[ex]) for r in rows):.0f} warp-instructions")
for r in sorted(rows, key=lambda r: -num(r[key]))[:25]:
    print(f"{num(r[key]) / total * 100:5.1f}%  {num(r[ex]):>12.0f}  {r['Address']:>6}  {r['Source']}")
PY
