// launch_floor.cu — the fixed cost of a chain of kernel launches, timed as `mhc bench` times a pass
// (L2 flushed by a memset, CUDA events around the launches): what the 15 µs small-T targets of
// issue 10 leave for the work itself. Each kernel does nothing but, where asked, read `bytes` of
// a buffer once (a grid-stride sum, written so it is not optimised away) and meet a block barrier.
// Last, a pair whose second kernel takes 104 KB of dynamic shared memory (dx_param's at n = 4),
// after one without (token_grads) or with it, and with the first preferring the largest carve-out.
// On the GPU machine (also the launch_floor target of a CUDA build):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc/cuda -Isrc/common bench/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_check.h"
#include "dependent_launch.cuh"

using namespace mhc::cuda;

// Reads n floats of `in` (grid-stride, 16-byte loads), one block barrier, one store a block.
__device__ void body(const float4* in, int64_t n4, float* out) {
  wait_prior_grid();
  float s = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = in[i];
    s += v.x + v.y + v.z + v.w;
  }
  __shared__ float red[32];
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  allow_dependents();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w) s += red[w];
    out[blockIdx.x] = s;
  }
}

// The same with `smem` bytes of dynamic shared memory, touched so that it is really used.
__global__ void step_smem(const float4* in, int64_t n4, float* out) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = float(threadIdx.x);
  body(in, n4, out);
}
__global__ void step(const float4* in, int64_t n4, float* out) { body(in, n4, out); }

int main() {
  int l2 = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  unsigned char* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&flush, 4 * size_t(l2)));
  const int64_t most = int64_t(64) << 20;  // bytes read by a kernel, at most
  float *in = nullptr, *out = nullptr;
  CUDA_CHECK(cudaMalloc(&in, most));
  CUDA_CHECK(cudaMemset(in, 0, most));
  CUDA_CHECK(cudaMalloc(&out, 1 << 20));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  // Median µs of 50 timed calls of launch() (after 5), L2 flushed before each.
  auto median_us = [&](auto&& launch) {
    std::vector<float> ms;
    for (int i = 0; i < 55; ++i) {
      CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, 4 * size_t(l2)));
      CUDA_CHECK(cudaEventRecord(start));
      launch();
      CUDA_CHECK(cudaEventRecord(stop));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (i >= 5) ms.push_back(t);
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return 1000.0 * ms[ms.size() / 2];
  };
  const float4* src = reinterpret_cast<const float4*>(in);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: median µs of 50 (after 5), L2 flushed before each; kernels of 256 threads\n", prop.name);
  std::printf("%-8s %-7s %-10s %-9s %s\n", "kernels", "blocks", "bytes/kern", "dependent", "µs");
  for (int kernels : {1, 2, 3})
    for (int blocks : {132, 264})
      for (int64_t bytes : {int64_t(0), int64_t(4) << 20, int64_t(16) << 20})
        for (bool dependent : {false, true}) {
          if (kernels == 1 && dependent) continue;
          const double us = median_us([&] {
            for (int k = 0; k < kernels; ++k)
              launch_after(dependent && k > 0, step, dim3(blocks), dim3(256), 0, nullptr, src, bytes / 16, out);
          });
          std::printf("%-8d %-7d %-10lld %-9s %.2f\n", kernels, blocks, (long long)bytes, dependent ? "yes" : "no", us);
        }
  // A kernel with 104 KB of dynamic shared memory (dx_param's at n = 4) after one with none
  // (token_grads): does the SMs' shared-memory carve-out change between them cost time?
  const int big = 104 * 1024;
  CUDA_CHECK(cudaFuncSetAttribute(step_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
  std::printf("\nsecond kernel with 104 KB of dynamic shared memory, 132 blocks, 4 MB each, PDL\n");
  for (int carveout : {-1, 100}) {  // -1: the first kernel as it is; 100: it prefers the largest carve-out
    CUDA_CHECK(cudaFuncSetAttribute(step, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
    for (bool first_smem : {false, true}) {
      const int64_t n4 = int64_t(4 << 20) / 16;
      const double us = median_us([&] {
        if (first_smem)
          launch_after(false, step_smem, dim3(132), dim3(256), big, nullptr, src, n4, out);
        else
          launch_after(false, step, dim3(132), dim3(256), 0, nullptr, src, n4, out);
        launch_after(true, step_smem, dim3(132), dim3(256), big, nullptr, src, n4, out);
      });
      std::printf("first kernel %-22s carve-out %-8s %.2f µs\n", first_smem ? "also 104 KB" : "without shared memory",
                  carveout < 0 ? "default" : "max", us);
    }
  }
  return 0;
}
