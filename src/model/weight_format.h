// Quantized weight formats of DeepSeek-V4 checkpoints (dsv4-model.md §10) on the host:
// dequantization to fp32 (whole tensors or a row range [row_begin, row_end), which is what the CPU
// reference uses to dequantize on the fly) and the inverse quantizers that the synthetic
// checkpoint writer uses. Formats:
//   - FP8 block: e4m3 [rows, cols] with one ue8m0 scale per 128x128 block, W = e4m3 * 2^(s-127);
//   - FP8 block with fp32 scales (Flash-Base experts, expert_dtype "fp8"), W = e4m3 * s;
//   - MXFP4: e2m1 packed two per byte (low nibble first) [rows, cols/2] with one ue8m0 scale per
//     32 consecutive K elements [rows, cols/32] (§10.1, the OCP MX layout);
//   - NVFP4: e2m1 packed likewise, one e4m3 scale per 16 K elements [rows, cols/16] and one fp32
//     global scale, W = e2m1 * e4m3(s) * global (§10.3).
// Scalar conversions come from core/dtype.h. All functions check their arguments and return a
// Status; none of them aborts on bad input.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace ds {

inline constexpr int64_t kFp8WeightBlock = 128;  // 128x128 weight blocks (quantization_config)
inline constexpr int64_t kMxfp4Block = 32;       // K elements per ue8m0 scale
inline constexpr int64_t kNvfp4Block = 16;       // K elements per e4m3 scale

// ---- views of stored tensors -------------------------------------------------------------------

struct Fp8BlockWeight {
  const uint8_t* codes = nullptr;   // [rows, cols] e4m3
  const uint8_t* scales = nullptr;  // [ceil(rows/128), ceil(cols/128)] e8m0
  int64_t rows = 0, cols = 0;
};

struct Fp8BlockWeightF32 {
  const uint8_t* codes = nullptr;  // [rows, cols] e4m3
  const float* scales = nullptr;   // [ceil(rows/128), ceil(cols/128)] fp32, multiplied in
  int64_t rows = 0, cols = 0;
};

struct Mxfp4Weight {
  const uint8_t* packed = nullptr;  // [rows, cols/2] e2m1, element 2j low nibble, 2j+1 high
  const uint8_t* scales = nullptr;  // [rows, cols/32] e8m0
  int64_t rows = 0, cols = 0;       // logical shape; cols % 32 == 0
};

struct Nvfp4Weight {
  const uint8_t* packed = nullptr;  // [rows, cols/2] e2m1, element 2j low nibble, 2j+1 high
  const uint8_t* scales = nullptr;  // [rows, cols/16] e4m3
  float global_scale = 1.0f;        // weight_scale_2
  int64_t rows = 0, cols = 0;       // logical shape; cols % 16 == 0
};

// ---- dequantization ----------------------------------------------------------------------------
// Each writes rows [row_begin, row_end) into out ([row_end - row_begin, cols] fp32, row-major).
// An e8m0 scale byte 0xFF (NaN) or an e4m3 NaN code dequantizes to NaN (the optional value scan
// of reliability.md rule 23 refuses such files before they get here).

Status dequantize_fp8_block(const Fp8BlockWeight& w, int64_t row_begin, int64_t row_end,
                            float* out);
Status dequantize_fp8_block_f32(const Fp8BlockWeightF32& w, int64_t row_begin, int64_t row_end,
                                float* out);
Status dequantize_mxfp4(const Mxfp4Weight& w, int64_t row_begin, int64_t row_end, float* out);
Status dequantize_nvfp4(const Nvfp4Weight& w, int64_t row_begin, int64_t row_end, float* out);

// Whole-tensor conveniences: out [rows, cols].
inline Status dequantize_fp8_block(const Fp8BlockWeight& w, float* out) {
  return dequantize_fp8_block(w, 0, w.rows, out);
}
inline Status dequantize_mxfp4(const Mxfp4Weight& w, float* out) {
  return dequantize_mxfp4(w, 0, w.rows, out);
}
inline Status dequantize_nvfp4(const Nvfp4Weight& w, float* out) {
  return dequantize_nvfp4(w, 0, w.rows, out);
}

// ---- quantization (synthetic checkpoints) -----------------------------------------------------
// Inputs must be finite (a NaN/Inf weight is refused with kInvalidArgument).

// FP8 block: per 128x128 block, s = 2^ceil(log2(amax / 448)) (ue8m0, e8m0_ceil_pow2), codes =
// e4m3(w / s) saturating at ±448, round to nearest even. An all-zero block gets s = 1 (byte 127).
//   w      [rows, cols]
//   codes  [rows, cols] e4m3 (out)
//   scales [ceil(rows/128), ceil(cols/128)] e8m0 (out)
Status quantize_fp8_block(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                          uint8_t* scales);
// Same grid with fp32 scales s = amax / 448 (no power-of-two rounding), for FP8-block experts.
//   scales [ceil(rows/128), ceil(cols/128)] fp32 (out)
Status quantize_fp8_block_f32(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                              float* scales);

// MXFP4: per 32 consecutive K elements, s = 2^ceil(log2(amax / 6)) (ue8m0), codes = e2m1(w / s)
// round to nearest even, saturating at ±6. An all-zero block gets s = 1 (byte 127).
//   w      [rows, cols], cols % 32 == 0
//   packed [rows, cols/2] (out)
//   scales [rows, cols/32] e8m0 (out)
Status quantize_mxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales);

// NVFP4, following the ModelOpt recipe (§10.3): global = amax(|w|) / (448 * 6) over the whole
// tensor (1 when the tensor is all zeros); per 16 K elements the scale is
// e4m3(amax_block / (6 * global)) (round to nearest even, <= 448 by construction), and codes =
// e2m1(w / (e4m3_value * global)) round to nearest even, saturating at ±6 (a block whose scale
// rounds to 0 stores zeros).
//   w      [rows, cols], cols % 16 == 0
//   packed [rows, cols/2] (out)
//   scales [rows, cols/16] e4m3 (out)
//   global_scale (out)
Status quantize_nvfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales,
                      float* global_scale);

// Owning results for tests and small tools.
struct Fp8BlockQuantized {
  std::vector<uint8_t> codes;   // [rows, cols]
  std::vector<uint8_t> scales;  // [ceil(rows/128), ceil(cols/128)]
  int64_t rows = 0, cols = 0;
  Fp8BlockWeight view() const { return {codes.data(), scales.data(), rows, cols}; }
};
struct Mxfp4Quantized {
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/32]
  int64_t rows = 0, cols = 0;
  Mxfp4Weight view() const { return {packed.data(), scales.data(), rows, cols}; }
};
struct Nvfp4Quantized {
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/16]
  float global_scale = 1.0f;
  int64_t rows = 0, cols = 0;
  Nvfp4Weight view() const { return {packed.data(), scales.data(), global_scale, rows, cols}; }
};
Result<Fp8BlockQuantized> quantize_fp8_block(const float* w, int64_t rows, int64_t cols);
Result<Mxfp4Quantized> quantize_mxfp4(const float* w, int64_t rows, int64_t cols);
Result<Nvfp4Quantized> quantize_nvfp4(const float* w, int64_t rows, int64_t cols);

}  // namespace ds
