// test_cuda.cpp — the CUDA backend against the CPU golden over a sweep of shapes, bitwise
// determinism, and clear errors. Exits 77 (ctest: skipped) when there is no CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "diff.h"
#include "support.h"

using namespace mhc;

namespace {

Case on_cuda(const Case& in) {
  Case c = in.inputs_only();
  cuda_run(c, Pass::both, true);
  return c;
}

// Holds all of the device's free memory but `leave` to 128 MiB more while it lives: another
// process (mhc) then finds about that much free.
struct HoldDeviceMemory {
  std::vector<std::unique_ptr<void, cudaError_t (*)(void*)>> held;
  explicit HoldDeviceMemory(size_t leave) {
    const size_t chunk = size_t(128) << 20;
    size_t free = 0, total = 0;
    for (CUDA_CHECK(cudaMemGetInfo(&free, &total)); free > leave + chunk; CUDA_CHECK(cudaMemGetInfo(&free, &total))) {
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, chunk));
      held.emplace_back(p, &cudaFree);
    }
  }
};

}  // namespace

TEST_CASE("mhc check cuda: within budget of the fp64 oracle and repeatable over the sweep") {
  // the sweep is a case file of mhc check: tests/cuda_sweep.txt (n = 1..8, odd D, T = 1,
  // [B,S], no gamma, float32 inputs, saturating gates, extreme x, forward only)
  auto r = test::sh(test::mhc(cat("check cuda --cases ", MHC_SOURCE_DIR, "/tests/cuda_sweep.txt --repeat 2")));
  INFO(r.out, r.err);
  CHECK(r.rc == 0);
  CHECK(r.out.find(" passed, 0 failed") != std::string::npos);
  auto d = test::sh(test::mhc("check cuda --against cpu --cases default"));  // the golden as the reference
  INFO(d.out, d.err);
  CHECK(d.rc == 0);
}

TEST_CASE("cuda is bitwise deterministic from run to run") {
  for (const char* shape : {"4096,4,2560", "333,8,77"}) {
    INFO("shape ", shape);
    Case in = generate_case(parse_shape(shape), 5, true);
    Case a = on_cuda(in), b = on_cuda(in);
    for (const Stage& s : stage_table()) {
      INFO("stage ", s.name);
      CHECK(a.get(s.name).bytes == b.get(s.name).bytes);
    }
  }
}

TEST_CASE("a token's forward bits do not depend on T (kernels, token tiles and the split of phi*gamma change with T)") {
  // forward.cu, plan: the full T of each shape takes mix_partial, the next one mix_group on
  // split_pg's planes, the last mix_group splitting phi*gamma itself (at 4096,4,4096: T = 200 in
  // one block per (warp tile, group), T = 100 in a block per n8 tile of j too). The shapes: whole groups
  // (K = 16384); N = 63 with one m16 tile a warp and K % 8 != 0; odd K (element-wise loads and
  // split) with a short last group; one group of two chunks.
  struct Shape {
    const char* full;
    std::vector<int64_t> fewer;
  };
  for (const Shape& sh : {Shape{"4096,4,4096", {1000, 200, 100}}, Shape{"11000,7,300", {1000, 100}},
                          Shape{"16400,3,1111", {1000, 17}}, Shape{"65600,5,13", {5000, 200}}}) {
    const Case big = generate_case(parse_shape(sh.full), 6, false);
    Case a = big.inputs_only();
    cuda_run(a, Pass::fwd, false);
    const Tensor& x = big.get("x");
    for (int64_t T : sh.fewer) {
      Case small = big.inputs_only();
      Tensor& xs = small.t["x"];
      xs.shape = {T, x.shape[1], x.shape[2]};
      xs.bytes.resize(size_t(T * x.shape[1] * x.shape[2] * 2));
      small.prob.tokens = {T};
      cuda_run(small, Pass::fwd, false);
      for (const char* s : {"inv_rms", "h_mix", "h_pre", "h_post", "h_res", "h_in"}) {
        INFO("shape ", sh.full, ", T ", T, ", stage ", s);
        const Tensor &ta = a.get(s), &tb = small.get(s);
        CHECK(std::equal(tb.bytes.begin(), tb.bytes.end(), ta.bytes.begin()));
      }
    }
  }
}

