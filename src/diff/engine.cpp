// engine.cpp — the diff itself: per stage, metrics against B, the accuracy class from the
// budgets of references.h, the rounding check of bf16 stages, the replay that tells an
// introduced error from an inherited one, and where the mismatches lie (docs/diff.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "diff.h"
#include "rounding.h"
#include "block.h"
#include "where.h"

namespace mhc {

const char* status_name(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::diverged: return "diverged";
    case Status::inherited: return "inherited";
    case Status::missing: return "missing";
    case Status::unknown: return "unknown";
    case Status::format: return "format";
  }
  return "?";
}

const char* verdict_name(Verdict v) {
  return v == Verdict::match ? "match" : v == Verdict::diverged ? "diverged" : "invalid";
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Accuracy kClasses[] = {Accuracy::fp32, Accuracy::tf32, Accuracy::bf16};
constexpr double kSigmas = 3.7;  // how far (in sigmas) a correct kernel's largest error may reach

// A stage's unit of error: bf16 ulps of the reference value (taken at least at rms/64 so
// that values cancelling to ~0 don't make every ulp tiny), or fractions of a reference scale.
// That scale is the block's RMS, except in a per-token stage, where a token larger than most
// takes its own: the token's row RMS, at least the block's median row RMS (and the block's RMS
// / 64, kUlpFloor). With the block's RMS alone, a few tokens far larger than the rest set the
// unit for all: 16 padding tokens (x = 0: inv_rms = 1/sqrt(norm_eps) = 1000) made inv_rms's RMS
// 354, and an inv_rms 1.2e-4 off on every real token passed, as did an h_mix 1e-4 off beside one
// token of 64x activations (review A, session 19). A token smaller than most keeps the common
// scale: a row whose terms cancel to near 0 carries the error of its terms, not of its value, and
// its own scale (tried first) failed a correct kernel's dh_pre there at 2.9x its limit (review E).
struct Unit {
  bool ulp = false;
  double rms = 1;
  std::vector<double> row;  // fp32 per-token stages: each token's scale; empty: rms for every element
  int64_t row_len = 1;
  std::vector<int64_t> segment;  // where given, row_len columns in segments of these lengths, each its own scale
  std::vector<double> floor;     // bf16 stages: each token's floor of the ulp's value; empty: rms * kUlpFloor
  double scale(int64_t i) const {
    if (row.empty()) return rms;
    if (segment.empty()) return row[size_t(i / row_len)];
    int64_t c = i % row_len, g = 0;
    while (c >= segment[size_t(g)]) c -= segment[size_t(g++)];
    return row[size_t((i / row_len) * int64_t(segment.size()) + g)];
  }
  double operator()(int64_t i, double diff, double ref) const {
    return ulp ? diff / bf16_ulp(std::max(std::fabs(ref), floor.empty() ? rms * kUlpFloor : floor[size_t(i / row_len)]))
               : diff / scale(i);
  }
};

// The RMS of the finite values in columns [c0, c1) of row `row` of t, rows of `row_len`.
double row_rms(const Tensor& t, int64_t row_len, int64_t row, int64_t c0, int64_t c1) {
  double sq = 0;
  int64_t k = 0;
  for (int64_t c = c0; c < c1; ++c)
    if (const double v = t.at(row * row_len + c); std::isfinite(v)) sq += v * v, ++k;
  return k ? std::sqrt(sq / double(k)) : 0.0;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Each token's RMS of t ([T,..]) over the median of the block's (empty where the median is 0).
std::vector<double> token_scales(const Tensor& t, int64_t T) {
  if (T <= 0 || t.size() % T != 0) return {};
  std::vector<double> r(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) r[size_t(i)] = row_rms(t, t.size() / T, i, 0, t.size() / T);
  const double mid = median(r);
  if (!(mid > 0) || !std::isfinite(mid)) return {};
  for (double& v : r) v /= mid;
  return r;
}

// The block's tokens' scales (token_scales) of x and of the oracle's inv_rms: how a token's rows
// of some stages grow with its activations.
struct TokenScales {
  std::vector<double> x, inv;
};

// How a correct kernel's error in a token's row (or a segment of a row) scales. Review A, session
// 20: token 0 of 1024x activations had inv_rms 1e-3 off, a token of 2^-10 x h_mix 1e-3 off, the
// post and res columns of token 0's dh_mix 1e-2 off, and each matched: those rows kept the common
// scale, 1000x their own, and every stage after them was excused as "over its limit only by its
// inputs' within-budget errors".
// - relative: with the value itself (inv_rms: positive, from a sum of squares, no cancellation):
//   the token's own RMS is its unit;
// - with_x / with_inv: the segment's median over the block's tokens, scaled by the token's x or
//   inv_rms over the block's median one: h_mix, dh_pre and dinv_rms are sums of terms linear in x,
//   dh_mix's res columns dh_res alpha inv_rms. A token of normal scale whose terms cancel keeps the
//   common floor;
// - common: the rule above (the whole row's RMS, at least the block's median row RMS and RMS / 64).
//   dh_mix's pre and post columns keep it: with saturated gates (s(1 - s) tiny, and cancelling in
//   fp32) a unit of their own failed the golden against PyTorch's autograd (tests/torch_sat_*).
enum class Scaling { common, relative, with_x, with_inv };

// ref: the stage over a block of `tokens` tokens. dh_mix's rows are two segments, the pre and post
// columns and the res columns. dphi [N,K] gets a unit per row j, at least the stage's RMS / 64:
// its rows are sums over tokens of dh_mix[t,j] x[t,k], and beside a token of 1024x activations
// the n pre rows were 1000x the others, set the stage's RMS, and a 1e-3 error in all the other
// rows passed (review A, session 20).
Unit unit_of(const Stage& s, const Tensor& ref, int64_t tokens, const TokenScales& ts) {
  Unit u;
  u.ulp = s.dtype == DType::bf16, u.rms = finite_rms(ref);
  const std::string name = s.name;
  const bool dphi_rows = name == "dphi" && ref.shape.size() == 2 && ref.shape[0] > 0;
  if (u.ulp && name == "h_in" && tokens > 0 && int64_t(ts.x.size()) == tokens && ref.size() % tokens == 0) {
    // h_in = sum_i h_pre[i] x[i,:] shrinks with its token's x: a token of 2^-16 x whose h_in was
    // 1% off matched under the common floor (review A, session 22). A token smaller than most
    // takes the floor times its x scale; the others keep the common floor.
    u.row_len = ref.size() / tokens;
    u.floor.resize(size_t(tokens));
    for (int64_t t = 0; t < tokens; ++t) u.floor[size_t(t)] = u.rms * kUlpFloor * std::clamp(ts.x[size_t(t)], kTinyUnit, 1.0);
  }
  if (u.ulp || (!per_token(s) && !dphi_rows) || tokens <= 0) return u;
  const int64_t rows = dphi_rows ? ref.shape[0] : tokens;
  if (ref.size() % rows != 0) return u;
  u.row_len = ref.size() / rows;
  std::vector<Scaling> how = {name == "inv_rms"                                          ? Scaling::relative
                              : name == "h_mix" || name == "dh_pre" || name == "dinv_rms" ? Scaling::with_x
                                                                                          : Scaling::common};
  if (name == "dh_mix" && !dphi_rows) {
    const int64_t n = int64_t(std::lround(std::sqrt(double(u.row_len) + 1))) - 1;  // N = n^2 + 2n
    if (n > 0 && n * n + 2 * n == u.row_len) u.segment = {2 * n, n * n}, how = {Scaling::common, Scaling::with_inv};
  }
  const size_t segs = std::max<size_t>(1, u.segment.size());
  std::vector<double> whole(static_cast<size_t>(rows));
  for (int64_t t = 0; t < rows; ++t) whole[size_t(t)] = row_rms(ref, u.row_len, t, 0, u.row_len);
  const double tiny = u.rms * kTinyUnit;  // an exact 0 (x = 0) is 0 in every kernel
  const double common = std::max(median(whole), u.rms * kUlpFloor);
  u.row.resize(size_t(rows) * segs);
  for (size_t g = 0, c0 = 0; g < segs; c0 += size_t(u.segment.empty() ? u.row_len : u.segment[g]), ++g) {
    const int64_t c1 = int64_t(c0) + (u.segment.empty() ? u.row_len : u.segment[g]);
    std::vector<double> own(static_cast<size_t>(rows));
    for (int64_t t = 0; t < rows; ++t) own[size_t(t)] = segs == 1 ? whole[size_t(t)] : row_rms(ref, u.row_len, t, int64_t(c0), c1);
    Scaling h = how[g];
    const std::vector<double>& by = h == Scaling::with_x ? ts.x : ts.inv;
    if ((h == Scaling::with_x || h == Scaling::with_inv) && int64_t(by.size()) != tokens) h = Scaling::common;
    const double mid = median(own);
    for (int64_t t = 0; t < rows; ++t) {
      const double r = own[size_t(t)];
      u.row[size_t(t) * segs + g] = dphi_rows                ? std::max(r, u.rms * kUlpFloor)
                                    : h == Scaling::relative ? std::max(r, tiny)
                                    : h == Scaling::common   ? std::max(whole[size_t(t)], common)
                                                             : std::max({r, mid * by[size_t(t)], tiny});
    }
  }
  return u;
}

// E_C is the largest of m element errors of one plain evaluation: one sample of a maximum,
// noisy when m is small. The factor scales it to what a correct kernel's largest error can
// reach (about 3.7 sigma) from the sigma that E_C understates with probability 1% at most:
// the 1% quantile of the largest of m half-normal errors is q(m) sigma, erf(q/sqrt2) = 0.01^(1/m).
double small_sample(int64_t m) {
  const double p = std::pow(0.01, 1.0 / double(std::max<int64_t>(m, 1)));
  double lo = 0, hi = 10;  // erf(q / sqrt 2) = p, by bisection
  for (int i = 0; i < 60; ++i) (std::erf((lo + hi) / 2 / std::sqrt(2.0)) < p ? lo : hi) = (lo + hi) / 2;
  return std::max(1.0, kSigmas / lo);
}

double noise_floor(const Stage& s) { return s.dtype == DType::bf16 ? 0.25 : 1e-6; }

// torch.testing.assert_close's defaults, by the stage's dtype.
std::pair<double, double> default_tol(const Stage& s) {
  return s.dtype == DType::bf16 ? std::pair{1e-5, 1.6e-2} : std::pair{1e-5, 1.3e-6};
}

// |a - b| with the special values: NaN vs NaN and equal infinities are 0, else non-finite is inf.
double elem_diff(double x, double y) {
  if ((std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y)) return 0;
  if (!std::isfinite(x) || !std::isfinite(y)) return kInf;
  return std::fabs(x - y);
}

double as_bf16(double v) { return bf16_to_float(double_to_bf16(v)); }

// Largest element error of t against the oracle o; bf16 stages rounded first (the plain
// evaluations keep h_in and dx unrounded).
double max_error(const Tensor& t, const Tensor& o, const Unit& u, bool round) {
  return visit(t, [&](auto tp) {
    return visit(o, [&](auto op) {
      double e = 0;
#pragma omp parallel for schedule(static) reduction(max : e)
      for (int64_t i = 0; i < o.size(); ++i) {
        double v = round ? as_bf16(as_double(tp[i])) : as_double(tp[i]), r = as_double(op[i]);
        e = std::max(e, u(i, elem_diff(v, r), r));
      }
      return e;
    });
  });
}

// The metrics of a against b, and each element's error in `u` (fixed policy: |a-b| - rtol|b|
// over atol, so that > 1 fails).
template <class Scaled>
StageReport measure(const std::string& name, const Tensor& a, const Tensor& b, std::vector<double>& err,
                    const Scaled& scaled) {
  // Fixed chunks on all threads, merged in chunk order: the same bits on any thread count.
  struct Part {
    double num = 0, den = 0, worst = -1, max_rel = 0, err_max = 0;
    int64_t worst_i = 0, nan_a = 0, inf_a = 0, nan_b = 0, inf_b = 0;
  };
  auto held = [](const Tensor& t) { return t.bytes.size() == size_t(t.size()) * dtype_size(t.dtype); };
  MHC_CHECK(a.shape == b.shape && held(a) && held(b), name, ": measured as ", shape_str(a.shape), " against ",
            shape_str(b.shape));
  const int64_t n = b.size(), chunk = kElementChunk, chunks = (n + chunk - 1) / chunk;
  std::vector<Part> parts(static_cast<size_t>(chunks));
  err.assign(size_t(n), 0);
  visit(a, [&](auto ap) {
    visit(b, [&](auto bp) {
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        Part& p = parts[size_t(c)];
        for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
          double x = as_double(ap[i]), y = as_double(bp[i]), d = elem_diff(x, y);
          p.nan_a += std::isnan(x), p.inf_a += std::isinf(x), p.nan_b += std::isnan(y), p.inf_b += std::isinf(y);
          if (d != kInf && std::isfinite(y)) {  // not NaN against NaN, nor equal infinities
            p.num += d * d, p.den += y * y;
            if (y != 0) p.max_rel = std::max(p.max_rel, d / std::fabs(y));
          } else if (d == kInf && std::isfinite(y)) {  // A's NaN or Inf against a finite B: rel_l2 inf (it was
            p.num = kInf, p.max_rel = kInf;           // the finite elements' alone; review A, session 24)
          }
          if (d > p.worst) p.worst = d, p.worst_i = i;
          err[size_t(i)] = d == kInf ? kInf : scaled(i, d, y);
          p.err_max = std::max(p.err_max, err[size_t(i)]);
        }
      }
    });
  });
  StageReport r;
  r.name = name;
  r.count = n;
  Part all;
  for (const Part& p : parts) {
    all.num += p.num, all.den += p.den, all.max_rel = std::max(all.max_rel, p.max_rel);
    all.err_max = std::max(all.err_max, p.err_max);
    all.nan_a += p.nan_a, all.inf_a += p.inf_a, all.nan_b += p.nan_b, all.inf_b += p.inf_b;
    if (p.worst > all.worst) all.worst = p.worst, all.worst_i = p.worst_i;
  }
  r.nan_a = all.nan_a, r.inf_a = all.inf_a, r.nan_b = all.nan_b, r.inf_b = all.inf_b, r.max_rel = all.max_rel;
  r.l2_num = all.num, r.l2_den = all.den;
  r.rel_l2 = rel_l2(all.num, all.den);
  r.max_abs = std::max(all.worst, 0.0);
  r.error = all.err_max;
  r.max_abs_index = unravel(all.worst_i, b.shape);
  r.a_at = n ? a.at(all.worst_i) : 0;
  r.b_at = n ? b.at(all.worst_i) : 0;
  r.compared = true;
  return r;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype == b.dtype) return a.bytes == b.bytes;
  for (int64_t i = 0; i < a.size(); ++i) {
    double x = a.at(i), y = b.at(i);
    if (!(x == y || (std::isnan(x) && std::isnan(y))) || std::signbit(x) != std::signbit(y)) return false;
  }
  return true;
}

