// mHC references (dsv4-model.md §5): Sinkhorn against exact fractions and a double
// implementation, the doubly-stochastic property, the C^T X orientation of post, and pre / post /
// head at tiny and DeepSeek-V4-Flash sizes against an independent double implementation.
//
// Tolerances: the hand cases use 1e-6 (fp32 rounding of a few divisions of O(1) values). Against
// the double implementation: pre/post/comb 2e-5 absolute (the mixes are fp32 dots over hc*dim =
// 16384 terms, relative error ~ sqrt(16384) * 2^-24 = 8e-6 of sum |fn x| ~ a few units; sigmoid,
// softmax and 20 normalization rounds are contractive), u / x_new / y 1e-5 relative to the sum of
// the absolute terms plus the pre/comb error carried through.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/mhc.h"

namespace ds::cpu {
namespace {

// Independent double-precision Sinkhorn (§5.1 as written in the spec).
std::vector<double> sinkhorn_double(const std::vector<double>& logits, int hc, int iters,
                                    double eps) {
  std::vector<double> c = logits;
  for (int j = 0; j < hc; ++j) {
    double mx = -1e300, s = 0;
    for (int k = 0; k < hc; ++k) mx = std::max(mx, c[j * hc + k]);
    for (int k = 0; k < hc; ++k) s += std::exp(c[j * hc + k] - mx);
    for (int k = 0; k < hc; ++k) c[j * hc + k] = std::exp(c[j * hc + k] - mx) / s + eps;
  }
  auto cols = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= (s + eps);
    }
  };
  auto rows = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int k = 0; k < hc; ++k) c[j * hc + k] /= (s + eps);
    }
  };
  cols();
  for (int it = 1; it < iters; ++it) {
    rows();
    cols();
  }
  return c;
}

TEST(MhcSinkhorn, HandComputed2x2) {
  // logits [[ln 3, 0], [0, 0]], eps 0. Row softmax [[3/4, 1/4], [1/2, 1/2]]; column
  // normalization (sums 5/4, 3/4) -> [[3/5, 1/3], [2/5, 2/3]] (iters = 1). One more row/column
  // round: rows / (14/15, 16/15) -> [[9/14, 5/14], [3/8, 5/8]]; columns / (57/56, 55/56) ->
  // [[12/19, 4/11], [7/19, 7/11]] (iters = 2).
  std::vector<float> c1 = {float(std::log(3.0)), 0.0f, 0.0f, 0.0f};
  mhc_sinkhorn(c1.data(), 2, 1, 0.0f);
  EXPECT_NEAR(c1[0], 3.0 / 5, 1e-6);
  EXPECT_NEAR(c1[1], 1.0 / 3, 1e-6);
  EXPECT_NEAR(c1[2], 2.0 / 5, 1e-6);
  EXPECT_NEAR(c1[3], 2.0 / 3, 1e-6);
  std::vector<float> c2 = {float(std::log(3.0)), 0.0f, 0.0f, 0.0f};
  mhc_sinkhorn(c2.data(), 2, 2, 0.0f);
  EXPECT_NEAR(c2[0], 12.0 / 19, 1e-6);
  EXPECT_NEAR(c2[1], 4.0 / 11, 1e-6);
  EXPECT_NEAR(c2[2], 7.0 / 19, 1e-6);
  EXPECT_NEAR(c2[3], 7.0 / 11, 1e-6);
}

TEST(MhcSinkhorn, MatchesDoubleAndIsDoublyStochastic) {
  Rng rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> c(16);
    std::vector<double> logits(16);
    for (int i = 0; i < 16; ++i) {
      c[i] = rng.normal();
      logits[i] = c[i];
    }
    mhc_sinkhorn(c.data(), 4, 20, 1e-6f);
    std::vector<double> expected = sinkhorn_double(logits, 4, 20, 1e-6);
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(c[i], expected[i], 1e-6) << trial << " " << i;
    // Doubly stochastic within 1e-5 after 20 iterations (the eps terms alone shift sums by ~1e-6).
    for (int j = 0; j < 4; ++j) {
      double row = 0, col = 0;
      for (int k = 0; k < 4; ++k) {
        row += c[j * 4 + k];
        col += c[k * 4 + j];
      }
      EXPECT_NEAR(row, 1.0, 1e-5) << trial;
      EXPECT_NEAR(col, 1.0, 1e-5) << trial;
    }
  }
}

