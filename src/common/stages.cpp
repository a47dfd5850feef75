#include "stages.h"

#include <algorithm>
#include <cctype>

namespace mhc {

using enum Dim;
static constexpr auto B16 = DType::bf16, F32 = DType::f32;

const std::vector<Stage>& stage_table() {
  static const std::vector<Stage> table = {
      // inputs
      {"x", Group::inputs, {tok, n, d}, B16, {}, "hidden streams"},
      {"phi", Group::inputs, {nmix, k}, F32, {}, "projection; rows: pre n, post n, res n*n"},
      {"alpha", Group::inputs, {three}, F32, {}, "gates of pre, post, res"},
      {"bias", Group::inputs, {nmix}, F32, {}, "bias of pre, post, res"},
      {"gamma", Group::inputs, {n, d}, F32, {}, "RMSNorm weight (optional, default ones)", Absent::ones},
      {"dh_in", Group::inputs, {tok, d}, B16, {}, "gradient of h_in", Absent::forward_only},
      {"dh_post", Group::inputs, {tok, n}, F32, {}, "gradient of h_post", Absent::forward_only},
      {"dh_res", Group::inputs, {tok, n, n}, F32, {}, "gradient of h_res", Absent::forward_only},
      // forward
      {"inv_rms", Group::forward, {tok}, F32, {"x"}, "1/sqrt(mean(x^2)+norm_eps)"},
      {"h_mix", Group::forward, {tok, nmix}, F32, {"x", "gamma", "phi"}, "(x*gamma) phi^T"},
      {"h_pre", Group::forward, {tok, n}, F32, {"h_mix", "inv_rms", "alpha", "bias"}, "sigmoid(..)+hc_eps"},
      {"h_post", Group::forward, {tok, n}, F32, {"h_mix", "inv_rms", "alpha", "bias"}, "2 sigmoid(..)", Absent::error, true},
      {"h_res", Group::forward, {tok, n, n}, F32, {"h_mix", "inv_rms", "alpha", "bias"}, "res logits", Absent::error, true},
      {"h_in", Group::forward, {tok, d}, B16, {"x", "h_pre"}, "sum_i h_pre[i] x[i,:]", Absent::error, true},
      // backward
      {"dh_pre", Group::backward, {tok, n}, F32, {"dh_in", "x"}, "dh_in . x[i,:]"},
      {"dh_mix", Group::backward, {tok, nmix}, F32,
       {"dh_pre", "dh_post", "dh_res", "h_pre", "h_post", "h_mix", "inv_rms", "alpha", "bias"}, "G * inv_rms"},
      {"dinv_rms", Group::backward, {tok}, F32,
       {"dh_pre", "dh_post", "dh_res", "h_pre", "h_post", "h_mix", "inv_rms", "alpha", "bias"}, "G . h_mix"},
      {"dvecX", Group::backward, {tok, n, d}, F32, {"dh_mix", "phi"}, "dh_mix phi: gradient of x*gamma"},
      {"dx", Group::backward, {tok, n, d}, B16,
       {"dvecX", "gamma", "dinv_rms", "inv_rms", "x", "h_pre", "dh_in"}, "gradient of x", Absent::error, true},
      {"dphi", Group::backward, {nmix, k}, F32, {"dh_mix", "x", "gamma"}, "sum_t dh_mix^T (x*gamma)", Absent::error, true},
      {"dalpha", Group::backward, {three}, F32,
       {"dh_pre", "dh_post", "dh_res", "h_pre", "h_post", "h_mix", "inv_rms", "alpha", "bias"}, "sum_t g . t", Absent::error, true},
      {"dbias", Group::backward, {nmix}, F32,
       {"dh_pre", "dh_post", "dh_res", "h_pre", "h_post", "h_mix", "inv_rms", "alpha", "bias"}, "sum_t g", Absent::error, true},
      {"dgamma", Group::backward, {n, d}, F32, {"x", "dvecX"}, "sum_t x * dvecX", Absent::error, true},
  };
  return table;
}

const Stage* find_stage(std::string_view name) {
  for (auto& s : stage_table())
    if (name == s.name) return &s;
  return nullptr;
}

const Stage& stage(std::string_view name) {
  const Stage* s = find_stage(name);
  MHC_CHECK(s, "unknown stage ", name);
  return *s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (std::tolower(a[i - 1]) != std::tolower(b[j - 1]))});
      diag = up;
    }
  }
  return row[b.size()];
}

