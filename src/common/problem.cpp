#include "problem.h"

#include <sstream>
#include <stdexcept>

namespace mhc {

std::string Problem::str() const {
  std::string s = tokens.size() == 2 ? cat("B=", tokens[0], " S=", tokens[1]) : cat("T=", tokens[0]);
  return cat(s, " n=", n, " D=", D);
}

double min_bytes(const Problem& p, Pass pass) {
  const double T = double(p.T()), K = double(p.K()), N = double(p.N()), n = double(p.n), D = double(p.D);
  const double params = N * K * 4 + (3 + N + K) * 4;  // phi, alpha, bias, gamma
  const double fwd = T * K * 2 + params + T * D * 2 + T * (1 + N + 2 * n + n * n) * 4;
  const double bwd = T * K * 2 + T * D * 2 + T * (n + n * n) * 4 + params  // x, grads, parameters
                     + T * (1 + N + 2 * n) * 4                            // inv_rms, h_mix, h_pre, h_post
                     + T * K * 2 + N * K * 4 + (3 + N + K) * 4;           // dx, dphi, dalpha, dbias, dgamma
  return pass == Pass::fwd ? fwd : pass == Pass::bwd ? bwd : fwd + bwd;
}

uint64_t phi_elements(int64_t n, int64_t D) {
  uint64_t K, N, NK;
  const uint64_t u = uint64_t(n);
  if (__builtin_mul_overflow(u, uint64_t(D), &K) || __builtin_mul_overflow(u, u + 2, &N) ||
      __builtin_mul_overflow(N, K, &NK))
    return 0;
  return NK;
}

Problem parse_shape(const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);  // "4, 4, 8 " reads as 4,4,8
    size_t used = 0;
    long long x = -1;
    try {
      x = std::stoll(item, &used);
    } catch (const std::out_of_range&) {
      if (item.find_first_not_of("0123456789") == std::string::npos)
        fail("--shape ", text, ": ", item, " is too large (x [T,n,D] or phi [n*n+2n, n*D] would have more than 2^62 elements)");
    } catch (...) {
    }
    if (used != item.size() || x < 1)
      fail("--shape ", text, ": expected positive integers T,n,D or B,S,n,D");
    v.push_back(x);
  }
  if ((v.size() != 3 && v.size() != 4) || text.back() == ',') fail("--shape ", text, ": expected T,n,D or B,S,n,D");
  // x [T,n,D] and phi [n*n+2n, n*D] must be addressable: none of their products may overflow
  const uint64_t NK = phi_elements(v[v.size() - 2], v.back());
  uint64_t T = 1, TK = 0;
  bool overflow = NK == 0;
  for (size_t i = 0; i + 2 < v.size(); ++i) overflow |= __builtin_mul_overflow(T, uint64_t(v[i]), &T);
  overflow = overflow || __builtin_mul_overflow(T, uint64_t(v[v.size() - 2] * v.back()), &TK);
  if (overflow || TK > (uint64_t(1) << 62) || NK > (uint64_t(1) << 62))
    fail("--shape ", text, ": too large (x [T,n,D] or phi [n*n+2n, n*D] would have more than 2^62 elements)");
  Problem p;
  p.tokens.assign(v.begin(), v.end() - 2);
  p.n = v[v.size() - 2];
  p.D = v.back();
  return p;
}

}  // namespace mhc
