// Weight formats (dsv4-model.md §10, §10.1, §10.3): dequantization against values computed by
// hand from the format definitions, the quantizers against hand-computed codes, and round-trip
// error bounds on random matrices.
//
// Stated bounds (per element, x the input, q the round trip):
//   FP8 block (e4m3, 3 mantissa bits, pow2 scale s per 128x128):  |x - q| <= |x|/16 + s * 2^-10
//     (half an ulp relative for normals; half the subnormal step 2^-9 times s below 2^-6 s).
//   MXFP4 (e2m1, 1 mantissa bit, pow2 scale s per 32, |x|/s <= 6):  |x - q| <= max(|x|, s) / 4
//     (grid 0, .5, 1, 1.5, 2, 3, 4, 6: the half-gap is at most a quarter of the magnitude above
//     1 and at most s/4 below).
//   NVFP4 (e2m1 with effective scale S = e4m3(block) * global):    |x - q| <= max(|x|, S) / 4
//     (as MXFP4; saturation after the e4m3 rounding of the block scale loses at most 1/16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "model/weight_format.h"

namespace ds {
namespace {

TEST(WeightFormat, Fp8BlockDequantHandComputed) {
  // 2 x 256: one row block, two column blocks with scales 2^0 and 2^3.
  std::vector<uint8_t> codes(2 * 256, 0);
  auto at = [&](int r, int c) -> uint8_t& { return codes[size_t(r * 256 + c)]; };
  at(0, 0) = 0x38;                                 // 0.0111.000 = 1.0
  at(0, 128) = 0x38;                               // 1.0 in block 1
  at(0, 255) = 0x7E;                               // 0.1111.110 = 1.75 * 2^8 = 448
  at(1, 5) = 0xC4;                                 // 1.1000.100 = -1.5 * 2^1 = -3
  at(1, 127) = 0xB9;                               // 1.0111.001 = -1.125
  at(1, 200) = 0x01;                               // subnormal 1/8 * 2^-6 = 2^-9
  const std::vector<uint8_t> scales = {127, 130};  // [1, 2]: 2^0, 2^3
  std::vector<float> out(2 * 256, -1.0f);
  ASSERT_TRUE(
      dequantize_fp8_block(Fp8BlockWeight{codes.data(), scales.data(), 2, 256}, out.data()).ok());
  std::vector<float> want(2 * 256, 0.0f);
  want[0] = 1.0f;
  want[128] = 8.0f;
  want[255] = 3584.0f;
  want[256 + 5] = -3.0f;
  want[256 + 127] = -1.125f;
  want[256 + 200] = 0.015625f;  // 2^-9 * 8
  EXPECT_EQ(out, want);
}

TEST(WeightFormat, Fp8BlockPartialBlocksAndRowRange) {
  // 130 x 3: scale grid [ceil(130/128), ceil(3/128)] = [2, 1].
  std::vector<uint8_t> codes(130 * 3, 0x38);       // all 1.0
  const std::vector<uint8_t> scales = {126, 129};  // 0.5 for rows 0..127, 4 for rows 128..129
  Fp8BlockWeight w{codes.data(), scales.data(), 130, 3};
  std::vector<float> out(3 * 3);
  ASSERT_TRUE(dequantize_fp8_block(w, 127, 130, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.5f, 0.5f, 4, 4, 4, 4, 4, 4}));
  EXPECT_FALSE(dequantize_fp8_block(w, 128, 131, out.data()).ok());
  EXPECT_FALSE(dequantize_fp8_block(w, 5, 4, out.data()).ok());
  EXPECT_TRUE(dequantize_fp8_block(w, 4, 4, nullptr).ok());  // empty range
  // fp32-scale variant (FP8-block experts): the scale is multiplied in as is.
  const std::vector<float> f32_scales = {0.1f, 3.0f};
  ASSERT_TRUE(dequantize_fp8_block_f32(Fp8BlockWeightF32{codes.data(), f32_scales.data(), 130, 3},
                                       127, 129, out.data())
                  .ok());
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(out[3], 3.0f);
}

TEST(WeightFormat, Mxfp4DequantHandComputed) {
  // One row of 64 logical elements: 32 packed bytes, 2 scales.
  std::vector<uint8_t> packed(32, 0);
  packed[0] = pack_e2m1(0x1, 0xF);                 // elems 0, 1: 0.5, -6
  packed[15] = pack_e2m1(0x6, 0xA);                // elems 30, 31: 4, -1
  packed[16] = pack_e2m1(0x7, 0x2);                // elems 32, 33: 6, 1
  packed[31] = pack_e2m1(0x5, 0xD);                // elems 62, 63: 3, -3
  EXPECT_EQ(packed[0], 0xF1);                      // low nibble first
  const std::vector<uint8_t> scales = {126, 129};  // 0.5, 4
  std::vector<float> out(64, -1.0f);
  ASSERT_TRUE(dequantize_mxfp4(Mxfp4Weight{packed.data(), scales.data(), 1, 64}, out.data()).ok());
  std::vector<float> want(64, 0.0f);
  want[0] = 0.25f;
  want[1] = -3.0f;
  want[30] = 2.0f;
  want[31] = -0.5f;
  want[32] = 24.0f;
  want[33] = 4.0f;
  want[62] = 12.0f;
  want[63] = -12.0f;
  EXPECT_EQ(out, want);
  EXPECT_FALSE(dequantize_mxfp4(Mxfp4Weight{packed.data(), scales.data(), 1, 48}, out.data()).ok());
}

TEST(WeightFormat, Nvfp4DequantHandComputed) {
  // One row of 32: two e4m3 block scales (1.0, 2.0) and a global scale 0.5.
  std::vector<uint8_t> packed(16, 0);
  packed[0] = pack_e2m1(0x5, 0x9);                   // 3, -0.5
  packed[8] = pack_e2m1(0xB, 0x7);                   // -1.5, 6
  packed[15] = pack_e2m1(0x4, 0x0);                  // 2, 0
  const std::vector<uint8_t> scales = {0x38, 0x40};  // e4m3 1.0, 2.0
  std::vector<float> out(32, -1.0f);
  ASSERT_TRUE(
      dequantize_nvfp4(Nvfp4Weight{packed.data(), scales.data(), 0.5f, 1, 32}, out.data()).ok());
  std::vector<float> want(32, 0.0f);
  want[0] = 1.5f;    // 3 * 1 * 0.5
  want[1] = -0.25f;  // -0.5 * 1 * 0.5
  want[16] = -1.5f;  // -1.5 * 2 * 0.5
  want[17] = 6.0f;   // 6 * 2 * 0.5
  want[30] = 2.0f;   // element 30 is in block 1: 2 * 2 * 0.5
  EXPECT_EQ(out, want);
}

TEST(WeightFormat, QuantizeFp8BlockHandComputed) {
  // 1 x 256: block 0 has amax 3 => s = 2^ceil(log2(3/448)) = 2^-7 (byte 120); block 1 is zero
  // => s = 1 (byte 127).
  std::vector<float> w(256, 0.0f);
  w[0] = 3.0f;    // 3 / 2^-7 = 384 = 1.5 * 2^8  -> 0.1111.100 = 0x7C
  w[1] = 1.0f;    // 128 = 2^7                   -> 0.1110.000 = 0x70
  w[2] = -0.5f;   // -64 = -2^6                  -> 1.1101.000 = 0xE8
  w[3] = 0.001f;  // 0.128 -> nearest on the 2^-6 grid of [2^-3, 2^-2): 0.125 -> 0.0100.000 = 0x20
  auto q = quantize_fp8_block(w.data(), 1, 256);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->scales, (std::vector<uint8_t>{120, 127}));
  EXPECT_EQ(q->codes[0], 0x7C);
  EXPECT_EQ(q->codes[1], 0x70);
  EXPECT_EQ(q->codes[2], 0xE8);
  EXPECT_EQ(q->codes[3], 0x20);
  for (int i = 4; i < 256; ++i) EXPECT_EQ(q->codes[size_t(i)], 0) << i;
  std::vector<float> back(256);
  ASSERT_TRUE(dequantize_fp8_block(q->view(), back.data()).ok());
  EXPECT_EQ(back[0], 3.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], -0.5f);
  EXPECT_EQ(back[3], 0.0009765625f);  // 0.125 * 2^-7
}

