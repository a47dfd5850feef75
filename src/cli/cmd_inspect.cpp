// cmd_inspect.cpp — mhc inspect: every dataset with shape, dtype and value statistics.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "h5io.h"
#include "stats.h"

namespace mhc {

void add_inspect(CLI::App& app, int& rc) {
  auto file = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("inspect", "List every dataset: shape, dtype, min/max/mean, NaN/Inf counts");
  sub->add_option("file", *file, "HDF5 file")->required();
  sub->footer("Example:\n  mhc inspect out.h5");
  sub->callback([file, &rc] {
    std::map<std::string, std::string> attrs;
    std::vector<DatasetInfo> datasets = list_datasets(*file, &attrs);
    std::printf("%s", one_line(*file).c_str());
    for (auto& [k, v] : attrs) std::printf("  %s=%s", one_line(k).c_str(), one_line(v).c_str());
    std::printf("\n%-22s %-16s %-9s %12s %12s %12s %8s %8s\n", "dataset", "shape", "dtype", "min", "max", "mean",
                "nan", "inf");
    for (const DatasetInfo& d : datasets) {
      std::printf("%-22s %-16s %-9s", one_line(d.path).c_str(), shape_str(d.shape).c_str(), one_line(d.type).c_str());
      if (!d.unread.empty()) {
        std::printf("  (not read: %s)", one_line(d.unread).c_str());
      } else if (d.is_float && numel(d.shape) == 0) {
        std::printf("  (no elements)");
      } else if (d.has_stats && !d.stats.finite) {  // NaN and Inf only: no min, max or mean
        std::printf(" %12s %12s %12s %8lld %8lld", "-", "-", "-", (long long)d.stats.nan, (long long)d.stats.inf);
      } else if (d.has_stats) {
        const Stats& s = d.stats;
        std::printf(" %12.5g %12.5g %12.5g %8lld %8lld", s.min, s.max, s.mean, (long long)s.nan, (long long)s.inf);
      } else if (d.is_float && !d.written) {
        std::printf("  (never written: no data stored)");
      } else if (d.is_float && d.partly) {
        std::printf("  (partly written: statistics skipped)");
      } else if (d.is_float) {
        std::printf("  (statistics skipped: more than %lld elements)", (long long)kInspectMaxElements);
      }
      std::printf("\n");
    }
    rc = 0;
  });
}

}  // namespace mhc
