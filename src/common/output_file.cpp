#include "output_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

#include "error.h"

namespace mhc {
namespace {

// The temporary files being written, for the signal handler (at most two at a time: diff's
// --dump-diff waits, finished, while its --report is written), and the cleanup it runs first.
constexpr int kTempSlots = 2;
char g_temp[kTempSlots][4096];
volatile sig_atomic_t g_have_temp[kTempSlots] = {};
void (*volatile g_cleanup)() = nullptr;

// Every signal whose default action ends the process and that another process, the terminal or
// a resource limit sends (SIGXCPU: `ulimit -t`, as batch schedulers set); not the faults of the
// process itself (SIGSEGV, SIGBUS: read_guard.h), nor SIGXFSZ, which is ignored (below), nor
// SIGPROF and SIGVTALRM, a sampling profiler's timers.
constexpr int kTermSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGQUIT, SIGXCPU, SIGPWR, SIGSTKFLT};

// Records `temp` for the signal handler: its slot, or -1 where none is free or the name is too long.
int claim_slot(const std::string& temp) {
  if (temp.size() >= sizeof g_temp[0]) return -1;
  for (int i = 0; i < kTempSlots; ++i)
    if (!g_have_temp[i]) {
      std::memcpy(g_temp[i], temp.c_str(), temp.size() + 1);
      g_have_temp[i] = 1;
      return i;
    }
  return -1;
}
void release_slot(int slot) {
  if (slot >= 0) g_have_temp[slot] = 0;
}

// Holds (HoldSignals) in force, and the signal that came meanwhile.
volatile sig_atomic_t g_holds = 0, g_held_signal = 0;

void on_signal(int sig) {
  if (g_holds > 0) {
    g_held_signal = sig;
    return;
  }
  remove_temp_now();
  _exit(128 + sig);
}

// The files inputs read, by name: compared by (device, inode) when an output is checked, so that
// a file removed since (a check case's temporary) and its inode reused is no match.
std::vector<std::string> g_read;

void refuse_read_file(const std::string& out) {
  struct stat so, sr;
  if (stat(out.c_str(), &so) == 0)
    for (const std::string& read : g_read)
      if (stat(read.c_str(), &sr) == 0 && so.st_dev == sr.st_dev && so.st_ino == sr.st_ino)
        fail(out, ": an input reads this file (", read,
             ", itself or through an external link or external storage); refusing to overwrite it");
}

std::string parent_dir(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "." : pos == 0 ? "/" : path.substr(0, pos);
}

std::string temp_path(const std::string& path) {
  auto pos = path.rfind('/');
  std::string base = pos == std::string::npos ? path : path.substr(pos + 1);
  // at most 200 bytes of the name: a 250-byte output name failed as "File name too long" for the
  // temporary's longer one
  // and a random part: one left by a process killed with SIGKILL whose pid came back blocked
  // every write of the same name (review B, session 22)
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r) r = uint32_t(std::chrono::steady_clock::now().time_since_epoch().count());
  char tag[16];
  std::snprintf(tag, sizeof tag, "%08x", r);
  return cat(parent_dir(path), "/.", base.substr(0, 200), ".tmp", getpid(), ".", tag);
}

// An output that is a symbolic link to an existing file is written to that file: the temporary
// beside it, then renamed onto it (renamed onto the link, it replaced the link and left its
// target as it was).
std::string target_of(const std::string& out) {
  struct stat sl;
  char real[PATH_MAX];
  if (lstat(out.c_str(), &sl) == 0 && S_ISLNK(sl.st_mode) && realpath(out.c_str(), real)) return real;
  return out;
}

void refuse_special(const std::string& out) {
  struct stat so, st;
  if (lstat(out.c_str(), &so) != 0) return;
  if (S_ISLNK(so.st_mode) && stat(out.c_str(), &st) != 0)
    fail(out, ": a symbolic link to nothing (", std::strerror(errno), "); refusing to write through or replace it");
  if (S_ISDIR(so.st_mode)) fail(out, ": is a directory, expected an output file name");
  if (!S_ISREG(so.st_mode) && !S_ISLNK(so.st_mode))
    fail(out, ": exists and is not a regular file (a device, FIFO or socket); refusing to replace it");
}

}  // namespace

void note_read_file(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && std::find(g_read.begin(), g_read.end(), path) == g_read.end())
    g_read.push_back(path);
}

void check_output_path(const std::string& path, const std::string& in, bool force) {
  if (path.empty()) fail("an empty output file name");  // it ran the whole case, then could not move the result
  refuse_special(path);
  const std::string out = target_of(path);
  struct stat so, si;
  if (stat(out.c_str(), &so) == 0) {
    if (!in.empty() && stat(in.c_str(), &si) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino)
      fail(out, ": output is the input file; refusing to overwrite it");
    refuse_read_file(out);
    refuse_special(out);
    if (!S_ISREG(so.st_mode)) fail(out, ": exists and is not a regular file; refusing to replace it");
    if (!force) fail(out, ": exists (use --force to replace it)");
  }
  std::string dir = parent_dir(out);
  struct stat sd;
  if (stat(dir.c_str(), &sd) != 0 || !S_ISDIR(sd.st_mode)) fail(out, ": directory ", dir, " does not exist");
  // the name itself, which the probe (a temporary name cut short) does not try: one past the file
  // system's limit failed only when the finished file was moved into place
  const std::string name = out.substr(out.rfind('/') + 1);
  if (const long most = pathconf(dir.c_str(), _PC_NAME_MAX); most > 0 && name.size() > size_t(most))
    fail(out.substr(0, 80), "...: the file name is ", name.size(), " bytes long, more than the ", most, " its file system allows");
  // the probe, a file of a moment, is known to the signal handler as an output's temporary file is
  // (a signal between its creation and its removal left it; review B, session 24)
  const std::string probe = temp_path(out);
  const int slot = claim_slot(probe);
  int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  const int err = errno;
  if (fd >= 0) close(fd), unlink(probe.c_str());
  release_slot(slot);
  if (fd < 0) fail(out, ": cannot create files in ", dir, ": ", std::strerror(err));
}

