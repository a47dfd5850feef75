// stream.h — the diff over token chunks, so that memory does not grow with T: each side is
// read (HDF5 hyperslabs) or computed chunk by chunk, compared in blocks of kTokenBlock
// tokens, and the sums over tokens are compared once every block has been added in.
#pragma once
#include <functional>
#include <memory>
#include <set>

#include "diff.h"
#include "h5io.h"

namespace mhc {

// One side of a diff, read or computed chunk by chunk (chunks in token order).
class Side {
 public:
  virtual ~Side() = default;
  // The problem (in its own token layout), parameters, attributes and unknown datasets.
  virtual const Case& head() = 0;
  // Tokens [t0, t1) of the flattened token axis as a case of layout [t1 - t0]: inputs,
  // parameters and per-token stages.
  virtual Case chunk(int64_t t0, int64_t t1) = 0;
  virtual Case inputs(int64_t t0, int64_t t1) = 0;  // the inputs of those tokens only
  // The sums over tokens (dphi, dalpha, dbias, dgamma) the side has: sums() holds them once
  // every chunk has been read.
  virtual std::set<std::string> sum_stages() = 0;
  virtual Case sums() = 0;
};

// A file's side. With `inputs`, a file without /inputs (a kernel's dump of stages only) is
// compared on those inputs.
std::unique_ptr<Side> file_side(const std::string& path, const LoadOptions& opt, bool outputs,
                                std::shared_ptr<Side> inputs = nullptr);
std::unique_ptr<Side> case_side(Case c);  // a case held whole (a backend that runs it in one piece)
// The golden run chunk by chunk on the chunks of `inputs`.
std::unique_ptr<Side> cpu_side(std::shared_ptr<Side> inputs, Arith arith);

// The inputs of tokens [0, T) of a side, in its own token layout.
Case whole_inputs(Side& s);

// Compares side A against the reference B over tokens [t0, t1); the sums over tokens only
// when that is every token. `check` sees both sides' chunks of each block first.
DiffReport diff_sides(Side& a, Side& b, const DiffOptions& opt, int64_t t0, int64_t t1,
                      const std::function<void(const Case&, const Case&)>& check = nullptr);

}  // namespace mhc
