// RoPE references (dsv4-model.md §7.3): the plain and YaRN frequency tables, the interleaved
// rotation of the rope tail, and the inverse rotation.
//
// Tolerances: tables are compared to double evaluations of the formulas with 2e-7 relative (an
// fp32 pow/division/blend is within a few ulps: 2e-7 for the plain table, 5e-7 for the blended
// pairs); the YaRN pairs that are exactly the plain table or exactly the plain table / 16 are
// compared bit for bit (REF's blend multiplies by exactly 0 and 1 there). Rotations: 2e-6 absolute
// on unit-scale values (angle rounding at moderate positions plus fp32 complex products).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/rope.h"

namespace ds::cpu {
namespace {

RopeConfig flash_config(int64_t ratio) {
  return rope_config_for_layer(ratio, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0);
}

TEST(RopeInvFreq, PlainTableForRatioZero) {
  RopeConfig c = flash_config(0);
  EXPECT_FALSE(c.yarn);
  EXPECT_EQ(c.theta, 10000.0);
  std::vector<float> f(32);
  rope_inv_freq(c, f.data());
  for (int i = 0; i < 32; ++i) {
    const double expected = std::pow(10000.0, -2.0 * i / 64.0);
    EXPECT_NEAR(f[i], expected, 2e-7 * expected) << i;
  }
  EXPECT_EQ(f[0], 1.0f);
}

TEST(RopeInvFreq, YarnFlashValues) {
  // §7.3: low = floor(cd(32)) = 15, high = ceil(cd(1)) = 25; pairs 0-15 unchanged, 25-31
  // divided by 16, 16-24 blended with ramp (i - 15) / 10.
  for (int64_t ratio : {4, 128}) {
    RopeConfig c = flash_config(ratio);
    EXPECT_TRUE(c.yarn);
    EXPECT_EQ(c.theta, 160000.0);
    std::vector<float> yarn(32), plain(32);
    rope_inv_freq(c, yarn.data());
    RopeConfig no_yarn = c;
    no_yarn.yarn = false;
    rope_inv_freq(no_yarn, plain.data());
    for (int i = 0; i <= 15; ++i) EXPECT_EQ(yarn[i], plain[i]) << i;
    for (int i = 25; i < 32; ++i) EXPECT_EQ(yarn[i], plain[i] / 16.0f) << i;
    for (int i = 16; i <= 24; ++i) {
      const double base = std::pow(160000.0, -2.0 * i / 64.0);
      const double ramp = (i - 15) / 10.0;
      const double expected = base / 16.0 * ramp + base * (1.0 - ramp);
      EXPECT_NEAR(yarn[i], expected, 5e-7 * expected) << i;
      EXPECT_LT(yarn[i], plain[i]);
      EXPECT_GT(yarn[i], plain[i] / 16.0f);
    }
  }
  // The correction dims themselves (cd(32) = 15.45, cd(1) = 24.71).
  auto cd = [](double n) {
    return 64.0 * std::log(65536.0 / (2.0 * std::numbers::pi * n)) / (2.0 * std::log(160000.0));
  };
  EXPECT_NEAR(cd(32), 15.45, 0.01);
  EXPECT_NEAR(cd(1), 24.71, 0.01);
}

TEST(RopeRotate, HandComputedSinglePair) {
  // head_dim 4 = 2 nope + 2 rope; inv_freq 0.5 at position 2 -> angle 1 rad.
  std::vector<float> x = {7.0f, 8.0f, 1.0f, 0.0f};
  const float f = 0.5f;
  rope_rotate(x.data(), 1, 4, 2, &f, 2, RopeDirection::kForward);
  EXPECT_EQ(x[0], 7.0f);
  EXPECT_EQ(x[1], 8.0f);
  EXPECT_NEAR(x[2], std::cos(1.0), 1e-7);
  EXPECT_NEAR(x[3], std::sin(1.0), 1e-7);
  // (0 + 1i) rotated back by -1 rad: (sin 1, cos 1).
  std::vector<float> y = {0.0f, 0.0f, 0.0f, 1.0f};
  rope_rotate(y.data(), 1, 4, 2, &f, 2, RopeDirection::kInverse);
  EXPECT_NEAR(y[2], std::sin(1.0), 1e-7);
  EXPECT_NEAR(y[3], std::cos(1.0), 1e-7);
}

TEST(RopeRotate, InterleavedPairsMatchDoubleAtFlashShape) {
  // 64 heads x 512, rope on dims 448..511, compressed-layer table, position 1000.
  const int64_t heads = 64, hd = 512, rd = 64, pos = 1000;
  Rng rng(17);
  std::vector<float> x(heads * hd);
  for (auto& v : x) v = rng.normal();
  std::vector<float> f(32);
  rope_inv_freq(flash_config(4), f.data());
  std::vector<float> y = x;
  rope_rotate(y.data(), heads, hd, rd, f.data(), pos, RopeDirection::kForward);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd - rd; ++i) ASSERT_EQ(y[h * hd + i], x[h * hd + i]);
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double angle = double(float(pos) * f[i]);  // REF's fp32 angle
      const double re = x[h * hd + 448 + 2 * i], im = x[h * hd + 448 + 2 * i + 1];
      EXPECT_NEAR(y[h * hd + 448 + 2 * i], re * std::cos(angle) - im * std::sin(angle), 2e-6);
      EXPECT_NEAR(y[h * hd + 448 + 2 * i + 1], re * std::sin(angle) + im * std::cos(angle), 2e-6);
    }
  }
}

TEST(RopeRotate, InverseUndoesForward) {
  const int64_t heads = 4, hd = 128, rd = 64;
  Rng rng(19);
  std::vector<float> f(32);
  rope_inv_freq(flash_config(128), f.data());
  for (int64_t pos : {0, 1, 15, 127, 4095, 65535, 1000000}) {
    std::vector<float> x(heads * hd);
    for (auto& v : x) v = rng.normal();
    std::vector<float> y = x;
    rope_rotate(y.data(), heads, hd, rd, f.data(), pos, RopeDirection::kForward);
    rope_rotate(y.data(), heads, hd, rd, f.data(), pos, RopeDirection::kInverse);
    // cos^2 + sin^2 = 1 up to fp32 rounding: 2e-6 on N(0,1) values.
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 2e-6) << pos << " " << i;
  }
}

TEST(RopeRotate, PositionZeroIsIdentity) {
  std::vector<float> f(32);
  rope_inv_freq(flash_config(0), f.data());
  Rng rng(23);
  std::vector<float> x(128);
  for (auto& v : x) v = rng.normal();
  std::vector<float> y = x;
  rope_rotate(y.data(), 1, 128, 64, f.data(), 0, RopeDirection::kForward);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]);
}

}  // namespace
}  // namespace ds::cpu
