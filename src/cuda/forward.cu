// forward.cu — the whole forward in one kernel. A block takes FT tokens and walks K
// in tiles of kTileK; x (bf16 -> f32) and phi*gamma tiles go through shared memory, and
// each thread accumulates a kRT x RJ register tile of h_mix (tokens x outputs), so every
// shared-memory load feeds several FMAs. The block then produces inv_rms, the three
// gates, and h_in (a second pass over its tokens' x). No atomics; every sum has a fixed order.
#include "cuda_check.h"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTileK = 64;                     // K per shared-memory tile
constexpr int kTokGroups = 16;                 // thread grid: kTokGroups x kOutGroups
constexpr int kOutGroups = kThreads / kTokGroups;
constexpr int kSsParts = 4;                    // threads per token in the sum of squares
constexpr int kFlush = 16;                     // tiles summed before they join the total
// Tokens per block (FT): 64 for large T (a 4-token register tile per thread, phi tiles
// reused 64 times), 16 for small T (more blocks to fill the GPU). Every token's sums run
// in the same order either way, so the choice never changes a bit.
constexpr int64_t kLargeT = 16384;

__device__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// One K tile of x (FT tokens, bf16, 16-byte vectors: needs K % 8 == 0) and of phi*gamma
// (N rows), held in registers so the next tile's global loads are in flight while the
// current tile is computed. Zero outside [T,K].
template <int FT, int N> struct TileRegs {
  static constexpr int kXVec = (FT * kTileK / 8 + kThreads - 1) / kThreads;  // uint4 per thread
  static constexpr int kP = (N * kTileK + kThreads - 1) / kThreads;          // floats per thread
  uint4 xv[kXVec];
  float pv[kP];

  __device__ void load(const FwdParams& p, int K, int64_t t0, int k0) {
#pragma unroll
    for (int q = 0; q < kXVec; ++q) {
      int e = threadIdx.x + q * kThreads, tb = e / (kTileK / 8), k = k0 + (e % (kTileK / 8)) * 8;
      xv[q] = tb < FT && t0 + tb < p.T && k < K ? *reinterpret_cast<const uint4*>(p.x + (t0 + tb) * K + k)
                                                : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < kP; ++q) {
      int e = threadIdx.x + q * kThreads, j = e / kTileK, k = k0 + e % kTileK;
      pv[q] = j < N && k < K ? p.pg[int64_t(j) * K + k] : 0.0f;
    }
  }

  __device__ void store(float (*xs)[kTileK + 1], float (*ps)[kTileK + 1]) const {
#pragma unroll
    for (int q = 0; q < kXVec; ++q) {
      int e = threadIdx.x + q * kThreads, tb = e / (kTileK / 8), kk = (e % (kTileK / 8)) * 8;
      if (tb >= FT) break;
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&xv[q]);
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[tb][kk + i] = __bfloat162float(h[i]);
    }
#pragma unroll
    for (int q = 0; q < kP; ++q) {
      int e = threadIdx.x + q * kThreads;
      if (e < N * kTileK) ps[e / kTileK][e % kTileK] = pv[q];
    }
  }
};

// The same tile straight into shared memory, element by element (any K).
template <int FT, int N>
__device__ void load_tile_direct(float (*xs)[kTileK + 1], float (*ps)[kTileK + 1], const FwdParams& p, int K,
                                 int64_t t0, int k0) {
  for (int e = threadIdx.x; e < FT * kTileK; e += kThreads) {
    int tb = e / kTileK, k = k0 + e % kTileK;
    xs[tb][e % kTileK] = t0 + tb < p.T && k < K ? __bfloat162float(p.x[(t0 + tb) * K + k]) : 0.0f;
  }
  for (int e = threadIdx.x; e < N * kTileK; e += kThreads) {
    int j = e / kTileK, k = k0 + e % kTileK;
    ps[j][e % kTileK] = k < K ? p.pg[int64_t(j) * K + k] : 0.0f;
  }
}

