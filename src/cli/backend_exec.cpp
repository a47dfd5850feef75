// backend_exec.cpp — exec:COMMAND, the user's own program as a backend: mhc writes the
// case's inputs to a temporary HDF5 file, runs COMMAND through /bin/sh with {in} and {out}
// replaced by the two paths, and reads the stages the program dumps to {out}.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "backends.h"
#include "h5io.h"

namespace mhc {
namespace {

// 'text' for /bin/sh.
std::string quoted(const std::string& text) {
  std::string q = "'";
  for (char ch : text) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// A temporary directory, removed with everything in it when this goes out of scope.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = cat(base && *base ? base : "/tmp", "/mhc-exec-XXXXXX");
    if (!mkdtemp(pattern.data())) fail("exec: cannot create a temporary directory in ", pattern, ": ", std::strerror(errno));
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Runs `command` through /bin/sh, its stdout joined to mhc's stderr (mhc's stdout stays its
// report); fails on a non-zero exit, a signal or a timeout.
void run_command(const std::string& shown, const std::string& command, double timeout) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) fail("exec: cannot start '", shown, "': ", std::strerror(errno));
  if (pid == 0) {
    dup2(2, 1);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) fail("exec: waiting for '", shown, "': ", std::strerror(errno));
    if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(timeout)) {
      kill(pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail("exec: '", shown, "' did not finish within ", timeout, " s (--timeout)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFSIGNALED(status)) fail("exec: '", shown, "' was killed by signal ", WTERMSIG(status));
  if (WEXITSTATUS(status) == 127) fail("exec: '", shown, "' exited with status 127 (command not found?)");
  if (WEXITSTATUS(status) != 0) fail("exec: '", shown, "' exited with status ", WEXITSTATUS(status));
}

void exec_run(const BackendSpec& spec, Case& c, Pass pass, bool) {
  const std::string& command = spec.arg;
  if (command.find("{in}") == std::string::npos || command.find("{out}") == std::string::npos)
    fail("exec:", command, ": the command must name {in} (the inputs mhc writes) and {out} (the dump it reads), e.g. ",
         "exec:'python3 kernel.py {in} {out}'");
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
  run_command(command, replace_all(replace_all(command, "{in}", quoted(in)), "{out}", quoted(out)), spec.timeout);
  if (!std::filesystem::exists(out)) fail("exec: '", command, "' exited with status 0 but wrote no {out} file");
  int before = int(c.t.size());
  try {
    load_stages(out, c);
  } catch (const UserError& e) {
    fail("exec: the dump '", command, "' wrote is not usable: ", replace_all(e.what(), out, "{out}"));
  }
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
  b.unavailable = [] { return std::string(); };
  b.run = exec_run;
  b.device = [](const BackendSpec& s) { return cat("your program (", s.arg, ")"); };
  return b;
}

}  // namespace mhc
