#include "diff.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "cpu_backend.h"

namespace mhc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// How one element's error is measured, and when it fails.
struct Rule {
  bool fixed = false;
  double atol = 0, rtol = 0;  // fixed
  bool ulp = false;           // budget: bf16 ulps (true) or fractions of the reference RMS
  double rms = 1, limit = 0;  // budget
  double golden_err = 0, ref_err = 0;  // budget: what the limit is made of
  double error(double diff, double b) const {
    return ulp ? diff / bf16_ulp(std::max(std::fabs(b), rms * 0x1p-10)) : diff / rms;
  }
  bool fails(double diff, double b) const { return fixed ? diff > atol + rtol * std::fabs(b) : error(diff, b) > limit; }
};

double finite_rms(const Tensor& t) {
  double s = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < t.size(); ++i)
    if (double v = t.at(i); std::isfinite(v)) s += v * v, ++n;
  double r = n ? std::sqrt(s / double(n)) : 0;
  return r > 0 ? r : 1;
}

Rule budget_rule(const Stage& s, const Tensor& ref, double limit) {
  Rule r;
  r.ulp = s.dtype == DType::bf16;
  r.rms = finite_rms(ref);
  r.limit = limit;
  return r;
}

double noise_floor(const Stage& s) { return s.dtype == DType::bf16 ? 0.25 : 1e-6; }

// torch.testing.assert_close's defaults, by the stage's dtype.
std::pair<double, double> default_tol(const Stage& s) {
  return s.dtype == DType::bf16 ? std::pair{1e-5, 1.6e-2} : std::pair{1e-5, 1.3e-6};
}

std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return idx;
}

// Every metric of a against b under `rule`; a and b have equal shapes.
StageReport compare(const std::string& name, const Tensor& a, const Tensor& b, const Rule& rule) {
  StageReport r;
  r.name = name;
  r.count = b.size();
  double num = 0, den = 0, worst = -1;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < b.size(); ++i) {
    double x = a.at(i), y = b.at(i);
    r.nan_a += std::isnan(x), r.inf_a += std::isinf(x), r.nan_b += std::isnan(y), r.inf_b += std::isinf(y);
    bool same_special = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
    double diff;
    if (same_special) {
      diff = 0;
    } else if (!std::isfinite(x) || !std::isfinite(y)) {
      diff = kInf;
    } else {
      diff = std::fabs(x - y);
      num += diff * diff, den += y * y;
    }
    if (diff == kInf || rule.fails(diff, y)) ++r.mismatches;
    if (diff > worst) worst = diff, worst_i = i;
    if (diff != kInf && !same_special) {
      if (y != 0) r.max_rel = std::max(r.max_rel, diff / std::fabs(y));
      if (!rule.fixed) r.error = std::max(r.error, rule.error(diff, y));
      r.min_atol = std::max(r.min_atol, diff - (rule.fixed ? rule.rtol : 0) * std::fabs(y));
    } else if (diff == kInf) {
      r.error = r.min_atol = kInf;
    }
  }
  r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  r.max_abs = std::max(worst, 0.0);
  r.max_abs_index = unravel(worst_i, b.shape);
  r.a_at = b.size() ? a.at(worst_i) : 0;
  r.b_at = b.size() ? b.at(worst_i) : 0;
  r.fixed = rule.fixed;
  r.atol = rule.atol, r.rtol = rule.rtol, r.limit = rule.limit;
  r.unit = rule.fixed ? "" : rule.ulp ? "bf16_ulp" : "ref_rms";
  r.status = r.mismatches ? "diverged" : "ok";
  return r;
}

}  // namespace

Budget measure_budget(const Case& inputs) {
  Budget b{inputs.inputs_only(), inputs.inputs_only()};
  cpu_run(b.golden, Precision::fp32);
  cpu_run(b.oracle, Precision::fp64);
  return b;
}

