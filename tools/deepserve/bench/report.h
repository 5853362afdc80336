// The benchmark's outputs: the result table (the layout and labels of `vllm bench serve` /
// `sglang.bench_serving`) and the result JSON (vLLM's key names: duration, completed, failed,
// total_input_tokens, total_output_tokens, request_throughput, output_throughput,
// total_token_throughput, {mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms, max_concurrent_requests,
// input_lens, output_lens, ttfts, itls, latencies, start_times, errors; SGLang's
// input_throughput and concurrency; spec_decode_* when measured).
#pragma once

#include <string>

#include "bench/metrics.h"
#include "bench/runner.h"
#include "core/json.h"

namespace ds::bench {

// What was run, for the table header and the JSON.
struct RunDescription {
  std::string backend = "openai";
  std::string base_url;
  std::string endpoint;
  std::string model;
  std::string tokenizer;
  std::string dataset_name;
  std::string dataset_path;
  int64_t num_prompts = 0;
  double request_rate = 0;  // inf = all at once
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0 = not set
  int64_t random_input_len = 0, random_output_len = 0;
  double random_range_ratio = 0;
  bool ignore_eos = false;
  uint64_t seed = 0;
  std::string date;  // "YYYYMMDD-HHMMSS" UTC
};

std::string format_report(const RunDescription& d, const BenchMetrics& m, const RunResult& run);

// `detailed` adds generated_texts.
Json report_json(const RunDescription& d, const BenchMetrics& m, const RunResult& run,
                 bool detailed);

}  // namespace ds::bench
