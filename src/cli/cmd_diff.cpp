// cmd_diff.cpp — mhc diff A B: compare two runs (backends or files) stage by stage.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "backends.h"
#include "commands.h"
#include "diff.h"
#include "generate.h"
#include "h5io.h"
#include "references.h"
#include "stream.h"

namespace mhc {
namespace {

const char* kDefaultShape = "256,4,1024";

std::pair<double, double> parse_pair(const std::string& text, const std::string& what) {
  double a, b;
  char extra;
  if (std::sscanf(text.c_str(), "%lf,%lf%c", &a, &b, &extra) != 2 || !(a >= 0) || !(b >= 0) || !std::isfinite(a) ||
      !std::isfinite(b))
    fail(what, ": expected ATOL,RTOL (two finite non-negative numbers), found '", text, "'");
  return {a, b};
}

// A side is a backend when it names one and no file of that name exists.
bool is_backend_side(const std::string& text) {
  struct stat st;
  if (stat(text.c_str(), &st) == 0) return false;
  if (is_backend_spec(text)) return true;
  if (text.find('/') == std::string::npos && text.find('.') == std::string::npos)
    fail("'", text, "' is neither a backend (", backend_names(), ") nor an existing file");
  return false;
}

// --tokens A:B -> [A, B) of the flattened tokens of a T-token case.
std::pair<int64_t, int64_t> parse_tokens(const std::string& text, int64_t T) {
  long long a, b;
  char extra;
  if (std::sscanf(text.c_str(), "%lld:%lld%c", &a, &b, &extra) != 2 || a < 0 || b <= a || b > T)
    fail("--tokens ", text, ": expected A:B with 0 <= A < B <= T = ", T, " (tokens A to B-1 of the flattened token axis)");
  return {a, b};
}

// --dump-diff: per compared stage, A - B, the error in the stage's unit and the mismatch mask.
void dump_diff(const std::string& path, const Problem& p, const DiffReport& rep, bool replace,
               const std::function<void()>& before_commit) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const StageReport& s : rep.stages) {
    if (!s.compared) continue;
    Shape shape = stage_shape(stage(s.name), p);
    if (numel(shape) != s.count) {  // --tokens: the compared tokens only
      const int64_t per = numel(shape) / p.T();
      shape.erase(shape.begin(), shape.begin() + int64_t(p.tokens.size()));
      shape.insert(shape.begin(), s.count / per);
    }
    Tensor d(shape, DType::f32), e(shape, DType::f32), m(shape, DType::f32);
    for (int64_t i = 0; i < s.count; ++i) {
      d.data<float>()[i] = s.elem_diff[size_t(i)];
      e.data<float>()[i] = s.elem_error[size_t(i)];
      m.data<float>()[i] = s.elem_mask[size_t(i)];
    }
    out.emplace_back(cat("/", s.name, "/a_minus_b"), std::move(d));
    out.emplace_back(cat("/", s.name, "/error"), std::move(e));
    out.emplace_back(cat("/", s.name, "/mismatch"), std::move(m));
  }
  save_tensors(path, out, replace, before_commit);
}

// The /inputs of two heads: "" when they agree (parameters, eps, shapes), else what differs.
std::string heads_difference(const Case& a, const Case& b) {
  const Problem &p = a.prob, &q = b.prob;
  if (p.tokens != q.tokens || p.n != q.n || p.D != q.D) return cat("/inputs/x shape ", p.str(), " vs ", q.str());
  return inputs_difference(a, b);
}

}  // namespace