std::string inputs_difference(const Case& a, const Case& b) {
  if (a.prob.norm_eps != b.prob.norm_eps || a.prob.hc_eps != b.prob.hc_eps) return "norm_eps/hc_eps attributes";
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

DiffReport diff_cases(const Case& a, const Case& b, const Budget& budget, const DiffOptions& opt) {
  DiffReport rep;
  std::map<std::string, Rule> rules;
  std::map<std::string, const StageReport*> by_name;

  auto rule_for = [&](const Stage& s) {
    Rule r;
    auto it = opt.per_stage.find(s.name);
    if (opt.fixed || it != opt.per_stage.end()) {
      auto [atol, rtol] = it != opt.per_stage.end() ? it->second : default_tol(s);
      if (it == opt.per_stage.end() && opt.atol >= 0) atol = opt.atol;
      if (it == opt.per_stage.end() && opt.rtol >= 0) rtol = opt.rtol;
      r.fixed = true, r.atol = atol, r.rtol = rtol;
      return r;
    }
    // limit = k x (golden vs oracle) + (reference vs oracle) + floor: A may be k times as
    // wrong as the golden, and is not blamed for the reference's own error (zero when the
    // reference is the oracle; by the triangle inequality a within-budget A then passes).
    const Tensor &g = budget.golden.get(s.name), &o = budget.oracle.get(s.name);
    Rule probe = budget_rule(s, o, 0);
    double golden_err = compare(s.name, g, o, probe).error, ref_err = compare(s.name, b.get(s.name), o, probe).error;
    r = budget_rule(s, b.get(s.name), opt.budget_factor * golden_err + ref_err + noise_floor(s));
    r.golden_err = golden_err, r.ref_err = ref_err;
    return r;
  };

  rep.stages.reserve(stage_table().size());
  for (const Stage& s : stage_table()) {
    bool ha = a.has(s.name), hb = b.has(s.name);
    if (s.group == Group::inputs && !(ha && hb)) continue;
    StageReport r;
    r.name = s.name;
    if (!ha || !hb) {
      r.status = "missing";
      r.note = !ha && !hb ? "on both sides" : !ha ? "missing in A" : "missing in B";
    } else if (a.get(s.name).shape != b.get(s.name).shape) {
      r.status = "diverged";
      r.note = cat("shape ", shape_str(a.get(s.name).shape), " vs ", shape_str(b.get(s.name).shape));
      r.mismatches = r.count = b.get(s.name).size();
    } else if (s.group == Group::inputs || budget.golden.has(s.name) || opt.fixed || opt.per_stage.count(s.name)) {
      Rule rule = s.group == Group::inputs ? Rule{true} : rule_for(s);
      r = compare(s.name, a.get(s.name), b.get(s.name), rule);
      r.golden_error = rule.golden_err, r.reference_error = rule.ref_err;
      rules[s.name] = rule;
    } else {
      r.status = "missing";
      r.note = "no golden for this stage";
    }
    if (s.group == Group::inputs && r.status == "ok") continue;  // identical inputs: not listed
    rep.stages.push_back(r);
  }
  for (auto& r : rep.stages) by_name[r.name] = &r;

  // Replay: recompute a stage in fp64 from A's own upstream tensors (or their replays).
  std::map<std::string, Tensor> replayed;
  std::function<const Tensor&(const std::string&)> value_in_a = [&](const std::string& name) -> const Tensor& {
    if (a.has(name)) return a.get(name);
    auto it = replayed.find(name);
    if (it != replayed.end()) return it->second;
    TensorMap deps;
    for (const char* d : stage(name).deps) deps[d] = value_in_a(d);
    return replayed[name] = cpu_stage(name, a.prob, deps, Precision::fp64);
  };
  auto diverging = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it != by_name.end() && (it->second->status == "diverged" || it->second->status == "inherited");
  };
  // Nearest diverging ancestor, looking through stages that were not compared.
  std::function<std::string(const std::string&)> upstream = [&](const std::string& name) -> std::string {
    for (const char* d : stage(name).deps) {
      if (diverging(d)) return d;
      auto it = by_name.find(d);
      if (it == by_name.end() || it->second->status == "missing")
        if (std::string u = upstream(d); !u.empty()) return u;
    }
    return "";
  };

  for (auto& r : rep.stages) {
    const Stage& s = stage(r.name);
    if (r.status != "diverged" || s.group == Group::inputs || !r.note.empty()) continue;
    TensorMap deps;
    for (const char* d : s.deps) deps[d] = value_in_a(d);
    Tensor re = cpu_stage(r.name, a.prob, deps, Precision::fp64);
    Rule rule = rules[r.name];
    if (!rule.fixed) rule.rms = finite_rms(re), rule.limit -= rule.ref_err;  // the replay is fp64: no reference error
    if (compare(r.name, a.get(r.name), re, rule).mismatches == 0) {
      r.status = "inherited";
      r.inherited_from = upstream(r.name);
      r.note = r.inherited_from.empty() ? "consistent with its inputs; error accumulated upstream"
                                        : cat("inherited from ", r.inherited_from);
    }
  }

  for (auto& r : rep.stages) {
    if (r.status != "diverged" && r.status != "inherited") continue;
    rep.match = false;
    if (rep.first_divergent.empty()) rep.first_divergent = r.name;
    if (r.status == "diverged") rep.root_causes.push_back(r.name);
  }
  return rep;
}

std::string DiffReport::verdict_line() const {
  if (match) return "match: every stage present on both sides is within tolerance";
  std::string line = cat("diverged: first at ", first_divergent);
  std::map<std::string, std::vector<std::string>> inherited;  // source -> stages
  for (auto& s : stages) {
    if (s.name == first_divergent)
      line += s.status == "diverged" ? " (introduced)" : cat(" (", s.note, ")");
    else if (s.status == "inherited")
      inherited[s.inherited_from].push_back(s.name);
  }
  std::string others;
  for (auto& r : root_causes)
    if (r != first_divergent) others += cat(others.empty() ? "" : ", ", r);
  if (!others.empty()) line += cat("; also introduced: ", others);
  for (auto& [from, names] : inherited) {
    std::string list;
    for (auto& n : names) list += cat(list.empty() ? "" : ", ", n);
    line += cat("; ", list, " inherited", from.empty() ? " (accumulated upstream)" : cat(" from ", from));
  }
  return line;
}

