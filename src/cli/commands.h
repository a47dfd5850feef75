// commands.h — one function per subcommand; each adds itself to the app and, when run,
// stores its exit status in `rc`.
#pragma once
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace mhc {

// --seed: decimal digits that fit 64 bits (CLI11 alone wrapped -1 to 2^64-1 and saturated 2^64).
inline const CLI::Validator kSeed(
    [](std::string& s) -> std::string {
      errno = 0;
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos ||
          (std::strtoull(s.c_str(), nullptr, 10), errno == ERANGE))
        return "expected an integer from 0 to 2^64-1";
      return "";
    },
    "UINT64");

// A number: > 0 (kPositive) or >= 0 (kNonNegative), and finite (CLI11's PositiveNumber took
// nan: --timeout nan ran a hanging command for ever).
inline CLI::Validator finite_number(bool zero) {
  return CLI::Validator(
      [zero](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s.c_str(), &end);
        if (!s.empty() && !*end && errno == ERANGE) return "out of the range of a double's normal numbers";
        if (s.empty() || *end || !std::isfinite(v) || !(zero ? v >= 0 : v > 0))
          return zero ? "expected a finite number >= 0" : "expected a finite number > 0";
        return "";
      },
      zero ? "NUMBER>=0" : "NUMBER>0");
}
inline const CLI::Validator kPositive = finite_number(false), kNonNegative = finite_number(true);

// A whole number > 0 that fits 63 bits (CLI11's PositiveNumber printed "not in range 0.000000 to"
// a 309-digit number for --chunk 0).
inline const CLI::Validator kCount(
    [](std::string& s) -> std::string {
      errno = 0;
      const long long v = std::strtoll(s.c_str(), nullptr, 10);
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE || v == 0)
        return "expected a whole number from 1 to 2^63-1";
      return "";
    },
    "INT>0");

// Flushes what a command printed, and fails (UserError) where standard output cannot take it (a
// full disk, a closed descriptor): called before an output is moved into place, so that a
// command that fails leaves no file.
void flush_stdout();

void add_gen(CLI::App& app, int& rc);
void add_run(CLI::App& app, int& rc);
void add_inspect(CLI::App& app, int& rc);
void add_bench(CLI::App& app, int& rc);
void add_diff(CLI::App& app, int& rc);
void add_check(CLI::App& app, int& rc);

}  // namespace mhc
