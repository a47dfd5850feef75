#!/bin/bash
# device_run.sh — on a GPU machine: build with CUDA, run the whole test suite (GPU tests
# included), then benchmark. Logs go to $OUT (or ./device-out). Usage: bash bench/device_run.sh
# Exit status: non-zero when the build or any test fails (the benchmarks still run after a
# test failure, so that one call yields both).
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" -A5 "$out/build.log" | head -60; exit 1; }
build-gpu/mhc --version
(cd build-gpu && ctest --output-on-failure -j"${CTEST_JOBS:-4}" ${CTEST_ARGS:-}) > "$out/ctest.log" 2>&1
tests=$?
tail -40 "$out/ctest.log"
bench=0  # non-zero when any benchmark fails, not only the last
for shape in ${SHAPES:-4096,4,2560 16384,4,4096 65536,4,2560 4096,8,4096}; do
  for pass in fwd bwd both; do
    build-gpu/mhc bench --backend cuda --shape "$shape" --pass $pass --repeat 20 --warmup 3 --json || bench=1
  done
done > "$out/bench.jsonl" 2> "$out/bench.err"
cat "$out/bench.jsonl"
# per-kernel times (Nsight Compute), when asked: PROFILE=16384,4,4096
if [ -n "${PROFILE:-}" ]; then
  ncu --clock-control none --metrics gpu__time_duration.sum build-gpu/mhc bench --backend cuda \
    --shape "$PROFILE" --pass both --repeat 1 --warmup 0 > "$out/ncu.txt" 2>&1
  grep -v "^==PROF==" "$out/ncu.txt" | grep -E "split_pg|mix_|token_grads|dx_param|param_final|gpu__time_duration" | paste - - |
    sed -E 's/.*(split_pg|mix_[a-z]+|token_grads|dx_param|param_final).*duration.sum +([a-z]+) +([0-9.,]+).*/\1 \3 \2/'
fi
echo "device_run: tests exit $tests, bench exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
