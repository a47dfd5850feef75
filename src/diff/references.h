// references.h — the evaluations a diff measures its budgets with, made on B's inputs:
// the fp64 oracle, and per accuracy class a plain fp32 evaluation (every reduction one
// sequential chain; GEMM operands exact, tf32 or bf16). Computed once, when first needed.
#pragma once
#include <map>

#include "case.h"
#include "cpu_backend.h"

namespace mhc {

// How close to the oracle a stage is, tightest first.
enum class Accuracy { exact, fp32, tf32, bf16, diverged };
const char* accuracy_name(Accuracy a);
Accuracy parse_accuracy(const std::string& text);  // fp32 | tf32 | bf16; UserError otherwise

// The arithmetic of the plain class-C evaluation (c in fp32, tf32, bf16).
Arith plain_arith(Accuracy c);

class References {
 public:
  explicit References(const Case& inputs) : inputs_(inputs.inputs_only()) {}
  const Case& oracle();
  const Case& plain(Accuracy c);  // c in fp32, tf32, bf16

 private:
  Case inputs_;
  std::map<int, Case> done_;  // by Accuracy, the oracle under -1
};

}  // namespace mhc
