// backend_exec.cpp — exec:COMMAND, the user's own program as a backend: mhc writes the
// case's inputs to a temporary HDF5 file, runs COMMAND through /bin/sh with {in} and {out}
// standing for the two paths, and reads the stages the program dumps to {out}.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "backends.h"
#include "h5io.h"
#include "output_file.h"

namespace mhc {
namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// COMMAND with {in} and {out} replaced by the variables MHC_IN and MHC_OUT (set for the command):
// "quoted" outside quotes, bare inside "...", and inside '...' as '"$MHC_IN"', which closes the
// quote around the variable, so that the word holds the path itself (python3 -c '..."{in}"...').
// The shell expands a variable's value without reading it as code: a path written into the
// command had been, where this scan cannot follow the shell's quoting (inside "$( .. "{in}" .. )",
// review B, session 22; after an apostrophe in a comment, review B, session 24: a TMPDIR holding
// $(..) ran). A scan that is wrong now breaks the command's quoting, never runs a path. Comments
// (# at a word's start, outside quotes) are copied as they are.
std::string substitute(const std::string& command) {
  std::string r;
  char quote = 0;  // the quoting the scan is inside: 0, '\'' or '"'
  for (size_t i = 0; i < command.size();) {
    const bool is_in = command.compare(i, 4, "{in}") == 0, is_out = command.compare(i, 5, "{out}") == 0;
    if (is_in || is_out) {
      const char* var = is_in ? "$MHC_IN" : "$MHC_OUT";
      r += quote == '\'' ? cat("'\"", var, "\"'") : quote == 0 ? cat("\"", var, "\"") : std::string(var);
      i += is_in ? 4 : 5;
      continue;
    }
    const char ch = command[i];
    if (quote == 0 && ch == '#' && (i == 0 || std::strchr(" \t\n;&|()", command[i - 1]))) {  // a comment, to the line's end
      const size_t end = std::min(command.find('\n', i), command.size());
      r += command.substr(i, end - i), i = end;
      continue;
    }
    if (ch == '\\' && quote != '\'' && i + 1 < command.size()) {  // an escaped character: no quote
      r += command.substr(i, 2), i += 2;
      continue;
    }
    if (quote == 0 && (ch == '\'' || ch == '"')) quote = ch;
    else if (quote == ch) quote = 0;
    r += ch, ++i;
  }
  return r;
}

// While a command runs, a termination signal must not leave it running nor leave its
// temporary directory (a full copy of the inputs) behind: for the directory's lifetime the
// handler of output_file.cpp first runs cleanup(), which kills the command's process group and
// removes the directory. Everything it touches is async-signal-safe.
char g_dir[4096];  // the temporary directory
volatile sig_atomic_t g_have_dir = 0;
volatile sig_atomic_t g_group = 0;  // the running command's process group, 0 when none

// Removes `name` (relative to the directory open as `at`) and everything under it with
// system calls only: opendir/readdir and std::filesystem are not async-signal-safe.
void remove_tree(int at, const char* name, int depth) {
  if (unlinkat(at, name, 0) == 0 || errno != EISDIR) return;  // a file, or gone
  int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    alignas(dirent64) char buf[1024];  // 64 levels deep: 64 KiB of the handler's stack (16 left a deeper tree; review B, session 24)
    for (ssize_t n; depth < 64 && (n = getdents64(fd, buf, sizeof buf)) > 0;)
      for (ssize_t off = 0; off < n; off += reinterpret_cast<dirent64*>(buf + off)->d_reclen) {
        const char* entry = reinterpret_cast<dirent64*>(buf + off)->d_name;
        if (std::strcmp(entry, ".") != 0 && std::strcmp(entry, "..") != 0) remove_tree(fd, entry, depth + 1);
      }
    close(fd);
  }
  unlinkat(at, name, AT_REMOVEDIR);
}

// The pid of /proc/<name>/stat's process if its parent is `parent`, else 0 (system calls only).
pid_t child_of(int proc, const char* name, pid_t parent) {
  pid_t pid = 0;
  for (const char* c = name; *c; ++c)
    if (*c < '0' || *c > '9' || pid > 100000000) return 0;
    else pid = pid * 10 + (*c - '0');
  char path[32], stat[512];
  size_t len = 0;
  for (const char* c = name; *c;) path[len++] = *c++;
  for (const char* c = "/stat"; *c;) path[len++] = *c++;
  path[len] = '\0';
  const int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = read(fd, stat, sizeof stat - 1);
  close(fd);
  if (n <= 0) return 0;
  const char* p = stat + n;  // "pid (comm) S ppid ...": comm may hold ')' and spaces, the last ')' ends it
  while (p > stat && p[-1] != ')') --p;
  if (p == stat || p + 3 >= stat + n) return 0;
  p += 3;  // past " S "
  pid_t ppid = 0;
  for (; p < stat + n && *p >= '0' && *p <= '9'; ++p) ppid = ppid * 10 + (*p - '0');
  return ppid == parent ? pid : 0;
}

