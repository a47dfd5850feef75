// block.h — the diff of one block of tokens (engine.cpp), which the streamed diff
// (stream.cpp) runs block by block and merges.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "diff.h"

namespace mhc {

// The fp64 replays of the sums over tokens from A's own tensors (introduced or inherited?) and
// from B's (is the reference wrong, or over its limit only through its inputs?): each block adds
// its part; the final diff of the sums is given their totals.
struct BlockSums {
  std::set<std::string> want;                       // sums over tokens this block replays its part of
  std::map<std::string, Tensor> replays_added;      // ... that part, from A
  std::map<std::string, Tensor> replays;            // given: the replays to use (the totals)
  std::map<std::string, Tensor> ref_replays_added;  // the same from B
  std::map<std::string, Tensor> ref_replays;
  // Given for the sums over tokens with few elements (dalpha, dbias): per class, an upper
  // estimate of the sigma of a correct kernel's error in each element, in the stage's values
  // (stream.cpp, docs/diff.md); empty where there is none.
  std::function<std::vector<double>(Accuracy, const std::string&)> sigma;
  // Given for the sums over tokens with many elements (dphi, dgamma): per element, the sigma of
  // a sequential fp32 chain's own rounding there, in the stage's values (stream.cpp); a floor
  // of the limit where a few large terms dominate an element. Empty where there is none.
  std::function<std::vector<double>(const std::string&)> chain;
};

// Compares one block: every stage present on both sides, with per-element errors and masks
// in StageReport::elem_error and elem_mask (where, heatmaps and the verdict are the caller's).
DiffReport diff_block(const Case& a, const Case& b, References& refs, const DiffOptions& opt, BlockSums& sums);

// The verdict, first divergent stage, root causes, inherited_from and --require, from the
// stage reports.
void finish_report(DiffReport& rep, const DiffOptions& opt);

}  // namespace mhc
