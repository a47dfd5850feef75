// stream.cpp — sides read or computed chunk by chunk, and the diff that runs the engine
// block by block and merges the blocks' reports into one per stage (docs/diff.md, "Blocks").
#include "stream.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "block.h"
#include "rounding.h"
#include "where.h"

namespace mhc {
namespace {

// The head of a case: problem, parameters (inputs that are not per token), attributes.
Case head_of(const Case& c) {
  Case h;
  h.prob = c.prob, h.attrs = c.attrs, h.stored_as = c.stored_as, h.unknown = c.unknown, h.misshapen = c.misshapen;
  for (auto& [name, t] : c.t)
    if (stage(name).group == Group::inputs && !per_token(stage(name))) h.t[name] = t;
  return h;
}

// The sums over tokens of a case, with its problem, parameters and stored types.
Case sums_of(const Case& c) {
  Case s = head_of(c);
  s.unknown.clear();
  for (auto& [name, t] : c.t)
    if (is_token_sum(stage(name))) s.t[name] = t;
  return s;
}

std::set<std::string> sum_names(const Case& c) {
  std::set<std::string> out;
  for (auto& [name, t] : c.t)
    if (is_token_sum(stage(name))) out.insert(name);
  return out;
}

class FileSide : public Side {
 public:
  // `in`: where a file without /inputs (a dump of stages only) takes its inputs from
  FileSide(const std::string& path, const LoadOptions& opt, bool outputs, std::shared_ptr<Side> in)
      : in_(in && outputs && !has_inputs(path) ? std::move(in) : nullptr),
        r_(path, opt, outputs, in_ ? &in_->head() : nullptr) {
    if (!outputs) return;
    const Case first = chunk(0, 1);  // the per-token stages and inputs present; the head holds the sums
    check_backward_has_gradients(path, first, first.has_gradients());
    check_backward_has_gradients(path, r_.head(), first.has_gradients());
  }
  const Case& head() override { return r_.head(); }
  Case chunk(int64_t t0, int64_t t1) override {
    Case c = r_.chunk(t0, t1);
    if (in_)
      for (auto& [name, t] : in_->inputs(t0, t1).t) c.t.emplace(name, std::move(t));
    return c;
  }
  Case inputs(int64_t t0, int64_t t1) override { return in_ ? in_->inputs(t0, t1) : r_.chunk(t0, t1).inputs_only(); }
  std::set<std::string> sum_stages() override { return sum_names(r_.head()); }
  Case sums() override { return sums_of(r_.head()); }

 private:
  std::shared_ptr<Side> in_;
  CaseReader r_;
};

class CaseSide : public Side {
 public:
  explicit CaseSide(Case c) : c_(std::move(c)), head_(head_of(c_)) {}
  const Case& head() override { return head_; }
  Case chunk(int64_t t0, int64_t t1) override { return c_.token_slice(t0, t1); }
  Case inputs(int64_t t0, int64_t t1) override { return c_.token_slice(t0, t1).inputs_only(); }
  std::set<std::string> sum_stages() override { return sum_names(c_); }
  Case sums() override { return sums_of(c_); }

 private:
  Case c_, head_;
};

class CpuSide : public Side {
 public:
  CpuSide(std::shared_ptr<Side> in, Arith arith) : in_(std::move(in)), arith_(arith) {}
  const Case& head() override { return in_->head(); }
  Case chunk(int64_t t0, int64_t t1) override {
    Case c = in_->inputs(t0, t1);
    cpu_run_chunk(c, arith_, sums_);
    return c;
  }
  Case inputs(int64_t t0, int64_t t1) override { return in_->inputs(t0, t1); }
  std::set<std::string> sum_stages() override {
    std::set<std::string> out;
    if (in_->inputs(0, 1).has_gradients())
      for (const Stage& s : stage_table())
        if (is_token_sum(s)) out.insert(s.name);
    return out;
  }
  Case sums() override {
    Case c = head_of(in_->head());
    cpu_finish(c, sums_, arith_);
    return sums_of(c);
  }

