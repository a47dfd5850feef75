// cmd_check.cpp — mhc check BACKEND: the backend against a reference on every case of a
// named list (check_cases.h), one line per case, then what the failures have in common.
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <memory>

#include "backends.h"
#include "check_cases.h"
#include "commands.h"
#include "diff.h"
#include "h5io.h"

namespace mhc {
namespace {

// A case's name as a file name in --keep's directory: a name from --cases or a --vary value may
// hold '/' ("../x").
std::string kept_name(const std::string& name) {
  std::string file = name;
  for (char& ch : file)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && !std::strchr("._=@,+-", ch)) ch = '_';
  return file[0] == '.' ? "_" + file : file;
}

struct Outcome {
  const CheckCase* c = nullptr;
  bool passed = false, kept = false;  // kept: its files are in --keep's directory
  std::string verdict, first_divergent, accuracy, pattern, reason;
  std::vector<AxisRanges> where;
};

// Outputs that no correct kernel produces, whatever the reference says.
std::string broken_invariant(const Case& a) {
  const double eps = a.prob.hc_eps, ulp = 0x1p-23;
  struct Rule {
    const char* stage;
    double lo, hi;
    const char* range;
  };
  const std::string pre = cat("(hc_eps, 1 + hc_eps] = (", eps, ", ", 1 + eps, "]");
  const Rule rules[] = {{"inv_rms", std::numeric_limits<double>::denorm_min(), INFINITY, "> 0"},
                        {"h_pre", float(eps) * (1 - ulp), (1 + eps) * (1 + ulp), pre.c_str()},
                        {"h_post", 0, 2, "[0, 2]"}};
  for (const Rule& r : rules) {
    if (!a.has(r.stage)) continue;
    const Tensor& t = a.get(r.stage);
    const int64_t per = std::max<int64_t>(1, t.size() / std::max<int64_t>(1, a.prob.T()));
    for (int64_t i = 0; i < t.size(); ++i)
      if (double v = t.at(i); std::isfinite(v) && !(v >= r.lo && v <= r.hi))
        return cat(r.stage, " = ", v, " at token ", i / per, " is outside ", r.range);
  }
  if (std::string at = a.first_failed(); !at.empty()) return at;
  return "";
}

// The first stage in which two runs of the backend differ, bit for bit; "" when none does.
std::string first_difference(const Case& a, const Case& b) {
  for (const Stage& s : stage_table())
    if (s.group != Group::inputs && a.has(s.name) && b.has(s.name) && a.get(s.name).bytes != b.get(s.name).bytes)
      return s.name;
  return "";
}

// inv_rms = c·(reference) for one constant c: the RMS over the wrong count (TensorRT-LLM #13587).
std::string constant_factor(const Case& a, const Case& b) {
  if (!a.has("inv_rms") || !b.has("inv_rms") || a.get("inv_rms").shape != b.get("inv_rms").shape) return "";
  const Tensor &x = a.get("inv_rms"), &y = b.get("inv_rms");
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < x.size(); ++i) {
    double r = x.at(i) / y.at(i);
    lo = std::min(lo, r), hi = std::max(hi, r);
  }
  const double mid = (lo + hi) / 2, n = double(a.prob.n);
  if (!(hi - lo <= 1e-3 * mid) || std::fabs(mid - 1) < 1e-3) return "";
  std::string why = cat("off by a constant factor ≈ ", std::round(mid * 1e4) / 1e4);
  if (n > 1 && std::fabs(mid - 1 / std::sqrt(n)) < 1e-2 * mid)
    why += " ≈ 1/√n: the sum of squares divided by D instead of n·D?";
  if (n > 1 && std::fabs(mid - std::sqrt(n)) < 1e-2 * mid)
    why += " ≈ √n: the sum of squares over one stream (D values) divided by n·D?";
  return why;
}

