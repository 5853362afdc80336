// Speculative decoding through the public Engine API on the embedded tiny model
// (docs/speculative.md): greedy outputs with speculation are identical to greedy outputs without
// it for many prompts and lengths, alone and in mixed batches (verify chunks, plain decodes and
// prefill chunks in one step), with the model's own MTP drafts (the trained embedded model's MTP
// layer: about 60% accepted) and with an oracle draft (the test hook replaces drafts by the known greedy continuation,
// corrupted at some positions) so that every accepted length 0..k and the rollbacks are
// exercised. Sampling requests run with speculation; metrics count drafts and acceptances; bad
// --speculative-config values are refused with a clear message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "deepserve/engine.h"

namespace deepserve {
namespace {

using namespace std::chrono_literals;

std::vector<int32_t> run_one(Engine* e, const std::vector<int32_t>& prompt, int64_t max_tokens,
                             double temperature = 0, FinishReason* reason = nullptr) {
  GenerateRequest req;
  req.prompt_ids = prompt;
  req.sampling.temperature = temperature;
  req.sampling.max_tokens = max_tokens;
  req.sampling.ignore_eos = true;
  req.sampling.seed = 5;
  ApiError err;
  auto s = e->submit(req, &err);
  EXPECT_NE(s, nullptr) << err.message;
  std::vector<int32_t> ids;
  if (!s) return ids;
  RequestEvent ev;
  while (s->next(&ev, 120s)) {
    for (const auto& t : ev.tokens) ids.push_back(t.token_id);
    if (ev.finished) {
      if (reason) *reason = ev.finish_reason;
      break;
    }
  }
  return ids;
}

// All prompts submitted at once (one engine batch with mixed prefill / decode / verify chunks).
std::vector<std::vector<int32_t>> run_batch(Engine* e,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int64_t>& max_tokens) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest req;
    req.prompt_ids = prompts[i];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = max_tokens[i];
    req.sampling.ignore_eos = true;
    ApiError err;
    streams.push_back(e->submit(req, &err));
    EXPECT_NE(streams.back(), nullptr) << err.message;
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    RequestEvent ev;
    while (streams[i] && streams[i]->next(&ev, 120s)) {
      for (const auto& t : ev.tokens) out[i].push_back(t.token_id);
      if (ev.finished) break;
    }
  }
  return out;
}

std::unique_ptr<Engine> make(int64_t k, bool adaptive,
                             std::function<void(const std::vector<int32_t>&,
                                                std::vector<int32_t>*)> override_fn = {}) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;  // chunked prefill alongside verify chunks
  if (k > 0) {
    c.speculative.method = "mtp";
    c.speculative.num_speculative_tokens = k;
    c.speculative.adaptive = adaptive;
  }
  c.fault.spec_draft_override = std::move(override_fn);
  ApiError err;
  auto e = Engine::create(c, &err);
  EXPECT_NE(e, nullptr) << err.message;
  return e;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> max_tokens;
};

Workload workload() {
  ds::Rng rng(77);
  Workload w;
  const int64_t lengths[] = {1, 3, 16, 41, 130, 7, 90, 2};
  const int64_t outs[] = {24, 1, 17, 30, 9, 40, 5, 33};
  for (size_t i = 0; i < 8; ++i) {
    std::vector<int32_t> p;
    for (int64_t j = 0; j < lengths[i]; ++j) p.push_back(int32_t(1000 + rng.below(100000)));
    w.prompts.push_back(p);
    w.max_tokens.push_back(outs[i]);
  }
  return w;
}

class SpeculativeEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    w_ = new Workload(workload());
    ref_ = new std::vector<std::vector<int32_t>>();
    auto e = make(0, false);
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      ref_->push_back(run_one(e.get(), w_->prompts[i], w_->max_tokens[i]));
    }
  }
  static void TearDownTestSuite() {
    delete w_;
    delete ref_;
  }
  // Replaces a draft by the reference continuation, with position (len % 3) of the draft
  // corrupted when len % 4 == 0 (so accepted lengths vary).
  static void oracle(const std::vector<int32_t>& tokens, std::vector<int32_t>* draft) {
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      const auto& p = w_->prompts[i];
      const auto& r = (*ref_)[i];
      if (tokens.size() < p.size() || !std::equal(p.begin(), p.end(), tokens.begin())) continue;
      if (!std::equal(tokens.begin() + int64_t(p.size()), tokens.end(), r.begin())) continue;
      const size_t done = tokens.size() - p.size();
      for (size_t j = 0; j < draft->size(); ++j) {
        (*draft)[j] = done + j < r.size() ? r[done + j] : 3;
      }
      if (tokens.size() % 4 == 0 && !draft->empty()) {
        int32_t& bad = (*draft)[tokens.size() % 3 % draft->size()];
        bad = bad == 5 ? 6 : 5;
      }
      return;
    }
  }
  static Workload* w_;
  static std::vector<std::vector<int32_t>>* ref_;
};
Workload* SpeculativeEngine::w_ = nullptr;
std::vector<std::vector<int32_t>>* SpeculativeEngine::ref_ = nullptr;

