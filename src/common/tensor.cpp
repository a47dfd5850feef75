#include "tensor.h"

namespace mhc {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}

double Tensor::at(int64_t i) const {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(data<bf16>()[i]);
    case DType::f32: return data<float>()[i];
    case DType::f64: return data<double>()[i];
  }
  return 0;
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
  double s = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < t.size(); ++i)
    if (double v = t.at(i); std::isfinite(v)) s += v * v, ++n;
  double r = n ? std::sqrt(s / double(n)) : 0;
  return r > 0 ? r : 1;
}

std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> r(size_t(t.size()));
  for (int64_t i = 0; i < t.size(); ++i) r[size_t(i)] = t.at(i);
  return r;
}

}  // namespace mhc
