// Bit-exact tests of the scalar dtype conversions: exhaustive over every code of the small types
// (fp8, e8m0, e2m1) and over every bf16/fp16 bit pattern, against independent brute-force
// "nearest representable value, ties to even" oracles written here in double precision.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace ds {
namespace {

// Brute-force round-to-nearest-even onto a finite set of (value, code) pairs sorted by value.
// "Even" means the code's lowest mantissa bit is 0, which for these formats is the code's bit 0.
struct Candidate {
  double value;
  int code;
};
int nearest_even(double x, const std::vector<Candidate>& grid) {
  int best = -1;
  double best_err = std::numeric_limits<double>::infinity();
  for (const auto& c : grid) {
    double err = std::fabs(c.value - x);
    if (err < best_err || (err == best_err && (c.code & 1) == 0 && (best & 1) == 1)) {
      best = c.code;
      best_err = err;
    }
  }
  return best;
}

TEST(DType, NamesRoundTripAndSizes) {
  for (auto name : {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I16", "U16",
                    "I32", "U32", "I64", "U64", "BOOL"}) {
    auto dt = dtype_from_name(name);
    ASSERT_TRUE(dt.has_value()) << name;
    EXPECT_EQ(dtype_name(*dt), name);
  }
  EXPECT_FALSE(dtype_from_name("F8_E5M2").has_value());
  EXPECT_FALSE(dtype_from_name("bf16").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
}

TEST(BF16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_float(uint16_t(b));
    uint16_t back = float_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(BF16, RoundsToNearestEven) {
  // Exactly halfway between 1.0 (0x3F80) and the next bf16 (0x3F81): ties to even -> 0x3F80.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);
  // Halfway between 0x3F81 and 0x3F82 -> even 0x3F82.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  // Largest finite float rounds to bf16 infinity.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Random floats against a double-precision nearest-even oracle over the two neighbours.
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = uint32_t(rng.next_u64());
    float f = std::bit_cast<float>(u);
    if (!std::isfinite(f)) continue;
    uint16_t lo = uint16_t(u >> 16);  // truncation toward zero in magnitude
    uint16_t hi = uint16_t(lo + 1);
    double dlo = bf16_to_float(lo), dhi = bf16_to_float(hi);
    std::vector<Candidate> grid = {{dlo, lo}, {dhi, hi}};
    if (std::isinf(dhi)) grid.back().value = std::ldexp(1.0, 128) * (f < 0 ? -1 : 1);
    EXPECT_EQ(float_to_bf16(f), uint16_t(nearest_even(f, grid))) << u;
  }
}

TEST(FP16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = fp16_to_float(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(((b >> 10) & 0x1F) == 0x1F && (b & 0x3FF) != 0);
      continue;
    }
    EXPECT_EQ(float_to_fp16(f), b) << b;
  }
  EXPECT_EQ(fp16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
}

TEST(FP16, RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  // Oracle: the neighbouring fp16 values of every float, by searching the sorted fp16 grid.
  std::vector<Candidate> positives;
  for (int b = 0; b < 0x7C00; ++b) positives.push_back({fp16_to_float(uint16_t(b)), b});
  positives.push_back({65536.0, 0x7C00});  // what overflow rounds to (2^16 acts as "infinity")
  auto oracle = [&](float f) -> uint16_t {
    double a = std::fabs(double(f));
    uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0) return uint16_t(sign | 0x7C00);  // halfway 65504..65536 rounds up
    // Binary search the neighbours, then resolve with the nearest-even rule.
    size_t lo = 0, hi = positives.size() - 1;
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      (positives[mid].value <= a ? lo : hi) = mid;
    }
    std::vector<Candidate> two = {positives[lo], positives[hi]};
    return uint16_t(sign | nearest_even(a, two));
  };
  Rng rng(2);
  for (int i = 0; i < 300000; ++i) {
    // Concentrate on the fp16 range: random exponent in [-30, 17].
    float f = std::ldexp(float(rng.uniform()) + 0.5f, int(rng.below(48)) - 30);
    if (rng.below(2)) f = -f;
    ASSERT_EQ(float_to_fp16(f), oracle(f)) << f;
  }
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);                     // tie -> even 0
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);                     // above half
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);                     // tie 1|2 -> 2
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
}

std::vector<Candidate> e4m3_finite_grid() {
  std::vector<Candidate> grid;
  for (int c = 0; c < 0x7F; ++c) grid.push_back({e4m3_to_float(uint8_t(c)), c});
  return grid;
}

TEST(E4M3, DecodesEveryCode) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  // No infinities anywhere, values strictly increasing over the positive codes.
  for (int c = 0; c < 256; ++c) EXPECT_FALSE(std::isinf(e4m3_to_float(uint8_t(c))));
  for (int c = 1; c < 0x7F; ++c) EXPECT_GT(e4m3_to_float(uint8_t(c)), e4m3_to_float(uint8_t(c - 1)));
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(c))), c) << c;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(c)), Fp8Saturation::kNonSaturating), c) << c;
  }
}

