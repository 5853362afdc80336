// RMSNorm on the GPU (dsv4-model.md §1, §6, §7.1): y = x * (1 / sqrt(mean(x^2) + eps)) * w per
// row, in fp32, with optional rounding of the output to bf16 values (the rounding points of
// src/model/deepseek_v4/forward.cpp) and an optional bf16 copy of the output (a GEMM input). The
// CPU reference is ds::cpu::rms_norm / rms_norm_heads (src/kernels/cpu/norm.h); only the order of
// the sum of squares differs (a tree here, a running sum there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

struct RmsNormParams {
  const float* x = nullptr;       // [num_rows, dim], rows x_stride elements apart, 16-byte aligned
  const float* weight = nullptr;  // [dim], nullable: the unweighted form
  float* y = nullptr;             // [num_rows, dim], rows y_stride apart; nullable; may equal x
  uint16_t* y_bf16 = nullptr;     // [num_rows, dim] bf16 bits, contiguous; nullable
  int64_t num_rows = 0;
  int64_t dim = 0;       // a multiple of 4
  int64_t x_stride = 0;  // elements, a multiple of 4 (>= dim)
  int64_t y_stride = 0;  // elements, a multiple of 4 (>= dim)
  float eps = 1e-6f;
  bool round_bf16 = false;  // round y to bf16 values (y_bf16 is always rounded)
  // Epilogue on y (needs rms_norm_epilogue_supported(dim, rope_dim); not with y_bf16): with
  // rope_dim > 0, RoPE forward of each row's last rope_dim dims at positions[token] (a row is a
  // token here, a head in rms_norm_heads) with the bits of launch_rope (after the rounding above,
  // rounded again when round_bf16); then, with simulate_fp8_kv, the FP8 simulation of dims
  // [0, dim - rope_dim) per 64 with the bits of launch_simulate_fp8_kv. One launch instead of
  // three (the query and kv paths of attention).
  int64_t rope_dim = 0;
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  const int64_t* positions = nullptr;  // [tokens] device memory
  bool simulate_fp8_kv = false;
};

// Whether launch_rms_norm / launch_rms_norm_heads run the epilogue above for rows of `dim`: even
// rope_dim <= dim with dim - rope_dim a multiple of 4, and dim 128, 256, 512 or 1024 (a row's
// threads cover whole 128-dim passes, so the 64-dim blocks are half-warps).
bool rms_norm_epilogue_supported(int64_t dim, int64_t rope_dim);

// One row per group of 32..512 threads (by dim); no allocation, no host sync, graph-capturable.
void launch_rms_norm(const RmsNormParams& params, cudaStream_t stream);

// §7.1: the unweighted per-head RMSNorm of q, in place.
struct RmsNormHeadsParams {
  float* x = nullptr;  // [num_tokens, num_heads, head_dim], tokens token_stride elements apart
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;      // a multiple of 4
  int64_t token_stride = 0;  // elements; num_heads * head_dim for a dense tensor
  float eps = 1e-6f;
  bool round_bf16 = false;
  // Epilogue per head, as RmsNormParams (every head of token t at positions[t]).
  int64_t rope_dim = 0;
  const float* inv_freq = nullptr;
  const int64_t* positions = nullptr;
  bool simulate_fp8_kv = false;
};

void launch_rms_norm_heads(const RmsNormHeadsParams& params, cudaStream_t stream);

}  // namespace ds::cuda
