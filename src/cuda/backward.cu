// backward.cu — the backward in three kernels (two with one token split: fewer than 256 tokens,
// or K above 131072), no atomics, every sum in a fixed order:
//   token_grads   one block per token: dh_pre, the gate gradients, dh_mix, dinv_rms,
//                 and the per-token terms of dalpha and dbias
//   dx_param      a block per (K tile, token split): dvecX = dh_mix·phi and dx, and
//                 P = sum_t dh_mix^T x over the split, both on tensor cores, in one read of x;
//                 with one split also param_final's work, in 3 + N more blocks
//   param_final   per column k: P summed over splits in order; dphi = P*gamma,
//                 dgamma = sum_j phi[j,k] P[j,k] (= sum_t x * dvecX); and in 3 + N more
//                 blocks dalpha and dbias, the per-token terms summed by a fixed tree
#include <algorithm>

#include "bf16_split.cuh"
#include "cuda_check.h"
#include "dependent_launch.cuh"
#include "gate_tails.h"
#include "kernels.h"

namespace mhc::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColTile = 32 * kWarps;  // columns of K per dx_param block: 32 a warp, 4 a lane
constexpr int kChunk = 32;             // tokens staged in shared memory per dx_param step: two 16-token steps
constexpr int kWideTokens = 264;       // token_grads' blocks in one wave at two an SM of an H100 (132 SMs;
                                       // token_grads<n, kWide> takes 73-103 registers, sm_90)
constexpr int kSplitTok = 128;         // tokens per split at least (32 was slower at T = 128..1024: s7-3)
constexpr int64_t kMaxSplits = 128;    // param_final adds the splits in order: 507 took ~200 µs (65000,4,16, s8-3)
static_assert(kChunk % 16 == 0 && kChunk <= kThreads, "whole 16-token steps; one thread per token loads coef");
static_assert(kColTile == kThreads, "dx_param loads phi's tile a column per thread");
static_assert(kThreads % 32 == 0, "block_sums shuffles whole warps");

// Fixed-order sums over the block of m values per thread, returned in every thread: a butterfly
// in each warp (xor 16, 8, .., 1: lanes l and l^s add the same two values, so all lanes hold the
// same bits), then the warps' sums in order. red: shared, [kWarps][m].
template <int m> __device__ void block_sums(float (&v)[m], float (*red)[m]) {
#pragma unroll
  for (int i = 0; i < m; ++i)
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], s);
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int i = 0; i < m; ++i) red[threadIdx.x / 32][i] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < m; ++i) {
    v[i] = 0.0f;
    for (int w = 0; w < kWarps; ++w) v[i] += red[w][i];
  }
  __syncthreads();  // red is free again
}

// dphi and dgamma of column k from P(j) = P[j,k], the splits' sum: dphi = P*gamma, dgamma =
// sum_j phi[j,k] P[j,k] in j order.
template <int N, class F> __device__ __forceinline__ void column_params(const BwdParams& p, int K, int k, F&& P) {
  const float g = p.gamma[k];
  float dg = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float s = P(j);
    p.dphi[int64_t(j) * K + k] = s * g;
    dg = fmaf(p.phi[int64_t(j) * K + k], s, dg);
  }
  p.dgamma[k] = dg;
}

// One block's share of dalpha (c < 3) or dbias (c - 3): column c of a_tok or g_tok summed over
// the tokens by a fixed tree (each thread its tokens in order, then block_sums).
template <int n> __device__ void token_param(const BwdParams& p, int c) {
  constexpr int N = n * n + 2 * n;
  __shared__ float red[kWarps][1];
  const int C = c < 3 ? 3 : N, col = c < 3 ? c : c - 3;
  const float* in = c < 3 ? p.a_tok : p.g_tok;
  float v[1] = {0.0f};
  for (int64_t t = threadIdx.x; t < p.T; t += kThreads) v[0] += in[t * C + col];
  block_sums<1>(v, red);
  if (threadIdx.x == 0) (c < 3 ? p.dalpha : p.dbias)[col] = v[0];
}

// Where D % 8 == 0 each thread reads 8 columns a step, kB steps' loads at once (kB > 1 where T
// is small and the kernel is a chain of round trips; at large T more registers would cost
// occupancy), then their products in column order: the same sums for any kB.
template <int n, int kB>
__global__ void __launch_bounds__(kThreads) token_grads(BwdParams p) {
  constexpr int N = n * n + 2 * n;
  __shared__ float red[kWarps][n];
  __shared__ float g[N];
  __shared__ float dhp[n];
  allow_dependents();  // dx_param's blocks may load phi's tiles meanwhile
  const int64_t t = blockIdx.x;
  const int K = n * p.D;
  float part[n];  // dh_pre: sum_d dh_in * x over the thread's columns, then over the block
#pragma unroll
  for (int i = 0; i < n; ++i) part[i] = 0.0f;
  if (p.D % 8 == 0) {  // 8 columns a load
    for (int d0 = 8 * threadIdx.x; d0 < p.D; d0 += 8 * kThreads * kB) {
      uint4 gv[kB], xv[kB][n];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int d = d0 + 8 * kThreads * b;
        if (d >= p.D) break;
        gv[b] = *reinterpret_cast<const uint4*>(p.dh_in + t * p.D + d);
#pragma unroll
        for (int i = 0; i < n; ++i) xv[b][i] = *reinterpret_cast<const uint4*>(p.x + t * K + i * p.D + d);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        if (d0 + 8 * kThreads * b >= p.D) break;
        const uint32_t gw[4] = {gv[b].x, gv[b].y, gv[b].z, gv[b].w};
#pragma unroll
        for (int i = 0; i < n; ++i) {
          const uint32_t xw[4] = {xv[b][i].x, xv[b][i].y, xv[b][i].z, xv[b][i].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            part[i] = fmaf(lo_bf16(gw[q]), lo_bf16(xw[q]), part[i]);
            part[i] = fmaf(hi_bf16(gw[q]), hi_bf16(xw[q]), part[i]);
          }
        }
      }
    }
  } else {
#pragma unroll 4
    for (int d = threadIdx.x; d < p.D; d += kThreads) {
      float gi = __bfloat162float(p.dh_in[t * p.D + d]);
#pragma unroll
      for (int i = 0; i < n; ++i) part[i] = fmaf(gi, __bfloat162float(p.x[t * K + i * p.D + d]), part[i]);
    }
  }
  block_sums<n>(part, red);
  if (threadIdx.x == 0)
