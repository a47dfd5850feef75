// test_torch.cpp — the golden against PyTorch autograd (tests/torch_reference.py, run by
// ctest as the torch_reference fixture): fp64 to ~1e-12, fp32 within the diff's budget; with
// saturated pre and post gates, their gradients' stages element by element.
#include <doctest/doctest.h>

#include <cmath>

#include "diff.h"
#include "h5io.h"
#include "support.h"

using namespace mhc;

TEST_SUITE("torch") {
  TEST_CASE("every stage equals PyTorch autograd in float64") {
    int files = 0;
    for (auto& e : std::filesystem::directory_iterator(MHC_TORCH_DIR)) {
      if (e.path().extension() != ".h5") continue;
      ++files;
      CAPTURE(e.path().string());
      Case ref = load_case(e.path().string(), LoadOptions{}, true);
      Case mine = ref.inputs_only();
      cpu_run(mine, Precision::fp64);
      for (const Stage& s : stage_table()) {
        if (s.group == Group::inputs) continue;
        INFO("stage ", s.name);
        REQUIRE(ref.has(s.name));
        const Tensor &a = mine.get(s.name), &b = ref.get(s.name);
        REQUIRE(a.shape == b.shape);
        double num = 0, den = 0;
        for (int64_t i = 0; i < a.size(); ++i) num += std::pow(a.at(i) - b.at(i), 2), den += b.at(i) * b.at(i);
        CHECK(std::sqrt(num / den) < 1e-12);
      }
      // the fp32 golden passes the diff against autograd, so does the fp64 oracle
      for (Precision prec : {Precision::fp32, Precision::fp64}) {
        Case c = ref.inputs_only();
        cpu_run(c, prec);
        CHECK(test::diff(c, ref).match());
        if (e.path().filename().string().rfind("torch_sat_", 0) != 0) continue;
        // pre bias[i] near -25 (even i): g_pre = dh_pre s (1 - s) with s ~ 1e-11 << hc_eps; near
        // +30 (odd i): 1 - s ~ 1e-13, where h_pre = 1 + hc_eps rounds. Post bias[n + i] near +30 and
        // +38: g_post = dh_post h_post (1 - h_post/2) with 1 - h_post/2 ~ 1e-13 and 3e-17, which
        // cancels (0 in fp32, and in fp64 at +38); near -25 for the last. Each element of dh_mix's
        // pre and post columns to its own value, and of dbias's to the sum of its terms' sizes
        // |g[t,j]| (a sum over tokens may cancel), not to the stage's RMS: s recovered as h_pre -
        // hc_eps kept two digits in fp32 at -25, and made s (1 - s) 1e6 times too large at +30.
        const double rel = prec == Precision::fp64 ? 1e-12 : 1e-5;
        const int64_t n = ref.prob.n, N = ref.prob.N(), T = ref.prob.T();
        const Tensor &dhm = ref.get("dh_mix"), &ir = ref.get("inv_rms");
        for (int64_t j = 0; j < 2 * n; ++j) {
          double size = 0, mix = 0;  // size: sum_t |g[t,j]|, g = dh_mix / (alpha inv_rms)
          for (int64_t t = 0; t < T; ++t) {
            const double m = dhm.at(t * N + j);
            size += std::abs(m / (ref.get("alpha").at(j < n ? 0 : 1) * ir.at(t)));
            mix = std::max(mix, std::abs(c.get("dh_mix").at(t * N + j) - m) / std::abs(m));
          }
          const double bias = std::abs(c.get("dbias").at(j) - ref.get("dbias").at(j)) / size;
          INFO(std::string(precision_name(prec)), j < n ? " pre gate " : " post gate ", j % n);
          CHECK(mix < rel);
          CHECK(bias < rel);
        }
      }
    }
    CHECK(files == 8);
  }
}
