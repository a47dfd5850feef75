// cuda_check.h — the one check for CUDA calls and kernel launches.
//
//   CUDA_CHECK(cudaMalloc(&p, bytes));
//   kernel<<<grid, block>>>(...); CUDA_CHECK(cudaGetLastError());
//
// A failure throws, naming the call, file and line, and CUDA's message: out of device memory
// is a CudaOutOfMemory (a UserError: one line, exit 2; a case too large for the device is not
// a bug), anything else a std::runtime_error (an internal error, exit 3).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "error.h"

namespace mhc {

struct CudaOutOfMemory : UserError {
  using UserError::UserError;
};

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::string where = std::string(call) + " at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorString(err);
  // A failed API call's error (not sticky) is kept as the last error: cleared here, or the next
  // launch's CUDA_CHECK(cudaGetLastError()) would report it again, for another case of the same
  // process (mhc check runs many). A sticky error (a kernel fault) stays, as it must.
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation) throw CudaOutOfMemory("CUDA out of device memory in " + where);
  throw std::runtime_error("CUDA error in " + where);
}

}  // namespace mhc

#define CUDA_CHECK(call) ::mhc::cuda_check((call), #call, __FILE__, __LINE__)
