// stats.h — summary numbers of a tensor (inspect, run's summary).
#pragma once
#include "tensor.h"

namespace mhc {

struct Stats {
  double min = 0, max = 0, mean = 0, rms = 0;  // over finite elements
  int64_t finite = 0, nan = 0, inf = 0;
};
Stats stats(const Tensor& t);

}  // namespace mhc
