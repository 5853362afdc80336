// The public Engine API on the embedded tiny model: batch invariance (64 concurrent greedy
// requests == each alone, ids and text), preempted == not preempted, chunked-prefill settings,
// aborts and dropped streams freeing the KV (metrics back to baseline), timeouts, the NaN fault
// hook ending only its request, stop strings / stop tokens, logprobs, seeds and admission errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "deepserve/engine.h"

namespace deepserve {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::vector<int32_t> ids;
  std::string text, reasoning;
  FinishReason reason = FinishReason::kNone;
  std::string stop_reason;
  Usage usage;
  std::vector<TokenInfo> tokens;
  int events = 0;
};

Outcome collect(RequestStream* s) {
  Outcome o;
  RequestEvent ev;
  while (s->next(&ev, 60s)) {
    ++o.events;
    o.text += ev.text;
    o.reasoning += ev.reasoning;
    for (const auto& t : ev.tokens) {
      o.ids.push_back(t.token_id);
      o.tokens.push_back(t);
    }
    if (ev.finished) {
      o.reason = ev.finish_reason;
      o.stop_reason = ev.stop_reason;
      o.usage = ev.usage;
      break;
    }
  }
  return o;
}

std::unique_ptr<Engine> make_engine(EngineConfig c = {}) {
  ApiError err;
  auto e = Engine::create(c, &err);
  EXPECT_NE(e, nullptr) << err.message;
  return e;
}

std::vector<int32_t> random_prompt(ds::Rng* rng, int64_t n) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(1000 + rng->below(100000)));
  return p;
}

GenerateRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

Outcome run_one(Engine* e, GenerateRequest r) {
  ApiError err;
  auto s = e->submit(std::move(r), &err);
  EXPECT_NE(s, nullptr) << err.message;
  if (!s) return {};
  return collect(s.get());
}

// Submits every request before collecting any (so that they share steps) and returns their
// outcomes in request order; a refused request fails the test and gives an empty outcome.
std::vector<Outcome> submit_all(Engine* e, const std::vector<GenerateRequest>& requests) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : requests) {
    ApiError err;
    streams.push_back(e->submit(r, &err));
    EXPECT_NE(streams.back(), nullptr) << err.message;
  }
  std::vector<Outcome> out;
  for (auto& s : streams) out.push_back(s ? collect(s.get()) : Outcome{});
  return out;
}

void wait_idle(Engine* e) {
  for (int i = 0; i < 2000 && !e->idle(); ++i) std::this_thread::sleep_for(5ms);
  // One more step boundary for the metrics snapshot.
  for (int i = 0; i < 200; ++i) {
    const EngineMetrics m = e->metrics();
    if (m.num_requests_running == 0 && m.num_requests_waiting == 0) break;
    std::this_thread::sleep_for(5ms);
  }
}

void expect_kv_baseline(Engine* e) {
  wait_idle(e);
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_EQ(m.num_requests_waiting, 0);
  EXPECT_EQ(m.kv_pages_free, m.kv_pages_total);
  ASSERT_FALSE(m.kv_pools.empty());
  for (const auto& p : m.kv_pools) EXPECT_EQ(p.free, p.total) << p.name;
}

// Tiny-model KV sized for 4 sequence slots and 5 pages per pool (each sequence of the tests below
// needs 2 pages: preemption, not failure), max_model_len 512.
void set_five_pages(EngineConfig* c) {
  c->max_num_seqs = 4;
  const double page_set = 2 * 64 * 584 + 2 * 64 * 132 + 2 * 584, slot = 243328;
  c->kv_cache_memory_gib = (4 * slot + 5 * page_set + 100) / double(1 << 30);
  c->max_model_len = 512;
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = make_engine().release(); }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static Engine* engine_;
};
Engine* EngineTest::engine_ = nullptr;

TEST_F(EngineTest, ModelInfoAndSummary) {
  ASSERT_NE(engine_, nullptr);
  EXPECT_EQ(engine_->model_info().vocab_size, 129280);
  EXPECT_EQ(engine_->model_info().max_model_len, 4096);
  bool kv_line = false;
  for (const auto& l : engine_->summary()) kv_line |= l.find("capacity") != std::string::npos;
  EXPECT_TRUE(kv_line);
  expect_kv_baseline(engine_);
}