 private:
  std::shared_ptr<Side> in_;
  Arith arith_;
  TokenSums sums_;
};

// The p-quantile of chi-square with k > 0 (not necessarily whole) degrees of freedom: for
// k >= 30 Wilson-Hilferty's cube (within 0.2% there), below by bisection on the regularised
// lower incomplete gamma function P(k/2, x/2), summed as its series.
double chi2_quantile(double k, double p) {
  double lo = -10, hi = 10;  // z, the standard normal p-quantile, by bisection
  for (int i = 0; i < 100; ++i) (0.5 * std::erfc(-(lo + hi) / 2 / std::sqrt(2.0)) < p ? lo : hi) = (lo + hi) / 2;
  const double z = lo;
  if (k >= 30) {
    double c = 2 / (9 * k), w = 1 - c + z * std::sqrt(c);
    return k * w * w * w;
  }
  auto P = [&](double x) {  // P(k/2, x/2)
    const double a = k / 2, y = x / 2;
    if (y <= 0) return 0.0;
    double term = 1, sum = 1;
    for (int n = 1; n < 100000 && term > 1e-17 * sum; ++n) sum += term *= y / (a + n);
    return std::exp(a * std::log(y) - y - std::lgamma(a + 1)) * sum;
  };
  lo = 0, hi = 10 * k + 100;
  for (int i = 0; i < 200; ++i) (P((lo + hi) / 2) < p ? lo : hi) = (lo + hi) / 2;
  return lo;
}

// A correct kernel's error in one element of a sum over tokens with few elements (dalpha,
// dbias; docs/diff.md), estimated from every token of the plain class-C evaluation: the errors
// e_t of its per-token terms against the oracle's, and the partial sums s_i of its chain over
// tokens. Carried from block to block in token order: memory does not grow with T.
struct SumNoise {
  int64_t tokens = 0;
  std::vector<double> run, chain2, err2, err4;  // per element: s_i, sum s_i^2, sum e_t^2, sum e_t^4

  void add(const std::vector<double>& plain, const std::vector<double>& oracle, int64_t M) {
    if (run.empty()) run.assign(size_t(M), 0), chain2 = err2 = err4 = run;
    const int64_t T = int64_t(plain.size()) / M;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m) {
        size_t i = size_t(t * M + m);
        double e = plain[i] - oracle[i];
        run[size_t(m)] += plain[i];
        chain2[size_t(m)] += run[size_t(m)] * run[size_t(m)];
        err2[size_t(m)] += e * e, err4[size_t(m)] += e * e * e * e;
      }
    tokens += T;
  }

  // Per element: sqrt(f^2 sum e_t^2 + sigma_chain^2). The e_t part is scaled by f so that it
  // understates the variance with probability 1% at most: sum e_t^2 is a chi-square sample of
  // about 3 (sum e_t^2)^2 / sum e_t^4 degrees of freedom (Gaussian e_t of equal variance: T;
  // fewer where a few tokens dominate). Each addition of the chain rounds by at most u|s_i|,
  // uniformly: sigma_chain^2 = u^2/3 sum s_i^2, u = 2^-24.
  std::vector<double> sigma() const {
    const double u = std::ldexp(1.0, -24);
    std::vector<double> out(run.size());
    for (size_t m = 0; m < run.size(); ++m) {
      double f2 = 1;
      if (err4[m] > 0) {
        double dof = std::min(double(tokens), 3 * err2[m] * err2[m] / err4[m]);
        f2 = dof / chi2_quantile(dof, 0.01);
      }
      out[m] = std::sqrt(f2 * err2[m] + u * u / 3 * chain2[m]);
    }
    return out;
  }
};

// The rounding of a sequential fp32 chain over tokens in a sum with many elements (dphi, dgamma;
// docs/diff.md, "Sums over tokens with many elements"): per element, the partial sums s_t of the
// oracle's per-token terms a_t, carried from block to block in token order, and sum_t (s_t^2 +
// a_t^2), since each addition rounds by at most u|s_t| and each product by at most u|a_t|,
// uniformly. dphi's terms are before gamma (dh_mix[t,j] x[t,k]), dgamma's x[t,k] dvecX[t,k].
struct ChainNoise {
  std::vector<double> run, sq, scale;  // per element; scale: gamma for dphi (dphi = gamma * the sum)

