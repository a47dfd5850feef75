// render_text.cpp — the report as a table, the where-lines of wrong stages, and the verdict.
#include <cmath>
#include <cstdio>

#include "diff.h"

namespace mhc {
namespace {

std::string num(double v, int digits = 6) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string index_str(const std::vector<int64_t>& idx) {
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += cat(i ? "," : "", idx[i]);
  return s + "]";
}

const char* colour_of(Status s) {
  switch (s) {
    case Status::ok: return "\033[32m";
    case Status::diverged: return "\033[1;31m";
    case Status::inherited: return "\033[33m";
    case Status::unknown:
    case Status::format: return "\033[1;35m";
    case Status::missing: return "\033[2m";
  }
  return "";
}

}  // namespace

std::string report_table(const DiffReport& r, bool colour) {
  std::string out;
  char buf[640];
  std::snprintf(buf, sizeof buf, "%-9s %-9s %-8s %9s %9s  %-34s %8s %9s  %s\n", "stage", "status", "class", "rel_l2",
                "max_abs", "max_abs at index: A vs B", "mismatch", "nan A/B", "error/limit");
  out += buf;
  for (const StageReport& s : r.stages) {
    const std::string name = one_line(s.name);  // names and notes may quote a file's datasets: no control characters
    std::string status = status_name(s.status);
    status += std::string(9 - std::min<size_t>(9, status.size()), ' ');
    if (colour) status = cat(colour_of(s.status), status, "\033[0m");
    if (!s.compared) {
      std::string note = one_line(cat(s.note, s.hint.empty() ? "" : cat(" — ", s.hint)));
      std::snprintf(buf, sizeof buf, "%-9s %s %s\n", name.c_str(), status.c_str(), note.c_str());
      out += buf;
      continue;
    }
    std::string cls = s.has_accuracy ? accuracy_name(s.accuracy) : "-";
    std::string at = cat(index_str(s.max_abs_index), " ", num(s.a_at), " vs ", num(s.b_at));
    std::string nan = cat(s.nan_a, "/", s.nan_b);
    std::string lim = s.fixed ? cat("a", num(s.atol, 2), " r", num(s.rtol, 2)) : cat(num(s.error, 2), "/", num(s.limit, 2));
    std::snprintf(buf, sizeof buf, "%-9s %s %-8s %9s %9s  %-34s %7.3f%% %9s  %s%s%s\n", name.c_str(), status.c_str(),
                  cls.c_str(), num(s.rel_l2, 3).c_str(), num(s.max_abs, 3).c_str(), at.c_str(),
                  s.count ? 100.0 * double(s.mismatches) / double(s.count) : 0.0, nan.c_str(), lim.c_str(),
                  s.note.empty() ? "" : "  ", one_line(s.note).c_str());
    out += buf;
  }
  for (const StageReport& s : r.stages) {
    if (!s.where.empty() && s.status == Status::diverged)  // root causes; --json has every stage's
      out += cat("  ", one_line(s.name), ": ", s.pattern, "; first mismatch at ", index_str(s.first_mismatch), "\n");
    if (!s.rounding.reason.empty()) out += cat("  ", one_line(s.name), " rounding: ", s.rounding.reason, "\n");
  }
  return out + one_line(r.verdict_line()) + "\n";
}

}  // namespace mhc