TEST(MhcSplit, LayoutOfPrePostAndComb) {
  // hc = 2: mixes [pre0, pre1, post0, post1, c00, c01, c10, c11]. scale = (1, 1, 1), base 0
  // except base[4 + 1] (row 0, col 1) = 5: row 0 of comb must concentrate in column 1.
  const std::vector<float> mixes = {0.0f, 1.0f, 0.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> scale = {1.0f, 1.0f, 1.0f};
  std::vector<float> base(8, 0.0f);
  base[5] = 5.0f;
  std::vector<float> pre(2), post(2), comb(4);
  mhc_split(mixes.data(), scale.data(), base.data(), 2, 20, 1e-6f, pre.data(), post.data(),
            comb.data());
  EXPECT_NEAR(pre[0], 0.5 + 1e-6, 1e-7);
  EXPECT_NEAR(pre[1], 1.0 / (1.0 + std::exp(-1.0)) + 1e-6, 1e-7);
  EXPECT_NEAR(post[0], 1.0, 1e-7);
  EXPECT_NEAR(post[1], 2.0 / (1.0 + std::exp(1.0)), 1e-7);
  EXPECT_GT(comb[1], 0.9f);  // C[0][1]
  EXPECT_GT(comb[2], 0.9f);  // C[1][0] (doubly stochastic)
  EXPECT_LT(comb[0], 0.1f);
}

TEST(MhcPost, OrientationIsCTransposeX) {
  // X_new[k] = post[k] * o + sum_j C[j][k] X[j] with a non-symmetric C.
  MhcConfig config;
  config.hc_mult = 2;
  config.dim = 2;
  const std::vector<float> o = {1.0f, 2.0f};
  const std::vector<float> x = {10.0f, 20.0f, 100.0f, 200.0f};  // X[0], X[1]
  const std::vector<float> post = {0.5f, 2.0f};
  const std::vector<float> comb = {0.25f, 0.75f, 0.5f, 0.5f};  // C[0][0], C[0][1], C[1][0], C[1][1]
  std::vector<float> y(4);
  mhc_post(config, o.data(), x.data(), post.data(), comb.data(), 1, y.data());
  // k = 0: 0.5*o + 0.25*X0 + 0.5*X1 ; k = 1: 2*o + 0.75*X0 + 0.5*X1.
  EXPECT_EQ(y[0], 0.5f + 2.5f + 50.0f);
  EXPECT_EQ(y[1], 1.0f + 5.0f + 100.0f);
  EXPECT_EQ(y[2], 2.0f + 7.5f + 50.0f);
  EXPECT_EQ(y[3], 4.0f + 15.0f + 100.0f);
}

struct Site {
  std::vector<float> fn, base, scale;
};
Site random_site(Rng& rng, int64_t num_mixes, int64_t hc_dim) {
  Site s;
  s.fn.resize(num_mixes * hc_dim);
  for (auto& v : s.fn) v = rng.normal() * 0.02f;
  s.base.resize(num_mixes);
  for (auto& v : s.base) v = rng.normal() * 0.5f;
  s.scale = {rng.uniform(0.5f, 1.5f), rng.uniform(0.5f, 1.5f), rng.uniform(0.5f, 1.5f)};
  return s;
}

void check_pre_post(int64_t dim, int64_t tokens, uint64_t seed) {
  const int hc = 4;
  const int64_t num_mixes = (2 + hc) * hc, hc_dim = hc * dim;
  Rng rng(seed);
  Site site = random_site(rng, num_mixes, hc_dim);
  std::vector<float> x(tokens * hc_dim), o(tokens * dim);
  for (auto& v : x) v = rng.normal();
  for (auto& v : o) v = rng.normal();
  MhcConfig config;
  config.dim = dim;
  std::vector<float> u(tokens * dim), post(tokens * hc), comb(tokens * hc * hc),
      x_new(tokens * hc_dim);
  mhc_pre(config, {site.fn.data(), site.base.data(), site.scale.data()}, x.data(), tokens, u.data(),
          post.data(), comb.data());
  mhc_post(config, o.data(), x.data(), post.data(), comb.data(), tokens, x_new.data());
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x.data() + t * hc_dim;
    double ss = 0;
    for (int64_t i = 0; i < hc_dim; ++i) ss += double(xt[i]) * xt[i];
    const double rs = 1.0 / std::sqrt(ss / double(hc_dim) + 1e-6);
    std::vector<double> m(num_mixes);
    for (int64_t r = 0; r < num_mixes; ++r) {
      double acc = 0;
      for (int64_t i = 0; i < hc_dim; ++i) acc += double(site.fn[r * hc_dim + i]) * xt[i];
      m[r] = acc * rs;
    }
    std::vector<double> pre(hc), post_d(hc), logits(hc * hc);
    for (int i = 0; i < hc; ++i) {
      pre[i] = 1.0 / (1.0 + std::exp(-(m[i] * site.scale[0] + site.base[i]))) + 1e-6;
      post_d[i] = 2.0 / (1.0 + std::exp(-(m[hc + i] * site.scale[1] + site.base[hc + i])));
    }
    for (int i = 0; i < hc * hc; ++i)
      logits[i] = m[2 * hc + i] * site.scale[2] + site.base[2 * hc + i];
    std::vector<double> c = sinkhorn_double(logits, hc, 20, 1e-6);
    for (int i = 0; i < hc; ++i) EXPECT_NEAR(post[t * hc + i], post_d[i], 2e-5);
    for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(comb[t * hc * hc + i], c[i], 2e-5);
    for (int64_t d = 0; d < dim; ++d) {
      double expected = 0, abs_sum = 0;
      for (int i = 0; i < hc; ++i) {
        expected += pre[i] * xt[i * dim + d];
        abs_sum += std::fabs(pre[i] * xt[i * dim + d]) + std::fabs(xt[i * dim + d]) * 2e-5;
      }
      ASSERT_NEAR(u[t * dim + d], expected, 1e-5 * abs_sum + 1e-6) << t << " " << d;
      for (int k = 0; k < hc; ++k) {
        double e2 = post_d[k] * o[t * dim + d],
               a2 = std::fabs(e2) + 2e-5 * std::fabs(o[t * dim + d]);
        for (int j = 0; j < hc; ++j) {
          e2 += c[j * hc + k] * xt[j * dim + d];
          a2 += std::fabs(c[j * hc + k] * xt[j * dim + d]) + 2e-5 * std::fabs(xt[j * dim + d]);
        }
        ASSERT_NEAR(x_new[t * hc_dim + k * dim + d], e2, 2e-5 * a2) << t << " " << d;
      }
    }
  }
}

