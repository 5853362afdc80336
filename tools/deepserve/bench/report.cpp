// Result table and result JSON of `deepserve bench` (see report.h).
#include "bench/report.h"

#include <cmath>
#include <cstdio>

namespace ds::bench {
namespace {

constexpr int kWidth = 50;

std::string centered(const std::string& title, char fill) {
  const int pad = kWidth - int(title.size());
  if (pad <= 0) return title;
  const int left = pad / 2;
  return std::string(size_t(left), fill) + title + std::string(size_t(pad - left), fill);
}

std::string line(const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-40s %-10s", label.c_str(), value.c_str());
  std::string s(buf);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + "\n";
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string pct_word(double p) {
  char buf[32];
  if (p == std::floor(p))
    std::snprintf(buf, sizeof(buf), "%d", int(p));
  else
    std::snprintf(buf, sizeof(buf), "%g", p);
  return buf;
}

std::string distribution_block(const std::string& header, const std::string& name,
                               const Distribution& d) {
  std::string s = centered(header, '-') + "\n";
  s += line("Mean " + name + " (ms):", num(d.mean_ms));
  s += line("Median " + name + " (ms):", num(d.median_ms));
  for (const auto& [p, v] : d.percentiles_ms)
    s += line("P" + pct_word(p) + " " + name + " (ms):", num(v));
  return s;
}

void put_distribution(Json* j, const std::string& key, const Distribution& d) {
  (*j)["mean_" + key + "_ms"] = d.mean_ms;
  (*j)["median_" + key + "_ms"] = d.median_ms;
  (*j)["std_" + key + "_ms"] = d.std_ms;
  for (const auto& [p, v] : d.percentiles_ms) (*j)["p" + pct_word(p) + "_" + key + "_ms"] = v;
}

}  // namespace

std::string format_report(const RunDescription& d, const BenchMetrics& m, const RunResult& run) {
  std::string s = centered(" Serving Benchmark Result ", '=') + "\n";
  s += line("Backend:", d.backend);
  s += line("Traffic request rate:", std::isinf(d.request_rate) ? "inf" : num(d.request_rate));
  if (!std::isinf(d.request_rate))
    s += line("Burstiness factor:",
              num(d.burstiness) + (d.burstiness == 1.0 ? " (Poisson process)" : " (Gamma)"));
  s += line("Max request concurrency:",
            d.max_concurrency > 0 ? std::to_string(d.max_concurrency) : "not set");
  s += line("Successful requests:", std::to_string(m.completed));
  s += line("Failed requests:", std::to_string(m.failed));
  s += line("Benchmark duration (s):", num(m.duration_s));
  s += line("Total input tokens:", std::to_string(m.total_input_tokens));
  s += line("Total generated tokens:", std::to_string(m.total_output_tokens));
  s += line("Request throughput (req/s):", num(m.request_throughput));
  s += line("Input token throughput (tok/s):", num(m.input_throughput));
  s += line("Output token throughput (tok/s):", num(m.output_throughput));
  s += line("Total token throughput (tok/s):", num(m.total_token_throughput));
  s += line("Concurrency (effective):", num(m.effective_concurrency));
  s += line("Peak concurrent requests:", std::to_string(m.peak_concurrency));
  s += distribution_block("Time to First Token", "TTFT", m.ttft);
  s += distribution_block("Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  s += distribution_block("Inter-token Latency", "ITL", m.itl);
  s += distribution_block("End-to-end Latency", "E2EL", m.e2el);
  if (run.spec_decode) {
    s += centered("Speculative Decoding", '-') + "\n";
    s += line("Acceptance rate (%):", num(run.spec_decode->acceptance_rate));
    s += line("Acceptance length:", num(run.spec_decode->acceptance_length));
    s += line("Drafts:", std::to_string(run.spec_decode->num_drafts));
    s += line("Draft tokens:", std::to_string(run.spec_decode->draft_tokens));
    s += line("Accepted tokens:", std::to_string(run.spec_decode->accepted_tokens));
  }
  s += std::string(kWidth, '=') + "\n";
  return s;
}

Json report_json(const RunDescription& d, const BenchMetrics& m, const RunResult& run,
                 bool detailed) {
  Json j = Json::object();
  j["date"] = d.date;
  j["backend"] = d.backend;
  j["base_url"] = d.base_url;
  j["endpoint"] = d.endpoint;
  j["model_id"] = d.model;
  j["tokenizer_id"] = d.tokenizer;
  j["dataset_name"] = d.dataset_name;
  j["dataset_path"] = d.dataset_path;
  j["num_prompts"] = d.num_prompts;
  // JSON has no infinity: an unlimited rate is written as the string "inf".
  if (std::isinf(d.request_rate))
    j["request_rate"] = "inf";
  else
    j["request_rate"] = d.request_rate;
  j["burstiness"] = d.burstiness;
  if (d.max_concurrency > 0)
    j["max_concurrency"] = d.max_concurrency;
  else
    j["max_concurrency"] = nullptr;
  if (d.dataset_name == "random") {
    j["random_input_len"] = d.random_input_len;
    j["random_output_len"] = d.random_output_len;
    j["random_range_ratio"] = d.random_range_ratio;
  }
  j["ignore_eos"] = d.ignore_eos;
  j["seed"] = d.seed;
  j["num_warmups_ok"] = run.warmups_ok;

  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["input_throughput"] = m.input_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["concurrency"] = m.effective_concurrency;
  j["max_concurrent_requests"] = m.peak_concurrency;
  put_distribution(&j, "ttft", m.ttft);
  put_distribution(&j, "tpot", m.tpot);
  put_distribution(&j, "itl", m.itl);
  put_distribution(&j, "e2el", m.e2el);
  if (run.spec_decode) {
    j["spec_decode_acceptance_rate"] = run.spec_decode->acceptance_rate;
    j["spec_decode_acceptance_length"] = run.spec_decode->acceptance_length;
    j["spec_decode_num_drafts"] = run.spec_decode->num_drafts;
    j["spec_decode_draft_tokens"] = run.spec_decode->draft_tokens;
    j["spec_decode_accepted_tokens"] = run.spec_decode->accepted_tokens;
  }

  Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(),
       itls = Json::array(), latencies = Json::array(), start_times = Json::array(),
       queue_times = Json::array(), errors = Json::array(), texts = Json::array();
  for (const RequestRecord& r : run.records) {
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    latencies.push_back(r.latency_s);
    start_times.push_back(r.start_s);
    queue_times.push_back(r.queue_s);
    errors.push_back(r.error);
    if (detailed) texts.push_back(r.generated_text);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(start_times);
  j["queue_times"] = std::move(queue_times);
  j["errors"] = std::move(errors);
  if (detailed) j["generated_texts"] = std::move(texts);
  return j;
}

}  // namespace ds::bench
