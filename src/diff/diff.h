// diff.h — compare two cases stage by stage: which stage parts ways first, how accurate
// each stage is, where in the tensor it is wrong, and whether a wrong stage introduced
// the error or inherited it. The policy and its reasoning: docs/diff.md.
//
// The engine (engine.cpp) fills a DiffReport; render_*.cpp turn it into text, JSON or
// HTML; dump.cpp writes per-element errors to HDF5. Nothing here prints.
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "case.h"
#include "references.h"

namespace mhc {

// Element loops run on all threads in fixed pieces of this many elements, merged in order:
// the same report bits on any thread count.
constexpr int64_t kElementChunk = int64_t(1) << 16;

// A plain fp32 evaluation this far from the fp64 oracle (in units of the stage's RMS) has lost
// the values themselves: no budget measured from it means anything (StageReport::fp32_error).
constexpr double kNoBudget = 0.1;

enum class Status { ok, diverged, inherited, missing, unknown, format };
const char* status_name(Status s);

enum class Verdict { match, diverged, invalid };  // exit status 0, 1, 2
const char* verdict_name(Verdict v);

struct DiffOptions {
  bool fixed = false;          // --tolerance fixed
  double budget_factor = 2.0;  // k
  double atol = -1, rtol = -1;  // fixed policy; < 0: the per-dtype default
  std::map<std::string, std::pair<double, double>> per_stage;  // name -> (atol, rtol)
  Accuracy accept = Accuracy::fp32;  // the loosest class that still passes
  int64_t tile = 64;                 // tile size of the pattern summary
  std::set<std::string> require;     // stages that must be present on both sides (backward ones: where the case has gradients)
  bool keep_elements = false;        // fill StageReport::elem_error, elem_mask and elem_diff (--dump-diff)
  std::function<void(double)> progress;  // told the fraction of tokens compared, when set
  // What differs between A's and B's /inputs where they are compared anyway (--ignore-inputs),
  // "" where they agree; it may be set while the tokens are compared (a per-token input). A
  // stage over its limit through the inputs alone is then inherited from them, not ok.
  std::string inputs_differ;
};

// Inclusive index ranges, along one axis of a stage's stored shape, holding a mismatch.
struct AxisRanges {
  std::string axis;
  int64_t size = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

// bf16 stages: A against the oracle (or the replay) rounded to nearest even.
struct Rounding {
  bool checked = false;
  int64_t differ = 0;       // elements where A is not the correctly rounded value
  int64_t unexplained = 0;  // ... of them, where the arithmetic's own error cannot explain it
  int64_t ties = 0, ties_not_even = 0;  // exact ties of the fp32 value, and those not rounded to even
  int64_t off_fp32 = 0;     // elements off a tie where A is not the fp32 value rounded to nearest even
  double bias_ulp = 0;      // mean of (A - rounded)/ulp over all elements, positive = away from zero
  std::string reason;       // empty when rounding is consistent with fp32-then-RNE
  bool other_values = false;  // the reason: flips of no rounding mode (A's stage computed from other values?)
  // what the reason is made of: unexplained flips toward and away from zero, the farthest
  // beyond its tie (in steps of the grid there; and in ulps of the stage's unit, floored at its
  // RMS / 64), the sum of (A - rounded)/ulp and the elements it is over
  int64_t toward = 0, away = 0, elements = 0;
  double widest = 0, widest_unit = 0, bias_sum = 0;
  // The lean of A's rounding (docs/diff.md, "Rounding"): per element u = (A - exact) sign(exact)
  // and r, nearest-even's u, in the unit above, u clamped to [-1, 1]; summed over every element,
  // by octave of |exact| / RMS and by place in a token's row (column), each beside the same sums
  // of the null: the plain class-C evaluation rounded to nearest even against the oracle, which
  // leans where the class's own arithmetic does (TF32 operands truncated where terms cancel).
  // Rows (tokens) are judged in their block: how many lean, and the one that leans the most.
  struct Lean {
    double n = 0, u = 0, u2 = 0, d = 0, d2 = 0;  // count, sums of u, u^2, u - r, (u - r)^2
    void add(const Lean& o) { n += o.n, u += o.u, u2 += o.u2, d += o.d, d2 += o.d2; }
  };
  struct Group {
    Lean a, null;
    void add(const Group& o) { a.add(o.a), null.add(o.null); }
  };
  static constexpr int kBands = 8;  // octaves of |exact| / RMS: [1/2, inf), [1/4, 1/2), ..., [0, 2^-7)
  Group lean_all, lean_band[kBands];
  // u signed by +1 (not by sign(exact)), over every element, by column and by row: rounding toward
  // +inf or -inf
  Group lean_up;
  std::vector<Group> lean_col, lean_col_up;
  struct Rows {  // the rows that lean (judged in their block); the one that leans most (its token), and its sums
    int64_t count = 0, most = -1;
    Lean sums;
    void keep(int64_t t, const Lean& g) {
      if (most < 0 || std::fabs(g.u / g.n) > std::fabs(sums.u / sums.n)) most = t, sums = g;
    }
    void add(const Rows& o) {
      count += o.count;
      if (o.most >= 0) keep(o.most, o.sums);
    }
  };
  Rows rows, rows_up;  // u signed by sign(exact); by +1
};

// Error over limit, binned: rows along the tokens (or the first axis), columns along the rest.
struct Heatmap {
  int64_t rows = 0, cols = 0;          // bins
  int64_t row_span = 0, col_span = 0;  // indices per bin
  std::string row_axis, col_axes;
  std::vector<float> value;  // rows x cols, the largest error/limit in each bin
};

struct StageReport {
  std::string name;
  Status status = Status::ok;
  std::string note, hint, inherited_from;
  bool compared = false;
  Accuracy accuracy = Accuracy::diverged;  // meaningful when compared
  bool has_accuracy = false;               // false under a fixed tolerance
  int64_t count = 0, mismatches = 0, nan_a = 0, inf_a = 0, nan_b = 0, inf_b = 0;
  double rel_l2 = 0, max_abs = 0, max_rel = 0, a_at = 0, b_at = 0, min_atol = 0;
  double l2_num = 0, l2_den = 0;  // sum (a-b)^2 and sum b^2 over finite differences: rel_l2
  std::vector<int64_t> max_abs_index;
  // tolerance: fixed (atol, rtol) or budget (error and limit in `unit`, for the accepted class)
  bool fixed = false;
  double atol = 0, rtol = 0, error = 0, limit = 0, reference_error = 0;
  // budget: B's own largest error against the oracle over the limit B would face as A against
  // cpu:fp64 (the limit without E_B), counted only where B's value is also that far off its own
  // fp64 replay; > 1: the reference itself is wrong here (docs/diff.md, "A wrong reference")
  double reference_over = 0;
  std::map<Accuracy, double> class_limit, class_error;  // budget: per class, limit and E_C
  // budget, fp32-unit stages: the plain fp32 evaluation's largest error (E_C of fp32) over the
  // blocks; at kNoBudget or more fp32 itself cannot evaluate the inputs (an overflow), and no
  // budget holds
  double fp32_error = 0;
  std::string unit;
  Rounding rounding;
  Rounding reference_rounding;  // B's, the same checks (bf16 stages): a reference that truncates is no reference
  std::vector<AxisRanges> where;  // for diverged and inherited stages
  std::vector<int64_t> first_mismatch;
  std::string pattern;
  Heatmap heat;  // for diverged and inherited stages
  std::vector<float> elem_error;    // with keep_elements: each element's error in `unit` (fixed: 0 or 2)
  std::vector<uint8_t> elem_mask;   // with keep_elements: 1 where the element fails
  std::vector<float> elem_diff;     // with keep_elements: A - B
};

struct DiffReport {
  std::vector<StageReport> stages;
  Verdict verdict = Verdict::match;
  Accuracy accept = Accuracy::fp32;
  int compared = 0;
  std::string first_divergent;  // "" when none
  std::string reference_wrong;  // the first stage where B itself is wrong (reference_over > 1): invalid
  std::string no_budget;        // the first stage whose fp32_error is kNoBudget or more: invalid
  std::vector<std::string> root_causes;
  std::vector<std::string> missing_required;
  std::string verdict_line() const;
  int exit_status() const { return int(verdict); }
  bool match() const { return verdict == Verdict::match; }
};

// --require's stages: "all", "forward", "backward", "outputs" (h_in, h_post, h_res and the
// inputs' gradients), "none", or a comma-separated list of computed stages; UserError otherwise.
std::set<std::string> parse_require(const std::string& text);

// Compares A against the reference B (docs/diff.md): block of kTokenBlock tokens by block,
// the sums over tokens at the end. Sides and streaming: stream.h.
DiffReport diff_cases(const Case& a, const Case& b, const DiffOptions& opt);

// sqrt(num/den), or sqrt(num) when den is 0.
inline double rel_l2(double num, double den) { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }

// Empty when the /inputs of a and b are identical, else what differs first.
std::string inputs_difference(const Case& a, const Case& b);

std::string report_json(const DiffReport& r);
std::string json_string(const std::string& s);                // a JSON string literal
std::string where_json(const std::vector<AxisRanges>& where);  // [{"axis", "size", "ranges"}, ...]
std::string report_table(const DiffReport& r, bool colour);
std::string report_html(const DiffReport& r, const std::string& title);

}  // namespace mhc
