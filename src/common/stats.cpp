#include "stats.h"

#include <cmath>
#include <limits>

namespace mhc {

Stats stats(const Tensor& t) {
  Stats s;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -s.min;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < t.size(); ++i) {
    double v = t.at(i);
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      ++s.finite;
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
      sum += v;
      sq += v * v;
    }
  }
  if (s.finite) {
    s.mean = sum / double(s.finite);
    s.rms = std::sqrt(sq / double(s.finite));
  } else {
    s.min = s.max = std::numeric_limits<double>::quiet_NaN();
  }
  return s;
}

}  // namespace mhc
