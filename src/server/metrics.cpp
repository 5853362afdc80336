// Prometheus histograms and the /metrics text (see metrics.h).
#include "server/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's count of live bytes (declared here: GCC ships no
// sanitizer/allocator_interface.h).
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#define DS_HEAP_FROM_SANITIZER 1
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define DS_HEAP_FROM_MALLINFO2 1
#endif

namespace ds::server {
namespace {

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void metric_header(std::string* out, const std::string& name, const char* type,
                   const std::string& help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " " + fmt_double(v) + "\n";
}

}  // namespace

ProcessMemory process_memory() {
  ProcessMemory m;
  // /proc/self/statm: size resident shared text lib data dt, in pages.
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      m.resident_bytes = int64_t(resident) * int64_t(sysconf(_SC_PAGESIZE));
    }
    std::fclose(f);
  }
#if defined(DS_HEAP_FROM_SANITIZER)
  // AddressSanitizer replaces malloc; its allocator counts the live bytes itself.
  m.heap_allocated_bytes = int64_t(__sanitizer_get_current_allocated_bytes());
#elif defined(DS_HEAP_FROM_MALLINFO2)
  // Every arena's bytes in use plus the mmap'ed chunks: what the program holds, whatever the
  // arenas' free lists and high-water marks add to the RSS.
  const struct mallinfo2 info = mallinfo2();
  m.heap_allocated_bytes = int64_t(info.uordblks + info.hblkhd);
#endif
  return m;
}

std::string prometheus_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void Histogram::render(std::string* out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  metric_header(out, name, "histogram", help);
  const std::string sep = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? fmt_double(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + sep + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, double(count_));
}

