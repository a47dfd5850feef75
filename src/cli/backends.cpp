#include "backends.h"

#include "version.h"

namespace mhc {

const std::vector<Backend>& backend_table() {
  static const std::vector<Backend> table = {cpu_backend(), cuda_backend(), exec_backend()};
  return table;
}

const std::string& BackendSpec::name() const { return backend->name; }

std::string BackendSpec::str() const {
  if (backend->takes_argument) return cat(name(), ":", arg);
  return backend->precisions.size() > 1 ? cat(name(), ":", precision_name(prec)) : name();
}

std::string backend_names() {
  std::string s;
  for (const Backend& b : backend_table()) s += cat(s.empty() ? "" : ", ", b.usage);
  return s;
}

std::string backend_help() {
  std::string s = "Backends:\n";
  for (const Backend& b : backend_table()) {
    std::string why = b.unavailable();
    s += cat("  ", b.usage, std::string(b.usage.size() < 26 ? 26 - b.usage.size() : 1, ' '), b.what,
             why.empty() ? "" : cat(" [unavailable here: ", why, "]"), "\n");
  }
  return s;
}

namespace {

// The row and the rest of a spec, or nullptr when no row has that name.
const Backend* find_backend(const std::string& text, std::string& rest) {
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  for (const Backend& b : backend_table())
    if (b.name == name) return &b;
  return nullptr;
}

// The spec, or "" with `why` set.
bool parse(const std::string& text, BackendSpec& spec, std::string& why) {
  std::string rest;
  spec.backend = find_backend(text, rest);
  if (!spec.backend) return false;
  const Backend& b = *spec.backend;
  if (b.takes_argument) {
    if (rest.empty()) return why = cat("expected ", b.usage), false;
    spec.arg = rest;
    return true;
  }
  spec.prec = b.precisions.front();
  if (rest.empty() && text.back() != ':') return true;  // "cpu", not "cpu:
  for (Precision p : b.precisions)
    if (rest == precision_name(p)) return spec.prec = p, true;
  return why = cat("expected ", b.usage), false;
}

const Backend& usable(const BackendSpec& b) {
  if (std::string why = b.backend->unavailable(); !why.empty())
    fail("the ", b.name(), " backend is not available: ", why);
  return *b.backend;
}

}  // namespace

bool is_backend_spec(const std::string& text) {
  BackendSpec spec;
  std::string why;
  return parse(text, spec, why);
}

BackendSpec parse_backend(const std::string& text) {
  BackendSpec spec;
  std::string why;
  if (!parse(text, spec, why)) {
    if (!spec.backend) fail("unknown backend '", text, "': expected one of ", backend_names());
    fail("backend '", text, "': ", why);
  }
  if (spec.backend->bad_argument)  // before anything runs: check counted every case as failed
    if (std::string why = spec.backend->bad_argument(spec.arg); !why.empty()) fail(text, ": ", why);
  return spec;
}

void run_backend(const BackendSpec& b, Case& c, Pass pass, bool dump_intermediates) {
  usable(b).run(b, c, pass, dump_intermediates);
}

std::vector<double> bench_backend(const BackendSpec& b, const Case& c, Pass pass, int warmup, int repeat) {
  const Backend& row = usable(b);
  if (!row.bench) fail("mhc bench: the ", b.name(), " backend cannot be timed in-process (time your program itself)");
  return row.bench(b, c, pass, warmup, repeat);
}

std::string backend_device(const BackendSpec& b) { return usable(b).device(b); }

bool cuda_built() {
#ifdef MHC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string version_string() {
#ifdef MHC_HAVE_CUDA
  std::string cuda = "CUDA backend built for " MHC_CUDA_ARCHS;
#else
  std::string cuda = "CPU only: built without CUDA";
#endif
  return cat("mhc ", MHC_VERSION, " (HDF5 schema ", MHC_SCHEMA_VERSION, "; ", cuda, ")");
}

}  // namespace mhc