TEST_F(EngineTest, BatchInvariance64ConcurrentGreedy) {
  ASSERT_NE(engine_, nullptr);
  ds::Rng rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 64; ++i) prompts.push_back(random_prompt(&rng, 2 + int64_t(rng.below(30))));
  const int64_t kTokens = 5;
  std::vector<Outcome> solo;
  for (const auto& p : prompts) solo.push_back(run_one(engine_, greedy_request(p, kTokens)));
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    ApiError err;
    streams.push_back(engine_->submit(greedy_request(p, kTokens), &err));
    ASSERT_NE(streams.back(), nullptr) << err.message;
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome o = collect(streams[i].get());
    EXPECT_EQ(o.ids, solo[i].ids) << "request " << i;
    EXPECT_EQ(o.text, solo[i].text) << "request " << i;
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.usage.completion_tokens, kTokens);
    EXPECT_EQ(o.usage.prompt_tokens, int64_t(prompts[i].size()));
    std::string text;
    ApiError err;
    ASSERT_TRUE(engine_->detokenize(o.ids, &text, &err));
    EXPECT_EQ(o.text, text);  // streamed text == one-shot decode
  }
  expect_kv_baseline(engine_);
}

// The step-phase metrics (EngineMetrics::step_*): requests run one after another (no batching,
// no preemption), so every prompt is one prefill step of its length and every generated token
// but the last is fed back as one decode row; the phases' seconds grow, the forward's is
// positive, and all of them together fit in the wall time the requests took.
TEST_F(EngineTest, StepPhaseMetricsAddUp) {
  ASSERT_NE(engine_, nullptr);
  wait_idle(engine_);
  const EngineMetrics before = engine_->metrics();
  const auto t0 = std::chrono::steady_clock::now();
  ds::Rng rng(23);
  int64_t prompt_rows = 0, decode_rows = 0;
  for (int64_t n : {7, 19, 33}) {
    const int64_t max_tokens = 2 + n % 5;
    const Outcome o = run_one(engine_, greedy_request(random_prompt(&rng, n), max_tokens));
    EXPECT_EQ(o.usage.completion_tokens, max_tokens);
    prompt_rows += n;
    decode_rows += max_tokens - 1;
  }
  wait_idle(engine_);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineMetrics after = engine_->metrics();
  EXPECT_EQ(after.step_prefill_tokens_total - before.step_prefill_tokens_total, prompt_rows);
  EXPECT_EQ(after.step_decode_tokens_total - before.step_decode_tokens_total, decode_rows);
  EXPECT_EQ(after.prefill_steps_total - before.prefill_steps_total, 3);
  EXPECT_EQ(after.engine_steps_total - before.engine_steps_total, 3 + decode_rows);
  const double forward = after.step_forward_seconds_total - before.step_forward_seconds_total;
  const double host = (after.step_schedule_seconds_total - before.step_schedule_seconds_total) +
                      (after.step_sample_seconds_total - before.step_sample_seconds_total) +
                      (after.step_emit_seconds_total - before.step_emit_seconds_total);
  EXPECT_GT(forward, 0);
  EXPECT_GT(after.step_sample_seconds_total, before.step_sample_seconds_total);
  EXPECT_GE(after.step_schedule_seconds_total, before.step_schedule_seconds_total);
  EXPECT_GE(after.step_emit_seconds_total, before.step_emit_seconds_total);
  EXPECT_EQ(after.step_speculate_seconds_total, before.step_speculate_seconds_total);  // no MTP
  EXPECT_LE(forward + host, wall);
}

TEST_F(EngineTest, AbortAndDroppedStreamFreeKv) {
  ASSERT_NE(engine_, nullptr);
  ds::Rng rng(11);
  ApiError err;
  auto s = engine_->submit(greedy_request(random_prompt(&rng, 300), 3000), &err);
  ASSERT_NE(s, nullptr) << err.message;
  RequestEvent ev;
  int got = 0;
  while (got < 3 && s->next(&ev, 60s)) got += int(ev.tokens.size());
  EXPECT_LT(engine_->metrics().kv_pages_free, engine_->metrics().kv_pages_total);
  s->abort();
  s->abort();  // idempotent
  Outcome o = collect(s.get());
  EXPECT_EQ(o.reason, FinishReason::kAbort);
  expect_kv_baseline(engine_);
  // Dropping a stream mid-way aborts it.
  {
    auto d = engine_->submit(greedy_request(random_prompt(&rng, 100), 3000), &err);
    ASSERT_NE(d, nullptr);
    ASSERT_TRUE(d->next(&ev, 60s));
  }
  expect_kv_baseline(engine_);
  EXPECT_TRUE(engine_->idle());
}

