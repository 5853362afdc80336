// RMSNorm kernels. A group of kThreads threads (a warp up to 512 threads, chosen by dim and the
// row count) owns one row: pass 1 loads float4s and reduces the sum of squares (shuffles, plus
// shared memory across warps), pass 2 re-reads the row (an L1 hit) and writes x * r * w. The
// scaling multiplies in the reference's order (x * r, then * w) and never fuses the two into one
// rounding, so given the same r the outputs are bit-identical to the CPU reference.
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/norm/device_util.cuh"
#include "kernels/cuda/norm/norm.h"

namespace ds::cuda {
namespace {

constexpr int kBlockThreads = 512;

// Row r lives at base + (r / rows_per_group) * outer_stride + (r % rows_per_group) * dim: plain
// rows use rows_per_group = 1; per-head norms use rows_per_group = num_heads.
struct RowLayout {
  int64_t rows_per_group;
  int64_t x_outer, y_outer;
};

template <int kThreads>
__global__ void __launch_bounds__(kBlockThreads)
    rms_norm_kernel(RmsNormParams p, RowLayout layout) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreads;
  constexpr int kWarpsPerRow = kThreads / 32 > 0 ? kThreads / 32 : 1;
  __shared__ float partial[kRowsPerBlock][kWarpsPerRow];
  pdl_begin();
  const int group = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + group;
  const bool active = row < p.num_rows;
  const int64_t g = active ? row / layout.rows_per_group : 0;
  const int64_t h = active ? row % layout.rows_per_group : 0;
  const float* x = p.x + g * layout.x_outer + h * p.dim;

  float ss = 0.0f;
  if (active) {
#pragma unroll 4
    for (int64_t i = int64_t(t) * 4; i < p.dim; i += kThreads * 4) {
      const float4 v = *reinterpret_cast<const float4*>(x + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  }
  ss = ops::warp_sum(ss);  // kThreads >= 32: a group spans whole warps
  if constexpr (kWarpsPerRow > 1) {
    if ((t & 31) == 0) partial[group][t >> 5] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerRow; ++w) ss += partial[group][w];
  }
  if (!active) return;
  const float r = 1.0f / sqrtf(ss / float(p.dim) + p.eps);

  float* y = p.y ? p.y + g * layout.y_outer + h * p.dim : nullptr;
  uint16_t* yb = p.y_bf16 ? p.y_bf16 + row * p.dim : nullptr;
  const int64_t rope0 = p.dim - p.rope_dim;  // first rotated dim (p.rope_dim > 0)
  const float pos = p.rope_dim > 0 ? float(p.positions[g]) : 0.0f;
#pragma unroll 4
  for (int64_t i = int64_t(t) * 4; i < p.dim; i += kThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    float o[4] = {__fmul_rn(v.x, r), __fmul_rn(v.y, r), __fmul_rn(v.z, r), __fmul_rn(v.w, r)};
    if (p.weight) {
      const float4 w = *reinterpret_cast<const float4*>(p.weight + i);
      o[0] = __fmul_rn(o[0], w.x);
      o[1] = __fmul_rn(o[1], w.y);
      o[2] = __fmul_rn(o[2], w.z);
      o[3] = __fmul_rn(o[3], w.w);
    }
    if (p.rope_dim > 0 || p.simulate_fp8_kv) {
      // The epilogue (rms_norm_epilogue_supported: every lane of the warp is in this pass, so
      // the half-warp maximum below sees one whole 64-dim block).
      if (p.round_bf16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = ops::round_bf16(o[k]);
      }
      if (p.rope_dim > 0 && i >= rope0) {
        // rope_kernel's arithmetic for the pairs (i, i+1) and (i+2, i+3).
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float angle = pos * p.inv_freq[(i - rope0) / 2 + q];
          double sd, cd;
          sincos(double(angle), &sd, &cd);
          const float c = float(cd), sn = float(sd);
          const float a = o[2 * q], b = o[2 * q + 1];
          float re = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
          float im = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c));
          if (p.round_bf16) {
            re = ops::round_bf16(re);
            im = ops::round_bf16(im);
          }
          o[2 * q] = re;
          o[2 * q + 1] = im;
        }
      }
      if (p.simulate_fp8_kv) {
        // Blocks of 64 dims from 0: lanes 0-15 / 16-31 of the warp hold one each. Rotated dims
        // take no part (a block cut by rope0 has the amax of its first part, as in
        // simulate_fp8_kv_kernel).
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (i + k < rope0) amax = fmaxf(amax, fabsf(o[k]));
#pragma unroll
        for (int off = 8; off > 0; off >>= 1)
          amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (i + k < rope0) o[k] = ops::fp8_simulate(o[k], amax);
      }
    }
    if (yb) {
      const uint2 packed =
          make_uint2(uint32_t(ops::bf16_bits(o[0])) | (uint32_t(ops::bf16_bits(o[1])) << 16),
                     uint32_t(ops::bf16_bits(o[2])) | (uint32_t(ops::bf16_bits(o[3])) << 16));
      *reinterpret_cast<uint2*>(yb + i) = packed;
    }
    if (y) {
      if (p.round_bf16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = ops::round_bf16(o[k]);
      }
      *reinterpret_cast<float4*>(y + i) = make_float4(o[0], o[1], o[2], o[3]);
    }
  }
}

