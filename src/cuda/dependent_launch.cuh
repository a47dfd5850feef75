// dependent_launch.cuh — programmatic dependent launch (sm_90 and later). A kernel launched by
// launch_after() may start while the stream's previous kernel still runs: it must call
// wait_prior_grid() before it reads what that kernel writes or writes what that kernel reads
// (the wait returns when that kernel has finished and its writes are visible). The previous
// kernel lets it start early by calling allow_dependents(). Where the kernel's code was compiled
// for an older architecture (an sm_80 build on an H100 too), both are no-ops and the launch is
// an ordinary one.
#pragma once
#include <cuda_runtime.h>

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
