// backends.h — the backend registry: one row per backend (backend_*.cpp), read by run,
// diff, bench, check and --help. A spec names a row and its precision or argument:
// "cpu", "cpu:fp64", "cuda", "exec:python3 k.py {in} {out}".
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "case.h"

namespace mhc {

struct Backend;

struct BackendSpec {
  const Backend* backend = nullptr;
  Precision prec = Precision::fp32;
  std::string arg;        // exec: the command
  double timeout = 600;   // exec: seconds the command may run
  const std::string& name() const;
  std::string str() const;  // "cpu:fp64", "cuda", "exec:COMMAND"
};

struct Backend {
  std::string name;                   // what a spec starts with
  std::string usage;                  // how a spec is written: "cpu[:fp32|fp64]"
  std::string what;                   // one line for --help
  std::vector<Precision> precisions;  // the first is the default
  bool takes_argument = false;        // exec:COMMAND
  std::function<std::string(const std::string&)> bad_argument;  // why that argument cannot work, or ""
  bool streams = false;               // runs token chunk by token chunk (cpu_run_chunk)
  std::function<std::string()> unavailable;  // "" when it can run here, else why not
  std::function<void(const BackendSpec&, Case&, Pass, bool dump_intermediates)> run;
  // ms per timed repeat; empty when the backend cannot be timed in-process
  std::function<std::vector<double>(const BackendSpec&, const Case&, Pass, int warmup, int repeat)> bench;
  std::function<std::string(const BackendSpec&)> device;  // the CPU's or GPU's name
};

// The rows, one file each: backend_cpu.cpp, backend_cuda.cpp, backend_exec.cpp.
Backend cpu_backend();
Backend cuda_backend();
Backend exec_backend();
const std::vector<Backend>& backend_table();

// "cpu, cpu:fp64, cuda, exec:COMMAND": the spellings parse_backend accepts.
std::string backend_names();
// One line per backend with its description, and why it is unavailable here if it is.
std::string backend_help();
// Throws UserError on an unknown spec, naming the valid ones.
BackendSpec parse_backend(const std::string& text);
// True when `text` names a backend rather than a file.
bool is_backend_spec(const std::string& text);

// Run or time a spec: UserError (with the reason) when its backend is unavailable here.
void run_backend(const BackendSpec& b, Case& c, Pass pass = Pass::both, bool dump_intermediates = false);
std::vector<double> bench_backend(const BackendSpec& b, const Case& c, Pass pass, int warmup, int repeat);
std::string backend_device(const BackendSpec& b);
bool cuda_built();
std::string version_string();

}  // namespace mhc