Outcome check_one(const CheckCase& cc, const BackendSpec& backend, const BackendSpec& against, int repeat,
                  const DiffOptions& opt, const std::string& keep) {
  Outcome o;
  o.c = &cc;
  Case in = make_inputs(cc), a = in, b = in;
  const Pass pass = cc.forward_only ? Pass::fwd : Pass::both;
  struct Env {  // --vary: the variable set while the backend runs, restored after
    std::string name, old;
    bool had = false;
    Env(const std::string& n, const std::string& v) : name(n) {
      if (name.empty()) return;
      const char* o = std::getenv(name.c_str());
      had = o, old = o ? o : "";
      setenv(name.c_str(), v.c_str(), 1);
    }
    ~Env() {
      if (name.empty()) return;
      had ? (void)setenv(name.c_str(), old.c_str(), 1) : (void)unsetenv(name.c_str());
    }
  };
  try {
    Env env(cc.env, cc.env_value);
    run_backend(backend, a, pass, true);  // intermediates too (cuda: dvecX)
    for (int r = 2; r <= repeat && o.reason.empty(); ++r) {
      Case again = in;
      run_backend(backend, again, pass, true);
      if (std::string s = first_difference(a, again); !s.empty())
        o.reason = cat("not repeatable: run ", r, " differs from run 1 in ", s, " (a race?)");
    }
    if (o.reason.empty()) o.reason = broken_invariant(a);
    run_backend(against, b, pass);
    DiffReport rep = diff_cases(a, b, opt);
    o.verdict = verdict_name(rep.verdict);
    o.first_divergent = rep.first_divergent;
    Accuracy worst = Accuracy::exact;
    for (const StageReport& s : rep.stages) {
      if (s.compared && s.has_accuracy) worst = std::max(worst, s.accuracy);
      if (s.name != rep.first_divergent) continue;
      o.pattern = cat(s.name, s.status == Status::diverged ? " (introduced)" : "", s.pattern.empty() ? "" : ": ",
                      s.pattern);
      if (!s.rounding.reason.empty()) o.pattern += cat("; ", s.rounding.reason);
      o.where = s.where;
    }
    o.accuracy = accuracy_name(rep.verdict == Verdict::match ? worst : Accuracy::diverged);
    if (rep.verdict == Verdict::invalid) o.pattern = rep.verdict_line().substr(std::strlen("invalid: "));
    if (rep.first_divergent.empty() && !rep.missing_required.empty())  // "diverged; required but missing: dx, .."
      o.pattern = rep.verdict_line().substr(std::strlen("diverged; "));
    if (std::string f = constant_factor(a, b); !f.empty() && o.first_divergent == "inv_rms") o.pattern = cat("inv_rms: ", f);
    o.passed = rep.match() && o.reason.empty();
  } catch (const std::bad_alloc&) {  // not the kernel's failure: the sweep itself cannot go on (main: exit 2)
    throw;
  } catch (const std::exception& e) {  // one case's error (a kernel that crashes on a shape) is its failure
    o.verdict = "error";
    o.reason = dynamic_cast<const UserError*>(&e) ? e.what() : cat("internal error: ", e.what());
  }
  if (!o.passed && !keep.empty()) {  // DIR was made before the sweep
    const std::string file = kept_name(cc.name);
    // the names are mhc's own: a symbolic link planted at one is never written through (it
    // replaced the link's target, a file anywhere, without --force; review B, session 23)
    auto own = [](const std::string& path) {
      struct stat st;
      if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
        fail(path, ": is a symbolic link; --keep writes only files of its own, never through a link");
      return path;
    };
    try {  // a full disk costs the kept files of this case, not the rest of the sweep
      save_case(own(cat(keep, "/", file, ".in.h5")), in);
      for (auto [side, c] : {std::pair{"a", &a}, std::pair{"ref", &b}}) {
        const std::string path = own(cat(keep, "/", file, ".", side, ".h5"));
        if (c->t.size() > in.t.size())
          save_case(path, *c);
        else if (std::error_code ec; std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec)))
          std::filesystem::remove(path, ec);  // an earlier sweep's run: not beside these inputs (review B, session 21)
      }
      o.kept = true;
    } catch (const UserError& e) {
      o.reason += cat(o.reason.empty() ? "" : "; ", "not kept: ", e.what());
    }
  }
  return o;
}

