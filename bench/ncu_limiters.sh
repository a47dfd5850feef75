#!/bin/bash
# ncu_limiters.sh MHC OUTDIR SHAPE... — Nsight Compute's SpeedOfLight, MemoryWorkloadAnalysis,
# WarpStateStats, Occupancy and LaunchStats sections for every kernel of one forward + backward
# (`mhc bench --backend cuda --pass both --repeat 1 --warmup 0`) per shape; the full report
# goes to OUTDIR/ncu-SHAPE.txt, and a line per kernel (time, % of peak DRAM and SM throughput,
# the top warp stall) to stdout. Run on the GPU machine; clocks are left as the card has them.
set -uo pipefail
mhc=$1 dir=$2
shift 2
mkdir -p "$dir"
for shape in "$@"; do
  f="$dir/ncu-${shape//,/_}.txt"
  ncu --clock-control none -k 'regex:split_pg|mix_|token_grads|dx_param|param_final' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    "$mhc" bench --backend cuda --shape "$shape" --pass both --repeat 1 --warmup 0 > "$f" 2>&1 ||
    { tail -5 "$f"; exit 1; }
  echo "== $shape"
  awk 'match($0, /(split_pg|mix_|token_grads|dx_param|param_final)[a-z_]*(<[0-9, ]+>)?/) && /\)x\(/ {
         k = substr($0, RSTART, RLENGTH) }
       $1 == "Duration" { d = $NF " " $(NF-1) } $1 == "DRAM" && $2 == "Throughput" { m = $NF }
       /Compute \(SM\) Throughput/ { c = $NF }
       /Achieved Occupancy/ { printf "%-24s %10s  dram %5s%%  sm %5s%%  occupancy %5s%%\n", k, d, m, c, $NF }' "$f"
done
