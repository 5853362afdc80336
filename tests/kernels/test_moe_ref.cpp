// MoE references (dsv4-model.md §8): sqrt-softplus, routing (bias for selection only, hash
// routing, renormalization, epsilon, routed scaling), the SwiGLU clamp, the shared-expert clamp
// option, and the whole layer against a per-token composition, at hand-computed, tiny (§14) and
// DeepSeek-V4-Flash expert shapes.
//
// Tolerances: hand cases 1e-6 (a few fp32 operations on O(1) values); whole-layer vs the
// per-token composition exact (moe_forward runs the same fp32 operations in the same order);
// the Flash-sized expert vs double 8 sqrt(K) 2^-24 sum|terms| per linear (random-walk bound, see
// test_linear_ref.cpp) propagated through silu*b (1e-6 relative slack per element).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"

namespace ds::cpu {
namespace {

TEST(SqrtSoftplus, Values) {
  EXPECT_NEAR(sqrt_softplus(0.0f), std::sqrt(std::log(2.0)), 1e-7);
  EXPECT_NEAR(sqrt_softplus(1.5f), std::sqrt(std::log1p(std::exp(1.5))), 1e-7);
  EXPECT_EQ(sqrt_softplus(25.0f), 5.0f);  // torch softplus threshold 20: identity above
  EXPECT_NEAR(sqrt_softplus(-30.0f), std::sqrt(std::log1p(std::exp(-30.0))), 1e-12);
}

// Logits whose sqrt-softplus scores are exactly `scores` (inverse of sqrt(softplus)).
std::vector<float> logits_for_scores(const std::vector<double>& scores) {
  std::vector<float> l;
  for (double s : scores) l.push_back(float(std::log(std::expm1(s * s))));
  return l;
}

TEST(RouteToken, BiasSelectsButWeightsUseScoresOnly) {
  // Scores ~ (1.0, 0.9, 0.8, 0.3); bias (0, 0, 0, 1) moves expert 3 into the top 2 (1.3 > 0.9),
  // but its weight uses its score 0.3: w = (s0, s3) / (s0 + s3) * 1.5.
  RouterConfig config{4, 2, 1.5f, 0.0f};
  const std::vector<float> logits = logits_for_scores({1.0, 0.9, 0.8, 0.3});
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 1.0f};
  std::vector<int32_t> idx(2);
  std::vector<float> w(2);
  route_token(config, logits.data(), bias.data(), nullptr, idx.data(), w.data());
  std::vector<int32_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 3}));
  for (int i = 0; i < 2; ++i) {
    const double s = idx[i] == 0 ? 1.0 : 0.3;
    EXPECT_NEAR(w[i], s / 1.3 * 1.5, 1e-6);
  }
  // Without the bias the top 2 are experts 0 and 1.
  route_token(config, logits.data(), nullptr, nullptr, idx.data(), w.data());
  std::sort(idx.begin(), idx.end());
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1}));
}

TEST(RouteToken, HashRowAndEpsilon) {
  // Hash layers take the experts from the tid2eid row, whatever the scores; weights are the
  // renormalized scores. An (exaggerated) epsilon joins the denominator.
  RouterConfig config{4, 2, 1.5f, 0.0f};
  const std::vector<float> logits = logits_for_scores({1.0, 0.9, 0.8, 0.2});
  const std::vector<int32_t> row = {3, 2};
  std::vector<int32_t> idx(2);
  std::vector<float> w(2);
  route_token(config, logits.data(), nullptr, row.data(), idx.data(), w.data());
  EXPECT_EQ(idx, row);
  EXPECT_NEAR(w[0], 0.2 / 1.0 * 1.5, 1e-6);
  EXPECT_NEAR(w[1], 0.8 / 1.0 * 1.5, 1e-6);
  config.renorm_epsilon = 0.25f;
  route_token(config, logits.data(), nullptr, row.data(), idx.data(), w.data());
  EXPECT_NEAR(w[0], 0.2 / 1.25 * 1.5, 1e-6);
  // hf's 1e-20 is below an ulp of the sum: the weights do not change.
  config.renorm_epsilon = 1e-20f;
  std::vector<float> w_eps(2);
  route_token(config, logits.data(), nullptr, row.data(), idx.data(), w_eps.data());
  config.renorm_epsilon = 0.0f;
  route_token(config, logits.data(), nullptr, row.data(), idx.data(), w.data());
  EXPECT_EQ(w, w_eps);
}

