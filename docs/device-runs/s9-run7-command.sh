#!/bin/bash
# session 9, device call 7 (profiles only, for the next design): main's kernels (= af57b9b) per kernel at 16384,4,4096
# (bench/ncu_limiters.sh), and mix_stream v3 (193233c, s9v3) per SASS instruction (bench/ncu_source.sh)
set -u
o=$OUT
t0=$(date +%s)
for d in . s9v3; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS=-lineinfo > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
done
(cmake --build build-gpu -j8 --target mhc > /tmp/build.log 2>&1; echo "build main $?") &
(cmake --build s9v3/build-gpu -j8 --target mhc > /tmp/build-b.log 2>&1; echo "build v3 $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
bash bench/ncu_limiters.sh build-gpu/mhc $o 16384,4,4096 2>&1 | tee $o/limiters.txt
echo "limiters at $(( $(date +%s) - t0 )) s"
timeout 200 bash bench/ncu_source.sh s9v3/build-gpu/mhc $o 16384,4,4096 mix_stream 2>&1 | tee $o/source-top.txt
echo "done at $(( $(date +%s) - t0 )) s"
