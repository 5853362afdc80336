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

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeParams p) {
  __shared__ float cos_table[kMaxHalf], sin_table[kMaxHalf];
  pdl_begin();
  const int64_t token = blockIdx.x;
  const int64_t half = p.rope_dim / 2;
  const float sign = p.inverse ? -1.0f : 1.0f;
  const float pos = float(p.positions[token]);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    const float angle = pos * p.inv_freq[i];
    double s, c;
    sincos(double(angle), &s, &c);
    cos_table[i] = float(c);
    sin_table[i] = sign * float(s);
  }
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

}  // namespace

void launch_rope(const RopeParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0 || params.rope_dim <= 0) return;
  (void)launch_pdl(rope_kernel, dim3(unsigned(params.num_tokens)), dim3(kThreads), 0, stream,
                   params);
}

}  // namespace ds::cuda
