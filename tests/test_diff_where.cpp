// test_diff_where.cpp — the new parts of the diff engine on planted faults in the golden:
// accuracy classes, rounding checks (unit-tested on exact ties too), where-ranges and
// patterns, format statuses, --require. Independent kernels: tests/indep/verdicts.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "h5io.h"
#include "rounding.h"
#include "support.h"
#include "where.h"

using namespace mhc;

namespace {

const StageReport& find(const DiffReport& r, std::string_view name) {
  for (auto& s : r.stages)
    if (s.name == name) return s;
  FAIL("stage not in report: " << name);
  return r.stages.front();
}

const AxisRanges& axis(const StageReport& s, std::string_view name) {
  for (auto& a : s.where)
    if (a.axis == name) return a;
  FAIL("no axis " << name << " in the where of " << s.name);
  return s.where.front();
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// The golden's h_in rounded from fp64 by `round` instead of nearest-even (x, h_pre as stored).
void reround_h_in(Case& c, float (*round)(double)) {
  Tensor& h = c.t["h_in"];
  const Tensor &x = c.get("x"), &hp = c.get("h_pre");
  const int64_t T = c.prob.T(), n = c.prob.n, D = c.prob.D;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += float(hp.at(t * n + i)) * float(x.at((t * n + i) * D + d));
      h.data<bf16>()[t * D + d].bits = uint16_t(std::bit_cast<uint32_t>(round(acc)) >> 16);
    }
}

float truncate16(double v) { return std::bit_cast<float>(std::bit_cast<uint32_t>(float(v)) & 0xffff0000u); }
float via_tf32(double v) {  // nearest-even to 10 mantissa bits, then nearest-even to bf16: rounded twice
  uint32_t u = std::bit_cast<uint32_t>(float(v));
  u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
  return bf16_to_float(float_to_bf16(std::bit_cast<float>(u)));
}

}  // namespace