TEST_F(EngineTest, Timeout) {
  ASSERT_NE(engine_, nullptr);
  ds::Rng rng(3);
  GenerateRequest r = greedy_request(random_prompt(&rng, 20), 3000);
  r.timeout = 30ms;
  const Outcome o = run_one(engine_, r);
  EXPECT_EQ(o.reason, FinishReason::kLength);
  EXPECT_LT(o.usage.completion_tokens, 3000);
  expect_kv_baseline(engine_);
}

TEST_F(EngineTest, StopStringsAndStopTokens) {
  ASSERT_NE(engine_, nullptr);
  ds::Rng rng(5);
  const auto prompt = random_prompt(&rng, 12);
  const Outcome base = run_one(engine_, greedy_request(prompt, 24));
  ASSERT_EQ(base.ids.size(), 24u);
  // Stop token: the 5th generated id (its first occurrence) ends the output before it.
  const int32_t stop_id = base.ids[4];
  size_t first = 0;
  while (base.ids[first] != stop_id) ++first;
  GenerateRequest r = greedy_request(prompt, 24);
  r.sampling.stop_token_ids = {stop_id};
  Outcome o = run_one(engine_, r);
  EXPECT_EQ(o.reason, FinishReason::kStop);
  EXPECT_EQ(o.usage.completion_tokens, int64_t(first + 1));
  std::string want;
  ApiError err;
  ASSERT_TRUE(engine_->detokenize(std::vector<int32_t>(base.ids.begin(), base.ids.begin() + first),
                                  &want, &err));
  EXPECT_EQ(o.text, want);
  // Stop string: a piece from the middle of the text.
  if (base.text.size() >= 8) {
    size_t at = base.text.size() / 2;
    while (at > 0 && (uint8_t(base.text[at]) & 0xC0) == 0x80) --at;
    size_t end = at + 1;
    while (end < base.text.size() && (uint8_t(base.text[end]) & 0xC0) == 0x80) ++end;
    const std::string stop = base.text.substr(at, end - at);
    GenerateRequest rs = greedy_request(prompt, 24);
    rs.sampling.stop = {stop};
    o = run_one(engine_, rs);
    EXPECT_EQ(o.reason, FinishReason::kStop);
    EXPECT_EQ(o.stop_reason, stop);
    EXPECT_EQ(o.text, base.text.substr(0, base.text.find(stop)));
  }
  expect_kv_baseline(engine_);
}

TEST_F(EngineTest, LogprobsAndSeeds) {
  ASSERT_NE(engine_, nullptr);
  ds::Rng rng(9);
  GenerateRequest r;
  r.prompt_ids = random_prompt(&rng, 10);
  r.sampling.temperature = 1.0;
  r.sampling.seed = 1234;
  r.sampling.max_tokens = 8;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 3;
  ApiError err;
  auto a = engine_->submit(r, &err);
  auto b = engine_->submit(r, &err);
  ASSERT_TRUE(a && b);
  const Outcome oa = collect(a.get()), ob = collect(b.get());
  EXPECT_EQ(oa.ids, ob.ids);  // same seed, concurrent: same tokens
  ASSERT_EQ(oa.tokens.size(), 8u);
  for (const auto& t : oa.tokens) {
    EXPECT_LE(t.logprob, 0.0f);
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[0].logprob, t.logprob);
  }
  r.sampling.seed = 1235;
  const Outcome oc = run_one(engine_, r);
  EXPECT_NE(oa.ids, oc.ids);
  expect_kv_baseline(engine_);
}

