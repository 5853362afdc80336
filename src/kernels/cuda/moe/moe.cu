// MoE kernels (see moe.h and NOTES.md). One forward is 8 launches:
//   1. router_logits: logits[T, E] = x @ gate^T in fp32 (T <= 64: a CTA per expert and 8
//      tokens, the warps splitting D; else 64 x 64 tiles of a shared-memory SIMT GEMM);
//   2. route: a warp per token: sqrt-softplus, top-k of score + bias (ties to the lower index, as
//      cpu::topk_indices) or the tid2eid row, renormalized weights times route_scale;
//   3. plan: one CTA: counts per group (routed experts in [begin, end), then the shared expert as
//      group E), exclusive scans of rows and tiles, the tile list and the permutation (row ->
//      token, output slot, route weight) with shared-memory atomics;
//   4. quant x: fp32 -> bf16, FP8-simulated per 128 (reference numerics) or bf16-rounded;
//   5. grouped GEMM gate/up: per (tile of <= 8*NT rows of one group, 16*4/KS inter columns) the
//      w1 and w3 products on the tensor cores (KS warps of the CTA split K, reduced in shared
//      memory), then the clamped SwiGLU times the route weight -> h fp32;
//   6. quant h (as 4);
//   7. grouped GEMM down: per (tile, 32*4/KS output columns) -> ybuf[slot] fp32;
//   8. combine: y[t] = sum of the token's slots in ascending expert order + shared (the CPU order).
// Steps 5-7 have three implementations: bf16 mma.sync with register dequant (any format, 8-64
// row tiles), e4m3 mma.sync for 8/16-row tiles of MXFP4 / FP8-block layers in reference numerics
// on sm_89+ (expert_gemm_f8_kernel, decode; on sm_90 / sm_100 its f16 variant: the same exact
// operands as f16, mma.sync m16n8k16), and the prefill path: 128 x 128 CTA tiles with the
// weights dequantized once per tile into shared memory, bf16 mma.sync (expert_gemm_pf_kernel), or
// on sm_90a the same tiles on wgmma with the weights dequantized into the A fragments
// (expert_gemm_wg_kernel, by default CTAs of 256 weight rows in four warpgroups).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/div_rn.cuh"
#include "kernels/cuda/common/mbarrier.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/moe/moe.h"

// Timing-only builds of the FP8 decode GEMMs (session 43; outputs wrong, never a default):
// 1 = the weight stages copied and waited for, no conversion or MMA (the access pattern's own
// time); 2 = neither copies nor math (the CTAs' start, activation load, reduction and epilogue).
#ifndef DS_MOE_F8_ABLATE
#define DS_MOE_F8_ABLATE 0
#endif

namespace ds::cuda {
namespace {

using cpu::WeightFormat;
constexpr int kF8Ablate = DS_MOE_F8_ABLATE;

constexpr int kChunk = 128;          // K elements per main-loop step (= FP8 activation block)
constexpr int kGemmThreads = 128;    // 4 warps
constexpr int kMaxExperts = 512;     // route kernel: 16 scores per lane
constexpr int kMaxTopk = 16;
constexpr int kDimAlign = 128;       // D: the FP8 activation block and the K chunk

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align256(size_t v) { return (v + 255) & ~size_t(255); }

// ---- workspace layout ---------------------------------------------------------------------------

struct Layout {
  size_t logits, experts, weights, group_offset, num_tiles, tiles, row_token, row_slot, row_weight,
      xq, h, hq, ybuf, xq8, xs, hq8, hs, total;
};

int64_t max_tiles(int64_t T, const MoeDeviceLayer& l, int bt) {
  const int64_t slots = T * l.topk;
  const int64_t range = l.expert_end - l.expert_begin;
  return ceil_div(slots, bt) + std::min(range, slots) + ceil_div(T, bt);
}

Layout make_layout(int64_t T, const MoeDeviceLayer& l) {
  const int64_t rows = T * l.topk + T;  // routed slots + shared rows
  Layout o{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t at = off;
    off += align256(bytes);
    return at;
  };
  o.logits = take(size_t(T * l.num_experts) * 4);
  o.experts = take(size_t(T * l.topk) * 4);
  o.weights = take(size_t(T * l.topk) * 4);
  o.group_offset = take(size_t(l.num_experts + 2) * 4);
  o.num_tiles = take(4);
  o.tiles = take(size_t(max_tiles(T, l, 8)) * 8);  // 8 = the smallest tile: the largest bound
  o.row_token = take(size_t(rows) * 4);
  o.row_slot = take(size_t(rows) * 4);
  o.row_weight = take(size_t(rows) * 4);
  o.xq = take(size_t(T * l.dim) * 2);
  o.h = take(size_t(rows * l.inter) * 4);
  o.hq = take(size_t(rows * l.inter) * 2);
  o.ybuf = take(size_t(rows * l.dim) * 4);
  // FP8 path: e4m3 codes and the power-of-two scale per 128 (the FP8 simulation's operands).
  o.xq8 = take(size_t(T * l.dim));
  o.xs = take(size_t(T * (l.dim / kChunk)) * 4);
  o.hq8 = take(size_t(rows * l.inter));
  o.hs = take(size_t(rows * (l.inter / kChunk)) * 4);
  o.total = off;
  return o;
}

// ---- small device helpers ----------------------------------------------------------------------

__device__ __forceinline__ float sqrt_softplus_dev(float logit) {
  const float sp = logit > 20.0f ? logit : log1pf(expf(logit));
  return sqrtf(sp);
}

__device__ __forceinline__ float round_bf16_dev(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&b);
}

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float e8m0_to_float_dev(uint32_t code) {
  // 2^(code-127); code 0 is the subnormal 2^-127, 255 is NaN.
  if (code == 0) return __uint_as_float(0x00400000u);
  if (code == 255) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(code << 23);
}

// The e2m1 code in the low 4 bits to fp32 with ALU operations only (a shared-memory table made
// the prefill GEMMs LDS-bound): the sign to bit 31 and exponent:mantissa (3 bits) to bits 24..22
// give 2^-126 times the value for every code (code 1, 0.5, lands on the fp32 subnormal 2^-127),
// and the multiplication by 2^126 is exact.
__device__ __forceinline__ float e2m1_to_float_dev(uint32_t code) {
  const uint32_t bits = ((code & 0x8u) << 28) | ((code & 0x7u) << 22);
  return __uint_as_float(bits) * 0x1p126f;
}

__device__ __forceinline__ float e4m3_to_float_dev(uint32_t code) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code & 0xFFu), __NV_E4M3);
  return __half2float(*reinterpret_cast<__half*>(&h));
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// ---- 1. router logits --------------------------------------------------------------------------

// Small T (decode): a CTA per (kEB experts, kTB tokens) with the 8 warps splitting D, so that the
// gate (E x D) streams with many warps in flight; partial sums reduced in warp order. kEB = 1,
// kTB = 8 for T <= 8 (256 CTAs stream the gate from HBM); kEB = 4, kTB = 16 above (each x element
// loaded once per 4 experts instead of once per expert: at T = 64 the L2 traffic falls from
// ~295 MB to ~82 MB). Every logit gets the same arithmetic whatever the tile (per lane the same
// fmaf chain over k, the same shuffle tree, the warps added in order): bit-identical results.
// The quantization of x that forward() folds into the small-T logits kernel (section 4/6).
struct XQuant {
  bool on = false;
  uint16_t* out = nullptr;
  bool fp8 = false;
  uint8_t* out8 = nullptr;
  float* scale8 = nullptr;
  bool permute = false;
};
__device__ __forceinline__ void quant_rows_warp(int64_t warp, const float* __restrict__ in,
                                                int64_t len, int64_t rows,
                                                uint16_t* __restrict__ out, bool fp8,
                                                uint8_t* __restrict__ out8,
                                                float* __restrict__ scale8, bool permute);

// Router logits of experts [e0, e0 + kEB) x tokens [t0, t0 + kTB) (the whole CTA calls, with at
// least 8 warps): warps 0-7 each sum a slice D / 8 of K, lane by lane in k order, then the slices
// in warp order; warps past 8 only pass the barrier. So every CTA width and every kEB / kTB gives
// a logit the same bits.
template <bool kBf16, int kEB, int kTB>
__device__ __forceinline__ void router_logits_tile(const float* __restrict__ x,
                                                   const void* __restrict__ gate, int64_t T,
                                                   int64_t D, int64_t E, float* __restrict__ logits,
                                                   int64_t e0, int64_t t0) {
  __shared__ float part[8][kEB][kTB];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ne = E - e0 < kEB ? int(E - e0) : kEB;
  const int nt = T - t0 < kTB ? int(T - t0) : kTB;
  const int64_t slice = D / 8;  // D % 128 == 0: slices of multiples of 16
  if (warp < 8) {
    float acc[kEB][kTB];
#pragma unroll
    for (int i = 0; i < kEB; ++i)
#pragma unroll
      for (int j = 0; j < kTB; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int64_t k = warp * slice + lane * 4; k < (warp + 1) * slice; k += 128) {
      float w[kEB][4];
#pragma unroll
      for (int i = 0; i < kEB; ++i) {
        const int64_t e = e0 + (i < ne ? i : 0);  // rows past E: a valid row, never stored
        if constexpr (kBf16) {
          const uint2 raw =
              *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(gate) + e * D + k);
          w[i][0] = __uint_as_float(raw.x << 16);
          w[i][1] = __uint_as_float(raw.x & 0xFFFF0000u);
          w[i][2] = __uint_as_float(raw.y << 16);
          w[i][3] = __uint_as_float(raw.y & 0xFFFF0000u);
        } else {
          const float4 v =
              *reinterpret_cast<const float4*>(static_cast<const float*>(gate) + e * D + k);
          w[i][0] = v.x;
          w[i][1] = v.y;
          w[i][2] = v.z;
          w[i][3] = v.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kTB; ++j) {
        if (j < nt) {
          const float4 xv = *reinterpret_cast<const float4*>(x + (t0 + j) * D + k);
#pragma unroll
          for (int i = 0; i < kEB; ++i) {
            acc[i][j] = fmaf(xv.x, w[i][0], acc[i][j]);
            acc[i][j] = fmaf(xv.y, w[i][1], acc[i][j]);
            acc[i][j] = fmaf(xv.z, w[i][2], acc[i][j]);
            acc[i][j] = fmaf(xv.w, w[i][3], acc[i][j]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kEB; ++i)
#pragma unroll
      for (int j = 0; j < kTB; ++j) {
        float v = acc[i][j];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == 0) part[warp][i][j] = v;
      }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kEB * kTB; idx += blockDim.x) {
    const int i = idx / kTB, j = idx % kTB;
    if (i >= ne || j >= nt) continue;
    float v = 0.0f;
    for (int w = 0; w < 8; ++w) v += part[w][i][j];
    logits[(t0 + j) * E + e0 + i] = v;
  }
}

// T <= 64: one CTA of 8 warps per kEB experts and kTB tokens. With q.on, warp w of the grid
// (CTA-linear) afterwards quantizes x's 128-blocks 2w and 2w + 1 as quant_rows_kernel does (the
// host checks that the grid covers T x D / 128 blocks), which saves the decode step a launch.
template <bool kBf16, int kEB, int kTB>
__global__ void router_logits_small_kernel(const float* __restrict__ x,
                                           const void* __restrict__ gate, int64_t T, int64_t D,
                                           int64_t E, float* __restrict__ logits, XQuant q) {
  pdl_begin();
  router_logits_tile<kBf16, kEB, kTB>(x, gate, T, D, E, logits, int64_t(blockIdx.x) * kEB,
                                      int64_t(blockIdx.y) * kTB);
  if (q.on) {
    const int64_t gwarp = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * 8 + (threadIdx.x >> 5);
    quant_rows_warp(gwarp, x, D, T, q.out, q.fp8, q.out8, q.scale8, q.permute);
  }
}

// Prefill (T > 64): a tiled fp32 SIMT GEMM (the logits stay fp32 FMAs: routing must match the
// CPU's top-k). A CTA computes 64 tokens x 64 experts, K in steps of 32 staged in shared memory
// (transposed, so a thread reads 4 tokens and 4 experts as two float4 per k); each thread owns a
// 4 x 4 block and sums in k order (deterministic). x is read E / 64 times instead of E / 8.
constexpr int kLogitsTile = 64;
constexpr int kLogitsK = 32;
constexpr int kLogitsPad = kLogitsTile + 4;  // row stride in floats (16-byte aligned rows)

template <bool kBf16>
__global__ void __launch_bounds__(256)
    router_logits_tiled_kernel(const float* __restrict__ x, const void* __restrict__ gate,
                               int64_t T, int64_t D, int64_t E, float* __restrict__ logits) {
  pdl_begin();
  __shared__ __align__(16) float xs[kLogitsK][kLogitsPad];  // [k][token]
  __shared__ __align__(16) float gs[kLogitsK][kLogitsPad];  // [k][expert]
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t t0 = int64_t(blockIdx.y) * kLogitsTile, e0 = int64_t(blockIdx.x) * kLogitsTile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < D; k0 += kLogitsK) {
#pragma unroll
    for (int rep = 0; rep < 2; ++rep) {
      const int idx = tid + 256 * rep;  // 512 float4 per operand tile
      const int row = idx >> 3, kq = (idx & 7) * 4;
      float4 xv = make_float4(0.f, 0.f, 0.f, 0.f), gv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t0 + row < T) xv = __ldg(reinterpret_cast<const float4*>(x + (t0 + row) * D + k0 + kq));
      if (e0 + row < E) {
        if constexpr (kBf16) {
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(
              static_cast<const uint16_t*>(gate) + (e0 + row) * D + k0 + kq));
          gv = make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xFFFF0000u),
                           __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xFFFF0000u));
        } else {
          gv = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(gate) +
                                                     (e0 + row) * D + k0 + kq));
        }
      }
      xs[kq + 0][row] = xv.x;
      xs[kq + 1][row] = xv.y;
      xs[kq + 2][row] = xv.z;
      xs[kq + 3][row] = xv.w;
      gs[kq + 0][row] = gv.x;
      gs[kq + 1][row] = gv.y;
      gs[kq + 2][row] = gv.z;
      gs[kq + 3][row] = gv.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kLogitsK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[kk][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&gs[kk][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + ty * 4 + i;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t e = e0 + tx * 4 + j;
      if (e < E) logits[t * E + e] = acc[i][j];
    }
  }
}

// ---- 2. route ----------------------------------------------------------------------------------

struct RouteArgs {
  const float* logits;
  const float* bias;
  const int32_t* tid2eid;
  const int32_t* token_ids;
  int64_t T, E, k;
  float route_scale, eps;
  int32_t* experts;
  float* weights;
};

// Token t's experts and weights (the whole warp calls). Lane r < k ends with slot r's expert and
// its unbiased score in registers, so the renormalization needs no reload (reading the
// just-written experts back from global memory, then each one's logit, was a chain of 12
// dependent loads: ~10 us at any T, bench_moe session 18).
__device__ __forceinline__ void route_token(const RouteArgs& a, int64_t t) {
  const int lane = threadIdx.x & 31;
  const float* lg = a.logits + t * a.E;
  int my_e = 0;
  float my_s = 0.0f;
  if (a.tid2eid) {
    if (lane < a.k) {
      my_e = a.tid2eid[int64_t(a.token_ids[t]) * a.k + lane];
      my_s = sqrt_softplus_dev(lg[my_e]);
    }
  } else {
    constexpr int kPer = kMaxExperts / 32;
    float raw[kPer], b[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t e = lane + 32 * i;
      raw[i] = e < a.E ? sqrt_softplus_dev(lg[e]) : 0.0f;
      b[i] = e < a.E ? raw[i] + (a.bias ? a.bias[e] : 0.0f) : -INFINITY;
    }
    for (int r = 0; r < a.k; ++r) {
      float best = -INFINITY;
      int best_idx = 0x7FFFFFFF;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = lane + 32 * i;
        if (e < a.E && (b[i] > best || (b[i] == best && e < best_idx))) {
          best = b[i];
          best_idx = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
        const int oi = __shfl_xor_sync(0xFFFFFFFFu, best_idx, o);
        if (ov > best || (ov == best && oi < best_idx)) {
          best = ov;
          best_idx = oi;
        }
      }
      // Every lane holds the same winner; its owner drops it and hands over its unbiased score.
      float sel = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (lane + 32 * i == best_idx) {
          sel = raw[i];
          b[i] = -INFINITY;
        }
      }
      const float score = __shfl_sync(0xFFFFFFFFu, sel, best_idx & 31);
      if (lane == r) {
        my_e = best_idx;
        my_s = score;
      }
    }
  }
  // The renormalization in slot order, as cpu::route_token (every lane sums the same sequence).
  float sum = 0.0f;
  for (int i = 0; i < a.k; ++i) sum += __shfl_sync(0xFFFFFFFFu, my_s, i);
  if (lane < a.k) {
    a.experts[t * a.k + lane] = my_e;
    a.weights[t * a.k + lane] = my_s / (sum + a.eps) * a.route_scale;
  }
}

__global__ void route_kernel(RouteArgs a) {
  pdl_begin();
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (t < a.T) route_token(a, t);
}

// ---- 3. plan -----------------------------------------------------------------------------------

struct PlanArgs {
  const int32_t* experts;
  const float* weights;
  int64_t T, k, E, begin, end;
  bool add_shared;
  int bt;
  int32_t* group_offset;  // [E + 2]
  int2* tiles;            // (group, row0)
  int32_t* num_tiles;
  int32_t* row_token;
  int32_t* row_slot;
  float* row_weight;
};

constexpr int kPlanThreads = 1024;

// Exclusive scan of v over the block (kPlanThreads threads); returns the block total in *total.
__device__ int block_exclusive_scan(int v, int* scratch /*[32]*/, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = scratch[lane];
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xFFFFFFFFu, winc, o);
      if (lane >= o) winc += n;
    }
    scratch[lane] = winc - w;  // exclusive prefix of the warps
    if (lane == 31) scratch[32] = winc;
  }
  __syncthreads();
  const int out = scratch[warp] + inc - v;
  *total = scratch[32];
  __syncthreads();
  return out;
}

