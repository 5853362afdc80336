// Scalar conversions for the element types in dtype.h, written for bit-exactness rather than
// speed: the fast paths live in kernels; these are the definitions they are tested against.
#include "core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace ds {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: case DType::kU16: return 2;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

namespace {
struct NameEntry {
  DType dtype;
  std::string_view name;
};
constexpr std::array<NameEntry, 15> kNames = {{
    {DType::kF64, "F64"}, {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"},
    {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E8M0, "F8_E8M0"}, {DType::kI8, "I8"},
    {DType::kU8, "U8"}, {DType::kI16, "I16"}, {DType::kU16, "U16"}, {DType::kI32, "I32"},
    {DType::kU32, "U32"}, {DType::kI64, "I64"}, {DType::kU64, "U64"}, {DType::kBool, "BOOL"},
}};
}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const auto& e : kNames)
    if (e.dtype == dtype) return e.name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kNames)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

uint16_t float_to_bf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_fp16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // NaN
  if (abs == 0x7F800000u) return uint16_t(sign | 0x7C00u);
  // Work in units of the smallest fp16 subnormal (2^-24) with round-to-nearest-even, using
  // integer arithmetic on the float's significand.
  int exp = int(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7FFFFFu) | (exp > -127 ? 0x800000u : 0u);
  if (exp == -127) exp = -126;  // float subnormal
  // value = mant * 2^(exp-23). fp16 normal range: exp in [-14, 15].
  int shift;  // right shift that brings mant to the target grid
  uint32_t base_exp_field;
  if (exp >= -14) {
    shift = 13;  // keep 10 mantissa bits (+ implicit)
    base_exp_field = uint32_t(exp + 15);
  } else {
    shift = 13 + (-14 - exp);  // subnormal: grid 2^-24
    base_exp_field = 0;
  }
  if (shift > 31) return sign;  // far below half the smallest subnormal
  uint32_t kept = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (kept & 1u))) ++kept;
  uint32_t bits;
  if (base_exp_field == 0) {
    bits = kept;  // may round up into the smallest normal (kept == 0x400), which encodes right
  } else {
    // kept includes the implicit bit (0x400..0x800); a carry to 0x800 bumps the exponent.
    bits = (base_exp_field << 10) + (kept - 0x400u);
  }
  if (bits >= 0x7C00u) return uint16_t(sign | 0x7C00u);  // overflow to infinity
  return uint16_t(sign | bits);
}

float e4m3_to_float(uint8_t bits) {
  uint32_t sign = bits >> 7;
  uint32_t exp = (bits >> 3) & 0xFu;
  uint32_t mant = bits & 0x7u;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(float(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    v = std::ldexp(float(8 + mant), int(exp) - 7 - 3);
  }
  return sign ? -v : v;
}

uint8_t float_to_e4m3(float value, Fp8Saturation mode) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if (std::isnan(value)) return uint8_t(sign | 0x7F);
  float a = std::fabs(value);
  if (mode == Fp8Saturation::kNonSaturating) {
    if (a >= 480.0f) return uint8_t(sign | 0x7F);
  } else if (a > kE4M3Max) {
    return uint8_t(sign | 0x7E);  // 448
  }
  // Find the nearest representable magnitude with ties to even by scanning the 127 finite codes
  // would be slow; instead round on the grid of the value's binade.
  if (a == 0.0f) return sign;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int unbiased = e - 1;  // a in [2^unbiased, 2^(unbiased+1))
  if (unbiased < -6) unbiased = -6;  // subnormal grid spacing is 2^-9
  float quantum = std::ldexp(1.0f, unbiased - 3);
  float q = a / quantum;  // exact: power-of-two division
  float r = std::nearbyint(q);  // default rounding mode is to nearest even
  float rounded = r * quantum;
  if (rounded > kE4M3Max) rounded = kE4M3Max;  // only reachable from [448, 480) when non-saturating
  // Encode.
  if (rounded == 0.0f) return sign;
  int re;
  std::frexp(rounded, &re);
  int rexp = re - 1;
  uint8_t code;
  if (rexp < -6) {
    code = uint8_t(std::ldexp(rounded, 9));  // subnormal mantissa
  } else {
    uint32_t mant = uint32_t(std::ldexp(rounded, 3 - rexp)) - 8u;
    code = uint8_t(((rexp + 7) << 3) | mant);
  }
  return uint8_t(sign | code);
}

float e8m0_to_float(uint8_t bits) {
  if (bits == kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(bits) - 127);
}

std::optional<uint8_t> e8m0_from_exponent(int exponent) {
  if (exponent < -127 || exponent > 127) return std::nullopt;
  return uint8_t(exponent + 127);
}

uint8_t e8m0_ceil_pow2(float value) {
  if (!(value > 0.0f)) return 0;  // smallest scale
  if (std::isinf(value)) return 254;
  int e;
  float f = std::frexp(value, &e);  // value = f * 2^e, f in [0.5, 1)
  int exponent = (f == 0.5f) ? e - 1 : e;
  if (exponent < -127) exponent = -127;
  if (exponent > 127) exponent = 127;
  return uint8_t(exponent + 127);
}

namespace {
constexpr std::array<float, 8> kE2M1Magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}

float e2m1_to_float(uint8_t code) {
  float m = kE2M1Magnitudes[code & 0x7];
  return (code & 0x8) ? -m : m;
}

uint8_t float_to_e2m1(float value) {
  if (std::isnan(value)) return 0;
  uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  float a = std::fabs(value);
  if (a >= kE2M1Max) return uint8_t(sign | 0x7);
  // Midpoints between neighbours; at an exact midpoint pick the even code (even mantissa bit).
  uint8_t best = 0;
  for (uint8_t c = 0; c < 7; ++c) {
    float lo = kE2M1Magnitudes[c], hi = kE2M1Magnitudes[c + 1];
    float mid = 0.5f * (lo + hi);
    if (a < mid) { best = c; break; }
    if (a == mid) { best = (c % 2 == 0) ? c : uint8_t(c + 1); break; }
    best = uint8_t(c + 1);
  }
  return uint8_t(sign | best);
}

}  // namespace ds