#pragma unroll
    for (int i = 0; i < n; ++i) dhp[i] = part[i];
  __syncthreads();
  const float ir = p.inv_rms[t];
  for (int j = threadIdx.x; j < N; j += kThreads) {
    float gj;
    if (j < n) {
      float s = p.h_pre[t * n + j] - p.hc_eps, r = 1.0f - s;  // s and 1 - s: from z in their tails
      if (s < p.pre_low || r < p.gate_high) {
        const float z = p.alpha[0] * (p.h_mix[t * N + j] * ir) + p.bias[j], sz = sigmoid(z), rz = sigmoid(-z);
        if (in_tail(s, r, sz, rz, p.pre_low, p.gate_high)) s = sz, r = rz;
      }
      gj = dhp[j] * s * r;
      p.dh_pre[t * n + j] = dhp[j];
    } else if (j < 2 * n) {
      const float h = p.h_post[t * n + j - n], q = 1.0f - h / 2.0f;  // q = sigmoid(-z): from z in its tail
      gj = p.dh_post[t * n + j - n] * h * q;
      if (q < p.gate_high) {
        const float z = p.alpha[1] * (p.h_mix[t * N + j] * ir) + p.bias[j], sz = sigmoid(z), rz = sigmoid(-z);
        if (in_tail(1.0f, q, sz, rz, 0.0f, p.gate_high)) gj = p.dh_post[t * n + j - n] * 2.0f * sz * rz;
      }
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

// The bf16 halves at (lo half of u, lo half of v) or (hi, hi) as one pair: column c of two rows.
__device__ __forceinline__ uint32_t pair_lo(uint32_t u, uint32_t v) { return __byte_perm(u, v, 0x5410); }
__device__ __forceinline__ uint32_t pair_hi(uint32_t u, uint32_t v) { return __byte_perm(u, v, 0x7632); }

// Columns k..k+3 of row r of a [rows, len] bf16 tensor as two words (zeros at or beyond len):
// one 8-byte load when vec (len % 4 == 0, k % 4 == 0), else element by element.
__device__ __forceinline__ uint2 load4(const __nv_bfloat16* __restrict__ src, int64_t r, int len, int k, bool vec) {
  if (vec) return k < len ? *reinterpret_cast<const uint2*>(src + r * len + k) : make_uint2(0, 0);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (k + q < len) w[q / 2] |= uint32_t(__bfloat16_as_ushort(src[r * len + k + q])) << (16 * (q % 2));
  return make_uint2(w[0], w[1]);
}
__device__ __forceinline__ float half_of(uint2 v, int q) {  // element q (0..3) of 4 packed bf16
  const uint32_t w = q < 2 ? v.x : v.y;
  return q % 2 ? hi_bf16(w) : lo_bf16(w);
}
// Rows from a dx_param lane's token o = 16 s + r of a chunk to its next: o + 1, or 16 (s + 1) after r = 3
__device__ __forceinline__ constexpr int next_row(int r) { return r < 3 ? 1 : 13; }

// Shared-memory slots of the dx_param tiles, 16-byte units of 8 j each. A plane of phi's
// column tile is [U][kColTile] units (U = 2 ceil(N/16)), one of the chunk's dh_mix [U][kChunk]. The
// swizzles make every ldmatrix below conflict-free: its 8 rows are the columns
// 4i + e (i = 0..7, e fixed), or the tokens 4(i/2) + (i%2) + 2h (h fixed) of a 16-token step.
__device__ __forceinline__ int col_slot(int c) { return c ^ ((c >> 3) & 3); }
__device__ __forceinline__ int tok_slot(int t) { return t ^ ((t >> 2) & 2); }

// dx_param's ring (kRing): a 16-token step of a warp's 32 columns is a tile of 16 rows x 4
// 16-byte units (8 columns each) of x, and one of dh_in, 1 KB each; a ring step holds both tiles
// of every warp. Unit e = 4 row + u of a tile is stored at ring_slot(e), which xors bits 4-5 of
// e (row / 4) into bits 1-2. A warp's 8-byte read (lane (g, tig): row 4tig + r, r fixed; unit
// g / 2, half g % 2) then takes 2 wavefronts, the least for 256 bytes: each half-warp's 128
// bytes hit all 32 banks once (unswizzled, its four rows would share 8 banks: 8 wavefronts);
// a 16-byte copy (quarter-warp: two whole rows, one 128-byte line) stays conflict-free.
constexpr int kRingTile = 16 * 4;                  // 16-byte units of a tile
constexpr int kRingStep = kWarps * 2 * kRingTile;  // 16-byte units of a ring step
constexpr int kRingStepBytes = kRingStep * 16;     // 16 KB
__host__ __device__ constexpr int ring_slot(int e) { return e ^ ((e >> 3) & 6); }
static_assert(kColTile == 32 * kWarps && kRingStep == 4 * kThreads, "a warp's 32 columns: a lane copies 2 units of each tile a step");
// ring_slot permutes a tile's units, and unit u of row 4i + r is at unit u of row 4i's slot ^ 4r
// (dx_param's reads)
constexpr bool ring_slot_ok() {
  for (int e = 0; e < kRingTile; ++e)
    if (ring_slot(ring_slot(e)) != e || ring_slot(e) >= kRingTile || ring_slot(e) != (ring_slot(e & ~12) ^ (e & 12))) return false;
  return true;
}
static_assert(ring_slot_ok(), "the ring's swizzle");

// 16 bytes from global to shared memory through L2 only (cp.async.cg, sm_80 on); zeros where
// !ok (src-size 0: nothing is read, src is only an address). Issued copies form a group at
// copy_commit(); copy_wait<m>() returns when all but this thread's m newest groups have landed.
__device__ __forceinline__ void copy16(uint4* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int m> __device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(m) : "memory"); }

// dx and P = dh_mixᵀ·x in one pass over x: a block per (kColTile columns, token split), walking
// its split kChunk tokens at a time, all products on tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 accumulate) with fp32 operands as bf16 planes hi + mid + lo. Shared memory holds phi's
// column tile as planes for the whole split, and per chunk dh_mix as planes (staged from
// registers loaded during the previous chunk), coef and h_pre; with kRing > 0 (n <= 4,
// D % 8 == 0, where two blocks an SM still fit) also a ring of x and dh_in, kRing 16-token
// steps ahead of the math (below). Warp w takes columns 32w..32w+31 of the tile; lane (g, tig)
// holds x and dh_in of columns 4g..4g+3 and, in each 16-token step, tokens 4tig..4tig+3:
//   dvecX = dh_mix·phi, as dvecXᵀ = phiᵀ·dh_mixᵀ (columns as m, tokens as n, j as k): m-tile
//           mt's rows g, g + 8 are columns 4g + 2mt, +1 and n-tile nt's columns 2tig, +1 are
//           tokens 4tig + 2nt, +1, so that the accumulators land on the lane's own x. The
//           six products of planes qa + qb <= 2 (the rest are below fp32's last bit): first
//           those with qa + qb >= 1 (k-step by k-step), then hi·hi, one chain from zero, so
//           that only the last KS steps add to a full-size sum. dx = dvecX·gamma − coef·x + h_pre·dh_in.
//           Where at most 8 j are left for the last k-step (n = 1, 2, 4, 5) it is an m16n8k8.
//   P     += dh_mixᵀ·x, as Pᵀ = xᵀ·dh_mix (columns as m, mapped as in dvecX; j as n-tiles of 8;
//           tokens as k: logical tokens {2tig, 2tig+1, 2tig+8, 2tig+9} are the physical
//           4tig..4tig+3, in A, the lane's own x, as in B, ldmatrix rows). x is exact in bf16,
//           so each chunk's chain (2 token steps x 3 planes) starts from zero and is then added
//           to the split's sum in order.
// With one split (p.splits == 1) the block also writes dphi and dgamma of its columns (P through
// shared memory, a column per thread, as param_final would from one split: the same bits), and
// the 3 + N blocks after the column tiles compute dalpha and dbias: no param_final launch.
// Two blocks per SM up to n = 4 (128 registers); dvecX on CUDA cores took 47% of the kernel's
// instructions (s5-6).
template <int n, int kRing>
__global__ void __launch_bounds__(kThreads, n <= 4 ? 2 : 1) dx_param(BwdParams p) {
  static_assert(kRing == 0 || (n <= 4 && (kRing == 2 || kRing == 3)), "a ring of 2 or 3 steps, for two blocks an SM: n <= 4");
  constexpr bool kEarly = n <= 4;  // the next chunk's fetch at the chunk's start
  constexpr int N = n * n + 2 * n, KS = ceil_div(N, 16), U = 2 * KS;  // j: k16 steps, 16-byte units
  constexpr bool kTail8 = N - 16 * (KS - 1) <= 8;                     // the last k-step as k = 8
  constexpr int NJ = ceil_div(N, 8);                                   // j: n8 tiles of P
  extern __shared__ uint4 dyn[];
  uint4* phs = dyn;                              // [kPlanes][U][kColTile]: phi
  uint4* dhs = dyn + kPlanes * U * kColTile;     // [kPlanes][U][kChunk]: dh_mix
  __shared__ float coef[kChunk];
  __shared__ float hp[kChunk][n];
  const int K = n * p.D, D = p.D, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4, w = threadIdx.x / 32;
  const int ctiles = int(ceil_div(K, kColTile));
  if (int(blockIdx.x) >= ctiles) {  // one split: dalpha and dbias
    wait_prior_grid();  // token_grads' a_tok and g_tok
    token_param<n>(p, int(blockIdx.x) - ctiles);
    return;
  }
  const int kbase = blockIdx.x * kColTile, c4 = 32 * w + 4 * g, k4 = kbase + c4;
  const int64_t per = ceil_div(p.T, p.splits);
  const int64_t ta = int64_t(blockIdx.y) * per, tb = min(p.T, ta + per);
  const bool vec = kRing > 0 || D % 4 == 0;  // then 4 consecutive columns lie in one stream, 8-byte aligned
  const bool dump = p.dvecX != nullptr;
  const int64_t K64 = K, D64 = D;  // row lengths: t·K passes 2^31
  // the lane's columns: in range, and (when vec) their stream and column of dh_in, divided once
  const bool col_in = k4 < K;
  const int stream = col_in ? k4 / D : 0, kd = k4 - stream * D;
  // the rows this lane addresses in ldmatrix: matrix mi = lane / 8, row i = lane % 8
  const int mi = lane / 8, i8 = lane % 8;
  // dvecX's B (matrices: k-half mi & 1 of n-tile mi >> 1) and P's B (j-tile mi >> 1, k-half mi & 1)
  const int tok_row = tok_slot(4 * (i8 / 2) + (i8 % 2) + 2 * (mi >> 1)), tok_unit = mi & 1;
  const int ptok_row = tok_slot(4 * (i8 / 2) + (i8 % 2) + 2 * (mi & 1)), ptok_unit = mi >> 1;
  // The next chunk's dh_mix, h_pre, inv_rms and dinv_rms are loaded into registers while this
  // chunk is computed, then staged. Item e of dh_mix is token e % kChunk, j = 4 (e / kChunk)
  // .. +3 (half a unit), one 8-byte store per plane.
  constexpr int kSQ = ceil_div(kChunk * 2 * U, kThreads), kHQ = ceil_div(kChunk * n, kThreads);
  struct Staged {
    float dhm[kSQ][4], hp[kHQ], ir, dinv;
  } nx;
  auto fetch = [&](int64_t c0) {
#pragma unroll
    for (int q = 0; q < kSQ; ++q) {
      const int e = threadIdx.x + q * kThreads, tt = e % kChunk, j = 4 * (e / kChunk);
      const bool ok = e < kChunk * 2 * U && c0 + tt < tb;
#pragma unroll
      for (int i = 0; i < 4; ++i) nx.dhm[q][i] = ok && j + i < N ? p.dh_mix[(c0 + tt) * N + j + i] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kHQ; ++q) {
      const int e = threadIdx.x + q * kThreads;
      nx.hp[q] = e < kChunk * n && c0 + e / n < tb ? p.h_pre[(c0 + e / n) * n + e % n] : 0.0f;
    }
    const bool tok = threadIdx.x < kChunk && c0 + threadIdx.x < tb;
    nx.ir = tok ? p.inv_rms[c0 + threadIdx.x] : 0.0f;
    nx.dinv = tok ? p.dinv_rms[c0 + threadIdx.x] : 0.0f;
  };
  // kRing > 0: the split's x and dh_in come through a ring of kRing 16-token steps in dynamic
  // shared memory after the tiles, [kRing][kWarps][x, dh_in][kRingTile] units. The warp's own
  // lanes copy its tiles (cp.async.cg: L2 to shared memory, not through L1), one commit group a
  // step, kRing steps ahead of the reads: lane l unit l % 4 (columns kc..kc+7 of x; of dh_in,
  // columns cd..cd+7 of one stream, as D % 8 == 0) of rows l / 4 and l / 4 + 8, zeros at tokens
  // >= tb and columns >= K (K % 8 == 0: a unit is all in or all out). Step i is read from slot
  // i % kRing, then the slot is refilled with step i + kRing: cp.async.wait_group lands a
  // lane's copies of step i, a __syncwarp every lane's before the reads; a second one orders the
  // reads before the refill. No block barrier: a warp reads only what its lanes copied. Unused where kRing == 0.
  constexpr int kTiles = kPlanes * U * (kColTile + kChunk);
  static_assert(alignof(uint4) == 16, "dyn, and the ring after kTiles whole units, are 16-byte aligned for cp.async");
  uint4* const ring = dyn + kTiles + 2 * kRingTile * w;  // the warp's tiles of slot 0
  int slot = 0;                                          // units from ring to the slot read next
  const int kc = kbase + 32 * w + 8 * (lane % 4), cd = kc % D;
  const bool c_in = kc < K;
  int64_t ct = ta + lane / 4;  // the token of the lane's first row in the next copy
  const __nv_bfloat16 *cx = p.x + ct * K + kc, *cg = p.dh_in + ct * D + cd;
  auto copy_step = [&](uint4* s) {
    const bool ok0 = c_in && ct < tb, ok1 = c_in && ct + 8 < tb;
    copy16(s + ring_slot(lane), ok0 ? cx : p.x, ok0);
    copy16(s + ring_slot(lane + 32), ok1 ? cx + 8 * int64_t(K) : p.x, ok1);
    copy16(s + kRingTile + ring_slot(lane), ok0 ? cg : p.dh_in, ok0);
    copy16(s + kRingTile + ring_slot(lane + 32), ok1 ? cg + 8 * int64_t(D) : p.dh_in, ok1);
    copy_commit();
    ct += 16, cx += 16 * int64_t(K), cg += 16 * int64_t(D);
  };
  // the lane's reads, 8 bytes (half g % 2) of unit g / 2 of row 4tig + r, at uint2 rd ^ 8r of a
  // tile: ring_slot(16tig + 4r + u) = ring_slot(16tig + u) ^ 4r for u < 4
  const int rd = 2 * ring_slot(16 * tig + g / 2) + g % 2;
  if constexpr (kRing > 0)  // the first steps, under phi's tile (x and dh_in are inputs, not token_grads')
    for (int i = 0; i < kRing; ++i) copy_step(ring + i * kRingStep);
  // phi's column tile as planes, a column per thread, the loads of up to 4 units (32 rows) in
  // flight at once (all of them up to n = 4)
  {
    const int64_t k = kbase + int(threadIdx.x);
    constexpr int UB = U < 4 ? U : 4;
#pragma unroll
    for (int u0 = 0; u0 < U; u0 += UB) {
      float v[UB][8];
#pragma unroll
      for (int u = 0; u < UB; ++u)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int j = 8 * (u0 + u) + i;
          v[u][i] = k < K && j < N ? p.phi[int64_t(j) * K + k] : 0.0f;
        }
#pragma unroll
      for (int u = 0; u < UB && u0 + u < U; ++u) {
        uint32_t pw[kPlanes][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const Planes a(v[u][2 * i]), b(v[u][2 * i + 1]);
#pragma unroll
          for (int q = 0; q < kPlanes; ++q) pw[q][i] = pack_bf16(a.p[q], b.p[q]);
        }
#pragma unroll
        for (int q = 0; q < kPlanes; ++q)
          phs[(q * U + u0 + u) * kColTile + col_slot(threadIdx.x)] = make_uint4(pw[q][0], pw[q][1], pw[q][2], pw[q][3]);
      }
    }
  }
  wait_prior_grid();  // token_grads' dh_mix and dinv_rms; phi's tile above overlapped it
  fetch(ta);
  float gam[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) gam[q] = k4 + q < K ? p.gamma[k4 + q] : 0.0f;

  float acc[2][NJ][4];  // Pᵀ for m-tile mt (columns 4g + 2mt, +1), j tile nj (the split's sum)
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nj][i] = 0.0f;

  for (int64_t c0 = ta; c0 < tb; c0 += kChunk) {
    __syncthreads();  // the previous chunk is done with the shared tiles (and phi's planes are in)
#pragma unroll
    for (int q = 0; q < kSQ; ++q) {
      const int e = threadIdx.x + q * kThreads, tt = e % kChunk, hu = e / kChunk;
      if (e >= kChunk * 2 * U) break;
      uint32_t pw[kPlanes][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const Planes a(nx.dhm[q][2 * i]), b(nx.dhm[q][2 * i + 1]);
#pragma unroll
        for (int pl = 0; pl < kPlanes; ++pl) pw[pl][i] = pack_bf16(a.p[pl], b.p[pl]);
      }
#pragma unroll
      for (int pl = 0; pl < kPlanes; ++pl)
        reinterpret_cast<uint2*>(&dhs[(pl * U + hu / 2) * kChunk + tok_slot(tt)])[hu % 2] = make_uint2(pw[pl][0], pw[pl][1]);
    }
#pragma unroll
    for (int q = 0; q < kHQ; ++q) {
      const int e = threadIdx.x + q * kThreads;
      if (e < kChunk * n) hp[e / n][e % n] = nx.hp[q];
    }
    if (threadIdx.x < kChunk) coef[threadIdx.x] = nx.dinv * nx.ir * nx.ir * nx.ir / float(K);
    __syncthreads();
    // up to n = 4 the next chunk's loads are issued here, where their registers are free: they
    // have the whole chunk to arrive (before P, as beyond n = 4: backward 928 µs against 913 at
    // 16384,4,4096, s10-4). Beyond n = 4, here they would be live through dvecX (spills).
    if constexpr (kEarly)
      if (c0 + kChunk < tb) fetch(c0 + kChunk);
    // this chunk's x and dh_in (kRing: from the ring, a step at a time, below), every load
    // issued before the math. The lane's tokens are t0 + o, o = 16 s + r, in range for o < left
    // (none where its columns are out of range). vec is tested once per chunk, and the rows are
    // walked by pointers, each row's the last one's plus next_row(r)·K (·D in dh_in), a 64-bit
    // add: row offsets written as xoff + o·K were folded back into (t0 + o)·K + k4, a 64-bit
    // product a row (~190 instructions per chunk for the 16 loads, behind per-row branches on
    // vec: s6-6, change 38). dx is [T, K] as x: its row pointer dxr walks the same way.
    const int64_t t0 = c0 + 4 * tig, xoff = t0 * K64 + k4;
    const int left = col_in ? int(min(tb - t0, int64_t(kChunk))) : 0;
    uint2 xv[kChunk / 16][4], gv[kChunk / 16][4];
    __nv_bfloat16* dxr = p.dx + xoff;
    if constexpr (kRing == 0) {
      if (vec) {
        const __nv_bfloat16* xr = p.x + xoff;
        const __nv_bfloat16* gr = p.dh_in + (t0 * D64 + kd);
#pragma unroll
        for (int s = 0; s < kChunk / 16; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int o = 16 * s + r;
            xv[s][r] = o < left ? *reinterpret_cast<const uint2*>(xr) : make_uint2(0, 0);
            gv[s][r] = o < left ? *reinterpret_cast<const uint2*>(gr) : make_uint2(0, 0);
            xr += next_row(r) * K64;
            gr += next_row(r) * D64;
          }
      } else {  // element by element (x by 8 bytes where K % 4 == 0); dh_in is read by dx's stores
#pragma unroll
        for (int s = 0; s < kChunk / 16; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int o = 16 * s + r;
            xv[s][r] = o < left ? load4(p.x, t0 + o, K, k4, K % 4 == 0) : make_uint2(0, 0);
            gv[s][r] = make_uint2(0, 0);
          }
      }
    }

    // dvecX and dx, both 16-token steps first: their registers are free again before P's accumulators
#pragma unroll
    for (int s = 0; s < kChunk / 16; ++s) {
      const int tt0 = 16 * s + 4 * tig;  // the lane's first token in the chunk
      // ldmatrix rows: dh_mix (k = j, n = tokens) and phi (m = columns, k = j) of plane q, k-step ks
      auto b_row = [&](int q, int ks) { return &dhs[(q * U + 2 * ks + tok_unit) * kChunk + 16 * s + tok_row]; };
      auto a_row = [&](int q, int mt, int ks) {
        return &phs[(q * U + 2 * ks + (mi >> 1)) * kColTile + col_slot(c4 - 4 * g + 4 * i8 + 2 * mt + (mi & 1))];
      };
      // their fragments; a k = 8 step takes the first k-half alone (ldmatrix.x2: matrices 0, 1 of
      // phi's rows; dh_mix's k-half 0 of n-tiles 0, 1, the rows of P's B below)
      auto load_a = [&](uint32_t (&a)[4], int q, int mt, int ks) {
        if (kTail8 && ks == KS - 1) {
          uint32_t h[2];
          ldsm_x2(h, a_row(q, mt, ks));
          a[0] = h[0], a[1] = h[1], a[2] = a[3] = 0;
        } else {
          ldsm_x4<false>(a, a_row(q, mt, ks));
        }
      };
      auto load_b = [&](uint32_t (&b)[4], int q, int ks) {
        if (kTail8 && ks == KS - 1) {
          uint32_t h[2];
          ldsm_x2(h, &dhs[(q * U + 2 * ks) * kChunk + 16 * s + ptok_row]);
          b[0] = h[0], b[2] = h[1], b[1] = b[3] = 0;
        } else {
          ldsm_x4<false>(b, b_row(q, ks));
        }
      };
      float dvp[2][2][4];  // [mt][nt]: dvecXᵀ fragments
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) dvp[mt][nt][i] = 0.0f;
      auto mma4 = [&](const uint32_t (&a)[2][4], const uint32_t (&b)[4], int ks) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
            if (kTail8 && ks == KS - 1)
              mma_bf16_k8(dvp[mt][nt], a[mt][0], a[mt][1], b[2 * nt]);
            else
              mma_bf16(dvp[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2 * nt], b[2 * nt + 1]);
      };
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {  // the small products: qa + qb = 1 or 2
        uint32_t b[kPlanes][4];
#pragma unroll
        for (int q = 0; q < kPlanes; ++q) load_b(b[q], q, ks);
#pragma unroll
        for (int qa = 0; qa < kPlanes; ++qa) {
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) load_a(a[mt], qa, mt, ks);
#pragma unroll
          for (int qb = kPlanes - 1 - qa; qb >= (qa == 0 ? 1 : 0); --qb) mma4(a, b[qb], ks);
        }
      }
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {  // hi·hi
        uint32_t a[2][4], b[4];
        load_b(b, 0, ks);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) load_a(a[mt], 0, mt, ks);
        mma4(a, b, ks);
      }
      // dvecX for token 4tig + r, column 4g + q: fragment (mt, nt) = (q / 2, r / 2), element r % 2 + 2 (q % 2)
      auto dv = [&](int r, int q) { return dvp[q / 2][r / 2][r % 2 + 2 * (q % 2)]; };
      // kRing > 0: the step's x and dh_in from its slot, zeros where the loads above give zeros; here,
      // after dvecX, not at the step's start, where they would be live through it (ptxas: 36
      // bytes of spills at n = 4, sm_90)
      if constexpr (kRing > 0) {
        copy_wait<kRing - 1>();  // this lane's copies of the step have landed (the later steps' may not)
        __syncwarp();  // so have all lanes'
        const uint2* rs = reinterpret_cast<const uint2*>(ring + slot);
#pragma unroll
        for (int r = 0; r < 4; ++r) xv[s][r] = rs[rd ^ 8 * r], gv[s][r] = rs[2 * kRingTile + (rd ^ 8 * r)];
        __syncwarp();  // all lanes have read the slot: refill it, kRing steps on
        copy_step(ring + slot);
        slot = slot + kRingStep < kRing * kRingStep ? slot + kRingStep : 0;
      }
      // dvecX when it is dumped (a row index each: not the timed path), then dx
      if (vec) {
        if (dump)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            if (16 * s + r < left)
              *reinterpret_cast<float4*>(p.dvecX + xoff + (16 * s + r) * K64) =
                  make_float4(dv(r, 0), dv(r, 1), dv(r, 2), dv(r, 3));
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int tt = tt0 + r, o = 16 * s + r;
          if (o < left) {
            float out[4];
#pragma unroll
            for (int q = 0; q < 4; ++q)
              out[q] = dv(r, q) * gam[q] - coef[tt] * half_of(xv[s][r], q) + hp[tt][stream] * half_of(gv[s][r], q);
            __align__(8) __nv_bfloat16 b[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) b[q] = __float2bfloat16_rn(out[q]);
            *reinterpret_cast<uint2*>(dxr) = *reinterpret_cast<const uint2*>(b);
          }
          dxr += next_row(r) * K64;
        }
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int tt = tt0 + r, o = 16 * s + r;
          const int64_t t = c0 + tt;
          if (o >= left) continue;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int k = k4 + q;
            if (k >= K) break;
            const float gi = __bfloat162float(p.dh_in[t * D + k % D]);
            p.dx[t * K + k] = __float2bfloat16_rn(dv(r, q) * gam[q] - coef[tt] * half_of(xv[s][r], q) + hp[tt][k / D] * gi);
            if (dump) p.dvecX[t * K + k] = dv(r, q);
          }
        }
      }
    }

    if constexpr (!kEarly)
      if (c0 + kChunk < tb) fetch(c0 + kChunk);
    // P: the chunk's chain (token step 0 then 1; planes lo, mid, hi) from zero, then into the split's sum
    float cc[2][NJ][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int i = 0; i < 4; ++i) cc[mt][nj][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < kChunk / 16; ++s) {
      // A fragments from the x rows (tokens 4tig, +1 | +2, +3): row g of m-tile mt is column
      // 4g + 2mt (low halves of word mt of each row), row g + 8 column 4g + 2mt + 1 (high halves)
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t u0 = mt ? xv[s][0].y : xv[s][0].x, u1 = mt ? xv[s][1].y : xv[s][1].x;
        const uint32_t u2 = mt ? xv[s][2].y : xv[s][2].x, u3 = mt ? xv[s][3].y : xv[s][3].x;
        af[mt][0] = pair_lo(u0, u1), af[mt][1] = pair_hi(u0, u1), af[mt][2] = pair_lo(u2, u3), af[mt][3] = pair_hi(u2, u3);
      }