// The tiles and row maps of the grouped GEMMs from the routed slots (one CTA of kPlanThreads).
__device__ __forceinline__ void plan_block(const PlanArgs& a) {
  __shared__ int count[kPlanThreads];
  __shared__ int cursor[kPlanThreads];
  __shared__ int scratch[33];
  const int tid = threadIdx.x;
  const int groups = int(a.E) + 1;
  const int64_t slots = a.T * a.k;
  count[tid] = 0;
  __syncthreads();
  for (int64_t s = tid; s < slots; s += kPlanThreads) {
    const int e = a.experts[s];
    if (e >= a.begin && e < a.end) atomicAdd(&count[e], 1);
  }
  if (tid == 0) count[a.E] = a.add_shared ? int(a.T) : 0;
  __syncthreads();
  const int c = tid < groups ? count[tid] : 0;
  const int tl = (c + a.bt - 1) / a.bt;
  int total_rows = 0, total_tiles = 0;
  const int row_off = block_exclusive_scan(c, scratch, &total_rows);
  const int tile_off = block_exclusive_scan(tl, scratch, &total_tiles);
  if (tid < groups) {
    a.group_offset[tid] = row_off;
    cursor[tid] = row_off;
    for (int i = 0; i < tl; ++i) a.tiles[tile_off + i] = make_int2(tid, i * a.bt);
  }
  if (tid == 0) {
    a.group_offset[groups] = total_rows;
    *a.num_tiles = total_tiles;
  }
  __syncthreads();
  for (int64_t s = tid; s < slots; s += kPlanThreads) {
    const int e = a.experts[s];
    if (e >= a.begin && e < a.end) {
      const int pos = atomicAdd(&cursor[e], 1);
      a.row_token[pos] = int(s / a.k);
      a.row_slot[pos] = int(s);
      a.row_weight[pos] = a.weights[s];
    }
  }
  if (a.add_shared) {
    const int base = cursor[a.E];
    for (int64_t t = tid; t < a.T; t += kPlanThreads) {
      a.row_token[base + t] = int(t);
      a.row_slot[base + t] = int(slots + t);
      a.row_weight[base + t] = 1.0f;
    }
  }
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(PlanArgs a) {
  pdl_begin();
  plan_block(a);
}

// Decode sizes (T <= kRoutePlanMaxTokens): the routing of every token (a warp per token, as
// route_kernel, or by rank over the CTA at T <= 2: route_tokens_by_rank) and the plan in one CTA,
// one launch instead of two. The CTA barrier makes the experts and weights its warps wrote
// visible to the plan. At most one token per warp: with 64 tokens (two per warp, all on one SM)
// the node took 31.6 us against 12.8 at T = 1 and 15.2 at T = 16, more than route_kernel (~11 us,
// T / 8 CTAs) and plan_kernel apart (bench_moe, H100, session 20).
constexpr int64_t kRoutePlanMaxTokens = kPlanThreads / 32;

// Expert e's biased score s as a 64-bit key whose unsigned order is cpu::topk_indices' order:
// the score's bits made order-preserving (+0 for -0; NaN below every number, never chosen ahead
// of one), then the inverted index (equal scores: the lower index first).
__device__ __forceinline__ uint64_t route_key(float s, int e) {
  uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  if (isnan(s)) u = 0u;
  return (uint64_t(u) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(e));
}

// Whether route_plan_kernel routes T tokens of E experts by rank (route_tokens_by_rank): while
// the tokens' thread groups (E rounded up to a warp) fill at most half the CTA. Measured on H100
// (session 26, forward in a graph, by rank / a warp per token, E = 256): T = 1 75.6 / 81.7 us,
// T = 2 109.5 / 113.5, T = 4 (the whole CTA) 172.6 / 173.4, T = 8 (two passes) 300.3 / 293.3.
constexpr bool route_by_rank_pays(int64_t T, int64_t E) {
  return T * ((E + 31) / 32 * 32) <= kPlanThreads / 2;
}

// The routing of the step's tokens by the whole CTA (kPlanThreads threads, no hash routing), one
// thread per (token, expert), instead of a warp per token: one warp's chain of route_token (16
// scores per lane, then k rounds of argmax shuffles) took ~10 us of the 15 us route + plan launch
// at T = 1 (ncu, H100, session 26). Per pass of kPlanThreads / G tokens (G = E rounded up to a
// warp): every thread computes its expert's score and key (route_key) into shared memory, counts
// the token's larger keys (its rank), and the thread of rank r < k writes slot r; then threads
// r < k renormalize, summing the k unbiased scores in slot order as cpu::route_token does. The
// experts and weights are route_token's, bit for bit (MoeTuning::route_by_warp compares them).
__device__ __forceinline__ void route_tokens_by_rank(const RouteArgs& a) {
  __shared__ uint64_t keys[kPlanThreads];
  __shared__ float slot_score[kPlanThreads / 32][kMaxTopk];
  const int E = int(a.E), k = int(a.k);
  const int G = (E + 31) / 32 * 32, P = kPlanThreads / G;
  const int grp = int(threadIdx.x) / G, e = int(threadIdx.x) % G;
  for (int64_t t0 = 0; t0 < a.T; t0 += P) {
    const int64_t t = t0 + grp;
    const bool on = grp < P && t < a.T && e < E;
    float raw = 0.0f;
    if (on) {
      raw = sqrt_softplus_dev(a.logits[t * a.E + e]);
      keys[threadIdx.x] = route_key(raw + (a.bias ? a.bias[e] : 0.0f), e);
    }
    __syncthreads();
    if (on) {
      const uint64_t* kg = keys + grp * G;
      const uint64_t mine = kg[e];
      int rank = 0;
#pragma unroll 8
      for (int j = 0; j < E; ++j) rank += kg[j] > mine ? 1 : 0;
      if (rank < k) {
        a.experts[t * k + rank] = e;
        slot_score[grp][rank] = raw;
      }
    }
    __syncthreads();
    if (grp < P && t < a.T && e < k) {
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += slot_score[grp][i];
      a.weights[t * k + e] = slot_score[grp][e] / (sum + a.eps) * a.route_scale;
    }
    __syncthreads();  // the next pass rewrites keys and slot_score
  }
}

// by_rank: route_tokens_by_rank (the caller checks no hash routing and route_by_rank_pays), else
// a warp per token.
__device__ __forceinline__ void route_plan_block(const RouteArgs& ra, const PlanArgs& pa,
                                                 bool by_rank) {
  if (by_rank) {
    route_tokens_by_rank(ra);
  } else {
    for (int64_t t = threadIdx.x >> 5; t < ra.T; t += kPlanThreads / 32) route_token(ra, t);
  }
  __syncthreads();
  plan_block(pa);
}

__global__ void __launch_bounds__(kPlanThreads)
    route_plan_kernel(RouteArgs ra, PlanArgs pa, bool by_rank) {
  pdl_begin();
  route_plan_block(ra, pa, by_rank);
}

// Decode sizes (T <= kTB <= kFusedRouteMaxTokens; MoeTuning::route_launch 1): the router logits,
// x's quantization and the routing with the plan in one launch instead of two. CTAs of
// kPlanThreads threads (so at most 64 registers: kTB is fitted to T, since 8 token columns spill),
// kFusedLogitsExperts experts each (128 CTAs at E = 256: one per SM); warps 0-7 compute
// the logits as router_logits_small_kernel does (router_logits_tile: the same bits), then every
// warp quantizes two of x's 128-blocks (the host checks that the grid covers them). The CTA that
// finishes last, found with the layer's arrival counter (MoeDeviceLayer::route_done), then runs
// route_plan_kernel's body on every CTA's logits and sets the counter back to 0 for the next
// forward. Memory order: each CTA's barrier orders its logit stores before thread 0's fence and
// arrival (fences are cumulative); the last CTA's thread 0 fences after it sees the count, and
// its barrier orders that before the CTA's loads.
constexpr int64_t kFusedRouteMaxTokens = 8;
constexpr int kFusedLogitsExperts = 2;

template <bool kBf16, int kTB>
__global__ void __launch_bounds__(kPlanThreads, 1)
    router_logits_route_kernel(const float* __restrict__ x, const void* __restrict__ gate,
                               int64_t T, int64_t D, int64_t E, float* __restrict__ logits,
                               XQuant q, RouteArgs ra, PlanArgs pa, bool by_rank,
                               unsigned* __restrict__ done) {
  pdl_begin();
  __shared__ bool last;
  router_logits_tile<kBf16, kFusedLogitsExperts, kTB>(x, gate, T, D, E, logits,
                                                      int64_t(blockIdx.x) * kFusedLogitsExperts, 0);
  if (q.on) {
    const int64_t gwarp = int64_t(blockIdx.x) * (kPlanThreads / 32) + (threadIdx.x >> 5);
    quant_rows_warp(gwarp, x, D, T, q.out, q.fp8, q.out8, q.scale8, q.permute);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  route_plan_block(ra, pa, by_rank);
  if (threadIdx.x == 0) *done = 0u;
}

// ---- 4/6. activation quantization --------------------------------------------------------------

// Half a warp per 128-element block: bf16 of the FP8 simulation (exact in bf16) or of the value.
// With out8 (FP8 path) the e4m3 codes go to out8 [rows, len] and the scales to scale8
// [rows, len / 128]; out (bf16) is then nullable. With permute (the sm_90a prefill path) every
// output (out and out8) holds each 128-block in wg_tile's K order: position
// 16 kk + 8 h + 2 t + e holds element 32 t + 16 (kk / 4) + 8 (kk / 2 % 2) + 2 (kk % 2) + h + 4 e,
// so lane `sub` (= 2 kk + h) loads elements 32 t + 4 e + (sub & 12) * 2 + (sub & 3).
// The two blocks 2 warp and 2 warp + 1 of in [rows, len] (half a warp each; the whole warp calls).
__device__ __forceinline__ void quant_rows_warp(int64_t warp, const float* __restrict__ in,
                                                int64_t len, int64_t rows,
                                                uint16_t* __restrict__ out, bool fp8,
                                                uint8_t* __restrict__ out8,
                                                float* __restrict__ scale8, bool permute) {
  const int lane = threadIdx.x & 31, sub = lane & 15;
  const int64_t bpr = len / kChunk;
  const int64_t block = warp * 2 + (lane >> 4);
  const bool active = block < rows * bpr;
  const int64_t row = active ? block / bpr : 0;
  const int64_t col = active ? (block % bpr) * kChunk + sub * 8 : 0;  // output position
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (active && permute) {
    const float* src = in + row * len + (col - sub * 8) + (sub & 12) * 2 + (sub & 3);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = src[32 * (i >> 1) + 4 * (i & 1)];
  } else if (active) {
    const float4 p0 = *reinterpret_cast<const float4*>(in + row * len + col);
    const float4 p1 = *reinterpret_cast<const float4*>(in + row * len + col + 4);
    v[0] = p0.x; v[1] = p0.y; v[2] = p0.z; v[3] = p0.w;
    v[4] = p1.x; v[5] = p1.y; v[6] = p1.z; v[7] = p1.w;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (!active) return;
  if (fp8) {
    // cpu::quantize_fp8_blocks: s = 2^ceil(log2(max(amax, 1e-4) / 448)), e4m3(clamp(x / s)) * s.
    const float q = fmaxf(amax, 1e-4f) / 448.0f;
    const uint32_t u = __float_as_uint(q);
    const uint32_t code = ((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) ? 1u : 0u);
    const float inv_scale = __uint_as_float((254u - code) << 23);
    const float scale = __uint_as_float(code << 23);
    uint32_t codes[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float x = v[i] * inv_scale;
      if (!isnan(x)) x = fminf(fmaxf(x, -448.0f), 448.0f);
      const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      codes[i >> 2] |= uint32_t(c) << ((i & 3) * 8);
      v[i] = e4m3_to_float_dev(c) * scale;
    }
    if (out8) {
      *reinterpret_cast<uint2*>(out8 + row * len + col) = make_uint2(codes[0], codes[1]);
      if (sub == 0) scale8[row * bpr + col / kChunk] = scale;
      if (!out) return;
    }
  }
  uint4 o;
  o.x = pack_bf16x2(v[0], v[1]);
  o.y = pack_bf16x2(v[2], v[3]);
  o.z = pack_bf16x2(v[4], v[5]);
  o.w = pack_bf16x2(v[6], v[7]);
  *reinterpret_cast<uint4*>(out + row * len + col) = o;
}

__global__ void quant_rows_kernel(const float* __restrict__ in, int64_t len, int64_t rows_bound,
                                  const int32_t* rows_dev, uint16_t* __restrict__ out, bool fp8,
                                  uint8_t* __restrict__ out8, float* __restrict__ scale8,
                                  bool permute) {
  pdl_begin();
  const int64_t warp = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int64_t rows = rows_dev ? int64_t(*rows_dev) : rows_bound;
  quant_rows_warp(warp, in, len, rows, out, fp8, out8, scale8, permute);
}

// ---- 5/7. grouped expert GEMMs -----------------------------------------------------------------
//
// A warp owns two sets of 16 weight rows (gate/up: w1 and w3 rows of the same 16 inter columns;
// down: 32 consecutive w2 rows) and all 8*NT tokens of the tile: mma.sync m16n8k16 with the
// weights as the A operand (rows = output features) and the tokens as B. Per 128-K chunk lane
// (g = lane/4, t4 = lane%4) loads bytes of K range [32*t4, 32*t4 + 32) of rows g and g+8 (16 bytes
// for FP4, 32 for FP8) and the matching block scales; the K order inside the mma is permuted
// consistently for A and B (the sum does not depend on it), so mma step s of the chunk uses K
// elements 32*t4 + 4s + {0..3}. The activation tile [8*NT, 128] bf16 goes through shared memory
// (cp.async, two stages), with the 16-byte units XOR-swizzled so that the uint4 reads are free
// of bank conflicts.

struct GemmArgs {
  const MoeDeviceExpert* experts;
  int E;
  const int2* tiles;
  const int32_t* num_tiles;
  const int32_t* group_offset;
  const int32_t* row_token;
  const int32_t* row_slot;
  const float* row_weight;
  const uint16_t* act;  // gate/up: xq [T, D] (rows via row_token); down: hq [rows, inter]
  int64_t K;            // D or inter
  int64_t N;            // inter or D
  float* out;           // gate/up: h [rows, inter]; down: ybuf [slots, D] (rows via row_slot)
  float swiglu_limit;
  bool shared_clamp;
  bool round_bf16;
  // FP8 path: e4m3 activation codes (rows as act) and their scales per 128 K.
  const uint8_t* act8 = nullptr;
  const float* act_scale = nullptr;
  bool tiles_fastest = false;  // prefill grids (tiles, N blocks) instead of (N blocks, tiles)
  int wg_step = 0;  // wgmma prefill tiles' width step: 0 = the kernel's (16 / 32), 8, 32 (pf_step)
  // FP8 path (f8_place): > 0, the shared expert's tiles (the last shared_first of the tile list)
  // take the grid's first CTAs and the routed tiles follow tile by tile (MoeTuning::f8_order 0).
  int shared_first = 0;
  // FP8 path: the rows of the activation tile in shared memory (no tile of the launch has more;
  // MoeTuning::f8_act_rows), 0 = the tile's 8 * NT. Fewer rows, less shared memory per CTA: at
  // T = 1 and 2 four CTAs per SM instead of three.
  int act_rows = 0;
};

// The prefill kernels' (128-row tiles) place in their grid. By default the grid is (N blocks,
// tiles): the N blocks of one tile are launched side by side, so the tile's activation rows come
// from HBM once and from L2 for its other N blocks. `tiles_fastest` (MoeTuning::pf_raster = 1)
// is the order before session 20, (tiles, N blocks), which re-read every tile's activations from
// HBM once per N block when they exceed L2 (ncu, T = 4096: 3-4x the GEMMs' minimal DRAM bytes).
__device__ __forceinline__ int pf_tile_index(const GemmArgs& a) {
  return int(a.tiles_fastest ? blockIdx.x : blockIdx.y);
}
__device__ __forceinline__ int64_t pf_n_block(const GemmArgs& a) {
  return int64_t(a.tiles_fastest ? blockIdx.y : blockIdx.x);
}

// The gate/up epilogue of one h element, in cpu::moe_forward's order: gate `av` and up `bv` (fp32
// sums, block scales applied) rounded to bf16 where REF keeps bf16, the clamped SwiGLU (the
// shared expert unclamped unless shared_clamp), times the route weight of routed row `gr`.
__device__ __forceinline__ float swiglu_hidden(const GemmArgs& a, float av, float bv, bool shared,
                                               int gr) {
  if (a.round_bf16) {
    av = round_bf16_dev(av);
    bv = round_bf16_dev(bv);
  }
  const float limit = shared && !a.shared_clamp ? 0.0f : a.swiglu_limit;
  if (limit > 0.0f) {
    av = fminf(av, limit);
    bv = fminf(fmaxf(bv, -limit), limit);
  }
  const float silu = silu_dev(av);  // av / (1 + e^-av) rounded as `/`, without its CALL
  float hidden = silu * bv;
  if (!shared) hidden = a.row_weight[gr] * hidden;
  if (a.round_bf16) hidden = round_bf16_dev(hidden);
  return hidden;
}

__device__ __forceinline__ int swizzle_unit(int u, int r) {
  return u ^ (((u >> 3) & 1) | ((r & 1) << 1));
}

template <int FMT>
struct WeightRegs {
  static constexpr int kVec = FMT == int(WeightFormat::kFp8Block) ? 4 : 2;  // uint4 per set
  uint4 raw[2][kVec];
  uint32_t sc[2][2];
};

template <int FMT>
__device__ __forceinline__ void load_weights(WeightRegs<FMT>& w, const uint8_t* const (&data)[2],
                                             const uint8_t* const (&scale)[2],
                                             const int64_t (&row_g)[2], int64_t K, int64_t kc,
                                             int t4) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_g[j] + 8 * h;
      if constexpr (FMT == int(WeightFormat::kFp8Block)) {
        const uint8_t* p = data[j] + row * K + kc + t4 * 32;
        w.raw[j][2 * h] = load_stream(p);
        w.raw[j][2 * h + 1] = load_stream(p + 16);
      } else {
        w.raw[j][h] = load_stream(data[j] + row * (K / 2) + kc / 2 + t4 * 16);
        if constexpr (FMT == int(WeightFormat::kMxfp4)) {
          w.sc[j][h] = scale[j][row * (K / 32) + kc / 32 + t4];
        } else {
          const uint8_t* s = scale[j] + row * (K / 16) + kc / 16 + t4 * 2;
          w.sc[j][h] = uint32_t(s[0]) | (uint32_t(s[1]) << 8);
        }
      }
    }
    if constexpr (FMT == int(WeightFormat::kFp8Block)) {
      w.sc[j][0] = scale[j][(row_g[j] / 128) * (K / 128) + kc / 128];
    }
  }
}

// A fragment of set j for mma step s (elements 4s..4s+3 of the lane's 32): a[0] row g elements
// 4s, 4s+1; a[1] row g+8 the same; a[2], a[3] elements 4s+2, 4s+3.
template <int FMT>
__device__ __forceinline__ void make_a(const WeightRegs<FMT>& w, int j, int s,
                                       uint32_t (&a)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (FMT == int(WeightFormat::kFp8Block)) {
      const float sc = e8m0_to_float_dev(w.sc[j][0]);
      // 32 bytes = 2 uint4; elements 4s..4s+3 are bytes 4s..4s+3: word s of the pair.
      const uint32_t v = word(w.raw[j][2 * h + (s >> 2)], s & 3);
      const float2 lo = e4m3x2_to_float2(v);
      const float2 hi = e4m3x2_to_float2(v >> 16);
      a[h] = pack_bf16x2(lo.x * sc, lo.y * sc);
      a[2 + h] = pack_bf16x2(hi.x * sc, hi.y * sc);
    } else {
      float sc;
      if constexpr (FMT == int(WeightFormat::kMxfp4)) {
        sc = e8m0_to_float_dev(w.sc[j][h]);
      } else {
        sc = e4m3_to_float_dev((w.sc[j][h] >> ((s >> 2) * 8)) & 0xFFu);
      }
      const uint32_t v = word(w.raw[j][h], s >> 1) >> ((s & 1) * 16);
      a[h] = pack_bf16x2(e2m1_to_float_dev(v) * sc, e2m1_to_float_dev(v >> 4) * sc);
      a[2 + h] = pack_bf16x2(e2m1_to_float_dev(v >> 8) * sc, e2m1_to_float_dev(v >> 12) * sc);
    }
  }
}