TEST_F(EngineTest, AdmissionErrors) {
  ASSERT_NE(engine_, nullptr);
  ApiError err;
  GenerateRequest r;
  EXPECT_EQ(engine_->submit(r, &err), nullptr);  // empty prompt
  EXPECT_EQ(err.kind, ErrorKind::kInvalidRequest);
  r.prompt_ids = {5, 129280};
  EXPECT_EQ(engine_->submit(r, &err), nullptr);
  EXPECT_EQ(err.kind, ErrorKind::kInvalidRequest);
  EXPECT_NE(err.message.find("129280"), std::string::npos);
  r.prompt_ids = std::vector<int32_t>(4000, 7);
  r.sampling.max_tokens = 200;
  EXPECT_EQ(engine_->submit(r, &err), nullptr);
  EXPECT_EQ(err.code, "context_length_exceeded");
  EXPECT_EQ(err.n_prompt_tokens, 4000);
  EXPECT_EQ(err.n_ctx, 4096);
  EXPECT_NE(err.message.find("maximum context length is 4096 tokens"), std::string::npos);
  r.prompt_ids = {5, 6};
  r.sampling.top_p = 1.5;
  EXPECT_EQ(engine_->submit(r, &err), nullptr);
  EXPECT_EQ(err.param, "top_p");
  expect_kv_baseline(engine_);
}

TEST_F(EngineTest, ChatEncodingErrors) {
  ASSERT_NE(engine_, nullptr);
  ChatPrompt p;
  p.messages.push_back({"user", std::string("hi"), std::nullopt, {}, ""});
  std::vector<int32_t> ids;
  ApiError err;
  ASSERT_TRUE(engine_->encode_chat(p, &ids, &err)) << err.message;
  EXPECT_FALSE(ids.empty());
  p.tools_json = "[{bad json";
  EXPECT_FALSE(engine_->encode_chat(p, &ids, &err));
  EXPECT_EQ(err.kind, ErrorKind::kInvalidRequest);
  EXPECT_EQ(err.param, "tools");
}

// Equivalences that need their own engine configuration.
TEST(EngineConfigs, ChunkedPrefillAndPreemptionKeepGreedyOutput) {
  ds::Rng rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(&rng, 236 + int64_t(rng.below(15))));
  const int64_t kTokens = 24;  // every sequence crosses 256 positions: a second page
  std::vector<Outcome> solo;
  {
    auto e = make_engine();
    ASSERT_NE(e, nullptr);
    for (const auto& p : prompts) solo.push_back(run_one(e.get(), greedy_request(p, kTokens)));
  }
  {
    // Chunks of 7 tokens.
    EngineConfig c;
    c.max_num_batched_tokens = 7;
    auto e = make_engine(c);
    ASSERT_NE(e, nullptr);
    const Outcome o = run_one(e.get(), greedy_request(prompts[0], kTokens));
    EXPECT_EQ(o.ids, solo[0].ids);
    EXPECT_EQ(o.text, solo[0].text);
  }
  {
    // 5 pages per pool for 4 sequences that each need 2: preemption, not failure.
    EngineConfig c;
    set_five_pages(&c);
    auto e = make_engine(c);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->metrics().kv_capacity_tokens, 5 * 256);
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      ApiError err;
      streams.push_back(e->submit(greedy_request(p, kTokens), &err));
      ASSERT_NE(streams.back(), nullptr) << err.message;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome o = collect(streams[i].get());
      EXPECT_EQ(o.ids, solo[i].ids) << "request " << i;  // no token duplicated or missing
      EXPECT_EQ(o.text, solo[i].text) << "request " << i;
      EXPECT_EQ(o.reason, FinishReason::kLength);
    }
    EXPECT_GT(e->metrics().num_preemptions_total, 0);
    expect_kv_baseline(e.get());
    // Recomputed tokens are not counted twice.
    int64_t prompt_total = 0;
    for (const auto& p : prompts) prompt_total += int64_t(p.size());
    EXPECT_EQ(e->metrics().prompt_tokens_total, prompt_total);
    EXPECT_EQ(e->metrics().generation_tokens_total, 4 * kTokens);
    // KV1: a request that can never fit the cache alone is refused at once, < max_model_len.
    e.reset();
    c.max_model_len = 2048;
    e = make_engine(c);
    ApiError err;
    EXPECT_EQ(e->submit(greedy_request(random_prompt(&rng, 1400), 10), &err), nullptr);
    EXPECT_EQ(err.kind, ErrorKind::kInvalidRequest);
    EXPECT_EQ(err.code, "kv_cache_exceeded");
  }
}

