// Lightning indexer kernels (see indexer.h and NOTES.md).
//
// Score kernel, CTA (query x, split y), 8 warps. On sm_90a (session 8) steps 0-1 are
// score_wgmma's: 2 warpgroups score 64-key tiles with wgmma e4m3 (keys and q in swizzled shared
// memory); elsewhere, and with DS_INDEXER_WGMMA=0, the mma.sync loop below:
//   0. quantizes q's heads to e4m3 (one power-of-two scale per head, folded into the weights:
//      ReLU(s x) = s ReLU(x) for s > 0) into shared memory; every warp keeps the B fragments of all
//      heads for the whole kernel (as f16: 64 heads x 128 dims = 128 registers);
//   1. per tile of 16 keys, each thread loads 2 x 16 bytes of 2 key rows from the paged pool into
//      its own slots of a per-warp cp.async ring (3 tiles in flight), converts them to f16 once
//      (exact) and 8 k-steps x heads/8 mma.sync m16n8k16 f16 give the 16 x heads dot products
//      (DS_INDEXER_F16_MMA=0: 4 k-steps of m16n8k32 e4m3, which sm_90 lowers to the same HMMAs
//      plus conversions per MMA); ReLU and the weights are applied in registers and two shuffles
//      finish the sum over heads: score = key scale * sum;
//   2. every 2048 keys the CTA merges the chunk's scores into its running top-k in shared memory
//      (select_threshold + select_emit on the order-preserving uint32 image of the score, keys in
//      registers; the list stays in ascending index order and ties keep the lower index);
//   3. one split: the top-k goes to the output; several: to the workspace, and the merge kernel
//      (one CTA per query) selects the final top-k from the splits' lists with the same select.
// The dimension order inside the MMA k-steps is a permutation of the 128 dims (the same for q and
// keys), chosen so each thread's key bytes are two contiguous 16-byte loads per row.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/func_attributes.h"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/indexer/indexer.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;  // score kernel
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;       // keys per MMA tile
// Keys scored between two selections (DS_INDEXER_CHUNK: build-time experiment, NOTES.md).
#ifndef DS_INDEXER_CHUNK
#define DS_INDEXER_CHUNK 2048
#endif
constexpr int kChunk = DS_INDEXER_CHUNK;
constexpr int kChunkTiles = kChunk / kTile;
// Iterations of every warp per chunk (mma.sync path).
[[maybe_unused]] constexpr int kChunkIters = kChunkTiles / kWarps;
static_assert(kChunkTiles % kWarps == 0, "a warp's tiles never straddle two chunks per iteration");
// Rows of register-resident keys per thread in the chunk select: old top-k + one chunk.
constexpr int kScoreRows = (kIndexerMaxTopk + kChunk + kThreads - 1) / kThreads;
// Merge: one CTA per query holds every candidate key in registers (kMergeRows per thread); the
// planner keeps max_splits * topk <= kMergeMaxKeys and the launch rejects larger plans.
constexpr int kMergeThreads = 512;
constexpr int kMergeRows = 16;
constexpr int kMergeMaxKeys = kMergeThreads * kMergeRows;  // 8192
// Fused merge (session 31): with merge counters, plans of at most this many candidates per query
// are merged by the last of the query's split CTAs (kThreads threads, kFusedMergeRows per thread)
// instead of the merge kernel. (8192 on 8 warps x 32 rows measured 1.7-4.4 us slower than the
// merge kernel at B = 1 32K / 128K, H100; at 4096 and below it was 0.3-0.8 us faster at B >= 16.)
constexpr int kFusedMergeRows = 16;
constexpr int kFusedMergeMaxKeys = kThreads * kFusedMergeRows;  // 4096
constexpr float kE4M3MaxF = 448.0f;
constexpr float kAmaxFloor = 1e-4f;  // as cpu::quantize_fp8_blocks

// ---- shared helpers ------------------------------------------------------------------------------
__host__ __device__ inline int active_splits(int max_splits, int min_keys, int visible) {
  const int s = visible / min_keys;
  return s < 1 ? 1 : (s < max_splits ? s : max_splits);
}

// 2^ceil(log2(v)) for positive normal v as an e8m0 code (the exponent field, plus one when any
// mantissa bit is set); the same rule as ds::e8m0_ceil_pow2 on v >= 1e-4 / 448.
__device__ __forceinline__ uint32_t e8m0_ceil_pow2_code(float v) {
  const uint32_t u = __float_as_uint(v);
  return ((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) ? 1u : 0u);
}

// The FP8 scale of a block with absolute maximum `amax` and its exact reciprocal.
__device__ __forceinline__ float fp8_scale(float amax, float& inv) {
  const uint32_t code = e8m0_ceil_pow2_code(fmaxf(amax, kAmaxFloor) / kE4M3MaxF);
  inv = __uint_as_float((254u - code) << 23);
  return __uint_as_float(code << 23);
}

__device__ __forceinline__ uint32_t to_e4m3(float x) {
  if (!isnan(x)) x = fminf(fmaxf(x, -kE4M3MaxF), kE4M3MaxF);
  return uint32_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) & 0xFFu;
}

// The score kernel's share of query q: thread tid (< 256) holds dims part * 32 .. + 31 of head
// h = tid / 4 (zeros past num_heads) and, on part 0, the head's weight. Loaded at the kernel's
// start, before the visible length is known, so these loads overlap its round trip and the page
// table's (session 31; before, they went out after the first key tiles had their pages).
struct QueryShare {
  float x[32];
  float weight;
};

__device__ __forceinline__ void load_query_share(const IndexerSelectParams& p, int q, int tid,
                                                 QueryShare& qs) {
  const int h = tid >> 2, part = tid & 3;
  const bool live = h < p.num_heads;
  const float* src = p.q + (int64_t(q) * p.num_heads + h) * kIndexHeadDim + part * 32;
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    const float4 f = live ? *reinterpret_cast<const float4*>(src + i) : make_float4(0, 0, 0, 0);
    qs.x[i] = f.x;
    qs.x[i + 1] = f.y;
    qs.x[i + 2] = f.z;
    qs.x[i + 3] = f.w;
  }
  qs.weight = live && part == 0 ? p.weights[int64_t(q) * p.num_heads + h] : 0.0f;
}

