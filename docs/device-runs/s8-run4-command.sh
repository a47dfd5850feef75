#!/bin/bash
# session 8, device call 4: change 31 (split cap) — build, check the capped shapes, bench
set -u
o=$OUT
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j16 --target mhc > /tmp/build.log 2>&1; echo "build $?"; grep error -A3 /tmp/build.log | head
echo "built at $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build-gpu/mhc check cuda --cases docs/device-runs/s8-run4-cap_cases.txt --repeat 2 > $o/check.txt 2>&1; echo "check cap cases $?"
build-gpu/mhc check cuda --cases tests/cuda_sweep.txt --only T65 --repeat 2 >> $o/check.txt 2>&1; echo "check sweep T65* $?"
tail -4 $o/check.txt
echo "checked at $(( $(date +%s) - t0 )) s"
PASSES="bwd both" bash bench/ab_bench.sh 1 "65000,4,16 40000,2,300" -- head=build-gpu/mhc > $o/ab.jsonl 2>&1
echo "done at $(( $(date +%s) - t0 )) s"
