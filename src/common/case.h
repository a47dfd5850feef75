// case.h — one complete case: the problem, its inputs, and whatever stages were computed.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "stages.h"

namespace mhc {

struct Case {
  Problem prob;
  TensorMap t;                                // stage name -> tensor
  std::map<std::string, std::string> attrs;  // producer attributes (backend, precision, ...)
  std::map<std::string, std::string> stored_as;  // stage -> HDF5 type, when not bf16/float32/float64
  std::vector<std::string> unknown;              // datasets under /, /inputs, /forward, /backward not in the schema
  // per-token stages stored in another shape than the schema's for the whole case -> how
  // (shape_mismatch). A chunk holds no tensor of them: its own problem could not tell (a
  // [T,..] dump of a [B,S,..] case)
  std::map<std::string, std::string> misshapen;
  std::vector<std::string> eps_defaulted;  // norm_eps, hc_eps: absent from the file's /inputs, read as 1e-6

  bool has(const std::string& name) const { return t.count(name) != 0; }
  // How stage s (present, or in misshapen) is stored where it cannot be read as the schema's
  // stage, to follow "stores h_mix ": its shape, or a type that loses its values; "" when it can.
  std::string storage_problem(const Stage& s) const;
  const Tensor& get(const std::string& name) const;  // MHC_CHECKs presence
  bool has_gradients() const;                        // all three upstream gradients present
  Case inputs_only() const;                          // the same case without computed stages
  // Tokens [t0, t1) of the flattened token axis, as a case of layout [t1-t0]: per-token
  // tensors sliced, parameters kept, sums over all tokens dropped.
  Case token_slice(int64_t t0, int64_t t1) const;
  // "" when every computed stage holds a value its arithmetic can give, else the first that
  // does not, with its likely cause: a NaN/Inf, or an inv_rms of 0 (its sum of squares
  // overflowed), as "inv_rms at token 3 is 0: |x| reaches 2^70 there, ...". Token indices
  // count from token_offset (a chunk of a larger case).
  std::string first_failed(int64_t token_offset = 0) const;
};

}  // namespace mhc
