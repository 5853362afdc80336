// Sampler: every parameter on hand-built logits with hand-computed expectations, seed
// reproducibility, a statistical check of temperature sampling, logprobs and range validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "scheduler/sampler.h"

namespace ds::sched {
namespace {

using deepserve::SamplingParams;

constexpr int32_t kEos = 1;

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

std::map<int32_t, int> histogram(const SamplingParams& p, const std::vector<float>& logits, int n,
                                 uint64_t seed = 1) {
  Sampler s(p, seed, int64_t(logits.size()), kEos, {});
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(logits.data())];
  return h;
}

TEST(Sampler, GreedyArgmaxTiesToLowestId) {
  const std::vector<float> l = {0.5f, 2.0f, 3.0f, 3.0f, -1.0f};
  Sampler s(greedy(), 0, 5, kEos, {});
  EXPECT_EQ(s.sample(l.data()), 2);
}

TEST(Sampler, LogitBias) {
  const std::vector<float> l = {0.5f, 2.0f, 3.0f, 1.0f};
  SamplingParams p = greedy();
  p.logit_bias = {{3, 2.5}};  // 1.0 + 2.5 = 3.5 > 3.0
  Sampler s(p, 0, 4, kEos, {});
  EXPECT_EQ(s.sample(l.data()), 3);
  p.logit_bias = {{2, -100}};  // 3 - 100: token 1 (2.0) wins
  Sampler s2(p, 0, 4, kEos, {});
  EXPECT_EQ(s2.sample(l.data()), 1);
}

TEST(Sampler, MinTokensSuppressesEosAndStopTokens) {
  const std::vector<float> l = {0.0f, 5.0f, 1.0f, 4.0f};  // EOS (1) best, then 3
  SamplingParams p = greedy();
  p.min_tokens = 2;
  p.stop_token_ids = {3};
  Sampler s(p, 0, 4, kEos, {});
  EXPECT_EQ(s.sample(l.data()), 2);
  s.accept(2);
  EXPECT_EQ(s.sample(l.data()), 2);
  s.accept(2);
  EXPECT_EQ(s.sample(l.data()), 1);  // min_tokens reached
  p.ignore_eos = true;               // EOS is not suppressed then (it is not a stop)
  Sampler s2(p, 0, 4, kEos, {});
  EXPECT_EQ(s2.sample(l.data()), 1);
}

TEST(Sampler, RepetitionPenaltyOnPromptAndOutput) {
  // Token 0: 2.0 -> 2.0 / 2 = 1.0 (in the prompt); token 2: 1.5 (unseen) wins.
  const std::vector<float> l = {2.0f, -3.0f, 1.5f, -0.5f};
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0;
  const std::vector<int32_t> prompt = {0};
  Sampler s(p, 0, 4, kEos, prompt);
  EXPECT_EQ(s.sample(l.data()), 2);
  s.accept(2);  // now 2: 1.5 / 2 = 0.75 < 1.0 -> token 0
  EXPECT_EQ(s.sample(l.data()), 0);
  // Negative logits are multiplied: -0.5 * 0.5 = -0.25 beats -0.3 when the penalty is 0.5.
  const std::vector<float> n = {-0.3f, -9.0f, -9.0f, -0.5f};
  SamplingParams q = greedy();
  q.repetition_penalty = 0.5;
  const std::vector<int32_t> prompt3 = {3};
  Sampler s3(q, 0, 4, kEos, prompt3);
  EXPECT_EQ(s3.sample(n.data()), 3);
}

TEST(Sampler, FrequencyAndPresencePenalties) {
  const std::vector<float> l = {3.0f, -9.0f, 2.0f, 1.2f};
  SamplingParams p = greedy();
  p.frequency_penalty = 0.6;
  Sampler s(p, 0, 4, kEos, {});
  s.accept(0);  // 3.0 - 0.6 = 2.4 > 2.0
  EXPECT_EQ(s.sample(l.data()), 0);
  s.accept(0);  // 3.0 - 1.2 = 1.8 < 2.0
  EXPECT_EQ(s.sample(l.data()), 2);
  SamplingParams q = greedy();
  q.presence_penalty = 0.9;
  Sampler t(q, 0, 4, kEos, {});
  t.accept(2);
  t.accept(2);  // presence counts once: 2.0 - 0.9 = 1.1 < 1.2
  t.accept(0);  // 3.0 - 0.9 = 2.1
  EXPECT_EQ(t.sample(l.data()), 0);
  const std::vector<float> m = {1.0f, -9.0f, 2.0f, 1.2f};
  EXPECT_EQ(t.sample(m.data()), 3);  // 0: 0.1, 2: 1.1, 3: 1.2
}

TEST(Sampler, TopKOneIsArgmax) {
  const std::vector<float> l = {0.1f, 0.3f, 0.2f, 0.25f};
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 1;
  const auto h = histogram(p, l, 200);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 1);
}

