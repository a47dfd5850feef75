// h5io.h — reading and writing cases in the HDF5 schema of docs/schema.md.
//
// Every failure is a UserError naming the file and dataset. Writes go to a temporary
// file in the target directory and are renamed into place, so no partial output survives.
#pragma once
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
  double memory_factor = 2;      // copies of the whole case the command holds (diff: more)
};

// Bytes mhc may allocate: MHC_MAX_MEMORY if set, else the machine's available memory.
// Cases and datasets that would need more are refused before anything is allocated.
uint64_t memory_limit();

// Reads /inputs (validated against the stage table) and, when `outputs`, every
// /forward and /backward dataset present, kept in its stored dtype and shape.
Case load_case(const std::string& path, const LoadOptions& opt, bool outputs);

// Writes the case atomically: a temporary file beside path, then renamed into place;
// without `replace`, linked into place so that of two racing writers exactly one wins.
void save_case(const std::string& path, const Case& c, bool replace = true);

// Writes datasets ("/group/name" -> tensor) to a new file, atomically like save_case.
void save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& datasets);

// Writes a text file (an HTML report) the same way: temporary file, then rename.
void save_text(const std::string& path, const std::string& text);

// A dataset as stored, for `inspect`; names non-float types too.
struct DatasetInfo {
  std::string path, type;
  Shape shape;
  bool is_float = false;
  bool written = true;     // false: declared, no data stored (statistics would be of fill values)
  bool has_stats = false;  // written float datasets up to kInspectMaxElements, read in slabs
  Stats stats;
};
constexpr int64_t kInspectMaxElements = int64_t(1) << 28;
// Every dataset of any HDF5 file; `attrs`, when given, receives the root's string attributes.
std::vector<DatasetInfo> list_datasets(const std::string& path, std::map<std::string, std::string>* attrs = nullptr);

}  // namespace mhc