// The FP8 scale of the head's 128 dims (the 4 threads of a head are adjacent lanes); x becomes
// x / scale, the weight weight * scale.
__device__ __forceinline__ void scale_query_share(QueryShare& qs) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(qs.x[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  float inv;
  const float scale = fp8_scale(amax, inv);
#pragma unroll
  for (int i = 0; i < 32; ++i) qs.x[i] *= inv;
  qs.weight *= scale;
}

// Order-preserving image of a score: a larger float gives a larger uint32 (-0 counted as +0). Only
// a NaN with every bit set would map to 0, which the select reserves for "filtered out"
// (kFiltered); it is moved to 1.
constexpr uint32_t kFiltered = 0;
__device__ __forceinline__ uint32_t order_key(float s) {
  const uint32_t u = __float_as_uint(s + 0.0f);
  return (u & 0x80000000u) ? max(~u, 1u) : (u | 0x80000000u);
}

// DS_INDEXER_F16_MMA (session 7, NOTES.md), default 1: the score loop converts the e4m3 key bytes
// to f16 once (cvt.rn.f16x2.e4m3x2) and multiplies with mma.sync m16n8k16 f16 (q held as f16 in
// registers). 0: mma.sync m16n8k32 e4m3, which sm_90 lowers to the same HMMAs plus e4m3->f16
// conversions redone for every MMA (measured 5-12% slower on the H200; native on sm_89/sm_120,
// not measured there). The e4m3 values are exact in f16 and both accumulate in fp32, so the scores
// agree within the tests' tolerance.
#ifndef DS_INDEXER_F16_MMA
#define DS_INDEXER_F16_MMA 1
#endif

#if DS_INDEXER_F16_MMA
// Two e4m3 codes (low byte first) -> f16x2 (low half first), exact.
[[maybe_unused]] __device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xFFFFu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// D = A(16x16 f16, row) * B(16x8 f16, col) + C, fp32.
[[maybe_unused]] __device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1,
                                                         uint32_t a2, uint32_t a3, uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#else
// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + C, fp32 (sm_89+).
[[maybe_unused]] __device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1,
                                                          uint32_t a2, uint32_t a3, uint32_t b0,
                                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// ---- block-wide select over register-resident keys (session 7) ----------------------------------
// Element r of thread t is the key at position r * kNT + t (strided ownership), 0 when it is past
// the end or filtered out (kFiltered: never counted, real keys are >= 1). No shared atomics, no
// match_any: the threshold search counts with compares + __reduce_add_sync, one barrier per step.
constexpr int kSelectCntWords = 256;  // (row, warp) counts of the ordered emit
struct SelectShared {
  uint32_t red[2][2][32];  // per-step warp partials, double-buffered by step parity
  uint32_t cnt[kSelectCntWords];
};

// The k-th largest of the keys (thr) and how many keys are > thr (gt); the k - gt first keys == thr
// in position order complete the top k. Radix-4 search from the top bit: up to 16 steps, each
// counts the keys >= the 3 candidates prefix | d << s (d = 1..3) and keeps the largest with
// count >= k (prefix | 0 always qualifies). At least k keys must be nonzero. `rows` (uniform)
// bounds the live rows. All threads of the block call it.
// Early exit (`early_exit`, session 30): when exactly k keys are >= the prefix just taken, they
// are the top k whatever the remaining digits (no key equal to the k-th one is left out), so the
// search stops with thr = prefix - 1 and gt = k (no ties). The selected set is the full search's;
// only thr may be lower than the k-th key. On random scores the search ends after ~8-10 steps.
template <int kNT, int kR>
__device__ __forceinline__ void select_threshold(const uint32_t (&e)[kR], int rows, int k,
                                                 SelectShared& sh, uint32_t& thr, uint32_t& gt,
                                                 bool early_exit) {
  constexpr int kNW = kNT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t need = uint32_t(k);
  uint32_t prefix = 0, above = 0;  // above = keys >= the top of the current range
#pragma unroll 1
  for (int step = 0; step < 16; ++step) {
    const int s = 30 - 2 * step;
    const uint32_t c1 = prefix | (1u << s), c2 = prefix | (2u << s), c3 = prefix | (3u << s);
    uint32_t n1 = 0, n2 = 0, n3 = 0;
#pragma unroll
    for (int r = 0; r < kR; ++r)
      if (r < rows) {
        n1 += e[r] >= c1;
        n2 += e[r] >= c2;
        n3 += e[r] >= c3;
      }
    // Warp sums <= 32 * kR < 2^16 and block sums <= kNT * kR < 2^16: two 16-bit fields.
    const uint32_t w12 = __reduce_add_sync(0xFFFFFFFFu, n1 | (n2 << 16));
    const uint32_t w3 = __reduce_add_sync(0xFFFFFFFFu, n3);
    uint32_t(&red)[2][32] = sh.red[step & 1];
    if (lane == 0) {
      red[0][warp] = w12;
      red[1][warp] = w3;
    }
    __syncthreads();
    const uint32_t a = __reduce_add_sync(0xFFFFFFFFu, lane < kNW ? red[0][lane] : 0u);
    const uint32_t t3 = __reduce_add_sync(0xFFFFFFFFu, lane < kNW ? red[1][lane] : 0u);
    const uint32_t t1 = a & 0xFFFFu, t2 = a >> 16;
    uint32_t taken = 0;  // keys >= the new prefix when a candidate was taken (block-uniform)
    if (t3 >= need) {
      prefix = c3;
      taken = t3;
    } else if (t2 >= need) {
      prefix = c2;
      above = t3;
      taken = t2;
    } else if (t1 >= need) {
      prefix = c1;
      above = t2;
      taken = t1;
    } else {
      above = t1;
    }
    if (early_exit && taken == need) {
      thr = prefix - 1u;  // prefix >= 1: the keys > thr are exactly the k keys >= prefix
      gt = need;
      return;
    }
  }
  thr = prefix;
  gt = above;  // the final range is [thr, thr + 1)
}

// Calls emit(position, rank, key, row) for the top-k keys (all keys > thr, then the first `ties`
// keys == thr in position order); rank = the key's rank in position order among the selected,
// row = the key's register row r (position = r * kNT + thread; a constant in the unrolled loop).
// Counts per (row, warp) from ballots, one warp scans them, three barriers.
template <int kNT, int kR, class Emit>
__device__ __forceinline__ void select_emit(const uint32_t (&e)[kR], int rows, uint32_t thr,
                                            uint32_t ties, SelectShared& sh, const Emit& emit) {
  constexpr int kNW = kNT / 32;
  constexpr int kWords = kR * kNW;
  static_assert(kWords <= kSelectCntWords, "emit counts fit SelectShared::cnt");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (r < rows) {
      const uint32_t bg = __ballot_sync(0xFFFFFFFFu, e[r] > thr);
      const uint32_t be = __ballot_sync(0xFFFFFFFFu, e[r] == thr);
      if (lane == 0) sh.cnt[r * kNW + warp] = uint32_t(__popc(bg)) | (uint32_t(__popc(be)) << 16);
    }
  __syncthreads();
  if (warp == 0) {  // exclusive scan of the live words in (row, warp) order = position order
    constexpr int kPer = (kWords + 31) / 32;
    const int words = rows * kNW;
    uint32_t v[kPer], sum = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane * kPer + j;
      v[j] = i < words ? sh.cnt[i] : 0u;
      sum += v[j];
    }
    uint32_t incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, incl, off);
      if (lane >= off) incl += y;
    }
    uint32_t run = incl - sum;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane * kPer + j;
      if (i < words) sh.cnt[i] = run;
      run += v[j];
    }
  }
  __syncthreads();
  const uint32_t lt = (1u << lane) - 1u;
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (r < rows) {
      const uint32_t bg = __ballot_sync(0xFFFFFFFFu, e[r] > thr);
      const uint32_t be = __ballot_sync(0xFFFFFFFFu, e[r] == thr);
      if (((bg | be) >> lane) & 1u) {
        const uint32_t base = sh.cnt[r * kNW + warp];
        const uint32_t gb = (base & 0xFFFFu) + uint32_t(__popc(bg & lt));
        const uint32_t eb = (base >> 16) + uint32_t(__popc(be & lt));
        const int pos = r * kNT + int(threadIdx.x);
        if (e[r] > thr)
          emit(pos, gb + min(eb, ties), e[r], r);
        else if (eb < ties)
          emit(pos, gb + eb, e[r], r);
      }
    }
}

// DS_INDEXER_SELECT_BUCKETS (session 8), default 1: the chunk select and the merge run with the
// register-row count rounded up to a bucket (score kernel 4 / 8 / kScoreRows, merge 2 / 4 / 8 /
// kMergeRows) instead of always the maximum: the rows past `rows` were skipped by a predicate,
// but their predicated compares were still issued in every one of the 16 steps (session 8 run 1:
// chunk 4096 = 8 more dead rows cost +3.6 us per select).
#ifndef DS_INDEXER_SELECT_BUCKETS
#define DS_INDEXER_SELECT_BUCKETS 1
#endif

template <int kR>
struct RowsTag {
  static constexpr int value = kR;
};