template <int kThreads>
void launch_with(const RmsNormParams& p, const RowLayout& layout, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kBlockThreads / kThreads;
  const int64_t grid = (p.num_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  (void)launch_pdl(rms_norm_kernel<kThreads>, dim3(unsigned(grid)), dim3(kBlockThreads), 0, stream,
                   p, layout);
}

void launch_layout(const RmsNormParams& p, const RowLayout& layout, cudaStream_t stream) {
  if (p.num_rows <= 0 || p.dim <= 0) return;
  // The RoPE / FP8 epilogue (rms_norm_epilogue_supported: dim 128 .. 1024, a power of two) at
  // decode sizes: one float4 per thread, so that a row's rotations and FP8 blocks run on dim / 4
  // threads at once (one warp per 512-dim kv row measured 5.9 us at 1 token, session 15); with
  // many rows the one-warp rows below.
  if ((p.rope_dim > 0 || p.simulate_fp8_kv) && p.num_rows < 1024) {
    switch (p.dim) {
      case 128:
        launch_with<32>(p, layout, stream);
        return;
      case 256:
        launch_with<64>(p, layout, stream);
        return;
      case 512:
        launch_with<128>(p, layout, stream);
        return;
      default:
        launch_with<256>(p, layout, stream);
        return;
    }
  }
  // Rows wider than 1024 with few rows (decode): about two float4 per thread so that every load
  // of a row is in flight at once (1x4096: 5.2 -> 3.1 us, 64x4096: 7.0 -> 3.9 us). Otherwise
  // 4..8 float4 per thread, which streams better for many rows (4096x4096: 46.7 vs 52.2 us) and
  // is as fast or faster for 512-wide heads at any count (64x512: 2.5 vs 2.9 us; 262144x512:
  // 268 vs 367 us). Measurements in OPS_NOTES.md.
  if (p.dim > 1024 && p.num_rows < 1024) {
    if (p.dim <= 2048)
      launch_with<256>(p, layout, stream);
    else
      launch_with<512>(p, layout, stream);
    return;
  }
  if (p.dim <= 1024)
    launch_with<32>(p, layout, stream);
  else if (p.dim <= 2048)
    launch_with<64>(p, layout, stream);
  else if (p.dim <= 4096)
    launch_with<128>(p, layout, stream);
  else if (p.dim <= 8192)
    launch_with<256>(p, layout, stream);
  else
    launch_with<512>(p, layout, stream);
}

}  // namespace

bool rms_norm_epilogue_supported(int64_t dim, int64_t rope_dim) {
  // launch_layout runs such a row on dim / 4 threads or on one warp: whole passes either way.
  const bool pow2 = dim == 128 || dim == 256 || dim == 512 || dim == 1024;
  return pow2 && rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= dim && (dim - rope_dim) % 4 == 0;
}

void launch_rms_norm(const RmsNormParams& params, cudaStream_t stream) {
  launch_layout(params, RowLayout{1, params.x_stride, params.y_stride}, stream);
}

void launch_rms_norm_heads(const RmsNormHeadsParams& params, cudaStream_t stream) {
  RmsNormParams p;
  p.x = params.x;
  p.y = params.x;
  p.num_rows = params.num_tokens * params.num_heads;
  p.dim = params.head_dim;
  p.x_stride = p.y_stride = params.head_dim;
  p.eps = params.eps;
  p.round_bf16 = params.round_bf16;
  p.rope_dim = params.rope_dim;
  p.inv_freq = params.inv_freq;
  p.positions = params.positions;
  p.simulate_fp8_kv = params.simulate_fp8_kv;
  launch_layout(p, RowLayout{params.num_heads, params.token_stride, params.token_stride}, stream);
}

}  // namespace ds::cuda