template <int NT, bool kFused, int KS, int FMT>
__device__ __forceinline__ void gemm_tile(const GemmArgs& a, const MoeDeviceExpert& ex, int g,
                                          int base, int row0, int rows, uint16_t* smem) {
  constexpr int BT = 8 * NT;
  constexpr int WN = 4 / KS;                   // warps along N; KS warps split K
  constexpr int kStageElems = KS * BT * kChunk;  // one super-chunk: KS chunks of 128 K
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, t4 = lane & 3;
  const int warp_n = warp % WN, warp_k = warp / WN;
  const int64_t K = a.K;
  const uint8_t* data[2];
  const uint8_t* scale[2];
  int64_t row_g[2];
  float gscale[2];
  if constexpr (kFused) {
    const int64_t n0 = int64_t(blockIdx.y) * (16 * WN) + 16 * warp_n;
    data[0] = ex.data[0];
    data[1] = ex.data[1];
    scale[0] = ex.scale[0];
    scale[1] = ex.scale[1];
    gscale[0] = ex.global_scale[0];
    gscale[1] = ex.global_scale[1];
    row_g[0] = row_g[1] = n0 + gid;
  } else {
    const int64_t n0 = int64_t(blockIdx.y) * (32 * WN) + 32 * warp_n;
    data[0] = data[1] = ex.data[2];
    scale[0] = scale[1] = ex.scale[2];
    gscale[0] = gscale[1] = ex.global_scale[2];
    row_g[0] = n0 + gid;
    row_g[1] = n0 + 16 + gid;
  }

  // Activation rows of the tile: the source row of smem row r (rows past the group's end repeat
  // the last valid row; their results are dropped).
  auto act_row = [&](int r) -> const uint16_t* {
    const int gr = base + row0 + min(r, rows - 1);
    if constexpr (kFused) return a.act + int64_t(a.row_token[gr]) * K;
    else return a.act + int64_t(gr) * K;
  };
  const int64_t chunks = K / kChunk;
  const int64_t supers = (chunks + KS - 1) / KS;
  // Stage layout: [KS chunks][BT rows][128] bf16, 16-byte units swizzled per row.
  auto load_act = [&](int stage, int64_t sc) {
    uint16_t* dst = smem + stage * kStageElems;
    for (int i = tid; i < KS * BT * 16; i += kGemmThreads) {
      const int q = i / (BT * 16), r = (i >> 4) % BT, u = i & 15;
      const int64_t chunk = sc * KS + q;
      if (chunk < chunks) {
        cp_async16(dst + (q * BT + r) * kChunk + swizzle_unit(u, r) * 8,
                   act_row(r) + chunk * kChunk + u * 8);
      }
    }
    cp_async_commit();
  };

  float acc[2][NT][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][n][c] = 0.0f;

  auto my_chunk = [&](int64_t sc) { return sc * KS + warp_k; };
  WeightRegs<FMT> w[2];
  if (my_chunk(0) < chunks)
    load_weights<FMT>(w[0], data, scale, row_g, K, my_chunk(0) * kChunk, t4);
  load_act(0, 0);

  auto compute = [&](const WeightRegs<FMT>& wr, int stage) {
    const uint16_t* src = smem + stage * kStageElems + warp_k * BT * kChunk;
#pragma unroll
    for (int s = 0; s < 8; s += 2) {
      uint32_t af[2][2][4];  // [step][set]
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        make_a<FMT>(wr, j, s, af[0][j]);
        make_a<FMT>(wr, j, s + 1, af[1][j]);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int r = n * 8 + gid;
        const int u = t4 * 4 + (s >> 1);
        const uint4 b = *reinterpret_cast<const uint4*>(src + r * kChunk + swizzle_unit(u, r) * 8);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          mma_bf16(acc[j][n], af[0][j], b.x, b.y);
          mma_bf16(acc[j][n], af[1][j], b.z, b.w);
        }
      }
    }
  };

  for (int64_t sc = 0; sc < supers; sc += 2) {
    // Even super-chunk sc in w[0] / stage 0, odd sc+1 in w[1] / stage 1.
    const bool has1 = sc + 1 < supers;
    if (has1) {
      if (my_chunk(sc + 1) < chunks)
        load_weights<FMT>(w[1], data, scale, row_g, K, my_chunk(sc + 1) * kChunk, t4);
      load_act(1, sc + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (my_chunk(sc) < chunks) compute(w[0], 0);
    __syncthreads();
    if (!has1) break;
    const bool has2 = sc + 2 < supers;
    if (has2) {
      if (my_chunk(sc + 2) < chunks)
        load_weights<FMT>(w[0], data, scale, row_g, K, my_chunk(sc + 2) * kChunk, t4);
      load_act(0, sc + 2);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (my_chunk(sc + 1) < chunks) compute(w[1], 1);
    __syncthreads();
  }

  if constexpr (KS > 1) {
    // Split-K reduction through shared memory (the stages are free now), in warp_k order:
    // deterministic.
    float* red = reinterpret_cast<float*>(smem);
    constexpr int kAccPerLane = 2 * NT * 4;
    if (warp_k > 0) {
      float* dst = red + (((warp_k - 1) * WN + warp_n) * kAccPerLane) * 32 + lane;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) dst[((j * NT + n) * 4 + c) * 32] = acc[j][n][c];
    }
    __syncthreads();
    if (warp_k > 0) return;
#pragma unroll
    for (int q = 1; q < KS; ++q) {
      const float* src = red + (((q - 1) * WN + warp_n) * kAccPerLane) * 32 + lane;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[j][n][c] += src[((j * NT + n) * 4 + c) * 32];
    }
  }

  // Epilogue. acc[j][n][c]: weight row row_g[j] + 8*(c>>1), tile token n*8 + 2*t4 + (c&1).
  const bool shared = g == a.E;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = n * 8 + 2 * t4 + (c & 1);
      if (r >= rows) continue;
      const int gr = base + row0 + r;
      if constexpr (kFused) {
        const int64_t col = row_g[0] + 8 * (c >> 1);
        a.out[int64_t(gr) * a.N + col] =
            swiglu_hidden(a, acc[0][n][c] * gscale[0], acc[1][n][c] * gscale[1], shared, gr);
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t col = row_g[j] + 8 * (c >> 1);
          float v = acc[j][n][c] * gscale[j];
          if (a.round_bf16) v = round_bf16_dev(v);
          a.out[int64_t(a.row_slot[gr]) * a.N + col] = v;
        }
      }
    }
  }
}

template <int NT, bool kFused, int KS>
__global__ void __launch_bounds__(kGemmThreads, NT == 1 ? 4 : 1)
    expert_gemm_kernel(GemmArgs a) {
  pdl_begin();
  __shared__ __align__(16) uint16_t smem[2 * KS * 8 * NT * kChunk];
  if (int(blockIdx.x) >= *a.num_tiles) return;
  const int2 tile = a.tiles[blockIdx.x];
  const int g = tile.x, row0 = tile.y;
  const int base = a.group_offset[g];
  const int rows = min(8 * NT, a.group_offset[g + 1] - base - row0);
  const MoeDeviceExpert ex = a.experts[g];
  const int fmt = kFused ? ex.format[0] : ex.format[2];
  if (fmt == int(WeightFormat::kMxfp4)) {
    gemm_tile<NT, kFused, KS, int(WeightFormat::kMxfp4)>(a, ex, g, base, row0, rows, smem);
  } else if (fmt == int(WeightFormat::kNvfp4)) {
    gemm_tile<NT, kFused, KS, int(WeightFormat::kNvfp4)>(a, ex, g, base, row0, rows, smem);
  } else {
    gemm_tile<NT, kFused, KS, int(WeightFormat::kFp8Block)>(a, ex, g, base, row0, rows, smem);
  }
}


// ---- 5/7 (FP8 path). grouped expert GEMMs on the FP8 tensor cores ------------------------------
//
// mma.sync m16n8k32 e4m3 x e4m3 -> fp32 (sm_89+). Numerics are the reference's: the activations
// are the FP8 simulation's operands themselves (e4m3 codes, power-of-two scale per 128 K, from
// quant_rows_kernel), and every e2m1 weight is exactly an e4m3 value: bit placement
// (code & 7) << 2 | sign << 7 gives e2m1 * 2^-6 for every code (0.5 lands on the e4m3 subnormal
// 2^-7), so the conversion is ~0.75 instructions per weight instead of ~6. One k32 step covers
// exactly one MXFP4 block (32 K) of each row, so the e8m0 block scale (times 2^6) multiplies the
// step's fp32 partial; the activation scale multiplies the chunk's (128 K) partial. FP8-block
// weights (the shared expert) feed the mma unconverted, their 128x128 scale per chunk.
//
// Weights stream through a per-warp shared-memory ring filled by cp.async (4 stages of 2 KB for
// FP4, 2 of 4 KB for FP8: up to 6 KB in flight per warp, no block-wide barrier in the main loop)
// and reach registers with ldmatrix, which yields the mma A fragment directly (lane (g, t4) gets
// 4 bytes t4 of a 16-byte row segment). For MXFP4 step s a lane holds bytes [16 s + 4 t4, +4) of
// rows g and g+8: K elements 32 s + 8 t4 + {0..7}; its even elements form a[0]/a[1] and its odd
// ones a[2]/a[3], so the B fragment takes activation bytes {0,2,4,6} and {1,3,5,7} of the same
// 8 (one 8-byte shared load and two byte permutes). The whole activation tile [8*NT, K] (valid
// rows only: the other columns of the mma are dropped) is loaded once at the start.

// A warp's ring: kRing weight bytes (8 KB: 4 FP4 / 2 FP8 stages; 16 KB: 8 / 4 stages) plus the
// MXFP4 scales (32 rows x 4 bytes per FP4 stage).
constexpr int ring_scale_bytes(int ring) { return ring / 2048 * 128; }
constexpr int kF8ActPad = 32;  // activation row stride K + 32: conflict-free 8-byte loads

// act_rows: GemmArgs::act_rows (0 = 8 * nt).
size_t f8_smem_bytes(int nt, int64_t K, int ring, int warps = 4, int act_rows = 0) {
  const size_t rows = size_t(act_rows > 0 ? std::min(act_rows, 8 * nt) : 8 * nt);
  return size_t(warps) * size_t(ring + ring_scale_bytes(ring)) + rows * size_t(K + kF8ActPad) +
         rows * size_t(K / kChunk) * 4;
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host selects this path only on sm_89+ (MoeDeviceLayer::fp8_mma)
#endif
}

// 8 e2m1 codes (nibble i = element i) -> e4m3 codes of 2^-6 times the values: elements
// {0,2,4,6} in *even, {1,3,5,7} in *odd (byte order).
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& even, uint32_t& odd) {
  const uint32_t sign = w & 0x88888888u;
  // Even elements: magnitude bits 0..2 of each byte to 2..4 and the sign bit 3 to 7 (the sign
  // bits of the odd elements land on bit 3 of the next byte, inside the magnitude mask).
  even = ((w << 2) & 0x1C1C1C1Cu) | ((sign << 4) & ~0x1C1C1C1Cu);
  // Odd elements: magnitude bits 4..6 to 2..4, the sign is already bit 7.
  odd = ((w >> 2) & 0x1C1C1C1Cu) | (sign & ~0x1C1C1C1Cu & 0x80808080u);
}

// ---- f16 variant of the FP8 path (sm_90 / sm_100: no native FP8 mma.sync; ptxas lowers an
// m16n8k32 e4m3 mma to two f16 HMMAs plus e4m3 -> f16 conversions of both operands, redone for
// every mma). The same operands as f16: an e2m1 code placed into the f16 bits
// sign << 15 | (code & 7) << 9 is exactly 2^-14 times its value (the 0.5 code lands on the f16
// subnormal 2^-15; the 2^14 is folded into the e8m0 block scale), an e4m3 code converts to f16
// exactly (one cvt per two codes), and mma.sync m16n8k16 f16 x f16 -> fp32 takes them.

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two e4m3 codes (bits 0..15: element 0 low) -> f16x2 (element 0 in the low half), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// 8 e2m1 codes (nibble i = element i) -> four f16x2 of 2^-14 times the values:
// r[0] = (e0, e2), r[1] = (e4, e6), r[2] = (e1, e3), r[3] = (e5, e7) (low half first).
// The f16 high byte of code c is (c & 8) << 4 | (c & 7) << 1 (the low byte is 0): computed for
// the 4 even and the 4 odd codes of the word at once, then spread by byte permutes.
__device__ __forceinline__ void e2m1x8_to_f16(uint32_t w, uint32_t (&r)[4]) {
  const uint32_t odd = (w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu);
  const uint32_t even = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu);
  r[0] = __byte_perm(even, 0u, 0x1404);
  r[1] = __byte_perm(even, 0u, 0x3424);
  r[2] = __byte_perm(odd, 0u, 0x1404);
  r[3] = __byte_perm(odd, 0u, 0x3424);
}

template <int NT, bool kFused>
__device__ __forceinline__ void f8_epilogue(const GemmArgs& a, float (&acc)[2][NT][4],
                                            const int64_t (&row_g)[2], int g, int base, int row0,
                                            int rows, int t4) {
  // acc[j][n][c]: weight row row_g[j] + 8*(c>>1), tile token n*8 + 2*t4 + (c&1).
  const bool shared = g == a.E;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = n * 8 + 2 * t4 + (c & 1);
      if (r >= rows) continue;
      const int gr = base + row0 + r;
      if constexpr (kFused) {
        const int64_t col = row_g[0] + 8 * (c >> 1);
        a.out[int64_t(gr) * a.N + col] = swiglu_hidden(a, acc[0][n][c], acc[1][n][c], shared, gr);
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t col = row_g[j] + 8 * (c >> 1);
          float v = acc[j][n][c];
          if (a.round_bf16) v = round_bf16_dev(v);
          a.out[int64_t(a.row_slot[gr]) * a.N + col] = v;
        }
      }
    }
  }
}

// The FP8-path CTA's tile (index into the tile list) and column block; false past the tiles.
// With shared_first = S (MoeTuning::f8_order 0) the grid's first S x (column blocks) CTAs run the
// shared expert's S tiles (the tile list's last S: FP8 weights, twice an FP4 tile's bytes, so
// they start first instead of ending the launch), then the routed tiles follow tile by tile, each
// tile's column blocks side by side (consecutive CTAs stream consecutive rows of one expert's
// matrix). Otherwise blockIdx.x is the tile and blockIdx.y the column block (the order before
// session 29: the tiles of every expert side by side). Measured on H100 (session 29, bench_moe):
// the forward 3-9% faster at T = 2-64 in this order, 1-2% at T = 1.
__device__ __forceinline__ bool f8_place(const GemmArgs& a, int* tile_index, int64_t* col) {
  const int tiles = *a.num_tiles;
  if (a.shared_first <= 0) {
    *tile_index = int(blockIdx.x);
    *col = int64_t(blockIdx.y);
    return int(blockIdx.x) < tiles;
  }
  const int64_t nb = gridDim.y, head = int64_t(a.shared_first) * nb;
  int64_t lin = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  if (lin < head) {
    *tile_index = tiles - a.shared_first + int(lin / nb);
    *col = lin % nb;
    return true;
  }
  lin -= head;
  *tile_index = int(lin / nb);
  *col = lin % nb;
  return *tile_index < tiles - a.shared_first;
}

// The FP8 path's per-lane rows of the activation tile: the mma's token columns past arows read
// row arows - 1 (their results are dropped): b_row[n] feeds the B fragments of token block n,
// s_row[n][h] the activation scale of the lane's accumulator columns 2 t4 + h.
template <int NT>
__device__ __forceinline__ void f8_act_lane_rows(int arows, int lane, int (&b_row)[NT],
                                                 int (&s_row)[NT][2]) {
  const int gid = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    b_row[n] = min(n * 8 + gid, arows - 1);
    s_row[n][0] = min(n * 8 + 2 * t4, arows - 1);
    s_row[n][1] = min(n * 8 + 2 * t4 + 1, arows - 1);
  }
}

// The matrices of weight sets 0 and 1 of an expert: gate/up w1 and w3, down w2 for both.
template <bool kFused>
__device__ __forceinline__ void f8_matrices(const MoeDeviceExpert& ex, const uint8_t* (&data)[2],
                                            const uint8_t* (&scale)[2]) {
  if constexpr (kFused) {
    data[0] = ex.data[0];
    data[1] = ex.data[1];
    scale[0] = ex.scale[0];
    scale[1] = ex.scale[1];
  } else {
    data[0] = data[1] = ex.data[2];
    scale[0] = scale[1] = ex.scale[2];
  }
}

// The weight rows of warp column warp_n in column block col: set j covers rows
// base_row[j] + [0, 16) (gate/up: the same 16 inter rows of w1 and w3; down: 32 rows of w2).
template <bool kFused, int WN>
__device__ __forceinline__ void f8_weight_rows(int64_t col, int warp_n, int64_t (&base_row)[2]) {
  if constexpr (kFused) {
    base_row[0] = base_row[1] = col * (16 * WN) + 16 * warp_n;
  } else {
    base_row[0] = col * (32 * WN) + 32 * warp_n;
    base_row[1] = base_row[0] + 16;
  }
}

// Activation tile (valid rows) and its scales, one cp.async group of the whole CTA.
template <bool kFused, int kThreads>
__device__ __forceinline__ void f8_load_act(const GemmArgs& a, uint8_t* act, float* act_sc,
                                            int base, int row0, int rows, int tid) {
  const int64_t K = a.K, act_stride = K + kF8ActPad;
  const int64_t units = K / 16, nsc = K / kChunk;
  for (int64_t i = tid; i < int64_t(rows) * units; i += kThreads) {
    const int r = int(i / units);
    const int64_t u = i % units;
    const int gr = base + row0 + r;
    const int64_t src_row = kFused ? int64_t(a.row_token[gr]) : int64_t(gr);
    cp_async16(act + r * act_stride + u * 16, a.act8 + src_row * K + u * 16);
  }
  for (int64_t i = tid; i < int64_t(rows) * nsc; i += kThreads) {
    const int r = int(i / nsc);
    const int gr = base + row0 + r;
    const int64_t src_row = kFused ? int64_t(a.row_token[gr]) : int64_t(gr);
    cp_async4(act_sc + i, a.act_scale + src_row * nsc + i % nsc);
  }
  cp_async_commit();
}

// A lane's cp.async sources at K = 0 and its ring offsets for the stages of weight rows
// base_row (session 8: computed once, not per stage; the per-stage int64 row arithmetic was ~40
// instructions of the ~420 of a stage); a stage adds its K byte offset. kUnits: 16-byte units per
// row, 4 (FP4) or 8 (FP8).
template <bool kFp4, int kUnits>
__device__ __forceinline__ void f8_stage_sources(const uint8_t* const (&data)[2],
                                                 const uint8_t* const (&scale)[2],
                                                 const int64_t (&base_row)[2], int64_t K, int lane,
                                                 const uint8_t* (&wsrc)[kUnits],
                                                 int (&wdst)[kUnits], const uint8_t*& ssrc) {
  static_assert(kUnits == (kFp4 ? 4 : 8), "16-byte units per row of a stage");
  constexpr int kRowBytes = 16 * kUnits;
#pragma unroll
  for (int it = 0; it < kUnits; ++it) {
    const int q = lane + 32 * it;
    const int r = q / kUnits, u = q % kUnits, j = r >> 4;
    const int64_t grow = base_row[j] + (r & 15);
    const int su = kFp4 ? (u ^ ((r >> 1) & 3)) : (u ^ (r & 7));
    wsrc[it] = data[j] + grow * (kFp4 ? K / 2 : K) + u * 16;
    wdst[it] = r * kRowBytes + su * 16;
  }
  // Lanes 0-15 copy the scales of set 0's rows, 16-31 set 1's (selected, not indexed: a
  // lane-dependent index would put the arrays in local memory).
  const bool set1 = lane >= 16;
  ssrc = kFp4 ? (set1 ? scale[1] : scale[0]) +
                    ((set1 ? base_row[1] : base_row[0]) + (lane & 15)) * (K / 32)
              : nullptr;
}

// One weight stage of the warp (32 rows x 128 K, and the MXFP4 scales) into ring stage `st`
// (scales into `st_scale`), for the chunk at K offset kc.
template <bool kFp4, int kUnits>
__device__ __forceinline__ void f8_issue_stage(uint8_t* st, uint8_t* st_scale,
                                               const uint8_t* const (&wsrc)[kUnits],
                                               const int (&wdst)[kUnits], const uint8_t* ssrc,
                                               int kc, int lane) {
#pragma unroll
  for (int it = 0; it < kUnits; ++it) cp_async16(st + wdst[it], wsrc[it] + (kFp4 ? kc / 2 : kc));
  if constexpr (kFp4) cp_async4(st_scale + lane * 4, ssrc + kc / 32);
}

