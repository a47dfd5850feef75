// stages.h — THE stage table: every tensor mhc reads or writes, in dependency order.
//
// Backends compute stages by name, HDF5 I/O derives dataset paths, shapes and dtypes
// from it, and diff walks it to find where two runs part ways.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "problem.h"

namespace mhc {

enum class Group { inputs, forward, backward };  // also the HDF5 group name
inline const char* group_name(Group g) {
  return g == Group::inputs ? "inputs" : g == Group::forward ? "forward" : "backward";
}

// Symbolic dimensions; `tok` expands to the problem's token dimensions ([T] or [B,S]).
enum class Dim { tok, n, d, nmix, k, three };

// What a file without an input means.
enum class Absent { error, ones, forward_only };

struct Stage {
  const char* name;
  Group group;
  std::vector<Dim> dims;
  DType dtype;  // stored dtype at fp32 precision; at fp64 every computed stage is float64
  std::vector<const char*> deps;
  const char* what;
  Absent absent = Absent::error;  // inputs: error, all ones (gamma), or no backward (the gradients)
  bool output = false;            // what the operator returns: h_in, h_post, h_res and the inputs' gradients
};

const std::vector<Stage>& stage_table();
const Stage* find_stage(std::string_view name);  // nullptr if unknown
const Stage& stage(std::string_view name);        // MHC_CHECKs that it exists
const Stage& shape_input();  // the input whose shape gives the problem: x, [T,n,D] or [B,S,n,D]

// For a dataset path that names no stage: "did you mean /forward/h_mix?", or "" when nothing is close.
std::string suggest_stage(const std::string& path);
// The stage named within two edits (any case) of `name`, the nearest; computed stages only
// with `computed`; nullptr when none is that near.
const Stage* nearest_stage(const std::string& name, bool computed = false);
size_t edit_distance(const std::string& a, const std::string& b);  // Levenshtein, any case
// A top-level group named within two edits (any case) of /inputs, /forward or /backward but
// not one of them: "/foward", "/Backward". Its datasets are a misspelling, not the user's own.
bool misspelled_group(const std::string& group);

Shape stage_shape(const Stage& s, const Problem& p);
std::string stage_shape_str(const Stage& s);        // "[..,n,D]" symbolic
// "" when `stored` is stage s's shape in problem p, else how it differs, to follow "stores
// h_mix ": "as [256,24]; the schema says [..,N] = [2,128,24] for ..." (or, with as many
// elements, "..: reshape it before writing").
std::string shape_mismatch(const Stage& s, const Shape& stored, const Problem& p);
// A case's size in memory, in two parts: the stages that do not grow with the tokens
// (parameters, sums over tokens) and what one token adds. Each element counts at its fp32
// dtype's size, or with `f64` at 8 bytes (the fp64 golden's computed stages; an upper bound
// for any run); with `inputs_only`, only /inputs.
struct CaseBytes {
  double fixed = 0, per_token = 0;
  double with(double tokens) const { return fixed + tokens * per_token; }
};
CaseBytes case_bytes(const Problem& p, bool f64 = false, bool inputs_only = false);

std::string dataset_path(const Stage& s);           // "/forward/h_mix"
DType stored_dtype(const Stage& s, Precision prec);

// Tokens are processed in blocks of this many: sums over tokens add block by block in order
// (the same bits for any chunking that starts chunks at multiples of it), and the diff
// measures a per-token stage's limits per block (docs/diff.md).
constexpr int64_t kTokenBlock = 256;

bool per_token(const Stage& s);    // its first axis is the token axis ([T,..] or [B,S,..])
bool is_token_sum(const Stage& s);  // a sum over all tokens: dphi, dalpha, dbias, dgamma
inline bool is_token_sum(std::string_view name) { const Stage* s = find_stage(name); return s && is_token_sum(*s); }

// The three upstream gradients; backward runs when all are present.
const std::vector<std::string>& gradient_inputs();
bool is_gradient_input(const std::string& name);

}  // namespace mhc
