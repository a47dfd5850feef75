#include "case.h"

#include <algorithm>
#include <cmath>

namespace mhc {

const Tensor& Case::get(const std::string& name) const {
  auto it = t.find(name);
  MHC_CHECK(it != t.end(), "stage ", name, " not in case");
  return it->second;
}

bool Case::has_gradients() const {
  for (auto& g : gradient_inputs())
    if (!has(g)) return false;
  return true;
}

std::string Case::storage_problem(const Stage& s) const {
  if (auto m = misshapen.find(s.name); m != misshapen.end()) return m->second;
  if (auto it = stored_as.find(s.name); it != stored_as.end())
    return cat("as ", it->second, ", which cannot hold ", dtype_name(s.dtype), " values exactly: store float32 or float64");
  const Tensor& x = get(s.name);
  if (s.dtype == DType::f32 && x.dtype == DType::bf16) return "as bfloat16; it is a float32 stage: store float32 or float64";
  return shape_mismatch(s, x.shape, prob);
}

Case Case::inputs_only() const {
  Case c;
  c.prob = prob;
  for (auto& [name, tensor] : t)
    if (stage(name).group == Group::inputs) c.t[name] = tensor;
  return c;
}

std::string Case::first_failed(int64_t token_offset) const {
  // why token i's values failed, from its x: "" where x does not tell
  auto cause = [&](int64_t i) -> std::string {
    if (!has("x") || prob.T() == 0) return "";
    const Tensor& x = get("x");
    const int64_t K = x.size() / prob.T();
    double m = 0;
    for (int64_t k = 0; k < K; ++k) m = std::max(m, std::abs(x.at(i * K + k)));
    if (m == 0) return prob.norm_eps == 0 ? ": x is all zero there and norm_eps = 0" : "";
    if (m * m * double(K) >= std::ldexp(1.0, 128))
      return cat(": |x| reaches 2^", std::ilogb(m), " there, and the sum of its squares overflows float32 (fp64 evaluates it: "
                 "--precision fp64, or the cpu:fp64 backend)");
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += x.at(i * K + k) * x.at(i * K + k);
    if (ss / double(K) + prob.norm_eps < std::ldexp(1.0, -84))  // inv_rms^3 = (mean + eps)^-1.5 passes 2^126
      return cat(": |x| is at most 2^", std::ilogb(m), " there and norm_eps = ", prob.norm_eps,
                 ", so inv_rms^3 (in dx) or the squares of x are beyond float32 (fp64 evaluates it: --precision fp64, or "
                 "the cpu:fp64 backend)");
    return "";
  };
  for (const Stage& s : stage_table()) {
    if (s.group == Group::inputs || !has(s.name)) continue;
    const Tensor& x = get(s.name);
    const bool zero_ok = s.name != std::string("inv_rms");  // 1/sqrt(sum + eps) > 0 for finite sums
    const int64_t i = visit(x, [&](auto p) {
      for (int64_t k = 0; k < x.size(); ++k)
        if (double v = as_double(p[k]); !std::isfinite(v) || (!zero_ok && v == 0)) return k;
      return int64_t(-1);
    });
    if (i < 0) continue;
    const std::string what = std::isfinite(x.at(i)) ? "0" : "not finite";
    if (!per_token(s)) return cat(s.name, " at element ", i, " is ", what);
    const int64_t t = i / std::max<int64_t>(1, x.size() / prob.T());
    return cat(s.name, " at token ", token_offset + t, " is ", what, cause(t));
  }
  return "";
}

Case Case::token_slice(int64_t t0, int64_t t1) const {
  MHC_CHECK(0 <= t0 && t0 < t1 && t1 <= prob.T(), "token slice ", t0, ":", t1, " of ", prob.T());
  Case c;
  c.prob = prob;
  c.prob.tokens = {t1 - t0};
  c.attrs = attrs, c.stored_as = stored_as, c.unknown = unknown, c.misshapen = misshapen;
  for (auto& [name, tensor] : t) {
    const Stage& s = stage(name);
    if (s.dims.empty() || s.dims[0] != Dim::tok) {
      if (s.group == Group::inputs) c.t[name] = tensor;  // parameters; sums over tokens are dropped
      continue;
    }
    const size_t lead = prob.tokens.size();
    if (std::string how = shape_mismatch(s, tensor.shape, prob); !how.empty()) {
      c.misshapen.emplace(name, how);  // left out, for the diff to report
      continue;
    }
    int64_t per = tensor.size() / prob.T();  // elements per token
    Shape shape = {t1 - t0};
    shape.insert(shape.end(), tensor.shape.begin() + int64_t(lead), tensor.shape.end());
    Tensor part(shape, tensor.dtype);
    size_t bytes = size_t(per) * dtype_size(tensor.dtype);
    std::copy_n(tensor.bytes.begin() + ptrdiff_t(size_t(t0) * bytes), size_t(t1 - t0) * bytes, part.bytes.begin());
    c.t[name] = std::move(part);
  }
  return c;
}

}  // namespace mhc