// A stage stored in another shape, or in a type that loses what the stage holds.
std::string format_problem(const Stage& s, const Case& c, const char* side) {
  const std::string how = c.storage_problem(s);
  return how.empty() ? "" : cat(side, " stores ", s.name, " ", how);
}

// Each element's error and mismatch flag (the caller's where and heatmap), and A - B for --dump-diff.
void keep(StageReport& r, const std::vector<double>& err, std::vector<uint8_t>& mask, const Tensor& a, const Tensor& b,
          const DiffOptions& opt) {
  r.elem_error.assign(err.begin(), err.end());
  r.elem_mask = std::move(mask);
  if (!opt.keep_elements) return;
  r.elem_diff.resize(err.size());
  for (int64_t i = 0; i < b.size(); ++i) r.elem_diff[size_t(i)] = float(a.at(i) - b.at(i));
}

// Whether B holds stage d in the schema's shape.
bool b_fits(const Case& b, const char* d) {
  return b.has(d) && (stage(d).group == Group::inputs || b.get(d).shape == stage_shape(stage(d), b.prob));
}

// Stage `name` recomputed in fp64 from B's own upstream tensors (the oracle's where B lacks one).
Tensor replay_in_b(const std::string& name, const Case& b, References& refs, Arith arith = Precision::fp64) {
  TensorMap deps;
  for (const char* d : stage(name).deps) deps[d] = b_fits(b, d) ? b.get(d) : refs.oracle().get(d);
  return cpu_stage(name, b.prob, deps, arith);
}

