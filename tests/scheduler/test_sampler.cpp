// Sampler: every parameter on hand-built logits with hand-computed expectations, seed
// reproducibility, a statistical check of temperature sampling, logprobs and range validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/sampling.h"
#include "scheduler/fast_exp.h"
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

// ---- At DeepSeek-V4's vocabulary, against plain definitions (one sorted pass, no shortcuts) ----

constexpr int64_t kBigVocab = 129280;

// Language-model-like logits: most small, a heavy upper tail; `ties` copies of the maximum at
// random places when > 0.
std::vector<float> big_logits(uint64_t seed, int ties = 0) {
  Rng rng(seed);
  std::vector<float> l(static_cast<size_t>(kBigVocab));
  for (float& v : l) {
    const float n = rng.normal();
    v = 2.0f * n + (n > 2.5f ? 6.0f * (n - 2.5f) : 0.0f);
  }
  if (ties > 0) {
    const float mx = *std::max_element(l.begin(), l.end());
    for (int i = 0; i < ties; ++i) l[size_t(rng.below(uint64_t(kBigVocab)))] = mx;
  }
  return l;
}

int32_t naive_argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (size_t i = 1; i < l.size(); ++i) {
    if (l[i] > l[size_t(best)]) best = int32_t(i);
  }
  return best;
}

TEST(Sampler, GreedyAtFullVocabularyIsTheFirstMaximum) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::vector<float> l = big_logits(seed, int(seed % 3) * 4);
    if (seed == 5) l.back() = 1000.0f;  // the maximum in the tail past the vector lanes
    if (seed == 6) l.front() = 1000.0f;
    Sampler plain(greedy(), 0, kBigVocab, kEos, {});
    EXPECT_EQ(plain.sample(l.data()), naive_argmax(l)) << "seed " << seed;
    // With an adjustment (a bias that makes a low token the maximum): the adjusted argmax.
    SamplingParams p = greedy();
    const int32_t low = int32_t(seed * 1000);
    p.logit_bias[low] = 100.0;
    std::vector<float> adjusted = l;
    adjusted[size_t(low)] = float(double(adjusted[size_t(low)]) + 100.0);
    Sampler biased(p, 0, kBigVocab, kEos, {});
    EXPECT_EQ(biased.sample(l.data()), naive_argmax(adjusted)) << "seed " << seed;
  }
}

