#!/bin/sh
# cuda_memcheck.sh MHC DIR — compute-sanitizer memcheck of the CUDA backend on small cases
# (ragged tiles, scalar and vector paths). Exits 77 (ctest: skipped) without a GPU.
set -eu
mhc=$1 dir=$2
if ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIPPED: no CUDA device"; exit 77; fi
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$cs" ] || { echo "compute-sanitizer not found"; exit 1; }
mkdir -p "$dir"
for shape in 5,4,7 3,8,64 17,1,1 2,3,6,16; do
  "$mhc" gen --force --shape $shape --seed 1 "$dir/in.h5" >/dev/null
  "$cs" --tool memcheck --error-exitcode 1 --leak-check full \
    "$mhc" run -q --force --backend cuda --dump-intermediates "$dir/in.h5" "$dir/out.h5"
  echo "memcheck clean: $shape"
done
