// Benchmark execution (see runner.h).
#include "bench/runner.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench/arrivals.h"
#include "bench/progress.h"

namespace ds::bench {
namespace {

// Worker pool: `num_workers` threads take request indices in arrival order from a queue.
template <typename Fn>
void run_pool(int64_t num_workers, const std::vector<double>& arrivals, Clock::time_point origin,
              Fn&& work) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<size_t> queue;
  bool closed = false;
  std::vector<std::thread> threads;
  threads.reserve(size_t(num_workers));
  for (int64_t w = 0; w < num_workers; ++w) {
    threads.emplace_back([&, w] {
      auto state = work.make_worker_state();
      for (;;) {
        size_t i;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return closed || !queue.empty(); });
          if (queue.empty()) return;
          i = queue.front();
          queue.pop_front();
        }
        work(state, i);
      }
      (void)w;
    });
  }
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(origin + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(arrivals[i])));
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(i);
    }
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
}

int64_t count_output_tokens(const RequestRecord& r, const tok::Tokenizer* tokenizer) {
  if (tokenizer) {
    tok::EncodeOptions plain;
    plain.parse_special = false;
    auto ids = tokenizer->encode(r.generated_text, plain);
    if (ids.ok()) return int64_t(ids->size());
  }
  return r.success ? int64_t(r.itl_s.size()) + 1 : 0;
}

std::optional<SpecCounters> fetch_spec_counters(const RunOptions& o) {
  StreamClient client(o.base, o.client);
  auto text = client.get("/metrics");
  if (!text.ok()) return std::nullopt;
  return parse_spec_counters(*text);
}

}  // namespace

std::optional<SpecCounters> parse_spec_counters(const std::string& text) {
  SpecCounters c;
  bool found = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    std::string name = line.substr(0, name_end);
    const size_t colon = name.find(':');
    if (colon == std::string::npos) continue;
    const std::string prefix = name.substr(0, colon);
    if (prefix != "deepserve" && prefix != "vllm" && prefix != "sglang") continue;
    name = name.substr(colon + 1);
    int64_t* slot = nullptr;
    if (name == "spec_decode_num_drafts_total")
      slot = &c.num_drafts;
    else if (name == "spec_decode_num_draft_tokens_total")
      slot = &c.draft_tokens;
    else if (name == "spec_decode_num_accepted_tokens_total")
      slot = &c.accepted_tokens;
    if (!slot) continue;
    // A sample line is "name{labels} value [timestamp]".
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      value_start = line.find('}', name_end);
      if (value_start == std::string::npos) continue;
      ++value_start;
    }
    std::istringstream vs(line.substr(value_start));
    double v = 0;
    if (!(vs >> v)) continue;
    *slot += int64_t(v);
    found = true;
  }
  if (!found) return std::nullopt;
  return c;
}

std::optional<SpecDecodeStats> spec_decode_delta(const std::optional<SpecCounters>& before,
                                                 const std::optional<SpecCounters>& after) {
  if (!before || !after) return std::nullopt;
  SpecDecodeStats s;
  s.num_drafts = after->num_drafts - before->num_drafts;
  s.draft_tokens = after->draft_tokens - before->draft_tokens;
  s.accepted_tokens = after->accepted_tokens - before->accepted_tokens;
  if (s.draft_tokens <= 0) return std::nullopt;
  s.acceptance_rate = double(s.accepted_tokens) / double(s.draft_tokens) * 100.0;
  s.acceptance_length =
      s.num_drafts > 0 ? 1.0 + double(s.accepted_tokens) / double(s.num_drafts) : 0.0;
  return s;
}

