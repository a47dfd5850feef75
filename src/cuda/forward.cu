// forward.cu — the forward in two kernels, K split over blocks so that any T fills the GPU:
//   mix_partial  a block per (FT tokens, K slice): the slice's partial h_mix = x·(phi*gamma)
//                and sums of squares of x. x (bf16 -> f32) and phi*gamma tiles of kTileK
//                columns go through shared memory; each thread keeps a kRT x RJ register
//                tile of h_mix (tokens x outputs), so every shared-memory load feeds several FMAs
//   mix_finish   a block per kFinTok tokens: the partials summed over slices, inv_rms, the
//                three gates, and h_in (a second read of the tokens' x)
// No atomics. Every sum runs in one order that depends on K alone: tile (kTileK terms, one
// chain) -> group (kFlush tiles) -> total. A slice is one tile or one whole group and the
// finish kernel continues that order, so neither the slicing nor the token tile FT (both
// chosen from the shape) changes a bit.
#include "cuda_check.h"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTileK = 64;                     // K per shared-memory tile
constexpr int kTokGroups = 16;                 // thread grid of mix_partial: kTokGroups x kOutGroups
constexpr int kOutGroups = kThreads / kTokGroups;
constexpr int kSsParts = 4;                    // threads per token in the sum of squares
constexpr int kFlush = 16;                     // tiles summed before they join the total
constexpr int kFinTok = 4;                     // tokens per mix_finish block
static_assert(kTokGroups * kOutGroups == kThreads, "the register-tile grid covers the block");
static_assert(kTileK % kSsParts == 0 && kTileK % 8 == 0, "sum-of-squares slices and 16-byte x loads per tile");

// How the forward splits a shape. Slices of one group (kFlush tiles) keep the partials small;
// slices of one tile give small T enough blocks. FT = 64 reuses each phi tile 64 times (a
// 4-token register tile per thread); FT = 16 makes more blocks.
struct Plan {
  int ft, slice_tiles, slices;
};
Plan plan(int64_t T, int K) {
  const int groups = int(ceil_div(K, kTileK * kFlush));
  if (ceil_div(T, 64) * groups >= 512) return {64, kFlush, groups};
  if (ceil_div(T, 16) * groups >= 256) return {16, kFlush, groups};
  return {16, 1, int(ceil_div(K, kTileK))};
}

__device__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// One K tile of x (FT tokens, bf16, 16-byte vectors: needs K % 8 == 0) and of phi*gamma
// (N rows), held in registers so the next tile's global loads are in flight while the
// current tile is computed. Zero outside [T,K].
template <int FT, int N> struct TileRegs {
  static constexpr int kXVec = ceil_div(FT * kTileK / 8, kThreads);  // uint4 per thread
  static constexpr int kP = ceil_div(N * kTileK, kThreads);          // floats per thread
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

// Block b takes token tile b % tiles and K slice b / tiles (one grid dimension: any count fits).
// part [slices,T,N]: h_mix over each slice; part_ss [slices,T,kSsParts]: the sums of squares
// of x over each slice, one per quarter of every tile.
template <int n, int FT>
__global__ void __launch_bounds__(kThreads) mix_partial(FwdParams p, int slice_tiles, float* part, float* part_ss) {
  constexpr int N = n * n + 2 * n;
  constexpr int kRT = FT / kTokGroups;             // tokens per thread: tg, tg+16, ...
  constexpr int RJ = ceil_div(N, kOutGroups);      // outputs per thread: jg, jg+16, ...
  static_assert(FT % kTokGroups == 0 && FT * kSsParts <= kThreads, "token tile vs thread grid");
  __shared__ float xs[FT][kTileK + 1];
  __shared__ float ps[N][kTileK + 1];

  const int K = n * p.D, tid = threadIdx.x, tg = tid / kOutGroups, jg = tid % kOutGroups;
  const int64_t tiles = ceil_div(p.T, FT), t0 = blockIdx.x % tiles * FT;
  const int slice = int(blockIdx.x / tiles), kbeg = slice * slice_tiles * kTileK, kend = min(K, kbeg + slice_tiles * kTileK);
  float grp[kRT][RJ];
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int s = 0; s < RJ; ++s) grp[r][s] = 0.0f;
  float ss_grp = 0.0f;

  // Prefetching costs registers; at n >= 7 that cut occupancy more than it hid latency, so
  // there the tile still comes in 16-byte loads but is stored at once, holding no registers
  // through the math.
  constexpr bool kPrefetch = N <= 48;
  const bool vec = K % 8 == 0;
  TileRegs<FT, kPrefetch ? N : 1> next;
  if (vec && kPrefetch) next.load(p, K, t0, kbeg);
  for (int k0 = kbeg; k0 < kend; k0 += kTileK) {
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
    if (vec && kPrefetch && k0 + kTileK < kend) next.load(p, K, t0, k0 + kTileK);  // in flight during this tile's math
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
#pragma unroll
    for (int r = 0; r < kRT; ++r)
#pragma unroll
      for (int s = 0; s < RJ; ++s) grp[r][s] += a[r][s];
    __syncthreads();
  }

  const int64_t base = int64_t(slice) * p.T;
#pragma unroll
  for (int r = 0; r < kRT; ++r) {
    const int64_t t = t0 + tg + kTokGroups * r;
#pragma unroll
    for (int s = 0; s < RJ; ++s)
      if (t < p.T && jg + kOutGroups * s < N) part[(base + t) * N + jg + kOutGroups * s] = grp[r][s];
  }
  if (tid < FT * kSsParts && t0 + tid / kSsParts < p.T) part_ss[(base + t0) * kSsParts + tid] = ss_grp;
}

