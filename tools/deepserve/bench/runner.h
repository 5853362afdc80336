// Runs one benchmark against a server: warm-up requests, then every sample request sent at its
// arrival time (arrivals.h) through at most --max-concurrency in flight (a pool of that many
// worker threads, each with its own keep-alive connection, taking requests in arrival order:
// vLLM's semaphore), timing each stream (openai_client.h). Output tokens come from the server's
// usage; without it the generated text is re-tokenized (as vLLM does). Speculative-decoding
// counters are read from /metrics before and after when the server exposes them.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/openai_client.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace ds::bench {

struct RunOptions {
  BaseUrl base;
  std::string endpoint = "/v1/completions";
  ApiKind kind = ApiKind::kCompletions;
  std::string model;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0 = unlimited
  int64_t num_warmups = 1;
  int64_t warmup_max_tokens = 32;  // warm-ups ask for min(output_len, this) tokens
  bool ignore_eos = false;
  std::optional<double> temperature;
  Json extra_body = Json::object();
  uint64_t seed = 0;
  bool show_progress = true;
  ClientOptions client;
};

// Speculative decoding over the run, from the server's Prometheus counters (deltas).
struct SpecDecodeStats {
  int64_t num_drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  double acceptance_rate = 0;    // accepted / draft tokens * 100
  double acceptance_length = 0;  // 1 + accepted / drafts
};

// Sums of the *_spec_decode_num_drafts_total, ..._num_draft_tokens_total and
// ..._num_accepted_tokens_total counters (prefix deepserve:, vllm: or sglang:) in Prometheus
// text; nullopt when none appears.
struct SpecCounters {
  int64_t num_drafts = 0, draft_tokens = 0, accepted_tokens = 0;
};
std::optional<SpecCounters> parse_spec_counters(const std::string& prometheus_text);
std::optional<SpecDecodeStats> spec_decode_delta(const std::optional<SpecCounters>& before,
                                                 const std::optional<SpecCounters>& after);

struct RunResult {
  std::vector<RequestRecord> records;  // in sample order
  Clock::time_point origin;            // the benchmark start all record times count from
  double duration_s = 0;
  int64_t warmups_ok = 0;
  std::optional<SpecDecodeStats> spec_decode;
};

// `retokenizer` counts output tokens when the server sends no usage (may be null: then each
// text chunk counts as one token).
Result<RunResult> run_benchmark(const RunOptions& options,
                                const std::vector<SampleRequest>& samples,
                                const tok::Tokenizer* retokenizer);

}  // namespace ds::bench
