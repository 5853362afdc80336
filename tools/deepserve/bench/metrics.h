// The serving-benchmark metrics as pure functions over per-request timelines, with the
// definitions of vLLM's `vllm bench serve` (vllm/benchmarks/serve.py calculate_metrics) and
// SGLang's `sglang.bench_serving`:
//   TTFT  = time from sending the request to the first streamed chunk carrying generated text;
//   ITL   = the gaps between consecutive text-carrying chunks (one value per gap, all requests
//           pooled; a chunk holding several tokens is one gap);
//   E2E   = time from sending the request to the last text-carrying chunk;
//   TPOT  = (E2E - TTFT) / (output tokens - 1), per request with more than one output token,
//           then averaged over requests;
//   effective concurrency = sum of E2E latencies / benchmark duration (SGLang, Little's law);
//   peak concurrency = most requests in flight at once (vLLM, half-open [start, end) intervals);
//   percentiles = numpy.percentile's default linear interpolation; std = population std.
// Failed requests count only in `failed`. Times are seconds in RequestRecord, ms in the summary.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ds::bench {

// One benchmark request as the client saw it.
struct RequestRecord {
  bool success = false;
  std::string error;          // why it failed (HTTP status and body, transport error)
  int64_t prompt_len = 0;     // input tokens: the server's usage.prompt_tokens when reported
  int64_t output_tokens = 0;  // usage.completion_tokens, else the re-tokenized text's length
  bool output_tokens_from_usage = false;
  int64_t expected_output_len = 0;  // max_tokens asked for
  double start_s = 0;               // when the request was sent, seconds since the benchmark start
  double queue_s = 0;               // time it waited for a concurrency slot after its arrival
  double ttft_s = 0;                // first text chunk - start
  std::vector<double> itl_s;        // [text chunks - 1] gaps between consecutive text chunks
  double latency_s = 0;             // last text chunk - start (E2E)
  std::string generated_text;
};

// Linear-interpolation percentile of `values` (numpy.percentile default): rank p/100*(n-1)
// between the sorted neighbours. 0 for an empty input (as numpy on `values or 0`).
double percentile(std::vector<double> values, double p);
double mean(const std::vector<double>& values);
double population_std(const std::vector<double>& values);

// mean / median / std / chosen percentiles of one metric, in milliseconds.
struct Distribution {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value) in the order asked
};
Distribution summarize_seconds(const std::vector<double>& values_s,
                               const std::vector<double>& percentiles);

struct BenchMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;      // completed / duration
  double input_throughput = 0;        // total input / duration
  double output_throughput = 0;       // total output / duration
  double total_token_throughput = 0;  // (input + output) / duration
  double effective_concurrency = 0;   // sum(E2E) / duration
  int64_t peak_concurrency = 0;       // most successful requests in flight at once
  Distribution ttft, tpot, itl, e2el;
};

// The metrics of `records` over a benchmark that lasted `duration_s` (> 0).
BenchMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                             const std::vector<double>& percentiles);

}  // namespace ds::bench
