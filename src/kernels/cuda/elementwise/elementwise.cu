// Elementwise and row-wise kernels of the CUDA backend (see elementwise.h). Every one is
// memory-bound: rows go to blockIdx.y (strided past 65535), vectors of a row to the threads of
// blockIdx.x; 16-byte vectors whenever the sizes and pointers allow, else one value per thread
// (the launcher picks from the sizes and pointer values, never from device data). Floating-point
// steps that the CPU reference does as separate fp32 operations use the explicitly rounded
// intrinsics (__fmul_rn, __fadd_rn, ...) so that nvcc's FMA contraction cannot fuse them.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/norm/device_util.cuh"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 4096;  // grid-stride beyond this

__device__ __forceinline__ float quiet_nan() {
  return __uint_as_float(0x7FFFFFFFu);
}

using ops::bf16_bits_exact;
using ops::round_bf16_exact;

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Grid for `rows` rows of `items` thread items each: x covers a row (grid-stride past kMaxGridX
// blocks), y the rows (grid-stride past 65535).
dim3 row_grid(int64_t rows, int64_t items, int threads) {
  const int64_t x = std::clamp<int64_t>((items + threads - 1) / threads, 1, kMaxGridX);
  return dim3(unsigned(x), unsigned(std::min(rows, kMaxGridY)));
}

// Threads per block for rows of `items` items: a multiple of 32, at most kThreads.
int row_threads(int64_t items) {
  return int(std::clamp<int64_t>((items + 31) / 32 * 32, 32, kThreads));
}

// ---- embed ----

template <int kVec>
__global__ void embed_kernel(EmbedParams p) {
  const int64_t num_vec = p.dim / kVec;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const int32_t id = p.ids[t];
    const bool valid = id >= 0 && id < p.vocab;
    const uint16_t* src = p.table + (valid ? int64_t(id) : 0) * p.dim;
    float* dst = p.out + t * p.copies * p.dim;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < num_vec;
         j += int64_t(gridDim.x) * blockDim.x) {
      if constexpr (kVec == 4) {
        float4 v = make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
        if (valid) {
          const uint2 raw = reinterpret_cast<const uint2*>(src)[j];
          v = make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xFFFF0000u),
                          __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xFFFF0000u));
        }
        for (int64_t c = 0; c < p.copies; ++c) reinterpret_cast<float4*>(dst + c * p.dim)[j] = v;
      } else {
        const float v = valid ? __uint_as_float(uint32_t(src[j]) << 16) : quiet_nan();
        for (int64_t c = 0; c < p.copies; ++c) dst[c * p.dim + j] = v;
      }
    }
  }
}

// ---- f32 -> bf16, round in place ----

template <int kVec>
__global__ void f32_to_bf16_kernel(F32ToBf16Params p) {
  const int64_t num_vec = p.cols / kVec;
  for (int64_t r = blockIdx.y; r < p.num_rows; r += gridDim.y) {
    const float* x = p.x + r * p.x_stride;
    uint16_t* y = p.y + r * p.y_stride;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < num_vec;
         j += int64_t(gridDim.x) * blockDim.x) {
      if constexpr (kVec == 4) {
        const float4 v = reinterpret_cast<const float4*>(x)[j];
        reinterpret_cast<uint2*>(y)[j] =
            make_uint2(bf16_bits_exact(v.x) | (bf16_bits_exact(v.y) << 16),
                       bf16_bits_exact(v.z) | (bf16_bits_exact(v.w) << 16));
      } else {
        y[j] = uint16_t(bf16_bits_exact(x[j]));
      }
    }
  }
}

// Vectors [0, num_vec) as float4 (x 16-byte aligned), then values [4 * num_vec, n) one by one.
__global__ void round_bf16_kernel(float* x, int64_t n, int64_t num_vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t j = first; j < num_vec; j += stride) {
    float4 v = reinterpret_cast<float4*>(x)[j];
    v = make_float4(round_bf16_exact(v.x), round_bf16_exact(v.y), round_bf16_exact(v.z),
                    round_bf16_exact(v.w));
    reinterpret_cast<float4*>(x)[j] = v;
  }
  for (int64_t i = 4 * num_vec + first; i < n; i += stride) x[i] = round_bf16_exact(x[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t* x, int64_t n, float* y) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = __uint_as_float(uint32_t(x[i]) << 16);
  }
}