// Calls f(RowsTag<R>{}) with the smallest bucket R >= rows among kB... (ascending; the last is
// >= any rows), or with the last one when DS_INDEXER_SELECT_BUCKETS is 0. (Session 8 run 2's
// "nobucket" build took the *first* bucket here: it dropped keys, its times are invalid.)
template <int kB0, int... kBs, class F>
__device__ __forceinline__ void with_row_bucket(int rows, const F& f) {
  if constexpr (sizeof...(kBs) == 0) {
    f(RowsTag<kB0>{});
  } else {
    if (DS_INDEXER_SELECT_BUCKETS && rows <= kB0)
      f(RowsTag<kB0>{});
    else
      with_row_bucket<kBs...>(rows, f);
  }
}

// Ordered compaction of a chunk's survivors (session 30): thread t owns the contiguous keys
// [t kPer, t kPer + kPer) of chunk_key[0, m); a block scan gives each nonzero key its place among
// the nonzero keys in position order. When there are at most kChunk / 2 of them, they are written
// to chunk_key[0, n) and their chunk offsets to chunk_key[kChunk / 2, kChunk / 2 + n) (the reads
// all happen before the first barrier) and n is returned; otherwise nothing is written and -1 is
// returned. All threads call it; it uses SelectShared::cnt[0 .. kWarps).
__device__ __forceinline__ int compact_survivors(uint32_t* chunk_key, int m, SelectShared& sh) {
  constexpr int kPer = kChunk / kThreads;
  static_assert(kChunk % kThreads == 0 && kWarps <= kSelectCntWords, "compaction layout");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t v[kPer];
  int n = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid * kPer + j;
    v[j] = i < m ? chunk_key[i] : kFiltered;
    n += v[j] != kFiltered;
  }
  int incl = n;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xFFFFFFFFu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) sh.cnt[warp] = uint32_t(incl);
  __syncthreads();
  int pos = incl - n, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int c = int(sh.cnt[w]);
    pos += w < warp ? c : 0;
    total += c;
  }
  if (total > kChunk / 2) return -1;  // block-uniform
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (v[j] != kFiltered) {
      chunk_key[pos] = v[j];
      chunk_key[kChunk / 2 + pos] = uint32_t(tid * kPer + j);
      ++pos;
    }
  __syncthreads();
  return total;
}

// Chunk end of the score kernel (both MMA paths): merges the chunk's m keys (chunk_key, indices
// c0 ..) into the running top-k (candidate list `cur` of cand_keys / cand_idxs, cand_n entries),
// keeping ascending index order. Threshold filter: once the list is full, a chunk key <= its k-th
// key (thr_f) cannot enter it (equal keys lose to the lower indices already held) and was stored
// as kFiltered; a chunk with no survivor skips the select. With `compact` the survivors of a
// filtered chunk are compacted first (compact_survivors), so the select runs over the list + the
// survivors (~k + k m / keys so far on random scores) instead of the list + the whole chunk.
// All threads call it.
__device__ __forceinline__ void score_chunk_end(uint32_t* chunk_key, uint32_t* cand_keys,
                                                int32_t* cand_idxs, int k, int m, int c0,
                                                SelectShared& sh, int& cur, int& cand_n,
                                                uint32_t& thr_f, int& survivor, bool early_exit,
                                                bool compact) {
  const int tid = threadIdx.x;
  const bool any = __syncthreads_or(survivor) != 0;  // also publishes chunk_key
  survivor = 0;
  uint32_t* ck = cand_keys + cur * k;
  int32_t* ci = cand_idxs + cur * k;
  if (cand_n + m <= k) {  // still filling (thr_f == 0: nothing was filtered)
    for (int x = tid; x < m; x += kThreads) {
      ck[cand_n + x] = chunk_key[x];
      ci[cand_n + x] = c0 + x;
    }
    cand_n += m;
  } else if (any) {
    uint32_t* ok = cand_keys + (cur ^ 1) * k;
    int32_t* oi = cand_idxs + (cur ^ 1) * k;
    const int n_old = cand_n;
    // Chunk entries entering the select: all m, or the compacted survivors (offsets beside them).
    const int n_surv = compact && thr_f != kFiltered ? compact_survivors(chunk_key, m, sh) : -1;
    const uint32_t* offs = n_surv >= 0 ? chunk_key + kChunk / 2 : nullptr;
    const int total = n_old + (n_surv >= 0 ? n_surv : m);
    const int rows = (total + kThreads - 1) / kThreads;
    with_row_bucket<4, 8, kScoreRows>(rows, [&](auto tag) {
      constexpr int kR = decltype(tag)::value;
      uint32_t e[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int x = r * kThreads + tid;
        e[r] = x < n_old ? ck[x] : (x < total ? chunk_key[x - n_old] : 0u);
      }
      uint32_t thr, gt;
      select_threshold<kThreads, kR>(e, rows, k, sh, thr, gt, early_exit);
      select_emit<kThreads, kR>(e, rows, thr, uint32_t(k) - gt, sh,
                                [&](int x, uint32_t pos, uint32_t key, int) {
                                  ok[pos] = key;
                                  oi[pos] = x < n_old ? ci[x]
                                                      : c0 + (offs ? int(offs[x - n_old])
                                                                   : x - n_old);
                                });
      thr_f = thr;
    });
    cur ^= 1;
    cand_n = k;
  }  // else: every chunk key was filtered out; the top-k is unchanged
  __syncthreads();  // chunk_key and the candidate lists are rewritten from here on
}

// ---- merge of the splits' candidate lists -------------------------------------------------------
// Whether the score kernel's last split CTA of each query merges (no merge kernel): host and
// device evaluate the same predicate.
__host__ __device__ inline bool fused_merge(const IndexerSelectParams& p) {
  return p.merge_counters != nullptr && p.plan.max_splits > 1 &&
         int64_t(p.plan.max_splits) * p.topk <= kFusedMergeMaxKeys;
}

// Workspace: the candidate keys of every (query, split) list, then their indices.
__device__ __forceinline__ uint32_t* ws_keys(const IndexerSelectParams& p) {
  return static_cast<uint32_t*>(p.workspace);
}
__device__ __forceinline__ int32_t* ws_indices(const IndexerSelectParams& p) {
  return reinterpret_cast<int32_t*>(ws_keys(p) +
                                    int64_t(p.plan.num_queries) * p.plan.max_splits * p.topk);
}

// Final top-k of query q over its `splits` candidate lists (consecutive in the workspace, in
// index order), by a block of kNT threads. Every thread loads its keys and their indices (strided,
// all loads in flight at once; session 31: the indices with the keys, not after the select) into
// registers; the select runs on registers. kRows: the register-row buckets (the last one must hold
// splits * topk / kNT).
template <int kNT, int... kRows>
__device__ __forceinline__ void merge_lists(const IndexerSelectParams& p, int q, int splits,
                                            SelectShared& sh) {
  const int k = p.topk;
  const int64_t base = int64_t(q) * p.plan.max_splits * k;
  const uint32_t* keys = ws_keys(p) + base;
  const int32_t* idx = ws_indices(p) + base;
  int32_t* sel = p.selected + int64_t(q) * k;
  const int n = splits * k;
  const int rows = (n + kNT - 1) / kNT;
  with_row_bucket<kRows...>(rows, [&](auto tag) {
    constexpr int kR = decltype(tag)::value;
    uint32_t e[kR];
    int32_t ix[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int i = r * kNT + int(threadIdx.x);
      e[r] = i < n ? __ldcg(keys + i) : 0u;
      ix[r] = i < n ? __ldcg(idx + i) : -1;
    }
    uint32_t thr, gt;
    select_threshold<kNT, kR>(e, rows, k, sh, thr, gt, p.select_early_exit);
    select_emit<kNT, kR>(e, rows, thr, uint32_t(k) - gt, sh,
                         [&](int, uint32_t pos, uint32_t, int r) { sel[pos] = ix[r]; });
  });
  if (threadIdx.x == 0 && p.count) p.count[q] = k;
}

