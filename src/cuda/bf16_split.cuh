// bf16_split.cuh — fp32 operands on bf16 tensor cores: a float as bf16 planes hi + mid + lo
// (8 significand bits each, together fp32's 24), the m16n8k16 and m16n8k8 mma they feed, the
// bf16 halves of packed 32-bit words and their packing, and the ldmatrix loads of mma
// fragments from shared memory.
// Used by forward.cu (x · phi*gamma) and backward.cu (dh_mix · phi and dh_mixᵀ · x).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mhc::cuda {

constexpr int kPlanes = 3;  // hi, mid, lo

// Plane q of v: plane(v, q) for q = 0, 1, 2 are the nearest bf16 to what the earlier planes
// left of v; their sum is v (each subtraction is exact: a plane holds the leading bits).
struct Planes {
  __nv_bfloat16 p[kPlanes];
  __device__ __forceinline__ explicit Planes(float v) {
#pragma unroll
    for (int q = 0; q < kPlanes; ++q) {
      p[q] = __float2bfloat16_rn(v);
      v -= __bfloat162float(p[q]);
    }
  }
};

// D (16 x 8, fp32) += A (16 x 16, bf16, row-major) · B (16 x 8, bf16, column-major).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with k = 8: A (16 x 8) in a0, a1, B (8 x 8) in b0, laid out as the first halves of the k16 fragments.
__device__ __forceinline__ void mma_bf16_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// Two bf16 as one word, lo in the low half: the layout of an mma fragment register.
__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | uint32_t(__bfloat16_as_ushort(hi)) << 16;
}

// Four 8x8 bf16 matrices from shared memory: lane L gives the address of row L % 8 of matrix
// L / 8 (16 bytes, 16-byte aligned); lane (g = lane / 4, tig = lane % 4) receives in r[m] the
// elements (g, 2tig), (g, 2tig + 1) of matrix m, or with trans (2tig, g), (2tig + 1, g).
template <bool trans> __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

// Two 8x8 bf16 matrices, as ldsm_x4 (lanes 0-15 give the rows), no transpose.
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
}

// The bf16 in the low or high half of a 32-bit word, as a float.
__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace mhc::cuda
