// FP8 block-scaled and BF16 linear layers: the small-M (decode) tensor-core kernel, the cuBLASLt
// prefill path and the helpers around them. See linear_fp8.h for the contract and NOTES.md for the
// floors and measurements.
//
// Small-M kernel layout. A warp owns 16 weight rows (the A operand of mma.sync, rows = output
// features) and up to 8*NT tokens (the B operand, 8 tokens per n-tile). Per 128-K block each lane
// loads 32 contiguous weight bytes of its two rows (rows g and g+8, g = lane/4) at k offset
// (lane%4)*32 and the matching 32 activation codes of its token: the K order inside a block is
// permuted consistently for A and B (any permutation leaves the dot product unchanged), which turns
// the mma fragments into 16-byte loads. The block's partial sums are multiplied by the weight
// scale (and the activation scale) in fp32 and added to the running sums, as REF's fp8_gemm does.
// A CTA of 8 warps = RW row-warps x (8/RW) K-warps; CTAs of one cluster split K further; partials
// are summed through (distributed) shared memory in a fixed order.
#include <cooperative_groups.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/func_attributes.h"
#include "kernels/cuda/common/mbarrier.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/gemm/linear_fp8.h"
#include "kernels/cuda/norm/device_util.cuh"
#include "kernels/cuda/quant/quant_fp8.h"

namespace ds::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct SmallMArgs {
  const uint8_t* w;
  const uint8_t* w_tiled;  // the same codes in the small-M tile order (Fp8WeightView::tiled), or null
  const uint8_t* w_scale;
  const uint8_t* x_codes;
  const uint8_t* x_scales;
  const uint16_t* x_bf16;
  void* y;
  void* y2;          // output rows [n_split, n) (n_split > 0, one group), else unused
  int64_t y2_stride;
  int64_t n_split;   // 0: every row to y
  int64_t n, k;  // per group
  int64_t m;
  int64_t x_stride;        // elements (codes: G*K; bf16: x_row_stride)
  int64_t x_scale_stride;  // G*K/128
  int64_t y_stride;
  int64_t w_scale_stride;  // K/128
  int k_split;             // CTAs per cluster along K
  int y_f32;
  int y_round;             // fp32 output rounded to bf16 values (OutType::kF32Bf16)
  int pdl;                       // launched with programmatic stream serialization
  int stages;                    // kBulk: shared-memory ring slots
  int64_t tiles, groups, items;  // row tiles per group; work items = tiles * groups * chunks
};

// Writes output row r (of group `group`) of token tok: to y at tok * y_stride + group * n + r, or,
// for rows past n_split (a split output: two linears sharing an input), to y2 at
// tok * y2_stride + r - n_split.
__device__ __forceinline__ void store_output(const SmallMArgs& a, int64_t tok, int64_t group,
                                             int64_t r, float sum) {
  void* out = a.y;
  int64_t idx = tok * a.y_stride + group * a.n + r;
  if (a.n_split > 0 && r >= a.n_split) {
    out = a.y2;
    idx = tok * a.y2_stride + (r - a.n_split);
  }
  if (a.y_f32)
    static_cast<float*>(out)[idx] = a.y_round ? ops::round_bf16_exact(sum) : sum;
  else
    static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(sum);
}

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float e8m0_to_float_dev(uint32_t code) {
  if (code == 0) return __uint_as_float(0x00400000u);  // 2^-127
  if (code == 255) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(code << 23);
}

__device__ __forceinline__ void mma_fp8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Two e4m3 codes (low 16 bits of v) to a bf16x2 word (exact: every e4m3 value is a bf16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xFFFFu), __NV_E4M3);
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&b);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One 128-K block of one warp: 16 rows x (8*NT) tokens, accumulated into acc with the block scales.
//   wv[0..1]: row g bytes [32*t4, 32*t4+32) of the block, wv[2..3]: row g+8.
template <bool kFp8Act, int NT>
__device__ __forceinline__ void block_step(const SmallMArgs& a, int64_t kb, const uint4 (&wv)[4],
                                           float w_scale, int64_t tok0, int64_t xcol0,
                                           float (&acc)[NT][4]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t tok_b = tok0 + j * 8 + g;  // the token this lane loads for the B operand
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (kFp8Act) {
      uint4 xv[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (tok_b < a.m) {
        const uint8_t* xp = a.x_codes + tok_b * a.x_stride + xcol0 + kb * 128 + t4 * 32;
        xv[0] = __ldg(reinterpret_cast<const uint4*>(xp));
        xv[1] = __ldg(reinterpret_cast<const uint4*>(xp) + 1);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // mma q covers words 2q, 2q+1 of the lane's 32 bytes
        const int h = q >> 1, i0 = (q & 1) * 2;
        const uint32_t af[4] = {word(wv[h], i0), word(wv[2 + h], i0), word(wv[h], i0 + 1),
                                word(wv[2 + h], i0 + 1)};
        mma_fp8(blk, af, word(xv[h], i0), word(xv[h], i0 + 1));
      }
      // Scales of the two tokens of this lane's accumulator columns.
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t tok = tok0 + j * 8 + t4 * 2 + c;
        float s = 0.f;
        if (tok < a.m) {
          s = w_scale *
              e8m0_to_float_dev(__ldg(a.x_scales + tok * a.x_scale_stride + xcol0 / 128 + kb));
        }
        acc[j][c] = fmaf(blk[c], s, acc[j][c]);
        acc[j][2 + c] = fmaf(blk[2 + c], s, acc[j][2 + c]);
      }
    } else {
      uint4 xv[4] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0),
                     make_uint4(0, 0, 0, 0)};
      if (tok_b < a.m) {
        const uint4* xp = reinterpret_cast<const uint4*>(a.x_bf16 + tok_b * a.x_stride + xcol0 +
                                                         kb * 128 + t4 * 32);
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = __ldg(xp + i);
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {  // mma q covers bf16 words 2q, 2q+1 = weight byte word q
        const int h = q >> 2, i = q & 3;
        const uint32_t w0 = word(wv[h], i), w1 = word(wv[2 + h], i);
        const uint32_t af[4] = {e4m3x2_to_bf16x2(w0), e4m3x2_to_bf16x2(w1),
                                e4m3x2_to_bf16x2(w0 >> 16), e4m3x2_to_bf16x2(w1 >> 16)};
        mma_bf16(blk, af, word(xv[q >> 1], (q & 1) * 2), word(xv[q >> 1], (q & 1) * 2 + 1));
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = fmaf(blk[e], w_scale, acc[j][e]);
    }
  }
}

template <bool kFp8Act, int NT, int RW>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 2 : 1) fp8_small_m_kernel(SmallMArgs a) {
  constexpr int KW = kWarps / RW;
  constexpr int kRows = 16 * RW;
  constexpr int kCols = 8 * NT;
  constexpr int kPad = kCols + 1;
  constexpr int kRing = 4;  // K blocks in flight per warp
  __shared__ float red[KW][kRows][kPad];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int srank = int(blockIdx.x % unsigned(a.k_split));
  const int64_t cluster_id = blockIdx.x / unsigned(a.k_split);
  const int64_t num_clusters = gridDim.x / unsigned(a.k_split);
  cg::cluster_group cluster = cg::this_cluster();

  // This warp's K blocks (the same for every work item).
  const int64_t kblocks = a.k / 128;
  const int64_t parts = int64_t(a.k_split) * KW;
  const int64_t part = int64_t(srank) * KW + kw;
  const int64_t kb_begin = kblocks * part / parts, kb_end = kblocks * (part + 1) / parts;

  // Work items (row tile, group, 8*NT-token chunk), strided over the clusters of the grid (one
  // item per cluster unless the caller capped the grid with max_ctas).
  bool waited = false;
  for (int64_t item = cluster_id; item < a.items; item += num_clusters) {
    const int64_t tile = item % a.tiles;
    const int64_t group = (item / a.tiles) % a.groups;
    const int64_t tok0 = item / (a.tiles * a.groups) * kCols;
    const int64_t row0 = tile * kRows + rw * 16;  // within the group
    const int64_t xcol0 = group * a.k;            // the group's first input column

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    uint4 ring[kRing][4];
    const bool has_rows = row0 < a.n;
    const int64_t grow = group * a.n + row0;  // global weight row of the warp's first row
    const uint8_t* w0 = a.w + (grow + g) * a.k + t4 * 32;
    const uint8_t* w1 = w0 + 8 * a.k;
    auto load = [&](uint4(&v)[4], int64_t kb) {
      const int64_t off = kb * 128;
      v[0] = load_stream(w0 + off);
      v[1] = load_stream(w0 + off + 16);
      v[2] = load_stream(w1 + off);
      v[3] = load_stream(w1 + off + 16);
    };
    if (has_rows) {
#pragma unroll
      for (int u = 0; u < kRing; ++u)
        if (kb_begin + u < kb_end) load(ring[u], kb_begin + u);
    }
    // Weights do not depend on the previous kernel: they are requested before waiting for the
    // producer of x.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (a.pdl && !waited) {
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
      asm volatile("griddepcontrol.wait;" ::: "memory");
    }
#endif
    waited = true;
    if (has_rows) {
      const uint8_t* srow = a.w_scale + (grow / 128) * a.w_scale_stride;
      for (int64_t kb = kb_begin; kb < kb_end; kb += kRing) {
#pragma unroll
        for (int u = 0; u < kRing; ++u) {
          if (kb + u < kb_end) {
            const float ws = e8m0_to_float_dev(__ldg(srow + kb + u));
            block_step<kFp8Act, NT>(a, kb + u, ring[u], ws, tok0, xcol0, acc);
            if (kb + u + kRing < kb_end) load(ring[u], kb + u + kRing);
          }
        }
      }
    }

    // Partials of this warp: rows rw*16 + g (+8), columns j*8 + t4*2 (+1).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      red[kw][rw * 16 + g][j * 8 + t4 * 2] = acc[j][0];
      red[kw][rw * 16 + g][j * 8 + t4 * 2 + 1] = acc[j][1];
      red[kw][rw * 16 + g + 8][j * 8 + t4 * 2] = acc[j][2];
      red[kw][rw * 16 + g + 8][j * 8 + t4 * 2 + 1] = acc[j][3];
    }
    if (a.k_split > 1)
      cluster.sync();
    else
      __syncthreads();

    // Each CTA of the cluster sums a slice of the tile's outputs over all K partials (fixed
    // order) and writes it. Element e: token e / kRows, row e % kRows (consecutive threads,
    // consecutive output features: coalesced stores).
    constexpr int kElems = kRows * kCols;
    const int e_begin = kElems * srank / a.k_split, e_end = kElems * (srank + 1) / a.k_split;
    for (int e = e_begin + int(threadIdx.x); e < e_end; e += kThreads) {
      const int col = e / kRows, row = e % kRows;
      float sum = 0.f;
      for (int s = 0; s < a.k_split; ++s) {
        const float* base =
            a.k_split > 1 ? cluster.map_shared_rank(&red[0][0][0], s) : &red[0][0][0];
#pragma unroll
        for (int w = 0; w < KW; ++w) sum += base[(w * kRows + row) * kPad + col];
      }
      const int64_t tok = tok0 + col, r = tile * kRows + row;
      if (tok < a.m && r < a.n) store_output(a, tok, group, r, sum);
    }
    // Nobody may overwrite `red` (here or, through DSMEM, in the cluster) before all have read it.
    if (a.k_split > 1)
      cluster.sync();
    else
      __syncthreads();
  }
}

