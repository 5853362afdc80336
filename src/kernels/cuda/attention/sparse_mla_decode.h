// Sparse MLA decode attention with a per-head sink over FP8 paged KV (dsv4-model.md §7.4, §7.5,
// §11): for each query token, all heads attend to the union of its window entries and its selected
// compressed entries, both stored as FP8 entries (448 e4m3 nope + ue8m0 scales + 64 bf16 rope for
// Flash; layout in kernels/cpu/kv_entry.h) in their own paged pools. K = V = the dequantized entry.
// The CPU reference is ds::cpu::sparse_attention on the dequantized entries (unpack_kv_entry).
//
// Work split: one CTA per (key split, query token, head group). Each CTA dequantizes each of its
// KV entries once into shared memory for all heads of its group and runs QK^T and PV on tensor
// cores (mma.sync bf16, fp32 accumulation, <= 99 KB shared memory, so it runs on sm_90/100/120).
// Split-invariance: the softmax state is folded tile by tile (16 keys) with a fixed merge rule;
// split 0 folds its own tiles, other splits store one partial per tile, and the combine kernel
// continues the same fold in the same order, so the output is bit-identical whatever the split
// count and head-group size the plan picks (NOTES.md).
// On compute capability 9.0 a second kernel (v7, sparse_mla_decode_wgmma.cuh; SparseMlaPlan::wgmma)
// runs 64 heads per CTA on wgmma with 64-key tiles (~219 KB of shared memory): its fold unit is
// the 64-key tile, so it is split-invariant among its own plans and differs from the mma.sync
// kernel in the last bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds::cuda {

inline constexpr int kSparseMlaTileKeys = 16;       // keys per tile (the fold unit), mma.sync
inline constexpr int kSparseMlaWgmmaTileKeys = 64;  // keys per tile of the sm_90a wgmma kernel

// One paged pool of FP8 KV entries (kernels/cpu/kv_entry.h layout). A sequence's logical entry i
// lives in page page_table[seq * page_table_stride + i / page_size], slot i % page_size.
struct SparseMlaKvSource {
  const uint8_t* pool = nullptr;        // 16-byte aligned
  const int32_t* page_table = nullptr;  // [num_seqs, page_table_stride]
  int32_t page_table_stride = 0;
  int32_t page_size = 0;   // entries per page
  int64_t page_bytes = 0;  // kv_page_bytes(layout, page_size), a multiple of 16
};

// Launch geometry chosen on the host from shape bounds only (never from device lengths), so the
// same launch can be captured once into a CUDA graph and replayed with new lengths and indices.
struct SparseMlaPlan {
  // The sm_90a kernel (v7, NOTES.md): 64 heads per CTA on wgmma, 64-key tiles (the fold unit, so
  // its outputs differ in the last bits from the mma.sync kernel's, and are split-invariant
  // among themselves). Needs head_dim 512, a multiple of 64 heads, a 16-byte aligned q and out,
  // and a compute capability 9.0 device (sparse_mla_wgmma_supported).
  bool wgmma = false;
  // With `wgmma`: v9 (NOTES.md), v7's tile math in two consumer warpgroups with a third that
  // copies and dequantizes the next tiles meanwhile (384 threads, ~207 KB of shared memory).
  // Same bits as v7. plan_sparse_mla_decode sets it with `wgmma` (DS_SPARSE_MLA_WARP_SPECIALIZED).
  bool warp_specialized = false;
  int32_t heads_per_cta = 64;  // 16, 32 or 64: heads sharing one dequantized KV tile
  int32_t max_splits = 1;      // key splits per query; a query of T tiles uses min(max_splits, T)
  // ceil((window_width + compressed_width) / tile keys): workspace slots; tile keys = 16, or 64
  // with `wgmma`.
  int32_t max_tiles = 0;
  // Tiles of 16 keys per step of the kernel's loop: 1 (what the plan picks), or 2 with 16 heads
  // per CTA (two tiles between the same two block barriers; an experiment, slower on the H200:
  // NOTES.md). Same bits either way.
  int32_t tiles_per_step = 1;
};

