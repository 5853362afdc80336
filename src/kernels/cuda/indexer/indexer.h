// Lightning indexer on the GPU (dsv4-model.md §7.7, CSA layers): per query token, score every
// index-key entry visible to it, I(w) = sum_h weights[h] * ReLU(q_h . K_w), and select the top-k
// entries. The CPU reference is ds::cpu::indexer_select run on the stored (unpacked) keys.
//
// Keys live in their own paged pool of 132-byte entries: 128 e4m3 values and one fp32 scale
// (a power of two, the rule of cpu::quantize_fp8_blocks with one block of 128). Within a page of
// P entries the data section comes first (entry i at i * 128), then the scales (entry i at
// P * 128 + i * 4), so every data row is 16-byte aligned for vector loads (NOTES.md).
//
// Work split (NOTES.md): one CTA per (key split, query token). Each warp scores tiles of 16 keys
// with tensor-core MMAs (the e4m3 bytes converted exactly to f16, mma.sync m16n8k16, fp32
// accumulation; sm_89+, <= 99 KB of shared memory so sm_90/100/120 all run it), applies ReLU and
// the weights in registers, and the CTA keeps a running top-k of its keys in shared memory (a
// block select on register-resident keys). A query whose keys span several
// splits writes one top-k candidate list per split to the workspace and a merge kernel selects
// the final top-k from them. A query with visible <= topk selects 0 .. visible-1 without scoring.
// Cost follows each query's own visible count; the launch geometry depends only on host bounds,
// so one launch can be captured in a CUDA graph and replayed with new lengths.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds::cuda {

inline constexpr int kIndexHeadDim = 128;                 // index_head_dim
inline constexpr int kIndexKeyDataBytes = kIndexHeadDim;  // e4m3 values
inline constexpr int kIndexKeyScaleBytes = 4;             // fp32 scale
inline constexpr int kIndexKeyEntryBytes = kIndexKeyDataBytes + kIndexKeyScaleBytes;  // 132
inline constexpr int kIndexerMaxHeads = 64;
inline constexpr int kIndexerMaxTopk = 1024;

// Bytes of one page of `page_size` index-key entries: page_size * 132 rounded up to 16.
inline int64_t index_key_page_bytes(int64_t page_size) {
  return (page_size * kIndexKeyEntryBytes + 15) / 16 * 16;
}

// One paged pool of index-key entries. A sequence's logical entry i lives in page
// page_table[seq * page_table_stride + i / page_size], slot i % page_size.
struct IndexKeySource {
  uint8_t* pool = nullptr;              // 16-byte aligned
  const int32_t* page_table = nullptr;  // [num_seqs, page_table_stride]
  int32_t page_table_stride = 0;
  int32_t page_size = 0;   // entries per page
  int64_t page_bytes = 0;  // index_key_page_bytes(page_size), a multiple of 16
};

// ---- host (CPU) helpers: the exact stored values, for the CPU oracle and for tests ----------
// Packs one key as the GPU pack kernel does: scale = 2^ceil(log2(max(amax, 1e-4) / 448)),
// data[d] = e4m3(key[d] / scale) (round to nearest even, saturating).
//   key [128] fp32, data [128]
void pack_index_key_host(const float* key, uint8_t* data, float* scale);
// key[d] = e4m3_to_float(data[d]) * scale.
void unpack_index_key_host(const uint8_t* data, float scale, float* key);
// Addresses of logical entry `index` in a host copy of a pool (pool and page_table host pointers).
uint8_t* index_key_data_host(const IndexKeySource& src, int32_t seq, int64_t index);
float* index_key_scale_host(const IndexKeySource& src, int32_t seq, int64_t index);

// ---- packing (the indexer compressor's finished keys -> the paged pool) ------------------------
struct PackIndexKeysParams {
  const float* keys = nullptr;       // [num_rows, 128] fp32 (Hadamard + FP4-simulated in REF mode)
  const int32_t* seq = nullptr;      // [num_rows] sequence of each row (page table row)
  const int32_t* index = nullptr;    // [num_rows] logical entry index; rows with index < 0 skipped
  int32_t num_rows = 0;
  IndexKeySource dst;
};

// Enqueues the pack kernel (one warp per row). Graph-capturable, no allocation.
Status launch_pack_index_keys(const PackIndexKeysParams& params, cudaStream_t stream);