// Whether stage d is a GEMM with phi (h_mix, dvecX).
bool reads_phi(const char* d) {
  const std::vector<const char*>& up = stage(d).deps;
  return std::any_of(up.begin(), up.end(), [](const char* u) { return std::string_view(u) == "phi"; });
}

// The other fp64 replays of stage `name` whose rounding a correct kernel of class c (TF32, bf16)
// may dump (check_rounding's alternatives): each upstream GEMM with phi (dvecX, for dx) made
// again from its operands as the side holds them, each operand exact or rounded as the class's
// GEMM reads it, and phi also as gamma-folded weights (phi*gamma rounded, then divided by gamma
// again). A kernel may form dx without the dvecX it dumps (gamma in its weights, the norm's
// textbook backward) or dump none, and its GEMM's error is coherent over a token (the rounding
// of the token's N dh_mix values scales its dvecX) and over a column (phi's rounding): a correct
// bf16 kernel's token leaned 0.33 ulp from the replay through the dumped dvecX (1 seed in 25;
// session 24), and with gamma 1e3 and 1e-3 in turn a fused one's column 0.46 ulp from it.
// value(d): the side's value of d, as the replay reads it (kept by the caller while the result is used).
Alternatives gemm_replays(const std::string& name, const Problem& p, Accuracy c,
                          std::function<const Tensor&(const char*)> value) {
  const std::vector<const char*>& deps = stage(name).deps;
  if (c == Accuracy::fp32 || std::none_of(deps.begin(), deps.end(), reads_phi)) return {};
  const Operands o = plain_arith(c).operands;
  // k = 2 w + r: phi exact, rounded, rounded as phi*gamma (w = 0, 1, 2); the other operand
  // (dh_mix) exact or rounded (r = 0, 1)
  return {6, [name, p, o, value = std::move(value)](int k) {
            const int weights = k / 2;
            const bool rounded = k % 2;
            TensorMap in;
            for (const char* d : stage(name).deps) {
              if (!reads_phi(d)) {
                in[d] = value(d);
                continue;
              }
              TensorMap ops;
              for (const char* u : stage(d).deps)
                ops[u] = std::string_view(u) == "phi" ? (weights == 0   ? value(u)
                                                         : weights == 1 ? as_operand(value(u), o)
                                                                        : as_operand(value(u), o, &value("gamma")))
                                                      : rounded ? as_operand(value(u), o) : value(u);
              in[d] = cpu_stage(d, p, ops, Precision::fp64);
            }
            return cpu_stage(name, p, in, Precision::fp64);
          }};
}

