// Linear-layer references (dsv4-model.md §10, §10.1, §10.2, §10.3) against hand-computed cases
// and an independent double-precision dequantize-and-dot written here, at small, tiny-config and
// DeepSeek-V4-Flash shapes.
//
// Tolerance for fp32 accumulation against double: 8 * sqrt(K) * 2^-24 * sum_k |x_k w_k|. The
// kernel sums K products sequentially in fp32; rounding errors behave like a random walk of K
// steps of at most 2^-24 relative each, so sqrt(K) * 2^-24 is one standard deviation and 8 of
// them keeps a fixed-seed test far from flaky. A wrong scale index or nibble order gives errors
// of the order of the sum itself.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {
namespace {

double accumulation_tolerance(int64_t k, double abs_sum) {
  return 8.0 * std::sqrt(double(k)) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
}

// Random FP8 block weight: e4m3 codes of N(0, 1) * 64 and e8m0 scales 2^-13 .. 2^-9.
struct Fp8Weight {
  std::vector<uint8_t> codes, scales;
  int64_t n, k;
  LinearWeight view() const {
    return {WeightFormat::kFp8Block, n, k, codes.data(), scales.data(), 1.0f};
  }
};
Fp8Weight random_fp8_weight(Rng& rng, int64_t n, int64_t k) {
  Fp8Weight w{{}, {}, n, k};
  w.codes.resize(size_t(n * k));
  for (auto& c : w.codes) c = float_to_e4m3(rng.normal() * 64.0f);
  w.scales.resize(size_t(((n + 127) / 128) * ((k + 127) / 128)));
  for (auto& s : w.scales) s = uint8_t(127 - 13 + rng.below(5));
  return w;
}

// Independent dequantization of an FP8 block weight element (§10).
double fp8_weight_value(const Fp8Weight& w, int64_t row, int64_t col) {
  const int64_t k_blocks = (w.k + 127) / 128;
  const int scale_bits = w.scales[size_t((row / 128) * k_blocks + col / 128)];
  return double(e4m3_to_float(w.codes[size_t(row * w.k + col)])) *
         std::ldexp(1.0, scale_bits - 127);
}

// Independent FP8 activation quantization (§10.2), computed with double log2/ceil.
std::vector<float> act_quant_expected(const std::vector<float>& x, int64_t k) {
  std::vector<float> q(x.size());
  for (size_t t = 0; t < x.size() / size_t(k); ++t) {
    for (int64_t b = 0; b < k; b += 128) {
      double amax = 1e-4;
      for (int64_t i = b; i < b + 128; ++i) amax = std::max(amax, std::fabs(double(x[t * k + i])));
      const double s = std::ldexp(1.0, int(std::ceil(std::log2(amax / 448.0))));
      for (int64_t i = b; i < b + 128; ++i) {
        double v = std::clamp(double(x[t * k + i]) / s, -448.0, 448.0);
        q[t * k + i] = float(double(e4m3_to_float(float_to_e4m3(float(v)))) * s);
      }
    }
  }
  return q;
}

std::vector<float> random_input(Rng& rng, int64_t count) {
  std::vector<float> x(static_cast<size_t>(count));
  for (auto& v : x) v = rng.normal();
  return x;
}

void check_fp8_linear(int64_t tokens, int64_t n, int64_t k, bool quantize, uint64_t seed) {
  Rng rng(seed);
  Fp8Weight w = random_fp8_weight(rng, n, k);
  std::vector<float> x = random_input(rng, tokens * k);
  std::vector<float> y(size_t(tokens * n), std::nanf(""));
  linear(x.data(), tokens, w.view(), quantize, y.data());
  std::vector<float> xq = quantize ? act_quant_expected(x, k) : x;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t row = 0; row < n; ++row) {
      double expected = 0, abs_sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double term = double(xq[t * k + c]) * fp8_weight_value(w, row, c);
        expected += term;
        abs_sum += std::fabs(term);
      }
      ASSERT_NEAR(y[t * n + row], expected, accumulation_tolerance(k, abs_sum))
          << "t=" << t << " row=" << row << " quantize=" << quantize;
    }
  }
}

TEST(LinearF32, HandComputed) {
  const std::vector<float> w = {1, 2, 3, 4};      // [2, 2]
  const std::vector<float> x = {1, 1, 0.5f, -1};  // [2 tokens, 2]
  std::vector<float> y(4);
  linear_f32(x.data(), 2, w.data(), 2, 2, y.data());
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], 7.0f);
  EXPECT_EQ(y[2], -1.5f);
  EXPECT_EQ(y[3], -2.5f);
}