TEST(EngineConfigs, QueueBoundsAndDrain) {
  EngineConfig c;
  c.max_queued_requests = 2;
  c.max_queued_tokens = 100;
  c.fault.stall_ms = 200;  // keep the queue from draining while we fill it (test build hook)
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);
  ds::Rng rng(1);
  ApiError err;
  auto a = e->submit(greedy_request(random_prompt(&rng, 10), 4), &err);
  auto b = e->submit(greedy_request(random_prompt(&rng, 10), 4), &err);
  ASSERT_TRUE(a && b);
  // A third one may or may not fit depending on whether the first was admitted yet; fill up.
  std::vector<std::unique_ptr<RequestStream>> extra;
  bool refused = false;
  for (int i = 0; i < 4 && !refused; ++i) {
    auto s = e->submit(greedy_request(random_prompt(&rng, 10), 4), &err);
    if (!s) {
      refused = true;
      EXPECT_EQ(err.kind, ErrorKind::kOverloaded);
    } else {
      extra.push_back(std::move(s));
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_GE(e->metrics().requests_rejected_total, 1);
  // Token bound: 200 prompt tokens never fit 100 queued tokens.
  EXPECT_EQ(e->submit(greedy_request(random_prompt(&rng, 200), 4), &err), nullptr);
  EXPECT_EQ(err.kind, ErrorKind::kOverloaded);
  e->drain();
  EXPECT_EQ(e->submit(greedy_request(random_prompt(&rng, 10), 4), &err), nullptr);
  EXPECT_EQ(err.kind, ErrorKind::kUnavailable);
  e->abort_all();
  const Outcome oa = collect(a.get());
  EXPECT_TRUE(oa.reason == FinishReason::kAbort || oa.reason == FinishReason::kLength);
  wait_idle(e.get());
  EXPECT_TRUE(e->idle());
}

// The step's rows are sampled in parallel over the requests (each with its own sampler): the
// tokens and logprobs of seeded sampled, penalized and greedy requests, with MTP drafts verified
// and proposed in the same phase, are the same on one thread as on four.
// Greedy rows that nothing adjusts take their argmax from the backend (SequenceChunk::argmax_only)
// unless DEEPSERVE_BACKEND_ARGMAX=0: both engines give the same tokens for concurrent greedy
// requests mixed with greedy requests that take logits (logprobs, a repetition penalty, min_tokens)
// and sampled ones, so steps mix both kinds of head output.
TEST(EngineConfigs, BackendArgmaxGivesTheHostArgmaxOutputs) {
  ds::Rng rng(61);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r = greedy_request(random_prompt(&rng, 4 + 5 * i), 8);
    if (i % 5 == 1) r.sampling.logprobs = 2;
    if (i % 5 == 2) r.sampling.repetition_penalty = 1.3;
    if (i % 5 == 3) {
      r.sampling.min_tokens = 4;
      r.sampling.ignore_eos = false;
    }
    if (i % 5 == 4) {
      r.sampling.temperature = 0.8;
      r.sampling.seed = 7 + uint64_t(i);
    }
    requests.push_back(r);
  }
  int64_t argmax_rows[2] = {-1, -1};
  auto run_all = [&](const char* backend_argmax) {
    setenv("DEEPSERVE_BACKEND_ARGMAX", backend_argmax, 1);
    auto e = make_engine();
    unsetenv("DEEPSERVE_BACKEND_ARGMAX");
    if (!e) return std::vector<Outcome>{};
    std::vector<Outcome> out = submit_all(e.get(), requests);
    wait_idle(e.get());
    argmax_rows[backend_argmax[0] - '0'] = e->metrics().step_argmax_rows_total;
    return out;
  };
  const std::vector<Outcome> host = run_all("0"), backend = run_all("1");
  // Greedy requests 0 and 5 (8 rows each), and 3 and 8 once min_tokens no longer masks EOS,
  // take the argmax from the backend; the others (logprobs, a penalty, sampled) never.
  EXPECT_EQ(argmax_rows[0], 0);
  EXPECT_GE(argmax_rows[1], 16);
  ASSERT_EQ(host.size(), requests.size());
  ASSERT_EQ(backend.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(backend[i].ids, host[i].ids) << "request " << i;
    EXPECT_EQ(backend[i].text, host[i].text) << "request " << i;
    EXPECT_FALSE(host[i].ids.empty()) << "request " << i;
    ASSERT_EQ(backend[i].tokens.size(), host[i].tokens.size());
    for (size_t t = 0; t < host[i].tokens.size(); ++t) {
      EXPECT_EQ(backend[i].tokens[t].logprob, host[i].tokens[t].logprob) << "request " << i;
    }
  }
}

