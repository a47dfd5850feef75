// backward.cu — the backward in five kernels, no atomics, every sum in a fixed order:
//   token_grads   one block per token: dh_pre, the gate gradients, dh_mix, dinv_rms,
//                 and the per-token terms of dalpha and dbias
//   dx_kernel     a block per (K tile, kDxTok tokens): dvecX = dh_mix·phi and dx
//   param_partial a block per (K tile, token split): P = sum_t dh_mix^T x over the split
//   param_final   per column k: P summed over splits in order; dphi = P*gamma,
//                 dgamma = sum_j phi[j,k] P[j,k] (= sum_t x * dvecX)
//   reduce_cols   dalpha and dbias: per-token terms summed by a fixed tree
#include "cuda_check.h"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kDxTok = 32;      // tokens per dx block (phi column reused across them)
constexpr int kChunk = 32;      // dh_mix rows staged in shared memory per step
constexpr int kSplitTok = 128;  // tokens per split at least

// Rows of dh_mix in shared memory are padded to a multiple of 4 floats so the inner loops
// read them as float4: one shared-memory load feeds four FMAs.
template <int N> __host__ __device__ constexpr int padded() { return (N + 3) / 4 * 4; }

// sum_j row[j] * w[j] + init, j in order, row read as float4 (row is 16-byte aligned, padded).
template <int N> __device__ float dot_row(const float* row, const float (&w)[N], float init) {
  float a = init;
#pragma unroll
  for (int j0 = 0; j0 < N; j0 += 4) {
    float4 q = *reinterpret_cast<const float4*>(row + j0);
    a = fmaf(q.x, w[j0], a);
    if (j0 + 1 < N) a = fmaf(q.y, w[j0 + 1], a);
    if (j0 + 2 < N) a = fmaf(q.z, w[j0 + 2], a);
    if (j0 + 3 < N) a = fmaf(q.w, w[j0 + 3], a);
  }
  return a;
}

// Fixed-order tree sum over the block of one value per thread; result valid in thread 0.
__device__ float block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

template <int n>
__global__ void __launch_bounds__(kThreads) token_grads(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  __shared__ float red[kThreads];
  __shared__ float g[N];
  __shared__ float dhp[n];
  const int64_t t = blockIdx.x;
  const int K = n * p.D;
  float part[n];
#pragma unroll
  for (int i = 0; i < n; ++i) part[i] = 0.0f;
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    float gi = __bfloat162float(p.dh_in[t * p.D + d]);
#pragma unroll
    for (int i = 0; i < n; ++i) part[i] = fmaf(gi, __bfloat162float(p.x[t * K + i * p.D + d]), part[i]);
  }
#pragma unroll
  for (int i = 0; i < n; ++i) {
    float s = block_sum(part[i], red);
    if (threadIdx.x == 0) dhp[i] = s;
  }
  __syncthreads();
  const float ir = p.inv_rms[t];
  for (int j = threadIdx.x; j < N; j += kThreads) {
    float gj;
    if (j < n) {
      float s = p.h_pre[t * n + j] - p.hc_eps;
      gj = dhp[j] * s * (1.0f - s);
      p.dh_pre[t * n + j] = dhp[j];
    } else if (j < 2 * n) {
      float h = p.h_post[t * n + j - n];
      gj = p.dh_post[t * n + j - n] * h * (1.0f - h / 2.0f);
    } else {
      gj = p.dh_res[t * n * n + j - 2 * n];
    }
    g[j] = gj;
    p.g_tok[t * N + j] = gj;
    p.dh_mix[t * N + j] = p.alpha[j < n ? 0 : j < 2 * n ? 1 : 2] * gj * ir;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // N <= 80 terms: sequential, in the CPU golden's order
    float dinv = 0.0f, a[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < N; ++j) {
      int grp = j < n ? 0 : j < 2 * n ? 1 : 2;
      float h = p.h_mix[t * N + j];
      dinv += p.alpha[grp] * g[j] * h;
      a[grp] += g[j] * h * ir;
    }
    p.dinv_rms[t] = dinv;
    for (int q = 0; q < 3; ++q) p.a_tok[t * 3 + q] = a[q];
  }
}

template <int n>
__global__ void __launch_bounds__(kThreads) dx_kernel(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  __shared__ __align__(16) float dhm[kDxTok][padded<N>()];
  __shared__ float coef[kDxTok];
  __shared__ float hp[kDxTok][n];
  const int K = n * p.D;
  const int k = blockIdx.x * kThreads + threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.y) * kDxTok;
  for (int e = threadIdx.x; e < kDxTok * N; e += kThreads) {
    int64_t t = t0 + e / N;
    dhm[e / N][e % N] = t < p.T ? p.dh_mix[t * N + e % N] : 0.0f;
  }
  for (int e = threadIdx.x; e < kDxTok * n; e += kThreads) {
    int64_t t = t0 + e / n;
    hp[e / n][e % n] = t < p.T ? p.h_pre[t * n + e % n] : 0.0f;
  }
  if (threadIdx.x < kDxTok) {
    int64_t t = t0 + threadIdx.x;
    float ir = t < p.T ? p.inv_rms[t] : 0.0f;
    coef[threadIdx.x] = t < p.T ? p.dinv_rms[t] * ir * ir * ir / float(K) : 0.0f;
  }
  __syncthreads();
  if (k >= K) return;
  float ph[N];
