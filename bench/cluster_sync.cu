// cluster_sync.cu — what a cluster design of the large-T forward would pay per 16-token tile
// (perf.md, session 20's next item 1): a cluster barrier (arrive.release + wait.acquire) among 2
// to 16 CTAs of one SM each, alone and after each thread reads another CTA's shared memory
// (distributed shared memory: 1 KB, or 32 KB, a tile's x slice of one CTA, in 4- or 16-byte
// loads). Every cluster the device holds at once runs together, each CTA with 211 KB of dynamic
// shared memory as that design needs; rounds are timed by clock64 and the kernel by CUDA events.
// On the GPU machine (also the cluster_sync target of a CUDA build):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc/cuda -Isrc/common bench/cluster_sync.cu -o /tmp/cluster_sync && /tmp/cluster_sync
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "cuda_check.h"

namespace cg = cooperative_groups;

constexpr int kRounds = 2000;
constexpr int kWords = 8192;                  // floats a CTA holds for the others to read (32 KB)
constexpr size_t kSmem = 211 * 1024;          // the design's shared memory a CTA: one CTA an SM

// Each round: read `words` floats of CTA (rank + 1 + r) % size (4-byte loads, or 16-byte ones where
// vec), then one thread writes a float of its own, then the cluster barrier. cycles[b]: clock64
// cycles of CTA b's rounds.
__global__ void rounds(int words, bool vec, long long* cycles, float* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float sm[];
  cg::cluster_group cl = cg::this_cluster();
  const unsigned rank = cl.block_rank(), size = cl.num_blocks();
  for (int i = threadIdx.x; i < kWords; i += blockDim.x) sm[i] = float(rank + i);
  cl.sync();
  float acc = 0.0f;
  const long long t0 = clock64();
  for (int r = 0; r < kRounds; ++r) {
    if (words && vec) {
      const float4* other = reinterpret_cast<const float4*>(cl.map_shared_rank(sm, (rank + 1 + unsigned(r)) % size));
#pragma unroll 4  // a thread's loads in flight together (s20-4: one at a time, 1.5 us for 32 KB)
      for (int i = threadIdx.x; i < words / 4; i += blockDim.x) {
        const float4 v = other[i];
        acc += v.x + v.y + v.z + v.w;
      }
    } else if (words) {
      const float* other = cl.map_shared_rank(sm, (rank + 1 + unsigned(r)) % size);
      for (int i = threadIdx.x; i < words; i += blockDim.x) acc += other[i];
    }
    if (threadIdx.x == 0) sm[r % kWords] = acc;
    cl.sync();
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (acc == -1.0f) sink[0] = acc;  // keeps the reads
#else
  (void)words, (void)vec, (void)cycles, (void)sink;
#endif
}

int main() {
  int dev = 0, cc = 0, khz = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  if (cc < 9) {
    std::printf("%s: thread block clusters need compute capability 9.0\n", prop.name);
    return 0;
  }
  std::printf("%s, %d SMs, clock %.0f MHz; %d rounds, %zu KB of shared memory a CTA\n", prop.name, sms, khz / 1e3,
              kRounds, kSmem / 1024);
  std::printf("%8s %8s %9s %11s %5s %12s %12s %12s\n", "cluster", "threads", "clusters", "KB read", "load",
              "cycles/round", "ns/round", "event ns/rd");
  CUDA_CHECK(cudaFuncSetAttribute(rounds, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  CUDA_CHECK(cudaFuncSetAttribute(rounds, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  long long* cycles = nullptr;
  float* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&cycles, size_t(sms) * 2 * sizeof(long long)));
  CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int size : {2, 4, 8, 16})
    for (int threads : {256, 512})
      for (auto [words, vec] : {std::pair{0, false}, std::pair{256, false}, std::pair{kWords, false}, std::pair{kWords, true}}) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = unsigned(size), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg{};
        cfg.blockDim = dim3(unsigned(threads));
        cfg.dynamicSmemBytes = kSmem;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        cfg.gridDim = dim3(unsigned(size));
        int active = 0;
        if (cudaOccupancyMaxActiveClusters(&active, rounds, &cfg) != cudaSuccess || active == 0) {
          (void)cudaGetLastError();
          std::printf("%8d %8d %9s  (no cluster of this size fits)\n", size, threads, "0");
          continue;
        }
        cfg.gridDim = dim3(unsigned(active * size));
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, rounds, words, vec, cycles, sink));  // warm-up
        CUDA_CHECK(cudaEventRecord(start));
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, rounds, words, vec, cycles, sink));
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        std::vector<long long> c(size_t(active * size));
        CUDA_CHECK(cudaMemcpy(c.data(), cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        std::sort(c.begin(), c.end());
        const double per = double(c[c.size() / 2]) / kRounds;
        std::printf("%8d %8d %9d %11.1f %5s %12.0f %12.1f %12.1f\n", size, threads, active, words * 4 / 1024.0,
                    vec ? "16 B" : "4 B", per,
                    per / (khz / 1e6), ms * 1e6 / kRounds);
      }
  CUDA_CHECK(cudaFree(cycles));
  CUDA_CHECK(cudaFree(sink));
  return 0;
}
