// test_numerics.cpp — the golden is right: finite differences of every gradient in fp64,
// fp32 within rounding of fp64, and the same bits on any thread count.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>

#include "support.h"

using namespace mhc;

namespace {

// L = sum dh_in·h_in + sum dh_post·h_post + sum dh_res·h_res: the scalar whose gradients
// the backward computes, given the upstream gradients of the case.
double loss(const Case& c) {
  double l = 0;
  for (auto [out, grad] : {std::pair{"h_in", "dh_in"}, std::pair{"h_post", "dh_post"}, std::pair{"h_res", "dh_res"}}) {
    const Tensor &o = c.get(out), &g = c.get(grad);
    for (int64_t i = 0; i < o.size(); ++i) l += o.at(i) * g.at(i);
  }
  return l;
}

// An fp64 case whose x and dh_in are float64 tensors, so they can be perturbed freely.
Case fp64_case(const Problem& p, uint64_t seed) {
  Case c = generate_case(p, seed, true);
  for (auto& [name, t] : c.t) t = convert(t, DType::f64);
  cpu_run(c, Precision::fp64);
  return c;
}

// Central difference of the loss with respect to every element of `wrt`, against `grad`.
// `from` is the stage after which the forward is recomputed (wrt itself for intermediates).
void check_gradient(Case c, const std::string& wrt, const std::string& grad, const std::string& from) {
  const Tensor g = c.get(grad);
  const int64_t count = c.get(wrt).size();
  REQUIRE(g.size() == count);
  double scale = 0;
  for (int64_t i = 0; i < count; ++i) scale = std::max(scale, std::fabs(g.at(i)));
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double v = c.get(wrt).at(i), h = 1e-6 * std::max(1.0, std::fabs(v));
    double l[2];
    for (int side = 0; side < 2; ++side) {
      c.t[wrt].set(i, side ? v - h : v + h);
      test::recompute_after(c, from, Precision::fp64);
      l[side] = loss(c);
    }
    c.t[wrt].set(i, v);
    worst = std::max(worst, std::fabs((l[0] - l[1]) / (2 * h) - g.at(i)));
  }
  INFO("d/d", wrt, " vs ", grad, ": worst error ", worst, ", largest gradient ", scale);
  CHECK(scale > 0);
  CHECK(worst <= 1e-6 * scale);
}

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("finite differences of every gradient, fp64") {
    for (const char* shape : {"3,4,5", "2,3,3", "1,2,1", "2,1,2,6"}) {
      INFO("shape ", shape);
      Case c = fp64_case(parse_shape(shape), 11);
      // leaves: recompute the whole forward
      check_gradient(c, "x", "dx", "x");
      check_gradient(c, "phi", "dphi", "x");
      check_gradient(c, "alpha", "dalpha", "x");
      check_gradient(c, "bias", "dbias", "x");
      check_gradient(c, "gamma", "dgamma", "x");
      // intermediates: recompute what follows them
      check_gradient(c, "h_pre", "dh_pre", "h_pre");
      check_gradient(c, "h_mix", "dh_mix", "h_mix");
      check_gradient(c, "inv_rms", "dinv_rms", "inv_rms");
    }
  }

  TEST_CASE("a wrong gradient is caught") {  // the check above can fail
    Case c = fp64_case(parse_shape("2,2,3"), 5);
    c.t["dgamma"].set(1, c.t["dgamma"].at(1) * 1.001);
    Tensor g = c.get("dgamma");
    const double v = c.get("gamma").at(1), h = 1e-6;
    c.t["gamma"].set(1, v + h), test::recompute_after(c, "x", Precision::fp64);
    double lp = loss(c);
    c.t["gamma"].set(1, v - h), test::recompute_after(c, "x", Precision::fp64);
    double lm = loss(c);
    CHECK(std::fabs((lp - lm) / (2 * h) - g.at(1)) > 1e-6 * std::fabs(g.at(1)));
  }
}

