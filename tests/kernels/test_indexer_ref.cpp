// Lightning indexer references (dsv4-model.md §7.7): scores against hand-computed values and a
// double implementation, top-k against a full sort, the "select everything" skip, query
// preparation in both numerics modes, and a DeepSeek-V4-Flash-sized selection (64 heads x 128,
// 2048 visible entries, top 512).
//
// Score tolerance: each head's dot has error <= 8 sqrt(hd) 2^-24 sum|q k| (random-walk bound,
// 8 sigma), ReLU is 1-Lipschitz, and the head sum adds 8 sqrt(nh) 2^-24 relative; so
// |I - I_ref| <= sum_h |w_h| (8 sqrt(hd) 2^-24 sum|q_h k|) + 8 sqrt(nh) 2^-24 sum_h |w_h relu|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/indexer.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ds::cpu {
namespace {

const double kU = std::ldexp(1.0, -24);

TEST(IndexerScores, HandComputedReluAndSignedWeights) {
  // 2 heads, head_dim 2, q0 = [1, 0], q1 = [-1, 1], weights (0.5, -2).
  // Key 0 = [2, 0]: head 0 dot 2, head 1 dot -2 (ReLU -> 0): I = 0.5 * 2 = 1.
  // Key 1 = [-3, 1]: head 0 dot -3 (ReLU -> 0), head 1 dot 3 + 1 = 4: I = -2 * 4 = -8.
  const std::vector<float> q = {1.0f, 0.0f, -1.0f, 1.0f}, w = {0.5f, -2.0f};
  const std::vector<float> keys = {2.0f, 0.0f, -3.0f, 1.0f};
  std::vector<float> scores(2);
  indexer_scores(q.data(), w.data(), keys.data(), 2, 2, 2, scores.data());
  EXPECT_EQ(scores[0], 0.5f * 2.0f + -2.0f * 0.0f);
  EXPECT_EQ(scores[1], 0.5f * 0.0f + -2.0f * 4.0f);
}

TEST(IndexerScaleWeights, FlashScale) {
  // w = proj * head_dim^-0.5 * num_heads^-0.5.
  const std::vector<float> proj = {1.0f, -2.0f};
  std::vector<float> w2(2);
  indexer_scale_weights(proj.data(), 2, 128, w2.data());
  EXPECT_FLOAT_EQ(w2[0], float(1.0 / std::sqrt(128.0 * 2.0)));
  EXPECT_FLOAT_EQ(w2[1], float(-2.0 / std::sqrt(128.0 * 2.0)));
  // Flash: 128^-0.5 * 64^-0.5 = 8192^-0.5.
  std::vector<float> ones(64, 1.0f), w64(64);
  indexer_scale_weights(ones.data(), 64, 128, w64.data());
  EXPECT_FLOAT_EQ(w64[63], float(1.0 / std::sqrt(8192.0)));
}

std::vector<double> scores_double(const std::vector<float>& q, const std::vector<float>& w,
                                  const std::vector<float>& keys, int64_t n, int64_t nh, int64_t hd,
                                  std::vector<double>* tol) {
  std::vector<double> s(n);
  tol->assign(n, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double total = 0, err = 0, abs_total = 0;
    for (int64_t h = 0; h < nh; ++h) {
      double dot = 0, abs_dot = 0;
      for (int64_t d = 0; d < hd; ++d) {
        dot += double(q[h * hd + d]) * keys[j * hd + d];
        abs_dot += std::fabs(double(q[h * hd + d]) * keys[j * hd + d]);
      }
      total += w[h] * std::max(dot, 0.0);
      abs_total += std::fabs(w[h] * std::max(dot, 0.0));
      err += std::fabs(w[h]) * 8 * std::sqrt(double(hd)) * kU * abs_dot;
    }
    s[j] = total;
    (*tol)[j] = err + 8 * std::sqrt(double(nh)) * kU * abs_total + 1e-12;
  }
  return s;
}

struct Problem {
  std::vector<float> q, w, keys;
};
Problem random_problem(int64_t nh, int64_t hd, int64_t n, uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.q.resize(nh * hd);
  p.w.resize(nh);
  p.keys.resize(n * hd);
  for (auto& v : p.q) v = rng.normal();
  for (auto& v : p.w) v = rng.normal() * 0.1f;
  for (auto& v : p.keys) v = rng.normal();
  return p;
}

TEST(IndexerScores, MatchesDoubleTinyShape) {
  const int64_t nh = 4, hd = 128, n = 75;  // §14: 300 tokens -> 75 CSA entries
  Problem p = random_problem(nh, hd, n, 3);
  std::vector<float> s(n);
  indexer_scores(p.q.data(), p.w.data(), p.keys.data(), n, nh, hd, s.data());
  std::vector<double> tol;
  std::vector<double> ref = scores_double(p.q, p.w, p.keys, n, nh, hd, &tol);
  for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(s[j], ref[j], tol[j]) << j;
}

TEST(TopkIndices, EqualsFullSortTopK) {
  Rng rng(5);
  for (int64_t n : {1, 7, 100, 1000}) {
    std::vector<float> s(n);
    for (auto& v : s) v = rng.normal();
    for (int64_t k : {1, 8, 512, 2000}) {
      std::vector<int32_t> got(std::min(k, n));
      ASSERT_EQ(topk_indices(s.data(), n, k, got.data()), std::min(k, n));
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
      std::set<int32_t> expected(order.begin(), order.begin() + std::min(k, n));
      EXPECT_EQ(std::set<int32_t>(got.begin(), got.end()), expected) << n << " " << k;
    }
  }
}

TEST(IndexerSelect, EverythingWhenCountAtMostTopk) {
  // num_visible <= topk: 0 .. n-1, no scoring (keys are not even read).
  std::vector<int32_t> sel(8, -1);
  EXPECT_EQ(indexer_select(nullptr, nullptr, nullptr, 5, 4, 128, 8, sel.data()), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sel[i], i);
  EXPECT_EQ(indexer_select(nullptr, nullptr, nullptr, 8, 4, 128, 8, sel.data()), 8);
  EXPECT_EQ(sel[7], 7);
  EXPECT_EQ(indexer_select(nullptr, nullptr, nullptr, 0, 4, 128, 8, sel.data()), 0);
}

void check_selection(int64_t nh, int64_t hd, int64_t n, int64_t topk, uint64_t seed) {
  Problem p = random_problem(nh, hd, n, seed);
  std::vector<int32_t> sel(topk);
  ASSERT_EQ(indexer_select(p.q.data(), p.w.data(), p.keys.data(), n, nh, hd, topk, sel.data()),
            topk);
  std::vector<double> tol;
  std::vector<double> ref = scores_double(p.q, p.w, p.keys, n, nh, hd, &tol);
  std::vector<double> sorted = ref;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  const double threshold = sorted[size_t(topk - 1)];
  std::set<int32_t> unique(sel.begin(), sel.end());
  EXPECT_EQ(int64_t(unique.size()), topk);
  // Every selected entry is among the true top-k up to the score tolerance (fp32 vs double can
  // only swap entries whose scores are within the tolerance of the threshold).
  for (int32_t i : sel) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, n);
    EXPECT_GE(ref[i], threshold - 2 * tol[i]) << i;
  }
}

