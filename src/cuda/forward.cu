// forward.cu — the forward in three kernels, K split over blocks so that any T fills the GPU:
//   split_pg     phi*gamma (N x K, fp32) as three bf16 planes hi + mid + lo whose sum is the
//                fp32 value (24 significand bits = 3 x 8), padded with zeros to whole tiles
//   mix_partial  a block per (up to 256 tokens, K slice): the slice's partial h_mix = x·(phi*gamma)
//                on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) and the sums of
//                squares of x. x is exact in bf16 and so is every product x·plane, so the only
//                roundings are those of fp32 sums (inside the mma possibly toward zero,
//                but each chain there is 12 steps from zero). Each warp owns 16 or 32 tokens
//                and loads its fragments straight from global memory (no shared memory)
//   mix_finish   a block per kFinTok tokens: the partials summed over slices, inv_rms, the
//                three gates, and h_in (a second read of the tokens' x)
// No atomics. Every sum runs in one order that depends on K alone: chunk (kChunk columns:
// 4 mma steps x 3 planes from zero) -> group (kFlush chunks, one chain) -> total. A slice is one
// chunk or one whole group and the finish kernel continues that order, so
// neither the slicing nor the token tiling (both chosen from the shape) changes a bit.
//
// The mma fragments use a permutation of k inside each chunk: lane (g, tig) holds, for each of
// the 4 k-steps s, the logical columns {2tig, 2tig+1, 2tig+8, 2tig+9} at the physical columns
// 16 tig + 4 s + {0,1,2,3}. A dot product over a chunk does not depend on how its columns are
// paired, as long as x (A) and the planes (B) use the same pairing: then each lane's 32 bytes
// of a row are contiguous, two 16-byte loads.
#include <cstdint>

#include "bf16_split.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;                     // K per chunk: 4 mma k-steps of 16
constexpr int kSsParts = 4;                    // the 4 lanes of a quad each sum their columns' squares
constexpr int kFlush = 16;                     // chunks summed before they join the total
constexpr int kFinTok = 4;                     // tokens per mix_finish block
constexpr int kGB = 16;                        // groups of slices summed at once by mix_finish
static_assert(kChunk == 4 * 16 && kChunk / kSsParts == 16, "a lane holds 16 columns of a chunk: two 16-byte loads");
static_assert(kThreads % 32 == 0 && kFinTok <= kThreads, "whole warps");

// m16 token tiles per warp: two share each plane fragment load; one where N > 48 (n >= 7),
// whose accumulators alone take 4·N/8 registers per tile.
__host__ __device__ constexpr int tok_tiles(int N) { return N > 48 ? 1 : 2; }

// How the forward splits a shape. A slice is one whole group of kFlush chunks (a warp sums
// them in one chain, from zero) or one chunk (small T: many more work items, at the price of
// partials as large as x); no other size, or the finish kernel could not continue the order.
// Then as many warps per block (1..kWarps, sharing the planes through L1) as still give two
// blocks per SM of an H100.
struct Plan {
  int slice_chunks, slices, warps;
};
Plan plan(int64_t T, int N, int K) {
  const int64_t chunks = ceil_div(K, kChunk), groups = ceil_div(chunks, kFlush), wtiles = ceil_div(T, 16 * tok_tiles(N));
  const int s = wtiles * groups >= 512 ? kFlush : 1, slices = int(ceil_div(chunks, s));
  int w = kWarps;
  while (w > 1 && ceil_div(wtiles, w) * slices < 264) w /= 2;
  return {s, slices, w};
}

// Rows of the planes (N rounded up to whole n8 tiles) and their padded length (whole chunks).
__host__ __device__ constexpr int plane_rows(int N) { return int(ceil_div(N, 8)) * 8; }
int64_t plane_cols(int K) { return ceil_div(K, kChunk) * kChunk; }

__device__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// planes [kPlanes][rows][Kp]: pg = hi + mid + lo exactly (each the nearest bf16 to what is left).
__global__ void __launch_bounds__(kThreads) split_pg(const float* pg, int N, int K, int rows, int64_t Kp,
                                                     __nv_bfloat16* planes) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * Kp) return;
  const int j = int(e / Kp);
  const int64_t k = e % Kp;
  float v = j < N && k < K ? pg[j * int64_t(K) + k] : 0.0f;
  const int64_t plane = rows * Kp;
  const Planes s(v);
#pragma unroll
  for (int q = 0; q < kPlanes; ++q) planes[q * plane + e] = s.p[q];
}

