#include "case.h"

namespace mhc {

const Tensor& Case::get(const std::string& name) const {
  auto it = t.find(name);
  MHC_CHECK(it != t.end(), "stage ", name, " not in case");
  return it->second;
}

bool Case::has_gradients() const {
  for (auto& g : gradient_inputs())
    if (!has(g)) return false;
  return true;
}

Case Case::inputs_only() const {
  Case c;
  c.prob = prob;
  for (auto& [name, tensor] : t)
    if (stage(name).group == Group::inputs) c.t[name] = tensor;
  return c;
}

}  // namespace mhc