namespace {
std::string num(double v, int digits = 6) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
std::string index_str(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += cat(i ? "," : "", idx[i]);
  return s + "]";
}
}  // namespace

std::string report_json(const DiffReport& r) {
  std::string out = cat("{\"schema\": 1, \"verdict\": \"", r.match ? "match" : "diverged", "\", \"first_divergent\": ",
                        r.first_divergent.empty() ? "null" : cat("\"", r.first_divergent, "\""), ", \"root_causes\": [");
  for (size_t i = 0; i < r.root_causes.size(); ++i) out += cat(i ? ", " : "", "\"", r.root_causes[i], "\"");
  out += cat("], \"summary\": \"", r.verdict_line(), "\", \"stages\": [");
  for (size_t i = 0; i < r.stages.size(); ++i) {
    const StageReport& s = r.stages[i];
    out += cat(i ? ",\n  " : "\n  ", "{\"name\": \"", s.name, "\", \"status\": \"", s.status, "\"");
    if (!s.note.empty()) out += cat(", \"note\": \"", s.note, "\"");
    if (!s.inherited_from.empty()) out += cat(", \"inherited_from\": \"", s.inherited_from, "\"");
    if (s.status != "missing" && s.note.rfind("shape", 0) != 0) {
      out += cat(", \"rel_l2\": ", num(s.rel_l2), ", \"max_abs\": ", num(s.max_abs), ", \"max_abs_index\": ",
                 index_str(s.max_abs_index), ", \"a_at_max\": ", num(s.a_at), ", \"b_at_max\": ", num(s.b_at),
                 ", \"max_rel\": ", num(s.max_rel), ", \"mismatches\": ", s.mismatches, ", \"count\": ", s.count,
                 ", \"mismatch_fraction\": ", num(s.count ? double(s.mismatches) / double(s.count) : 0),
                 ", \"nan\": [", s.nan_a, ", ", s.nan_b, "], \"inf\": [", s.inf_a, ", ", s.inf_b, "]",
                 ", \"min_passing_atol\": ", num(s.min_atol));
      out += s.fixed ? cat(", \"tolerance\": {\"policy\": \"fixed\", \"atol\": ", num(s.atol), ", \"rtol\": ", num(s.rtol), "}")
                     : cat(", \"tolerance\": {\"policy\": \"budget\", \"unit\": \"", s.unit, "\", \"limit\": ",
                           num(s.limit), ", \"error\": ", num(s.error), ", \"golden_error\": ", num(s.golden_error),
                           ", \"reference_error\": ", num(s.reference_error), "}");
    } else {
      out += ", \"rel_l2\": null, \"max_abs\": null, \"max_abs_index\": null, \"mismatch_fraction\": null, \"tolerance\": null";
    }
    out += "}";
  }
  return out + "\n]}\n";
}

std::string report_table(const DiffReport& r, bool colour) {
  auto paint = [&](const std::string& status, const std::string& text) {
    if (!colour) return text;
    const char* c = status == "ok" ? "\033[32m" : status == "diverged" ? "\033[1;31m" : status == "inherited" ? "\033[33m" : "\033[2m";
    return cat(c, text, "\033[0m");
  };
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-9s %-10s %9s %9s  %-34s %9s  %s\n", "stage", "status", "rel_l2", "max_abs",
                "max_abs at index: A vs B", "mismatch", "error/limit");
  out += buf;
  for (const StageReport& s : r.stages) {
    std::string status = paint(s.status, cat(s.status, std::string(10 - std::min<size_t>(10, s.status.size()), ' ')));
    if (s.status == "missing" || s.note.rfind("shape", 0) == 0) {
      std::snprintf(buf, sizeof buf, "%-9s %s %s\n", s.name.c_str(), status.c_str(), s.note.c_str());
    } else {
      std::string at = cat(index_str(s.max_abs_index), " ", num(s.a_at), " vs ", num(s.b_at));
      std::string lim = s.fixed ? cat("a", num(s.atol, 2), " r", num(s.rtol, 2)) : cat(num(s.error, 2), "/", num(s.limit, 2));
      std::snprintf(buf, sizeof buf, "%-9s %s %9.3g %9.3g  %-34s %8.3f%%  %s%s%s\n", s.name.c_str(), status.c_str(),
                    s.rel_l2, s.max_abs, at.c_str(), s.count ? 100.0 * double(s.mismatches) / double(s.count) : 0.0,
                    lim.c_str(), s.note.empty() ? "" : "  ", s.note.c_str());
    }
    out += buf;
  }
  return out + r.verdict_line() + "\n";
}

}  // namespace mhc
