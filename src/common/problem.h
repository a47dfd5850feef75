// problem.h — one mHC pre problem: token layout, n streams, D channels, epsilons.
#pragma once
#include <string>

#include "tensor.h"

namespace mhc {

enum class Precision { fp32, fp64 };
inline const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "fp64"; }

enum class Pass { fwd, bwd, both };  // which half of the operator to run or time

// Elements of phi [n*n+2n, n*D], or 0 where a product overflows 64 bits (n, D >= 1): checked
// before n*D or n*n+2n is formed from a shape that came from outside.
uint64_t phi_elements(int64_t n, int64_t D);

// g_pre's sigmoid s is recovered as h_pre − hc_eps, as kernels that keep only h_pre do (an h_pre
// off the oracle then shows downstream as inherited error), except in its tails, where that loses
// more than 6 bits and s and 1 − s are evaluated from z: s < hc_eps / kPreLow (s = 1e-11 kept
// two digits in fp32) and 1 − s < kGateHigh, 64 fp32 ulps of 1 (1 + hc_eps rounds: at z = 30,
// s(1 − s) came out 1e6 times too large). g_post's h_post (1 − h_post/2) likewise, from z where
// 1 − h_post/2 < kGateHigh (it cancels there: 0 in fp32 beyond z = 17, in fp64 beyond z = 37).
// The same tails at fp64, so that its replays see a kernel the same way; none in plain
// evaluations (GateGrads).
constexpr double kPreLow = 64, kGateHigh = 0x1p-17;

struct Problem {
  Shape tokens;  // [T] or [B,S]: the leading dimensions of every per-token tensor
  int64_t n = 0, D = 0;
  double norm_eps = 1e-6, hc_eps = 1e-6;

  int64_t T() const { return numel(tokens); }
  int64_t K() const { return n * D; }
  int64_t N() const { return n * n + 2 * n; }
  std::string str() const;  // "T=64 n=4 D=256" or "B=2 S=32 n=4 D=256"
};

// The fewest bytes a pass must move through memory: inputs read once, outputs written once
// (intermediates such as dvecX not counted). Used for effective GB/s.
double min_bytes(const Problem& p, Pass pass);

// Parses "T,n,D" or "B,S,n,D"; throws UserError naming the option on bad text.
Problem parse_shape(const std::string& text);

}  // namespace mhc
