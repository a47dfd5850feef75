#include "references.h"

namespace mhc {

const char* accuracy_name(Accuracy a) {
  switch (a) {
    case Accuracy::exact: return "exact";
    case Accuracy::fp32: return "fp32";
    case Accuracy::tf32: return "tf32";
    case Accuracy::bf16: return "bf16";
    case Accuracy::diverged: return "diverged";
  }
  return "?";
}

Accuracy parse_accuracy(const std::string& text) {
  for (Accuracy a : {Accuracy::fp32, Accuracy::tf32, Accuracy::bf16})
    if (text == accuracy_name(a)) return a;
  fail("--accept ", text, ": expected fp32, tf32 or bf16");
}

Arith plain_arith(Accuracy c) {
  MHC_CHECK(c == Accuracy::fp32 || c == Accuracy::tf32 || c == Accuracy::bf16, "no plain evaluation for ", accuracy_name(c));
  Operands o = c == Accuracy::fp32 ? Operands::exact : c == Accuracy::tf32 ? Operands::tf32 : Operands::bf16;
  return Arith(Precision::fp32, true, o);
}

Arith ref_arith(int key) { return key == kOracle ? Arith(Precision::fp64) : plain_arith(Accuracy(key)); }

References::References(const Case& inputs, std::map<int, TokenSums>* sums)
    : eval_([in = inputs.inputs_only(), sums](int key) {
        Case c = in;
        if (sums) cpu_run_chunk(c, ref_arith(key), (*sums)[key]);
        else cpu_run(c, ref_arith(key));
        return c;
      }) {}

const Case& References::get(int key) {
  auto it = done_.find(key);
  return it != done_.end() ? it->second : done_[key] = eval_(key);
}

}  // namespace mhc
