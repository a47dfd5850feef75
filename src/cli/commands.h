// commands.h — one function per subcommand; each adds itself to the app and, when run,
// stores its exit status in `rc`.
#pragma once
#include <CLI/CLI.hpp>
#include <cerrno>
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

void add_gen(CLI::App& app, int& rc);
void add_run(CLI::App& app, int& rc);
void add_inspect(CLI::App& app, int& rc);
void add_bench(CLI::App& app, int& rc);
void add_diff(CLI::App& app, int& rc);
void add_check(CLI::App& app, int& rc);

}  // namespace mhc
