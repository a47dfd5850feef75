// diff.h — compare two cases stage by stage and say where they part ways.
//
// Policy (docs/diff.md): by default a stage passes when its error against the reference
// is at most k x the CPU fp32 golden's error against the fp64 oracle, plus the
// reference's own error against the oracle, plus a noise floor;
// bf16 stages are measured in bf16 ulps, the others relative to the reference's RMS.
// Diverging stages are replayed from side A's own upstream tensors to tell an error a
// stage introduces from one it inherits.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "case.h"

namespace mhc {

struct DiffOptions {
  bool fixed = false;          // --tolerance fixed
  double budget_factor = 2.0;  // k
  double atol = -1, rtol = -1;  // fixed policy; < 0: the per-dtype default
  std::map<std::string, std::pair<double, double>> per_stage;  // name -> (atol, rtol)
};

struct StageReport {
  std::string name, status;  // ok | diverged | inherited | missing
  std::string note;          // why missing, shape mismatch, "inherited from X"
  std::string inherited_from;
  int64_t count = 0, mismatches = 0, nan_a = 0, inf_a = 0, nan_b = 0, inf_b = 0;
  double rel_l2 = 0, max_abs = 0, max_rel = 0, a_at = 0, b_at = 0, min_atol = 0;
  std::vector<int64_t> max_abs_index;
  // tolerance: fixed (atol, rtol) or budget (error and limit in `unit`)
  bool fixed = false;
  double atol = 0, rtol = 0, error = 0, limit = 0, golden_error = 0, reference_error = 0;
  std::string unit;
};

struct DiffReport {
  std::vector<StageReport> stages;
  bool match = true;
  std::string first_divergent;        // "" when none
  std::vector<std::string> root_causes;
  std::string verdict_line() const;
};

// The golden's error per stage, measured on `inputs`: cpu fp32 against cpu fp64.
struct Budget {
  Case golden, oracle;
};
Budget measure_budget(const Case& inputs);

// Compares A against the reference B. The budget is used unless opt.fixed.
DiffReport diff_cases(const Case& a, const Case& b, const Budget& budget, const DiffOptions& opt);

// Empty when the /inputs of a and b are identical, else what differs first.
std::string inputs_difference(const Case& a, const Case& b);

std::string report_json(const DiffReport& r);
std::string report_table(const DiffReport& r, bool colour);

}  // namespace mhc
