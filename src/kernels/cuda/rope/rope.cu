// RoPE kernel: one block per token. The first rope_dim/2 threads compute cos/sin of the token's
// angles (double sincos, rounded to fp32, the sine negated for the inverse rotation) into shared
// memory; then each thread rotates (head, pair) items with float2 loads. The complex multiply
// uses explicitly rounded products and sums (no FMA contraction) like the CPU reference.
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/norm/device_util.cuh"
#include "kernels/cuda/rope/rope.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 512;  // rope_dim <= 1024

// The token's cos / sin table (the sine negated for the inverse rotation), kThreads threads.
__device__ __forceinline__ void fill_table(const RopeParams& p, int64_t token, float* cos_table,
                                           float* sin_table) {
  const float sign = p.inverse ? -1.0f : 1.0f;
  const float pos = float(p.positions[token]);
  for (int64_t i = threadIdx.x; i < p.rope_dim / 2; i += kThreads) {
    const float angle = pos * p.inv_freq[i];
    double s, c;
    sincos(double(angle), &s, &c);
    cos_table[i] = float(c);
    sin_table[i] = sign * float(s);
  }
}

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeParams p) {
  __shared__ float cos_table[kMaxHalf], sin_table[kMaxHalf];
  pdl_begin();
  const int64_t token = blockIdx.x;
  const int64_t half = p.rope_dim / 2;
  fill_table(p, token, cos_table, sin_table);
  __syncthreads();
  float* base = p.x + token * p.token_stride + (p.head_dim - p.rope_dim);
  const int64_t items = p.num_heads * half;
  for (int64_t j = threadIdx.x; j < items; j += kThreads) {
    const int64_t h = j / half, i = j % half;
    float2* slot = reinterpret_cast<float2*>(base + h * p.head_dim + 2 * i);
    const float2 v = *slot;
    const float c = cos_table[i], s = sin_table[i];
    float re = __fsub_rn(__fmul_rn(v.x, c), __fmul_rn(v.y, s));
    float im = __fadd_rn(__fmul_rn(v.x, s), __fmul_rn(v.y, c));
    if (p.round_bf16) {
      re = ops::round_bf16(re);
      im = ops::round_bf16(im);
    }
    *slot = make_float2(re, im);
  }
}

constexpr int kVecDims = 8;  // bf16 values per 16-byte vector

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

__global__ void __launch_bounds__(kThreads)
    rope_bf16_kernel(RopeParams p, const uint16_t* __restrict__ src, uint16_t* dst) {
  __shared__ float cos_table[kMaxHalf], sin_table[kMaxHalf];
  const int64_t token = blockIdx.x;
  const int64_t vecs_per_head = p.head_dim / kVecDims;
  const int64_t v = int64_t(blockIdx.y) * kThreads + threadIdx.x;
  const bool has = v < p.num_heads * vecs_per_head;
  const int64_t h = v / vecs_per_head, d0 = (v % vecs_per_head) * kVecDims;
  const int64_t off = token * p.token_stride + h * p.head_dim + d0;
  pdl_begin();
  // The vector is requested before the table's double sin/cos, so the two latencies overlap.
  uint4 raw = make_uint4(0u, 0u, 0u, 0u);
  if (has) raw = *reinterpret_cast<const uint4*>(src + off);
  fill_table(p, token, cos_table, sin_table);
  __syncthreads();
  if (!has) return;
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float x[kVecDims];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = bf16_bits_to_f32(w[k] & 0xFFFFu);
    x[2 * k + 1] = bf16_bits_to_f32(w[k] >> 16);
  }
  const int64_t rope_start = p.head_dim - p.rope_dim;  // a multiple of 8: whole vectors rotate
  const bool rotated = d0 >= rope_start;
  if (rotated) {
#pragma unroll
    for (int k = 0; k < kVecDims / 2; ++k) {
      const int64_t i = (d0 - rope_start) / 2 + k;
      const float c = cos_table[i], s = sin_table[i];
      float re = __fsub_rn(__fmul_rn(x[2 * k], c), __fmul_rn(x[2 * k + 1], s));
      float im = __fadd_rn(__fmul_rn(x[2 * k], s), __fmul_rn(x[2 * k + 1], c));
      if (p.round_bf16) {
        re = ops::round_bf16(re);
        im = ops::round_bf16(im);
      }
      x[2 * k] = re;
      x[2 * k + 1] = im;
    }
  }
  float4* out = reinterpret_cast<float4*>(p.x + off);
  out[0] = make_float4(x[0], x[1], x[2], x[3]);
  out[1] = make_float4(x[4], x[5], x[6], x[7]);
  if (dst != nullptr) {
    uint4 bits = raw;  // unrotated dims: the input's bits
    if (rotated) {
      // The f32 -> bf16 conversion's rounding (launch_f32_to_bf16): exact for rounded values.
      uint32_t o[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        o[k] = ops::bf16_bits_exact(x[2 * k]) | (ops::bf16_bits_exact(x[2 * k + 1]) << 16);
      bits = make_uint4(o[0], o[1], o[2], o[3]);
    }
    *reinterpret_cast<uint4*>(dst + off) = bits;
  }
}

}  // namespace

bool rope_bf16_supported(const RopeParams& p, const void* src, const void* dst) {
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return p.head_dim % kVecDims == 0 && p.rope_dim % kVecDims == 0 && p.rope_dim <= p.head_dim &&
         p.rope_dim / 2 <= kMaxHalf && p.token_stride % kVecDims == 0 && aligned(p.x) &&
         aligned(src) && (dst == nullptr || aligned(dst));
}

void launch_rope_bf16(const RopeParams& params, const uint16_t* src, uint16_t* dst,
                      cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return;
  const int64_t vecs = params.num_heads * (params.head_dim / kVecDims);
  const dim3 grid(unsigned(params.num_tokens), unsigned((vecs + kThreads - 1) / kThreads));
  (void)launch_pdl(rope_bf16_kernel, grid, dim3(kThreads), 0, stream, params, src, dst);
}

void launch_rope(const RopeParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0 || params.rope_dim <= 0) return;
  (void)launch_pdl(rope_kernel, dim3(unsigned(params.num_tokens)), dim3(kThreads), 0, stream,
                   params);
}

}  // namespace ds::cuda
