#!/bin/bash
# ab_bench.sh ROUNDS SHAPES -- LABEL=MHC... — A/B benchmark of several builds on one machine:
# for each round, shape and pass (fwd, bwd, both; or those in $PASSES), every build in turn
# runs `mhc bench --backend cuda --json` (20 repeats after 3 warm-ups, L2 flushed before each),
# so the builds see the same clocks and neighbours. One JSON line per run on stdout, with the
# build's label and the round added. Example, on the GPU machine:
#   bash bench/ab_bench.sh 2 "1,4,4096 128,4,4096" -- base=build-gpu/mhc pdl=b/build-gpu/mhc
set -uo pipefail
rounds=$1 shapes=$2
shift 2
[ "${1:-}" = "--" ] && shift
status=0
for r in $(seq "$rounds"); do
  for shape in $shapes; do
    for pass in ${PASSES:-fwd bwd both}; do
      for build in "$@"; do
        label=${build%%=*} mhc=${build#*=}
        line=$("$mhc" bench --backend cuda --shape "$shape" --pass $pass --repeat 20 --warmup 3 --json) || { status=1; continue; }
        echo "{\"build\": \"$label\", \"round\": $r, ${line#\{}"
      done
    done
  done
done
exit $status
