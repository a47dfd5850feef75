// read_guard.h — a crash inside the HDF5 library while it reads a user's file is that file's
// fault: libhdf5 1.10 follows corrupt B-tree nodes and attribute messages into unmapped memory
// (tests/fuzz/repro/README; h5py dies on the same files). While a ReadingFile is alive, a
// SIGSEGV or SIGBUS is reported as bad input: one line naming the file, exit status 2, the
// temporary output removed. A crash anywhere else stays a crash: a bug in mhc must not pass
// for a bad file.
#pragma once
#include <string>

namespace mhc {

// Marks, for its lifetime, that HDF5 is reading `path`. Nests: the innermost file is the one
// named (one_line: a name with a newline had made the message two lines; review B, session 24).
class ReadingFile {
 public:
  explicit ReadingFile(const std::string& path);
  ~ReadingFile();
  ReadingFile(const ReadingFile&) = delete;
  ReadingFile& operator=(const ReadingFile&) = delete;

 private:
  std::string shown_;
  const char* outer_;
};

// Installs the SIGSEGV/SIGBUS handler; main() calls it once. Not in AddressSanitizer builds,
// whose own report of the crash is what the fuzzer reads (tests/fuzz).
void report_crashes_in_reads();

}  // namespace mhc