// ---- FP8 simulation of the KV nope part ----

// One warp per (row, block of 64); lane l holds values l and l + 32 of the block.
__global__ void simulate_fp8_kv_kernel(SimulateFp8KvParams p, int64_t blocks_per_row) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (warp >= p.num_rows * blocks_per_row) return;  // uniform over the warp
  const int64_t row = warp / blocks_per_row, b = warp % blocks_per_row;
  const int64_t len = std::min<int64_t>(64, p.head_dim - p.rope_dim - b * 64);
  float* x = p.kv + row * p.row_stride + b * 64;
  const bool has0 = lane < len, has1 = lane + 32 < len;
  const float v0 = has0 ? x[lane] : 0.0f, v1 = has1 ? x[lane + 32] : 0.0f;
  const float amax = ops::warp_max(fmaxf(fabsf(v0), fabsf(v1)));
  if (has0) x[lane] = ops::fp8_simulate(v0, amax);
  if (has1) x[lane + 32] = ops::fp8_simulate(v1, amax);
}

// ---- indexer ----

constexpr int kIndexerWarps = 8;

__global__ void __launch_bounds__(kIndexerWarps * 32)
    indexer_prepare_query_kernel(IndexerPrepareQueryParams p) {
  // Block (token, group of kIndexerWarps heads), one warp per head: at decode sizes a token's 64
  // heads are 8 blocks on 8 SMs instead of 8 heads after one another in each warp of one block.
  __shared__ float cos_table[kIndexerHeadDim / 2], sin_table[kIndexerHeadDim / 2];
  const int64_t token = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = int64_t(blockIdx.y) * kIndexerWarps + warp;
  const bool has_head = h < p.num_heads;  // uniform over the warp
  float4* slot =
      reinterpret_cast<float4*>(p.q + token * p.token_stride + h * kIndexerHeadDim) + lane;
  // The head's values are requested before the table's double sin/cos, so the two latencies
  // overlap.
  float4 raw = make_float4(0.f, 0.f, 0.f, 0.f);
  if (has_head) raw = *slot;
  const int64_t half = p.rope_dim / 2;
  const float pos = float(p.positions[token]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = __fmul_rn(pos, p.inv_freq[i]);  // ds::cpu::rope_rotate: fp32 product
    double s, c;
    sincos(double(angle), &s, &c);
    cos_table[i] = float(c);
    sin_table[i] = float(s);
  }
  __syncthreads();
  if (!has_head) return;
  const int rope_start = int(kIndexerHeadDim - p.rope_dim);                 // even
  const float hadamard_scale = float(1.0 / sqrt(double(kIndexerHeadDim)));  // as the CPU's
  {
    float v[4] = {raw.x, raw.y, raw.z, raw.w};  // values 4 * lane + j
    // RoPE (forward): pairs (2i, 2i+1) of the tail never straddle a lane's 4 values.
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const int e = 4 * lane + j;
      if (e >= rope_start) {
        const int i = (e - rope_start) / 2;
        const float c = cos_table[i], s = sin_table[i], re = v[j], im = v[j + 1];
        v[j] = __fsub_rn(__fmul_rn(re, c), __fmul_rn(im, s));
        v[j + 1] = __fadd_rn(__fmul_rn(re, s), __fmul_rn(im, c));
      }
    }
    if (p.round_bf16) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = round_bf16_exact(v[j]);
    }
    if (p.simulate_fp4) {
      // Walsh-Hadamard stages h = 1, 2, ..., 64 in the CPU's order; at each stage the lower
      // value of a pair becomes a + b and the upper a - b (a = lower, b = upper).
      float a = v[0], b = v[1];  // h = 1
      v[0] = __fadd_rn(a, b);
      v[1] = __fsub_rn(a, b);
      a = v[2];
      b = v[3];
      v[2] = __fadd_rn(a, b);
      v[3] = __fsub_rn(a, b);
      a = v[0];  // h = 2
      b = v[2];
      v[0] = __fadd_rn(a, b);
      v[2] = __fsub_rn(a, b);
      a = v[1];
      b = v[3];
      v[1] = __fadd_rn(a, b);
      v[3] = __fsub_rn(a, b);
#pragma unroll
      for (int m = 1; m < 32; m <<= 1) {  // h = 4 m: the partner value sits in lane ^ m
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float other = __shfl_xor_sync(0xFFFFFFFFu, v[j], m);
          v[j] = upper ? __fsub_rn(other, v[j]) : __fadd_rn(v[j], other);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = __fmul_rn(v[j], hadamard_scale);
        if (p.round_bf16) v[j] = round_bf16_exact(v[j]);
      }
      // FP4 blocks of 32 values = 8 consecutive lanes.
      float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = ops::fp4_simulate(v[j], amax);
    }
    *slot = make_float4(v[0], v[1], v[2], v[3]);
  }
}

