#!/bin/bash
# session 24, device call 3: ctest -R cuda on the session's final code (69d5a52)
set -u
o=$OUT
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $o/gpu.txt
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j16 --target mhc mhc_tests mhc_cuda_tests > /tmp/build.log 2>&1 || { grep -E "error" -A3 /tmp/build.log | head -30; exit 1; }
echo "built at $(( $(date +%s) - t0 )) s"
(cd build-gpu && timeout 430 ctest --output-on-failure -j3 -R cuda) > $o/ctest.log 2>&1; echo "ctest exit $?"
tail -6 $o/ctest.log
echo "done at $(( $(date +%s) - t0 )) s"
