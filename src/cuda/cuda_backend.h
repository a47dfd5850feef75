// cuda_backend.h — the CUDA backend: every stage on the GPU, fp32 arithmetic, deterministic.
// Declared unconditionally; defined only when mhc is built with CUDA (MHC_HAVE_CUDA). The
// device-memory plan at the end is inline and needs no GPU (tests/test_cuda_memory.cpp).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "case.h"
#include "error.h"
#include "problem.h"

namespace mhc {

// Computes the stages of `pass` like cpu_run. dvecX (a [..,n,D] float32 intermediate)
// is kept only when dump_intermediates is set. A case larger than the device's free memory
// is a UserError (exit 2) that says how much it needs, checked before anything is allocated.
void cuda_run(Case& c, Pass pass, bool dump_intermediates);

// Milliseconds per repeat of `pass`, timed with CUDA events, data resident on the device,
// the L2 flushed before every repeat.
std::vector<double> cuda_bench(const Case& c, Pass pass, int warmup, int repeat);

// Device-to-device copy bandwidth in GB/s, bytes read + written (1 GiB, median of 10).
double cuda_copy_gbps();

// "NVIDIA H100 80GB HBM3 (sm_90)"; UserError "no CUDA device" when there is none.
std::string cuda_device_name();

// ---- What the kernels can run, and the device memory of a case, from the shape alone.

// The largest n·D the kernels index in 32 bits: column indices k < K, and mix_finish's column
// ranges, whose ends may pass D by up to a few hundred before their clamp (4096 to spare).
inline constexpr int64_t kCudaMaxK = (int64_t(1) << 31) - 4096;
// The most tokens: token_grads launches a block per token (a grid's x is below 2^31).
inline constexpr int64_t kCudaMaxT = (int64_t(1) << 31) - 1;

// Why the cuda backend cannot run a shape, or "" when it can. Checked before any size is
// computed in 32 bits (the device-memory check itself uses the kernels' scratch sizes).
inline std::string cuda_unsupported(const Problem& p) {
  if (p.n < 1 || p.n > 8) return cat("the cuda backend supports n = 1..8, this case has n = ", p.n);
  if (p.D > kCudaMaxK / p.n)
    return cat("the cuda backend supports n*D up to ", kCudaMaxK, ", this case has n*D = ", p.n, "*", p.D);
  if (p.T() > kCudaMaxT) return cat("the cuda backend supports up to ", kCudaMaxT, " tokens, this case has ", p.T());
  return "";
}

// ---- The device memory of a case.

// Sizes the kernels choose for a shape: cuda::forward_scratch_floats and, with backward,
// cuda::token_splits.
struct CudaGeometry {
  int64_t fwd_scratch_floats = 0;
  int64_t splits = 0;
};

// Whether a stage of group g lists `name` among what it reads.
inline bool read_by(Group g, std::string_view name) {
  for (const Stage& s : stage_table())
    if (s.group == g)
      for (const char* dep : s.deps)
        if (name == dep) return true;
  return false;
}

// The stages on the device in a run (forward always; backward when `backward`):
//  - inputs the forward reads, but phi and gamma, which reach it folded into pg = phi*gamma;
//    with backward, also every input the backward reads;
//  - every forward stage (computed, or uploaded for a backward alone);
//  - with backward, every backward stage; dvecX only when kept.
inline bool cuda_on_device(const Stage& s, bool backward, bool keep_dvecX) {
  const std::string_view name = s.name;
  switch (s.group) {
    case Group::inputs:
      return (read_by(Group::forward, name) && name != "phi" && name != "gamma") ||
             (backward && read_by(Group::backward, name));
    case Group::forward: return true;
    case Group::backward: return backward && (keep_dvecX || name != "dvecX");
  }
  return false;
}

// The forward stages a backward alone uploads from the case: those the backward reads.
inline bool cuda_backward_reads(const Stage& s) { return s.group == Group::forward && read_by(Group::backward, s.name); }

// Elements of a stage as a double: a shape declared in a hostile file cannot overflow it.
inline double stage_elements(const Stage& s, const Problem& p) {
  double e = 1;
  for (int64_t d : stage_shape(s, p)) e *= double(d);
  return e;
}

// Float elements of the device buffers that are no stage.
struct CudaScratch {
  double pg = 0;           // [N,K] phi with gamma folded in, read by the forward
  double fwd = 0;          // the forward's phi*gamma planes and partial sums over groups of K
  double g_tok = 0;        // backward: [T,N] per-token gate gradients
  double a_tok = 0;        // backward: [T,3] per-token dalpha terms
  double partial = 0;      // backward: [splits,N,K] partial sums over token splits
  double total() const { return pg + fwd + g_tok + a_tok + partial; }
};

inline CudaScratch cuda_scratch(const Problem& p, bool backward, const CudaGeometry& g) {
  const double T = double(p.T()), N = double(p.N()), K = double(p.K());
  CudaScratch s;
  s.pg = N * K;
  s.fwd = double(g.fwd_scratch_floats);
  if (backward) s.g_tok = T * N, s.a_tok = T * 3, s.partial = double(g.splits) * N * K;
  return s;
}

// Bytes of every device allocation of a run: the stages on the device and the scratch.
inline double cuda_case_bytes(const Problem& p, bool backward, bool keep_dvecX, const CudaGeometry& g) {
  double bytes = cuda_scratch(p, backward, g).total() * 4;
  for (const Stage& s : stage_table())
    if (cuda_on_device(s, backward, keep_dvecX)) bytes += stage_elements(s, p) * double(dtype_size(s.dtype));
  return bytes;
}

}  // namespace mhc