__global__ void scale_kernel(float* w, int64_t n, float scale, bool round) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __fmul_rn(w[i], scale);
    w[i] = round ? round_bf16_exact(v) : v;
  }
}

// ---- add_broadcast, gather_rows ----

template <int kVec>
__global__ void add_broadcast_kernel(AddBroadcastParams p) {
  using V = std::conditional_t<kVec == 4, float4, float>;
  const int64_t num_vec = p.dim / kVec;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const V* e = reinterpret_cast<const V*>(p.e + t * p.dim);
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < num_vec;
         j += int64_t(gridDim.x) * blockDim.x) {
      const V ev = e[j];
      for (int64_t c = 0; c < p.hc; ++c) {
        const int64_t row = (t * p.hc + c) * p.dim;
        const V hv = reinterpret_cast<const V*>(p.h + row)[j];
        V out;
        if constexpr (kVec == 4) {
          out = make_float4(__fadd_rn(ev.x, hv.x), __fadd_rn(ev.y, hv.y), __fadd_rn(ev.z, hv.z),
                            __fadd_rn(ev.w, hv.w));
        } else {
          out = __fadd_rn(ev, hv);
        }
        reinterpret_cast<V*>(p.x + row)[j] = out;
      }
    }
  }
}

__global__ void copy_segments_kernel(const CopySegment* segments, int64_t num_segments) {
  for (int64_t i = blockIdx.y; i < num_segments; i += gridDim.y) {
    const CopySegment seg = segments[i];
    const bool vec = ((reinterpret_cast<uintptr_t>(seg.src) | reinterpret_cast<uintptr_t>(seg.dst)) &
                      15) == 0 && seg.num_floats % 4 == 0;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (vec) {
      const float4* src = reinterpret_cast<const float4*>(seg.src);
      float4* dst = reinterpret_cast<float4*>(seg.dst);
      for (int64_t j = first; j < seg.num_floats / 4; j += step) dst[j] = src[j];
    } else {
      for (int64_t j = first; j < seg.num_floats; j += step) seg.dst[j] = seg.src[j];
    }
  }
}

template <int kVec>
__global__ void gather_rows_kernel(GatherRowsParams p) {
  using V = std::conditional_t<kVec == 4, float4, float>;
  const int64_t num_vec = p.width / kVec;
  for (int64_t r = blockIdx.y; r < p.num_rows; r += gridDim.y) {
    const int64_t src_row = p.rows[r];
    const bool valid = src_row >= 0 && src_row < p.num_x_rows;
    const V* src = reinterpret_cast<const V*>(p.x + (valid ? src_row : 0) * p.width);
    V* dst = reinterpret_cast<V*>(p.out + r * p.width);
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < num_vec;
         j += int64_t(gridDim.x) * blockDim.x) {
      V v;
      if (valid) {
        v = src[j];
      } else if constexpr (kVec == 4) {
        v = make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
      } else {
        v = quiet_nan();
      }
      dst[j] = v;
    }
  }
}