// One 128-K chunk of a warp: the products of ring stage `st` (32 weight rows; the MXFP4 scales at
// `st_scale`) with the tile's token columns (activation tile `act`, rows b_row, its scales act_sc
// per chunk), scaled by the block and activation scales and added into acc: f8_tile's loop body.
template <int NT, bool kFp4, bool kH16>
__device__ __forceinline__ void f8_chunk(float (&acc)[2][NT][4], const uint8_t* st,
                                         const uint8_t* st_scale, const uint8_t* act,
                                         const float* act_sc, int64_t act_stride, int64_t chunk,
                                         int64_t chunks, const int (&b_row)[NT],
                                         const int (&s_row)[NT][2],
                                         const uint8_t* const (&scale)[2],
                                         const int64_t (&base_row)[2], int lane) {
  constexpr int kRowBytes = kFp4 ? 64 : 128;
  const int gid = lane >> 2, t4 = lane & 3;
  const int m = lane >> 3, mr = lane & 7;  // ldmatrix: this lane addresses matrix m, row mr
  float cacc[2][NT][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) cacc[j][n][c] = 0.0f;
  if constexpr (kFp4) {
    const uint32_t* scw = reinterpret_cast<const uint32_t*>(st_scale);
    uint32_t wsc[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) wsc[j][h] = scw[16 * j + 8 * h + gid];
#pragma unroll
    for (int s = 0; s < 4; s += 2) {
      uint32_t w[2][4];  // [set]: (row g, block s), (g+8, s), (g, s+1), (g+8, s+1)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 16 * j + 8 * (m & 1) + mr, u = s + (m >> 1);
        ldmatrix_x4(w[j], st + r * kRowBytes + (u ^ ((r >> 1) & 3)) * 16);
      }
#pragma unroll
      for (int ss = 0; ss < 2; ++ss) {
        uint32_t bf[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint2 v = *reinterpret_cast<const uint2*>(act + b_row[n] * act_stride +
                                                          chunk * kChunk + 32 * (s + ss) + 8 * t4);
          bf[n][0] = __byte_perm(v.x, v.y, 0x6420);
          bf[n][1] = __byte_perm(v.x, v.y, 0x7531);
        }
        if constexpr (kH16) {
          // B as f16x2: (e0, e2), (e4, e6), (e1, e3), (e5, e7): the pairs of e2m1x8_to_f16.
          uint32_t bh[NT][4];
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            bh[n][0] = e4m3x2_to_f16x2(bf[n][0]);
            bh[n][1] = e4m3x2_to_f16x2(bf[n][0] >> 16);
            bh[n][2] = e4m3x2_to_f16x2(bf[n][1]);
            bh[n][3] = e4m3x2_to_f16x2(bf[n][1] >> 16);
          }
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            uint32_t ag[4], a8[4];  // rows g and g+8
            e2m1x8_to_f16(w[j][2 * ss], ag);
            e2m1x8_to_f16(w[j][2 * ss + 1], a8);
            // e8m0 code + 14 as an fp32 exponent: 2^(code - 127) * 2^14 (codes <= 240).
            float f[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t code = __byte_perm(wsc[j][h], 0u, 0x4440 + (s + ss));
              f[h] = __uint_as_float((code + 14u) << 23);
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_f16(d, ag[0], a8[0], ag[1], a8[1], bh[n][0], bh[n][1]);  // even elements
              mma_f16(d, ag[2], a8[2], ag[3], a8[3], bh[n][2], bh[n][3]);  // odd elements
#pragma unroll
              for (int c = 0; c < 4; ++c) cacc[j][n][c] = fmaf(d[c], f[c >> 1], cacc[j][n][c]);
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            uint32_t af[4];
            e2m1x8_to_e4m3(w[j][2 * ss], af[0], af[2]);
            e2m1x8_to_e4m3(w[j][2 * ss + 1], af[1], af[3]);
            // e8m0 code + 6 as an fp32 exponent: 2^(code - 127) * 2^6 (codes <= 248).
            float f[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t code = __byte_perm(wsc[j][h], 0u, 0x4440 + (s + ss));
              f[h] = __uint_as_float((code + 6u) << 23);
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_e4m3(d, af, bf[n][0], bf[n][1]);
#pragma unroll
              for (int c = 0; c < 4; ++c) cacc[j][n][c] = fmaf(d[c], f[c >> 1], cacc[j][n][c]);
            }
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t bf[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint8_t* p = act + b_row[n] * act_stride + chunk * kChunk + 32 * s + 4 * t4;
        bf[n][0] = *reinterpret_cast<const uint32_t*>(p);
        bf[n][1] = *reinterpret_cast<const uint32_t*>(p + 16);
      }
      if constexpr (kH16) {
        // f16: bytes (0, 1) and (2, 3) of each 4-byte group as f16x2, A and B alike.
        uint32_t bh[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int q = 0; q < 4; ++q) bh[n][q] = e4m3x2_to_f16x2(bf[n][q >> 1] >> (16 * (q & 1)));
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t af[4];
          const int r = 16 * j + 8 * (m & 1) + mr, u = 2 * s + (m >> 1);
          ldmatrix_x4(af, st + r * kRowBytes + (u ^ (r & 7)) * 16);
          uint32_t ah[8];  // [4 * half + reg]: bytes (0, 1) (half 0) or (2, 3) of af[reg]
#pragma unroll
          for (int q = 0; q < 8; ++q) ah[q] = e4m3x2_to_f16x2(af[q & 3] >> (16 * (q >> 2)));
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            mma_f16(cacc[j][n], ah[0], ah[1], ah[4], ah[5], bh[n][0], bh[n][1]);
            mma_f16(cacc[j][n], ah[2], ah[3], ah[6], ah[7], bh[n][2], bh[n][3]);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t af[4];  // (row g, K 32s + [0,16)), (g+8, same), (g, 32s + [16,32)), (g+8..)
          const int r = 16 * j + 8 * (m & 1) + mr, u = 2 * s + (m >> 1);
          ldmatrix_x4(af, st + r * kRowBytes + (u ^ (r & 7)) * 16);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_e4m3(cacc[j][n], af, bf[n][0], bf[n][1]);
        }
      }
    }
    // The 128x128 block scale of each set (16 rows lie in one block).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float sc = e8m0_to_float_dev(__ldg(scale[j] + (base_row[j] / 128) * chunks + chunk));
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) cacc[j][n][c] *= sc;
    }
  }
  // The activation scale of the chunk per token column.
  const int64_t nsc = chunks;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float as0 = act_sc[s_row[n][0] * nsc + chunk];
    const float as1 = act_sc[s_row[n][1] * nsc + chunk];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        acc[j][n][c] = fmaf(cacc[j][n][c], (c & 1) ? as1 : as0, acc[j][n][c]);
  }
}

// Split-K partials of a lane (its 2 x NT x 4 accumulators) to and from the reduction scratch:
// `slot` = scratch + (((warp_k - 1) * WN + warp_n) * 8 NT) * 32 + lane (lane-interleaved).
template <int NT>
__device__ __forceinline__ void f8_red_store(float* slot, const float (&acc)[2][NT][4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) slot[((j * NT + n) * 4 + c) * 32] = acc[j][n][c];
}
template <int NT>
__device__ __forceinline__ void f8_red_add(float (&acc)[2][NT][4], const float* slot) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][n][c] += slot[((j * NT + n) * 4 + c) * 32];
}

template <int NT, bool kFused, int KS, bool kFp4, int kRing, bool kH16, int kWarps>
__device__ __forceinline__ void f8_tile(const GemmArgs& a, const MoeDeviceExpert& ex, int g,
                                        int base, int row0, int rows, int64_t col, uint8_t* smem) {
  constexpr int BT = 8 * NT;
  constexpr int WN = kWarps / KS;
  constexpr int kThreads = 32 * kWarps;
  constexpr int kStageBytes = kFp4 ? 2048 : 4096;  // 32 rows x 64 (FP4) or 128 (FP8) bytes
  constexpr int kStages = kRing / kStageBytes;
  constexpr int kUnits = kStageBytes / 32 / 16;  // 16-byte units per row: 4 (FP4) or 8 (FP8)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, t4 = lane & 3;
  const int warp_n = warp % WN, warp_k = warp / WN;
  const int64_t K = a.K;
  const int64_t chunks = K / kChunk;
  const int64_t act_stride = K + kF8ActPad;
  const int arows = a.act_rows > 0 ? min(a.act_rows, BT) : BT;
  uint8_t* ring = smem + warp * kRing;
  uint8_t* ring_scale = smem + kWarps * kRing + warp * ring_scale_bytes(kRing);
  uint8_t* act = smem + kWarps * (kRing + ring_scale_bytes(kRing));
  float* act_sc = reinterpret_cast<float*>(act + arows * act_stride);
  int b_row[NT], s_row[NT][2];
  f8_act_lane_rows<NT>(arows, lane, b_row, s_row);

  // Weight rows of the warp: set j covers rows base_row[j] + [0, 16).
  const uint8_t* data[2];
  const uint8_t* scale[2];
  f8_matrices<kFused>(ex, data, scale);
  int64_t base_row[2];
  f8_weight_rows<kFused, WN>(col, warp_n, base_row);
  const int64_t row_g[2] = {base_row[0] + gid, base_row[1] + gid};

  f8_load_act<kFused, kThreads>(a, act, act_sc, base, row0, rows, tid);

  const int64_t my_chunks = chunks > warp_k ? (chunks - warp_k + KS - 1) / KS : 0;
  // Stage i of the warp holds its chunk warp_k + KS * i.
  const uint8_t* wsrc[kUnits];
  int wdst[kUnits];
  const uint8_t* ssrc;
  f8_stage_sources<kFp4, kUnits>(data, scale, base_row, K, lane, wsrc, wdst, ssrc);
  auto issue = [&](int64_t i) {
    if (kF8Ablate < 2 && i < my_chunks) {
      f8_issue_stage<kFp4, kUnits>(ring + (i % kStages) * kStageBytes,
                                   ring_scale + (i % kStages) * 128, wsrc, wdst, ssrc,
                                   int(warp_k + KS * i) * kChunk, lane);
    }
    cp_async_commit();  // possibly empty: keeps the group count uniform
  };

  float acc[2][NT][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][n][c] = 0.0f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  cp_async_wait<kStages - 1>();  // the activation group
  __syncthreads();

  for (int64_t i = 0; i < my_chunks; ++i) {
    __syncwarp();  // every lane is done reading the stage the next issue overwrites
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    if constexpr (kF8Ablate == 0) {
      f8_chunk<NT, kFp4, kH16>(acc, ring + (i % kStages) * kStageBytes,
                               ring_scale + (i % kStages) * 128, act, act_sc, act_stride,
                               warp_k + KS * i, chunks, b_row, s_row, scale, base_row, lane);
    }
  }
  cp_async_wait<0>();

  if constexpr (KS > 1) {
    // Split-K reduction in warp_k order (deterministic) through the (now free) rings.
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    constexpr int kAccPerLane = 2 * NT * 4;
    if (warp_k > 0)
      f8_red_store<NT>(red + (((warp_k - 1) * WN + warp_n) * kAccPerLane) * 32 + lane, acc);
    __syncthreads();
    if (warp_k > 0) return;
#pragma unroll
    for (int q = 1; q < KS; ++q)
      f8_red_add<NT>(acc, red + (((q - 1) * WN + warp_n) * kAccPerLane) * 32 + lane);
  }
  f8_epilogue<NT, kFused>(a, acc, row_g, g, base, row0, rows, t4);
}

template <int NT, bool kFused, int KS, int kRing, bool kH16, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 8 ? 2 : kRing > 8192 ? 2 : 3)
    expert_gemm_f8_kernel(GemmArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t f8_smem[];
  int tile_index;
  int64_t col;
  if (!f8_place(a, &tile_index, &col)) return;
  const int2 tile = a.tiles[tile_index];
  const int g = tile.x, row0 = tile.y;
  const int base = a.group_offset[g];
  const int rows = min(8 * NT, a.group_offset[g + 1] - base - row0);
  const MoeDeviceExpert ex = a.experts[g];
  const int fmt = kFused ? ex.format[0] : ex.format[2];
  if (fmt == int(WeightFormat::kMxfp4)) {
    f8_tile<NT, kFused, KS, true, kRing, kH16, kWarps>(a, ex, g, base, row0, rows, col, f8_smem);
  } else {
    f8_tile<NT, kFused, KS, false, kRing, kH16, kWarps>(a, ex, g, base, row0, rows, col, f8_smem);
  }
}

// ---- 5/7 (prefill path). tiled grouped GEMM: 128 weight rows x 128 tokens per CTA --------------
//
// For tiles of many rows off sm_90 (T > 1365 at Flash: MoeRunner::tile_tokens). A CTA of 4
// warps (2 along the weight rows x 2 along the tokens, 64 x 64 per warp) computes 128 output
// features (gate/up: 64 w1 rows and the same 64 w3 rows; down: 128 w2 rows) for up to 128 rows
// of one group, K in steps of 64:
//   - activations (bf16, FP8-simulated in reference numerics: exactly the bf16 kernel's
//     operands) go global -> shared by cp.async through a 3-slot ring;
//   - weights are read once per CTA tile: thread t loads row t's 32 bytes (FP4) or 64 bytes (FP8)
//     of the next step into registers (one step ahead), dequantizes them to bf16 (exact: e2m1 x
//     e8m0 / e4m3 and e4m3 x e8m0 are bf16 values) and stores them to a double-buffered bf16
//     tile; one block barrier per K step;
//   - both operands reach the mma (m16n8k16 bf16 -> fp32) through ldmatrix from 128-byte rows
//     whose 16-byte units are XOR-swizzled by (row & 7): conflict-free.
// e2m1 -> bf16 uses byte permutes (two 8-byte tables for the low and high bytes of the 8
// magnitudes, the sign bits moved by a permute), then one bf16x2 multiply by the block scale:
// ~3 instructions per weight, amortized over the tile's 128 tokens. The token dimension is split
// between the two token warps in 16-row groups (warp wn owns groups wn, wn + 2, ...), and groups
// past the tile's valid rows are skipped (a 96-row tile costs 96 rows of mma, balanced).
// Numerics: the same operands as the bf16 kernel and the CPU oracle; only the fp32 summation
// order differs (each output element is one thread's fixed-order sum: deterministic).

constexpr int kPfThreads = 128;
constexpr int kPfTokens = 128;  // tile rows (tokens) per CTA
constexpr int kPfK = 64;        // K per step
constexpr int kPfBSlots = 3;
constexpr int kPfTileBytes = 128 * kPfK * 2;  // one [128][64] bf16 tile: 16 KB
constexpr size_t kPfSmem = size_t(kPfBSlots + 2) * kPfTileBytes;  // 80 KB

// Byte offset of 16-byte unit u (0..7) of row r in a [128][64] bf16 tile.
__device__ __forceinline__ uint32_t pf_off(int r, int u) {
  return uint32_t(r) * 128u + (uint32_t(u ^ (r & 7)) << 4);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 z = __hmul2(x, y);  // exact here: power-of-two or <= 4-bit scales, 2-bit values
  return *reinterpret_cast<uint32_t*>(&z);
}

// 8 e2m1 codes (nibble i = element i, K order) -> 8 bf16 (4 x bf16x2, element 2i in the low half),
// times the bf16x2 scale s2. Tables: bf16 of the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}: low
// bytes {00, 00, 80, C0, 00, 40, 80, C0}, high bytes {00, 3F, 3F, 3F, 40, 40, 40, 40}.
__device__ __forceinline__ uint4 e2m1x8_to_bf16x8(uint32_t w, uint32_t s2) {
  const uint32_t m = w & 0x77777777u;  // magnitudes: selector nibbles with bit 3 clear
  const uint32_t mh = m >> 16;
  const uint32_t lo0 = __byte_perm(0xC0800000u, 0xC0804000u, m);
  const uint32_t hi0 = __byte_perm(0x3F3F3F00u, 0x40404040u, m);
  const uint32_t lo1 = __byte_perm(0xC0800000u, 0xC0804000u, mh);
  const uint32_t hi1 = __byte_perm(0x3F3F3F00u, 0x40404040u, mh);
  // Sign of element 2i: bit 3 of byte i (bit 7 of byte i of w << 4); of element 2i+1: bit 7 of
  // byte i of w. They go to bits 15 and 31 of output word i.
  const uint32_t w4 = w << 4;
  constexpr uint32_t kSign = 0x80008000u;
  uint4 o;
  o.x = bf16x2_mul(__byte_perm(lo0, hi0, 0x5140) | (__byte_perm(w4, w, 0x4000) & kSign), s2);
  o.y = bf16x2_mul(__byte_perm(lo0, hi0, 0x7362) | (__byte_perm(w4, w, 0x5010) & kSign), s2);
  o.z = bf16x2_mul(__byte_perm(lo1, hi1, 0x5140) | (__byte_perm(w4, w, 0x6020) & kSign), s2);
  o.w = bf16x2_mul(__byte_perm(lo1, hi1, 0x7362) | (__byte_perm(w4, w, 0x7030) & kSign), s2);
  return o;
}

// 8 e2m1 codes (nibble i = element i) -> 4 bf16x2 of 2^-126 times the values; word j holds
// elements j (low half) and j + 4 (high half). Each code's magnitude bits (e1 e0 m) land on bf16
// bits 8..6 (the two lowest exponent bits and the top mantissa bit: exponent field e1 e0, so code
// 1, 0.5, is the subnormal 2^-127) and its sign on bit 15: exact for every code. Per word: a mask,
// a multiply that writes the nibble at bits 6..9 and 12..15 at once (on the FMA pipe, disjoint
// bits: no carries) and a mask keeping bits 15 and 8..6 of each half; one shift per 8 codes. About
// half the integer-pipe instructions of e2m1x8_to_bf16x8 (session 22, NOTES.md).
__device__ __forceinline__ void e2m1x8_to_bf16_tiny(uint32_t w, uint32_t (&o)[4]) {
  constexpr uint32_t kKeep = 0x81C081C0u;
  const uint32_t w8 = w >> 8;
  o[0] = ((w & 0x000F000Fu) * 0x1040u) & kKeep;   // nibbles 0, 4: << 6 and << 12
  o[1] = ((w & 0x00F000F0u) * 0x0104u) & kKeep;   // nibbles 1, 5: << 2 and << 8
  o[2] = ((w8 & 0x000F000Fu) * 0x1040u) & kKeep;  // nibbles 2, 6
  o[3] = ((w8 & 0x00F000F0u) * 0x0104u) & kKeep;  // nibbles 3, 7
}

// e8m0 code -> bf16 bits (bf16 has the same 8-bit exponent; 0 is the subnormal 2^-127, 255 NaN).
__device__ __forceinline__ uint32_t e8m0_to_bf16_bits(uint32_t c) {
  return c == 0 ? 0x0040u : c == 255 ? 0x7FC0u : (c << 7);
}

__device__ __forceinline__ uint32_t bf16_bits(float v) {
  __nv_bfloat16 b = __float2bfloat16_rn(v);
  return uint32_t(*reinterpret_cast<uint16_t*>(&b));
}

// The bf16 multiplier that turns e2m1x8_to_bf16_tiny's 2^-126 v into 2^-8 times the dequantized
// weight (the wgmma kernel's epilogue multiplies by 2^8, kWgFoldBack). MXFP4 (e8m0 code c):
// 2^(c - 127 + 118), bf16 exponent field c + 118: finite for c <= kMoeWgMaxScaleCode (136; larger
// codes give NaN, and MoeDeviceLayer::limit_to_scale_code turns the kernel off for such layers).
// NVFP4 (e4m3 code): e4m3 * 2^118 <= 448 * 2^118 < 2^127. The products v * scale * 2^-8 are the
// exact bf16 values (at most 6 significant bits; NVFP4 within [2^-18, 2^11]; MXFP4 for codes
// >= 4, block scales from 2^-123 up).
__device__ __forceinline__ uint32_t wg_scale_bits_mx(uint32_t c) {
  return c <= uint32_t(kMoeWgMaxScaleCode) ? (c + 118u) << 7 : 0x7FC0u;
}
__device__ __forceinline__ uint32_t wg_scale_bits_nv(uint32_t c) {
  return bf16_bits(e4m3_to_float_dev(c) * 0x1p118f);
}
constexpr float kWgFoldBack = 256.0f;

template <int FMT>
struct PfRaw {
  static constexpr int kVec = FMT == int(WeightFormat::kFp8Block) ? 4 : 2;
  uint4 d[kVec];
  uint32_t sc;  // MXFP4: 2 e8m0 codes; NVFP4: 4 e4m3 codes; FP8 block: the e8m0 code
};