  void add(const std::string& name, const Case& o) {
    const bool dphi = name == "dphi";
    const int64_t T = o.prob.T(), K = o.prob.K(), rows = dphi ? o.prob.N() : 1;
    if (run.empty()) {
      run.assign(size_t(rows * K), 0), sq = run;
      if (dphi && o.has("gamma"))
        for (int64_t k = 0; k < K; ++k) scale.push_back(o.get("gamma").at(k));
    }
    const Tensor &x = o.get("x"), &f = o.get(dphi ? "dh_mix" : "dvecX");  // f: [T,N] or [T,K], fp64
    const double* fv = f.data<double>();
    constexpr int64_t kSlice = 256;  // columns a thread walks every token of: run and sq stay in cache
    visit(x, [&](auto* xp) {
#pragma omp parallel for schedule(static)
      for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
        const int64_t w = std::min(kSlice, K - k0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            double* ru = &run[size_t(r * K + k0)];
            double* q = &sq[size_t(r * K + k0)];
            for (int64_t c = 0; c < w; ++c) {
              const double a = as_double(xp[t * K + k0 + c]) * (dphi ? fv[t * rows + r] : fv[t * K + k0 + c]);
              ru[c] += a;
              q[c] += ru[c] * ru[c] + a * a;
            }
          }
      }
    });
  }

  std::vector<double> sigma() const {
    const double u = std::ldexp(1.0, -24);
    std::vector<double> out(sq.size());
    const size_t K = scale.empty() ? 1 : scale.size();
    for (size_t i = 0; i < sq.size(); ++i)
      out[i] = u * std::sqrt(sq[i] / 3) * (scale.empty() ? 1.0 : std::abs(scale[i % K]));
    return out;
  }
};

// Adds a block's per-token terms of dalpha and dbias, as the plain evaluation `plain` (in its
// arithmetic `arith`) and the oracle form them, to noise.
void add_noise(std::map<std::string, SumNoise>& noise, const Case& plain, const Case& oracle, Arith arith) {
  if (!plain.has_gradients()) return;
  for (const Stage& s : stage_table()) {
    if (!has_token_terms(s.name)) continue;
    const int64_t M = numel(stage_shape(s, plain.prob));
    noise[s.name].add(cpu_token_terms(s.name, plain.prob, plain.t, arith),
                      cpu_token_terms(s.name, oracle.prob, oracle.t, Arith(Precision::fp64)), M);
  }
}

int severity(Status s) { return s == Status::diverged ? 2 : s == Status::inherited ? 1 : 0; }

// One stage's report, merged block by block.
struct Merged {
  StageReport r;
  double ratio = -1;  // error/limit of the block the row shows (the one closest to its limit)
  bool over_limit = false, rounding_reason = false;
  std::unique_ptr<Locator> where;
  std::unique_ptr<HeatBinner> heat;
};

// A block's rounding counts added to the stage's so far.
void add_rounding(Rounding& x, const Rounding& y) {
  if (x.checked && y.checked) {
    x.differ += y.differ, x.unexplained += y.unexplained, x.ties += y.ties, x.ties_not_even += y.ties_not_even;
    x.off_fp32 += y.off_fp32;
    x.toward += y.toward, x.away += y.away, x.elements += y.elements, x.bias_sum += y.bias_sum;
    x.widest = std::max(x.widest, y.widest), x.widest_unit = std::max(x.widest_unit, y.widest_unit);
    x.lean_all.add(y.lean_all), x.lean_up.add(y.lean_up);
    for (int k = 0; k < Rounding::kBands; ++k) x.lean_band[k].add(y.lean_band[k]);
    for (auto [xc, yc] : {std::pair{&x.lean_col, &y.lean_col}, std::pair{&x.lean_col_up, &y.lean_col_up}})
      if (xc->size() == yc->size())
        for (size_t c = 0; c < xc->size(); ++c) (*xc)[c].add((*yc)[c]);
    x.rows.add(y.rows), x.rows_up.add(y.rows_up);
  }
  x.checked = x.checked && y.checked;
}

