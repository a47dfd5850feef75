// rounding.h — is a bf16 stage rounded the way a correct fp32-then-round-to-nearest-even
// kernel rounds it? (docs/diff.md, "Rounding")
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "diff.h"

namespace mhc {

// bf16 errors are counted in ulps of max(|value|, rms * kUlpFloor): for values that cancel
// to near zero, the fp32 arithmetic's absolute error (about 1e-5 rms at K = 28672) would
// otherwise be many of their own tiny ulps.
constexpr double kUlpFloor = 1.0 / 64;
// The smallest per-token unit, a fraction of the block's RMS (engine.cpp, unit_of): only so that a
// token whose row is exactly 0 is not divided by 0.
constexpr double kTinyUnit = 0x1p-40;

// Smallest error before rounding, in ulps, that is always allowed to flip a rounding.
constexpr double kTieFloorUlp = 1.0 / 1024;

// Whether every finite value of a is a bf16 value (stored as bf16, or wider); check_rounding
// judges only such values.
bool bf16_valued(const Tensor& a);

// Other fp64 replays of a stage that a correct kernel's values may be the rounding of
// (engine.cpp, gemm_replays): `count` of them, made one at a time.
struct Alternatives {
  int count = 0;
  std::function<Tensor(int)> make;
};

// a: A's stored values; exact: the stage recomputed in fp64 from A's own upstream tensors;
// alternatives: the lean is measured against exact and each of them, and the one A's tokens and
// columns fit best is kept (rounding.cpp: the 20th percentiles of the rows' and the columns'
// |mean u|, each relative to the least any replay gives); fp32: exact's
// replay in fp32 and left unrounded, to find A's exact ties; tau: the largest error before
// rounding the arithmetic explains, in ulps of `exact`; plain and oracle: the stage's plain
// class-C evaluation and the fp64 oracle, the lean's null (empty tensors: none); row: elements
// per token (the lean's rows and columns). Marks in `bad` the elements whose rounding nothing
// explains.
Rounding check_rounding(const Tensor& a, const Tensor& exact, const Alternatives& alternatives, const Tensor& fp32,
                        const Tensor& plain, const Tensor& oracle, double tau, int64_t row, std::vector<uint8_t>& bad);

// Sets bias_ulp and the reason from the counts (also of counts added up over token blocks).
void explain(Rounding& r);

}  // namespace mhc