TEST_CASE("dvecX only when asked; backward alone from given forward stages") {
  Case in = generate_case(parse_shape("64,4,96"), 8, true);
  Case c = in.inputs_only();
  cuda_run(c, Pass::both, false);
  CHECK(!c.has("dvecX"));
  CHECK(c.has("dx"));
  Case f = in.inputs_only();
  cpu_run(f, Precision::fp32, Pass::fwd);
  cuda_run(f, Pass::bwd, true);
  References refs(in);
  CHECK(diff_cases(f, refs.oracle(), {}).match());
}

TEST_CASE("unsupported n is a clear error") {
  Case in = generate_case(parse_shape("2,9,4"), 1, true);
  CHECK_THROWS_WITH_AS(cuda_run(in, Pass::both, false), "the cuda backend supports n = 1..8, this case has n = 9",
                       UserError);
}

TEST_CASE("a case larger than the device is a user error that says how much memory it needs") {
  Case huge;  // the shape alone: the check comes before anything is read or allocated
  huge.prob = parse_shape("134217728,4,4096");  // x alone is 4 TiB
  std::string msg;
  try {
    cuda_run(huge, Pass::both, false);
  } catch (const UserError& e) {
    msg = e.what();
  }
  INFO(msg);
  const char* head = "cuda: the case needs ";
  REQUIRE(msg.rfind(head, 0) == 0);
  CHECK(std::strtod(msg.c_str() + std::strlen(head), nullptr) >= 4096.0);  // GiB
  CHECK(msg.find(" GiB of device memory (T=134217728 n=4 D=4096, forward), the device has ") != std::string::npos);
  CHECK(msg.find(" GiB free of ") != std::string::npos);
  Case small = generate_case(parse_shape("64,4,96"), 3, true);  // nothing left behind: a case that fits runs
  CHECK_NOTHROW(on_cuda(small));
}

TEST_CASE("out of device memory in any CUDA call is a user error, and no error is left behind") {
  void* p = nullptr;
  CHECK_THROWS_AS(CUDA_CHECK(cudaMalloc(&p, size_t(1) << 50)), CudaOutOfMemory);  // 1 PiB
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("mhc run: a case larger than the device's free memory is exit 2, one line saying what it needs") {
  // x, dx and dvecX alone are 2 GiB; mhc finds at most 1.125 GiB free (less its own context)
  std::string dir = test::tmpdir("cuda_oom"), in = dir + "/in.h5", out = dir + "/out.h5";
  auto g = test::sh(test::mhc(cat("gen --shape 4096,4,16384 --seed 1 ", in)));
  INFO(g.err);
  REQUIRE(g.rc == 0);
  HoldDeviceMemory hold(size_t(1) << 30);
  test::expect_error(cat("run --backend cuda --dump-intermediates ", in, " ", out),
                     {"mhc: error: cuda: the case needs ",
                      " GiB of device memory (T=4096 n=4 D=16384, forward + backward, dvecX kept), the device has ",
                      " GiB free of "},
                     dir, in, out);
  std::filesystem::remove_all(dir);  // 640 MB
}

TEST_CASE("mhc diff cpu cuda on the example matches") {
  auto r = test::sh(test::mhc(std::string("diff cpu cuda --input ") + MHC_SOURCE_DIR + "/data/example.h5"));
  INFO(r.out, r.err);
  CHECK(r.rc == 0);
  auto g = test::sh(test::mhc("diff cuda cpu"));  // exactly as typed: a generated default case
  INFO(g.out, g.err);
  CHECK(g.rc == 0);
}

int main(int argc, char** argv) {
  try {
    std::cout << "CUDA device: " << cuda_device_name() << "\n";
  } catch (const UserError& e) {
    std::cout << "SKIPPED: " << e.what() << "\n";
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
