// Sparse MLA decode kernel (see sparse_mla_decode.h and NOTES.md).
//
// CTA (split k, query q, head group g), kD/64 warps; warp w owns head dims [64w, 64w+64) for every
// head of the group. Per tile of 16 keys:
//   0. (every 48 tiles) all threads resolve indices and page-table entries into shared memory;
//   1. warp w copies (4-stage cp.async pipeline, 3 tiles ahead) and dequantizes dims
//      [64w, 64w+64) of the 16 entries into a swizzled bf16 tile in shared memory: only the
//      columns its own QK^T and PV read, so this phase needs no block barrier (v4);
//   2. QK^T: warp w multiplies its 64 dims of Q (A fragments held in registers for the whole
//      kernel) by the tile (ldmatrix) and writes a partial score; the partials of the warps are
//      added in warp order (fixed, independent of the head-group size);
//   3. softmax of the tile (own max m_t, P = exp2(s - m_t) rounded to bf16, l_t = sum of P in key
//      order), then the fold  M' = max(M, m_t), a = 2^(M-M'), b = 2^(m_t-M'),
//      L = L a + l_t b,  O = O a + (P V) b, with P V one mma from zero per 8 output dims;
//   4. split 0 keeps folding; other splits store (m_t, l_t, P V) per tile to the workspace and the
//      combine kernel continues split 0's fold over them in tile order with the same arithmetic.
// Scores are kept in the log2 domain (scale * log2 e); the lse output is converted back.
// v5: the combine kernel is launched as a programmatic dependent of the attention kernel, and the
// batch-1 plan runs one tile per CTA. Experiment behind plan.tiles_per_step = 2 (16 heads): two
// tiles per step (phases 1-3 of both between the same two block barriers, folded in tile order:
// same bits); slower as written (NOTES.md), not the default.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/cuda/attention/sparse_mla_decode.h"
#include "kernels/cuda/attention/sparse_mla_trace.cuh"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/func_attributes.h"

// Timing experiments only (NOTES.md, "where the time goes"); 0 in every real build. 1 drops the
// QK^T mma, 2 drops the PV mma and fold, 3 drops the FP8 -> bf16 conversion (results are wrong).
#ifndef DS_SPARSE_MLA_ABLATE
#define DS_SPARSE_MLA_ABLATE 0
#endif
// Tiles per step that the plan picks at 16 heads per CTA: 1 (default) or 2 (the v5 experiment,
// slower on the H200: NOTES.md).
#ifndef DS_SPARSE_MLA_TILES_PER_STEP16
#define DS_SPARSE_MLA_TILES_PER_STEP16 1
#endif
// 1: the wgmma plan runs v9 (a producer warpgroup copies and dequantizes; the default since its
// in-place producer: 5-12% faster than v7 at batch 16-128, NOTES.md v9); 0: v7.
#ifndef DS_SPARSE_MLA_WARP_SPECIALIZED
#define DS_SPARSE_MLA_WARP_SPECIALIZED 1
#endif
// 1: the combine kernel is a programmatic dependent of the attention kernel (v5); 0: plain
// stream order (v4), kept for timing comparisons.
#ifndef DS_SPARSE_MLA_COMBINE_PDL
#define DS_SPARSE_MLA_COMBINE_PDL 1
#endif
// The fast combine (batch 1 at 64 heads: DS_SPARSE_MLA_COMBINE_FAST_MAX_PAIRS). 1 (the default):
// sparse_mla_combine_fast_kernel (session 39's v4: one warp per 128 dims, the partials through
// cp.async, the coefficients once per tile; batch 1 at 512 tokens 9.3 -> 8.2 us on H100 against
// session 38's form, NOTES.md session 40); 0: session 7's kernel, 20 tiles deep per thread.
#ifndef DS_SPARSE_MLA_COMBINE_FAST
#define DS_SPARSE_MLA_COMBINE_FAST 1
#endif
// 1: the batch-1 plan's CTAs load their keys' indices before the lengths (session 38); 0: after.
#ifndef DS_SPARSE_MLA_SPEC_INDEX
#define DS_SPARSE_MLA_SPEC_INDEX 0
#endif
// 1 (the default since session 39): the mma.sync kernel's grid is (head groups, queries, splits),
// so that the CTAs of the low splits, which have work whatever the lengths, are placed before the
// high ones (batch 1 at 512 tokens 10.4 -> 9.3 us on H100, NOTES.md session 39); 0: (splits,
// queries, head groups).
#ifndef DS_SPARSE_MLA_SPLIT_MAJOR
#define DS_SPARSE_MLA_SPLIT_MAJOR 1
#endif

#include "kernels/cuda/common/mbarrier.cuh"
#include "kernels/cuda/common/wgmma.cuh"

