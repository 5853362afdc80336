// Speculative decoding in src/scheduler (docs/speculative.md): the rejection rule of
// Sampler::verify preserves the target distribution (chi-square over many fixed-seed trials on a
// small vocabulary with mocked logits, for one token and for a two-token chain with a bonus
// token), greedy verification is exact match, the scheduler schedules verify chunks and commits
// only the real token, and the adaptive policy follows the measured tokens/s.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>

#include "core/rng.h"
#include "model/config.h"
#include "scheduler/sampler.h"
#include "scheduler/scheduler.h"
#include "scheduler/speculative.h"

namespace ds::sched {
namespace {

constexpr int64_t kV = 6;

int32_t draw(const std::vector<double>& q, Rng* rng) {
  double u = rng->uniform();
  for (size_t i = 0; i < q.size(); ++i) {
    u -= q[i];
    if (u < 0) return int32_t(i);
  }
  return int32_t(q.size() - 1);
}

// Pearson chi-square of counts against probabilities (cells with p = 0 must be empty).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = p[i] * double(n);
    x2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return x2;
}

deepserve::SamplingParams params(double t, int64_t top_k = 0, double top_p = 1.0) {
  deepserve::SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

// Draft distributions far from the target (and with zeros where the target has mass) still give
// exactly the target's distribution. Thresholds: chi-square with <= 5 degrees of freedom exceeds
// 30 with probability < 2e-5; the seeds are fixed, so the test is deterministic.
TEST(SpeculativeSampling, RejectionRulePreservesTheTargetDistribution) {
  const float target[kV] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f};
  const float draft[kV] = {-1.0f, 2.5f, 0.5f, -2.0f, 0.0f, 1.0f};
  struct Case {
    deepserve::SamplingParams target, draft;
  };
  const Case cases[] = {{params(0.8), params(1.3)},
                        {params(1.0, 4), params(0.7, 2)},
                        {params(1.2, 0, 0.8), params(1.0)}};
  for (const Case& c : cases) {
    Sampler s(c.target, 11, kV, -1, {});
    Sampler d(c.draft, 12, kV, -1, {});
    std::vector<double> p, q;
    s.distribution(target, &p);
    d.distribution(draft, &q);
    Rng rng(13);
    const int64_t n = 200000;
    std::vector<int64_t> counts(kV, 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t x = draw(q, &rng);
      bool acc = false;
      const int32_t t = s.verify(target, x, q, &acc);
      if (acc) {
        ++accepted;
        EXPECT_EQ(t, x);
      }
      ++counts[size_t(t)];
    }
    EXPECT_LT(chi_square(counts, p, n), 30.0);
    // Acceptance probability is sum_x min(p, q).
    double expect_acc = 0;
    for (int64_t i = 0; i < kV; ++i) expect_acc += std::min(p[size_t(i)], q[size_t(i)]);
    EXPECT_NEAR(double(accepted) / double(n), expect_acc, 0.01);
  }
}

// A point-mass draft (greedy drafter or a replaced draft) against a sampled target.
TEST(SpeculativeSampling, PointMassDraftPreservesTheTargetDistribution) {
  const float target[kV] = {0.3f, 1.0f, -0.2f, 0.8f, -1.0f, 0.1f};
  Sampler s(params(1.0), 21, kV, -1, {});
  std::vector<double> p;
  s.distribution(target, &p);
  const int64_t n = 200000;
  std::vector<int64_t> counts(kV, 0);
  const std::vector<double> point;
  for (int64_t i = 0; i < n; ++i) {
    bool acc = false;
    ++counts[size_t(s.verify(target, 3, point, &acc))];
  }
  EXPECT_LT(chi_square(counts, p, n), 30.0);
}

// Two tokens as the engine produces them: d1 ~ q1, d2 ~ q2(.|d1); verify row 0 with d1; if
// accepted verify row 1 (target given d1) with d2, and if that is accepted too, the bonus row is
// not needed for this pair; a rejection at row 0 ends the step and the next token is sampled
// plainly at the next step. The joint (t1, t2) must be p1(t1) p2(t2 | t1). 36 cells: chi-square
// with 35 degrees of freedom exceeds 80 with probability < 1e-5.
TEST(SpeculativeSampling, ChainedDraftsPreserveTheJointDistribution) {
  auto target2 = [](int32_t t1, float* out) {
    for (int64_t i = 0; i < kV; ++i) out[i] = float(std::sin(1.7 * double(t1 + 1) * double(i + 1)));
  };
  auto draft2 = [](int32_t d1, float* out) {
    for (int64_t i = 0; i < kV; ++i) out[i] = float(std::cos(0.9 * double(d1 + 2) * double(i)));
  };
  const float target1[kV] = {0.5f, -0.1f, 1.2f, 0.0f, -0.7f, 0.9f};
  const float draft1[kV] = {1.5f, 0.1f, -1.2f, 0.3f, 0.4f, -0.9f};
  Sampler s(params(0.9), 31, kV, -1, {});
  Sampler d(params(1.1), 32, kV, -1, {});
  std::vector<double> p1;
  s.distribution(target1, &p1);
  std::vector<double> joint(size_t(kV * kV));
  for (int32_t a = 0; a < kV; ++a) {
    float l[kV];
    target2(a, l);
    std::vector<double> p2;
    s.distribution(l, &p2);
    for (int32_t b = 0; b < kV; ++b) joint[size_t(a * kV + b)] = p1[size_t(a)] * p2[size_t(b)];
  }
  Rng rng(33);
  const int64_t n = 200000;
  std::vector<int64_t> counts(size_t(kV * kV), 0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> q1, q2;
    d.distribution(draft1, &q1);
    const int32_t d1 = draw(q1, &rng);
    float dl[kV];
    draft2(d1, dl);
    d.distribution(dl, &q2);
    const int32_t d2 = draw(q2, &rng);
    bool acc = false;
    const int32_t t1 = s.verify(target1, d1, q1, &acc);
    float tl[kV];
    target2(t1, tl);
    int32_t t2;
    if (acc) {
      t2 = s.verify(tl, d2, q2, &acc);  // row 1 judges d2 (the bonus would follow it)
    } else {
      t2 = s.sample(tl);  // the next step, without a draft
    }
    ++counts[size_t(t1 * kV + t2)];
  }
  EXPECT_LT(chi_square(counts, joint, n), 80.0);
}

TEST(SpeculativeSampling, GreedyVerifyIsExactMatch) {
  const float logits[kV] = {0.1f, 0.9f, 0.9f, -1.0f, 0.2f, 0.0f};
  Sampler s(params(0), 1, kV, -1, {});
  bool acc = false;
  EXPECT_EQ(s.verify(logits, 1, {}, &acc), 1);  // ties go to the lower id, as in sample()
  EXPECT_TRUE(acc);
  EXPECT_EQ(s.verify(logits, 2, {}, &acc), 1);
  EXPECT_FALSE(acc);
  std::vector<double> q;
  EXPECT_EQ(s.propose(logits, &q), 1);
  EXPECT_TRUE(q.empty());
}

TEST(SpeculativeScheduler, VerifyChunkCommitsOnlyTheRealToken) {
  runtime::KvCacheManager kv(runtime::KvGeometry::from_config(tiny_config()), {100, 100, 100}, 8);
  Scheduler s({8, 256}, &kv);
  auto seq = std::make_unique<SchedSeq>();
  seq->id = 1;
  seq->tokens = {5, 6, 7};
  seq->num_prompt = 3;
  s.add(seq.get());
  StepPlan p = s.schedule();
  s.commit(p);
  seq->tokens.push_back(9);
  seq->draft = {10, 11, 12};
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].count, 4);
  EXPECT_EQ(p.chunks[0].num_draft, 3);
  EXPECT_TRUE(p.chunks[0].samples);
  s.commit(p);
  EXPECT_EQ(seq->num_computed, 4);
  // A short budget trims the draft.
  Scheduler small({8, 2}, &kv);
  auto b = std::make_unique<SchedSeq>();
  b->id = 2;
  b->tokens = {5};
  b->num_prompt = 1;
  small.add(b.get());
  small.commit(small.schedule());
  b->tokens.push_back(3);
  b->draft = {1, 2, 3};
  p = small.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].count, 2);
  EXPECT_EQ(p.chunks[0].num_draft, 1);
  s.remove(seq.get());
  small.remove(b.get());
}

