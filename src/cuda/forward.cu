// forward.cu — the forward in two or three kernels, K split over blocks so that any T fills the GPU:
//   split_pg     phi*gamma (N x K, fp32) as three bf16 planes hi + mid + lo whose sum is the
//                fp32 value (24 significand bits = 3 x 8), padded with zeros to whole tiles
//   mix_partial  (many tokens) a block per (up to 256 tokens, group of kFlush chunks of K): each
//                warp's partial h_mix = x·(phi*gamma) over the group on tensor cores (mma.sync
//                m16n8k16, bf16 in, fp32 accumulate) and the sums of squares of x. x is exact in
//                bf16 and so is every product x·plane, so the only roundings are those of fp32 sums
//                (inside the mma possibly toward zero, but each chain there is 12 steps from zero).
//                Each warp owns 16 or 32 tokens and loads its fragments straight from global
//                memory (no shared memory)
//   mix_group    (few tokens or a short K) the same partials, a block per (one warp's tokens, group): its warps
//                share the group's chunks and the block adds their results in chunk order; where
//                the tokens are very few the warps split phi*gamma into planes themselves (no
//                split_pg), and where those blocks are few a block per n8 tile of j too
//   mix_finish   a block per (kFinTok tokens, range of D): the groups' partials summed in order,
//                inv_rms, the three gates, and h_in over the range (a second read of the tokens' x)
// No atomics. Every sum runs in one order that depends on K alone: chunk (kChunk columns:
// 4 mma steps x 3 planes from zero) -> group (kFlush chunks, one chain) -> total (the groups
// in order), whichever kernel and tiling (both chosen from the shape) computes it, so neither
// changes a bit.
//
// The mma fragments use a permutation of k inside each chunk: lane (g, tig) holds, for each of
// the 4 k-steps s, the logical columns {2tig, 2tig+1, 2tig+8, 2tig+9} at the physical columns
// 16 tig + 4 s + {0,1,2,3}. A dot product over a chunk does not depend on how its columns are
// paired, as long as x (A) and the planes (B) use the same pairing: then each lane's 32 bytes
// of a row are contiguous, two 16-byte loads.
#include <algorithm>
#include <cstdint>

#include "bf16_split.cuh"
#include "cuda_check.h"
#include "dependent_launch.cuh"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;                     // K per chunk: 4 mma k-steps of 16
constexpr int kSsParts = 4;                    // the 4 lanes of a quad each sum their columns' squares
constexpr int kFlush = 16;                     // chunks in a group, summed in one chain before it joins the total
constexpr int kFinTok = 4;                     // tokens per mix_finish block
constexpr int kFillBlocks = 264;               // blocks that fill an H100 twice over (132 SMs)
static_assert(kChunk == 4 * 16 && kChunk / kSsParts == 16, "a lane holds 16 columns of a chunk: two 16-byte loads");
static_assert(kThreads % 32 == 0 && kFinTok <= kThreads, "whole warps");

// m16 token tiles per warp: two share each plane fragment load. mix_group takes one where N > 48
// (n >= 7), whose results for 32 tokens would need 172 KiB of shared memory at n = 8;
// mix_partial two at every n (at n = 7 and 8 one tile read the planes twice as often per
// token: mix_partial<8> took 457 µs at 4096,8,4096, its warps stalled on L1, s12-9).
__host__ __device__ constexpr int tok_tiles(int N) { return N > 48 ? 1 : 2; }
constexpr int kPartialTiles = 2;

