// Element types and bit-exact scalar conversions: bf16, fp16, fp32, fp8 e4m3 ("fn": no
// infinities), e8m0 (power-of-two scales), e2m1 (FP4, packed two per byte, low nibble first).
// These are the host-side definitions every kernel's reference and every weight-format routine
// uses; dsv4-model.md §10 defines how the checkpoint stores them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

static_assert(std::endian::native == std::endian::little,
              "deepserve supports little-endian hosts only (safetensors data is little-endian)");

namespace ds {

// Element types that can appear in a checkpoint or a tensor view. Names follow safetensors.
enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; NaN = S.1111.111
  kF8E8M0,  // float8_e8m0fnu: 8-bit exponent (bias 127), no sign, no mantissa; 0xFF = NaN
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,
};

// Bytes per element (every supported dtype is at least one byte; FP4 lives packed in I8/U8).
size_t dtype_size(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype name; nullopt for unknown names (sub-byte and exotic types such as
// F8_E5M2 or F4 are not accepted: DeepSeek-V4 does not use them).
std::optional<DType> dtype_from_name(std::string_view name);

// ---- bf16 --------------------------------------------------------------------------------------
inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
// Round to nearest even; NaN stays NaN (quietened), infinities stay infinities.
uint16_t float_to_bf16(float value);

// ---- fp16 (IEEE binary16) ----------------------------------------------------------------------
float fp16_to_float(uint16_t bits);
// Round to nearest even, subnormals included; overflow gives infinity; NaN stays NaN.
uint16_t float_to_fp16(float value);

// ---- fp8 e4m3fn ------------------------------------------------------------------------------
inline constexpr float kE4M3Max = 448.0f;
float e4m3_to_float(uint8_t bits);
enum class Fp8Saturation {
  // Finite values beyond ±448 clamp to ±448, ±inf clamps too, NaN stays NaN. This is what the
  // reference quantizers produce (they clamp to ±448 before the cast).
  kSaturate,
  // torch's `.to(torch.float8_e4m3fn)`: |x| >= 480 (the first value that would round past 448)
  // and ±inf become NaN.
  kNonSaturating,
};
// Round to nearest even (subnormals included).
uint8_t float_to_e4m3(float value, Fp8Saturation mode = Fp8Saturation::kSaturate);

// ---- e8m0 (ue8m0 scales) -----------------------------------------------------------------------
inline constexpr uint8_t kE8M0Nan = 0xFF;
// 2^(bits-127); 0xFF is NaN.
float e8m0_to_float(uint8_t bits);
// Encodes 2^exponent; nullopt when exponent is outside [-127, 127].
std::optional<uint8_t> e8m0_from_exponent(int exponent);
// The smallest power of two >= value (the reference's 2^ceil(log2(x))), encoded. value must be
// positive and finite; results are clamped to the representable range [2^-127, 2^127].
uint8_t e8m0_ceil_pow2(float value);

// ---- e2m1 (FP4) --------------------------------------------------------------------------------
// Code bit 3 is the sign; codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline constexpr float kE2M1Max = 6.0f;
float e2m1_to_float(uint8_t code);  // uses the low 4 bits
// Round to nearest even on the e2m1 grid, saturating at ±6; NaN maps to +0 (e2m1 has no NaN).
uint8_t float_to_e2m1(float value);
// Packing: element 2j in the low nibble, element 2j+1 in the high nibble (REF convert.py).
inline uint8_t pack_e2m1(uint8_t low_code, uint8_t high_code) {
  return uint8_t((low_code & 0xF) | ((high_code & 0xF) << 4));
}
inline uint8_t e2m1_low(uint8_t byte) { return byte & 0xF; }
inline uint8_t e2m1_high(uint8_t byte) { return byte >> 4; }

}  // namespace ds
