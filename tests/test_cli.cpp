// test_cli.cpp — the command line: bad input gets one line, status 2, and nothing lost.
#include <doctest/doctest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "backends.h"
#include "h5io.h"
#include "support.h"

using namespace mhc;

namespace {

void remove_dataset(const std::string& file, const std::string& path) {
  H5::H5File f(file, H5F_ACC_RDWR);
  f.unlink(path);
}

// Replaces a dataset by float64 (or int32) data of any shape.
// int_bits: 0 for float64, else an integer dataset of 32 or 16 bits, all ones
void replace_dataset(const std::string& file, const std::string& path, const Shape& shape, double fill,
                     int int_bits = 0) {
  H5::H5File f(file, H5F_ACC_RDWR);
  if (H5Lexists(f.getId(), path.c_str(), H5P_DEFAULT) > 0) f.unlink(path);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5::DataSpace sp(int(dims.size()), dims.data());
  std::vector<double> v(size_t(numel(shape)), fill);
  for (size_t i = 0; i < v.size(); ++i) v[i] = fill * double(i % 7 + 1) / 8;  // bf16-exact for fill = 1
  if (int_bits) {
    std::vector<int> iv(v.size(), 1);
    f.createDataSet(path, int_bits == 16 ? H5::PredType::STD_I16LE : H5::PredType::STD_I32LE, sp).write(iv.data(), H5::PredType::NATIVE_INT);
  } else {
    f.createDataSet(path, H5::PredType::IEEE_F64LE, sp).write(v.data(), H5::PredType::NATIVE_DOUBLE);
  }
}

struct Bad {
  std::string dir, in, out;
  explicit Bad(const std::string& name, bool grads = true) : dir(test::tmpdir("cli_" + name)) {
    in = dir + "/in.h5", out = dir + "/out.h5";
    save_case(in, generate_case(parse_shape("4,4,8"), 2, grads));
  }
  // Runs mhc, expects status 2 with one line naming `what`, and no output left behind.
  void expect_error(const std::string& args, const std::vector<std::string>& what) const {
    test::expect_error(args, what, dir, in, out);
  }

  std::string run() const { return "run " + in + " " + out; }
};

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("missing, non-HDF5 and truncated files") {
    Bad b("files");
    b.expect_error("run " + b.dir + "/nope.h5 " + b.out, {"nope.h5", "cannot open", "No such file"});
    std::ofstream(b.dir + "/text.h5") << "not hdf5\n";
    b.expect_error("run " + b.dir + "/text.h5 " + b.out, {"text.h5", "not an HDF5 file"});
    std::string whole = test::read_bytes(b.in);
    std::ofstream(b.dir + "/half.h5", std::ios::binary) << whole.substr(0, whole.size() / 2);
    b.expect_error("run " + b.dir + "/half.h5 " + b.out, {"half.h5", "truncated"});
  }

  TEST_CASE("missing dataset, wrong rank, wrong shape, non-float data") {
    {
      Bad b("missing");
      remove_dataset(b.in, "/inputs/phi");
      b.expect_error(b.run(), {"in.h5", "/inputs/phi", "missing dataset", "float32 [N,K] = [24,32]"});
    }
    {
      Bad b("rank");
      replace_dataset(b.in, "/inputs/x", {4, 32}, 1);
      b.expect_error(b.run(), {"/inputs/x", "expected rank 3 [T,n,D] or 4 [B,S,n,D], found [4,32]"});
    }
    {
      Bad b("shape");
      replace_dataset(b.in, "/inputs/bias", {25}, 1);
      b.expect_error(b.run(), {"/inputs/bias", "expected shape [N] = [24]", "found [25]"});
    }
    {
      Bad b("phi_cols");
      replace_dataset(b.in, "/inputs/phi", {24, 33}, 0.01);
      b.expect_error(b.run(), {"/inputs/phi", "x gives n*D = 32 but phi has 33 columns"});
    }
    {
      Bad b("int");
      replace_dataset(b.in, "/inputs/alpha", {3}, 1, 32);
      b.expect_error(b.run(), {"/inputs/alpha", "expected a floating-point dataset, found integer"});
    }
    {  // bf16 bit patterns stored as int16 (tensor.view(torch.int16))
      Bad b("int16");
      replace_dataset(b.in, "/inputs/x", {4, 4, 8}, 1, 16);
      b.expect_error(b.run(), {"/inputs/x", "found integer of 16 bits (bf16 bit patterns? write them as float32"});
    }
  }

  TEST_CASE("zero-size dimensions, NaN/Inf, partial gradients") {
    {
      Bad b("zero");
      replace_dataset(b.in, "/inputs/x", {0, 4, 8}, 1);
      b.expect_error(b.run(), {"/inputs/x", "zero-size dimension in [0,4,8]"});
    }
    {
      Bad b("nan");
      replace_dataset(b.in, "/inputs/gamma", {4, 8}, NAN);
      b.expect_error(b.run(), {"/inputs/gamma", "32 NaN and 0 Inf values", "--allow-nonfinite"});
      auto ok = test::sh(test::mhc("run -q --allow-nonfinite " + b.run().substr(4)));
      CHECK(ok.rc == 0);
      CHECK(std::filesystem::exists(b.out));
    }
    {
      Bad b("grads");
      remove_dataset(b.in, "/inputs/dh_res");
      b.expect_error(b.run(), {"in.h5: /inputs: 2 of the 3 gradients", "backward needs all 3"});
    }
  }