// distribution() against the documented rule computed over a full sort: softmax of w / T (with
// the sampler's single-precision exp, whose accuracy FastExp below bounds), the top-k prefix, the
// smallest prefix whose mass reaches top_p of the kept mass, then p >= min_p x p_max,
// renormalized. Supports must agree exactly; values to 1e-9 relative (summation orders differ).
TEST(Sampler, DistributionAtFullVocabularyMatchesTheDefinition) {
  struct Combo {
    double temperature, top_p;
    int64_t top_k;
    double min_p;
  };
  const std::vector<Combo> combos = {{1.0, 1.0, 0, 0.0},  {0.7, 0.9, 0, 0.0},  {1.0, 0.95, 50, 0.0},
                                     {1.3, 1.0, 40, 0.0}, {1.0, 1.0, 0, 0.05}, {0.8, 0.9, 0, 0.02},
                                     {1.0, 0.5, 200, 0.1}};
  // Logits: random (big_logits), widely spaced (the best few spread over tens of units, so the
  // sampler's candidate threshold widens several times), flat with ties, with masked (-inf)
  // tokens between the others, and 13 maxima at 0 with 128 ties at -4 (exactly the sampler's
  // first candidate threshold, mx - 4) that the top 50 and 200 need.
  auto make_logits = [](int kind, uint64_t seed) {
    std::vector<float> l = big_logits(seed, kind == 0 ? 0 : 4);
    for (size_t i = 0; i < l.size(); ++i) {
      if (kind == 1) l[i] = -float((i * 7919) % kBigVocab) * 0.37f;
      if (kind == 2) l[i] = float(int(l[i]) % 3);
      if (kind == 3 && i % 3 == 1) l[i] = -std::numeric_limits<float>::infinity();
      if (kind == 4) l[i] = i % 9973 == 0 ? 0.0f : i % 1013 == 0 ? -4.0f : -10.0f;
    }
    return l;
  };
  uint64_t seed = 40;
  for (int kind = 0; kind < 5; ++kind)
    for (const Combo& c : combos) {
      SCOPED_TRACE("logits kind " + std::to_string(kind));
      const std::vector<float> l = make_logits(kind, ++seed);
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.top_k = c.top_k;
      p.min_p = c.min_p;
      Sampler s(p, 1, kBigVocab, kEos, {});
      std::vector<double> got;
      s.distribution(l.data(), &got);
      ASSERT_EQ(int64_t(got.size()), kBigVocab);
      // Reference.
      const float mx = *std::max_element(l.begin(), l.end());
      std::vector<double> e(l.size());
      for (size_t i = 0; i < l.size(); ++i) {
        e[i] = double(ds::sched::exp_nonpositive((l[i] - mx) * float(1.0 / c.temperature)));
      }
      std::vector<int32_t> order(l.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return l[size_t(a)] != l[size_t(b)] ? l[size_t(a)] > l[size_t(b)] : a < b;
      });
      size_t keep = c.top_k > 0 ? size_t(c.top_k) : order.size();
      if (c.top_p < 1.0) {
        double kept = 0, mass = 0;
        for (size_t i = 0; i < keep; ++i) kept += e[size_t(order[i])];
        size_t n = 0;
        while (n < keep && mass < c.top_p * kept) mass += e[size_t(order[n++])];
        keep = std::max<size_t>(1, n);
      }
      if (c.min_p > 0) {
        size_t n = 1;
        while (n < keep && e[size_t(order[n])] >= c.min_p * e[size_t(order[0])]) ++n;
        keep = n;
      }
      double total = 0;
      for (size_t i = 0; i < keep; ++i) total += e[size_t(order[i])];
      std::vector<double> want(l.size(), 0.0);
      for (size_t i = 0; i < keep; ++i) want[size_t(order[i])] = e[size_t(order[i])] / total;
      int64_t support = 0;
      double sum = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        ASSERT_EQ(got[i] > 0, want[i] > 0) << "token " << i << " top_p " << c.top_p;
        if (want[i] > 0) {
          EXPECT_NEAR(got[i], want[i], 1e-9 * want[i]) << "token " << i;
        }
        support += got[i] > 0;
        sum += got[i];
      }
      // Kept tokens whose exp underflows to 0 (widely spaced logits) have no mass either way.
      EXPECT_EQ(support, std::count_if(want.begin(), want.end(), [](double v) { return v > 0; }));
      EXPECT_NEAR(sum, 1.0, 1e-9);
    }
}

TEST(Sampler, LogprobsAtFullVocabularyMatchTheDefinition) {
  std::vector<float> l = big_logits(77, 5);  // five extra copies of the maximum: ties
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float v : l) sum += std::exp(double(v) - double(mx));
  const double lse = double(mx) + std::log(sum);
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return l[size_t(a)] != l[size_t(b)] ? l[size_t(a)] > l[size_t(b)] : a < b;
  });
  std::vector<LogprobEntry> best;
  const float lp = token_logprob(l.data(), kBigVocab, 12345, 20, &best);
  EXPECT_NEAR(lp, double(l[12345]) - lse, 2e-6);
  ASSERT_EQ(best.size(), 20u);
  for (size_t i = 0; i < best.size(); ++i) {
    EXPECT_EQ(best[i].token_id, ids[i]) << "rank " << i;
    EXPECT_NEAR(best[i].logprob, double(l[size_t(ids[i])]) - lse, 2e-6);
  }
}

TEST(Sampler, AllFiniteFindsEveryNonFiniteValueAnywhere) {
  std::vector<float> l = big_logits(9);
  l[3] = std::numeric_limits<float>::max();
  l[4] = -std::numeric_limits<float>::max();
  l[5] = std::numeric_limits<float>::denorm_min();
  l[6] = -0.0f;
  EXPECT_TRUE(all_finite(l.data(), kBigVocab));
  for (size_t at : {size_t(0), size_t(17), size_t(kBigVocab / 2), size_t(kBigVocab - 1)}) {
    for (float bad : {std::nanf(""), -std::nanf(""), INFINITY, -INFINITY}) {
      std::vector<float> m = l;
      m[at] = bad;
      EXPECT_FALSE(all_finite(m.data(), kBigVocab)) << "at " << at << " value " << bad;
    }
  }
}

