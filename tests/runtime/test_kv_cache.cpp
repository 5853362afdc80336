// KV cache manager: page geometry of the tiny config (hand-computed from dsv4-model.md §11),
// allocation, growth, all-or-nothing growth across unequal pools (KV5), exhaustion, idempotent
// free and the return of every pool to its baseline.
#include <gtest/gtest.h>

#include "model/config.h"
#include "runtime/kv_cache.h"

namespace ds::runtime {
namespace {

TEST(KvGeometry, TinyConfigBytes) {
  // tiny: compress_ratios {0, 4, 128, 4, 0}: two CSA layers, one HCA layer, five rings of 16.
  const KvGeometry g = KvGeometry::from_config(tiny_config());
  EXPECT_EQ(g.page_bytes[size_t(KvPool::kCompressed4)], 2 * 64 * 584);
  EXPECT_EQ(g.page_bytes[size_t(KvPool::kIndexKeys)], 2 * 64 * 132);
  EXPECT_EQ(g.page_bytes[size_t(KvPool::kCompressed128)], 1 * 2 * 584);
  EXPECT_EQ(g.swa_ring_bytes, 5 * 16 * 584);
  // CSA: attention and indexer compressors, 8 rows x 256 wide (kv + score, fp32) each;
  // HCA: 128 rows x 128 wide.
  EXPECT_EQ(g.compressor_state_bytes, 2 * (2 * 8 * 256 * 4 * 2) + 2 * 128 * 128 * 4);
  EXPECT_EQ(g.slot_bytes, g.swa_ring_bytes + g.compressor_state_bytes);
}

TEST(KvCache, AllocateGrowFree) {
  const KvGeometry g = KvGeometry::from_config(tiny_config());
  KvCacheManager kv(g, {10, 10, 10}, 3);
  EXPECT_EQ(kv.capacity_tokens(), 10 * 256);
  EXPECT_EQ(kv.max_concurrency(512), 3);   // slots bound it
  EXPECT_EQ(kv.max_concurrency(1024), 2);  // 4 pages each out of 10
  ASSERT_TRUE(kv.allocate(7));
  EXPECT_FALSE(kv.allocate(7));  // already holds a slot
  EXPECT_EQ(kv.slots_free(), 2);
  ASSERT_TRUE(kv.grow(7, 1));
  EXPECT_EQ(kv.tokens_of(7), 256);
  for (int p = 0; p < kNumKvPools; ++p) EXPECT_EQ(kv.pages_free(KvPool(p)), 9);
  ASSERT_TRUE(kv.grow(7, 256));  // still one page
  EXPECT_EQ(kv.pages_free(KvPool::kCompressed4), 9);
  ASSERT_TRUE(kv.grow(7, 257));
  EXPECT_EQ(kv.pages_free(KvPool::kCompressed4), 8);
  EXPECT_EQ(kv.tokens_of(7), 512);
  EXPECT_FALSE(kv.grow(8, 10));  // no slot
  kv.free(7);
  kv.free(7);  // idempotent
  for (int p = 0; p < kNumKvPools; ++p) EXPECT_EQ(kv.pages_free(KvPool(p)), 10);
  EXPECT_EQ(kv.slots_free(), 3);
  EXPECT_DOUBLE_EQ(kv.usage(), 0.0);
}

TEST(KvCache, ExhaustionIsAllOrNothingAcrossUnequalPools) {
  const KvGeometry g = KvGeometry::from_config(tiny_config());
  // The indexer-key pool is the smallest: it runs out first while the others have room (KV5).
  KvCacheManager kv(g, {8, 8, 3}, 4);
  EXPECT_EQ(kv.capacity_tokens(), 3 * 256);
  EXPECT_TRUE(kv.can_ever_fit(768));
  EXPECT_FALSE(kv.can_ever_fit(769));
  ASSERT_TRUE(kv.allocate(1));
  ASSERT_TRUE(kv.grow(1, 512));
  ASSERT_TRUE(kv.allocate(2));
  EXPECT_FALSE(kv.grow(2, 512));  // indexer pool has 1 page left
  // Nothing was taken from any pool by the failed grow.
  EXPECT_EQ(kv.pages_free(KvPool::kCompressed4), 6);
  EXPECT_EQ(kv.pages_free(KvPool::kCompressed128), 6);
  EXPECT_EQ(kv.pages_free(KvPool::kIndexKeys), 1);
  EXPECT_TRUE(kv.grow(2, 200));
  EXPECT_EQ(kv.pages_free(KvPool::kIndexKeys), 0);
  EXPECT_FALSE(kv.can_admit(1));  // pages gone although slots remain
  EXPECT_DOUBLE_EQ(kv.usage(), 1.0);
  kv.free(1);
  kv.free(2);
  const auto stats = kv.stats();
  ASSERT_EQ(stats.size(), 4u);
  for (const auto& s : stats) EXPECT_EQ(s.free, s.total) << s.name;
}

TEST(KvCache, SlotsRunOut) {
  const KvGeometry g = KvGeometry::from_config(tiny_config());
  KvCacheManager kv(g, {100, 100, 100}, 2);
  EXPECT_TRUE(kv.allocate(1));
  EXPECT_TRUE(kv.allocate(2));
  EXPECT_FALSE(kv.allocate(3));
  EXPECT_FALSE(kv.can_admit(1));
  kv.free(1);
  EXPECT_TRUE(kv.allocate(3));
}

TEST(KvCache, FromBudget) {
  const KvGeometry g = KvGeometry::from_config(tiny_config());
  const int64_t page_set = 2 * 64 * 584 + 2 * 64 * 132 + 2 * 584;
  auto kv = KvCacheManager::from_budget(g, uint64_t(4 * g.slot_bytes + 10 * page_set + 5), 4);
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  for (int p = 0; p < kNumKvPools; ++p) EXPECT_EQ(kv->pages_total(KvPool(p)), 10);
  EXPECT_EQ(kv->slots_total(), 4);
  EXPECT_LE(kv->total_bytes(), uint64_t(4 * g.slot_bytes + 10 * page_set + 5));
  auto small = KvCacheManager::from_budget(g, uint64_t(4 * g.slot_bytes), 4);
  EXPECT_FALSE(small.ok());
}

}  // namespace
}  // namespace ds::runtime