// B's largest error against the oracle o over its own limit (own(i): element i's limit without
// E_B). Where that is over 1, B's value must also be that far off the stage replayed in fp64
// from B's own upstream tensors (replay_in_b; a sum over tokens: the blocks' replays added up,
// `sum_replay`, where there is one): over its limit only through its inputs' within-budget
// errors, B is not wrong here (as for A).
template <class Own>
double reference_over(const Stage& s, const Tensor& tb, const Tensor& o, const Unit& uo, const Own& own, const Case& b,
                      References& refs, const Tensor* sum_replay) {
  auto over = [&](const Tensor& ref) {  // NaN/Inf in one of B and ref only: kInf (B's own limit is then inf too)
    double w = 0;
    for (int64_t i = 0; i < o.size(); ++i) {
      const double d = elem_diff(tb.at(i), ref.at(i));
      if (d == kInf) return kInf;
      w = std::max(w, uo(i, d, o.at(i)) / own(size_t(i)));
    }
    return w;
  };
  double w = over(o);
  if (w <= 1) return w;
  if (is_token_sum(s)) return sum_replay ? std::min(w, over(*sum_replay)) : w;
  return std::min(w, over(replay_in_b(s.name, b, refs)));
}

}  // namespace

std::string inputs_difference(const Case& a, const Case& b) {
  if (a.prob.norm_eps != b.prob.norm_eps || a.prob.hc_eps != b.prob.hc_eps) {  // every digit: a float32 1e-2 is not 0.01
    char v[160];
    std::snprintf(v, sizeof v, "norm_eps %.17g vs %.17g, hc_eps %.17g vs %.17g", a.prob.norm_eps, b.prob.norm_eps,
                  a.prob.hc_eps, b.prob.hc_eps);
    return cat("the attributes ", v);
  }
  for (const Stage& s : stage_table()) {
    if (s.group != Group::inputs) continue;
    bool ha = a.has(s.name), hb = b.has(s.name);
    if (ha != hb) return cat("/inputs/", s.name, " present on one side only");
    if (!ha) continue;
    const Tensor &x = a.get(s.name), &y = b.get(s.name);
    if (x.shape != y.shape) return cat("/inputs/", s.name, " shape ", shape_str(x.shape), " vs ", shape_str(y.shape));
    if (x.dtype != y.dtype || x.bytes != y.bytes) return cat("/inputs/", s.name, " values");
  }
  return "";
}

