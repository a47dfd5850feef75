#!/bin/bash
# session 9, device call 5: where mix_stream's time goes. Builds: base (af57b9b, s9x), v3 (193233c, s9v3), v4a (this
# tree: x's first read evict_last in L2, h_in stored streaming), and two timing-only cuts of v4a made here by sed:
# nohin (h_in never written) and nomma (no mma, no stash). Bits of v4a against base; A/B forward; ncu of v4a.
set -u
o=$OUT
t0=$(date +%s)
for v in nohin nomma; do mkdir -p s9$v && cp -r CMakeLists.txt src bench tests s9$v/; done
sed -i 's/^    token_h_in<n, kTok, 2>(p, tile \* kTok, hp, grp, groups, \[&\] {/    if (false) token_h_in<n, kTok, 2>(p, tile * kTok, hp, grp, groups, [\&] {/' s9nohin/src/cuda/forward.cu
sed -i 's/^    if (c < chunks)$/    if (false)/' s9nomma/src/cuda/forward.cu
diff src/cuda/forward.cu s9nohin/src/cuda/forward.cu; diff src/cuda/forward.cu s9nomma/src/cuda/forward.cu
for d in . s9x s9v3 s9nohin s9nomma; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
  (cmake --build $d/build-gpu -j4 --target mhc > /tmp/build-$(basename $d).log 2>&1; echo "build $d $?") &
done
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/c
for sh in 4096,4,4096 129,4,7168 6000,3,77; do
  build-gpu/mhc gen --force --shape $sh --seed 3 /tmp/c/in.h5 > /dev/null
  timeout 60 build-gpu/mhc run -q --force --backend cuda /tmp/c/in.h5 /tmp/c/new.h5; echo "run new $sh $?"
  s9x/build-gpu/mhc run -q --force --backend cuda /tmp/c/in.h5 /tmp/c/old.h5
  python3 docs/device-runs/s9cmp.py /tmp/c/new.h5 /tmp/c/old.h5
done 2>&1 | tee $o/bits.txt | grep -v IDENTICAL
echo "bits at $(( $(date +%s) - t0 )) s"
PASSES=fwd bash bench/ab_bench.sh 1 "4096,4,2560 4096,4,4096 16384,4,4096" -- head=s9x/build-gpu/mhc v3=s9v3/build-gpu/mhc v4a=build-gpu/mhc nohin=s9nohin/build-gpu/mhc nomma=s9nomma/build-gpu/mhc > $o/ab.jsonl 2> $o/ab.err
PASSES=fwd bash bench/ab_bench.sh 1 "64,4,4096 4096,8,4096" -- head=s9x/build-gpu/mhc v4a=build-gpu/mhc >> $o/ab.jsonl 2>> $o/ab.err
echo "ab at $(( $(date +%s) - t0 )) s"
python3 bench/ab_table.py $o/ab.jsonl
timeout 100 ncu --kernel-name regex:mix_stream --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats build-gpu/mhc bench --backend cuda --shape 16384,4,4096 --pass fwd --repeat 1 --warmup 0 > $o/ncu_v4a.txt 2>&1; echo "ncu $?"
grep -E "Duration|DRAM Through|L2 Hit|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  " $o/ncu_v4a.txt | head -12
echo "done at $(( $(date +%s) - t0 )) s"