// How the forward splits a shape. Both ways give every (token tile of a warp, group) one partial,
// with the same bits. Where there are kGroupedBelow (mix_group warp tile, group) pairs or more
// (many tokens or a long K): mix_partial, each warp one group in one chain, as many warps per
// block (1..kWarps, sharing the planes through L1) as still give two blocks per SM of an H100. Fewer:
// mix_group, a block per pair, eight times the warps; and with at most kSplitTiles warp tiles
// the warps split phi*gamma themselves, and where those blocks would fill at most half of an
// H100's SMs a block per n8 tile of j too (that work would otherwise sit on a few SMs: s7-2;
// it lost where the pairs were 112 or 256: 128,4,7168, 200,4,4096, 128,8,4096 in s8-2).
// group_fits: mix_group's shared memory fits the device (not so at n = 6 on cards of compute
// capability 8.6 and 8.9: 99 KiB).
constexpr int64_t kGroupedBelow = 2048, kSplitTiles = 8;
int64_t k_groups(int K) { return ceil_div(ceil_div(K, kChunk), kFlush); }  // groups of kFlush chunks in K
// Rows of the planes (N rounded up to whole n8 tiles) and their padded length (whole chunks).
__host__ __device__ constexpr int plane_rows(int N) { return int(ceil_div(N, 8)) * 8; }
struct Plan {
  bool grouped, split;
  int warps, groups, jtiles;  // jtiles: mix_group's blocks per (warp tile, group), each its share of the n8 tiles of j
};
Plan plan(int64_t T, int N, int K, bool group_fits) {
  const int64_t groups = k_groups(K), wtiles = ceil_div(T, 16 * tok_tiles(N)), NT = plane_rows(N) / 8;
  if (group_fits && wtiles * groups < kGroupedBelow) {
    const bool split = wtiles <= kSplitTiles;
    return {true, split, kWarps, int(groups), split && wtiles * groups <= kFillBlocks / 4 ? int(NT) : 1};
  }
  const int64_t ptiles = ceil_div(T, 16 * kPartialTiles);  // mix_partial's warp tiles
  int w = kWarps;
  while (w > 1 && ceil_div(ptiles, w) * groups < kFillBlocks) w /= 2;
  return {false, false, w, int(groups), 1};
}
int64_t plane_cols(int K) { return ceil_div(K, kChunk) * kChunk; }

// planes [kPlanes][rows][Kp]: pg = hi + mid + lo exactly (each the nearest bf16 to what is left).
__global__ void __launch_bounds__(kThreads) split_pg(const float* pg, int N, int K, int rows, int64_t Kp,
                                                     __nv_bfloat16* planes) {
  allow_dependents();  // mix_partial's blocks may load their first x chunk meanwhile
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

// The B fragments of plane row `row`, columns k..k+15 (8 to a 16-byte half), from split_pg's planes.
__device__ __forceinline__ void load_planes(const __nv_bfloat16* __restrict__ planes, int64_t plane, int64_t Kp, int row,
                                            int k, uint4 (&br)[kPlanes][2]) {
#pragma unroll
  for (int q = 0; q < kPlanes; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      br[q][h] = __ldg(reinterpret_cast<const uint4*>(planes + q * plane + int64_t(row) * Kp + k + 8 * h));
}

// The same fragments split from phi*gamma here, with split_pg's arithmetic (the same bits):
// 16-byte loads when K % 4 == 0 (a run of 4 from a multiple of 4 is then all in or all out).
__device__ __forceinline__ void split_planes(const float* __restrict__ pg, int N, int K, int row, int k,
                                             uint4 (&br)[kPlanes][2]) {
  float v[16];
  const float* src = pg + int64_t(row) * K + k;
#pragma unroll
  for (int i = 0; i < 16; i += 4) {
    if (row >= N || k + i >= K) {
      v[i] = v[i + 1] = v[i + 2] = v[i + 3] = 0.0f;
    } else if (K % 4 == 0) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(src + i));
      v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[i + e] = k + i + e < K ? __ldg(src + i + e) : 0.0f;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t w[kPlanes][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const Planes a(v[8 * h + 2 * i]), b(v[8 * h + 2 * i + 1]);
#pragma unroll
      for (int q = 0; q < kPlanes; ++q) w[q][i] = pack_bf16(a.p[q], b.p[q]);
    }
#pragma unroll
    for (int q = 0; q < kPlanes; ++q) br[q][h] = make_uint4(w[q][0], w[q][1], w[q][2], w[q][3]);
  }
}

// One chunk's sum of squares of a lane's 16 columns of one row, one chain from zero.
__device__ __forceinline__ float chunk_ss(const uint4 (&xr)[2]) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = word(xr[i / 4], i % 4);
    s = fmaf(lo_bf16(w), lo_bf16(w), s);
    s = fmaf(hi_bf16(w), hi_bf16(w), s);
  }
  return s;
}

