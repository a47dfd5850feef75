// backend_cuda.cpp — the registry row of the CUDA backend (src/cuda), and its stand-ins in a
// build without CUDA.
#include "backends.h"
#include "cuda_backend.h"

namespace mhc {

#ifndef MHC_HAVE_CUDA
[[noreturn]] static void no_cuda() {
  fail("the cuda backend is not available: this mhc was built without CUDA (see mhc --version)");
}
void cuda_run(Case&, Pass, bool) { no_cuda(); }
std::vector<double> cuda_bench(const Case&, Pass, int, int) { no_cuda(); }
std::string cuda_device_name() { no_cuda(); }
double cuda_copy_gbps() { no_cuda(); }
#endif

Backend cuda_backend() {
  Backend b;
  b.name = "cuda";
  b.usage = "cuda";
  b.what = "every stage on an NVIDIA GPU: fp32 accuracy (tensor cores on exact bf16 splits), deterministic";
  b.precisions = {Precision::fp32};
  b.unavailable = []() -> std::string {
    if (!cuda_built()) return "this mhc was built without CUDA (see mhc --version)";
    try {
      cuda_device_name();
      return "";
    } catch (const UserError& e) {
      return e.what();
    }
  };
  b.run = [](const BackendSpec&, Case& c, Pass pass, bool dump) {
    for (auto& [name, t] : c.t)  // the schema's input dtypes (x may come as float32 holding bf16 values)
      if (const Stage& s = stage(name); s.group == Group::inputs && t.dtype != s.dtype) t = convert(t, s.dtype);
    cuda_run(c, pass, dump);
  };
  b.bench = [](const BackendSpec&, const Case& c, Pass pass, int warmup, int repeat) {
    return cuda_bench(c, pass, warmup, repeat);
  };
  b.device = [](const BackendSpec&) { return cuda_device_name(); };
  return b;
}

}  // namespace mhc