TEST_SUITE("diff") {
  TEST_CASE("rounding: truncation, round-half-away and double rounding of h_in are diverged at h_in with the reason") {
    Case ref = test::golden(parse_shape("256,4,512"), 31);
    struct Kind {
      float (*round)(double);
      const char* reason;
    };
    for (Kind k : {Kind{truncate16, "truncation"}, Kind{via_tf32, "double rounding"}}) {
      Case bad = ref;
      reround_h_in(bad, k.round);
      DiffReport r = test::diff(bad, ref);
      INFO(report_table(r, false));
      CHECK(r.root_causes == std::vector<std::string>{"h_in"});
      CHECK(find(r, "h_in").rounding.reason.find(k.reason) != std::string::npos);
      // as the reference B (mhc diff golden.h5 mine.h5): invalid, naming B's rounding (it matched)
      DiffReport rev = test::diff(ref, bad);
      CHECK(rev.verdict == Verdict::invalid);
      CHECK(rev.reference_wrong == "h_in");
      CHECK(rev.verdict_line().find("the reference B rounds h_in wrongly (") != std::string::npos);
      CHECK(rev.verdict_line().find(k.reason) != std::string::npos);
    }
    Case fine = ref;  // fp32 sum then nearest-even: the golden's own rounding, recomputed
    reround_h_in(fine, [](double v) { return bf16_to_float(float_to_bf16(float(v))); });
    DiffReport ok = test::diff(fine, ref);
    CHECK(ok.match());
    CHECK(find(ok, "h_in").rounding.reason.empty());
    CHECK(test::diff(ref, fine).match());
  }

  TEST_CASE("rounding: exact ties rounded away from zero are named; ties to even pass; clustered ties are not judged") {
    // exact fp32 ties whose away neighbour is odd (every `every`-th of m values), among ordinary values
    auto judge = [](int64_t m, int64_t every, bool round_away, bool one_off = false) {
      Tensor exact({m}, DType::f64), fp32({m}, DType::f32), a({m}, DType::bf16);
      for (int64_t i = 0; i < m; ++i) {
        uint32_t lo = uint32_t(0x3f80 + 2 * (i % 64)) << 16;  // 1.0 + even bf16 steps
        float v = std::bit_cast<float>(lo | (i % every == 0 ? 0x8000u : uint32_t(i * 37 % 0x7fff)));
        fp32.data<float>()[i] = v;
        exact.data<double>()[i] = double(v) + (i % (2 * every) == 0 ? 1e-9 : -1e-9);  // fp64: either side of the tie
        if (round_away)
          a.data<bf16>()[i].bits = uint16_t((std::bit_cast<uint32_t>(v) + 0x8000u) >> 16);
        else
          a.data<bf16>()[i] = float_to_bf16(v);
      }
      if (one_off) a.data<bf16>()[1].bits ^= 1;  // one value off a tie not the fp32 value's rounding
      std::vector<uint8_t> bad;
      return check_rounding(a, exact, Alternatives{}, fp32, Tensor{}, Tensor{}, 0.01, m, bad);
    };
    // 25 ties in 2^21 values: about as many as chance gives an fp32 stage (one in 2^17, so 16)
    Rounding ok = judge(int64_t(1) << 21, 87381, false), up = judge(int64_t(1) << 21, 87381, true);
    CHECK(ok.ties == 25);
    CHECK(ok.reason.empty());
    CHECK(up.ties_not_even == 25);
    CHECK(up.reason.find("ties not to even") != std::string::npos);
    // 64 in 1024: clustered, as saturated gates cluster them (h_pre = 1 + 2^-20), where a correct
    // kernel with h_pre in fp64 rounds them all one way: no verdict from them
    Rounding clustered = judge(1024, 16, true);
    CHECK(clustered.ties_not_even == 64);
    CHECK(clustered.reason.empty());
    // A's values elsewhere not all the fp32 recomputation's: its values at the ties need not be
    // the ties (a kernel computing more precisely than it stores), so no verdict either
    Rounding other = judge(int64_t(1) << 21, 87381, true, true);
    CHECK(other.off_fp32 == 1);
    CHECK(other.reason.find("ties not to even") == std::string::npos);
  }

  TEST_CASE("rounding: a few flips just past a tie are the kernel's arithmetic; many are double rounding") {
    // n values just below a tie (0.48 ulp above a bf16 value b): nearest-even gives b; a flip to
    // the next value lies 0.02 ulp beyond the tie, more than tau = 0.001 explains
    auto check = [](int64_t n, int64_t flips) {
      Tensor exact({n}, DType::f64), fp32({n}, DType::f32), a({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i) {
        exact.data<double>()[i] = 1.0 + double(i % 128) * 0x1p-7 + 0.48 * 0x1p-7;
        fp32.data<float>()[i] = float(exact.at(i));
        a.data<bf16>()[i] = double_to_bf16(exact.at(i));
        if (flips && i % (n / flips) == 0 && i / (n / flips) < flips) a.data<bf16>()[i].bits += 1;
      }
      std::vector<uint8_t> bad;
      Rounding r = check_rounding(a, exact, Alternatives{}, fp32, Tensor{}, Tensor{}, 0.001, n, bad);
      CHECK(r.unexplained == flips);
      return r.reason;
    };
    CHECK(check(4096, 1).empty());  // at most 3, or 1 in 1000: isolated
    CHECK(check(4096, 3).empty());
    CHECK(check(4096, 4).empty());
    CHECK(check(256, 1).empty());  // a block of 256 tokens with one
    CHECK(check(4096, 64).find("double rounding") != std::string::npos);
    CHECK(check(256, 8).find("double rounding") != std::string::npos);
    // flips at values that cancelled to 1e-4 of the stage's RMS, 0.7 of their own step past the
    // tie: a hair in the ulps of the floor (RMS / 64) the budget uses. A few are not named (a
    // correct kernel forming dx another way was called "truncation"; review A, session 21);
    // 64 of 65536 all toward zero are (a truncation of the small values; review E, session 21)
    auto tiny = [](int64_t n, int64_t every, bool both_ways) {
      Tensor exact({n}, DType::f64), fp32({n}, DType::f32), a({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i) {
        const bool small = i % every == 7;
        const double step = small ? 0x1p-21 : 0x1p-7;  // 1e-4 has a step of 2^-21
        exact.data<double>()[i] = (small ? 0x1p-14 : 1.0 + double(i % 128) * step) + 0.1 * step;
        fp32.data<float>()[i] = float(exact.at(i));
        a.data<bf16>()[i] = double_to_bf16(exact.at(i));
        if (small && both_ways && i / every % 2)
          a.data<bf16>()[i].bits += 1;  // away from zero, 0.4 of the step past the tie
        else if (small)
          a.data<bf16>()[i].bits -= 1;  // toward zero, into the binade below
      }
      std::vector<uint8_t> bad;
      return check_rounding(a, exact, Alternatives{}, fp32, Tensor{}, Tensor{}, 0.001, n, bad);
    };
    Rounding two = tiny(4096, 2048, false);
    CHECK(two.unexplained == 2);
    CHECK(two.reason.empty());
    Rounding mixed = tiny(65536, 1024, true), truncated = tiny(65536, 1024, false);
    CHECK(mixed.unexplained == 64);
    CHECK(mixed.reason.empty());
    CHECK(truncated.unexplained == 64);
    CHECK(truncated.reason.find("truncation") != std::string::npos);
  }

  TEST_CASE("rounding: the lean tells truncation where the arithmetic's error explains every flip") {
    // 64 tokens of 4096 values; each kernel value is the exact one plus an error of up to 0.6 of a
    // step (a TF32 GEMM's), and tau = 1.7 explains every flip, a truncation's too; then rounded
    constexpr int64_t T = 64, L = 4096, n = T * L;
    Tensor exact({n}, DType::f64), fp32({n}, DType::f32);
    uint64_t state = 12345;
    auto uniform = [&state] { return double((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 11) * 0x1p-53; };
    std::vector<double> noisy(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double e = (uniform() - 0.5) * std::exp2(std::floor(uniform() * 6 - 3));
      exact.data<double>()[i] = e;
      fp32.data<float>()[i] = float(e);
      noisy[size_t(i)] = e + (uniform() - 0.5) * 1.2 * bf16_ulp(e);
    }
    auto judge = [&](auto&& truncated) {
      Tensor a({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i)
        a.data<bf16>()[i] = truncated(i) ? bf16{uint16_t(std::bit_cast<uint32_t>(float(noisy[size_t(i)])) >> 16)}
                                         : double_to_bf16(noisy[size_t(i)]);
      std::vector<uint8_t> bad;
      Rounding r = check_rounding(a, exact, Alternatives{}, fp32, Tensor{}, Tensor{}, 1.7, L, bad);
      CHECK(r.unexplained == 0);
      return r.reason;
    };
    CHECK(judge([](int64_t) { return false; }).empty());
    CHECK(judge([](int64_t) { return true; }).rfind("truncation: over all 262144 elements", 0) == 0);
    CHECK(judge([](int64_t i) { return i / L == 37; }).rfind("truncation: in 1 token (token 37: 4096 elements)", 0) == 0);
    CHECK(judge([](int64_t i) { return i % L == 100; }).empty());  // a place in 64 tokens: too few to tell (~300)
    // rounded toward +inf: +1/2 ulp on the positive values, -1/2 on the negative ones; over every
    // element, in one token, and (rows of 512: 512 tokens) at places 64..127 of every row
    auto judge_up = [&](int64_t row, auto&& up) {
      Tensor a({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i) {
        const double v = noisy[size_t(i)];
        bf16 b = double_to_bf16(v);
        if (up(i) && bf16_to_float(b) < v) b = double_to_bf16(v + bf16_ulp(v) / 2 + bf16_ulp(v) / 64);  // the next value up
        a.data<bf16>()[i] = b;
      }
      std::vector<uint8_t> bad;
      Rounding r = check_rounding(a, exact, Alternatives{}, fp32, Tensor{}, Tensor{}, 1.7, row, bad);
      CHECK(r.unexplained == 0);
      return r.reason;
    };
    CHECK(judge_up(L, [](int64_t) { return true; }).rfind("rounding toward +inf: over all 262144 elements", 0) == 0);
    CHECK(judge_up(L, [](int64_t i) { return i / L == 37; }).rfind("rounding toward +inf: in 1 token (token 37: 4096 elements)", 0) == 0);
    CHECK(judge_up(512, [](int64_t i) { return i % 512 / 64 == 1; }).rfind("rounding toward +inf: at place 64 of every token's row (512 elements)", 0) == 0);
    CHECK(judge_up(512, [](int64_t) { return false; }).empty());
    // A formed from another correct value than the replay's: token 20 scaled by 1 + 2^-8 (a bf16
    // GEMM's error coherent over a token, where A's dx does not read the dvecX it dumped): it
    // leans 0.5..1 ulp from `exact`, not from the alternative replay; a truncated token leans from
    // both (engine.cpp, gemm_replays)
    Tensor other = exact;
    for (int64_t i = 20 * L; i < 21 * L; ++i) other.data<double>()[i] *= 1 + 0x1p-8;
    auto judge_other = [&](Alternatives alternatives, int64_t truncated_token) {
      Tensor a({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i) {
        const double v = other.at(i) + (noisy[size_t(i)] - exact.at(i));
        a.data<bf16>()[i] = i / L == truncated_token ? bf16{uint16_t(std::bit_cast<uint32_t>(float(v)) >> 16)} : double_to_bf16(v);
      }
      std::vector<uint8_t> bad;
      return check_rounding(a, exact, alternatives, fp32, Tensor{}, Tensor{}, 1.7, L, bad).reason;
    };
    CHECK(judge_other({}, -1).rfind("rounding away from zero: in 1 token (token 20: 4096 elements)", 0) == 0);
    CHECK(judge_other({1, [&](int) { return other; }}, -1).empty());
    CHECK(judge_other({1, [&](int) { return other; }}, 37).rfind("truncation: in 1 token (token 37: 4096 elements)", 0) == 0);
    // every token scaled by its own 1 + e_t, e_t ~ N(0, 2^-12.6) (a kernel's per-token arithmetic,
    // its tokens' leans spread with rms ~0.03 ulp), token 20 by 1 + 2^-9.2 (0.31 ulp from the
    // exact values): no token leans beyond its spread (row_floor); a truncated token still does
    for (int64_t t = 0; t < T; ++t) {
      double z = -6;
      for (int k = 0; k < 12; ++k) z += uniform();
      const double scale = t == 20 ? 1 + std::exp2(-9.2) : 1 + z * std::exp2(-12.6);
      for (int64_t i = t * L; i < (t + 1) * L; ++i) other.data<double>()[i] = exact.at(i) * scale;
    }
    CHECK(judge_other({}, -1).empty());
    CHECK(judge_other({}, 37).rfind("truncation: in 1 token (token 37: 4096 elements)", 0) == 0);
    // exact values crowded on one side of their interval (h_pre = 1 + hc_eps at n = 1: bf16 x
    // times 1.002 lies 0.26..0.51 of a step above x), rounded to nearest even: u leans (most
    // round down), its departure from nearest-even does not, and nothing is named
    Tensor crowd({n}, DType::f64), crowd32({n}, DType::f32), a({n}, DType::bf16);
    for (int64_t i = 0; i < n; ++i) {
      const double x = bf16_to_float(double_to_bf16((uniform() - 0.5) * 4));
      crowd.data<double>()[i] = x * 1.002;
      crowd32.data<float>()[i] = float(x * 1.002);
      a.data<bf16>()[i] = double_to_bf16(x * 1.002);
    }
    std::vector<uint8_t> bad;
    Rounding r = check_rounding(a, crowd, Alternatives{}, crowd32, Tensor{}, Tensor{}, 0.001, L, bad);
    CHECK(r.lean_all.a.u / r.lean_all.a.n < -0.2);
    CHECK(r.reason.empty());
  }

  TEST_CASE("h_in of a token of tiny activations is judged on its own scale") {
    // token 5's x times 2^-16, its h_in then 1% off: under the common floor (the block's RMS / 64)
    // it matched (review A, session 22)
    Case ref = generate_case(parse_shape("512,4,128"), 61, true);
    for (int64_t k = 0; k < 4 * 128; ++k) ref.t["x"].set(5 * 512 + k, ref.get("x").at(5 * 512 + k) * 0x1p-16);
    cpu_run(ref, Precision::fp32);
    Case bad = ref;
    for (int64_t d = 0; d < 128; ++d) bad.t["h_in"].set(5 * 128 + d, bf16_to_float(double_to_bf16(ref.get("h_in").at(5 * 128 + d) * 1.01)));
    test::recompute_after(bad, "h_in", Precision::fp32);
    DiffReport r = test::diff(bad, ref);
    INFO(report_table(r, false));
    CHECK(r.root_causes == std::vector<std::string>{"h_in"});
    CHECK(axis(find(r, "h_in"), "token").ranges == Ranges{{5, 5}});
  }

  TEST_CASE("where: an error in later tokens only, downstream consistent with it") {
    Case ref = test::golden(parse_shape("512,4,128"), 32), bad = ref;
    for (int64_t t = 256; t < 512; ++t)
      for (int64_t i = 0; i < 4; ++i) bad.t["h_pre"].set(t * 4 + i, bad.get("h_pre").at(t * 4 + i) * (1 + 1e-4));
    test::recompute_after(bad, "h_pre", Precision::fp32);
    DiffReport r = test::diff(bad, ref);
    INFO(report_table(r, false));
    CHECK(r.root_causes == std::vector<std::string>{"h_pre"});
    const StageReport& h = find(r, "h_pre");
    CHECK(axis(h, "token").ranges == Ranges{{256, 511}});
    CHECK(h.first_mismatch[0] == 256);
    CHECK(h.pattern.rfind("tokens 256–511", 0) == 0);
    CHECK(find(r, "dh_mix").status == Status::inherited);
    CHECK(find(r, "h_in").status != Status::diverged);
    CHECK(r.verdict_line().find("downstream stages follow from h_pre") != std::string::npos);
  }

  TEST_CASE("where, streamed from files: an error in one batch row that crosses token blocks") {
    std::string dir = test::tmpdir("where_stream");
    Case ref = test::golden(parse_shape("3,200,4,64"), 36), bad = ref;  // blocks of 256 tokens cut batch rows
    for (int64_t t = 200; t < 400; ++t)
      for (int64_t i = 0; i < 4; ++i) bad.t["h_pre"].set(t * 4 + i, bad.get("h_pre").at(t * 4 + i) * (1 + 1e-4));
    test::recompute_after(bad, "h_pre", Precision::fp32);
    save_case(dir + "/bad.h5", bad);
    save_case(dir + "/ref.h5", ref);
    for (const std::string& b : {dir + "/ref.h5", std::string("cpu")}) {
      auto r = test::sh(test::mhc("diff " + dir + "/bad.h5 " + b + " --json"));
      INFO(r.out, r.err);
      CHECK(r.rc == 1);
      CHECK(r.out.find("\"first_divergent\": \"h_pre\"") != std::string::npos);
      CHECK(r.out.find("{\"axis\": \"batch\", \"size\": 3, \"ranges\": [[1, 1]]}") != std::string::npos);
      CHECK(r.out.find("{\"axis\": \"seq\", \"size\": 200, \"ranges\": [[0, 199]]}") != std::string::npos);
    }
    CHECK(test::diff(bad, ref).first_divergent == "h_pre");
    CHECK(test::diff(ref, ref).match());
  }

  TEST_CASE("where: dh_res transposed shows in the off-diagonal h_res columns of dh_mix") {
    Case ref = test::golden(parse_shape("2,64,4,64"), 33), bad = ref;
    Tensor& g = bad.t["dh_res"];
    const Tensor& orig = ref.get("dh_res");
    for (int64_t t = 0; t < 128; ++t)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 4; ++j) g.set(t * 16 + i * 4 + j, orig.at(t * 16 + j * 4 + i));
    test::recompute_after(bad, "dh_post", Precision::fp32);
    bad.t["dh_res"] = orig;  // the kernel read its input transposed; the dump holds the true input
    DiffReport r = test::diff(bad, ref);
    INFO(report_table(r, false));
    CHECK(r.first_divergent == "dh_mix");
    const StageReport& d = find(r, "dh_mix");
    CHECK(d.where.size() == 3);  // batch, seq, N
    CHECK(axis(d, "N").ranges == Ranges{{9, 12}, {14, 17}, {19, 22}});
    CHECK(d.pattern.find("h_res off-diagonal") != std::string::npos);
  }

  TEST_CASE("classes: a stage within the tf32 budget reads tf32; --accept tf32 passes it") {
    Case ref = test::golden(parse_shape("128,4,1024"), 34), tf = ref.inputs_only();
    cpu_run(tf, Arith(Precision::fp32, true, Operands::tf32));
    for (const char* s : {"h_in", "dx"}) tf.t[s] = convert(tf.get(s), DType::bf16);
    DiffReport strict = test::diff(tf, ref);
    INFO(report_table(strict, false));
    CHECK(find(strict, "h_mix").accuracy == Accuracy::tf32);
    CHECK(strict.verdict == Verdict::diverged);
    DiffOptions loose;
    loose.accept = Accuracy::tf32;
    CHECK(test::diff(tf, ref, loose).match());
    Case wrong = tf;  // and a real error still diverges at tf32
    for (int64_t i = 0; i < wrong.get("dphi").size(); ++i) wrong.t["dphi"].set(i, wrong.get("dphi").at(i) * 1.01);
    DiffReport w = test::diff(wrong, ref, loose);
    INFO(report_table(w, false));
    CHECK(w.root_causes == std::vector<std::string>{"dphi"});
  }

  TEST_CASE("sharp: 1e-4 relative error in an fp32 stage and 2 ulps in 1% of a bf16 stage are caught") {
    Case ref = test::golden(parse_shape("256,4,4096"), 35);
    // dalpha and dbias (few elements): their limits come from sigma estimated over every
    // token (docs/diff.md, "Sums over tokens with few elements")
    for (const char* s : {"h_mix", "dvecX", "dphi", "inv_rms", "dgamma", "dbias", "dalpha"}) {
      Case bad = ref;
      for (int64_t i = 0; i < bad.get(s).size(); ++i) bad.t[s].set(i, bad.get(s).at(i) * (1 + 1e-4));
      DiffReport r = test::diff(bad, ref);
      INFO("stage ", std::string(s), "\n", report_table(r, false));
      CHECK(r.root_causes == std::vector<std::string>{s});
    }
    Case bad = ref;
    Tensor& h = bad.t["dx"];
    for (int64_t i = 0; i < h.size(); i += 100) h.data<bf16>()[i].bits += 2;
    CHECK(test::diff(bad, ref).root_causes == std::vector<std::string>{"dx"});
  }

  TEST_CASE("the same report bits on 1 and 2 threads, and --tokens reports indices of the whole case") {
    std::string dir = test::tmpdir("diff_threads");
    Case bad = test::golden(parse_shape("600,4,256"), 37);
    Tensor& h = bad.t["h_in"];
    for (int64_t i = 300 * 256; i < h.size(); i += 3) h.data<bf16>()[i].bits ^= 1;  // later tokens only
    save_case(dir + "/bad.h5", bad);
    std::string diff = test::mhc("diff --json " + dir + "/bad.h5 cpu");
    auto one = test::sh("OMP_NUM_THREADS=1 " + diff), two = test::sh("OMP_NUM_THREADS=2 " + diff);
    CHECK(one.rc == 1);
    CHECK(one.out == two.out);
    auto part = test::sh(test::mhc("diff " + dir + "/bad.h5 cpu --tokens 200:400"));
    CHECK(part.rc == 1);
    CHECK(part.out.find("h_in: tokens 300–399") != std::string::npos);
    CHECK(part.out.find("dphi      missing") != std::string::npos);
    CHECK(test::sh(test::mhc("diff " + dir + "/bad.h5 cpu --tokens 0:300")).rc == 0);
    CHECK(test::sh(test::mhc("diff " + dir + "/bad.h5 cpu --tokens 5:700")).rc == 2);
  }

  TEST_CASE("format: unknown datasets, reshaped or lossy stages make the comparison invalid; --require") {
    Case ref = test::golden(parse_shape("32,4,64"), 36);
    Case typo = ref;
    typo.t.erase("h_mix");
    typo.unknown = {"/forward/hmix"};
    DiffReport r = test::diff(typo, ref);
    CHECK(r.verdict == Verdict::invalid);
    CHECK(r.exit_status() == 2);
    CHECK(find(r, "/forward/hmix").status == Status::unknown);
    CHECK(find(r, "/forward/hmix").hint == "did you mean /forward/h_mix?");

    Case flat = ref;
    flat.t["dh_mix"].shape = {flat.get("dh_mix").size()};
    CHECK(find(test::diff(flat, ref), "dh_mix").status == Status::format);
    Case half = ref;
    half.stored_as["h_mix"] = "float16";
    DiffReport hr = test::diff(half, ref);
    CHECK(find(hr, "h_mix").status == Status::format);
    CHECK(hr.verdict == Verdict::invalid);

    // A [T,..] dump of a [B,S,..] case, within one block of tokens (2 x 40) and across blocks
    // (2 x 150): invalid, the message in the whole case's terms, from a file (read in chunks)
    // and from a case held whole, on either side. (The first crashed: the chunk's own problem is
    // [T] and took the flat tensor for a fitting one.)
    const std::string dir = test::tmpdir("diff_flat_tokens");
    for (const char* shape : {"2,40,4,64", "2,150,4,64"}) {
      CAPTURE(shape);
      Case bs = test::golden(parse_shape(shape), 37), flat_t = bs;
      const int64_t T = bs.prob.T();
      flat_t.t["inv_rms"].shape = {T};
      flat_t.t["dx"].shape = {T, bs.prob.n, bs.prob.D};
      for (auto [a, b] : {std::pair{&flat_t, &bs}, std::pair{&bs, &flat_t}}) {
        DiffReport fr = test::diff(*a, *b);
        CHECK(fr.verdict == Verdict::invalid);
        CHECK(find(fr, "inv_rms").status == Status::format);
        CHECK(find(fr, "dx").status == Status::format);
        CHECK(find(fr, "h_mix").status == Status::ok);
        CHECK(find(fr, "inv_rms").note.find(cat("= ", shape_str(bs.prob.tokens))) != std::string::npos);
      }
      save_case(dir + "/flat.h5", flat_t);
      save_case(dir + "/bs.h5", bs);
      const std::string flat_h5 = dir + "/flat.h5", bs_h5 = dir + "/bs.h5";
      for (const std::string& args : {flat_h5 + " " + bs_h5, bs_h5 + " " + flat_h5, flat_h5 + " cpu"}) {
        CAPTURE(args);
        auto run = test::sh(test::mhc("diff " + args));
        CHECK(run.rc == 2);
        CHECK(run.out.find(cat("stores inv_rms as [", T, "], the same ", T, " elements as the schema's [..] = ",
                               shape_str(bs.prob.tokens))) != std::string::npos);
      }
    }

    // a misspelled group is not the user's own: /forward renamed /foward, /backward /Backward; nor
    // is one that holds stages missing from their schema path (/fwd, /grads: more than two edits)
    save_case(dir + "/ref.h5", ref);
    for (auto [from, to, one] : {std::tuple{"forward", "foward", "h_mix"}, std::tuple{"backward", "Backward", "dphi"},
                                 std::tuple{"forward", "fwd", "h_mix"}, std::tuple{"backward", "grads", "dphi"}}) {
      CAPTURE(to);
      const std::string moved = cat(dir, "/", to, ".h5");
      auto mv = test::sh(cat("cp ", dir, "/ref.h5 ", moved, " && ", MHC_PYTHON, " -c \"import h5py; f = h5py.File('", moved,
                             "', 'r+'); f.move('", from, "', '", to, "')\""));
      REQUIRE(mv.rc == 0);
      auto run = test::sh(test::mhc("diff " + moved + " cpu"));
      CHECK(run.rc == 2);
      CHECK(run.out.find(cat("A: dataset /", to, "/", one, " is not in the schema")) != std::string::npos);
      CHECK(run.out.find(cat("did you mean /", from, "/", one, "?")) != std::string::npos);
    }
    auto own = test::sh(cat("cp ", dir, "/ref.h5 ", dir, "/extra.h5 && ", MHC_PYTHON, " -c \"import h5py; f = h5py.File('",
                            dir, "/extra.h5', 'r+'); f['extra/h_mix'] = f['forward/h_mix'][...]\""));
    REQUIRE(own.rc == 0);
    CHECK(test::sh(test::mhc("diff " + dir + "/extra.h5 cpu")).rc == 0);  // /extra is the user's own (h_mix is in /forward)
    // a stage reached at its schema path through a soft link is compared (the walk of hard links
    // left it out in silence: a wrong h_mix matched)
    auto soft = test::sh(cat("cp ", dir, "/ref.h5 ", dir, "/soft.h5 && ", MHC_PYTHON, " -c \"import h5py; f = h5py.File('", dir,
                             "/soft.h5', 'r+'); f['stash/h_mix'] = f['forward/h_mix'][...] * 1.01; del f['forward/h_mix']; "
                             "f['forward/h_mix'] = h5py.SoftLink('/stash/h_mix')\""));
    REQUIRE(soft.rc == 0);
    auto linked = test::sh(test::mhc("diff " + dir + "/soft.h5 cpu"));
    CHECK(linked.rc == 1);
    CHECK(linked.out.find("diverged: first at h_mix") != std::string::npos);

    Case nothing = ref.inputs_only();
    CHECK(test::diff(nothing, ref).verdict == Verdict::invalid);
    Case fwd = ref;
    for (const Stage& s : stage_table())
      if (s.group == Group::backward) fwd.t.erase(s.name);
    DiffOptions req;
    req.require = {"h_mix", "dphi"};
    DiffReport rr = test::diff(fwd, ref, req);
    CHECK(rr.verdict == Verdict::diverged);
    CHECK(rr.missing_required == std::vector<std::string>{"dphi"});
    CHECK(test::diff(fwd, ref).match());
  }
}
