// Quantization simulation references: FP8 e4m3 (REF kernel.py act_quant semantics, power-of-two
// scales), FP4 e2m1 (REF fp4_act_quant), bf16 rounding. Scalar conversions come from core/dtype.h.
//
// REF computes the scale as 2^ceil(log2(amax * (1/max))) with the reciprocal rounded to fp32;
// this file divides by max instead. The two agree for every normal fp32 amax: the results can
// only differ next to an exact power of two, and for 448 and 6 the nearest fp32 values on both
// sides of max * 2^k round to the same side either way (checked by hand for the mantissas
// 1.75 and 1.5; the check is scale invariant).
#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

namespace ds::cpu {

void quantize_fp8_blocks(const float* x, int64_t n, int block, uint8_t* codes, uint8_t* scales,
                         float* dequant_out) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min<int64_t>(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    uint8_t scale_bits = e8m0_ceil_pow2(std::max(amax, kFp8AmaxFloor) / kE4M3Max);
    float scale = e8m0_to_float(scale_bits);
    if (scales) scales[b0 / block] = scale_bits;
    for (int64_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / scale, -kE4M3Max, kE4M3Max);
      uint8_t code = float_to_e4m3(v);
      if (codes) codes[i] = code;
      if (dequant_out) dequant_out[i] = e4m3_to_float(code) * scale;
    }
  }
}

void simulate_fp8_blocks(float* x, int64_t n, int block) {
  quantize_fp8_blocks(x, n, block, nullptr, nullptr, x);
}

void simulate_fp8_kv_nope(float* kv, int64_t num_vectors, int64_t head_dim, int64_t rope_dim) {
  const int64_t nope_dim = head_dim - rope_dim;
  for (int64_t v = 0; v < num_vectors; ++v) {
    simulate_fp8_blocks(kv + v * head_dim, nope_dim, kKvFp8Block);
  }
}

void quantize_fp4_blocks(const float* x, int64_t n, int block, uint8_t* packed, uint8_t* scales,
                         float* dequant_out) {
  // Smallest amax REF allows: 6 * 2^-126, so the scale never drops below 2^-126.
  const float amax_floor = kE2M1Max * std::ldexp(1.0f, -126);
  if (packed) std::fill(packed, packed + (n + 1) / 2, uint8_t{0});
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min<int64_t>(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    uint8_t scale_bits = e8m0_ceil_pow2(std::max(amax, amax_floor) / kE2M1Max);
    float scale = e8m0_to_float(scale_bits);
    if (scales) scales[b0 / block] = scale_bits;
    for (int64_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / scale, -kE2M1Max, kE2M1Max);
      uint8_t code = float_to_e2m1(v);
      if (packed) packed[i / 2] |= uint8_t((i % 2 == 0) ? code : (code << 4));
      if (dequant_out) dequant_out[i] = e2m1_to_float(code) * scale;
    }
  }
}

void simulate_fp4_blocks(float* x, int64_t n, int block) {
  quantize_fp4_blocks(x, n, block, nullptr, nullptr, x);
}

float round_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

void bf16_to_float_array(const uint16_t* bits, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(bits[i]);
}

}  // namespace ds::cpu
