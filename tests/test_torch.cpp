// test_torch.cpp — the golden against PyTorch autograd (tests/torch_reference.py, run by
// ctest as the torch_reference fixture): fp64 to ~1e-12, fp32 within the diff's budget.
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
      }
    }
    CHECK(files == 7);
  }
}
