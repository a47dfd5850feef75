// backend_cpu.cpp — the registry row of the golden: Eigen + OpenMP, fp32 or the fp64 oracle.
#include <omp.h>

#include <chrono>
#include <fstream>

#include "backends.h"
#include "cpu_backend.h"

namespace mhc {

Backend cpu_backend() {
  Backend b;
  b.name = "cpu";
  b.usage = "cpu[:fp32|fp64]";
  b.what = "the golden: Eigen + OpenMP; fp64 is the oracle (every operation in double)";
  b.precisions = {Precision::fp32, Precision::fp64};
  b.streams = true;
  b.unavailable = [] { return std::string(); };
  b.run = [](const BackendSpec& s, Case& c, Pass pass, bool) { cpu_run(c, s.prec, pass); };
  b.bench = [](const BackendSpec& s, const Case& c, Pass pass, int warmup, int repeat) {
    Case work = c;
    if (pass == Pass::bwd) cpu_run(work, s.prec, Pass::fwd);
    std::vector<double> ms;
    for (int i = 0; i < warmup + repeat; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      cpu_run(work, s.prec, pass);
      auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return ms;
  };
  b.device = [](const BackendSpec&) {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model = "unknown CPU";
    while (std::getline(f, line))
      if (line.rfind("model name", 0) == 0) {
        model = line.substr(line.find(':') + 2);
        break;
      }
    return cat(model, ", ", omp_get_max_threads(), " threads");
  };
  return b;
}

}  // namespace mhc