  TEST_CASE("outputs: never the input, never clobbered, never partial") {
    Bad b("outputs");
    b.expect_error("run " + b.in + " " + b.in, {"output is the input file"});
    b.expect_error("run " + b.in + " " + b.dir + "/../" + std::filesystem::path(b.dir).filename().string() + "/in.h5",
                   {"output is the input file"});
    b.expect_error("run " + b.in + " " + b.dir + "/no/such/dir/out.h5", {"directory", "does not exist"});
    b.expect_error("run " + b.in + " /proc/out.h5", {"/proc/out.h5", "cannot create files in /proc"});
    std::ofstream(b.out) << "precious";
    auto r = test::sh(test::mhc(b.run()));
    CHECK(r.rc == 2);
    CHECK(r.err.find("exists (use --force to replace it)") != std::string::npos);
    CHECK(test::read_bytes(b.out) == "precious");
    CHECK(test::sh(test::mhc("run -q --force " + b.run().substr(4))).rc == 0);
    CHECK(load_case(b.out, LoadOptions{}, true).has("dgamma"));
    // a link planted at the temporary file's name while an exec kernel runs (another process
    // with write access to the directory): the output was written through it, onto the input.
    // The name has a random part now: one planted at the name of old (and a stale file there,
    // left by a process killed with the same pid, which blocked every write) is passed by
    const std::string in_bytes = test::read_bytes(b.in), out2 = b.dir + "/out2.h5", old_name = b.dir + "/.out2.h5.tmp";
    auto planted = test::sh(test::mhc("run -q --backend 'exec:ln -s " + b.in + " " + old_name + "$PPID; cp " + b.out +
                                      " {out} # {in}' " + b.in + " " + out2));
    CHECK(planted.rc == 0);
    CHECK(test::read_bytes(b.in) == in_bytes);
    CHECK(std::filesystem::is_regular_file(std::filesystem::symlink_status(out2)));
    CHECK(load_case(out2, LoadOptions{}, true).has("dgamma"));
    for (auto& e : std::filesystem::directory_iterator(b.dir))
      if (e.path().filename().string().rfind(".out2.h5.tmp", 0) == 0) std::filesystem::remove(e.path());
    // diff's --report and --dump-diff, created by another process while the diff ran: kept
    // without --force (both were always replaced; review B, session 21)
    for (const char* opt : {"--report", "--dump-diff"}) {
      const std::string made = b.dir + "/made" + (opt[2] == 'r' ? ".html" : ".h5");
      auto raced = test::sh(test::mhc(cat("diff 'exec:cp ", b.out, " {out}; echo precious > ", made, " # {in}' ", b.out, " ",
                                          opt, " ", made)));
      CAPTURE(raced.err);
      CHECK(raced.rc == 2);
      CHECK(raced.err.find("exists (created meanwhile by another process?)") != std::string::npos);
      CHECK(test::read_bytes(made) == "precious\n");
    }
    // --report that cannot be written (its directory removed while the diff ran): the --dump-diff
    // file this diff made is removed too (it was left beside the error; review B, session 22)
    const std::string gone = b.dir + "/gone", dumped = b.dir + "/dumped.h5";
    std::filesystem::create_directory(gone);
    auto half = test::sh(test::mhc(cat("diff 'exec:cp ", b.out, " {out}; rmdir ", gone, " # {in}' ", b.out, " --dump-diff ",
                                       dumped, " --report ", gone, "/r.html")));
    CAPTURE(half.err);
    CHECK(half.rc == 2);
    CHECK(!std::filesystem::exists(dumped));
    // the same with an old --dump-diff file and --force: the old file stays as it was (it was
    // replaced before the report failed; review B, session 23)
    std::ofstream(dumped) << "old dump";
    std::filesystem::create_directory(gone);
    auto kept = test::sh(test::mhc(cat("diff 'exec:cp ", b.out, " {out}; rmdir ", gone, " # {in}' ", b.out, " --force --dump-diff ",
                                       dumped, " --report ", gone, "/r.html")));
    CAPTURE(kept.err);
    CHECK(kept.rc == 2);
    CHECK(test::read_bytes(dumped) == "old dump");
    // ... and the other way round: a --dump-diff file that cannot be moved into place (created
    // meanwhile without --force; a directory put there meanwhile under --force) leaves no new
    // report, and an old one as it was
    const std::string report = b.dir + "/r.html";
    std::filesystem::remove(dumped);
    auto made = test::sh(test::mhc(cat("diff 'exec:cp ", b.out, " {out}; echo x > ", dumped, " # {in}' ", b.out, " --dump-diff ",
                                       dumped, " --report ", report)));
    CAPTURE(made.err);
    CHECK(made.rc == 2);
    CHECK(made.err.find("exists (created meanwhile by another process?)") != std::string::npos);
    CHECK(!std::filesystem::exists(report));
    std::ofstream(report) << "old report";
    auto dir = test::sh(test::mhc(cat("diff 'exec:cp ", b.out, " {out}; rm ", dumped, "; mkdir ", dumped, " # {in}' ", b.out,
                                      " --force --dump-diff ", dumped, " --report ", report)));
    CAPTURE(dir.err);
    CHECK(dir.rc == 2);
    CHECK(test::read_bytes(report) == "old report");
    for (auto& e : std::filesystem::directory_iterator(b.dir))
      CHECK(e.path().filename().string().find(".tmp") == std::string::npos);  // no temporary file left
  }

  TEST_CASE("the same command writes the same bytes (no HDF5 timestamps in gen, run and diff's files)") {
    Bad b("same_bytes");
    for (int i : {1, 2}) {
      if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // timestamps have a resolution of 1 s
      REQUIRE(test::sh(test::mhc(cat("gen --force --shape 9,3,20 --seed 4 ", b.dir, "/g", i, ".h5"))).rc == 0);
      REQUIRE(test::sh(test::mhc(cat("run -q --force ", b.dir, "/g1.h5 ", b.dir, "/r", i, ".h5"))).rc == 0);
      REQUIRE(test::sh(test::mhc(cat("diff ", b.dir, "/r1.h5 cpu:fp64 --dump-diff ", b.dir, "/d", i, ".h5"))).rc == 0);
    }
    for (const char* f : {"/g", "/r", "/d"})
      CHECK(test::read_bytes(cat(b.dir, f, 1, ".h5")) == test::read_bytes(cat(b.dir, f, 2, ".h5")));
  }

  TEST_CASE("forward-only inputs give a forward-only output") {
    Bad b("fwd", false);
    CHECK(test::sh(test::mhc("run -q " + b.run().substr(4))).rc == 0);
    Case c = load_case(b.out, LoadOptions{}, true);
    CHECK(c.has("h_in"));
    CHECK(!c.has("dx"));
  }

  TEST_CASE("diff: a bf16 stage of A that is not on the bf16 grid is said to be unchecked for rounding") {
    // an fp32 accumulator dumped as h_in (here the fp64 oracle's, which keeps h_in and dx unrounded)
    // passed by the ulp budget without a word (review A, session 24); a rounded one has no such note
    auto r = test::sh(test::mhc("diff cpu:fp64 cpu --shape 64,4,64 --json"));
    CHECK(r.rc == 0);
    for (const char* name : {"\"h_in\"", "\"dx\""}) {
      const size_t at = r.out.find(cat("\"name\": ", name));
      REQUIRE(at != std::string::npos);
      CHECK(r.out.substr(at, r.out.find('}', at) - at).find("not bf16 (stored unrounded?)") != std::string::npos);
    }
    CHECK(test::sh(test::mhc("diff cpu cpu:fp64 --shape 64,4,64")).out.find("not bf16") == std::string::npos);
  }