// One launch of kernel(a) with the attributes the arguments ask for: a cluster of k_split CTAs
// along K (k_split > 1) and programmatic dependent launch (pdl), and smem_bytes of dynamic shared
// memory (the caller opts the kernel in to more than 48 KB: ensure_max_dynamic_smem).
template <typename Kernel>
cudaError_t launch_small_m_kernel(Kernel kernel, const SmallMArgs& a, dim3 grid, int threads,
                                  cudaStream_t stream, size_t smem_bytes = 0) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (a.k_split > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(a.k_split);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (a.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

template <bool kFp8Act, int NT, int RW>
cudaError_t launch_small_m(const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  return launch_small_m_kernel(fp8_small_m_kernel<kFp8Act, NT, RW>, a, grid, kThreads, stream);
}

template <bool kFp8Act, int NT>
cudaError_t dispatch_rw(int rw, const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  switch (rw) {
    case 1:
      return launch_small_m<kFp8Act, NT, 1>(a, grid, stream);
    case 2:
      return launch_small_m<kFp8Act, NT, 2>(a, grid, stream);
    case 4:
      return launch_small_m<kFp8Act, NT, 4>(a, grid, stream);
    default:
      return launch_small_m<kFp8Act, NT, 8>(a, grid, stream);
  }
}

template <bool kFp8Act>
cudaError_t dispatch_nt(int nt, int rw, const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  switch (nt) {
    case 1:
      return dispatch_rw<kFp8Act, 1>(rw, a, grid, stream);
    case 2:
      return dispatch_rw<kFp8Act, 2>(rw, a, grid, stream);
    case 4:
      return dispatch_rw<kFp8Act, 4>(rw, a, grid, stream);
    default:
      return dispatch_rw<kFp8Act, 8>(rw, a, grid, stream);
  }
}

// The end of a kStream / kBulk work item (one item per CTA, CTA = item * k_split + rank): sum the
// K warps' partials in `red` (all written, not yet synchronized) over the k_split CTAs of the
// item's cluster in a fixed order (rank, then K warp: deterministic), each CTA a slice of the
// tile read through distributed shared memory, and write it; consecutive threads write
// consecutive output features. All threads of the CTA call it.
template <int KW, int kRows, int kCols, int kNumThreads>
__device__ __forceinline__ void reduce_k_partials(const SmallMArgs& a,
                                                  float (&red)[KW][kRows][kCols + 1], int srank,
                                                  int64_t tile, int64_t group, int64_t tok0) {
  constexpr int kPad = kCols + 1;
  constexpr int kElems = kRows * kCols;
  const int ks = a.k_split;
  cg::cluster_group cluster = cg::this_cluster();
  if (ks > 1)
    cluster.sync();
  else
    __syncthreads();
  const int e_begin = kElems * srank / ks, e_end = kElems * (srank + 1) / ks;
  for (int e = e_begin + int(threadIdx.x); e < e_end; e += kNumThreads) {
    const int col = e / kRows, row = e % kRows;
    float sum = 0.f;
    for (int s = 0; s < ks; ++s) {
      const float* base = ks > 1 ? cluster.map_shared_rank(&red[0][0][0], s) : &red[0][0][0];
#pragma unroll
      for (int w = 0; w < KW; ++w) sum += base[(w * kRows + row) * kPad + col];
    }
    const int64_t tok = tok0 + col, r = tile * kRows + row;
    if (tok < a.m && r < a.n) store_output(a, tok, group, r, sum);
  }
  // The CTAs of a cluster read each other's shared memory: none may exit before all have read.
  if (ks > 1) cluster.sync();
}

// ---- kStream: 4-warp CTAs, everything a block needs prefetched in one register ring ----------
//
// Same per-block arithmetic as fp8_small_m_kernel (FP8 mma.sync on the raw codes, block partials x
// weight scale x activation scale into fp32 sums), with three differences (NOTES.md, v4):
//  - the 16-byte weight loads of a warp cover whole 32-byte sectors: lane (g, t4) reads bytes
//    [16*t4, 16*t4 + 16) and [64 + 16*t4, 80 + 16*t4) of rows g and g+8 of each 128-K block, so
//    one warp instruction reads 64 contiguous bytes of 8 rows;
//  - the weight scale of a block is loaded with its weights (R = 4 blocks ahead) and its
//    activation fragments and scales 2 blocks ahead (L2 hits), so no load sits on the critical
//    path;
//  - small CTAs (4 warps, <= 128 registers for NT = 1) and one work item each: several CTAs per
//    SM, the block scheduler balances the SMs, and under programmatic dependent launch the next
//    kernel's CTAs become resident early and request their weights while this one drains.

constexpr int kStreamWarps = 4;
constexpr int kStreamThreads = kStreamWarps * 32;

template <int NT>
struct StreamTraits {
  static constexpr int kRing = 4;   // weight blocks in flight per warp (a multiple of kXRing)
  static constexpr int kXRing = 2;  // activation blocks in flight (L2 hits: a shorter distance)
  static constexpr int kMinBlocks = NT == 1 ? 4 : 2;  // <= 128 / <= 255 registers
};

template <int NT, int RW>
__global__ void __launch_bounds__(kStreamThreads, StreamTraits<NT>::kMinBlocks)
    fp8_stream_kernel(SmallMArgs a) {
  constexpr int KW = kStreamWarps / RW;
  constexpr int kRows = 16 * RW;
  constexpr int kCols = 8 * NT;
  constexpr int kPad = kCols + 1;
  constexpr int R = StreamTraits<NT>::kRing;
  constexpr int XR = StreamTraits<NT>::kXRing;
  static_assert(R % XR == 0, "the activation slot of ring slot u must be u % XR");
  __shared__ float red[KW][kRows][kPad];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int rw = warp % RW, kw = warp / RW;
  const int ks = a.k_split;
  const int srank = int(blockIdx.x % unsigned(ks));
  const int64_t item = blockIdx.x / unsigned(ks);
  const int64_t tile = item % a.tiles;
  const int64_t group = (item / a.tiles) % a.groups;
  const int64_t tok0 = item / (a.tiles * a.groups) * kCols;
  const int64_t row0 = tile * kRows + rw * 16;  // within the group
  const int64_t xcol0 = group * a.k;            // the group's first input column

  const int kblocks = int(a.k / 128);
  const int parts = ks * KW;
  const int part = srank * KW + kw;
  const int kb_begin = kblocks * part / parts, kb_end = kblocks * (part + 1) / parts;
  const bool has_rows = row0 < a.n;  // N % 16 == 0: a warp has all 16 rows or none
  const int64_t grow = group * a.n + row0;
  // The four 16-byte loads of a block: row-major, lane (g, t4) reads rows g and g+8 at +0 and +64;
  // in the tile order (a.w_tiled) the block's 2 KB are contiguous and load i is 512 bytes of it.
  const bool tiled = a.w_tiled != nullptr;
  const uint8_t* wp = tiled ? a.w_tiled + (grow / 16) * kblocks * 2048 + lane * 16
                            : a.w + (grow + g) * a.k + t4 * 16;
  const int wblk = tiled ? 2048 : 128;
  const int64_t wd2 = tiled ? 1024 : 8 * a.k;
  const int wd1 = tiled ? 512 : 64;
  const uint8_t* wsrow = a.w_scale + (grow / 128) * a.w_scale_stride;
  // This lane's activation rows (B operand: token 8j + g) and scale rows (tokens 8j + 2*t4 + c).
  const uint8_t* xrow[NT];
  const uint8_t* xsrow[NT];
  bool xok[NT], xsok[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t tb = tok0 + j * 8 + g, ts = tok0 + j * 8 + t4 * 2;
    xok[j] = tb < a.m;
    xsok[j][0] = ts < a.m;
    xsok[j][1] = ts + 1 < a.m;
    xrow[j] = a.x_codes + (xok[j] ? tb : 0) * a.x_stride + xcol0 + t4 * 16;
    xsrow[j] = a.x_scales + (xsok[j][0] ? ts : 0) * a.x_scale_stride + xcol0 / 128;
  }

  uint4 wr[R][4];        // weights: row g (+0, +64), row g+8 (+0, +64)
  uint32_t wsr[R];       // weight scale byte
  uint4 xr[XR][NT][2];   // activation codes of token tok0 + 8j + g (+0, +64)
  uint32_t xsr[XR][NT];  // activation scale bytes of tokens tok0 + 8j + 2*t4 (+1) (bits 0-7, 8-15)
  auto load_w = [&](uint4(&v)[4], uint32_t& s, int kb) {
    const uint8_t* p0 = wp + int64_t(kb) * wblk;
    v[0] = load_stream(p0);
    v[1] = load_stream(p0 + wd1);
    v[2] = load_stream(p0 + wd2);
    v[3] = load_stream(p0 + wd2 + wd1);
    s = __ldg(wsrow + kb);
  };
  auto load_x = [&](uint4(&v)[NT][2], uint32_t(&s)[NT], int kb) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      v[j][0] = v[j][1] = make_uint4(0, 0, 0, 0);
      if (xok[j]) {
        v[j][0] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + kb * 128));
        v[j][1] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + kb * 128 + 64));
      }
      uint32_t sv = 0;  // missing tokens: code 0 (2^-127) times a zero partial
      if (xsok[j][0]) sv = __ldg(xsrow[j] + kb);
      if (xsok[j][1]) sv |= uint32_t(__ldg(xsrow[j] + a.x_scale_stride + kb)) << 8;
      s[j] = sv;
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // Weights and their scales do not depend on the previous kernel: requested before waiting.
  if (has_rows) {
#pragma unroll
    for (int u = 0; u < R; ++u)
      if (kb_begin + u < kb_end) load_w(wr[u], wsr[u], kb_begin + u);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
#endif
  if (has_rows) {
#pragma unroll
    for (int u = 0; u < XR; ++u)
      if (kb_begin + u < kb_end) load_x(xr[u], xsr[u], kb_begin + u);
    for (int kb = kb_begin; kb < kb_end; kb += R) {
#pragma unroll
      for (int u = 0; u < R; ++u) {
        if (kb + u < kb_end) {
          const int xu = u % XR;  // (kb - kb_begin) % R == 0 and R % XR == 0
          const float ws = e8m0_to_float_dev(wsr[u]);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // mma q: chunk h = q / 2, words i0, i0 + 1
              const int h = q >> 1, i0 = (q & 1) * 2;
              const uint32_t af[4] = {word(wr[u][h], i0), word(wr[u][2 + h], i0),
                                      word(wr[u][h], i0 + 1), word(wr[u][2 + h], i0 + 1)};
              mma_fp8(blk, af, word(xr[xu][j][h], i0), word(xr[xu][j][h], i0 + 1));
            }
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float s = ws * e8m0_to_float_dev((xsr[xu][j] >> (8 * c)) & 0xFFu);
              acc[j][c] = fmaf(blk[c], s, acc[j][c]);
              acc[j][2 + c] = fmaf(blk[2 + c], s, acc[j][2 + c]);
            }
          }
          if (kb + u + R < kb_end) load_w(wr[u], wsr[u], kb + u + R);
          if (kb + u + XR < kb_end) load_x(xr[xu], xsr[xu], kb + u + XR);
        }
      }
    }
  }

  // Partials of this warp: rows rw*16 + g (+8), columns j*8 + t4*2 (+1).
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[kw][rw * 16 + g][j * 8 + t4 * 2] = acc[j][0];
    red[kw][rw * 16 + g][j * 8 + t4 * 2 + 1] = acc[j][1];
    red[kw][rw * 16 + g + 8][j * 8 + t4 * 2] = acc[j][2];
    red[kw][rw * 16 + g + 8][j * 8 + t4 * 2 + 1] = acc[j][3];
  }
  reduce_k_partials<KW, kRows, kCols, kStreamThreads>(a, red, srank, tile, group, tok0);
}

template <int NT, int RW>
cudaError_t launch_stream(const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  return launch_small_m_kernel(fp8_stream_kernel<NT, RW>, a, grid, kStreamThreads, stream);
}

template <int NT>
cudaError_t dispatch_stream_rw(int rw, const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  switch (rw) {
    case 1:
      return launch_stream<NT, 1>(a, grid, stream);
    case 2:
      return launch_stream<NT, 2>(a, grid, stream);
    default:
      return launch_stream<NT, 4>(a, grid, stream);
  }
}

// ---- kBulk: the weight stream as TMA bulk copies into a shared-memory ring (sm_90+) ---------
//
// The same per-block arithmetic and work decomposition as fp8_stream_kernel, but the weights do
// not pass through a per-warp register ring: a producer warp copies, per stage, KW consecutive K
// blocks of each of the CTA's 16*RW rows (one contiguous KW*128-byte piece per row) with
// cp.async.bulk into one of `stages` shared-memory slots and signals an mbarrier (complete_tx);
// the 4 consumer warps (RW row-warps x KW K-warps, warp kw takes block kw of each stage) read
// their mma fragments from shared memory, release the slot (a second mbarrier) and run the mma.
// Why (NOTES.md, v5): bytes in flight no longer cost registers (stages x 8-12 KB per CTA), the
// memory system sees few large contiguous requests instead of 64-byte pieces of 8 rows, and
// under programmatic dependent launch the producer of the next kernel starts its copies as soon
// as its CTA is resident, without waiting for the previous kernel.
// Shared rows are padded by 64 bytes so that rows g and g+1 (one 8-lane phase of a 16-byte
// ld.shared) fall on different banks.

constexpr int kBulkConsumerWarps = 4;
// KP K partitions per CTA (1 or 2; NOTES.md, session 13): each has its own producer warp, ring
// and 4 consumer warps, and takes the K range a cluster rank of k_split * KP would; the partials
// of all partitions are summed in the CTA (so KP = 2, k_split = 1 gives the bits of KP = 1,
// k_split = 2 without a cluster).
__host__ __device__ constexpr int bulk_threads(int kp) {
  return (kBulkConsumerWarps + 1) * kp * 32;
}
constexpr int kBulkRowPad = 64;
constexpr int kBulkMaxStages = 8;

