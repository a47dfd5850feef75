// commands.h — one function per subcommand; each adds itself to the app and, when run,
// stores its exit status in `rc`.
#pragma once
#include <CLI/CLI.hpp>

namespace mhc {

void add_gen(CLI::App& app, int& rc);
void add_run(CLI::App& app, int& rc);
void add_inspect(CLI::App& app, int& rc);
void add_bench(CLI::App& app, int& rc);
void add_diff(CLI::App& app, int& rc);
void add_check(CLI::App& app, int& rc);

}  // namespace mhc