// Kills (SIGKILL) every child of mhc, and returns how many there were (zombies too). While a
// command runs mhc is its subreaper (PR_SET_CHILD_SUBREAPER), so a descendant that left the
// command's process group (setsid) is reparented to mhc once its parent ends, not to init, and
// is found here in a pass after its parent's death. System calls only (the termination handler
// calls it).
int kill_children() {
  const int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return 0;
  int found = 0;
  alignas(dirent64) char buf[4096];
  for (ssize_t n; (n = getdents64(proc, buf, sizeof buf)) > 0;)
    for (ssize_t off = 0; off < n; off += reinterpret_cast<dirent64*>(buf + off)->d_reclen)
      if (pid_t pid = child_of(proc, reinterpret_cast<dirent64*>(buf + off)->d_name, getpid()); pid > 0)
        kill(pid, SIGKILL), ++found;
  close(proc);
  return found;
}

void cleanup() {
  if (pid_t group = g_group; group > 0) kill(-group, SIGKILL);
  // a few passes for the descendants outside the group: each is reparented once its parent died
  for (int pass = 0; pass < 4 && kill_children() > 0; ++pass) {
    const timespec pause{0, 5'000'000};
    nanosleep(&pause, nullptr);
  }
  if (g_have_dir) remove_tree(AT_FDCWD, g_dir, 0);
}