__host__ __device__ constexpr int bulk_row_bytes(int rw) {
  return (kBulkConsumerWarps / rw) * 128 + kBulkRowPad;
}
__host__ __device__ constexpr int bulk_stage_bytes(int rw) {
  return 16 * rw * bulk_row_bytes(rw);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int NT, int RW, int KP>
__global__ void __launch_bounds__(bulk_threads(KP), (NT == 1 ? 4 : 3) / KP)
    fp8_bulk_kernel(SmallMArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int KW = kBulkConsumerWarps / RW;
  constexpr int kThreadsBulk = bulk_threads(KP);
  constexpr int kConsumers = kBulkConsumerWarps * KP;
  constexpr int kRows = 16 * RW;
  constexpr int kCols = 8 * NT;
  constexpr int kPad = kCols + 1;
  constexpr int kRowBytes = bulk_row_bytes(RW);
  constexpr int kStageBytes = bulk_stage_bytes(RW);
  constexpr int XR = 2;  // activation blocks in flight per consumer warp (L2 hits)
  __shared__ float red[KP * KW][kRows][kPad];
  __shared__ __align__(8) uint64_t full_bars[KP][kBulkMaxStages], empty_bars[KP][kBulkMaxStages];
  extern __shared__ __align__(128) uint8_t rings[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This warp's K partition: consumers 4p .. 4p+3, producer kConsumers + p.
  const int part = warp < kConsumers ? warp / kBulkConsumerWarps : warp - kConsumers;
  uint64_t* const full_bar = full_bars[part];
  uint64_t* const empty_bar = empty_bars[part];
  const int g = lane >> 2, t4 = lane & 3;
  const int S = a.stages;
  const int ks = a.k_split;
  const int srank = int(blockIdx.x % unsigned(ks));
  const int64_t item = blockIdx.x / unsigned(ks);
  const int64_t tile = item % a.tiles;
  const int64_t group = (item / a.tiles) % a.groups;
  const int64_t tok0 = item / (a.tiles * a.groups) * kCols;
  const int64_t xcol0 = group * a.k;
  const int kblocks = int(a.k / 128);
  const int vrank = srank * KP + part, parts = ks * KP;
  const int kb_begin = kblocks * vrank / parts, kb_end = kblocks * (vrank + 1) / parts;
  const int nst = (kb_end - kb_begin + KW - 1) / KW;  // stages of this partition
  uint8_t* const ring = rings + size_t(part) * size_t(a.stages) * kStageBytes;
  const int rows_valid = int(std::min<int64_t>(kRows, a.n - tile * kRows));  // N % 16 == 0
  const bool tiled = a.w_tiled != nullptr;
  static_assert(kBulkConsumerWarps * 2048 <= bulk_stage_bytes(RW), "a tiled stage fits the slot");

  if (threadIdx.x == 0) {
    for (int q = 0; q < KP; ++q)
      for (int s = 0; s < S; ++s) {
        mbar_init(smem_addr(&full_bars[q][s]), 1);
        mbar_init(smem_addr(&empty_bars[q][s]), kBulkConsumerWarps);
      }
    // Make the initialized barriers visible to the async (bulk copy) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  if (warp >= kConsumers) {
    // Producer: weights only (independent of the previous kernel): copies start before the wait.
    const uint8_t* wbase = a.w + (group * a.n + tile * kRows) * a.k;
    const uint8_t* wtiles =
        tiled ? a.w_tiled + (group * a.n + tile * kRows) / 16 * kblocks * 2048 : nullptr;
    for (int j = 0; j < nst; ++j) {
      const int s = j % S;
      if (j >= S) mbar_wait(smem_addr(&empty_bar[s]), uint32_t((j / S - 1) & 1));
      const int kb0 = kb_begin + j * KW;
      const uint32_t bytes = uint32_t(std::min(KW, kb_end - kb0) * 128);
      const uint32_t fb = smem_addr(&full_bar[s]);
      if (lane == 0)
        asm volatile(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(fb),
            "r"(bytes * uint32_t(rows_valid))
            : "memory");
      __syncwarp();
      const uint32_t dst0 = smem_addr(ring + size_t(s) * kStageBytes);
      if (tiled) {
        // One copy per 16-row tile: its blocks kb0.. are contiguous (2 KB each), slot layout
        // [row warp][K warp][2 KB].
        for (int r = lane; r < rows_valid / 16; r += 32) {
          const uint8_t* src = wtiles + (int64_t(r) * kblocks + kb0) * 2048;
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
              "[%3];" ::"r"(dst0 + uint32_t(r * KW * 2048)),
              "l"(src), "r"(bytes * 16), "r"(fb)
              : "memory");
        }
      } else {
        for (int r = lane; r < rows_valid; r += 32) {
          const uint8_t* src = wbase + int64_t(r) * a.k + int64_t(kb0) * 128;
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
              "[%3];" ::"r"(dst0 + uint32_t(r * kRowBytes)),
              "l"(src), "r"(bytes), "r"(fb)
              : "memory");
        }
      }
    }
    // The epilogue below writes y: ordered after the previous kernel like the consumers.
    if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  } else {
    const int cw = warp % kBulkConsumerWarps;
    const int rw = cw % RW, kw = cw / RW;
    const bool has_rows = rw * 16 < rows_valid;
    if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    const uint8_t* wsrow = a.w_scale + ((group * a.n + tile * kRows + rw * 16) / 128) *
                                           a.w_scale_stride;
    const uint8_t* xrow[NT];
    const uint8_t* xsrow[NT];
    bool xok[NT], xsok[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int64_t tb = tok0 + j * 8 + g, ts = tok0 + j * 8 + t4 * 2;
      xok[j] = tb < a.m;
      xsok[j][0] = ts < a.m;
      xsok[j][1] = ts + 1 < a.m;
      xrow[j] = a.x_codes + (xok[j] ? tb : 0) * a.x_stride + xcol0 + t4 * 16;
      xsrow[j] = a.x_scales + (xsok[j][0] ? ts : 0) * a.x_scale_stride + xcol0 / 128;
    }
    uint4 xr[XR][NT][2];
    uint32_t xsr[XR][NT];
    uint32_t wsr[XR];
    // Block of stage j for this warp (valid when < kb_end).
    auto load_x = [&](uint4(&v)[NT][2], uint32_t(&sc)[NT], uint32_t& ws, int kb) {
      ws = has_rows ? __ldg(wsrow + kb) : 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        v[j][0] = v[j][1] = make_uint4(0, 0, 0, 0);
        if (xok[j]) {
          v[j][0] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + kb * 128));
          v[j][1] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + kb * 128 + 64));
        }
        uint32_t sv = 0;
        if (xsok[j][0]) sv = __ldg(xsrow[j] + kb);
        if (xsok[j][1]) sv |= uint32_t(__ldg(xsrow[j] + a.x_scale_stride + kb)) << 8;
        sc[j] = sv;
      }
    };
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int u = 0; u < XR; ++u) {
      const int kb = kb_begin + u * KW + kw;
      if (u < nst && kb < kb_end) load_x(xr[u], xsr[u], wsr[u], kb);
    }
    const int roff =
        tiled ? (rw * KW + kw) * 2048 + lane * 16 : (rw * 16 + g) * kRowBytes + kw * 128 + t4 * 16;
    const int rd1 = tiled ? 512 : 64, rd2 = tiled ? 1024 : 8 * kRowBytes;
    for (int j0 = 0; j0 < nst; j0 += XR) {
#pragma unroll
      for (int u = 0; u < XR; ++u) {
        const int j = j0 + u;
        if (j < nst) {
          const int s = j % S;
          const int kb = kb_begin + j * KW + kw;
          const bool mine = has_rows && kb < kb_end;
          mbar_wait(smem_addr(&full_bar[s]), uint32_t((j / S) & 1));
          uint4 wv[4];
          if (mine) {
            const uint8_t* p = ring + size_t(s) * kStageBytes + roff;
            wv[0] = *reinterpret_cast<const uint4*>(p);
            wv[1] = *reinterpret_cast<const uint4*>(p + rd1);
            wv[2] = *reinterpret_cast<const uint4*>(p + rd2);
            wv[3] = *reinterpret_cast<const uint4*>(p + rd2 + rd1);
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(smem_addr(&empty_bar[s]));
          if (mine) {
            const float ws = e8m0_to_float_dev(wsr[u]);
#pragma unroll
            for (int jt = 0; jt < NT; ++jt) {
              float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const int h = q >> 1, i0 = (q & 1) * 2;
                const uint32_t af[4] = {word(wv[h], i0), word(wv[2 + h], i0),
                                        word(wv[h], i0 + 1), word(wv[2 + h], i0 + 1)};
                mma_fp8(blk, af, word(xr[u][jt][h], i0), word(xr[u][jt][h], i0 + 1));
              }
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const float sc = ws * e8m0_to_float_dev((xsr[u][jt] >> (8 * c)) & 0xFFu);
                acc[jt][c] = fmaf(blk[c], sc, acc[jt][c]);
                acc[jt][2 + c] = fmaf(blk[2 + c], sc, acc[jt][2 + c]);
              }
            }
          }
          const int kbn = kb + XR * KW;
          if (j + XR < nst && kbn < kb_end) load_x(xr[u], xsr[u], wsr[u], kbn);
        }
      }
    }
    const int rk = part * KW + kw;  // partition-major: the order of the ranks of k_split * KP
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      red[rk][rw * 16 + g][j * 8 + t4 * 2] = acc[j][0];
      red[rk][rw * 16 + g][j * 8 + t4 * 2 + 1] = acc[j][1];
      red[rk][rw * 16 + g + 8][j * 8 + t4 * 2] = acc[j][2];
      red[rk][rw * 16 + g + 8][j * 8 + t4 * 2 + 1] = acc[j][3];
    }
  }

  reduce_k_partials<KP * KW, kRows, kCols, kThreadsBulk>(a, red, srank, tile, group, tok0);
#else
  __trap();
#endif
}

template <int NT, int RW, int KP>
cudaError_t launch_bulk(const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  auto kernel = fp8_bulk_kernel<NT, RW, KP>;
  const size_t smem = size_t(KP) * size_t(a.stages) * bulk_stage_bytes(RW);
  // The ring plus the kernel's static shared memory may exceed the default 48 KB (rw 4 with 4
  // slots is 48 KB of ring alone: refused with cudaErrorInvalidValue until session 10, when the
  // attribute was set only for rings above 48 KB): opt in for every ring size, once per device.
  if (const cudaError_t e = ensure_max_dynamic_smem(kernel, int(smem)); e != cudaSuccess) return e;
  return launch_small_m_kernel(kernel, a, grid, bulk_threads(KP), stream, smem);
}

template <int NT, int KP>
cudaError_t dispatch_bulk_rw(int rw, const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  switch (rw) {
    case 1:
      return launch_bulk<NT, 1, KP>(a, grid, stream);
    case 2:
      return launch_bulk<NT, 2, KP>(a, grid, stream);
    default:
      return launch_bulk<NT, 4, KP>(a, grid, stream);
  }
}

// ---- kWgmma: FP8 wgmma from a cp.async ring (sm_90a), up to 64 tokens in one pass -----------
//
// Why (NOTES.md, session 27): at 9..64 tokens kStream re-reads every weight once per 16-token
// chunk and cuBLASLt's block-scaled GEMM reaches 43-60% of copy bandwidth, so the decode batches
// of the 33 MB projections ran at 16-60%. Here each weight byte crosses HBM once for all tokens:
//  - CTA = WG warpgroups x 64 weight rows (wgmma M) x all tokens (wgmma N = NB, the token count
//    rounded up to 8, 16, 32 or 64) x the K range of its cluster rank (clusters of k_split CTAs
//    split K, partials summed through distributed shared memory in rank order).
//  - Every thread copies its fixed 16-byte pieces of each 128-K stage (64 x WG weight rows and NB
//    activation rows of 128 bytes, 128-byte swizzle) with cp.async into a ring of S stages, S - 1
//    in flight; rows past N and tokens past M are zero-filled.
//  - Per stage each warpgroup runs 4 wgmma m64nNBk32 e4m3 into a fresh block accumulator (the
//    tensor core sums one 128-K block, as REF's fp8_gemm on Hopper does) and adds it to the fp32
//    running sums times weight scale x activation scale of the block (both from shared memory,
//    loaded once per CTA).
// The ring slot consumed in iteration i is refilled in iteration i + 1, after the CTA barrier
// that follows every warpgroup's wgmma wait of iteration i.
constexpr int kWgRows = 64;         // weight rows per warpgroup (wgmma M)
constexpr int kWgMaxKBlocks = 64;   // 128-K blocks per CTA whose scales shared memory holds

// A stage: the e4m3 weight rows, then the activation rows (e4m3, or bf16 as two [nb][64] halves
// of K).
__host__ __device__ constexpr int wg_stage_bytes(int nb, int wgs, bool bf16) {
  return (kWgRows * wgs + (bf16 ? 2 : 1) * nb) * 128;
}
// Ring; with bf16 activations the bf16 copy of each warpgroup's weight rows ([2][64][64] per
// warpgroup); then the block scales as fp32: weights [2][kWgMaxKBlocks], activations [kb][nb]
// for the kb_max = ceil(K blocks / k_split) K blocks of a cluster rank (e4m3 only).
__host__ __device__ constexpr int wg_smem_bytes(int nb, int wgs, int stages, int kb_max,
                                                bool bf16) {
  return 1024 + stages * wg_stage_bytes(nb, wgs, bf16) + (bf16 ? wgs * 2 * kWgRows * 128 : 0) +
         (2 * kWgMaxKBlocks + (bf16 ? 0 : kb_max * nb)) * 4;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_GEMM_WGMMA_PATH 1
#else
#define DS_GEMM_WGMMA_PATH 0
#endif

#if DS_GEMM_WGMMA_PATH
// D[64 x NB] (+)= A[64 x K] * B[K x NB] from shared memory (K-major, 128-byte swizzle), fp32
// accumulators (scale_d 0: D = A * B): e4m3 with K = 32, or bf16 with K = 16 (kBf16).
#define DS_WG_R4 "{%0, %1, %2, %3}"
#define DS_WG_R8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define DS_WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DS_WG_R32                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DS_WG_D4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define DS_WG_D8 DS_WG_D4, "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define DS_WG_D16                                                                             \
  DS_WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),       \
      "+f"(d[14]), "+f"(d[15])
