// KV cache manager: page and slot free lists, all-or-nothing growth across the pools (see
// kv_cache.h).
#include "runtime/kv_cache.h"

#include <algorithm>
#include <limits>

#include "kernels/cpu/compressor.h"

namespace ds::runtime {

const char* kv_pool_name(KvPool pool) {
  switch (pool) {
    case KvPool::kCompressed4:
      return "compressed_r4";
    case KvPool::kCompressed128:
      return "compressed_r128";
    case KvPool::kIndexKeys:
      return "indexer_keys";
  }
  return "?";
}

KvGeometry KvGeometry::from_config(const DeepSeekV4Config& c) {
  KvGeometry g;
  auto compressor_bytes = [&](int64_t ratio, int64_t head_dim) {
    cpu::CompressorConfig cc;
    cc.ratio = ratio;
    cc.head_dim = head_dim;
    cc.rope_dim = c.qk_rope_head_dim;
    return 2 * cc.state_rows() * cc.width() * int64_t(sizeof(float));  // kv + score, fp32
  };
  for (int64_t l = 0; l < c.num_layers_total(); ++l) {
    const int64_t ratio = c.compress_ratios[size_t(l)];
    g.swa_ring_bytes += c.sliding_window * kKvEntryBytes;
    if (ratio == 4) {
      g.page_bytes[size_t(KvPool::kCompressed4)] += (kPageTokens / 4) * kKvEntryBytes;
      g.page_bytes[size_t(KvPool::kIndexKeys)] += (kPageTokens / 4) * kIndexKeyEntryBytes;
      g.compressor_state_bytes += compressor_bytes(4, c.head_dim);
      g.compressor_state_bytes += compressor_bytes(4, c.index_head_dim);
    } else if (ratio == 128) {
      g.page_bytes[size_t(KvPool::kCompressed128)] += (kPageTokens / 128) * kKvEntryBytes;
      g.compressor_state_bytes += compressor_bytes(128, c.head_dim);
    }
  }
  g.slot_bytes = g.swa_ring_bytes + g.compressor_state_bytes;
  return g;
}

KvCacheManager::KvCacheManager(const KvGeometry& geometry, std::array<int64_t, kNumKvPools> pages,
                               int64_t slots)
    : geometry_(geometry), slots_total_(std::max<int64_t>(0, slots)) {
  for (int p = 0; p < kNumKvPools; ++p) {
    pages_total_[size_t(p)] =
        geometry.has_pool(KvPool(p)) ? std::max<int64_t>(0, pages[size_t(p)]) : 0;
    auto& fl = free_pages_[size_t(p)];
    fl.resize(size_t(pages_total_[size_t(p)]));
    // A stack popped from the back: page 0 is handed out first.
    for (int64_t i = 0; i < pages_total_[size_t(p)]; ++i) {
      fl[size_t(i)] = int32_t(pages_total_[size_t(p)] - 1 - i);
    }
  }
  free_slots_.resize(size_t(slots_total_));
  for (int64_t i = 0; i < slots_total_; ++i) free_slots_[size_t(i)] = int32_t(slots_total_ - 1 - i);
}

Result<KvCacheManager> KvCacheManager::from_budget(const KvGeometry& g, uint64_t budget_bytes,
                                                   int64_t slots) {
  if (slots < 1) return invalid_argument("KV cache: need at least one sequence slot");
  int64_t page_set = 0;  // bytes of one page in every pool
  for (int p = 0; p < kNumKvPools; ++p) page_set += g.page_bytes[size_t(p)];
  const uint64_t slot_total = uint64_t(slots) * uint64_t(g.slot_bytes);
  if (budget_bytes < slot_total + uint64_t(page_set)) {
    return resource_exhausted(
        "KV cache: a budget of " + std::to_string(budget_bytes) + " bytes does not hold " +
        std::to_string(slots) + " sequence slots of " + std::to_string(g.slot_bytes) +
        " bytes plus one page of each pool (" + std::to_string(page_set) + " bytes)");
  }
  int64_t pages = 0;
  if (page_set == 0) {
    pages = 0;  // an SWA-only model has no paged pools
  } else {
    const uint64_t n = (budget_bytes - slot_total) / uint64_t(page_set);
    pages = int64_t(std::min<uint64_t>(n, uint64_t(std::numeric_limits<int32_t>::max())));
  }
  return KvCacheManager(g, {pages, pages, pages}, slots);
}

int64_t KvCacheManager::capacity_tokens() const {
  int64_t pages = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    any = true;
    pages = std::min(pages, pages_total_[size_t(p)]);
  }
  if (!any) return std::numeric_limits<int32_t>::max();  // nothing grows with the context
  return pages * kPageTokens;
}