const Stage* nearest_stage(const std::string& name, bool computed) {
  const Stage* best = nullptr;
  size_t best_d = 3;  // at most two edits away
  for (auto& s : stage_table()) {
    size_t d = edit_distance(name, s.name);
    if (d < best_d && !(computed && s.group == Group::inputs)) best = &s, best_d = d;
  }
  return best;
}

std::string suggest_stage(const std::string& path) {
  const Stage* best = nearest_stage(path.substr(path.rfind('/') + 1));
  return best ? cat("did you mean ", dataset_path(*best), "?") : "";
}

bool misspelled_group(const std::string& group) {
  if (group.size() < 2 || group[0] != '/' || group.find('/', 1) != std::string::npos) return false;
  const std::string name = group.substr(1);
  for (const char* g : {"inputs", "forward", "backward"})
    if (name != g && edit_distance(name, g) <= 2) return true;
  return false;
}

Shape stage_shape(const Stage& s, const Problem& p) {
  Shape r;
  for (Dim dim : s.dims) switch (dim) {
      case tok: r.insert(r.end(), p.tokens.begin(), p.tokens.end()); break;
      case n: r.push_back(p.n); break;
      case d: r.push_back(p.D); break;
      case nmix: r.push_back(p.N()); break;
      case k: r.push_back(p.K()); break;
      case three: r.push_back(3); break;
    }
  return r;
}

std::string stage_shape_str(const Stage& s) {
  static const char* names[] = {"..", "n", "D", "N", "K", "3"};
  std::string r = "[";
  for (size_t i = 0; i < s.dims.size(); ++i) r += cat(i ? "," : "", names[int(s.dims[i])]);
  return r + "]";
}

std::string shape_mismatch(const Stage& s, const Shape& stored, const Problem& p) {
  const Shape want = stage_shape(s, p);
  if (stored == want) return "";
  // the same axes in another order ([K,N] for [N,K]): a reshape would scramble it
  const bool permuted = stored.size() == want.size() && std::is_permutation(stored.begin(), stored.end(), want.begin());
  if (numel(stored) == numel(want))
    return cat("as ", shape_str(stored), ", the same ", numel(stored), " elements as the schema's ", stage_shape_str(s),
               " = ", shape_str(want), permuted ? ": if its axes are swapped, transpose it (a reshape would scramble it); "
                                                  "if it is flat or split, reshape it before writing"
                                                : ": reshape it before writing");
  return cat("as ", shape_str(stored), "; the schema says ", stage_shape_str(s), " = ", shape_str(want), " for ", p.str());
}

CaseBytes case_bytes(const Problem& p, bool f64, bool inputs_only) {
  CaseBytes b;
  for (auto& s : stage_table()) {
    if (inputs_only && s.group != Group::inputs) continue;
    double n = f64 ? 8.0 : double(dtype_size(s.dtype));
    for (Dim d : s.dims) n *= d == Dim::tok ? 1.0 : d == Dim::n ? double(p.n) : d == Dim::d ? double(p.D)
                            : d == Dim::nmix ? double(p.N()) : d == Dim::k ? double(p.K()) : 3.0;
    (per_token(s) ? b.per_token : b.fixed) += n;
  }
  return b;
}

std::string dataset_path(const Stage& s) { return cat("/", group_name(s.group), "/", s.name); }

DType stored_dtype(const Stage& s, Precision prec) {
  return prec == Precision::fp64 && s.group != Group::inputs ? DType::f64 : s.dtype;
}

bool per_token(const Stage& s) { return !s.dims.empty() && s.dims[0] == Dim::tok; }
bool is_token_sum(const Stage& s) { return s.group == Group::backward && !per_token(s); }

const Stage& shape_input() { return stage_table().front(); }

const std::vector<std::string>& gradient_inputs() {
  static const std::vector<std::string> g = [] {
    std::vector<std::string> names;
    for (const Stage& s : stage_table())
      if (s.absent == Absent::forward_only) names.push_back(s.name);
    return names;
  }();
  return g;
}

bool is_gradient_input(const std::string& name) {
  for (auto& g : gradient_inputs())
    if (g == name) return true;
  return false;
}

}  // namespace mhc
