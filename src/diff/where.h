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

// Fills r.where, r.first_mismatch and r.pattern from the mismatch mask (row-major over shape);
// token indices start at token_offset (diff --tokens).
void locate(StageReport& r, const std::vector<uint8_t>& mask, const Shape& shape, const Stage& s, const Problem& p,
            int64_t tile, int64_t token_offset = 0);

// Fills r.heat from the per-element errors; a failing element (mask) shows at least at 1.5x
// the limit, also when it fails through the rounding check.
void heatmap(StageReport& r, const std::vector<double>& err, const std::vector<uint8_t>& mask, double limit,
             const Shape& shape, const Stage& s, const Problem& p);

}  // namespace mhc
