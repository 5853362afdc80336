// The Engine implementation (include/deepserve/engine.h, docs/engine.md): model + tokenizer
// loading, KV sizing, admission, one engine thread running the scheduler and the CPU forward, the
// per-request output pipeline (sampler -> stop tokens -> StreamDecoder -> stop strings -> output
// parser) and the bounded per-request event queues.
#include "deepserve/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/env.h"
#include "core/rng.h"
#include "kernels/cpu/numerics.h"
#include "kernels/cpu/parallel.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/weights.h"
#include "model/embedded_model.h"
#include "model/model_stats.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/model_runner.h"
#include "scheduler/sampler.h"
#include "scheduler/scheduler.h"
#include "scheduler/speculative.h"
#include "scheduler/stop_matcher.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/default_tokenizer.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8_util.h"

#ifndef DEEPSERVE_FAULT_HOOKS
#define DEEPSERVE_FAULT_HOOKS 0
#endif

namespace deepserve {

namespace {

using Clock = std::chrono::steady_clock;
namespace dsv4 = ds::dsv4;
namespace tok = ds::tok;
namespace sched = ds::sched;
namespace rt = ds::runtime;

constexpr size_t kMaxQueuedEvents = 64;  // past it, new output merges into the last event
constexpr uint64_t kDefaultKvBudgetCap = uint64_t(2) << 30;  // CPU default: at most 2 GiB
// CUDA backend without --max-model-len: each sequence's device state is sized for this context.
constexpr int64_t kDefaultGpuContext = 32768;
// Decode rows the MTP layer may lag behind while no drafts are wanted (EngineImpl::speculate).
constexpr int64_t kMtpBacklogRows = 8;
// Logits rows one step returns per running sequence (speculative verification: 1 + 8 drafts).
constexpr int64_t kMaxLogitRowsPerSeq = 9;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

ApiError make_error(ErrorKind kind, std::string message, std::string param = "",
                    std::string code = "") {
  ApiError e;
  e.kind = kind;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// The read side's shared state. The engine pushes, the client pops.
struct RequestShared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> events;
  bool finished = false;  // the finished event was pushed
  bool done_reading = false;
  std::atomic<bool> abort_requested{false};
  std::string id;
};

// Wakes the engine thread (shared with the streams so that a stream may outlive the engine).
struct Wakeup {
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false;
  void notify() {
    {
      std::lock_guard<std::mutex> lock(mu);
      pending = true;
    }
    cv.notify_one();
  }
};

void merge_event(RequestEvent* into, RequestEvent&& from) {
  into->text += from.text;
  into->reasoning += from.reasoning;
  for (auto& c : from.tool_calls) into->tool_calls.push_back(std::move(c));
  for (auto& t : from.tokens) into->tokens.push_back(std::move(t));
  into->finished = from.finished;
  into->finish_reason = from.finish_reason;
  into->stop_reason = std::move(from.stop_reason);
  into->usage = from.usage;
  into->error = std::move(from.error);
  into->time = from.time;
}

void push_event(RequestShared* sh, RequestEvent&& ev) {
  {
    std::lock_guard<std::mutex> lock(sh->mu);
    if (sh->finished) return;
    if (ev.finished) sh->finished = true;
    if (sh->events.size() >= kMaxQueuedEvents) {
      merge_event(&sh->events.back(), std::move(ev));
    } else {
      sh->events.push_back(std::move(ev));
    }
  }
  sh->cv.notify_all();
}

class StreamImpl final : public RequestStream {
 public:
  StreamImpl(std::shared_ptr<RequestShared> sh, std::shared_ptr<Wakeup> wake)
      : sh_(std::move(sh)), wake_(std::move(wake)) {}
  ~StreamImpl() override { abort(); }

  bool next(RequestEvent* event, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(sh_->mu);
    if (!sh_->cv.wait_for(lock, timeout, [&] { return !sh_->events.empty(); })) return false;
    *event = std::move(sh_->events.front());
    sh_->events.pop_front();
    return true;
  }
  void abort() override {
    bool finished;
    {
      std::lock_guard<std::mutex> lock(sh_->mu);
      finished = sh_->finished;
    }
    if (finished || sh_->abort_requested.exchange(true)) return;
    wake_->notify();
  }
  const std::string& request_id() const override { return sh_->id; }

 private:
  std::shared_ptr<RequestShared> sh_;
  std::shared_ptr<Wakeup> wake_;
};

// The engine thread's record of one request.
struct Request {
  sched::SchedSeq seq;
  std::shared_ptr<RequestShared> sh;
  GenerateRequest req;
  int64_t max_tokens = 0;  // effective
  uint64_t ordinal = 0;    // submission number (1-based)
  Clock::time_point deadline = Clock::time_point::max();
  std::unique_ptr<sched::Sampler> sampler;
  dsv4::SequenceState state;
  std::optional<tok::StreamDecoder> decoder;
  sched::StopMatcher stop;
  std::optional<tok::OutputParser> parser;
  std::unordered_set<int32_t> stop_tokens;
  int64_t num_generated = 0;
  int64_t prompt_counted = 0;  // prompt tokens counted in prompt_tokens_total
  bool counted_in_queue = true;  // still counted in the admission queue bounds
  bool saw_tool_calls = false;
  bool nan_target = false;
  // Speculative decoding: the distributions seq.draft was proposed from (sampling requests; empty
  // = a point mass), and the MTP output streams of the last draft position (for chaining).
  std::vector<std::vector<double>> draft_q;
  // The main model's pre-head streams of the decode positions the MTP layer has not consumed yet
  // ([rows, hc * hidden], positions state.mtp_position() onward): while no draft is wanted the
  // MTP catch-up is deferred and later runs as one chunk (EngineImpl::speculate).
  std::vector<float> mtp_backlog;
};

std::string escape_token_bytes(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = tok::utf8_char_len(bytes.substr(i));
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(uint8_t(bytes[i])));
      out += buf;
      ++i;
    }
  }
  return out;
}

std::string random_call_id(ds::Rng* rng) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng->below(sizeof(kChars) - 1)];
  return id;
}

class EngineImpl final : public Engine {
 public:
  EngineImpl() = default;
  ~EngineImpl() override;

  ds::Status init(const EngineConfig& config);
  void start();

  const ModelInfo& model_info() const override { return info_; }
  EngineMetrics metrics() const override;
  std::vector<std::string> summary() const override { return summary_; }
  bool tokenize(const std::string& text, bool add_special_tokens, std::vector<int32_t>* ids,
                ApiError* error) const override;
  bool detokenize(const std::vector<int32_t>& ids, std::string* text,
                  ApiError* error) const override;
  bool encode_chat(const ChatPrompt& prompt, std::vector<int32_t>* ids,
                   ApiError* error) const override;
  std::unique_ptr<RequestStream> submit(GenerateRequest request, ApiError* error) override;
  void drain() override { draining_ = true; }
  void abort_all() override {
    abort_all_ = true;
    wake_->notify();
  }
  bool idle() const override { return active_.load() == 0; }
  Health health() const override;