// sample_finite == all_finite, then sample: for greedy requests (its one-pass form, the maximum
// anywhere, ties, ulp-close extremes) and for an adjusted and a temperature request (its two-step
// form, the same draws as a twin sampler with the same seed); a NaN or infinity anywhere returns
// false, leaves the token alone and draws nothing (the next draw equals the twin's).
TEST(Sampler, SampleFiniteIsAllFiniteThenSample) {
  SamplingParams biased = greedy();
  biased.logit_bias[7] = 50.0;
  SamplingParams hot;
  hot.temperature = 0.8;
  hot.top_p = 0.9;
  for (const SamplingParams& p : {greedy(), biased, hot}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      std::vector<float> l = big_logits(seed, int(seed % 3) * 4);
      if (seed == 2) l.back() = 1000.0f;                 // the maximum in the tail
      if (seed == 3) l[11] = l[kBigVocab - 5] = 999.0f;  // a tie: the lower id
      if (seed == 4) l[12] = std::numeric_limits<float>::max();
      Sampler fused(p, seed, kBigVocab, kEos, {});
      Sampler twin(p, seed, kBigVocab, kEos, {});
      int32_t token = -5;
      ASSERT_TRUE(fused.sample_finite(l.data(), &token));
      EXPECT_EQ(token, twin.sample(l.data())) << "seed " << seed << " t " << p.temperature;
      if (p.temperature <= 0 && p.logit_bias.empty()) {
        EXPECT_EQ(token, naive_argmax(l)) << "seed " << seed;
      }
      for (size_t at : {size_t(0), size_t(kBigVocab / 3), size_t(kBigVocab - 1)}) {
        for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
          std::vector<float> m = l;
          m[at] = bad;
          int32_t untouched = -5;
          EXPECT_FALSE(fused.sample_finite(m.data(), &untouched)) << "at " << at;
          EXPECT_EQ(untouched, -5);
        }
      }
      int32_t again = -5;
      ASSERT_TRUE(fused.sample_finite(l.data(), &again));
      EXPECT_EQ(again, twin.sample(l.data())) << "a refused row drew nothing";
    }
  }
}