// 32-bit word i (0..3) of a 16-byte vector; i a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// A lane's 16 columns k..k+15 of token row t (zeros beyond T or K): two 16-byte loads when
// K % 8 == 0 (then a run of 8 is all in or all out), else element by element.
__device__ __forceinline__ void load_row(const __nv_bfloat16* __restrict__ x, int64_t T, int K, bool vec, int64_t t,
                                         int k, uint4 (&out)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int kh = k + 8 * h;
    if (t >= T) {
      out[h] = make_uint4(0, 0, 0, 0);
    } else if (vec) {
      out[h] = kh < K ? __ldcs(reinterpret_cast<const uint4*>(x + t * K + kh)) : make_uint4(0, 0, 0, 0);
    } else {
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (kh + i < K) w[i / 2] |= uint32_t(__bfloat16_as_ushort(x[t * K + kh + i])) << (16 * (i % 2));
      out[h] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Block b: token tile b % tiles, K slice b / tiles (blockDim.x / 32 warps, Plan::warps). Warp w
// owns kMT m16 tiles of tokens; lane (g = lane / 4, tig = lane % 4) holds rows g and g + 8 of
// each; up to n = 6 the next chunk's x is loaded while this one is computed. No register cap: at n = 4
// two m16 tiles, prefetching, one block per SM was faster than one tile or a 128-register
// cap for two blocks (device run s4-4), and than 12 warps under a 168-register cap except
// where those fit the waves better (s5-3); staging x through a per-lane cp.async ring in
// shared memory was slower still (s4-2: it takes the L1 that the planes are read through).
// part [slices,T,N]: h_mix over each slice; part_ss [slices,T,kSsParts]: sums of squares of x
// over each slice, one per lane of the token's quad.
template <int n>
__global__ void __launch_bounds__(kThreads, 1) mix_partial(FwdParams p, const __nv_bfloat16* __restrict__ planes,
                                                        int64_t Kp, int slice_chunks, float* part, float* part_ss) {
  constexpr int N = n * n + 2 * n, NT = plane_rows(N) / 8, kMT = tok_tiles(N);
  const int K = n * p.D, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int warps = blockDim.x / 32;
  const int64_t tiles = ceil_div(p.T, warps * 16 * kMT);
  const int64_t tw = (blockIdx.x % tiles * warps + threadIdx.x / 32) * (16 * kMT);  // the warp's first token
  if (tw >= p.T) return;  // no barriers in this kernel
  const int slice = int(blockIdx.x / tiles);
  const int c_beg = slice * slice_chunks, c_end = min(int(ceil_div(K, kChunk)), c_beg + slice_chunks);
  const bool vec = K % 8 == 0;
  const int64_t plane = plane_rows(N) * Kp;

  float acc[kMT][NT][4], ss[kMT][2];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    ss[m][0] = ss[m][1] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;
  }
  // x of the next chunk is loaded while this one is computed (up to n = 6)
  uint4 next[kMT][2][2];  // [m tile][row g, g + 8][16-byte half]
  auto load = [&](int c) {
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) load_row(p.x, p.T, K, vec, tw + 16 * m + 8 * r + g, c * kChunk + 16 * tig, next[m][r]);
  };
  constexpr bool kPrefetch = N <= 48;  // beyond, the registers spill
  load(c_beg);
  for (int c = c_beg; c < c_end; ++c) {
    if (!kPrefetch && c > c_beg) load(c);
    const int k = c * kChunk + 16 * tig;
    uint4 xr[kMT][2][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) xr[m][r][0] = next[m][r][0], xr[m][r][1] = next[m][r][1];
    if (kPrefetch && c + 1 < c_end) load(c + 1);
    // sums of squares: each lane its 16 columns of each of its rows, one chain per chunk
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t w = word(xr[m][r][i / 4], i % 4);
          s = fmaf(lo_bf16(w), lo_bf16(w), s);
          s = fmaf(hi_bf16(w), hi_bf16(w), s);
        }
        ss[m][r] += s;
      }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint4 br[kPlanes][2];
#pragma unroll
      for (int q = 0; q < kPlanes; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          br[q][h] = __ldg(reinterpret_cast<const uint4*>(planes + q * plane + int64_t(nt * 8 + g) * Kp + k + 8 * h));
      float cc[kMT][4];
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) cc[m][i] = 0.0f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {  // k-step s: words 2(s%2), 2(s%2)+1 of half s/2
        const int h = s / 2, w0 = 2 * (s % 2);
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          const uint32_t a[4] = {word(xr[m][0][h], w0), word(xr[m][1][h], w0), word(xr[m][0][h], w0 + 1),
                                 word(xr[m][1][h], w0 + 1)};
#pragma unroll
          for (int q = kPlanes - 1; q >= 0; --q) mma_bf16(cc[m], a[0], a[1], a[2], a[3], word(br[q][h], w0), word(br[q][h], w0 + 1));
        }
      }
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][nt][i] += cc[m][i];
    }
  }

  const int64_t base = int64_t(slice) * p.T;
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t t = tw + 16 * m + 8 * r + g;
      if (t >= p.T) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int j = nt * 8 + 2 * tig + i;
          if (j < N) part[(base + t) * N + j] = acc[m][nt][2 * r + i];
        }
      part_ss[(base + t) * kSsParts + tig] = ss[m][r];
    }
}