 private:
  void loop();
  void step();
  void intake();
  void finish(Request* r, FinishReason reason, std::optional<ApiError> error = std::nullopt,
              std::string stop_reason = "");
  // The logprobs of a sampled token (decide_rows computes them when the request asks).
  struct TokenLogprobs {
    float logprob = 0;
    std::vector<sched::LogprobEntry> best;
  };
  // One logits row's sampling decision (phase 1 of the step's sampling, see step()).
  struct RowDecision {
    bool finite = true;  // false: the row is not usable; the request ends with an error
    int32_t token = 0;
    bool accepted = false;                    // a verified draft that stays
    std::unique_ptr<TokenLogprobs> logprobs;  // when the request asks for logprobs
  };
  struct RowDecisions {
    std::vector<RowDecision> rows;  // up to the first rejected draft or unusable row
  };
  // Phase 1 for one sampling chunk: touches only r's sampler and r's logits rows (thread-safe
  // across requests).
  RowDecisions decide_rows(Request* r, const sched::ScheduledChunk& sc,
                           dsv4::ChunkOutput& out) const;
  void on_token(Request* r, int32_t token, const TokenLogprobs* logprobs);
  void emit_text(Request* r, const std::string& text, RequestEvent* ev);
  void publish_metrics();
  void fail_everything(const std::string& reason);
  // Speculative decoding (docs/speculative.md).
  struct SpecWork {  // one sequence's MTP work after the main step
    Request* r = nullptr;
    int64_t start = 0;  // main position of the first row fed to the MTP layer
    int64_t rows = 0;   // rows of the main step's row_streams the MTP layer consumes
    const float* streams = nullptr;
    int64_t k = 0;  // draft tokens to propose after it (0 = none)
  };
  void speculate(std::vector<SpecWork>* work);
  // A draft proposed from one row of MTP logits (non-finite rows propose nothing).
  struct Proposal {
    bool finite = false;
    int32_t token = 0;
    std::vector<double> q;  // the draft distribution (empty: a point mass)
  };
  // requests[i]'s proposal from outs[i]'s logits, in parallel over the rows (each touches only its
  // own request's sampler); a null request is skipped.
  std::vector<Proposal> propose_all(const std::vector<Request*>& requests,
                                    const std::vector<dsv4::ChunkOutput>& outs) const;
  // Ends a request whose logits were not finite (counted in requests_corrupted_total).
  void report_non_finite(Request* r);

  EngineConfig config_;
  ModelInfo info_;
  std::vector<std::string> summary_;
  std::unique_ptr<dsv4::ModelWeights> weights_;
  std::unique_ptr<rt::ModelRunner> runner_;  // the forward on one or more ranks
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  std::unique_ptr<rt::KvCacheManager> kv_;
  std::optional<rt::DeviceKvCapacity> device_kv_;  // the CUDA backend's slots and pages
  std::unique_ptr<sched::Scheduler> scheduler_;
  int64_t vocab_ = 0;
  int32_t eos_ = 1;
  int64_t max_model_len_ = 0;

  // Submission side.
  std::shared_ptr<Wakeup> wake_ = std::make_shared<Wakeup>();
  std::mutex inbox_mu_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::atomic<int64_t> queued_requests_{0};
  std::atomic<int64_t> queued_tokens_{0};
  std::atomic<int64_t> active_{0};
  std::atomic<uint64_t> next_ordinal_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> abort_all_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> dead_{false};
  std::thread thread_;

  // Engine thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> order_;  // requests_ in submission order
  ds::Rng id_rng_{0};
  int64_t steps_ = 0;
  int64_t max_num_seqs_ = 0;  // config_.max_num_seqs, or fewer if the backend holds fewer
  // Forward outputs, reused from step to step so that the logits buffers keep their pages
  // (a [64, 129280] fp32 block is 33 MB; freshly allocated, its page faults cost milliseconds).
  std::vector<dsv4::ChunkOutput> step_outputs_, mtp_outputs_;
  // Speculative decoding (engine thread only).
  bool spec_ = false;
  // Greedy rows that nothing adjusts take only their argmax and finite flag from the backend
  // (SequenceChunk::argmax_only; on a GPU 5 bytes per row instead of 517 KB of logits). The
  // environment variable DEEPSERVE_BACKEND_ARGMAX=0 turns it off (A/B measurements).
  const bool backend_argmax_ = !ds::env_switched_off("DEEPSERVE_BACKEND_ARGMAX");
  // Random draws that nothing adjusts (no logprobs, no drafts) are made by the backend
  // (SequenceChunk::backend_sample, cpu::sample_row) when it prefers them (a GPU: the rows stay
  // there); DEEPSERVE_BACKEND_SAMPLING=0 turns it off, =1 on for any backend (the CPU's host
  // reference: tests). Set in start() from the runner.
  bool backend_sampling_ = false;
  std::unique_ptr<sched::SpecPolicy> spec_policy_;
  int64_t spec_k_ = 0;                  // the k the drafts of the running sequences were made for
  double spec_draft_seconds_ = 0;       // drafting time at the end of the last step

  // Metrics (guarded by metrics_mu_).
  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
  std::string dead_reason_;
  Clock::time_point last_step_ = Clock::now();
};

EngineImpl::~EngineImpl() {
  stop_ = true;
  wake_->notify();
  if (thread_.joinable()) thread_.join();
  // Anything still known ends with abort so that blocked readers return.
  for (auto& [id, r] : requests_) {
    RequestEvent ev;
    ev.finished = true;
    ev.finish_reason = FinishReason::kAbort;
    ev.usage.prompt_tokens = r->seq.num_prompt;
    ev.usage.completion_tokens = r->num_generated;
    ev.time = Clock::now();
    push_event(r->sh.get(), std::move(ev));
  }
  std::lock_guard<std::mutex> lock(inbox_mu_);
  for (auto& r : inbox_) {
    RequestEvent ev;
    ev.finished = true;
    ev.finish_reason = FinishReason::kAbort;
    ev.usage.prompt_tokens = r->seq.num_prompt;
    ev.time = Clock::now();
    push_event(r->sh.get(), std::move(ev));
  }
}

