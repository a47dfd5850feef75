#!/bin/bash
# session 9, device call 8: change 33d (mix_stream v3 + gates shared by the team) beside af57b9b (s9x): bits, A/B
# forward; the CUDA tests only if it beats af57b9b at 16384,4,4096
set -u
o=$OUT
t0=$(date +%s)
for d in . s9x; do
  cmake -S $d -B $d/build-gpu -DCMAKE_BUILD_TYPE=Release -DMHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 || { tail /tmp/cfg.log; exit 1; }
done
(cmake --build build-gpu -j11 > /tmp/build.log 2>&1; echo "build new $?") &
(cmake --build s9x/build-gpu -j5 --target mhc > /tmp/build-b.log 2>&1; echo "build base $?") &
wait
grep -E "error" -A3 /tmp/build*.log | head -30
echo "built at $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/c
for sh in 4096,4,4096 300,4,520 6000,3,77 129,4,7168 16384,4,520; do
  build-gpu/mhc gen --force --shape $sh --seed 3 /tmp/c/in.h5 > /dev/null
  timeout 60 build-gpu/mhc run -q --force --backend cuda /tmp/c/in.h5 /tmp/c/new.h5; echo "run new $sh $?"
  s9x/build-gpu/mhc run -q --force --backend cuda /tmp/c/in.h5 /tmp/c/old.h5
  python3 docs/device-runs/s9cmp.py /tmp/c/new.h5 /tmp/c/old.h5
done 2>&1 | tee $o/bits.txt | grep -v IDENTICAL
echo "bits at $(( $(date +%s) - t0 )) s"
PASSES=fwd bash bench/ab_bench.sh 1 "128,4,4096 512,4,4096 4096,4,4096 4096,4,2560 2048,4,7168 16384,4,4096" -- head=s9x/build-gpu/mhc stream=build-gpu/mhc > $o/ab.jsonl 2> $o/ab.err
echo "ab at $(( $(date +%s) - t0 )) s"
python3 bench/ab_table.py $o/ab.jsonl
if python3 -c "
import json,sys
m={json.loads(l)['build']: json.loads(l)['median_ms'] for l in open('$o/ab.jsonl') if '\"16384,4,4096\"' in l}
print('16384,4,4096', m); sys.exit(0 if m['stream'] < m['head'] else 1)"; then
  (cd build-gpu && timeout 280 ctest -R cuda -j4 --output-on-failure) > $o/ctest.log 2>&1; echo "ctest new $?"; tail -6 $o/ctest.log
fi
echo "done at $(( $(date +%s) - t0 )) s"