TEST(IndexerSelect, TinyShapeTop8Of75) {
  check_selection(4, 128, 75, 8, 7);
}
TEST(IndexerSelect, FlashShapeTop512Of2048) {
  check_selection(64, 128, 2048, 512, 9);
}

TEST(IndexerPrepareQuery, ReferenceAndHfModes) {
  const int64_t nh = 4, hd = 128, rd = 64, pos = 77;
  Rng rng(11);
  std::vector<float> q(nh * hd);
  for (auto& v : q) v = rng.normal();
  std::vector<float> f(32);
  rope_inv_freq(rope_config_for_layer(4, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0), f.data());
  // Reference: RoPE -> bf16 -> Hadamard per head -> bf16 -> FP4 per 32.
  std::vector<float> got = q, expected = q;
  indexer_prepare_query(got.data(), nh, hd, rd, f.data(), pos, true, true);
  rope_rotate(expected.data(), nh, hd, rd, f.data(), pos, RopeDirection::kForward);
  round_to_bf16(expected.data(), nh * hd);
  hadamard_transform(expected.data(), nh, hd);
  round_to_bf16(expected.data(), nh * hd);
  simulate_fp4_blocks(expected.data(), nh * hd, 32);
  EXPECT_EQ(got, expected);
  // hf: RoPE only.
  std::vector<float> hf = q, rope_only = q;
  indexer_prepare_query(hf.data(), nh, hd, rd, f.data(), pos, false, false);
  rope_rotate(rope_only.data(), nh, hd, rd, f.data(), pos, RopeDirection::kForward);
  EXPECT_EQ(hf, rope_only);
  // The Hadamard leaves dot products unchanged, so without FP4 the reference-mode scores equal
  // the hf-mode scores up to rounding (1e-4 relative: bf16 rounding of q is 2^-9 per element,
  // averaging over 128 terms).
  std::vector<float> rotated = q;
  indexer_prepare_query(rotated.data(), nh, hd, rd, f.data(), pos, false, false);
  hadamard_transform(rotated.data(), nh, hd);
  std::vector<float> key(hd), key_rot(hd);
  for (auto& v : key) v = rng.normal();
  key_rot = key;
  hadamard_transform(key_rot.data(), 1, hd);
  std::vector<float> w(nh, 1.0f), s_plain(1), s_rot(1);
  indexer_scores(hf.data(), w.data(), key.data(), 1, nh, hd, s_plain.data());
  indexer_scores(rotated.data(), w.data(), key_rot.data(), 1, nh, hd, s_rot.data());
  EXPECT_NEAR(s_rot[0], s_plain[0], 1e-4 * (1 + std::fabs(s_plain[0])));
}

TEST(IndexerQuery, LinearThenPrepare) {
  // Tiny config: q_lora_rank 128, 4 heads x 128; FP8 wq_b [512, 128].
  const int64_t rank = 128, nh = 4, hd = 128;
  Rng rng(13);
  std::vector<uint8_t> w(nh * hd * rank), s((nh * hd / 128) * (rank / 128));
  for (auto& v : w) v = float_to_e4m3(rng.normal() * 32.0f);
  for (auto& v : s) v = uint8_t(127 - 9);
  const LinearWeight wq_b{WeightFormat::kFp8Block, nh * hd, rank, w.data(), s.data(), 1.0f};
  std::vector<float> qr(rank), f(32);
  for (auto& v : qr) v = rng.normal();
  rope_inv_freq(rope_config_for_layer(4, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0), f.data());
  IndexerQueryParams p;
  p.num_heads = nh;
  p.head_dim = hd;
  p.inv_freq = f.data();
  std::vector<float> got(nh * hd), expected(nh * hd);
  indexer_query(p, wq_b, qr.data(), 41, got.data());
  linear(qr.data(), 1, wq_b, true, expected.data());
  round_to_bf16(expected.data(), nh * hd);
  indexer_prepare_query(expected.data(), nh, hd, 64, f.data(), 41, true, true);
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace ds::cpu
