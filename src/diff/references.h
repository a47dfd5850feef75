// references.h — the evaluations a diff measures its budgets with, made on B's inputs:
// the fp64 oracle, and per accuracy class a plain fp32 evaluation (every reduction one
// sequential chain; GEMM operands exact, tf32 or bf16). Computed once, when first needed.
#pragma once
#include <functional>
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

// An evaluation's key: the oracle, or the plain evaluation of class fp32, tf32 or bf16.
constexpr int kOracle = -1;
inline int ref_key(Accuracy c) { return int(c); }
Arith ref_arith(int key);

// Evaluations in other orders where a case is shorter than a block (reordered): the reversed
// one and at most kMostReordered - 1 with D's columns shuffled.
constexpr int kMostReordered = 7;

class References {
 public:
  // Evaluations of `inputs` by the CPU backend. With `sums`, the inputs are one token chunk
  // of a case: each evaluation adds its sums over tokens to sums[key] (cpu_run_chunk).
  explicit References(const Case& inputs, std::map<int, TokenSums>* sums = nullptr);
  // Evaluations made elsewhere: eval(key) returns the case.
  explicit References(std::function<Case(int key)> eval) : eval_(std::move(eval)) {}
  const Case& oracle() { return get(kOracle); }
  const Case& plain(Accuracy c) { return get(ref_key(c)); }
  const Case& get(int key);

  // More plain class-C evaluations of the block (none from the second constructor), their
  // per-token stages only: the reversed one (every per-token chain from its last index down: a
  // dominant term last in the plain chain is first there), and in a block of fewer than
  // kTokenBlock tokens ceil(kTokenBlock / tokens) - 2 more, at most 6 (and at most D! - 1), each
  // with the columns of every D-long run (x's d, phi's k stream by stream, ...) in another fixed
  // order, its stages put back in the original one. Other sequential chains over K and D:
  // samples of a correct kernel's error where the plain chain's order or one evaluation's few
  // elements say little (engine.cpp).
  // Where the block is the whole case, their sums over tokens are whole too: keep_sums() keeps
  // them, and the references of the sums take them with share_reordered(block).
  const std::vector<Case>& reordered(Accuracy c);
  void keep_sums() { keep_sums_ = true; }
  void share_reordered(References& block) { shared_ = &block; }

 private:
  std::function<Case(int)> eval_;
  std::map<int, Case> done_;
  Case inputs_;  // the block's inputs (first constructor)
  std::map<int, std::vector<Case>> reordered_;
  bool keep_sums_ = false;
  References* shared_ = nullptr;
};

}  // namespace mhc