// Random rows that nothing adjusts take their draw from the backend (SequenceChunk::backend_sample)
// when DEEPSERVE_BACKEND_SAMPLING=1 (on the CPU backend: cpu::sample_row on the host; the GPU's
// kernel is the same function, test_sampling_cuda): seeded requests give the same tokens run after
// run and alone or batched; a draw whose truncation leaves only the maximum (top-k 1) gives the
// greedy tokens; requests with logprobs or a penalty stay on the host sampler; with MTP drafts the
// rows without drafts still draw on the backend. DEEPSERVE_BACKEND_SAMPLING=0: no backend draws.
TEST(EngineConfigs, BackendSamplingDrawsSeededTokensOnTheBackend) {
  ds::Rng rng(63);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r = greedy_request(random_prompt(&rng, 5 + 4 * i), 6);
    r.sampling.seed = 500 + uint64_t(i);
    r.sampling.temperature = 0.7 + 0.1 * i;
    if (i == 1) r.sampling.top_p = 0.9;
    if (i == 2) r.sampling.top_k = 20;
    if (i == 3) r.sampling.min_p = 0.05;
    if (i == 4) r.sampling.top_k = 1;               // only the maximum survives: the greedy tokens
    if (i == 5) r.sampling.logprobs = 2;            // host
    if (i == 6) r.sampling.presence_penalty = 0.5;  // host after the first token
    requests.push_back(r);
  }
  GenerateRequest greedy4 = requests[4];
  greedy4.sampling.temperature = 0;
  greedy4.sampling.top_k = 0;
  requests.push_back(greedy4);
  struct Run {
    std::vector<Outcome> out;
    int64_t sampled = -1;
  };
  auto run_all = [&](const char* mode, const std::vector<GenerateRequest>& rs, bool mtp) {
    setenv("DEEPSERVE_BACKEND_SAMPLING", mode, 1);
    EngineConfig c;
    if (mtp) {
      c.speculative.method = "mtp";
      c.speculative.num_speculative_tokens = 2;
      c.speculative.adaptive = false;
    }
    auto e = make_engine(c);
    unsetenv("DEEPSERVE_BACKEND_SAMPLING");
    Run run;
    if (!e) return run;
    run.out = submit_all(e.get(), rs);
    wait_idle(e.get());
    run.sampled = e->metrics().step_backend_sampled_rows_total;
    return run;
  };
  const Run a = run_all("1", requests, false), b = run_all("1", requests, false);
  const Run host = run_all("0", requests, false);
  ASSERT_EQ(a.out.size(), requests.size());
  ASSERT_EQ(b.out.size(), requests.size());
  ASSERT_EQ(host.out.size(), requests.size());
  // Requests 0-4 and 7 draw every token on the backend, 6 its first one.
  EXPECT_GE(a.sampled, 6 * 6 + 1);
  EXPECT_EQ(host.sampled, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(a.out[i].ids.size(), 6u) << "request " << i;
    EXPECT_EQ(a.out[i].ids, b.out[i].ids) << "request " << i;
  }
  EXPECT_EQ(a.out[4].ids, a.out[8].ids);     // top-k 1 = greedy
  EXPECT_EQ(host.out[4].ids, a.out[4].ids);  // on the host too
  EXPECT_EQ(host.out[5].ids, a.out[5].ids);  // logprobs: the host sampler on both
  for (size_t t = 0; t < a.out[5].tokens.size(); ++t) {
    EXPECT_EQ(a.out[5].tokens[t].logprob, host.out[5].tokens[t].logprob);
  }
  // Alone, request 1 draws what it drew in the batch.
  const Run alone = run_all("1", {requests[1]}, false);
  ASSERT_EQ(alone.out.size(), 1u);
  EXPECT_EQ(alone.out[0].ids, a.out[1].ids);
  // With MTP: verify rows stay on the host, the others draw on the backend; seeded, repeatable.
  const Run m1 = run_all("1", requests, true), m2 = run_all("1", requests, true);
  ASSERT_EQ(m1.out.size(), requests.size());
  EXPECT_GT(m1.sampled, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(m1.out[i].ids.size(), 6u) << "request " << i;
    EXPECT_EQ(m1.out[i].ids, m2.out[i].ids) << "request " << i;
  }
}

