// test_diff.cpp — mhc diff names the stage a planted fault is in, and calls the stages
// downstream of it inherited; clean pairs match; the JSON follows its contract.
#include <doctest/doctest.h>

#include "diff.h"
#include "h5io.h"
#include "support.h"

using namespace mhc;

namespace {

struct Planted {
  Case ref;   // the golden, B
  Case bad;   // A: the golden with a fault
  explicit Planted(const char* shape = "48,4,64", uint64_t seed = 21)
      : ref(test::golden(parse_shape(shape), seed)), bad(ref) {}
  DiffReport diff(const DiffOptions& o = {}) const { return test::diff(bad, ref, o); }
};

const StageReport& find(const DiffReport& r, std::string_view name) {
  for (auto& s : r.stages)
    if (s.name == name) return s;
  FAIL("stage not in report: " << name);
  return r.stages.front();
}

void expect_root(const DiffReport& r, const std::string& stage) {
  INFO(report_table(r, false));
  CHECK(!r.match());
  CHECK(r.first_divergent == stage);
  CHECK(r.root_causes == std::vector<std::string>{stage});
  CHECK(find(r, stage).status == Status::diverged);
}

}  // namespace

TEST_SUITE("diff") {
  TEST_CASE("inv_rms off by 1e-3 in one token, downstream recomputed from it: introduced, the rest inherited") {
    Planted p;
    p.bad.t["inv_rms"].set(17, p.bad.get("inv_rms").at(17) * (1 + 1e-3));
    test::recompute_after(p.bad, "inv_rms", Precision::fp32);
    DiffReport r = p.diff();
    expect_root(r, "inv_rms");
    for (const char* s : {"h_pre", "h_post", "h_res", "dh_mix"}) {
      INFO("stage ", s);
      CHECK(find(r, s).status == Status::inherited);
      CHECK(find(r, s).inherited_from != "");
    }
    CHECK(find(r, "h_pre").inherited_from == "inv_rms");
    CHECK(find(r, "h_mix").status == Status::ok);
    CHECK(r.verdict_line().rfind("diverged: first at inv_rms (introduced)", 0) == 0);
    CHECK(r.verdict_line().find("downstream stages follow from inv_rms") != std::string::npos);
  }

  TEST_CASE("a token alone in its block: inv_rms off by 1e-3 is still introduced (T = 1; token 256 of 257)") {
    // one evaluation's one element set the limit through s(1) = 296: this passed (limit 1.1e-3)
    for (auto [shape, tok] : {std::pair{"1,4,1024", 0}, std::pair{"257,4,1024", 256}}) {
      CAPTURE(shape);
      Planted p(shape, 41);
      p.bad.t["inv_rms"].set(tok, p.bad.get("inv_rms").at(tok) * (1 + 1e-3));
      test::recompute_after(p.bad, "inv_rms", Precision::fp32);
      expect_root(p.diff(), "inv_rms");
    }
  }

  TEST_CASE("dphi scaled by 1+1e-4") {
    Planted p;
    for (int64_t i = 0; i < p.bad.get("dphi").size(); ++i) p.bad.t["dphi"].set(i, p.bad.get("dphi").at(i) * (1 + 1e-4));
    expect_root(p.diff(), "dphi");
  }

  TEST_CASE("sign of dalpha[1] flipped") {
    Planted p;
    p.bad.t["dalpha"].set(1, -p.bad.get("dalpha").at(1));
    expect_root(p.diff(), "dalpha");
  }

  TEST_CASE("one h_in element off by 2 bf16 ulps") {
    Planted p;
    Tensor& h = p.bad.t["h_in"];
    int64_t i = 123;
    while (std::fabs(h.at(i)) < 0.5) ++i;  // a typical magnitude
    h.data<bf16>()[i].bits += 2;
    DiffReport r = p.diff();
    expect_root(r, "h_in");
    CHECK(find(r, "h_in").mismatches == 1);
  }

  TEST_CASE("saturated gates: h_in rounded from h_pre kept in fp64 matches (its ties are not half-up rounding)") {
    // bias +-20: h_pre = 1 + 1e-6 is 1 + 2^-20 in fp32, and fp32 recomputation put 126 of 65536
    // values of h_in on exact ties; the kernel's values, from h_pre in fp64, lie beyond them and
    // round away from zero, correctly: "ties not to even (round half up?)" (review A, session 17)
    Case in = generate_case(parse_shape("256,4,256"), 3, true);
    float* b = in.t["bias"].data<float>();
    for (int64_t j = 0; j < in.prob.N(); ++j) b[j] = j % 2 ? -20.0f : 20.0f;
    Case ref = in, exact = in;
    cpu_run(ref, Precision::fp32);
    cpu_run(exact, Precision::fp64);
    Case a = ref;
    Tensor& h = a.t["h_in"];
    for (int64_t i = 0; i < h.size(); ++i) h.data<bf16>()[i] = double_to_bf16(exact.get("h_in").at(i));
    DiffReport r = test::diff(a, ref);
    INFO(report_table(r, false));
    CHECK(find(r, "h_in").rounding.ties > 64);  // the clustered ties are there
    CHECK(r.match());
  }

  TEST_CASE("a NaN in dgamma") {
    Planted p;
    p.bad.t["dgamma"].set(5, NAN);
    DiffReport r = p.diff();
    expect_root(r, "dgamma");
    CHECK(find(r, "dgamma").nan_a == 1);
    CHECK(std::isinf(find(r, "dgamma").rel_l2));  // it was the finite elements' alone (review A, session 24)
  }

  TEST_CASE("dvecX wrong, dx and dgamma consistent with it: dx inherited from dvecX") {
    Planted p;
    p.bad.t["dvecX"].set(40, p.bad.get("dvecX").at(40) + 0.05);
    test::recompute_after(p.bad, "dvecX", Precision::fp32);
    DiffReport r = p.diff();
    INFO(report_table(r, false));
    expect_root(r, "dvecX");
    CHECK(find(r, "dx").status == Status::inherited);
    CHECK(find(r, "dx").inherited_from == "dvecX");
    CHECK(find(r, "dgamma").inherited_from == "dvecX");
  }

  TEST_CASE("a missing intermediate is replayed: dx wrong with dvecX absent is still introduced") {
    Planted p;
    p.bad.t.erase("dvecX");
    p.bad.t["dx"].data<bf16>()[7].bits ^= 0x0100;
    DiffReport r = p.diff();
    expect_root(r, "dx");
    CHECK(find(r, "dvecX").status == Status::missing);
  }

  TEST_CASE("clean pairs match: fp32 vs fp64, a case against itself") {
    Planted p("33,6,20", 4);
    Case oracle = p.ref.inputs_only();
    cpu_run(oracle, Precision::fp64);
    CHECK(test::diff(p.ref, oracle).match());
    CHECK(test::diff(oracle, p.ref).match());
    for (const char* shape : {"1,4,4096", "1,8,7168", "3,1,2560", "7,4,1000"})  // small blocks: reordered evaluations set the limits
      for (uint64_t seed : {1, 2, 3}) {
        CAPTURE(shape);
        CAPTURE(seed);
        Case a = test::golden(parse_shape(shape), seed), o = a.inputs_only();
        cpu_run(o, Precision::fp64);
        CHECK(test::diff(a, o).match());
      }
    DiffReport self = test::diff(p.ref, p.ref);
    CHECK(self.match());
    for (auto& s : self.stages) CHECK(s.max_abs == 0);
  }

  TEST_CASE("inputs fp32 cannot evaluate (x * 2^60: the sum of squares overflows): invalid, not a match") {
    // every budget was then >= 1 RMS, and a transposed h_res matched (an independent kernel's review)
    Case in = test::golden(parse_shape("64,4,200"), 5).inputs_only();
    for (int64_t i = 0; i < in.get("x").size(); ++i) in.t["x"].set(i, in.get("x").at(i) * 0x1p60);
    Case a = in, o = in;
    cpu_run(a, Precision::fp32);
    cpu_run(o, Precision::fp64);
    Case hres = a;  // and a planted bug
    for (int64_t t = 0; t < 64; ++t) std::swap(hres.t["h_res"].data<float>()[t * 16 + 1], hres.t["h_res"].data<float>()[t * 16 + 4]);
    for (Case* side : {&a, &hres}) {
      DiffReport r = test::diff(*side, o);
      INFO(report_table(r, false));
      CHECK(r.verdict == Verdict::invalid);
      CHECK(r.no_budget == "inv_rms");
      CHECK(r.verdict_line().find("fp32 arithmetic cannot evaluate these inputs: at inv_rms") != std::string::npos);
    }
    Case fine = test::golden(parse_shape("64,4,200"), 5), fine64 = fine.inputs_only();
    cpu_run(fine64, Precision::fp64);
    DiffReport ok = test::diff(fine, fine64);
    CHECK(ok.match());
    CHECK(ok.no_budget.empty());
    for (auto& s : ok.stages) CHECK(s.fp32_error < 1e-3);
  }

  TEST_CASE("a wrong reference B makes the comparison invalid and is named; B's unknown datasets too") {
    Planted p;
    Case h_mix = p.bad;  // one h_mix element off by 1e-3, and the stages after it computed from it
    h_mix.t["h_mix"].set(40, h_mix.get("h_mix").at(40) * (1 + 1e-3));
    test::recompute_after(h_mix, "h_mix", Precision::fp32);
    Case dphi = p.bad, dalpha = p.bad;
    for (int64_t i = 0; i < dphi.get("dphi").size(); ++i) dphi.t["dphi"].set(i, dphi.get("dphi").at(i) * (1 + 1e-4));
    dalpha.t["dalpha"].set(1, -dalpha.get("dalpha").at(1));
    for (auto [wrong, stage] : {std::pair{&h_mix, "h_mix"}, std::pair{&dphi, "dphi"}, std::pair{&dalpha, "dalpha"}}) {
      CAPTURE(stage);
      DiffReport r = test::diff(p.ref, *wrong);
      INFO(report_table(r, false));
      CHECK(r.verdict == Verdict::invalid);
      CHECK(r.reference_wrong == stage);
      CHECK(find(r, stage).reference_over > 1);
      CHECK(r.verdict_line().find(cat("the reference B is itself off the fp64 oracle, first at ", stage, " (")) !=
            std::string::npos);
      CHECK(test::diff(*wrong, p.ref).verdict == Verdict::diverged);  // the same pair the other way round
    }
    // a correct B: the fp32 golden (its stages within their budgets, none over 1)
    Case oracle = p.ref.inputs_only();
    cpu_run(oracle, Precision::fp64);
    DiffReport ok = test::diff(oracle, p.ref);
    CHECK(ok.match());
    for (auto& s : ok.stages) CHECK(s.reference_over <= 1);

    Case typo = p.ref;
    typo.t.erase("dgamma");
    typo.unknown = {"/backward/d_gamma"};
    DiffReport u = test::diff(p.ref, typo);
    CHECK(u.verdict == Verdict::invalid);
    CHECK(find(u, "/backward/d_gamma").note == "B: dataset /backward/d_gamma is not in the schema");
    typo.unknown = {"/forward/t_scaled"};  // nothing near: where the user's own tensors belong
    CHECK(find(test::diff(p.ref, typo), "/forward/t_scaled").note ==
          "B: dataset /forward/t_scaled is not in the schema (keep your own tensors in another group, e.g. /extra)");
  }

  TEST_CASE("json_string: quotes, control characters, UTF-8 kept, other bytes escaped") {
    CHECK(json_string("a\"b\\c\nd\te") == "\"a\\\"b\\\\c\\nd e\"");
    CHECK(json_string("/forward/h_mix_\xc3\xa9") == "\"/forward/h_mix_\xc3\xa9\"");         // é
    CHECK(json_string("/forward/\xff\xc3x\xe2\x82") == "\"/forward/\\u00ff\\u00c3x\\u00e2\\u0082\"");  // not UTF-8
    // well-formed only (review B, session 19): a surrogate, an overlong form, past U+10FFFF
    CHECK(json_string("\xed\xa0\x80") == "\"\\u00ed\\u00a0\\u0080\"");
    CHECK(json_string("\xe0\x80\x80") == "\"\\u00e0\\u0080\\u0080\"");
    CHECK(json_string("\xf4\x90\x80\x80") == "\"\\u00f4\\u0090\\u0080\\u0080\"");
    CHECK(json_string("\xf4\x8f\xbf\xbf\xed\x9f\xbf") == "\"\xf4\x8f\xbf\xbf\xed\x9f\xbf\"");  // U+10FFFF, U+D7FF kept
  }

  TEST_CASE("fixed tolerance and per-stage overrides") {
    Planted p;
    for (int64_t i = 0; i < p.bad.get("dphi").size(); ++i) p.bad.t["dphi"].set(i, p.bad.get("dphi").at(i) * (1 + 1e-4));
    DiffOptions fixed;
    fixed.fixed = true, fixed.atol = 0, fixed.rtol = 1e-3;
    CHECK(test::diff(p.bad, p.ref, fixed).match());
    fixed.rtol = 1e-5;
    CHECK(!test::diff(p.bad, p.ref, fixed).match());
    // --rtol sets the float32 stages' only: h_in one bf16 ulp off (7.8e-3 relative) keeps bf16's
    // 1.6e-2 (an rtol of 1e-3 for everything failed a correct kernel's h_in)
    Planted u;
    u.bad.t["h_in"].set(0, u.ref.get("h_in").at(0) == 0 ? 1.0 : u.ref.get("h_in").at(0) * (1 + 1.0 / 128));
    fixed.rtol = 1e-3;
    CHECK(find(test::diff(u.bad, u.ref, fixed), "h_in").status == Status::ok);
    CHECK(find(test::diff(u.bad, u.ref, fixed), "h_in").rtol == doctest::Approx(1.6e-2));
    DiffOptions per;
    per.per_stage["dphi"] = {0, 1e-3};
    DiffReport r = test::diff(p.bad, p.ref, per);
    CHECK(r.match());
    CHECK(find(r, "dphi").fixed);
    CHECK(find(r, "dphi").min_atol == doctest::Approx(0).epsilon(1e-9));
    // NaN against NaN and equal infinities are equal under a fixed tolerance too (rtol·|NaN| failed them)
    Planted q;
    q.ref.t["h_mix"].set(3, std::nan("")), q.ref.t["dphi"].set(5, INFINITY);
    DiffOptions strictly;
    strictly.fixed = true, strictly.atol = 0, strictly.rtol = 0;
    CHECK(test::diff(q.ref, q.ref, strictly).match());
    DiffOptions both;  // --tol h_mix=1,1 --tol dphi=0,0
    both.per_stage["h_mix"] = {1, 1}, both.per_stage["dphi"] = {0, 0};
    DiffReport r2 = test::diff(q.ref, q.ref, both);
    CHECK(find(r2, "h_mix").status == Status::ok);
    CHECK(find(r2, "dphi").status == Status::ok);
  }

  TEST_CASE("command line: exit codes, missing stages, shapes, inputs, JSON contract") {
    std::string dir = test::tmpdir("diff_cli");
    Planted p;
    save_case(dir + "/ref.h5", p.ref);
    p.bad.t["dalpha"].set(1, -p.bad.get("dalpha").at(1));
    save_case(dir + "/bad.h5", p.bad);
    Case fwd = p.ref;
    for (const Stage& s : stage_table())
      if (s.group == Group::backward) fwd.t.erase(s.name);
    save_case(dir + "/fwd.h5", fwd);
    save_case(dir + "/other.h5", test::golden(parse_shape("8,4,64"), 1));

    auto same = test::sh(test::mhc("diff " + dir + "/ref.h5 " + dir + "/ref.h5"));
    CHECK(same.rc == 0);
    CHECK(same.out.find("match") != std::string::npos);
    CHECK(test::sh(test::mhc("diff cpu cpu:fp64 --input " + dir + "/ref.h5")).rc == 0);
    CHECK(test::sh(test::mhc("diff " + dir + "/ref.h5 cpu:fp64")).rc == 0);

    auto bad = test::sh(test::mhc("diff " + dir + "/bad.h5 " + dir + "/ref.h5"));
    CHECK(bad.rc == 1);
    CHECK(bad.out.find("diverged: first at dalpha (introduced)") != std::string::npos);
    CHECK(bad.out.find("\033[") == std::string::npos);  // no colour when not a TTY

    // a kernel's dump of stages only (no /inputs): compared on --input's inputs, or on the other
    // file side's; it was refused even with --input
    REQUIRE(test::sh(cat(MHC_PYTHON, " -c \"import h5py; a = h5py.File('", dir, "/bad.h5', 'r'); ",
                         "b = h5py.File('", dir, "/stages.h5', 'w'); [a.copy(g, b) for g in ('forward', 'backward')]\""))
                .rc == 0);
    for (const std::string& args : {"stages.h5 cpu --input " + dir + "/ref.h5", std::string("stages.h5 ") + dir + "/ref.h5"}) {
      CAPTURE(args);
      auto st = test::sh(test::mhc("diff " + dir + "/" + args));
      CHECK(st.rc == 1);
      CHECK(st.out.find("diverged: first at dalpha (introduced)") != std::string::npos);
    }
    auto alone = test::sh(test::mhc("diff " + dir + "/stages.h5 cpu"));
    CHECK(alone.rc == 2);
    CHECK(alone.err.find("to diff a dump of stages only, give its inputs: --input IN.h5") != std::string::npos);

    auto half = test::sh(test::mhc("diff " + dir + "/fwd.h5 " + dir + "/ref.h5"));
    CHECK(half.rc == 0);
    CHECK(half.out.find("missing in A") != std::string::npos);
    // the verdict line itself says what was not compared (it read "match: 6 stages compared" alone)
    CHECK(half.out.find("; not compared, missing in A: dh_pre, dh_mix, dinv_rms, dvecX, dx, dphi, dalpha, dbias, dgamma") !=
          std::string::npos);
    auto outputs = test::sh(test::mhc("diff " + dir + "/fwd.h5 " + dir + "/ref.h5 --require outputs"));
    CHECK(outputs.rc == 1);
    CHECK(outputs.out.find("diverged; required but missing: dx, dphi, dalpha, dbias, dgamma") != std::string::npos);
    CHECK(test::sh(test::mhc("diff " + dir + "/fwd.h5 " + dir + "/ref.h5 --require forward")).rc == 0);
    // a case without gradients has no backward to require: --require all judges its forward only
    Case fo = fwd;
    for (const std::string& g : gradient_inputs()) fo.t.erase(g);
    save_case(dir + "/fo.h5", fo);
    auto fo_all = test::sh(test::mhc("diff " + dir + "/fo.h5 cpu --require all"));
    CHECK(fo_all.rc == 0);
    CHECK(fo_all.out.find("required but missing") == std::string::npos);
    // the eps in the header, and whether they were defaulted (a dump whose /inputs lost them
    // ran at 1e-6, and a correct kernel run at 1e-2 was blamed at inv_rms with nothing saying why)
    CHECK(fo_all.out.find("norm_eps 1e-06 hc_eps 1e-06   accept") != std::string::npos);
    REQUIRE(test::sh(cat(MHC_PYTHON, " -c \"import h5py; f = h5py.File('", dir, "/fo.h5', 'r+'); ",
                         "del f['inputs'].attrs['hc_eps']\"")).rc == 0);
    CHECK(test::sh(test::mhc("diff " + dir + "/fo.h5 cpu")).out.find("hc_eps 1e-06 (hc_eps not in /inputs: the default)") !=
          std::string::npos);
    for (const char* alone : {"--atol 1", "--rtol 1"}) {  // without --tolerance fixed they were ignored
      auto r = test::sh(test::mhc(cat("diff ", dir, "/fo.h5 cpu ", alone)));
      CHECK(r.rc == 2);
      CHECK(r.err.find("sets the fixed policy's tolerance; add --tolerance fixed") != std::string::npos);
    }
    // the match line under --tolerance fixed names the policy, not a class no stage has ("all within fp32 ()")
    auto fixed = test::sh(test::mhc("diff " + dir + "/fo.h5 cpu:fp64 --tolerance fixed"));
    CHECK(fixed.rc == 0);
    CHECK(fixed.out.find("compared, all within the fixed tolerances") != std::string::npos);
    CHECK(fixed.out.find("()") == std::string::npos);
    auto typo = test::sh(test::mhc("diff " + dir + "/fo.h5 cpu --require hmix"));
    CHECK(typo.rc == 2);
    CHECK(typo.err.find("--require hmix: expected all, forward, backward, outputs, none or computed stages") != std::string::npos);
    CHECK(typo.err.find("did you mean h_mix?") != std::string::npos);

    for (const char* flag : {"", "--ignore-inputs "}) {  // not told to --ignore-inputs, which cannot help
      auto shapes = test::sh(test::mhc(cat("diff ", flag, dir, "/other.h5 ", dir, "/ref.h5")));
      CHECK(shapes.rc == 2);
      CHECK(shapes.err.find("the cases have different shapes") != std::string::npos);
    }
    save_case(dir + "/seed22.h5", test::golden(parse_shape("48,4,64"), 22));
    auto inputs = test::sh(test::mhc("diff " + dir + "/seed22.h5 " + dir + "/ref.h5"));
    CHECK(inputs.rc == 2);
    CHECK(inputs.err.find("inputs differ") != std::string::npos);
    Case eps = p.ref;  // norm_eps stored as float32 by a kernel: the values, every digit (it said "attributes")
    eps.prob.norm_eps = double(float(p.ref.prob.norm_eps));
    save_case(dir + "/eps.h5", eps);
    CHECK(test::sh(test::mhc("diff " + dir + "/eps.h5 " + dir + "/ref.h5")).err.find(
              cat("norm_eps 9.9999999747524271e-07 vs 9.9999999999999995e-07")) != std::string::npos);
    // --ignore-inputs compares runs on other inputs, and says they diverge through them (it said
    // "match": every stage agreed with A's own upstream, and the inputs excused the rest)
    auto others = test::sh(test::mhc("diff --ignore-inputs " + dir + "/seed22.h5 " + dir + "/ref.h5"));
    CHECK(others.rc == 1);
    CHECK(others.out.find("(inherited from the inputs, which differ: /inputs/") != std::string::npos);
    Case tok = generate_case(parse_shape("48,4,64"), 21, true);  // ref's inputs, one dh_post value moved
    tok.t["dh_post"].set(3, tok.get("dh_post").at(3) + 1);
    cpu_run(tok, Precision::fp32);
    save_case(dir + "/dh_post.h5", tok);
    auto per_token = test::sh(test::mhc("diff --ignore-inputs " + dir + "/dh_post.h5 " + dir + "/ref.h5"));
    CHECK(per_token.rc == 1);  // it was exit 2, "inputs differ; use --ignore-inputs"
    CHECK(per_token.out.find("inherited from the inputs, which differ: /inputs/dh_post") != std::string::npos);

    CHECK(test::sh(test::mhc("diff " + dir + "/nope.h5 cpu")).rc == 2);
    CHECK(test::sh(test::mhc("diff cpu cpu --tol dphi=abc")).rc == 2);

    std::string check =
        "import json,sys; r=json.load(sys.stdin); "
        "assert r['schema']==2 and r['verdict']=='diverged' and r['first_divergent']=='dalpha', r; "
        "assert r['root_causes']==['dalpha'], r['root_causes']; "
        "keys={'name','status','rel_l2','max_abs','max_abs_index','mismatch_fraction','tolerance'}; "
        "assert all(keys <= set(s) for s in r['stages']); "
        "st={s['name']:s for s in r['stages']}; "
        "assert st['dalpha']['status']=='diverged' and st['dphi']['status']=='ok'; "
        "assert st['dalpha']['max_abs_index']==[1] and st['dalpha']['mismatch_fraction']>0.3; "
        "assert all(s['status'] in ('ok','diverged','inherited','missing','unknown','format') for s in r['stages']); "
        "assert st['dalpha']['class']=='diverged' and st['dphi']['class'] in ('exact','fp32'); "
        "print('json ok')";
    auto js = test::sh(test::mhc("diff --json " + dir + "/bad.h5 " + dir + "/ref.h5") + " | " + MHC_PYTHON +
                       " -c \"" + check + "\"");
    CHECK(js.rc == 0);
    CHECK(js.out == "json ok\n");
    auto ok = test::sh(test::mhc("diff --json " + dir + "/ref.h5 cpu") + " | " + MHC_PYTHON +
                       " -c \"import json,sys; r=json.load(sys.stdin); assert r['verdict']=='match' and "
                       "r['first_divergent'] is None and r['root_causes']==[]; print('ok')\"");
    CHECK(ok.out == "ok\n");
  }

  TEST_CASE("the CPU golden against the PyTorch autograd dump matches, from the command line") {
    for (auto& e : std::filesystem::directory_iterator(MHC_TORCH_DIR)) {
      CAPTURE(e.path().string());
      auto r = test::sh(test::mhc("diff cpu " + e.path().string()));
      CHECK(r.rc == 0);
    }
  }
}