namespace ds::cuda {
namespace {

constexpr int kTile = kSparseMlaTileKeys;
constexpr bool kSparseMlaCombinePdl = DS_SPARSE_MLA_COMBINE_PDL != 0;
constexpr bool kSparseMlaCombineFast = DS_SPARSE_MLA_COMBINE_FAST != 0;
constexpr bool kSparseMlaSpecIndex = DS_SPARSE_MLA_SPEC_INDEX != 0;
constexpr bool kSparseMlaSplitMajor = DS_SPARSE_MLA_SPLIT_MAJOR != 0;
// Dims per block (one warp) of the fast combine: four blocks per (query, head) at head_dim 512,
// so that the partials' loads come from every SM.
constexpr int kCombineFastDims = 128;
// The programmatic combine launch (session 7's kernel 20 tiles deep, or the fast combine) only
// for a combine grid of at most this many blocks (query x head; batch <= 4 at 64 heads): there it
// is latency-bound (batch 1: -1.6 us with the one-tile-per-CTA plan). Batch 16 (1024 blocks) ran
// 3.6 us slower with it (H200, graph; NOTES.md) and keeps the v4 combine: plain stream order, 16
// tiles deep.
#ifndef DS_SPARSE_MLA_FAST_COMBINE_MAX_BLOCKS
#define DS_SPARSE_MLA_FAST_COMBINE_MAX_BLOCKS 256
#endif
// Of those, the fast combine kernel only for at most this many (query, head) pairs: batch 1 at 64
// heads. Session 38's form made batch 4 slower (11.9 -> 20.4 us at 512 tokens, 21.8 -> 28.0 at
// 32K, H100, NOTES.md session 39: 1024 blocks of 235 registers); v4 there: 12.35 -> 12.70 at 512,
// 22.37 -> 22.00 at 32K (session 40): no clear gain, so batch 2-4 keep session 7's kernel.
#ifndef DS_SPARSE_MLA_COMBINE_FAST_MAX_PAIRS
#define DS_SPARSE_MLA_COMBINE_FAST_MAX_PAIRS 64
#endif
constexpr int64_t kCombineFastMaxPairs = DS_SPARSE_MLA_COMBINE_FAST_MAX_PAIRS;
constexpr int64_t kFastCombineMaxBlocks = DS_SPARSE_MLA_FAST_COMBINE_MAX_BLOCKS;
constexpr int kSparseMlaTilesPerStep16 = DS_SPARSE_MLA_TILES_PER_STEP16;
// Whether the wgmma plan picks the kernel with a producer warpgroup (v9, NOTES.md) or v7's.
constexpr bool kSparseMlaWarpSpecialized = DS_SPARSE_MLA_WARP_SPECIALIZED != 0;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- split plan shared by the attention and combine kernels ------------------------------------
struct QuerySplit {
  int n;       // keys (window + compressed, -1 entries included)
  int tiles;   // ceil(n / tile keys): 16 (mma.sync kernel) or 64 (wgmma kernel)
  int splits;  // min(max_splits, tiles), at least 1
};

template <int kTileKeys = kTile>
__device__ __forceinline__ QuerySplit query_split(const SparseMlaParams& p, int q) {
  QuerySplit s;
  const int wn = p.window_len[q];
  const int cn = p.compressed_width > 0 ? p.compressed_len[q] : 0;
  s.n = wn + cn;
  s.tiles = (s.n + kTileKeys - 1) / kTileKeys;
  s.splits = max(1, min(p.plan.max_splits, s.tiles));
  return s;
}

__host__ __device__ inline bool fast_combine(const SparseMlaParams& p) {
  return kSparseMlaCombinePdl && p.plan.max_splits > 1 &&
         int64_t(p.num_queries) * p.num_heads <= kFastCombineMaxBlocks;
}

__device__ __forceinline__ int split_begin(const QuerySplit& s, int k) {
  return int((int64_t(s.tiles) * k) / s.splits);
}

// The fold's merge coefficients (shared by both kernels so that they compute the same bits).
__device__ __forceinline__ void merge_coeffs(float m_run, float m_tile, float& m_new, float& a,
                                             float& b) {
  m_new = fmaxf(m_run, m_tile);
  a = (m_run == kNegInf) ? 0.0f : exp2f(m_run - m_new);
  b = (m_tile == kNegInf) ? 0.0f : exp2f(m_tile - m_new);
}
__device__ __forceinline__ float merge_value(float run, float a, float tile, float b) {
  return __fmaf_rn(run, a, __fmul_rn(tile, b));
}
// 1 / (L + e^(sink - M)) (0 when the denominator is 0 or infinite) and the natural-log lse.
__device__ __forceinline__ float final_scale(float m, float l, const float* sink, int h) {
  float d = l;
  if (sink) d = __fadd_rn(d, exp2f(__fmul_rn(sink[h], kLog2e) - m));
  return (d > 0.0f && d < std::numeric_limits<float>::infinity()) ? __frcp_rn(d) : 0.0f;
}
__device__ __forceinline__ float final_lse(float m, float l) {
  return l > 0.0f ? (m + log2f(l)) * kLn2 : kNegInf;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Programmatic dependent launch (sm_90+; no-ops when the grid was launched without the attribute).
// A grid waits for the previous grid in its stream before reading any input, and only then lets
// its dependents launch, so a dependent that starts early sees every input of this grid written
// (the combine kernel reads the lengths before its own wait for the attention kernel's partials).
__device__ __forceinline__ void pdl_wait_then_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + C, fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

// 8 e4m3 values (two 32-bit words, in dim order) times the block scale 2^k -> 8 bf16 (exact:
// e4m3 x 2^k fits bf16). Shared by both kernels' dequantization.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint32_t w0, uint32_t w1, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const uint32_t word = h < 2 ? w0 : w1;
    const __nv_fp8x2_storage_t pair =
        __nv_fp8x2_storage_t((h & 1) ? (word >> 16) : (word & 0xFFFF));
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
    out[h] = pack_bf16x2(f.x * scale, f.y * scale);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Page of key `a` (from an address table) -> the byte address of its page; its slot and the
// pool's page size. Shared by both kernels.
__device__ __forceinline__ const uint8_t* kv_page_of(const SparseMlaParams& p, int2 a, int& slot,
                                                     int& page_size) {
  const bool from_window = a.y < 0;
  slot = a.y & 0x7FFFFFFF;
  page_size = from_window ? p.window.page_size : p.compressed.page_size;
  const uint8_t* pool = from_window ? p.window.pool : p.compressed.pool;
  const int64_t page_bytes = from_window ? p.window.page_bytes : p.compressed.page_bytes;
  return pool + int64_t(a.x) * page_bytes;
}

// The indices of keys [kTileKeys c0, kTileKeys c1) of query q (keys [0, wn) from the window
// list, [wn, n) from the compressed list; -1 past n), by all kThreads threads of the CTA: thread
// tid holds key tid + i kThreads of the chunk in idx[i].
template <int kTileKeys, int kThreads, int kIters>
__device__ __forceinline__ void load_indices(const SparseMlaParams& p, int q, int wn, int n, int c0,
                                             int c1, int tid, int (&idx)[kIters]) {
  const int count = (c1 - c0) * kTileKeys;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int k = tid + i * kThreads;
    const int j = c0 * kTileKeys + k;
    idx[i] = -1;
    if (k >= count) continue;
    if (j < wn)
      idx[i] = p.window_idx[int64_t(q) * p.window_width + j];
    else if (j < n)
      idx[i] = p.compressed_idx[int64_t(q) * p.compressed_width + (j - wn)];
  }
}

// The page-table entries of those keys into `addr` ({page or -1, slot | window << 31}; keys past
// the query's n keys and -1 indices get page -1).
template <int kTileKeys, int kThreads, int kIters>
__device__ __forceinline__ void resolve_pages(const SparseMlaParams& p, int seq, int wn, int c0,
                                              int c1, int tid, const int (&idx)[kIters],
                                              int2* addr) {
  const int count = (c1 - c0) * kTileKeys;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int k = tid + i * kThreads;
    if (k >= count) continue;
    const bool from_window = c0 * kTileKeys + k < wn;
    int2 a = make_int2(-1, 0);
    if (idx[i] >= 0) {
      // Fields picked by value (taking the address of the kernel parameter would copy it to the
      // stack).
      const int32_t* table = from_window ? p.window.page_table : p.compressed.page_table;
      const int stride = from_window ? p.window.page_table_stride : p.compressed.page_table_stride;
      const int page_size = from_window ? p.window.page_size : p.compressed.page_size;
      a.x = table[int64_t(seq) * stride + idx[i] / page_size];
      a.y = (idx[i] % page_size) | (from_window ? int(0x80000000u) : 0);
    }
    addr[k] = a;
  }
}

// Resolves the indices and page-table entries of keys [kTileKeys c0, kTileKeys c1) of query q
// into `addr`. All index loads are issued before the page-table loads that depend on them (two
// memory round trips per chunk). Shared by the kernels.
template <int kTileKeys, int kThreads, int kIters>
__device__ __forceinline__ void resolve_addresses(const SparseMlaParams& p, int q, int seq, int wn,
                                                  int n, int c0, int c1, int tid, int2* addr) {
  int idx[kIters];
  load_indices<kTileKeys, kThreads, kIters>(p, q, wn, n, c0, c1, tid, idx);
  resolve_pages<kTileKeys, kThreads, kIters>(p, seq, wn, c0, c1, tid, idx, addr);
}

__device__ __forceinline__ int spart_swizzle(int row) {
  return ((row >> 1) & 1) << 3;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [16][kD] bf16 tile.
template <int kD>
__device__ __forceinline__ uint32_t kv_offset(int row, int chunk) {
  return uint32_t(row * kD * 2 + ((chunk ^ (row & 7)) << 4));
}

// kP: tiles per step (v5). A step runs the dequantize -> QK^T -> barrier -> softmax -> barrier ->
// PV chain over kP tiles at once (their loads, mma and softmax interleaved), and folds them one
// after the other in tile order with the same arithmetic as kP = 1: the bits do not change.
template <int kD, int kMT, int kP = 1>
struct Config {
  static constexpr int kWarps = kD / 64;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHG = kMT * 16;  // heads per CTA
  static constexpr int kNope = kD - 64;
  static constexpr int kDataBytes = kNope + 128;                 // 576 for kD = 512
  static constexpr int kScaleBytes = kNope / 64 + 1;             // 8 for kD = 512
  static constexpr int kThreadsPerEntry = kThreads / kTile;      // each thread: 32 dims of an entry
  static constexpr int kKeysPerThread = kTile * kHG / kThreads;  // softmax: keys per thread
  static constexpr int kThreadsPerRow = kTile / kKeysPerThread;
  static constexpr int kPStride = 24;  // bf16 per P row (48 B: no conflicts)
  static constexpr int kStages = 4;    // raw tiles in flight (cp.async)
  // Data, then one 4-byte scale slot per warp (each warp copies the scale word it needs, so
  // that no warp reads bytes another warp copied: the dequantization needs no block barrier).
  static constexpr int kScaleSlots = (4 * kWarps + 15) / 16 * 16;
  static constexpr int kStageEntry = kDataBytes + kScaleSlots;
  static constexpr bool kScaleAsync = kScaleBytes == 8;  // scales 8-byte aligned: cp.async
  // Tiles per resolved address chunk: 48 covers the 40 tiles of a 640-key query in one chunk
  // (no pipeline drain and second index/page-table round trip in the middle of the keys).
  static constexpr int kAddrTiles = 48;
  static constexpr int kResolveIters = (kAddrTiles * kTile + kThreads - 1) / kThreads;
  // Shared memory layout (bytes).
  // Tiles issued ahead of the step that needs them (prologue): 3 at kP = 1 (the slot of tile t
  // is refilled one step later), 4 at kP = 2 (a step refills the two slots it just dequantized).
  static constexpr int kAhead = kStages - 2 + kP;
  static constexpr int kKvBytes = kTile * kD * 2;  // one dequantized tile (kP of them)
  static constexpr int kStageBytes = kStages * kTile * kStageEntry;
  static constexpr int kSpartFloats = kWarps * kHG * kTile;  // one tile's partial scores
  static constexpr int kSpartBytes = kP * kSpartFloats * 4;
  static constexpr int kPElems = kHG * kPStride;  // one tile's P
  static constexpr int kPBytes = kP * kPElems * 2;
  // run_m, run_l, coef (kP tiles), key_ok (kP tiles)
  static constexpr int kStatBytes = (2 + 2 * kP) * kHG * 4 + kP * kTile * 4;
  static constexpr int kAddrBytes = kAddrTiles * kTile * 8;
  static constexpr int kOffStage = kP * kKvBytes;
  static constexpr int kOffSpart = kOffStage + kStageBytes;
  static constexpr int kOffP = kOffSpart + kSpartBytes;
  static constexpr int kOffStat = kOffP + kPBytes;
  static constexpr int kOffAddr = kOffStat + kStatBytes;
  static constexpr int kSmemBytes = kOffAddr + kAddrBytes;
  static_assert(kThreadsPerEntry * 32 == kD, "one thread per 32 dims of an entry");
  static_assert(kTile * 2 == 32, "loader: a warp covers its 64 dims of the 16 keys, 2 lanes/key");
  static_assert(kKeysPerThread >= 1 && kTile % kKeysPerThread == 0, "softmax mapping");
  static_assert(kNope % 64 == 0 && kNope > 0, "nope dims: a positive multiple of 64");
  static_assert(kSmemBytes <= 99 * 1024, "portable path: at most 99 KB of shared memory");
  static_assert(kP == 1 || kP == 2, "tiles per step");
  static_assert(kAhead <= kStages && kAddrTiles % kP == 0, "pipeline");
};

template <int kD, int kMT, int kP>
__global__ void __launch_bounds__(Config<kD, kMT, kP>::kThreads, kMT == 1 ? 2 : 1)
    sparse_mla_decode_kernel(const SparseMlaParams p) {
  using C = Config<kD, kMT, kP>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* kv_tile = smem;
  uint8_t* stage = smem + C::kOffStage;
  // [warp][head][key ^ spart_swizzle(head)]: the swizzle makes the fragment stores conflict-free
  // and keeps each aligned group of <= 8 keys contiguous for the vector loads of the softmax.
  float* spart = reinterpret_cast<float*>(smem + C::kOffSpart);
  // [tile of the step][head][24]
  __nv_bfloat16* p_tile = reinterpret_cast<__nv_bfloat16*>(smem + C::kOffP);
  float* run_m = reinterpret_cast<float*>(smem + C::kOffStat);
  float* run_l = run_m + C::kHG;
  // [tile of the step][head] {a, b} of the fold
  float2* coef = reinterpret_cast<float2*>(run_l + C::kHG);
  int* key_ok = reinterpret_cast<int*>(coef + kP * C::kHG);  // [tile of the step][key]
  int2* addr = reinterpret_cast<int2*>(smem + C::kOffAddr);  // {page or -1, slot | window << 31}

  // Grid (splits, queries, head groups), or with kSparseMlaSplitMajor (head groups, queries,
  // splits): the CTAs of the first splits, which have work whatever the lengths, placed first.
  const int split = kSparseMlaSplitMajor ? blockIdx.z : blockIdx.x;
  const int q = blockIdx.y;
  const int h0 = (kSparseMlaSplitMajor ? blockIdx.x : blockIdx.z) * C::kHG;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

#if DS_SPARSE_MLA_TRACE
  // Stamps of thread 0 (sparse_mla_trace.cuh): 0 entry, 1 after the PDL wait, 2 lengths read,
  // 3 addresses resolved, 4 first tile dequantized, 5 its partial scores summed, 6 all tiles done,
  // 7 exit.
  __shared__ unsigned long long tr_s[mla_trace::kStamps];
  const bool tracing = p.num_queries == 1 && kP == 1 && p.plan.max_splits == mla_trace::kSplits &&
                       gridDim.x * gridDim.y * gridDim.z <= unsigned(mla_trace::kCtas);
  if (tracing && tid < mla_trace::kStamps) tr_s[tid] = 0;
#define DS_MLA_STAMP(k)                                           \
  do {                                                            \
    if (tracing && tid == 0) tr_s[k] = mla_trace::now(); \
  } while (0)
  DS_MLA_STAMP(0);
#else
#define DS_MLA_STAMP(k) \
  do {                  \
  } while (0)
#endif
  // Everything this grid reads may come from the previous kernel (p.pdl); the fast combine
  // kernel launched after it may start now (its blocks wait for this grid's partials). Uniform
  // branch: without either, the kernel runs exactly the v4 instructions.
  if (p.pdl || fast_combine(p)) pdl_wait_then_trigger();
#if DS_SPARSE_MLA_TRACE
  const unsigned int tr_gen = tracing ? mla_trace::gen() : 0u;
  DS_MLA_STAMP(1);
#endif
  // One tile per CTA (the batch-1 plan): split k works on tile k whatever the query's length, and
  // with a full window (the case past the window's first tokens) its keys' indices sit at fixed
  // places. They are loaded before the lengths and used if the window is full (one dependent
  // round trip less); otherwise resolve() loads them again.
  const bool spec = kSparseMlaSpecIndex && kP == 1 && p.plan.max_splits >= p.plan.max_tiles;
  int spec_idx[C::kResolveIters];
  if (spec)
    load_indices<kTile, C::kThreads, C::kResolveIters>(p, q, p.window_width,
                                                       p.window_width + p.compressed_width, split,
                                                       split + 1, tid, spec_idx);
  const QuerySplit qs = query_split(p, q);
#if DS_SPARSE_MLA_TRACE
  auto tr_flush = [&] {
    if (!(tracing && tid == 0)) return;
    tr_s[7] = mla_trace::now();
    const int slot = int(tr_gen % unsigned(mla_trace::kRing));
    const int cta = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    for (int k = 0; k < mla_trace::kStamps; ++k) mla_trace::g_att[slot][cta][k] = tr_s[k];
    mla_trace::g_att_meta[slot][cta] = make_int4(mla_trace::smid(), max(qs.n, 1), p.pdl ? 1 : 0,
                                                 int(tr_gen));
  };
  DS_MLA_STAMP(2);
  if (split >= qs.splits) {
    tr_flush();
    return;
  }
#else
  if (split >= qs.splits) return;
#endif
  const int t_begin = split_begin(qs, split);
  const int t_end = split_begin(qs, split + 1);
  const bool fold = split == 0;  // split 0 folds its tiles; the others store one partial per tile
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int wn = p.window_len[q];
  const int seq = p.query_seq[q];
  const int64_t slot_base = int64_t(q) * p.plan.max_tiles;
  float* ws_o = p.workspace;
  float* ws_ml = p.workspace + int64_t(p.num_queries) * p.plan.max_tiles * p.num_heads * kD;

  if (tid < C::kHG) {
    run_m[tid] = kNegInf;
    run_l[tid] = 0.0f;
  }

  // Q A-fragments of this warp's 64 dims, all heads of the group: q_frag[mt][kk][4].
  uint32_t q_frag[kMT][4][4];
  {
    const uint16_t* qb = p.q + int64_t(q) * p.num_heads * kD;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = h0 + mt * 16 + (lane >> 2) + ((i & 1) ? 8 : 0);
          const int d = warp * 64 + kk * 16 + 2 * (lane & 3) + ((i & 2) ? 8 : 0);
          q_frag[mt][kk][i] =
              h < p.num_heads ? *reinterpret_cast<const uint32_t*>(qb + int64_t(h) * kD + d) : 0u;
        }
  }

  float o[kMT][8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][nb][i] = 0.0f;

  // Loader role: entry `ld_entry` of the tile, dims [32 ld_part, 32 ld_part + 32). Warp w copies
  // and dequantizes exactly the dims [64w, 64w + 64) that its own QK^T and PV read (the swizzle
  // keeps them in the warp's own 16-byte chunks), so a tile needs only __syncwarp between the
  // copy, the dequantization and the mma phases; the block barriers are left to the cross-warp
  // score reduction (v4, NOTES.md).
  const int ld_entry = lane >> 1;
  const int ld_part = warp * 2 + (lane & 1);
  const bool ld_nope = ld_part * 32 < C::kNope;
  const int ld_off = ld_nope ? ld_part * 32 : C::kNope + 2 * (ld_part * 32 - C::kNope);
  const int ld_chunks = ld_nope ? 2 : 4;

  auto page_ptr_of = [&](int2 a, int& slot, int& page_size) {
    return kv_page_of(p, a, slot, page_size);
  };
  auto resolve = [&](int c0, int c1) {
    resolve_addresses<kTile, C::kThreads, C::kResolveIters>(p, q, seq, wn, qs.n, c0, c1, tid, addr);
  };

  auto issue_tile = [&](int t, int c0, int st) {
    const int2 a = addr[(t - c0) * kTile + ld_entry];
    if (a.x < 0) return;
    int slot, page_size;
    const uint8_t* page_ptr = page_ptr_of(a, slot, page_size);
    const uint8_t* data = page_ptr + int64_t(slot) * C::kDataBytes + ld_off;
    uint8_t* dst = stage + (st * kTile + ld_entry) * C::kStageEntry;
    for (int c = 0; c < ld_chunks; ++c) cp_async16(dst + ld_off + 16 * c, data + 16 * c);
    if (C::kScaleAsync && ld_nope && (lane & 1) == 0)  // the 4-byte word holding scale `warp`
      cp_async4(dst + C::kDataBytes + 4 * warp, page_ptr + int64_t(page_size) * C::kDataBytes +
                                                    int64_t(slot) * C::kScaleBytes + (warp & ~3));
  };

  // u: tile of the step; !valid: an empty tile (all keys masked) past the split's end.
  auto dequant_tile = [&](int t, int c0, int st, int u, bool valid = true) {
    uint8_t* kvu = kv_tile + u * C::kKvBytes;
    const int2 a = addr[(t - c0) * kTile + ld_entry];
    const bool ok = valid && a.x >= 0;
    const int chunk0 = (ld_part * 32) / 8;  // 16-byte chunk of the bf16 row
    if (ld_part == 0) key_ok[u * kTile + ld_entry] = ok ? 1 : 0;
    if (!ok || DS_SPARSE_MLA_ABLATE == 3) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        *reinterpret_cast<uint4*>(kvu + kv_offset<kD>(ld_entry, chunk0 + c)) =
            make_uint4(0, 0, 0, 0);
      return;
    }
    const uint8_t* src = stage + (st * kTile + ld_entry) * C::kStageEntry;
    if (ld_nope) {
      uint32_t sbyte;
      if (C::kScaleAsync) {
        sbyte = src[C::kDataBytes + 4 * warp + (warp & 3)];  // ld_part / 2 == warp
      } else {
        int slot, page_size;
        const uint8_t* page_ptr = page_ptr_of(a, slot, page_size);
        sbyte = __ldg(page_ptr + int64_t(page_size) * C::kDataBytes +
                      int64_t(slot) * C::kScaleBytes + ld_part / 2);
      }
      const float scale = __uint_as_float(sbyte << 23);  // 2^(byte - 127)
      const uint4 raw[2] = {reinterpret_cast<const uint4*>(src + ld_off)[0],
                            reinterpret_cast<const uint4*>(src + ld_off)[1]};
      const uint32_t* w = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
      for (int c = 0; c < 4; ++c)  // 8 fp8 values -> 8 bf16 per 16-byte chunk
        *reinterpret_cast<uint4*>(kvu + kv_offset<kD>(ld_entry, chunk0 + c)) =
            e4m3x8_to_bf16x8(w[c * 2], w[c * 2 + 1], scale);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        *reinterpret_cast<uint4*>(kvu + kv_offset<kD>(ld_entry, chunk0 + c)) =
            reinterpret_cast<const uint4*>(src + ld_off)[c];
    }
  };