ServerMetrics::ServerMetrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
                           1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      inter_token_latency({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2, 0.3,
                           0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  10.0,  20.0, 40.0, 80.0}),
      e2e_request_latency({0.01,  0.05,  0.1,   0.3,   0.5,    0.8,   1.0,  1.5,
                           2.0,   2.5,   5.0,   10.0,  15.0,   20.0,  30.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::count_finished(deepserve::FinishReason reason) {
  const size_t i = size_t(reason);
  if (i < finished_.size()) finished_[i].fetch_add(1, std::memory_order_relaxed);
}

void ServerMetrics::count_http(int status) {
  if (status >= 200 && status < 300) http_2xx_.fetch_add(1);
  if (status >= 400 && status < 500) http_4xx_.fetch_add(1);
  if (status >= 500) http_5xx_.fetch_add(1);
  if (status == 429 || status == 503) http_rejected_.fetch_add(1);
}

std::string ServerMetrics::render(const deepserve::EngineMetrics* engine,
                                  const std::string& model_name) const {
  std::string out;
  out.reserve(8192);
  const std::string labels = "model_name=\"" + prometheus_label_value(model_name) + "\"";
  const deepserve::EngineMetrics m = engine ? *engine : deepserve::EngineMetrics{};

  auto gauge = [&](const char* name, const char* help, double v) {
    metric_header(&out, name, "gauge", help);
    sample(&out, name, labels, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    metric_header(&out, name, "counter", help);
    sample(&out, name, labels, v);
  };
  gauge("deepserve:num_requests_running", "Requests in the running batch.",
        double(m.num_requests_running));
  gauge("deepserve:num_requests_waiting", "Requests waiting to be scheduled.",
        double(m.num_requests_waiting));
  gauge("deepserve:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", m.kv_cache_usage);
  gauge("deepserve:kv_cache_pages_total", "KV-cache pages in the pool.", double(m.kv_pages_total));
  gauge("deepserve:kv_cache_pages_free", "KV-cache pages free.", double(m.kv_pages_free));
  gauge("deepserve:http_active_generations", "Generation requests the HTTP server is serving.",
        double(active_generations.load()));
  counter("deepserve:prompt_tokens_total", "Prefill tokens processed.",
          double(m.prompt_tokens_total));
  counter("deepserve:generation_tokens_total", "Generation tokens produced.",
          double(m.generation_tokens_total));
  counter("deepserve:num_preemptions_total", "Preemptions of running requests.",
          double(m.num_preemptions_total));
  counter("deepserve:engine_steps_total", "Engine steps run.", double(m.engine_steps_total));
  counter("deepserve:engine_prefill_steps_total",
          "Engine steps that computed prefill rows (alone or next to decode rows).",
          double(m.prefill_steps_total));
  counter("deepserve:engine_argmax_rows_total",
          "Sampled rows whose token is the backend's argmax (greedy, nothing adjusts the logits, "
          "no logprobs): their logits stay on the device.",
          double(m.step_argmax_rows_total));
  counter("deepserve:engine_backend_sampled_rows_total",
          "Sampled rows whose random draw the backend made (temperature > 0, nothing adjusts the "
          "logits, no logprobs, no drafts): their logits stay on the device.",
          double(m.step_backend_sampled_rows_total));
  metric_header(&out, "deepserve:engine_step_seconds_total", "counter",
                "Engine-thread seconds per step phase (schedule, forward, sample, emit, "
                "speculate).");
  const std::pair<const char*, double> phases[] = {
      {"schedule", m.step_schedule_seconds_total}, {"forward", m.step_forward_seconds_total},
      {"sample", m.step_sample_seconds_total},     {"emit", m.step_emit_seconds_total},
      {"speculate", m.step_speculate_seconds_total}};
  for (const auto& [phase, v] : phases) {
    sample(&out, "deepserve:engine_step_seconds_total", labels + ",phase=\"" + phase + "\"", v);
  }
  metric_header(&out, "deepserve:engine_step_tokens_total", "counter",
                "Rows fed to the model, by kind: decode (a generated token and its drafts) or "
                "prefill (prompt tokens and recomputation).");
  sample(&out, "deepserve:engine_step_tokens_total", labels + ",kind=\"decode\"",
         double(m.step_decode_tokens_total));
  sample(&out, "deepserve:engine_step_tokens_total", labels + ",kind=\"prefill\"",
         double(m.step_prefill_tokens_total));
  counter("deepserve:request_failed_total", "Requests the engine ended with an error.",
          double(m.requests_failed_total));
  counter("deepserve:request_rejected_total",
          "Requests refused at admission by the engine (queue full or draining).",
          double(m.requests_rejected_total));
  counter("deepserve:request_corrupted_total",
          "Requests ended by non-finite logits (also counted as failed).",
          double(m.requests_corrupted_total));
  gauge("deepserve:kv_cache_capacity_tokens", "Tokens one sequence can hold at most.",
        double(m.kv_capacity_tokens));
  if (!m.kv_pools.empty()) {
    metric_header(&out, "deepserve:kv_cache_pool_free", "gauge",
                  "Free units (pages or slots) per KV pool; back to the total when idle.");
    for (const auto& p : m.kv_pools) {
      sample(&out, "deepserve:kv_cache_pool_free",
             labels + ",pool=\"" + prometheus_label_value(p.name) + "\"", double(p.free));
    }
    metric_header(&out, "deepserve:kv_cache_pool_total", "gauge", "Units per KV pool.");
    for (const auto& p : m.kv_pools) {
      sample(&out, "deepserve:kv_cache_pool_total",
             labels + ",pool=\"" + prometheus_label_value(p.name) + "\"", double(p.total));
    }
  }
  counter("deepserve:spec_decode_num_drafts_total",
          "Speculative verify steps of one sequence with at least one draft token.",
          double(m.spec_num_drafts_total));
  counter("deepserve:spec_decode_num_draft_tokens_total", "Speculative draft tokens proposed.",
          double(m.spec_draft_tokens_total));
  counter("deepserve:spec_decode_num_accepted_tokens_total", "Speculative draft tokens accepted.",
          double(m.spec_accepted_tokens_total));
  gauge("deepserve:spec_decode_acceptance_rate",
        "Accepted / proposed draft tokens since start (0 before any draft).",
        m.spec_draft_tokens_total > 0
            ? double(m.spec_accepted_tokens_total) / double(m.spec_draft_tokens_total)
            : 0.0);
  gauge("deepserve:spec_decode_mean_accepted_length",
        "Tokens emitted per verify step since start: 1 + accepted / drafts (0 before any).",
        m.spec_num_drafts_total > 0
            ? 1.0 + double(m.spec_accepted_tokens_total) / double(m.spec_num_drafts_total)
            : 0.0);
  gauge("deepserve:spec_decode_num_speculative_tokens",
        "Draft tokens per step the adaptive policy chose last (0 = speculation off).",
        double(m.spec_num_speculative_tokens));

  metric_header(&out, "deepserve:request_success_total", "counter",
                "Finished requests by finish reason.");
  static const std::pair<deepserve::FinishReason, const char*> kReasons[] = {
      {deepserve::FinishReason::kStop, "stop"},
      {deepserve::FinishReason::kLength, "length"},
      {deepserve::FinishReason::kToolCalls, "tool_calls"},
      {deepserve::FinishReason::kAbort, "abort"},
      {deepserve::FinishReason::kError, "error"}};
  for (const auto& [reason, name] : kReasons) {
    sample(&out, "deepserve:request_success_total", labels + ",finished_reason=\"" + name + "\"",
           double(finished_[size_t(reason)].load()));
  }
  metric_header(&out, "deepserve:http_responses_total", "counter",
                "HTTP responses by status class.");
  sample(&out, "deepserve:http_responses_total", labels + ",code=\"2xx\"", double(http_2xx_));
  sample(&out, "deepserve:http_responses_total", labels + ",code=\"4xx\"", double(http_4xx_));
  sample(&out, "deepserve:http_responses_total", labels + ",code=\"5xx\"", double(http_5xx_));
  counter("deepserve:http_rejected_total", "HTTP answers 429/503 (overloaded, loading, draining).",
          double(http_rejected_));

  // Process memory, unlabelled like the Prometheus client libraries' process collector.
  const ProcessMemory pm = process_memory();
  if (pm.resident_bytes >= 0) {
    metric_header(&out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    sample(&out, "process_resident_memory_bytes", "", double(pm.resident_bytes));
  }
  if (pm.heap_allocated_bytes >= 0) {
    gauge("deepserve:heap_allocated_bytes",
          "Bytes the C allocator has handed out and not taken back (glibc mallinfo2).",
          double(pm.heap_allocated_bytes));
  }

  time_to_first_token.render(&out, "deepserve:time_to_first_token_seconds",
                             "Histogram of time to first token in seconds.", labels);
  inter_token_latency.render(&out, "deepserve:inter_token_latency_seconds",
                             "Histogram of the time between token events in seconds.", labels);
  e2e_request_latency.render(&out, "deepserve:e2e_request_latency_seconds",
                             "Histogram of end-to-end request latency in seconds.", labels);
  return out;
}

}  // namespace ds::server
