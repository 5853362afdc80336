// The arithmetic of the GPU epilogue's division (kernels/cuda/common/div_rn.h, used by the MoE
// gate/up epilogue's silu through div_rn.cuh) on the CPU: for d = 1 + e^-x it must round x / d as
// IEEE division does when it starts from the correctly rounded reciprocal of d. Inputs: every bf16
// value, every 4099th fp32 bit pattern, 65536 consecutive patterns around each edge (the denormals
// and tiny values from +-0, d crossing 2^64 near x = -44.36, e^-x overflowing near x = -88.72),
// +-inf and NaNs. Any NaN matches any NaN.
// From an estimate one ulp off, the Newton step does not always reach the correctly rounded
// reciprocal, and x = 2^-23 (x / d = 2^-24 (1 + 2^-24 + ...), just above a midpoint) then rounds
// down: the second test pins that down. Whether the GPU's rcp.approx gives the right bits for
// every input is what test_moe_cuda's DivRnGe1MatchesIeeeDivisionForSilu checks (all 2^32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/common/div_rn.h"

namespace ds {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float silu_div(float x, int rcp_ulps) {
  const auto rcp = [rcp_ulps](float v) {
    const float r = 1.0f / v;
    return rcp_ulps == 0 ? r : std::nextafter(r, rcp_ulps < 0 ? 0.0f : INFINITY);
  };
  return cuda::div_rn_ge1_with(x, 1.0f + std::exp(-x), rcp);
}

TEST(DivRnGe1, RoundsAsIeeeDivisionFromTheRoundedReciprocal) {
  std::vector<uint32_t> inputs;
  for (uint32_t b = 0; b < (1u << 16); ++b) inputs.push_back(b << 16);  // every bf16
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) inputs.push_back(uint32_t(u));
  for (float edge : {0.0f, -44.36f, -88.72f}) {
    for (float sign : {1.0f, -1.0f}) {
      const uint32_t c = float_to_bits(sign * edge);
      const uint32_t first = edge == 0.0f ? c : c - 32768;
      for (uint32_t k = 0; k < (1u << 16); ++k) inputs.push_back(first + k);
    }
  }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u}) inputs.push_back(u);

  int64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint32_t u : inputs) {
    const float x = bits_to_float(u);
    const float want = x / (1.0f + std::exp(-x)), got = silu_div(x, 0);
    const bool same =
        float_to_bits(got) == float_to_bits(want) || (std::isnan(got) && std::isnan(want));
    if (!same && mismatches++ == 0) first_bad = u;
  }
  EXPECT_GT(inputs.size(), size_t(1300000));
  EXPECT_EQ(mismatches, 0) << "first mismatching x (bits) 0x" << std::hex << first_bad;
}

// The limit of the argument: from a reciprocal one ulp off, the near-midpoint quotient at
// x = 2^-23 (d = 2 - 2^-23) rounds down to 2^-24 instead of up. On the GPU this depends on what
// rcp.approx returns for that d (the exhaustive GPU test decides).
TEST(DivRnGe1, NearMidpointQuotientNeedsTheRoundedReciprocal) {
  const float x = 0x1p-23f;
  const float want = x / (1.0f + std::exp(-x));
  EXPECT_EQ(want, 0x1.000002p-24f);
  EXPECT_EQ(silu_div(x, 0), want);
  EXPECT_EQ(silu_div(x, -1), 0x1p-24f);
  EXPECT_EQ(silu_div(x, 1), 0x1p-24f);
}

}  // namespace
}  // namespace ds
