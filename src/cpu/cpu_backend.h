// cpu_backend.h — the golden: Eigen + OpenMP, one function per stage of the stage table.
//
// fp32: the operator's arithmetic with fp32 accumulation, h_in and dx rounded to bf16.
// fp64: every operation in double, every stage stored as float64 (the oracle).
// Results are bitwise identical for any thread count: work is split into fixed-size
// pieces and every reduction over tokens runs in a fixed order.
#pragma once
#include "case.h"

namespace mhc {

// Computes stage `name` from its dependencies in `in` (any float dtype; converted as needed).
Tensor cpu_stage(const std::string& name, const Problem& p, const TensorMap& in, Precision prec);
// The same into `out`, reusing its memory when its shape and dtype already fit.
void cpu_stage_into(const std::string& name, const Problem& p, const TensorMap& in, Precision prec, Tensor& out);

// Computes the stages of `pass` (backward needs the gradients and, alone, the forward stages).
void cpu_run(Case& c, Precision prec, Pass pass = Pass::both);

}  // namespace mhc
