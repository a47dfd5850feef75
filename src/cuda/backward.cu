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
constexpr int kWarps = kThreads / 32;
constexpr int kDxTok = 4 * kWarps;  // tokens per dx block: 4 per warp
constexpr int kColTile = 256;       // columns of K per dx / param_partial block: 8 per lane
constexpr int kChunk = 32;          // tokens staged in shared memory per param_partial step
constexpr int kSplitTok = 128;      // tokens per split at least
static_assert((kThreads & (kThreads - 1)) == 0, "block_sum halves the block");
static_assert(kColTile == 2 * 4 * 32, "tile_col: a lane owns 4 columns in each 128-column half");
static_assert(kDxTok <= kThreads, "dx_kernel: one thread per token loads coef");

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

// Column tiles: a dx or param block covers kColTile columns of K; lane cg (0..31) of a
// warp owns columns 4cg..4cg+3 and 128+4cg..128+4cg+3 of the tile, so the warp's float4
// shared-memory reads and its 8-byte global accesses are contiguous.
__device__ int tile_col(int cg, int c) { return c < 4 ? 4 * cg + c : 128 + 4 * cg + c - 4; }

// 4 consecutive bf16 values as floats, one 8-byte load (src 8-byte aligned).
__device__ void load4(const __nv_bfloat16* __restrict__ src, float* out) {
  uint2 raw = *reinterpret_cast<const uint2*>(src);
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) out[q] = __bfloat162float(h[q]);
}

// dvecX = dh_mix·phi as a (4 tokens x 8 columns) register tile per thread: phi tile [N][256]
// and dh_mix^T [N][32] in shared memory, then dx, with every token's loads issued up front.
template <int n>
__global__ void __launch_bounds__(kThreads) dx_kernel(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  extern __shared__ __align__(16) float dyn[];
  auto phis = reinterpret_cast<float(*)[kColTile]>(dyn);                // [N][kColTile]
  auto dhmT = reinterpret_cast<float(*)[kDxTok]>(dyn + N * kColTile);   // [N][kDxTok]
  __shared__ float coef[kDxTok];
  __shared__ float hp[kDxTok][n];
  const __nv_bfloat16* __restrict__ x = p.x;
  const __nv_bfloat16* __restrict__ dh_in = p.dh_in;
  __nv_bfloat16* __restrict__ dx = p.dx;
  float* __restrict__ dvecX = p.dvecX;
  const int K = n * p.D, D = p.D, cg = threadIdx.x % 32, tg = threadIdx.x / 32;
  const int kbase = blockIdx.x * kColTile;
  const int64_t t0 = int64_t(blockIdx.y) * kDxTok;
  for (int e = threadIdx.x; e < N * kColTile; e += kThreads) {
    int j = e / kColTile, c = e % kColTile;
    phis[j][c] = kbase + c < K ? p.phi[int64_t(j) * K + kbase + c] : 0.0f;
  }
  for (int e = threadIdx.x; e < kDxTok * N; e += kThreads) {
    int64_t t = t0 + e / N;
    dhmT[e % N][e / N] = t < p.T ? p.dh_mix[t * N + e % N] : 0.0f;
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

  float acc[4][8];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;
  for (int j = 0; j < N; ++j) {  // j in order, as the golden's dot product
    float4 d = *reinterpret_cast<const float4*>(&dhmT[j][4 * tg]);
    float4 pa = *reinterpret_cast<const float4*>(&phis[j][4 * cg]);
    float4 pb = *reinterpret_cast<const float4*>(&phis[j][128 + 4 * cg]);
    const float dr[4] = {d.x, d.y, d.z, d.w}, pc[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(dr[r], pc[c], acc[r][c]);
  }

  float gam[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    int k = kbase + tile_col(cg, c);
    gam[c] = k < K ? p.gamma[k] : 0.0f;
  }
  const bool vec = D % 4 == 0;  // 4 consecutive columns stay in one stream, 8-byte aligned
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int tt = 4 * tg + r;
    const int64_t t = t0 + tt;
    if (t >= p.T) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k4 = kbase + 128 * h + 4 * cg;
      float* a = &acc[r][4 * h];
      if (vec) {
        if (k4 >= K) continue;
        const int i = k4 / D, d = k4 % D;
        float xv[4], gv[4];
        load4(x + t * K + k4, xv);
        load4(dh_in + t * D + d, gv);
        __align__(8) __nv_bfloat16 o[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) o[q] = __float2bfloat16_rn(a[q] * gam[4 * h + q] - coef[tt] * xv[q] + hp[tt][i] * gv[q]);
        *reinterpret_cast<uint2*>(dx + t * K + k4) = *reinterpret_cast<const uint2*>(o);
        if (dvecX) *reinterpret_cast<float4*>(dvecX + t * K + k4) = make_float4(a[0], a[1], a[2], a[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int k = k4 + q;
          if (k >= K) break;
          const int i = k / D, d = k % D;
          float v = __bfloat162float(x[t * K + k]), gi = __bfloat162float(dh_in[t * D + d]);
          dx[t * K + k] = __float2bfloat16_rn(a[q] * gam[4 * h + q] - coef[tt] * v + hp[tt][i] * gi);
          if (dvecX) dvecX[t * K + k] = a[q];
        }
      }
    }
  }
}

// P[j,k] = sum over the block's token split of dh_mix[t,j] x[t,k]: an (RJ outputs x 8
// columns) register tile per thread, x staged as float in shared memory kChunk tokens at
// a time; a chunk's partial sums are added to the total (error grows with chunks).
template <int n>
__global__ void __launch_bounds__(kThreads) param_partial(BwdParams p) {
  constexpr int N = n * n + 2 * n, RJ = ceil_div(N, kWarps);  // outputs per thread: jg, jg+8, ... (jg: the warp)
  __shared__ __align__(16) float xs[kChunk][kColTile];
  __shared__ float dhm[kChunk][N];
  const __nv_bfloat16* __restrict__ x = p.x;
  const int K = n * p.D, cg = threadIdx.x % 32, jg = threadIdx.x / 32;
  const int kbase = blockIdx.x * kColTile;
  const int64_t per = ceil_div(p.T, p.splits);
  const int64_t ta = int64_t(blockIdx.y) * per, tb = min(p.T, ta + per);
  float acc[RJ][8];
#pragma unroll
  for (int s = 0; s < RJ; ++s)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[s][c] = 0.0f;
  for (int64_t c0 = ta; c0 < tb; c0 += kChunk) {
    const int rows = tb - c0 < kChunk ? int(tb - c0) : kChunk;
    __syncthreads();
    for (int e = threadIdx.x; e < rows * N; e += kThreads) dhm[e / N][e % N] = p.dh_mix[(c0 + e / N) * N + e % N];
    if (K % 8 == 0) {
      for (int e = threadIdx.x; e < rows * (kColTile / 8); e += kThreads) {
        const int tt = e / (kColTile / 8), c8 = (e % (kColTile / 8)) * 8, k = kbase + c8;
        if (k < K) {
          uint4 raw = *reinterpret_cast<const uint4*>(x + (c0 + tt) * K + k);
          const __nv_bfloat16* hv = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
          for (int q = 0; q < 8; ++q) xs[tt][c8 + q] = __bfloat162float(hv[q]);
        } else {
#pragma unroll
          for (int q = 0; q < 8; ++q) xs[tt][c8 + q] = 0.0f;
        }
      }
    } else {
      for (int e = threadIdx.x; e < rows * kColTile; e += kThreads) {
        const int tt = e / kColTile, c = e % kColTile, k = kbase + c;
        xs[tt][c] = k < K ? __bfloat162float(x[(c0 + tt) * K + k]) : 0.0f;
      }
    }
    __syncthreads();
    float part[RJ][8];
#pragma unroll
    for (int s = 0; s < RJ; ++s)
#pragma unroll
      for (int c = 0; c < 8; ++c) part[s][c] = 0.0f;
    for (int r = 0; r < rows; ++r) {
      float4 xa = *reinterpret_cast<const float4*>(&xs[r][4 * cg]);
      float4 xb = *reinterpret_cast<const float4*>(&xs[r][128 + 4 * cg]);
      const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int s = 0; s < RJ; ++s) {
        const float d = dhm[r][min(jg + kWarps * s, N - 1)];
#pragma unroll
        for (int c = 0; c < 8; ++c) part[s][c] = fmaf(d, xv[c], part[s][c]);
      }
    }
#pragma unroll
    for (int s = 0; s < RJ; ++s)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[s][c] += part[s][c];
  }
#pragma unroll
  for (int s = 0; s < RJ; ++s) {
    const int j = jg + kWarps * s;
    if (j >= N) break;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int k = kbase + tile_col(cg, c);
      if (k < K) p.partial[(int64_t(blockIdx.y) * N + j) * K + k] = acc[s][c];
    }
  }
}