TEST(WeightFormat, QuantizeMxfp4HandComputed) {
  // Row 0: amax 6 => s = 1 (byte 127). Row 1: amax 1 => s = 2^ceil(log2(1/6)) = 0.25 (byte 125).
  std::vector<float> w(64, 0.0f);
  w[0] = 6.0f;    // code 7
  w[1] = 2.5f;    // tie 2|3 -> even mantissa: 2 (code 4)
  w[2] = -0.25f;  // tie 0|0.5 -> 0, negative zero (code 8)
  w[3] = 0.75f;   // tie 0.5|1 -> 1 (code 2)
  w[4] = 5.0f;    // tie 4|6 -> 4 (code 6)
  w[5] = -1.3f;   // nearest 1.5 (code 0xB)
  w[32] = 1.0f;   // 1 / 0.25 = 4 (code 6)
  w[33] = 0.1f;   // 0.4 -> 0.5 (code 1)
  auto q = quantize_mxfp4(w.data(), 2, 32);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->scales, (std::vector<uint8_t>{127, 125}));
  EXPECT_EQ(q->packed[0], 0x47);
  EXPECT_EQ(q->packed[1], 0x28);
  EXPECT_EQ(q->packed[2], 0xB6);
  EXPECT_EQ(q->packed[16], 0x16);
  std::vector<float> back(64);
  ASSERT_TRUE(dequantize_mxfp4(q->view(), back.data()).ok());
  EXPECT_EQ(back[1], 2.0f);
  EXPECT_EQ(back[4], 4.0f);
  EXPECT_EQ(back[5], -1.5f);
  EXPECT_EQ(back[32], 1.0f);
  EXPECT_EQ(back[33], 0.125f);
}