// ---- FP8 KV entries ----

// Block = one row; warp w < nope / 64 quantizes values [64 w, 64 w + 64) (lane l: 2 l, 2 l + 1),
// the last warp converts the 64 rope values to bf16 and writes the pad byte.
__global__ void pack_kv_entries_kernel(PackKvEntriesParams p) {
  const int64_t r = blockIdx.x;
  const int32_t index = p.row_index[r];
  if (index < 0) return;  // uniform over the block
  const int64_t seq = p.row_seq[r];
  const int64_t page = p.page_table[seq * p.page_table_stride + index / p.page_size];
  const int64_t slot = index % p.page_size;
  const int64_t nope = p.head_dim - 64, num_scales = nope / 64;
  const int64_t data_bytes = nope + 2 * 64, scale_bytes = num_scales + 1;
  uint8_t* page_base = p.pool + page * p.page_bytes;
  uint8_t* data = page_base + slot * data_bytes;
  uint8_t* scales = page_base + p.page_size * data_bytes + slot * scale_bytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float2 v = reinterpret_cast<const float2*>(p.kv + r * p.kv_stride + warp * 64)[lane];
  if (warp < num_scales) {
    // ds::cpu::quantize_fp8_blocks: scale 2^ceil(log2(max(amax, 1e-4) / 448)), codes
    // e4m3(clamp(x / scale, ±448)) (the division by a power of two is exact).
    const float amax = ops::warp_max(fmaxf(fabsf(v.x), fabsf(v.y)));
    const uint32_t code = ops::e8m0_ceil_pow2_code(fmaxf(amax, 1e-4f) / 448.0f);
    const float scale = ops::e8m0_value(code);
    float q0 = v.x / scale, q1 = v.y / scale;
    if (!isnan(q0)) q0 = fminf(fmaxf(q0, -448.0f), 448.0f);
    if (!isnan(q1)) q1 = fminf(fmaxf(q1, -448.0f), 448.0f);
    const uint32_t c0 = __nv_cvt_float_to_fp8(q0, __NV_SATFINITE, __NV_E4M3);
    const uint32_t c1 = __nv_cvt_float_to_fp8(q1, __NV_SATFINITE, __NV_E4M3);
    reinterpret_cast<uint16_t*>(data + warp * 64)[lane] = uint16_t((c0 & 0xFFu) | (c1 << 8));
    if (lane == 0) scales[warp] = uint8_t(code);
  } else {
    // Little-endian bf16 pairs, as ds::cpu::pack_kv_entry's memcpy.
    reinterpret_cast<uint32_t*>(data + nope)[lane] =
        bf16_bits_exact(v.x) | (bf16_bits_exact(v.y) << 16);
    if (lane == 0) scales[num_scales] = 0;  // pad byte
  }
}

}  // namespace

void launch_embed(const EmbedParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.dim <= 0 || p.copies <= 0) return;
  const bool vec = p.dim % 4 == 0 && aligned(p.table, 8) && aligned(p.out, 16);
  const int64_t items = vec ? p.dim / 4 : p.dim;
  const int threads = row_threads(items);
  const dim3 grid = row_grid(p.num_tokens, items, threads);
  if (vec)
    embed_kernel<4><<<grid, threads, 0, stream>>>(p);
  else
    embed_kernel<1><<<grid, threads, 0, stream>>>(p);
}

void launch_f32_to_bf16(const F32ToBf16Params& p, cudaStream_t stream) {
  if (p.num_rows <= 0 || p.cols <= 0) return;
  const bool vec = p.cols % 4 == 0 && p.x_stride % 4 == 0 && p.y_stride % 4 == 0 &&
                   aligned(p.x, 16) && aligned(p.y, 8);
  const int64_t items = vec ? p.cols / 4 : p.cols;
  const int threads = row_threads(items);
  const dim3 grid = row_grid(p.num_rows, items, threads);
  if (vec)
    f32_to_bf16_kernel<4><<<grid, threads, 0, stream>>>(p);
  else
    f32_to_bf16_kernel<1><<<grid, threads, 0, stream>>>(p);
}

