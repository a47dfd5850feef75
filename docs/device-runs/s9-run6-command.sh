#!/bin/bash
# session 9, device call 6: change 34 (mix_finish cache hints) — the CUDA tests on HEAD; A/B forward beside af57b9b (s9x)
set -u
o=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
t0=$(date +%s)
for d in . s9x; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
done
(cmake --build build-gpu -j11 > /tmp/build.log 2>&1; echo "build head $?") &
(cmake --build s9x/build-gpu -j5 --target mhc > /tmp/build-b.log 2>&1; echo "build base $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
PASSES=fwd bash bench/ab_bench.sh 2 "1,4,4096 16,4,4096 64,4,4096 128,4,4096 512,4,4096 1,4,7168 16,4,7168 128,4,7168 512,4,7168 128,8,4096 1000,3,1536" -- base=s9x/build-gpu/mhc head=build-gpu/mhc > $o/ab.jsonl 2> $o/ab.err
PASSES=fwd bash bench/ab_bench.sh 1 "4096,8,4096 4096,4,2560 16384,4,4096" -- base=s9x/build-gpu/mhc head=build-gpu/mhc >> $o/ab.jsonl 2>> $o/ab.err
echo "ab at $(( $(date +%s) - t0 )) s"
python3 bench/ab_table.py $o/ab.jsonl
(cd build-gpu && timeout 330 ctest -R cuda -j4 --output-on-failure) > $o/ctest.log 2>&1; echo "ctest head $?"
tail -6 $o/ctest.log
echo "done at $(( $(date +%s) - t0 )) s"