DiffReport diff_block(const Case& a, const Case& b, References& refs, const DiffOptions& opt, BlockSums& sums) {
  DiffReport rep;
  rep.accept = opt.accept;
  TokenScales ts;  // the tokens' scales, for the per-token units
  if (b.has("x")) ts.x = token_scales(b.get("x"), b.prob.T());

  // A stage's value in A (when A has it in the schema's shape), else its replay: the stage
  // recomputed in fp64 from A's own upstream tensors.
  auto a_provides = [&](const std::string& name) {
    return a.has(name) && !a.misshapen.count(name) &&
           (stage(name).group == Group::inputs || a.get(name).shape == stage_shape(stage(name), a.prob));
  };
  std::map<std::string, Tensor> replayed;
  std::function<const Tensor&(const std::string&)> value_in_a = [&](const std::string& name) -> const Tensor& {
    if (a_provides(name)) return a.get(name);
    auto it = replayed.find(name);
    if (it != replayed.end()) return it->second;
    TensorMap deps;
    for (const char* d : stage(name).deps) deps[d] = value_in_a(d);
    return replayed[name] = cpu_stage(name, a.prob, deps, Precision::fp64);
  };
  // The error a replay leaves to A's own arithmetic: the stage (and what A lacks, as the
  // replay recomputes it) in plain class-C arithmetic from the oracle's values, unrounded.
  // A dependency d is the oracle's where formed(d), else recomputed so.
  std::map<std::pair<int, std::string>, Tensor> local;
  std::function<const Tensor&(const std::string&, Accuracy)> local_plain;
  auto plain_from = [&](const std::string& name, Accuracy c, auto&& formed) {
    TensorMap deps;
    for (const char* d : stage(name).deps) deps[d] = formed(d) ? refs.oracle().get(d) : local_plain(d, c);
    return cpu_stage(name, refs.oracle().prob, deps, plain_arith(c));
  };
  local_plain = [&](const std::string& name, Accuracy c) -> const Tensor& {
    auto key = std::pair{int(c), name};
    if (auto it = local.find(key); it != local.end()) return it->second;
    return local[key] = plain_from(name, c, a_provides);
  };
  // The stage itself recomputed from A's upstream tensors: fp64, or fp32 plain and unrounded.
  std::map<std::string, Tensor> own;
  auto recompute = [&](const std::string& name, Arith arith) {
    TensorMap deps;
    for (const char* d : stage(name).deps) deps[d] = value_in_a(d);
    return cpu_stage(name, a.prob, deps, arith);
  };
  auto replay = [&](const std::string& name) -> const Tensor& {
    if (auto given = sums.replays.find(name); given != sums.replays.end()) return given->second;
    auto it = own.find(name);
    return it != own.end() ? it->second : own[name] = recompute(name, Precision::fp64);
  };

  for (auto [side, c] : {std::pair{"A", &a}, std::pair{"B", &b}})
    for (const std::string& name : c->unknown) {
      StageReport r;
      r.name = name;
      r.status = Status::unknown;
      r.hint = suggest_stage(name);
      r.note = cat(side, ": dataset ", name, " is not in the schema",
                   r.hint.empty() ? " (keep your own tensors in another group, e.g. /extra)" : "");
      rep.stages.push_back(r);
    }

  for (const Stage& s : stage_table()) {
    if (s.group == Group::inputs) continue;
    bool ha = a.has(s.name) || a.misshapen.count(s.name), hb = b.has(s.name) || b.misshapen.count(s.name);
    StageReport r;
    r.name = s.name;
    if (!ha || !hb) {
      r.status = Status::missing;
      r.note = !ha && !hb ? "on both sides" : !ha ? "missing in A" : "missing in B";
      rep.stages.push_back(r);
      continue;
    }
    std::string problem = format_problem(s, a, "A");
    if (problem.empty()) problem = format_problem(s, b, "B");
    if (!problem.empty()) {
      r.status = Status::format;
      r.note = problem;
      rep.stages.push_back(r);
      continue;
    }
    const Tensor &ta = a.get(s.name), &tb = b.get(s.name);
    std::vector<double> err;
    auto fixed_tol = opt.per_stage.find(s.name);
    if (opt.fixed || fixed_tol != opt.per_stage.end()) {
      auto [atol, rtol] = fixed_tol != opt.per_stage.end() ? fixed_tol->second : default_tol(s);
      const bool given = fixed_tol == opt.per_stage.end() && s.dtype != DType::bf16;  // --atol/--rtol: float32 stages
      if (given && opt.atol >= 0) atol = opt.atol;
      if (given && opt.rtol >= 0) rtol = opt.rtol;
      // d = 0: equal, NaN against NaN or equal infinities (whose rtol·|y| is NaN)
      r = measure(s.name, ta, tb, err, [&](int64_t, double d, double y) { return d == 0 || d <= atol + rtol * std::fabs(y) ? 0.0 : 2.0; });
      r.fixed = true, r.atol = atol, r.rtol = rtol, r.limit = 1, r.error = 0;
      for (int64_t i = 0; i < tb.size(); ++i)
        r.min_atol = std::max(r.min_atol, elem_diff(ta.at(i), tb.at(i)) - rtol * std::fabs(tb.at(i)));
      r.has_accuracy = bitwise_equal(ta, tb);
      r.accuracy = Accuracy::exact;
      std::vector<uint8_t> mask(err.size());
      for (size_t i = 0; i < err.size(); ++i) mask[i] = err[i] > 1;
      r.mismatches = std::count(mask.begin(), mask.end(), 1);
      r.status = r.mismatches ? Status::diverged : Status::ok;
      keep(r, err, mask, ta, tb, opt);
      rep.stages.push_back(r);
      continue;
    }

    // Budget: limit_C = k E_C + E_B + floor, E_C the plain class-C evaluation's error and E_B
    // B's own error against the oracle, all in the stage's unit.
    const Tensor& o = refs.oracle().get(s.name);
    const int64_t tokens = b.prob.T();
    if (ts.inv.empty() && per_token(s) && refs.oracle().has("inv_rms"))
      ts.inv = token_scales(refs.oracle().get("inv_rms"), tokens);
    Unit uo = unit_of(s, o, tokens, ts), ub = unit_of(s, tb, tokens, ts);
    bool bf = s.dtype == DType::bf16;
    r = measure(s.name, ta, tb, err, ub);
    r.unit = bf ? "bf16_ulp" : "ref_rms";
    r.reference_error = max_error(tb, o, uo, false);
    auto ref_error_of = [&](size_t i) {
      return uo(int64_t(i), elem_diff(tb.at(int64_t(i)), o.at(int64_t(i))), o.at(int64_t(i)));
    };
    r.min_atol = r.max_abs;
    r.has_accuracy = true;

    // bf16 stages: A's rounding, checked against the replay from A's own upstream tensors,
    // judged first with tau from the stage's own arithmetic in class C (A's upstream
    // tensors as dumped). Under a class coarser than fp32, flips that fit no rounding mode are
    // judged again with the GEMMs with phi the stage reads (dvecX for dx) recomputed in class C,
    // as if A never formed them: a kernel may fold dvecX's GEMM into dx (gamma in its weights,
    // the norm's textbook backward) and dump a dvecX made apart; in TF32 their errors differ by
    // many flips, and a correct kernel was called "computed from other values" (review A, session
    // 21). Only then: with that tau always, a truncation of one token of an fp32 kernel that dumps
    // dvecX passed under --accept tf32 (review E, session 22). The lean (rounding.cpp) still tells
    // a truncation where tau explains every flip.
    auto fused_plain = [&](Accuracy c) {
      return plain_from(s.name, c, [&](const char* d) { return a_provides(d) && !reads_phi(d); });
    };
    std::map<Accuracy, Rounding> rounding;
    Tensor fp32_value;
    std::map<Accuracy, std::vector<uint8_t>> unexplained;
    auto rounding_ok = [&](Accuracy c) {
      if (!bf) return true;
      if (!rounding.count(c)) {
        if (fp32_value.bytes.empty()) fp32_value = recompute(s.name, plain_arith(Accuracy::fp32));
        const Alternatives alternatives =
            gemm_replays(s.name, a.prob, c, [&](const char* d) -> const Tensor& { return value_in_a(d); });
        auto judge = [&](const Tensor& plain) {
          const double tau = opt.budget_factor * max_error(plain, o, uo, false) + kTieFloorUlp;
          rounding[c] = check_rounding(ta, replay(s.name), alternatives, fp32_value, plain, o, tau,
                                       ta.size() / std::max<int64_t>(tokens, 1), unexplained[c]);
        };
        judge(local_plain(s.name, c));
        if (c != Accuracy::fp32 && rounding[c].other_values) judge(fused_plain(c));
      }
      return rounding[c].reason.empty();
    };
    // Sums over tokens with few elements (dalpha, dbias) get a limit per element (elem_limit):
    // sigma, estimated from every token, is the sharper bound there; the element's own plain
    // error (bias included) stays a floor, and s(m) E_C a ceiling (docs/diff.md, "Sums over
    // tokens with few elements"). The row then shows the element closest to its limit.
    std::map<Accuracy, std::vector<double>> elem_limit;
    std::map<Accuracy, size_t> closest;
    auto limit_of = [&](Accuracy c) {
      if (!r.class_limit.count(c)) {
        const Tensor& pc = refs.plain(c).get(s.name);
        r.class_error[c] = max_error(pc, o, uo, bf);
        // a per-token stage (and a sum over tokens where one block is the case, as at T = 1, where
        // dphi of a correct kernel was 2.7x its limit): its largest error over more evaluations in other orders over K, D,
        // n and N (references.h): the reversed chains, where a dominant last term is first (an
        // outlier channel at k = K - 1, summed from K - 1 down by a correct kernel, failed inv_rms
        // at 2.9x its limit), and in a small block shuffled ones, so that s(m) need not stretch
        // one sample of a few elements (T = 1: s = 296, and inv_rms off by 1e-3 passed at K = 4096)
        // (an evaluation whose stage is bitwise one already counted is no new sample: at D <= 2 or
        // n = 1 some orders give the same chains, and counting them lowered s(m))
        int64_t m = tb.size();
        std::vector<const Tensor*> counted = {&pc};
        for (const Case& q : refs.reordered(c))  // per-token stages; the sums too where the block is the case
          if (q.has(s.name)) {
            const Tensor& e = q.get(s.name);
            if (std::any_of(counted.begin(), counted.end(), [&](const Tensor* t) { return t->bytes == e.bytes; })) continue;
            counted.push_back(&e);
            r.class_error[c] = std::max(r.class_error[c], max_error(e, o, uo, bf));
            // a sum over tokens adds its tokens in the same order in every evaluation: no new
            // samples of that chain's error (counting them made dalpha's limit 5x tighter, and a
            // correct dalpha beside a planted h_pre bug was called introduced, session 20's CI)
            if (per_token(s)) m += tb.size();
          }
        const double k = opt.budget_factor, floor = r.reference_error + noise_floor(s);
        const double reach = small_sample(m) * r.class_error[c];
        r.class_limit[c] = k * reach + floor;
        // per element: the limit of element i, f(i), and the row shows the element closest to it
        auto per_element = [&](auto&& f) {
          std::vector<double>& lim = elem_limit[c];
          lim.resize(size_t(tb.size()));
          size_t w = 0;
          for (size_t i = 0; i < lim.size(); ++i) {
            lim[i] = f(i);
            if (!(err[i] * lim[w] <= err[w] * lim[i])) w = i;  // err/lim larger (or NaN)
          }
          closest[c] = w;
          r.class_limit[c] = lim[w];
        };
        // there E_B is B's own error at the element, not its largest over the stage (the golden's
        // 3e-5 at dalpha[0] more than doubled dalpha[1]'s limit, and a 2e-4 error there passed)
        const double noise = noise_floor(s);
        std::vector<double> sigma = sums.sigma && !bf ? sums.sigma(c, s.name) : std::vector<double>{};
        std::vector<double> chain = sums.chain && !bf ? sums.chain(s.name) : std::vector<double>{};
        if (!sigma.empty() && int64_t(sigma.size()) == tb.size()) {
          // s(m) E_C caps sigma only where the evaluations in other orders gave E_C (one block the
          // case: T <= 256). Beyond, E_C is the plain chain's alone, and with an outlier channel at
          // k = K - 1 (last in that chain) it was 1/20 of a correct kernel's dbias error: a torch
          // kernel summing in tiles of 64 failed at 300 tokens, where sigma from every token allowed 40x
          // (session 20's CI).
          const bool capped = std::any_of(refs.reordered(c).begin(), refs.reordered(c).end(),
                                          [&](const Case& q) { return q.has(s.name); });
          per_element([&](size_t i) {
            double own = uo(int64_t(i), elem_diff(pc.at(int64_t(i)), o.at(int64_t(i))), o.at(int64_t(i)));
            const double spread = kSigmas * sigma[i] / uo.rms;
            return k * std::max(own, capped ? std::min(reach, spread) : spread) + ref_error_of(i) + noise;
          });
        } else if (!chain.empty() && int64_t(chain.size()) == tb.size()) {
          // dphi, dgamma: where a few large terms dominate an element (an outlier channel of x),
          // E_C there is one draw and the chain's own rounding may exceed it
          per_element([&](size_t i) { return k * std::max(reach, kSigmas * chain[i] / uo.scale(int64_t(i))) + ref_error_of(i) + noise; });
        }
      }
      return r.class_limit[c];
    };
    auto within = [&](Accuracy c) {
      const double limit = limit_of(c);
      auto it = elem_limit.find(c);
      if (it == elem_limit.end()) return r.error <= limit;
      for (size_t i = 0; i < err.size(); ++i)
        if (!(err[i] <= it->second[i])) return false;
      return true;
    };

    r.accuracy = Accuracy::diverged;
    if (bitwise_equal(ta, tb)) {
      r.accuracy = Accuracy::exact;
    } else {
      for (Accuracy c : kClasses)
        if (within(c) && rounding_ok(c)) {
          r.accuracy = c;
          break;
        }
    }
    if (!bf && r.class_error.count(Accuracy::fp32)) r.fp32_error = r.class_error[Accuracy::fp32];
    r.limit = limit_of(opt.accept);
    const std::vector<double>* per_elem = elem_limit.count(opt.accept) ? &elem_limit[opt.accept] : nullptr;
    if (per_elem) r.error = err[closest[opt.accept]];
    auto limit_at = [&](size_t i) { return per_elem ? (*per_elem)[i] : r.limit; };
    // B's own error in the limit at element i: per element where the limits are (limit_of)
    auto ref_error_at = [&](size_t i) {
      return per_elem ? ref_error_of(i) : r.reference_error;
    };
    rounding_ok(opt.accept);
    if (bf) r.rounding = rounding[opt.accept];
    if (bf && bf16_valued(tb)) {  // not the two replays for a B that keeps h_in and dx unrounded (cpu:fp64)
      // B's rounding, as A's: with golden.h5 first and a kernel's truncated h_in as B, it matched.
      // The error before rounding that explains a flip: the whole plain evaluation's, since B's
      // upstream stages it does not hold are the oracle's in the replay
      const Tensor& plain = refs.plain(opt.accept).get(s.name);
      const double tau = opt.budget_factor * max_error(plain, o, uo, false) + kTieFloorUlp;
      std::vector<uint8_t> unused;
      const Alternatives alternatives = gemm_replays(
          s.name, b.prob, opt.accept,
          [&](const char* d) -> const Tensor& { return b_fits(b, d) ? b.get(d) : refs.oracle().get(d); });
      r.reference_rounding = check_rounding(tb, replay_in_b(s.name, b, refs), alternatives,
                                            replay_in_b(s.name, b, refs, plain_arith(Accuracy::fp32)), plain, o, tau,
                                            tb.size() / std::max<int64_t>(tokens, 1), unused);
    }
    std::vector<uint8_t> mask(err.size());
    const std::vector<uint8_t>& rounded_badly = unexplained[opt.accept];
    // unexplained flips are mismatches only when they make a reason (isolated near-tie flips do not)
    const bool check_rounded = bf && r.accuracy != Accuracy::exact && !rounded_badly.empty() && !r.rounding.reason.empty();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(err.size()); ++i)
      mask[size_t(i)] = !(err[size_t(i)] <= limit_at(size_t(i))) || (check_rounded && rounded_badly[size_t(i)]);
    r.mismatches = std::count(mask.begin(), mask.end(), 1);
    auto given = sums.ref_replays.find(s.name);
    r.reference_over = reference_over(s, tb, o, uo, [&](size_t i) { return limit_at(i) - ref_error_at(i); }, b, refs,
                                      given != sums.ref_replays.end() ? &given->second : nullptr);
    bool fails = r.accuracy > opt.accept;
    r.status = fails ? Status::diverged : Status::ok;
    if (fails) {
      // Introduced or inherited: is A's value right given A's own upstream tensors?
      const Tensor& re = replay(s.name);
      Unit ur = unit_of(s, re, tokens, ts);
      // a forward float32 stage (the gates: inv_rms and h_mix read only the inputs) is held to the
      // error of its own arithmetic, the plain class-C evaluation of the stage alone from the
      // oracle's upstream (local_plain), not to the whole stage's limit, most of which is h_mix's
      // GEMM error that the replay removes: a 64-ulp bias of h_res (1.2x its limit) was called
      // computed correctly from its inputs (review A, session 24). Not the backward's: their
      // replays take what a kernel may form otherwise (a saturated gate's s from z), and dh_mix
      // after a planted h_pre bug was called introduced
      const double own_limit = s.group == Group::forward && !bf ? opt.budget_factor * small_sample(tb.size()) *
                                                             max_error(local_plain(s.name, opt.accept), o, uo, false) +
                                                         noise_floor(s)
                                                   : kInf;
      bool own_ok = true;
      for (int64_t i = 0; i < re.size(); ++i)
        own_ok = own_ok && ur(i, elem_diff(ta.at(i), re.at(i)), re.at(i)) <=
                               std::min(own_limit, limit_at(size_t(i)) - ref_error_at(size_t(i)));
      if (own_ok && (!bf || r.rounding.reason.empty())) r.status = Status::inherited;
      if (r.error > r.limit) r.rounding.reason.clear();  // values off by more than rounding: that is the news
    }
    keep(r, err, mask, ta, tb, opt);
    rep.stages.push_back(r);
  }

  for (const std::string& name : sums.want) {  // this block's part of a sum over tokens, replayed from A and B
    sums.replays_added[name] = recompute(name, Precision::fp64);
    sums.ref_replays_added[name] = replay_in_b(name, b, refs);
  }
  return rep;  // the verdict is the merged report's (finish_report)
}