#define DS_WG_D32                                                                              \
  DS_WG_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),     \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
// One specialization per (N, input type): operands N / 2 and N / 2 + 1 are the descriptors,
// N / 2 + 2 the scale_d predicate (A, B, P).
#define DS_WG_MMA(N, BF16, SHAPE, TAIL, A, B, P, REGS, DREGS)                                 \
  template <>                                                                                \
  __device__ __forceinline__ void wgmma_ss<N, BF16>(float(&d)[N / 2], uint64_t da, uint64_t db, \
                                                    int scale_d) {                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\nwgmma.mma_async.sync.aligned." \
                 SHAPE " " REGS ", %" A ", %" B ", p, 1, 1" TAIL ";\n}\n"                    \
                 : DREGS                                                                     \
                 : "l"(da), "l"(db), "r"(scale_d));                                          \
  }
template <int N, bool kBf16>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d);
DS_WG_MMA(8, false, "m64n8k32.f32.e4m3.e4m3", "", "4", "5", "6", DS_WG_R4, DS_WG_D4)
DS_WG_MMA(16, false, "m64n16k32.f32.e4m3.e4m3", "", "8", "9", "10", DS_WG_R8, DS_WG_D8)
DS_WG_MMA(32, false, "m64n32k32.f32.e4m3.e4m3", "", "16", "17", "18", DS_WG_R16, DS_WG_D16)
DS_WG_MMA(64, false, "m64n64k32.f32.e4m3.e4m3", "", "32", "33", "34", DS_WG_R32, DS_WG_D32)
DS_WG_MMA(8, true, "m64n8k16.f32.bf16.bf16", ", 0, 0", "4", "5", "6", DS_WG_R4, DS_WG_D4)
DS_WG_MMA(16, true, "m64n16k16.f32.bf16.bf16", ", 0, 0", "8", "9", "10", DS_WG_R8, DS_WG_D8)
DS_WG_MMA(32, true, "m64n32k16.f32.bf16.bf16", ", 0, 0", "16", "17", "18", DS_WG_R16, DS_WG_D16)
DS_WG_MMA(64, true, "m64n64k16.f32.bf16.bf16", ", 0, 0", "32", "33", "34", DS_WG_R32, DS_WG_D32)
#undef DS_WG_MMA
#undef DS_WG_R4
#undef DS_WG_R8
#undef DS_WG_R16
#undef DS_WG_R32
#undef DS_WG_D4
#undef DS_WG_D8
#undef DS_WG_D16
#undef DS_WG_D32
// 16 bytes global -> shared, cached in L2 only; src_bytes 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
#endif  // DS_GEMM_WGMMA_PATH

template <int NB, int WG, int S, bool kBf16>
__global__ void __launch_bounds__(128 * WG, WG == 2 ? 2 : 3) fp8_wgmma_kernel(SmallMArgs a) {
#if DS_GEMM_WGMMA_PATH
  constexpr int kThr = 128 * WG;
  constexpr int kAhead = S - 1;  // stages in flight
  constexpr int kRowsCta = kWgRows * WG;
  constexpr int kStage = wg_stage_bytes(NB, WG, kBf16);
  constexpr int kXChunks = kBf16 ? 16 : 8;                     // 16-byte pieces per token row
  constexpr int kWPieces = kRowsCta * 8 / kThr;                // = 4: weight pieces per thread
  constexpr int kXPieces = (NB * kXChunks + kThr - 1) / kThr;  // activation pieces per thread
  static_assert(kRowsCta * 8 % kThr == 0, "weight pieces divide evenly");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  // bf16 activations: each warpgroup's weight rows of the current stage in bf16 ([2][64][64]).
  uint8_t* wb16 = smem + S * kStage;
  // The block scales as fp32 (decoded once per CTA: the promotion of a stage is then one LDS.64,
  // two FMUL and four FFMA per token pair of a thread).
  float* ws_s = reinterpret_cast<float*>(wb16 + (kBf16 ? WG * 2 * kWgRows * 128 : 0));
  float* xs_s = ws_s + 2 * kWgMaxKBlocks;  // [kb][NB] activation scales (e4m3 only)
  const uint32_t ring = smem_addr(smem);

  const int tid = threadIdx.x;
  const int wg = tid >> 7, wt = tid & 127, w4 = wt >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int ks = a.k_split;
  const int srank = int(blockIdx.x % unsigned(ks));
  const int64_t item = blockIdx.x / unsigned(ks);
  const int64_t tile = item % a.tiles, group = item / a.tiles;
  const int64_t row0 = tile * kRowsCta;  // within the group
  const int kblocks = int(a.k / 128);
  const int kb_begin = kblocks * srank / ks, kb_end = kblocks * (srank + 1) / ks;
  const int nkb = kb_end - kb_begin;

  // This thread's pieces: weight piece p = tid + kThr * u is row p / 8, 16-byte chunk p % 8;
  // activation piece p (< NB * kXChunks) is token p / kXChunks, chunk p % kXChunks (bf16: chunks
  // 8 .. 15 are the second K half, stored as its own [NB][128 bytes] tile). Sources at K block
  // kb_begin.
  const uint8_t* wsrc[kWPieces];
  uint32_t wdst[kWPieces];
  int wbytes[kWPieces];
#pragma unroll
  for (int u = 0; u < kWPieces; ++u) {
    const int p = tid + kThr * u, r = p >> 3, c = p & 7;
    const bool ok = row0 + r < a.n;
    wsrc[u] = a.w + ((group * a.n + (ok ? row0 + r : 0)) * a.k + int64_t(kb_begin) * 128 + c * 16);
    wdst[u] = uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
    wbytes[u] = ok ? 16 : 0;
  }
  const uint8_t* xsrc[kXPieces];
  uint32_t xdst[kXPieces];
  int xbytes[kXPieces];
  constexpr int kEsz = kBf16 ? 2 : 1;  // activation element bytes
  const uint8_t* xbase =
      kBf16 ? reinterpret_cast<const uint8_t*>(a.x_bf16) : static_cast<const uint8_t*>(a.x_codes);
#pragma unroll
  for (int u = 0; u < kXPieces; ++u) {
    const int p = tid + kThr * u, t = p / kXChunks, c16 = p % kXChunks, c = c16 & 7;
    const bool ok = p < NB * kXChunks && t < a.m;
    xsrc[u] = xbase + ((ok ? t : 0) * a.x_stride + group * a.k + int64_t(kb_begin) * 128) * kEsz +
              c16 * 16;
    xdst[u] = uint32_t(kRowsCta * 128 + (c16 >> 3) * NB * 128 + t * 128 + ((c ^ (t & 7)) << 4));
    xbytes[u] = ok ? 16 : (p < NB * kXChunks ? 0 : -1);  // -1: no piece
  }
  auto issue_w = [&](int i) {  // weights of stage i (K block kb_begin + i) into slot i % S
    const uint32_t base = ring + uint32_t((i % S) * kStage);
#pragma unroll
    for (int u = 0; u < kWPieces; ++u)
      cp_async16_zfill(base + wdst[u], wsrc[u] + int64_t(i) * 128, wbytes[u]);
  };
  auto issue_x = [&](int i) {
    const uint32_t base = ring + uint32_t((i % S) * kStage);
#pragma unroll
    for (int u = 0; u < kXPieces; ++u)
      if (xbytes[u] >= 0)
        cp_async16_zfill(base + xdst[u], xsrc[u] + int64_t(i) * 128 * kEsz, xbytes[u]);
  };

  // Weights and their scales do not depend on the previous kernel: requested before waiting.
  // The scale loads are issued 4 at a time per thread (independent loads, one latency).
#pragma unroll
  for (int i = 0; i < kAhead; ++i)
    if (i < nkb) issue_w(i);
  for (int e0 = tid; e0 < WG * nkb; e0 += 4 * kThr) {
    uint32_t v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int e = e0 + u * kThr;
      const int64_t r = group * a.n + row0 + int64_t(e / nkb) * kWgRows;  // the warpgroup's rows
      v[u] = e < WG * nkb && r < (group + 1) * a.n
                 ? a.w_scale[(r / 128) * a.w_scale_stride + kb_begin + e % nkb]
                 : 127u;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (e0 + u * kThr < WG * nkb) ws_s[e0 + u * kThr] = e8m0_to_float_dev(v[u]);
  }
  if (a.pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  for (int e0 = tid; !kBf16 && e0 < NB * nkb; e0 += 4 * kThr) {
    uint32_t v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int e = e0 + u * kThr, t = e % NB, kb = e / NB;
      v[u] = e < NB * nkb && t < a.m
                 ? a.x_scales[t * a.x_scale_stride + group * (a.k / 128) + kb_begin + kb]
                 : 127u;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (e0 + u * kThr < NB * nkb) xs_s[e0 + u * kThr] = e8m0_to_float_dev(v[u]);
  }
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < nkb) issue_x(i);
    cp_async_commit_group();  // group i: stage i (and, for i = 0, the weights issued above)
  }

  float acc[NB / 2];