TEST(WeightFormat, QuantizeNvfp4HandComputed) {
  // Tensor amax 2688 => global = 2688 / (448 * 6) = 1. Row 0: block amax 2688 => block scale
  // e4m3(2688 / 6) = 448 (0x7E). Row 1: block amax 12 => e4m3(2) = 0x40.
  std::vector<float> w(32, 0.0f);
  w[0] = 2688.0f;  // 6 -> code 7
  w[1] = 448.0f;   // 1 -> code 2
  w[16] = 12.0f;   // 6 -> code 7
  w[17] = -3.0f;   // -1.5 -> code 0xB
  w[18] = 5.0f;    // 2.5 tie -> 2 (code 4) -> 4.0
  auto q = quantize_nvfp4(w.data(), 2, 16);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->global_scale, 1.0f);
  EXPECT_EQ(q->scales, (std::vector<uint8_t>{0x7E, 0x40}));
  EXPECT_EQ(q->packed[0], 0x27);
  EXPECT_EQ(q->packed[8], 0xB7);
  EXPECT_EQ(q->packed[9], 0x04);
  std::vector<float> back(32);
  ASSERT_TRUE(dequantize_nvfp4(q->view(), back.data()).ok());
  EXPECT_EQ(back[0], 2688.0f);
  EXPECT_EQ(back[1], 448.0f);
  EXPECT_EQ(back[16], 12.0f);
  EXPECT_EQ(back[17], -3.0f);
  EXPECT_EQ(back[18], 4.0f);
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> w(size_t(rows * cols));
  // Mostly N(0, 0.02) like the synthetic init, with a few rows scaled up to give the blocks
  // different magnitudes, and some exact zeros.
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = (r % 7 == 3) ? 50.0f : 1.0f;
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0.02f * rng.normal() * row_scale;
      if (rng.below(50) == 0) v = 0.0f;
      w[size_t(r * cols + c)] = v;
    }
  }
  return w;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(a[i]) * double(a[i]);
  }
  return std::sqrt(num / den);
}

TEST(WeightFormat, Fp8BlockRoundTripBound) {
  const int64_t rows = 300, cols = 384;  // partial row block at the end
  const auto w = random_matrix(rows, cols, 1);
  auto q = quantize_fp8_block(w.data(), rows, cols);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->scales.size(), 3u * 3u);
  std::vector<float> back(w.size());
  ASSERT_TRUE(dequantize_fp8_block(q->view(), back.data()).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      const float s = e8m0_to_float(q->scales[size_t((r / 128) * 3 + c / 128)]);
      EXPECT_LE(std::fabs(w[i] - back[i]), std::fabs(w[i]) / 16 + s * 0x1p-10f) << r << "," << c;
    }
  const double e = rel_rms(w, back);
  std::printf("FP8 block round trip: relative RMS error %.4f\n", e);
  EXPECT_LT(e, 0.04) << e;
  // Dequantized values are a fixed point of quantize -> dequantize.
  auto q2 = quantize_fp8_block(back.data(), rows, cols);
  ASSERT_TRUE(q2.ok());
  std::vector<float> back2(w.size());
  ASSERT_TRUE(dequantize_fp8_block(q2->view(), back2.data()).ok());
  EXPECT_EQ(back, back2);
  // A row range equals the same rows of the whole tensor.
  std::vector<float> part(size_t(5 * cols));
  ASSERT_TRUE(dequantize_fp8_block(q->view(), 126, 131, part.data()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), back.begin() + 126 * cols));
}

