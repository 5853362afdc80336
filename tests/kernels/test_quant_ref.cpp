// Quantization simulation references against hand-computed values: FP8 block quantization
// (§10.2), the FP8 KV nope simulation (§7.2), FP4 block quantization (§7.7) and bf16 rounding.
// All comparisons are exact: each value is a power-of-two scale times a grid value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {
namespace {

TEST(QuantizeFp8Blocks, PowerOfTwoScalePerBlock) {
  // Block 0: amax 3.0 -> 3/448 -> scale 2^ceil(log2(0.0067)) = 2^-7; 3.0 / 2^-7 = 384 (exact).
  // Block 1: amax 0 -> floor 1e-4/448 -> 2^-22.
  std::vector<float> x = {3.0f, -1.0f, 0.1f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<uint8_t> codes(8), scales(2);
  std::vector<float> deq(8);
  quantize_fp8_blocks(x.data(), 8, 4, codes.data(), scales.data(), deq.data());
  EXPECT_EQ(scales[0], 127 - 7);
  EXPECT_EQ(scales[1], 127 - 22);
  EXPECT_EQ(deq[0], 3.0f);
  EXPECT_EQ(deq[1], -1.0f);
  // 0.1 * 128 = 12.8 -> e4m3 grid near 12.8 has spacing 1 (8..16): 13 -> 13/128.
  EXPECT_EQ(deq[2], 13.0f / 128.0f);
  EXPECT_EQ(codes[0], float_to_e4m3(384.0f));
  for (int i = 3; i < 8; ++i) EXPECT_EQ(deq[i], 0.0f);
}

}  // namespace
}  // namespace ds::cpu

// ---- FP8 KV nope simulation, FP4 simulation, bf16 rounding (dsv4-model.md §7.2, §7.7) ----------
namespace ds::cpu {
namespace {

TEST(SimulateFp8KvNope, BlocksOf64AndRopeTailUntouched) {
  // head_dim 192 = nope 128 (two blocks of 64) + rope 64. Block 0 holds 3.0 (scale 2^-7, as in
  // the test above), block 1 holds 0.75 (0.75/448 -> 2^-9; 0.75*512 = 384 exact) plus 0.3:
  // 0.3*512 = 153.6, on the e4m3 grid of [128, 256) (spacing 16) -> 160 -> 0.3125.
  const int64_t head_dim = 192, rope_dim = 64;
  Rng rng(7);
  std::vector<float> kv(head_dim);
  for (auto& v : kv) v = rng.uniform(-0.01f, 0.01f);
  kv[5] = 3.0f;
  kv[64] = 0.75f;
  kv[65] = 0.3f;
  std::vector<float> original = kv;
  simulate_fp8_kv_nope(kv.data(), 1, head_dim, rope_dim);
  EXPECT_EQ(kv[5], 3.0f);
  EXPECT_EQ(kv[64], 0.75f);
  EXPECT_EQ(kv[65], 0.3125f);
  for (int64_t i = 128; i < head_dim; ++i) EXPECT_EQ(kv[i], original[i]) << i;  // rope: bit-exact
  // Every nope value matches the generic block quantizer with block 64 (exact).
  std::vector<float> expected(original.begin(), original.begin() + 128);
  quantize_fp8_blocks(expected.data(), 128, 64, nullptr, nullptr, expected.data());
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(kv[i], expected[i]) << i;
}

TEST(QuantizeFp4Blocks, HandComputedBlock) {
  // Block of 32 with amax 3.0: s = 2^ceil(log2(3/6)) = 2^-1. x/s = 6 -> code 7 (6.0);
  // 1.1/0.5 = 2.2 -> nearest e2m1 is 2 -> 1.0; -0.7/0.5 = -1.4 -> -1.5 -> -0.75;
  // 0.125/0.5 = 0.25 -> tie between 0 and 0.5: ties to even -> 0.
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f;
  x[1] = 1.1f;
  x[2] = -0.7f;
  x[3] = 0.125f;
  std::vector<uint8_t> packed(16), scales(1);
  std::vector<float> deq(32);
  quantize_fp4_blocks(x.data(), 32, 32, packed.data(), scales.data(), deq.data());
  EXPECT_EQ(scales[0], 127 - 1);
  EXPECT_EQ(deq[0], 3.0f);
  EXPECT_EQ(deq[1], 1.0f);
  EXPECT_EQ(deq[2], -0.75f);
  EXPECT_EQ(deq[3], 0.0f);
  // Packing: element 0 low nibble (code 7 = 6.0), element 1 high nibble (code 4 = 2.0).
  EXPECT_EQ(packed[0], uint8_t(0x47));
  EXPECT_EQ(packed[1], uint8_t(0x0B));  // element 2: sign|3 (1.5) = 0xB, element 3: 0
}

TEST(QuantizeFp4Blocks, AmaxFloorAndZeroBlock) {
  // An all-zero block uses the floor amax 6 * 2^-126 -> scale 2^-126, values 0.
  std::vector<float> x(32, 0.0f);
  std::vector<uint8_t> scales(1);
  std::vector<float> deq(32, 1.0f);
  quantize_fp4_blocks(x.data(), 32, 32, nullptr, scales.data(), deq.data());
  EXPECT_EQ(scales[0], 127 - 126);
  for (float v : deq) EXPECT_EQ(v, 0.0f);
}

TEST(SimulateFp4Blocks, ErrorBoundedByHalfStep) {
  // Property: |x - fp4(x)| <= s (the largest e2m1 step, 2 * s, halved), blockwise; values at the
  // block amax are exact when amax/s is on the grid.
  Rng rng(11);
  const int64_t n = 128;
  std::vector<float> x(n);
  for (auto& v : x) v = rng.normal();
  std::vector<float> y = x;
  simulate_fp4_blocks(y.data(), n, 32);
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = std::ldexp(1.0f, int(std::ceil(std::log2(amax / 6.0f))));
    for (int64_t i = b; i < b + 32; ++i) EXPECT_LE(std::fabs(x[i] - y[i]), s) << i;
  }
}

TEST(RoundBf16, NearestEven) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  std::vector<float> v = {0.1f, -2.5f};
  round_to_bf16(v.data(), 2);
  EXPECT_EQ(v[0], bf16_to_float(float_to_bf16(0.1f)));
  EXPECT_EQ(v[1], -2.5f);
}

}  // namespace
}  // namespace ds::cpu