#pragma unroll
  for (int j = 0; j < NB / 2; ++j) acc[j] = 0.f;
  const uint64_t desc_w = wgmma::desc(ring + uint32_t(wg * kWgRows * 128));
  const uint64_t desc_x = wgmma::desc(ring + uint32_t(kRowsCta * 128));
  // acc += block accumulator b of stage i x weight scale (x activation scale: e4m3).
  auto promote = [&](float(&b)[NB / 2], int i) {
#pragma unroll
    for (int j = 0; j < NB / 2; ++j) wgmma::fence_operand(b[j]);
    const float ws = ws_s[wg * nkb + i];
    const float* xsk = xs_s + i * NB + 2 * t4;
#pragma unroll
    for (int j = 0; j < NB / 8; ++j) {
      const float2 xs = kBf16 ? make_float2(1.f, 1.f)
                              : *reinterpret_cast<const float2*>(xsk + 8 * j);
      const float s0 = ws * xs.x, s1 = ws * xs.y;
      acc[4 * j] = fmaf(b[4 * j], s0, acc[4 * j]);
      acc[4 * j + 1] = fmaf(b[4 * j + 1], s1, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(b[4 * j + 2], s0, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(b[4 * j + 3], s1, acc[4 * j + 3]);
    }
  };
  // bf16 activations: the warpgroup's 64 weight rows of ring slot `slot` to bf16 (exact), into
  // its [2][64][64] tile (K halves, 128-byte swizzle); thread wt converts 4 pieces of 16 codes.
  uint8_t* wb = wb16 + wg * 2 * kWgRows * 128;
  auto to_bf16 = [&](int slot) {
    const uint8_t* src = smem + slot * kStage + wg * kWgRows * 128;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int p = wt + 128 * u, r = p >> 3, c = p & 7;
      const uint4 v = *reinterpret_cast<const uint4*>(src + r * 128 + ((c ^ (r & 7)) << 4));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint4 o[2];
      uint32_t* ow = reinterpret_cast<uint32_t*>(o);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        ow[2 * q] = e4m3x2_to_bf16x2(w[q]);
        ow[2 * q + 1] = e4m3x2_to_bf16x2(w[q] >> 16);
      }
      // K 16c .. 16c + 15 = bf16 chunks 2 (c % 4) and + 1 of K half c / 4.
      uint8_t* dst = wb + (c >> 2) * kWgRows * 128 + r * 128;
      const int c0 = 2 * (c & 3);
      *reinterpret_cast<uint4*>(dst + ((c0 ^ (r & 7)) << 4)) = o[0];
      *reinterpret_cast<uint4*>(dst + (((c0 + 1) ^ (r & 7)) << 4)) = o[1];
    }
    wgmma::fence_proxy_async();
    wgmma::warpgroup_bar(wg);
  };
  const uint64_t desc_wb = wgmma::desc(smem_addr(wb));
  // Stage i: wait for its pieces, refill the slot that stage i - 1 read (its wgmma were waited
  // for before the barrier), run its wgmma (4 x k32 e4m3, or the bf16 copy of the weights and
  // 8 x k16 bf16) into a fresh block accumulator (the first with scale_d 0), wait for them and
  // promote. (Waiting one stage later, with one stage fewer in flight, measured 1-5% slower:
  // NOTES.md, session 27.)
  for (int i = 0; i < nkb; ++i) {
    cp_async_wait_group<kAhead - 1>();  // this thread's pieces of stage i have landed
    wgmma::fence_proxy_async();
    __syncthreads();  // ... and every thread's; the slot of stage i + kAhead is free
    if (i + kAhead < nkb) {
      issue_w(i + kAhead);
      issue_x(i + kAhead);
    }
    cp_async_commit_group();
    const uint64_t so = uint64_t(((i % S) * kStage) >> 4);
    float blk[NB / 2];
    if constexpr (kBf16) {
      to_bf16(i % S);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {  // K half kk / 4, k16 step kk % 4 (32 bytes)
        const uint64_t step = uint64_t(2 * (kk & 3));
        wgmma_ss<NB, true>(blk, desc_wb + uint64_t((kk >> 2) * (kWgRows * 128 >> 4)) + step,
                           desc_x + so + uint64_t((kk >> 2) * (NB * 128 >> 4)) + step,
                           kk > 0 ? 1 : 0);
      }
    } else {
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss<NB, false>(blk, desc_w + so + uint64_t(2 * kk), desc_x + so + uint64_t(2 * kk),
                            kk > 0 ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    promote(blk, i);
  }
  cp_async_wait_group<0>();
  __syncthreads();  // every warpgroup's wgmma reads of the ring are done: it becomes `red`

  // Partials: rows wg * 64 + 16 w4 + g (+8), tokens 8j + 2 t4 (+1).
  using Red = float[1][kRowsCta][NB + 1];
  Red& red = *reinterpret_cast<Red*>(smem);
  const int r0 = wg * kWgRows + 16 * w4 + g;
#pragma unroll
  for (int j = 0; j < NB / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      red[0][r0][8 * j + 2 * t4 + c] = acc[4 * j + c];
      red[0][r0 + 8][8 * j + 2 * t4 + c] = acc[4 * j + 2 + c];
    }
  reduce_k_partials<1, kRowsCta, NB, kThr>(a, red, srank, tile, group, 0);
#else
  __trap();  // launched only on compute capability 9.0 devices (launch_wgmma_plan)
#endif
}

template <int NB, int WG, int S, bool kBf16>
cudaError_t launch_wgmma(const SmallMArgs& a, dim3 grid, cudaStream_t stream) {
  auto kernel = fp8_wgmma_kernel<NB, WG, S, kBf16>;
  const int kblocks = int(a.k / 128);
  const int smem = wg_smem_bytes(NB, WG, S, (kblocks + a.k_split - 1) / a.k_split, kBf16);
  if (const cudaError_t e = ensure_max_dynamic_smem(kernel, smem); e != cudaSuccess) return e;
  return launch_small_m_kernel(kernel, a, grid, 128 * WG, stream, size_t(smem));
}

template <int NB, int WG, bool kBf16>
cudaError_t dispatch_wgmma_stages(int stages, const SmallMArgs& a, dim3 grid,
                                  cudaStream_t stream) {
  return stages >= 6 ? launch_wgmma<NB, WG, 6, kBf16>(a, grid, stream)
                     : launch_wgmma<NB, WG, 4, kBf16>(a, grid, stream);
}

template <int NB>
cudaError_t dispatch_wgmma_wg(int wgs, int stages, bool bf16, const SmallMArgs& a, dim3 grid,
                              cudaStream_t stream) {
  if (bf16)
    return wgs == 2 ? dispatch_wgmma_stages<NB, 2, true>(stages, a, grid, stream)
                    : dispatch_wgmma_stages<NB, 1, true>(stages, a, grid, stream);
  return wgs == 2 ? dispatch_wgmma_stages<NB, 2, false>(stages, a, grid, stream)
                  : dispatch_wgmma_stages<NB, 1, false>(stages, a, grid, stream);
}

// Token tile of kWgmma: M rounded up to 8, 16, 32 or 64.
int wgmma_tokens(int64_t m) {
  return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
}

int n_tiles_for(int64_t m) {
  const int64_t mm = std::min<int64_t>(m, kSmallMMaxTokens);
  return mm <= 8 ? 1 : mm <= 16 ? 2 : mm <= 32 ? 4 : 8;
}

int device_sms() {
  static int sms = [] {
    int dev = 0, n = 132;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 132;
    }
    return n;
  }();
  return sms;
}

int device_cc_major() {
  static int major = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    return v;
  }();
  return major;
}

// Compute capability 9.0 exactly: the devices that run the sm_90a image's wgmma paths.
bool device_is_sm90() {
  static bool is = [] {
    int dev = 0, minor = -1;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return device_cc_major() == 9 && minor == 0;
  }();
  return is;
}

Status check_weight(const Fp8WeightView& w) {
  if (!w.data || !w.scale) return invalid_argument("fp8 linear: null weight or scale pointer");
  if (w.out_features <= 0 || w.in_features <= 0 || w.num_groups <= 0)
    return invalid_argument("fp8 linear: empty weight");
  if (w.in_features % kFp8GemmBlock != 0)
    return invalid_argument("fp8 linear: K = " + std::to_string(w.in_features) +
                            " is not a multiple of 128");
  if (w.out_features % 16 != 0 || (w.num_groups > 1 && w.out_features % kFp8GemmBlock != 0))
    return invalid_argument("fp8 linear: N = " + std::to_string(w.out_features) +
                            " must be a multiple of 16 (of 128 for a grouped weight)");
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.tiled) % 16 != 0)
    return invalid_argument("fp8 linear: weight data must be 16-byte aligned");
  return ok_status();
}

// One thread per 16-byte piece of the tiled copy: piece q = (t * K/128 + b) * 128 + i * 32 + l.
__global__ void fp8_weight_to_tiles_kernel(const uint8_t* w, uint8_t* tiled, int64_t pieces,
                                           int64_t k) {
  const int64_t kblocks = k / 128;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pieces;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tb = q / 128, t = tb / kblocks, b = tb % kblocks;
    const int i = int(q % 128) / 32, l = int(q % 32);
    const int64_t r = t * 16 + l / 4 + 8 * (i / 2), c = b * 128 + (i % 2) * 64 + (l % 4) * 16;
    reinterpret_cast<uint4*>(tiled)[q] = *reinterpret_cast<const uint4*>(w + r * k + c);
  }
}

__global__ void e8m0_to_f32_kernel(const uint8_t* in, float* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = e8m0_to_float_dev(in[i]);
}

// Activation scales e8m0 [M, C] (row-major) -> fp32 [C, M] (cuBLASLt VEC128_32F: the M index
// contiguous).
__global__ void act_scales_transpose_kernel(const uint8_t* in, float* out, int64_t m, int64_t c) {
  __shared__ float tile[32][33];
  const int64_t c0 = int64_t(blockIdx.x) * 32, m0 = int64_t(blockIdx.y) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t mi = m0 + i, ci = c0 + threadIdx.x;
    if (mi < m && ci < c) tile[i][threadIdx.x] = e8m0_to_float_dev(in[mi * c + ci]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t ci = c0 + i, mi = m0 + threadIdx.x;
    if (mi < m && ci < c) out[ci * m + mi] = tile[threadIdx.x][i];
  }
}

const char* lt_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cublasStatus";
  }
}

}  // namespace

#define DS_LT_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                    \
    cublasStatus_t ds_lt_st_ = (expr);                                                    \
    if (ds_lt_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      return internal_error(std::string("cuBLASLt error ") + lt_status_name(ds_lt_st_) +  \
                            " in " #expr " at " __FILE__ ":" + std::to_string(__LINE__)); \
  } while (0)

std::pair<int, int> fp8_small_m_config(const Fp8SmallMParams& p, int num_sms) {
  // From the H200 sweeps (NOTES.md, v2): at M = 1 the best layout has about two row tiles per SM
  // (the largest row_warps that still gives >= 1.5 tiles per SM, else 1), and clusters split K
  // only when the tiles alone leave more than half of the SMs idle.
  const int nt = n_tiles_for(p.num_tokens);
  const int64_t mchunks = (p.num_tokens + 8 * nt - 1) / (8 * nt);
  const int64_t kblocks = p.w.in_features / kFp8GemmBlock;
  const int64_t rows = p.w.out_features * p.w.num_groups * mchunks;
  int rw = p.row_warps;
  if (!rw) {
    rw = 1;
    for (int cand : {8, 4, 2})
      if ((rows + 16 * cand - 1) / (16 * cand) * 2 >= 3 * int64_t(num_sms)) {
        rw = cand;
        break;
      }
  }
  const int kw = kWarps / rw;
  const int64_t tiles = (rows + 16 * rw - 1) / (16 * rw);
  int ks = p.k_split;
  if (!ks) {
    ks = 1;
    while (ks < 8 && tiles * ks * 2 < int64_t(num_sms) && kblocks >= int64_t(2 * ks) * kw) ks *= 2;
  }
  return {rw, ks};
}

Status launch_fp8_weight_to_tiles(const uint8_t* w, uint8_t* tiled, int64_t rows, int64_t k,
                                  cudaStream_t stream) {
  if (!w || !tiled) return invalid_argument("fp8 weight to tiles: null pointer");
  if (rows <= 0 || k <= 0 || rows % 16 != 0 || k % kFp8GemmBlock != 0)
    return invalid_argument("fp8 weight to tiles: rows must be a multiple of 16 and K of 128");
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(tiled) % 16 != 0)
    return invalid_argument("fp8 weight to tiles: pointers must be 16-byte aligned");
  const int64_t pieces = rows * k / 16;
  const int blocks = int(std::min<int64_t>((pieces + 255) / 256, int64_t(device_sms()) * 16));
  fp8_weight_to_tiles_kernel<<<blocks, 256, 0, stream>>>(w, tiled, pieces, k);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}

