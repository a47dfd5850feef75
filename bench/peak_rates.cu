// peak_rates.cu — the two compute ceilings the CUDA kernels meet, measured on the card:
// fp32 FMA on CUDA cores and bf16 mma.sync m16n8k16 (fp32 accumulate) on tensor cores, the
// instruction mhc's kernels use. Each warp runs 8 independent chains so that latency hides;
// results are stored, so nothing is optimised away. Times are CUDA events around one launch
// of every SM's worth of blocks, best of 5.
//   build/peak_rates (built with the CUDA backend), or on its own:
//   nvcc -std=c++17 -O3 -arch=sm_90 -I src/cuda -I src/common -o /tmp/peak_rates bench/peak_rates.cu && /tmp/peak_rates
#include <cstdio>
#include <cstdlib>

#include "bf16_split.cuh"
#include "cuda_check.h"

namespace {

constexpr int kChains = 8, kIters = 16384, kThreads = 256;

__global__ void __launch_bounds__(kThreads, 3) fma_loop(float* out, float a, float b) {
  float v[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) v[c] = float(threadIdx.x + c);
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) v[c] = fmaf(v[c], a, b);
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += v[c];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads, 3) mma_loop(float* out, uint32_t a, uint32_t b) {
  float d[kChains][4] = {};
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) mhc::cuda::mma_bf16(d[c], a, a + c, a, a, b, b);
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
}

template <class F> float best_ms(F launch) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < 6; ++r) {  // the first is a warm-up
    CUDA_CHECK(cudaEventRecord(a));
    launch();
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms < best) best = ms;
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return best;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int blocks = prop.multiProcessorCount * 3;  // 3 blocks of 8 warps per SM, all resident
  float* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, size_t(blocks) * kThreads * sizeof(float)));
  const double warps = double(blocks) * kThreads / 32;
  const float fma_ms = best_ms([&] { fma_loop<<<blocks, kThreads>>>(out, 0.999f, 0.001f); });
  const float mma_ms = best_ms([&] { mma_loop<<<blocks, kThreads>>>(out, 0x3f803f80u, 0x3f803f80u); });
  const double fma = warps * 32 * kChains * kIters / (fma_ms * 1e-3);          // FMA/s
  const double mma = warps * kChains * kIters * 16 * 8 * 16 / (mma_ms * 1e-3);  // MAC/s
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("fp32 FMA (CUDA cores):            %.2f T FMA/s  (%.1f TFLOP/s)\n", fma / 1e12, 2 * fma / 1e12);
  std::printf("bf16 mma.sync m16n8k16, fp32 acc: %.1f T MAC/s  (%.0f TFLOP/s)\n", mma / 1e12, 2 * mma / 1e12);
  CUDA_CHECK(cudaFree(out));
  return EXIT_SUCCESS;
}