TEST(MoeRoute, GateLinearAndTid2eid) {
  // 3 tokens, dim 8, 4 experts, top 2, bf16 gate; tid2eid rows for token ids 0..2.
  Rng rng(3);
  const int64_t dim = 8, e = 4, k = 2, tokens = 3;
  std::vector<uint16_t> gate(e * dim);
  for (auto& v : gate) v = float_to_bf16(rng.normal());
  std::vector<float> x(tokens * dim);
  for (auto& v : x) v = rng.normal();
  const std::vector<int32_t> tid2eid = {1, 2, 0, 3, 3, 1}, ids = {2, 0, 1};
  RouterConfig config{e, k, 1.5f, 0.0f};
  RouterWeights router{
      {WeightFormat::kBF16, e, dim, gate.data(), nullptr, 1.0f}, nullptr, tid2eid.data(), 3};
  std::vector<int32_t> idx(tokens * k);
  std::vector<float> w(tokens * k);
  moe_route(config, router, x.data(), ids.data(), tokens, idx.data(), w.data());
  for (int64_t t = 0; t < tokens; ++t) {
    EXPECT_EQ(idx[t * k], tid2eid[ids[t] * k]);
    EXPECT_EQ(idx[t * k + 1], tid2eid[ids[t] * k + 1]);
    double s[2];
    for (int i = 0; i < 2; ++i) {
      double logit = 0;
      for (int64_t d = 0; d < dim; ++d)
        logit += double(x[t * dim + d]) * bf16_to_float(gate[idx[t * k + i] * dim + d]);
      s[i] = std::sqrt(std::log1p(std::exp(logit)));
    }
    EXPECT_NEAR(w[t * k], s[0] / (s[0] + s[1]) * 1.5, 1e-5);
    EXPECT_NEAR(w[t * k + 1], s[1] / (s[0] + s[1]) * 1.5, 1e-5);
    EXPECT_NEAR(w[t * k] + w[t * k + 1], 1.5, 1e-6);
  }
}

TEST(ExpertSwiglu, ClampHandComputed) {
  // dim 2, inter 2, f32 identity weights: a = x, b = x from w1 = w3 = I (x chosen per case).
  // x = (20, -12): a = (20, -12) -> min(a, 10) = (10, -12); b = (20, -12) -> clamp = (10, -10).
  const std::vector<float> eye = {1, 0, 0, 1};
  ExpertWeights weights{{WeightFormat::kF32, 2, 2, eye.data(), nullptr, 1.0f},
                        {WeightFormat::kF32, 2, 2, eye.data(), nullptr, 1.0f},
                        {WeightFormat::kF32, 2, 2, eye.data(), nullptr, 1.0f}};
  const std::vector<float> x = {20.0f, -12.0f};
  const float route = 0.5f;
  std::vector<float> y(2);
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  expert_swiglu(weights, {10.0f, false, false}, x.data(), 1, &route, y.data());
  EXPECT_NEAR(y[0], 0.5 * silu(10.0) * 10.0, 1e-5);
  EXPECT_NEAR(y[1], 0.5 * silu(-12.0) * -10.0, 1e-6);
  // No clamp (limit 0): the raw values.
  expert_swiglu(weights, {0.0f, false, false}, x.data(), 1, nullptr, y.data());
  EXPECT_NEAR(y[0], silu(20.0) * 20.0, 1e-4);
  EXPECT_NEAR(y[1], silu(-12.0) * -12.0, 1e-6);
}

// Random MXFP4 expert of the given shape.
struct Mxfp4Expert {
  std::vector<uint8_t> w1, s1, w2, s2, w3, s3;
  int64_t dim, inter;
  ExpertWeights view() const {
    return {{WeightFormat::kMxfp4, inter, dim, w1.data(), s1.data(), 1.0f},
            {WeightFormat::kMxfp4, dim, inter, w2.data(), s2.data(), 1.0f},
            {WeightFormat::kMxfp4, inter, dim, w3.data(), s3.data(), 1.0f}};
  }
};
Mxfp4Expert random_expert(Rng& rng, int64_t dim, int64_t inter) {
  Mxfp4Expert e{{}, {}, {}, {}, {}, {}, dim, inter};
  auto fill = [&](std::vector<uint8_t>& w, std::vector<uint8_t>& s, int64_t n, int64_t k) {
    w.resize(n * k / 2);
    s.resize(n * k / 32);
    for (auto& b : w) b = uint8_t(rng.below(256));
    for (auto& v : s) v = uint8_t(127 - 9 + rng.below(3));
  };
  fill(e.w1, e.s1, inter, dim);
  fill(e.w2, e.s2, dim, inter);
  fill(e.w3, e.s3, inter, dim);
  return e;
}