  const uint32_t kv_base = smem_addr(kv_tile);
  const uint32_t p_base = smem_addr(p_tile);
  const int mi = lane >> 3, ri = lane & 7;

  if constexpr (kP == 1) {
    // One tile per step (the v4 loop, the default).
    for (int c0 = t_begin; c0 < t_end; c0 += C::kAddrTiles) {
      const int c1 = min(t_end, c0 + C::kAddrTiles);
      __syncthreads();  // earlier readers of addr are done
      if (spec && wn == p.window_width && c0 == split && c1 == split + 1) {
#pragma unroll
        for (int i = 0; i < C::kResolveIters; ++i)  // keys past the query's n
          if (c0 * kTile + tid + i * C::kThreads >= qs.n) spec_idx[i] = -1;
        resolve_pages<kTile, C::kThreads, C::kResolveIters>(p, seq, wn, c0, c1, tid, spec_idx,
                                                            addr);
      } else {
        resolve(c0, c1);
      }
      __syncthreads();
      if (c0 == t_begin) DS_MLA_STAMP(3);
#pragma unroll
      for (int s = 0; s < C::kStages - 1; ++s) {
        if (c0 + s < c1) issue_tile(c0 + s, c0, s);
        cp_async_commit();
      }
      for (int t = c0; t < c1; ++t) {
        cp_async_wait<C::kStages - 2>();  // this thread's copies for tile t have landed
        // The warp's copies (the scale word) visible to the warp; its PV reads of the previous
        // tile's columns are done. Other warps never touch this warp's stage bytes or columns.
        __syncwarp();
        dequant_tile(t, c0, (t - c0) % C::kStages, 0);
        if (t == t_begin) DS_MLA_STAMP(4);
        if (t + C::kStages - 1 < c1)
          issue_tile(t + C::kStages - 1, c0, (t - c0 + C::kStages - 1) % C::kStages);
        cp_async_commit();
        __syncwarp();  // the warp's dequantized columns visible to its ldmatrix

        // ---- QK^T: partial scores over this warp's 64 dims ----
        {
          uint32_t kb[4][4];
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const int key = (mi >> 1) * 8 + ri;
            const int chunk = (warp * 64 + kk * 16) / 8 + (mi & 1);
            ldmatrix_x4(kb[kk], kv_base + kv_offset<kD>(key, chunk));
          }
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
              if (DS_SPARSE_MLA_ABLATE == 1) continue;
              mma_bf16(acc[0], q_frag[mt][kk], kb[kk][0], kb[kk][1], acc[0]);
              mma_bf16(acc[1], q_frag[mt][kk], kb[kk][2], kb[kk][3], acc[1]);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int row = mt * 16 + (lane >> 2) + hh * 8;
              float* sp = spart + (warp * C::kHG + row) * kTile;
              const int sw = spart_swizzle(row);
#pragma unroll
              for (int nt = 0; nt < 2; ++nt)
                *reinterpret_cast<float2*>(sp + ((nt * 8 + 2 * (lane & 3)) ^ sw)) =
                    make_float2(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
          }
        }
        __syncthreads();
        if (t == t_begin) DS_MLA_STAMP(5);

        // ---- softmax of the tile (scores summed in warp order, tile max, P in bf16), then the
        // fold statistics by the first thread of each row: l_t sums P in key order ----
        {
          const int row = tid / C::kThreadsPerRow;
          const int key0 = (tid % C::kThreadsPerRow) * C::kKeysPerThread;
          float s[C::kKeysPerThread];
          float m = kNegInf;
          const int sw = spart_swizzle(row);
          // Partial scores of the warps, added in warp order (vector loads where the group allows).
#pragma unroll
          for (int w = 0; w < C::kWarps; ++w) {
            const float* sp = spart + (w * C::kHG + row) * kTile;
            float v[C::kKeysPerThread];
            if constexpr (C::kKeysPerThread == 4 || C::kKeysPerThread == 8) {
#pragma unroll
              for (int g = 0; g < C::kKeysPerThread; g += 4) {
                const float4 f = *reinterpret_cast<const float4*>(sp + ((key0 + g) ^ sw));
                v[g] = f.x;
                v[g + 1] = f.y;
                v[g + 2] = f.z;
                v[g + 3] = f.w;
              }
            } else if constexpr (C::kKeysPerThread == 2) {
              const float2 f = *reinterpret_cast<const float2*>(sp + (key0 ^ sw));
              v[0] = f.x;
              v[1] = f.y;
            } else {
#pragma unroll
              for (int i = 0; i < C::kKeysPerThread; ++i) v[i] = sp[(key0 + i) ^ sw];
            }
#pragma unroll
            for (int i = 0; i < C::kKeysPerThread; ++i) s[i] = w == 0 ? v[i] : s[i] + v[i];
          }
#pragma unroll
          for (int i = 0; i < C::kKeysPerThread; ++i) {
            const float acc = s[i];
            const int j = t * kTile + key0 + i;
            s[i] = (j < qs.n && key_ok[key0 + i]) ? acc * scale_log2 : kNegInf;
            m = fmaxf(m, s[i]);
          }
#pragma unroll
          for (int off = C::kThreadsPerRow / 2; off > 0; off >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
          float pr[C::kKeysPerThread];
#pragma unroll
          for (int i = 0; i < C::kKeysPerThread; ++i) {
            const __nv_bfloat16 b = __float2bfloat16_rn(m == kNegInf ? 0.0f : exp2f(s[i] - m));
            p_tile[row * C::kPStride + key0 + i] = b;
            pr[i] = __bfloat162float(b);
          }
          const int row_lane0 = (lane / C::kThreadsPerRow) * C::kThreadsPerRow;
          float l_t = 0.0f;
#pragma unroll
          for (int k = 0; k < kTile; ++k)
            l_t += __shfl_sync(0xFFFFFFFFu, pr[k % C::kKeysPerThread],
                               row_lane0 + k / C::kKeysPerThread);
          if (key0 == 0) {
            if (fold) {
              float m_new, a, b;
              merge_coeffs(run_m[row], m, m_new, a, b);
              run_l[row] = merge_value(run_l[row], a, l_t, b);
              run_m[row] = m_new;
              coef[row] = make_float2(a, b);
            } else {
              coef[row] = make_float2(0.0f, 1.0f);
              if (h0 + row < p.num_heads) {
                float* ml = ws_ml + ((slot_base + t) * p.num_heads + h0 + row) * 2;
                ml[0] = m;
                ml[1] = l_t;
              }
            }
          }
        }
        __syncthreads();

        // ---- PV: per 8 output dims one mma from zero, then O = O a + (P V) b ----
        {
          uint32_t pa[kMT][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            const int row = mt * 16 + (mi & 1) * 8 + ri;
            ldmatrix_x4(pa[mt], p_base + uint32_t((row * C::kPStride + (mi >> 1) * 8) * 2));
          }
#pragma unroll
          for (int nb2 = 0; nb2 < 4; ++nb2) {
            uint32_t vb[4];
            const int key = (mi & 1) * 8 + ri;
            const int chunk = (warp * 64 + nb2 * 16) / 8 + (mi >> 1);
            ldmatrix_x4_trans(vb, kv_base + kv_offset<kD>(key, chunk));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              const int r0 = mt * 16 + (lane >> 2);
              const float2 c0 = coef[r0], c1 = coef[r0 + 8];
              const float a0 = c0.x, b0 = c0.y, a1 = c1.x, b1 = c1.y;
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                if (DS_SPARSE_MLA_ABLATE == 2) continue;
                const float zero[4] = {0, 0, 0, 0};
                float pv[4];
                mma_bf16(pv, pa[mt], vb[2 * half], vb[2 * half + 1], zero);
                float* acc = o[mt][nb2 * 2 + half];
                acc[0] = merge_value(acc[0], a0, pv[0], b0);
                acc[1] = merge_value(acc[1], a0, pv[1], b0);
                acc[2] = merge_value(acc[2], a1, pv[2], b1);
                acc[3] = merge_value(acc[3], a1, pv[3], b1);
              }
            }
          }
        }
        if (!fold) {  // store this tile's P V as its own partial
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int h = h0 + mt * 16 + (lane >> 2) + hh * 8;
              if (h >= p.num_heads) continue;
              float* dst =
                  ws_o + ((slot_base + t) * p.num_heads + h) * kD + warp * 64 + 2 * (lane & 3);
#pragma unroll
              for (int nb = 0; nb < 8; ++nb)
                *reinterpret_cast<float2*>(dst + nb * 8) =
                    make_float2(o[mt][nb][2 * hh], o[mt][nb][2 * hh + 1]);
            }
        }
      }
    }
  } else {
    // kP tiles per step (v5 experiment, plan.tiles_per_step = 2, NOTES.md). No per-tile guards
    // around the mma: a step past the split's end runs on an empty tile (all keys masked, zero
    // entries; fold coefficients (1, 0) leave O and the statistics unchanged, no partial stored).
    for (int c0 = t_begin; c0 < t_end; c0 += C::kAddrTiles) {
      const int c1 = min(t_end, c0 + C::kAddrTiles);
      __syncthreads();  // earlier readers of addr are done
      resolve(c0, c1);
      __syncthreads();
#pragma unroll
      for (int s = 0; s < C::kAhead; ++s) {
        if (c0 + s < c1) issue_tile(c0 + s, c0, s);
        cp_async_commit();
      }
      for (int t = c0; t < c1; t += kP) {
        // Tiles t .. t + np - 1 in this step (np < kP only at the end of a split: uniform).
        const int np = min(kP, c1 - t);
        cp_async_wait<C::kStages - 2>();  // this thread's copies for tiles t .. t + kP - 1 landed
        // The warp's copies (the scale word) visible to the warp; its PV reads of the previous
        // step's columns are done. Other warps never touch this warp's stage bytes or columns.
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kP; ++u) dequant_tile(t + u, c0, (t + u - c0) % C::kStages, u, u < np);
        if (kP > 1) __syncwarp();  // the scale words read before their slots are refilled
#pragma unroll
        for (int u = 0; u < kP; ++u) {
          const int tn = t + u + C::kAhead;
          if (tn < c1) issue_tile(tn, c0, (tn - c0) % C::kStages);
          cp_async_commit();
        }
        __syncwarp();  // the warp's dequantized columns visible to its ldmatrix

        // ---- QK^T: partial scores over this warp's 64 dims, the step's tiles interleaved ----
        {
          uint32_t kb[kP][4][4];
#pragma unroll
          for (int u = 0; u < kP; ++u)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
              const int key = (mi >> 1) * 8 + ri;
              const int chunk = (warp * 64 + kk * 16) / 8 + (mi & 1);
              ldmatrix_x4(kb[u][kk],
                          kv_base + uint32_t(u * C::kKvBytes) + kv_offset<kD>(key, chunk));
            }
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            float acc[kP][2][4];
#pragma unroll
            for (int u = 0; u < kP; ++u)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[u][i / 4][i % 4] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
              for (int u = 0; u < kP; ++u) {
                if (DS_SPARSE_MLA_ABLATE == 1) continue;
                mma_bf16(acc[u][0], q_frag[mt][kk], kb[u][kk][0], kb[u][kk][1], acc[u][0]);
                mma_bf16(acc[u][1], q_frag[mt][kk], kb[u][kk][2], kb[u][kk][3], acc[u][1]);
              }
#pragma unroll
            for (int u = 0; u < kP; ++u)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int row = mt * 16 + (lane >> 2) + hh * 8;
                float* sp = spart + u * C::kSpartFloats + (warp * C::kHG + row) * kTile;
                const int sw = spart_swizzle(row);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                  *reinterpret_cast<float2*>(sp + ((nt * 8 + 2 * (lane & 3)) ^ sw)) =
                      make_float2(acc[u][nt][2 * hh], acc[u][nt][2 * hh + 1]);
              }
          }
        }
        __syncthreads();

        // ---- softmax of each tile (scores summed in warp order, tile max, P in bf16), then the
        // fold statistics by the first thread of each row, tile after tile: l_t sums P in key
        // order ----
        {
          const int row = tid / C::kThreadsPerRow;
          const int key0 = (tid % C::kThreadsPerRow) * C::kKeysPerThread;
          const int sw = spart_swizzle(row);
          const int row_lane0 = (lane / C::kThreadsPerRow) * C::kThreadsPerRow;
          float m_u[kP], l_u[kP];
#pragma unroll
          for (int u = 0; u < kP; ++u) {
            float s[C::kKeysPerThread];
            float m = kNegInf;
            // Partial scores of the warps, added in warp order (vector loads where possible).
#pragma unroll
            for (int w = 0; w < C::kWarps; ++w) {
              const float* sp = spart + u * C::kSpartFloats + (w * C::kHG + row) * kTile;
              float v[C::kKeysPerThread];
              if constexpr (C::kKeysPerThread == 4 || C::kKeysPerThread == 8) {
#pragma unroll
                for (int g = 0; g < C::kKeysPerThread; g += 4) {
                  const float4 f = *reinterpret_cast<const float4*>(sp + ((key0 + g) ^ sw));
                  v[g] = f.x;
                  v[g + 1] = f.y;
                  v[g + 2] = f.z;
                  v[g + 3] = f.w;
                }
              } else if constexpr (C::kKeysPerThread == 2) {
                const float2 f = *reinterpret_cast<const float2*>(sp + (key0 ^ sw));
                v[0] = f.x;
                v[1] = f.y;
              } else {
#pragma unroll
                for (int i = 0; i < C::kKeysPerThread; ++i) v[i] = sp[(key0 + i) ^ sw];
              }
#pragma unroll
              for (int i = 0; i < C::kKeysPerThread; ++i) s[i] = w == 0 ? v[i] : s[i] + v[i];
            }
#pragma unroll
            for (int i = 0; i < C::kKeysPerThread; ++i) {
              const float acc = s[i];
              const int j = (t + u) * kTile + key0 + i;
              s[i] = (j < qs.n && key_ok[u * kTile + key0 + i]) ? acc * scale_log2 : kNegInf;
              m = fmaxf(m, s[i]);
            }
#pragma unroll
            for (int off = C::kThreadsPerRow / 2; off > 0; off >>= 1)
              m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
            float pr[C::kKeysPerThread];
#pragma unroll
            for (int i = 0; i < C::kKeysPerThread; ++i) {
              const __nv_bfloat16 b = __float2bfloat16_rn(m == kNegInf ? 0.0f : exp2f(s[i] - m));
              p_tile[u * C::kPElems + row * C::kPStride + key0 + i] = b;
              pr[i] = __bfloat162float(b);
            }
            float l_t = 0.0f;
#pragma unroll
            for (int k = 0; k < kTile; ++k)
              l_t += __shfl_sync(0xFFFFFFFFu, pr[k % C::kKeysPerThread],
                                 row_lane0 + k / C::kKeysPerThread);
            m_u[u] = m;
            l_u[u] = l_t;
          }
          if (key0 == 0) {
            if (fold) {
              float rm = run_m[row], rl = run_l[row];
#pragma unroll
              for (int u = 0; u < kP; ++u) {
                if (u >= np) {  // the empty tile past the split's end: O = O * 1 + 0
                  coef[u * C::kHG + row] = make_float2(1.0f, 0.0f);
                  continue;
                }
                float m_new, a, b;
                merge_coeffs(rm, m_u[u], m_new, a, b);
                rl = merge_value(rl, a, l_u[u], b);
                rm = m_new;
                coef[u * C::kHG + row] = make_float2(a, b);
              }
              run_l[row] = rl;
              run_m[row] = rm;
            } else {
#pragma unroll
              for (int u = 0; u < kP; ++u) {
                coef[u * C::kHG + row] = u < np ? make_float2(0.0f, 1.0f) : make_float2(1.0f, 0.0f);
                if (u >= np) continue;
                if (h0 + row < p.num_heads) {
                  float* ml = ws_ml + ((slot_base + t + u) * p.num_heads + h0 + row) * 2;
                  ml[0] = m_u[u];
                  ml[1] = l_u[u];
                }
              }
            }
          }
        }
        __syncthreads();

        // ---- PV: per 8 output dims one mma from zero per tile, then O = O a + (P V) b for the
        // step's tiles in order ----
        {
          uint32_t pa[kP][kMT][4];
#pragma unroll
          for (int u = 0; u < kP; ++u)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              const int row = mt * 16 + (mi & 1) * 8 + ri;
              ldmatrix_x4(
                  pa[u][mt],
                  p_base + uint32_t((u * C::kPElems + row * C::kPStride + (mi >> 1) * 8) * 2));
            }
          float2 cf[kP][kMT][2];  // fold coefficients of rows r0 and r0 + 8