#pragma unroll
      for (int q = kPlanes - 1; q >= 0; --q)  // lo, mid, hi
#pragma unroll
        for (int nj = 0; nj < NJ; nj += 2) {
          uint32_t b[4];  // matrices (j-tile nj | nj + 1) x (logical tokens 0-7 | 8-15), transposed
          ldsm_x4<true>(b, &dhs[(q * U + nj + ptok_unit) * kChunk + 16 * s + ptok_row]);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2 && nj + h < NJ; ++h)
              mma_bf16(cc[mt][nj + h], af[mt][0], af[mt][1], af[mt][2], af[mt][3], b[2 * h], b[2 * h + 1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nj][i] += cc[mt][nj][i];
  }
  if constexpr (kRing > 0) copy_wait<0>();  // the copies past the split (zeros) land before the block ends
  // C fragment element i: row g (i < 2) or g + 8 of m-tile mt, i.e. column 4g + 2mt + i / 2;
  // n-index 2tig + i % 2 of j-tile nj. One split: P[j][column] in shared memory (phi's tile
  // is free after the barrier; N·kColTile floats fit in its kPlanes·U·kColTile units).
  allow_dependents();
  float* ps = reinterpret_cast<float*>(phs);
  if (p.splits == 1) __syncthreads();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = c4 + 2 * mt + i / 2, j = 8 * nj + 2 * tig + i % 2;
        if (j >= N) continue;
        if (p.splits == 1)
          ps[j * kColTile + c] = acc[mt][nj][i];
        else if (kbase + c < K)
          p.partial[(int64_t(blockIdx.y) * N + j) * K + kbase + c] = acc[mt][nj][i];
      }
  if (p.splits == 1) {
    __syncthreads();
    const int k = kbase + int(threadIdx.x);
    if (k < K) column_params<N>(p, K, k, [&](int j) { return 0.0f + ps[j * kColTile + threadIdx.x]; });
  }
}

