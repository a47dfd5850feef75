// dtype.h — element types mhc stores, and bf16 conversion (round to nearest even).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace mhc {

enum class DType { bf16, f32, f64 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
    case DType::f64: return "float64";
  }
  return "?";
}
inline size_t dtype_size(DType t) { return t == DType::bf16 ? 2 : t == DType::f32 ? 4 : 8; }

// bf16 bits: sign 15, exponent 7..14 (bias 127), mantissa 0..6 — the top half of a float.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even. NaN stays NaN (quiet), inf stays inf.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))  // NaN
    return bf16{uint16_t((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// Double -> bf16 through float would round twice; round the double directly.
inline bf16 double_to_bf16(double d) {
  float f = float(d);  // nearest float
  if (!std::isfinite(d) || double(f) == d) return float_to_bf16(f);
  // float rounding may have landed on a bf16 tie; nudge towards d so the tie breaks correctly.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0xffffu) == 0x8000u) u += (double(f) < d) == (f > 0) ? 1 : -1;
  std::memcpy(&f, &u, 4);
  return float_to_bf16(f);
}

// bf16 spacing at |v| (the distance to the next bf16 away from zero); subnormal spacing near 0.
inline double bf16_ulp(double v) {
  v = std::fabs(v);
  if (!(v >= 0x1p-126)) return 0x1p-133;
  if (v > 0x1p1000) return std::ldexp(1.0, std::ilogb(v) - 7);  // inf too
  uint64_t u;
  std::memcpy(&u, &v, 8);
  u = ((u >> 52) - 7) << 52;  // 2^(exponent of v - 7): the exponent field alone
  std::memcpy(&v, &u, 8);
  return v;
}

}  // namespace mhc
