// FP8 block quantization reference against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
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
