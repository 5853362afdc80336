// FP8 block activation quantization kernel. Each warp owns one 128-element block: every lane loads
// 4 bf16 values (8 bytes, coalesced), the warp reduces the absolute maximum with shuffles, lane 0
// writes the e8m0 scale, and every lane writes its 4 e4m3 codes (4 bytes). Memory-bound: it reads
// 2 bytes and writes 1 byte (+1/128) per element.
#include <cuda_fp8.h>

#include "kernels/cuda/quant/quant_fp8.h"

namespace ds::cuda {
namespace {

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

// 2^ceil(log2(v)) for positive normal v, as the e8m0 code: the exponent field, plus one when any
// mantissa bit is set. Matches ds::e8m0_ceil_pow2 on the range the caller produces (v >= 1e-4/448).
__device__ __forceinline__ uint32_t e8m0_ceil_pow2_code(float v) {
  uint32_t u = __float_as_uint(v);
  uint32_t exp_field = (u >> 23) & 0xFFu;
  return exp_field + ((u & 0x7FFFFFu) ? 1u : 0u);
}

__global__ void quantize_fp8_blocks_kernel(QuantFp8Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t blocks_per_row = p.row_len / kQuantFp8Block;
  const int64_t block = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (block >= p.num_rows * blocks_per_row) return;
  const int64_t row = block / blocks_per_row;
  const int64_t col0 = (block % blocks_per_row) * kQuantFp8Block + lane * 4;

  const uint2 raw = *reinterpret_cast<const uint2*>(p.x + row * p.x_row_stride + col0);
  float v[4] = {bf16_bits_to_float(raw.x & 0xFFFFu), bf16_bits_to_float(raw.x >> 16),
                bf16_bits_to_float(raw.y & 0xFFFFu), bf16_bits_to_float(raw.y >> 16)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));

  const uint32_t code = e8m0_ceil_pow2_code(fmaxf(amax, 1e-4f) / 448.0f);
  // Dividing by 2^(code-127) is exact: multiply by its reciprocal 2^(127-code) built from bits.
  const float inv_scale = __uint_as_float((254u - code) << 23);
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float q = v[i] * inv_scale;
    if (!isnan(q)) q = fminf(fmaxf(q, -448.0f), 448.0f);  // NaN stays NaN, as in the reference
    uint32_t c = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
    packed |= (c & 0xFFu) << (8 * i);
  }
  *reinterpret_cast<uint32_t*>(p.codes + row * p.row_len + col0) = packed;
  if (lane == 0) p.scales[block] = uint8_t(code);
}

}  // namespace

void launch_quantize_fp8_blocks(const QuantFp8Params& params, cudaStream_t stream) {
  const int64_t num_blocks = params.num_rows * (params.row_len / kQuantFp8Block);
  if (num_blocks == 0) return;
  constexpr int kWarpsPerCta = 8;
  const int64_t grid = (num_blocks + kWarpsPerCta - 1) / kWarpsPerCta;
  quantize_fp8_blocks_kernel<<<unsigned(grid), kWarpsPerCta * 32, 0, stream>>>(params);
}

}  // namespace ds::cuda
