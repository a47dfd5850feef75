// where.h — where in a stage's tensor the mismatches lie: per-axis index ranges, the
// first mismatching index, a one-line pattern, and a binned heatmap of error/limit.
#pragma once
#include <cstdint>
#include <vector>

#include "diff.h"

namespace mhc {

std::vector<int64_t> unravel(int64_t i, const Shape& shape);

// Axis names of the stage's stored shape: token (or batch, seq), n, D, N, K, 3.
std::vector<std::string> axis_names(const Stage& s, const Problem& p);

// Where a stage's mismatches lie, gathered block of elements by block over the stage's
// whole shape: per-axis index ranges, the first mismatching index and a one-line pattern.
class Locator {
 public:
  explicit Locator(const Shape& shape);
  void add(const uint8_t* mask, int64_t n, int64_t first);  // mask of elements first..first+n-1 (row-major)
  // Fills r.where, r.first_mismatch and r.pattern (nothing when no element was marked).
  void fill(StageReport& r, const Stage& s, const Problem& p, int64_t tile) const;

 private:
  Shape shape_;
  std::vector<std::vector<uint8_t>> hit_;  // per axis: indices holding a mismatch
  int64_t first_ = -1;
};

// The heatmap of error over limit over a stage's whole shape, filled block by block; a
// failing element (mask) shows at least at 1.5x the limit, also when it fails through the
// rounding check.
class HeatBinner {
 public:
  HeatBinner(const Shape& shape, const Stage& s, const Problem& p);
  void add(const float* err, const uint8_t* mask, int64_t n, int64_t first, double limit);
  const Heatmap& heat() const { return heat_; }

 private:
  Heatmap heat_;
  int64_t cols_ = 1;  // elements per row
};

}  // namespace mhc