TEST(LinearBf16, MatchesDoubleAndIgnoresActivationQuantization) {
  Rng rng(5);
  const int64_t tokens = 3, n = 40, k = 256;
  std::vector<uint16_t> w(n * k);
  for (auto& v : w) v = float_to_bf16(rng.normal() * 0.05f);
  std::vector<float> x = random_input(rng, tokens * k);
  std::vector<float> y(tokens * n), y_q(tokens * n);
  linear_bf16(x.data(), tokens, w.data(), n, k, y.data());
  // REF's bf16 linears never quantize their input: the flag must not change anything.
  linear(x.data(), tokens, {WeightFormat::kBF16, n, k, w.data(), nullptr, 1.0f}, true, y_q.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t row = 0; row < n; ++row) {
      double expected = 0, abs_sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double term = double(x[t * k + c]) * bf16_to_float(w[row * k + c]);
        expected += term;
        abs_sum += std::fabs(term);
      }
      EXPECT_NEAR(y[t * n + row], expected, accumulation_tolerance(k, abs_sum));
      EXPECT_EQ(y_q[t * n + row], y[t * n + row]);
    }
  }
}

TEST(LinearFp8Block, HandComputedScaleGrid) {
  // N = 256, K = 256: four 128x128 blocks with scales 2^0, 2^1 (row block 0) and 2^2, 2^3 (row
  // block 1). All codes are 1.0; x is one-hot, so y[row] picks one block's scale.
  const int64_t n = 256, k = 256;
  std::vector<uint8_t> codes(n * k, float_to_e4m3(1.0f));
  std::vector<uint8_t> scales = {127, 128, 129, 130};
  std::vector<float> x(k, 0.0f), y(n);
  x[200] = 1.5f;  // column block 1
  linear_fp8_block(x.data(), 1, codes.data(), scales.data(), n, k, false, y.data());
  EXPECT_EQ(y[0], 1.5f * 2.0f);
  EXPECT_EQ(y[127], 1.5f * 2.0f);
  EXPECT_EQ(y[128], 1.5f * 8.0f);
  // With activation quantization 1.5 is exact in e4m3 (scale 2^ceil(log2(1.5/448)) = 2^-8).
  linear_fp8_block(x.data(), 1, codes.data(), scales.data(), n, k, true, y.data());
  EXPECT_EQ(y[255], 1.5f * 8.0f);
}

TEST(LinearFp8Block, RandomSmallWithAndWithoutActivationQuantization) {
  check_fp8_linear(3, 256, 384, false, 21);
  check_fp8_linear(3, 256, 384, true, 22);
  // Partial blocks (N, K not multiples of 128) use the ceil-div scale grid.
  check_fp8_linear(2, 200, 300, false, 23);
}

TEST(LinearFp8Block, TinyConfigShapes) {
  // dsv4-model.md §14: wq_a [128, 256], wq_b [512, 128], wkv [128, 256], wo_b [256, 256].
  check_fp8_linear(4, 128, 256, true, 31);
  check_fp8_linear(4, 512, 128, true, 32);
  check_fp8_linear(4, 256, 256, true, 33);
}

TEST(LinearFp8Block, FlashWqA) {
  // DeepSeek-V4-Flash wq_a [1024, 4096], one decode token.
  check_fp8_linear(1, 1024, 4096, true, 41);
}

TEST(LinearFp8Block, SliceRowsMatchesFullRows) {
  Rng rng(51);
  const int64_t n = 384, k = 256;
  Fp8Weight w = random_fp8_weight(rng, n, k);
  std::vector<float> x = random_input(rng, 2 * k);
  std::vector<float> full(2 * n), part(2 * 128);
  linear(x.data(), 2, w.view(), true, full.data());
  linear(x.data(), 2, slice_rows(w.view(), 256, 128), true, part.data());
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t r = 0; r < 128; ++r) EXPECT_EQ(part[t * 128 + r], full[t * n + 256 + r]);
  }
}

