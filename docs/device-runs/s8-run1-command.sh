#!/bin/bash
# session 8, device call 1: HEAD's CUDA tests (new cases never run), A/B of HEAD vs PDL branch
set -u
o=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
t0=$(date +%s)
for d in . s8pdl; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $o/cfg.log 2>&1 || { tail $o/cfg.log; exit 1; }
done
(cmake --build build-gpu -j10 > /tmp/build.log 2>&1; echo "build base $?") &
(cmake --build s8pdl/build-gpu -j6 > /tmp/build-pdl.log 2>&1; echo "build pdl $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
(cd build-gpu && ctest -R cuda -j4 --output-on-failure) > $o/ctest.log 2>&1; echo "ctest base $?"
tail -8 $o/ctest.log
echo "tests at $(( $(date +%s) - t0 )) s"
s8pdl/build-gpu/tests/mhc_cuda_tests -tc="*deterministic*,*do not depend on T*" > $o/pdl-tests.log 2>&1; echo "pdl bits tests $?"
tail -4 $o/pdl-tests.log
bash bench/ab_bench.sh 2 "1,4,4096 16,4,4096 128,4,4096 512,4,4096 1,4,7168 16,4,7168 128,4,7168 512,4,7168" -- base=build-gpu/mhc pdl=s8pdl/build-gpu/mhc > $o/ab-small.jsonl 2> $o/ab.err
echo "ab small at $(( $(date +%s) - t0 )) s"
bash bench/ab_bench.sh 1 "4096,4,2560 16384,4,4096 65000,4,16" -- base=build-gpu/mhc pdl=s8pdl/build-gpu/mhc > $o/ab-large.jsonl 2>> $o/ab.err
echo "done at $(( $(date +%s) - t0 )) s"