// Adds block report b (tokens t0.. of a case of problem p) to m.
void merge(Merged& m, StageReport&& b, const Problem& p, int64_t t0, const Case& ab, const DiffOptions& opt) {
  if (!m.where && b.compared) {
    const Stage& s = stage(b.name);
    Shape shape = stage_shape(s, p);
    m.where = std::make_unique<Locator>(shape);
    m.heat = std::make_unique<HeatBinner>(shape, s, p);
  }
  const bool first = m.ratio < 0;
  StageReport& r = m.r;
  for (Rounding* g : {&b.rounding, &b.reference_rounding})  // the block's leaning tokens, as tokens of the case
    for (Rounding::Rows* rows : {&g->rows, &g->rows_up})
      if (rows->most >= 0) rows->most += t0;
  if (b.compared) {
    const int64_t per = b.count / std::max<int64_t>(1, ab.prob.T()), base = t0 * per;
    m.where->add(b.elem_mask.data(), b.count, base);
    m.heat->add(b.elem_error.data(), b.elem_mask.data(), b.count, base, b.limit);
    if (opt.keep_elements) {
      r.elem_diff.insert(r.elem_diff.end(), b.elem_diff.begin(), b.elem_diff.end());
      r.elem_error.insert(r.elem_error.end(), b.elem_error.begin(), b.elem_error.end());
      r.elem_mask.insert(r.elem_mask.end(), b.elem_mask.begin(), b.elem_mask.end());
    }
    if (!b.max_abs_index.empty()) {  // the block's index, as an index of the whole stage
      Shape bshape = ab.get(b.name).shape;
      int64_t flat = 0;
      for (size_t d = 0; d < bshape.size(); ++d) flat = flat * bshape[d] + b.max_abs_index[d];
      b.max_abs_index = unravel(base + flat, stage_shape(stage(b.name), p));
    }
    m.over_limit = m.over_limit || (!b.fixed && b.error > b.limit);
    m.rounding_reason = m.rounding_reason || !b.rounding.reason.empty();
  }
  b.elem_error.clear(), b.elem_mask.clear(), b.elem_diff.clear();
  const double ratio = b.limit > 0 ? b.error / b.limit : b.error;
  if (first) {
    std::vector<float> e = std::move(r.elem_error), d = std::move(r.elem_diff);
    std::vector<uint8_t> k = std::move(r.elem_mask);
    r = std::move(b);
    r.elem_error = std::move(e), r.elem_diff = std::move(d), r.elem_mask = std::move(k);
    m.ratio = std::max(ratio, 0.0);
    return;
  }
  if (!b.compared) return;  // missing, unknown, format: the same in every block
  if (severity(b.status) > severity(r.status)) r.status = b.status;
  r.accuracy = std::max(r.accuracy, b.accuracy);
  r.has_accuracy = r.has_accuracy && b.has_accuracy;
  r.count += b.count, r.mismatches += b.mismatches;
  r.nan_a += b.nan_a, r.inf_a += b.inf_a, r.nan_b += b.nan_b, r.inf_b += b.inf_b;
  r.l2_num += b.l2_num, r.l2_den += b.l2_den;
  r.max_rel = std::max(r.max_rel, b.max_rel), r.min_atol = std::max(r.min_atol, b.min_atol);
  r.reference_over = std::max(r.reference_over, b.reference_over);
  r.fp32_error = std::isnan(b.fp32_error) ? b.fp32_error : std::max(r.fp32_error, b.fp32_error);
  if (b.max_abs > r.max_abs) r.max_abs = b.max_abs, r.max_abs_index = b.max_abs_index, r.a_at = b.a_at, r.b_at = b.b_at;
  if (ratio > m.ratio) {
    m.ratio = ratio;
    r.error = b.error, r.limit = b.limit, r.reference_error = b.reference_error;
    r.class_limit = b.class_limit, r.class_error = b.class_error;
  }
  add_rounding(r.rounding, b.rounding);
  add_rounding(r.reference_rounding, b.reference_rounding);  // B's, counted over every block alike
}

