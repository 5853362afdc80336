// RMSNorm references (dsv4-model.md §1, §7.1) against hand-computed values and a double
// implementation. Tolerance 4e-6 relative: the fp32 sum of up to 4096 positive squares has a
// relative error of at most about sqrt(dim) * 2^-24 = 4e-6 in practice (a random walk of
// roundings), the rsqrt halves it, and two multiplications add 2^-23.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/norm.h"

namespace ds::cpu {
namespace {

TEST(RmsNorm, HandComputedUnweighted) {
  // mean(3^2, 4^2) = 12.5; rsqrt(12.5 + 1e-6) = 0.28284270...
  std::vector<float> x = {3.0f, 4.0f}, y(2);
  rms_norm(x.data(), nullptr, 1, 2, 1e-6f, y.data());
  const double r = 1.0 / std::sqrt(12.5 + 1e-6);
  EXPECT_NEAR(y[0], 3.0 * r, 1e-6);
  EXPECT_NEAR(y[1], 4.0 * r, 1e-6);
}

TEST(RmsNorm, HandComputedWeightedAndEps) {
  // A zero row stays zero (eps keeps the rsqrt finite): rsqrt(0 + 1e-6) = 1000.
  std::vector<float> x = {0.0f, 0.0f, 1e-4f, 0.0f}, w = {2.0f, -1.0f}, y(4);
  rms_norm(x.data(), w.data(), 2, 2, 1e-6f, y.data());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  // Row 2: mean(x^2) = 5e-9, rsqrt(5e-9 + 1e-6) = 1/sqrt(1.005e-6).
  EXPECT_NEAR(y[2], 1e-4 * 2.0 / std::sqrt(1.005e-6), 1e-6);
}

void check_against_double(int64_t rows, int64_t dim, bool weighted, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(rows * dim), w(dim), y(rows * dim);
  for (auto& v : x) v = rng.normal() * 3.0f;
  for (auto& v : w) v = rng.uniform(0.5f, 1.5f);
  rms_norm(x.data(), weighted ? w.data() : nullptr, rows, dim, 1e-6f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double rs = 1.0 / std::sqrt(ss / double(dim) + 1e-6);
    for (int64_t i = 0; i < dim; ++i) {
      const double expected = double(x[r * dim + i]) * rs * (weighted ? w[i] : 1.0);
      EXPECT_NEAR(y[r * dim + i], expected, 4e-6 * std::fabs(expected) + 1e-7);
    }
  }
}

TEST(RmsNorm, MatchesDoubleAtModelShapes) {
  check_against_double(3, 256, true, 1);   // tiny hidden
  check_against_double(2, 4096, true, 2);  // Flash hidden (attn_norm / ffn_norm)
  check_against_double(2, 1024, true, 3);  // Flash q_norm
  check_against_double(2, 512, false, 4);  // Flash kv head, unweighted
}

TEST(RmsNormHeads, EachHeadIndependently) {
  // Per-head unweighted norm (§7.1): every head of every token has mean square ~1 afterwards.
  Rng rng(9);
  const int64_t tokens = 2, heads = 4, hd = 128;
  std::vector<float> q(tokens * heads * hd);
  for (int64_t i = 0; i < int64_t(q.size()); ++i) q[i] = rng.normal() * float(1 + i / hd);
  std::vector<float> expected(q.size());
  rms_norm(q.data(), nullptr, tokens * heads, hd, 1e-6f, expected.data());
  rms_norm_heads(q.data(), tokens, heads, hd, 1e-6f);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_EQ(q[i], expected[i]);
  for (int64_t h = 0; h < tokens * heads; ++h) {
    double ms = 0;
    for (int64_t i = 0; i < hd; ++i) ms += double(q[h * hd + i]) * q[h * hd + i];
    EXPECT_NEAR(ms / hd, 1.0, 1e-4);
  }
}

}  // namespace
}  // namespace ds::cpu