#pragma unroll
          for (int u = 0; u < kP; ++u)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              cf[u][mt][0] = coef[u * C::kHG + mt * 16 + (lane >> 2)];
              cf[u][mt][1] = coef[u * C::kHG + mt * 16 + (lane >> 2) + 8];
            }
#pragma unroll
          for (int nb2 = 0; nb2 < 4; ++nb2) {
            uint32_t vb[kP][4];
            const int key = (mi & 1) * 8 + ri;
            const int chunk = (warp * 64 + nb2 * 16) / 8 + (mi >> 1);
#pragma unroll
            for (int u = 0; u < kP; ++u)
              ldmatrix_x4_trans(vb[u],
                                kv_base + uint32_t(u * C::kKvBytes) + kv_offset<kD>(key, chunk));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              const int r0 = mt * 16 + (lane >> 2);
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                if (DS_SPARSE_MLA_ABLATE == 2) continue;
                const float zero[4] = {0, 0, 0, 0};
                float pv[kP][4];
#pragma unroll
                for (int u = 0; u < kP; ++u)
                  mma_bf16(pv[u], pa[u][mt], vb[u][2 * half], vb[u][2 * half + 1], zero);
                float* acc = o[mt][nb2 * 2 + half];
#pragma unroll
                for (int u = 0; u < kP; ++u) {
                  const float2 c0 = cf[u][mt][0], c1 = cf[u][mt][1];
                  acc[0] = merge_value(acc[0], c0.x, pv[u][0], c0.y);
                  acc[1] = merge_value(acc[1], c0.x, pv[u][1], c0.y);
                  acc[2] = merge_value(acc[2], c1.x, pv[u][2], c1.y);
                  acc[3] = merge_value(acc[3], c1.x, pv[u][3], c1.y);
                  if (!fold && u < np) {  // tile t + u's P V is its own partial
                    const int h = h0 + r0;
                    float* dst = ws_o + ((slot_base + t + u) * p.num_heads + h) * kD + warp * 64 +
                                 2 * (lane & 3) + (nb2 * 2 + half) * 8;
                    if (h < p.num_heads)
                      *reinterpret_cast<float2*>(dst) = make_float2(acc[0], acc[1]);
                    if (h + 8 < p.num_heads)
                      *reinterpret_cast<float2*>(dst + 8 * kD) = make_float2(acc[2], acc[3]);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  DS_MLA_STAMP(6);
#if DS_SPARSE_MLA_TRACE
  if (!fold) {
    tr_flush();
    return;
  }
#else
  if (!fold) return;
#endif
  __syncthreads();  // run_m / run_l final

  if (qs.splits > 1) {  // split 0's fold state -> slot 0, continued by the combine kernel
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = mt * 16 + (lane >> 2) + hh * 8;
        const int h = h0 + row;
        if (h >= p.num_heads) continue;
        float* dst = ws_o + (slot_base * p.num_heads + h) * kD + warp * 64 + 2 * (lane & 3);
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
          *reinterpret_cast<float2*>(dst + nb * 8) =
              make_float2(o[mt][nb][2 * hh], o[mt][nb][2 * hh + 1]);
      }
    if (tid < C::kHG && h0 + tid < p.num_heads) {
      float* ml = ws_ml + (slot_base * p.num_heads + h0 + tid) * 2;
      ml[0] = run_m[tid];
      ml[1] = run_l[tid];
    }
#if DS_SPARSE_MLA_TRACE
    tr_flush();
#endif
    return;
  }
  // Single split: normalize and write the output directly.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = mt * 16 + (lane >> 2) + hh * 8;
      const int h = h0 + row;
      if (h >= p.num_heads) continue;
      const float inv = final_scale(run_m[row], run_l[row], p.sink, h);
      uint16_t* dst = p.out + (int64_t(q) * p.num_heads + h) * kD + warp * 64 + 2 * (lane & 3);
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
        *reinterpret_cast<uint32_t*>(dst + nb * 8) =
            pack_bf16x2(__fmul_rn(o[mt][nb][2 * hh], inv), __fmul_rn(o[mt][nb][2 * hh + 1], inv));
    }
  if (p.lse && tid < C::kHG && h0 + tid < p.num_heads)
    p.lse[int64_t(q) * p.num_heads + h0 + tid] = final_lse(run_m[tid], run_l[tid]);
#if DS_SPARSE_MLA_TRACE
  tr_flush();
#endif
}
#undef DS_MLA_STAMP