// param_final's columns where n = 5..7: a thread a column holds too few registers for a split's
// N loads beside the N sums (param_final<6> took 64 registers, and 181 µs at 4096,6,4096 with its
// loads one round trip at a time: s12-9; 29 µs here, s13-1). Not at n = 8, where a thread a
// column took 44 µs at 4096,8,4096 and this 79 (s12-9, s13-2). Here a block takes kParamCols columns and
// each column kParamGroups threads, thread (group, column) the J outputs j0..j0+J-1: each sum
// over the splits in split order as before, two splits' loads issued at once and no load behind
// a branch (indices clamped into range, sums updated by select). dphi as column_params; dgamma,
// its chain over all j in order, by the column's first thread from shared memory.
constexpr int kParamCols = 64, kParamGroups = kThreads / kParamCols;
template <int N> constexpr bool kByColumns = N > 24 && N < 80;
template <int N> __device__ void param_columns(const BwdParams& p, int K) {
  constexpr int J = ceil_div(N, kParamGroups);
  __shared__ float ps[N][kParamCols], phis[N][kParamCols];
  const int c = threadIdx.x % kParamCols, j0 = int(threadIdx.x / kParamCols) * J;
  const int k = blockIdx.x * kParamCols + c, kk = min(k, K - 1);  // kk: a column to load from
  const float* __restrict__ partial = p.partial;
  float s[J], ph[J];
#pragma unroll
  for (int i = 0; i < J; ++i) s[i] = 0.0f, ph[i] = p.phi[int64_t(min(j0 + i, N - 1)) * K + kk];
  for (int q = 0; q < p.splits; q += 2) {
    float v[2][J];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < J; ++i) v[u][i] = partial[(int64_t(min(q + u, p.splits - 1)) * N + min(j0 + i, N - 1)) * K + kk];
#pragma unroll
    for (int i = 0; i < J; ++i) {
      s[i] += v[0][i];
      s[i] = q + 1 < p.splits ? s[i] + v[1][i] : s[i];
    }
  }
  const float g = p.gamma[kk];