TEST_SUITE("precision") {
  TEST_CASE("fp32 golden agrees with the fp64 oracle within rounding") {
    for (const char* shape : {"64,4,256", "7,6,33", "2,3,8,1"}) {
      INFO("shape ", shape);
      Problem p = parse_shape(shape);
      Case a = test::golden(p, 3, Precision::fp32), b = test::golden(p, 3, Precision::fp64);
      for (const Stage& s : stage_table()) {
        if (s.group == Group::inputs) continue;
        INFO("stage ", s.name);
        const Tensor &x = a.get(s.name), &y = b.get(s.name);
        REQUIRE(x.dtype == s.dtype);
        REQUIRE(y.dtype == DType::f64);
        REQUIRE(x.shape == y.shape);
        double num = 0, den = 0, worst = 0;
        for (int64_t i = 0; i < x.size(); ++i) {
          double d = x.at(i) - y.at(i);
          num += d * d, den += y.at(i) * y.at(i);
        }
        const double rms = std::sqrt(den / double(y.size()));
        for (int64_t i = 0; i < x.size(); ++i)  // beyond half a bf16 ulp, in units of fp32 noise
          worst = std::max(worst, std::fabs(x.at(i) - y.at(i)) - 0.5 * bf16_ulp(y.at(i)));
        if (s.dtype == DType::bf16) {
          // round-to-nearest of a value accurate to fp32 (which near zero is all that counts)
          CHECK(worst <= 1e-6 * rms);
        } else {
          CHECK(std::sqrt(num / den) < 2e-6);  // fp32 accumulation over at most K terms
        }
      }
    }
  }

  TEST_CASE("fp64 stores every stage as float64, h_in and dx unrounded") {
    Case b = test::golden(parse_shape("4,4,16"), 1, Precision::fp64);
    int64_t off_grid = 0;
    for (const char* s : {"h_in", "dx"}) {
      CHECK(b.get(s).dtype == DType::f64);
      for (int64_t i = 0; i < b.get(s).size(); ++i)
        off_grid += double(bf16_to_float(double_to_bf16(b.get(s).at(i)))) != b.get(s).at(i);
    }
    CHECK(off_grid > 0);
  }
}

TEST_SUITE("determinism") {
  TEST_CASE("same bits for 1 and 2 threads and from run to run") {
    for (Precision prec : {Precision::fp32, Precision::fp64}) {
      Problem p = parse_shape("600,4,300");  // several chunks and column slices, ragged ends
      omp_set_num_threads(1);
      Case one = test::golden(p, 9, prec);
      omp_set_num_threads(2);
      Case two = test::golden(p, 9, prec), again = test::golden(p, 9, prec);
      for (const Stage& s : stage_table()) {
        INFO("stage ", s.name);
        CHECK(one.get(s.name).bytes == two.get(s.name).bytes);
        CHECK(two.get(s.name).bytes == again.get(s.name).bytes);
      }
    }
  }
}

TEST_SUITE("determinism") {
  TEST_CASE("run in token chunks: the same bits as in one piece") {
    Problem p = parse_shape("700,3,200");  // three blocks of kTokenBlock, the last one partial
    Case in = generate_case(p, 5, true);
    for (Arith arith : {Arith(Precision::fp32), Arith(Precision::fp64), plain_arith(Accuracy::fp32)}) {
      Case whole = in;
      cpu_run(whole, arith);
      for (int64_t chunk : {kTokenBlock, 2 * kTokenBlock}) {
        TokenSums sums;
        std::map<std::string, std::vector<uint8_t>> joined;  // per-token stages, chunk after chunk
        Case last;
        for (int64_t t0 = 0; t0 < p.T(); t0 += chunk) {
          Case c = in.token_slice(t0, std::min(p.T(), t0 + chunk));
          cpu_run_chunk(c, arith, sums);
          for (auto& [name, t] : c.t) joined[name].insert(joined[name].end(), t.bytes.begin(), t.bytes.end());
          last = std::move(c);
        }
        cpu_finish(last, sums, arith);
        for (const Stage& s : stage_table()) {
          if (s.group == Group::inputs) continue;
          INFO("stage ", s.name, ", chunks of ", chunk, " tokens, plain ", arith.plain);
          const auto& want = whole.get(s.name).bytes;
          if (is_token_sum(s)) CHECK(last.get(s.name).bytes == want);
          else CHECK(std::equal(want.begin(), want.end(), joined[s.name].begin(), joined[s.name].end()));
        }
      }
    }
  }
}

TEST_SUITE("hdf5") {
  TEST_CASE("bf16 conversion rounds to nearest even") {
    CHECK(float_to_bf16(1.0f).bits == 0x3f80);
    CHECK(float_to_bf16(1.0f + 0x1p-8f).bits == 0x3f80);           // tie -> even
    CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f).bits == 0x3f82);       // tie -> even (up)
    CHECK(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f).bits == 0x3f81);  // above the tie
    CHECK(double_to_bf16(1.0 + 0x1p-8 + 0x1p-40).bits == 0x3f81);    // no double rounding
    CHECK(double_to_bf16(-(1.0 + 0x1p-8 + 0x1p-40)).bits == 0xbf81);
    CHECK(float_to_bf16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
    CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
    CHECK(float_to_bf16(3.4e38f).bits == 0x7f80);  // above the largest bf16: rounds to inf
  }
}