// The merged report of a stage, once every block is in.
StageReport finish_stage(Merged& m, const Problem& p, const DiffOptions& opt) {
  StageReport& r = m.r;
  if (!r.compared) return std::move(r);
  r.rel_l2 = rel_l2(r.l2_num, r.l2_den);
  // A's h_in or dx not on the bf16 grid (a float32 accumulator dumped unrounded): said, since a
  // kernel's real output is bf16 and its rounding goes unchecked here (review A, session 24)
  if (stage(r.name).dtype == DType::bf16 && !r.rounding.checked && r.note.empty() && !r.fixed)
    r.note = "A's values are not bf16 (stored unrounded?): its rounding is not checked, only the ulp budget";
  if (r.rounding.checked) explain(r.rounding);
  if (r.reference_rounding.checked) explain(r.reference_rounding);
  if (m.over_limit) {
    r.rounding.reason.clear();  // values off by more than rounding: that is the news
  } else if (!r.rounding.reason.empty() && !m.rounding_reason) {
    // evidence no single block held (ties not to even, counted over every block): A's own rounding
    r.status = Status::diverged, r.accuracy = Accuracy::diverged;
  }
  if (severity(r.status) > 0) {
    const Stage& s = stage(r.name);
    m.where->fill(r, s, p, opt.tile);
    r.heat = m.heat->heat();
  }
  return std::move(r);
}

}  // namespace

std::unique_ptr<Side> file_side(const std::string& path, const LoadOptions& opt, bool outputs, std::shared_ptr<Side> inputs) {
  return std::make_unique<FileSide>(path, opt, outputs, std::move(inputs));
}
std::unique_ptr<Side> case_side(Case c) { return std::make_unique<CaseSide>(std::move(c)); }
std::unique_ptr<Side> cpu_side(std::shared_ptr<Side> inputs, Arith arith) {
  return std::make_unique<CpuSide>(std::move(inputs), arith);
}

Case whole_inputs(Side& side) {
  Case c = side.inputs(0, side.head().prob.T());
  c.prob = side.head().prob;
  for (auto& [name, t] : c.t)
    if (per_token(stage(name))) t.shape = stage_shape(stage(name), c.prob);
  return c;
}