template <bool kFused, int FMT>
__device__ __forceinline__ void pf_tile(const GemmArgs& a, const MoeDeviceExpert& ex, int g,
                                        int base, int row0, int rows, uint8_t* smem) {
  constexpr bool kFp8 = FMT == int(WeightFormat::kFp8Block);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, t4 = lane & 3;
  const int wm = warp >> 1, wn = warp & 1;
  const int64_t K = a.K;
  const int steps = int(K / kPfK);
  uint8_t* bs = smem;                              // [3][128 tokens][64] bf16
  uint8_t* as = smem + kPfBSlots * kPfTileBytes;   // [2][128 weight rows][64] bf16

  // This thread's weight row (dequantization: row tid of the tile) and the tile's first feature.
  const int64_t n0 = pf_n_block(a) * (kFused ? 64 : 128);
  // w1 / w3 / w2 (selects, not a dynamic index: the struct stays in registers)
  const bool up = kFused && tid >= 64;
  const int64_t wrow = kFused ? n0 + (tid & 63) : n0 + tid;
  const uint8_t* wdata = !kFused ? ex.data[2] : up ? ex.data[1] : ex.data[0];
  const uint8_t* wscale = !kFused ? ex.scale[2] : up ? ex.scale[1] : ex.scale[0];
  const float gscale0 = kFused ? ex.global_scale[0] : ex.global_scale[2];
  const float gscale1 = kFused ? ex.global_scale[1] : ex.global_scale[2];

  auto load_raw = [&](PfRaw<FMT>& r, int step) {
    const int64_t kc = int64_t(step) * kPfK;
    if constexpr (kFp8) {
      // (L1-allocating loads: the 16-byte halves of one 32-byte sector come from one L1 fill.)
      const uint4* p = reinterpret_cast<const uint4*>(wdata + wrow * K + kc);
#pragma unroll
      for (int i = 0; i < 4; ++i) r.d[i] = __ldg(p + i);
      r.sc = __ldg(wscale + (wrow / 128) * (K / 128) + kc / 128);
    } else {
      const uint4* p = reinterpret_cast<const uint4*>(wdata + wrow * (K / 2) + kc / 2);
      r.d[0] = __ldg(p);
      r.d[1] = __ldg(p + 1);
      if constexpr (FMT == int(WeightFormat::kMxfp4)) {
        const uint8_t* s = wscale + wrow * (K / 32) + kc / 32;
        r.sc = uint32_t(__ldg(s)) | (uint32_t(__ldg(s + 1)) << 8);
      } else {
        const uint8_t* s = wscale + wrow * (K / 16) + kc / 16;
        r.sc = uint32_t(__ldg(s)) | (uint32_t(__ldg(s + 1)) << 8) |
               (uint32_t(__ldg(s + 2)) << 16) | (uint32_t(__ldg(s + 3)) << 24);
      }
    }
  };
  auto dequant = [&](const PfRaw<FMT>& r, int buf) {
    uint8_t* dst = as + buf * kPfTileBytes;
    if constexpr (kFp8) {
      const float sc = e8m0_to_float_dev(r.sc);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const uint32_t w0 = word(r.d[u >> 1], (u & 1) * 2), w1 = word(r.d[u >> 1], (u & 1) * 2 + 1);
        const float2 f0 = e4m3x2_to_float2(w0), f1 = e4m3x2_to_float2(w0 >> 16);
        const float2 f2 = e4m3x2_to_float2(w1), f3 = e4m3x2_to_float2(w1 >> 16);
        uint4 o;
        o.x = pack_bf16x2(f0.x * sc, f0.y * sc);
        o.y = pack_bf16x2(f1.x * sc, f1.y * sc);
        o.z = pack_bf16x2(f2.x * sc, f2.y * sc);
        o.w = pack_bf16x2(f3.x * sc, f3.y * sc);
        *reinterpret_cast<uint4*>(dst + pf_off(tid, u)) = o;
      }
    } else {
      uint32_t s2[4];
      if constexpr (FMT == int(WeightFormat::kMxfp4)) {
        // Units 0..3 use the block of K [0, 32), units 4..7 the block [32, 64).
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const uint32_t bits = e8m0_to_bf16_bits((r.sc >> (8 * b)) & 0xFFu);
          s2[2 * b] = s2[2 * b + 1] = bits | (bits << 16);
        }
      } else {
        // NVFP4: e4m3 scale per 16 K: units 2b, 2b+1 use scale b (exact in bf16).
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t bits = bf16_bits(e4m3_to_float_dev((r.sc >> (8 * b)) & 0xFFu));
          s2[b] = bits | (bits << 16);
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const uint32_t sc = FMT == int(WeightFormat::kMxfp4) ? s2[(u >> 2) * 2] : s2[u >> 1];
        *reinterpret_cast<uint4*>(dst + pf_off(tid, u)) =
            e2m1x8_to_bf16x8(word(r.d[u >> 2], u & 3), sc);
      }
    }
  };

  // Activation rows: thread tid copies unit (tid & 7) of tile rows (tid >> 3) + 16 j.
  uint32_t src_row[8];  // element offset of the row in act (rows * K < 2^31: checked by forward)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = (tid >> 3) + 16 * j;
    const int gr = base + row0 + min(r, rows - 1);
    src_row[j] = uint32_t((kFused ? int64_t(a.row_token[gr]) : int64_t(gr)) * K);
  }
  const int bu = tid & 7;
  auto load_act = [&](int step) {
    if (step < steps) {
      uint8_t* dst = bs + (step % kPfBSlots) * kPfTileBytes;
      const uint16_t* src = a.act + int64_t(step) * kPfK + bu * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int r = (tid >> 3) + 16 * j;
        if (r < rows) cp_async16(dst + pf_off(r, bu), src + src_row[j]);
      }
    }
    cp_async_commit();  // possibly empty: uniform group count
  };

  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][n][c] = 0.0f;

  // Smem weight row of m-fragment i of this warp.
  auto a_row = [&](int i) {
    return kFused ? (i < 2 ? 32 * wm + 16 * i : 64 + 32 * wm + 16 * (i - 2)) : 64 * wm + 16 * i;
  };
  const uint32_t as_addr = static_cast<uint32_t>(__cvta_generic_to_shared(as));
  const uint32_t bs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(bs));
  const int lm = lane >> 3, lr = lane & 7;

  auto mma_step = [&](int step) {
    const uint32_t ab = as_addr + (step & 1) * kPfTileBytes;
    const uint32_t bb = bs_addr + (step % kPfBSlots) * kPfTileBytes;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t af[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = a_row(i) + 8 * (lm & 1) + lr;
        const uint32_t addr = ab + pf_off(r, 2 * kk + (lm >> 1));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                     : "r"(addr));
      }
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const int q = wn + 2 * p;  // 16-row token group
        if (q * 16 >= rows) continue;
        uint32_t b[4];
        const int r = q * 16 + 8 * (lm >> 1) + lr;
        const uint32_t addr = bb + pf_off(r, 2 * kk + (lm & 1));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(addr));
        const bool second = q * 16 + 8 < rows;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          mma_bf16(acc[i][2 * p], af[i], b[0], b[1]);
          if (second) mma_bf16(acc[i][2 * p + 1], af[i], b[2], b[3]);
        }
      }
    }
  };

  // Prologue: activation steps 0 and 1 in flight, weights of step 0 dequantized, step 1 loaded.
  PfRaw<FMT> raw;
  load_act(0);
  load_act(1);
  load_raw(raw, 0);
  dequant(raw, 0);
  load_raw(raw, 1);  // steps >= 2 (K % 128 == 0)
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<1>();  // activation step s (this thread's part)
    __syncthreads();     // everyone's step s, weights s in buffer s & 1; step s - 1 fully read
    load_act(s + 2);     // into slot (s - 1) % 3
    if (s + 1 < steps) {
      dequant(raw, (s + 1) & 1);  // buffer (s - 1) & 1: free
      if (s + 2 < steps) load_raw(raw, s + 2);
    }
    mma_step(s);
  }
  cp_async_wait<0>();

  // Epilogue. acc[i][n][c]: smem weight row a_row(i) + gid + 8 * (c >> 1), token
  // 16 * (wn + 2 * (n >> 1)) + 8 * (n & 1) + 2 * t4 + (c & 1).
  const bool shared = g == a.E;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 16 * (wn + 2 * (n >> 1)) + 8 * (n & 1) + 2 * t4 + (c & 1);
      if (r >= rows) continue;
      const int gr = base + row0 + r;
      if constexpr (kFused) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t col = n0 + 32 * wm + 16 * i + gid + 8 * (c >> 1);
          a.out[int64_t(gr) * a.N + col] =
              swiglu_hidden(a, acc[i][n][c] * gscale0, acc[i + 2][n][c] * gscale1, shared, gr);
        }
      } else {
        const int64_t orow = int64_t(a.row_slot[gr]) * a.N;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t col = n0 + 64 * wm + 16 * i + gid + 8 * (c >> 1);
          float v = acc[i][n][c] * gscale0;
          if (a.round_bf16) v = round_bf16_dev(v);
          a.out[orow + col] = v;
        }
      }
    }
  }
}

template <bool kFused>
__global__ void __launch_bounds__(kPfThreads, 2) expert_gemm_pf_kernel(GemmArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t pf_smem[];
  const int tile_index = pf_tile_index(a);
  if (tile_index >= *a.num_tiles) return;
  const int2 tile = a.tiles[tile_index];
  const int g = tile.x, row0 = tile.y;
  const int base = a.group_offset[g];
  const int rows = min(kPfTokens, a.group_offset[g + 1] - base - row0);
  const MoeDeviceExpert ex = a.experts[g];
  const int fmt = kFused ? ex.format[0] : ex.format[2];
  if (fmt == int(WeightFormat::kMxfp4)) {
    pf_tile<kFused, int(WeightFormat::kMxfp4)>(a, ex, g, base, row0, rows, pf_smem);
  } else if (fmt == int(WeightFormat::kNvfp4)) {
    pf_tile<kFused, int(WeightFormat::kNvfp4)>(a, ex, g, base, row0, rows, pf_smem);
  } else {
    pf_tile<kFused, int(WeightFormat::kFp8Block)>(a, ex, g, base, row0, rows, pf_smem);
  }
}

// ---- 5/7 (prefill path, sm_90a). wgmma with the weights dequantized into registers --------------
//
// The same tiles as expert_gemm_pf_kernel (up to 128 rows of one group; gate/up: 64 inter
// columns = 64 w1 + 64 w3 rows, down: 128 w2 rows), on the Hopper warpgroup MMA. A CTA is two
// warpgroups (or, for the default 256 weight rows, four: wg_tile's kWgs, kRg); warpgroup wg owns
// 64 weight rows (per row group) as the A operand of wgmma m64nNk16, taken from
// registers: each thread dequantizes exactly the A fragment elements it holds (rows g and g + 8 of
// its warp's 16), so the bf16 weights never touch shared memory and need no barrier. The tile's
// tokens are the B operand (N = the tile's valid rows rounded up to 16 for the FP4 tiles of the
// four-warpgroup CTAs, else to 32: kWgWidthStep), K-major in shared memory with the 128-byte
// swizzle. Per chunk of 128 K:
//   - cp.async brings the chunk two chunks ahead into one of 4 slots: the activation rows
//     (gathered through row_token for gate/up), this thread's raw weight bytes (16 B of each of its
//     two rows for FP4, 32 B for FP8) and the MXFP4 / NVFP4 block scales of its rows;
//   - one CTA barrier per chunk (the activations are shared by both warpgroups);
//   - two halves of 64 K: wait until the wgmma group that last read this half's A registers is
//     done, dequantize (the previous group runs on the tensor cores meanwhile), 4 wgmma, commit.
// K order: lane t4 owns the 32 elements [32 t4, 32 t4 + 32) of a chunk (one MXFP4 block, two NVFP4
// blocks); half hh (k16 steps 4 hh .. 4 hh + 3) takes the 16 elements 32 t4 + 16 hh + {0..15}, and
// its A fragment of step kk holds, in register half h (logical k 16 kk + 8 h + 2 t4 + e), element
// 32 t4 + 16 (kk / 4) + 8 (kk / 2 % 2) + 2 (kk % 2) + h + 4 e: each 32-bit word of 8 FP4 codes
// gives the pairs (i, i + 4) that e2m1x8_to_bf16_tiny makes with one mask-multiply-mask each. The
// activations must be stored in that logical order: quant_rows_kernel's `permute` writes them.
// The sum is the same; only its fp32 order differs from the other kernels (deterministic: each
// output element is one fixed sequence of wgmmas).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_MOE_WGMMA_PATH 1
#else
#define DS_MOE_WGMMA_PATH 0
#endif

constexpr int kWgThreads = 256;
constexpr int kWgSlots = 4;
constexpr int kWgAtomBytes = kPfTokens * 128;          // [128 tokens][64 K] bf16: 16 KB
constexpr int kWgActBytes = 2 * kWgAtomBytes;          // one chunk of 128 K
constexpr int kWgRawBytes = 4 * kWgThreads * 16;       // FP8: 2 rows x 2 halves x 16 B per thread
constexpr int kWgScaleBytes = 128 * 8;                 // NVFP4: 8 scale bytes per row and chunk
constexpr int kWgSlotBytes = kWgActBytes + kWgRawBytes + kWgScaleBytes;  // 49 KB (1024-aligned)
constexpr size_t kWgSmem = size_t(kWgSlots) * kWgSlotBytes + 1024;     // + base alignment
static_assert(kWgSlotBytes % 1024 == 0, "wgmma B atoms need 1024-byte alignment");
// The wide CTAs (256 weight rows, kRg = 2), FP4 tiles: the same raw bytes (2 row groups x 2 rows x
// 16 B per thread), the scales of 256 rows.
constexpr int kWgWideSlotBytes = kWgActBytes + kWgRawBytes + 2 * kWgScaleBytes;  // 50 KB
constexpr size_t kWgWideSmem = size_t(kWgSlots) * kWgWideSlotBytes + 1024 + 128 * 4;  // + rows
static_assert(kWgWideSlotBytes % 1024 == 0, "wgmma B atoms need 1024-byte alignment");
// FP8-block tiles of the wide CTAs: twice the raw bytes (2 row groups x 2 rows x 32 B per thread),
// so three slots of 64 KB, the copies one chunk ahead.
constexpr int kWgWideFp8Slots = 3;
constexpr int kWgWideFp8SlotBytes = kWgActBytes + 2 * kWgRawBytes;
static_assert(size_t(kWgWideFp8Slots) * kWgWideFp8SlotBytes + 1024 + 128 * 4 <= kWgWideSmem,
              "the wide kernel's FP8 tiles fit its shared memory");

#if DS_MOE_WGMMA_PATH
// cp.async of 4 or 8 bytes (the .ca form: .cg copies 16 only).
__device__ __forceinline__ void cp_async_small(void* smem, const void* gmem, int bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}

// D[64 x N] += A[64 x 16] (registers, bf16) B[16 x N] (shared memory, K-major, descriptor).
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                       int scale_d);
#include "kernels/cuda/moe/moe_wgmma_rs.inc"  // mma_rs<8, 16, ..., 128>

// Four k16 steps of this warpgroup's tile: the A fragments a[kk], the B atom at b_addr; `first`
// starts the accumulators from zero (scale-d 0: zeroing them with ordinary moves instead made ptxas
// serialize every wgmma of the kernel, C7515).
template <int N>
__device__ __forceinline__ void mma_half(float (&acc)[64], const uint32_t (&a)[4][4],
                                         uint32_t b_addr, bool first) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    mma_rs<N>(acc, a[kk], wgmma::desc(b_addr + 32u * kk), first && kk == 0 ? 0 : 1);
}
#endif

// N: the wgmma width, the tile's valid rows rounded up to kWgWidthStep (the columns past them are
// computed from whatever the slot holds there and dropped).
// kRg: m64 row groups per warpgroup. 1: the CTA's 128 weight rows (N block nb of 64 inter columns
// for gate/up, 128 outputs for down); 2 (the wide CTAs): 256 weight rows (128 inter columns / 256
// outputs), so each activation chunk copied into shared memory feeds twice the MMAs (half the
// L2 -> SM traffic per FLOP). Row group v = kRg wg + rg of the CTA holds the weight rows
// 64 v .. 64 v + 63 in the layout of the narrow tile's warpgroup v. The wide FP8-block tiles
// (twice the raw bytes) copy one chunk ahead into three slots. kWgs: warpgroups per CTA, 2, or 4
// with kRg 1 (session 22: the 256-row CTAs as four warpgroups of one row group each, 512 threads:
// 4 warps per scheduler instead of 2, each with half the dequantization per chunk).
// kMbar (four warpgroups only; the default there, MoeTuning::pf_sync 2 turns it off): per-slot
// mbarriers instead of the CTA barrier per chunk. Each thread's copies of a chunk arrive on the
// slot's `full` barrier when they land; each warp arrives on the slot's `empty` barrier once its
// wgmmas reading the slot are done, and a thread waits for that before copying into the slot
// again. The warpgroups may then drift apart by about half a chunk instead of meeting at every
// chunk.
template <bool kFused, int FMT, int N, int kRg = 1, int kWgs = 2, bool kMbar = false>
__device__ __forceinline__ void wg_tile(const GemmArgs& a, const MoeDeviceExpert& ex, int g,
                                        int base, int row0, int rows, int64_t nb, uint8_t* smem) {
#if DS_MOE_WGMMA_PATH
  constexpr bool kFp8 = FMT == int(WeightFormat::kFp8Block);
  constexpr bool kMx = FMT == int(WeightFormat::kMxfp4);
  static_assert((kRg == 1 || kRg == 2) && (kWgs == 2 || (kWgs == 4 && kRg == 1)),
                "128 or 256 weight rows per CTA");
  static_assert(!kMbar || kWgs == 4, "the slot mbarriers sit where the kRg 2 CTAs' row table is");
  constexpr int kThreads = 128 * kWgs;
  constexpr int kVg = kRg * kWgs;         // m64 row groups per CTA
  constexpr int kRowStep = kThreads / 16;  // activation rows copied per pass
  constexpr bool kWide = kVg == 4;
  constexpr bool kWideFp8 = kFp8 && kWide;
  constexpr int kAhead = kWideFp8 ? 1 : 2;  // chunks copied ahead
  constexpr int kSlots = kWideFp8 ? kWgWideFp8Slots : kWgSlots;
  constexpr int kSlotBytes = kWideFp8 ? kWgWideFp8SlotBytes
                             : kWide  ? kWgWideSlotBytes
                                      : kWgSlotBytes;
  // Raw weight bytes of a slot, before the FP4 block scales.
  constexpr int kRawBytes = kWideFp8 ? 2 * kWgRawBytes : kWgRawBytes;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int gid = lane >> 2, t4 = lane & 3;
  const int64_t K = a.K;
  const int chunks = int(K / kChunk);

  // This thread's two weight rows per row group (A fragment rows g and g + 8 of its warp) and
  // their local ids. Gate/up: rows 0-7 of a warp's 16 are w1 of inter columns c0 .. c0 + 7, rows
  // 8-15 w3 of the same columns (wrow[rg][0] = wrow[rg][1]); down: w2 rows lrow and lrow + 8.
  int lrow[kRg];  // local row of the first (the second is + 8)
  int64_t wrow[kRg][2];
#pragma unroll
  for (int rg = 0; rg < kRg; ++rg) {
    const int v = kRg * wg + rg;
    lrow[rg] = 64 * v + 16 * wq + gid;
    wrow[rg][0] = kFused ? nb * (32 * kVg) + 32 * v + 8 * wq + gid : nb * (64 * kVg) + lrow[rg];
    wrow[rg][1] = kFused ? wrow[rg][0] : wrow[rg][0] + 8;
  }
  const uint8_t* wdata[2] = {kFused ? ex.data[0] : ex.data[2], kFused ? ex.data[1] : ex.data[2]};
  const uint8_t* wscale[2] = {kFused ? ex.scale[0] : ex.scale[2],
                              kFused ? ex.scale[1] : ex.scale[2]};
  // FP4: the dequantized weights are 2^-8 times the true ones (wg_scale_bits_mx / _nv).
  const float fold = kFp8 ? 1.0f : kWgFoldBack;
  const float gscale0 = (kFused ? ex.global_scale[0] : ex.global_scale[2]) * fold;
  const float gscale1 = (kFused ? ex.global_scale[1] : ex.global_scale[2]) * fold;

  // Activation rows: thread tid copies 16-byte unit (tid & 7) of atom (tid >> 3) & 1 of tile rows
  // (tid >> 4) + kRowStep j.
  const int bu = tid & 7, batom = (tid >> 3) & 1;
  // The element offset of each tile row in act (rows * K < 2^31: checked by forward): in registers
  // (one row group per warpgroup), or in a table after the slots that the kRg 2 CTAs read per copy
  // (their registers are short: 128 accumulators per thread; with four warpgroups the table made
  // ptxas spill more).
  constexpr bool kRowRegs = kRg == 1;
  uint32_t src_row[kRowRegs ? kPfTokens / kRowStep : 1];
  uint32_t* const row_tab = reinterpret_cast<uint32_t*>(smem + kSlots * kSlotBytes);
  const auto row_offset = [&](int r) {
    const int gr = base + row0 + min(r, rows - 1);
    return uint32_t((kFused ? int64_t(a.row_token[gr]) : int64_t(gr)) * K);
  };
  if constexpr (kRowRegs) {
#pragma unroll
    for (int j = 0; j < kPfTokens / kRowStep; ++j)
      src_row[j] = row_offset((tid >> 4) + kRowStep * j);
  } else {
    if (tid < kPfTokens) row_tab[tid] = row_offset(tid);
    __syncthreads();
  }
  // kMbar: slot s's `full` barrier at bars + 8 s, its `empty` barrier at bars + 8 (kSlots + s)
  // (after the slots, where the kRg 2 CTAs keep their row table). Chunk c is phase c / kSlots of
  // its slot's barriers.
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  [[maybe_unused]] const uint32_t bars = smem_addr + uint32_t(kSlots * kSlotBytes);
  const auto full_bar = [&](int c) { return bars + uint32_t(8 * (c % kSlots)); };
  const auto empty_bar = [&](int c) { return bars + uint32_t(8 * (kSlots + c % kSlots)); };
  if constexpr (kMbar) {
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        mbar_init(full_bar(i), kThreads);        // every thread's copies
        mbar_init(empty_bar(i), kThreads / 32);  // every warp
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }

  // Chunk c into slot c % kSlots: one commit group (maybe empty), or with kMbar one arrival on
  // the slot's full barrier after the slot's previous chunk was released.
  auto issue = [&](int c) {
    if constexpr (kMbar) {
      if (c >= chunks) return;
      if (c >= kSlots) mbar_wait(empty_bar(c), uint32_t((c / kSlots - 1) & 1));
    }
    if (c < chunks) {
      uint8_t* slot = smem + (c % kSlots) * kSlotBytes;
      uint8_t* act = slot + batom * kWgAtomBytes;
      const uint16_t* src = a.act + int64_t(c) * kChunk + batom * 64 + bu * 8;
#pragma unroll
      for (int j = 0; j < kPfTokens / kRowStep; ++j) {
        const int r = (tid >> 4) + kRowStep * j;
        if (r < rows)
          cp_async16(act + r * 128 + ((bu ^ (r & 7)) << 4),
                     src + (kRowRegs ? src_row[j] : row_tab[r]));
      }
      uint8_t* raw = slot + kWgActBytes;
#pragma unroll
      for (int rg = 0; rg < kRg; ++rg) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (kFp8) {
            const uint8_t* p = wdata[r] + wrow[rg][r] * K + int64_t(c) * 128 + 32 * t4;
            cp_async16(raw + ((4 * rg + 0 * 2 + r) * kThreads + tid) * 16, p);
            cp_async16(raw + ((4 * rg + 1 * 2 + r) * kThreads + tid) * 16, p + 16);
          } else {
            cp_async16(raw + ((2 * rg + r) * kThreads + tid) * 16,
                       wdata[r] + wrow[rg][r] * (K / 2) + int64_t(c) * 64 + 16 * t4);
          }
        }
      }
      if constexpr (!kFp8) {
        // The block scales of this thread's rows for the chunk (MXFP4 4 bytes, NVFP4 8): copied
        // by lanes t4 = 0 (row g) and 1 (row g + 8), read by the four lanes of the row after the
        // chunk's barrier.
        if (t4 < 2) {
          constexpr int kScaleBytes = kMx ? 4 : 8;
#pragma unroll
          for (int rg = 0; rg < kRg; ++rg) {
            const uint8_t* p = (t4 == 0 ? wscale[0] + wrow[rg][0] * (K / (kMx ? 32 : 16))
                                        : wscale[1] + wrow[rg][1] * (K / (kMx ? 32 : 16))) +
                               int64_t(c) * kScaleBytes;
            cp_async_small(slot + kWgActBytes + kRawBytes + (lrow[rg] + 8 * t4) * 8, p,
                           kScaleBytes);
          }
        }
      }
    }
    if constexpr (kMbar)
      mbar_arrive_cp_async(full_bar(c));
    else
      cp_async_commit();
  };

  float acc[kRg][64];     // written first by a scale-d 0 wgmma (mma_half's `first`)
  uint32_t afr[2][4][4];  // [buffer][k16 step][fragment register]; the groups alternate buffers
  // FP8 block scales (128 x 128 blocks: one per row and chunk), one chunk ahead in registers.
  auto fp8_scale = [&](int rg, int r, int c) {
    return e8m0_to_float_dev(__ldg(wscale[r] + (wrow[rg][r] / 128) * (K / 128) + c));
  };
  float fsc[kRg][2];
