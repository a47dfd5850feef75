// cmd_run.cpp — mhc run: load a case, run a backend, write every stage.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <cstdio>
#include <memory>

#include "backends.h"
#include "cpu_backend.h"
#include "commands.h"
#include "h5io.h"
#include "stats.h"

namespace mhc {

namespace {

// Tokens a streamed run holds at once: whole blocks (the same bits for any chunk size), --chunk
// or by default about 512 MB of stages at 8 bytes an element, and no more than the memory limit
// allows (the reader checked that one block fits).
int64_t run_chunk(const Problem& p, int64_t asked) {
  const CaseBytes b = case_bytes(p, true);
  auto blocks_up = [](int64_t tokens) { return (tokens + kTokenBlock - 1) / kTokenBlock; };
  auto blocks = [&](double tokens) {  // whole blocks in `tokens`, 1 to those of T
    return tokens >= double(p.T()) ? blocks_up(p.T()) : std::max<int64_t>(1, int64_t(tokens) / kTokenBlock);
  };
  const int64_t want = asked > 0 ? blocks_up(std::min(asked, p.T())) : blocks(512e6 / b.per_token);
  return std::min(want, blocks((double(memory_limit()) / kRunCopies - b.fixed) / b.per_token)) * kTokenBlock;
}

}  // namespace

void add_run(CLI::App& app, int& rc) {
  struct Opts {
    std::string backend = "cpu", precision, in, out;
    bool force = false, strict = false, allow_nonfinite = false, dump = false, quiet = false;
    int64_t chunk = 0;
    double timeout = 600;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("run", "Run the operator (forward, and backward when gradients are given)");
  sub->add_option("--backend", o->backend, "cpu, cpu:fp64, cuda or exec:COMMAND (mhc --help lists them)")
      ->capture_default_str();
  sub->add_option("--timeout", o->timeout, "exec: seconds the command may run")->check(kPositive)
      ->capture_default_str();
  sub->add_option("--precision", o->precision, "fp32 (default) or fp64 (cpu only: the float64 oracle)")
      ->check(CLI::IsMember({"fp32", "fp64"}));
  sub->add_flag("--force", o->force, "replace an existing output file");
  sub->add_flag("--strict", o->strict, "inputs that need rounding to their dtype are an error");
  sub->add_flag("--allow-nonfinite", o->allow_nonfinite, "accept NaN/Inf in inputs, and outputs that fail (NaN/Inf, or an inv_rms of 0 from an overflowed sum of squares)");
  sub->add_flag("--dump-intermediates", o->dump, "cuda: also keep dvecX ([..,n,D] float32)");
  sub->add_flag("-q,--quiet", o->quiet, "no summary table");
  sub->add_option("--chunk", o->chunk, "cpu: tokens read, computed and written at a time (rounded up to a multiple of 256, down to what the "
                  "memory limit allows; default: about 512 MB of stages a chunk)")
      ->check(kCount);
  sub->add_option("in", o->in, "input HDF5 file (/inputs)")->required();
  sub->add_option("out", o->out, "output HDF5 file: a copy of /inputs plus /forward and /backward")->required();
  sub->footer(
      "Examples:\n  mhc run --backend cpu in.h5 out.h5\n  mhc run --backend cpu --precision fp64 in.h5 oracle.h5\n"
      "  mhc run --backend cuda --dump-intermediates in.h5 gpu.h5\n"
      "  mhc run --backend 'exec:python3 kernel.py {in} {out}' in.h5 mine.h5");
  sub->callback([o, &rc] {
    BackendSpec b = parse_backend(o->backend);
    b.timeout = o->timeout;
    if (!o->precision.empty()) {
      const Precision want = o->precision == "fp64" ? Precision::fp64 : Precision::fp32;
      if (o->backend.find(':') != std::string::npos && b.backend->precisions.size() > 1 && want != b.prec)
        fail("--precision ", o->precision, " contradicts --backend ", o->backend, ": give one of them");
      b.prec = want;
      const auto& precs = b.backend->precisions;
      if (std::find(precs.begin(), precs.end(), b.prec) == precs.end())
        fail("--precision ", o->precision, ": the ", b.name(), " backend computes in ", precision_name(precs.front()));
    }
    LoadOptions lo;
    lo.strict = o->strict;
    lo.allow_nonfinite = o->allow_nonfinite;
    auto nonfinite = [&](const Case& c, int64_t t0) {  // exec: the command's doing, not the input's
      const char* whose = b.backend->takes_argument ? "the outputs your command wrote" : "the operator's outputs";
      if (std::string at = c.first_failed(t0); !at.empty() && !o->allow_nonfinite)
        fail(o->in, ": ", whose, " fail, first ", at, "; nothing written; --allow-nonfinite writes them anyway");
    };
    std::map<std::string, StatsAccumulator> summary;  // stage -> statistics over every chunk
    auto add_summary = [&](const Case& c) {
      for (auto& [name, t] : c.t)
        if (stage(name).group != Group::inputs) summary[name].add(t);
    };
    double ms = 0;
    Problem prob;
    bool backward = false;
    // The summary, printed before the output is moved into place: where it cannot be printed
    // (stdout a full disk or closed), the command fails and leaves no file.
    auto report = [&] {
      if (!o->quiet) {
        std::printf("mhc run: %s on %s, %s, %s in %.1f ms -> %s\n", b.str().c_str(), backend_device(b).c_str(),
                    prob.str().c_str(), backward ? "forward + backward" : "forward only", ms, o->out.c_str());
        std::printf("%-10s %-16s %-9s %12s %12s %12s %6s\n", "stage", "shape", "dtype", "min", "max", "rms", "nonfin");
        for (const Stage& s : stage_table()) {
          if (!summary.count(s.name)) continue;
          Stats st = summary[s.name].result();
          std::printf("%-10s %-16s %-9s %12.5g %12.5g %12.5g %6lld\n", s.name, shape_str(stage_shape(s, prob)).c_str(),
                      dtype_name(stored_dtype(s, b.prec)), st.min, st.max, st.rms, (long long)(st.nan + st.inf));
        }
      }
      flush_stdout();
    };
    if (b.backend->streams) {  // token chunk by token chunk: memory does not grow with T
      lo.copies = kRunCopies, lo.stream_tokens = kTokenBlock;  // at least a block at a time
      CaseReader in(o->in, lo, false);
      check_output_path(o->out, o->in, o->force);
      Case head = in.head();
      prob = head.prob;
      head.attrs = {{"backend", "cpu"}, {"precision", precision_name(b.prec)}};
      CaseWriter out(o->out, head, o->force);
      TokenSums sums;
      const auto begin = std::chrono::steady_clock::now();
      const int64_t chunk = run_chunk(prob, o->chunk);
      for (int64_t t0 = 0; t0 < prob.T(); t0 += chunk) {
        Case c = in.chunk(t0, std::min(prob.T(), t0 + chunk));
        backward = c.has_gradients();
        auto start = std::chrono::steady_clock::now();
        cpu_run_chunk(c, Arith(b.prec), sums);
        ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        nonfinite(c, t0);
        out.write(c, t0);
        add_summary(c);
        if (isatty(STDERR_FILENO) && std::chrono::steady_clock::now() - begin > std::chrono::seconds(1))
          std::cerr << "\rmhc run: " << int(100.0 * double(std::min(prob.T(), t0 + chunk)) / double(prob.T()))
                    << "% of tokens\033[K" << std::flush;
      }
      if (isatty(STDERR_FILENO)) std::cerr << "\r\033[K" << std::flush;
      cpu_finish(head, sums, Arith(b.prec));
      nonfinite(head, 0);
      out.write(head, 0);
      add_summary(head);
      out.finish();
      report();
      out.commit();
    } else {
      Case c = load_case(o->in, lo, false);
      check_output_path(o->out, o->in, o->force);
      auto start = std::chrono::steady_clock::now();
      run_backend(b, c, Pass::both, o->dump);
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      nonfinite(c, 0);
      if (!c.unknown.empty())  // an exec kernel's misspelled stage (/forward/H_PRE) was left out in silence
        fail(o->backend, ": ", c.unknown.front(), " is not a stage of the schema",
             suggest_stage(c.unknown.front()).empty() ? "" : cat(" (", suggest_stage(c.unknown.front()), ")"),
             "; nothing written (docs/schema.md)");
      prob = c.prob, backward = c.has_gradients();
      add_summary(c);
      save_case(o->out, c, o->force, report);
    }
    rc = 0;
  });
}

}  // namespace mhc
