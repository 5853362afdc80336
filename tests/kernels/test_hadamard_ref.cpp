// Walsh-Hadamard transform reference (dsv4-model.md §7.7): hand-computed H_2 / H_4 cases, the
// explicit matrix (-1)^popcount(i&j) / sqrt(n) evaluated in double, orthonormality and
// self-inversion. Tolerances: fp32 butterflies have log2(n) rounding steps per output, so the
// comparisons against double use 1e-6 relative to the vector norm (n = 128: 7 steps of 2^-24
// relative each, times sqrt(n) growth of the partial sums, stays below 1e-6 * |x|).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/hadamard.h"

namespace ds::cpu {
namespace {

TEST(Hadamard, HandComputedSmallSizes) {
  std::vector<float> x2 = {3.0f, 1.0f};
  hadamard_transform(x2.data(), 1, 2);
  const float r2 = float(1.0 / std::sqrt(2.0));
  EXPECT_FLOAT_EQ(x2[0], 4.0f * r2);
  EXPECT_FLOAT_EQ(x2[1], 2.0f * r2);
  // H_4 [1,2,3,4] = [10, -2, -4, 0] / 2.
  std::vector<float> x4 = {1.0f, 2.0f, 3.0f, 4.0f};
  hadamard_transform(x4.data(), 1, 4);
  EXPECT_FLOAT_EQ(x4[0], 5.0f);
  EXPECT_FLOAT_EQ(x4[1], -1.0f);
  EXPECT_FLOAT_EQ(x4[2], -2.0f);
  EXPECT_FLOAT_EQ(x4[3], 0.0f);
}

double vector_norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

TEST(Hadamard, MatchesExplicitSylvesterMatrix) {
  for (int64_t n : {8, 64, 128, 512}) {
    Rng rng(static_cast<uint64_t>(n));
    const int64_t num_vectors = 3;
    std::vector<float> x(num_vectors * n);
    for (auto& v : x) v = rng.normal();
    std::vector<float> y = x;
    hadamard_transform(y.data(), num_vectors, n);
    for (int64_t v = 0; v < num_vectors; ++v) {
      std::vector<float> xv(x.begin() + v * n, x.begin() + (v + 1) * n);
      const double tol = 1e-6 * vector_norm(xv);
      for (int64_t i = 0; i < n; ++i) {
        double expected = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double sign = (std::popcount(uint64_t(i & j)) % 2) ? -1.0 : 1.0;
          expected += sign * xv[j];
        }
        expected /= std::sqrt(double(n));
        EXPECT_NEAR(y[v * n + i], expected, tol) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(Hadamard, OrthonormalAndSelfInverse) {
  const int64_t n = 128;
  Rng rng(3);
  std::vector<float> a(n), b(n);
  for (auto& v : a) v = rng.normal();
  for (auto& v : b) v = rng.normal();
  std::vector<float> ha = a, hb = b;
  hadamard_transform(ha.data(), 1, n);
  hadamard_transform(hb.data(), 1, n);
  // Dot products (hence norms) are preserved: tolerance 1e-5 relative to |a||b| (fp32 dot of 128
  // terms plus the transform's rounding).
  double dot = 0, hdot = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += double(a[i]) * b[i];
    hdot += double(ha[i]) * hb[i];
  }
  EXPECT_NEAR(hdot, dot, 1e-5 * vector_norm(a) * vector_norm(b));
  EXPECT_NEAR(vector_norm(ha), vector_norm(a), 1e-6 * vector_norm(a));
  // H (H a) = a.
  hadamard_transform(ha.data(), 1, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(ha[i], a[i], 1e-6 * vector_norm(a)) << i;
}

}  // namespace
}  // namespace ds::cpu
