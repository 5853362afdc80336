// FP8 e4m3 activation quantization with power-of-two (ue8m0) scales per block of K elements: the
// input side of every FP8/FP4 linear in reference numerics (dsv4-model.md §10.2). The CPU
// reference is ds::cpu::quantize_fp8_blocks (src/kernels/cpu/quant.h); this kernel matches it
// bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

struct QuantFp8Params {
  const uint16_t* x = nullptr;  // [num_rows, row_len] bf16 bits, rows `x_row_stride` elements
                                // apart; 16-byte aligned
  uint8_t* codes = nullptr;     // [num_rows, row_len] e4m3 bits (row-major, contiguous, 8-byte aligned)
  uint8_t* scales = nullptr;    // [num_rows, row_len / 128] e8m0 bits (row-major, contiguous)
  int64_t num_rows = 0;
  int64_t row_len = 0;          // a multiple of 128
  int64_t x_row_stride = 0;     // in elements; >= row_len and a multiple of 8
  // Instead of x (which must then be null): fp32 values, same layout and stride rules, 16-byte
  // aligned, rounded to bf16 (ds::float_to_bf16) as they are loaded: the codes and scales of
  // launch_f32_to_bf16 followed by the bf16 form, without the bf16 copy in memory.
  const float* x_f32 = nullptr;
};

inline constexpr int kQuantFp8Block = 128;

// Half a warp per 128-element block; no allocation, no host synchronization, graph-capturable.
void launch_quantize_fp8_blocks(const QuantFp8Params& params, cudaStream_t stream);

}  // namespace ds::cuda