struct Fp8Expert {
  std::vector<uint8_t> w1, s1, w2, s2, w3, s3;
  int64_t dim, inter;
  ExpertWeights view() const {
    return {{WeightFormat::kFp8Block, inter, dim, w1.data(), s1.data(), 1.0f},
            {WeightFormat::kFp8Block, dim, inter, w2.data(), s2.data(), 1.0f},
            {WeightFormat::kFp8Block, inter, dim, w3.data(), s3.data(), 1.0f}};
  }
};
Fp8Expert random_fp8_expert(Rng& rng, int64_t dim, int64_t inter, int scale_exp) {
  Fp8Expert e{{}, {}, {}, {}, {}, {}, dim, inter};
  auto fill = [&](std::vector<uint8_t>& w, std::vector<uint8_t>& s, int64_t n, int64_t k) {
    w.resize(n * k);
    s.resize(((n + 127) / 128) * ((k + 127) / 128));
    for (auto& b : w) b = float_to_e4m3(rng.normal() * 64.0f);
    for (auto& v : s) v = uint8_t(127 + scale_exp);
  };
  fill(e.w1, e.s1, inter, dim);
  fill(e.w2, e.s2, dim, inter);
  fill(e.w3, e.s3, inter, dim);
  return e;
}

void check_moe_layer(bool hash, bool shared_clamp, bool quantize, bool round_bf16, uint64_t seed) {
  // Tiny config (§14): dim 256, 8 experts, top 2, inter 128, MXFP4 experts, FP8 shared expert.
  const int64_t dim = 256, inter = 128, e_count = 8, k = 2, tokens = 6, vocab = 16;
  Rng rng(seed);
  std::vector<Mxfp4Expert> experts;
  std::vector<ExpertWeights> views;
  for (int64_t e = 0; e < e_count; ++e) experts.push_back(random_expert(rng, dim, inter));
  for (const auto& e : experts) views.push_back(e.view());
  // Large shared weights so that some of its pre-activations exceed the clamp limit.
  Fp8Expert shared = random_fp8_expert(rng, dim, inter, -7);
  std::vector<uint16_t> gate(e_count * dim);
  for (auto& v : gate) v = float_to_bf16(rng.normal() * 0.1f);
  std::vector<float> bias(e_count);
  for (auto& v : bias) v = rng.normal() * 0.1f;
  std::vector<int32_t> tid2eid(vocab * k);
  for (int64_t t = 0; t < vocab; ++t) {
    tid2eid[t * k] = int32_t(t % e_count);
    tid2eid[t * k + 1] = int32_t((t + 3) % e_count);
  }
  std::vector<int32_t> ids(tokens);
  for (auto& v : ids) v = int32_t(rng.below(vocab));
  std::vector<float> x(tokens * dim);
  for (auto& v : x) v = rng.normal();

  MoeParams params;
  params.router_config = {e_count, k, 1.5f, 0.0f};
  params.router = {{WeightFormat::kBF16, e_count, dim, gate.data(), nullptr, 1.0f},
                   hash ? nullptr : bias.data(),
                   hash ? tid2eid.data() : nullptr,
                   vocab};
  params.experts = views.data();
  params.shared = shared.view();
  params.swiglu_limit = 10.0f;
  params.shared_expert_clamp = shared_clamp;
  params.quantize_activations = quantize;
  params.round_bf16 = round_bf16;
  std::vector<float> y(tokens * dim);
  moe_forward(params, x.data(), ids.data(), tokens, y.data());

  // Per-token composition: route, then each chosen expert in ascending expert order, then shared.
  std::vector<int32_t> idx(tokens * k);
  std::vector<float> w(tokens * k);
  moe_route(params.router_config, params.router, x.data(), ids.data(), tokens, idx.data(),
            w.data());
  int clamped_shared_values = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> expected(dim, 0.0f), y_e(dim);
    std::vector<std::pair<int32_t, float>> chosen;
    for (int64_t i = 0; i < k; ++i) chosen.push_back({idx[t * k + i], w[t * k + i]});
    std::sort(chosen.begin(), chosen.end());
    if (hash) {
      EXPECT_EQ(chosen[0].first, std::min(tid2eid[ids[t] * k], tid2eid[ids[t] * k + 1]));
    }
    for (auto [e, weight] : chosen) {
      expert_swiglu(views[e], {10.0f, quantize, round_bf16}, x.data() + t * dim, 1, &weight,
                    y_e.data());
      for (int64_t d = 0; d < dim; ++d) expected[d] += y_e[d];
    }
    expert_swiglu(shared.view(), {shared_clamp ? 10.0f : 0.0f, quantize, round_bf16},
                  x.data() + t * dim, 1, nullptr, y_e.data());
    for (int64_t d = 0; d < dim; ++d) expected[d] += y_e[d];
    for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(y[t * dim + d], expected[d]) << t << " " << d;
    // Count shared pre-activations beyond the limit (so the clamp option is exercised).
    std::vector<float> a(inter);
    linear(x.data() + t * dim, 1, shared.view().w1, quantize, a.data());
    for (float v : a) clamped_shared_values += v > 10.0f;
  }
  EXPECT_GT(clamped_shared_values, 0);
}

