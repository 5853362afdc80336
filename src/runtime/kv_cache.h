// KV cache manager (dsv4-model.md §11): capacity accounting and page allocation for the
// DeepSeek-V4 per-sequence state. Three paged pools, each in logical pages of 256 token positions:
// ratio-4 compressed entries (CSA layers, 64 entries per page), ratio-128 compressed entries (HCA
// layers, 2 entries per page) and indexer keys (CSA layers, 64 keys per page). A page's bytes are
// summed over the layers (MTP included) that have that kind, at the 584-byte entry / 132-byte
// indexer-key sizes of §11. Besides the pages, every running sequence holds one fixed slot from a
// slot pool: its sliding-window rings (584 B per ring entry) and compressor state rings (fp32).
//
// A sequence needs ceil(tokens / 256) pages in every pool that has layers. grow() is
// all-or-nothing across the pools (KV5): when any pool lacks pages nothing is taken. free()
// returns every page and the slot. The manager only accounts; the CPU forward keeps the state
// itself in SequenceState's vectors (see docs/engine.md, "KV accounting").
//
// Not thread-safe: the engine thread owns it; metrics are copied out under the engine's lock.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace ds::runtime {

inline constexpr int64_t kPageTokens = 256;          // logical page (token positions)
inline constexpr int64_t kKvEntryBytes = 584;        // FP8 nope + bf16 rope + scales (§11)
inline constexpr int64_t kIndexKeyEntryBytes = 132;  // FP8 key + fp32 scale (§11)

enum class KvPool : int { kCompressed4 = 0, kCompressed128 = 1, kIndexKeys = 2 };
inline constexpr int kNumKvPools = 3;
const char* kv_pool_name(KvPool pool);  // "compressed_r4", "compressed_r128", "indexer_keys"

// Bytes of one page per pool and of one sequence slot, from the model config.
struct KvGeometry {
  std::array<int64_t, kNumKvPools> page_bytes{};  // 0 when no layer has that kind
  int64_t slot_bytes = 0;  // SWA rings (584 B entries) + compressor rings (fp32 kv + score)
  int64_t swa_ring_bytes = 0;
  int64_t compressor_state_bytes = 0;

  static KvGeometry from_config(const DeepSeekV4Config& config);
  bool has_pool(KvPool p) const { return page_bytes[size_t(p)] > 0; }
};

// Pages needed for `tokens` positions (in every pool that has layers).
inline int64_t pages_for_tokens(int64_t tokens) {
  return tokens <= 0 ? 0 : (tokens + kPageTokens - 1) / kPageTokens;
}

struct KvPoolStats {
  std::string name;
  int64_t total = 0;  // pages (slots for the slot pool)
  int64_t free = 0;
};

class KvCacheManager {
 public:
  // Explicit sizes: pages per pool (ignored for pools without layers) and sequence slots.
  KvCacheManager(const KvGeometry& geometry, std::array<int64_t, kNumKvPools> pages, int64_t slots);

  // Sizes the pools from a byte budget: `slots` sequence slots first, then the rest split so
  // that every pool has the same number of pages. Fails when not even one slot and one page of
  // each pool fit.
  static Result<KvCacheManager> from_budget(const KvGeometry& geometry, uint64_t budget_bytes,
                                            int64_t slots);

  const KvGeometry& geometry() const { return geometry_; }

  // Tokens one sequence can hold at most (the smallest pool's pages * 256).
  int64_t capacity_tokens() const;
  // Sequences of `tokens` positions that fit at the same time (pages and slots).
  int64_t max_concurrency(int64_t tokens) const;
  // True when a sequence of `tokens` positions can ever fit (alone in an empty cache).
  bool can_ever_fit(int64_t tokens) const {
    return tokens <= capacity_tokens() && slots_total_ > 0;
  }

  // Takes a slot for `seq`. False when no slot is free or `seq` already has one.
  bool allocate(uint64_t seq);
  // Makes `seq` (which has a slot) hold pages for `tokens` positions in every pool; all or
  // nothing. Shrinking is not done here (free() releases everything).
  bool grow(uint64_t seq, int64_t tokens);
  // True when grow(seq, tokens) would succeed.
  bool can_grow(uint64_t seq, int64_t tokens) const;
  // Pages the free lists would need to hand out for a new sequence of `tokens` positions.
  bool can_admit(int64_t tokens) const;
  // Releases the slot and every page of `seq`; a no-op for an unknown sequence (idempotent).
  void free(uint64_t seq);

  bool holds(uint64_t seq) const { return seqs_.count(seq) != 0; }
  int64_t tokens_of(uint64_t seq) const;  // positions covered by the pages of `seq`
  int64_t num_sequences() const { return int64_t(seqs_.size()); }

  int64_t pages_total(KvPool p) const { return pages_total_[size_t(p)]; }
  int64_t pages_free(KvPool p) const { return int64_t(free_pages_[size_t(p)].size()); }
  int64_t slots_total() const { return slots_total_; }
  int64_t slots_free() const { return int64_t(free_slots_.size()); }
  // Per pool (pools without layers are left out) plus "sequence_slots".
  std::vector<KvPoolStats> stats() const;
  // The largest fraction used over the pools and the slot pool, in [0, 1].
  double usage() const;
  // Bytes the pools and slots account for.
  uint64_t total_bytes() const;

 private:
  struct SeqPages {
    int32_t slot = -1;
    std::array<std::vector<int32_t>, kNumKvPools> pages;  // page ids per pool
  };
  KvGeometry geometry_;
  std::array<int64_t, kNumKvPools> pages_total_{};
  std::array<std::vector<int32_t>, kNumKvPools> free_pages_;  // stacks of free page ids
  int64_t slots_total_ = 0;
  std::vector<int32_t> free_slots_;
  std::unordered_map<uint64_t, SeqPages> seqs_;
};

}  // namespace ds::runtime
