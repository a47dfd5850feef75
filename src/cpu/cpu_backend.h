// cpu_backend.h — the golden: Eigen + OpenMP, one function per stage of the stage table.
//
// fp32: the operator's arithmetic with fp32 accumulation, h_in and dx rounded to bf16.
// fp64: every operation in double, every stage stored as float64 (the oracle).
// Results are bitwise identical for any thread count: work is split into fixed-size
// pieces and every reduction runs in a fixed order.
//
// `plain` evaluations are the diff's reference for what a correct kernel may do
// (docs/diff.md): fp32 with every reduction one sequential chain (the least accurate
// common order), GEMM operands optionally rounded to tf32 or bf16, and h_in, dx stored
// unrounded (float32) so that their error before rounding can be measured. `reversed`
// runs each per-token chain (over K, D, n and N) from its last index down: a term that is
// last in the forward chain, where it rounds nothing after it, is first there.
#pragma once
#include "case.h"

namespace mhc {

// GEMM operands of a plain evaluation: as given, tf32 (mantissa truncated to 10 bits, as
// tensor cores read fp32), or bf16 (round to nearest even). x is bf16 already: exact in both.
enum class Operands { exact, tf32, bf16 };

struct Arith {
  Precision prec;
  bool plain;  // fp32 only
  Operands operands;
  bool reversed = false;  // plain only: the per-token chains from their last index down
  Arith(Precision p = Precision::fp32, bool pl = false, Operands o = Operands::exact) : prec(p), plain(pl), operands(o) {}
};

// t's values as a GEMM reading operands `o` reads them (any shape; float64). With `scale`
// (weights folded into the operand, gamma of phi*gamma): t[i] s rounded, then divided by s, s
// the scale's element i mod its size (t[i] itself where s is 0).
Tensor as_operand(const Tensor& t, Operands o, const Tensor* scale = nullptr);

// Computes stage `name` from its dependencies in `in` (any float dtype; converted as needed).
Tensor cpu_stage(const std::string& name, const Problem& p, const TensorMap& in, Arith arith);
// The same into `out`, reusing its memory when its shape and dtype already fit.
void cpu_stage_into(const std::string& name, const Problem& p, const TensorMap& in, Arith arith, Tensor& out);

// Computes the stages of `pass` (backward needs the gradients and, alone, the forward stages).
void cpu_run(Case& c, Arith arith, Pass pass = Pass::both);

// The sums over tokens (dphi before gamma, dalpha, dbias, dgamma) of the chunks run so far,
// in the arithmetic's type.
struct TokenSums {
  TensorMap acc;
};

// cpu_run in token chunks: each chunk (a case of its tokens; chunks in order, each starting at
// a multiple of kTokenBlock) gets its per-token stages and adds to `sums`; cpu_finish then
// writes the sums over tokens into `c`. The same bits as cpu_run on the whole case.
void cpu_run_chunk(Case& chunk, Arith arith, TokenSums& sums, Pass pass = Pass::both);
void cpu_finish(Case& c, const TokenSums& sums, Arith arith);

// The per-token terms of the sums over tokens with few elements (dalpha [T,3], dbias [T,N]),
// as cpu_run forms them before adding them over tokens, in the arithmetic of `a` (the diff
// estimates a correct kernel's error in those sums from them: docs/diff.md).
bool has_token_terms(const std::string& name);
std::vector<double> cpu_token_terms(const std::string& name, const Problem& p, const TensorMap& in, Arith a);

}  // namespace mhc
