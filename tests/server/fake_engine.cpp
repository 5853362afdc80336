// FakeEngine (see fake_engine.h).
#include "fake_engine.h"

#include <algorithm>
#include <random>

namespace ds::server::testing {

using namespace deepserve;
namespace {

constexpr int32_t kBos = 0, kEos = 1, kOffset = 3;

std::string id_text(int32_t id) {
  if (id >= kOffset && id < kOffset + 256) return std::string(1, char(id - kOffset));
  return id == kBos ? "<bos>" : id == kEos ? "<eos>" : "<pad>";
}

}  // namespace

// Engine-side state of one request, shared with its stream.
struct FakeEngine::Request {
  GenerateRequest req;
  std::string script;  // what the request will generate (bytes)
  int64_t generated = 0;
  std::string pending;         // generated text not yet emitted (stop-string hold-back)
  std::string reasoning_left;  // thinking mode: the reasoning prefix still to emit
  int64_t pages = 0;
  int64_t fail_at = -1;
  Clock::time_point deadline{};
  bool done = false;
  bool abort = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> events;
  bool tool_call = false;

  void push(RequestEvent ev) {
    ev.time = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(ev));
    }
    cv.notify_all();
  }
};

namespace {

class FakeStream : public RequestStream {
 public:
  FakeStream(std::shared_ptr<FakeEngine::Request> r, std::function<void()> wake)
      : r_(std::move(r)), wake_(std::move(wake)) {}
  ~FakeStream() override { abort(); }
  bool next(RequestEvent* event, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(r_->mu);
    if (!r_->cv.wait_for(lock, timeout, [&] { return !r_->events.empty(); })) return false;
    *event = std::move(r_->events.front());
    r_->events.pop_front();
    return true;
  }
  void abort() override {
    {
      std::lock_guard<std::mutex> lock(r_->mu);
      r_->abort = true;
    }
    wake_();
  }
  const std::string& request_id() const override { return r_->req.request_id; }

 private:
  std::shared_ptr<FakeEngine::Request> r_;
  std::function<void()> wake_;
};

}  // namespace

FakeEngine::FakeEngine(FakeEngineOptions options) : opt_(std::move(options)) {
  info_.id = opt_.model_name;
  info_.architecture = "FakeForTests";
  info_.max_model_len = opt_.max_model_len;
  info_.vocab_size = kOffset + 256;
  info_.num_parameters = 0;
  info_.eos_token_id = kEos;
  pages_free_ = opt_.kv_pages;
  thread_ = std::thread([this] { loop(); });
}

FakeEngine::~FakeEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

EngineMetrics FakeEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineMetrics m;
  m.num_requests_running = int64_t(running_.size());
  m.num_requests_waiting = int64_t(waiting_.size());
  m.kv_pages_total = opt_.kv_pages;
  m.kv_pages_free = pages_free_;
  m.kv_cache_usage = double(opt_.kv_pages - pages_free_) / double(opt_.kv_pages);
  m.prompt_tokens_total = prompt_tokens_total_;
  m.generation_tokens_total = generation_tokens_total_;
  m.num_preemptions_total = preemptions_;
  m.requests_finished_total = finished_;
  m.requests_failed_total = failed_;
  m.requests_rejected_total = rejected_;
  m.engine_steps_total = steps_;
  return m;
}

std::vector<std::string> FakeEngine::summary() const {
  return {"fake engine for tests: byte tokens, " + std::to_string(opt_.kv_pages) + " KV pages"};
}

bool FakeEngine::tokenize(const std::string& text, bool add_special_tokens,
                          std::vector<int32_t>* ids, ApiError*) const {
  ids->clear();
  if (add_special_tokens) ids->push_back(kBos);
  for (unsigned char c : text) ids->push_back(kOffset + c);
  return true;
}

bool FakeEngine::detokenize(const std::vector<int32_t>& ids, std::string* text, ApiError*) const {
  text->clear();
  for (int32_t id : ids) {
    if (id >= kOffset) text->push_back(char(id - kOffset));
  }
  return true;
}

bool FakeEngine::encode_chat(const ChatPrompt& prompt, std::vector<int32_t>* ids,
                             ApiError* error) const {
  std::string text;
  for (const auto& m : prompt.messages) {
    text += "<|" + m.role + "|>" + m.content.value_or("") + "\n";
  }
  if (!prompt.tools_json.empty()) text += "<|tools|>" + prompt.tools_json + "\n";
  text += prompt.thinking ? "<|assistant|><think>" : "<|assistant|>";
  return tokenize(text, true, ids, error);
}

std::string FakeEngine::script(const GenerateRequest& request, int64_t length) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta",  "echo", "foxtrot",
                                 "golf",  "hotel", "india",   "juliet", "kilo", "lima"};
  std::string out;
  if (request.sampling.temperature <= 0) {
    // Greedy: a fixed sentence that depends on the prompt length only.
    static const std::string kText = "The quick brown fox jumps over the lazy dog. ";
    const size_t start = request.prompt_ids.size() % 7;
    while (int64_t(out.size()) < length + int64_t(start)) out += kText;
    return out.substr(start, size_t(length));
  }
  const uint64_t seed = request.sampling.seed.value_or(std::random_device{}());
  std::mt19937_64 rng(seed);
  while (int64_t(out.size()) < length) {
    out += kWords[rng() % 12];
    out += ' ';
  }
  return out.substr(0, size_t(length));
}

