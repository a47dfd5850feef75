#include "references.h"

#include <cstring>

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
      }),
      inputs_(inputs.inputs_only()) {}

const Case& References::get(int key) {
  auto it = done_.find(key);
  return it != done_.end() ? it->second : done_[key] = eval_(key);
}

namespace {

// A fixed order of 0..D-1 for evaluation q: Fisher-Yates driven by splitmix64 from q.
std::vector<int64_t> column_order(int64_t D, int q) {
  std::vector<int64_t> order(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) order[size_t(i)] = i;
  uint64_t z = 0x9e3779b97f4a7c15ull * uint64_t(q + 1);
  for (int64_t i = D - 1; i > 0; --i) {
    uint64_t r = (z += 0x9e3779b97f4a7c15ull);
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull, r = (r ^ (r >> 27)) * 0x94d049bb133111ebull, r ^= r >> 31;
    std::swap(order[size_t(i)], order[size_t(r % uint64_t(i + 1))]);
  }
  return order;
}

// Every tensor of c whose last axis is d or k (the k of stream i being i D + d), its D-long runs
// moved by `order` (element j of a run to order[j]), or back (`back`).
void reorder_columns(Case& c, const std::vector<int64_t>& order, bool back) {
  const int64_t D = c.prob.D;
  for (auto& [name, t] : c.t) {
    const Stage& s = stage(name);
    if (s.dims.empty() || (s.dims.back() != Dim::d && s.dims.back() != Dim::k)) continue;
    const size_t e = dtype_size(t.dtype);
    std::vector<unsigned char, NoInit<unsigned char>> out(t.bytes.size());
    for (int64_t r = 0; r < t.size() / D; ++r)
      for (int64_t j = 0; j < D; ++j) {
        const int64_t from = r * D + (back ? order[size_t(j)] : j), to = r * D + (back ? j : order[size_t(j)]);
        std::memcpy(&out[size_t(to) * e], &t.bytes[size_t(from) * e], e);
      }
    t.bytes = std::move(out);
  }
}

}  // namespace

const std::vector<Case>& References::reordered(Accuracy c) {
  if (shared_) return shared_->reordered(c);
  auto [it, fresh] = reordered_.try_emplace(ref_key(c));
  if (!fresh || inputs_.t.empty()) return it->second;
  // one more evaluation in arithmetic a, its columns moved by `order` first (and back after);
  // only its per-token stages are kept (and its sums over tokens where keep_sums): the rest
  // would hold memory
  auto evaluate = [&](Arith a, const std::vector<int64_t>* order) {
    Case e = inputs_;
    if (order) reorder_columns(e, *order, false);
    cpu_run(e, a);
    if (order) reorder_columns(e, *order, true);
    for (auto t = e.t.begin(); t != e.t.end();) {
      const Stage& s = stage(t->first);
      t = s.group != Group::inputs && (per_token(s) || keep_sums_) ? std::next(t) : e.t.erase(t);
    }
    it->second.push_back(std::move(e));
  };
  Arith reversed = plain_arith(c);
  reversed.reversed = true;
  evaluate(reversed, nullptr);
  const int64_t T = inputs_.prob.T(), D = inputs_.prob.D;
  // shuffled orders where D has others (D! - 1: none at D = 1); 6 at most, 7 with the reversed
  // one: 31 took 5x the CPU time of the whole diff at 1,4,7168 (s(8 m) = 4.8 at m = 1, against 296)
  const int64_t others = D == 1 ? 0 : D == 2 ? 1 : D == 3 ? 5 : kMostReordered - 1;
  if (T > 0 && T < kTokenBlock)
    for (int q = 0; q < int(std::min<int64_t>(others, (kTokenBlock + T - 1) / T - 2)); ++q) {
      const std::vector<int64_t> order = column_order(D, q);
      evaluate(plain_arith(c), &order);
    }
  return it->second;
}

}  // namespace mhc