Fp8SmallMPlan fp8_small_m_plan(const Fp8SmallMParams& p, int num_sms) {
  Fp8SmallMPlan plan;
  const bool fp8_act = p.x_codes != nullptr;
  plan.kernel = p.kernel;
  plan.k_parts = p.k_parts ? p.k_parts : 1;
  if (plan.kernel == SmallMKernel::kWgmma) {
    // From the H100 sweeps of session 27 (NOTES.md): two warpgroups per CTA only at 33-64 tokens
    // (their activation copies per weight byte are halved where they are largest); clusters
    // along K until the CTAs nearly fill one wave (>= 0.9 x SMs; each rank keeps >= 4 K blocks
    // and at most kWgMaxKBlocks), with bf16 activations once more while under 1.8 x SMs and
    // ranks keep >= 16 K blocks (each stage's weight conversion lengthens the per-CTA chain);
    // a ring of 6 stages where a rank has >= 16 K blocks or the token tile is 8 (e4m3), or has
    // >= 16 K blocks and the tile is <= 16 (bf16); 4 otherwise (more CTAs per SM pay more).
    const bool bf16 = p.x_codes == nullptr;
    const int64_t kblocks = p.w.in_features / kFp8GemmBlock;
    const int nb = wgmma_tokens(p.num_tokens);
    const int wgs = p.row_warps ? p.row_warps : nb == 64 ? 2 : 1;
    const int64_t tiles =
        (p.w.out_features + kWgRows * wgs - 1) / (kWgRows * wgs) * p.w.num_groups;
    int ks = p.k_split;
    if (!ks) {
      ks = 1;
      while (ks < 8 && ((kblocks + ks - 1) / ks > kWgMaxKBlocks ||
                        (tiles * ks * 10 < 9 * int64_t(num_sms) && kblocks / (2 * ks) >= 4)))
        ks *= 2;
      if (bf16 && ks < 8 && tiles * ks * 10 < 18 * int64_t(num_sms) && kblocks / (2 * ks) >= 16)
        ks *= 2;
    }
    plan.row_warps = wgs;
    plan.k_split = ks;
    const bool deep = bf16 ? kblocks / ks >= 16 && nb <= 16 : kblocks / ks >= 16 || nb == 8;
    plan.stages = p.stages ? p.stages : deep ? 6 : 4;
    return plan;
  }
  if (plan.kernel == SmallMKernel::kAuto)
    plan.kernel = fp8_act && p.num_tokens <= kSmallMMaxTokens && p.max_ctas == 0
                      ? SmallMKernel::kStream
                      : SmallMKernel::kMma;
  if (plan.kernel == SmallMKernel::kMma) {
    const auto [rw, ks] = fp8_small_m_config(p, num_sms);
    plan.row_warps = rw;
    plan.k_split = ks;
    return plan;
  }
  // kStream, from the H200 sweep of run gemm4-1 (NOTES.md, v4): NT = 1 (<= 8 tokens per chunk,
  // 4 CTAs/SM resident) is best with ~3 CTAs per SM, NT = 2 (200 registers, 2 CTAs/SM) with ~2:
  // the largest row_warps reaching that many CTAs, then clusters along K while below it. Every
  // warp keeps >= 4 K blocks (the ring depth; 2 warps' worth only cost 30-50% at shared_w1/w2),
  // except that NT = 1 accepts 2 while the grid has fewer CTAs than SMs (wq_a, wkv).
  const bool nt1 = p.num_tokens <= 8;
  const int64_t chunk = nt1 ? 8 : kStreamMaxTokens;
  const int64_t mchunks = (p.num_tokens + chunk - 1) / chunk;
  const int64_t kblocks = p.w.in_features / kFp8GemmBlock;
  const int64_t tiles16 = p.w.out_features / 16 * p.w.num_groups * mchunks;
  const bool auto_layout = p.kernel == SmallMKernel::kAuto && !p.row_warps && !p.k_split;
  // An explicit kStream / kBulk takes the copy when given, at <= 8 tokens per chunk only: with
  // 16-token chunks (NT = 2) the tiled kBulk gave wrong block partials for one token in one
  // 16-row tile in 2 of the configurations tested at M = 37 (3 chunks, clusters of 2-8), not
  // understood (NOTES.md, session 12); there the row-major weight is read.
  plan.tiled = p.w.tiled != nullptr && nt1 && !auto_layout;
  // kBulk from the H200 sweep of session 5 (NOTES.md, v5): it beats kStream by 0.5-0.7 us at
  // M <= 8 when each CTA streams >= 32 K blocks (4 KB) of its 16 rows with >= 3.5 CTAs per SM
  // (wo_a, wo_b: 512 CTAs, 2 ring slots); with shorter row pieces (K <= 2048 per CTA: wq_b,
  // wq_a, wkv, shared experts) it is slower or equal. bks: its clusters along K.
  int bks = 1;
  while (bks < 8 && tiles16 * bks * 2 < 7 * int64_t(num_sms)) bks *= 2;
  const bool row_major_bulk = tiles16 * bks * 2 >= 7 * int64_t(num_sms) && kblocks / bks >= 32;
  if (auto_layout && nt1 && device_cc_major() >= 9 && p.w.tiled != nullptr) {
    // Tile-ordered weights (session 12, NOTES.md): kBulk copies one contiguous piece per 16-row
    // tile and stage, so short rows no longer cost it (wq_b M = 1: 11.25 us vs kStream's 12.1)
    // and long ones gain at M <= 2 (wo_a 10.9 vs 11.4, wo_b 11.8 vs 12.5); at M = 8 the
    // row-major kBulk was 0.3 us faster on wo_a / wo_b. Layout: the largest row_warps keeping
    // >= 3.5 CTAs per SM, then clusters along K up to that many.
    int trw = 1;
    for (int cand : {4, 2})
      if (tiles16 / cand * 2 >= 7 * int64_t(num_sms)) {
        trw = cand;
        break;
      }
    const int64_t tctas = tiles16 / trw;
    int tks = 1;
    while (tks < 8 && tctas * tks * 2 < 7 * int64_t(num_sms) &&
           kblocks >= int64_t(2 * tks) * (kBulkConsumerWarps / trw))
      tks *= 2;
    // Only where each CTA keeps its ring busy for >= 8 stages (wq_b, wo_a, wo_b): with fewer
    // (wq_a, wkv, the shared experts, idx_wq_b: 1-2 stages) the tiled kBulk measured 5-140% slower
    // than the row-major plan (run h-gemm12-4).
    const int64_t tstages = kblocks / tks / (kBulkConsumerWarps / trw);
    // A split of 2 runs as 2 K partitions inside each CTA instead of a cluster of 2 (session 13:
    // wo_b M = 1 10.92 us vs 11.68, M = 8 12.02 vs the row-major kBulk's 13.22), so it is taken
    // at every M <= 8.
    if (tstages >= 8 && (p.num_tokens <= 2 || !row_major_bulk || tks == 2)) {
      plan.kernel = SmallMKernel::kBulk;
      plan.row_warps = trw;
      plan.k_split = tks == 2 ? 1 : tks;
      plan.k_parts = p.k_parts ? p.k_parts : tks == 2 ? 2 : 1;
      plan.stages = p.stages ? p.stages : 2;
      plan.tiled = true;
      return plan;
    }
  }
  if (auto_layout && nt1 && device_cc_major() >= 9 && row_major_bulk) {
    plan.kernel = SmallMKernel::kBulk;
    plan.row_warps = 1;
    plan.k_split = bks;
    plan.stages = p.stages ? p.stages : 2;
    return plan;
  }
  const int64_t target = nt1 ? 3 * int64_t(num_sms) : int64_t(num_sms) * 19 / 10;
  int rw = p.row_warps;
  if (!rw) {
    rw = 1;
    for (int cand : {4, 2})
      if (tiles16 / cand >= target) {
        rw = cand;
        break;
      }
  }
  const int kw = kStreamWarps / rw;
  const int64_t ctas = (tiles16 + rw - 1) / rw;
  int ks = p.k_split;
  if (!ks) {
    ks = 1;
    while (ks < 8 && ctas * ks < target) {
      const int64_t per_warp = kblocks / (int64_t(kw) * 2 * ks);  // after doubling
      const bool ok = per_warp >= 4 || (nt1 && per_warp >= 2 && ctas * ks < num_sms);
      if (!ok) break;
      ks *= 2;
    }
  }
  plan.row_warps = rw;
  plan.k_split = ks;
  if (plan.kernel == SmallMKernel::kBulk) plan.stages = p.stages ? p.stages : 2;
  return plan;
}

namespace {

// The kernel arguments of p under plan (tiles, groups and items are the caller's).
SmallMArgs small_m_args(const Fp8SmallMParams& p, const Fp8SmallMPlan& plan,
                        const uint8_t* tiled) {
  const int64_t in_cols = p.w.in_features * p.w.num_groups;
  const bool fp8_act = p.x_codes != nullptr;
  SmallMArgs a{};
  a.w = p.w.data;
  a.w_tiled = tiled;
  a.w_scale = p.w.scale;
  a.x_codes = p.x_codes;
  a.x_scales = p.x_scales;
  a.x_bf16 = p.x_bf16;
  a.y = p.y;
  a.y2 = p.y2;
  a.y2_stride = p.y2_row_stride;
  a.n_split = p.split_features;
  a.n = p.w.out_features;
  a.k = p.w.in_features;
  a.m = p.num_tokens;
  a.x_stride = fp8_act ? in_cols : p.x_row_stride;
  a.x_scale_stride = in_cols / kFp8GemmBlock;
  a.y_stride = p.y_row_stride;
  a.w_scale_stride = p.w.in_features / kFp8GemmBlock;
  a.k_split = plan.k_split;
  a.y_f32 = out_is_f32(p.y_type) ? 1 : 0;
  a.y_round = p.y_type == OutType::kF32Bf16 ? 1 : 0;
  a.pdl = p.pdl ? 1 : 0;
  a.stages = plan.stages;
  return a;
}

// kWgmma: one pass over all tokens, a cluster of k_split CTAs per row tile of 64 x row_warps.
Status launch_wgmma_plan(const Fp8SmallMParams& p, const Fp8SmallMPlan& plan,
                         cudaStream_t stream) {
  const bool bf16 = p.x_codes == nullptr;  // hf numerics: bf16 activations
  if (bf16 && reinterpret_cast<uintptr_t>(p.x_bf16) % 16 != 0)
    return invalid_argument("fp8 linear: kWgmma needs 16-byte aligned bf16 input");
  if (p.num_tokens > kSmallMMaxTokens)
    return invalid_argument("fp8 linear: kWgmma takes at most 64 tokens");
  if (!device_is_sm90())
    return invalid_argument("fp8 linear: kWgmma needs a compute capability 9.0 device");
  const int wgs = plan.row_warps, ks = plan.k_split;
  const int64_t kblocks = p.w.in_features / kFp8GemmBlock;
  if ((wgs != 1 && wgs != 2) || (ks != 1 && ks != 2 && ks != 4 && ks != 8) ||
      (plan.stages != 4 && plan.stages != 6))
    return invalid_argument(
        "fp8 linear: kWgmma needs row_warps (warpgroups) 1 or 2, k_split 1, 2, 4 or 8 and "
        "stages 4 or 6");
  if (ks > kblocks || (kblocks + ks - 1) / ks > kWgMaxKBlocks)
    return invalid_argument("fp8 linear: kWgmma needs 1 .. 64 K blocks of 128 per cluster rank");
  SmallMArgs a = small_m_args(p, plan, nullptr);
  a.tiles = (p.w.out_features + kWgRows * wgs - 1) / (kWgRows * wgs);
  a.groups = p.w.num_groups;
  a.items = a.tiles * a.groups;
  if (a.items * ks > 0x7FFFFFFF) return invalid_argument("fp8 linear: shape too large");
  const dim3 grid(unsigned(a.items * ks), 1, 1);
  const int nb = wgmma_tokens(p.num_tokens);
  cudaError_t err;
  switch (nb) {
    case 8:
      err = dispatch_wgmma_wg<8>(wgs, plan.stages, bf16, a, grid, stream);
      break;
    case 16:
      err = dispatch_wgmma_wg<16>(wgs, plan.stages, bf16, a, grid, stream);
      break;
    case 32:
      err = dispatch_wgmma_wg<32>(wgs, plan.stages, bf16, a, grid, stream);
      break;
    default:
      err = dispatch_wgmma_wg<64>(wgs, plan.stages, bf16, a, grid, stream);
  }
  DS_CUDA_RETURN_IF_ERROR(err);
  return ok_status();
}

}  // namespace

Status launch_fp8_linear_small_m(const Fp8SmallMParams& p, cudaStream_t stream) {
  if (Status s = check_weight(p.w); !s.ok()) return s;
  if (p.num_tokens < 0) return invalid_argument("fp8 linear: negative token count");
  if (p.num_tokens == 0) return ok_status();
  const int64_t in_cols = p.w.in_features * p.w.num_groups;
  const bool fp8_act = p.x_codes != nullptr;
  if (fp8_act && !p.x_scales) return invalid_argument("fp8 linear: codes given without scales");
  if (!fp8_act && !p.x_bf16) return invalid_argument("fp8 linear: no input");
  if (!fp8_act && (p.x_row_stride < in_cols || p.x_row_stride % 8 != 0))
    return invalid_argument("fp8 linear: bf16 row stride must be >= G*K and a multiple of 8");
  if (p.split_features == 0 && (!p.y || p.y_row_stride < p.w.out_features * p.w.num_groups))
    return invalid_argument("fp8 linear: output missing or row stride < G*N");
  if (p.split_features != 0 &&
      (p.w.num_groups != 1 || p.split_features < 0 || p.split_features >= p.w.out_features ||
       !p.y || !p.y2 || p.y_row_stride < p.split_features ||
       p.y2_row_stride < p.w.out_features - p.split_features))
    return invalid_argument(
        "fp8 linear: a split output needs one group, 0 < split < N, both outputs and row strides "
        ">= their widths");
  const Fp8SmallMPlan plan = fp8_small_m_plan(p, device_sms());
  if (plan.kernel == SmallMKernel::kWgmma) return launch_wgmma_plan(p, plan, stream);
  // kBulk needs cp.async.bulk (sm_90+); elsewhere the same layout runs on kStream.
  const bool bulk_kernel = plan.kernel == SmallMKernel::kBulk && device_cc_major() >= 9;
  const bool stream_kernel = plan.kernel == SmallMKernel::kStream ||
                             plan.kernel == SmallMKernel::kBulk;
  if (stream_kernel && !fp8_act)
    return invalid_argument("fp8 linear: the stream kernel needs FP8-quantized activations");
  if (plan.kernel == SmallMKernel::kBulk && (plan.stages < 2 || plan.stages > kBulkMaxStages))
    return invalid_argument("fp8 linear: kBulk stages must be 2..8");
  if (plan.k_parts != 1 && (plan.k_parts != 2 || plan.kernel != SmallMKernel::kBulk ||
                            p.num_tokens > 8))
    return invalid_argument("fp8 linear: k_parts must be 1, or 2 with kBulk at M <= 8");
  const int rw = plan.row_warps, ks = plan.k_split;
  if ((rw != 1 && rw != 2 && rw != 4 && (rw != 8 || stream_kernel)) ||
      (ks != 1 && ks != 2 && ks != 4 && ks != 8))
    return invalid_argument(
        "fp8 linear: row_warps must be 1, 2, 4 (or 8, kMma) and k_split 1, 2, 4 or 8");
  // Tokens per work item: 8 * nt (kStream: up to 16 per chunk; kMma: up to 64).
  const int nt = stream_kernel ? (p.num_tokens <= 8 ? 1 : 2) : n_tiles_for(p.num_tokens);
  SmallMArgs a = small_m_args(p, plan, stream_kernel && plan.tiled ? p.w.tiled : nullptr);
  const int64_t tiles = (p.w.out_features + 16 * rw - 1) / (16 * rw);
  const int64_t mchunks = (p.num_tokens + 8 * nt - 1) / (8 * nt);
  a.tiles = tiles;
  a.groups = p.w.num_groups;
  a.items = tiles * p.w.num_groups * mchunks;
  // Clusters in the grid: one per work item unless the caller caps it (a grid of about one CTA per
  // SM, which would leave room for the next kernel's CTAs under PDL, measured slower: NOTES.md).
  // kStream: always one CTA per work item.
  int64_t clusters = a.items;
  if (p.max_ctas > 0 && !stream_kernel) clusters = std::max<int64_t>(1, p.max_ctas / ks);
  clusters = std::min(clusters, a.items);
  if (clusters * ks > 0x7FFFFFFF) return invalid_argument("fp8 linear: shape too large");
  const dim3 grid(unsigned(clusters * ks), 1, 1);
  cudaError_t err;
  if (bulk_kernel)
    err = nt == 2       ? dispatch_bulk_rw<2, 1>(rw, a, grid, stream)
          : plan.k_parts == 2 ? dispatch_bulk_rw<1, 2>(rw, a, grid, stream)
                              : dispatch_bulk_rw<1, 1>(rw, a, grid, stream);
  else if (stream_kernel)
    err = nt == 1 ? dispatch_stream_rw<1>(rw, a, grid, stream)
                  : dispatch_stream_rw<2>(rw, a, grid, stream);
  else
    err = fp8_act ? dispatch_nt<true>(nt, rw, a, grid, stream)
                  : dispatch_nt<false>(nt, rw, a, grid, stream);
  DS_CUDA_RETURN_IF_ERROR(err);
  return ok_status();
}

