// FP8 KV entry (dsv4-model.md §11) on the CPU: the byte layout of the 584-byte entry checked on
// hand-computed bytes, pack/unpack against the §7.2 FP8 simulation (simulate_fp8_kv_nope, exact
// equality: e4m3 x 2^k is exact), page sizes, and paged addressing (every entry of several
// sequences written through the page tables and read back unchanged, no two entries overlapping).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/kv_entry.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {
namespace {

TEST(KvEntryRef, LayoutSizes) {
  KvEntryLayout flash{512};
  EXPECT_TRUE(flash.valid());
  EXPECT_EQ(flash.nope_dim(), 448);
  EXPECT_EQ(flash.data_bytes(), 576);
  EXPECT_EQ(flash.scale_bytes(), 8);
  EXPECT_EQ(flash.entry_bytes(), 584);
  EXPECT_EQ(kv_page_bytes(flash, 256), 260 * 576);  // 256 * 584 = 149504 -> 149760
  EXPECT_EQ(kv_page_bytes(flash, 64), 65 * 576);    // 37376 -> 37440
  KvEntryLayout tiny{128};
  EXPECT_TRUE(tiny.valid());
  EXPECT_EQ(tiny.entry_bytes(), 194);
  EXPECT_FALSE(KvEntryLayout{100}.valid());
  EXPECT_FALSE(KvEntryLayout{64}.valid());
}

TEST(KvEntryRef, HandComputedBytes) {
  KvEntryLayout layout{512};
  std::vector<float> kv(512, 0.0f);
  kv[0] = 1.0f;     // block 0: amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8 (byte 119), code 256
  kv[1] = -0.5f;    // -128 = -2^7: sign 1, exponent field 14, mantissa 0 -> 0xF0
  kv[64] = 448.0f;  // block 1: amax 448 -> scale 2^0 (byte 127), code 448 = 0x7E
  kv[448] = 1.0f;   // rope: bf16 0x3F80, little-endian
  kv[449] = -2.0f;  // bf16 0xC000
  std::vector<uint8_t> data(576, 0xAA), scales(8, 0xAA);
  pack_kv_entry(layout, kv.data(), data.data(), scales.data());
  EXPECT_EQ(data[0], 0x78);
  EXPECT_EQ(data[1], 0xF0);
  EXPECT_EQ(data[2], 0x00);
  EXPECT_EQ(data[64], 0x7E);
  EXPECT_EQ(scales[0], 119);
  EXPECT_EQ(scales[1], 127);
  EXPECT_EQ(scales[2], 127 - 22);  // all-zero block: amax floor 1e-4 -> 2^ceil(log2(1e-4/448))
  EXPECT_EQ(scales[7], 0);         // pad
  EXPECT_EQ(data[448], 0x80);
  EXPECT_EQ(data[449], 0x3F);
  EXPECT_EQ(data[450], 0x00);
  EXPECT_EQ(data[451], 0xC0);
  std::vector<float> back(512);
  unpack_kv_entry(layout, data.data(), scales.data(), back.data());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -0.5f);
  EXPECT_EQ(back[64], 448.0f);
  EXPECT_EQ(back[449], -2.0f);
}

// unpack(pack(x)) equals the reference FP8 simulation of the nope part and bf16 of the rope part.
void check_round_trip(int64_t head_dim, uint64_t seed) {
  KvEntryLayout layout{head_dim};
  Rng rng(seed);
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> kv(static_cast<size_t>(head_dim));
    const float mag = std::ldexp(1.0f, int(rng.below(24)) - 12);
    for (auto& v : kv) v = round_bf16(rng.normal() * mag);
    std::vector<float> expect = kv;
    simulate_fp8_kv_nope(expect.data(), 1, head_dim, kKvRopeDim);
    std::vector<uint8_t> data(size_t(layout.data_bytes())), scales(size_t(layout.scale_bytes()));
    pack_kv_entry(layout, kv.data(), data.data(), scales.data());
    std::vector<float> got(static_cast<size_t>(head_dim));
    unpack_kv_entry(layout, data.data(), scales.data(), got.data());
    for (int64_t i = 0; i < head_dim; ++i) ASSERT_EQ(got[size_t(i)], expect[size_t(i)]) << i;
  }
}

TEST(KvEntryRef, RoundTripMatchesFp8Simulation) {
  check_round_trip(512, 1);
  check_round_trip(128, 2);
}

TEST(KvEntryRef, PagedAddressing) {
  for (int64_t head_dim : {int64_t(128), int64_t(512)}) {
    PagedKv kv;
    kv.layout = KvEntryLayout{head_dim};
    kv.page_size = 4;
    kv.page_bytes = kv_page_bytes(kv.layout, kv.page_size);
    const int num_pages = 6;
    std::vector<uint8_t> pool(size_t(num_pages * kv.page_bytes), 0);
    kv.pool = pool.data();
    // Two sequences of 8 and 7 entries on shuffled pages; page 0 unused.
    const std::vector<std::vector<int32_t>> tables = {{3, 1}, {5, 2}};
    const int64_t lengths[2] = {8, 7};
    Rng rng(static_cast<uint64_t>(head_dim));
    std::vector<std::vector<std::vector<float>>> written(2);
    for (int s = 0; s < 2; ++s)
      for (int64_t i = 0; i < lengths[s]; ++i) {
        std::vector<float> v(static_cast<size_t>(head_dim));
        for (auto& x : v) x = round_bf16(rng.normal());
        pack_kv_entry(kv.layout, v.data(), kv_entry_data(kv, tables[s].data(), i),
                      kv_entry_scales(kv, tables[s].data(), i));
        simulate_fp8_kv_nope(v.data(), 1, head_dim, kKvRopeDim);
        written[s].push_back(v);
      }
    // Exact addresses of one entry: page 1 (physical), slot 1.
    EXPECT_EQ(kv_entry_data(kv, tables[0].data(), 5) - kv.pool,
              1 * kv.page_bytes + 1 * kv.layout.data_bytes());
    EXPECT_EQ(kv_entry_scales(kv, tables[0].data(), 5) - kv.pool,
              1 * kv.page_bytes + 4 * kv.layout.data_bytes() + 1 * kv.layout.scale_bytes());
    for (int s = 0; s < 2; ++s)
      for (int64_t i = 0; i < lengths[s]; ++i) {
        std::vector<float> got(static_cast<size_t>(head_dim));
        unpack_kv_entry(kv.layout, kv_entry_data(kv, tables[s].data(), i),
                        kv_entry_scales(kv, tables[s].data(), i), got.data());
        ASSERT_EQ(got, written[s][size_t(i)]) << "seq " << s << " entry " << i;
      }
    // Page 0 and page 4 were never written.
    for (int64_t b = 0; b < kv.page_bytes; ++b) {
      ASSERT_EQ(pool[size_t(b)], 0);
      ASSERT_EQ(pool[size_t(4 * kv.page_bytes + b)], 0);
    }
  }
}

}  // namespace
}  // namespace ds::cpu
