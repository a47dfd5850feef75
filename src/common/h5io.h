// h5io.h — reading and writing cases in the HDF5 schema of docs/schema.md.
//
// Every failure is a UserError naming the file and dataset. Writes go to a temporary
// file in the target directory and are renamed into place, so no partial output survives.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "case.h"

namespace mhc {

struct LoadOptions {
  bool strict = false;           // values that need rounding to the input dtype are an error
  bool allow_nonfinite = false;  // NaN/Inf in inputs are an error unless set
  bool quiet = false;            // no rounding warnings on stderr
};

// Reads /inputs (validated against the stage table) and, when `outputs`, every
// /forward and /backward dataset present, kept in its stored dtype and shape.
Case load_case(const std::string& path, const LoadOptions& opt, bool outputs);

// Refuses an output path that is the input, exists (unless force), or cannot be
// created; probes by creating and removing a file in the target directory.
void check_output_path(const std::string& out, const std::string& in, bool force);

// Writes the case atomically (temporary file + rename).
void save_case(const std::string& path, const Case& c);

// Writes datasets ("/group/name" -> tensor) to a new file, atomically like save_case.
void save_tensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& datasets);

// Writes a text file (an HTML report) the same way: temporary file, then rename.
void save_text(const std::string& path, const std::string& text);

// A dataset as stored, for `inspect`; names non-float types too.
struct DatasetInfo {
  std::string path, type;
  Shape shape;
  bool is_float = false;
  Tensor values;  // read as float64 when is_float
};
// Every dataset of any HDF5 file; `attrs`, when given, receives the root's string attributes.
std::vector<DatasetInfo> list_datasets(const std::string& path, std::map<std::string, std::string>* attrs = nullptr);

}  // namespace mhc
