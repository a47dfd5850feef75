// stats.h — summary numbers of a tensor (inspect, run's summary).
#pragma once
#include "tensor.h"

namespace mhc {

struct Stats {
  double min = 0, max = 0, mean = 0, rms = 0;  // over finite elements
  int64_t finite = 0, nan = 0, inf = 0;
};
Stats stats(const Tensor& t);

// Accumulates slabs of one tensor (inspect reads large datasets in pieces).
struct StatsAccumulator {
  void add(const Tensor& slab);
  Stats result() const;

 private:
  Stats s_;
  long double sum_ = 0, sq_ = 0;  // long: the mean of [1.7e308, 1.7e308] was inf (review B, session 21)
};

}  // namespace mhc