// All pointers are device pointers. Per query token q (q < num_queries), its keys are, in order,
// window_idx[q, 0 : window_len[q]] (entries of `window`) then
// compressed_idx[q, 0 : compressed_len[q]] (entries of `compressed`); an index of -1 is skipped.
struct SparseMlaParams {
  const uint16_t* q = nullptr;  // [num_queries, num_heads, head_dim] bf16, 4-byte aligned
  const float* sink = nullptr;  // [num_heads] sink logits (natural log), nullable: no sink
  uint16_t* out = nullptr;      // [num_queries, num_heads, head_dim] bf16
  float* lse = nullptr;         // [num_queries, num_heads] fp32, nullable: natural-log
                                // log-sum-exp over the keys only (sink excluded), -inf if none
  int32_t num_queries = 0;
  int32_t num_heads = 0;               // any; heads are processed in groups of plan.heads_per_cta
  int32_t head_dim = 512;              // 512 (Flash, Pro) or 128 (tiny); rope dims = 64
  float softmax_scale = 0.0f;          // head_dim^-0.5 for DeepSeek-V4
  const int32_t* query_seq = nullptr;  // [num_queries] sequence of each query token (page tables)
  SparseMlaKvSource window;
  SparseMlaKvSource compressed;
  const int32_t* window_idx = nullptr;  // [num_queries, window_width]
  const int32_t* window_len = nullptr;  // [num_queries], each in [0, window_width]
  int32_t window_width = 0;
  const int32_t* compressed_idx = nullptr;  // [num_queries, compressed_width], nullable if width 0
  const int32_t* compressed_len = nullptr;  // [num_queries], nullable if width 0
  int32_t compressed_width = 0;
  SparseMlaPlan plan;
  // Launch the attention kernel as a programmatic dependent of the previous kernel in the stream
  // (sm_90+): its blocks are placed while that kernel finishes and wait (griddepcontrol.wait)
  // before reading anything. The combine kernel is always a programmatic dependent of the
  // attention kernel.
  bool pdl = false;
  float* workspace = nullptr;  // sparse_mla_workspace_bytes(...) bytes, 16-byte aligned
  size_t workspace_bytes = 0;
};

// Picks head group and split count so that num_queries * groups * splits covers the GPU's
// `num_sms` about twice, preferring larger head groups (each KV entry dequantized once for more
// heads) and splitting keys only when heads alone cannot fill it. `max_splits_cap` > 0 caps the
// split count (tests use it to force counts). Host arithmetic only.
// `wgmma`: plan for the sm_90a kernel when the head count allows it (pass
// sparse_mla_wgmma_supported(num_heads, head_dim)).
SparseMlaPlan plan_sparse_mla_decode(int32_t num_queries, int32_t num_heads, int32_t window_width,
                                     int32_t compressed_width, int32_t num_sms,
                                     int32_t max_splits_cap = 0, bool wgmma = false);

// Whether the current device runs the sm_90a kernel (compute capability 9.0), and whether it
// runs it for this shape (head_dim 512, a multiple of 64 heads).
bool sparse_mla_wgmma_available();
bool sparse_mla_wgmma_supported(int32_t num_heads, int32_t head_dim);

// Which kernel a launch of `num_queries` tokens should plan for where both run (H200, NOTES.md
// v7): the wgmma kernel from 8 CTAs of 64 heads up (batch 8: 14.9 vs 16.1 us at context 512,
// 16.9 vs 32.4 at 32K; batch 128: 70.9 vs 111.5 at 32K), the mma.sync kernel below (its one-tile
// CTAs: batch 4 at context 512 11.7 vs 14.9 us, batch 1 10.2 vs 14.1). Host arithmetic only.
bool sparse_mla_wgmma_preferred(int32_t num_queries, int32_t num_heads);

// Workspace bytes the launch needs for `plan` (0 when plan.max_splits == 1).
size_t sparse_mla_workspace_bytes(const SparseMlaPlan& plan, int32_t num_queries, int32_t num_heads,
                                  int32_t head_dim);

// Enqueues the attention kernel and, when plan.max_splits > 1, the combine kernel on `stream`.
// No allocation and no host synchronization: graph-capturable. Returns an error (launching
// nothing) for unsupported head_dim / heads_per_cta, a too-small workspace or null pointers.
Status launch_sparse_mla_decode(const SparseMlaParams& params, cudaStream_t stream);

}  // namespace ds::cuda