// One chunk's h_mix for one n8 tile of j, from zero: xr [m tile][row g, g + 8][16-byte half] of
// the lane's x, br the tile's B fragments of the three planes; cc the C fragments per m tile.
template <int kMT>
__device__ __forceinline__ void chunk_mma(const uint4 (&xr)[kMT][2][2], const uint4 (&br)[kPlanes][2], float (&cc)[kMT][4]) {
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
}

// The lane's x of one chunk: rows g and g + 8 of each of its kMT m16 tiles from token tw.
template <int kMT>
__device__ __forceinline__ void load_chunk(const FwdParams& p, int K, bool vec, int64_t tw, int g, int k,
                                           uint4 (&xr)[kMT][2][2]) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) load_row(p.x, p.T, K, vec, tw + 16 * m + 8 * r + g, k, xr[m][r]);
}

// mix_partial's x where K % 8 == 0 (kVec). A lane's rows, g + 8i (i = 2m + r: row g or g + 8 of
// m tile m) from the warp's first token t0, are the warp's for the whole kernel and only the
// chunk moves, so they are set up once (x_rows): row i of chunk c is at p + c·kChunk + i·step. A
// run of 8 columns from a multiple of 8 is then all in or all out, and every chunk but the last of
// K (where K % 64 != 0) is whole, so outside the tile holding token T - 1 load_vec tests once a
// chunk (c < whole).
struct XRows {
  const __nv_bfloat16* p;  // row g, column 16 tig (formed, never read, where that row is T or beyond)
  int64_t step;            // 8 rows: 8K (t·K needs 64 bits: K up to 2^31 - 4096, T up to 2^31 - 1)
  int whole;               // chunks c < whole are in range in every row and column: K / kChunk where
                           // all 16 kMT rows are below T, else 0
  int live, col;           // rows below T (row i where 8i + g < live: 1..16 kMT); col = 16 tig
};
template <int kMT> __device__ __forceinline__ XRows x_rows(const FwdParams& p, int K, int64_t t0, int g, int tig) {
  const int live = int(min(p.T - t0, int64_t(16 * kMT)));  // t0 < T
  return {p.x + (t0 + g) * K + 16 * tig, 8 * int64_t(K), live == 16 * kMT ? K / kChunk : 0, live, 16 * tig};
}