// The end of split `split` of query q (of `splits` > 1): its candidate list (k keys ck and
// indices ci, in index order) goes to the workspace. With fused_merge(p), the query's split CTAs
// then count themselves on merge_counters[q] (each CTA's stores made visible first, the
// threadFenceReduction pattern); the last to arrive returns the counter to zero and merges the
// lists. All threads of the score CTA call it.
__device__ __forceinline__ void finish_split(const IndexerSelectParams& p, int q, int split,
                                             int splits, const uint32_t* ck, const int32_t* ci,
                                             SelectShared& sh) {
  const int k = p.topk;
  const int64_t slot = (int64_t(q) * p.plan.max_splits + split) * k;
  uint32_t* wk = ws_keys(p);
  int32_t* wi = ws_indices(p);
  for (int i = threadIdx.x; i < k; i += kThreads) {
    wk[slot + i] = ck[i];
    wi[slot + i] = ci[i];
  }
  if (!fused_merge(p)) return;
  // Every thread's stores are done (CTA barrier) before thread 0 counts the CTA with a gpu-scope
  // acquire-release add: release publishes this CTA's list, acquire makes the lists of the CTAs
  // counted before visible to the last one, whose threads read them (L2, __ldcg) after the
  // barrier (the pattern of CUTLASS's semaphore; session 31's first form fenced in every thread
  // without the barrier before the add, a race that racecheck's scheduling exposed).
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    uint32_t prev;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;"
                 : "=r"(prev)
                 : "l"(p.merge_counters + q)
                 : "memory");
    last = prev + 1u == uint32_t(splits);
    if (last) p.merge_counters[q] = 0u;  // read by the next launch only
  }
  if (!__syncthreads_or(last)) return;
  merge_lists<kThreads, 4, 8, kFusedMergeRows>(p, q, splits, sh);
}

// ---- pack kernel ---------------------------------------------------------------------------------
__global__ void __launch_bounds__(256) pack_index_keys_kernel(const PackIndexKeysParams p) {
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.num_rows) return;  // warp-uniform
  const int32_t idx = p.index[row];
  if (idx < 0) return;
  const float4 x = *reinterpret_cast<const float4*>(p.keys + row * kIndexHeadDim + lane * 4);
  float amax = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  float inv;
  const float scale = fp8_scale(amax, inv);
  const uint32_t packed = to_e4m3(x.x * inv) | (to_e4m3(x.y * inv) << 8) |
                          (to_e4m3(x.z * inv) << 16) | (to_e4m3(x.w * inv) << 24);
  const IndexKeySource& d = p.dst;
  const int32_t page = d.page_table[int64_t(p.seq[row]) * d.page_table_stride + idx / d.page_size];
  const int slot = idx % d.page_size;
  uint8_t* base = d.pool + int64_t(page) * d.page_bytes;
  *reinterpret_cast<uint32_t*>(base + int64_t(slot) * kIndexKeyDataBytes + lane * 4) = packed;
  if (lane == 0)
    *reinterpret_cast<float*>(base + int64_t(d.page_size) * kIndexKeyDataBytes +
                              int64_t(slot) * kIndexKeyScaleBytes) = scale;
}

// ---- score + select kernel -----------------------------------------------------------------------
// Shared memory: per-warp rings of key tiles [warp][stage] (the q e4m3 [64][128] and scaled
// weights [64] of the prologue alias the rings) | SelectShared | chunk keys [kChunk] | candidate
// keys [2][topk] | candidate indices [2][topk].
// A ring stage holds one 16-key tile as its warp's threads load it: uint4 data[4][32] (each
// thread's 2 x 32 bytes of rows g and g+8) and float scale[2][32]; every thread reads back only
// the slots it wrote itself, so the ring needs no barrier, only cp.async.wait_group.
constexpr int kStages = 4;  // tiles per warp in flight: kStages - 1
constexpr int kStageBytes = 4 * 32 * 16 + 2 * 32 * 4;
constexpr int kOffW = kIndexerMaxHeads * kIndexHeadDim;
constexpr int kRingBytes = kWarps * kStages * kStageBytes;
static_assert(kOffW + kIndexerMaxHeads * 4 <= kRingBytes, "prologue aliases the rings");
constexpr int kOffSel = kRingBytes;
constexpr int kOffChunk = kOffSel + int((sizeof(SelectShared) + 15) / 16 * 16);
constexpr int kOffCand = kOffChunk + kChunk * 4;
constexpr size_t score_smem_bytes(int topk) { return size_t(kOffCand) + size_t(topk) * 16; }
// (A DS_INDEXER_CHUNK experiment above 2048 is for sm_90, where a CTA may use 227 KB.)
static_assert(kChunk > 2048 || score_smem_bytes(kIndexerMaxTopk) <= 99 * 1024,
              "portable: <= 99 KB shared memory");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- sm_90a score path: wgmma e4m3 (session 8, NOTES.md) ---------------------------------------
// DS_INDEXER_WGMMA (default 1): on sm_90a the score kernel runs score_wgmma below instead of the
// mma.sync loop. sm_90 has no FP8 mma.sync (ptxas lowers it to conversions + f16 HMMA, NOTES.md
// session 7), but wgmma.mma_async e4m3 is native there: one warpgroup multiplies a 64-key tile
// (A: 64 keys x 128 e4m3 dims, shared memory, 128-byte swizzle) by q (B: 64 heads x 128 dims,
// shared memory, same layout; fewer heads are padded with zero q and zero weights) in 4
// m64n64k32 instructions, fp32 accumulators: 32 registers per thread instead of the 128 of the
// q fragments and 64 HMMA per 16 keys of the mma.sync loop (100 registers in all, 2 CTAs per
// SM). Other architectures (and builds without sm_90a features) compile the mma.sync loop.
#ifndef DS_INDEXER_WGMMA
#define DS_INDEXER_WGMMA 1
#endif
#if DS_INDEXER_WGMMA && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_INDEXER_WGMMA_PATH 1
#else
#define DS_INDEXER_WGMMA_PATH 0
#endif
#ifndef DS_INDEXER_WG_STAGES
#define DS_INDEXER_WG_STAGES 4
#endif
// Shared memory of the wgmma path (offsets from a 1024-byte aligned base): q e4m3 [64][128]
// swizzled | rings [2 warpgroups][stages][64 keys][128] swizzled | key scales [2][stages][64] |
// scaled weights [64] | SelectShared | chunk keys [kChunk] | candidate keys [2][topk] | indices.
constexpr int kWgKeys = 64;                            // keys per warpgroup tile (wgmma M)
constexpr int kWgTileBytes = kWgKeys * kIndexHeadDim;  // 8192
constexpr int kWgStages = DS_INDEXER_WG_STAGES;        // tiles per warpgroup in flight: stages - 1
constexpr int kWgChunkTiles = kChunk / kWgKeys;
// Iterations of each warpgroup per chunk.
[[maybe_unused]] constexpr int kWgChunkIters = kWgChunkTiles / 2;
static_assert(kWgChunkTiles % 2 == 0, "a chunk is an even number of 64-key tiles");
constexpr int kWgOffQ = 0;
constexpr int kWgOffRing = kWgOffQ + kWgTileBytes;
constexpr int kWgOffScale = kWgOffRing + 2 * kWgStages * kWgTileBytes;
constexpr int kWgOffW = kWgOffScale + 2 * kWgStages * kWgKeys * 4;
constexpr int kWgOffSel = kWgOffW + kIndexerMaxHeads * 4;
constexpr int kWgOffChunk = kWgOffSel + int((sizeof(SelectShared) + 15) / 16 * 16);
constexpr int kWgOffCand = kWgOffChunk + kChunk * 4;
constexpr size_t wg_smem_bytes(int topk) { return 1024 + size_t(kWgOffCand) + size_t(topk) * 16; }
static_assert(wg_smem_bytes(kIndexerMaxTopk) <= 227 * 1024, "sm_90: <= 227 KB per CTA");

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a [rows][128] tile with the 128-byte
// swizzle of wgmma (chunk index XOR row % 8; the tile base is 1024-byte aligned).
[[maybe_unused]] __device__ __forceinline__ int swz128(int r, int c) {
  return r * 128 + ((c ^ (r & 7)) << 4);
}