TEST(MoeForward, LearnedRoutingReferenceMode) {
  check_moe_layer(false, false, true, true, 1);
}
TEST(MoeForward, HashRoutingReferenceMode) {
  check_moe_layer(true, false, true, true, 2);
}
TEST(MoeForward, HfModeClampsSharedExpert) {
  check_moe_layer(false, true, false, false, 3);
}

TEST(MoeForward, SharedClampChangesTheResult) {
  // The same layer with and without the shared-expert clamp differs (the shared expert's
  // pre-activations exceed 10 for these weights).
  const int64_t dim = 256, inter = 128;
  Rng rng(4);
  Fp8Expert shared = random_fp8_expert(rng, dim, inter, -7);
  std::vector<float> x(dim);
  for (auto& v : x) v = rng.normal();
  std::vector<float> clamped(dim), raw(dim);
  expert_swiglu(shared.view(), {10.0f, false, false}, x.data(), 1, nullptr, clamped.data());
  expert_swiglu(shared.view(), {0.0f, false, false}, x.data(), 1, nullptr, raw.data());
  EXPECT_NE(clamped, raw);
}

TEST(ExpertSwiglu, FlashExpertMatchesDouble) {
  // DeepSeek-V4-Flash routed expert: w1/w3 [2048, 4096], w2 [4096, 2048] MXFP4, one token, hf
  // numerics (no activation quantization, so the double reference has no rounding thresholds).
  const int64_t dim = 4096, inter = 2048;
  Rng rng(5);
  Mxfp4Expert e = random_expert(rng, dim, inter);
  std::vector<float> x(dim);
  for (auto& v : x) v = rng.normal();
  const float route = 0.37f;
  std::vector<float> y(dim);
  expert_swiglu(e.view(), {10.0f, false, false}, x.data(), 1, &route, y.data());
  auto w_at = [](const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t k, int64_t r,
                 int64_t c) {
    const uint8_t byte = w[r * k / 2 + c / 2];
    return double(e2m1_to_float(c % 2 ? byte >> 4 : byte & 0xF)) *
           std::ldexp(1.0, s[r * k / 32 + c / 32] - 127);
  };
  const double u = std::ldexp(1.0, -24);
  std::vector<double> h(inter), h_err(inter);
  for (int64_t i = 0; i < inter; ++i) {
    double a = 0, b = 0, abs_a = 0, abs_b = 0;
    for (int64_t c = 0; c < dim; ++c) {
      const double wa = w_at(e.w1, e.s1, dim, i, c), wb = w_at(e.w3, e.s3, dim, i, c);
      a += x[c] * wa;
      b += x[c] * wb;
      abs_a += std::fabs(x[c] * wa);
      abs_b += std::fabs(x[c] * wb);
    }
    const double ea = 8 * std::sqrt(double(dim)) * u * abs_a,
                 eb = 8 * std::sqrt(double(dim)) * u * abs_b;
    a = std::min(a, 10.0);
    b = std::clamp(b, -10.0, 10.0);
    const double silu = a / (1.0 + std::exp(-a));
    h[i] = route * silu * b;
    // d(silu)/da <= 1.1, so the error of h is bounded by the input errors plus 1e-6 relative.
    h_err[i] = route * (1.1 * ea * std::fabs(b) + std::fabs(silu) * eb) + 1e-6 * std::fabs(h[i]);
  }
  for (int64_t r = 0; r < dim; r += 13) {
    double expected = 0, abs_sum = 0, carried = 0;
    for (int64_t i = 0; i < inter; ++i) {
      const double w2 = w_at(e.w2, e.s2, inter, r, i);
      expected += h[i] * w2;
      abs_sum += std::fabs(h[i] * w2);
      carried += h_err[i] * std::fabs(w2);
    }
    ASSERT_NEAR(y[r], expected, 8 * std::sqrt(double(inter)) * u * abs_sum + carried) << r;
  }
}

}  // namespace
}  // namespace ds::cpu
