// dependent_launch.cuh — programmatic dependent launch (sm_90 and later). A kernel launched by
// launch_after() may start while the stream's previous kernel still runs: it must call
// wait_prior_grid() before it reads what that kernel writes or writes what that kernel reads
// (the wait returns when that kernel has finished and its writes are visible). The previous
// kernel lets it start early by calling allow_dependents(). On older devices, or when a kernel
// was launched the ordinary way, both are no-ops and the launch is an ordinary one.
#pragma once
#include <cuda_runtime.h>

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

// k<<<grid, block, smem, s>>>(args...), checked; a programmatic dependent of the stream's
// previous kernel when `dependent` and the device has compute capability 9.0 or later.
template <class... P, class... A>
void launch_after(bool dependent, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  static const bool supported = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = dependent && supported ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...));
}

}  // namespace mhc::cuda
