// cmd_run.cpp — mhc run: load a case, run a backend, write every stage.
#include <chrono>
#include <cstdio>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "h5io.h"
#include "stats.h"

namespace mhc {

void add_run(CLI::App& app, int& rc) {
  struct Opts {
    std::string backend = "cpu", precision, in, out;
    bool force = false, strict = false, allow_nonfinite = false, dump = false, quiet = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("run", "Run the operator (forward, and backward when gradients are given)");
  sub->add_option("--backend", o->backend, "cpu, cpu:fp64 or cuda")->capture_default_str();
  sub->add_option("--precision", o->precision, "fp32 (default) or fp64 (cpu only: the float64 oracle)")
      ->check(CLI::IsMember({"fp32", "fp64"}));
  sub->add_flag("--force", o->force, "replace an existing output file");
  sub->add_flag("--strict", o->strict, "inputs that need rounding to their dtype are an error");
  sub->add_flag("--allow-nonfinite", o->allow_nonfinite, "accept NaN/Inf in inputs and outputs");
  sub->add_flag("--dump-intermediates", o->dump, "cuda: also keep dvecX ([..,n,D] float32)");
  sub->add_flag("-q,--quiet", o->quiet, "no summary table");
  sub->add_option("in", o->in, "input HDF5 file (/inputs)")->required();
  sub->add_option("out", o->out, "output HDF5 file: a copy of /inputs plus /forward and /backward")->required();
  sub->footer(
      "Examples:\n  mhc run --backend cpu in.h5 out.h5\n  mhc run --backend cpu --precision fp64 in.h5 oracle.h5\n"
      "  mhc run --backend cuda --dump-intermediates in.h5 gpu.h5");
  sub->callback([o, &rc] {
    BackendSpec b = parse_backend(o->backend);
    if (!o->precision.empty()) {
      if (b.name == "cuda" && o->precision != "fp32") fail("--precision fp64: the cuda backend computes in fp32");
      b.prec = o->precision == "fp64" ? Precision::fp64 : Precision::fp32;
    }
    LoadOptions lo;
    lo.strict = o->strict;
    lo.allow_nonfinite = o->allow_nonfinite;
    Case c = load_case(o->in, lo, false);
    check_output_path(o->out, o->in, o->force);
    auto t0 = std::chrono::steady_clock::now();
    run_backend(b, c, Pass::both, o->dump);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (std::string at = c.first_nonfinite(); !at.empty() && !o->allow_nonfinite)
      fail(o->in, ": the operator's outputs are not finite, first ", at, " (norm_eps = ", c.prob.norm_eps,
           "; an all-zero token?); nothing written; --allow-nonfinite writes them anyway");
    save_case(o->out, c, o->force);
    if (!o->quiet) {
      std::printf("mhc run: %s on %s, %s, %s in %.1f ms -> %s\n", b.str().c_str(), backend_device(b).c_str(),
                  c.prob.str().c_str(), c.has_gradients() ? "forward + backward" : "forward only", ms,
                  o->out.c_str());
      std::printf("%-10s %-16s %-9s %12s %12s %12s %6s\n", "stage", "shape", "dtype", "min", "max", "rms", "nonfin");
      for (const Stage& s : stage_table()) {
        if (s.group == Group::inputs || !c.has(s.name)) continue;
        const Tensor& t = c.get(s.name);
        Stats st = stats(t);
        std::printf("%-10s %-16s %-9s %12.5g %12.5g %12.5g %6lld\n", s.name, shape_str(t.shape).c_str(),
                    dtype_name(t.dtype), st.min, st.max, st.rms, (long long)(st.nan + st.inf));
      }
    }
    rc = 0;
  });
}

}  // namespace mhc