// Continues split 0's fold over the per-tile partials of the other splits, in tile order.
// Block (query q, head h); each thread owns 4 output dims; kBatch: tiles whose loads are in flight
// before their (ordered) merges. The fast combine (fast_combine(p): kBatch 20, which covers the
// 39 partials of a 640-key query at batch 1 in two round trips) is launched as a programmatic
// dependent of the attention kernel (v5): its blocks start while the attention kernel runs, read
// the lengths (inputs of the attention kernel, complete once that grid has triggered), then wait
// for the partials. Otherwise kBatch 16 in plain stream order (v4; the wait is a no-op).
template <int kD, int kBatch, int kTileKeys = kTile>
__global__ void __launch_bounds__(kD / 4) sparse_mla_combine_kernel(const SparseMlaParams p) {
  const int q = blockIdx.x;
  const int h = blockIdx.y;
#if DS_SPARSE_MLA_TRACE
  mla_trace::CombineTrace tr;
  tr.begin(kTileKeys == kTile && p.num_queries == 1 && p.plan.max_splits == mla_trace::kSplits);
#endif
  const QuerySplit qs = query_split<kTileKeys>(p, q);
  pdl_wait();
#if DS_SPARSE_MLA_TRACE
  tr.stamp(1);
#endif
  if (qs.splits <= 1) return;
  const int d = threadIdx.x * 4;
  const int64_t slot_base = int64_t(q) * p.plan.max_tiles;
  const float* ws_o = p.workspace;
  const float* ws_ml = p.workspace + int64_t(p.num_queries) * p.plan.max_tiles * p.num_heads * kD;
  auto o_at = [&](int t) {
    return *reinterpret_cast<const float4*>(ws_o + ((slot_base + t) * p.num_heads + h) * kD + d);
  };
  auto ml_at = [&](int t) {
    return *reinterpret_cast<const float2*>(ws_ml + ((slot_base + t) * p.num_heads + h) * 2);
  };
  float2 ml = ml_at(0);
  float m = ml.x, l = ml.y;
  float4 o = o_at(0);
  const int t0 = split_begin(qs, 1);
  for (int t = t0; t < qs.tiles; t += kBatch) {
    float4 ot[kBatch];
    float2 mlt[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (t + i < qs.tiles) {
        ot[i] = o_at(t + i);
        mlt[i] = ml_at(t + i);
      }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (t + i < qs.tiles) {
        float m_new, a, b;
        merge_coeffs(m, mlt[i].x, m_new, a, b);
        l = merge_value(l, a, mlt[i].y, b);
        m = m_new;
        o.x = merge_value(o.x, a, ot[i].x, b);
        o.y = merge_value(o.y, a, ot[i].y, b);
        o.z = merge_value(o.z, a, ot[i].z, b);
        o.w = merge_value(o.w, a, ot[i].w, b);
      }
  }
#if DS_SPARSE_MLA_TRACE
  tr.stamp(2);
#endif
  const float inv = final_scale(m, l, p.sink, h);
  uint16_t* dst = p.out + (int64_t(q) * p.num_heads + h) * kD + d;
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack_bf16x2(__fmul_rn(o.x, inv), __fmul_rn(o.y, inv)),
                 pack_bf16x2(__fmul_rn(o.z, inv), __fmul_rn(o.w, inv)));
  if (p.lse && threadIdx.x == 0) p.lse[int64_t(q) * p.num_heads + h] = final_lse(m, l);
#if DS_SPARSE_MLA_TRACE
  tr.end();
#endif
}

