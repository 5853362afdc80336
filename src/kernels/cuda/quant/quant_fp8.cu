// FP8 block activation quantization kernel. Each half-warp owns one 128-element block: every lane
// loads 8 bf16 values (16 bytes, coalesced), the half-warp reduces the absolute maximum with
// shuffles, its first lane writes the e8m0 scale, and every lane writes its 8 e4m3 codes (8 bytes).
// Memory-bound: it reads 2 bytes (fp32 input: 4, rounded to bf16 in registers) and writes 1 byte
// (+1/128) per element. v1 (one warp per block, 8-byte loads) reached 1.98x the floor; see
// NOTES.md.
#include <cuda_fp8.h>

#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/norm/device_util.cuh"
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

template <bool kF32In>
__global__ void quantize_fp8_blocks_kernel(QuantFp8Params p) {
  // Each half-warp owns one 128-element block: 16 lanes x 8 bf16 (one 16-byte load each).
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int sub = lane & 15;
  const int64_t blocks_per_row = p.row_len / kQuantFp8Block;
  const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int64_t block = warp * 2 + (lane >> 4);
  // Every lane takes part in the shuffles (full mask), so lanes past the end stay in with zeros.
  const bool active = block < p.num_rows * blocks_per_row;
  const int64_t row = active ? block / blocks_per_row : 0;
  const int64_t col0 = active ? (block % blocks_per_row) * kQuantFp8Block + sub * 8 : 0;

  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (active && kF32In) {
    const float4* src = reinterpret_cast<const float4*>(p.x_f32 + row * p.x_row_stride + col0);
    const float4 a = src[0], b = src[1];
    const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = ops::round_bf16_exact(f[i]);
  } else if (active) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p.x + row * p.x_row_stride + col0);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = bf16_bits_to_float(w[i] & 0xFFFFu);
      v[2 * i + 1] = bf16_bits_to_float(w[i] >> 16);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1)  // stays within the half-warp
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (!active) return;

  const uint32_t code = e8m0_ceil_pow2_code(fmaxf(amax, 1e-4f) / 448.0f);
  // Dividing by 2^(code-127) is exact: multiply by its reciprocal 2^(127-code) built from bits.
  const float inv_scale = __uint_as_float((254u - code) << 23);
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float q = v[i] * inv_scale;
    if (!isnan(q)) q = fminf(fmaxf(q, -448.0f), 448.0f);  // NaN stays NaN, as in the reference
    const uint32_t c = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
    packed[i / 4] |= (c & 0xFFu) << (8 * (i % 4));
  }
  *reinterpret_cast<uint2*>(p.codes + row * p.row_len + col0) = make_uint2(packed[0], packed[1]);
  if (sub == 0) p.scales[block] = uint8_t(code);
}

}  // namespace

void launch_quantize_fp8_blocks(const QuantFp8Params& params, cudaStream_t stream) {
  const int64_t num_blocks = params.num_rows * (params.row_len / kQuantFp8Block);
  if (num_blocks == 0) return;
  constexpr int kWarpsPerCta = 8;
  const int64_t blocks_per_cta = 2 * kWarpsPerCta;  // two 128-element blocks per warp
  const int64_t grid = (num_blocks + blocks_per_cta - 1) / blocks_per_cta;
  (void)launch_pdl(params.x_f32 != nullptr ? quantize_fp8_blocks_kernel<true>
                                            : quantize_fp8_blocks_kernel<false>,
                   dim3(unsigned(grid)), dim3(kWarpsPerCta * 32), 0, stream, params);
}

}  // namespace ds::cuda