DiffReport diff_sides(Side& a, Side& b, const DiffOptions& opt, int64_t t_begin, int64_t t_end,
                      const std::function<void(const Case&, const Case&)>& check) {
  const Problem P = b.head().prob;
  const bool with_sums = t_begin == 0 && t_end == P.T(), budget = !opt.fixed;
  DiffOptions block_opt = opt;
  block_opt.require.clear(), block_opt.progress = nullptr;
  std::map<int, TokenSums> ref_sums;  // the oracle's and the accepted class's sums over tokens
  std::map<std::string, Tensor> replays, ref_replays;  // fp64 replays of A's and B's sums over tokens
  std::set<std::string> want;
  if (with_sums && budget) want = a.sum_stages();
  std::map<int, std::map<std::string, SumNoise>> noise;  // per class: dalpha's and dbias's SumNoise
  std::map<std::string, ChainNoise> chain;                // dphi's and dgamma's

  std::vector<std::string> order;
  std::map<std::string, Merged> merged;
  std::unique_ptr<References> whole;  // where one block is the case: its references, for the sums' too
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kTokenBlock) {
    const int64_t t1 = std::min(t0 + kTokenBlock, t_end);
    Case ab = a.chunk(t0, t1), bb = b.chunk(t0, t1);
    if (check) check(ab, bb);
    auto block = std::make_unique<References>(bb, with_sums ? &ref_sums : nullptr);
    References& refs = *block;
    if (with_sums && t0 == 0 && t1 == P.T()) refs.keep_sums();
    if (budget) refs.oracle(), refs.plain(opt.accept);  // every block: their sums over tokens are complete
    if (budget && with_sums) {
      add_noise(noise[ref_key(opt.accept)], refs.plain(opt.accept), refs.oracle(), plain_arith(opt.accept));
      if (refs.oracle().has_gradients())
        for (const char* name : {"dphi", "dgamma"})
          if (want.count(name)) chain[name].add(name, refs.oracle());
    }
    BlockSums bs;
    bs.want = want;
    DiffReport br = diff_block(ab, bb, refs, block_opt, bs);
    for (auto [added, total] : {std::pair{&bs.replays_added, &replays}, std::pair{&bs.ref_replays_added, &ref_replays}})
      for (auto& [name, t] : *added) {
        auto [it, fresh] = total->try_emplace(name, t);
        if (!fresh)
          for (int64_t i = 0; i < t.size(); ++i) it->second.data<double>()[i] += t.data<double>()[i];
      }
    for (StageReport& r : br.stages) {
      if (!merged.count(r.name)) order.push_back(r.name);
      merge(merged[r.name], std::move(r), P, t0, ab, opt);
    }
    if (opt.progress) opt.progress(double(t1 - t_begin) / double(t_end - t_begin));
    if (with_sums && t0 == 0 && t1 == P.T()) whole = std::move(block);
  }

  DiffReport rep;
  rep.accept = opt.accept;
  std::map<std::string, StageReport> sums;
  if (with_sums) {
    // References for the sums: the oracle's and accepted class's were added up block by
    // block; another class takes a pass over B's inputs.
    References refs([&](int key) {
      Case c = head_of(b.head());
      TokenSums once;
      TokenSums* s = &once;
      if (ref_sums.count(key) && (key == kOracle || key == ref_key(opt.accept)) && budget) {
        s = &ref_sums[key];
      } else {
        for (int64_t t0 = 0; t0 < P.T(); t0 += kTokenBlock) {
          Case in = b.inputs(t0, std::min(t0 + kTokenBlock, P.T())), o = in;
          cpu_run_chunk(in, ref_arith(key), once);
          if (key != kOracle && budget && in.has_gradients()) {  // and the oracle of the block, for SumNoise
            TokenSums scratch;
            cpu_run_chunk(o, ref_arith(kOracle), scratch);
            add_noise(noise[key], in, o, ref_arith(key));
          }
        }
      }
      cpu_finish(c, *s, ref_arith(key));
      return c;
    });
    if (whole) refs.share_reordered(*whole);
    BlockSums bs;
    bs.replays = std::move(replays), bs.ref_replays = std::move(ref_replays);
    bs.sigma = [&](Accuracy c, const std::string& name) -> std::vector<double> {
      refs.get(ref_key(c));  // its pass over B's inputs fills noise[c]
      auto k = noise.find(ref_key(c));
      if (k == noise.end()) return {};
      auto it = k->second.find(name);
      return it == k->second.end() ? std::vector<double>{} : it->second.sigma();
    };
    bs.chain = [&](const std::string& name) {
      auto it = chain.find(name);
      return it == chain.end() ? std::vector<double>{} : it->second.sigma();
    };
    const Case as = a.sums();
    DiffReport sr = diff_block(as, b.sums(), refs, block_opt, bs);
    for (StageReport& r : sr.stages) {
      if (!is_token_sum(r.name)) continue;
      const std::string name = r.name;
      Merged m;  // one block: where, first mismatch and heatmap as for the per-token stages
      merge(m, std::move(r), P, 0, as, opt);
      sums[name] = finish_stage(m, P, opt);
    }
  }
  for (const std::string& name : order) {
    auto it = sums.find(name);
    rep.stages.push_back(it != sums.end() ? std::move(it->second) : finish_stage(merged[name], P, opt));
  }
  DiffOptions fin = opt;
  if (!fin.require.empty() && !b.inputs(0, 1).has_gradients())  // a forward-only case has no backward to require
    for (const Stage& s : stage_table())
      if (s.group == Group::backward) fin.require.erase(s.name);
  finish_report(rep, fin);
  return rep;
}

DiffReport diff_cases(const Case& a, const Case& b, const DiffOptions& opt) {
  auto sa = case_side(a), sb = case_side(b);
  return diff_sides(*sa, *sb, opt, 0, b.prob.T());
}

}  // namespace mhc