  TEST_CASE("usage errors, --help with examples, --version") {
    auto r = test::sh(test::mhc("run --backend tpu a.h5 b.h5"));
    CHECK(r.rc == 2);
    CHECK(r.err.find("unknown backend 'tpu'") != std::string::npos);
    CHECK(test::sh(test::mhc("gen --shape 4,0,3 x.h5")).rc == 2);
    CHECK(test::sh(test::mhc("gen --shape 99999999999999999999,4,8 x.h5")).err.find("is too large") != std::string::npos);
    CHECK(test::sh(test::mhc("gen --force --shape '3, 2,4 ' " + test::tmpdir("cli_spaced") + "/s.h5")).out.find("T=3 n=2 D=4") !=
          std::string::npos);  // spaces around a number are read as in "3,2,4"
    // sizes that would wrap, and counts beyond their range: one line, exit 2 (an audit found a
    // written file with x declared [2^62+1,1,4], a crash of bench and an internal error of check)
    for (const char* args : {"gen --shape 4611686018427387905,1,4 x.h5", "gen --shape 1,2,9223372036854775807 x.h5",
                             "gen --shape 4294967296,4294967296,1,1 x.h5", "bench --shape 1,1,1 --repeat 2147483647",
                             "bench --shape 1,1,1 --warmup 2147483647", "check cpu --repeat 2147483647",
                             "gen --shape 1,4,8, x.h5", "gen --shape 2,2,4 --seed -1 x.h5",
                             "gen --shape 2,2,4 --seed 18446744073709551616 x.h5", "diff cpu cpu --seed 1e3",
                             // NaN passed CLI11's PositiveNumber: --timeout nan never timed out
                             "run --timeout nan --backend 'exec:sleep 9 {in} {out}' a.h5 b.h5", "check cpu --timeout nan",
                             "diff cpu cpu --budget-factor nan", "diff cpu cpu --tolerance fixed --atol nan",
                             "diff cpu cpu --tolerance fixed --rtol inf", "diff cpu cpu --tolerance fixed --tol dphi=nan,nan",
                             "diff cpu cpu --dump-diff x.h5 --report ./x.h5",
                             "run --chunk 0 a.h5 b.h5", "run --chunk -5 a.h5 b.h5", "diff cpu cpu --tile 0",
                             // an empty --require was no requirement at all; a denormal was "not > 0"
                             "diff cpu cpu --require ''", "diff cpu cpu --require h_mix,,dphi", "check cpu --require ''",
                             "diff cpu cpu --budget-factor 1e-320"}) {
      CAPTURE(args);
      auto e = test::sh(test::mhc(args));
      CHECK(e.rc == 2);
      CHECK(e.err.rfind("mhc: error: ", 0) == 0);
      CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
    }
    CHECK(test::sh(test::mhc("gen --shape 4611686018427387905,1,4 x.h5")).err.find("too large") != std::string::npos);
    // a 309-digit "range" for --chunk 0 and --tile 0; a contradiction resolved in silence
    CHECK(test::sh(test::mhc("run --chunk 0 a.h5 b.h5")).err.find("--chunk: expected a whole number from 1") != std::string::npos);
    CHECK(test::sh(test::mhc("diff cpu cpu --tile 0")).err.find("--tile: expected a whole number from 1") != std::string::npos);
    CHECK(test::sh(test::mhc("diff cpu cpu --require ''")).err.find("--require '': an empty stage name") != std::string::npos);
    CHECK(test::sh(test::mhc("diff cpu cpu --budget-factor 1e-320")).err.find("out of the range of a double") != std::string::npos);
    save_case("contradiction.h5", generate_case(parse_shape("8,4,8"), 1, true));
    auto both = test::sh(test::mhc("run --backend cpu:fp64 --precision fp32 contradiction.h5 contradiction.out.h5"));
    CHECK(both.rc == 2);
    CHECK(both.err.find("--precision fp32 contradicts --backend cpu:fp64") != std::string::npos);
    CHECK(!std::filesystem::exists("contradiction.out.h5"));
    std::filesystem::remove("contradiction.h5");
    // MHC_MAX_MEMORY=-1 was 2^64 - 1 bytes (strtoull), which let a 21 KB file ask for 558 GB
    for (const char* limit : {"-1", "+5", "' 1000'", "99999999999999999999999", "1e9"}) {
      CAPTURE(limit);
      auto m = test::sh(std::string("MHC_MAX_MEMORY=") + limit + " " + test::mhc("gen --shape 8,4,8 x.h5"));
      CHECK(m.rc == 2);
      CHECK(m.err.find("expected a number of bytes") != std::string::npos);
    }
    CHECK(!std::filesystem::exists("x.h5"));
    // libgomp that cannot start its threads (a stack below the minimum) ended the process with
    // exit(1), "diverged" to diff (review B, session 24); under AddressSanitizer the threads
    // started and overflowed: refused before any thread starts, one line, exit 2
    for (const char* env : {"OMP_STACKSIZE=16K", "OMP_STACKSIZE=' 100 k'", "GOMP_STACKSIZE=64"}) {
      auto stack = test::sh(cat(env, " OMP_NUM_THREADS=2 ", test::mhc("diff cpu cpu:fp64 --shape 64,4,64")));
      CAPTURE(env);
      CAPTURE(stack.err);
      CHECK(stack.rc == 2);
      CHECK(stack.err.find("is too small for mhc's OpenMP threads") != std::string::npos);
    }
    CHECK(test::sh("OMP_STACKSIZE=4M OMP_NUM_THREADS=2 " + test::mhc("diff cpu cpu:fp64 --shape 16,4,64")).rc == 0);
    // a report that could not be written was exit 0
    save_case("full_stdout.h5", generate_case(parse_shape("8,4,8"), 1, true));
    for (const char* args : {"inspect full_stdout.h5", "diff cpu cpu --input full_stdout.h5 --json", "--help", "--version",
                             "diff --help"}) {  // --help and --version too (they were exit 0)
      CAPTURE(args);
      auto full = test::sh(test::mhc(args) + " > /dev/full");
      CHECK(full.rc == 2);
      CHECK(full.err.find("cannot write to standard output") != std::string::npos);
    }
    // ... and a command that failed so left its output in place (a rerun then found it existing)
    for (const char* args : {"gen --shape 8,4,8 full_out.h5", "run full_stdout.h5 full_out.h5",
                             "diff cpu cpu --input full_stdout.h5 --dump-diff full_out.h5"}) {
      CAPTURE(args);
      for (const char* redirect : {" > /dev/full", " >&-"}) {
        CHECK(test::sh(test::mhc(args) + redirect).rc == 2);
        CHECK(!std::filesystem::exists("full_out.h5"));
      }
    }
    // --dump-diff and --report replaced an existing file without --force (run and gen refuse to)
    std::ofstream("notes.html") << "mine\n";
    auto kept = test::sh(test::mhc("diff cpu cpu --shape 8,4,8 --report notes.html"));
    CHECK(kept.rc == 2);
    CHECK(kept.err.find("notes.html: exists (use --force to replace it)") != std::string::npos);
    CHECK(test::sh("cat notes.html").out == "mine\n");
    CHECK(test::sh(test::mhc("diff cpu cpu --shape 8,4,8 --report notes.html --force")).rc == 0);
    CHECK(test::sh("head -c 15 notes.html").out == "<!DOCTYPE html>");
    std::filesystem::remove("notes.html");
    // stderr closed: the warning went to the next file opened, the output's temporary HDF5 file
    {
      Case w = generate_case(parse_shape("8,4,8"), 1, true);
      w.t["x"] = convert(w.get("x"), DType::f32);
      w.t["x"].data<float>()[3] += 1e-3f;  // not bf16-exact: a rounding warning on stderr
      save_case("warn.h5", w);
      CHECK(test::sh(test::mhc("run -q warn.h5 warn_ref.h5")).rc == 0);
      CHECK(test::sh(test::mhc("run -q warn.h5 warn_closed.h5") + " 2>&-").rc == 0);
      CHECK(load_case("warn_closed.h5", LoadOptions{}, true).get("h_in").bytes ==
            load_case("warn_ref.h5", LoadOptions{}, true).get("h_in").bytes);
      for (const char* f : {"warn.h5", "warn_ref.h5", "warn_closed.h5"}) std::filesystem::remove(f);
    }
    std::filesystem::remove("full_stdout.h5");
    // an empty output name ran the whole case, then failed to move it; --report '' was ignored
    CHECK(test::sh(test::mhc("gen --shape 8,4,8 ''")).err.find("an empty output file name") != std::string::npos);
    CHECK(test::sh(test::mhc("diff cpu cpu --shape 8,4,8 --report ''")).err.find("--report: an empty file name") !=
          std::string::npos);
    // a 250-byte output name: the temporary's name was longer than a file name may be
    const std::string long_name = std::string(250, 'n') + ".h5";
    CHECK(test::sh(test::mhc("gen --shape 8,4,8 " + long_name)).rc == 0);
    CHECK(std::filesystem::remove(long_name));
    auto unknown = test::sh(test::mhc("frobnicate"));
    CHECK(unknown.rc == 2);
    CHECK(unknown.err.find("unknown subcommand 'frobnicate': expected one of gen, run") != std::string::npos);
    for (const char* sub : {"gen", "run", "inspect", "bench", "diff"}) {
      auto h = test::sh(test::mhc(std::string(sub) + " --help"));
      INFO("subcommand ", sub);
      CHECK(h.rc == 0);
      CHECK(h.out.find("mhc " + std::string(sub)) != std::string::npos);  // an example line
    }
    auto v = test::sh(test::mhc("--version"));
    CHECK(v.rc == 0);
    CHECK(v.out.rfind("mhc 0.", 0) == 0);
    CHECK(v.out.find(cuda_built() ? "CUDA backend built for sm_" : "CPU only: built without CUDA") != std::string::npos);
  }

