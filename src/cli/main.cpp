// main.cpp — the mhc command line: gen, run, inspect, bench, diff.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <malloc.h>
#include <unistd.h>
#include <omp.h>

#include <atomic>
#include <cerrno>
#include <exception>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "backends.h"
#include "commands.h"
#include "error.h"
#include "h5io.h"
#include "output_file.h"
#include "read_guard.h"

void mhc::flush_stdout() {
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
    fail("cannot write to standard output (", std::strerror(errno), ")");
}

namespace {

// The report is the result: one that could not be written (a full disk, a closed pipe) is an
// error, not exit 0 (inspect > /dev/full, diff --json > /dev/full, --help > /dev/full).
int written(int rc) {
  try {
    mhc::flush_stdout();
  } catch (const mhc::UserError& e) {
    std::cerr << "mhc: error: " << e.what() << "\n";
    return 2;
  }
  return rc;
}

// How many of `want` threads (this one among them) can start, at least 1.
int startable_threads(int want) {
  std::vector<pthread_t> started;
  for (int i = 1; i < want; ++i) {
    pthread_t t;
    if (pthread_create(&t, nullptr, [](void*) -> void* { return nullptr; }, nullptr) != 0) break;
    started.push_back(t);
  }
  for (pthread_t t : started) pthread_join(t, nullptr);
  return int(started.size()) + 1;
}

const char* const kOutOfMemory =
    "mhc: error: out of memory: this command needs more than the process may allocate (ulimit -v, a "
    "container's limit, other processes); MHC_MAX_MEMORY=BYTES makes streamed commands use less\n";

// The temporary output removed, `line` on stderr, exit status rc, no exit handlers.
[[noreturn]] void die(const std::string& line, int rc) {
  mhc::remove_temp_now();
  const ssize_t written = write(2, line.data(), line.size());  // where stderr is gone, the status still tells
  (void)written;
  std::_Exit(rc);
}

// An exception that leaves an OpenMP region (a worker thread's buffer under ulimit -v) ends in
// std::terminate: it aborted (exit 134) and left the temporary output (review B, session 23).
// Handled as main() handles it on its own thread: one line, the temporary file removed, exit 2
// (3 for an internal error); a second thread that gets here waits for the first one's exit.
[[noreturn]] void on_terminate() {
  static std::atomic<bool> once{false};
  if (once.exchange(true))
    for (;;) pause();
  std::string line = "mhc: internal error: std::terminate\n";
  int rc = 3;
  try {
    if (std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    line = kOutOfMemory, rc = 2;
  } catch (const mhc::UserError& e) {
    line = "mhc: error: " + mhc::one_line(e.what()) + "\n", rc = 2;
  } catch (const std::exception& e) {
    line = std::string("mhc: internal error: ") + e.what() + "\n";
  } catch (...) {
  }
  std::fflush(stdout);
  die(line, rc);
}

// Set when main returns: an exit() before that is a library's, not mhc's. libgomp calls exit(1)
// when it cannot start its threads (OMP_STACKSIZE below the minimum or beyond what memory
// allows), which diff means as "diverged" (review B, session 24): one line and exit 2 instead.
std::atomic<bool> g_returned{false};
void on_library_exit() {
  if (g_returned) return;
  die("mhc: error: a library ended the process before it finished (the OpenMP runtime could not start its threads? "
      "see OMP_STACKSIZE, OMP_NUM_THREADS, ulimit -u and -v)\n", 2);
}

int run_main(int argc, char** argv);

// OMP_STACKSIZE or GOMP_STACKSIZE below what mhc's threads need (Eigen's blocks on the stack):
// libgomp failed to start them (exit 1, "diverged") or, under AddressSanitizer, started them
// and they overflowed. "" where neither is set too small (unset or unreadable: libgomp decides).
std::string stack_too_small() {
  constexpr double kMinStack = 1 << 20;
  for (const char* name : {"OMP_STACKSIZE", "GOMP_STACKSIZE"}) {
    const char* v = std::getenv(name);
    if (!v) continue;
    char* end = nullptr;
    const double n = std::strtod(v, &end);
    if (end == v || !(n >= 0)) continue;
    while (*end == ' ') ++end;
    const char u = char(std::tolower(static_cast<unsigned char>(*end)));
    const double unit = u == 'b' ? 1 : u == 'm' ? 1 << 20 : u == 'g' ? 1 << 30 : 1024;  // K without a suffix
    if ((u == 0 || std::strchr("bkmg", u)) && n * unit < kMinStack)
      return mhc::cat(name, "=", mhc::one_line(v), " is too small for mhc's OpenMP threads (at least 1M; unset it for libgomp's default)");
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::atexit(on_library_exit);
  const int rc = run_main(argc, argv);
  g_returned = true;
  return rc;
}

namespace {

int run_main(int argc, char** argv) {
  std::set_terminate(on_terminate);
  CLI::App app{"mhc: golden CPU backend, CUDA backend and stage-by-stage diff for the mHC pre operator"};
  app.set_version_flag("--version", mhc::version_string());
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  mhc gen --shape 256,4,1024 --seed 1 in.h5\n"
      "  mhc run --backend cpu in.h5 out.h5\n"
      "  mhc diff cpu cuda --input in.h5\n"
      "  mhc diff mine.h5 cpu\n"
      "  mhc check 'exec:python3 kernel.py {in} {out}'\n");
  app.footer([] { return mhc::backend_help(); });  // asked only for --help: the cuda row looks for a GPU
  // A closed standard descriptor would be the next file opened (an output's temporary file),
  // and what mhc prints would land in it (review: warnings written at offset 0 of the HDF5
  // file with 2>&-): each gets /dev/null, stdout read-only so that printing fails as before.
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int d = open("/dev/null", fd == 2 ? O_WRONLY : O_RDONLY);
      if (d >= 0 && d != fd) dup2(d, fd), close(d);
    }
  mhc::remove_temp_on_signal();
  mhc::report_crashes_in_reads();
  // Keep freed memory for the next token chunk instead of returning it to the system:
  // fresh pages cost a fault and a zero fill each.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // OMP_NUM_THREADS=1000000 overflowed libgomp's stack in the first parallel region (a crash, or
  // "Thread creation failed" and exit 1, which diff means as "diverged"): at most 4 threads a
  // hardware thread. Any count gives the same bits.
  if (const int most = 4 * int(std::max(1u, std::thread::hardware_concurrency())); omp_get_max_threads() > most)
    omp_set_num_threads(most);
  // Under a limit on processes (ulimit -u, a cgroup's pids.max) libgomp could not start its
  // threads and ended mhc with status 1, "diverged" to diff (review B, session 22): as many as
  // can start here, each started and joined once, is the count. Any count gives the same bits.
  if (const std::string small = stack_too_small(); !small.empty()) {
    std::cerr << "mhc: error: " << small << "\n";
    return 2;
  }
  if (const int can = startable_threads(omp_get_max_threads()); can < omp_get_max_threads()) omp_set_num_threads(can);
  // A parent that ignores SIGCHLD passes that on, and the kernel then reaps an exec command
  // itself: mhc could not wait for it ("No child processes").
  signal(SIGCHLD, SIG_DFL);
  int rc = 0;
  mhc::add_gen(app, rc);
  mhc::add_run(app, rc);
  mhc::add_inspect(app, rc);
  mhc::add_bench(app, rc);
  mhc::add_diff(app, rc);
  mhc::add_check(app, rc);
  // CLI11 says "A subcommand is required" for `mhc frobnicate`: name it and the subcommands
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->get_name() == argv[1];
    }
    if (!known) {
      std::cerr << "mhc: error: unknown subcommand '" << mhc::one_line(argv[1]) << "': expected one of " << names
                << " (see mhc --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return written(app.exit(e));  // --help, --version
    std::cerr << "mhc: error: " << mhc::one_line(e.what()) << " (see mhc --help)\n";
    return 2;
  } catch (const mhc::UserError& e) {
    std::cerr << "mhc: error: " << mhc::one_line(e.what()) << "\n";
    // Outputs are committed or removed by now. Skip the exit handlers: after a failed write
    // (EFBIG) libhdf5 1.10 crashes closing the file again at library shutdown.
    std::cout.flush();
    std::cerr.flush();
    std::_Exit(2);
  } catch (const std::bad_alloc&) {  // a limit memory_limit() could not see, or an estimate too low
    std::cerr << kOutOfMemory;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mhc: internal error: " << e.what() << "\n";
    return 3;
  }
  rc = written(rc);
  if (mhc::write_left_file_open()) std::_Exit(rc);  // past libhdf5's shutdown, which would loop on that file
  return rc;
}

}  // namespace