#pragma unroll
  for (int rg = 0; rg < kRg; ++rg) {
    fsc[rg][0] = kFp8 ? fp8_scale(rg, 0, 0) : 0.0f;
    fsc[rg][1] = kFp8 ? fp8_scale(rg, 1, 0) : 0.0f;
  }

#pragma unroll
  for (int i = 0; i < kAhead; ++i) issue(i);
  for (int c = 0; c < chunks; ++c) {
    if constexpr (kMbar) {
      mbar_wait(full_bar(c), uint32_t((c / kSlots) & 1));  // everyone's copies of chunk c
      wgmma::fence_proxy_async();
    } else {
      cp_async_wait<kAhead - 1>();  // this thread's copies of chunk c (later ones may be in flight)
      wgmma::fence_proxy_async();
      __syncthreads();  // everyone's chunk c; every warpgroup is done with chunk c - 2
    }
    issue(c + kAhead);  // into chunk c + kAhead - kSlots's slot
    const int s = c % kSlots;
    const uint8_t* raw = smem + s * kSlotBytes + kWgActBytes;
    [[maybe_unused]] const uint8_t* scl = raw + kRawBytes;
    [[maybe_unused]] float nsc[kRg][2];
    if constexpr (kFp8) {
#pragma unroll
      for (int rg = 0; rg < kRg; ++rg) {
        nsc[rg][0] = c + 1 < chunks ? fp8_scale(rg, 0, c + 1) : 0.0f;
        nsc[rg][1] = c + 1 < chunks ? fp8_scale(rg, 1, c + 1) : 0.0f;
      }
    }
    // Groups in the order (row group, half): both halves of a row group's 16 raw bytes per row
    // come from one 16-byte shared load (conflict-free at a 16-byte lane stride; two 8-byte loads
    // there take twice the wavefronts), the second half kept in registers for the next group.
    [[maybe_unused]] uint2 next[2];
    [[maybe_unused]] uint32_t s2mx[2];
#pragma unroll
    for (int rg = 0; rg < kRg; ++rg) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The group that last read this buffer (two groups back) must be done; the group issued
        // just before keeps the tensor cores busy during the dequantization.
        const int b = h;
        wgmma::wait<1>();
        // kMbar: the last group of the chunk; the wait leaves only the previous group in flight,
        // so this warp is done with chunk c - 1's slot.
        if constexpr (kMbar) {
          if (rg == kRg - 1 && h == 1 && c > 0 && lane == 0) mbar_arrive(empty_bar(c - 1));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // The half's 16 elements e0..e15 (K order of the lane's bytes) in the fragments of its
          // four k16 steps: step kk, register half h0 = elements 8 (kk / 2) + 2 (kk % 2) + h0 and
          // that + 4: the pairs e2m1x8_to_bf16_tiny makes of each 32-bit word.
          if constexpr (kFp8) {
            const uint4 q = *reinterpret_cast<const uint4*>(
                raw + ((4 * rg + h * 2 + r) * kThreads + tid) * 16);
            const float f = fsc[rg][r];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const uint32_t lo = word(q, 2 * i), hi = word(q, 2 * i + 1);
#pragma unroll
              for (int p = 0; p < 2; ++p) {
                // bytes (2p, 2p + 4, 2p + 1, 2p + 5) of the 8 elements lo:hi
                const uint32_t w = __byte_perm(lo, hi, p == 0 ? 0x5140 : 0x7362);
                const float2 f0 = e4m3x2_to_float2(w), f1 = e4m3x2_to_float2(w >> 16);
                afr[b][2 * i + p][r] = pack_bf16x2(f0.x * f, f0.y * f);
                afr[b][2 * i + p][2 + r] = pack_bf16x2(f1.x * f, f1.y * f);
              }
            }
          } else {
            uint2 q;
            if (h == 0) {
              const uint4 q4 = *reinterpret_cast<const uint4*>(
                  raw + ((2 * rg + r) * kThreads + tid) * 16);
              q = make_uint2(q4.x, q4.y);
              next[r] = make_uint2(q4.z, q4.w);
            } else {
              q = next[r];
            }
            uint32_t s2;
            if constexpr (kMx) {  // one block per lane and chunk: both halves
              if (h == 0) {
                const uint32_t bits = wg_scale_bits_mx(scl[(lrow[rg] + 8 * r) * 8 + t4]);
                s2mx[r] = bits | (bits << 16);
              }
              s2 = s2mx[r];
            } else {
              const uint32_t bits = wg_scale_bits_nv(scl[(lrow[rg] + 8 * r) * 8 + 2 * t4 + h]);
              s2 = bits | (bits << 16);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              uint32_t o[4];
              e2m1x8_to_bf16_tiny(i == 0 ? q.x : q.y, o);
#pragma unroll
              for (int j = 0; j < 4; ++j)
                afr[b][2 * i + j / 2][2 * (j % 2) + r] = bf16x2_mul(o[j], s2);
            }
          }
        }
        wgmma::fence();
        const uint32_t b_addr = smem_addr + uint32_t(s * kSlotBytes + h * kWgAtomBytes);
        mma_half<N>(acc[rg], afr[b], b_addr, c == 0 && h == 0);
        wgmma::commit();
      }
    }
    if constexpr (kFp8) {
#pragma unroll
      for (int rg = 0; rg < kRg; ++rg) {
        fsc[rg][0] = nsc[rg][0];
        fsc[rg][1] = nsc[rg][1];
      }
    }
  }
  wgmma::wait<0>();
  cp_async_wait<0>();

  // Epilogue. acc[rg][4 j + e]: row g (w1 / the first w2 row), token 8 j + 2 t4 + e;
  // acc[rg][4 j + 2 + e]: row g + 8 (w3 / the second w2 row), the same token.
  const bool shared = g == a.E;
#pragma unroll
  for (int rg = 0; rg < kRg; ++rg) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * j + 2 * t4 + e;
        if (r >= rows) continue;
        const int gr = base + row0 + r;
        if constexpr (kFused) {
          a.out[int64_t(gr) * a.N + wrow[rg][0]] = swiglu_hidden(
              a, acc[rg][4 * j + e] * gscale0, acc[rg][4 * j + 2 + e] * gscale1, shared, gr);
        } else {
          const int64_t orow = int64_t(a.row_slot[gr]) * a.N;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float v = acc[rg][4 * j + 2 * i + e] * gscale0;
            if (a.round_bf16) v = round_bf16_dev(v);
            a.out[orow + wrow[rg][i]] = v;
          }
        }
      }
    }
  }
#else
  (void)a, (void)ex, (void)g, (void)base, (void)row0, (void)rows, (void)nb, (void)smem;
#endif
}

// The wgmma width step of a tile: 16 for the FP4 tiles of the default CTAs (four warpgroups), 32
// otherwise. A tile's width is its rows rounded up to the step; at T = 4096 (~96 rows per expert)
// steps of 32 computed ~14% more columns than the tiles' rows (session 23). The other CTAs and the
// FP8-block tiles (the shared expert: 128 rows but the last tile) keep 32 (fewer instantiations).
template <int FMT, int kWgs>
constexpr int kWgWidthStep = kWgs == 4 && FMT != int(WeightFormat::kFp8Block) ? 16 : 32;

// kRg 1: CTAs of 128 weight rows (kWgs 2) or 256 (kWgs 4: four warpgroups); 2: the wide CTAs of
// 256 rows in two warpgroups.
template <bool kFused, int kRg = 1, int kWgs = 2, bool kMbar = false>
__global__ void __launch_bounds__(128 * kWgs, 1) expert_gemm_wg_kernel(GemmArgs a) {
  pdl_begin();
#if DS_MOE_WGMMA_PATH
  extern __shared__ __align__(16) uint8_t wg_smem_raw[];
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(wg_smem_raw));
  uint8_t* smem = wg_smem_raw + ((1024u - (sa & 1023u)) & 1023u);
  const int tile_index = pf_tile_index(a);
  if (tile_index >= *a.num_tiles) return;
  const int2 tile = a.tiles[tile_index];
  const int g = tile.x, row0 = tile.y;
  const int base = a.group_offset[g];
  const int rows = min(kPfTokens, a.group_offset[g + 1] - base - row0);
  const MoeDeviceExpert ex = a.experts[g];
  const int fmt = kFused ? ex.format[0] : ex.format[2];
  const int64_t nb = pf_n_block(a);
  // One instantiation per (format, wgmma width): a width chosen inside the K loop made ptxas
  // serialize the wgmmas (C7515: the branches' accumulator moves). The width is the tile's rows
  // rounded up to kWgWidthStep<...> (the columns past them are computed and dropped). Always
  // inlined: cicc once left this lambda out of line when the epilogue grew (a CALL around the
  // wgmma K loop: C7510, and a 288-byte stack frame for its arguments).
  const auto run = [&](auto fmt_c) __attribute__((always_inline)) {
    constexpr int F = decltype(fmt_c)::value;
    constexpr int kStep = kWgWidthStep<F, kWgs>;
    // pf_step 8 (the FP4 tiles of the four-warpgroup CTAs only) or 32, else kStep.
    const int step = a.wg_step == 32 || (a.wg_step == 8 && kStep == 16) ? a.wg_step : kStep;
    const int width = (rows + step - 1) & -step;  // steps are powers of two
    // (A switch: a fold over lambdas per width made ptxas spill more in the K loops.)
#define DS_WG_TILE(n) wg_tile<kFused, F, n, kRg, kWgs, kMbar>(a, ex, g, base, row0, rows, nb, smem)
    // clang-format off
    if constexpr (kStep == 16) {
      switch (width >> 3) {
        case 1: DS_WG_TILE(8); break;
        case 2: DS_WG_TILE(16); break;
        case 3: DS_WG_TILE(24); break;
        case 4: DS_WG_TILE(32); break;
        case 5: DS_WG_TILE(40); break;
        case 6: DS_WG_TILE(48); break;
        case 7: DS_WG_TILE(56); break;
        case 8: DS_WG_TILE(64); break;
        case 9: DS_WG_TILE(72); break;
        case 10: DS_WG_TILE(80); break;
        case 11: DS_WG_TILE(88); break;
        case 12: DS_WG_TILE(96); break;
        case 13: DS_WG_TILE(104); break;
        case 14: DS_WG_TILE(112); break;
        case 15: DS_WG_TILE(120); break;
        default: DS_WG_TILE(128); break;
      }
    } else {
      switch (width >> 5) {
        case 1: DS_WG_TILE(32); break;
        case 2: DS_WG_TILE(64); break;
        case 3: DS_WG_TILE(96); break;
        default: DS_WG_TILE(128); break;
      }
    }
    // clang-format on
#undef DS_WG_TILE
  };
  if (fmt == int(WeightFormat::kMxfp4)) {
    run(std::integral_constant<int, int(WeightFormat::kMxfp4)>{});
  } else if (fmt == int(WeightFormat::kNvfp4)) {
    run(std::integral_constant<int, int(WeightFormat::kNvfp4)>{});
  } else {
    run(std::integral_constant<int, int(WeightFormat::kFp8Block)>{});
  }
#else
  (void)a;
  __trap();  // launched only on sm_90 devices (MoeDeviceLayer::pf_wgmma)
#endif
}

// ---- 8. combine --------------------------------------------------------------------------------

// y[t] = the token's routed slots in ascending expert order (stable: the order of
// cpu::moe_forward's expert loop), then the shared row. kK >= k: the slots' experts and ranks stay
// in registers (the order as 4-bit fields of one word), so no load waits for another (an insertion
// sort through global and local memory cost ~6 us at T = 1, bench_moe session 18).
template <int kK>
__global__ void combine_kernel(const float* __restrict__ ybuf, const int32_t* __restrict__ experts,
                               int64_t T, int64_t D, int64_t k, int64_t begin, int64_t end,
                               bool add_shared, float* __restrict__ y) {
  static_assert(kK <= 16, "the order holds 16 slots of 4 bits");
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t d = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * 4;
  if (d >= D) return;
  int e[kK];
#pragma unroll
  for (int i = 0; i < kK; ++i) {
    e[i] = i < k ? experts[t * k + i] : 0;
    if (i >= k || e[i] < begin || e[i] >= end) e[i] = -1;  // not summed here
  }
  uint64_t order = 0;  // 4 bits per position: the slot summed at that position
  int n = 0;
#pragma unroll
  for (int i = 0; i < kK; ++i) {
    if (e[i] < 0) continue;
    int rank = 0;
#pragma unroll
    for (int j = 0; j < kK; ++j)
      rank += e[j] >= 0 && (e[j] < e[i] || (e[j] == e[i] && j < i)) ? 1 : 0;
    order |= uint64_t(i) << (4 * rank);
    ++n;
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r = 0; r < n; ++r) {
    const int64_t slot = int64_t((order >> (4 * r)) & 15u);
    const float4 v = *reinterpret_cast<const float4*>(ybuf + (t * k + slot) * D + d);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  if (add_shared) {
    const float4 v = *reinterpret_cast<const float4*>(ybuf + (T * k + t) * D + d);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  *reinterpret_cast<float4*>(y + t * D + d) = acc;
}

template <int NT, int KS>
Status launch_gemms(const GemmArgs& g1, const GemmArgs& g2, int64_t tiles, int64_t inter,
                    int64_t dim, const float* h, uint16_t* hq, const int32_t* total_rows,
                    int64_t rows_bound, bool fp8, bool pdl, cudaStream_t stream) {
  constexpr int WN = 4 / KS;
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, expert_gemm_kernel<NT, true, KS>,
                                        dim3(unsigned(tiles), unsigned(inter / (16 * WN))),
                                        kGemmThreads, 0, stream, g1));
  const int64_t qblocks = rows_bound * (inter / kChunk);
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, quant_rows_kernel, unsigned(ceil_div(qblocks, 16)),
                                        256, 0, stream, h, inter, rows_bound, total_rows, hq, fp8,
                                        nullptr, nullptr, false));
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, expert_gemm_kernel<NT, false, KS>,
                                        dim3(unsigned(tiles), unsigned(dim / (32 * WN))),
                                        kGemmThreads, 0, stream, g2));
  return ok_status();
}

constexpr size_t kF8MaxSmem = 227 * 1024;  // sm_90 opt-in maximum per block

template <int NT, int KS, int kRing, bool kH16, int kWarps>
Status launch_gemms_f8(const GemmArgs& g1, const GemmArgs& g2, int64_t tiles, int64_t inter,
                       int64_t dim, const float* h, uint8_t* hq8, float* hs,
                       const int32_t* total_rows, int64_t rows_bound, bool pdl,
                       cudaStream_t stream) {
  constexpr int WN = kWarps / KS;
  // (The dynamic shared memory opt-in is done at load time: set_f8_smem_attributes.)
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, expert_gemm_f8_kernel<NT, true, KS, kRing, kH16, kWarps>,
                                        dim3(unsigned(tiles), unsigned(inter / (16 * WN))),
                                        32 * kWarps,
                                        f8_smem_bytes(NT, dim, kRing, kWarps, g1.act_rows),
                                        stream, g1));
  const int64_t qblocks = rows_bound * (inter / kChunk);
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, quant_rows_kernel, unsigned(ceil_div(qblocks, 16)),
                                        256, 0, stream, h, inter, rows_bound, total_rows, nullptr,
                                        true, hq8, hs, false));
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, expert_gemm_f8_kernel<NT, false, KS, kRing, kH16, kWarps>,
                                        dim3(unsigned(tiles), unsigned(dim / (32 * WN))),
                                        32 * kWarps,
                                        f8_smem_bytes(NT, inter, kRing, kWarps, g2.act_rows),
                                        stream, g2));
  return ok_status();
}