// The sampler's exp (fast_exp.h) against the exact value: under 2e-7 relative on [-87, 0] (a
// dense sweep and random points, each lane of a block and the one-value form alike), exactly 1
// at 0, exactly 0 at -inf and below -87, and the vocabulary helpers equal to the per-value form.
TEST(FastExp, WithinItsBoundAndExactAtTheEnds) {
  double worst = 0;
  auto check = [&](float x) {
    const double want = std::exp(double(x));
    const double got = double(ds::sched::exp_nonpositive(x));
    worst = std::max(worst, std::fabs(got - want) / want);
  };
  for (float x = -87.0f; x <= 0.0f; x += 3.1e-4f) check(x);
  ds::Rng rng(5);
  for (int i = 0; i < 200000; ++i) check(-87.0f * float(rng.uniform()));
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(ds::sched::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(ds::sched::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(ds::sched::exp_nonpositive(-87.5f), 0.0f);
  EXPECT_EQ(ds::sched::exp_nonpositive(-1000.0f), 0.0f);
  EXPECT_GT(ds::sched::exp_nonpositive(-87.0f), 0.0f);
  // Lanes of a block are the one-value form; the helpers cover a ragged tail.
  const int64_t n = 4099;
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = float(rng.uniform() * 40.0 - 30.0);
  w[17] = -std::numeric_limits<float>::infinity();
  const float mx = *std::max_element(w.begin(), w.end());
  std::vector<double> out(static_cast<size_t>(n), -1.0);
  ds::sched::exp_shifted(w.data(), n, mx, 0.5f, out.data());
  double sum = 0;
  std::vector<double> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = (w[size_t(i)] - mx) * 0.5f;
    ASSERT_EQ(out[size_t(i)], double(ds::sched::exp_nonpositive(x))) << i;
    e[size_t(i)] = double(ds::sched::exp_nonpositive(w[size_t(i)] - mx));
    sum += e[size_t(i)];
  }
  EXPECT_EQ(out[17], 0.0);
  // The lane sums add the same values in another fixed order: equal to the serial sum within
  // double rounding (n terms: under n * 2^-53 relative), and sum_exp_shifted bit for bit to its
  // documented order.
  EXPECT_NEAR(ds::sched::sum_exp_shifted(w.data(), n, mx), sum, 1e-12 * sum);
  EXPECT_NEAR(ds::sched::sum_lanes(e.data(), n), sum, 1e-12 * sum);
  const int64_t blocks = n / 4 * 4;  // value i into lane i % 4, lanes pairwise, then the tail
  double by_lane[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < blocks; ++i) by_lane[i % 4] += e[size_t(i)];
  double want = (by_lane[0] + by_lane[1]) + (by_lane[2] + by_lane[3]);
  for (int64_t i = blocks; i < n; ++i) want += e[size_t(i)];
  EXPECT_EQ(ds::sched::sum_exp_shifted(w.data(), n, mx), want);
  for (int64_t m : {int64_t(0), int64_t(5), int64_t(8), int64_t(13)}) {
    double serial = 0;
    for (int64_t i = 0; i < m; ++i) serial += e[size_t(i)];
    EXPECT_NEAR(ds::sched::sum_lanes(e.data(), m), serial, 1e-15 * serial) << m;
  }
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

// ---- Backend sampling (kernels/cpu/sampling.h): the reference the CUDA kernel follows ----

TEST(BackendSampling, ExpWithinItsBoundAndExactAtZero) {
  EXPECT_EQ(cpu::sampling_exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::sampling_exp(-28.5f), 0.0f);
  EXPECT_EQ(cpu::sampling_mass_of(1.0f), uint64_t{1} << 40);
  double worst = 0;
  for (int i = 0; i <= 280000; ++i) {
    const float x = -28.0f * float(i) / 280000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(cpu::sampling_exp(x)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // about 2 fp32 ulps
}

TEST(BackendSampling, KeysOrderValuesDescending) {
  const std::vector<float> v = {-1e30f, -3.5f, -1.0f, -1e-30f, 0.0f, 1e-30f, 0.25f, 7.0f, 1e30f};
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    EXPECT_GT(cpu::sampling_key(v[i]), cpu::sampling_key(v[i + 1])) << v[i];
  }
  EXPECT_EQ(cpu::sampling_key(-0.0f), cpu::sampling_key(0.0f));
  for (float x : v) EXPECT_EQ(cpu::sampling_key_value(cpu::sampling_key(x)), x) << x;
}

// The distribution of cpu::sample_row over the draws is the host sampler's
// (Sampler::distribution): the tokens of 40000 evenly spaced draws, counted per token, against the
// host's probabilities, for temperatures, top-k, top-p, min-p and their combinations, on random
// logits, logits with ties and a peaked row. Each token's draws form one interval of [0, 1) (a
// cumulative sum in a fixed order), so the count is off by at most 2 draws, plus the masses'
// truncation (2^-40 each) and the exp's 2 ulps.
TEST(BackendSampling, DrawsFollowTheHostSamplersDistribution) {
  struct Combo {
    double temperature, top_p;
    int64_t top_k;
    double min_p;
  };
  const std::vector<Combo> combos = {{1.0, 1.0, 0, 0.0},  {0.7, 0.9, 0, 0.0},    {1.3, 1.0, 5, 0.0},
                                     {1.0, 1.0, 0, 0.1},  {0.8, 0.8, 10, 0.05},  {2.0, 0.6, 0, 0.0},
                                     {0.5, 1.0, 39, 0.0}, {1.0, 0.95, 1000, 0.0}};
  constexpr int kVocab = 40, kDraws = 40000;
  ds::Rng rng(77);
  for (int kind = 0; kind < 3; ++kind) {
    for (const Combo& c : combos) {
      SCOPED_TRACE("kind " + std::to_string(kind) + " T " + std::to_string(c.temperature) +
                   " top_p " + std::to_string(c.top_p) + " top_k " + std::to_string(c.top_k) +
                   " min_p " + std::to_string(c.min_p));
      std::vector<float> l(kVocab);
      for (int i = 0; i < kVocab; ++i) {
        const float g = rng.normal();
        l[size_t(i)] = kind == 0 ? 2.0f * g : kind == 1 ? float(int(2.0f * g)) : 6.0f * g;
      }
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.top_k = c.top_k;
      p.min_p = c.min_p;
      Sampler host(p, 1, kVocab, kEos, {});
      std::vector<double> want;
      host.distribution(l.data(), &want);
      std::vector<int> count(kVocab, 0);
      cpu::RowSampling rs{c.temperature, c.top_k, c.top_p, c.min_p, 0.0};
      for (int d = 0; d < kDraws; ++d) {
        rs.uniform = (d + 0.5) / kDraws;
        int32_t token = -1;
        ASSERT_TRUE(cpu::sample_row(l.data(), kVocab, rs, &token));
        ASSERT_GE(token, 0);
        ASSERT_LT(token, kVocab);
        ++count[size_t(token)];
      }
      for (int i = 0; i < kVocab; ++i) {
        EXPECT_NEAR(double(count[size_t(i)]) / kDraws, want[size_t(i)], 2.0 / kDraws + 1e-6)
            << "token " << i;
      }
    }
  }
}

TEST(BackendSampling, GreedyTopKOneEdgesAndNonFiniteRows) {
  const std::vector<float> l = {0.5f, 2.0f, 3.0f, 3.0f, -1.0f};
  int32_t t = -1;
  ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{0.0, 0, 1.0, 0.0, 0.7}, &t));
  EXPECT_EQ(t, 2);  // the argmax, ties to the lowest id
  for (double u : {0.0, 0.3, 0.999999999}) {
    ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{1.0, 1, 1.0, 0.0, u}, &t));
    EXPECT_EQ(t, 2);  // top-k 1: the first of the tied maxima
    // Plain draws in id order: the first draw is the first token, the last the last one.
    ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{1.0, 0, 1.0, 0.0, u}, &t));
    if (u == 0.0) EXPECT_EQ(t, 0);
    if (u > 0.99) EXPECT_EQ(t, 4);
    // Truncated draws in descending order: the first draw is the first maximum.
    ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{1.0, 3, 1.0, 0.0, u}, &t));
    if (u == 0.0) EXPECT_EQ(t, 2);
    if (u > 0.99) EXPECT_EQ(t, 1);  // the third of 3.0, 3.0, 2.0
  }
  // top-p so small that only the first maximum is kept; min-p 1 keeps the tied maxima.
  ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{1.0, 0, 1e-9, 0.0, 0.9}, &t));
  EXPECT_EQ(t, 2);
  ASSERT_TRUE(cpu::sample_row(l.data(), 5, cpu::RowSampling{1.0, 0, 1.0, 1.0, 0.9}, &t));
  EXPECT_EQ(t, 3);
  std::vector<float> bad = l;
  bad[4] = std::numeric_limits<float>::quiet_NaN();
  t = 17;
  EXPECT_FALSE(cpu::sample_row(bad.data(), 5, cpu::RowSampling{1.0, 0, 1.0, 0.0, 0.5}, &t));
  EXPECT_EQ(t, 17);
  bad[4] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(cpu::sample_row(bad.data(), 5, cpu::RowSampling{0.0, 0, 1.0, 0.0, 0.5}, &t));
}

