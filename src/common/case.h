// case.h — one complete case: the problem, its inputs, and whatever stages were computed.
#pragma once
#include <map>
#include <string>

#include "stages.h"

namespace mhc {

struct Case {
  Problem prob;
  TensorMap t;                                // stage name -> tensor
  std::map<std::string, std::string> attrs;  // producer attributes (backend, precision, ...)

  bool has(const std::string& name) const { return t.count(name) != 0; }
  const Tensor& get(const std::string& name) const;  // MHC_CHECKs presence
  bool has_gradients() const;                        // all three upstream gradients present
  Case inputs_only() const;                          // the same case without computed stages
};

}  // namespace mhc
