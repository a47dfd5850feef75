#include "check_cases.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "generate.h"
#include "h5io.h"
#include "output_file.h"

namespace mhc {

Problem CheckCase::prob() const { return parse_shape(shape); }

uint64_t CheckCase::seed() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : name.substr(0, name.find('@')) + "/" + shape) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return h;
}

namespace {

const int kN[] = {1, 2, 3, 4, 5, 6, 7, 8};
const int kD[] = {1, 7, 63, 64, 65, 200, 257, 2560, 4096, 7168};
const int kT[] = {1, 3, 255, 256, 257, 4096};

CheckCase shaped(const std::string& name, int64_t T, int64_t n, int64_t D) {
  return {name, cat(T, ",", n, ",", D)};
}
CheckCase large_eps(const std::string& shape) {
  CheckCase c{"large_eps", shape};
  c.large_eps = true;
  return c;
}

// Every value of every axis once, the other axes at small values; then layouts and inputs.
std::vector<CheckCase> default_cases() {
  std::vector<CheckCase> cs;
  for (int n : kN) cs.push_back(shaped(cat("n", n), 64, n, 64));
  for (int D : kD) cs.push_back(shaped(cat("D", D), 64, 4, D));
  for (int T : kT) cs.push_back(shaped(cat("T", T), T, 4, 64));
  for (auto [n, D] : {std::pair{4, 2560}, {4, 4096}, {4, 7168}, {6, 4096}, {8, 4096}})  // production sizes
    cs.push_back(shaped(cat("prod_n", n, "_D", D), 512, n, D));
  cs.push_back({"bs2x300", "2,300,4,64"});
  cs.push_back({"bs3x5_n6_D7", "3,5,6,7"});
  const std::string base = "257,4,64";
  cs.push_back({"no_gamma", base, true});
  cs.push_back({"x_f32", base, false, true});
  cs.push_back({"saturating", base, false, false, true});
  cs.push_back({"forward_only", base, false, false, false, true});
  cs.push_back(large_eps("64,4,64"));  // T <= 256: its failure shares no token count
  CheckCase large{"x_large", base}, small{"x_small", base};
  large.x_exp = 40, small.x_exp = -40;
  cs.push_back(large);
  cs.push_back(small);
  return cs;
}

std::vector<CheckCase> quick_cases() {
  return {shaped("n4_D65_T257", 257, 4, 65), shaped("n6", 64, 6, 64), shaped("n1_D1", 3, 1, 1),
          shaped("T1_D4096", 1, 4, 4096), {"bs2x300", "2,300,4,64"}, {"forward_only", "64,4,64", false, false, false, true},
          large_eps("64,4,64")};
}

std::vector<CheckCase> full_cases() {
  std::vector<CheckCase> cs;
  for (int n : kN)
    for (int D : kD)
      for (int T : kT) cs.push_back(shaped(cat("n", n, "_D", D, "_T", T), T, n, D));
  for (CheckCase& c : default_cases())
    if (c.name.rfind("n", 0) != 0 && c.name.rfind("D", 0) != 0 && c.name.rfind("T", 0) != 0) cs.push_back(c);
  return cs;
}

// E of an option x_exp=E: an integer in -50..50, so that x·2^E stays normal in bf16 and its
// squares, summed over K up to 2^17, stay finite and normal in fp32.
int parse_exponent(const std::string& path, int no, const std::string& opt) {
  const std::string v = opt.substr(6);
  size_t used = 0;
  int e = 0;
  try {
    e = std::stoi(v, &used);
  } catch (...) {
    used = 0;
  }
  if (v.empty() || used != v.size() || e < -50 || e > 50)
    fail(path, ":", no, ": ", opt, ": expected x_exp=E with E an integer from -50 to 50");
  return e;
}

std::vector<CheckCase> file_cases(const std::string& path) {
  struct stat st;  // a FIFO would block, /dev/zero never end
  if (stat(path.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size > (1 << 20)))
    fail("--cases ", path, ": expected quick, default, full or a regular file of cases (at most 1 MiB)");
  std::ifstream f(path);
  if (!f) fail("--cases ", path, ": expected quick, default, full or a readable file of cases");
  note_read_file(path);  // --keep's files never replace it (a case named c1.in.h5 did)
  std::vector<CheckCase> cs;
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    if (line.find('\0') != std::string::npos)  // a message built with it was cut there (review B, session 23)
      fail(path, ":", no, ": a NUL byte in the line (a binary file, not a file of cases?)");
    line = line.substr(0, line.find('#'));
    std::istringstream in(line);
    CheckCase c;
    if (!(in >> c.name)) continue;
    if (!(in >> c.shape)) fail(path, ":", no, ": expected NAME SHAPE [options], found '", line, "'");
    try {
      parse_shape(c.shape);
    } catch (const UserError& e) {  // "--shape S: why" names a flag that was not given
      const std::string why = e.what(), flag = "--shape ";
      fail(path, ":", no, ": shape ", why.rfind(flag, 0) == 0 ? why.substr(flag.size()) : why);
    }
    for (std::string opt; in >> opt;) {
      if (opt == "no_gamma") c.no_gamma = true;
      else if (opt == "x_f32") c.x_f32 = true;
      else if (opt == "saturating") c.saturating = true;
      else if (opt == "forward_only") c.forward_only = true;
      else if (opt == "large_eps") c.large_eps = true;
      else if (opt.rfind("x_exp=", 0) == 0) c.x_exp = parse_exponent(path, no, opt);
      else fail(path, ":", no, ": unknown option '", opt, "' (no_gamma, x_f32, saturating, forward_only, large_eps, x_exp=E)");
    }
    cs.push_back(c);
  }
  if (cs.empty()) fail("--cases ", path, ": no case in the file");
  return cs;
}

}  // namespace