namespace {
// y[r, c] = its bf16 rounding, for an fp32 output of the cuBLASLt paths asked for kF32Bf16.
__global__ void round_rows_bf16_kernel(float* y, int64_t rows, int64_t cols, int64_t stride) {
  const int64_t total = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    float* e = y + (i / cols) * stride + i % cols;
    *e = ops::round_bf16_exact(*e);
  }
}

Status round_rows_bf16(void* y, int64_t rows, int64_t cols, int64_t stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return ok_status();
  const int64_t blocks = std::min<int64_t>((rows * cols + 255) / 256, 4096);
  round_rows_bf16_kernel<<<unsigned(blocks), 256, 0, stream>>>(static_cast<float*>(y), rows, cols,
                                                               stride);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}
}  // namespace

Status launch_e8m0_to_f32(const uint8_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return ok_status();
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  e8m0_to_f32_kernel<<<unsigned(blocks), 256, 0, stream>>>(in, out, n);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}

// ---- GemmRunner -------------------------------------------------------------------------------

namespace {
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}
}  // namespace

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool swapped = false;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

size_t GemmRunner::workspace_bytes(int64_t max_tokens, int64_t max_in_columns) {
  const size_t mk = size_t(max_tokens) * size_t(max_in_columns);
  return align_up(mk, 256) + align_up(mk / kFp8GemmBlock, 256) +
         align_up(mk / kFp8GemmBlock * sizeof(float), 256) + kLtWorkspaceBytes;
}

Result<std::unique_ptr<GemmRunner>> GemmRunner::create(void* workspace, size_t bytes,
                                                       int64_t max_tokens, int64_t max_in_columns) {
  if (max_tokens <= 0 || max_in_columns <= 0 || max_in_columns % kFp8GemmBlock != 0)
    return invalid_argument("GemmRunner: max_in_columns must be a positive multiple of 128");
  if (!workspace || bytes < workspace_bytes(max_tokens, max_in_columns))
    return invalid_argument("GemmRunner: workspace smaller than workspace_bytes()");
  std::unique_ptr<GemmRunner> r(new GemmRunner());
  cublasLtHandle_t h = nullptr;
  DS_LT_RETURN_IF_ERROR(cublasLtCreate(&h));
  r->lt_ = h;
  const size_t mk = size_t(max_tokens) * size_t(max_in_columns);
  uint8_t* p = static_cast<uint8_t*>(workspace);
  r->codes_ = p;
  p += align_up(mk, 256);
  r->scales_ = p;
  p += align_up(mk / kFp8GemmBlock, 256);
  r->scales_t_ = reinterpret_cast<float*>(p);
  p += align_up(mk / kFp8GemmBlock * sizeof(float), 256);
  r->lt_workspace_ = p;
  r->lt_workspace_bytes_ = kLtWorkspaceBytes;
  r->max_tokens_ = max_tokens;
  r->max_in_columns_ = max_in_columns;
  return Result<std::unique_ptr<GemmRunner>>(std::move(r));
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  tuned_.clear();
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
}

// One orientation's descriptors for an FP8 block-scaled GEMM of m tokens (no algorithm yet).
// (0) column-major D[N, M] = W[K, N]^T Xq[K, M] with the 128x128 scales on A;
// (1) D[M, N] stored row-major = Xq[K, M]^T W[K, N] with the 1x128 scales on A.
Status GemmRunner::make_fp8_plan(const Fp8WeightView& w, int64_t m, const float* scales_t,
                                 OutType y_type, int64_t y_row_stride, int orient,
                                 std::shared_ptr<Plan>* out) {
  const int64_t n = w.out_features, k = w.in_features, in_cols = k * w.num_groups;
  auto pl = std::make_shared<Plan>();
  pl->swapped = orient == 1;
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
  DS_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt));
  DS_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
  const int32_t wmode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t xmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const float* aptr = pl->swapped ? scales_t : w.scale_f32;
  const float* bptr = pl->swapped ? w.scale_f32 : scales_t;
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, pl->swapped ? &xmode : &wmode, sizeof wmode));
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, pl->swapped ? &wmode : &xmode, sizeof xmode));
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &aptr, sizeof aptr));
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bptr, sizeof bptr));
  const cudaDataType_t dt = out_is_f32(y_type) ? CUDA_R_32F : CUDA_R_16BF;
  if (!pl->swapped) {
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->a, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->b, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), in_cols));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->c, dt, uint64_t(n), uint64_t(m), y_row_stride));
  } else {
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->a, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), in_cols));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->b, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->c, dt, uint64_t(m), uint64_t(n), y_row_stride));
    const int32_t row = CUBLASLT_ORDER_ROW;
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutSetAttribute(pl->c, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
  }
  *out = std::move(pl);
  return ok_status();
}

// Launches plan's GEMM for group g of w.
Status GemmRunner::run_fp8_group(const Plan& plan, const Fp8WeightView& w, int64_t m, int g,
                                 const uint8_t* codes, const float* scales_t, void* y,
                                 OutType y_type, cudaStream_t stream) {
  const int64_t n = w.out_features, k = w.in_features;
  const float alpha = 1.0f, beta = 0.0f;
  const size_t elt = out_is_f32(y_type) ? 4 : 2;
  cublasLtHandle_t lt = static_cast<cublasLtHandle_t>(lt_);
  const uint8_t* wg = w.data + size_t(g) * size_t(n) * size_t(k);
  const float* wsg =
      w.scale_f32 + size_t(g) * size_t(n / kFp8GemmBlock) * size_t(k / kFp8GemmBlock);
  const uint8_t* xg = codes + size_t(g) * size_t(k);
  const float* xsg = scales_t + size_t(g) * size_t(k / kFp8GemmBlock) * size_t(m);
  void* yg = static_cast<uint8_t*>(y) + size_t(g) * size_t(n) * elt;
  const void* aop = plan.swapped ? static_cast<const void*>(xg) : wg;
  const void* bop = plan.swapped ? static_cast<const void*>(wg) : xg;
  const float* asc = plan.swapped ? xsg : wsg;
  const float* bsc = plan.swapped ? wsg : xsg;
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &asc, sizeof asc));
  DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bsc, sizeof bsc));
  DS_LT_RETURN_IF_ERROR(cublasLtMatmul(lt, plan.desc, &alpha, aop, plan.a, bop, plan.b, &beta, yg,
                                       plan.c, yg, plan.c, &plan.algo, lt_workspace_,
                                       lt_workspace_bytes_, stream));
  return ok_status();
}

Status GemmRunner::run_fp8_cublaslt(const Fp8WeightView& w, int64_t m, const uint8_t* codes,
                                    const float* scales_t, void* y, OutType y_type,
                                    int64_t y_row_stride, cudaStream_t stream) {
  const int64_t n = w.out_features, k = w.in_features, in_cols = k * w.num_groups;
  auto key = std::make_tuple(0, m, n, k, in_cols, y_row_stride, int(y_type));
  std::shared_ptr<Plan>& plan = plans_[key];
  cublasLtHandle_t lt = static_cast<cublasLtHandle_t>(lt_);
  // Shape class of the autotuning: the same weight shape and output, M in [2^(b-1), 2^b).
  int mbits = 0;
  while ((int64_t(1) << mbits) <= m) ++mbits;
  const auto tkey = std::make_tuple(mbits, n, k, in_cols, y_row_stride, int(y_type));
  if (!plan) {
    // A tuned algorithm of this shape class: reuse it when cuBLASLt accepts it for this M.
    if (auto it = tuned_.find(tkey); it != tuned_.end()) {
      std::shared_ptr<Plan> pl;
      const int orient = it->second->swapped ? 1 : 0;
      if (make_fp8_plan(w, m, scales_t, y_type, y_row_stride, orient, &pl).ok()) {
        cublasLtMatmulHeuristicResult_t chk{};
        if (cublasLtMatmulAlgoCheck(lt, pl->desc, pl->a, pl->b, pl->c, pl->c, &it->second->algo,
                                    &chk) == CUBLAS_STATUS_SUCCESS &&
            chk.workspaceSize <= lt_workspace_bytes_) {
          pl->algo = it->second->algo;
          plan = pl;
        }
      }
    }
  }
  if (!plan) {
    // Candidates: cuBLASLt's heuristic list for both orientations, orientation 0's first answer
    // first (the choice without tuning).
    struct Cand {
      std::shared_ptr<Plan> plan;
      cublasLtMatmulAlgo_t algo;
    };
    std::vector<Cand> cands;
    std::string why;
    constexpr int kMaxHeur = 8;
    for (int orient = 0; orient < 2; ++orient) {
      std::shared_ptr<Plan> pl;
      DS_RETURN_IF_ERROR(make_fp8_plan(w, m, scales_t, y_type, y_row_stride, orient, &pl));
      cublasLtMatmulPreference_t pref = nullptr;
      DS_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
      size_t ws = lt_workspace_bytes_;
      cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulHeuristicResult_t heur[kMaxHeur] = {};
      int found = 0;
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, pl->desc, pl->a, pl->b, pl->c, pl->c, pref,
                                            autotune_ ? kMaxHeur : 1, heur, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        why += std::string(" orientation ") + std::to_string(orient) + ": " + lt_status_name(st);
        continue;
      }
      for (int i = 0; i < found; ++i) {
        if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
        cands.push_back({pl, heur[i].algo});
        if (!autotune_) continue;
        // Split-K variants (N = 512 leaves SMs idle with large tiles), where cuBLASLt takes them.
        int32_t splitk = 1;
        size_t written = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                 &splitk, sizeof splitk, &written) !=
                CUBLAS_STATUS_SUCCESS ||
            splitk != 1)
          continue;
        for (int32_t sk : {2, 4}) {
          cublasLtMatmulAlgo_t alg = heur[i].algo;
          cublasLtMatmulHeuristicResult_t chk{};
          // Partials reduced in fp32 (the compute type), never in the bf16 output type.
          const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
          if (cublasLtMatmulAlgoConfigSetAttribute(&alg, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                                   sizeof sk) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoConfigSetAttribute(&alg, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                   &scheme,
                                                   sizeof scheme) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoCheck(lt, pl->desc, pl->a, pl->b, pl->c, pl->c, &alg, &chk) ==
                  CUBLAS_STATUS_SUCCESS &&
              chk.workspaceSize <= lt_workspace_bytes_)
            cands.push_back({pl, alg});
        }
      }
      if (!autotune_) break;  // without tuning: orientation 0 when it has an algorithm
    }
    if (cands.empty()) {
      plans_.erase(key);
      return unimplemented(std::string("cuBLASLt has no FP8 block-scaled algorithm for M=") +
                           std::to_string(m) + " N=" + std::to_string(n) +
                           " K=" + std::to_string(k) + " (" + why + ")");
    }
    size_t best = 0;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    const bool capturing = cudaStreamIsCapturing(stream, &cap) != cudaSuccess ||
                           cap != cudaStreamCaptureStatusNone;
    if (autotune_ && cands.size() > 1 && !capturing) {
      // Time the candidates on this call's operands (group 0; the real call below overwrites y):
      // one warm-up each, then 3 interleaved rounds of one timed run each (clock and power drift
      // hit all candidates alike), best of 3 per candidate. A candidate replaces cuBLASLt's first
      // answer only when >= 3% faster (run 1 of session 5: a 2-run timing picked an algorithm 14%
      // slower for wq_b at M = 8192). Host-synchronizing, once per shape class; any failure of
      // candidate 0 keeps candidate 0.
      constexpr int kRounds = 3;
      std::vector<cudaEvent_t> ev(2 * cands.size() * kRounds, nullptr);
      bool ok = true;
      for (cudaEvent_t& e : ev) ok = ok && cudaEventCreate(&e) == cudaSuccess;
      std::vector<char> usable(cands.size(), 1);
      for (size_t i = 0; ok && i < cands.size(); ++i) {
        cands[i].plan->algo = cands[i].algo;
        usable[i] = run_fp8_group(*cands[i].plan, w, m, 0, codes, scales_t, y, y_type, stream).ok();
      }
      for (int r = 0; ok && r < kRounds; ++r)
        for (size_t i = 0; ok && i < cands.size(); ++i) {
          if (!usable[i]) continue;
          cudaEvent_t* e = &ev[2 * (size_t(r) * cands.size() + i)];
          cands[i].plan->algo = cands[i].algo;
          ok = cudaEventRecord(e[0], stream) == cudaSuccess;
          usable[i] = ok && run_fp8_group(*cands[i].plan, w, m, 0, codes, scales_t, y, y_type,
                                          stream)
                                .ok();
          ok = ok && cudaEventRecord(e[1], stream) == cudaSuccess;
        }
      ok = ok && usable[0] && cudaStreamSynchronize(stream) == cudaSuccess;
      std::vector<float> t(cands.size(), 1e30f);
      for (int r = 0; ok && r < kRounds; ++r)
        for (size_t i = 0; ok && i < cands.size(); ++i) {
          if (!usable[i]) continue;
          const cudaEvent_t* e = &ev[2 * (size_t(r) * cands.size() + i)];
          float ms = 0;
          if (cudaEventElapsedTime(&ms, e[0], e[1]) == cudaSuccess) t[i] = std::min(t[i], ms);
        }
      if (ok) {
        size_t fastest = 0;
        for (size_t i = 1; i < cands.size(); ++i)
          if (usable[i] && t[i] < t[fastest]) fastest = i;
        if (t[fastest] < 0.97f * t[0]) best = fastest;
      }
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      (void)cudaGetLastError();
    }
    cands[best].plan->algo = cands[best].algo;
    plan = cands[best].plan;
    if (autotune_ && !capturing) tuned_[tkey] = plan;
  }
  for (int g = 0; g < w.num_groups; ++g)
    DS_RETURN_IF_ERROR(run_fp8_group(*plan, w, m, g, codes, scales_t, y, y_type, stream));
  return ok_status();
}