ds::Status EngineImpl::init(const EngineConfig& config) {
  config_ = config;
  auto progress = [&](const std::string& phase) {
    if (config_.on_progress) {
      LoadProgress p;
      p.phase = phase;
      config_.on_progress(p);
    }
  };
  if (config_.device != "cpu" && config_.device != "cuda") {
    return ds::invalid_argument("device must be \"cpu\" or \"cuda\", got \"" + config_.device +
                                "\"");
  }
  auto mode = ds::cpu::numerics_mode_from_name(config_.numerics);
  if (!mode) return ds::invalid_argument("numerics must be \"reference\" or \"hf\"");
  if (config_.max_num_seqs < 1) return ds::invalid_argument("max_num_seqs must be at least 1");
  if (config_.max_num_batched_tokens < 1)
    return ds::invalid_argument("max_num_batched_tokens must be at least 1");
  if (config_.max_queued_requests < 0 || config_.max_queued_tokens < 0)
    return ds::invalid_argument("queue bounds must be non-negative");
  if (!(config_.kv_cache_memory_gib >= 0) || !std::isfinite(config_.kv_cache_memory_gib))
    return ds::invalid_argument("kv_cache_memory_gib must be a non-negative number");
  if (!(config_.gpu_memory_utilization > 0 && config_.gpu_memory_utilization <= 1))
    return ds::invalid_argument("gpu_memory_utilization must be in (0, 1]");
  if (config_.num_gpu_blocks_override < 0)
    return ds::invalid_argument("num_gpu_blocks_override must be >= 0");

#if defined(__GLIBC__)
  // The step's large buffers (logits [rows, vocab], activations) exceed glibc's mmap threshold
  // (at most 32 MiB when adaptive): every step would map, fault in and unmap them again (a third
  // of the CPU time of a 64-sequence decode step on the tiny model). Keep them on the heap.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  std::string dir = config_.model_dir;
  if (dir.empty()) {
    auto embedded = ds::ensure_embedded_model();
    if (!embedded.ok()) return embedded.status().with_context("embedded model");
    dir = *embedded;
  }
  progress("tokenizer");
  {
    auto t = tok::load_checkpoint_tokenizer(dir);
    if (!t.ok()) return t.status().with_context("tokenizer");
    tokenizer_ = std::make_unique<tok::Tokenizer>(std::move(t).value());
  }
  progress("weights");
  if (config_.full_scan) {
    ds::CheckpointValidateOptions vo;
    vo.full_scan = true;
    auto c = ds::open_checkpoint(dir, vo);
    if (!c.ok()) return c.status();
  }
  {
    auto w = dsv4::ModelWeights::load(dir);
    if (!w.ok()) return w.status();
    weights_ = std::move(w).value();
  }
  const ds::DeepSeekV4Config& c = weights_->config();
  DS_RETURN_IF_ERROR(tok::validate_chat_tokens(*tokenizer_, size_t(c.vocab_size)));
  {
    const dsv4::ForwardOptions fo = dsv4::ForwardOptions::for_mode(*mode);
    ds::runtime::BackendLimits limits;
    limits.max_sequences = config_.max_num_seqs;
    limits.gpu_memory_utilization = config_.gpu_memory_utilization;
    limits.kv_pages = config_.num_gpu_blocks_override;
    if (config_.kv_cache_memory_gib > 0) {
      limits.kv_cache_bytes = uint64_t(config_.kv_cache_memory_gib * double(uint64_t(1) << 30));
    }
    // The CUDA backend sizes each sequence's state for this context once, at start.
    limits.max_context = config_.max_model_len > 0
                             ? config_.max_model_len
                             : std::min<int64_t>(c.max_position_embeddings, kDefaultGpuContext);
    limits.max_step_tokens = config_.max_num_batched_tokens;
    limits.max_logit_rows = std::min<int64_t>(config_.max_num_batched_tokens,
                                              config_.max_num_seqs * kMaxLogitRowsPerSeq);
    // A verify step covers 1 + k positions (k is validated below, at most 8).
    if (!config_.speculative.method.empty()) {
      limits.max_checkpoint_tokens =
          1 + std::clamp<int64_t>(config_.speculative.num_speculative_tokens, 1, 8);
    }
    ds::runtime::ParallelConfig parallel;
    parallel.tensor_parallel_size = config_.tensor_parallel_size;
    auto runner = ds::runtime::make_model_runner(config_.device, *weights_, fo, limits, parallel);
    if (!runner.ok()) return runner.status().with_context("device " + config_.device);
    runner_ = std::move(runner).value();
    backend_sampling_ =
        ds::env_switch("DEEPSERVE_BACKEND_SAMPLING", runner_->prefers_backend_sampling());
    // The CUDA backend sizes its sequence slots from the memory budget: the scheduler never
    // runs more sequences than it holds.
    max_num_seqs_ = config_.max_num_seqs;
    device_kv_ = runner_->kv_capacity();
    if (device_kv_ && device_kv_->slots < max_num_seqs_) {
      spdlog::warn("engine: GPU memory holds {} sequence slots next to one sequence of {} tokens; "
                   "max_num_seqs lowered from {} (raise --gpu-memory-utilization or lower "
                   "--max-model-len for more)",
                   device_kv_->slots, limits.max_context, max_num_seqs_);
      max_num_seqs_ = device_kv_->slots;
    }
  }
  vocab_ = c.vocab_size;
  eos_ = int32_t(c.eos_token_id);
  if (!config_.speculative.method.empty()) {
    const SpeculativeConfig& sc = config_.speculative;
    if (sc.method != "mtp") {
      return ds::invalid_argument("speculative method \"" + sc.method +
                                  "\" is not supported (only \"mtp\")");
    }
    if (sc.num_speculative_tokens < 1 || sc.num_speculative_tokens > 8 ||
        sc.num_speculative_tokens >= c.sliding_window) {
      return ds::invalid_argument(
          "num_speculative_tokens must be between 1 and min(8, sliding_window - 1 = " +
          std::to_string(c.sliding_window - 1) + ")");
    }
    if (c.num_nextn_predict_layers < 1 || weights_->mtp.empty()) {
      return ds::invalid_argument("speculative method \"mtp\" needs a model with an MTP layer");
    }
    spec_ = true;
    spec_policy_ =
        std::make_unique<sched::SpecPolicy>(sc.num_speculative_tokens, sc.adaptive);
  }

  progress("kv-cache");
  const rt::KvGeometry geo = rt::KvGeometry::from_config(c);
  uint64_t budget = 0;
  if (device_kv_) {
    // The device's pages and slots, counted by the same rule (ceil(tokens / 256) pages in every
    // pool), so that every grow the scheduler allows finds its pages on the device.
    const int64_t p = device_kv_->pages;
    kv_ = std::make_unique<rt::KvCacheManager>(geo, std::array<int64_t, rt::kNumKvPools>{p, p, p},
                                               max_num_seqs_);
  } else if (config_.kv_cache_memory_gib > 0) {
    budget = uint64_t(config_.kv_cache_memory_gib * double(uint64_t(1) << 30));
  } else {
    int64_t page_set = 0;
    for (int64_t b : geo.page_bytes) page_set += b;
    const uint64_t want =
        uint64_t(max_num_seqs_) *
        (uint64_t(geo.slot_bytes) +
         uint64_t(rt::pages_for_tokens(c.max_position_embeddings)) * uint64_t(page_set));
    budget = std::min(want, kDefaultKvBudgetCap);
  }
  if (!kv_) {
    auto kv = rt::KvCacheManager::from_budget(geo, budget, max_num_seqs_);
    if (!kv.ok()) return kv.status().with_context("KV cache");
    kv_ = std::make_unique<rt::KvCacheManager>(std::move(kv).value());
  }
  int64_t capacity = kv_->capacity_tokens();
  if (device_kv_) capacity = std::min(capacity, device_kv_->max_context);
  if (config_.max_model_len < 0) return ds::invalid_argument("max_model_len must be >= 0");
  if (config_.max_model_len > c.max_position_embeddings) {
    return ds::invalid_argument("max_model_len " + std::to_string(config_.max_model_len) +
                                " exceeds the model's max_position_embeddings " +
                                std::to_string(c.max_position_embeddings));
  }
  max_model_len_ = config_.max_model_len > 0
                       ? config_.max_model_len
                       : std::min<int64_t>(c.max_position_embeddings, capacity);
  sched::SchedulerConfig sc;
  sc.max_num_seqs = max_num_seqs_;
  sc.max_num_batched_tokens = config_.max_num_batched_tokens;
  scheduler_ = std::make_unique<sched::Scheduler>(sc, kv_.get());

  info_.id = config_.served_model_name;
  if (info_.id.empty()) {
    info_.id =
        config_.model_dir.empty()
            ? "deepseek-v4-tiny"
            : std::filesystem::path(config_.model_dir).lexically_normal().filename().string();
    if (info_.id.empty()) info_.id = std::filesystem::path(dir).parent_path().filename().string();
  }
  info_.architecture = "DeepseekV4ForCausalLM";
  info_.max_model_len = max_model_len_;
  info_.vocab_size = c.vocab_size;
  info_.eos_token_id = c.eos_token_id;
  {
    auto stats = ds::compute_model_stats(c);
    info_.num_parameters = int64_t(stats.main_params + stats.mtp_params);
  }

  const double gib = 1.0 / double(uint64_t(1) << 30);
  summary_.push_back("model: " + info_.id + " (" + info_.architecture + ", " +
                     std::to_string(c.num_hidden_layers) + " layers, vocab " +
                     std::to_string(c.vocab_size) + ", " + std::to_string(info_.num_parameters) +
                     " parameters) from " + dir);
  summary_.push_back("numerics: " + config_.numerics +
                     ", device: " + runner_->describe());
  if (spec_) {
    summary_.push_back("speculative decoding: mtp, " +
                       std::to_string(config_.speculative.num_speculative_tokens) +
                       " draft tokens" +
                       (config_.speculative.adaptive ? " (adaptive)" : " (fixed)"));
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "KV cache: %.3f GiB: %lld pages of %lld tokens per pool, %lld sequence slots "
                "(%lld bytes each); capacity %lld tokens per sequence",
                double(kv_->total_bytes()) * gib,
                (long long)kv_->pages_total(rt::KvPool::kCompressed4), (long long)rt::kPageTokens,
                (long long)kv_->slots_total(), (long long)geo.slot_bytes, (long long)capacity);
  summary_.push_back(line);
  std::snprintf(line, sizeof(line),
                "max_model_len %lld: maximum concurrency %lld requests at full length "
                "(max_num_seqs %lld, max_num_batched_tokens %lld)",
                (long long)max_model_len_, (long long)kv_->max_concurrency(max_model_len_),
                (long long)max_num_seqs_, (long long)config_.max_num_batched_tokens);
  summary_.push_back(line);
  if (max_model_len_ > capacity) {
    summary_.push_back("warning: max_model_len exceeds the KV capacity of " +
                       std::to_string(capacity) +
                       " tokens; longer requests are refused at admission");
  }
#if DEEPSERVE_FAULT_HOOKS
  const EngineFaultHooks& f = config_.fault;
  if (!f.nan_request_id.empty() || f.nan_request_ordinal > 0 || f.stall_ms > 0 ||
      f.sticky_fault_at_step > 0) {
    summary_.push_back("warning: fault hooks are set (test build)");
  }
#endif
  id_rng_ = ds::Rng(config_.seed ^ 0x5DEECE66Dull);
  publish_metrics();
  progress("ready");
  return ds::ok_status();
}