#pragma unroll
  for (int j = 0; j < N; ++j) ph[j] = p.phi[int64_t(j) * K + k];
  const float gk = p.gamma[k];
  const int i = k / p.D, d = k % p.D;
  for (int tb = 0; tb < kDxTok; ++tb) {
    int64_t t = t0 + tb;
    if (t >= p.T) break;
    float dv = dot_row<N>(dhm[tb], ph, 0.0f);
    if (p.dvecX) p.dvecX[t * K + k] = dv;
    float v = __bfloat162float(p.x[t * K + k]);
    float gi = __bfloat162float(p.dh_in[t * p.D + d]);
    p.dx[t * K + k] = __float2bfloat16_rn(dv * gk - coef[tb] * v + hp[tb][i] * gi);
  }
}

template <int n>
__global__ void __launch_bounds__(kThreads) param_partial(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  __shared__ __align__(16) float dhm[kChunk][padded<N>()];
  const int K = n * p.D;
  const int k = blockIdx.x * kThreads + threadIdx.x;
  const int64_t per = (p.T + p.splits - 1) / p.splits;
  const int64_t ta = int64_t(blockIdx.y) * per, tb = min(p.T, ta + per);
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.0f;
  for (int64_t c0 = ta; c0 < tb; c0 += kChunk) {
    int rows = tb - c0 < kChunk ? int(tb - c0) : kChunk;
    __syncthreads();
    for (int e = threadIdx.x; e < rows * N; e += kThreads) dhm[e / N][e % N] = p.dh_mix[(c0 + e / N) * N + e % N];
    __syncthreads();
    if (k < K) {  // a chunk's partial sums, then added: error grows with chunks, not tokens
      float part[N];
#pragma unroll
      for (int j = 0; j < N; ++j) part[j] = 0.0f;
      for (int r = 0; r < rows; ++r) {
        float v = __bfloat162float(p.x[(c0 + r) * K + k]);
#pragma unroll
        for (int j0 = 0; j0 < N; j0 += 4) {
          float4 q = *reinterpret_cast<const float4*>(&dhm[r][j0]);
          part[j0] = fmaf(q.x, v, part[j0]);
          if (j0 + 1 < N) part[j0 + 1] = fmaf(q.y, v, part[j0 + 1]);
          if (j0 + 2 < N) part[j0 + 2] = fmaf(q.z, v, part[j0 + 2]);
          if (j0 + 3 < N) part[j0 + 3] = fmaf(q.w, v, part[j0 + 3]);
        }
      }
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += part[j];
    }
  }
  if (k < K)
#pragma unroll
    for (int j = 0; j < N; ++j) p.partial[(int64_t(blockIdx.y) * N + j) * K + k] = acc[j];
}

template <int n>
__global__ void __launch_bounds__(kThreads) param_final(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  const int K = n * p.D;
  const int k = blockIdx.x * kThreads + threadIdx.x;
  if (k >= K) return;
  float dg = 0.0f;
  for (int j = 0; j < N; ++j) {
    float s = 0.0f;
    for (int q = 0; q < p.splits; ++q) s += p.partial[(int64_t(q) * N + j) * K + k];
    p.dphi[int64_t(j) * K + k] = s * p.gamma[k];
    dg = fmaf(p.phi[int64_t(j) * K + k], s, dg);
  }
  p.dgamma[k] = dg;
}

// out[c] = sum_t in[t*C + c], one block per column, a fixed tree.
__global__ void __launch_bounds__(kThreads) reduce_cols(const float* in, int64_t T, int C, float* out) {
  __shared__ float red[kThreads];
  const int c = blockIdx.x;
  float s = 0.0f;
  for (int64_t t = threadIdx.x; t < T; t += kThreads) s += in[t * C + c];
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[c] = s;
}

template <int n> void launch(const BwdParams& p, cudaStream_t s) {
  constexpr int N = n * n + 2 * n;
  const int K = n * p.D;
  const unsigned ktiles = unsigned((K + kThreads - 1) / kThreads);
  token_grads<n><<<unsigned(p.T), kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  dx_kernel<n><<<dim3(ktiles, unsigned((p.T + kDxTok - 1) / kDxTok)), kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  param_partial<n><<<dim3(ktiles, unsigned(p.splits)), kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  param_final<n><<<ktiles, kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  reduce_cols<<<3, kThreads, 0, s>>>(p.a_tok, p.T, 3, p.dalpha);
  CUDA_CHECK(cudaGetLastError());
  reduce_cols<<<N, kThreads, 0, s>>>(p.g_tok, p.T, N, p.dbias);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int token_splits(int64_t T, int64_t K) {
  int64_t ktiles = (K + kThreads - 1) / kThreads;
  int64_t want = std::max<int64_t>(1, 1024 / ktiles);  // about 1024 blocks in all
  int64_t most = std::max<int64_t>(1, T / kSplitTok);
  return int(std::min(want, most));
}

void launch_backward(const BwdParams& p, cudaStream_t s) {
  switch (p.n) {
    case 1: return launch<1>(p, s);
    case 2: return launch<2>(p, s);
    case 3: return launch<3>(p, s);
    case 4: return launch<4>(p, s);
    case 5: return launch<5>(p, s);
    case 6: return launch<6>(p, s);
    case 7: return launch<7>(p, s);
    case 8: return launch<8>(p, s);
  }
  throw std::logic_error("launch_backward: n out of range");
}

}  // namespace mhc::cuda