TEST(EngineConfigs, ParallelSamplingGivesTheSingleThreadOutputs) {
  ds::Rng rng(57);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_ids = random_prompt(&rng, 6 + 3 * i);
    r.sampling.max_tokens = 10;
    r.sampling.ignore_eos = true;
    r.sampling.seed = 100 + uint64_t(i);
    r.sampling.temperature = i % 4 == 0 ? 0.0 : 0.9;
    if (i % 4 == 1) r.sampling.top_p = 0.9;
    if (i % 4 == 2) r.sampling.top_k = 20;
    if (i % 4 == 3) {
      r.sampling.min_p = 0.05;
      r.sampling.frequency_penalty = 0.5;
    }
    if (i % 2 == 0) r.sampling.logprobs = 3;
    requests.push_back(r);
  }
  auto run_all = [&](int threads) {
    EngineConfig c;
    c.num_threads = threads;
    c.speculative.method = "mtp";
    c.speculative.num_speculative_tokens = 2;
    c.speculative.adaptive = false;
    auto e = make_engine(c);
    if (!e) return std::vector<Outcome>{};
    std::vector<Outcome> out = submit_all(e.get(), requests);
    const EngineMetrics m = e->metrics();
    EXPECT_GT(m.spec_draft_tokens_total, 0);
    expect_kv_baseline(e.get());
    return out;
  };
  const std::vector<Outcome> one = run_all(1), four = run_all(4);
  ASSERT_EQ(one.size(), requests.size());
  ASSERT_EQ(four.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(one[i].reason, FinishReason::kLength) << i;
    EXPECT_EQ(one[i].ids.size(), 10u) << i;
    EXPECT_EQ(one[i].ids, four[i].ids) << "request " << i;
    ASSERT_EQ(one[i].tokens.size(), four[i].tokens.size());
    for (size_t t = 0; t < one[i].tokens.size(); ++t) {
      EXPECT_EQ(one[i].tokens[t].logprob, four[i].tokens[t].logprob) << i << "/" << t;
      ASSERT_EQ(one[i].tokens[t].top.size(), four[i].tokens[t].top.size());
      EXPECT_EQ(one[i].tokens[t].top.size(), requests[i].sampling.logprobs >= 0 ? 3u : 0u);
      for (size_t k = 0; k < one[i].tokens[t].top.size(); ++k) {
        EXPECT_EQ(one[i].tokens[t].top[k].token_id, four[i].tokens[t].top[k].token_id);
        EXPECT_EQ(one[i].tokens[t].top[k].logprob, four[i].tokens[t].top[k].logprob);
      }
    }
  }
}

TEST(EngineConfigs, NanHookEndsOnlyItsRequest) {
  ds::Rng rng(33);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(&rng, 8 + i));
  EngineConfig c;
  c.fault.nan_request_ordinal = 6;  // the 2nd of the concurrent batch (after 4 solo runs)
  c.fault.nan_at_output_token = 3;
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);
  std::vector<Outcome> solo;
  for (const auto& p : prompts) solo.push_back(run_one(e.get(), greedy_request(p, 6)));
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    ApiError err;
    streams.push_back(e->submit(greedy_request(p, 6), &err));
    ASSERT_NE(streams.back(), nullptr);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome o = collect(streams[i].get());
    if (i == 1) {
      EXPECT_EQ(o.reason, FinishReason::kError);
      EXPECT_EQ(o.usage.completion_tokens, 2);
    } else {
      EXPECT_EQ(o.reason, FinishReason::kLength);
      EXPECT_EQ(o.ids, solo[i].ids);
    }
  }
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.requests_corrupted_total, 1);
  EXPECT_EQ(m.requests_failed_total, 1);
  expect_kv_baseline(e.get());
  // Still serving.
  EXPECT_EQ(run_one(e.get(), greedy_request(prompts[0], 6)).ids, solo[0].ids);
}