#if DS_INDEXER_WGMMA_PATH

// D[64 x 64] (+)= A[64 x 32] * B[32 x 64], e4m3 inputs, fp32 accumulators; scale_d 0: D = A * B.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t da, uint64_t db,
                                                     int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

// The score kernel's body on sm_90a. Warpgroup wg (warps 4wg .. 4wg+3) scores the 64-key tiles
// wg, wg + 2, ... of the split; thread (row r = wt / 2, half wt % 2) of a warpgroup copies 64
// bytes of key r (and its scale) into the ring stage with cp.async; after wait_group + a proxy
// fence + a warpgroup barrier the tile is visible to the tensor cores. The accumulators have the
// mma.sync layout (warp w4 of the warpgroup: rows 16 w4 + g, + 8; heads 8j + 2c, + 1), so the
// epilogue is the mma.sync path's. Chunk ends, the running top-k and the outputs are the same.
__device__ __forceinline__ void score_wgmma(const IndexerSelectParams& p, uint8_t* smem_raw) {
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* q8 = smem + kWgOffQ;
  float* wq = reinterpret_cast<float*>(smem + kWgOffW);
  SelectShared& sh = *reinterpret_cast<SelectShared*>(smem + kWgOffSel);
  uint32_t* chunk_key = reinterpret_cast<uint32_t*>(smem + kWgOffChunk);
  const int k = p.topk;
  uint32_t* const cand_keys = reinterpret_cast<uint32_t*>(smem + kWgOffCand);
  int32_t* const cand_idxs = reinterpret_cast<int32_t*>(cand_keys + 2 * k);
  auto cand_key = [&](int b) { return cand_keys + b * k; };
  auto cand_idx = [&](int b) { return cand_idxs + b * k; };

  const int split = blockIdx.y;
  const int q = blockIdx.x;
  const int tid = threadIdx.x;
  // The visible length, the query's sequence and its q / weights go out together (one round
  // trip instead of three in a row; session 31).
  const int v = p.visible[q];
  const int seq = p.query_seq[q];
  QueryShare qs;
  load_query_share(p, q, tid, qs);
  int32_t* sel = p.selected + int64_t(q) * k;
  if (v <= k) {
    if (split == 0) {
      for (int i = tid; i < k; i += kThreads) sel[i] = i < v ? i : -1;
      if (tid == 0 && p.count) p.count[q] = max(v, 0);
    }
    return;
  }
  const int splits = active_splits(p.plan.max_splits, p.plan.min_keys, v);
  if (split >= splits) return;
  const int begin = int(int64_t(v) * split / splits);
  const int end = int(int64_t(v) * (split + 1) / splits);

  const IndexKeySource& ks = p.keys;
  const int32_t* table = ks.page_table + int64_t(seq) * ks.page_table_stride;
  const int64_t scale_off = int64_t(ks.page_size) * kIndexKeyDataBytes;
  const int n_keys = end - begin;
  const int num_tiles = (n_keys + kWgKeys - 1) / kWgKeys;
  const int iters = (num_tiles + 1) / 2;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int wg = warp >> 2, w4 = warp & 3, wt = tid & 127;
  uint8_t* ring = smem + kWgOffRing + wg * kWgStages * kWgTileBytes;
  float* ring_sc = reinterpret_cast<float*>(smem + kWgOffScale) + wg * kWgStages * kWgKeys;
  // Page + slot of this thread's row of tile t (page -1: past the split); one division per
  // thread per 64-key tile, computed one iteration before the tile is issued. (Copies where each
  // warp instruction covers 4 whole rows, pages handed out by shuffles, measured 4-8% slower in
  // session 8 run 2 and were removed.)
  const int lrow = wt >> 1, lhalf = wt & 1;  // the key row / 64-byte half this thread copies
  auto locate = [&](int t, int& pg, int& slot) {
    const int j = t * kWgKeys + lrow;
    pg = -1;
    slot = 0;
    if (j < n_keys) {
      const int idx = begin + j;
      const int pi = idx / ks.page_size;
      slot = idx - pi * ks.page_size;
      pg = __ldg(table + pi);
    }
  };
  auto issue = [&](int st, int pg, int slot) {
    if (pg < 0) return;  // rows past the split keep stale bytes: their scores are never stored
    const uint8_t* base = ks.pool + int64_t(pg) * ks.page_bytes;
    const uint4* src = reinterpret_cast<const uint4*>(base + int64_t(slot) * kIndexKeyDataBytes) +
                       4 * lhalf;
    uint8_t* dst = ring + st * kWgTileBytes;
#pragma unroll
    for (int u = 0; u < 4; ++u) cp_async16(dst + swz128(lrow, 4 * lhalf + u), src + u);
    if (lhalf == 0)
      cp_async4(ring_sc + st * kWgKeys + lrow,
                reinterpret_cast<const float*>(base + scale_off) + slot);
  };
  // The first tiles' loads go out before the q prologue.
  // Tiles issued ahead of the one being multiplied (a stage is busy for one iteration).
  constexpr int kAhead = kWgStages - 1;
  static_assert(kAhead >= 1, "ring too short");
  int pg, slot;
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    locate(wg + 2 * i, pg, slot);
    issue(i, pg, slot);
    cp_async_commit();
  }
  locate(wg + 2 * kAhead, pg, slot);

  // ---- q -> e4m3 per head (4 threads x 32 dims per head, 64 heads, zeros past num_heads) ----
  {
    const int h = tid >> 2, part = tid & 3;
    scale_query_share(qs);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 wv;
      uint32_t* w = reinterpret_cast<uint32_t*>(&wv);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = half * 16 + 4 * u;
        w[u] = to_e4m3(qs.x[i]) | (to_e4m3(qs.x[i + 1]) << 8) | (to_e4m3(qs.x[i + 2]) << 16) |
               (to_e4m3(qs.x[i + 3]) << 24);
      }
      *reinterpret_cast<uint4*>(q8 + swz128(h, 2 * part + half)) = wv;
    }
    if (part == 0) wq[h] = qs.weight;
  }
  wgmma::fence_proxy_async();  // q8 is read by the tensor cores (async proxy)
  __syncthreads();
  float wreg[8][2];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    wreg[j][0] = wq[8 * j + 2 * c];
    wreg[j][1] = wq[8 * j + 2 * c + 1];
  }
  const uint64_t desc_q = wgmma::desc(smem_addr(q8));
  const uint64_t desc_ring = wgmma::desc(smem_addr(ring));

  int cur = 0, cand_n = 0;
  uint32_t thr_f = 0;  // threshold filter (score_chunk_end)
  int survivor = 0;
  // ReLU, weights, head sum and key scale of tile t (ring stage st) -> chunk_key.
  auto epilogue = [&](float(&acc)[32], int t, int st, int m) {
#pragma unroll
    for (int x = 0; x < 32; ++x) wgmma::fence_operand(acc[x]);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s0 += wreg[j][0] * fmaxf(acc[4 * j], 0.0f) + wreg[j][1] * fmaxf(acc[4 * j + 1], 0.0f);
      s1 += wreg[j][0] * fmaxf(acc[4 * j + 2], 0.0f) + wreg[j][1] * fmaxf(acc[4 * j + 3], 0.0f);
    }
    s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 1);
    s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 2);
    s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 1);
    s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 2);
    // Lane c == 0 owns row 16 w4 + g, lane c == 1 row 16 w4 + g + 8.
    const int row = 16 * w4 + g + (c == 1 ? 8 : 0);
    const int j = (t % kWgChunkTiles) * kWgKeys + row;
    if (c < 2 && j < m) {
      const float sc = ring_sc[st * kWgKeys + row];
      uint32_t u = order_key((c == 0 ? s0 : s1) * sc);
      if (u <= thr_f) u = kFiltered;
      survivor |= u != kFiltered;
      chunk_key[j] = u;
    }
  };
  auto mma_tile = [&](float(&acc)[32], int st) {
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n64k32_e4m3(acc, desc_ring + uint64_t((st * kWgTileBytes + 32 * kk) >> 4),
                           desc_q + uint64_t((32 * kk) >> 4), kk > 0 ? 1 : 0);
    wgmma::commit();
  };
  for (int i = 0; i < iters; ++i) {
    const int t = wg + 2 * i;
    cp_async_wait<kAhead - 1>();  // this thread's copies of tile t have landed
    wgmma::fence_proxy_async();
    wgmma::warpgroup_bar(wg);  // ... and every thread's; stage (i - 1) % S is free again
    issue((i + kAhead) % kWgStages, pg, slot);
    cp_async_commit();
    locate(t + 2 * (kAhead + 1), pg, slot);
    const int chunk = i / kWgChunkIters;
    const int c0 = begin + chunk * kChunk;
    const int m = min(kChunk, n_keys - chunk * kChunk);
    if (t < num_tiles) {
      const int st = i % kWgStages;
      float acc[32];
      mma_tile(acc, st);
      wgmma::wait<0>();
      epilogue(acc, t, st, m);
    }
    if ((i + 1) % kWgChunkIters != 0 && i + 1 != iters) continue;
    score_chunk_end(chunk_key, cand_keys, cand_idxs, k, m, c0, sh, cur, cand_n, thr_f, survivor,
                    p.select_early_exit, p.select_compact);
  }
  cp_async_wait<0>();

  if (splits == 1) {
    for (int i = tid; i < k; i += kThreads) sel[i] = cand_idx(cur)[i];
    if (tid == 0 && p.count) p.count[q] = k;
  } else {
    finish_split(p, q, split, splits, cand_key(cur), cand_idx(cur), sh);
  }
}
#endif  // DS_INDEXER_WGMMA_PATH

