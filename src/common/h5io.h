// h5io.h — reading and writing cases in the HDF5 schema of docs/schema.md.
//
// Every failure is a UserError naming the file and dataset. Writes go to a temporary
// file in the target directory and are renamed into place, so no partial output survives.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "case.h"
#include "output_file.h"
#include "stats.h"

namespace mhc {

struct LoadOptions {
  bool strict = false;           // values that need rounding to the input dtype are an error
  bool allow_nonfinite = false;  // NaN/Inf in inputs are an error unless set
  bool quiet = false;            // no rounding warnings on stderr
  // What the command holds at once, checked before anything is allocated: `copies` copies of
  // the whole case at its dtypes' sizes; or, for a command that streams (stream_tokens > 0),
  // copies of the parameters and of that many tokens at 8 bytes an element (CaseBytes).
  double copies = 2;
  int64_t stream_tokens = 0;
};

// Peak memory of the commands that stream, in copies of case_bytes(p, true) at the tokens
// they hold (measured with /usr/bin/time on phi-heavy, N-heavy and K-heavy shapes, docs/perf.md:
// run ≤ 2.1, diff ≤ 5.9; the rest is margin).
constexpr double kRunCopies = 2.5, kDiffCopies = 6.5;

// Bytes mhc may allocate: MHC_MAX_MEMORY if set, else the machine's available memory.
// Cases and datasets that would need more are refused before anything is allocated.
uint64_t memory_limit();
// One line naming `where` and the problem when `need` bytes pass memory_limit().
void check_memory(const std::string& where, const Problem& p, double need);
// The check of a command that holds the whole case, by what it holds: gen two copies of its
// inputs; bench two of the case at 8 bytes an element (cpu:fp64); check four at 8 bytes (its
// run, a repeat and the fp64 reference: 2.7 measured at 2048,4,4096).
enum class Holds { inputs, case_f64, check };
inline void check_case_memory(const std::string& where, const Problem& p, Holds h) {
  const double T = double(p.T());
  check_memory(where, p, h == Holds::inputs ? case_bytes(p, false, true).with(T) * 2
                         : case_bytes(p, true).with(T) * (h == Holds::check ? 4 : 2));
}

// Reads /inputs (validated against the stage table) and, when `outputs`, every
// /forward and /backward dataset present, kept in its stored dtype and shape.
Case load_case(const std::string& path, const LoadOptions& opt, bool outputs);

// Whether the HDF5 file at path has an /inputs link (true where it cannot be opened: its
// reader then reports why).
bool has_inputs(const std::string& path);

// The stages a program wrote for the inputs of `c` (the exec backend): every /forward and
// /backward dataset of the schema, in its stored dtype and shape, into c.t; other datasets
// in those groups into c.unknown. The file's own /inputs, if any, are not read.
void load_stages(const std::string& path, Case& c);

// A /backward stage in `c` (present, or misshapen) where its case has no `gradients`: an error
// naming path (a forward-only case has no backward to compare or replay from).
void check_backward_has_gradients(const std::string& path, const Case& c, bool gradients);

// Reads a case token chunk by token chunk (HDF5 hyperslabs), for commands whose memory must
// not grow with T. The constructor validates the file as load_case does and reads what is
// not per token: parameters and, with `outputs`, the sums over tokens.
class CaseReader {
 public:
  // With `inputs` (the head of another case: problem and parameters), a file without /inputs
  // is read as that case's stages (a kernel's dump of stages only); its chunks then hold no
  // per-token inputs.
  CaseReader(const std::string& path, const LoadOptions& opt, bool outputs, const Case* inputs = nullptr);
  ~CaseReader();
  CaseReader(const CaseReader&) = delete;
  CaseReader& operator=(const CaseReader&) = delete;

  // The problem, parameters, sums over tokens, attributes, unknown datasets and stored types.
  const Case& head() const { return head_; }
  // Tokens [t0, t1) of the flattened token axis as a case of layout [t1 - t0], like
  // Case::token_slice: inputs, parameters and per-token stages; no sums over tokens. A stage
  // stored in another shape than the schema's comes as a shape-only tensor (no bytes), for
  // the diff to report as a format problem.
  Case chunk(int64_t t0, int64_t t1);
  // Everything, in the file's own token layout (what load_case returns).
  Case whole();

 private:
  Case read(int64_t t0, int64_t t1, bool whole);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Case head_;
};

// Whether a write failed (a full disk) and left its file open: libhdf5 1.10 cannot close such
// a file, and loops at library shutdown ("HDF5: infinite loop closing library"). A process that
// carries on after one (check --keep) ends with _Exit, past libhdf5's exit handler.
bool write_left_file_open();

// Writes the case atomically: a temporary file beside path, then renamed into place;
// without `replace`, linked into place so that of two racing writers exactly one wins.
// `announce` runs once the file is written and closed, before it is moved into place (what a
// command prints: where stdout or the disk fails, no file is left).
void save_case(const std::string& path, const Case& c, bool replace = true, const std::function<void()>& announce = {});

// Writes a case token chunk by token chunk, atomically like save_case: each dataset is
// created at its full shape when first written, per-token tensors go in by hyperslab.
class CaseWriter {
 public:
  // `head`: the problem (in its own token layout), norm_eps/hc_eps and attributes.
  CaseWriter(const std::string& path, const Case& head, bool replace);
  ~CaseWriter();
  CaseWriter(const CaseWriter&) = delete;
  CaseWriter& operator=(const CaseWriter&) = delete;

  // Every tensor of `c`: per-token ones as tokens t0.. of the flattened token axis, the
  // others (parameters, sums over tokens) whole, the first time they are seen. t0 < 0:
  // `c` is the whole case, every tensor written whole in its own shape.
  void write(const Case& c, int64_t t0);
  void finish();  // closes the file: everything is written (a full disk fails here, not later)
  void commit();  // finishes, and moves the file into place

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes datasets ("/group/name" -> tensor) to a new file, atomically like save_case; an existing
// file (one created meanwhile too) is replaced only with `replace`. before_commit runs once the
// file is complete, before it is moved into place: an error there leaves the old file as it was.
void save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& datasets, bool replace,
                  const std::function<void()>& before_commit = nullptr);

// Writes a text file (an HTML report) the same way: temporary file, then rename (before_commit
// as in save_tensors).
void save_text(const std::string& path, const std::string& text, bool replace,
               const std::function<void()>& before_commit = nullptr);

// A dataset as stored, for `inspect`; names non-float types too.
struct DatasetInfo {
  std::string path, type;
  Shape shape;
  bool is_float = false;
  bool written = true;     // false: declared, no data stored (statistics would be of fill values)
  bool partly = false;     // some chunks never written (statistics would be mostly of fill values)
  bool has_stats = false;  // wholly written float datasets up to kInspectMaxElements, read in slabs
  Stats stats;
  std::string unread;  // why it could not be listed (a virtual dataset, rank 10, 2^62 elements...); "" when listed
};
constexpr int64_t kInspectMaxElements = int64_t(1) << 28;
// Every dataset of any HDF5 file; `attrs`, when given, receives the root's string attributes.
std::vector<DatasetInfo> list_datasets(const std::string& path, std::map<std::string, std::string>* attrs = nullptr);

}  // namespace mhc