TEST(E4M3, EncodesEveryBf16ValueToNearestEven) {
  auto grid = e4m3_finite_grid();
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_float(uint16_t(b));
    uint8_t sat = float_to_e4m3(f, Fp8Saturation::kSaturate);
    uint8_t nonsat = float_to_e4m3(f, Fp8Saturation::kNonSaturating);
    uint8_t sign = std::signbit(f) ? 0x80 : 0;
    if (std::isnan(f)) {
      EXPECT_EQ(sat & 0x7F, 0x7F);
      EXPECT_EQ(nonsat & 0x7F, 0x7F);
      continue;
    }
    double a = std::fabs(double(f));
    if (a > 448.0) {
      EXPECT_EQ(sat, sign | 0x7E) << f;
      if (a >= 480.0) EXPECT_EQ(nonsat, sign | 0x7F) << f;
      else EXPECT_EQ(nonsat, sign | 0x7E) << f;
      continue;
    }
    int expect = nearest_even(a, grid) | sign;
    EXPECT_EQ(sat, expect) << f;
    EXPECT_EQ(nonsat, expect) << f;
  }
}

TEST(E4M3, RandomFloatsAndBoundaries) {
  auto grid = e4m3_finite_grid();
  Rng rng(3);
  for (int i = 0; i < 100000; ++i) {
    float f = std::ldexp(float(rng.uniform()) + 0.5f, int(rng.below(26)) - 16);
    ASSERT_EQ(float_to_e4m3(f), nearest_even(f, grid)) << f;
  }
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // tie between 448 and (virtual) 480 -> 448 (even)
  EXPECT_EQ(float_to_e4m3(479.9f, Fp8Saturation::kNonSaturating), 0x7E);
  EXPECT_EQ(float_to_e4m3(480.0f, Fp8Saturation::kNonSaturating), 0x7F);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity(), Fp8Saturation::kNonSaturating),
            0x7F);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of the smallest subnormal: even
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -11)), 0x01);
}

TEST(E8M0, EveryCode) {
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(e8m0_to_float(uint8_t(b)), std::ldexp(1.0f, b - 127)) << b;
    EXPECT_EQ(e8m0_from_exponent(b - 127), b);
    EXPECT_EQ(e8m0_ceil_pow2(std::ldexp(1.0f, b - 127)), b) << b;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_FALSE(e8m0_from_exponent(128).has_value());
  EXPECT_FALSE(e8m0_from_exponent(-128).has_value());
  EXPECT_EQ(e8m0_ceil_pow2(3.0f), 129);      // 2^ceil(log2 3) = 4
  EXPECT_EQ(e8m0_ceil_pow2(0.3f), 127 - 1);  // 0.5
  EXPECT_EQ(e8m0_ceil_pow2(1.0f + 1e-7f), 128);
}

TEST(E2M1, EveryCodeAndPacking) {
  const float expect[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = e2m1_to_float(uint8_t(c));
    EXPECT_EQ(std::fabs(v), expect[c & 7]);
    EXPECT_EQ(std::signbit(v), (c & 8) != 0);
    EXPECT_EQ(float_to_e2m1(v), c);
  }
  uint8_t byte = pack_e2m1(0x3, 0xC);  // element 2j = 1.5, element 2j+1 = -2
  EXPECT_EQ(byte, 0xC3);
  EXPECT_EQ(e2m1_to_float(e2m1_low(byte)), 1.5f);
  EXPECT_EQ(e2m1_to_float(e2m1_high(byte)), -2.0f);
}

TEST(E2M1, EncodesEveryBf16ValueToNearestEvenWithSaturation) {
  std::vector<Candidate> grid;
  for (int c = 0; c < 8; ++c) grid.push_back({e2m1_to_float(uint8_t(c)), c});
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_float(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_EQ(float_to_e2m1(f), 0);
      continue;
    }
    int sign = std::signbit(f) ? 8 : 0;
    double a = std::fabs(double(f));
    int expect = a >= 6.0 ? 7 : nearest_even(a, grid);
    EXPECT_EQ(float_to_e2m1(f), expect | sign) << f;
  }
  EXPECT_EQ(float_to_e2m1(0.25f), 0);
  EXPECT_EQ(float_to_e2m1(0.75f), 2);
  EXPECT_EQ(float_to_e2m1(2.5f), 4);
  EXPECT_EQ(float_to_e2m1(5.0f), 6);
  EXPECT_EQ(float_to_e2m1(100.0f), 7);
}

}  // namespace
}  // namespace ds