// load_chunk's x of chunk c from xs: below xs.whole two unpredicated 16-byte loads a row; else
// the same loads where the row is below T and the half's 8 columns below K, zeros elsewhere.
// g comes from threadIdx again rather than as an argument: with the argument ptxas 13.0 spilled
// 144 bytes at n = 6 (sm_90), against 112 this way and 132 with load_chunk.
template <int kMT>
__device__ __forceinline__ void load_vec(const XRows& xs, int K, int c, uint4 (&xr)[kMT][2][2]) {
  if (c < xs.whole) {
#pragma unroll
    for (int i = 0; i < 2 * kMT; ++i) {
      const uint4* v = reinterpret_cast<const uint4*>(xs.p + c * kChunk + i * xs.step);
      xr[i / 2][i % 2][0] = __ldcs(v), xr[i / 2][i % 2][1] = __ldcs(v + 1);
    }
  } else {
    const int g = threadIdx.x % 32 / 4, left = K - c * kChunk - xs.col;  // left: the lane's columns still in K
#pragma unroll
    for (int i = 0; i < 2 * kMT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        xr[i / 2][i % 2][h] = 8 * i + g < xs.live && 8 * h < left
                                  ? __ldcs(reinterpret_cast<const uint4*>(xs.p + c * kChunk + i * xs.step + 8 * h))
                                  : make_uint4(0, 0, 0, 0);
  }
}

// Block b: token tile b % tiles, group b / tiles (blockDim.x / 32 warps, Plan::warps). Warp w
// owns kMT m16 tiles of tokens; lane (g = lane / 4, tig = lane % 4) holds rows g and g + 8 of
// each; up to n = 6 the next chunk's x is loaded while this one is computed. kVec (K % 8 == 0):
// x by load_vec, from rows set up once, one test a chunk (load_chunk's tests and 64-bit row
// products were 118 of the 463 instructions a chunk took at n = 4, sm_90, ptxas 13.0); else by
// load_chunk, as in mix_group. No register cap: at n = 4 two m16 tiles, prefetching, one block
// per SM was faster than one tile or a 128-register cap for two blocks (device run s4-4), and
// than 12 warps under a 168-register cap except where those fit the waves better (s5-3);
// staging x through a per-lane cp.async ring in shared memory was slower still (s4-2: it takes
// the L1 that the planes are read through).
// part [groups,T,N]: h_mix over each group; part_ss [groups,T,kSsParts]: sums of squares of x
// over each group, one per lane of the token's quad.
template <int n, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) mix_partial(FwdParams p, const __nv_bfloat16* __restrict__ planes,
                                                           int64_t Kp, float* part, float* part_ss) {
  constexpr int N = n * n + 2 * n, NT = plane_rows(N) / 8, kMT = kPartialTiles;
  const int K = n * p.D, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int warps = blockDim.x / 32;
  const int64_t tiles = ceil_div(p.T, warps * 16 * kMT);
  const int64_t tw = (blockIdx.x % tiles * warps + threadIdx.x / 32) * (16 * kMT);  // the warp's first token
  if (tw >= p.T) return;  // no barriers in this kernel
  const int grp = int(blockIdx.x / tiles);
  const int c_beg = grp * kFlush, c_end = min(int(ceil_div(K, kChunk)), c_beg + kFlush);
  const int64_t plane = plane_rows(N) * Kp;
  const XRows xs = x_rows<kMT>(p, K, tw, g, tig);
  // x of chunk c into xr. !kVec: load_chunk's vec left a run-time test (false here): made a
  // constant, ptxas 13.0 spilled 160 bytes at n = 6 (sm_90) against 132
  auto load = [&](int c, uint4 (&xr)[kMT][2][2]) {
    if constexpr (kVec)
      load_vec<kMT>(xs, K, c, xr);
    else
      load_chunk<kMT>(p, K, K % 8 == 0, tw, g, c * kChunk + 16 * tig, xr);
  };

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
  constexpr bool kPrefetch = N <= 48;  // beyond, the registers spill
  load(c_beg, next);
  wait_prior_grid();  // split_pg's planes
  for (int c = c_beg; c < c_end; ++c) {
    const int k = c * kChunk + 16 * tig;
    if (!kPrefetch && c > c_beg) load(c, next);
    uint4 xr[kMT][2][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) xr[m][r][0] = next[m][r][0], xr[m][r][1] = next[m][r][1];
    if (kPrefetch && c + 1 < c_end) load(c + 1, next);
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) ss[m][r] += chunk_ss(xr[m][r]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint4 br[kPlanes][2];
      load_planes(planes, plane, Kp, nt * 8 + g, k, br);
      float cc[kMT][4];
      chunk_mma<kMT>(xr, br, cc);
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][nt][i] += cc[m][i];
    }
  }

  allow_dependents();
  const int64_t base = int64_t(grp) * p.T;
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

// Shared memory of mix_group: every chunk's results for the block's tokens, [kFlush][16 kMT][N + kSsParts]
// (56 KiB at n = 4, 104 KiB at n = 6).
template <int n> constexpr int group_smem_bytes() {
  constexpr int N = n * n + 2 * n;
  return kFlush * 16 * tok_tiles(N) * (N + kSsParts) * int(sizeof(float));
}