// Kills and reaps whatever of the command's descendants outlived its process group (setsid),
// once the command's shell is reaped, for up to 2 s: one that forks as fast as it is killed is
// left then. mhc has no other children then, and with none left (ECHILD, the common case) /proc
// is not read: its calls would vary with the processes on the machine.
void kill_strays() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {
    const pid_t reaped = waitpid(-1, nullptr, WNOHANG);
    if (reaped < 0 && errno != EINTR) return;  // no child left
    if (reaped == 0) {  // children running: kill them, and reap them next
      kill_children();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

// mhc as the subreaper of the command's descendants (kill_children) while this lives.
struct Subreaper {
  Subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~Subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

// A new directory $TMPDIR/mhc-exec-XXXXXX (/tmp without TMPDIR) in `path`: "" when made, else why not.
std::string make_temp_dir(std::string& path) {
  const char* base = std::getenv("TMPDIR");
  path = cat(base && *base ? base : "/tmp", "/mhc-exec-XXXXXX");
  if (mkdtemp(path.data())) return "";
  return cat("cannot create a temporary directory in ", base && *base ? cat("TMPDIR=", base) : std::string("/tmp"), " (",
             std::strerror(errno), ")");
}

// Gives the owner every permission on directory `dir` and those under it, so that it can be
// removed: as another user than root, a command's chmod 000 left the copy of the inputs behind.
void open_up(const std::filesystem::path& dir, int depth = 0) {
  std::error_code ec;
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
  if (depth < 64)
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.is_directory(ec) && !e.is_symlink(ec)) open_up(e.path(), depth + 1);
}

// A temporary directory, removed with everything in it when this goes out of scope or a
// termination signal ends mhc.
struct TempDir {
  std::string path;
  TempDir() {
    HoldSignals held;
    if (std::string why = make_temp_dir(path); !why.empty()) fail("exec: ", why);
    MHC_CHECK(path.size() < sizeof g_dir && !g_have_dir, "one exec command at a time");
    std::memcpy(g_dir, path.c_str(), path.size() + 1);
    g_have_dir = 1;
    on_termination(cleanup);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);  // a signal meanwhile finishes the removal itself
    if (ec) open_up(path), std::filesystem::remove_all(path, ec);  // the command made a directory unreadable
    g_have_dir = 0;
    on_termination(nullptr);
  }
};

// True once `pid` has exited, without reaping it: until it is reaped its pid, which is also
// its process group's id, cannot be reused, so that killing the group hits nothing else.
bool exited(pid_t pid, const std::string& shown) {
  siginfo_t info{};
  while (waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    kill(-pid, SIGKILL);
    g_group = 0;
    fail("exec: waiting for '", shown, "': ", std::strerror(err));
  }
  return info.si_pid == pid;
}

// Runs `command` through /bin/sh in a process group of its own (the shell, the program and
// anything they start), its stdout joined to mhc's stderr (mhc's stdout stays its report), its
// stdin /dev/null; fails on a non-zero exit, a signal or a timeout. Whatever of the group is
// still running when the shell ends or times out is killed: nothing the command started outlives it.
void run_command(const std::string& shown, const std::string& command, double timeout) {
  std::fflush(nullptr);
  // Termination signals wait until the group is registered for the handler (and, in the
  // child, until it has the default handlers back).
  const sigset_t term = termination_signals();
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &term, &old);
  Subreaper subreaper;  // a descendant that leaves the group is reparented to mhc, and killed by kill_strays
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    default_termination_signals();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    dup2(2, 1);
    // stdin from /dev/null: the group is never the terminal's foreground, so a command that read
    // the terminal (input(), a breakpoint) was stopped by SIGTTIN and mhc waited out --timeout
    // (review B, session 24); now it reads end of file
    if (int null = open("/dev/null", O_RDONLY | O_CLOEXEC); null >= 0) dup2(null, 0);
    close_range(3, ~0u, 0);  // nothing else of mhc's: libhdf5's open input took descriptors under ulimit -n
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const int fork_errno = errno;
  if (pid > 0) {
    setpgid(pid, pid);  // also here: the group exists before anything kills it (EACCES once it ran exec: done then)
    g_group = pid;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) fail("exec: cannot start '", shown, "': ", std::strerror(fork_errno));
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  bool timed_out = false;
  while (!exited(pid, shown)) {
    if (elapsed() > timeout) {  // SIGTERM first, for the program to clean up; a second later SIGKILL
      timed_out = true;
      kill(-pid, SIGTERM);
      // the whole second: the shell ends at once on SIGTERM, which says nothing of the program
      std::this_thread::sleep_for(std::chrono::seconds(1));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(-pid, SIGKILL);
  g_group = 0;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  kill_strays();
  if (timed_out) fail("exec: '", shown, "' did not finish within ", timeout, " s (--timeout)");
  if (WIFSIGNALED(status)) fail("exec: '", shown, "' was killed by signal ", WTERMSIG(status));
  if (WEXITSTATUS(status) == 127) fail("exec: '", shown, "' exited with status 127 (command not found?)");
  if (WEXITSTATUS(status) != 0) fail("exec: '", shown, "' exited with status ", WEXITSTATUS(status));
}

// The program's stages in the schema's shapes and in dtypes that hold their values: run
// would write anything else into its output as it is, and the code after it indexes a
// per-token stage by token as size / T.
void check_dump(const Case& c, const std::string& command) {
  std::vector<std::string> names;  // the stages read, and those left unread for their shape
  for (const auto& [name, t] : c.t) names.push_back(name);
  for (const auto& [name, how] : c.misshapen) names.push_back(name);
  for (const std::string& name : names)
    if (const Stage& s = stage(name); s.group != Group::inputs)
      if (std::string how = c.storage_problem(s); !how.empty())
        fail("exec: the dump '", command, "' wrote is not usable: {out}: ", dataset_path(s), " is stored ", how);
}

void exec_run(const BackendSpec& spec, Case& c, Pass pass, bool) {
  const std::string& command = spec.arg;
  TempDir dir;
  const std::string in = dir.path + "/in.h5", out = dir.path + "/out.h5";
  Case inputs = c.inputs_only();
  if (pass == Pass::fwd)
    for (auto& g : gradient_inputs()) inputs.t.erase(g);
  const Tensor& gamma = inputs.get("gamma");  // all ones: left out, the schema's default
  bool ones = true;
  for (int64_t i = 0; i < gamma.size() && ones; ++i) ones = gamma.at(i) == 1.0;
  if (ones) inputs.t.erase("gamma");
  save_case(in, inputs);
  if (setenv("MHC_IN", in.c_str(), 1) != 0 || setenv("MHC_OUT", out.c_str(), 1) != 0)
    fail("exec: cannot set MHC_IN and MHC_OUT for '", command, "' (", std::strerror(errno), ")");
  run_command(command, substitute(command), spec.timeout);
  std::error_code ec;  // a loop of links at {out}, or a directory made unreadable: not an internal error
  const bool wrote = std::filesystem::exists(out, ec);
  if (ec) fail("exec: cannot read {out} after '", command, "' ran: ", ec.message());
  if (!wrote) fail("exec: '", command, "' exited with status 0 but wrote no {out} file");
  int before = int(c.t.size());
  try {
    load_stages(out, c);
  } catch (const UserError& e) {
    fail("exec: the dump '", command, "' wrote is not usable: ", replace_all(e.what(), out, "{out}"));
  }
  check_dump(c, command);
  if (int(c.t.size()) == before && c.unknown.empty())
    fail("exec: '", command, "' wrote no stage to {out} (expected datasets such as /forward/h_mix; docs/schema.md)");
  c.attrs["backend"] = "exec";
  c.attrs["command"] = command;
}

}  // namespace

Backend exec_backend() {
  Backend b;
  b.name = "exec";
  b.usage = "exec:COMMAND";
  b.what = "your program: COMMAND (run by /bin/sh) reads {in} and writes its stages to {out}";
  b.precisions = {Precision::fp32};
  b.takes_argument = true;
  b.bad_argument = [](const std::string& command) -> std::string {
    if (command.find("{in}") != std::string::npos && command.find("{out}") != std::string::npos) return "";
    return "the command must name {in} (the inputs mhc writes) and {out} (the dump it reads), e.g. "
           "exec:'python3 kernel.py {in} {out}'";
  };
  b.unavailable = [] {  // checked once before a command runs: check counted a bad TMPDIR as every case failing
    HoldSignals held;
    std::string path, why = make_temp_dir(path);
    if (why.empty()) rmdir(path.c_str());
    return why;
  };
  b.run = exec_run;
  b.device = [](const BackendSpec& s) { return cat("your program (", s.arg, ")"); };
  return b;
}

}  // namespace mhc