template <int n>
__global__ void __launch_bounds__(kThreads) mix_finish(FwdParams p, int slice_tiles, int slices, const float* part,
                                                       const float* part_ss) {
  constexpr int N = n * n + 2 * n;
  __shared__ float hm[kFinTok][N];
  __shared__ float ssq[kFinTok][kSsParts];
  __shared__ float inv[kFinTok];
  __shared__ float hp[kFinTok][n];
  const int K = n * p.D, tid = threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.x) * kFinTok;

  // Each (token, output) over the slices: a group's tiles chain, then groups join the total.
  for (int e = tid; e < kFinTok * (N + kSsParts); e += kThreads) {
    const int tb = e / (N + kSsParts), c = e % (N + kSsParts);
    const int64_t t = t0 + tb;
    if (t >= p.T) continue;
    const float* src = c < N ? part + t * N + c : part_ss + t * kSsParts + (c - N);
    const int64_t stride = p.T * (c < N ? N : kSsParts);
    float acc = 0.0f, grp = 0.0f;
#pragma unroll 8
    for (int s = 0; s < slices; ++s) {
      grp += src[s * stride];
      if ((s + 1) * slice_tiles % kFlush == 0 || s == slices - 1) acc += grp, grp = 0.0f;
    }
    (c < N ? hm[tb][c] : ssq[tb][c - N]) = acc;
  }
  __syncthreads();
  if (tid < kFinTok && t0 + tid < p.T) {
    float s = 0.0f;
    for (int q = 0; q < kSsParts; ++q) s += ssq[tid][q];
    inv[tid] = 1.0f / sqrtf(s / float(K) + p.norm_eps);
    p.inv_rms[t0 + tid] = inv[tid];
  }
  __syncthreads();

  for (int idx = tid; idx < kFinTok * N; idx += kThreads) {
    int tb = idx / N, j = idx % N;
    int64_t t = t0 + tb;
    if (t >= p.T) break;
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

  // h_in: (token, d) pairs spread over the block; 8 columns a thread in 16-byte accesses when D allows
  if (p.D % 8 == 0) {
    const int D8 = p.D / 8;
    for (int e = tid; e < kFinTok * D8; e += kThreads) {
      const int tb = e / D8, d = (e % D8) * 8;
      const int64_t t = t0 + tb;
      if (t >= p.T) break;
      float a[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) a[q] = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        uint4 raw = *reinterpret_cast<const uint4*>(p.x + t * K + i * p.D + d);
        const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
        for (int q = 0; q < 8; ++q) a[q] = fmaf(hp[tb][i], __bfloat162float(h[q]), a[q]);
      }
      __align__(16) __nv_bfloat16 o[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) o[q] = __float2bfloat16_rn(a[q]);
      *reinterpret_cast<uint4*>(p.h_in + t * p.D + d) = *reinterpret_cast<const uint4*>(o);
    }
  } else {
    for (int64_t e = tid; e < int64_t(kFinTok) * p.D; e += kThreads) {
      int tb = int(e / p.D), d = int(e % p.D);
      int64_t t = t0 + tb;
      if (t >= p.T) break;
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) a = fmaf(hp[tb][i], __bfloat162float(p.x[t * K + i * p.D + d]), a);
      p.h_in[t * p.D + d] = __float2bfloat16_rn(a);
    }
  }
}

template <int n> void launch(const FwdParams& p, cudaStream_t s) {
  constexpr int N = n * n + 2 * n;
  const Plan pl = plan(p.T, n * p.D);
  float* part = p.scratch;
  float* part_ss = p.scratch + int64_t(pl.slices) * p.T * N;
  const unsigned grid = unsigned(ceil_div(p.T, pl.ft) * pl.slices);
  if (pl.ft == 64) {
    mix_partial<n, 64><<<grid, kThreads, 0, s>>>(p, pl.slice_tiles, part, part_ss);
  } else {
    mix_partial<n, 16><<<grid, kThreads, 0, s>>>(p, pl.slice_tiles, part, part_ss);
  }
  CUDA_CHECK(cudaGetLastError());
  mix_finish<n><<<unsigned(ceil_div(p.T, kFinTok)), kThreads, 0, s>>>(p, pl.slice_tiles, pl.slices, part, part_ss);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t forward_scratch_floats(int64_t T, int n, int D) {
  return int64_t(plan(T, n * D).slices) * T * (n * n + 2 * n + kSsParts);
}

void launch_forward(const FwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