// The 128-row prefill tiles, one grid for both kernels: the wgmma kernel (wg; its activations, xq
// from forward and hq here, are in wg_tile's K order: quant_rows_kernel's permute) or the bf16
// mma.sync one. wide: the wgmma kernel's CTAs of 256 weight rows (half the N blocks), in four
// warpgroups with wgs4 (mbar: their per-slot mbarrier form). (The dynamic shared memory opt-in is
// done at load time: MoeDeviceLayer::create.)
Status launch_gemms_prefill(bool wg, bool wide, bool wgs4, bool mbar, const GemmArgs& g1,
                            const GemmArgs& g2, int64_t tiles, int64_t inter, int64_t dim,
                            const float* h, uint16_t* hq, const int32_t* total_rows,
                            int64_t rows_bound, bool fp8, bool pdl, cudaStream_t stream) {
  void (*const gate_up)(GemmArgs) = !wg            ? expert_gemm_pf_kernel<true>
                                    : wgs4 && mbar ? expert_gemm_wg_kernel<true, 1, 4, true>
                                    : wgs4         ? expert_gemm_wg_kernel<true, 1, 4>
                                    : wide         ? expert_gemm_wg_kernel<true, 2>
                                                   : expert_gemm_wg_kernel<true, 1>;
  void (*const down)(GemmArgs) = !wg            ? expert_gemm_pf_kernel<false>
                                 : wgs4 && mbar ? expert_gemm_wg_kernel<false, 1, 4, true>
                                 : wgs4         ? expert_gemm_wg_kernel<false, 1, 4>
                                 : wide         ? expert_gemm_wg_kernel<false, 2>
                                                : expert_gemm_wg_kernel<false, 1>;
  const int threads = !wg ? kPfThreads : wgs4 ? 2 * kWgThreads : kWgThreads;
  const size_t smem = !wg ? kPfSmem : wide ? kWgWideSmem : kWgSmem;
  const int64_t rows_per_cta = wide ? 2 : 1;
  // (N blocks, tiles) by default, (tiles, N blocks) with tiles_fastest: pf_tile_index.
  const auto grid = [&](int64_t n_blocks) {
    return g1.tiles_fastest ? dim3(unsigned(tiles), unsigned(n_blocks))
                            : dim3(unsigned(n_blocks), unsigned(tiles));
  };
  if (!g1.tiles_fastest && tiles > 65535)
    return invalid_argument("moe: " + std::to_string(tiles) +
                            " prefill tiles exceed the grid's 65535 rows; run fewer tokens per "
                            "forward");
  DS_CUDA_RETURN_IF_ERROR(
      launch_pdl_if(pdl, gate_up, grid(inter / (64 * rows_per_cta)), threads, smem, stream, g1));
  const int64_t qblocks = rows_bound * (inter / kChunk);
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, quant_rows_kernel, unsigned(ceil_div(qblocks, 16)),
                                        256, 0, stream, h, inter, rows_bound, total_rows, hq, fp8,
                                        nullptr, nullptr, wg));
  DS_CUDA_RETURN_IF_ERROR(
      launch_pdl_if(pdl, down, grid(dim / (128 * rows_per_cta)), threads, smem, stream, g2));
  return ok_status();
}

// The wgmma kernel's CTAs of 256 weight rows need whole N blocks: 128 inter columns (gate/up) and
// 256 outputs (down).
bool wide_prefill_fits(const MoeDeviceLayer& l) {
  return l.inter % 128 == 0 && l.dim % 256 == 0;
}

// Opts the prefill kernels into their dynamic shared memory on the current device (load time):
// the mma.sync pair, or (wg) the wgmma kernels of both CTA widths.
cudaError_t set_prefill_smem_attributes(bool wg) {
  struct Fn {
    void (*f)(GemmArgs);
    size_t bytes;
  };
  const Fn pf[] = {{expert_gemm_pf_kernel<true>, kPfSmem}, {expert_gemm_pf_kernel<false>, kPfSmem}};
  const Fn wgk[] = {{expert_gemm_wg_kernel<true, 1>, kWgSmem},
                    {expert_gemm_wg_kernel<false, 1>, kWgSmem},
                    {expert_gemm_wg_kernel<true, 2>, kWgWideSmem},
                    {expert_gemm_wg_kernel<false, 2>, kWgWideSmem},
                    {expert_gemm_wg_kernel<true, 1, 4>, kWgWideSmem},
                    {expert_gemm_wg_kernel<false, 1, 4>, kWgWideSmem},
                    {expert_gemm_wg_kernel<true, 1, 4, true>, kWgWideSmem},
                    {expert_gemm_wg_kernel<false, 1, 4, true>, kWgWideSmem}};
  for (const Fn& f : wg ? std::span<const Fn>(wgk) : std::span<const Fn>(pf)) {
    const cudaError_t e =
        cudaFuncSetAttribute(f.f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(f.bytes));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Opts every FP8-path kernel into large dynamic shared memory on the current device. Called by
// MoeDeviceLayer::create (load time), so that no attribute call happens inside a graph capture.
template <int NT, int KS, int kRing, int kWarps = 4>
cudaError_t set_f8_smem_attribute() {
  // Both MMA variants (e4m3, f16), gate/up and down.
  const void* fns[] = {
      reinterpret_cast<const void*>(expert_gemm_f8_kernel<NT, true, KS, kRing, false, kWarps>),
      reinterpret_cast<const void*>(expert_gemm_f8_kernel<NT, false, KS, kRing, false, kWarps>),
      reinterpret_cast<const void*>(expert_gemm_f8_kernel<NT, true, KS, kRing, true, kWarps>),
      reinterpret_cast<const void*>(expert_gemm_f8_kernel<NT, false, KS, kRing, true, kWarps>)};
  for (const void* f : fns) {
    const cudaError_t e =
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kF8MaxSmem));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t set_f8_smem_attributes() {
  const cudaError_t errs[] = {
      set_f8_smem_attribute<1, 1, 8192>(),  set_f8_smem_attribute<1, 2, 8192>(),
      set_f8_smem_attribute<1, 4, 8192>(),  set_f8_smem_attribute<1, 1, 16384>(),
      set_f8_smem_attribute<1, 2, 16384>(), set_f8_smem_attribute<1, 4, 16384>(),
      set_f8_smem_attribute<2, 1, 8192>(),  set_f8_smem_attribute<2, 2, 8192>(),
      set_f8_smem_attribute<2, 4, 8192>(),  set_f8_smem_attribute<1, 1, 8192, 8>(),
      set_f8_smem_attribute<1, 2, 8192, 8>(), set_f8_smem_attribute<1, 4, 8192, 8>()};
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

Status check_weight(const cpu::LinearWeight& w, int64_t n, int64_t k, const std::string& what) {
  const bool fp4 = w.format == WeightFormat::kMxfp4 || w.format == WeightFormat::kNvfp4;
  if (!fp4 && w.format != WeightFormat::kFp8Block)
    return invalid_argument("moe: " + what + ": format must be MXFP4, NVFP4 or FP8 block");
  if (w.out_features != n || w.in_features != k)
    return invalid_argument("moe: " + what + ": shape [" + std::to_string(w.out_features) + ", " +
                            std::to_string(w.in_features) + "], expected [" + std::to_string(n) +
                            ", " + std::to_string(k) + "]");
  if (!w.data || !w.scale) return invalid_argument("moe: " + what + ": null data or scale");
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    return invalid_argument("moe: " + what + ": data must be 16-byte aligned");
  return ok_status();
}

MoeDeviceExpert to_device_expert(const cpu::ExpertWeights& e) {
  MoeDeviceExpert d;
  const cpu::LinearWeight* ws[3] = {&e.w1, &e.w3, &e.w2};
  for (int i = 0; i < 3; ++i) {
    d.data[i] = static_cast<const uint8_t*>(ws[i]->data);
    d.scale[i] = ws[i]->scale;
    d.global_scale[i] = ws[i]->format == WeightFormat::kNvfp4 ? ws[i]->global_scale : 1.0f;
    d.format[i] = uint8_t(ws[i]->format);
  }
  return d;
}

}  // namespace

// ---- MoeDeviceLayer ----------------------------------------------------------------------------

MoeDeviceLayer::~MoeDeviceLayer() { release(); }

void MoeDeviceLayer::limit_to_scale_code(int max_code) {
  if (max_code > kMoeF16MaxScaleCode) fp8_f16 = false;
  if (max_code > kMoeF8MaxScaleCode) fp8_mma = false;
  if (max_code > kMoeWgMaxScaleCode) pf_wgmma = pf_wide = false;
}

int max_mxfp4_scale_code(const cpu::ExpertWeights* experts, int64_t begin, int64_t end,
                         const cpu::ExpertWeights* shared) {
  int best = -1;
  auto scan = [&](const cpu::LinearWeight& w) {
    if (w.format != WeightFormat::kMxfp4 || w.scale == nullptr) return;
    const size_t n = size_t(w.out_features) * size_t(w.in_features / 32);
    if (n > 0) best = std::max(best, int(*std::max_element(w.scale, w.scale + n)));
  };
  for (int64_t e = begin; experts != nullptr && e < end; ++e) {
    scan(experts[e].w1);
    scan(experts[e].w3);
    scan(experts[e].w2);
  }
  if (shared != nullptr) {
    scan(shared->w1);
    scan(shared->w3);
    scan(shared->w2);
  }
  return best;
}

void MoeDeviceLayer::release() {
  if (experts) cudaFree(experts);
  experts = nullptr;
  route_done = nullptr;  // in the experts allocation
}

MoeDeviceLayer::MoeDeviceLayer(MoeDeviceLayer&& o) noexcept { *this = std::move(o); }

MoeDeviceLayer& MoeDeviceLayer::operator=(MoeDeviceLayer&& o) noexcept {
  if (this != &o) {
    release();
    dim = o.dim;
    inter = o.inter;
    num_experts = o.num_experts;
    topk = o.topk;
    route_scale = o.route_scale;
    renorm_epsilon = o.renorm_epsilon;
    gate = o.gate;
    gate_bf16 = o.gate_bf16;
    bias = o.bias;
    tid2eid = o.tid2eid;
    vocab_size = o.vocab_size;
    swiglu_limit = o.swiglu_limit;
    shared_expert_clamp = o.shared_expert_clamp;
    quantize_activations = o.quantize_activations;
    round_bf16 = o.round_bf16;
    expert_begin = o.expert_begin;
    expert_end = o.expert_end;
    add_shared = o.add_shared;
    experts = o.experts;
    route_done = o.route_done;
    fp8_mma = o.fp8_mma;
    fp8_f16 = o.fp8_f16;
    pf_wgmma = o.pf_wgmma;
    pf_wide = o.pf_wide;
    o.experts = nullptr;
    o.route_done = nullptr;
  }
  return *this;
}

Result<MoeDeviceLayer> MoeDeviceLayer::create(const cpu::MoeParams& p) {
  MoeDeviceLayer l;
  const cpu::RouterConfig& rc = p.router_config;
  l.dim = p.shared.w1.in_features;
  l.inter = p.shared.w1.out_features;
  l.num_experts = rc.num_experts;
  l.topk = rc.topk;
  l.route_scale = rc.route_scale;
  l.renorm_epsilon = rc.renorm_epsilon;
  l.expert_begin = p.expert_begin;
  l.expert_end = p.expert_end < 0 ? rc.num_experts : p.expert_end;
  l.add_shared = p.add_shared;
  l.swiglu_limit = p.swiglu_limit;
  l.shared_expert_clamp = p.shared_expert_clamp;
  l.quantize_activations = p.quantize_activations;
  l.round_bf16 = p.round_bf16;
  if (l.num_experts < 1 || l.num_experts > kMaxExperts)
    return invalid_argument("moe: num_experts must be in [1, 512]");
  if (l.topk < 1 || l.topk > kMaxTopk || l.topk > l.num_experts)
    return invalid_argument("moe: topk must be in [1, min(16, num_experts)]");
  if (l.dim <= 0 || l.dim % kDimAlign != 0) return invalid_argument("moe: dim % 128 != 0");
  if (l.inter <= 0 || l.inter % kChunk != 0) return invalid_argument("moe: inter % 128 != 0");
  if (l.expert_begin < 0 || l.expert_begin > l.expert_end || l.expert_end > l.num_experts)
    return invalid_argument("moe: bad expert range");
  const cpu::LinearWeight& gate = p.router.gate;
  if (gate.format != WeightFormat::kF32 && gate.format != WeightFormat::kBF16)
    return invalid_argument("moe: router gate must be fp32 or bf16");
  if (gate.out_features != l.num_experts || gate.in_features != l.dim || !gate.data)
    return invalid_argument("moe: router gate shape must be [num_experts, dim]");
  l.gate = gate.data;
  l.gate_bf16 = gate.format == WeightFormat::kBF16;
  l.bias = p.router.bias;
  l.tid2eid = p.router.tid2eid;
  l.vocab_size = p.router.vocab_size;
  if (l.tid2eid && l.vocab_size <= 0) return invalid_argument("moe: tid2eid needs vocab_size");

  std::vector<MoeDeviceExpert> table(size_t(l.num_experts + 1));
  for (int64_t e = l.expert_begin; e < l.expert_end; ++e) {
    if (!p.experts) return invalid_argument("moe: experts is null");
    const cpu::ExpertWeights& ew = p.experts[e];
    const std::string name = "expert " + std::to_string(e);
    DS_RETURN_IF_ERROR(check_weight(ew.w1, l.inter, l.dim, name + " w1"));
    DS_RETURN_IF_ERROR(check_weight(ew.w3, l.inter, l.dim, name + " w3"));
    DS_RETURN_IF_ERROR(check_weight(ew.w2, l.dim, l.inter, name + " w2"));
    if (ew.w1.format != ew.w3.format)
      return invalid_argument("moe: " + name + " w1/w3 formats differ");
    table[size_t(e)] = to_device_expert(ew);
  }
  if (l.add_shared) {
    DS_RETURN_IF_ERROR(check_weight(p.shared.w1, l.inter, l.dim, "shared w1"));
    DS_RETURN_IF_ERROR(check_weight(p.shared.w3, l.inter, l.dim, "shared w3"));
    DS_RETURN_IF_ERROR(check_weight(p.shared.w2, l.dim, l.inter, "shared w2"));
    if (p.shared.w1.format != p.shared.w3.format)
      return invalid_argument("moe: shared w1/w3 formats differ");
    table[size_t(l.num_experts)] = to_device_expert(p.shared);
  }
  // The FP8 tensor-core path: reference numerics, MXFP4 / FP8-block weights only (NVFP4's
  // 16-element blocks do not align with the k32 steps), scales loadable 4 bytes at a time, sm_89+.
  {
    bool f8 = l.quantize_activations;
    auto fmt_ok = [&](const cpu::LinearWeight& w) {
      if (w.format == WeightFormat::kFp8Block) return true;
      return w.format == WeightFormat::kMxfp4 && reinterpret_cast<uintptr_t>(w.scale) % 4 == 0;
    };
    for (int64_t e = l.expert_begin; f8 && e < l.expert_end; ++e) {
      const cpu::ExpertWeights& ew = p.experts[e];
      f8 = fmt_ok(ew.w1) && fmt_ok(ew.w3) && fmt_ok(ew.w2);
    }
    if (f8 && l.add_shared) f8 = fmt_ok(p.shared.w1) && fmt_ok(p.shared.w3) && fmt_ok(p.shared.w2);
    int dev = 0, major = 0, minor = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    DS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    f8 = f8 && major * 10 + minor >= 89;
    // sm_90 / sm_100 have no FP8 mma.sync of their own (ptxas lowers it to f16 HMMAs plus
    // conversions): the FP8 path runs its f16 variant there; sm_89 / sm_120 keep the e4m3 mma.
    l.fp8_f16 = major == 9 || major == 10;
    f8 = f8 && f8_smem_bytes(2, std::max(l.dim, l.inter), 8192) <= kF8MaxSmem &&
         f8_smem_bytes(1, std::max(l.dim, l.inter), 16384) <= kF8MaxSmem &&
         f8_smem_bytes(1, std::max(l.dim, l.inter), 8192, 8) <= kF8MaxSmem;
    if (f8) DS_CUDA_RETURN_IF_ERROR(set_f8_smem_attributes());
    l.fp8_mma = f8;
  }
  DS_CUDA_RETURN_IF_ERROR(set_prefill_smem_attributes(false));
  // The sm_90a prefill path: an sm_90 device, and block scales that its 4-byte (MXFP4) / 8-byte
  // (NVFP4) cp.async can copy (real checkpoints' tensors are allocated far more aligned).
  {
    int dev = 0, major = 0, minor = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    DS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    bool wg = major == 9 && minor == 0;
    auto aligned = [](const cpu::LinearWeight& w) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(w.scale);
      return w.format == WeightFormat::kFp8Block ||
             (w.format == WeightFormat::kMxfp4 && a % 4 == 0) ||
             (w.format == WeightFormat::kNvfp4 && a % 8 == 0);
    };
    auto expert_ok = [&](const cpu::ExpertWeights& ew) {
      return aligned(ew.w1) && aligned(ew.w3) && aligned(ew.w2);
    };
    for (int64_t e = l.expert_begin; wg && e < l.expert_end; ++e) wg = expert_ok(p.experts[e]);
    if (wg && l.add_shared) wg = expert_ok(p.shared);
    if (wg) DS_CUDA_RETURN_IF_ERROR(set_prefill_smem_attributes(true));
    l.pf_wgmma = wg;
    // The 256-row CTAs (four warpgroups) by default where they divide the shapes (session 22,
    // H100, GEMMs at T = 4096 against the 128-row CTAs: MXFP4 -16%, NVFP4 -11%).
    l.pf_wide = wg && wide_prefill_fits(l);
  }
  // The expert table, then the fused routing's arrival counter (zero between forwards).
  const size_t bytes = table.size() * sizeof(MoeDeviceExpert);
  DS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&l.experts), align256(bytes) + 256));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpy(l.experts, table.data(), bytes, cudaMemcpyHostToDevice));
  l.route_done =
      reinterpret_cast<unsigned*>(reinterpret_cast<uint8_t*>(l.experts) + align256(bytes));
  DS_CUDA_RETURN_IF_ERROR(cudaMemset(l.route_done, 0, 256));
  return Result<MoeDeviceLayer>(std::move(l));
}

// ---- MoeRunner ---------------------------------------------------------------------------------

size_t MoeRunner::workspace_bytes(int64_t max_tokens, const MoeDeviceLayer& layer) {
  return make_layout(std::max<int64_t>(max_tokens, 1), layer).total;
}

int MoeRunner::tile_tokens(int64_t T, const MoeDeviceLayer& layer) {
  // Expected rows per routed expert; a tile as large as that (decode: 8 tokens).
  const int64_t per_expert = ceil_div(T * layer.topk, std::max<int64_t>(layer.num_experts, 1));
  if (per_expert <= 8) return 8;
  if (per_expert <= 16) return 16;
  // 17-32 rows per expert: on sm_90 the wgmma prefill tiles (session 18, H200, Flash MXFP4:
  // T = 1024, 24 rows per expert, 3.81 ms against 5.74 ms on the bf16 32-row tiles; at T = 512,
  // 12 rows, the FP8 16-row tiles stay faster: 2.67 vs 3.54 ms). Elsewhere the 32-row tiles.
  if (per_expert <= 32) return layer.pf_wgmma ? kPfTokens : 32;
  // More than 32 rows per expert: the 128-row prefill tiles (expert_gemm_wg_kernel on sm_90,
  // else expert_gemm_pf_kernel). Measured on H200 (session 7, the mma.sync kernel): faster than
  // the 64-row bf16 tiles at T = 4096 / 8192 (9.6 / 18.3 ms vs 13.9 / 24.4 ms), equal at T = 1024,
  // 2x slower at T = 512 (5.5 ms vs 2.9 ms with the FP8 16-row tiles): below ~1000 tokens it is
  // bound by the weight bytes in flight (NOTES.md).
  return kPfTokens;
}

