// Device helpers shared by the op kernels (norm, rope, mhc, compressor, sampling): bf16 rounding,
// warp/block reductions, exp/sin/cos evaluated in double and rounded once to fp32 (so they agree
// with the CPU reference's libm results except in rare double-rounding cases), and the scalar
// pieces of the FP8 (e4m3) / FP4 (e2m1) quantization simulations with ue8m0 scales, written to
// match src/core/dtype.cpp and src/kernels/cpu/quant.cpp bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda::ops {

// The value a bf16 tensor would hold (round to nearest even).
__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
__device__ __forceinline__ uint16_t bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
// ds::float_to_bf16 bit for bit: round to nearest even; a NaN stays a NaN with its payload's top
// bits and the quiet bit set (cvt.rn.bf16.f32 would return the canonical NaN instead).
__device__ __forceinline__ uint32_t bf16_bits_exact(float v) {
  const uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) | 0x0040u) & 0xFFFFu;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float round_bf16_exact(float v) {
  return __uint_as_float(bf16_bits_exact(v) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Sum over all threads of the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds >= 33 floats; the call begins and ends with a barrier.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < num_warps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

// expf / sinf / cosf as the CPU reference gets them from libm: evaluated in double, rounded once.
__device__ __forceinline__ float exp_f32(float v) {
  return float(exp(double(v)));
}
__device__ __forceinline__ float sigmoid_f32(float v) {
  return 1.0f / (1.0f + exp_f32(-v));
}

// e8m0 code of 2^ceil(log2(v)) for a positive normal fp32 v (ds::e8m0_ceil_pow2 on that range):
// the exponent field, plus one when any mantissa bit is set.
__device__ __forceinline__ uint32_t e8m0_ceil_pow2_code(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t code = ((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) ? 1u : 0u);
  return code > 254u ? 254u : code;
}
__device__ __forceinline__ float e8m0_value(uint32_t code) {  // 2^(code - 127), code in 1..254
  return __uint_as_float(code << 23);
}

// FP8 simulation of one value given its block's amax: e4m3(clamp(v / s, ±448)) * s with
// s = 2^ceil(log2(max(amax, 1e-4) / 448)) (ds::cpu::quantize_fp8_blocks).
__device__ __forceinline__ float fp8_simulate(float v, float amax) {
  const uint32_t code = e8m0_ceil_pow2_code(fmaxf(amax, 1e-4f) / 448.0f);
  const float scale = e8m0_value(code);
  float q = v / scale;  // exact: a power of two
  if (!isnan(q)) q = fminf(fmaxf(q, -448.0f), 448.0f);
  const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
  const float deq = __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
  return deq * scale;
}

// e2m1 round to nearest even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; NaN -> +0
// (ds::float_to_e2m1), returned as the dequantized magnitude with the input's sign.
__device__ __forceinline__ float e2m1_round(float v) {
  if (isnan(v)) return 0.0f;
  const float a = fabsf(v);
  float r;
  if (a >= 6.0f)
    r = 6.0f;
  else if (a < 0.25f)
    r = 0.0f;
  else if (a == 0.25f)
    r = 0.0f;  // tie -> even code 0
  else if (a < 0.75f)
    r = 0.5f;
  else if (a == 0.75f)
    r = 1.0f;  // tie -> code 2
  else if (a < 1.25f)
    r = 1.0f;
  else if (a == 1.25f)
    r = 1.0f;  // tie -> code 2
  else if (a < 1.75f)
    r = 1.5f;
  else if (a == 1.75f)
    r = 2.0f;  // tie -> code 4
  else if (a < 2.5f)
    r = 2.0f;
  else if (a == 2.5f)
    r = 2.0f;  // tie -> code 4
  else if (a < 3.5f)
    r = 3.0f;
  else if (a == 3.5f)
    r = 4.0f;  // tie -> code 6
  else if (a < 5.0f)
    r = 4.0f;
  else if (a == 5.0f)
    r = 4.0f;  // tie -> code 6
  else
    r = 6.0f;
  return signbit(v) ? -r : r;
}

// FP4 simulation of one value given its block's amax: e2m1(clamp(v / s, ±6)) * s with
// s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)) (ds::cpu::quantize_fp4_blocks).
__device__ __forceinline__ float fp4_simulate(float v, float amax) {
  const float floor_amax = 6.0f * 1.1754943508222875e-38f;  // 6 * 2^-126
  const uint32_t code = e8m0_ceil_pow2_code(fmaxf(amax, floor_amax) / 6.0f);
  const float scale = e8m0_value(code);
  float q = v / scale;
  if (!isnan(q)) q = fminf(fmaxf(q, -6.0f), 6.0f);
  return e2m1_round(q) * scale;
}

}  // namespace ds::cuda::ops
