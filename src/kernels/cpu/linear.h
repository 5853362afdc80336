// Linear layers y = x @ W^T (dsv4-model.md §10, §10.1, §10.2, §10.3) for every weight format a
// DeepSeek-V4 checkpoint uses: fp32, bf16, FP8 e4m3 with e8m0 128x128 block scales, MXFP4 (e2m1
// packed low nibble first + e8m0 per 32) and NVFP4 (e2m1 + e4m3 per 16 + fp32 global scale).
// Weights are dequantized row by row on the fly; products accumulate in fp32. The FP8/FP4
// formats optionally quantize the input first (FP8 e4m3, ue8m0 per 128 K-elements, §10.2), which
// is what REF's fp8_gemm / fp4_gemm see.
#pragma once

#include <cstdint>

namespace ds::cpu {

enum class WeightFormat : uint8_t {
  kF32,       // data: float [N, K]
  kBF16,      // data: uint16 bf16 bits [N, K]
  kFp8Block,  // data: e4m3 [N, K]; scale: e8m0 [ceil(N/128), ceil(K/128)]
  kMxfp4,     // data: packed e2m1 [N, K/2] (element 2j low nibble); scale: e8m0 [N, K/32]
  kNvfp4,     // data: packed e2m1 [N, K/2]; scale: e4m3 [N, K/16]; global_scale: fp32
};

inline constexpr int kFp8WeightBlock = 128;  // §10: 128x128 weight blocks
inline constexpr int kMxfp4Block = 32;       // §10.1: one e8m0 per 32 K-elements
inline constexpr int kNvfp4Block = 16;       // §10.3: one e4m3 per 16 K-elements

// A weight matrix W[N, K] in one of the formats above (a non-owning view).
struct LinearWeight {
  WeightFormat format = WeightFormat::kF32;
  int64_t out_features = 0;        // N
  int64_t in_features = 0;         // K (logical, also for the packed FP4 formats)
  const void* data = nullptr;      // layout per format, see WeightFormat
  const uint8_t* scale = nullptr;  // layout per format; nullptr for kF32 / kBF16
  float global_scale = 1.0f;       // kNvfp4 only (weight_scale_2)
};

// True for the formats whose REF GEMM quantizes its input (§10.2).
bool is_quantized_format(WeightFormat format);

// Rows [row0, row0 + rows) of w as a view. For kFp8Block row0 must be a multiple of 128.
LinearWeight slice_rows(const LinearWeight& w, int64_t row0, int64_t rows);

// Dequantizes one row of W to fp32 (exact: every format's values times its scales are fp32
// representable).
//   out [K]
void dequantize_weight_row(const LinearWeight& w, int64_t row, float* out);

// y = x @ W^T with fp32 accumulation. When quantize_activations is set and the format is FP8 or
// FP4, x is first replaced by its FP8 simulation per 128 K-elements (§10.2); fp32/bf16 weights
// never quantize their input (REF's bf16 linears do not). y must not alias x.
//   x [num_tokens, K]
//   y [num_tokens, N]
void linear(const float* x, int64_t num_tokens, const LinearWeight& w, bool quantize_activations,
            float* y);

// Per-format entry points (thin wrappers over linear()).
//   x [num_tokens, in_features], y [num_tokens, out_features]
//   weight [out_features, in_features] fp32
void linear_f32(const float* x, int64_t num_tokens, const float* weight, int64_t out_features,
                int64_t in_features, float* y);
//   weight [out_features, in_features] bf16 bits
void linear_bf16(const float* x, int64_t num_tokens, const uint16_t* weight, int64_t out_features,
                 int64_t in_features, float* y);
//   weight [out_features, in_features] e4m3; scale [ceil(out/128), ceil(in/128)] e8m0
void linear_fp8_block(const float* x, int64_t num_tokens, const uint8_t* weight,
                      const uint8_t* scale, int64_t out_features, int64_t in_features,
                      bool quantize_activations, float* y);
//   weight [out_features, in_features/2] packed e2m1; scale [out_features, in_features/32] e8m0
void linear_mxfp4(const float* x, int64_t num_tokens, const uint8_t* weight, const uint8_t* scale,
                  int64_t out_features, int64_t in_features, bool quantize_activations, float* y);
//   weight [out_features, in_features/2] packed e2m1; scale [out_features, in_features/16] e4m3
void linear_nvfp4(const float* x, int64_t num_tokens, const uint8_t* weight, const uint8_t* scale,
                  float global_scale, int64_t out_features, int64_t in_features,
                  bool quantize_activations, float* y);

}  // namespace ds::cpu