#if DS_INDEXER_WGMMA_PATH
#define DS_INDEXER_SCORE_MIN_BLOCKS 2  // 2 CTAs per SM: <= 128 registers
#else
#define DS_INDEXER_SCORE_MIN_BLOCKS 1
#endif

template <int kNT>
__global__ void __launch_bounds__(kThreads, DS_INDEXER_SCORE_MIN_BLOCKS)
    indexer_score_kernel(const IndexerSelectParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
#if DS_INDEXER_WGMMA_PATH
  score_wgmma(p, smem);
#else
  uint8_t* q8 = smem;
  float* wq = reinterpret_cast<float*>(smem + kOffW);
  SelectShared& sh = *reinterpret_cast<SelectShared*>(smem + kOffSel);
  uint32_t* chunk_key = reinterpret_cast<uint32_t*>(smem + kOffChunk);
  const int k = p.topk;
  // Candidate list b (0/1): keys at cand_keys + b * k, indices at cand_idxs + b * k (pointer
  // arithmetic, not an array of pointers, which would live in local memory).
  uint32_t* const cand_keys = reinterpret_cast<uint32_t*>(smem + kOffCand);
  int32_t* const cand_idxs = reinterpret_cast<int32_t*>(cand_keys + 2 * k);
  auto cand_key = [&](int b) { return cand_keys + b * k; };
  auto cand_idx = [&](int b) { return cand_idxs + b * k; };

  const int split = blockIdx.y;
  const int q = blockIdx.x;
  const int tid = threadIdx.x;
  const int v = p.visible[q];  // with the sequence and q: one round trip (session 31)
  const int seq = p.query_seq[q];
  QueryShare qs;
  load_query_share(p, q, tid, qs);
  int32_t* sel = p.selected + int64_t(q) * k;
  if (v <= k) {  // everything visible is selected; no scoring
    if (split == 0) {
      for (int i = tid; i < k; i += kThreads) sel[i] = i < v ? i : -1;
      if (tid == 0 && p.count) p.count[q] = max(v, 0);
    }
    return;
  }
  const int splits = active_splits(p.plan.max_splits, p.plan.min_keys, v);
  if (split >= splits) return;
  const int begin = int(int64_t(v) * split / splits);
  const int end = int(int64_t(v) * (split + 1) / splits);

  // ---- q -> e4m3 per head (4 threads x 32 dims per head), weights * q scale ----
  {
    const int h = tid >> 2, part = tid & 3;
    scale_query_share(qs);
    uint32_t* dst = reinterpret_cast<uint32_t*>(q8 + h * kIndexHeadDim + part * 32);
#pragma unroll
    for (int i = 0; i < 32; i += 4)
      dst[i / 4] = to_e4m3(qs.x[i]) | (to_e4m3(qs.x[i + 1]) << 8) | (to_e4m3(qs.x[i + 2]) << 16) |
                   (to_e4m3(qs.x[i + 3]) << 24);
    if (part == 0) wq[h] = qs.weight;
  }
  __syncthreads();

  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  // B fragments (k-step s: b0 = dims c*16 + 4s .. +3, b1 = dims 64 + c*16 + 4s .. +3 of head
  // nt*8 + g; the A fragments below use the same dims).
#if DS_INDEXER_F16_MMA
  // f16 k-step s2 (0..7) takes the thread's 4-byte word s2 of each row (words 0..3: dims
  // c*16 + 4*s2 ..; 4..7: dims 64 + c*16 + 4*(s2-4) ..): bytes 0,1 -> k 2c, 2c+1 and bytes 2,3 ->
  // k 2c+8, 2c+9, for the key rows (A) and for q (B) alike.
  uint32_t bh[kNT][8][2];
#else
  uint32_t bq[kNT][4][2];
#endif
  float wreg[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const uint8_t* row = q8 + (nt * 8 + g) * kIndexHeadDim;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#if DS_INDEXER_F16_MMA
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(row + c * 16 + 4 * s);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(row + 64 + c * 16 + 4 * s);
      bh[nt][s][0] = e4m3x2_to_f16x2(lo);
      bh[nt][s][1] = e4m3x2_to_f16x2(lo >> 16);
      bh[nt][4 + s][0] = e4m3x2_to_f16x2(hi);
      bh[nt][4 + s][1] = e4m3x2_to_f16x2(hi >> 16);
#else
      bq[nt][s][0] = *reinterpret_cast<const uint32_t*>(row + c * 16 + 4 * s);
      bq[nt][s][1] = *reinterpret_cast<const uint32_t*>(row + 64 + c * 16 + 4 * s);
#endif
    }
    wreg[nt][0] = wq[nt * 8 + 2 * c];
    wreg[nt][1] = wq[nt * 8 + 2 * c + 1];
  }
  __syncthreads();  // q8 / wq are overwritten by the rings from here on
  uint8_t* ring = smem + warp * kStages * kStageBytes;

  const IndexKeySource& ks = p.keys;
  const int32_t* table = ks.page_table + int64_t(seq) * ks.page_table_stride;
  const int64_t scale_off = int64_t(ks.page_size) * kIndexKeyDataBytes;
  const int n_keys = end - begin;
  const int num_tiles = (n_keys + kTile - 1) / kTile;
  // Every warp runs the same number of iterations (the chunk-end barriers are block-wide); warp w
  // scores tiles w, w + kWarps, ... Iteration i belongs to chunk i / kChunkIters.
  const int iters = (num_tiles + kWarps - 1) / kWarps;
  // Page of rows g and g + 8 of tile t (-1: past the split), loaded one iteration before the tile
  // is issued so the page-table latency does not sit in front of the cp.async.
  auto page_of = [&](int t, int (&pg)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int j = t * kTile + g + 8 * hh;
      pg[hh] = j < n_keys ? __ldg(table + (begin + j) / ks.page_size) : -1;
    }
  };
  // Issues tile t of this warp into ring stage st (rows past the split are zero-filled).
  auto issue = [&](int t, int st, const int (&pg)[2]) {
    uint4* data = reinterpret_cast<uint4*>(ring + st * kStageBytes);
    float* sc = reinterpret_cast<float*>(ring + st * kStageBytes + 4 * 32 * 16);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (pg[hh] >= 0) {
        const int slot = (begin + t * kTile + g + 8 * hh) % ks.page_size;
        const uint8_t* base = ks.pool + int64_t(pg[hh]) * ks.page_bytes;
        const uint4* src = reinterpret_cast<const uint4*>(base + int64_t(slot) * kIndexKeyDataBytes);
        cp_async16(&data[(2 * hh) * 32 + lane], src + c);
        cp_async16(&data[(2 * hh + 1) * 32 + lane], src + 4 + c);
        cp_async4(&sc[hh * 32 + lane], reinterpret_cast<const float*>(base + scale_off) + slot);
      } else {
        data[(2 * hh) * 32 + lane] = make_uint4(0, 0, 0, 0);
        data[(2 * hh + 1) * 32 + lane] = make_uint4(0, 0, 0, 0);
        sc[hh * 32 + lane] = 0.0f;
      }
    }
  };
  int pg[2];
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    page_of(warp + i * kWarps, pg);
    issue(warp + i * kWarps, i, pg);
    cp_async_commit();
  }
  page_of(warp + (kStages - 1) * kWarps, pg);

  int cur = 0, cand_n = 0;
  // Threshold filter: once the running top-k is full, a chunk key <= its k-th key (thr_f) cannot
  // enter it (equal keys lose to the lower indices already held), so it is stored as kFiltered;
  // a chunk with no survivor skips the select. thr_f = 0 keeps everything (real keys are >= 1).
  uint32_t thr_f = 0;
  int survivor = 0;
  // The ring keeps kStages - 1 tiles per warp in flight across chunk ends: the select below does
  // not touch the rings, so the next chunk's loads overlap it.
  for (int i = 0; i < iters; ++i) {
    const int t = warp + i * kWarps;
    {
      const int ta = t + (kStages - 1) * kWarps;
      issue(ta, (i + kStages - 1) % kStages, pg);
      cp_async_commit();
      page_of(ta + kWarps, pg);
    }
    cp_async_wait<kStages - 1>();
    const int chunk = i / kChunkIters;
    const int c0 = begin + chunk * kChunk;
    const int m = min(kChunk, n_keys - chunk * kChunk);
    if (t < num_tiles) {
      const uint8_t* stage = ring + (i % kStages) * kStageBytes;
      uint4 dr[4];
#pragma unroll
      for (int part = 0; part < 4; ++part)
        dr[part] = reinterpret_cast<const uint4*>(stage)[part * 32 + lane];
      const float* scs = reinterpret_cast<const float*>(stage + 4 * 32 * 16);
      const float sc0 = scs[lane], sc1 = scs[32 + lane];
      float acc[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&dr[0]);  // row g, dims c*16..
      const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&dr[1]);  // row g, 64 + c*16..
      const uint32_t* w2 = reinterpret_cast<const uint32_t*>(&dr[2]);  // row g+8, c*16..
      const uint32_t* w3 = reinterpret_cast<const uint32_t*>(&dr[3]);  // row g+8, 64 + ..
#if DS_INDEXER_F16_MMA
#pragma unroll
      for (int s2 = 0; s2 < 8; ++s2) {
        const uint32_t rg = s2 < 4 ? w0[s2] : w1[s2 - 4];  // row g
        const uint32_t rh = s2 < 4 ? w2[s2] : w3[s2 - 4];  // row g + 8
        const uint32_t a0 = e4m3x2_to_f16x2(rg), a2 = e4m3x2_to_f16x2(rg >> 16);
        const uint32_t a1 = e4m3x2_to_f16x2(rh), a3 = e4m3x2_to_f16x2(rh >> 16);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          mma_f16(acc[nt], a0, a1, a2, a3, bh[nt][s2][0], bh[nt][s2][1]);
      }
#else
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          mma_e4m3(acc[nt], w0[s], w2[s], w1[s], w3[s], bq[nt][s][0], bq[nt][s][1]);
#endif
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        s0 += wreg[nt][0] * fmaxf(acc[nt][0], 0.0f) + wreg[nt][1] * fmaxf(acc[nt][1], 0.0f);
        s1 += wreg[nt][0] * fmaxf(acc[nt][2], 0.0f) + wreg[nt][1] * fmaxf(acc[nt][3], 0.0f);
      }
      s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 1);
      s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, 2);
      s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 1);
      s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, 2);
      // Lane c == 0 owns row g, lane c == 1 row g + 8.
      const int j = (t % kChunkTiles) * kTile + g + (c == 1 ? 8 : 0);
      if (c < 2 && j < m) {
        uint32_t u = order_key(c == 0 ? s0 * sc0 : s1 * sc1);
        if (u <= thr_f) u = kFiltered;
        survivor |= u != kFiltered;
        chunk_key[j] = u;
      }
    }
    if ((i + 1) % kChunkIters != 0 && i + 1 != iters) continue;

    score_chunk_end(chunk_key, cand_keys, cand_idxs, k, m, c0, sh, cur, cand_n, thr_f, survivor,
                    p.select_early_exit, p.select_compact);
  }
  cp_async_wait<0>();  // tiles issued past the split (zero-filled rows only) must land

  // cand_n == k here: v > k, and with several splits every split has >= min_keys >= k keys.
  if (splits == 1) {
    for (int i = tid; i < k; i += kThreads) sel[i] = cand_idx(cur)[i];
    if (tid == 0 && p.count) p.count[q] = k;
  } else {
    finish_split(p, q, split, splits, cand_key(cur), cand_idx(cur), sh);
  }
