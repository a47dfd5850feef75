#include "backends.h"

#include <omp.h>

#include <chrono>
#include <fstream>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "version.h"

namespace mhc {

std::string BackendSpec::str() const { return name == "cpu" ? cat("cpu:", precision_name(prec)) : name; }

static const char* const kBackends[] = {"cpu", "cpu:fp32", "cpu:fp64", "cuda", "cuda:fp32"};

std::string backend_names() {
  std::string s;
  for (const char* b : kBackends) s += cat(s.empty() ? "" : ", ", b);
  return s;
}

bool is_backend_spec(const std::string& text) {
  for (const char* b : kBackends)
    if (text == b) return true;
  return false;
}

BackendSpec parse_backend(const std::string& text) {
  if (!is_backend_spec(text)) fail("unknown backend '", text, "': expected one of ", backend_names());
  BackendSpec b;
  b.name = text.substr(0, text.find(':'));
  b.prec = text == "cpu:fp64" ? Precision::fp64 : Precision::fp32;
  return b;
}

bool cuda_built() {
#ifdef MHC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string version_string() {
#ifdef MHC_HAVE_CUDA
  std::string cuda = "CUDA backend built for " MHC_CUDA_ARCHS;
#else
  std::string cuda = "CPU only: built without CUDA";
#endif
  return cat("mhc ", MHC_VERSION, " (HDF5 schema ", MHC_SCHEMA_VERSION, "; ", cuda, ")");
}

#ifndef MHC_HAVE_CUDA
[[noreturn]] static void no_cuda() {
  fail("the cuda backend is not available: this mhc was built without CUDA (see mhc --version)");
}
void cuda_run(Case&, Pass, bool) { no_cuda(); }
std::vector<double> cuda_bench(const Case&, Pass, int, int) { no_cuda(); }
std::string cuda_device_name() { no_cuda(); }
double cuda_copy_gbps() { no_cuda(); }
#endif

void run_backend(const BackendSpec& b, Case& c, Pass pass, bool dump_intermediates) {
  if (b.name == "cpu") return cpu_run(c, b.prec, pass);
  cuda_run(c, pass, dump_intermediates);
}

std::vector<double> bench_backend(const BackendSpec& b, const Case& c, Pass pass, int warmup, int repeat) {
  if (b.name == "cuda") return cuda_bench(c, pass, warmup, repeat);
  Case work = c;
  if (pass == Pass::bwd) cpu_run(work, b.prec, Pass::fwd);
  std::vector<double> ms;
  for (int i = 0; i < warmup + repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    cpu_run(work, b.prec, pass);
    auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return ms;
}

std::string backend_device(const BackendSpec& b) {
  if (b.name == "cuda") return cuda_device_name();
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return cat(model, ", ", omp_get_max_threads(), " threads");
}

}  // namespace mhc
