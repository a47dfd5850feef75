// tensor.h — a dense row-major tensor: shape, dtype and bytes. Nothing more.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtype.h"
#include "error.h"

namespace mhc {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
std::string shape_str(const Shape& s);  // "[4,2,16]"

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

// Leaves elements uninitialised: every producer writes every element of its tensors, and
// skipping the zero fill saves a pass over memory on the large ones.
template <class T> struct NoInit : std::allocator<T> {
  template <class U> struct rebind {
    using other = NoInit<U>;
  };
  template <class U> void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }
  template <class U, class... A> void construct(U* p, A&&... a) { ::new (static_cast<void*>(p)) U(std::forward<A>(a)...); }
};

struct Tensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<unsigned char, NoInit<unsigned char>> bytes;

  Tensor() = default;
  Tensor(Shape s, DType t) : shape(std::move(s)), dtype(t), bytes(size_t(numel(shape)) * dtype_size(t)) {}

  int64_t size() const { return numel(shape); }
  template <class T> T* data() {
    MHC_CHECK(dtype_of<T>() == dtype, "tensor is ", dtype_name(dtype));
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T> const T* data() const { return const_cast<Tensor*>(this)->data<T>(); }

  double at(int64_t i) const {  // element i as double, whatever the dtype
    const unsigned char* p = bytes.data();
    switch (dtype) {
      case DType::bf16: return bf16_to_float(reinterpret_cast<const bf16*>(p)[i]);
      case DType::f32: return reinterpret_cast<const float*>(p)[i];
      case DType::f64: return reinterpret_cast<const double*>(p)[i];
    }
    return 0;
  }
  void set(int64_t i, double v);  // stores v rounded to the dtype (nearest even)
};

inline double as_double(bf16 v) { return bf16_to_float(v); }
inline double as_double(float v) { return v; }
inline double as_double(double v) { return v; }

// f(p) with p the tensor's elements as a typed pointer (const bf16*, const float* or
// const double*): loops over elements without a dtype switch per element.
template <class F> decltype(auto) visit(const Tensor& t, F&& f) {
  const unsigned char* p = t.bytes.data();
  switch (t.dtype) {
    case DType::bf16: return f(reinterpret_cast<const bf16*>(p));
    case DType::f32: return f(reinterpret_cast<const float*>(p));
    default: return f(reinterpret_cast<const double*>(p));
  }
}

// Element-wise conversion to another dtype (round to nearest even).
Tensor convert(const Tensor& t, DType to);
// RMS of the finite elements; 1 when that is 0 (a scale that is never zero).
double finite_rms(const Tensor& t);
// All elements as doubles.
std::vector<double> to_f64(const Tensor& t);

using TensorMap = std::map<std::string, Tensor>;

}  // namespace mhc
