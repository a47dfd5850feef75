// support.h — helpers shared by the tests: temporary files, running the mhc binary,
// recomputing stages after a planted change.
#pragma once
#include <sys/wait.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "case.h"
#include "cpu_backend.h"
#include "diff.h"
#include "generate.h"

namespace mhc::test {

// A fresh directory under the build tree, named after the test.
inline std::string tmpdir(const std::string& name) {
  std::string dir = std::string(MHC_TEST_TMP) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct CmdResult {
  int rc = -1;
  std::string out, err;
};

// Runs a shell command; stdout and stderr captured separately.
inline CmdResult sh(const std::string& cmd) {
  static int seq = 0;
  std::string errfile = std::string(MHC_TEST_TMP) + "/stderr." + std::to_string(getpid()) + "." + std::to_string(seq++);
  std::filesystem::create_directories(MHC_TEST_TMP);
  CmdResult r;
  FILE* p = popen((cmd + " 2>" + errfile).c_str(), "r");
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), got);
  int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(errfile);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove(errfile);
  return r;
}

inline std::string mhc(const std::string& args) { return std::string(MHC_BIN) + " " + args; }
// 'text' for /bin/sh: one word, whatever it holds
inline std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char ch : text) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Recomputes, at `prec`, every stage after `from` in table order (forward, then backward
// when gradients are present), keeping `from` and everything before it as they are.
inline void recompute_after(Case& c, const std::string& from, Precision prec) {
  bool after = false;
  for (const Stage& s : stage_table()) {
    if (after && s.group != Group::inputs && (s.group == Group::forward || c.has_gradients()))
      cpu_stage_into(s.name, c.prob, c.t, prec, c.t[s.name]);
    after = after || s.name == from;
  }
}

inline Case golden(const Problem& p, uint64_t seed, Precision prec = Precision::fp32, bool grads = true) {
  Case c = generate_case(p, seed, grads);
  cpu_run(c, prec);
  return c;
}

// Runs mhc with `args` and expects a user error: status 2, one line "mhc: error: ..." that
// contains each of `what`, no `out` created, `in` unchanged, no temporary file in `dir`.
inline void expect_error(const std::string& args, const std::vector<std::string>& what, const std::string& dir,
                         const std::string& in, const std::string& out) {
  std::string before = read_bytes(in);
  auto r = sh(mhc(args));
  CAPTURE(args);
  CAPTURE(r.err);
  CHECK(r.rc == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("mhc: error: ", 0) == 0);
  for (auto& w : what) CHECK(r.err.find(w) != std::string::npos);
  CHECK(!std::filesystem::exists(out));
  CHECK(read_bytes(in) == before);
  for (auto& e : std::filesystem::directory_iterator(dir))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

// A against B under the budget measured on B's inputs.
inline DiffReport diff(const Case& a, const Case& b, const DiffOptions& opt = {}) { return diff_cases(a, b, opt); }

}  // namespace mhc::test