// The fast combine since session 40 (session 39's v4; at most kCombineFastMaxPairs (query, head)
// pairs: batch 1 at 64 heads), where the combine is latency-bound: its warps are few. Session 7's
// kernel above spent ~5.5 us merging the 39 partials of a 640-key query (H100 trace and ncu,
// NOTES.md session 38), session 38's straight-line form (one dim per thread, each tile's
// coefficients taken from their lanes by three shuffles) ~3 us, and so does this one at 32K: what
// bounds the merge is reading the partials (5 MB of fp32 at 32K) after the attention grid has
// ended, not instructions (NOTES.md session 40); at 512 tokens it is 1.1 us faster than v3.
// Here a block is one warp and 128 dims of one (query, head): each lane copies the partials of
// its four dims for up to kChunk tiles into shared memory at once (cp.async, no registers held),
// and meanwhile the warp computes the chunk's fold coefficients, two tiles per lane: the running
// max as a prefix maximum over the lanes (fmaxf is exact and associative, so each tile gets the
// serial fold's running max before and after it), then merge_coeffs per tile (a, b and
// merge_value's product for l, written to shared memory). The l and o chains then run in tile
// order, two shared loads per tile. Same functions on the same operands in the same order for
// every value: the serial combine's bits (FlashBatch1 compares split caps 1-40).
template <int kD, int kTileKeys = kTile>
__global__ void __launch_bounds__(32) sparse_mla_combine_fast_kernel(const SparseMlaParams p) {
  constexpr int kChunk = 64;  // tiles whose partials are copied together
  static_assert(kD % kCombineFastDims == 0 && kCombineFastDims == 4 * 32, "four dims per lane");
  __shared__ float4 part[kChunk][32];  // [tile][lane]: the lane's four dims
  __shared__ float4 coef[kChunk];      // a, b, l's product per tile
  const int q = blockIdx.x;
  const int h = blockIdx.y;
  const int lane = threadIdx.x;
  const int d = int(blockIdx.z) * kCombineFastDims + 4 * lane;
#if DS_SPARSE_MLA_TRACE
  mla_trace::CombineTrace tr;
  tr.begin(kTileKeys == kTile && p.num_queries == 1 && p.plan.max_splits == mla_trace::kSplits);
#endif
  const QuerySplit qs = query_split<kTileKeys>(p, q);
  pdl_wait();
#if DS_SPARSE_MLA_TRACE
  tr.stamp(1);
#endif
  if (qs.splits <= 1) return;
  const int64_t slot_base = int64_t(q) * p.plan.max_tiles;
  const int64_t stride = int64_t(p.num_heads) * kD;  // one tile's partials
  const float* ws_o = p.workspace + (slot_base * p.num_heads + h) * kD + d;
  const float* ws_ml = p.workspace + int64_t(p.num_queries) * p.plan.max_tiles * p.num_heads * kD;
  auto ml_at = [&](int t) {
    return *reinterpret_cast<const float2*>(ws_ml + ((slot_base + t) * p.num_heads + h) * 2);
  };
  float4 o = *reinterpret_cast<const float4*>(ws_o);
  const float2 ml0 = ml_at(0);  // split 0's state, continued tile by tile
  float m = ml0.x, l = ml0.y;
  for (int t = split_begin(qs, 1); t < qs.tiles; t += kChunk) {
    const int nb = min(kChunk, qs.tiles - t);
#pragma unroll 8
    for (int i = 0; i < nb; ++i) cp_async16(&part[i][lane], ws_o + (t + i) * stride);
    cp_async_commit();
    // Tiles t + lane (half 0) and t + 32 + lane (half 1).
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (32 * k >= nb) break;
      const bool real = 32 * k + lane < nb;
      const float2 mlt = real ? ml_at(t + 32 * k + lane) : make_float2(kNegInf, 0.0f);
      float r = mlt.x;  // max of the half's tile maxima up to this lane
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xFFFFFFFFu, r, off);
        if (lane >= off) r = fmaxf(r, y);
      }
      r = fmaxf(m, r);
      float before = __shfl_up_sync(0xFFFFFFFFu, r, 1);
      if (lane == 0) before = m;
      m = __shfl_sync(0xFFFFFFFFu, r, 31);  // padded lanes hold -inf
      float m_new, a, b;
      merge_coeffs(before, mlt.x, m_new, a, b);
      if (real) coef[32 * k + lane] = make_float4(a, b, __fmul_rn(mlt.y, b), 0.0f);
    }
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll 4
    for (int i = 0; i < nb; ++i) {
      const float4 c = coef[i];
      const float4 x = part[i][lane];
      l = __fmaf_rn(l, c.x, c.z);
      o.x = merge_value(o.x, c.x, x.x, c.y);
      o.y = merge_value(o.y, c.x, x.y, c.y);
      o.z = merge_value(o.z, c.x, x.z, c.y);
      o.w = merge_value(o.w, c.x, x.w, c.y);
    }
    __syncwarp();  // part and coef are rewritten by the next chunk
  }
