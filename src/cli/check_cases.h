// check_cases.h — the named cases of `mhc check`: shapes and inputs that break kernels
// (tails of K tiles, a second token tile, every n, odd and production hidden sizes, both
// layouts, no gamma, float32 inputs, saturating gates, extreme x, forward only, large eps).
#pragma once
#include <string>
#include <vector>

#include "case.h"

namespace mhc {

struct CheckCase {
  std::string name;   // "n6", "D65", "T257", "bs2x300", "no_gamma", ...
  std::string shape;  // "T,n,D" or "B,S,n,D"
  bool no_gamma = false, x_f32 = false, saturating = false, forward_only = false;
  // norm_eps = 1e-2 and hc_eps = 1e-3 instead of 1e-6: a kernel that does not read the
  // attributes misses by ~1000x its limit, where at 1e-6 it stays within the fp32 budget (docs/diff.md)
  bool large_eps = false;
  int x_exp = 0;  // x scaled by 2^x_exp (exact in bf16)
  std::string env, env_value;  // --vary: the backend runs with environment variable env = env_value
  Problem prob() const;
  uint64_t seed() const;  // fixed: from the name (without its "@VAR=value") and shape
};

// --vary VAR=V1,V2,..: every case once per value, named "NAME@VAR=V", with the same inputs.
std::vector<CheckCase> vary(const std::vector<CheckCase>& cases, const std::string& spec);

// quick (seconds), default (about a minute on the CPU backends), full (the axes crossed), or
// a file: one case a line, "NAME SHAPE [no_gamma] [x_f32] [saturating] [forward_only] [large_eps] [x_exp=E]",
// '#' starts a comment.
std::vector<CheckCase> check_cases(const std::string& set);

// The inputs of a case, generated with its seed.
Case make_inputs(const CheckCase& c);

}  // namespace mhc
