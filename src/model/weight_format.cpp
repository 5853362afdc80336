// Host dequantizers and quantizers for the FP8-block, MXFP4 and NVFP4 weight formats
// (dsv4-model.md §10, §10.1, §10.3). Written for clarity: the CPU reference dequantizes a few rows
// at a time, and the synthetic checkpoint writer quantizes tiny models; fast paths live in kernels.
#include "model/weight_format.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/checked_math.h"
#include "core/dtype.h"
#include "kernels/cpu/linear.h"

namespace ds {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Status check_shape(const char* fn, const void* a, const void* b, int64_t rows, int64_t cols,
                   int64_t col_multiple) {
  if (rows < 0 || cols < 0)
    return invalid_argument(std::string(fn) + ": negative shape [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  if (cols % col_multiple != 0)
    return invalid_argument(std::string(fn) + ": cols = " + std::to_string(cols) +
                            " is not a multiple of " + std::to_string(col_multiple));
  if (!checked_mul(uint64_t(rows), uint64_t(cols)) ||
      uint64_t(rows) * uint64_t(cols) > (uint64_t(1) << 62))
    return invalid_argument(std::string(fn) + ": shape too large");
  if ((!a || !b) && rows > 0 && cols > 0)
    return invalid_argument(std::string(fn) + ": null pointer");
  return ok_status();
}

Status check_rows(const char* fn, int64_t rows, int64_t row_begin, int64_t row_end,
                  const float* out) {
  if (row_begin < 0 || row_end < row_begin || row_end > rows)
    return out_of_range(std::string(fn) + ": row range [" + std::to_string(row_begin) + ", " +
                        std::to_string(row_end) + ") is outside [0, " + std::to_string(rows) + ")");
  if (!out && row_end > row_begin) return invalid_argument(std::string(fn) + ": null output");
  return ok_status();
}

Status check_finite(const char* fn, const float* w, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(w[i]))
      return invalid_argument(std::string(fn) + ": element " + std::to_string(i) +
                              " is not finite");
  return ok_status();
}

// Tables: the 256 e4m3 values and the 16 e2m1 values, so the inner loops are lookups.
struct Tables {
  float e4m3[256];
  float e2m1[16];
  Tables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_float(uint8_t(i));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// The validated row range of a stored weight, through the CPU kernels' decoder (the one the
// forward uses), so that there is a single definition of each format's dequantization.
void dequantize_rows(const cpu::LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  for (int64_t r = row_begin; r < row_end; ++r)
    cpu::dequantize_weight_row(w, r, out + (r - row_begin) * w.in_features);
}

// Encodes 2^e for a block whose amax is `amax` and whose format maximum is `fmt_max`:
// e8m0_ceil_pow2(amax / fmt_max), or 127 (scale 1) for an all-zero block.
uint8_t pow2_scale(float amax, float fmt_max) {
  if (!(amax > 0.0f)) return 127;
  return e8m0_ceil_pow2(amax / fmt_max);
}

}  // namespace

// ---- dequantization ----------------------------------------------------------------------------

Status dequantize_fp8_block(const Fp8BlockWeight& w, int64_t row_begin, int64_t row_end,
                            float* out) {
  DS_RETURN_IF_ERROR(check_shape("dequantize_fp8_block", w.codes, w.scales, w.rows, w.cols, 1));
  DS_RETURN_IF_ERROR(check_rows("dequantize_fp8_block", w.rows, row_begin, row_end, out));
  dequantize_rows({cpu::WeightFormat::kFp8Block, w.rows, w.cols, w.codes, w.scales, 1.0f},
                  row_begin, row_end, out);
  return ok_status();
}

Status dequantize_fp8_block_f32(const Fp8BlockWeightF32& w, int64_t row_begin, int64_t row_end,
                                float* out) {
  DS_RETURN_IF_ERROR(check_shape("dequantize_fp8_block_f32", w.codes, w.scales, w.rows, w.cols, 1));
  DS_RETURN_IF_ERROR(check_rows("dequantize_fp8_block_f32", w.rows, row_begin, row_end, out));
  const Tables& t = tables();
  const int64_t scale_cols = ceil_div(w.cols, kFp8WeightBlock);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* codes = w.codes + r * w.cols;
    const float* srow = w.scales + (r / kFp8WeightBlock) * scale_cols;
    float* o = out + (r - row_begin) * w.cols;
    for (int64_t c = 0; c < w.cols; ++c) o[c] = t.e4m3[codes[c]] * srow[c / 128];
  }
  return ok_status();
}