// Sampler::backend_draw takes the same generator draw sample() would: a sampler that drew
// through the backend stays in step with one that sampled on the host.
TEST(BackendSampling, BackendDrawConsumesTheHostSamplersDraw) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.8;
  p.top_k = 12;
  p.min_p = 0.01;
  Sampler a(p, 99, 50, kEos, {}), b(p, 99, 50, kEos, {});
  EXPECT_TRUE(a.raw_draw());
  ds::Rng same(99);
  for (int i = 0; i < 5; ++i) {
    const cpu::RowSampling d = a.backend_draw();
    EXPECT_EQ(d.temperature, 0.9);
    EXPECT_EQ(d.top_p, 0.8);
    EXPECT_EQ(d.top_k, 12);
    EXPECT_EQ(d.min_p, 0.01);
    EXPECT_EQ(d.uniform, same.uniform());
  }
  p.presence_penalty = 0.5;
  Sampler c(p, 1, 50, kEos, {});
  EXPECT_TRUE(c.raw_draw());  // no output yet: nothing to penalize
  c.accept(3);
  EXPECT_FALSE(c.raw_draw());
  EXPECT_FALSE(Sampler(greedy(), 1, 50, kEos, {}).raw_draw());
  (void)b;
}

}  // namespace
}  // namespace ds::sched