template <int n>
__global__ void __launch_bounds__(kThreads) mix_finish(FwdParams p, int slice_chunks, int slices, const float* part,
                                                       const float* part_ss) {
  constexpr int N = n * n + 2 * n;
  __shared__ float hm[kFinTok][N];
  __shared__ float ssq[kFinTok][kSsParts];
  __shared__ float gsum[kFinTok][N + kSsParts][kGB];  // 21 KB at n = 8
  __shared__ float inv[kFinTok];
  __shared__ float hp[kFinTok][n];
  const int K = n * p.D, tid = threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.x) * kFinTok;

  // Each (token, output) over the slices: a group's slices chain, then the groups join the
  // total in order. Where a slice is a whole group (large T) that is one walk per output;
  // where a group has several one-chunk slices (small T) the groups' chains run in parallel
  // (kGB at a time, over the block's threads) and one thread adds them: the same sums in the
  // same order either way.
  const int per_group = kFlush / slice_chunks, groups = int(ceil_div(slices, per_group));
  for (int e = tid; e < kFinTok * (N + kSsParts); e += kThreads) {
    const int tb = e / (N + kSsParts), c = e % (N + kSsParts);
    float& acc = c < N ? hm[tb][c] : ssq[tb][c - N];
    acc = 0.0f;
    if (per_group > 1 || t0 + tb >= p.T) continue;
    const float* src = c < N ? part + (t0 + tb) * N + c : part_ss + (t0 + tb) * kSsParts + (c - N);
    const int64_t stride = p.T * (c < N ? N : kSsParts);
#pragma unroll 8
    for (int s = 0; s < slices; ++s) acc += src[s * stride];
  }
  for (int gb = 0; per_group > 1 && gb < groups; gb += kGB) {
    __syncthreads();  // gsum is free again
    for (int e = tid; e < kFinTok * (N + kSsParts) * kGB; e += kThreads) {
      const int q = e % kGB, c = e / kGB % (N + kSsParts), tb = e / kGB / (N + kSsParts);
      const int64_t t = t0 + tb;
      if (t >= p.T || gb + q >= groups) continue;
      const float* src = c < N ? part + t * N + c : part_ss + t * kSsParts + (c - N);
      const int64_t stride = p.T * (c < N ? N : kSsParts);
      const int s0 = (gb + q) * per_group, s1 = min(slices, s0 + per_group);
      float grp = 0.0f;
#pragma unroll 16
      for (int s = s0; s < s1; ++s) grp += src[s * stride];
      gsum[tb][c][q] = grp;
    }
    __syncthreads();
    for (int e = tid; e < kFinTok * (N + kSsParts); e += kThreads) {
      const int tb = e / (N + kSsParts), c = e % (N + kSsParts);
      if (t0 + tb >= p.T) continue;
      float& acc = c < N ? hm[tb][c] : ssq[tb][c - N];
      for (int q = 0; q < min(kGB, groups - gb); ++q) acc += gsum[tb][c][q];
    }
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
  const int K = n * p.D;
  const Plan pl = plan(p.T, N, K);
  const int64_t Kp = plane_cols(K), plane_floats = ceil_div(kPlanes * plane_rows(N) * Kp, 8) * 4;  // 16-byte multiple
  auto* planes = reinterpret_cast<__nv_bfloat16*>(p.scratch);
  float* part = p.scratch + plane_floats;
  float* part_ss = part + int64_t(pl.slices) * p.T * N;
  split_pg<<<unsigned(ceil_div(plane_rows(N) * Kp, kThreads)), kThreads, 0, s>>>(p.pg, N, K, plane_rows(N), Kp, planes);
  CUDA_CHECK(cudaGetLastError());
  mix_partial<n><<<unsigned(ceil_div(p.T, pl.warps * 16 * tok_tiles(N)) * pl.slices), 32 * pl.warps, 0, s>>>(p, planes, Kp, pl.slice_chunks,
                                                                                    part, part_ss);
  CUDA_CHECK(cudaGetLastError());
  mix_finish<n><<<unsigned(ceil_div(p.T, kFinTok)), kThreads, 0, s>>>(p, pl.slice_chunks, pl.slices, part, part_ss);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t forward_scratch_floats(int64_t T, int n, int D) {
  const int N = n * n + 2 * n, K = n * D;
  return ceil_div(kPlanes * plane_rows(N) * plane_cols(K), 8) * 4 + int64_t(plan(T, N, K).slices) * T * (N + kSsParts);
}

void launch_forward(const FwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