#if DS_SPARSE_MLA_TRACE
  tr.stamp(2);
#endif
  const float inv = final_scale(m, l, p.sink, h);
  *reinterpret_cast<uint2*>(p.out + (int64_t(q) * p.num_heads + h) * kD + d) =
      make_uint2(pack_bf16x2(__fmul_rn(o.x, inv), __fmul_rn(o.y, inv)),
                 pack_bf16x2(__fmul_rn(o.z, inv), __fmul_rn(o.w, inv)));
  if (p.lse && d == 0) p.lse[int64_t(q) * p.num_heads + h] = final_lse(m, l);
#if DS_SPARSE_MLA_TRACE
  if (blockIdx.z == 0) tr.end();
#endif
}

#include "kernels/cuda/attention/sparse_mla_decode_wgmma.cuh"
#include "kernels/cuda/attention/sparse_mla_decode_ws.cuh"

// One launch of kernel(p), as a programmatic dependent of the previous grid in the stream when
// `pdl` (the kernels wait with griddepcontrol.wait before reading what that grid wrote).
template <typename Kernel>
cudaError_t launch_kernel(Kernel kernel, dim3 grid, int threads, int smem, bool pdl,
                          const SparseMlaParams& p, cudaStream_t stream) {
  if (!pdl) {
    kernel<<<grid, threads, size_t(smem), stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// The combine kernel after a split launch (kTileKeys: the attention kernel's fold unit): the fast
// combine (programmatic) for small grids, v4's otherwise.
template <int kD, int kTileKeys>
cudaError_t launch_combine(const SparseMlaParams& p, cudaStream_t stream) {
  const dim3 cgrid(unsigned(p.num_queries), unsigned(p.num_heads));
  if (fast_combine(p) && kSparseMlaCombineFast &&
      int64_t(p.num_queries) * p.num_heads <= kCombineFastMaxPairs) {
    return launch_kernel(sparse_mla_combine_fast_kernel<kD, kTileKeys>,
                         dim3(cgrid.x, cgrid.y, kD / kCombineFastDims), 32, 0, true, p, stream);
  }
  if (fast_combine(p))
    return launch_kernel(sparse_mla_combine_kernel<kD, 20, kTileKeys>, cgrid, kD / 4, 0, true, p,
                         stream);
  return launch_kernel(sparse_mla_combine_kernel<kD, 16, kTileKeys>, cgrid, kD / 4, 0, false, p,
                       stream);
}

template <int kD, int kMT, int kP>
Status launch_impl(const SparseMlaParams& p, cudaStream_t stream) {
  using C = Config<kD, kMT, kP>;
  DS_CUDA_RETURN_IF_ERROR(
      ensure_max_dynamic_smem(sparse_mla_decode_kernel<kD, kMT, kP>, int(C::kSmemBytes)));
  const int groups = (p.num_heads + C::kHG - 1) / C::kHG;
  const dim3 grid = kSparseMlaSplitMajor
                        ? dim3(unsigned(groups), unsigned(p.num_queries), unsigned(p.plan.max_splits))
                        : dim3(unsigned(p.plan.max_splits), unsigned(p.num_queries), unsigned(groups));
  DS_CUDA_RETURN_IF_ERROR(launch_kernel(sparse_mla_decode_kernel<kD, kMT, kP>, grid, C::kThreads,
                                        C::kSmemBytes, p.pdl, p, stream));
  if (p.plan.max_splits > 1) DS_CUDA_RETURN_IF_ERROR((launch_combine<kD, kTile>(p, stream)));
  return ok_status();
}

Status launch_wgmma(const SparseMlaParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.plan.max_splits), unsigned(p.num_queries),
                  unsigned(p.num_heads / wgp::kHeads));
  if (p.plan.warp_specialized) {
    DS_CUDA_RETURN_IF_ERROR(
        ensure_max_dynamic_smem(sparse_mla_decode_ws_kernel, int(wsp::kSmemBytes)));
    DS_CUDA_RETURN_IF_ERROR(launch_kernel(sparse_mla_decode_ws_kernel, grid, wsp::kThreads,
                                          wsp::kSmemBytes, p.pdl, p, stream));
#if DS_SPARSE_MLA_WS_TRACE
    sparse_mla_ws_trace_print_kernel<<<1, 1, 0, stream>>>();
    DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
#endif
  } else {
    DS_CUDA_RETURN_IF_ERROR(
        ensure_max_dynamic_smem(sparse_mla_decode_wgmma_kernel, int(wgp::kSmemBytes)));
    DS_CUDA_RETURN_IF_ERROR(launch_kernel(sparse_mla_decode_wgmma_kernel, grid, wgp::kThreads,
                                          wgp::kSmemBytes, p.pdl, p, stream));
  }
  if (p.plan.max_splits > 1)
    DS_CUDA_RETURN_IF_ERROR((launch_combine<wgp::kD, wgp::kKeys>(p, stream)));
  return ok_status();
}