TEST_F(SpeculativeEngine, GreedyMatchesPlainAloneWithMtpDrafts) {
  for (int64_t k : {1, 3}) {
    auto e = make(k, false);
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      EXPECT_EQ(run_one(e.get(), w_->prompts[i], w_->max_tokens[i]), (*ref_)[i])
          << "k " << k << " prompt " << i;
    }
    const EngineMetrics m = e->metrics();
    EXPECT_GT(m.spec_num_drafts_total, 0);
    EXPECT_GE(m.spec_draft_tokens_total, m.spec_num_drafts_total);
    EXPECT_LE(m.spec_accepted_tokens_total, m.spec_draft_tokens_total);
    EXPECT_EQ(m.spec_num_speculative_tokens, k);
  }
}

TEST_F(SpeculativeEngine, GreedyMatchesPlainWithOracleDraftsAloneAndBatched) {
  for (int64_t k : {2, 4}) {
    auto e = make(k, false, &SpeculativeEngine::oracle);
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      EXPECT_EQ(run_one(e.get(), w_->prompts[i], w_->max_tokens[i]), (*ref_)[i])
          << "alone, k " << k << " prompt " << i;
    }
    const auto batched = run_batch(e.get(), w_->prompts, w_->max_tokens);
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      EXPECT_EQ(batched[i], (*ref_)[i]) << "batched, k " << k << " prompt " << i;
    }
    const EngineMetrics m = e->metrics();
    EXPECT_GT(m.spec_accepted_tokens_total, 0);
    EXPECT_LT(m.spec_accepted_tokens_total, m.spec_draft_tokens_total);  // some rejected
    // Fewer steps than tokens: accepted drafts made some steps emit several tokens.
    EXPECT_GT(m.generation_tokens_total, m.spec_num_drafts_total);
  }
}

TEST_F(SpeculativeEngine, AdaptivePolicyKeepsGreedyOutputs) {
  auto e = make(3, true, &SpeculativeEngine::oracle);
  const auto batched = run_batch(e.get(), w_->prompts, w_->max_tokens);
  for (size_t i = 0; i < w_->prompts.size(); ++i) {
    EXPECT_EQ(batched[i], (*ref_)[i]) << "prompt " << i;
  }
}

// Steps with k = 0 (the adaptive policy switching speculation off, the last token of a request)
// defer the MTP catch-up into a backlog that later runs as one chunk, in MTP calls of at most
// max_num_batched_tokens rows (16 here, below the 8 sequences' backlogs plus verify rows). A
// test hook forces k = 0 on three steps of every four, so every draft comes right after a
// deferred catch-up of up to 3 rows. Outputs stay the greedy reference, and the MTP layer's own
// drafts keep being accepted nearly as often as with k = 3 on every step (the trained embedded
// model); a catch-up that fed the MTP layer wrong rows or next tokens drops acceptance.
TEST_F(SpeculativeEngine, DeferredMtpCatchUpKeepsOutputsAndAcceptance) {
  auto run = [&](bool alternate) {
    EngineConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 16;
    c.speculative.method = "mtp";
    c.speculative.num_speculative_tokens = 3;
    c.speculative.adaptive = false;
    if (alternate) c.fault.spec_k_override = [](int64_t step) { return step % 4 == 0 ? 3 : 0; };
    ApiError err;
    auto e = Engine::create(c, &err);
    EXPECT_NE(e, nullptr) << err.message;
    if (e == nullptr) return 0.0;
    const auto batched = run_batch(e.get(), w_->prompts, w_->max_tokens);
    for (size_t i = 0; i < w_->prompts.size(); ++i) {
      EXPECT_EQ(batched[i], (*ref_)[i]) << "prompt " << i << (alternate ? " (alternating)" : "");
    }
    const EngineMetrics m = e->metrics();
    const double rate = m.spec_draft_tokens_total > 0 ? double(m.spec_accepted_tokens_total) /
                                                            double(m.spec_draft_tokens_total)
                                                      : 0.0;
    std::printf("[ metric ] %s: drafts %lld, draft tokens %lld, accepted %lld (%.1f%%)\n",
                alternate ? "k = 3 one step in four" : "k = 3 every step",
                (long long)m.spec_num_drafts_total, (long long)m.spec_draft_tokens_total,
                (long long)m.spec_accepted_tokens_total, 100 * rate);
    EXPECT_GT(m.spec_draft_tokens_total, 20);
    return rate;
  };
  // Measured (CPU, deterministic): 46.2% every step, 35.8% alternating (drafts at other
  // positions). Feeding the backlog's rows out of order gave 26.7%, wrong next tokens 1.0%.
  const double every = run(false), alternating = run(true);
  EXPECT_GT(alternating, 0.7 * every);
  EXPECT_GT(alternating, 0.2);
}

