// Benchmark metric arithmetic (definitions in metrics.h).
#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ds::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - double(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

double population_std(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  const double m = mean(values);
  double ss = 0;
  for (double v : values) ss += (v - m) * (v - m);
  return std::sqrt(ss / double(values.size()));
}

Distribution summarize_seconds(const std::vector<double>& values_s,
                               const std::vector<double>& percentiles) {
  Distribution d;
  d.mean_ms = mean(values_s) * 1000.0;
  d.median_ms = percentile(values_s, 50) * 1000.0;
  d.std_ms = population_std(values_s) * 1000.0;
  for (double p : percentiles) d.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000.0);
  return d;
}

BenchMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                             const std::vector<double>& percentiles) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::vector<std::pair<double, int>> events;  // (time, +1 start / -1 end)
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_len;
    m.total_output_tokens += r.output_tokens;
    if (r.output_tokens > 1)
      tpots.push_back((r.latency_s - r.ttft_s) / double(r.output_tokens - 1));
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.latency_s);
    events.emplace_back(r.start_s, +1);
    events.emplace_back(r.start_s + r.latency_s, -1);
  }
  if (duration_s > 0) {
    m.request_throughput = double(m.completed) / duration_s;
    m.input_throughput = double(m.total_input_tokens) / duration_s;
    m.output_throughput = double(m.total_output_tokens) / duration_s;
    m.total_token_throughput = double(m.total_input_tokens + m.total_output_tokens) / duration_s;
    m.effective_concurrency = std::accumulate(e2els.begin(), e2els.end(), 0.0) / duration_s;
  }
  // Sweep line over half-open intervals: an end at time t comes before a start at t.
  std::sort(events.begin(), events.end());
  int64_t now = 0;
  for (const auto& e : events) {
    now += e.second;
    m.peak_concurrency = std::max(m.peak_concurrency, now);
  }
  m.ttft = summarize_seconds(ttfts, percentiles);
  m.tpot = summarize_seconds(tpots, percentiles);
  m.itl = summarize_seconds(itls, percentiles);
  m.e2el = summarize_seconds(e2els, percentiles);
  return m;
}

}  // namespace ds::bench