#pragma unroll
  for (int i = 0; i < J; ++i)
    if (j0 + i < N) {
      if (k < K) p.dphi[int64_t(j0 + i) * K + k] = s[i] * g;
      ps[j0 + i][c] = s[i], phis[j0 + i][c] = ph[i];
    }
  __syncthreads();
  if (threadIdx.x < kParamCols && k < K) {
    float dg = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) dg = fmaf(phis[j][c], ps[j][c], dg);
    p.dgamma[k] = dg;
  }
}

// Blocks 0 .. ktiles-1, a column k per thread: P[j,k] summed over the splits in order, then dphi
// and dgamma (the loads of kQ splits in flight at once); at n = 5..7, kParamCols columns a
// block (param_columns). Then 3 + N
// blocks, one per column of a_tok and g_tok: dalpha and dbias, the per-token terms summed by a
// fixed tree (each thread its tokens in order, then block_sums).
template <int n>
__global__ void __launch_bounds__(kThreads) param_final(BwdParams p, int ktiles) {
  constexpr int N = n * n + 2 * n;
  // dx_param's partials; token_grads' a_tok and g_tok too, since every dx_param block waited
  // for token_grads before it let this kernel start
  wait_prior_grid();
  if (int(blockIdx.x) >= ktiles) {
    token_param<n>(p, int(blockIdx.x) - ktiles);
    return;
  }
  const int K = n * p.D;
  if constexpr (kByColumns<N>) {
    param_columns<N>(p, K);
    return;
  }
  const int k = blockIdx.x * kThreads + threadIdx.x;
  if (k >= K) return;
  const float* __restrict__ partial = p.partial;
  float s[N];
#pragma unroll
  for (int j = 0; j < N; ++j) s[j] = 0.0f;
  // kQ splits' loads in flight at once (one split's were one DRAM round trip each: 825 µs for
  // 507 splits at 65000,4,16, s8-2), then added in split order. Only up to n = 4: beyond, the
  // registers (245 at n = 5 with two splits) leave one block per SM (not measured).
  constexpr int kQ = N <= 24 ? 4 : 1;
  for (int q = 0; q < p.splits; q += kQ) {
    float v[kQ][N];
#pragma unroll
    for (int u = 0; u < kQ; ++u)
#pragma unroll
      for (int j = 0; j < N; ++j) v[u][j] = q + u < p.splits ? partial[(int64_t(q + u) * N + j) * K + k] : 0.0f;
#pragma unroll
    for (int u = 0; u < kQ; ++u)
#pragma unroll
      for (int j = 0; j < N; ++j)
        if (q + u < p.splits) s[j] += v[u][j];
  }
  column_params<N>(p, K, k, [&](int j) { return s[j]; });
}