TEST_F(SpeculativeEngine, SamplingRequestsRunWithSpeculation) {
  auto e = make(2, false, &SpeculativeEngine::oracle);
  FinishReason reason = FinishReason::kNone;
  const auto ids = run_one(e.get(), w_->prompts[3], 25, 0.8, &reason);
  EXPECT_EQ(ids.size(), 25u);
  EXPECT_EQ(reason, FinishReason::kLength);
  for (int32_t id : ids) EXPECT_LT(int64_t(id), e->model_info().vocab_size);
  EXPECT_GT(e->metrics().spec_num_drafts_total, 0);
  // The finished event precedes the engine's bookkeeping by a moment.
  for (int i = 0; i < 500 && !e->idle(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(e->idle());
}

// The measurement behind the adaptive policy's defaults (docs/speculative.md): output tokens/s
// of greedy decoding at k = 0..3, batch 1 and 8, with the MTP's own drafts (measured in session 2
// with random weights:
// nothing accepted, so this is the pure verify + draft overhead) and with oracle drafts (about
// 3 in 4 accepted). Run by hand: --gtest_also_run_disabled_tests --gtest_filter=*Measure*.
TEST_F(SpeculativeEngine, DISABLED_MeasureTokensPerSecond) {
  for (int oracle_drafts = 0; oracle_drafts < 2; ++oracle_drafts) {
    for (int64_t batch : {1, 8}) {
      for (int64_t k = 0; k <= 3; ++k) {
        auto e = make(k, false, oracle_drafts ? &SpeculativeEngine::oracle : nullptr);
        std::vector<std::vector<int32_t>> prompts(w_->prompts.begin(),
                                                  w_->prompts.begin() + batch);
        std::vector<int64_t> outs(size_t(batch), 40);
        if (batch == 1) prompts = {w_->prompts[3]};
        const auto t0 = std::chrono::steady_clock::now();
        const auto got = run_batch(e.get(), prompts, outs);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        int64_t n = 0;
        for (const auto& g : got) n += int64_t(g.size());
        const EngineMetrics m = e->metrics();
        std::printf("drafts=%s batch=%lld k=%lld: %.1f tok/s (incl. prefill), accepted %lld/%lld\n",
                    oracle_drafts ? "oracle" : "mtp", (long long)batch, (long long)k,
                    double(n) / s, (long long)m.spec_accepted_tokens_total,
                    (long long)m.spec_draft_tokens_total);
      }
    }
  }
}

TEST(SpeculativeConfigParse, GoodAndBadValues) {
  SpeculativeConfig c;
  std::string err;
  EXPECT_TRUE(parse_speculative_config(R"({"method":"mtp","num_speculative_tokens":3})", &c, &err));
  EXPECT_EQ(c.method, "mtp");
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_TRUE(c.adaptive);
  EXPECT_TRUE(parse_speculative_config(
      R"({"method":"mtp","num_speculative_tokens":1,"adaptive":false})", &c, &err));
  EXPECT_FALSE(c.adaptive);
  const char* bad[] = {"", "{", "[]", R"({"method":"mtp"})",
                       R"({"method":"eagle","num_speculative_tokens":2})",
                       R"({"method":"mtp","num_speculative_tokens":0})",
                       R"({"method":"mtp","num_speculative_tokens":9})",
                       R"({"method":"mtp","num_speculative_tokens":"2"})",
                       R"({"method":"mtp","num_speculative_tokens":2,"k":1})"};
  for (const char* j : bad) {
    err.clear();
    EXPECT_FALSE(parse_speculative_config(j, &c, &err)) << j;
    EXPECT_NE(err.find("--speculative-config"), std::string::npos) << err;
  }
  // The engine refuses k >= sliding_window (16 on the tiny model).
  EngineConfig ec;
  ec.speculative.method = "mtp";
  ec.speculative.num_speculative_tokens = 16;
  ApiError e;
  EXPECT_EQ(Engine::create(ec, &e), nullptr);
  EXPECT_EQ(e.kind, ErrorKind::kInvalidRequest);
  EXPECT_NE(e.message.find("num_speculative_tokens"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace deepserve
