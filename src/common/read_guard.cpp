#include "read_guard.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

#include "error.h"
#include "output_file.h"

namespace mhc {
namespace {

std::atomic<const char*> g_reading{nullptr};  // the file HDF5 is reading, or nullptr
static_assert(std::atomic<const char*>::is_always_lock_free, "read from a signal handler");

void say(const char* s) {  // async-signal-safe
  size_t n = 0;
  while (s[n]) ++n;
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= size_t(w);
  }
}

void on_crash(int sig, siginfo_t* info, void*) {
  const char* file = g_reading.load();
  if (file == nullptr || info->si_code <= 0) {  // not inside a read, or sent by kill(): the
    raise(sig);                                 // default action (SA_RESETHAND restored it)
    return;
  }
  remove_temp_now();
  say("mhc: error: ");
  say(file);
  say(sig == SIGBUS ? ": corrupt HDF5 structure: the HDF5 library crashed reading it (SIGBUS)\n"
                    : ": corrupt HDF5 structure: the HDF5 library crashed reading it (SIGSEGV)\n");
  _exit(2);
}

}  // namespace

ReadingFile::ReadingFile(const std::string& path) : shown_(one_line(path)), outer_(g_reading.exchange(shown_.c_str())) {}
ReadingFile::~ReadingFile() { g_reading.store(outer_); }

void report_crashes_in_reads() {
#ifndef __SANITIZE_ADDRESS__
  struct sigaction sa{};
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS}) sigaction(sig, &sa, nullptr);
#endif
}

}  // namespace mhc
