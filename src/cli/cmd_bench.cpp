// cmd_bench.cpp — mhc bench: time the operator alone (no file I/O) on a generated case.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "backends.h"
#include "commands.h"
#include "cuda_backend.h"
#include "diff.h"
#include "generate.h"
#include "h5io.h"

namespace mhc {

void add_bench(CLI::App& app, int& rc) {
  struct Opts {
    std::string backend = "cpu", shape = "4096,4,4096", pass = "both";
    int repeat = 5, warmup = 1;
    uint64_t seed = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("bench", "Time the operator alone: median/min/max over repeats, effective GB/s");
  sub->add_option("--backend", o->backend, "cpu, cpu:fp64 or cuda")->capture_default_str();
  sub->add_option("--shape", o->shape, "T,n,D or B,S,n,D")->capture_default_str();
  sub->add_option("--pass", o->pass, "fwd, bwd or both")->check(CLI::IsMember({"fwd", "bwd", "both"}))
      ->capture_default_str();
  sub->add_option("--repeat", o->repeat, "timed repeats")->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("--warmup", o->warmup, "untimed repeats first")->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "seed of the generated inputs")->check(kSeed)->capture_default_str();
  sub->add_flag("--json", o->json, "print one JSON object");
  sub->footer(
      "Examples:\n  OMP_NUM_THREADS=2 mhc bench --backend cpu --shape 4096,4,4096 --pass both\n"
      "  mhc bench --backend cuda --shape 16384,4,4096 --repeat 50 --json\n"
      "Effective GB/s counts the fewest bytes the pass must move (inputs read once, outputs\n"
      "written once, intermediates such as dvecX not counted) over the median time. cuda: the L2\n"
      "is flushed before every repeat, and the device's copy bandwidth is measured once to\n"
      "report the effective GB/s as a percentage of it.");
  sub->callback([o, &rc] {
    BackendSpec b = parse_backend(o->backend);
    Problem p = parse_shape(o->shape);
    check_case_memory(cat("--shape ", o->shape, ": "), p, Holds::case_f64);
    Pass pass = o->pass == "fwd" ? Pass::fwd : o->pass == "bwd" ? Pass::bwd : Pass::both;
    Case c = generate_case(p, o->seed, pass != Pass::fwd);
    std::string device = backend_device(b);
    const double copy_gbps = b.name() == "cuda" ? cuda_copy_gbps() : 0.0;  // 0: not measured
    std::vector<double> ms = bench_backend(b, c, pass, o->warmup, o->repeat);
    std::sort(ms.begin(), ms.end());
    double med = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    double bytes = min_bytes(p, pass), gbps = bytes / (med * 1e-3) / 1e9;
    if (o->json) {
      // strings as JSON literals: a tab in --shape (accepted, trimmed by the parser) made it invalid
      std::printf(
          "{\"backend\": %s, \"device\": %s, \"shape\": %s, \"pass\": %s, \"repeat\": %d, "
          "\"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, \"bytes\": %.0f, \"gbps\": %.2f",
          json_string(b.str()).c_str(), json_string(device).c_str(), json_string(o->shape).c_str(),
          json_string(o->pass).c_str(), o->repeat, med, ms.front(), ms.back(), bytes, gbps);
      if (copy_gbps > 0) std::printf(", \"copy_gbps\": %.1f, \"pct_copy_bw\": %.1f", copy_gbps, 100 * gbps / copy_gbps);
      std::printf("}\n");
    } else {
      std::printf("mhc bench: %s on %s\n  %s, pass %s, %d repeat%s after %d warm-up\n", b.str().c_str(),
                  device.c_str(), p.str().c_str(), o->pass.c_str(), o->repeat, o->repeat == 1 ? "" : "s", o->warmup);
      std::printf("  median %.3f ms   min %.3f ms   max %.3f ms   effective %.1f GB/s (%.3g GB minimum traffic)\n",
                  med, ms.front(), ms.back(), gbps, bytes / 1e9);
      if (copy_gbps > 0)
        std::printf("  %.1f%% of the device's copy bandwidth (%.0f GB/s, 1 GiB device-to-device, read + write)\n",
                    100 * gbps / copy_gbps, copy_gbps);
    }
    rc = 0;
  });
}

}  // namespace mhc