// mix_partial's partials where the (warp tile, group) pairs are few. Block (b, y): the tokens
// of one warp tile (16 kMT from (b % tiles) · 16 kMT), group b / tiles, and of j the n8 tiles
// y, y + gridDim.y, ... (the sums of squares in y = 0); warp w computes chunks w, w + kWarps, ...
// of the group, each from zero as mix_partial does, into shared memory, and then each (token,
// output) adds them in chunk order: the same chain, the same bits. split: the B fragments come
// from phi*gamma (split_planes), not from split_pg's planes. At most 128 registers, so that two
// blocks fit an SM (n = 5 took 139 without the cap: 600,5,2048 39.3 -> 31.1 µs with it, s12-8).
template <int n>
__global__ void __launch_bounds__(kThreads, 2) mix_group(FwdParams p, const __nv_bfloat16* __restrict__ planes,
                                                         int64_t Kp, bool split, float* part, float* part_ss) {
  constexpr int N = n * n + 2 * n, NT = plane_rows(N) / 8, kMT = tok_tiles(N), kTok = 16 * kMT, kOut = N + kSsParts;
  extern __shared__ float stash[];  // [kFlush][kTok][kOut]
  const int K = n * p.D, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  const int64_t tiles = ceil_div(p.T, kTok), t0 = blockIdx.x % tiles * kTok;
  const int grp = int(blockIdx.x / tiles);
  const int c_beg = grp * kFlush, c_end = min(int(ceil_div(K, kChunk)), c_beg + kFlush);
  const bool vec = K % 8 == 0;
  const int64_t plane = plane_rows(N) * Kp;

  wait_prior_grid();  // split_pg's planes (a no-op where the warps split phi*gamma: an ordinary launch)
  for (int c = c_beg + int(threadIdx.x / 32); c < c_end; c += kWarps) {
    const int k = c * kChunk + 16 * tig;
    float* out = stash + (c - c_beg) * kTok * kOut;
    uint4 xr[kMT][2][2];
    load_chunk<kMT>(p, K, vec, t0, g, k, xr);
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (blockIdx.y == 0) out[(16 * m + 8 * r + g) * kOut + N + tig] = chunk_ss(xr[m][r]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt % gridDim.y != blockIdx.y) continue;
      uint4 br[kPlanes][2];
      if (split)
        split_planes(p.pg, N, K, nt * 8 + g, k, br);
      else
        load_planes(planes, plane, Kp, nt * 8 + g, k, br);
      float cc[kMT][4];
      chunk_mma<kMT>(xr, br, cc);
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = nt * 8 + 2 * tig + i % 2;
          if (j < N) out[(16 * m + 8 * (i / 2) + g) * kOut + j] = cc[m][i];
        }
    }
  }
  __syncthreads();
  allow_dependents();
  for (int e = threadIdx.x; e < kTok * kOut; e += kThreads) {
    const int64_t t = t0 + e / kOut;
    const int o = e % kOut;
    if (t >= p.T || (o < N ? o / 8 % gridDim.y : 0) != blockIdx.y) continue;
    float acc = 0.0f;
    for (int c = 0; c < c_end - c_beg; ++c) acc += stash[c * kTok * kOut + e];
    if (o < N)
      part[(int64_t(grp) * p.T + t) * N + o] = acc;
    else
      part_ss[(int64_t(grp) * p.T + t) * kSsParts + (o - N)] = acc;
  }
}

