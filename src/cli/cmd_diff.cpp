// cmd_diff.cpp — mhc diff A B: compare two runs (backends or files) stage by stage.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "diff.h"
#include "generate.h"
#include "h5io.h"

namespace mhc {
namespace {

const char* kDefaultShape = "256,4,1024";

std::pair<double, double> parse_pair(const std::string& text, const std::string& what) {
  double a, b;
  char extra;
  if (std::sscanf(text.c_str(), "%lf,%lf%c", &a, &b, &extra) != 2 || a < 0 || b < 0)
    fail(what, ": expected ATOL,RTOL (two non-negative numbers), found '", text, "'");
  return {a, b};
}

}  // namespace

void add_diff(CLI::App& app, int& rc) {
  struct Opts {
    std::string a, b, input, tolerance = "budget", shape = kDefaultShape;
    std::vector<std::string> tol;
    double factor = 2, atol = -1, rtol = -1;
    uint64_t seed = 0;
    bool json = false, ignore_inputs = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("diff", "Compare two runs stage by stage; name the first divergent stage");
  sub->add_option("A", o->a, "backend (cpu, cpu:fp64, cuda) or HDF5 file")->required();
  sub->add_option("B", o->b, "the reference: backend or HDF5 file")->required();
  sub->add_option("--input", o->input, "inputs for backend sides (default: the file side's /inputs, else generated)");
  sub->add_option("--shape", o->shape, "shape of the generated default case")->capture_default_str();
  sub->add_option("--seed", o->seed, "seed of the generated default case")->capture_default_str();
  sub->add_option("--tolerance", o->tolerance, "budget (default) or fixed")
      ->check(CLI::IsMember({"budget", "fixed"}))->capture_default_str();
  sub->add_option("--budget-factor", o->factor, "k in: error <= k x golden error + floor")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--atol", o->atol, "fixed policy: absolute tolerance (default per dtype)");
  sub->add_option("--rtol", o->rtol, "fixed policy: relative tolerance (default per dtype)");
  sub->add_option("--tol", o->tol, "per-stage fixed tolerance STAGE=ATOL,RTOL (repeatable)");
  sub->add_flag("--ignore-inputs", o->ignore_inputs, "compare files whose /inputs differ");
  sub->add_flag("--json", o->json, "print the report as JSON");
  sub->footer(
      "Exit status: 0 match, 1 diverged, 2 error.\n"
      "Examples:\n  mhc diff cpu cpu:fp64 --input data/example.h5\n  mhc diff cpu cuda\n"
      "  mhc diff mine.h5 cpu            (your kernel's dump against the golden on its own inputs)\n"
      "  mhc diff a.h5 b.h5 --tolerance fixed --atol 1e-5 --rtol 1e-3 --tol dphi=1e-4,1e-3");
  sub->callback([o, &rc] {
    DiffOptions opt;
    opt.fixed = o->tolerance == "fixed";
    opt.budget_factor = o->factor, opt.atol = o->atol, opt.rtol = o->rtol;
    for (auto& t : o->tol) {
      auto eq = t.find('=');
      std::string name = t.substr(0, eq);
      if (eq == std::string::npos || !find_stage(name) || stage(name).group == Group::inputs)
        fail("--tol ", t, ": expected STAGE=ATOL,RTOL with STAGE a computed stage (e.g. dphi=1e-4,1e-3)");
      opt.per_stage[name] = parse_pair(t.substr(eq + 1), "--tol " + t);
    }
    bool a_backend = is_backend_spec(o->a), b_backend = is_backend_spec(o->b);
    LoadOptions lo;
    Case a, b;
    if (!a_backend) a = load_case(o->a, lo, true);
    if (!b_backend) b = load_case(o->b, lo, true);
    if (!a_backend && !b_backend && !o->ignore_inputs)
      if (std::string d = inputs_difference(a, b); !d.empty())
        fail(o->a, " and ", o->b, ": inputs differ (", d, "); use --ignore-inputs to compare anyway");

    if (!o->input.empty() && !a_backend && !b_backend)
      std::cerr << "mhc diff: --input ignored: both sides are files with their own /inputs\n";
    Case inputs;
    if (!o->input.empty()) {
      inputs = load_case(o->input, lo, false);
    } else if (!b_backend) {
      inputs = b.inputs_only();
    } else if (!a_backend) {
      inputs = a.inputs_only();
    } else {
      inputs = generate_case(parse_shape(o->shape), o->seed, true);
      std::cerr << "mhc diff: no input file given; generated " << inputs.prob.str() << ", seed " << o->seed
                << " (mhc gen --shape " << o->shape << " --seed " << o->seed << ")\n";
    }
    if (a_backend) a = inputs.inputs_only(), run_backend(parse_backend(o->a), a, Pass::both, true);
    if (b_backend) b = inputs.inputs_only(), run_backend(parse_backend(o->b), b, Pass::both, true);

    Budget budget = opt.fixed ? Budget{} : measure_budget(b.inputs_only());
    DiffReport rep = diff_cases(a, b, budget, opt);
    if (o->json) {
      std::cout << report_json(rep);
    } else {
      bool colour = isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR");
      std::cout << "A: " << o->a << "   B (reference): " << o->b << "   " << b.prob.str() << "\n"
                << report_table(rep, colour);
    }
    rc = rep.match ? 0 : 1;
  });
}

}  // namespace mhc