template <int kD>
Status launch_for_dim(const SparseMlaParams& p, cudaStream_t stream) {
  if (p.plan.tiles_per_step == 2) {  // 16 heads only (checked by the caller)
    return launch_impl<kD, 1, 2>(p, stream);
  }
  switch (p.plan.heads_per_cta) {
    case 16:
      return launch_impl<kD, 1, 1>(p, stream);
    case 32:
      return launch_impl<kD, 2, 1>(p, stream);
    case 64:
      return launch_impl<kD, 4, 1>(p, stream);
    default:
      return invalid_argument("sparse_mla_decode: heads_per_cta must be 16, 32 or 64, got " +
                              std::to_string(p.plan.heads_per_cta));
  }
}

}  // namespace

bool sparse_mla_wgmma_available() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

bool sparse_mla_wgmma_supported(int32_t num_heads, int32_t head_dim) {
  return head_dim == wgp::kD && num_heads > 0 && num_heads % wgp::kHeads == 0 &&
         sparse_mla_wgmma_available();
}

bool sparse_mla_wgmma_preferred(int32_t num_queries, int32_t num_heads) {
  return int64_t(num_queries) * (num_heads / wgp::kHeads) >= 8;
}

SparseMlaPlan plan_sparse_mla_decode(int32_t num_queries, int32_t num_heads, int32_t window_width,
                                     int32_t compressed_width, int32_t num_sms,
                                     int32_t max_splits_cap, bool wgmma) {
  SparseMlaPlan plan;
  const int64_t queries = num_queries > 0 ? num_queries : 1;
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  if (wgmma && num_heads > 0 && num_heads % wgp::kHeads == 0) {
    // sm_90a kernel: 64 heads per CTA, 64-key tiles, one CTA per SM; splits as below.
    plan.wgmma = true;
    plan.warp_specialized = kSparseMlaWarpSpecialized;
    plan.heads_per_cta = wgp::kHeads;
    plan.max_tiles = (window_width + compressed_width + wgp::kKeys - 1) / wgp::kKeys;
    // Split only below a quarter of the GPU: batch 64 on 132 SMs ran 59.1 us with 2 splits (each
    // second split stores an fp32 partial per tile) and 52.0 us with one (H200, NOTES.md v7).
    const int64_t ctas = queries * (num_heads / wgp::kHeads);
    int64_t splits = 1;
    if (4 * ctas <= sms) splits = std::max<int64_t>(1, sms / ctas);
    splits = std::min<int64_t>(splits, std::max(1, plan.max_tiles));
    if (max_splits_cap > 0) splits = std::min<int64_t>(splits, max_splits_cap);
    plan.max_splits = int32_t(std::max<int64_t>(1, splits));
    return plan;
  }
  plan.max_tiles = (window_width + compressed_width + kTile - 1) / kTile;
  // Largest head group that fills >= 90% of the GPU with one wave; 16 if none does.
  plan.heads_per_cta = 16;
  for (int hpc : {64, 32}) {
    if (hpc > ((num_heads + 15) / 16) * 16) continue;
    if (10 * queries * ((num_heads + hpc - 1) / hpc) >= 9 * sms) {
      plan.heads_per_cta = hpc;
      break;
    }
  }
  const int64_t ctas = queries * ((num_heads + plan.heads_per_cta - 1) / plan.heads_per_cta);
  // Split keys only when heads leave more than half the GPU idle: every split but the first
  // stores one fp32 partial per tile (NOTES.md), which costs more than idle SMs beyond that.
  int64_t splits = 1;
  if (2 * ctas < sms) {
    // At most one CTA per SM (rounded down): rounding up put a second CTA on some SMs, whose
    // splits then finished last (H200, session 8, context 32K: batch 4 s8 20.5 us vs s9 26.7,
    // batch 16 s2 58.5 vs s3 68.9; NOTES.md v6).
    splits = std::max<int64_t>(1, sms / ctas);
    // 16-head CTAs run two per SM: where one wave still leaves some CTA two tiles of a full-width
    // query (batch 1: 33 splits of 40 tiles), take up to two CTAs per SM, one tile each (v5).
    if (plan.heads_per_cta == 16 && splits < plan.max_tiles && 2 * splits > plan.max_tiles)
      splits = std::min<int64_t>(plan.max_tiles, 2 * sms / ctas);
  }
  splits = std::min<int64_t>(splits, std::max(1, plan.max_tiles));
  if (max_splits_cap > 0) splits = std::min<int64_t>(splits, max_splits_cap);
  plan.max_splits = int32_t(std::max<int64_t>(1, splits));
  plan.tiles_per_step = plan.heads_per_cta == 16 ? kSparseMlaTilesPerStep16 : 1;
  return plan;
}

size_t sparse_mla_workspace_bytes(const SparseMlaPlan& plan, int32_t num_queries, int32_t num_heads,
                                  int32_t head_dim) {
  if (plan.max_splits <= 1) return 0;
  return size_t(num_queries) * size_t(plan.max_tiles) * size_t(num_heads) * (size_t(head_dim) + 2) *
         sizeof(float);
}

Status launch_sparse_mla_decode(const SparseMlaParams& p, cudaStream_t stream) {
#if DS_SPARSE_MLA_TRACE
  {  // the batch-1 launches' ring to DS_MLA_TRACE_OUT once a larger batch follows
    static int last_queries = 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(stream, &cs);
    if (last_queries == 1 && p.num_queries != 1 && cs == cudaStreamCaptureStatusNone)
      mla_trace::dump(std::getenv("DS_MLA_TRACE_OUT"));
    last_queries = p.num_queries;
  }
#endif
  if (p.num_queries <= 0 || p.num_heads <= 0) return ok_status();
  if (!p.q || !p.out || !p.query_seq || !p.window_len || (p.window_width > 0 && !p.window_idx) ||
      (p.compressed_width > 0 && (!p.compressed_idx || !p.compressed_len)))
    return invalid_argument("sparse_mla_decode: null pointer in params");
  if (p.plan.wgmma) {
    if (p.head_dim != wgp::kD || p.num_heads % wgp::kHeads != 0 ||
        p.plan.heads_per_cta != wgp::kHeads || p.plan.tiles_per_step != 1)
      return invalid_argument(
          "sparse_mla_decode: the wgmma plan needs head_dim 512, a multiple of 64 heads, 64 "
          "heads per CTA and one tile per step");
    if (((reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.out)) & 15u) != 0)
      return invalid_argument(
          "sparse_mla_decode: the wgmma plan needs a 16-byte aligned q and out");
    if (!sparse_mla_wgmma_available())
      return invalid_argument("sparse_mla_decode: the wgmma plan needs an sm_90 device");
  }
  if (p.plan.warp_specialized && !p.plan.wgmma)
    return invalid_argument("sparse_mla_decode: warp_specialized needs the wgmma plan");
  const int tile_keys = p.plan.wgmma ? wgp::kKeys : kTile;
  if (!(p.plan.tiles_per_step == 1 || (p.plan.tiles_per_step == 2 && p.plan.heads_per_cta == 16)))
    return invalid_argument(
        "sparse_mla_decode: tiles_per_step must be 1, or 2 with 16 heads per "
        "CTA, got " +
        std::to_string(p.plan.tiles_per_step));
  if (p.window_width < 0 || p.compressed_width < 0 || p.plan.max_splits < 1 ||
      int64_t(p.plan.max_tiles) * tile_keys < p.window_width + p.compressed_width)
    return invalid_argument("sparse_mla_decode: plan does not match the index widths");
  if ((p.window_width > 0 && (p.window.page_size <= 0 || p.window.page_bytes % 16 != 0)) ||
      (p.compressed_width > 0 &&
       (p.compressed.page_size <= 0 || p.compressed.page_bytes % 16 != 0)))
    return invalid_argument(
        "sparse_mla_decode: page_size must be > 0 and page_bytes a multiple of 16");
  const size_t need = sparse_mla_workspace_bytes(p.plan, p.num_queries, p.num_heads, p.head_dim);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need))
    return invalid_argument("sparse_mla_decode: workspace of " + std::to_string(p.workspace_bytes) +
                            " bytes, need " + std::to_string(need));
  if (p.plan.wgmma) return launch_wgmma(p, stream);
  switch (p.head_dim) {
    case 512:
      return launch_for_dim<512>(p, stream);
    case 128:
      return launch_for_dim<128>(p, stream);
    default:
      return unimplemented("sparse_mla_decode: head_dim " + std::to_string(p.head_dim) +
                           " (supported: 512, 128)");
  }
}

}  // namespace ds::cuda