void EngineImpl::start() {
  thread_ = std::thread([this] { loop(); });
}

EngineMetrics EngineImpl::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  return metrics_;
}

Engine::Health EngineImpl::health() const {
  Health h;
  std::lock_guard<std::mutex> lock(metrics_mu_);
  h.dead = dead_;
  h.reason = dead_reason_;
  h.steps = metrics_.engine_steps_total;
  h.active = active_.load();
  h.last_step = last_step_;
  return h;
}

bool EngineImpl::tokenize(const std::string& text, bool add_special_tokens,
                          std::vector<int32_t>* ids, ApiError* error) const {
  auto r = tokenizer_->encode(text);
  if (!r.ok()) {
    if (error) *error = make_error(ErrorKind::kInvalidRequest, r.status().message(), "prompt");
    return false;
  }
  ids->clear();
  if (add_special_tokens) ids->push_back(int32_t(weights_->config().bos_token_id));
  ids->insert(ids->end(), r->begin(), r->end());
  return true;
}

bool EngineImpl::detokenize(const std::vector<int32_t>& ids, std::string* text,
                            ApiError* error) const {
  for (int32_t id : ids) {
    if (id < 0 || int64_t(id) >= vocab_) {  // ids without a token decode to "" (TK6)
      if (error)
        *error =
            make_error(ErrorKind::kInvalidRequest,
                       "token id " + std::to_string(id) + " is not in the vocabulary", "tokens");
      return false;
    }
  }
  *text = tokenizer_->decode(ids);
  return true;
}

bool EngineImpl::encode_chat(const ChatPrompt& prompt, std::vector<int32_t>* ids,
                             ApiError* error) const {
  auto fail = [&](std::string msg, std::string param) {
    if (error) *error = make_error(ErrorKind::kInvalidRequest, std::move(msg), std::move(param));
    return false;
  };
  tok::OrderedJson tools;  // null = none
  if (!prompt.tools_json.empty()) {
    tools = tok::OrderedJson::parse(prompt.tools_json, nullptr, false);
    if (tools.is_discarded()) return fail("tools: not valid JSON", "tools");
    if (!tools.is_array()) return fail("tools: must be an array", "tools");
  }
  tok::OrderedJson response_format;
  if (!prompt.response_format_json.empty()) {
    response_format = tok::OrderedJson::parse(prompt.response_format_json, nullptr, false);
    if (response_format.is_discarded())
      return fail("response_format: not valid JSON", "response_format");
    if (!response_format.is_object())
      return fail("response_format: must be an object", "response_format");
  }
  tok::OrderedJson msgs = tok::OrderedJson::array();
  for (const ChatMessage& m : prompt.messages) {
    tok::OrderedJson j = tok::OrderedJson::object();
    j["role"] = m.role;
    if (m.content)
      j["content"] = *m.content;
    else
      j["content"] = nullptr;
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.empty()) {
      tok::OrderedJson calls = tok::OrderedJson::array();
      for (const ChatToolCall& tc : m.tool_calls) {
        calls.push_back({{"id", tc.id},
                         {"type", "function"},
                         {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    msgs.push_back(std::move(j));
  }
  auto parsed = tok::chat_messages_from_json(msgs, tools);
  if (!parsed.ok()) return fail(parsed.status().message(), "messages");
  std::vector<tok::ChatMessage> messages = std::move(parsed).value();
  if (!response_format.is_null()) {
    bool placed = false;
    for (auto& m : messages) {
      if (m.role == "system" || m.role == "developer") {
        m.response_format = response_format;
        placed = true;
        break;
      }
    }
    if (!placed) {
      tok::ChatMessage sys;
      sys.role = "system";
      sys.content = "";
      sys.response_format = response_format;
      messages.insert(messages.begin(), std::move(sys));
    }
  }
  tok::ChatEncodeOptions opts;
  opts.mode = prompt.thinking ? tok::ThinkingMode::kThinking : tok::ThinkingMode::kChat;
  if (prompt.reasoning_effort.empty()) {
    opts.effort = tok::ReasoningEffort::kNone;
  } else if (prompt.reasoning_effort == "high") {
    opts.effort = tok::ReasoningEffort::kHigh;
  } else if (prompt.reasoning_effort == "max") {
    opts.effort = tok::ReasoningEffort::kMax;
  } else {
    return fail("reasoning_effort must be \"high\" or \"max\"", "reasoning_effort");
  }
  auto r = tok::encode_chat(*tokenizer_, messages, opts);
  if (!r.ok()) {
    if (r.status().code() == ds::StatusCode::kInvalidArgument)
      return fail(r.status().message(), "messages");
    if (error) *error = make_error(ErrorKind::kInternal, r.status().message());
    return false;
  }
  ids->assign(r->begin(), r->end());
  return true;
}

std::unique_ptr<RequestStream> EngineImpl::submit(GenerateRequest request, ApiError* error) {
  auto refuse = [&](ApiError e) -> std::unique_ptr<RequestStream> {
    if (e.kind == ErrorKind::kOverloaded || e.kind == ErrorKind::kUnavailable) {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      ++metrics_.requests_rejected_total;
    }
    if (error) *error = std::move(e);
    return nullptr;
  };
  if (dead_) return refuse(make_error(ErrorKind::kUnavailable, "the engine has failed"));
  if (draining_) return refuse(make_error(ErrorKind::kUnavailable, "the server is shutting down"));
  const bool chat = request.output_mode != OutputMode::kText;
  const char* prompt_param = chat ? "messages" : "prompt";
  const int64_t n_prompt = int64_t(request.prompt_ids.size());
  if (n_prompt == 0)
    return refuse(make_error(ErrorKind::kInvalidRequest, "the prompt is empty", prompt_param));
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || int64_t(id) >= vocab_) {
      return refuse(make_error(ErrorKind::kInvalidRequest,
                               "prompt token id " + std::to_string(id) + " is outside [0, " +
                                   std::to_string(vocab_) + ")",
                               prompt_param));
    }
  }
  std::string param;
  const std::string msg = sched::validate_sampling(request.sampling, vocab_, &param);
  if (!msg.empty()) return refuse(make_error(ErrorKind::kInvalidRequest, msg, param));
  if (request.timeout.count() < 0)
    return refuse(make_error(ErrorKind::kInvalidRequest, "timeout must be >= 0", "timeout"));
  const int64_t asked = request.sampling.max_tokens;
  if (n_prompt >= max_model_len_ || (asked > 0 && n_prompt + asked > max_model_len_)) {
    ApiError e;
    e.kind = ErrorKind::kInvalidRequest;
    e.code = "context_length_exceeded";
    e.param = asked > 0 && n_prompt < max_model_len_ ? "max_tokens" : prompt_param;
    e.n_prompt_tokens = n_prompt;
    e.n_ctx = max_model_len_;
    const int64_t completion = asked > 0 ? asked : 0;
    e.message = "This model's maximum context length is " + std::to_string(max_model_len_) +
                " tokens. However, you requested " + std::to_string(n_prompt + completion) +
                " tokens (" + std::to_string(n_prompt) + " in the " +
                (chat ? "messages" : "prompt") + ", " + std::to_string(completion) +
                " in the completion). Please reduce the length of the " +
                (chat ? "messages" : "prompt") + " or completion.";
    return refuse(std::move(e));
  }
  const int64_t max_tokens = asked > 0 ? asked : max_model_len_ - n_prompt;
  if (!scheduler_->fits_alone(n_prompt + max_tokens)) {
    ApiError e =
        make_error(ErrorKind::kInvalidRequest,
                   "the request needs " + std::to_string(n_prompt + max_tokens) +
                       " tokens of KV cache (prompt + max_tokens) but the cache holds at most " +
                       std::to_string(kv_->capacity_tokens()) + " tokens per sequence",
                   asked > 0 ? "max_tokens" : prompt_param, "kv_cache_exceeded");
    return refuse(std::move(e));
  }
  // Queue bounds (KV4): checked and reserved together.
  {
    const int64_t q = queued_requests_.fetch_add(1) + 1;
    const int64_t t = queued_tokens_.fetch_add(n_prompt) + n_prompt;
    if (q > config_.max_queued_requests || t > config_.max_queued_tokens) {
      queued_requests_ -= 1;
      queued_tokens_ -= n_prompt;
      return refuse(make_error(ErrorKind::kOverloaded,
                               q > config_.max_queued_requests
                                   ? "the request queue is full; retry later"
                                   : "too many prompt tokens are queued; retry later"));
    }
  }
  const uint64_t ordinal = ++next_ordinal_;
  auto r = std::make_unique<Request>();
  r->ordinal = ordinal;
  r->sh = std::make_shared<RequestShared>();
  r->sh->id = request.request_id.empty() ? "req-" + std::to_string(ordinal) : request.request_id;
  r->seq.id = ordinal;
  r->seq.tokens = request.prompt_ids;
  r->seq.num_prompt = n_prompt;
  r->max_tokens = max_tokens;
  if (request.timeout.count() > 0) r->deadline = Clock::now() + request.timeout;
  const uint64_t seed = request.sampling.seed ? *request.sampling.seed : config_.seed + ordinal;
  r->sampler = std::make_unique<sched::Sampler>(request.sampling, seed, vocab_, eos_,
                                                std::span<const int32_t>(request.prompt_ids));
  r->stop = sched::StopMatcher(request.sampling.stop);
  r->stop_tokens.insert(request.sampling.stop_token_ids.begin(),
                        request.sampling.stop_token_ids.end());
  r->decoder.emplace(*tokenizer_);
  if (request.output_mode == OutputMode::kChat) r->parser.emplace(tok::ThinkingMode::kChat);
  if (request.output_mode == OutputMode::kChatThinking)
    r->parser.emplace(tok::ThinkingMode::kThinking);
#if DEEPSERVE_FAULT_HOOKS
  const EngineFaultHooks& f = config_.fault;
  r->nan_target = (!f.nan_request_id.empty() && f.nan_request_id == r->sh->id) ||
                  (f.nan_request_id.empty() && f.nan_request_ordinal > 0 &&
                   uint64_t(f.nan_request_ordinal) == ordinal);
#endif
  r->req = std::move(request);
  auto stream = std::make_unique<StreamImpl>(r->sh, wake_);
  ++active_;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(r));
  }
  wake_->notify();
  return stream;
}