template <int n, int FT>
__global__ void __launch_bounds__(kThreads) forward_kernel(FwdParams p) {
  constexpr int N = n * n + 2 * n;
  constexpr int kRT = FT / kTokGroups;                    // tokens per thread: tg, tg+16, ...
  constexpr int RJ = (N + kOutGroups - 1) / kOutGroups;  // outputs per thread: jg, jg+16, ...
  __shared__ float xs[FT][kTileK + 1];
  __shared__ float ps_or_hm[N * (kTileK + 1)];  // phi*gamma tile in the K loop, then h_mix [FT][N]
  __shared__ float ss_part[FT][kSsParts];
  __shared__ float inv[FT];
  __shared__ float hp[FT][n];
  auto ps = reinterpret_cast<float(*)[kTileK + 1]>(ps_or_hm);
  auto hm = reinterpret_cast<float(*)[N]>(ps_or_hm);

  const int K = n * p.D, tid = threadIdx.x, tg = tid / kOutGroups, jg = tid % kOutGroups;
  const int64_t t0 = int64_t(blockIdx.x) * FT;
  // Sums run tile (kTileK terms) -> group (kFlush tiles) -> total, so rounding error
  // grows like the golden's blocked sums, not like one chain over K.
  float acc[kRT][RJ], grp[kRT][RJ];
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int s = 0; s < RJ; ++s) acc[r][s] = grp[r][s] = 0.0f;
  float ss = 0.0f, ss_grp = 0.0f;

  // Prefetching costs registers; at n >= 7 that cut occupancy more than it hid latency, so
  // there the tile still comes in 16-byte loads but is stored at once, holding no registers
  // through the math.
  constexpr bool kPrefetch = N <= 48;
  const bool vec = K % 8 == 0;
  TileRegs<FT, kPrefetch ? N : 1> next;
  if (vec && kPrefetch) next.load(p, K, t0, 0);
  for (int k0 = 0, tile = 1; k0 < K; k0 += kTileK, ++tile) {
    if (vec && kPrefetch) {
      next.store(xs, ps);
    } else if (vec) {
      TileRegs<FT, N> now;
      now.load(p, K, t0, k0);
      now.store(xs, ps);
    } else {
      load_tile_direct<FT, N>(xs, ps, p, K, t0, k0);
    }
    __syncthreads();
    if (vec && kPrefetch && k0 + kTileK < K) next.load(p, K, t0, k0 + kTileK);  // in flight during this tile's math
    if (tid < FT * kSsParts) {  // sum of squares: kSsParts threads per token, a fixed slice each
      int tb = tid / kSsParts, part = tid % kSsParts;
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < kTileK / kSsParts; ++q) {
        float v = xs[tb][part * (kTileK / kSsParts) + q];
        s = fmaf(v, v, s);
      }
      ss_grp += s;
    }
    float a[kRT][RJ];
#pragma unroll
    for (int r = 0; r < kRT; ++r)
#pragma unroll
      for (int s = 0; s < RJ; ++s) a[r][s] = 0.0f;
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      float xv[kRT], pv[RJ];
#pragma unroll
      for (int r = 0; r < kRT; ++r) xv[r] = xs[tg + kTokGroups * r][kk];
#pragma unroll
      for (int s = 0; s < RJ; ++s) pv[s] = ps[min(jg + kOutGroups * s, N - 1)][kk];
#pragma unroll
      for (int r = 0; r < kRT; ++r)
#pragma unroll
        for (int s = 0; s < RJ; ++s) a[r][s] = fmaf(xv[r], pv[s], a[r][s]);
    }
    const bool flush = tile % kFlush == 0 || k0 + kTileK >= K;
#pragma unroll
    for (int r = 0; r < kRT; ++r)
#pragma unroll
      for (int s = 0; s < RJ; ++s) {
        grp[r][s] += a[r][s];
        if (flush) acc[r][s] += grp[r][s], grp[r][s] = 0.0f;
      }
    if (flush) ss += ss_grp, ss_grp = 0.0f;
    __syncthreads();
  }

  if (tid < FT * kSsParts) ss_part[tid / kSsParts][tid % kSsParts] = ss;
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int s = 0; s < RJ; ++s)
      if (jg + kOutGroups * s < N) hm[tg + kTokGroups * r][jg + kOutGroups * s] = acc[r][s];
  __syncthreads();
  if (tid < FT) {
    float s = 0.0f;
    for (int q = 0; q < kSsParts; ++q) s += ss_part[tid][q];
    inv[tid] = 1.0f / sqrtf(s / float(K) + p.norm_eps);
    if (t0 + tid < p.T) p.inv_rms[t0 + tid] = inv[tid];
  }
  __syncthreads();

  for (int idx = tid; idx < FT * N; idx += kThreads) {
    int tb = idx / N, j = idx % N;
    int64_t t = t0 + tb;
    if (t >= p.T) continue;
    float h = hm[tb][j];
    p.h_mix[t * N + j] = h;
    float tt = h * inv[tb];
    if (j < n) {
      float v = sigmoid(p.alpha[0] * tt + p.bias[j]) + p.hc_eps;
      p.h_pre[t * n + j] = v;
      hp[tb][j] = v;
    } else if (j < 2 * n) {
      p.h_post[t * n + j - n] = 2.0f * sigmoid(p.alpha[1] * tt + p.bias[j]);
    } else {
      p.h_res[t * n * n + j - 2 * n] = p.alpha[2] * tt + p.bias[j];
    }
  }
  __syncthreads();

  // h_in: (token, d) pairs spread over the block, so small D keeps every thread busy
  for (int64_t e = tid; e < int64_t(FT) * p.D; e += kThreads) {
    int tb = int(e / p.D), d = int(e % p.D);
    int64_t t = t0 + tb;
    if (t >= p.T) break;
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < n; ++i) a = fmaf(hp[tb][i], __bfloat162float(p.x[t * K + i * p.D + d]), a);
    p.h_in[t * p.D + d] = __float2bfloat16_rn(a);
  }
}

template <int n> void launch(const FwdParams& p, cudaStream_t s) {
  if (p.T >= kLargeT) {
    forward_kernel<n, 64><<<unsigned((p.T + 63) / 64), kThreads, 0, s>>>(p);
  } else {
    forward_kernel<n, 16><<<unsigned((p.T + 15) / 16), kThreads, 0, s>>>(p);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_forward(const FwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
