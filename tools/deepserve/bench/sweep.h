// The concurrency sweep of `deepserve bench --sweep 1,8,16,64`: one benchmark per concurrency,
// a summary table, a JSON holding every run, and two SVG charts (output and total token
// throughput vs concurrency; TPOT mean/median/p99 vs concurrency).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/metrics.h"
#include "bench/svg_plot.h"
#include "core/json.h"
#include "core/status.h"

namespace ds::bench {

struct SweepPoint {
  int64_t concurrency = 0;
  BenchMetrics metrics;
};

// "1,8,16,64" -> {1, 8, 16, 64}; each > 0, no duplicates.
Result<std::vector<int64_t>> parse_sweep(const std::string& text);

std::string format_sweep_table(const std::vector<SweepPoint>& points);
PlotSpec throughput_plot(const std::vector<SweepPoint>& points, const std::string& subtitle);
PlotSpec tpot_plot(const std::vector<SweepPoint>& points, const std::string& subtitle);

}  // namespace ds::bench
