// output_file.h — how mhc writes an output: into a temporary file beside it, moved into
// place only when complete. Nothing partial survives an error or SIGINT/SIGTERM/SIGHUP;
// an input is never overwritten; without `replace`, of two racing writers exactly one wins.
#pragma once
#include <string>

namespace mhc {

// Refuses an output path that is the input, exists (unless force), is not a regular file
// (even with force: a device node or FIFO is never replaced), or cannot be created.
void check_output_path(const std::string& out, const std::string& in, bool force);

class OutputFile {
 public:
  OutputFile(const std::string& path, bool replace);  // claims the temporary file's name
  ~OutputFile();                                       // removes it unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& temp() const { return temp_; }
  void commit();  // moves the finished temporary file to path (UserError if path appeared meanwhile)

 private:
  std::string path_, temp_;
  bool replace_, committed_ = false;
};

// Installs the SIGINT/SIGTERM/SIGHUP handler that removes the current temporary file and
// exits with 128 + the signal number, and ignores SIGXFSZ so that a file-size limit is a
// write error (EFBIG). main() calls it once.
void remove_temp_on_signal();

// Removes the temporary file being written, if any: async-signal-safe, for signal handlers.
void remove_temp_now();

}  // namespace mhc