Status dequantize_mxfp4(const Mxfp4Weight& w, int64_t row_begin, int64_t row_end, float* out) {
  DS_RETURN_IF_ERROR(
      check_shape("dequantize_mxfp4", w.packed, w.scales, w.rows, w.cols, kMxfp4Block));
  DS_RETURN_IF_ERROR(check_rows("dequantize_mxfp4", w.rows, row_begin, row_end, out));
  dequantize_rows({cpu::WeightFormat::kMxfp4, w.rows, w.cols, w.packed, w.scales, 1.0f},
                  row_begin, row_end, out);
  return ok_status();
}

Status dequantize_nvfp4(const Nvfp4Weight& w, int64_t row_begin, int64_t row_end, float* out) {
  DS_RETURN_IF_ERROR(
      check_shape("dequantize_nvfp4", w.packed, w.scales, w.rows, w.cols, kNvfp4Block));
  DS_RETURN_IF_ERROR(check_rows("dequantize_nvfp4", w.rows, row_begin, row_end, out));
  // Order of multiplication as the format defines it: (e2m1 * block scale) * global.
  dequantize_rows({cpu::WeightFormat::kNvfp4, w.rows, w.cols, w.packed, w.scales, w.global_scale},
                  row_begin, row_end, out);
  return ok_status();
}

// ---- quantization ------------------------------------------------------------------------------

namespace {

// Shared 128x128 block walk for the two FP8 quantizers: `scale_of(amax)` returns the scale the
// block uses (as a float) after storing it.
template <typename ScaleFn>
void fp8_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* codes, ScaleFn scale_of) {
  const int64_t brows = ceil_div(rows, kFp8WeightBlock), bcols = ceil_div(cols, kFp8WeightBlock);
  for (int64_t br = 0; br < brows; ++br) {
    const int64_t r0 = br * kFp8WeightBlock, r1 = std::min(rows, r0 + kFp8WeightBlock);
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t c0 = bc * kFp8WeightBlock, c1 = std::min(cols, c0 + kFp8WeightBlock);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = scale_of(br * bcols + bc, amax);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          codes[r * cols + c] = float_to_e4m3(w[r * cols + c] / s, Fp8Saturation::kSaturate);
    }
  }
}

}  // namespace

Status quantize_fp8_block(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                          uint8_t* scales) {
  DS_RETURN_IF_ERROR(check_shape("quantize_fp8_block", w, codes, rows, cols, 1));
  if (!scales && rows * cols > 0) return invalid_argument("quantize_fp8_block: null scales");
  DS_RETURN_IF_ERROR(check_finite("quantize_fp8_block", w, rows * cols));
  fp8_blocks(w, rows, cols, codes, [&](int64_t i, float amax) {
    scales[i] = pow2_scale(amax, kE4M3Max);
    return e8m0_to_float(scales[i]);
  });
  return ok_status();
}

Status quantize_fp8_block_f32(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                              float* scales) {
  DS_RETURN_IF_ERROR(check_shape("quantize_fp8_block_f32", w, codes, rows, cols, 1));
  if (!scales && rows * cols > 0) return invalid_argument("quantize_fp8_block_f32: null scales");
  DS_RETURN_IF_ERROR(check_finite("quantize_fp8_block_f32", w, rows * cols));
  fp8_blocks(w, rows, cols, codes, [&](int64_t i, float amax) {
    scales[i] = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    return scales[i];
  });
  return ok_status();
}

