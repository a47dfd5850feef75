// generate.h — seeded, realistic random cases (mhc gen, tests, diff's default case).
#pragma once
#include <cstdint>

#include "case.h"

namespace mhc {

// x ~ N(0,1) in bf16; phi ~ N(0,1/K); alpha ~ U(0.5,1.5); bias ~ N(0,0.1^2);
// gamma ~ 1 + N(0,0.1^2); with gradients: dh_in ~ N(0,1) in bf16, dh_post, dh_res ~ N(0,1).
Case generate_case(const Problem& p, uint64_t seed, bool gradients);

// A small deterministic generator (splitmix64 + Box-Muller): same numbers on every platform.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next();
  double uniform();  // [0,1)
  double normal();
};

}  // namespace mhc