void check_commit(const std::string& path, bool replace) {
  const std::string out = target_of(path);
  refuse_special(out);
  refuse_read_file(out);
  struct stat st;
  if (!replace && lstat(out.c_str(), &st) == 0) fail(out, ": exists (created meanwhile by another process?); use --force to replace it");
}

OutputFile::OutputFile(const std::string& path, bool replace)
    : path_(target_of(path)), temp_(temp_path(path_)), replace_(replace) {
  if (temp_.size() >= sizeof g_temp[0])
    fail(path_, ": the temporary file's name beside it would be ", temp_.size(), " bytes long, more than ",
         sizeof g_temp[0] - 1, "; choose a shorter output path");
  slot_ = claim_slot(temp_);
  MHC_CHECK(slot_ >= 0, "at most ", kTempSlots, " outputs at a time");
}

OutputFile::~OutputFile() {
  if (!committed_ && (ino_ != 0 || creating_)) unlink(temp_.c_str());  // only what this process created
  release_slot(slot_);
}

int OutputFile::create() {
  int fd = open(temp_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail(path_, ": cannot create the temporary file ", temp_, ": ", std::strerror(errno));
  created(fd);
  return fd;
}

const std::string& OutputFile::temp_to_create() {
  struct stat st;
  if (lstat(temp_.c_str(), &st) == 0) fail(path_, ": the temporary file ", temp_, " exists already; nothing written");
  creating_ = true;
  return temp_;
}

void OutputFile::created(int fd) {
  struct stat st;
  MHC_CHECK(fstat(fd, &st) == 0, "fstat of ", temp_);
  dev_ = st.st_dev, ino_ = st.st_ino;
}

void OutputFile::commit() {
  // the temporary file is still the one written: renamed, a link planted in its place (another
  // process with write access to the directory) would become the output
  struct stat st;
  if (ino_ == 0 || lstat(temp_.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev_ || st.st_ino != ino_)
    fail(path_, ": the temporary file ", temp_, " was removed or replaced while it was written; nothing written");
  check_commit(path_, replace_);
  int rc;
  if (replace_) {
    rc = rename(temp_.c_str(), path_.c_str());
  } else {
    // no clobber: link() fails with EEXIST if another writer got there first
    rc = link(temp_.c_str(), path_.c_str());
    // EPERM, EOPNOTSUPP: no hard links there; ENOSPC, EMLINK: no room for one more link (a full
    // inode table refused a finished run that --force wrote; review B, session 22)
    if (rc != 0 && (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSPC || errno == EMLINK))
      rc = int(syscall(SYS_renameat2, AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), 1 /* RENAME_NOREPLACE */));
    if (rc != 0 && errno == EEXIST) fail(path_, ": exists (created meanwhile by another process?); use --force to replace it");
  }
  if (rc != 0) fail(path_, ": cannot move the finished file into place: ", std::strerror(errno));
  if (!replace_) unlink(temp_.c_str());  // after link(); a no-op after renameat2
  committed_ = true;
}

void remove_temp_now() {
  if (void (*cleanup)() = g_cleanup) cleanup();
  for (int i = 0; i < kTempSlots; ++i)
    if (g_have_temp[i]) unlink(g_temp[i]);
}

sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kTermSignals) sigaddset(&set, sig);
  return set;
}

HoldSignals::HoldSignals() {
  const sigset_t term = termination_signals();
  pthread_sigmask(SIG_BLOCK, &term, &old_);
  g_holds = g_holds + 1;
}

HoldSignals::~HoldSignals() {
  g_holds = g_holds - 1;
  if (int sig = g_held_signal; g_holds == 0 && sig != 0) on_signal(sig);
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // one pending in this thread is taken now
}

void remove_temp_on_signal() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sa.sa_mask = termination_signals();  // one cleanup at a time
  for (int sig : kTermSignals) {  // only where the default action holds: nohup stays nohup, a preloaded tool's handler stays
    struct sigaction now{};
    if (sigaction(sig, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL)
      sigaction(sig, &sa, nullptr);
  }
  signal(SIGXFSZ, SIG_IGN);  // past a file-size limit, write() fails with EFBIG: an error, not a kill
}

void default_termination_signals() {
  for (int sig : kTermSignals) {
    struct sigaction now{};
    if (sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_IGN) signal(sig, SIG_DFL);
  }
}

void on_termination(void (*cleanup)()) {
  MHC_CHECK(!cleanup || !g_cleanup, "one termination cleanup at a time");
  g_cleanup = cleanup;
}

}  // namespace mhc
