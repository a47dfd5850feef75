// gate_tails.h — where the gate gradients take their sigmoids from z instead of from the stored
// gate (problem.h: kPreLow, kGateHigh): one rule for the CPU golden and the CUDA backward.
#pragma once

#if defined(__CUDACC__)
#define MHC_HOST_DEVICE __host__ __device__
#else
#define MHC_HOST_DEVICE
#endif

namespace mhc {

// Whether the gate recomputed from z (sz = sigmoid(z), rz = sigmoid(-z)) is in the tail that the
// stored one (s, r = 1 - s) is in, within a factor 2: then z evaluates the same gate more
// accurately. A kernel whose own gate is wrong there (a bias of another slice put it in a tail z
// is not in) keeps its own s, so that its later stages show as inherited from that gate, not as
// introduced (session 18's review). The post gate passes s = 1, low = 0 (its upper tail only).
template <class R> MHC_HOST_DEVICE inline bool in_tail(R s, R r, R sz, R rz, R low, R high) {
  return (s < low && sz < R(2) * low) || (r < high && rz < R(2) * high);
}

}  // namespace mhc
