// dependent_launch.cuh — programmatic dependent launch (sm_90 and later). A kernel launched by
// launch_after() may start while the stream's previous kernel still runs: it must call
// wait_prior_grid() before it reads what that kernel writes or writes what that kernel reads
// (the wait returns when that kernel has finished and its writes are visible). The previous
// kernel lets it start early by calling allow_dependents(). Where the kernel's code was compiled
// for an older architecture (an sm_80 build on an H100 too), both are no-ops and the launch is
// an ordinary one.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "cuda_check.h"

namespace mhc::cuda {

__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernel k, as the current device runs it, waits in wait_prior_grid(): its code must
// come from PTX of compute capability 9.0 or later. The device alone does not say so: an
// sm_80-only build runs on an H100 from compute_80 PTX, without the wait.
inline bool waits_for_prior_grid(const void* k) {
  static std::mutex m;
  static std::map<std::pair<const void*, int>, bool> known;  // (kernel, device)
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(m);
  auto [it, fresh] = known.try_emplace({k, dev}, false);
  if (fresh) {
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
    it->second = fa.ptxVersion >= 90;
  }
  return it->second;
}

// Dynamic shared memory for kernel k of `smem` bytes or more with which no two of its blocks share
// an SM, and whether the current device's SMs hold `blocks` of them at once that way. A
// programmatic dependent's blocks are placed as soon as the kernel before lets them, two to an SM
// where the resources allow, on the SMs that have room first; where each block walks a long loop
// the SMs with two set the kernel's time (dx_param, s19-1 and s19-2: 2.4-10.6 µs).
struct Apart {
  size_t smem;
  bool fits;
};
inline Apart apart(const void* k, size_t smem, unsigned blocks) {
  struct Figures {
    size_t half, most;  // dynamic shared memory that puts a block above half an SM; the most it may have
    unsigned sms;
  };
  static std::mutex m;
  static std::map<std::pair<const void*, int>, Figures> known;  // (kernel, device)
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(m);
  auto [it, fresh] = known.try_emplace({k, dev}, Figures{0, 0, 0});
  if (fresh) {
    int per_sm = 0, per_block = 0, reserved = 0, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
    const size_t fixed = fa.sharedSizeBytes + size_t(reserved), half = size_t(per_sm) / 2 + 16;
    it->second = {half > fixed ? half - fixed : 0, size_t(per_block) - fa.sharedSizeBytes, unsigned(sms)};
  }
  const size_t need = std::max(smem, it->second.half);
  return {need, blocks <= it->second.sms && need <= it->second.most};
}

// k<<<grid, block, smem, s>>>(args...), checked; a programmatic dependent of the stream's
// previous kernel when `dependent` and k waits for it (waits_for_prior_grid).
template <class... P, class... A>
void launch_after(bool dependent, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = dependent && waits_for_prior_grid(reinterpret_cast<const void*>(k)) ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...));
}

}  // namespace mhc::cuda