namespace {

// MoeRunner::route, and for forward(): with q.on the quantization of x inside the small-T logits
// kernel where its grid covers x's blocks (*quantized tells whether it did; else the caller
// launches quant_rows_kernel); with a plan, at T <= kRoutePlanMaxTokens the routing and the plan
// as one route_plan_kernel (*planned; else the caller launches plan_kernel), routing by rank over
// the CTA unless by_warp (MoeTuning::route_by_warp). With fused (MoeTuning::route_launch 1) and a
// plan, at T <= kFusedRouteMaxTokens the logits, x's quantization, the routing and the plan are
// one router_logits_route_kernel.
Status route_impl(const MoeDeviceLayer& l, const float* x, const int32_t* token_ids, int64_t T,
                  int32_t* experts, float* weights, void* workspace, cudaStream_t stream, bool pdl,
                  XQuant q, bool* quantized, const PlanArgs* plan, bool* planned,
                  bool by_warp = false, bool fused = false) {
  *quantized = false;
  *planned = false;
  if (T <= 0) return ok_status();
  if (l.tid2eid && !token_ids) return invalid_argument("moe: hash routing needs token_ids");
  const Layout L = make_layout(T, l);
  auto* ws = static_cast<uint8_t*>(workspace);
  float* logits = reinterpret_cast<float*>(ws + L.logits);
  RouteArgs ra{logits, l.bias,        l.tid2eid,        token_ids, T,      l.num_experts,
               l.topk, l.route_scale, l.renorm_epsilon, experts,   weights};
  // The whole CTA routes by rank where it pays (T <= 2 at E = 256).
  const bool by_rank = !by_warp && !l.tid2eid && route_by_rank_pays(T, l.num_experts);
  if (fused && plan && T <= kFusedRouteMaxTokens && l.route_done) {
    const unsigned ctas = unsigned(ceil_div(l.num_experts, kFusedLogitsExperts));
    q.on = q.on && int64_t(ctas) * (kPlanThreads / 32) * 2 >= T * (l.dim / kChunk);
    *quantized = q.on;
    *planned = true;
    const auto launch = [&](auto k) {
      return launch_pdl_if(pdl, k, ctas, kPlanThreads, 0, stream, x, l.gate, T, l.dim,
                           l.num_experts, logits, q, ra, *plan, by_rank, l.route_done);
    };
    const int tb = T <= 2 ? 2 : T <= 4 ? 4 : 8;
    if (l.gate_bf16) {
      DS_CUDA_RETURN_IF_ERROR(tb == 2   ? launch(router_logits_route_kernel<true, 2>)
                              : tb == 4 ? launch(router_logits_route_kernel<true, 4>)
                                        : launch(router_logits_route_kernel<true, 8>));
    } else {
      DS_CUDA_RETURN_IF_ERROR(tb == 2   ? launch(router_logits_route_kernel<false, 2>)
                              : tb == 4 ? launch(router_logits_route_kernel<false, 4>)
                                        : launch(router_logits_route_kernel<false, 8>));
    }
    return ok_status();
  }
  const dim3 lg(unsigned(ceil_div(l.num_experts, kLogitsTile)),
                unsigned(ceil_div(T, kLogitsTile)));
  const dim3 lg_small(unsigned(l.num_experts), unsigned(ceil_div(T, 8)));
  const dim3 lg_mid(unsigned(ceil_div(l.num_experts, 4)), unsigned(ceil_div(T, 16)));
  const auto small_kernel = [&](auto k, dim3 grid) {
    // Two 128-blocks per warp of the grid's 8-warp CTAs.
    q.on = q.on && int64_t(grid.x) * grid.y * 16 >= T * (l.dim / kChunk);
    *quantized = q.on;
    return launch_pdl_if(pdl, k, grid, 256, 0, stream, x, l.gate, T, l.dim, l.num_experts,
                         logits, q);
  };
  const auto tiled_kernel = [&](auto k) {
    return launch_pdl_if(pdl, k, lg, 256, 0, stream, x, l.gate, T, l.dim, l.num_experts, logits);
  };
  if (T <= 8 && l.gate_bf16) {
    DS_CUDA_RETURN_IF_ERROR(small_kernel(router_logits_small_kernel<true, 1, 8>, lg_small));
  } else if (T <= 8) {
    DS_CUDA_RETURN_IF_ERROR(small_kernel(router_logits_small_kernel<false, 1, 8>, lg_small));
  } else if (T <= 64 && l.gate_bf16) {
    DS_CUDA_RETURN_IF_ERROR(small_kernel(router_logits_small_kernel<true, 4, 16>, lg_mid));
  } else if (T <= 64) {
    DS_CUDA_RETURN_IF_ERROR(small_kernel(router_logits_small_kernel<false, 4, 16>, lg_mid));
  } else if (l.gate_bf16) {
    DS_CUDA_RETURN_IF_ERROR(tiled_kernel(router_logits_tiled_kernel<true>));
  } else {
    DS_CUDA_RETURN_IF_ERROR(tiled_kernel(router_logits_tiled_kernel<false>));
  }
  if (plan && T <= kRoutePlanMaxTokens) {
    *planned = true;
    DS_CUDA_RETURN_IF_ERROR(
        launch_pdl_if(pdl, route_plan_kernel, 1, kPlanThreads, 0, stream, ra, *plan, by_rank));
  } else {
    DS_CUDA_RETURN_IF_ERROR(
        launch_pdl_if(pdl, route_kernel, unsigned(ceil_div(T, 8)), 256, 0, stream, ra));
  }
  return ok_status();
}

}  // namespace

Status MoeRunner::route(const MoeDeviceLayer& l, const float* x, const int32_t* token_ids,
                        int64_t T, int32_t* experts, float* weights, void* workspace,
                        cudaStream_t stream, bool pdl) {
  bool quantized = false, planned = false;
  return route_impl(l, x, token_ids, T, experts, weights, workspace, stream, pdl, XQuant{},
                    &quantized, nullptr, &planned);
}

Status MoeRunner::forward(const MoeDeviceLayer& l, const float* x, const int32_t* token_ids,
                          int64_t T, float* y, void* workspace, cudaStream_t stream,
                          const MoeTuning& tuning) {
  if (T <= 0) return ok_status();
  if (!l.experts) return invalid_argument("moe: layer not created");
  if (T * (l.topk + 1) >= (int64_t(1) << 31) / std::max<int64_t>(l.dim, l.inter))
    return invalid_argument("moe: too many tokens");
  const Layout L = make_layout(T, l);
  auto* ws = static_cast<uint8_t*>(workspace);
  auto* experts = reinterpret_cast<int32_t*>(ws + L.experts);
  auto* weights = reinterpret_cast<float*>(ws + L.weights);
  auto* group_offset = reinterpret_cast<int32_t*>(ws + L.group_offset);
  auto* num_tiles = reinterpret_cast<int32_t*>(ws + L.num_tiles);
  auto* tiles = reinterpret_cast<int2*>(ws + L.tiles);
  auto* row_token = reinterpret_cast<int32_t*>(ws + L.row_token);
  auto* row_slot = reinterpret_cast<int32_t*>(ws + L.row_slot);
  auto* row_weight = reinterpret_cast<float*>(ws + L.row_weight);
  auto* xq = reinterpret_cast<uint16_t*>(ws + L.xq);
  auto* h = reinterpret_cast<float*>(ws + L.h);
  auto* hq = reinterpret_cast<uint16_t*>(ws + L.hq);
  auto* ybuf = reinterpret_cast<float*>(ws + L.ybuf);

  if (tuning.pdl != 0 && tuning.pdl != 1) return invalid_argument("moe: tuning.pdl must be 0 or 1");
  if (tuning.route_by_warp != 0 && tuning.route_by_warp != 1)
    return invalid_argument("moe: tuning.route_by_warp must be 0 or 1");
  if (tuning.f8_order != 0 && tuning.f8_order != 1)
    return invalid_argument("moe: tuning.f8_order must be 0 or 1");
  if (tuning.f8_act_rows != 0 && tuning.f8_act_rows != 1)
    return invalid_argument("moe: tuning.f8_act_rows must be 0 or 1");
  if (tuning.route_launch < 0 || tuning.route_launch > 2)
    return invalid_argument("moe: tuning.route_launch must be 0, 1 or 2");
  const bool pdl = tuning.pdl == 1;
  const bool pf_forced = tuning.path == 3 || tuning.path == 4;
  const int bt = tuning.tile_tokens > 0 ? tuning.tile_tokens
                 : pf_forced            ? kPfTokens
                                        : tile_tokens(T, l);
  if (bt != 8 && bt != 16 && bt != 32 && bt != 64 && bt != kPfTokens)
    return invalid_argument("moe: tile_tokens must be 8, 16, 32, 64 or 128");
  if ((bt == kPfTokens) != (pf_forced || (tuning.path == 0 && bt == kPfTokens)))
    return invalid_argument("moe: 128-row tiles are the prefill paths (3, 4) and vice versa");
  if (tuning.path == 4 && !l.pf_wgmma)
    return invalid_argument("moe: the wgmma prefill path needs an sm_90 device");
  // The prefill tiles run on wgmma (sm_90a) unless the mma.sync kernel is forced (path 3).
  const bool use_wg = bt == kPfTokens && tuning.path != 3 && l.pf_wgmma;
  if (tuning.pf_raster != 0 && tuning.pf_raster != 1)
    return invalid_argument("moe: tuning.pf_raster must be 0 or 1");
  if (tuning.pf_rows != 0 && tuning.pf_rows != 128 && tuning.pf_rows != 256)
    return invalid_argument("moe: tuning.pf_rows must be 0, 128 or 256");
  // The wgmma kernel's CTAs of 256 weight rows: forced, or the layer's default (pf_wide).
  if (tuning.pf_rows == 256 && !(use_wg && wide_prefill_fits(l)))
    return invalid_argument(
        "moe: 256-row prefill CTAs need the wgmma prefill path, inter % 128 == 0 and dim % 256 == "
        "0");
  const bool use_wide = use_wg && (tuning.pf_rows == 256 || (tuning.pf_rows == 0 && l.pf_wide));
  if (tuning.pf_wgs != 0 && tuning.pf_wgs != 2 && tuning.pf_wgs != 4)
    return invalid_argument("moe: tuning.pf_wgs must be 0, 2 or 4");
  if (tuning.pf_step != 0 && tuning.pf_step != 8 && tuning.pf_step != 32)
    return invalid_argument("moe: tuning.pf_step must be 0, 8 or 32");
  if (tuning.pf_sync < 0 || tuning.pf_sync > 2)
    return invalid_argument("moe: tuning.pf_sync must be 0, 1 or 2");
  if (tuning.pf_wgs == 4 && !use_wide)
    return invalid_argument("moe: four-warpgroup prefill CTAs need the 256-row CTAs");
  const bool use_wgs4 = use_wide && tuning.pf_wgs != 2;
  if (tuning.pf_sync != 0 && !use_wgs4)
    return invalid_argument("moe: tuning.pf_sync 1 / 2 needs the four-warpgroup prefill CTAs");
  // The four-warpgroup CTAs hand chunks over through per-slot mbarriers unless pf_sync is 2
  // (session 26, H100, GEMMs against the CTA barrier per chunk: -2.3% MXFP4 T = 4096, -1.9% 8192,
  // -5.6% 1024, -4.8% NVFP4 4096).
  const bool use_mbar = use_wgs4 && tuning.pf_sync != 2;
  auto* xq8 = reinterpret_cast<uint8_t*>(ws + L.xq8);
  auto* xs = reinterpret_cast<float*>(ws + L.xs);
  auto* hq8 = reinterpret_cast<uint8_t*>(ws + L.hq8);
  auto* hs = reinterpret_cast<float*>(ws + L.hs);
  const bool want_f8 = tuning.path == 2 || (tuning.path == 0 && l.fp8_mma && bt <= 16);
  // x's activation quantization (xq bf16 in the GEMMs' K order; with the FP8 path also e4m3 codes
  // xq8 and scales xs): inside the small-T logits kernel where it can, else its own launch below.
  const XQuant xquant{true, xq, l.quantize_activations, want_f8 ? xq8 : nullptr, xs, use_wg};
  // The plan: with the routing in one launch at decode sizes, else its own launch.
  const PlanArgs pa{experts,      weights,   T,         l.topk,    l.num_experts, l.expert_begin,
                    l.expert_end, l.add_shared, bt,     group_offset, tiles,      num_tiles,
                    row_token,    row_slot,  row_weight};
  bool x_quantized = false, planned = false;
  DS_RETURN_IF_ERROR(route_impl(l, x, token_ids, T, experts, weights, workspace, stream, pdl,
                                xquant, &x_quantized, &pa, &planned, tuning.route_by_warp == 1,
                                tuning.route_launch == 1));
  if (!planned)
    DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, plan_kernel, 1, kPlanThreads, 0, stream, pa));

  if (!x_quantized) {
    const int64_t xblocks = T * (l.dim / kChunk);
    DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, quant_rows_kernel, unsigned(ceil_div(xblocks, 16)),
                                          256, 0, stream, x, l.dim, T, nullptr, xq,
                                          l.quantize_activations, xquant.out8, xs, use_wg));
  }

  GemmArgs g1{l.experts, int(l.num_experts), tiles, num_tiles, group_offset, row_token, row_slot,
              row_weight, xq, l.dim, l.inter, h, l.swiglu_limit, l.shared_expert_clamp,
              l.round_bf16};
  g1.act8 = xq8;
  g1.act_scale = xs;
  g1.tiles_fastest = tuning.pf_raster == 1;
  g1.wg_step = tuning.pf_step;
  // The FP8 path's grid order: the shared expert's tiles first, then tile by tile (f8_place).
  if (want_f8 && tuning.f8_order == 0 && l.add_shared) g1.shared_first = int(ceil_div(T, bt));
  // The FP8 path's activation tile rows: a tile holds at most T rows (the shared expert's T, a
  // routed expert's at most one per token: top-k picks distinct experts) or T * k with hash
  // routing (a tid2eid row may repeat an expert).
  if (want_f8 && tuning.f8_act_rows == 0)
    g1.act_rows = int(std::min<int64_t>(bt, l.tid2eid ? T * l.topk : T));
  GemmArgs g2 = g1;
  g2.act = hq;
  g2.act8 = hq8;
  g2.act_scale = hs;
  g2.K = l.inter;
  g2.N = l.dim;
  g2.out = ybuf;
  const int64_t tiles_bound = max_tiles(T, l, bt);
  const int64_t rows_bound = T * l.topk + T;
  const int32_t* total_rows = group_offset + (l.num_experts + 1);
  const bool fp8 = l.quantize_activations;
  if (tuning.mma < 0 || tuning.mma > 2)
    return invalid_argument("moe: tuning.mma must be 0, 1 or 2");
  if (tuning.path == 2 && (!l.fp8_mma || bt > 16))
    return invalid_argument("moe: the FP8 path needs fp8_mma and 8 or 16-row tiles");
  const bool use_f8 = tuning.path == 2 || (tuning.path == 0 && l.fp8_mma && bt <= 16);
  // K split: measured on H200 (bench_moe): 8-token tiles are fastest with 2 (T = 1: 129 us vs
  // 163 us unsplit and 144 us with 4), 16-token tiles without a split.
  int ks = tuning.k_split > 0 ? tuning.k_split : (bt == 8 ? 2 : 1);
  if (bt >= 32 || (bt == 16 && ks > 2)) ks = 1;  // the instantiated (tile, split) pairs
  const auto run = [&](auto nt, auto kss) {
    return launch_gemms<decltype(nt)::value, decltype(kss)::value>(
        g1, g2, tiles_bound, l.inter, l.dim, h, hq, total_rows, rows_bound, fp8, pdl, stream);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  // The FP8 path's MMA: f16 mma.sync on the exactly converted operands, or e4m3 mma.sync.
  const bool h16 = tuning.mma == 0 ? l.fp8_f16 : tuning.mma == 2;
  const auto run_f8 = [&](auto nt, auto kss, auto ring, auto warps) {
    constexpr int kNt = decltype(nt)::value, kKs = decltype(kss)::value;
    constexpr int kR = decltype(ring)::value, kW = decltype(warps)::value;
    return h16 ? launch_gemms_f8<kNt, kKs, kR, true, kW>(g1, g2, tiles_bound, l.inter, l.dim, h,
                                                         hq8, hs, total_rows, rows_bound, pdl,
                                                         stream)
               : launch_gemms_f8<kNt, kKs, kR, false, kW>(g1, g2, tiles_bound, l.inter, l.dim, h,
                                                          hq8, hs, total_rows, rows_bound, pdl,
                                                          stream);
  };
  if (bt == kPfTokens) {
    DS_RETURN_IF_ERROR(launch_gemms_prefill(use_wg, use_wide, use_wgs4, use_mbar, g1, g2,
                                            tiles_bound, l.inter, l.dim, h, hq, total_rows,
                                            rows_bound, fp8, pdl, stream));
  } else if (use_f8) {
    // K split and ring of the FP8 path, measured on H200 (bench_moe, session 5): K split 4 at
    // T = 1 (80.6 us vs 84.9 with 2: 896 CTAs instead of 448 for the 7 groups, < 2 waves at 3
    // CTAs per SM), 2 at T = 16 and 64 (536 / 1240 us vs 548 / 1306 with 4, 616 / 1420 with 1).
    // Ring 8 KB per warp (4 FP4 stages, 3 CTAs per SM). Session 8 (f16 MMA, cp.async sources
    // computed once per CTA) re-measured the choices: K split 4 / 2 / 2 at T = 1 / 16 / 64 still
    // best (74.8 / 443 / 1027 us; K split 1: 82.4 / 531 / 1187; 4 at T = 16 / 64: 489 / 1188),
    // the 16 KB ring and 8-warp CTAs slower (T = 16: 502 and 470 us; NOTES.md).
    const int kf = tuning.k_split > 0 ? tuning.k_split : (T <= 4 ? 4 : 2);
    const int ring = tuning.ring_kb > 0 ? tuning.ring_kb : 8;
    using R8 = std::integral_constant<int, 8192>;
    using R16 = std::integral_constant<int, 16384>;
    // Warps per CTA: 4, or 8 (8-row tiles, 8 KB ring: 2 CTAs = 16 warps per SM instead of 3 x 4
    // at ~69 KB of shared memory each; session 8).
    const int warps = tuning.warps > 0 ? tuning.warps : 4;
    if (warps != 4 && (warps != 8 || bt != 8 || ring != 8))
      return invalid_argument("moe: 8 warps per CTA need 8-row tiles and the 8 KB ring");
    const int64_t wn = warps / kf;  // column blocks of 16 (gate/up) or 32 (down) rows per CTA
    if (l.inter % (16 * wn) != 0 || l.dim % (32 * wn) != 0)
      return invalid_argument("moe: dim / inter not a multiple of the FP8 path's CTA columns");
    if (bt == 8 && ring == 16) {
      DS_RETURN_IF_ERROR(kf == 4   ? run_f8(I1{}, I4{}, R16{}, I4{})
                         : kf == 2 ? run_f8(I1{}, I2{}, R16{}, I4{})
                                   : run_f8(I1{}, I1{}, R16{}, I4{}));
    } else if (bt == 8 && warps == 8) {
      DS_RETURN_IF_ERROR(kf == 4   ? run_f8(I1{}, I4{}, R8{}, I8{})
                         : kf == 2 ? run_f8(I1{}, I2{}, R8{}, I8{})
                                   : run_f8(I1{}, I1{}, R8{}, I8{}));
    } else if (bt == 8) {
      DS_RETURN_IF_ERROR(kf == 4   ? run_f8(I1{}, I4{}, R8{}, I4{})
                         : kf == 2 ? run_f8(I1{}, I2{}, R8{}, I4{})
                                   : run_f8(I1{}, I1{}, R8{}, I4{}));
    } else {
      DS_RETURN_IF_ERROR(kf == 4   ? run_f8(I2{}, I4{}, R8{}, I4{})
                         : kf == 2 ? run_f8(I2{}, I2{}, R8{}, I4{})
                                   : run_f8(I2{}, I1{}, R8{}, I4{}));
    }
  } else if (bt == 8) {
    DS_RETURN_IF_ERROR(ks == 4 ? run(I1{}, I4{}) : ks == 2 ? run(I1{}, I2{}) : run(I1{}, I1{}));
  } else if (bt == 16) {
    DS_RETURN_IF_ERROR(ks == 2 ? run(I2{}, I2{}) : run(I2{}, I1{}));
  } else if (bt == 32) {
    DS_RETURN_IF_ERROR(run(I4{}, I1{}));
  } else {
    DS_RETURN_IF_ERROR(run(I8{}, I1{}));
  }
  DS_CUDA_RETURN_IF_ERROR(launch_pdl_if(pdl, l.topk <= 8 ? combine_kernel<8> : combine_kernel<16>,
                                        dim3(unsigned(T), unsigned(ceil_div(l.dim, 1024))), 256, 0,
                                        stream, ybuf, experts, T, l.dim, l.topk, l.expert_begin,
                                        l.expert_end, l.add_shared, y));
  return ok_status();
}

}  // namespace ds::cuda