void finish_report(DiffReport& rep, const DiffOptions& opt) {
  std::map<std::string, StageReport*> by_name;
  for (auto& r : rep.stages) by_name[r.name] = &r;
  auto diverging = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it != by_name.end() && (it->second->status == Status::diverged || it->second->status == Status::inherited);
  };
  // Nearest diverging ancestor, looking through stages that were not compared.
  std::function<std::string(const std::string&)> upstream = [&](const std::string& name) -> std::string {
    for (const char* d : stage(name).deps) {
      if (diverging(d)) return d;
      auto it = by_name.find(d);
      if (it == by_name.end() || !it->second->compared)
        if (std::string u = upstream(d); !u.empty()) return u;
    }
    return "";
  };

  bool invalid = false;
  rep.compared = 0;
  rep.first_divergent.clear(), rep.root_causes.clear(), rep.missing_required.clear(), rep.reference_wrong.clear();
  rep.no_budget.clear();
  for (auto& r : rep.stages) {
    rep.compared += r.compared;
    invalid = invalid || r.status == Status::unknown || r.status == Status::format;
    if ((r.reference_over > 1 || !r.reference_rounding.reason.empty()) && rep.reference_wrong.empty())
      rep.reference_wrong = r.name, invalid = true;
    if (!(r.fp32_error < kNoBudget) && rep.no_budget.empty()) rep.no_budget = r.name, invalid = true;
    if (r.status == Status::missing && opt.require.count(r.name)) rep.missing_required.push_back(r.name);
    if (r.status == Status::inherited) {
      r.inherited_from = upstream(r.name);
      r.note = cat("inherited from ", r.inherited_from);
      if (r.inherited_from.empty() && !opt.inputs_differ.empty()) {
        // A and B ran on different inputs: the stage differs through them (a divergence, not a bug of A)
        r.inherited_from = "inputs";
        r.note = cat("inherited from the inputs, which differ: ", opt.inputs_differ);
      } else if (r.inherited_from.empty()) {
        // Over its limit only through its inputs' errors, every one of them within its own
        // budget, and computed correctly from them: no stage of A is wrong (docs/diff.md).
        r.status = Status::ok, r.accuracy = opt.accept;
        r.note = "over its limit only by its inputs' within-budget errors; computed correctly from them";
        r.where.clear(), r.pattern.clear(), r.first_mismatch.clear();
      }
    }
    if (r.status != Status::diverged && r.status != Status::inherited) continue;
    if (rep.first_divergent.empty()) rep.first_divergent = r.name;
    if (r.status == Status::diverged) rep.root_causes.push_back(r.name);
  }
  rep.verdict = invalid || rep.compared == 0                                   ? Verdict::invalid
                : !rep.first_divergent.empty() || !rep.missing_required.empty() ? Verdict::diverged
                                                                                : Verdict::match;
}