void EngineImpl::intake() {
  std::vector<std::unique_ptr<Request>> incoming;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    incoming.swap(inbox_);
  }
  for (auto& r : incoming) {
    r->state = runner_->new_sequence();
    Request* p = r.get();
    requests_.emplace(p->seq.id, std::move(r));
    order_.push_back(p);
    scheduler_->add(&p->seq);
  }
}

void EngineImpl::finish(Request* r, FinishReason reason, std::optional<ApiError> error,
                        std::string stop_reason) {
  RequestEvent ev;
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
    // Release the held-back text: the decoder's partial character, then the stop matcher's tail.
    std::string tail = r->decoder->flush();
    std::string text = r->stop.push(tail);
    if (r->stop.matched()) {
      reason = FinishReason::kStop;
      stop_reason = r->stop.matched_stop();
    } else {
      text += r->stop.flush();
    }
    emit_text(r, text, &ev);
    if (r->parser) {
      tok::OutputDelta d = r->parser->finish();
      ev.reasoning += d.reasoning;
      ev.text += d.content;
      for (auto& c : d.tool_calls) {
        ev.tool_calls.push_back(
            {random_call_id(&id_rng_), std::move(c.name), std::move(c.arguments)});
      }
      if (r->parser->saw_tool_calls()) r->saw_tool_calls = true;
    }
    if (reason == FinishReason::kStop && r->saw_tool_calls) reason = FinishReason::kToolCalls;
  }
  ev.finished = true;
  ev.finish_reason = reason;
  ev.stop_reason = std::move(stop_reason);
  ev.usage.prompt_tokens = r->seq.num_prompt;
  ev.usage.completion_tokens = r->num_generated;
  ev.error = std::move(error);
  ev.time = Clock::now();
  push_event(r->sh.get(), std::move(ev));

  if (r->counted_in_queue) {
    queued_requests_ -= 1;
    queued_tokens_ -= r->seq.num_prompt;
    r->counted_in_queue = false;
  }
  scheduler_->remove(&r->seq);
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++metrics_.requests_finished_total;
    if (reason == FinishReason::kError) ++metrics_.requests_failed_total;
  }
  const uint64_t id = r->seq.id;
  runner_->release_sequence(&r->state);  // a device backend frees the state's slot
  order_.erase(std::remove(order_.begin(), order_.end(), r), order_.end());
  requests_.erase(id);  // r is gone after this
  --active_;
}

void EngineImpl::emit_text(Request* r, const std::string& text, RequestEvent* ev) {
  if (text.empty()) return;
  if (!r->parser) {
    ev->text += text;
    return;
  }
  tok::OutputDelta d = r->parser->push(text);
  ev->reasoning += d.reasoning;
  ev->text += d.content;
  for (auto& c : d.tool_calls) {
    ev->tool_calls.push_back({random_call_id(&id_rng_), std::move(c.name), std::move(c.arguments)});
  }
  if (r->parser->saw_tool_calls()) r->saw_tool_calls = true;
}

// A token was sampled for `r` (already appended to seq.tokens).
void EngineImpl::on_token(Request* r, int32_t token, const TokenLogprobs* logprobs) {
  RequestEvent ev;
  ++r->num_generated;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++metrics_.generation_tokens_total;
  }
  TokenInfo ti;
  ti.token_id = token;
  ti.token = escape_token_bytes(tokenizer_->token_bytes(token));
  if (logprobs != nullptr) {
    ti.logprob = logprobs->logprob;
    for (const auto& b : logprobs->best) {
      ti.top.push_back(
          {b.token_id, escape_token_bytes(tokenizer_->token_bytes(b.token_id)), b.logprob});
    }
  }
  ev.tokens.push_back(std::move(ti));
  const bool is_eos = token == eos_ && !r->req.sampling.ignore_eos;
  const bool is_stop_token = r->stop_tokens.count(token) != 0;
  if (is_eos || is_stop_token) {
    if (!ev.tokens.empty()) {
      ev.time = Clock::now();
      push_event(r->sh.get(), std::move(ev));
    }
    finish(r, FinishReason::kStop, std::nullopt,
           is_stop_token ? std::string(tokenizer_->token_bytes(token)) : std::string());
    return;
  }
  const std::string delta = r->decoder->push(token);
  const std::string text = r->stop.push(delta);
  emit_text(r, text, &ev);
  ev.time = Clock::now();
  push_event(r->sh.get(), std::move(ev));
  if (r->stop.matched()) {
    finish(r, FinishReason::kStop, std::nullopt, r->stop.matched_stop());
  } else if (r->num_generated >= r->max_tokens) {
    finish(r, FinishReason::kLength);
  }
}

void EngineImpl::fail_everything(const std::string& reason) {
  std::vector<Request*> all = order_;
  for (Request* r : all) {
    finish(r, FinishReason::kError, make_error(ErrorKind::kInternal, reason));
  }
}

