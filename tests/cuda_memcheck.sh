#!/bin/sh
# cuda_memcheck.sh MHC DIR — compute-sanitizer on the CUDA backend over small cases (ragged
# tiles, scalar and vector paths, n = 1..8, the forward's three paths: 4096,8,1024, 65521,7,9 and
# 65521,4,1028 (vector rows, a partial last chunk)
# mix_partial, 16384,4,520 and 300,4,520 mix_group on split_pg's planes, 5,4,7 mix_group splitting
# phi*gamma; 3,4,1031 mix_finish's element-wise h_in over 3 column ranges; the backward with one
# token split and with several; its ring of x and dh_in at n <= 4, D % 8 == 0: 3,2,40, 2,3,24,
# 300,4,520, 16384,4,520 and 45,2,1032, a warp's columns across two streams): memcheck on every
# case; racecheck (shared-memory hazards), synccheck and initcheck on a subset. Exits 77 without a GPU.
set -eu
mhc=$1 dir=$2
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIPPED: no CUDA device"; exit 77; fi
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$cs" ] || { echo "compute-sanitizer not found"; exit 1; }
mkdir -p "$dir"
check() {  # TOOL SHAPE [extra sanitizer options]
  tool=$1 shape=$2
  shift 2
  "$mhc" gen --force --shape "$shape" --seed 1 "$dir/in.h5" >/dev/null
  "$cs" --tool "$tool" --error-exitcode 1 "$@" \
    "$mhc" run -q --force --backend cuda --dump-intermediates "$dir/in.h5" "$dir/out.h5"
  echo "$tool clean: $shape"
}
for shape in 5,4,7 3,8,64 17,1,1 2,3,6,16 3,2,40 2,3,24 4,5,8 2,7,16 300,4,520 16384,4,520 45,2,1032 4096,8,1024 65521,7,9 65521,4,1028 600,6,520 3,4,1031; do
  check memcheck $shape --leak-check full
done
for shape in 5,4,7 3,8,64 300,4,520 45,2,1032 40,6,24 600,6,520; do
  check racecheck $shape --racecheck-report all
  check synccheck $shape
  check initcheck $shape
done