#endif  // DS_INDEXER_WGMMA_PATH
}

// Final top-k over the splits' candidate lists (merge_lists), one CTA per query; queries the
// score kernel merged itself (fused_merge) or that need no merge return at once.
__global__ void __launch_bounds__(kMergeThreads) indexer_merge_kernel(const IndexerSelectParams p) {
  __shared__ SelectShared sh;
  const int q = blockIdx.x;
  const int v = p.visible[q];
  if (v <= p.topk) return;
  const int splits = active_splits(p.plan.max_splits, p.plan.min_keys, v);
  if (splits <= 1) return;
  merge_lists<kMergeThreads, 2, 4, 8, kMergeRows>(p, q, splits, sh);  // <= kMergeMaxKeys: launch
}

// Dynamic shared memory of the score kernel on the current device: on compute capability 9.x
// the sm_90a image may run the wgmma path, so its size (the larger) is requested; elsewhere the
// mma.sync path's (<= 99 KB). Host arithmetic + one cached attribute query per device.
Status score_smem_for_device(int topk, size_t& bytes) {
  int device = 0;
  DS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major_of[kMaxDevices] = {};  // 0: not queried yet
  int major = device < kMaxDevices ? major_of[device].load(std::memory_order_relaxed) : 0;
  if (major == 0) {
    DS_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (device < kMaxDevices) major_of[device].store(major, std::memory_order_relaxed);
  }
  bytes = score_smem_bytes(topk);
  if (DS_INDEXER_WGMMA && major == 9) bytes = std::max(bytes, wg_smem_bytes(topk));
  return ok_status();
}

