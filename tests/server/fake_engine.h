// FakeEngine: a scripted implementation of deepserve::Engine for the server tests, so the HTTP
// layer can be tested without a model. Byte-level "tokenizer" (id = byte + 3; 0 = BOS, 1 = EOS),
// one engine thread that emits one token per running request every `step_ms`, stop strings held
// back until resolved, a KV pool of pages with preemption when it runs out, a bounded waiting
// queue (kOverloaded past it), drain / abort_all, seeded sampling over a word list, fake
// logprobs, thinking output (reasoning first), a tool call when tools are offered and the last user
// message mentions "weather", and an engine error at token k when the prompt contains "FAIL@k".
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "deepserve/engine.h"

namespace ds::server::testing {

struct FakeEngineOptions {
  int64_t max_model_len = 512;
  int64_t max_running = 8;
  int64_t max_queued = 32;
  int64_t kv_pages = 256;       // pool size
  int64_t page_tokens = 16;     // tokens per page
  int step_ms = 2;              // time per engine step
  int64_t natural_length = 48;  // tokens before the script's EOS
  std::string model_name = "fake-model";
};

class FakeEngine : public deepserve::Engine {
 public:
  using Clock = std::chrono::steady_clock;
  explicit FakeEngine(FakeEngineOptions options = {});
  ~FakeEngine() override;

  const deepserve::ModelInfo& model_info() const override { return info_; }
  deepserve::EngineMetrics metrics() const override;
  std::vector<std::string> summary() const override;
  bool tokenize(const std::string& text, bool add_special_tokens, std::vector<int32_t>* ids,
                deepserve::ApiError* error) const override;
  bool detokenize(const std::vector<int32_t>& ids, std::string* text,
                  deepserve::ApiError* error) const override;
  bool encode_chat(const deepserve::ChatPrompt& prompt, std::vector<int32_t>* ids,
                   deepserve::ApiError* error) const override;
  std::unique_ptr<deepserve::RequestStream> submit(deepserve::GenerateRequest request,
                                                   deepserve::ApiError* error) override;
  void drain() override;
  void abort_all() override;
  bool idle() const override;
  Health health() const override;

  // The text the engine would generate for `request` (no stop strings applied), for tests.
  static std::string script(const deepserve::GenerateRequest& request, int64_t length);

  struct Request;  // engine-side state of one request (fake_engine.cpp)

 private:
  void loop();
  void step_locked();

  FakeEngineOptions opt_;
  deepserve::ModelInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;
  int64_t pages_free_;
  bool accepting_ = true;
  bool stop_ = false;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0, preemptions_ = 0;
  int64_t finished_ = 0, failed_ = 0, rejected_ = 0, steps_ = 0;
  Clock::time_point last_step_ = Clock::now();
  std::thread thread_;
};

}  // namespace ds::server::testing
