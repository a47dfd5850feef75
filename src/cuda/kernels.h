// kernels.h — device-side parameter structs and kernel launchers of the CUDA backend.
// All pointers are device pointers; token tensors are flattened to [T, ...].
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <stdexcept>
#include <type_traits>

namespace mhc::cuda {

// Blocks (or tiles) of size b that cover a: launch arithmetic.
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

struct FwdParams {
  const __nv_bfloat16* x;  // [T,K]
  const float* pg;         // [N,K] phi with gamma folded in (phi[j,k] * gamma[k])
  const float* alpha;      // [3]
  const float* bias;       // [N]
  float* inv_rms;          // [T]
  float* h_mix;            // [T,N]
  float* h_pre;            // [T,n]
  float* h_post;           // [T,n]
  float* h_res;            // [T,n,n]
  __nv_bfloat16* h_in;     // [T,D]
  float* scratch;          // forward_scratch_floats(T, n, D): phi*gamma as bf16 planes, partial sums over groups of K
  int64_t T;
  int n, D;
  float norm_eps, hc_eps;
};

struct BwdParams {
  const __nv_bfloat16* x;      // [T,K]
  const __nv_bfloat16* dh_in;  // [T,D]
  const float* dh_post;        // [T,n]
  const float* dh_res;         // [T,n*n]
  const float* phi;            // [N,K]
  const float* gamma;          // [K]
  const float* alpha;          // [3]
  const float* bias;           // [N]
  const float* inv_rms;        // [T]
  const float* h_mix;          // [T,N]
  const float* h_pre;          // [T,n]
  const float* h_post;         // [T,n]
  float* dh_pre;               // [T,n]
  float* dh_mix;               // [T,N]
  float* dinv_rms;             // [T]
  float* dvecX;                // [T,K], or nullptr when not dumped
  __nv_bfloat16* dx;           // [T,K]
  float* g_tok;                // [T,N]  per-token gate gradients (dbias terms)
  float* a_tok;                // [T,3]  per-token dalpha terms
  float* partial;              // [splits,N,K] partial sums over token splits (unused with one split)
  float* dphi;                 // [N,K]
  float* dalpha;               // [3]
  float* dbias;                // [N]
  float* dgamma;               // [K]
  int64_t T;
  int n, D, splits;
  float hc_eps, pre_low, gate_high;  // g_pre's s from z where s < pre_low or 1 - s < gate_high, g_post's
                                     // where 1 - h_post/2 < gate_high (kPreLow, kGateHigh)
};

// Floats of FwdParams::scratch for a shape: the bf16 planes of phi*gamma and the forward's
// partial sums over its groups of K.
int64_t forward_scratch_floats(int64_t T, int n, int D);

// Number of token splits of the dphi/dgamma reduction: a function of the shape only,
// so results are the same bits on every device.
int token_splits(int64_t T, int64_t K);

// Kernels are compiled once per n (register arrays need it): calls f(integral_constant<n>).
template <class F> void dispatch_n(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
  }
  throw std::logic_error("n out of range 1..8");
}

void launch_forward(const FwdParams& p, cudaStream_t s);
void launch_backward(const BwdParams& p, cudaStream_t s);

}  // namespace mhc::cuda