TEST(EngineConfigs, StickyFaultFailsEverythingAndKillsTheEngine) {
  EngineConfig c;
  c.fault.sticky_fault_at_step = 3;
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);
  ds::Rng rng(44);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 2; ++i) {
    ApiError err;
    streams.push_back(e->submit(greedy_request(random_prompt(&rng, 6), 20), &err));
    ASSERT_NE(streams.back(), nullptr);
  }
  for (auto& s : streams) EXPECT_EQ(collect(s.get()).reason, FinishReason::kError);
  const Engine::Health h = e->health();
  EXPECT_TRUE(h.dead);
  EXPECT_FALSE(h.reason.empty());
  ApiError err;
  EXPECT_EQ(e->submit(greedy_request(random_prompt(&rng, 6), 4), &err), nullptr);
  EXPECT_EQ(err.kind, ErrorKind::kUnavailable);
  expect_kv_baseline(e.get());
}

// Tensor parallelism through the Engine API (docs/parallelism.md), on CPU ranks (the GPU ranks
// are the same runner with NCCL: scripts/gpu/run_multi_gpu.sh): two ranks serve concurrent
// greedy requests, with chunked prefill, a sequence restarted after preemption and speculative
// decoding, and free every KV page afterwards. Expected output: the same requests on one rank.
// The two ranks' all-reduce sums two partial dot products where one rank computes one, an
// fp32-rounding difference; on these prompts and 16 tokens the greedy ids agree exactly (a
// rounding flip would show as a mismatch in one request from some token on, and the test
// reports which).
TEST(EngineConfigs, TensorParallelTwoRanksGiveTheSingleRankGreedyOutput) {
  ds::Rng rng(77);
  std::vector<std::vector<int32_t>> prompts;  // each crosses 256 positions: a second page
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(&rng, 240 + int64_t(rng.below(10))));
  const int64_t kTokens = 16;
  auto run_all = [&](EngineConfig c) {
    auto e = make_engine(c);
    std::vector<Outcome> out;
    if (!e) return out;
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      ApiError err;
      streams.push_back(e->submit(greedy_request(p, kTokens), &err));
      EXPECT_NE(streams.back(), nullptr) << err.message;
      if (!streams.back()) return out;
    }
    for (auto& s : streams) out.push_back(collect(s.get()));
    expect_kv_baseline(e.get());
    EXPECT_FALSE(e->summary().empty());
    return out;
  };
  EngineConfig one;
  one.max_num_batched_tokens = 64;  // chunked prefill
  const std::vector<Outcome> single = run_all(one);
  ASSERT_EQ(single.size(), prompts.size());

  EngineConfig two = one;
  two.tensor_parallel_size = 2;
  const std::vector<Outcome> tp = run_all(two);
  ASSERT_EQ(tp.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tp[i].reason, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(tp[i].ids, single[i].ids) << "request " << i;
  }

  // Preemption (pages for fewer sequences than run) on two ranks: the restarted sequences keep
  // the two-rank greedy output.
  EngineConfig tight = two;
  set_five_pages(&tight);
  {
    auto e = make_engine(tight);
    ASSERT_NE(e, nullptr);
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      ApiError err;
      streams.push_back(e->submit(greedy_request(p, kTokens), &err));
      ASSERT_NE(streams.back(), nullptr) << err.message;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(collect(streams[i].get()).ids, tp[i].ids) << "request " << i;
    }
    EXPECT_GT(e->metrics().num_preemptions_total, 0);
    expect_kv_baseline(e.get());
  }
  // MTP speculation on two ranks (checkpoint and rollback on every rank): the same greedy ids.
  {
    EngineConfig spec = two;
    spec.speculative.method = "mtp";
    spec.speculative.num_speculative_tokens = 2;
    auto e = make_engine(spec);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(run_one(e.get(), greedy_request(prompts[1], kTokens)).ids, tp[1].ids);
    EXPECT_GT(e->metrics().spec_draft_tokens_total, 0);
    expect_kv_baseline(e.get());
  }

  // A split the model cannot take is a load error naming the flag.
  EngineConfig three = one;
  three.tensor_parallel_size = 3;
  ApiError err;
  EXPECT_EQ(Engine::create(three, &err), nullptr);
  EXPECT_NE(err.message.find("--tensor-parallel-size 3"), std::string::npos) << err.message;
  EXPECT_NE(err.message.find("divide by 3"), std::string::npos) << err.message;
}

}  // namespace
}  // namespace deepserve
