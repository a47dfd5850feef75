// test_cuda_memory.cpp — the CUDA backend's device-memory plan (cuda_backend.h), which needs no
// GPU: which stages a run keeps on the device, and the bytes of a case, against a count by hand.
#include <doctest/doctest.h>

#include <cmath>

#include "cuda_backend.h"

using namespace mhc;

namespace {

std::vector<std::string> on_device(Group g, bool backward, bool keep_dvecX) {
  std::vector<std::string> names;
  for (const Stage& s : stage_table())
    if (s.group == g && cuda_on_device(s, backward, keep_dvecX)) names.push_back(s.name);
  return names;
}

// Every device allocation of a run, written out from the schema (docs/schema.md) and BwdParams.
double by_hand(const Problem& p, bool backward, bool dvecX, const CudaGeometry& g) {
  const double T = double(p.T()), n = double(p.n), D = double(p.D), K = n * D, N = n * n + 2 * n;
  double b = 2 * T * K + 4 * 3 + 4 * N + 4 * N * K;                 // x, alpha, bias, pg
  b += 4 * T * (1 + N + n + n + n * n) + 2 * T * D;                 // inv_rms h_mix h_pre h_post h_res, h_in
  b += 4 * double(g.fwd_scratch_floats);                            // the forward's scratch
  if (!backward) return b;
  b += 2 * T * D + 4 * T * n + 4 * T * n * n + 4 * N * K + 4 * K;   // dh_in dh_post dh_res phi gamma
  b += 4 * T * (n + N + 1) + 2 * T * K + (dvecX ? 4 * T * K : 0);   // dh_pre dh_mix dinv_rms, dx, dvecX
  b += 4 * T * N + 4 * T * 3 + 4 * double(g.splits) * N * K;         // g_tok, a_tok, partial
  b += 4 * N * K + 4 * 3 + 4 * N + 4 * K;                            // dphi dalpha dbias dgamma
  return b;
}

}  // namespace

TEST_SUITE("cuda_memory") {
  TEST_CASE("the stages on the device come from the stage table") {
    using V = std::vector<std::string>;
    CHECK(on_device(Group::inputs, false, false) == V{"x", "alpha", "bias"});  // phi, gamma: folded into pg
    CHECK(on_device(Group::inputs, true, false) == V{"x", "phi", "alpha", "bias", "gamma", "dh_in", "dh_post", "dh_res"});
    CHECK(on_device(Group::forward, false, false) == V{"inv_rms", "h_mix", "h_pre", "h_post", "h_res", "h_in"});
    CHECK(on_device(Group::backward, false, true).empty());
    CHECK(on_device(Group::backward, true, false) ==
          V{"dh_pre", "dh_mix", "dinv_rms", "dx", "dphi", "dalpha", "dbias", "dgamma"});
    CHECK(on_device(Group::backward, true, true) ==
          V{"dh_pre", "dh_mix", "dinv_rms", "dvecX", "dx", "dphi", "dalpha", "dbias", "dgamma"});
    V uploaded;  // what a backward alone takes from the case
    for (const Stage& s : stage_table())
      if (cuda_backward_reads(s)) uploaded.push_back(s.name);
    CHECK(uploaded == V{"inv_rms", "h_mix", "h_pre", "h_post"});
  }

  TEST_CASE("cuda_case_bytes counts every allocation") {
    for (const char* shape : {"1,1,1", "64,4,96", "2,32,4,256", "4096,8,4096", "333,3,77"}) {
      Problem p = parse_shape(shape);
      CudaGeometry g;
      g.fwd_scratch_floats = 12345, g.splits = 7;
      for (bool backward : {false, true})
        for (bool dvecX : {false, true}) {
          CAPTURE(shape);
          CAPTURE(backward);
          CAPTURE(dvecX);
          CHECK(cuda_case_bytes(p, backward, dvecX, g) == by_hand(p, backward, dvecX, g));
        }
    }
    // T = 2, n = 1, D = 3 (K = 3, N = 3), item by item. Forward: x 12, alpha 12, bias 12, pg 36,
    // inv_rms 8, h_mix 24, h_pre 8, h_post 8, h_res 8, h_in 12, scratch 5 floats 20: 160.
    // Backward: dh_in 12, dh_post 8, dh_res 8, phi 36, gamma 12, dh_pre 8, dh_mix 24, dinv_rms 8,
    // dx 12, g_tok 24, a_tok 24, partial 2 splits 72, dphi 36, dalpha 12, dbias 12, dgamma 12: 320;
    // dvecX 24.
    CudaGeometry g;
    g.fwd_scratch_floats = 5, g.splits = 2;
    Problem p = parse_shape("2,1,3");
    CHECK(cuda_case_bytes(p, false, false, g) == 160);
    CHECK(cuda_case_bytes(p, false, true, g) == 160);
    CHECK(cuda_case_bytes(p, true, false, g) == 160 + 320);
    CHECK(cuda_case_bytes(p, true, true, g) == 160 + 320 + 24);
  }

  TEST_CASE("shapes beyond the kernels' 32-bit indices are refused, by a line that says why") {
    // the bounds: n·D up to 2^31 - 4096 (a review found mix_finish's column ranges would pass
    // 2^31 at T=1 n=1 D=2147483449, and int(D) wrap beyond), T up to 2^31 - 1 (token_grads'
    // grid); the last supported value of each, then one past it
    CHECK(cuda_unsupported(parse_shape("1,1,2147479552")).empty());
    CHECK(cuda_unsupported(parse_shape("1,8,268434944")).empty());
    CHECK(cuda_unsupported(parse_shape("2147483647,4,4096")).empty());
    CHECK(cuda_unsupported(parse_shape("4096,4,7168")).empty());
    CHECK(cuda_unsupported(parse_shape("1,1,2147479553")) ==
          "the cuda backend supports n*D up to 2147479552, this case has n*D = 1*2147479553");
    CHECK(cuda_unsupported(parse_shape("1,8,268434945")) ==
          "the cuda backend supports n*D up to 2147479552, this case has n*D = 8*268434945");
    CHECK(cuda_unsupported(parse_shape("1,2,4294967297")) ==  // int(D) would have been 1
          "the cuda backend supports n*D up to 2147479552, this case has n*D = 2*4294967297");
    Problem wraps;  // n·D overflows int64 (parse_shape refuses it; a file's shape reaches here)
    wraps.tokens = {1}, wraps.n = 8, wraps.D = int64_t(1) << 61;
    CHECK(cuda_unsupported(wraps) ==
          "the cuda backend supports n*D up to 2147479552, this case has n*D = 8*2305843009213693952");
    CHECK(cuda_unsupported(parse_shape("2147483648,4,4096")) ==
          "the cuda backend supports up to 2147483647 tokens, this case has 2147483648");
    CHECK(cuda_unsupported(parse_shape("65536,32768,4,4096")) ==  // B·S
          "the cuda backend supports up to 2147483647 tokens, this case has 2147483648");
    CHECK(cuda_unsupported(parse_shape("2,9,4")) == "the cuda backend supports n = 1..8, this case has n = 9");
  }

  TEST_CASE("a shape far beyond any device does not overflow the count") {
    Problem p = parse_shape("1099511627776,8,65536");  // T = 2^40: 2^40 * 2^19 elements of x
    CudaGeometry g;
    double b = cuda_case_bytes(p, true, true, g);
    CHECK(std::isfinite(b));
    CHECK(b > 2.0 * std::ldexp(1.0, 59));  // x alone is 2^60 bytes
    CHECK(b == by_hand(p, true, true, g));
  }
}