// The steps of dx_param's ring beside `tiles` bytes of dynamic shared memory: 3, else
// 2, where two blocks an SM still fit with it (H100: 3 up to n = 4; A100: 3 up to n = 3, none
// at n = 4), else 0: no ring (asked once per process and n, of the current device).
template <int n> int dx_ring_steps(size_t tiles) {
  static const int steps = [tiles] {
    int dev = 0, per_sm = 0, per_block = 0, reserved = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    cudaFuncAttributes fa{};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, dx_param<n, 3>));  // the same static shared memory for 2
    for (int r = 3; r >= 2; --r) {
      const size_t block = fa.sharedSizeBytes + tiles + size_t(r) * kRingStepBytes;
      if (block <= size_t(per_block) && 2 * (block + size_t(reserved)) <= size_t(per_sm)) return r;
    }
    return 0;
  }();
  return steps;
}

template <int n> void launch(const BwdParams& p, cudaStream_t s) {
  constexpr int N = n * n + 2 * n;
  const int K = n * p.D;
  const unsigned ktiles = unsigned(ceil_div(K, kThreads)), ctiles = unsigned(ceil_div(K, kColTile));
  constexpr int U = 2 * ceil_div(N, 16);
  size_t smem = size_t(kPlanes) * U * (kColTile + kChunk) * sizeof(uint4);  // 54 KB at n = 4, 135 KB at n = 8
  // x and dh_in through the ring where it fits (n <= 4, 16-byte rows of 8 columns: D % 8 == 0)
  void (*dx_kernel)(BwdParams) = dx_param<n, 0>;
  if constexpr (n <= 4)
    if (p.D % 8 == 0)
      if (const int r = dx_ring_steps<n>(smem))
        dx_kernel = r == 3 ? dx_param<n, 3> : dx_param<n, 2>, smem += size_t(r) * kRingStepBytes;
  // dx_param's blocks are kept one an SM where they fit (apart: 2.4-3.1 µs at 100..255 tokens with one split,
  // 5.7-10.6 µs with more, s19-1 and s19-2). Elsewhere, with one split and more than two chunks
  // a block (n <= 4), an ordinary launch: as a dependent it lost there (T = 128: 27.8 -> 33.0
  // µs, s8-1), while at T <= 64 and at n = 8 a dependent won 3-4 µs.
  const Apart one = apart(reinterpret_cast<const void*>(dx_kernel), smem, ctiles * unsigned(p.splits));
  const bool kept = one.fits && (p.splits > 1 || (n <= 4 && p.T > 2 * kChunk));
  if (kept) smem = one.smem;
  const bool dependent = kept || p.splits > 1 || n > 4 || p.T <= 2 * kChunk;
  CUDA_CHECK(cudaFuncSetAttribute(dx_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // a block per token; where the blocks fit one wave, several steps' loads at once
  constexpr int kWide = n <= 4 ? 4 : 2;
  (p.T <= kWideTokens ? token_grads<n, kWide> : token_grads<n, 1>)<<<unsigned(p.T), kThreads, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  // token_grads is an ordinary launch, the later kernels programmatic dependents of the one
  // before (dependent_launch.cuh)
  if (p.splits == 1) {  // dx_param does param_final's work too
    launch_after(dependent, dx_kernel, ctiles + 3 + N, kThreads, smem, s, p);
    return;
  }
  launch_after(dependent, dx_kernel, dim3(ctiles, unsigned(p.splits)), kThreads, smem, s, p);
  const unsigned ptiles = kByColumns<N> ? unsigned(ceil_div(K, kParamCols)) : ktiles;  // param_final's column blocks
  launch_after(true, param_final<n>, ptiles + 3 + N, kThreads, 0, s, p, int(ptiles));
}

}  // namespace

int token_splits(int64_t T, int64_t K) {
  int64_t ktiles = ceil_div(K, kColTile);
  int64_t want = std::max<int64_t>(1, 1024 / ktiles);  // about 1024 blocks in all
  int64_t most = std::max<int64_t>(1, T / kSplitTok);
  return int(std::min({want, most, kMaxSplits}));
}

void launch_backward(const BwdParams& p, cudaStream_t s) {
  dispatch_n(p.n, [&](auto n) { launch<decltype(n)::value>(p, s); });
}

}  // namespace mhc::cuda