std::set<std::string> parse_require(const std::string& text) {
  std::set<std::string> out;
  if (text == "none") return out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = std::min(text.find(',', pos), text.size());
    std::string item = text.substr(pos, end - pos);
    bool found = false;
    for (const Stage& s : stage_table()) {
      if (s.group == Group::inputs) continue;
      if (item == "all" || item == s.name || item == group_name(s.group) || (item == "outputs" && s.output))
        out.insert(s.name), found = true;
    }
    if (item.empty())
      fail("--require '", text, "': an empty stage name; expected all, forward, backward, outputs, none or computed stages "
           "(e.g. h_mix,dphi)");
    if (!found) {
      const Stage* near = nearest_stage(item, true);
      fail("--require ", item, ": expected all, forward, backward, outputs, none or computed stages (e.g. h_mix,dphi)",
           near ? cat("; did you mean ", near->name, "?") : "");
    }
    pos = end + 1;
  }
  return out;
}

std::string DiffReport::verdict_line() const {
  if (verdict == Verdict::invalid) {
    std::string why;
    for (auto& s : stages)
      if (s.status == Status::unknown || s.status == Status::format)
        why += cat(why.empty() ? "" : "; ", s.note, s.hint.empty() ? "" : cat(" (", s.hint, ")"));
    for (auto& s : stages)
      if (s.name == reference_wrong) {
        char over[64];
        std::snprintf(over, sizeof over, "%.3gx the limit a correct kernel meets there", s.reference_over);
        // infinite: NaN or Inf on one side, or an error past a double's range (B's dphi at
        // FLT_MAX was called "NaN or Inf"; review B, session 22)
        if (std::isinf(s.reference_over)) std::snprintf(over, sizeof over, "NaN, Inf or a huge value in one of B and the oracle only");
        const std::string what = s.reference_over > 1 ? cat("is itself off the fp64 oracle, first at ", s.name, " (", over, ")")
                                                      : cat("rounds ", s.name, " wrongly (", s.reference_rounding.reason, ")");
        why += cat(why.empty() ? "" : "; ", "the reference B ", what,
                   ": put the trusted side as B (mhc diff mine.h5 golden.h5), or compare B with cpu:fp64");
      }
    for (auto& s : stages)
      if (s.name == no_budget) {
        char off[32];
        std::snprintf(off, sizeof off, "%.3g", s.fp32_error);
        why += cat(why.empty() ? "" : "; ", "fp32 arithmetic cannot evaluate these inputs: at ", s.name,
                   " the plain fp32 evaluation is off the fp64 oracle by ", off,
                   " of the stage's RMS (an overflow, or gates saturated past fp32?), so no error budget holds; compare with --tolerance fixed");
      }
    if (why.empty()) why = "no stage is present on both sides";
    return cat("invalid: ", why, "; the comparison cannot be trusted");
  }
  std::map<Accuracy, std::vector<std::string>> by_class;
  for (auto& s : stages)
    if (s.compared && s.has_accuracy) by_class[s.accuracy].push_back(s.name);
  if (verdict == Verdict::match) {
    // under --tolerance fixed only a bitwise equal stage has a class ("all within fp32 ()" said otherwise)
    const bool fixed = std::any_of(stages.begin(), stages.end(), [](const StageReport& s) { return s.compared && s.fixed; });
    std::string line = cat("match: ", compared, compared == 1 ? " stage" : " stages", " compared, all within ",
                           fixed ? "the fixed tolerances" : accuracy_name(accept), by_class.empty() ? "" : " (");
    bool first = true;
    for (auto& [c, names] : by_class) {
      line += cat(first ? "" : ", ", names.size(), " ", accuracy_name(c));
      if (c > Accuracy::fp32) {
        std::string list;
        for (auto& n : names) list += cat(list.empty() ? "" : " ", n);
        line += cat(": ", list);
      }
      first = false;
    }
    if (!by_class.empty()) line += ")";
    // stages one side lacks were not compared: a dump without its backward "matched" in silence
    for (const char* side : {"A", "B"}) {
      std::string absent;
      int count = 0;
      for (auto& s : stages)
        if (s.status == Status::missing && s.note == cat("missing in ", side))
          absent += cat(absent.empty() ? "" : ", ", s.name), ++count;
      if (count)
        line += cat("; not compared, missing in ", side, ": ", absent, " (--require makes a missing stage a divergence)");
    }
    return line;
  }
  std::string line;
  if (!first_divergent.empty()) {
    line = cat("diverged: first at ", first_divergent);
    for (auto& s : stages) {
      if (s.name != first_divergent) continue;
      std::string cls = s.has_accuracy && s.accuracy != Accuracy::diverged
                            ? cat("; accuracy ", accuracy_name(s.accuracy), ", accepted ", accuracy_name(accept))
                            : "";
      std::string why = s.rounding.reason.empty() ? "" : cat("; ", s.rounding.reason);
      line += s.status == Status::diverged ? cat(" (introduced", cls, why, ")") : cat(" (", s.note, ")");
    }
    std::string others;
    for (auto& r : root_causes)
      if (r != first_divergent) others += cat(others.empty() ? "" : ", ", r);
    if (!others.empty()) line += cat("; also introduced: ", others);
    int inherited = 0;
    for (auto& s : stages) inherited += s.status == Status::inherited && s.name != first_divergent;
    std::string roots;
    for (auto& r : root_causes) roots += cat(roots.empty() ? "" : ", ", r);
    if (inherited)
      line += roots.empty() ? cat("; ", inherited, " more stages accumulate error from upstream")
                            : cat("; ", inherited, " downstream stage", inherited == 1 ? "" : "s", " follow",
                                  inherited == 1 ? "s" : "", " from ", roots);
  } else {
    line = "diverged";
  }
  if (!missing_required.empty()) {
    std::string list;
    for (auto& n : missing_required) list += cat(list.empty() ? "" : ", ", n);
    line += cat("; required but missing: ", list);
  }
  return line;
}

}  // namespace mhc
