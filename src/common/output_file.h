// output_file.h — how mhc writes an output: into a temporary file beside it, moved into
// place only when complete. Nothing partial survives an error or a termination signal;
// an input is never overwritten; without `replace`, of two racing writers exactly one wins.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <string>

namespace mhc {

// Refuses an output path that is the input or a file an input reads (note_read_file), exists
// (unless force), is not a regular file (even with force: a device node or FIFO is never
// replaced), is a symbolic link to nothing, or cannot be created.
void check_output_path(const std::string& out, const std::string& in, bool force);

// Notes a file that an input reads (the input itself, an external link's target, external raw
// storage): no output may replace it (check_output_path, OutputFile::commit).
void note_read_file(const std::string& path);

// What moving a finished file into place at path would refuse, checked now: an output that
// waits on another one's commit (diff's --report, --dump-diff) checks the other's first.
void check_commit(const std::string& path, bool replace);

class OutputFile {
 public:
  OutputFile(const std::string& path, bool replace);  // claims the temporary file's name
  ~OutputFile();                                       // removes it unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // The temporary file, created here (O_EXCL, O_NOFOLLOW: a file or link planted at its
  // predictable name is never written through) and open for writing: its descriptor.
  int create();
  // The temporary file's name, for a writer that creates it itself with exclusive creation
  // (HDF5's H5F_ACC_EXCL): absent now, so whatever is there after a failed creation (libhdf5
  // creates the file, then fails to write its superblock on a full disk) is removed too.
  const std::string& temp_to_create();
  // The temporary file as created by that writer, through its open descriptor fd.
  void created(int fd);
  void commit();  // moves the finished temporary file to path (UserError if path appeared meanwhile or is read,
                  // or the temporary file is no longer the one created)

 private:
  std::string path_, temp_;
  bool replace_, committed_ = false, creating_ = false;
  int slot_ = 0;  // the signal handler's record of the temporary file
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Installs the handler of the termination signals (SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2,
// SIGALRM, SIGQUIT, SIGXCPU, SIGPWR, SIGSTKFLT; one ignored or handled at start, as SIGHUP under nohup, stays ignored): it runs the cleanup
// set by on_termination, removes the current temporary file and exits with 128 + the signal
// number. It also ignores SIGXFSZ, so that a file-size limit is a write error (EFBIG). main()
// calls it once.
void remove_temp_on_signal();

// The termination signals, as a set: blocked around a fork.
sigset_t termination_signals();

// Termination signals held back for its lifetime: blocked in this thread, and one that another
// thread receives meanwhile is acted on (the temporary files removed, exit 128 + signal) as the
// hold ends. Steps that must not be parted by a signal (a directory made and registered; diff's
// --report and --dump-diff moved into place, both or neither) run inside one.
class HoldSignals {
 public:
  HoldSignals();
  ~HoldSignals();
  HoldSignals(const HoldSignals&) = delete;
  HoldSignals& operator=(const HoldSignals&) = delete;

 private:
  sigset_t old_;
};

// In a forked child, before exec: the termination signals' default actions back (those
// ignored stay ignored).
void default_termination_signals();

// A cleanup for the handler to run first, e.g. killing a child's process group: one at a time,
// async-signal-safe; nullptr clears it.
void on_termination(void (*cleanup)());

// Runs the cleanup and removes the temporary file being written, if any: async-signal-safe,
// for signal handlers.
void remove_temp_now();

}  // namespace mhc
