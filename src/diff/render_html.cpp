// render_html.cpp — the report as one self-contained HTML page: verdict, stage table, and
// per wrong stage an SVG heatmap of error/limit. No scripts, no network, no external files.
#include <cmath>
#include <cstdio>

#include "diff.h"

namespace mhc {
namespace {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// error/limit -> colour: white at 0, yellow at the limit, red above it, dark red at 10x.
std::string colour(float v) {
  double t = std::min(1.0, double(v));
  int r = 255, g = int(255 - 40 * t), b = int(255 * (1 - t));
  if (v > 1) {
    double u = std::min(1.0, std::log10(double(v)));  // 1x .. 10x
    r = int(230 - 100 * u), g = int(60 * (1 - u)), b = int(40 * (1 - u));
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
  return buf;
}

std::string heatmap_svg(const StageReport& s) {
  const Heatmap& h = s.heat;
  if (h.value.empty()) return "";
  const int cell_w = std::max<int>(2, int(640 / h.cols)), cell_h = std::max<int>(2, int(256 / h.rows));
  const int w = int(h.cols) * cell_w, ht = int(h.rows) * cell_h;
  std::string out = cat("<figure><svg role=\"img\" aria-label=\"error heatmap of ", esc(s.name), "\" width=\"", w + 2,
                        "\" height=\"", ht + 2, "\" xmlns=\"http://www.w3.org/2000/svg\">");
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t c = 0; c < h.cols; ++c) {
      float v = h.value[size_t(r * h.cols + c)];
      out += cat("<rect x=\"", 1 + c * cell_w, "\" y=\"", 1 + r * cell_h, "\" width=\"", cell_w, "\" height=\"", cell_h,
                 "\" fill=\"", colour(v), "\"><title>", h.row_axis.empty() ? "" : cat(h.row_axis, " ", r * h.row_span, "–",
                 (r + 1) * h.row_span - 1, ", "), h.col_axes, " ", c * h.col_span, "–", (c + 1) * h.col_span - 1,
                 ": error/limit ", num(v), "</title></rect>");
    }
  out += cat("<rect x=\"0.5\" y=\"0.5\" width=\"", w + 1, "\" height=\"", ht + 1,
             "\" fill=\"none\" stroke=\"#888\"/></svg><figcaption>", esc(s.name), ": largest error/limit per bin; rows: ",
             h.row_axis.empty() ? "-" : esc(h.row_axis), " (", h.row_span, " per row), columns: ", esc(h.col_axes), " (",
             h.col_span, " per column). White 0, yellow at the limit, red above it.</figcaption></figure>");
  return out;
}

}  // namespace

std::string report_html(const DiffReport& r, const std::string& title) {
  const char* vcls = r.verdict == Verdict::match ? "match" : r.verdict == Verdict::diverged ? "diverged" : "invalid";
  std::string out = cat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", esc(title), "</title><style>"
      "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:13px}"
      "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}"
      "td:first-child,th:first-child,td:nth-child(n+9),th:nth-child(n+9){text-align:left}"
      "td:nth-child(n+9){white-space:normal}"
      ".verdict{font-size:16px;padding:8px;border-radius:4px}.match{background:#dfd}.diverged{background:#fdd}"
      ".invalid{background:#fde}.s-ok{color:#070}.s-diverged{color:#c00;font-weight:bold}.s-inherited{color:#a60}"
      ".s-unknown,.s-format{color:#909;font-weight:bold}.s-missing{color:#888}figure{margin:1em 0}"
      "</style></head><body>\n<h1>", esc(title), "</h1>\n<p class=\"verdict ", vcls, "\" id=\"verdict\">",
      esc(r.verdict_line()), "</p>\n<p>accepted class: ", accuracy_name(r.accept), "; stages compared: ", r.compared,
      "</p>\n<table id=\"stages\"><tr><th>stage</th><th>status</th><th>class</th><th>rel_l2</th><th>max_abs</th>"
      "<th>mismatch</th><th>NaN A/B</th><th>error / limit</th><th>where</th><th>note</th></tr>\n");
  for (const StageReport& s : r.stages) {
    out += cat("<tr><td>", esc(s.name), "</td><td class=\"s-", status_name(s.status), "\">", status_name(s.status),
               "</td>");
    if (s.compared) {
      out += cat("<td>", s.has_accuracy ? accuracy_name(s.accuracy) : "-", "</td><td>", num(s.rel_l2), "</td><td>",
                 num(s.max_abs), "</td><td>", num(s.count ? 100.0 * double(s.mismatches) / double(s.count) : 0),
                 "%</td><td>", s.nan_a, "/", s.nan_b, "</td><td>",
                 s.fixed ? cat("atol ", num(s.atol), " rtol ", num(s.rtol)) : cat(num(s.error), " / ", num(s.limit)),
                 "</td>");
    } else {
      out += "<td>-</td><td></td><td></td><td></td><td></td><td></td>";
    }
    std::string note = s.note;
    if (!s.hint.empty()) note += cat(note.empty() ? "" : "; ", s.hint);
    if (!s.rounding.reason.empty()) note += cat(note.empty() ? "" : "; ", "rounding: ", s.rounding.reason);
    out += cat("<td>", esc(s.pattern), "</td><td>", esc(note), "</td></tr>\n");
  }
  out += "</table>\n";
  for (const StageReport& s : r.stages)
    if (!s.heat.value.empty())
      out += cat("<h2>", esc(s.name), " — ", status_name(s.status), "</h2>\n<p>", esc(s.pattern), "</p>\n",
                 heatmap_svg(s), "\n");
  return out + "</body></html>\n";
}

}  // namespace mhc
