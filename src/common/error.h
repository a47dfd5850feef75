// error.h — the two kinds of failure mhc knows.
//
// UserError: bad input, bad arguments, missing device. main() prints its message
// as one line and exits with status 2. Throw it with fail(...).
// Internal invariants use MHC_CHECK, which names file and line.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mhc {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

// Text for one line of a terminal, also when it quotes names from a file: control characters
// escaped (\n, \t, \x1b).
inline std::string one_line(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c != 0x7f) out += char(c);
    else out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : cat("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  return out;
}

template <class... A>
[[noreturn]] void fail(const A&... a) {
  throw UserError(cat(a...));
}

}  // namespace mhc

#define MHC_CHECK(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond))                                                                     \
      throw std::logic_error(::mhc::cat(__FILE__, ":", __LINE__, ": check failed: ", \
                                        #cond, " ", ##__VA_ARGS__));                 \
  } while (0)