TEST(MhcPrePost, TinyShapeMatchesDouble) {
  check_pre_post(256, 3, 41);
}
TEST(MhcPrePost, FlashShapeMatchesDouble) {
  check_pre_post(4096, 2, 42);
}

TEST(MhcHead, MatchesDouble) {
  for (int64_t dim : {256, 4096}) {
    const int hc = 4;
    const int64_t hc_dim = hc * dim;
    Rng rng(static_cast<uint64_t>(50 + dim));
    std::vector<float> fn(hc * hc_dim), base(hc), scale = {rng.uniform(0.5f, 1.5f)};
    for (auto& v : fn) v = rng.normal() * 0.02f;
    for (auto& v : base) v = rng.normal();
    std::vector<float> x(2 * hc_dim), y(2 * dim);
    for (auto& v : x) v = rng.normal();
    MhcConfig config;
    config.dim = dim;
    mhc_head(config, {fn.data(), base.data(), scale.data()}, x.data(), 2, y.data());
    for (int64_t t = 0; t < 2; ++t) {
      const float* xt = x.data() + t * hc_dim;
      double ss = 0;
      for (int64_t i = 0; i < hc_dim; ++i) ss += double(xt[i]) * xt[i];
      const double rs = 1.0 / std::sqrt(ss / double(hc_dim) + 1e-6);
      std::vector<double> pre(hc);
      for (int i = 0; i < hc; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < hc_dim; ++k) acc += double(fn[i * hc_dim + k]) * xt[k];
        pre[i] = 1.0 / (1.0 + std::exp(-(acc * rs * scale[0] + base[i]))) + 1e-6;
      }
      for (int64_t d = 0; d < dim; ++d) {
        double expected = 0, abs_sum = 0;
        for (int i = 0; i < hc; ++i) {
          expected += pre[i] * xt[i * dim + d];
          abs_sum += std::fabs(xt[i * dim + d]);
        }
        ASSERT_NEAR(y[t * dim + d], expected, 2e-5 * abs_sum) << dim << " " << d;
      }
    }
  }
}

}  // namespace
}  // namespace ds::cpu
