// backends.h — backend specs ("cpu", "cpu:fp64", "cuda") and running or timing one.
#pragma once
#include <string>
#include <vector>

#include "case.h"

namespace mhc {

struct BackendSpec {
  std::string name = "cpu";  // cpu | cuda
  Precision prec = Precision::fp32;
  std::string str() const;  // "cpu:fp64"
};

// "cpu, cpu:fp32, cpu:fp64, cuda": the names parse_backend accepts.
std::string backend_names();
// Throws UserError on an unknown spec.
BackendSpec parse_backend(const std::string& text);
// True when `text` names a backend rather than a file.
bool is_backend_spec(const std::string& text);

void run_backend(const BackendSpec& b, Case& c, Pass pass = Pass::both, bool dump_intermediates = false);
std::vector<double> bench_backend(const BackendSpec& b, const Case& c, Pass pass, int warmup, int repeat);
std::string backend_device(const BackendSpec& b);  // the CPU's or GPU's name
bool cuda_built();
std::string version_string();

}  // namespace mhc