template <int kNT>
Status launch_score(const IndexerSelectParams& p, cudaStream_t stream) {
  size_t max_bytes = 0, bytes = 0;
  if (Status st = score_smem_for_device(kIndexerMaxTopk, max_bytes); !st.ok()) return st;
  if (Status st = score_smem_for_device(p.topk, bytes); !st.ok()) return st;
  DS_CUDA_RETURN_IF_ERROR(ensure_max_dynamic_smem(indexer_score_kernel<kNT>, int(max_bytes)));
  // Queries in x (dispatched first), splits in y: CTA ids of the splits a query really uses
  // (split < its own count) come first and spread one per SM; with the split in x, the
  // active CTAs of a plan with more splits than used (max model length >> real context) paired
  // up on SMs while others got only CTAs that exit at once (session 8: B=64 ctx 8K 33.4 us with
  // a plan for 8K, 39.5 us with a plan for 1M, at 2 CTAs per SM).
  const dim3 grid(unsigned(p.num_queries), unsigned(p.plan.max_splits));
  indexer_score_kernel<kNT><<<grid, kThreads, bytes, stream>>>(p);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}

}  // namespace

// ---- host helpers --------------------------------------------------------------------------------
void pack_index_key_host(const float* key, uint8_t* data, float* scale) {
  float amax = 0.0f;
  for (int d = 0; d < kIndexHeadDim; ++d) amax = std::max(amax, std::fabs(key[d]));
  const float s = e8m0_to_float(e8m0_ceil_pow2(std::max(amax, kAmaxFloor) / kE4M3Max));
  for (int d = 0; d < kIndexHeadDim; ++d)
    data[d] = float_to_e4m3(std::clamp(key[d] / s, -kE4M3Max, kE4M3Max));
  *scale = s;
}

void unpack_index_key_host(const uint8_t* data, float scale, float* key) {
  for (int d = 0; d < kIndexHeadDim; ++d) key[d] = e4m3_to_float(data[d]) * scale;
}

uint8_t* index_key_data_host(const IndexKeySource& src, int32_t seq, int64_t index) {
  const int32_t page =
      src.page_table[int64_t(seq) * src.page_table_stride + index / src.page_size];
  return src.pool + int64_t(page) * src.page_bytes + (index % src.page_size) * kIndexKeyDataBytes;
}

float* index_key_scale_host(const IndexKeySource& src, int32_t seq, int64_t index) {
  const int32_t page =
      src.page_table[int64_t(seq) * src.page_table_stride + index / src.page_size];
  return reinterpret_cast<float*>(src.pool + int64_t(page) * src.page_bytes +
                                  int64_t(src.page_size) * kIndexKeyDataBytes +
                                  (index % src.page_size) * kIndexKeyScaleBytes);
}

// ---- launches ------------------------------------------------------------------------------------
Status launch_pack_index_keys(const PackIndexKeysParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return ok_status();
  if (!p.keys || !p.seq || !p.index || !p.dst.pool || !p.dst.page_table)
    return invalid_argument("pack_index_keys: null pointer in params");
  if (p.dst.page_size <= 0 || p.dst.page_bytes < index_key_page_bytes(p.dst.page_size) ||
      p.dst.page_bytes % 16 != 0)
    return invalid_argument("pack_index_keys: page_size must be > 0 and page_bytes >= "
                            "index_key_page_bytes(page_size), a multiple of 16");
  const unsigned grid = unsigned((int64_t(p.num_rows) + 7) / 8);
  pack_index_keys_kernel<<<grid, 256, 0, stream>>>(p);
  DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ok_status();
}

IndexerPlan plan_indexer_select(int32_t num_queries, int32_t max_visible, int32_t topk,
                                int32_t num_sms, int32_t max_splits_cap, int32_t min_keys_topks,
                                bool cap_crowded_merge) {
  IndexerPlan plan;
  plan.topk = topk;
  plan.num_queries = num_queries;
  plan.min_keys = std::max(std::max(topk, 1) * std::max(min_keys_topks, 1), 256);
  const int64_t queries = std::max<int32_t>(num_queries, 1);
  const int64_t sms = std::max<int32_t>(num_sms, 1);
  // At most two CTAs per SM (one is resident per SM: registers), rounded down so that the last
  // wave is not a small tail.
  int64_t splits = std::max<int64_t>(1, 2 * sms / queries);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, max_visible / plan.min_keys));
  // The merge holds every candidate in registers (kMergeMaxKeys per query).
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, kMergeMaxKeys / std::max(topk, 1)));
  // When the CTAs of all queries exceed the SMs (two short splits per SM), a merge of more than
  // half the capacity costs more than the splits save (session 30: B = 16 at 32K, 16 splits of
  // 512 keys 29.8 us, 8 splits of 1024 26.8 us, H100); at batch 1 the splits run side by side.
  if (cap_crowded_merge && queries * splits > sms)
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, kMergeMaxKeys / 2 / std::max(topk, 1)));
  if (max_splits_cap > 0) splits = std::min<int64_t>(splits, max_splits_cap);
  plan.max_splits = int32_t(std::max<int64_t>(1, splits));
  return plan;
}

bool indexer_merges_in_score_kernel(const IndexerSelectParams& params) {
  return fused_merge(params);
}

size_t indexer_workspace_bytes(const IndexerPlan& plan) {
  if (plan.max_splits <= 1) return 0;
  return size_t(plan.num_queries) * size_t(plan.max_splits) * size_t(plan.topk) * 8;
}

Status launch_indexer_select(const IndexerSelectParams& p, cudaStream_t stream) {
  if (p.num_queries <= 0) return ok_status();
  if (!p.q || !p.weights || !p.query_seq || !p.visible || !p.selected || !p.keys.pool ||
      !p.keys.page_table)
    return invalid_argument("indexer_select: null pointer in params");
  if (p.head_dim != kIndexHeadDim)
    return unimplemented("indexer_select: head_dim " + std::to_string(p.head_dim) +
                         " (supported: 128)");
  if (p.num_heads < 1 || p.num_heads > kIndexerMaxHeads)
    return unimplemented("indexer_select: num_heads " + std::to_string(p.num_heads) +
                         " (supported: 1 .. 64)");
  if (p.topk < 1 || p.topk > kIndexerMaxTopk)
    return invalid_argument("indexer_select: topk must be in 1 .. 1024");
  if (p.plan.topk != p.topk || p.plan.max_splits < 1 || p.num_queries > p.plan.num_queries ||
      p.plan.min_keys < p.topk)
    return invalid_argument("indexer_select: plan does not match the params");
  if (p.keys.page_size <= 0 || p.keys.page_bytes < index_key_page_bytes(p.keys.page_size) ||
      p.keys.page_bytes % 16 != 0)
    return invalid_argument("indexer_select: page_size must be > 0 and page_bytes >= "
                            "index_key_page_bytes(page_size), a multiple of 16");
  if (p.plan.max_splits > 1 && int64_t(p.plan.max_splits) * p.topk > kMergeMaxKeys)
    return invalid_argument("indexer_select: plan.max_splits * topk must be <= " +
                            std::to_string(kMergeMaxKeys) + " (plan_indexer_select keeps it)");
  const size_t need = indexer_workspace_bytes(p.plan);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need))
    return invalid_argument("indexer_select: workspace of " + std::to_string(p.workspace_bytes) +
                            " bytes, need " + std::to_string(need));
  const Status st = p.num_heads <= 8    ? launch_score<1>(p, stream)
                    : p.num_heads <= 16 ? launch_score<2>(p, stream)
                    : p.num_heads <= 32 ? launch_score<4>(p, stream)
                                        : launch_score<8>(p, stream);
  if (!st.ok()) return st;
  if (p.plan.max_splits > 1 && !fused_merge(p)) {
    indexer_merge_kernel<<<unsigned(p.num_queries), kMergeThreads, 0, stream>>>(p);
    DS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return ok_status();
}

}  // namespace ds::cuda