// Block (b, y): tokens b·kFinTok.. and the y-th of gridDim.y ranges of h_in's columns (several
// where the tokens are too few to fill the GPU). Every block of a token sums the same partials
// in the same order; the y = 0 block writes the token's gates. kEarly (all blocks in one wave,
// where T is small and the kernel is a chain of round trips): the thread's first x of h_in is
// loaded before the wait for the partials (x is an input, not the previous kernel's), and the
// partials 16 at a time, not 8. That takes 58 registers at n = 4 (sm_90) against 32, and so
// half the occupancy where the kernel streams x at large T.
template <int n, bool kEarly>
__global__ void __launch_bounds__(kThreads) mix_finish(FwdParams p, int groups, const float* part, const float* part_ss) {
  constexpr int N = n * n + 2 * n;
  __shared__ float hm[kFinTok][N];
  __shared__ float ssq[kFinTok][kSsParts];
  __shared__ float inv[kFinTok];
  __shared__ float hp[kFinTok][n];
  const int K = n * p.D, tid = threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.x) * kFinTok;
  const bool writes_gates = blockIdx.y == 0;
  // where D % 8 == 0, h_in's pairs (token, 8 columns) of the block: tokens t0.., columns
  // 8 (d_beg..d_beg + cols - 1)
  auto col_range = [&](int& d_beg, int& cols) {
    const int D8 = p.D / 8, per = int(ceil_div(D8, gridDim.y));
    d_beg = int(blockIdx.y) * per, cols = max(0, min(D8, d_beg + per) - d_beg);
  };
  // stream i of x at pair e of those (token t0 + e / cols, columns 8 (d_beg + e % cols)..+7)
  auto x_at = [&](int e, int d_beg, int cols, int i) {
    return *reinterpret_cast<const uint4*>(p.x + (t0 + e / cols) * K + i * p.D + (d_beg + e % cols) * 8);
  };
  uint4 first[n];  // kEarly: x of the thread's first pair
  if constexpr (kEarly) {
    int d_beg, cols;
    col_range(d_beg, cols);
    if (p.D % 8 == 0 && tid < kFinTok * cols && t0 + tid / cols < p.T)
#pragma unroll
      for (int i = 0; i < n; ++i) first[i] = x_at(tid, d_beg, cols, i);
  }
  wait_prior_grid();  // the partials

  // each (token, output): the groups' partials, in order
  for (int e = tid; e < kFinTok * (N + kSsParts); e += kThreads) {
    const int tb = e / (N + kSsParts), c = e % (N + kSsParts);
    float acc = 0.0f;
    if (t0 + tb < p.T) {
      const float* src = c < N ? part + (t0 + tb) * N + c : part_ss + (t0 + tb) * kSsParts + (c - N);
      const int64_t stride = p.T * (c < N ? N : kSsParts);
      if constexpr (kEarly) {  // 16 loads at once, the last batch too (an unrolled loop's remainder runs one by one)
        for (int s0 = 0; s0 < groups; s0 += 16) {
          float v[16];
#pragma unroll
          for (int u = 0; u < 16; ++u) v[u] = s0 + u < groups ? src[(s0 + u) * stride] : 0.0f;
#pragma unroll
          for (int u = 0; u < 16; ++u)
            if (s0 + u < groups) acc += v[u];
        }
      } else {
#pragma unroll 8
        for (int s = 0; s < groups; ++s) acc += src[s * stride];
      }
    }
    (c < N ? hm[tb][c] : ssq[tb][c - N]) = acc;
  }
  __syncthreads();
  if (tid < kFinTok && t0 + tid < p.T) {
    float s = 0.0f;
    for (int q = 0; q < kSsParts; ++q) s += ssq[tid][q];
    inv[tid] = 1.0f / sqrtf(s / float(K) + p.norm_eps);
    if (writes_gates) p.inv_rms[t0 + tid] = inv[tid];
  }
  __syncthreads();

  for (int idx = tid; idx < kFinTok * N; idx += kThreads) {
    int tb = idx / N, j = idx % N;
    int64_t t = t0 + tb;
    if (t >= p.T) break;
    float h = hm[tb][j];
    float tt = h * inv[tb];
    if (j < n) {
      hp[tb][j] = sigmoid(p.alpha[0] * tt + p.bias[j]) + p.hc_eps;
      if (writes_gates) p.h_pre[t * n + j] = hp[tb][j];
    } else if (!writes_gates) {
      continue;
    } else if (j < 2 * n) {
      p.h_post[t * n + j - n] = 2.0f * sigmoid(p.alpha[1] * tt + p.bias[j]);
    } else {
      p.h_res[t * n * n + j - 2 * n] = p.alpha[2] * tt + p.bias[j];
    }
    if (writes_gates) p.h_mix[t * N + j] = h;
  }
  __syncthreads();

  // h_in: (token, d) pairs of the block's column range spread over the block; 8 columns a thread
  // in 16-byte accesses when D allows
  if (p.D % 8 == 0) {
    int d_beg, cols;
    col_range(d_beg, cols);
    for (int e = tid; e < kFinTok * cols; e += kThreads) {
      const int tb = e / cols, d = (d_beg + e % cols) * 8;
      const int64_t t = t0 + tb;
      if (t >= p.T) break;
      float a[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) a[q] = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) {
        const uint4 raw = kEarly && e == tid ? first[i] : x_at(e, d_beg, cols, i);
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
    const int per = int(ceil_div(p.D, gridDim.y)), d_beg = int(blockIdx.y) * per, cols = min(p.D, d_beg + per) - d_beg;
    for (int e = tid; e < kFinTok * cols; e += kThreads) {
      const int tb = e / cols, d = d_beg + e % cols;
      const int64_t t = t0 + tb;
      if (t >= p.T) break;
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < n; ++i) a = fmaf(hp[tb][i], __bfloat162float(p.x[t * K + i * p.D + d]), a);
      p.h_in[t * p.D + d] = __float2bfloat16_rn(a);
    }
  }
}

