#include "where.h"

#include <algorithm>
#include <cmath>

namespace mhc {

std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return idx;
}

std::vector<std::string> axis_names(const Stage& s, const Problem& p) {
  std::vector<std::string> names;
  for (Dim d : s.dims) switch (d) {
      case Dim::tok:
        if (p.tokens.size() == 1) names.push_back("token");
        else names.insert(names.end(), {"batch", "seq"});
        break;
      case Dim::n: names.push_back("n"); break;
      case Dim::d: names.push_back("D"); break;
      case Dim::nmix: names.push_back("N"); break;
      case Dim::k: names.push_back("K"); break;
      case Dim::three: names.push_back("3"); break;
    }
  return names;
}

namespace {

std::string ranges_str(const std::vector<std::pair<int64_t, int64_t>>& rs) {
  std::string out;
  for (size_t i = 0; i < rs.size() && i < 6; ++i)
    out += cat(i ? ", " : "", rs[i].first, rs[i].first == rs[i].second ? "" : cat("–", rs[i].second));
  if (rs.size() > 6) out += cat(", … (", rs.size(), " ranges)");
  return out;
}

// Which part of the N = 2n + n*n columns of phi the hit columns are.
std::string mix_block(const std::vector<uint8_t>& hit, int64_t n) {
  bool pre = false, post = false, diag = false, off = false, all_off = true;
  for (int64_t j = 0; j < int64_t(hit.size()); ++j) {
    bool is_off = j >= 2 * n && (j - 2 * n) / n != (j - 2 * n) % n;
    if (!hit[size_t(j)]) {
      all_off = all_off && !is_off;
      continue;
    }
    (j < n ? pre : j < 2 * n ? post : is_off ? off : diag) = true;
  }
  if (pre + post + (diag || off) != 1) return "";
  if (pre) return "h_pre";
  if (post) return "h_post";
  if (off && !diag) return all_off ? "h_res off-diagonal" : "h_res, off-diagonal only";
  return off ? "h_res" : "h_res diagonal";
}

std::string axis_words(const std::string& axis) {
  if (axis == "token") return "tokens";
  if (axis == "batch") return "batches";
  if (axis == "seq") return "positions";
  if (axis == "n") return "streams";
  if (axis == "3") return "gates";
  return "columns";
}

}  // namespace

Locator::Locator(const Shape& shape) : shape_(shape), hit_(shape.size()) {
  for (size_t d = 0; d < shape.size(); ++d) hit_[d].assign(size_t(shape[d]), 0);
}

void Locator::add(const uint8_t* mask, int64_t n, int64_t first) {
  std::vector<int64_t> idx = unravel(first, shape_);
  for (int64_t i = 0; i < n; ++i) {
    if (mask[i]) {
      if (first_ < 0) first_ = first + i;
      for (size_t d = 0; d < shape_.size(); ++d) hit_[d][size_t(idx[d])] = 1;
    }
    for (size_t d = shape_.size(); d-- > 0;) {  // next multi-index
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
}

void Locator::fill(StageReport& r, const Stage& s, const Problem& p, int64_t tile) const {
  const Shape& shape = shape_;
  std::vector<std::string> names = axis_names(s, p);
  r.where.clear();
  r.pattern.clear();
  if (first_ < 0) return;
  r.first_mismatch = unravel(first_, shape);
  std::vector<std::string> parts;
  for (size_t d = 0; d < shape.size(); ++d) {
    AxisRanges ax{d < names.size() ? names[d] : cat("axis", d), shape[d], {}};
    for (int64_t i = 0; i < shape[d]; ++i) {
      if (!hit_[d][size_t(i)]) continue;
      if (!ax.ranges.empty() && ax.ranges.back().second == i - 1) ax.ranges.back().second = i;
      else ax.ranges.push_back({i, i});
    }
    bool whole = ax.ranges.size() == 1 && ax.ranges[0].first == 0 && ax.ranges[0].second == shape[d] - 1;
    if (!whole) {
      std::string part = cat(axis_words(ax.axis), " ", ranges_str(ax.ranges));
      if (ax.axis == "N" || ax.axis == "K" || ax.axis == "D") part += cat(" of ", ax.axis);
      std::string block = ax.axis == "N" ? mix_block(hit_[d], p.n) : "";
      int64_t last_tile = (shape[d] - 1) / tile * tile;
      bool tail = shape[d] > tile && ax.ranges.front().first >= last_tile;
      if (tail) block += cat(block.empty() ? "" : "; ", "the last", shape[d] % tile ? ", partial" : "", " ", tile, "-tile");
      if (!block.empty()) part += cat(" (", block, ")");
      parts.push_back(part);
    }
    r.where.push_back(std::move(ax));
  }
  double frac = r.count ? double(r.mismatches) / double(r.count) : 0;
  if (parts.empty()) {
    r.pattern = frac > 0.5 ? "throughout the tensor"
                           : cat("scattered over every index of every axis (", std::round(frac * 1e4) / 100, "% of elements)");
    return;
  }
  for (size_t i = 0; i < parts.size(); ++i) r.pattern += cat(i ? "; " : "", parts[i]);
  r.pattern += " only";
}

HeatBinner::HeatBinner(const Shape& shape, const Stage& s, const Problem& p) {
  std::vector<std::string> names = axis_names(s, p);
  bool tokens = per_token(s);
  size_t lead = tokens ? p.tokens.size() : shape.empty() ? 0 : 1;
  int64_t rows = 1, cols = 1;
  for (size_t d = 0; d < shape.size(); ++d) (d < lead ? rows : cols) *= shape[d];
  if (shape.size() == 1) rows = 1, cols = shape[0];  // [3], [N]: one row
  Heatmap& h = heat_;
  h.row_axis = tokens ? "token" : shape.size() > 1 ? names[0] : "";
  for (size_t d = shape.size() == 1 ? 0 : lead; d < names.size(); ++d) h.col_axes += cat(h.col_axes.empty() ? "" : "×", names[d]);
  h.rows = std::min<int64_t>(rows, 64), h.cols = std::min<int64_t>(cols, 128);
  h.row_span = (rows + h.rows - 1) / h.rows, h.col_span = (cols + h.cols - 1) / h.cols;
  h.rows = (rows + h.row_span - 1) / h.row_span, h.cols = (cols + h.col_span - 1) / h.col_span;
  h.value.assign(size_t(h.rows * h.cols), 0.f);
  cols_ = cols;
}

void HeatBinner::add(const float* err, const uint8_t* mask, int64_t n, int64_t first, double limit) {
  Heatmap& h = heat_;
  const double scale = limit > 0 ? 1 / limit : 1;
  for (int64_t k = 0; k < n;) {  // row by row, bin by bin
    const int64_t i = first + k, row = i / cols_, col = i % cols_;
    const int64_t end = std::min(n, k + (std::min(cols_, (col / h.col_span + 1) * h.col_span) - col));
    double worst = 0;
    bool failing = false;
    for (int64_t j = k; j < end; ++j) worst = std::max(worst, double(err[j])), failing = failing || mask[j];
    double e = std::min(worst * scale, 1e6);
    if (failing) e = std::max(e, 1.5);
    float& v = h.value[size_t(row / h.row_span * h.cols + col / h.col_span)];
    v = std::max(v, float(e));
    k = end;
  }
}

}  // namespace mhc