  TEST_CASE("OMP_NUM_THREADS far above the machine's threads: the same bits, no crash") {
    // OMP_NUM_THREADS=1000000 overflowed libgomp's stack in the first parallel region (SIGSEGV)
    const std::string dir = test::tmpdir("omp_threads");
    save_case(dir + "/in.h5", generate_case(parse_shape("300,4,64"), 2, true));
    REQUIRE(test::sh("OMP_NUM_THREADS=1 " + test::mhc("run -q " + dir + "/in.h5 " + dir + "/one.h5")).rc == 0);
    auto r = test::sh("OMP_NUM_THREADS=1000000 " + test::mhc("run -q " + dir + "/in.h5 " + dir + "/many.h5"));
    CAPTURE(r.err);
    REQUIRE(r.rc == 0);
    const Case one = load_case(dir + "/one.h5", {}, true), many = load_case(dir + "/many.h5", {}, true);
    for (auto& [name, t] : one.t) {
      CAPTURE(name);
      CHECK(many.get(name).bytes == t.bytes);
    }
    // Under a limit on processes (prlimit --nproc; root is exempt, so as nobody) libgomp could not
    // start its threads and ended mhc with status 1, "diverged" to diff (review B, session 22):
    // fewer threads, the same bits
#ifndef __SANITIZE_ADDRESS__  // LeakSanitizer needs a thread of its own at exit
    if (geteuid() != 0 || test::sh("command -v setpriv && command -v prlimit").rc != 0) return;
    const std::string open_dir = "/tmp/mhc_nproc_test";
    std::filesystem::remove_all(open_dir);
    std::filesystem::create_directory(open_dir);
    std::filesystem::permissions(open_dir, std::filesystem::perms::all);
    std::filesystem::copy_file(dir + "/in.h5", open_dir + "/in.h5");
    std::filesystem::copy_file(std::string(MHC_BIN), open_dir + "/mhc");
    std::filesystem::permissions(open_dir + "/in.h5", std::filesystem::perms::all);
    auto np = test::sh("cd " + open_dir + " && prlimit --nproc=1 setpriv --reuid=65534 --regid=65534 --clear-groups ./mhc run -q in.h5 few.h5");
    CAPTURE(np.err);
    CHECK(np.rc == 0);
    if (np.rc == 0) CHECK(load_case(open_dir + "/few.h5", {}, true).get("dx").bytes == one.get("dx").bytes);
    std::filesystem::remove_all(open_dir);
#endif
  }

  TEST_CASE("a newline in an argument stays on the error's one line; check refuses two cases of one name") {
    Bad b("newline");
    b.expect_error("run --precision \"$(printf 'fp\\n32')\" " + b.in + " " + b.out, {"--precision", "fp\\n32"});
    b.expect_error("run " + b.in + " " + b.out + " \"$(printf 'extra\\narg')\"", {"extra\\narg"});
    // the second case's kept files replaced the first's
    std::ofstream(b.dir + "/dup.txt") << "dup 8,4,8\ndup 9,4,8\n";
    b.expect_error("check cpu --cases " + b.dir + "/dup.txt --keep " + b.dir + "/kept", {"case dup appears twice"});
    b.expect_error("check 'exec:true {in} {out}' --cases quick --only n1 --vary X=a,b,a", {"appears twice"});
    b.expect_error("check 'exec:true {in} {out}' --cases quick --vary X=,", {"--vary X=,: no values"});  // it named --only
  }

  TEST_CASE("small n*D at fp64: the same bits on 1 and 4 threads and any --chunk") {
    // Eigen multiplied matrices of rows + cols + depth < 20 coefficient by coefficient, in an order
    // that depended on where the buffers lay: dvecX's last partial block of 100,2,3 (4 x 8 by 8 x 6)
    // and dx differed by an ulp between thread counts, and so did diff's report against cpu:fp64
    const std::string dir = test::tmpdir("small_fp64");
    for (const char* shape : {"100,2,3", "513,2,2"}) {
      CAPTURE(shape);
      save_case(dir + "/in.h5", generate_case(parse_shape(shape), 5, true));
      Case want;
      for (const char* run : {"OMP_NUM_THREADS=1 ", "OMP_NUM_THREADS=4 ", "OMP_NUM_THREADS=3 --chunk 256 "}) {
        const std::string env = std::string(run).substr(0, std::string(run).find(' ') + 1);
        const std::string chunk = std::string(run).substr(env.size());
        REQUIRE(test::sh(env + test::mhc("run -q --force --precision fp64 " + chunk + dir + "/in.h5 " + dir + "/out.h5")).rc == 0);
        Case got = load_case(dir + "/out.h5", {}, true);
        if (want.t.empty()) want = got;
        for (auto& [name, t] : want.t) {
          CAPTURE(name);
          CHECK(got.get(name).bytes == t.bytes);
        }
      }
    }
  }

  TEST_CASE("--backend cuda without a GPU (or without CUDA) is one line and status 2") {
    Bad b("nocuda");
    auto r = test::sh(test::mhc("run -q --backend cuda " + b.run().substr(4)));
    if (r.rc == 0) {  // a GPU machine: the run worked
      CHECK(std::filesystem::exists(b.out));
    } else {
      b.expect_error("run --backend cuda " + b.run().substr(4),
                     {cuda_built() ? "no CUDA device" : "built without CUDA"});
    }
  }