std::vector<CheckCase> check_cases(const std::string& set) {
  if (set == "quick") return quick_cases();
  if (set == "default") return default_cases();
  if (set == "full") return full_cases();
  return file_cases(set);
}

std::vector<CheckCase> vary(const std::vector<CheckCase>& cases, const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    fail("--vary ", spec, ": expected VAR=V1,V2,... (e.g. SPLITS=1,2,4: your kernel's split count)");
  std::vector<std::string> values;
  for (size_t at = eq + 1; at <= spec.size();) {
    size_t end = std::min(spec.find(',', at), spec.size());
    if (end > at) values.push_back(spec.substr(at, end - at));
    at = end + 1;
  }
  if (values.empty()) fail("--vary ", spec, ": no values; expected VAR=V1,V2,... (e.g. SPLITS=1,2,4)");
  std::vector<CheckCase> out;
  for (const CheckCase& c : cases)
    for (const std::string& v : values) {
      CheckCase x = c;
      x.env = spec.substr(0, eq), x.env_value = v;
      x.name = cat(c.name, "@", x.env, "=", v);
      out.push_back(x);
    }
  return out;
}

Case make_inputs(const CheckCase& cc) {
  check_case_memory(cat("case ", cc.name, ": "), cc.prob(), Holds::check);
  Case c = generate_case(cc.prob(), cc.seed(), !cc.forward_only);
  if (cc.no_gamma)
    for (int64_t i = 0; i < c.t["gamma"].size(); ++i) c.t["gamma"].set(i, 1.0);
  if (cc.saturating) {  // |z| of 30-ish: sigmoid at its floor and ceiling
    for (int64_t i = 0; i < 3; ++i) c.t["alpha"].set(i, 40.0);
    for (int64_t i = 0; i < c.t["bias"].size(); ++i) c.t["bias"].set(i, i % 2 ? 30.0 : -30.0);
  }
  if (cc.large_eps) c.prob.norm_eps = 1e-2, c.prob.hc_eps = 1e-3;
  if (cc.x_exp)
    for (int64_t i = 0; i < c.t["x"].size(); ++i) c.t["x"].set(i, std::ldexp(c.t["x"].at(i), cc.x_exp));
  if (cc.x_f32)
    for (const char* name : {"x", "dh_in"})
      if (c.has(name)) c.t[name] = convert(c.get(name), DType::f32);
  return c;
}

}  // namespace mhc