TEST(SpecPolicy, FollowsTheMeasuredTokensPerSecond) {
  // Speculation that does not pay (k = 0 fastest) is turned off; one that pays keeps its k.
  for (int64_t best : {0, 2}) {
    SpecPolicy policy(3, true);
    int64_t chosen_best = 0, chosen = 0;
    for (int step = 0; step < 400; ++step) {
      const int64_t k = policy.choose(16);
      const double tps = k == best ? 100.0 : 60.0 - 5.0 * double(k);
      policy.record(16, k, 16, 16.0 / tps);
      if (step >= 50) {
        ++chosen;
        if (k == best) ++chosen_best;
      }
    }
    EXPECT_GT(double(chosen_best) / double(chosen), 0.85) << "best k " << best;
    EXPECT_NEAR(policy.goodput(16, best), 100.0, 1e-9);
  }
  SpecPolicy fixed(3, false);
  EXPECT_EQ(fixed.choose(64), 3);
  EXPECT_EQ(SpecPolicy::bucket(1), 0);
  EXPECT_EQ(SpecPolicy::bucket(3), 1);
  EXPECT_EQ(SpecPolicy::bucket(64), 6);
  EXPECT_EQ(SpecPolicy::bucket(1000), 7);
}

}  // namespace
}  // namespace ds::sched