Status GemmRunner::linear_fp8_cublaslt(const Fp8LinearParams& p, cudaStream_t stream) {
  if (Status s = check_weight(p.w); !s.ok()) return s;
  const int64_t in_cols = p.w.in_features * p.w.num_groups;
  if (!p.x.codes || !p.x.scales) return invalid_argument("fp8 cuBLASLt: needs quantized input");
  if (!p.w.scale_f32) return invalid_argument("fp8 cuBLASLt: needs fp32 weight scales");
  if (p.w.out_features % kFp8GemmBlock != 0 || p.w.in_features % 512 != 0)
    return unimplemented("fp8 cuBLASLt: needs N % 128 == 0 and K % 512 == 0");
  if (p.num_tokens > max_tokens_ || in_cols > max_in_columns_)
    return invalid_argument("fp8 cuBLASLt: input larger than the runner's workspace");
  if (p.num_tokens == 0) return ok_status();
  const int64_t c = in_cols / kFp8GemmBlock;
  const dim3 tgrid(unsigned((c + 31) / 32), unsigned((p.num_tokens + 31) / 32));
  act_scales_transpose_kernel<<<tgrid, dim3(32, 8), 0, stream>>>(p.x.scales, scales_t_,
                                                                 p.num_tokens, c);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // kF32Bf16: the fp32 GEMM (same plan as kF32), then the rounding pass.
  const bool round = p.y_type == OutType::kF32Bf16;
  DS_RETURN_IF_ERROR(run_fp8_cublaslt(p.w, p.num_tokens, p.x.codes, scales_t_, p.y,
                                      round ? OutType::kF32 : p.y_type, p.y_row_stride, stream));
  if (!round) return ok_status();
  return round_rows_bf16(p.y, p.num_tokens, p.w.out_features * p.w.num_groups, p.y_row_stride,
                         stream);
}

bool fp8_linear_uses_cublaslt(const Fp8WeightView& w, int64_t m) {
  if (!w.scale_f32 || w.out_features % kFp8GemmBlock != 0 || w.in_features % 512 != 0) return false;
  if (m > kSmallMMaxTokens) return true;
  // Decode batches (run h-gemm7-1, H200, graph of distinct weight copies): cuBLASLt 14.8 / 16.2 /
  // 16.0 us for wq_b at M = 16 / 32 / 64 (kStream 20.2 / 37.2 / 71.5) and 18.8 / 20.5 us for wo_b
  // at M = 32 / 64 (kStream 29.0 / 55.3; at M = 16 kStream's 16.6 beats cuBLASLt's 19.3). M in
  // between is assumed to follow (cuBLASLt pads M to its tile; kStream runs 16-token chunks). The
  // small weights and the grouped wo_a (8 GEMMs: 114 us) stay on the small-M kernels.
  const int64_t bytes = w.out_features * w.in_features * w.num_groups;
  if (w.num_groups != 1 || bytes < (int64_t(16) << 20)) return false;
  return m > 16 || (m > 8 && w.in_features <= 1024);
}

bool fp8_linear_uses_wgmma(const Fp8WeightView& w, int64_t m, bool quantized) {
  // H100, graph of >= 20 launches on distinct weight copies, PDL on (NOTES.md, session 27):
  // wq_b 11.9 / 12.5 / 13.8 / 16.4 us at M = 1 / 8 / 16 / 32 (kStream 14.2 / 15.7, cuBLASLt
  // 17.0 / 18.4) but 21.1 at M = 64 (cuBLASLt 18.3); wo_b 16.8 / 18.8 at M = 16 / 32 (kStream
  // 17.7, cuBLASLt 20.3) but 15.1-15.3 at M <= 8 (kBulk 14.7-15.0) and 31.4 at 64 (cuBLASLt
  // 21.7); wo_a 15.8 / 17.7 / 23.3 at M = 16 / 32 / 64 (kStream 18.0 / 29.8 / 58.3), 14.0-14.4
  // at M <= 8 (kBulk 13.1-13.7). The small weights (wq_a, wkv, their pair) stay on kStream.
  // bf16 activations (hf numerics; the engine's wo_a), call 6: wo_a 20.4 / 22.7 / 27.5 us at
  // M = 16 / 32 / 64 (kMma 23.4 / 33.6 / 52.7) but 19.0 at M <= 8 (kMma 14.4-16.0); wq_b 23.6 /
  // 26.7 / 35.1 at M = 16 / 32 / 64 (kMma 25.0 / 39.6 / 61.7); wo_b 24.7 at M = 16 (kMma 23.2).
  // The per-rank slices under tensor parallelism of 2 (call 12, 16.8 MB each): wq_b 7.07 / 9.24
  // at M = 1 / 16 (kStream 8.13, cuBLASLt 10.43), wo_b 10.29 at 16 (kStream 10.46); but wo_a
  // with bf16 input 17.3 / 41.7 at M = 16 / 64 (kMma 14.7 / 32.7) and quantized 31.1 at 64
  // (kStream 28.9): hence the 32 MB bound for those two.
  if (m < 1 || m > kSmallMMaxTokens || !device_is_sm90()) return false;
  const int64_t bytes = w.out_features * w.in_features * w.num_groups;
  if (bytes < (int64_t(16) << 20)) return false;
  const bool full = bytes >= (int64_t(32) << 20);
  if (!quantized) return full && m >= 16 && (w.num_groups > 1 || w.in_features <= 1024);
  if (w.num_groups > 1) return m > 8 && (full || m <= 32);
  return w.in_features <= 1024 ? m <= 32 : m > 8 && m <= 32;
}

Status GemmRunner::linear_fp8(const Fp8LinearParams& p, cudaStream_t stream) {
  if (Status s = check_weight(p.w); !s.ok()) return s;
  if (p.num_tokens < 0) return invalid_argument("fp8 linear: negative token count");
  if (p.num_tokens == 0) return ok_status();
  const int64_t in_cols = p.w.in_features * p.w.num_groups;
  if (p.x.f32 && (!p.quantize_activations || reinterpret_cast<uintptr_t>(p.x.f32) % 16 != 0))
    return invalid_argument("fp8 linear: fp32 input needs quantize_activations and 16-byte rows");
  Fp8LinearParams q = p;
  if (p.quantize_activations && !p.x.codes) {
    // Reference numerics: quantize once into the workspace (bit-exact with the CPU reference).
    if (!p.x.bf16 && !p.x.f32) return invalid_argument("fp8 linear: no input");
    if (p.num_tokens > max_tokens_ || in_cols > max_in_columns_)
      return invalid_argument("fp8 linear: input larger than the runner's workspace");
    if (p.x.x_row_stride < in_cols || p.x.x_row_stride % 8 != 0)
      return invalid_argument("fp8 linear: bf16 row stride must be >= G*K and a multiple of 8");
    QuantFp8Params qp;
    qp.x = p.x.f32 ? nullptr : p.x.bf16;
    qp.x_f32 = p.x.f32;
    qp.codes = codes_;
    qp.scales = scales_;
    qp.num_rows = p.num_tokens;
    qp.row_len = in_cols;
    qp.x_row_stride = p.x.x_row_stride;
    launch_quantize_fp8_blocks(qp, stream);
    DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    q.x.codes = codes_;
    q.x.scales = scales_;
  }
  const bool fp8_act = p.quantize_activations;
  // Decode batches go to cuBLASLt only when they fit the runner's workspace (pre-quantized input
  // larger than it keeps running the small-M kernels, as before session 7).
  const bool fits = p.num_tokens <= max_tokens_ && in_cols <= max_in_columns_;
  const bool wgmma = p.wgmma && fp8_linear_uses_wgmma(p.w, p.num_tokens, fp8_act);
  const bool lt = fp8_act && !wgmma && fp8_linear_uses_cublaslt(p.w, p.num_tokens);
  if (p.split_features != 0 && lt)
    return invalid_argument("fp8 linear: a split output runs on the small-M kernels only");
  if (fp8_act && lt && (p.num_tokens > kSmallMMaxTokens || fits)) {
    Status s = linear_fp8_cublaslt(q, stream);
    if (s.code() != StatusCode::kUnimplemented) return s;
    // No cuBLASLt algorithm for this combination: the small-M kernel in chunks below.
  }
  Fp8SmallMParams sp;
  sp.w = p.w;
  sp.num_tokens = p.num_tokens;
  if (fp8_act) {
    sp.x_codes = q.x.codes;
    sp.x_scales = q.x.scales;
  } else {
    sp.x_bf16 = p.x.bf16;
    sp.x_row_stride = p.x.x_row_stride;
  }
  sp.y = p.y;
  sp.y_type = p.y_type;
  sp.y_row_stride = p.y_row_stride;
  sp.y2 = p.y2;
  sp.y2_row_stride = p.y2_row_stride;
  sp.split_features = p.split_features;
  sp.pdl = p.pdl;
  if (wgmma) sp.kernel = SmallMKernel::kWgmma;
  return launch_fp8_linear_small_m(sp, stream);
}

Status GemmRunner::linear_bf16(const Bf16LinearParams& p, cudaStream_t stream) {
  if (!p.w || !p.x || !p.y) return invalid_argument("bf16 linear: null pointer");
  if (p.out_features <= 0 || p.in_features <= 0 || p.num_tokens < 0)
    return invalid_argument("bf16 linear: bad shape");
  if (p.out_features % 8 != 0 || p.in_features % 8 != 0 || p.x_row_stride < p.in_features ||
      p.x_row_stride % 8 != 0 || p.y_row_stride < p.out_features || p.y_row_stride % 8 != 0)
    return invalid_argument("bf16 linear: N, K and row strides must be multiples of 8");
  if (p.num_tokens == 0) return ok_status();
  const int64_t m = p.num_tokens, n = p.out_features, k = p.in_features;
  const bool round = p.y_type == OutType::kF32Bf16;  // fp32 GEMM, then the rounding pass
  const OutType y_type = round ? OutType::kF32 : p.y_type;
  auto key = std::make_tuple(1, m, n, k, p.x_row_stride, p.y_row_stride, int(y_type));
  std::shared_ptr<Plan>& plan = plans_[key];
  cublasLtHandle_t lt = static_cast<cublasLtHandle_t>(lt_);
  if (!plan) {
    auto pl = std::make_shared<Plan>();
    DS_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
    const cudaDataType_t dt = out_is_f32(y_type) ? CUDA_R_32F : CUDA_R_16BF;
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->a, CUDA_R_16BF, uint64_t(k), uint64_t(n), k));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->b, CUDA_R_16BF, uint64_t(k), uint64_t(m), p.x_row_stride));
    DS_LT_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&pl->c, dt, uint64_t(n), uint64_t(m), p.y_row_stride));
    cublasLtMatmulPreference_t pref = nullptr;
    DS_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = lt_workspace_bytes_;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, pl->desc, pl->a, pl->b, pl->c, pl->c, pref, 1, &heur,
                                          &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      plans_.erase(key);
      return unimplemented(std::string("cuBLASLt has no bf16 algorithm (") + lt_status_name(st) +
                           ")");
    }
    pl->algo = heur.algo;
    plan = pl;
  }
  const float alpha = 1.0f, beta = 0.0f;
  DS_LT_RETURN_IF_ERROR(cublasLtMatmul(lt, plan->desc, &alpha, p.w, plan->a, p.x, plan->b, &beta,
                                       p.y, plan->c, p.y, plan->c, &plan->algo, lt_workspace_,
                                       lt_workspace_bytes_, stream));
  return round ? round_rows_bf16(p.y, m, n, p.y_row_stride, stream) : ok_status();
}

}  // namespace ds::cuda