void EngineImpl::publish_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_.num_requests_running = scheduler_ ? scheduler_->num_running() : 0;
  metrics_.num_requests_waiting = (scheduler_ ? scheduler_->num_waiting() : 0) + int64_t(0);
  metrics_.kv_cache_usage = kv_->usage();
  metrics_.kv_pages_total = 0;
  metrics_.kv_pages_free = 0;
  metrics_.kv_pools.clear();
  for (const rt::KvPoolStats& s : kv_->stats()) {
    metrics_.kv_pools.push_back({s.name, s.total, s.free});
    if (s.name != "sequence_slots") {
      metrics_.kv_pages_total += s.total;
      metrics_.kv_pages_free += s.free;
    }
  }
  metrics_.kv_capacity_tokens = kv_->capacity_tokens();
  metrics_.num_preemptions_total = scheduler_ ? scheduler_->num_preemptions() : 0;
  metrics_.engine_steps_total = steps_;
  metrics_.spec_num_speculative_tokens = spec_k_;
}

void EngineImpl::loop() {
#if defined(_OPENMP)
  if (config_.num_threads > 0) omp_set_num_threads(config_.num_threads);
#endif
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(wake_->mu);
      if (requests_.empty()) {
        wake_->cv.wait(lock, [&] { return wake_->pending || stop_; });
      }
      wake_->pending = false;
    }
    if (stop_) break;
    intake();
    step();
    publish_metrics();
  }
}

void EngineImpl::step() {
  // Aborts (client abort, stream destroyed, abort_all) and timeouts, before planning.
  const bool abort_everything = abort_all_.exchange(false);
  const Clock::time_point now = Clock::now();
  {
    std::vector<Request*> all = order_;
    for (Request* r : all) {
      if (abort_everything || r->sh->abort_requested.load()) {
        finish(r, FinishReason::kAbort);
      } else if (now >= r->deadline) {
        finish(r, FinishReason::kLength);
      }
    }
  }
  if (requests_.empty()) return;

  sched::StepPlan plan = scheduler_->schedule();
  for (sched::SchedSeq* s : plan.preempted) {
    Request* r = requests_.at(s->id).get();
    runner_->release_sequence(&r->state);
    r->state.reset(weights_->config());
    r->mtp_backlog.clear();
  }
  if (plan.empty()) {
    // Nothing could run (cannot happen while a running sequence exists); do not spin.
    std::unique_lock<std::mutex> lock(wake_->mu);
    wake_->cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return wake_->pending; });
    return;
  }
#if DEEPSERVE_FAULT_HOOKS
  const EngineFaultHooks& f = config_.fault;
  if (f.stall_ms > 0 && steps_ >= f.stall_after_steps) {
    std::this_thread::sleep_for(std::chrono::milliseconds(f.stall_ms));
  }
  if (f.sticky_fault_at_step > 0 && steps_ + 1 == f.sticky_fault_at_step) {
    {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      dead_reason_ = "injected sticky device fault at step " + std::to_string(steps_ + 1);
    }
    dead_ = true;
    spdlog::error("engine: {}", dead_reason_);
    fail_everything("device fault: the engine has stopped");
    return;
  }
#endif

  const Clock::time_point step_start = Clock::now();
  std::vector<dsv4::SequenceChunk> chunks(plan.chunks.size());
  std::vector<std::vector<int32_t>> verify_tokens(plan.chunks.size());  // [last token, drafts]
  int64_t prompt_tokens = 0;
  int64_t decode_rows = 0, prefill_rows = 0;  // engine_step_tokens_total
  int64_t argmax_rows = 0;                    // engine_argmax_rows_total
  int64_t sampled_rows = 0;                   // engine_backend_sampled_rows_total
  bool pure_decode = true;  // every chunk feeds one real token (plus drafts) and samples
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const sched::ScheduledChunk& sc = plan.chunks[i];
    Request* r = requests_.at(sc.seq->id).get();
    chunks[i].state = &r->state;
    if (sc.num_draft > 0) {
      // Speculative verify: the last sampled token and the draft in one multi-token chunk, every
      // row's logits; the main state is checkpointed so that the rejected rows can be undone.
      std::vector<int32_t>& v = verify_tokens[i];
      v.push_back(sc.seq->tokens[size_t(sc.start)]);
      v.insert(v.end(), sc.seq->draft.begin(), sc.seq->draft.begin() + sc.num_draft);
      chunks[i].tokens = std::span<const int32_t>(v);
      for (int64_t j = 0; j <= sc.num_draft; ++j) chunks[i].logit_rows.push_back(j);
      ds::Status cs = runner_->checkpoint(&r->state, false, sc.count);
      if (!cs.ok()) {
        spdlog::error("engine: speculative checkpoint failed: {}", cs.message());
        fail_everything("internal error");
        return;
      }
    } else {
      chunks[i].tokens =
          std::span<const int32_t>(sc.seq->tokens.data() + sc.start, size_t(sc.count));
      if (sc.samples) chunks[i].logit_rows = {sc.count - 1};
      // The backend may pick the token when no logprobs are asked (and not for a request whose
      // logits a fault hook poisons on the host): the argmax when greedy and nothing adjusts the
      // row, the draw when sampled and nothing adjusts it.
      const bool backend_token = sc.samples && r->req.sampling.logprobs < 0 && !r->nan_target;
      chunks[i].argmax_only = backend_argmax_ && backend_token && r->sampler->raw_argmax();
      argmax_rows += chunks[i].argmax_only ? 1 : 0;
      if (backend_sampling_ && backend_token && r->sampler->raw_draw()) {
        chunks[i].backend_sample = r->sampler->backend_draw();
        ++sampled_rows;
      }
    }
    // The MTP layer consumes every position the main model consumes (its own window ring).
    if (spec_) {
      for (int64_t j = 0; j < sc.count; ++j) chunks[i].stream_rows.push_back(j);
    }
    if (!sc.samples || sc.count - sc.num_draft != 1) pure_decode = false;
    const bool decode_chunk =
        sc.samples && sc.count - sc.num_draft == 1 && sc.start >= sc.seq->num_prompt;
    (decode_chunk ? decode_rows : prefill_rows) += sc.count;
    // Prompt tokens computed for the first time count toward prompt_tokens_total (not again
    // when a preempted request recomputes them).
    const int64_t prompt_end = std::min(sc.start + sc.count, sc.seq->num_prompt);
    if (prompt_end > r->prompt_counted) {
      prompt_tokens += prompt_end - r->prompt_counted;
      r->prompt_counted = prompt_end;
    }
    if (r->counted_in_queue) {
      r->counted_in_queue = false;
      queued_requests_ -= 1;
      queued_tokens_ -= r->seq.num_prompt;
    }
  }
  std::vector<dsv4::ChunkOutput>& outputs = step_outputs_;
  const Clock::time_point forward_start = Clock::now();
  ds::Status st = runner_->run(chunks, &outputs);
  const Clock::time_point forward_end = Clock::now();
  ++steps_;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    last_step_ = forward_end;
    metrics_.prompt_tokens_total += prompt_tokens;
    metrics_.step_schedule_seconds_total += seconds_between(now, forward_start);
    metrics_.step_forward_seconds_total += seconds_between(forward_start, forward_end);
    metrics_.step_decode_tokens_total += decode_rows;
    metrics_.step_prefill_tokens_total += prefill_rows;
    metrics_.step_argmax_rows_total += argmax_rows;
    metrics_.step_backend_sampled_rows_total += sampled_rows;
    if (prefill_rows > 0) ++metrics_.prefill_steps_total;
  }
  if (!st.ok()) {
    spdlog::error("engine: forward failed: {}", st.message());
    for (const sched::ScheduledChunk& sc : plan.chunks) {
      Request* r = requests_.at(sc.seq->id).get();
      finish(r, FinishReason::kError, make_error(ErrorKind::kInternal, "internal error"));
    }
    return;
  }
  scheduler_->commit(plan);
  const int64_t decode_batch = int64_t(plan.chunks.size());
  int64_t k_next = spec_ ? spec_policy_->choose(scheduler_->num_running()) : 0;
#if DEEPSERVE_FAULT_HOOKS
  if (spec_ && config_.fault.spec_k_override) {
    k_next = std::clamp<int64_t>(config_.fault.spec_k_override(steps_), 0,
                                 config_.speculative.num_speculative_tokens);
  }
