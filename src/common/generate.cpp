#include "generate.h"

#include <cmath>

namespace mhc {

uint64_t Rng::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next() >> 11) * 0x1p-53; }

double Rng::normal() {
  double u = 1.0 - uniform(), v = uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

Case generate_case(const Problem& p, uint64_t seed, bool gradients) {
  Case c;
  c.prob = p;
  Rng rng(seed);
  auto fill = [&](const char* name, auto draw) {
    Tensor t(stage_shape(stage(name), p), stage(name).dtype);
    for (int64_t i = 0; i < t.size(); ++i) t.set(i, draw());
    c.t[name] = std::move(t);
  };
  const double phi_sd = 1.0 / std::sqrt(double(p.K()));
  fill("x", [&] { return rng.normal(); });
  fill("phi", [&] { return phi_sd * rng.normal(); });
  fill("alpha", [&] { return 0.5 + rng.uniform(); });
  fill("bias", [&] { return 0.1 * rng.normal(); });
  fill("gamma", [&] { return 1.0 + 0.1 * rng.normal(); });
  if (gradients)
    for (const std::string& g : gradient_inputs()) fill(g.c_str(), [&] { return rng.normal(); });
  return c;
}

}  // namespace mhc