// ---- scoring + top-k ----------------------------------------------------------------------------
// Launch geometry from shape bounds only (never from device lengths).
struct IndexerPlan {
  int32_t max_splits = 1;  // CTAs per query token; a query uses min(max_splits, visible/min_keys)
  int32_t min_keys = 512;   // keys per split at least (>= topk; the planner: topk, >= 256)
  int32_t topk = 512;
  int32_t num_queries = 0;  // the bound the workspace was sized for
};

// Picks the split count so that num_queries * splits covers `num_sms` about twice, limited by
// max_visible / min_keys with min_keys = max(topk * min_keys_topks, 256). `max_splits_cap` > 0
// caps it (tests). min_keys_topks = 1 (session 30): a split of <= 2 topk keys selects at most
// once and one of exactly topk keys never does (its keys go to the merge as they are);
// 2 is the rule before (A/B in bench_indexer's "mk2" series). cap_crowded_merge: when
// num_queries * splits exceeds num_sms, at most half the merge's capacity in candidates (8
// splits at topk 512; bench series "nocap" without it). Host arithmetic only.
IndexerPlan plan_indexer_select(int32_t num_queries, int32_t max_visible, int32_t topk,
                                int32_t num_sms, int32_t max_splits_cap = 0,
                                int32_t min_keys_topks = 1, bool cap_crowded_merge = true);

// Workspace bytes for `plan` (0 when max_splits == 1): one candidate list per (query, split).
size_t indexer_workspace_bytes(const IndexerPlan& plan);

// All pointers are device pointers.
struct IndexerSelectParams {
  const float* q = nullptr;          // [num_queries, num_heads, 128] fp32 (prepared query)
  const float* weights = nullptr;    // [num_queries, num_heads] fp32 (indexer_scale_weights)
  const int32_t* query_seq = nullptr;  // [num_queries] sequence of each query (page table row)
  const int32_t* visible = nullptr;    // [num_queries] entries 0 .. visible-1 visible to the query
  int32_t num_queries = 0;             // <= plan.num_queries
  int32_t num_heads = 64;              // 1 .. 64
  int32_t head_dim = kIndexHeadDim;    // 128 only
  int32_t topk = 512;                  // == plan.topk, 1 .. kIndexerMaxTopk
  IndexKeySource keys;
  int32_t* selected = nullptr;  // [num_queries, topk]: min(topk, visible) indices, then -1
  int32_t* count = nullptr;     // [num_queries] min(topk, visible), nullable
  IndexerPlan plan;
  void* workspace = nullptr;  // indexer_workspace_bytes(plan) bytes, 16-byte aligned
  size_t workspace_bytes = 0;
  // The selects' radix search stops as soon as exactly topk keys are >= its prefix (same
  // selection; session 30). false = the full 16 steps (A/B switch for the benchmark and tests).
  bool select_early_exit = true;
  // The score kernel's chunk selects run over the running top-k + the chunk keys that pass the
  // threshold filter, compacted first (same selection; session 30). false = over the whole chunk.
  bool select_compact = true;
  // Optional [plan.num_queries] counters, zero before the first launch that reads them; every
  // launch leaves them zero. With them, a plan of more than one split and at most 4096 candidates
  // per query (max_splits * topk) is merged by the last of each query's split CTAs to finish,
  // and the merge kernel is not launched (session 31). nullptr: the merge kernel, as before.
  uint32_t* merge_counters = nullptr;
};

// Whether launch_indexer_select merges inside the score kernel for these params (merge_counters
// given, more than one split, at most 4096 candidates per query) instead of launching the merge
// kernel. Host arithmetic only.
bool indexer_merges_in_score_kernel(const IndexerSelectParams& params);

// Enqueues the score/select kernel and, when plan.max_splits > 1 and the score kernel does not
// merge (indexer_merges_in_score_kernel), the merge kernel. No allocation, no host synchronization:
// graph-capturable. The selected indices of a query are in ascending
// index order; among equal scores the lower index wins (as cpu::topk_indices). Returns an error
// (launching nothing) for unsupported shapes, a mismatched plan, a small workspace or nulls.
Status launch_indexer_select(const IndexerSelectParams& params, cudaStream_t stream);

}  // namespace ds::cuda