Result<RunResult> run_benchmark(const RunOptions& o, const std::vector<SampleRequest>& samples,
                                const tok::Tokenizer* retokenizer) {
  if (samples.empty()) return invalid_argument("no requests to send");
  if (o.max_concurrency < 0) return invalid_argument("--max-concurrency must be > 0");
  RunResult result;

  auto spec_for = [&](const SampleRequest& s, int64_t max_tokens) {
    RequestSpec spec;
    spec.model = o.model;
    spec.prompt = s.prompt;
    spec.max_tokens = max_tokens;
    spec.ignore_eos = o.ignore_eos;
    spec.temperature = o.temperature;
    spec.extra_body = o.extra_body;
    return build_request_body(o.kind, spec);
  };

  // ---- warm-up: the first prompt, at most max_concurrency at a time (SGLang's warm-up) ----
  if (o.num_warmups > 0) {
    const std::string body =
        spec_for(samples[0], std::min(samples[0].output_len, o.warmup_max_tokens));
    const int64_t workers =
        o.max_concurrency > 0 ? std::min(o.max_concurrency, o.num_warmups) : o.num_warmups;
    Progress progress("warm-up", o.num_warmups, o.show_progress);
    std::vector<RequestRecord> warm(size_t(o.num_warmups));
    const auto origin = Clock::now();
    struct Work {
      const RunOptions& o;
      const std::string& body;
      std::vector<RequestRecord>& out;
      Progress& progress;
      Clock::time_point origin;
      std::unique_ptr<StreamClient> make_worker_state() const {
        return std::make_unique<StreamClient>(o.base, o.client);
      }
      void operator()(std::unique_ptr<StreamClient>& c, size_t i) const {
        out[i] = c->stream(o.endpoint, body, o.kind, origin);
        progress.tick(out[i].success);
      }
    } work{o, body, warm, progress, origin};
    run_pool(workers, std::vector<double>(size_t(o.num_warmups), 0.0), origin, work);
    progress.finish();
    for (const auto& r : warm) result.warmups_ok += r.success ? 1 : 0;
    if (result.warmups_ok == 0)
      return failed_precondition("every warm-up request failed; the first error: " + warm[0].error);
  }

  // ---- the measured run ----
  DS_ASSIGN_OR_RETURN(auto arrivals,
                      arrival_times(int64_t(samples.size()), o.request_rate, o.burstiness, o.seed));
  std::vector<std::string> bodies;
  bodies.reserve(samples.size());
  for (const auto& s : samples) bodies.push_back(spec_for(s, s.output_len));
  const auto spec_before = fetch_spec_counters(o);

  const int64_t n = int64_t(samples.size());
  const int64_t workers = o.max_concurrency > 0 ? std::min(o.max_concurrency, n) : n;
  result.records.assign(samples.size(), RequestRecord{});
  Progress progress("benchmark", n, o.show_progress);
  const auto origin = Clock::now();
  result.origin = origin;
  struct Work {
    const RunOptions& o;
    const std::vector<std::string>& bodies;
    const std::vector<double>& arrivals;
    std::vector<RequestRecord>& out;
    Progress& progress;
    Clock::time_point origin;
    std::unique_ptr<StreamClient> make_worker_state() const {
      return std::make_unique<StreamClient>(o.base, o.client);
    }
    void operator()(std::unique_ptr<StreamClient>& c, size_t i) const {
      RequestRecord r = c->stream(o.endpoint, bodies[i], o.kind, origin);
      r.queue_s = std::max(0.0, r.start_s - arrivals[i]);
      out[i] = std::move(r);
      progress.tick(out[i].success);
    }
  } work{o, bodies, arrivals, result.records, progress, origin};
  run_pool(workers, arrivals, origin, work);
  result.duration_s = std::chrono::duration<double>(Clock::now() - origin).count();
  progress.finish();

  for (size_t i = 0; i < samples.size(); ++i) {
    RequestRecord& r = result.records[i];
    r.expected_output_len = samples[i].output_len;
    if (r.prompt_len <= 0) r.prompt_len = samples[i].prompt_len;
    if (r.success && !r.output_tokens_from_usage)
      r.output_tokens = count_output_tokens(r, retokenizer);
  }
  result.spec_decode = spec_decode_delta(spec_before, fetch_spec_counters(o));
  return result;
}

}  // namespace ds::bench