TEST(Sampler, TopPAndMinPKeepTheRightSets) {
  // p = 0.5, 0.3, 0.15, 0.05 at T = 1.
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p;
  p.top_p = 0.5;  // the first token alone reaches 0.5
  auto h = histogram(p, l, 300);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 0);
  p.top_p = 0.7;  // 0.5 + 0.3
  h = histogram(p, l, 4000);
  ASSERT_EQ(h.size(), 2u);
  // Kept tokens renormalized: 0.625 / 0.375; 4000 draws, sd ~ 31.
  EXPECT_NEAR(h[0], 2500, 160);
  p.top_p = 1.0;
  p.min_p = 0.25;  // keep p >= 0.125: tokens 0, 1, 2
  h = histogram(p, l, 4000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
  p.min_p = 0.0;
  p.top_k = 2;  // with top_k the same sets come out of the sorted path
  h = histogram(p, l, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
}

TEST(Sampler, TopPOverLargeVocabularyExpandsTheSortedPrefix) {
  // 1000 tokens with equal logits: top_p 0.5 keeps exactly the 500 lowest ids (ties by id).
  const std::vector<float> l(1000, 0.25f);
  SamplingParams p;
  p.top_p = 0.5;
  const auto h = histogram(p, l, 3000);
  for (const auto& [id, n] : h) EXPECT_LT(id, 500);
  EXPECT_GT(h.size(), 400u);
}

TEST(Sampler, TemperatureMatchesSoftmaxStatistically) {
  // T = 0.5 on logits {0, ln 2, ln 3}: p ~ {1, 4, 9} / 14.
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f)};
  SamplingParams p;
  p.temperature = 0.5;
  const int n = 20000;
  const auto h = histogram(p, l, n, 12345);
  const double want[3] = {1.0 / 14, 4.0 / 14, 9.0 / 14};
  double chi2 = 0;
  for (int i = 0; i < 3; ++i) {
    const double e = want[i] * n;
    const double o = h.count(i) ? h.at(i) : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  EXPECT_LT(chi2, 13.8);  // chi-square, 2 degrees of freedom, p = 0.001
}

TEST(Sampler, SeedReproducibility) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)) * 2);
  SamplingParams p;
  p.temperature = 1.3;
  std::vector<int32_t> a, b, c;
  Sampler sa(p, 42, 50, kEos, {}), sb(p, 42, 50, kEos, {}), sc(p, 43, 50, kEos, {});
  for (int i = 0; i < 64; ++i) {
    a.push_back(sa.sample(l.data()));
    b.push_back(sb.sample(l.data()));
    c.push_back(sc.sample(l.data()));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfRawLogits) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  std::vector<LogprobEntry> best;
  const float lp = token_logprob(l.data(), 4, 2, 3, &best);
  EXPECT_NEAR(lp, 2.0 - lse, 1e-6);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0].token_id, 1);  // tie between 1 and 3: lower id first
  EXPECT_EQ(best[1].token_id, 3);
  EXPECT_EQ(best[2].token_id, 2);
  EXPECT_NEAR(best[0].logprob, 3.0 - lse, 1e-6);
}

TEST(Sampler, AllFinite) {
  std::vector<float> l = {1.0f, 2.0f, -3.0f};
  EXPECT_TRUE(all_finite(l.data(), 3));
  l[1] = std::nanf("");
  EXPECT_FALSE(all_finite(l.data(), 3));
  l[1] = INFINITY;
  EXPECT_FALSE(all_finite(l.data(), 3));
}

TEST(Sampler, Validation) {
  std::string param;
  SamplingParams p;
  EXPECT_EQ(validate_sampling(p, 10, &param), "");
  p.top_p = 0;
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "top_p");
  p = SamplingParams{};
  p.temperature = NAN;
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "temperature");
  p = SamplingParams{};
  p.logit_bias = {{10, 1.0}};
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "logit_bias");
  p = SamplingParams{};
  p.max_tokens = 0;
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "max_tokens");
  p = SamplingParams{};
  p.stop_token_ids = {-1};
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "stop_token_ids");
  p = SamplingParams{};
  p.repetition_penalty = 0;
  EXPECT_NE(validate_sampling(p, 10, &param), "");
  EXPECT_EQ(param, "repetition_penalty");
}

}  // namespace
}  // namespace ds::sched