std::unique_ptr<RequestStream> FakeEngine::submit(GenerateRequest request, ApiError* error) {
  const int64_t n = int64_t(request.prompt_ids.size());
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || id >= info_.vocab_size) {
      *error = {ErrorKind::kInvalidRequest, "prompt token id out of vocabulary", "prompt", ""};
      return nullptr;
    }
  }
  if (n >= opt_.max_model_len) {
    *error = {ErrorKind::kInvalidRequest, "prompt too long", "prompt", "context_length_exceeded", n,
              opt_.max_model_len};
    return nullptr;
  }
  auto r = std::make_shared<Request>();
  r->req = std::move(request);
  const int64_t room = opt_.max_model_len - n;
  int64_t limit =
      r->req.sampling.max_tokens < 0 ? room : std::min(room, r->req.sampling.max_tokens);
  const int64_t natural = r->req.sampling.ignore_eos ? limit : opt_.natural_length;
  r->script = script(r->req, std::min(limit, natural) + 1);
  std::string prompt_text;
  detokenize(r->req.prompt_ids, &prompt_text, nullptr);
  if (auto at = prompt_text.find("FAIL@"); at != std::string::npos) {
    r->fail_at = std::atoi(prompt_text.c_str() + at + 5);
  }
  if (r->req.output_mode == OutputMode::kChatThinking) r->reasoning_left = "Let me think. ";
  r->tool_call = prompt_text.find("<|tools|>") != std::string::npos &&
                 prompt_text.find("weather") != std::string::npos;
  if (r->req.timeout.count() > 0) r->deadline = Clock::now() + r->req.timeout;
  // KV the whole request could need must fit in the pool (KV1).
  const int64_t need = (n + limit + opt_.page_tokens - 1) / opt_.page_tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) {
      ++rejected_;
      *error = {ErrorKind::kUnavailable, "the server is shutting down", "", ""};
      return nullptr;
    }
    if (need > opt_.kv_pages) {
      *error = {ErrorKind::kInvalidRequest, "request needs more KV than the cache holds", "", ""};
      return nullptr;
    }
    if (int64_t(waiting_.size()) >= opt_.max_queued) {
      ++rejected_;
      *error = {ErrorKind::kOverloaded, "the server is overloaded; retry later", "", ""};
      return nullptr;
    }
    if (r->req.request_id.empty()) r->req.request_id = "fake-" + std::to_string(steps_);
    waiting_.push_back(r);
  }
  cv_.notify_all();
  return std::make_unique<FakeStream>(r, [this] { cv_.notify_all(); });
}

void FakeEngine::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void FakeEngine::abort_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : running_) {
    std::lock_guard<std::mutex> l(r->mu);
    r->abort = true;
  }
  for (auto& r : waiting_) {
    std::lock_guard<std::mutex> l(r->mu);
    r->abort = true;
  }
  cv_.notify_all();
}

bool FakeEngine::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_.empty() && waiting_.empty();
}

Engine::Health FakeEngine::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  Health h;
  h.steps = steps_;
  h.active = int64_t(running_.size() + waiting_.size());
  h.last_step = last_step_;
  return h;
}

void FakeEngine::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (running_.empty() && waiting_.empty()) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    step_locked();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(opt_.step_ms));
    lock.lock();
  }
}