// Per column k: P[j,k] summed over the splits in order, then dphi and dgamma. The N sums of
// one split are independent loads, all in flight at once.
template <int n>
__global__ void __launch_bounds__(kThreads) param_final(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  const int K = n * p.D;
  const int k = blockIdx.x * kThreads + threadIdx.x;
  if (k >= K) return;
  const float* __restrict__ partial = p.partial;
  const float* __restrict__ phi = p.phi;
  float s[N];
#pragma unroll
  for (int j = 0; j < N; ++j) s[j] = 0.0f;
  for (int q = 0; q < p.splits; ++q)
#pragma unroll
    for (int j = 0; j < N; ++j) s[j] += partial[(int64_t(q) * N + j) * K + k];
  const float g = p.gamma[k];
  float dg = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    p.dphi[int64_t(j) * K + k] = s[j] * g;
    dg = fmaf(phi[int64_t(j) * K + k], s[j], dg);
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
  const unsigned ktiles = unsigned(ceil_div(K, kThreads)), ctiles = unsigned(ceil_div(K, kColTile));
  const size_t dx_smem = size_t(N) * (kColTile + kDxTok) * sizeof(float);  // up to 92 KB at n = 8
  CUDA_CHECK(cudaFuncSetAttribute(dx_kernel<n>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dx_smem)));
  token_grads<n><<<unsigned(p.T), kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  dx_kernel<n><<<dim3(ctiles, unsigned(ceil_div(p.T, kDxTok))), kThreads, dx_smem, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  param_partial<n><<<dim3(ctiles, unsigned(p.splits)), kThreads, 0, s>>>(p);
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
  int64_t ktiles = ceil_div(K, kColTile);
  int64_t want = std::max<int64_t>(1, 1024 / ktiles);  // about 1024 blocks in all
  int64_t most = std::max<int64_t>(1, T / kSplitTok);
  return int(std::min(want, most));
}

void launch_backward(const BwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