  TEST_CASE("gen, run and inspect agree with the library") {
    std::string dir = test::tmpdir("cli_gen");
    CHECK(test::sh(test::mhc("gen --shape 2,5,4,6 --seed 3 " + dir + "/in.h5")).rc == 0);
    Case in = load_case(dir + "/in.h5", LoadOptions{}, false);
    Case direct = generate_case(parse_shape("2,5,4,6"), 3, true);
    for (auto& [name, t] : direct.t) CHECK(in.get(name).bytes == t.bytes);
    auto r = test::sh(test::mhc("run " + dir + "/in.h5 " + dir + "/out.h5"));
    CHECK(r.rc == 0);
    CHECK(r.out.find("dgamma") != std::string::npos);
    Case out = load_case(dir + "/out.h5", LoadOptions{}, true);
    cpu_run(direct, Precision::fp32);
    for (auto& [name, t] : direct.t) CHECK(out.get(name).bytes == t.bytes);
    CHECK(out.get("h_in").shape == Shape{2, 5, 6});  // the [B,S,..] layout is kept
    auto i = test::sh(test::mhc("inspect " + dir + "/out.h5"));
    CHECK(i.rc == 0);
    CHECK(i.out.find("backend=cpu") != std::string::npos);
    CHECK(i.out.find("precision=fp32") != std::string::npos);
    auto line = i.out.substr(i.out.find("/backward/dx "));
    line = line.substr(0, line.find('\n'));
    CHECK(line.find(" [2,5,4,6] ") != std::string::npos);
    CHECK(line.find(" bfloat16 ") != std::string::npos);
    // a mean that overflowed a double's sum (inf), NaN statistics of an all-NaN/Inf dataset, and a
    // dataset of no elements called "never written" (review B, session 21)
    {
      H5::H5File f(dir + "/odd.h5", H5F_ACC_TRUNC);
      const double big[2] = {1.7e308, 1.7e308};
      const float bad[2] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
      hsize_t two[1] = {2}, none[2] = {0, 5};
      f.createDataSet("big", H5::PredType::IEEE_F64LE, H5::DataSpace(1, two)).write(big, H5::PredType::NATIVE_DOUBLE);
      f.createDataSet("bad", H5::PredType::IEEE_F32LE, H5::DataSpace(1, two)).write(bad, H5::PredType::NATIVE_FLOAT);
      f.createDataSet("none", H5::PredType::IEEE_F32LE, H5::DataSpace(2, none));
    }
    auto odd = test::sh(test::mhc("inspect " + dir + "/odd.h5"));
    CHECK(odd.rc == 0);
    auto row = [&](const std::string& name) {
      auto r = odd.out.substr(odd.out.find("/" + name + " "));
      return r.substr(0, r.find('\n'));
    };
    CHECK(row("big").find("1.7e+308     1.7e+308     1.7e+308") != std::string::npos);
    CHECK(row("bad").find("nan") == std::string::npos);
    CHECK(row("none").find("(no elements)") != std::string::npos);
  }

  TEST_CASE("run streams token chunks: any --chunk writes the same bits as the library in one piece") {
    std::string dir = test::tmpdir("cli_chunks");
    CHECK(test::sh(test::mhc("gen --shape 3,300,2,16 --seed 8 " + dir + "/in.h5")).rc == 0);  // batch rows cross chunks
    Case direct = generate_case(parse_shape("3,300,2,16"), 8, true);
    cpu_run(direct, Precision::fp32);
    for (const char* chunk : {"256", "512", "1000", "9223372036854775807"}) {  // the last: no wrap near 2^63
      CAPTURE(chunk);
      std::string out = dir + "/out" + chunk + ".h5";
      CHECK(test::sh(test::mhc(cat("run -q --chunk ", chunk, " ", dir, "/in.h5 ", out))).rc == 0);
      Case got = load_case(out, LoadOptions{}, true);
      for (auto& [name, t] : direct.t) {
        CAPTURE(name);
        CHECK(got.get(name).shape == t.shape);
        CHECK(got.get(name).bytes == t.bytes);
      }
    }
  }
}