TEST(LinearMxfp4, NibbleOrderAndScalesHandComputed) {
  // One row, K = 64: byte 0 = 0x21 -> element 0 = code 1 (0.5, low nibble), element 1 = code 2
  // (1.0, high nibble); byte 16 = 0xE7 -> element 32 = code 7 (6.0), element 33 = code 0xE
  // (-4.0). Scales: 2^-1 for elements 0..31, 2^2 for 32..63.
  std::vector<uint8_t> packed(32, 0);
  packed[0] = 0x21;
  packed[16] = 0xE7;
  std::vector<uint8_t> scales = {126, 129};
  const int64_t k = 64;
  auto run = [&](int64_t hot) {
    std::vector<float> x(k, 0.0f);
    x[hot] = 1.0f;
    float y = 0;
    linear_mxfp4(x.data(), 1, packed.data(), scales.data(), 1, k, false, &y);
    return y;
  };
  EXPECT_EQ(run(0), 0.25f);
  EXPECT_EQ(run(1), 0.5f);
  EXPECT_EQ(run(32), 24.0f);
  EXPECT_EQ(run(33), -16.0f);
  EXPECT_EQ(run(2), 0.0f);
}

TEST(LinearMxfp4, FlashExpertW1) {
  // DeepSeek-V4-Flash routed expert w1 [2048, 4096] (packed [2048, 2048], scales [2048, 128]),
  // one token with activation quantization, against double.
  Rng rng(61);
  const int64_t n = 2048, k = 4096;
  std::vector<uint8_t> packed(n * k / 2), scales(n * k / 32);
  for (auto& b : packed) b = uint8_t(rng.below(256));
  for (auto& s : scales) s = uint8_t(127 - 8 + rng.below(4));
  std::vector<float> x = random_input(rng, k);
  std::vector<float> y(n);
  linear_mxfp4(x.data(), 1, packed.data(), scales.data(), n, k, true, y.data());
  std::vector<float> xq = act_quant_expected(x, k);
  for (int64_t row = 0; row < n; row += 7) {
    double expected = 0, abs_sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = packed[row * k / 2 + c / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      const double w = e2m1_to_float(code) * std::ldexp(1.0, scales[row * k / 32 + c / 32] - 127);
      expected += double(xq[c]) * w;
      abs_sum += std::fabs(double(xq[c]) * w);
    }
    ASSERT_NEAR(y[row], expected, accumulation_tolerance(k, abs_sum)) << row;
  }
}

TEST(LinearNvfp4, HandComputedScales) {
  // One row, K = 32: element 0 = code 3 (1.5) with block scale e4m3(1.5), element 17 = code
  // 0xD (-3.0) with block scale e4m3(0.25); global scale 0.5.
  std::vector<uint8_t> packed(16, 0);
  packed[0] = 0x03;
  packed[8] = 0xD0;  // element 17 = high nibble of byte 8
  std::vector<uint8_t> scales = {float_to_e4m3(1.5f), float_to_e4m3(0.25f)};
  std::vector<float> x(32, 0.0f);
  x[0] = 2.0f;
  x[17] = 1.0f;
  float y = 0;
  linear_nvfp4(x.data(), 1, packed.data(), scales.data(), 0.5f, 1, 32, false, &y);
  EXPECT_EQ(y, 2.0f * 1.5f * 1.5f * 0.5f + 1.0f * -3.0f * 0.25f * 0.5f);
}

TEST(LinearNvfp4, RandomWithActivationQuantization) {
  Rng rng(71);
  const int64_t tokens = 2, n = 64, k = 256;
  std::vector<uint8_t> packed(n * k / 2), scales(n * k / 16);
  for (auto& b : packed) b = uint8_t(rng.below(256));
  for (auto& s : scales) s = float_to_e4m3(rng.uniform(0.01f, 2.0f));
  const float global = 0.0625f;
  std::vector<float> x = random_input(rng, tokens * k);
  std::vector<float> y(tokens * n);
  linear_nvfp4(x.data(), tokens, packed.data(), scales.data(), global, n, k, true, y.data());
  std::vector<float> xq = act_quant_expected(x, k);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t row = 0; row < n; ++row) {
      double expected = 0, abs_sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = packed[row * k / 2 + c / 2];
        const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
        const double w =
            double(e2m1_to_float(code)) * e4m3_to_float(scales[row * k / 16 + c / 16]) * global;
        expected += double(xq[t * k + c]) * w;
        abs_sum += std::fabs(double(xq[t * k + c]) * w);
      }
      ASSERT_NEAR(y[t * n + row], expected, accumulation_tolerance(k, abs_sum));
    }
  }
}

}  // namespace
}  // namespace ds::cpu