#endif
  std::vector<SpecWork> work;
  int64_t emitted = 0;
  // Sampling, in two phases. 1 (parallel over the chunks that sample): each request's own
  // sampler judges its rows (finite check, verify or sample, accept, logprobs); it touches only
  // that request's state, so the result does not depend on the thread. 2 (serial, below): the
  // decisions take effect in chunk order (tokens, events, finishing, rollbacks). At B = 64 and
  // a 129280-token vocabulary phase 1 is 64 rows of 0.2-1 ms each on one core (bench_sampler).
  std::vector<RowDecisions> decided(plan.chunks.size());
  const int64_t num_chunks = int64_t(plan.chunks.size());
  // Phase 1 allocates nothing large: the samplers' buffers and the decision lists are sized here,
  // on the engine thread (memory a worker allocates stays in its malloc arena, and the engine
  // keeps freed memory on the heap: RSS would creep up across requests).
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const sched::ScheduledChunk& sc = plan.chunks[i];
    if (!sc.samples) continue;
    requests_.at(sc.seq->id)->sampler->reserve_buffers(sc.num_draft > 0);
    decided[i].rows.reserve(size_t(sc.num_draft + 1));
  }
  DS_OMP_PARALLEL_FOR_DYNAMIC_IF(num_chunks >= 2)
  for (int64_t i = 0; i < num_chunks; ++i) {
    const sched::ScheduledChunk& sc = plan.chunks[size_t(i)];
    if (sc.samples) {
      decided[size_t(i)] = decide_rows(requests_.at(sc.seq->id).get(), sc, outputs[size_t(i)]);
    }
  }
  const Clock::time_point sample_end = Clock::now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const sched::ScheduledChunk& sc = plan.chunks[i];
    const uint64_t id = sc.seq->id;
    Request* r = requests_.at(id).get();
    dsv4::ChunkOutput& out = outputs[i];
    if (!sc.samples) {
      if (spec_) work.push_back({r, sc.start, sc.count, out.row_streams.data(), 0});
      continue;
    }
    // Rows 0..num_draft: row j's logits judge draft j (or, after the last draft, give the bonus
    // token). Without a draft this is plain sampling of the one row.
    const int64_t nd = sc.num_draft;
    int64_t accepted = 0;
    bool alive = true;
    for (RowDecision& d : decided[i].rows) {
      if (!d.finite) {
        report_non_finite(r);
        alive = false;
        break;
      }
      r->seq.tokens.push_back(d.token);
      if (d.accepted) {
        ++accepted;
        ++r->seq.num_computed;  // the draft's row is in the state: it stays
      }
      ++emitted;
      on_token(r, d.token, d.logprobs.get());
      if (requests_.count(id) == 0) {
        alive = false;
        break;
      }
      if (!d.accepted) break;
    }
    if (nd > 0) {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      ++metrics_.spec_num_drafts_total;
      metrics_.spec_draft_tokens_total += nd;
      metrics_.spec_accepted_tokens_total += accepted;
    }
    if (!alive) continue;
    r->seq.draft.clear();
    r->draft_q.clear();
    if (nd > 0) {
      // Undo the rejected drafts' rows: the state keeps [last token, accepted drafts].
      ds::Status rs = runner_->rollback(&r->state, false, sc.start + 1 + accepted);
      if (!rs.ok()) {
        spdlog::error("engine: speculative rollback failed: {}", rs.message());
        finish(r, FinishReason::kError, make_error(ErrorKind::kInternal, "internal error"));
        continue;
      }
    }
    if (spec_) {
      // A verify emits up to k + 1 tokens: never draft past max_tokens.
      const int64_t k = std::max<int64_t>(
          0, std::min<int64_t>(k_next, r->max_tokens - r->num_generated - 1));
      work.push_back({r, sc.start, sc.count - nd + accepted, out.row_streams.data(), k});
    }
  }
  const Clock::time_point emit_end = Clock::now();
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    metrics_.step_sample_seconds_total += seconds_between(forward_end, sample_end);
    metrics_.step_emit_seconds_total += seconds_between(sample_end, emit_end);
  }
  if (spec_) {
    const double verify_s = seconds_between(step_start, emit_end);
    if (pure_decode) {
      spec_policy_->record(decode_batch, spec_k_, emitted, verify_s + spec_draft_seconds_);
    }
    const Clock::time_point draft_start = Clock::now();
    speculate(&work);
    spec_draft_seconds_ = seconds_between(draft_start, Clock::now());
    std::lock_guard<std::mutex> lock(metrics_mu_);
    metrics_.step_speculate_seconds_total += spec_draft_seconds_;
    spec_k_ = k_next;
  }
}

EngineImpl::RowDecisions EngineImpl::decide_rows(Request* r, const sched::ScheduledChunk& sc,
                                                 dsv4::ChunkOutput& out) const {
  RowDecisions d;
  const std::vector<double> point_mass;
  const int64_t nd = sc.num_draft;
  for (int64_t j = 0; j <= nd; ++j) {
    float* logits = out.logits.data() + j * vocab_;
#if DEEPSERVE_FAULT_HOOKS
    // Row j is the request's output token num_generated + j + 1 (one token per earlier row).
    if (r->nan_target && r->num_generated + j + 1 == config_.fault.nan_at_output_token) {
      logits[vocab_ / 2] = std::nanf("");
    }
#endif
    RowDecision row;
    // The finite check first (a non-finite row ends the request); for the sampled row it shares
    // its pass over the logits with a greedy request's argmax (Sampler::sample_finite), or the
    // backend made both (SequenceChunk::argmax_only: no logits here).
    if (!out.argmax.empty()) {
      row.finite = out.finite[size_t(j)] != 0;
      if (row.finite) row.token = out.argmax[size_t(j)];
    } else {
      row.finite = j < nd ? sched::all_finite(logits, vocab_)
                          : r->sampler->sample_finite(logits, &row.token);
    }
    if (!row.finite) {
      d.rows.push_back(std::move(row));
      break;
    }
    if (j < nd) {
      const std::vector<double>& q =
          size_t(j) < r->draft_q.size() ? r->draft_q[size_t(j)] : point_mass;
      row.token = r->sampler->verify(logits, r->seq.draft[size_t(j)], q, &row.accepted);
    }
    // Accepted before the next row is judged, as each emitted token is. When the serial phase
    // ends the request at an earlier row (a stop string, max_tokens), the request is gone and
    // what this advanced in its sampler is never used.
    r->sampler->accept(row.token);
    const int64_t lp = r->req.sampling.logprobs;
    if (lp >= 0) {
      row.logprobs = std::make_unique<TokenLogprobs>();
      row.logprobs->logprob =
          sched::token_logprob(logits, vocab_, row.token, lp, &row.logprobs->best);
    }
    const bool accepted = row.accepted;
    d.rows.push_back(std::move(row));
    if (!accepted) break;
  }
  return d;
}

std::vector<EngineImpl::Proposal> EngineImpl::propose_all(
    const std::vector<Request*>& requests, const std::vector<dsv4::ChunkOutput>& outs) const {
  std::vector<Proposal> out(requests.size());
  const int64_t n = int64_t(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {  // sized on this thread (see step())
    if (requests[i] == nullptr) continue;
    requests[i]->sampler->reserve_buffers(false);
    if (!requests[i]->sampler->greedy()) out[i].q.reserve(size_t(vocab_));
  }
  DS_OMP_PARALLEL_FOR_DYNAMIC_IF(n >= 2)
  for (int64_t i = 0; i < n; ++i) {
    Request* r = requests[size_t(i)];
    if (r == nullptr) continue;
    const float* logits = outs[size_t(i)].logits.data();
    Proposal& p = out[size_t(i)];
    p.finite = sched::all_finite(logits, vocab_);
    if (p.finite) p.token = r->sampler->propose(logits, &p.q);
  }
  return out;
}

void EngineImpl::report_non_finite(Request* r) {
  spdlog::warn("engine: request {}: non-finite logits; ending it with an error", r->sh->id);
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++metrics_.requests_corrupted_total;
  }
  finish(r, FinishReason::kError,
         make_error(ErrorKind::kInternal, "the model produced non-finite logits"));
}

