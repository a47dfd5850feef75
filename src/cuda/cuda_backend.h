// cuda_backend.h — the CUDA backend: every stage on the GPU, fp32 arithmetic, deterministic.
// Declared unconditionally; defined only when mhc is built with CUDA (MHC_HAVE_CUDA).
#pragma once
#include <string>
#include <vector>

#include "case.h"

namespace mhc {

// Computes the stages of `pass` like cpu_run. dvecX (a [..,n,D] float32 intermediate)
// is kept only when dump_intermediates is set.
void cuda_run(Case& c, Pass pass, bool dump_intermediates);

// Milliseconds per repeat of `pass`, timed with CUDA events, data resident on the device,
// the L2 flushed before every repeat.
std::vector<double> cuda_bench(const Case& c, Pass pass, int warmup, int repeat);

// Device-to-device copy bandwidth in GB/s, bytes read + written (1 GiB, median of 10).
double cuda_copy_gbps();

// "NVIDIA H100 80GB HBM3 (sm_90)"; UserError "no CUDA device" when there is none.
std::string cuda_device_name();

}  // namespace mhc
