#!/bin/sh
# cuda_memcheck.sh MHC DIR — compute-sanitizer memcheck of the CUDA backend on small cases
# (ragged tiles, scalar and vector paths, n = 1..8, every forward split: 16384,4,520 takes
# 64-token tiles and K slices of 16 tiles, 300,4,520 slices of one tile). Exits 77 without a GPU.
set -eu
mhc=$1 dir=$2
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIPPED: no CUDA device"; exit 77; fi
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$cs" ] || { echo "compute-sanitizer not found"; exit 1; }
mkdir -p "$dir"
for shape in 5,4,7 3,8,64 17,1,1 2,3,6,16 3,2,40 2,3,24 4,5,8 2,7,16 300,4,520 16384,4,520; do
  "$mhc" gen --force --shape $shape --seed 1 "$dir/in.h5" >/dev/null
  "$cs" --tool memcheck --error-exitcode 1 --leak-check full \
    "$mhc" run -q --force --backend cuda --dump-intermediates "$dir/in.h5" "$dir/out.h5"
  echo "memcheck clean: $shape"
done
