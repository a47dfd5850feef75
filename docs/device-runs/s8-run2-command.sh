#!/bin/bash
# session 8, device call 2: B (working tree) full CUDA tests, C (s8c) full CUDA tests, A/B/C bench
set -u
o=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
t0=$(date +%s)
for d in . s8pdl s8c; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
done
(cmake --build build-gpu -j6 > /tmp/build.log 2>&1; echo "build B $?") &
(cmake --build s8pdl/build-gpu -j5 --target mhc > /tmp/build-a.log 2>&1; echo "build A $?") &
(cmake --build s8c/build-gpu -j5 --target mhc mhc_cuda_tests > /tmp/build-c.log 2>&1; echo "build C $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
(cd build-gpu && ctest -R cuda -j4 --output-on-failure) > $o/ctest-B.log 2>&1; echo "ctest B $?"
tail -6 $o/ctest-B.log
s8c/build-gpu/tests/mhc_cuda_tests -tc="*deterministic*" > /tmp/c.log 2>&1; echo "C determinism $?"; tail -3 /tmp/c.log
echo "tests at $(( $(date +%s) - t0 )) s"
bash bench/ab_bench.sh 1 "1,4,4096 16,4,4096 64,4,4096 128,4,4096 200,4,4096 512,4,4096 16,4,7168 128,4,7168 1,8,4096 128,8,4096" -- A=s8pdl/build-gpu/mhc B=build-gpu/mhc C=s8c/build-gpu/mhc > $o/ab-small.jsonl 2> $o/ab.err
echo "ab at $(( $(date +%s) - t0 )) s"
bash bench/ab_bench.sh 1 "16384,4,4096 16384,8,4096 4096,4,7168" -- B=build-gpu/mhc >> $o/ab-small.jsonl 2>> $o/ab.err
echo "large at $(( $(date +%s) - t0 )) s"
timeout 60 bash bench/ncu_limiters.sh build-gpu/mhc /tmp/ncu 65000,4,16 > $o/ncu-65000.txt 2>&1
echo "done at $(( $(date +%s) - t0 )) s"
