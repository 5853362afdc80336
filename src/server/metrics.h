// /metrics: Prometheus text exposition (format 0.0.4) with vLLM's metric names under the
// `deepserve:` prefix (conventions.md). Latency histograms (time to first token, inter-token
// latency, end-to-end latency) are built by the server from event times; gauges and counters of
// the engine (running/waiting, KV usage and pages, token totals, preemptions, speculative
// decoding) come from Engine::metrics() at scrape time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "deepserve/engine.h"

namespace ds::server {

// A cumulative-bucket histogram (thread-safe).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends `# HELP`, `# TYPE` and the _bucket/_sum/_count series; `labels` is `k="v",...` or "".
  void render(std::string* out, const std::string& name, const std::string& help,
              const std::string& labels) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // [bounds + 1] per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  Histogram time_to_first_token;  // seconds
  Histogram inter_token_latency;  // seconds between token events
  Histogram e2e_request_latency;  // seconds from arrival to the last event

  // Finished generation requests by finish reason (stop, length, tool_calls, abort, error).
  void count_finished(deepserve::FinishReason reason);
  // HTTP answers by status code class (2xx, 4xx, 5xx) and the 429/503 rejections.
  void count_http(int status);

  std::atomic<int64_t> active_generations{0};  // requests the HTTP side is serving now

  // The whole exposition. `engine` is null while loading.
  std::string render(const deepserve::EngineMetrics* engine, const std::string& model_name) const;

 private:
  std::array<std::atomic<int64_t>, 6> finished_{};  // by FinishReason value
  std::atomic<int64_t> http_2xx_{0}, http_4xx_{0}, http_5xx_{0}, http_rejected_{0};
};

// This process's memory: the resident set (/proc/self/statm) and the bytes the C allocator holds
// for the program (glibc's mallinfo2, every arena): the second grows only when live allocations
// do, the first also with allocator fragmentation. -1 where unavailable.
struct ProcessMemory {
  int64_t resident_bytes = -1;
  int64_t heap_allocated_bytes = -1;
};
ProcessMemory process_memory();

// Prometheus label value escaping (backslash, double quote, newline).
std::string prometheus_label_value(const std::string& value);

}  // namespace ds::server