// Whether mix_group's shared memory fits the current device (asked once per process and n).
template <int n> bool group_fits() {
  static const bool fits = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return group_smem_bytes<n>() <= optin;
  }();
  return fits;
}

template <int n> void launch(const FwdParams& p, cudaStream_t s) {
  constexpr int N = n * n + 2 * n;
  const int K = n * p.D;
  const Plan pl = plan(p.T, N, K, group_fits<n>());
  const int64_t Kp = plane_cols(K), plane_floats = ceil_div(kPlanes * plane_rows(N) * Kp, 8) * 4;  // 16-byte multiple
  auto* planes = reinterpret_cast<__nv_bfloat16*>(p.scratch);
  float* part = p.scratch + plane_floats;
  float* part_ss = part + int64_t(pl.groups) * p.T * N;
  // The pass's first kernel is an ordinary launch; each later one a programmatic dependent of
  // the one before (dependent_launch.cuh).
  if (!pl.split) {
    split_pg<<<unsigned(ceil_div(plane_rows(N) * Kp, kThreads)), kThreads, 0, s>>>(p.pg, N, K, plane_rows(N), Kp, planes);
    CUDA_CHECK(cudaGetLastError());
  }
  if (pl.grouped) {
    // a dependent of split_pg, its blocks one an SM where they fit (apart)
    const dim3 grid(unsigned(ceil_div(p.T, 16 * tok_tiles(N)) * pl.groups), unsigned(pl.jtiles));
    size_t smem = group_smem_bytes<n>();
    if (!pl.split)
      if (const Apart one = apart(reinterpret_cast<const void*>(mix_group<n>), smem, grid.x * grid.y); one.fits) smem = one.smem;
    CUDA_CHECK(cudaFuncSetAttribute(mix_group<n>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_after(!pl.split, mix_group<n>, grid, kThreads, smem, s, p, planes, Kp, pl.split, part, part_ss);
  } else {
    launch_after(true, K % 8 == 0 ? mix_partial<n, true> : mix_partial<n, false>,
                 unsigned(ceil_div(p.T, pl.warps * 16 * kPartialTiles) * pl.groups), 32 * pl.warps, 0, s, p, planes, Kp, part,
                 part_ss);
  }
  const int64_t fin_tiles = ceil_div(p.T, kFinTok);
  const int64_t ranges = std::min(ceil_div(kFillBlocks, fin_tiles), ceil_div(p.D, 512));  // h_in column ranges a token tile
  const bool early = fin_tiles * ranges <= 2 * kFillBlocks;  // one wave of 4 blocks an SM of an H100
  launch_after(true, early ? mix_finish<n, true> : mix_finish<n, false>, dim3(unsigned(fin_tiles), unsigned(ranges)), kThreads,
               0, s, p, pl.groups, part, part_ss);
}

}  // namespace

int64_t forward_scratch_floats(int64_t T, int n, int D) {
  const int N = n * n + 2 * n, K = n * D;
  return ceil_div(kPlanes * plane_rows(N) * plane_cols(K), 8) * 4 + k_groups(K) * T * (N + kSsParts);
}

void launch_forward(const FwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
