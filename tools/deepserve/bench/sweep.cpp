// Concurrency sweep summary and plots (see sweep.h).
#include "bench/sweep.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace ds::bench {

Result<std::vector<int64_t>> parse_sweep(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v <= 0)
      return invalid_argument(
          "--sweep takes positive concurrencies separated by commas "
          "(e.g. 1,8,16,64); got \"" +
          text + "\"");
    if (std::find(out.begin(), out.end(), v) != out.end())
      return invalid_argument("--sweep lists concurrency " + std::to_string(v) + " twice");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

std::string format_sweep_table(const std::vector<SweepPoint>& points) {
  std::string s = "================ Concurrency sweep ================\n";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%11s %9s %11s %11s %10s %10s %10s %9s\n", "concurrency", "req/s",
                "out tok/s", "total tok/s", "TTFT ms", "TPOT ms", "ITL ms", "failed");
  s += buf;
  for (const auto& p : points) {
    std::snprintf(buf, sizeof(buf), "%11lld %9.2f %11.2f %11.2f %10.2f %10.2f %10.2f %9lld\n",
                  (long long)p.concurrency, p.metrics.request_throughput,
                  p.metrics.output_throughput, p.metrics.total_token_throughput,
                  p.metrics.ttft.median_ms, p.metrics.tpot.mean_ms, p.metrics.itl.mean_ms,
                  (long long)p.metrics.failed);
    s += buf;
  }
  s += "(TTFT median, TPOT and ITL mean)\n";
  return s;
}

PlotSpec throughput_plot(const std::vector<SweepPoint>& points, const std::string& subtitle) {
  PlotSpec spec;
  spec.title = "Throughput vs concurrency" + (subtitle.empty() ? "" : " (" + subtitle + ")");
  spec.x_label = "max concurrency (requests in flight)";
  spec.y_label = "tokens/s";
  spec.log2_x = true;
  PlotSeries out{"output tok/s", {}, {}}, total{"total tok/s (input + output)", {}, {}};
  for (const auto& p : points) {
    out.x.push_back(double(p.concurrency));
    out.y.push_back(p.metrics.output_throughput);
    total.x.push_back(double(p.concurrency));
    total.y.push_back(p.metrics.total_token_throughput);
  }
  spec.series = {out, total};
  return spec;
}

PlotSpec tpot_plot(const std::vector<SweepPoint>& points, const std::string& subtitle) {
  PlotSpec spec;
  spec.title = "TPOT vs concurrency" + (subtitle.empty() ? "" : " (" + subtitle + ")");
  spec.x_label = "max concurrency (requests in flight)";
  spec.y_label = "time per output token (ms)";
  spec.log2_x = true;
  PlotSeries mean{"mean TPOT", {}, {}}, median{"median TPOT", {}, {}}, p99{"p99 TPOT", {}, {}};
  for (const auto& p : points) {
    const double x = double(p.concurrency);
    mean.x.push_back(x);
    mean.y.push_back(p.metrics.tpot.mean_ms);
    median.x.push_back(x);
    median.y.push_back(p.metrics.tpot.median_ms);
    for (const auto& [pc, v] : p.metrics.tpot.percentiles_ms)
      if (pc == 99) {
        p99.x.push_back(x);
        p99.y.push_back(v);
      }
  }
  spec.series = {mean, median};
  if (!p99.x.empty()) spec.series.push_back(p99);
  return spec;
}

}  // namespace ds::bench
