// cuda_check.h — the one check for CUDA calls and kernel launches.
//
//   CUDA_CHECK(cudaMalloc(&p, bytes));
//   kernel<<<grid, block>>>(...); CUDA_CHECK(cudaGetLastError());
//
// A failure throws std::runtime_error naming the call, file and line, and CUDA's message.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mhc {
inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + call + " at " + file + ":" + std::to_string(line) +
                             ": " + cudaGetErrorString(err));
}
}  // namespace mhc

#define CUDA_CHECK(call) ::mhc::cuda_check((call), #call, __FILE__, __LINE__)