std::string line_of(const Outcome& o) {
  std::string what = o.verdict == "match" ? cat("match (", o.accuracy, ")")
                     : o.verdict == "error" ? "error"
                                            : cat(o.verdict, !o.first_divergent.empty() ? " at " : o.pattern.empty() ? "" : ": ",
                                                  o.pattern);
  if (!o.reason.empty()) what += cat(o.verdict == "match" ? "; but " : "; ", o.reason);
  return one_line(cat(o.passed ? "ok  " : "FAIL", "  ", o.c->name, std::string(o.c->name.size() < 14 ? 14 - o.c->name.size() : 1, ' '),
             o.c->shape, std::string(o.c->shape.size() < 14 ? 14 - o.c->shape.size() : 1, ' '), what));
}

// What every failure shares and some passing case lacks, most specific first.
std::vector<std::string> shared_by_failures(const std::vector<Outcome>& all) {
  struct Trait {
    std::string text;
    std::function<bool(const CheckCase&)> has;
  };
  std::vector<Trait> traits = {
      {"n·D % 64 ≠ 0 (a partial K tile)", [](const CheckCase& c) { return c.prob().K() % 64 != 0; }},
      {"T > 256 (a second token tile)", [](const CheckCase& c) { return c.prob().T() > 256; }},
      {"T % 64 ≠ 0 (a partial token tile)", [](const CheckCase& c) { return c.prob().T() % 64 != 0; }},
      {"T ≤ 256", [](const CheckCase& c) { return c.prob().T() <= 256; }},
      {"the [B,S] layout", [](const CheckCase& c) { return c.prob().tokens.size() == 2; }},
      {"no gamma (all ones)", [](const CheckCase& c) { return c.no_gamma; }},
      {"float32 x and dh_in", [](const CheckCase& c) { return c.x_f32; }},
      {"saturating gates", [](const CheckCase& c) { return c.saturating; }},
      {"x scaled far from 1", [](const CheckCase& c) { return c.x_exp != 0; }},
      {"forward only", [](const CheckCase& c) { return c.forward_only; }},
      {"norm_eps = 1e-2 and hc_eps = 1e-3 (large_eps)", [](const CheckCase& c) { return c.large_eps; }},
      {"gradients (a backward)", [](const CheckCase& c) { return !c.forward_only; }}};
  for (int n = 1; n <= 8; ++n) traits.push_back({cat("n = ", n), [n](const CheckCase& c) { return c.prob().n == n; }});
  for (int n = 1; n <= 8; ++n) traits.push_back({cat("n ≠ ", n), [n](const CheckCase& c) { return c.prob().n != n; }});
  std::set<int64_t> Ds;
  for (auto& o : all) Ds.insert(o.c->prob().D);
  for (int64_t D : Ds) traits.push_back({cat("D = ", D), [D](const CheckCase& c) { return c.prob().D == D; }});
  std::set<std::pair<std::string, std::string>> envs;  // --vary: "a failure that changes with a split count"
  for (auto& o : all)
    if (!o.c->env.empty()) envs.insert({o.c->env, o.c->env_value});
  for (auto& [name, value] : envs)
    traits.push_back({cat(name, " = ", value), [name, value](const CheckCase& c) { return c.env == name && c.env_value == value; }});

  int failed = 0;
  for (auto& o : all) failed += !o.passed;
  if (failed == 0) return {};
  std::vector<std::pair<int, std::string>> found;  // (passing cases that have it, text)
  for (const Trait& t : traits) {
    int fail_with = 0, pass_with = 0, pass_without = 0;
    for (auto& o : all) {
      if (!o.passed) fail_with += t.has(*o.c);
      else (t.has(*o.c) ? pass_with : pass_without) += 1;
    }
    if (fail_with == failed && pass_without > 0) found.push_back({pass_with, t.text});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  std::set<std::string> firsts;
  for (auto& o : all)
    if (!o.passed) firsts.insert(o.verdict == "error" ? "(error)" : o.first_divergent);
  if (failed > 1 && firsts.size() == 1 && !firsts.begin()->empty() && *firsts.begin() != "(error)")
    out.push_back(cat("all ", failed, " failures diverge first at ", *firsts.begin()));
  // one failure whose every trait some passing case shares: naming them ("the failure has D = 64",
  // beside passing cases of D = 64) points the wrong way
  if (failed == 1 && (found.empty() || found.front().first > 0)) {
    for (auto& o : all)
      if (!o.passed) out.push_back(cat("one case failed, ", o.c->name, ": passing cases share each of its traits"));
    return out;
  }
  // a trait that passing cases have too is named with how many: "all 4 failures have gradients"
  // beside 9 passing cases with gradients pointed the wrong way (review A, session 24)
  const int passed = int(all.size()) - failed;
  for (auto& [pass_with, text] : found)
    if (out.size() < 3 && pass_with == found.front().first)
      out.push_back(cat(failed == 1 ? "the failure has " : cat("all ", failed, " failures have "), text,
                        pass_with ? cat(" (as do ", pass_with, " of the ", passed, " passing cases)") : std::string()));
  return out;
}

std::string json_of(const std::string& backend, const std::string& against, const std::vector<Outcome>& all,
                    const std::vector<std::string>& summary) {
  int passed = 0;
  std::string cases;
  for (const Outcome& o : all) {
    passed += o.passed;
    cases += cat(cases.empty() ? "" : ",\n    ", "{\"name\": ", json_string(o.c->name), ", \"shape\": ", json_string(o.c->shape),
                 ", \"passed\": ", o.passed ? "true" : "false", ", \"verdict\": ", json_string(o.verdict),
                 ", \"first_divergent\": ", o.first_divergent.empty() ? "null" : json_string(o.first_divergent),
                 ", \"accuracy\": ", o.accuracy.empty() ? "null" : json_string(o.accuracy), ", \"where\": ", where_json(o.where),
                 ", \"pattern\": ", json_string(o.pattern), ", \"reason\": ", json_string(o.reason), "}");
  }
  std::string shared;
  for (auto& s : summary) shared += cat(shared.empty() ? "" : ", ", json_string(s));
  return cat("{\"backend\": ", json_string(backend), ", \"against\": ", json_string(against), ",\n  \"cases\": [\n    ", cases,
             "],\n  \"passed\": ", passed, ", \"failed\": ", int(all.size()) - passed, ", \"summary\": [", shared, "]}\n");
}

}  // namespace