void FakeEngine::step_locked() {
  ++steps_;
  last_step_ = Clock::now();
  auto finish = [&](const std::shared_ptr<Request>& r, FinishReason reason, std::string stop) {
    RequestEvent ev;
    ev.finished = true;
    ev.finish_reason = reason;
    ev.stop_reason = std::move(stop);
    ev.usage.prompt_tokens = int64_t(r->req.prompt_ids.size());
    ev.usage.completion_tokens = r->generated;
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) ev.text = r->pending;
    if (reason == FinishReason::kToolCalls) {
      ev.tool_calls.push_back({"call_" + r->req.request_id, "get_weather", "{\"city\":\"Paris\"}"});
    }
    if (reason == FinishReason::kError) {
      ev.error = ApiError{ErrorKind::kInternal, "injected fault", "", ""};
      ++failed_;
    }
    r->pending.clear();
    pages_free_ += r->pages;
    r->pages = 0;
    r->done = true;
    ++finished_;
    r->push(std::move(ev));
  };
  // Aborted / timed-out requests end first (frees their pages within one step).
  for (auto* list : {&running_}) {
    for (auto it = list->begin(); it != list->end();) {
      bool abort;
      {
        std::lock_guard<std::mutex> l((*it)->mu);
        abort = (*it)->abort;
      }
      if (abort) {
        finish(*it, FinishReason::kAbort, "");
        it = list->erase(it);
      } else if ((*it)->deadline != Clock::time_point{} && Clock::now() > (*it)->deadline) {
        finish(*it, FinishReason::kLength, "");
        it = list->erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    bool abort;
    {
      std::lock_guard<std::mutex> l((*it)->mu);
      abort = (*it)->abort;
    }
    if (abort) {
      finish(*it, FinishReason::kAbort, "");
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  // Admit waiting requests while slots and pages allow (prompt pages + 1).
  while (!waiting_.empty() && int64_t(running_.size()) < opt_.max_running) {
    auto& r = waiting_.front();
    const int64_t tokens = int64_t(r->req.prompt_ids.size()) + r->generated + 1;
    const int64_t need = (tokens + opt_.page_tokens - 1) / opt_.page_tokens;
    if (need > pages_free_) break;
    pages_free_ -= need;
    r->pages = need;
    prompt_tokens_total_ += int64_t(r->req.prompt_ids.size()) + r->generated;
    running_.push_back(r);
    waiting_.pop_front();
  }
  // One token per running request.
  for (size_t i = 0; i < running_.size();) {
    auto r = running_[i];
    const int64_t tokens = int64_t(r->req.prompt_ids.size()) + r->generated + 1;
    const int64_t need = (tokens + opt_.page_tokens - 1) / opt_.page_tokens;
    if (need > r->pages) {
      if (pages_free_ == 0) {
        // Preempt the newest other request (recompute later), or this one if it is alone.
        auto victim = running_.back() == r && running_.size() > 1 ? running_[running_.size() - 2]
                                                                  : running_.back();
        pages_free_ += victim->pages;
        victim->pages = 0;
        ++preemptions_;
        waiting_.push_front(victim);
        running_.erase(std::find(running_.begin(), running_.end(), victim));
        if (victim == r) continue;
        i = std::find(running_.begin(), running_.end(), r) - running_.begin();
        continue;
      }
      --pages_free_;
      ++r->pages;
    }
    const int64_t k = r->generated;
    if (r->fail_at >= 0 && k >= r->fail_at) {
      finish(r, FinishReason::kError, "");
      running_.erase(running_.begin() + long(i));
      continue;
    }
    const int64_t room = opt_.max_model_len - int64_t(r->req.prompt_ids.size());
    const int64_t limit =
        r->req.sampling.max_tokens < 0 ? room : std::min(room, r->req.sampling.max_tokens);
    RequestEvent ev;
    // The token: a reasoning byte first (thinking), else the script's next byte, or EOS.
    char c = 0;
    bool eos = false;
    bool reasoning = false;
    if (!r->reasoning_left.empty()) {
      c = r->reasoning_left[0];
      r->reasoning_left.erase(0, 1);
      reasoning = true;
    } else if (size_t(k) < r->script.size() - 1 || r->req.sampling.ignore_eos) {
      c = r->script[size_t(k) % r->script.size()];
    } else {
      eos = true;
    }
    ++r->generated;
    ++generation_tokens_total_;
    TokenInfo t;
    t.token_id = eos ? kEos : kOffset + uint8_t(c);
    t.token = id_text(t.token_id);
    t.logprob = -0.25f;
    for (int64_t j = 0; j < std::max<int64_t>(r->req.sampling.logprobs, 0); ++j) {
      t.top.push_back(
          {int32_t(kOffset + 'a' + j), std::string(1, char('a' + j)), -0.25f - float(j)});
    }
    if (r->req.sampling.logprobs >= 0)
      ev.tokens.push_back(t);
    else
      ev.tokens.push_back(TokenInfo{t.token_id, t.token, t.logprob, {}});
    if (eos) {
      r->push(std::move(ev));
      finish(r, r->tool_call ? FinishReason::kToolCalls : FinishReason::kStop,
             r->tool_call ? "" : "<eos>");
      running_.erase(running_.begin() + long(i));
      continue;
    }
    if (reasoning) {
      ev.reasoning = std::string(1, c);
      r->push(std::move(ev));
      ++i;
      continue;
    }
    r->pending += c;
    // Stop strings: the earliest match ends the request; text that could start one is held.
    size_t cut = std::string::npos;
    std::string matched;
    for (const auto& s : r->req.sampling.stop) {
      size_t at = r->pending.find(s);
      if (at != std::string::npos && at < cut) {
        cut = at;
        matched = s;
      }
    }
    if (cut != std::string::npos) {
      ev.text = r->pending.substr(0, cut);
      r->pending.clear();
      r->push(std::move(ev));
      finish(r, FinishReason::kStop, matched);
      running_.erase(running_.begin() + long(i));
      continue;
    }
    size_t hold = 0;
    for (const auto& s : r->req.sampling.stop) {
      for (size_t len = std::min(s.size() - 1, r->pending.size()); len > hold; --len) {
        if (r->pending.compare(r->pending.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    ev.text = r->pending.substr(0, r->pending.size() - hold);
    r->pending.erase(0, r->pending.size() - hold);
    r->push(std::move(ev));
    if (r->generated >= limit) {
      finish(r, FinishReason::kLength, "");
      running_.erase(running_.begin() + long(i));
      continue;
    }
    ++i;
  }
}

}  // namespace ds::server::testing
