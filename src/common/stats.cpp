#include "stats.h"

#include <cmath>
#include <limits>

namespace mhc {

void StatsAccumulator::add(const Tensor& t) {
  if (s_.finite + s_.nan + s_.inf == 0) s_.min = std::numeric_limits<double>::infinity(), s_.max = -s_.min;
  for (int64_t i = 0; i < t.size(); ++i) {
    double v = t.at(i);
    if (std::isnan(v)) {
      ++s_.nan;
    } else if (std::isinf(v)) {
      ++s_.inf;
    } else {
      ++s_.finite;
      s_.min = std::min(s_.min, v);
      s_.max = std::max(s_.max, v);
      sum_ += v;
      sq_ += (long double)v * v;
    }
  }
}

Stats StatsAccumulator::result() const {
  Stats s = s_;
  if (s.finite) {
    s.mean = double(sum_ / (long double)s.finite);
    s.rms = double(std::sqrt(sq_ / (long double)s.finite));
  } else {  // no finite element: no statistic (an all-NaN dataset showed mean 0)
    s.min = s.max = s.mean = s.rms = std::numeric_limits<double>::quiet_NaN();
  }
  return s;
}

Stats stats(const Tensor& t) {
  StatsAccumulator a;
  a.add(t);
  return a.result();
}

}  // namespace mhc