// After the main step: the MTP layer catches up over the positions the main model just consumed
// (rolling back the previous step's chained draft positions first), and the sequences that
// decode next get their drafts: the catch-up's last row proposes draft 1 (its input is the last
// accepted position's streams and the token sampled there), each further MTP step at the next
// position proposes one more from the previous MTP step's output streams and draft.
void EngineImpl::speculate(std::vector<SpecWork>* work) {
  const ds::DeepSeekV4Config& c = weights_->config();
  const int64_t width = c.hc_mult * c.hidden_size;
  // Rows of one MTP call: the step's token budget (the backend is sized for it).
  const int64_t budget = config_.max_num_batched_tokens;
  // While a sequence wants no draft after this step (k = 0: the adaptive policy turned
  // speculation off, or the request is about to end), its decode rows wait in a backlog of up to
  // this many rows instead of costing an MTP forward each; the backlog and the next rows then run
  // as one chunk, which the forward computes exactly as row by row (chunking invariance).
  const int64_t max_backlog = std::min<int64_t>(kMtpBacklogRows, budget - 1);
  std::vector<dsv4::MtpChunk> chunks;
  std::vector<SpecWork*> owners;
  for (SpecWork& w : *work) {
    Request* r = w.r;
    dsv4::SequenceState& st = r->state;
    if (st.mtp_position() > w.start && st.checkpoint(true).armed) {
      ds::Status rs = runner_->rollback(&st, true, w.start);
      if (!rs.ok()) spdlog::warn("engine: MTP rollback failed: {}", rs.message());
    }
    const int64_t lag = int64_t(r->mtp_backlog.size()) / width;
    if (st.mtp_position() + lag != w.start || w.rows <= 0) {  // out of step: no drafts
      r->mtp_backlog.clear();
      continue;
    }
    if (w.k == 0 && w.rows == 1 && lag < max_backlog) {
      r->mtp_backlog.insert(r->mtp_backlog.end(), w.streams, w.streams + width);
      continue;
    }
    const float* streams = w.streams;
    if (lag > 0) {
      r->mtp_backlog.insert(r->mtp_backlog.end(), w.streams, w.streams + w.rows * width);
      streams = r->mtp_backlog.data();
    }
    const int64_t start = w.start - lag, rows = lag + w.rows;
    dsv4::MtpChunk m;
    m.state = &st;
    m.streams = std::span<const float>(streams, size_t(rows * width));
    m.next_tokens = std::span<const int32_t>(r->seq.tokens.data() + start + 1, size_t(rows));
    if (w.k > 0) m.logit_rows = {rows - 1};
    chunks.push_back(m);
    owners.push_back(&w);
  }
  if (chunks.empty()) return;
  // Draft 1 (the catch-up's last row), then chained drafts 2..k.
  struct Chain {
    Request* r;
    int64_t k;
    std::vector<float> streams;  // [hc, hidden] MTP output streams of the last draft position
  };
  std::vector<Chain> chains;
  int64_t max_k = 0;
  std::vector<dsv4::ChunkOutput>& outs = mtp_outputs_;
  ds::Status st = ds::ok_status();
  // One MTP call per group of chunks within the token budget (backlogs can make the catch-up
  // longer than the main step).
  for (size_t begin = 0, end = 0; begin < chunks.size(); begin = end) {
    int64_t n = 0;
    for (end = begin; end < chunks.size(); ++end) {
      const int64_t rows = int64_t(chunks[end].next_tokens.size());
      if (end > begin && n + rows > budget) break;
      n += rows;
    }
    st = runner_->run_mtp(std::span<dsv4::MtpChunk>(chunks.data() + begin, end - begin), &outs,
                           /*want_streams=*/true);
    if (!st.ok()) {
      spdlog::error("engine: MTP forward failed: {}", st.message());
      for (size_t i = begin; i < owners.size(); ++i) {
        finish(owners[i]->r, FinishReason::kError,
               make_error(ErrorKind::kInternal, "internal error"));
      }
      return;
    }
    std::vector<Request*> proposers(end - begin, nullptr);  // null: no draft wanted
    for (size_t i = begin; i < end; ++i) {
      owners[i]->r->mtp_backlog.clear();  // consumed (the chunk's streams are no longer read)
      if (owners[i]->k > 0) proposers[i - begin] = owners[i]->r;
    }
    std::vector<Proposal> drafts = propose_all(proposers, outs);
    for (size_t i = begin; i < end; ++i) {
      SpecWork* w = owners[i];
      Proposal& d = drafts[i - begin];
      if (w->k <= 0 || !d.finite) continue;
      w->r->seq.draft = {d.token};
      w->r->draft_q = {std::move(d.q)};
      chains.push_back({w->r, w->k, std::move(outs[i - begin].streams)});
      max_k = std::max(max_k, w->k);
    }
  }
  for (int64_t j = 2; j <= max_k; ++j) {
    std::vector<dsv4::MtpChunk> next;
    std::vector<Chain*> who;
    for (Chain& ch : chains) {
      if (ch.k < j) continue;
      // Draft j runs the MTP layer one position past the last accepted one's row (up to
      // position + k - 2), where the verify step's KV pages are not yet counted: count them now,
      // or stop the chain (a device backend holds exactly the pages the manager counts).
      if (!kv_->grow(ch.r->seq.id, ch.r->state.mtp_position() + 1)) {
        ch.k = j - 1;
        continue;
      }
      if (j == 2) {
        ds::Status cs = runner_->checkpoint(&ch.r->state, true, ch.k - 1);
        if (!cs.ok()) {
          ch.k = 1;
          continue;
        }
      }
      dsv4::MtpChunk m;
      m.state = &ch.r->state;
      m.streams = std::span<const float>(ch.streams);
      m.next_tokens = std::span<const int32_t>(&ch.r->seq.draft.back(), 1);
      m.logit_rows = {0};
      next.push_back(m);
      who.push_back(&ch);
    }
    if (next.empty()) break;
    st = runner_->run_mtp(next, &outs, /*want_streams=*/true);
    if (!st.ok()) {
      spdlog::error("engine: MTP draft step failed: {}", st.message());
      break;  // the drafts so far stand; the next step rolls the MTP state back
    }
    std::vector<Request*> proposers;
    for (Chain* ch : who) proposers.push_back(ch->r);
    std::vector<Proposal> drafts = propose_all(proposers, outs);
    for (size_t i = 0; i < who.size(); ++i) {
      Chain& ch = *who[i];
      if (!drafts[i].finite) {
        ch.k = j - 1;
        continue;
      }
      ch.r->seq.draft.push_back(drafts[i].token);
      ch.r->draft_q.push_back(std::move(drafts[i].q));
      ch.streams = std::move(outs[i].streams);
    }
  }
#if DEEPSERVE_FAULT_HOOKS
  if (config_.fault.spec_draft_override) {
    for (Chain& ch : chains) {
      std::vector<int32_t> draft = ch.r->seq.draft;
      config_.fault.spec_draft_override(ch.r->seq.tokens, &draft);
      draft.resize(std::min(draft.size(), ch.r->seq.draft.size()));
      for (size_t i = 0; i < draft.size(); ++i) {
        if (draft[i] < 0 || int64_t(draft[i]) >= vocab_) {
          draft.resize(i);
          break;
        }
        if (draft[i] != ch.r->seq.draft[i]) ch.r->draft_q[i].clear();  // a point mass
      }
      ch.r->draft_q.resize(draft.size());
      ch.r->seq.draft = std::move(draft);
    }
  }
#endif
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const EngineConfig& config, ApiError* error) {
  try {
    auto engine = std::make_unique<EngineImpl>();
    ds::Status st = engine->init(config);
    if (!st.ok()) {
      if (error) {
        const bool bad_config = st.code() == ds::StatusCode::kInvalidArgument;
        *error = make_error(bad_config ? ErrorKind::kInvalidRequest : ErrorKind::kInternal,
                            st.message());
      }
      return nullptr;
    }
    engine->start();
    return engine;
  } catch (const std::exception& e) {
    if (error) *error = make_error(ErrorKind::kInternal, std::string("engine start: ") + e.what());
    return nullptr;
  }
}

}  // namespace deepserve