TEST(WeightFormat, Fp8BlockF32RoundTripBound) {
  const int64_t rows = 256, cols = 256;
  const auto w = random_matrix(rows, cols, 2);
  std::vector<uint8_t> codes(w.size());
  std::vector<float> scales(4);
  ASSERT_TRUE(quantize_fp8_block_f32(w.data(), rows, cols, codes.data(), scales.data()).ok());
  std::vector<float> back(w.size());
  ASSERT_TRUE(dequantize_fp8_block_f32(Fp8BlockWeightF32{codes.data(), scales.data(), rows, cols},
                                       0, rows, back.data())
                  .ok());
  for (size_t i = 0; i < w.size(); ++i) {
    const float s = scales[(i / size_t(cols)) / 128 * 2 + (i % size_t(cols)) / 128];
    EXPECT_LE(std::fabs(w[i] - back[i]), std::fabs(w[i]) / 16 + s * 0x1p-10f) << i;
  }
  EXPECT_LT(rel_rms(w, back), 0.04);
}

TEST(WeightFormat, Mxfp4RoundTripBound) {
  const int64_t rows = 64, cols = 256;
  const auto w = random_matrix(rows, cols, 3);
  auto q = quantize_mxfp4(w.data(), rows, cols);
  ASSERT_TRUE(q.ok());
  std::vector<float> back(w.size());
  ASSERT_TRUE(dequantize_mxfp4(q->view(), back.data()).ok());
  for (size_t i = 0; i < w.size(); ++i) {
    const float s = e8m0_to_float(q->scales[i / 32]);
    EXPECT_LE(std::fabs(w[i] - back[i]), std::max(std::fabs(w[i]), s) / 4) << i;
  }
  const double e = rel_rms(w, back);
  std::printf("MXFP4 round trip: relative RMS error %.4f\n", e);
  EXPECT_LT(e, 0.20) << e;
  auto q2 = quantize_mxfp4(back.data(), rows, cols);
  ASSERT_TRUE(q2.ok());
  std::vector<float> back2(w.size());
  ASSERT_TRUE(dequantize_mxfp4(q2->view(), back2.data()).ok());
  EXPECT_EQ(back, back2);
  std::vector<float> part(size_t(3 * cols));
  ASSERT_TRUE(dequantize_mxfp4(q->view(), 10, 13, part.data()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), back.begin() + 10 * cols));
}

TEST(WeightFormat, Nvfp4RoundTripBound) {
  const int64_t rows = 64, cols = 256;
  const auto w = random_matrix(rows, cols, 4);
  auto q = quantize_nvfp4(w.data(), rows, cols);
  ASSERT_TRUE(q.ok());
  std::vector<float> back(w.size());
  ASSERT_TRUE(dequantize_nvfp4(q->view(), back.data()).ok());
  for (size_t i = 0; i < w.size(); ++i) {
    const float S = e4m3_to_float(q->scales[i / 16]) * q->global_scale;
    EXPECT_LE(std::fabs(w[i] - back[i]), std::max(std::fabs(w[i]), S) / 4 * 1.0001f) << i;
  }
  const double e = rel_rms(w, back);
  std::printf("NVFP4 round trip: relative RMS error %.4f\n", e);
  EXPECT_LT(e, 0.20) << e;
  std::vector<float> part(size_t(2 * cols));
  ASSERT_TRUE(dequantize_nvfp4(q->view(), 62, 64, part.data()).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), back.begin() + 62 * cols));
}

TEST(WeightFormat, RefusesBadArguments) {
  std::vector<float> w(64, 1.0f);
  w[7] = std::nanf("");
  EXPECT_FALSE(quantize_fp8_block(w.data(), 2, 32).ok());
  EXPECT_FALSE(quantize_mxfp4(w.data(), 2, 32).ok());
  EXPECT_FALSE(quantize_nvfp4(w.data(), 2, 32).ok());
  w[7] = INFINITY;
  EXPECT_FALSE(quantize_fp8_block(w.data(), 2, 32).ok());
  w[7] = 1.0f;
  EXPECT_FALSE(quantize_mxfp4(w.data(), 4, 16).ok());  // K not a multiple of 32
  EXPECT_FALSE(quantize_nvfp4(w.data(), 8, 8).ok());   // K not a multiple of 16
  EXPECT_FALSE(quantize_fp8_block(w.data(), -1, 64).ok());
  // An all-zero tensor quantizes to zeros with unit scales.
  std::vector<float> z(64, 0.0f);
  auto q = quantize_nvfp4(z.data(), 2, 32);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->global_scale, 1.0f);
  std::vector<float> back(64, 1.0f);
  ASSERT_TRUE(dequantize_nvfp4(q->view(), back.data()).ok());
  for (float v : back) EXPECT_EQ(v, 0.0f);
  auto m = quantize_mxfp4(z.data(), 2, 32);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->scales, (std::vector<uint8_t>{127, 127}));
}

}  // namespace
}  // namespace ds
