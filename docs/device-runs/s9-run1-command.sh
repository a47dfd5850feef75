#!/bin/bash
# session 9, device call 1: HEAD (bcd3e8e's kernels) full CUDA tests; A/B against the split64 candidate (s9x)
set -u
o=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
t0=$(date +%s)
for d in . s9x; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
done
(cmake --build build-gpu -j11 > /tmp/build.log 2>&1; echo "build head $?") &
(cmake --build s9x/build-gpu -j5 --target mhc > /tmp/build-b.log 2>&1; echo "build cand $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
build-gpu/mhc --version
(cd build-gpu && ctest -R cuda -j4 --output-on-failure) > $o/ctest.log 2>&1; echo "ctest head $?"
tail -6 $o/ctest.log
echo "tests at $(( $(date +%s) - t0 )) s"
printf "n4_D4096_T128 128,4,4096\nn4_D4096_T200 200,4,4096\nn4_D7168_T255 255,4,7168\nn3_D300_T129 129,3,300\nn8_D4096_T160 160,8,4096\nn5_D33_T250 250,5,33\n" > /tmp/cand_cases.txt
s9x/build-gpu/mhc check cuda --cases /tmp/cand_cases.txt --repeat 2 > $o/cand_check.txt 2>&1; echo "check cand $?"
tail -3 $o/cand_check.txt
PASSES="bwd both" bash bench/ab_bench.sh 2 "128,4,4096 200,4,4096 255,4,4096 128,4,7168 200,4,7168 128,8,4096 64,4,4096 256,4,4096" -- head=build-gpu/mhc cand=s9x/build-gpu/mhc > $o/ab.jsonl 2> $o/ab.err
echo "ab at $(( $(date +%s) - t0 )) s"
/usr/bin/python3 bench/ab_table.py $o/ab.jsonl || python3 bench/ab_table.py $o/ab.jsonl
ncu --kernel-name regex:param_final --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats build-gpu/mhc bench --backend cuda --shape 16384,8,4096 --pass bwd --repeat 1 --warmup 0 > $o/ncu_pf.txt 2>&1; echo "ncu $?"
echo "done at $(( $(date +%s) - t0 )) s"