void launch_round_bf16(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t num_vec = aligned(x, 16) ? n / 4 : 0;
  const int64_t items = std::max(num_vec, n - 4 * num_vec);
  const int64_t blocks = std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, 8 * kMaxGridX);
  round_bf16_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(x, n, num_vec);
}

void launch_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8 * kMaxGridX);
  bf16_to_f32_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(x, n, y);
}

void launch_simulate_fp8_kv(const SimulateFp8KvParams& p, cudaStream_t stream) {
  const int64_t nope = p.head_dim - p.rope_dim;
  if (p.num_rows <= 0 || nope <= 0) return;
  const int64_t blocks_per_row = (nope + 63) / 64;
  constexpr int kWarpsPerBlock = kThreads / 32;
  const int64_t warps = p.num_rows * blocks_per_row;
  const int64_t grid = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  simulate_fp8_kv_kernel<<<unsigned(grid), kThreads, 0, stream>>>(p, blocks_per_row);
}

void launch_indexer_prepare_query(const IndexerPrepareQueryParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.num_heads <= 0) return;
  const dim3 grid(unsigned(p.num_tokens),
                  unsigned((p.num_heads + kIndexerWarps - 1) / kIndexerWarps));
  indexer_prepare_query_kernel<<<grid, kIndexerWarps * 32, 0, stream>>>(p);
}

void launch_indexer_scale_weights(float* w, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                  bool round_bf16, cudaStream_t stream) {
  const int64_t n = num_tokens * num_heads;
  if (n <= 0) return;
  // Exactly ds::cpu::indexer_scale_weights' factor (host libm pow, product in double, rounded).
  const float scale = float(std::pow(double(head_dim), -0.5) * std::pow(double(num_heads), -0.5));
  const int64_t blocks = std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxGridX);
  scale_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(w, n, scale, round_bf16);
}

void launch_add_broadcast(const AddBroadcastParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.hc <= 0 || p.dim <= 0) return;
  const bool vec = p.dim % 4 == 0 && aligned(p.e, 16) && aligned(p.h, 16) && aligned(p.x, 16);
  const int64_t items = vec ? p.dim / 4 : p.dim;
  const int threads = row_threads(items);
  const dim3 grid = row_grid(p.num_tokens, items, threads);
  if (vec)
    add_broadcast_kernel<4><<<grid, threads, 0, stream>>>(p);
  else
    add_broadcast_kernel<1><<<grid, threads, 0, stream>>>(p);
}

void launch_copy_segments(const CopySegment* segments, int64_t num_segments, int64_t max_floats,
                          cudaStream_t stream) {
  if (num_segments <= 0 || max_floats <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks_x = std::min<int64_t>((max_floats + 4 * kThreads - 1) / (4 * kThreads), 64);
  const dim3 grid(unsigned(blocks_x), unsigned(std::min<int64_t>(num_segments, 65535)));
  copy_segments_kernel<<<grid, kThreads, 0, stream>>>(segments, num_segments);
}

void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0 || p.width <= 0) return;
  const bool vec = p.width % 4 == 0 && aligned(p.x, 16) && aligned(p.out, 16);
  const int64_t items = vec ? p.width / 4 : p.width;
  const int threads = row_threads(items);
  const dim3 grid = row_grid(p.num_rows, items, threads);
  if (vec)
    gather_rows_kernel<4><<<grid, threads, 0, stream>>>(p);
  else
    gather_rows_kernel<1><<<grid, threads, 0, stream>>>(p);
}

void launch_pack_kv_entries(const PackKvEntriesParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return;
  const int64_t num_scales = (p.head_dim - 64) / 64;
  pack_kv_entries_kernel<<<unsigned(p.num_rows), unsigned(32 * (num_scales + 1)), 0, stream>>>(p);
}

}  // namespace ds::cuda
