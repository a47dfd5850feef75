#include "tensor.h"

#include <algorithm>

namespace mhc {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}

void Tensor::set(int64_t i, double v) {
  switch (dtype) {
    case DType::bf16: data<bf16>()[i] = double_to_bf16(v); break;
    case DType::f32: data<float>()[i] = float(v); break;
    case DType::f64: data<double>()[i] = v; break;
  }
}

Tensor convert(const Tensor& t, DType to) {
  if (t.dtype == to) return t;
  Tensor r(t.shape, to);
  for (int64_t i = 0; i < t.size(); ++i) r.set(i, t.at(i));
  return r;
}

double finite_rms(const Tensor& t) {
  // fixed pieces on all threads, added in order: the same bits on any thread count
  constexpr int64_t kPiece = int64_t(1) << 16;
  const int64_t size = t.size(), pieces = (size + kPiece - 1) / kPiece;
  std::vector<double> part(size_t(pieces), 0.0);
  std::vector<int64_t> count(size_t(pieces), 0);
  visit(t, [&](auto p) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < pieces; ++c) {
      double s = 0;
      int64_t k = 0;
      for (int64_t i = c * kPiece; i < std::min(size, (c + 1) * kPiece); ++i)
        if (double v = as_double(p[i]); std::isfinite(v)) s += v * v, ++k;
      part[size_t(c)] = s, count[size_t(c)] = k;
    }
  });
  double s = 0;
  int64_t n = 0;
  for (int64_t c = 0; c < pieces; ++c) s += part[size_t(c)], n += count[size_t(c)];
  double r = n ? std::sqrt(s / double(n)) : 0;
  return r > 0 ? r : 1;
}

std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> r(size_t(t.size()));
  for (int64_t i = 0; i < t.size(); ++i) r[size_t(i)] = t.at(i);
  return r;
}

}  // namespace mhc