Status quantize_mxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed,
                      uint8_t* scales) {
  DS_RETURN_IF_ERROR(check_shape("quantize_mxfp4", w, packed, rows, cols, kMxfp4Block));
  if (!scales && rows * cols > 0) return invalid_argument("quantize_mxfp4: null scales");
  DS_RETURN_IF_ERROR(check_finite("quantize_mxfp4", w, rows * cols));
  const int64_t nblocks = cols / kMxfp4Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nblocks; ++b) {
      const float* x = w + r * cols + b * kMxfp4Block;
      float amax = 0.0f;
      for (int64_t k = 0; k < kMxfp4Block; ++k) amax = std::max(amax, std::fabs(x[k]));
      const uint8_t sbyte = pow2_scale(amax, kE2M1Max);
      scales[r * nblocks + b] = sbyte;
      const float s = e8m0_to_float(sbyte);
      uint8_t* p = packed + r * (cols / 2) + b * (kMxfp4Block / 2);
      for (int64_t k = 0; k < kMxfp4Block; k += 2)
        p[k / 2] = pack_e2m1(float_to_e2m1(x[k] / s), float_to_e2m1(x[k + 1] / s));
    }
  }
  return ok_status();
}

Status quantize_nvfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales,
                      float* global_scale) {
  DS_RETURN_IF_ERROR(check_shape("quantize_nvfp4", w, packed, rows, cols, kNvfp4Block));
  if (!global_scale || (!scales && rows * cols > 0))
    return invalid_argument("quantize_nvfp4: null scales");
  DS_RETURN_IF_ERROR(check_finite("quantize_nvfp4", w, rows * cols));
  float amax = 0.0f;
  for (int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float global = amax > 0.0f ? amax / (kE4M3Max * kE2M1Max) : 1.0f;
  *global_scale = global;
  const Tables& t = tables();
  const int64_t nblocks = cols / kNvfp4Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nblocks; ++b) {
      const float* x = w + r * cols + b * kNvfp4Block;
      float bmax = 0.0f;
      for (int64_t k = 0; k < kNvfp4Block; ++k) bmax = std::max(bmax, std::fabs(x[k]));
      const uint8_t sbyte = float_to_e4m3(bmax / (kE2M1Max * global), Fp8Saturation::kSaturate);
      scales[r * nblocks + b] = sbyte;
      const float s = t.e4m3[sbyte] * global;
      uint8_t* p = packed + r * (cols / 2) + b * (kNvfp4Block / 2);
      for (int64_t k = 0; k < kNvfp4Block; k += 2) {
        const uint8_t lo = s > 0.0f ? float_to_e2m1(x[k] / s) : 0;
        const uint8_t hi = s > 0.0f ? float_to_e2m1(x[k + 1] / s) : 0;
        p[k / 2] = pack_e2m1(lo, hi);
      }
    }
  }
  return ok_status();
}

Result<Fp8BlockQuantized> quantize_fp8_block(const float* w, int64_t rows, int64_t cols) {
  DS_RETURN_IF_ERROR(check_shape("quantize_fp8_block", w, w, rows, cols, 1));
  Fp8BlockQuantized q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(size_t(rows * cols));
  q.scales.resize(size_t(ceil_div(rows, kFp8WeightBlock) * ceil_div(cols, kFp8WeightBlock)));
  DS_RETURN_IF_ERROR(quantize_fp8_block(w, rows, cols, q.codes.data(), q.scales.data()));
  return q;
}

Result<Mxfp4Quantized> quantize_mxfp4(const float* w, int64_t rows, int64_t cols) {
  DS_RETURN_IF_ERROR(check_shape("quantize_mxfp4", w, w, rows, cols, kMxfp4Block));
  Mxfp4Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.packed.resize(size_t(rows * cols / 2));
  q.scales.resize(size_t(rows * cols / kMxfp4Block));
  DS_RETURN_IF_ERROR(quantize_mxfp4(w, rows, cols, q.packed.data(), q.scales.data()));
  return q;
}

Result<Nvfp4Quantized> quantize_nvfp4(const float* w, int64_t rows, int64_t cols) {
  DS_RETURN_IF_ERROR(check_shape("quantize_nvfp4", w, w, rows, cols, kNvfp4Block));
  Nvfp4Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.packed.resize(size_t(rows * cols / 2));
  q.scales.resize(size_t(rows * cols / kNvfp4Block));
  DS_RETURN_IF_ERROR(
      quantize_nvfp4(w, rows, cols, q.packed.data(), q.scales.data(), &q.global_scale));
  return q;
}

}  // namespace ds