TEST_SUITE("cli") {
  TEST_CASE("the memory limit: whole-case commands refuse before allocating; streamed run and diff fit under it") {
    // gen, bench and diff on a generated case hold it whole (an audit found gen --shape
    // 100000000000,4,4096 dying of bad_alloc or an OOM kill)
    for (const char* args : {"gen --shape 100000000000,4,4096 x.h5", "bench --shape 100000000000,4,4096",
                             "diff cpu cpu --shape 100000000000,4,4096"}) {
      CAPTURE(args);
      auto e = test::sh("MHC_MAX_MEMORY=8000000000 " + test::mhc(args));
      CHECK(e.rc == 2);
      CHECK(e.err.rfind("mhc: error: --shape 100000000000,4,4096: T=100000000000 n=4 D=4096 needs about", 0) == 0);
      CHECK(e.err.find("more than the memory limit of 8 GB") != std::string::npos);
      CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
    }
    CHECK(!std::filesystem::exists("x.h5"));
    std::string dir = test::tmpdir("cli_memory");
    // n = 32, D = 1: h_mix, dh_mix, h_res and dh_res are 17 KB a token, x 64 bytes. The streamed run
    // sized its chunk by x alone and held all 32768 tokens (~0.9 GB); under a 200 MB limit its
    // chunks now fit, and it writes the bits of a run without the limit.
    CHECK(test::sh(test::mhc("gen --shape 32768,32,1 --seed 4 " + dir + "/n32.h5")).rc == 0);
    auto peak = test::sh("MHC_MAX_MEMORY=200000000 python3 -c 'import resource, subprocess, sys; "
                         "r = subprocess.run(sys.argv[1:]).returncode; "
                         "print(r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' " +
                         test::mhc("run -q " + dir + "/n32.h5 " + dir + "/limited.h5"));
    int rc = -1;
    double rss = 0;
    std::istringstream(peak.out) >> rc >> rss;
    CHECK(rc == 0);
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer's shadow memory and quarantine are not mhc's
    CHECK(rss > 0);
    CHECK(rss < 200e6);
#endif
    CHECK(test::sh(test::mhc("run -q " + dir + "/n32.h5 " + dir + "/free.h5")).rc == 0);
    Case limited = load_case(dir + "/limited.h5", LoadOptions{}, true), free = load_case(dir + "/free.h5", LoadOptions{}, true);
    for (auto& [name, t] : free.t) {
      CAPTURE(name);
      CHECK(limited.get(name).bytes == t.bytes);
    }
    // n = 64, D = 64: phi and dphi are 2 x 69 MB at 4 bytes (x 8 as float64). A run fits in 1 GB;
    // the diff, which holds ~6 copies, is refused before it starts (it peaked at 3.2 GB at
    // 256,128,16 with no check).
    CHECK(test::sh(test::mhc("gen --shape 4,64,64 --seed 4 " + dir + "/phi.h5")).rc == 0);
    CHECK(test::sh("MHC_MAX_MEMORY=1000000000 " + test::mhc("run -q " + dir + "/phi.h5 " + dir + "/phi_out.h5")).rc == 0);
    auto d = test::sh("MHC_MAX_MEMORY=1000000000 " + test::mhc("diff cpu " + dir + "/phi_out.h5"));
    CHECK(d.rc == 2);
    CHECK(d.err.find("phi_out.h5: /inputs/x: T=4 n=64 D=64 needs about") != std::string::npos);
    // one token of a long row: the diff holds 1 token, not a block of 256 (a review found
    // 1,4,131072 refused at 25.8 GB, where it peaks at 1.1 GB)
    CHECK(test::sh(test::mhc("gen --shape 1,4,16384 --seed 4 " + dir + "/t1.h5")).rc == 0);
    CHECK(test::sh(test::mhc("run -q " + dir + "/t1.h5 " + dir + "/t1_out.h5")).rc == 0);
    CHECK(test::sh("MHC_MAX_MEMORY=1000000000 " + test::mhc("diff cpu " + dir + "/t1_out.h5")).rc == 0);
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer reserves terabytes of address space: no ulimit -v under it
    // an address-space limit (ulimit -v) is a memory limit too: the diff that holds the case
    // whole was an internal error (bad_alloc, exit 3), the streamed run fits its chunks under it
    // (review B, session 21)
    CHECK(test::sh(test::mhc("gen --shape 4096,4,1024 --seed 4 " + dir + "/v.h5")).rc == 0);
    CHECK(test::sh(test::mhc("run -q " + dir + "/v.h5 " + dir + "/v_out.h5")).rc == 0);
    auto v = test::sh("ulimit -v 400000 && " + test::mhc("diff " + dir + "/v_out.h5 cpu --dump-diff " + dir + "/v_d.h5"));
    CHECK(v.rc == 2);
    CHECK(v.err.find("more than the memory limit of") != std::string::npos);
    CHECK(test::sh("ulimit -v 150000 && " + test::mhc("run -q " + dir + "/v.h5 " + dir + "/v_lim.h5")).rc == 0);
    CHECK(test::read_bytes(dir + "/v_lim.h5") == test::read_bytes(dir + "/v_out.h5"));
    // a worker thread's bad_alloc inside an OpenMP region ended in std::terminate (SIGABRT, exit
    // 134, the temporary output left), and check counted the golden's as its failure: one line,
    // exit 2 (review B, session 23)
    auto omp = test::sh("ulimit -v 100000 && OMP_NUM_THREADS=2 " + test::mhc("check cpu --cases quick --only T1_D4096"));
    INFO(omp.out, omp.err);
    CHECK(omp.rc == 2);
    CHECK(omp.err.rfind("mhc: error: out of memory", 0) == 0);
    CHECK(std::count(omp.err.begin(), omp.err.end(), '\n') == 1);
#endif
  }

  TEST_CASE("the backend registry: --help lists every backend with its availability; unknown names list them") {
    auto h = test::sh(test::mhc("--help"));
    CHECK(h.rc == 0);
    for (const Backend& b : backend_table()) CHECK(h.out.find(b.usage) != std::string::npos);
    CHECK((h.out.find("cuda") != std::string::npos &&
           (cuda_built() || h.out.find("unavailable here: this mhc was built without CUDA") != std::string::npos)));
    auto r = test::sh(test::mhc("diff tpu cpu"));
    CHECK(r.rc == 2);
    CHECK(r.err.find("cpu[:fp32|fp64], cuda, exec:COMMAND") != std::string::npos);
    CHECK(test::sh(test::mhc("run --backend cpu:fp16 a.h5 b.h5")).err.find("expected cpu[:fp32|fp64]") != std::string::npos);
    CHECK(test::sh(test::mhc("run --backend cpu: a.h5 b.h5")).err.find("expected cpu[:fp32|fp64]") != std::string::npos);
    CHECK(test::sh(test::mhc("check cpu --against nope")).rc == 2);
    CHECK(test::sh(test::mhc("bench --backend 'exec:true {in} {out}'")).err.find("cannot be timed") != std::string::npos);
    // bench --json is valid JSON whatever --shape holds (a tab, which the parser trims, was copied raw)
    auto j = test::sh(test::mhc("bench --shape \"$(printf '8\\t,4,16')\" --repeat 2 --warmup 0 --json") + " | " + MHC_PYTHON +
                      " -c \"import json, sys; print(json.load(sys.stdin)['pass'])\"");
    CHECK(j.rc == 0);
    CHECK(j.out == "both\n");
  }

  TEST_CASE("exec: a command that fails, hangs, writes nothing, writes garbage or names no file is one clear error") {
    Bad b("exec");
    auto exec = [&](const std::string& command, const std::string& extra = "") {
      return "run " + extra + "--backend 'exec:" + command + "' " + b.in + " " + b.out;
    };
    b.expect_error(exec("false {in} {out}"), {"exec: 'false {in} {out}' exited with status 1"});
    b.expect_error(exec("sleep 30; echo {in} {out}", "--timeout 1 "), {"did not finish within 1 s (--timeout)"});
    b.expect_error(exec("true {in} {out}"), {"wrote no {out} file"});
    b.expect_error(exec("echo garbage > {out}; true {in}"), {"not usable", "{out}: not an HDF5 file"});
    b.expect_error(exec("cp {in} {out}"), {"wrote no stage"});
    // a loop of links at {out}: "internal error: filesystem error", exit 3 (review B, session 22)
    b.expect_error(exec("ln -s {out} {out}; : {in}"), {"exec: cannot read {out} after", "symbolic links"});
    // a misspelled stage of an exec dump was left out of run's output in silence (diff flags it)
    std::ofstream(b.dir + "/typo.py") << "import h5py, sys\nwith h5py.File(sys.argv[1], 'r+') as f:\n"
                                         "    f.move('forward/h_pre', 'forward/H_PRE')\n";
    b.expect_error(exec(std::string(MHC_BIN) + " run -q {in} {out} && " + MHC_PYTHON + " " + b.dir + "/typo.py {out}"),
                   {"/forward/H_PRE is not a stage of the schema", "did you mean /forward/h_pre?", "nothing written"});
    b.expect_error(exec("python3 kernel.py"), {"must name {in}", "{out}"});
    // check reported every case as failed, status 1, where no case could run
    for (const char* args : {"check 'exec:python3 kernel.py' --cases quick", "check cpu --against exec:true --cases quick",
                              "diff 'exec:python3 kernel.py' cpu --shape 3,4,8"})
      b.expect_error(args, {"must name {in}", "{out}"});
    auto r = test::sh(test::mhc(exec("no-such-program-here {in} {out}")));  // the shell's own line comes first
    CHECK(r.rc == 2);
    CHECK(r.err.find("mhc: error: exec: 'no-such-program-here {in} {out}' exited with status 127") != std::string::npos);
    CHECK(!std::filesystem::exists(b.out));
  }

  TEST_CASE("exec: any program that writes the schema is a backend for run, diff and check") {
    Bad b("exec_ok");
    const std::string self = std::string(MHC_BIN) + " run -q {in} {out}";  // the plumbing, not a verdict test
    auto r = test::sh(test::mhc("run -q --backend 'exec:" + self + "' " + b.in + " " + b.out));
    CHECK(r.rc == 0);
    Case got = load_case(b.out, LoadOptions{}, true), want = load_case(b.in, LoadOptions{}, false);
    cpu_run(want, Precision::fp32);
    for (auto& [name, t] : want.t) CHECK(got.get(name).bytes == t.bytes);
    CHECK(got.attrs["backend"] == "exec");
    auto d = test::sh(test::mhc("diff 'exec:" + self + "' cpu --input " + b.in));
    CHECK(d.rc == 0);
    CHECK(d.out.find("15 exact") != std::string::npos);
    // {in} and {out} inside the user's own quotes: the path escaped for them ("{in}" became
    // "'/tmp/../in.h5'", a name with quotes, and the command failed; review D, session 19)
    // Inside "$( .. "{in}" .. )" the scan cannot follow the shell's quoting: the path written
    // there kept literal quotes (and a TMPDIR holding $(..) ran); now it is "$MHC_IN" (review B,
    // session 22). A parent that ignores SIGCHLD (passed on to mhc): the kernel reaped the
    // command itself and mhc failed "No child processes" (review B, session 22)
    // An apostrophe in a comment made the scan take the rest for '...', where the path was pasted
    // as text: a TMPDIR holding $(..) ran (review B, session 24). Comments are skipped now, and
    // inside '...' the path is '"$MHC_IN"'
    const std::string evil = b.dir + "/$(touch " + b.dir + "/PWNED)";
    std::filesystem::create_directories(evil);
    for (const char* quoting : {"\"{in}\" \"{out}\"", "\"$(echo {in})\" '{out}'", "\"$(realpath \"{in}\")\" \"{out}\"",
                                "'{in}' '{out}'", "x'{in}'y {out} # then a word\n", "\"{in}\" {out} # the kernel's dump\ntrue {out}"}) {
      CAPTURE(quoting);
      const std::string q = std::string(MHC_BIN) + " run -q " + quoting;
      for (const std::string& tmp : {std::string(), evil}) {
        auto qr = test::sh((tmp.empty() ? "" : "TMPDIR=" + test::shell_quote(tmp) + " ") +
                           test::mhc(cat("run -q --force --backend ", test::shell_quote("exec:" + q), " ", b.in, " ", b.out)));
        CAPTURE(qr.err);
        CHECK(!std::filesystem::exists(b.dir + "/PWNED"));
        // x'/tmp/..'y: no such file, as with any shell; inside $( .. ) an unquoted $MHC_IN is split
        // at the space of the evil TMPDIR (an error, not code)
        const std::string qs = quoting;
        if (qs.rfind("x'", 0) == 0)
          CHECK(qr.rc == 2);
        else if (tmp.empty() || qs.find("$(") == std::string::npos)
          CHECK(qr.rc == 0);
      }
    }
    auto commented = test::sh("TMPDIR=" + test::shell_quote(evil) + " " +
                              test::mhc(cat("run -q --force --backend ", test::shell_quote("exec:true # the kernel's dump\ncp " + b.out + " {out} # {in}"),
                                            " ", b.in, " ", b.out)));
    CAPTURE(commented.err);
    CHECK(commented.rc == 0);
    CHECK(!std::filesystem::exists(b.dir + "/PWNED"));
    // stdin is /dev/null: a command that read it (the terminal: input(), a breakpoint) was stopped
    // by SIGTTIN, and mhc waited out --timeout (review B, session 24)
    auto stdin_null = test::sh("echo typed | " + test::mhc(cat("run -q --force --backend ", test::shell_quote(cat(
                          "exec:[ \"$(readlink /proc/$$/fd/0)\" = /dev/null ] && cp ", b.out, " {out} # {in}")), " ", b.in, " ", b.dir, "/stdin.h5")));
    CAPTURE(stdin_null.err);
    CHECK(stdin_null.rc == 0);
    auto ig = test::sh("env --ignore-signal=CHLD " + test::mhc("run -q --force --backend 'exec:" + self + "' " + b.in + " " + b.out));
    CAPTURE(ig.err);
    CHECK(ig.rc == 0);
    // a command of 70 KB (its attribute in the output was over libhdf5's 64 KiB: a working kernel
    // failed "cannot write"; review B, session 21): kept, cut to 16 KiB with its length
    const std::string pad = "# " + std::string(70000, 'x');
    auto lr = test::sh(test::mhc(cat("run -q --force --backend 'exec:", self, " ", pad, "' ", b.in, " ", b.out)));
    CHECK(lr.rc == 0);
    {
      H5::H5File lf(b.out, H5F_ACC_RDONLY);
      H5::Attribute la = lf.openAttribute("command");
      std::string cmd;
      la.read(la.getStrType(), cmd);
      CHECK(cmd.size() < 16500);
      CHECK(cmd.find(cat(self.size() + pad.size() + 1, " bytes in all)")) != std::string::npos);
    }
    auto c = test::sh(test::mhc("check 'exec:" + self + "' --against cpu --cases quick"));
    INFO(c.out, c.err);
    CHECK(c.rc == 0);
    CHECK(c.out.find(" passed, 0 failed") != std::string::npos);
  }

  TEST_CASE("check: a FIFO or /dev/zero as --cases, a file as --keep, a case too large: exit 2 before any case runs") {
    const std::string dir = test::tmpdir("check_args");
    REQUIRE(test::sh(cat("rm -f ", dir, "/fifo && mkfifo ", dir, "/fifo && touch ", dir, "/file && printf 'a 4,2,4\\nhuge "
                         "100000,8,8192\\n' > ", dir, "/cases.txt")).rc == 0);
    for (const std::string& args : {"--cases " + dir + "/fifo", std::string("--cases /dev/zero"),
                                    "--cases quick --keep " + dir + "/file", "--cases " + dir + "/cases.txt"}) {
      CAPTURE(args);
      auto r = test::sh("timeout 20 " + test::mhc("check cpu " + args));
      CHECK(r.rc == 2);
      CHECK(r.out.find("ok ") == std::string::npos);  // no case ran
    }
    // an unusable TMPDIR is the environment's fault: it was every case failing, exit 1
    auto t = test::sh("TMPDIR=" + dir + "/missing " + test::mhc("check 'exec:cp {in} {out}' --cases quick"));
    CHECK(t.rc == 2);
    CHECK(t.err.find("cannot create a temporary directory in TMPDIR=" + dir + "/missing") != std::string::npos);
    CHECK(t.out.find("FAIL") == std::string::npos);
    // --keep onto a directory that takes no files (a read-only mount): one line before the sweep,
    // not libhdf5's errno text at every failing case (review B, session 24)
    const std::string ro = dir + "/ro";
    std::filesystem::create_directories(ro);
    if (test::sh("mount -t tmpfs -o ro tmpfs " + ro + " 2>/dev/null").rc != 0) {
      MESSAGE("not checked: --keep on a read-only directory (cannot mount a tmpfs here)");
    } else {
      auto k = test::sh(test::mhc("check cpu --cases quick --keep " + ro));
      test::sh("umount " + ro);
      CHECK(k.rc == 2);
      CHECK(k.err.find("--keep " + ro + ": no file can be written there (Read-only file system)") != std::string::npos);
      CHECK(k.out.find("FAIL") == std::string::npos);
    }
  }

  TEST_CASE("check --vary: a kernel wrong at one split count only is named by it") {
    const std::string kernel = std::string("exec:if [ \"$SPLITS\" = 2 ]; then echo bad > {out}; else ") + MHC_BIN +
                               " run -q {in} {out}; fi";
    auto r = test::sh(test::mhc("check '" + kernel + "' --cases quick --vary SPLITS=1,2,4 --against cpu"));
    INFO(r.out, r.err);
    CHECK(r.rc == 1);
    CHECK(r.out.find("21 cases: 14 passed, 7 failed") != std::string::npos);
    CHECK(r.out.find("all 7 failures have SPLITS = 2") != std::string::npos);
    CHECK(r.out.find("passing cases)") == std::string::npos);  // SPLITS = 2 separates them: no count
    // a trait that passing cases have too is named with how many (review A, session 24): a kernel
    // failing n6 (64,6,64) and bs2x300 (2,300,4,64), whose D = 64 two passing cases share
    const std::string picky = test::tmpdir("check_picky") + "/picky.sh";
    std::ofstream(picky) << "/usr/bin/python3 -c \"import h5py, sys; s = h5py.File(sys.argv[1])['inputs/x'].shape; "
                            "sys.exit(1 if s[-1] == 64 and s != (64, 4, 64) else 0)\" \"$1\" && " << MHC_BIN << " run -q \"$1\" \"$2\"\n";
    auto pk = test::sh(test::mhc("check 'exec:sh " + picky + " {in} {out}' --cases quick --against cpu"));
    INFO(pk.out, pk.err);
    CHECK(pk.rc == 1);
    CHECK(pk.out.find("all 2 failures have D = 64 (as do 2 of the 5 passing cases)") != std::string::npos);
    CHECK(r.out.find("n6@SPLITS=2") != std::string::npos);
    CHECK(test::sh(test::mhc("check cpu --vary SPLITS")).rc == 2);
    // an in-process backend reads its environment once: --vary changed nothing and said nothing
    auto cpu = test::sh(test::mhc("check cpu --cases quick --vary OMP_NUM_THREADS=1,2"));
    CHECK(cpu.rc == 2);
    CHECK(cpu.err.find("needs an exec backend") != std::string::npos);
    // one failure whose traits passing cases share: named as such, not as "the failure has D = 8"
    const std::string dir = test::tmpdir("check_one");
    std::ofstream(dir + "/cases.txt") << "a 8,4,8\nb 8,4,8\nc 16,4,8\n";
    const std::string second = cat("exec:n=$(cat ", dir, "/count 2>/dev/null || echo 0); echo $((n + 1)) > ", dir,
                                   "/count; if [ $n = 1 ]; then echo bad > {out}; else ", MHC_BIN, " run -q {in} {out}; fi");
    auto one = test::sh(test::mhc("check '" + second + "' --cases " + dir + "/cases.txt --against cpu"));
    INFO(one.out, one.err);
    CHECK(one.rc == 1);
    CHECK(one.out.find("one case failed, b: passing cases share each of its traits") != std::string::npos);
    CHECK(one.out.find("the failure has") == std::string::npos);
  }

  TEST_CASE("check: cases, --only, --json, --keep and a file of cases") {
    std::string dir = test::tmpdir("check");
    auto j = test::sh(test::mhc("check cpu --cases quick --only n6 --json"));
    CHECK(j.rc == 0);
    CHECK(j.out.find("\"backend\": \"cpu:fp32\", \"against\": \"cpu:fp64\"") != std::string::npos);
    CHECK(j.out.find("\"name\": \"n6\", \"shape\": \"64,6,64\", \"passed\": true, \"verdict\": \"match\"") !=
          std::string::npos);
    CHECK(j.out.find("\"passed\": 1, \"failed\": 0") != std::string::npos);
    {
      std::ofstream f(dir + "/cases.txt");
      f << "# name shape options\nodd 5,3,7 no_gamma x_exp=-3\nwide 2,3,4,300 forward_only\n";
    }
    auto t = test::sh(test::mhc("check cpu:fp64 --against cpu --cases " + dir + "/cases.txt --repeat 2"));
    CHECK(t.rc == 0);
    CHECK(t.out.find("2 cases: 2 passed, 0 failed") != std::string::npos);
    CHECK(test::sh(test::mhc("check cpu --only nothing-matches")).rc == 2);
    {
      std::ofstream f(dir + "/bad.txt");
      f << "odd 5,3,7 sparkly\n";
    }
    auto bad = test::sh(test::mhc("check cpu --cases " + dir + "/bad.txt"));
    CHECK(bad.rc == 2);
    CHECK(bad.err.find("bad.txt:1: unknown option 'sparkly'") != std::string::npos);
    std::ofstream(dir + "/bad_shape.txt") << "fine 2,4,8\nodd 1,2,3,4,5\n";  // named by file and line, not as --shape
    auto bs = test::sh(test::mhc("check cpu --cases " + dir + "/bad_shape.txt"));
    CHECK(bs.rc == 2);
    CHECK(bs.err.find("bad_shape.txt:2: shape 1,2,3,4,5: expected T,n,D or B,S,n,D") != std::string::npos);
    // --keep: a DIR whose parent is missing is made before the sweep (it ended the sweep at the
    // first failure); a case name or --vary value with '/' stays inside DIR
    std::ofstream(dir + "/odd_names.txt") << "../esc 3,1,1\n";
    auto k = test::sh(test::mhc("check 'exec:false {in} {out}' --cases " + dir + "/odd_names.txt --vary V=x/y --keep " + dir +
                                "/new/kept"));
    CHECK(k.rc == 1);
    CHECK(std::filesystem::exists(dir + "/new/kept/_.._esc@V=x_y.in.h5"));
    CHECK(!std::filesystem::exists(dir + "/new/esc@V=x_y.in.h5"));
    // a file of cases in DIR named as a failing case's kept inputs is not replaced by them (it
    // was, review B, session 20): that case's files are not kept, and the reason says why
    std::filesystem::create_directories(dir + "/kc");
    std::ofstream(dir + "/kc/c1.in.h5") << "c1 4,2,8\n";
    auto kc = test::sh("cd " + dir + "/kc && " + test::mhc("check 'exec:false {in} {out}' --cases c1.in.h5 --keep ."));
    CHECK(kc.rc == 1);
    CHECK(test::read_bytes(dir + "/kc/c1.in.h5") == "c1 4,2,8\n");
    CHECK(kc.out.find("not kept: ./c1.in.h5: an input reads this file") != std::string::npos);
    CHECK(kc.out.find(": 1 case (c1.in.h5)") != std::string::npos);
    // a case kept by an earlier sweep with both runs, failing now without them: its old runs go,
    // not left beside the new inputs for the summary's diff (review B, session 21)
    std::ofstream(dir + "/kc/one.txt") << "c2 3,2,8\n";
    for (const char* side : {"a", "ref"}) std::ofstream(dir + "/kc/c2." + side + ".h5") << "an earlier sweep's run";
    CHECK(test::sh("cd " + dir + "/kc && " + test::mhc("check 'exec:false {in} {out}' --cases one.txt --keep .")).rc == 1);
    CHECK(std::filesystem::exists(dir + "/kc/c2.in.h5"));
    CHECK(!std::filesystem::exists(dir + "/kc/c2.a.h5"));
    CHECK(!std::filesystem::exists(dir + "/kc/c2.ref.h5"));
    // a symbolic link planted at a kept file's name is not written through: its target (any file)
    // was replaced with the case's HDF5 bytes, without --force (review B, session 23)
    std::filesystem::create_directories(dir + "/kl");
    std::ofstream(dir + "/victim.txt") << "precious\n";
    std::filesystem::create_symlink(dir + "/victim.txt", dir + "/kl/c2.in.h5");
    auto kl = test::sh("cd " + dir + "/kc && " + test::mhc("check 'exec:false {in} {out}' --cases one.txt --keep ../kl"));
    CHECK(kl.rc == 1);
    CHECK(test::read_bytes(dir + "/victim.txt") == "precious\n");
    CHECK(kl.out.find("not kept: ../kl/c2.in.h5: is a symbolic link") != std::string::npos);
    for (const char* e : {"x_exp=zz", "x_exp=99999999999", "x_exp=51", "x_exp=-51", "x_exp=", "x_exp=3x"}) {
      CAPTURE(e);
      std::ofstream(dir + "/exp.txt") << "odd 5,3,7 " << e << "\n";
      auto x = test::sh(test::mhc("check cpu --cases " + dir + "/exp.txt"));
      CHECK(x.rc == 2);
      CHECK(x.err.find(cat("exp.txt:1: ", e, ": expected x_exp=E with E an integer from -50 to 50")) != std::string::npos);
    }
  }
}
