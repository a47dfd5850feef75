// render_json.cpp — the report as JSON (contract in docs/diff.md). Non-finite numbers are null.
#include <cmath>
#include <cstdio>

#include "diff.h"

namespace mhc {
namespace {

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Length of the well-formed UTF-8 sequence at s[i] (1 for ASCII), or 0 where it is not one.
size_t utf8_length(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 && c >= 0xc2 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 && c <= 0xf4 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
  // no overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) or code points past U+10FFFF (F4 90..)
  const unsigned char c1 = len > 1 ? static_cast<unsigned char>(s[i + 1]) : 0;
  if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f)) return 0;
  return len;
}

}  // namespace

// A JSON string literal. Control characters become spaces; bytes that are not UTF-8 (a dataset
// name in another encoding) become \u00XX, so that the report stays valid JSON.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const size_t len = utf8_length(s, i);
    if (len == 0) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned char>(c));
      out += esc, ++i;
      continue;
    }
    if (c == '"' || c == '\\') out += cat("\\", c);
    else if (c == '\n') out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) out += " ";
    else out.append(s, i, len);
    i += len;
  }
  return out + "\"";
}

std::string where_json(const std::vector<AxisRanges>& where) {
  std::string out = "[";
  for (size_t i = 0; i < where.size(); ++i) {
    out += cat(i ? ", " : "", "{\"axis\": ", json_string(where[i].axis), ", \"size\": ", where[i].size, ", \"ranges\": [");
    for (size_t j = 0; j < where[i].ranges.size(); ++j)
      out += cat(j ? ", " : "", "[", where[i].ranges[j].first, ", ", where[i].ranges[j].second, "]");
    out += "]}";
  }
  return out + "]";
}

namespace {

template <class T> std::string list(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, std::string>) out += cat(i ? ", " : "", json_string(v[i]));
    else out += cat(i ? ", " : "", v[i]);
  }
  return out + "]";
}


std::string stage_json(const StageReport& s) {
  std::string out = cat("{\"name\": ", json_string(s.name), ", \"status\": ", json_string(status_name(s.status)));
  if (!s.note.empty()) out += cat(", \"note\": ", json_string(s.note));
  if (!s.hint.empty()) out += cat(", \"hint\": ", json_string(s.hint));
  if (!s.inherited_from.empty()) out += cat(", \"inherited_from\": ", json_string(s.inherited_from));
  out += cat(", \"class\": ", s.compared && s.has_accuracy ? json_string(accuracy_name(s.accuracy)) : "null");
  if (!s.compared)
    return out + ", \"rel_l2\": null, \"max_abs\": null, \"max_abs_index\": null, \"mismatch_fraction\": null, \"tolerance\": null}";
  out += cat(", \"rel_l2\": ", num(s.rel_l2), ", \"max_abs\": ", num(s.max_abs), ", \"max_abs_index\": ",
             list(s.max_abs_index), ", \"a_at_max\": ", num(s.a_at), ", \"b_at_max\": ", num(s.b_at),
             ", \"max_rel\": ", num(s.max_rel), ", \"mismatches\": ", s.mismatches, ", \"count\": ", s.count,
             ", \"mismatch_fraction\": ", num(s.count ? double(s.mismatches) / double(s.count) : 0), ", \"nan\": [",
             s.nan_a, ", ", s.nan_b, "], \"inf\": [", s.inf_a, ", ", s.inf_b, "], \"min_passing_atol\": ", num(s.min_atol));
  if (s.fixed) {
    out += cat(", \"tolerance\": {\"policy\": \"fixed\", \"atol\": ", num(s.atol), ", \"rtol\": ", num(s.rtol), "}");
  } else {
    out += cat(", \"tolerance\": {\"policy\": \"budget\", \"unit\": ", json_string(s.unit), ", \"limit\": ", num(s.limit),
               ", \"error\": ", num(s.error), ", \"reference_error\": ", num(s.reference_error),
               ", \"reference_over\": ", num(s.reference_over), ", \"classes\": {");
    bool first = true;
    for (auto& [c, limit] : s.class_limit) {
      out += cat(first ? "" : ", ", json_string(accuracy_name(c)), ": {\"limit\": ", num(limit), ", \"plain_error\": ",
                 num(s.class_error.at(c)), "}");
      first = false;
    }
    out += "}}";
  }
  if (s.rounding.checked)
    out += cat(", \"rounding\": {\"differ\": ", s.rounding.differ, ", \"unexplained\": ", s.rounding.unexplained,
               ", \"ties\": ", s.rounding.ties, ", \"ties_not_even\": ", s.rounding.ties_not_even, ", \"off_fp32\": ", s.rounding.off_fp32,
               ", \"bias_ulp\": ", num(s.rounding.bias_ulp), ", \"reason\": ",
               s.rounding.reason.empty() ? "null" : json_string(s.rounding.reason), "}");
  if (!s.where.empty())
    out += cat(", \"where\": ", where_json(s.where), ", \"first_mismatch\": ", list(s.first_mismatch),
               ", \"pattern\": ", json_string(s.pattern));
  return out + "}";
}

}  // namespace

std::string report_json(const DiffReport& r) {
  std::string out = cat("{\"schema\": 2, \"verdict\": ", json_string(verdict_name(r.verdict)), ", \"accept\": ",
                        json_string(accuracy_name(r.accept)), ", \"first_divergent\": ",
                        r.first_divergent.empty() ? "null" : json_string(r.first_divergent), ", \"root_causes\": ",
                        list(r.root_causes), ", \"missing_required\": ", list(r.missing_required), ", \"reference_wrong\": ",
                        r.reference_wrong.empty() ? "null" : json_string(r.reference_wrong), ", \"no_budget\": ",
                        r.no_budget.empty() ? "null" : json_string(r.no_budget),
                        ", \"compared\": ", r.compared, ", \"summary\": ", json_string(r.verdict_line()), ", \"stages\": [");
  for (size_t i = 0; i < r.stages.size(); ++i) out += cat(i ? ",\n  " : "\n  ", stage_json(r.stages[i]));
  return out + "\n]}\n";
}

}  // namespace mhc