void add_diff(CLI::App& app, int& rc) {
  struct Opts {
    std::string a, b, input, tolerance = "budget", shape = kDefaultShape, accept = "fp32", require, dump, report, tokens;
    std::vector<std::string> tol;
    double factor = 2, atol = -1, rtol = -1, timeout = 600;
    uint64_t seed = 0;
    int64_t tile = 64;
    bool json = false, ignore_inputs = false, strict = false, allow_nonfinite = false, force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("diff", "Compare two runs stage by stage; name the first divergent stage");
  sub->add_option("A", o->a, "backend (cpu, cpu:fp64, cuda, exec:COMMAND) or HDF5 file")->required();
  sub->add_option("B", o->b, "the reference: backend or HDF5 file (a wrong one is named: exit 2)")->required();
  sub->add_option("--input", o->input, "inputs for backend sides and for a file side without /inputs (default: a file side's /inputs, else generated)");
  sub->add_option("--shape", o->shape, "shape of the generated default case")->capture_default_str();
  sub->add_option("--seed", o->seed, "seed of the generated default case")->check(kSeed)->capture_default_str();
  sub->add_option("--accept", o->accept, "loosest accuracy class that passes: fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))->capture_default_str();
  sub->add_option("--tokens", o->tokens, "compare tokens A..B-1 only (A:B); sums over tokens are then not compared");
  sub->add_option("--require", o->require, "stages that must be present on both sides: all, forward, backward, outputs (h_in, h_post, h_res, dx, dphi, dalpha, dbias, dgamma), none, or a list; backward stages only where the inputs have gradients");
  sub->add_option("--tolerance", o->tolerance, "budget (default) or fixed")
      ->check(CLI::IsMember({"budget", "fixed"}))->capture_default_str();
  sub->add_option("--budget-factor", o->factor, "k in: error <= k x plain fp32 error + B's error + floor")
      ->check(kPositive)->capture_default_str();
  sub->add_option("--atol", o->atol, "fixed policy: absolute tolerance of the float32 stages (default 1e-5)")->check(kNonNegative);
  sub->add_option("--rtol", o->rtol, "fixed policy: relative tolerance of the float32 stages (default 1.3e-6; bf16 h_in and dx keep 1.6e-2: --tol h_in=ATOL,RTOL)")->check(kNonNegative);
  sub->add_option("--tol", o->tol, "per-stage fixed tolerance STAGE=ATOL,RTOL (repeatable)");
  sub->add_option("--timeout", o->timeout, "exec: seconds a command may run")->check(kPositive)
      ->capture_default_str();
  sub->add_option("--tile", o->tile, "tile size the where-summary names")->check(kCount)->capture_default_str();
  sub->add_option("--dump-diff", o->dump, "write A-B, per-element error and mismatch mask of every stage to FILE.h5");
  sub->add_option("--report", o->report, "write a self-contained HTML page: verdict, table, error heatmaps");
  sub->add_flag("--force", o->force, "replace an existing --dump-diff or --report file");
  sub->add_flag("--ignore-inputs", o->ignore_inputs, "compare files whose /inputs differ (same shapes)");
  sub->add_flag("--strict", o->strict, "inputs that need rounding to their dtype are an error");
  sub->add_flag("--allow-nonfinite", o->allow_nonfinite, "accept NaN/Inf in inputs, and a backend side's outputs that fail (NaN/Inf, or an inv_rms of 0)");
  sub->add_flag("--json", o->json, "print the report as JSON");
  sub->footer(
      "Exit status: 0 match, 1 diverged (or a --require'd stage missing), 2 error or invalid comparison\n"
      "(unknown dataset, stage stored in a lossy type or shape, inputs that differ, nothing compared).\n"
      "Examples:\n  mhc diff cpu cpu:fp64 --input data/example.h5\n  mhc diff cpu cuda\n"
      "  mhc diff mine.h5 cpu                 (your kernel's dump against the golden on its own inputs)\n"
      "  mhc diff mine.h5 cpu --input in.h5   (a dump of stages only, without /inputs)\n"
      "  mhc diff 'exec:python3 kernel.py {in} {out}' cpu --shape 257,4,200\n"
      "  mhc diff mine.h5 cpu:fp64 --accept tf32 --require all\n"
      "  mhc diff mine.h5 cpu --json --dump-diff errors.h5 --report diff.html\n"
      "  mhc diff a.h5 b.h5 --tolerance fixed --atol 1e-5 --rtol 1e-3 --tol dphi=1e-4,1e-3");
  sub->callback([o, sub, &rc] {
    DiffOptions opt;
    opt.fixed = o->tolerance == "fixed";
    for (const char* name : {"--atol", "--rtol"})
      if (sub->get_option(name)->count() && !opt.fixed)
        fail(name, ": sets the fixed policy's tolerance; add --tolerance fixed (or give one stage its own: --tol STAGE=ATOL,RTOL)");
    opt.budget_factor = o->factor, opt.atol = o->atol, opt.rtol = o->rtol, opt.tile = o->tile;
    opt.accept = parse_accuracy(o->accept);
    opt.keep_elements = !o->dump.empty();
    if (sub->get_option("--require")->count()) opt.require = parse_require(o->require);
    for (auto& t : o->tol) {
      auto eq = t.find('=');
      std::string name = t.substr(0, eq);
      if (eq == std::string::npos || !find_stage(name) || stage(name).group == Group::inputs)
        fail("--tol ", t, ": expected STAGE=ATOL,RTOL with STAGE a computed stage (e.g. dphi=1e-4,1e-3)");
      opt.per_stage[name] = parse_pair(t.substr(eq + 1), "--tol " + t);
    }
    for (auto [name, value] : {std::pair{"--dump-diff", &o->dump}, std::pair{"--report", &o->report}})
      if (sub->get_option(name)->count() && value->empty()) fail(name, ": an empty file name");
    bool a_backend = is_backend_side(o->a), b_backend = is_backend_side(o->b);
    LoadOptions lo;
    lo.strict = o->strict, lo.allow_nonfinite = o->allow_nonfinite;
    lo.copies = kDiffCopies, lo.stream_tokens = kTokenBlock;  // read a block of tokens at a time
    std::shared_ptr<Side> a_file, b_file, in;
    if (!o->input.empty()) in = file_side(o->input, lo, false);
    // A file side without /inputs (a kernel's dump of stages only) is compared on --input's
    // inputs, else on the other file side's.
    auto open_file = [&](const std::string& path, const std::string& other, bool other_backend) {
      std::shared_ptr<Side> source = in;
      if (!source && !other_backend && !has_inputs(path) && has_inputs(other)) source = file_side(other, lo, false);
      return std::shared_ptr<Side>(file_side(path, lo, true, source));
    };
    if (!a_backend) a_file = open_file(o->a, o->b, b_backend);
    if (!b_backend) b_file = open_file(o->b, o->a, a_backend);
    // mhc's own dump as A beside one it did not write as B: B is the reference, and its rounding
    // and errors are not what is judged (a truncating kernel as B "matched"; review D, session 19)
    auto by_mhc = [](const std::shared_ptr<Side>& f) {
      const auto& at = f->head().attrs;
      auto it = at.find("producer");
      return it != at.end() && it->second == "mhc";
    };
    if (a_file && b_file && by_mhc(a_file) && !by_mhc(b_file))
      std::cerr << "mhc diff: note: A (" << o->a << ") was written by mhc and B (" << o->b
                << ") was not; B is the reference, whose own errors are not judged: to check B, put it first (mhc diff "
                << o->b << " " << o->a << ")\n";
    if (a_file && b_file) {  // two file sides: their /inputs agree, or --ignore-inputs compares them anyway
      const std::string files_differ = heads_difference(a_file->head(), b_file->head());
      const Problem &p = a_file->head().prob, &q = b_file->head().prob;
      if (p.tokens != q.tokens || p.n != q.n || p.D != q.D)
        fail(o->a, " and ", o->b, ": the cases have different shapes, ", p.str(), " and ", q.str(),
             "; only cases of one shape can be compared");
      if (!files_differ.empty() && !o->ignore_inputs)
        fail(o->a, " and ", o->b, ": inputs differ (", files_differ, "); use --ignore-inputs to compare anyway");
      opt.inputs_differ = files_differ;
    }

    // the outputs replace neither a file side, nor --input, nor each other
    auto resolved = [](const std::string& p) {  // as given where it cannot be resolved (a symlink loop: its own error later)
      std::error_code ec;
      std::filesystem::path r = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
      return ec ? std::filesystem::path(p) : r;
    };
    if (!o->dump.empty() && !o->report.empty() && resolved(o->dump) == resolved(o->report))
      fail(o->report, ": --dump-diff and --report name the same file");
    for (auto* out : {&o->dump, &o->report})
      for (const std::string& in : {is_backend_spec(o->a) ? std::string() : o->a, is_backend_spec(o->b) ? std::string() : o->b,
                                    o->input, out == &o->report ? o->dump : std::string()})
        if (!out->empty()) check_output_path(*out, in, o->force);

    // Beyond the blocks the readers checked, what grows with T: a generated case (held whole),
    // a backend side that runs the whole case, and --dump-diff's error, mask and difference of
    // every element and the tensors written from them (21 bytes); and the reordered sums of a
    // case of one block. Checked before generating.
    auto check_diff_memory = [&](const Problem& prob, const std::string& where, bool generated) {
      const CaseBytes all = case_bytes(prob), all64 = case_bytes(prob, true);
      double need = all64.with(double(std::min(kTokenBlock, prob.T()))) * kDiffCopies;
      if (generated) need += 2 * all.with(double(prob.T()));
      // where one block is the case, the evaluations in other orders keep their sums over tokens
      // too (References::reordered): dphi, dgamma, dbias, dalpha in float64
      if (prob.T() <= kTokenBlock) need += kMostReordered * 8.0 * double((prob.N() + 1) * prob.K() + prob.N() + 3);
      for (auto* side : {&o->a, &o->b})
        if (is_backend_side(*side) && !parse_backend(*side).backend->streams) need += 2 * all.with(double(prob.T()));
      if (!o->dump.empty()) need += all64.with(double(prob.T())) * 21 / 8;
      check_memory(where, prob, need);
    };
    if (in) {
      for (auto [side, f] : {std::pair{&o->a, a_file}, std::pair{&o->b, b_file}})
        if (std::string d = f ? heads_difference(f->head(), in->head()) : ""; !d.empty())
          fail(*side, ": its /inputs differ from --input ", o->input, " (", d,
               "); a file side is compared on its own inputs: drop --input or pass the matching file");
    } else if (b_file) {
      in = b_file;
    } else if (a_file) {
      in = a_file;
    } else {
      const Problem p = parse_shape(o->shape);
      check_diff_memory(p, cat("--shape ", o->shape, ": "), true);
      Case gen = generate_case(p, o->seed, true);
      std::cerr << "mhc diff: no input file given; generated " << gen.prob.str() << ", seed " << o->seed
                << " (mhc gen --shape " << o->shape << " --seed " << o->seed << ")\n";
      in = case_side(std::move(gen));
    }
    const Problem prob = in->head().prob;
    if (a_file || b_file || !o->input.empty())
      check_diff_memory(prob, cat(!o->input.empty() ? o->input : b_file ? o->b : o->a, ": "), false);
    int64_t t0 = 0, t1 = prob.T();
    if (!o->tokens.empty()) {
      std::tie(t0, t1) = parse_tokens(o->tokens, prob.T());
      std::cerr << "mhc diff: comparing tokens " << t0 << ".." << t1 - 1 << " of " << prob.T()
                << "; dphi, dalpha, dbias and dgamma (sums over all tokens) are not compared\n";
    }
    // The golden's outputs that fail (NaN/Inf, an inv_rms of 0) say the inputs are beyond its
    // arithmetic: an error. Another backend's (cuda, exec) are compared like a file's: a kernel
    // that wrote NaN has diverged (exit 1; it was exit 2 through exec and 1 as a file).
    auto failed_outputs = [&](const std::string& side, const Case& c) {
      if (std::string at = c.first_failed(); !at.empty() && !o->allow_nonfinite)
        fail(side, ": the golden's outputs fail, first ", at, "; nothing to compare (--allow-nonfinite compares them anyway)");
    };
    // A backend side: the golden runs chunk by chunk; another backend on the whole case.
    auto backend_side = [&](const std::string& text) -> std::shared_ptr<Side> {
      BackendSpec spec = parse_backend(text);
      spec.timeout = o->timeout;
      if (spec.backend->streams) return cpu_side(in, Arith(spec.prec));
      Case c = whole_inputs(*in);
      run_backend(spec, c, Pass::both, true);
      return case_side(std::move(c));
    };
    std::shared_ptr<Side> a = a_backend ? backend_side(o->a) : a_file, b = b_backend ? backend_side(o->b) : b_file;
    const bool a_golden = a_backend && parse_backend(o->a).backend->streams, b_golden = b_backend && parse_backend(o->b).backend->streams;

    // Each block: the golden's outputs are finite, and the inputs of A and B agree.
    auto check = [&](const Case& ab, const Case& bb) {
      for (auto [side, c, golden] : {std::tuple{&o->a, &ab, a_golden}, std::tuple{&o->b, &bb, b_golden}})
        if (golden) failed_outputs(*side, *c);
      if (!opt.inputs_differ.empty()) return;  // --ignore-inputs, and a difference already known
      if (std::string d = inputs_difference(ab, bb); !d.empty()) {
        const std::string& file = a_backend ? o->b : o->a;
        if (a_backend == b_backend && o->ignore_inputs) {  // two files: a per-token input differs, in this block first
          opt.inputs_differ = d;
          return;
        }
        if (a_backend == b_backend) fail(o->a, " and ", o->b, ": inputs differ (", d, "); use --ignore-inputs to compare anyway");
        fail(file, ": its /inputs differ from --input ", o->input, " (", d,
             "); a file side is compared on its own inputs: drop --input or pass the matching file");
      }
    };

    if (isatty(STDERR_FILENO))  // progress on a terminal, once the work has taken a second
      opt.progress = [start = std::chrono::steady_clock::now()](double done) {
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(1))
          std::cerr << "\rmhc diff: " << int(done * 100) << "% of tokens compared\033[K" << std::flush;
      };
    DiffReport rep = diff_sides(*a, *b, opt, t0, t1, check);
    if (opt.progress) std::cerr << "\r\033[K" << std::flush;
    if (o->json) {
      std::cout << report_json(rep);
    } else {
      bool colour = isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR");
      // the eps the inputs give: a dump whose /inputs lost its attributes ran at the defaults, and a
      // correct kernel run at other values was blamed at inv_rms with nothing saying why
      const std::vector<std::string>& dflt = in->head().eps_defaulted;
      std::string absent;
      for (const std::string& e : dflt) absent += cat(absent.empty() ? "" : " and ", e);
      char eps[96];
      std::snprintf(eps, sizeof eps, "norm_eps %g hc_eps %g", prob.norm_eps, prob.hc_eps);
      std::cout << "A: " << one_line(o->a) << "   B (reference): " << one_line(o->b) << "   " << prob.str() << "   " << eps
                << (absent.empty() ? "" : cat(" (", absent, " not in /inputs: the default)")) << "   accept " << o->accept
                << "\n"
                << report_table(rep, colour);
    }
    flush_stdout();  // before the files: a report that cannot be printed leaves none of them
    // both or neither: the --dump-diff file, finished, waits for the --report to be written, which
    // is moved into place only once the dump could be too (a report that failed had left an old
    // dump replaced under --force; review B, sessions 22 and 23); a termination signal between the
    // two moves is held until both are done (one there had left the report without its dump)
    std::optional<HoldSignals> held;
    auto write_report = [&] {
      if (!o->report.empty())
        save_text(o->report, report_html(rep, cat("mhc diff ", o->a, " ", o->b)), o->force, [&] {
          if (o->dump.empty()) return;
          check_commit(o->dump, o->force);
          held.emplace();
        });
    };
    if (o->dump.empty())
      write_report();
    else
      dump_diff(o->dump, prob, rep, o->force, write_report);
    held.reset();
    rc = rep.exit_status();
  });
}

}  // namespace mhc