int64_t KvCacheManager::max_concurrency(int64_t tokens) const {
  int64_t n = slots_total_;
  const int64_t need = pages_for_tokens(tokens);
  if (need == 0) return n;
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    n = std::min(n, pages_total_[size_t(p)] / need);
  }
  return n;
}

bool KvCacheManager::allocate(uint64_t seq) {
  if (free_slots_.empty() || seqs_.count(seq)) return false;
  SeqPages sp;
  sp.slot = free_slots_.back();
  free_slots_.pop_back();
  seqs_.emplace(seq, std::move(sp));
  return true;
}

bool KvCacheManager::can_grow(uint64_t seq, int64_t tokens) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  const int64_t need = pages_for_tokens(tokens);
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    const int64_t have = int64_t(it->second.pages[size_t(p)].size());
    if (need > have && need - have > int64_t(free_pages_[size_t(p)].size())) return false;
  }
  return true;
}

bool KvCacheManager::can_admit(int64_t tokens) const {
  if (free_slots_.empty()) return false;
  const int64_t need = pages_for_tokens(tokens);
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    if (need > int64_t(free_pages_[size_t(p)].size())) return false;
  }
  return true;
}

bool KvCacheManager::grow(uint64_t seq, int64_t tokens) {
  if (!can_grow(seq, tokens)) return false;
  SeqPages& sp = seqs_.at(seq);
  const int64_t need = pages_for_tokens(tokens);
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    auto& mine = sp.pages[size_t(p)];
    auto& fl = free_pages_[size_t(p)];
    while (int64_t(mine.size()) < need) {
      mine.push_back(fl.back());
      fl.pop_back();
    }
  }
  return true;
}

void KvCacheManager::free(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int p = 0; p < kNumKvPools; ++p) {
    auto& fl = free_pages_[size_t(p)];
    for (auto pit = it->second.pages[size_t(p)].rbegin(); pit != it->second.pages[size_t(p)].rend();
         ++pit) {
      fl.push_back(*pit);
    }
  }
  free_slots_.push_back(it->second.slot);
  seqs_.erase(it);
}

int64_t KvCacheManager::tokens_of(uint64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int64_t pages = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    any = true;
    pages = std::min(pages, int64_t(it->second.pages[size_t(p)].size()));
  }
  return any ? pages * kPageTokens : std::numeric_limits<int32_t>::max();
}

std::vector<KvPoolStats> KvCacheManager::stats() const {
  std::vector<KvPoolStats> out;
  for (int p = 0; p < kNumKvPools; ++p) {
    if (!geometry_.has_pool(KvPool(p))) continue;
    out.push_back({kv_pool_name(KvPool(p)), pages_total_[size_t(p)], pages_free(KvPool(p))});
  }
  out.push_back({"sequence_slots", slots_total_, slots_free()});
  return out;
}

double KvCacheManager::usage() const {
  double u = 0;
  for (const KvPoolStats& s : stats()) {
    if (s.total > 0) u = std::max(u, double(s.total - s.free) / double(s.total));
  }
  return u;
}

uint64_t KvCacheManager::total_bytes() const {
  uint64_t b = uint64_t(slots_total_) * uint64_t(geometry_.slot_bytes);
  for (int p = 0; p < kNumKvPools; ++p) {
    b += uint64_t(pages_total_[size_t(p)]) * uint64_t(geometry_.page_bytes[size_t(p)]);
  }
  return b;
}

}  // namespace ds::runtime