void add_check(CLI::App& app, int& rc) {
  struct Opts {
    std::string backend, against = "cpu:fp64", cases = "default", only, keep, accept = "fp32", vary, require = "outputs";
    int repeat = 1;
    double timeout = 600;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("check", "Sweep a backend over the shapes that break kernels, against a reference");
  sub->add_option("BACKEND", o->backend, "the backend to check: cpu, cuda, exec:COMMAND (mhc --help lists them)")
      ->required();
  sub->add_option("--against", o->against, "the reference backend")->capture_default_str();
  sub->add_option("--cases", o->cases, "quick (seconds), default (about a minute), full (the axes crossed) or FILE")
      ->capture_default_str();
  sub->add_option("--only", o->only, "cases whose name contains PATTERN (or matches it, with * and ?)");
  sub->add_option("--vary", o->vary, "VAR=V1,V2,..: run every case once per value of an environment variable of "
                  "BACKEND (e.g. your kernel's split count) and group failures by it (exec backends: cpu and cuda "
                  "read their environment once, at mhc's start)");
  sub->add_option("--repeat", o->repeat, "run BACKEND N times per case and compare the runs bit for bit")
      ->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("--accept", o->accept, "loosest accuracy class that passes: fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))->capture_default_str();
  sub->add_option("--require", o->require, "stages each run must give: outputs (h_in, h_post, h_res and, where the case "
                  "has gradients, dx, dphi, dalpha, dbias, dgamma), all, forward, backward, none or a list; a missing one fails the case")
      ->capture_default_str();
  sub->add_option("--keep", o->keep, "write the inputs and both runs of every failing case to DIR (for mhc diff), "
                                     "replacing an earlier sweep's files of its cases");
  sub->add_option("--timeout", o->timeout, "exec: seconds a command may run")->check(kPositive)
      ->capture_default_str();
  sub->add_flag("--json", o->json, "print the results as one JSON object");
  sub->footer(
      "One line per case as it finishes, then what the failures share. Exit status: 0 every case\n"
      "passed, 1 a case failed, 2 an error before any case ran.\n"
      "A FILE of cases has one a line: NAME SHAPE [no_gamma] [x_f32] [saturating] [forward_only] [large_eps]\n"
      "[x_exp=E].\n"
      "Examples:\n  mhc check cpu\n  mhc check cuda --repeat 3\n"
      "  mhc check 'exec:python3 kernel.py {in} {out}' --cases quick\n"
      "  mhc check 'exec:./my_kernel {in} {out}' --only D7168 --keep failing/\n"
      "  mhc check 'exec:./my_kernel {in} {out}' --vary SPLITS=1,2,4   (the kernel reads $SPLITS)");
  sub->callback([o, &rc] {
    BackendSpec backend = parse_backend(o->backend), against = parse_backend(o->against);
    backend.timeout = against.timeout = o->timeout;
    for (const BackendSpec* b : {&backend, &against})
      if (std::string why = b->backend->unavailable(); !why.empty())
        fail("the ", b->name(), " backend is not available: ", why);
    DiffOptions opt;
    opt.accept = parse_accuracy(o->accept);
    opt.require = parse_require(o->require);
    std::vector<CheckCase> cases, all_cases = check_cases(o->cases);
    if (!o->vary.empty() && !backend.backend->takes_argument)
      fail("--vary ", o->vary, ": the ", backend.name(), " backend reads its environment once, at mhc's start; --vary "
           "needs an exec backend, whose command starts anew each run");
    if (!o->vary.empty()) all_cases = vary(all_cases, o->vary);
    for (CheckCase& c : all_cases) {
      bool glob = o->only.find_first_of("*?[") != std::string::npos;
      if (o->only.empty() || (glob ? fnmatch(o->only.c_str(), c.name.c_str(), 0) == 0 : c.name.find(o->only) != std::string::npos))
        cases.push_back(c);
    }
    if (cases.empty()) fail("--only ", o->only, ": no case of --cases ", o->cases, " matches");
    std::set<std::string> names;  // two cases of one name: the second one's kept files replaced the first's
    for (const CheckCase& c : cases)
      if (!names.insert(kept_name(c.name)).second)
        fail("case ", one_line(c.name), " appears twice (--cases, --vary): each case needs a name of its own");
    // what would stop the sweep midway, found before any case runs
    for (const CheckCase& c : cases) check_case_memory(cat("case ", c.name, ": "), c.prob(), Holds::check);
    struct stat kd;
    if (!o->keep.empty() && stat(o->keep.c_str(), &kd) == 0 && !S_ISDIR(kd.st_mode))
      fail("--keep ", o->keep, ": exists and is not a directory");
    if (std::error_code ec; !o->keep.empty() && (std::filesystem::create_directories(o->keep, ec), ec))
      fail("--keep ", o->keep, ": cannot create the directory: ", ec.message());
    // a directory that exists but takes no files (read-only): said once, before the sweep, not as
    // libhdf5's errno line at every failing case (review B, session 24)
    if (!o->keep.empty() && access(o->keep.c_str(), W_OK | X_OK) != 0)
      fail("--keep ", o->keep, ": no file can be written there (", std::strerror(errno), ")");
    if (!o->json)
      std::printf("mhc check %s against %s: %zu case%s (%s)\n", backend.str().c_str(), against.str().c_str(), cases.size(),
                  cases.size() == 1 ? "" : "s", o->cases.c_str());
    std::vector<Outcome> all;
    for (const CheckCase& c : cases) {
      all.push_back(check_one(c, backend, against, o->repeat, opt, o->keep));
      if (!o->json) std::printf("%s\n", line_of(all.back()).c_str()), std::fflush(stdout);
    }
    std::vector<std::string> summary = shared_by_failures(all);
    int passed = 0;
    for (auto& r : all) passed += r.passed;
    if (o->json) {
      std::printf("%s", json_of(backend.str(), against.str(), all, summary).c_str());
    } else {
      std::printf("%zu case%s: %d passed, %zu failed\n", all.size(), all.size() == 1 ? "" : "s", passed,
                  all.size() - size_t(passed));
      for (auto& s : summary) std::printf("%s\n", s.c_str());
      std::string dir = o->keep;  // "keep/" printed as "keep//NAME"
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      if (std::any_of(all.begin(), all.end(), [](const Outcome& r) { return r.kept; }))
        std::printf("failing cases kept in %s/: NAME.in.h5, and where both runs finished, mhc diff %s/NAME.a.h5 %s/NAME.ref.h5\n",
                    dir.c_str(), dir.c_str(), dir.c_str());
    }
    rc = passed == int(all.size()) ? 0 : 1;
  });
}

}  // namespace mhc
