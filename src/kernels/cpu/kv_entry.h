// CPU reference of the FP8 KV cache entry and its paged layout (dsv4-model.md §7.2, §11): the
// 584-byte entry of DeepSeek-V4-Flash (448 e4m3 nope values with one ue8m0 scale per 64, 64 bf16
// rope values, 1 pad byte), generalized to any head_dim = nope + 64 with nope a multiple of 64
// (the tiny model's 64 + 128 + 1 + 1 = 194 bytes). In a page of P entries the data section comes
// first (entry i at i * data_bytes: [nope e4m3 | rope bf16]), then the scale section (entry i at
// P * data_bytes + i * scale_bytes: nope/64 scale bytes, then the pad byte). A scale byte b means
// 2^(b - 127). Page bytes are rounded up to a multiple of data_bytes (576 for Flash).
#pragma once

#include <cstdint>

namespace ds::cpu {

inline constexpr int64_t kKvRopeDim = 64;

struct KvEntryLayout {
  int64_t head_dim = 512;  // nope + rope; nope = head_dim - 64 must be a positive multiple of 64

  int64_t nope_dim() const { return head_dim - kKvRopeDim; }
  int64_t num_scales() const { return nope_dim() / 64; }
  int64_t data_bytes() const { return nope_dim() + 2 * kKvRopeDim; }    // 576 for Flash
  int64_t scale_bytes() const { return num_scales() + 1; }              // 8 for Flash (7 + pad)
  int64_t entry_bytes() const { return data_bytes() + scale_bytes(); }  // 584 for Flash
  bool valid() const { return head_dim > kKvRopeDim && nope_dim() % 64 == 0; }
};

// Bytes of one page of `page_size` entries: page_size * entry_bytes rounded up to a multiple of
// data_bytes.
int64_t kv_page_bytes(const KvEntryLayout& layout, int64_t page_size);

// Quantizes one KV vector into its entry: the nope part as e4m3 with ue8m0 scales per 64 (the
// rule of ds::cpu::quantize_fp8_blocks, §7.2), the rope part rounded to bf16, the pad byte 0.
//   kv     [head_dim] fp32
//   data   [data_bytes]
//   scales [scale_bytes]
void pack_kv_entry(const KvEntryLayout& layout, const float* kv, uint8_t* data, uint8_t* scales);

// Dequantizes one entry: nope = e4m3 * 2^(scale - 127) (exact in bf16 and fp32), rope = bf16.
//   out [head_dim] fp32
void unpack_kv_entry(const KvEntryLayout& layout, const uint8_t* data, const uint8_t* scales,
                     float* out);

// A paged KV buffer: `pool` holds pages of `page_bytes`; a sequence's logical entry i lives in
// page page_table[i / page_size] at slot i % page_size.
struct PagedKv {
  KvEntryLayout layout;
  int64_t page_size = 0;   // entries per page
  int64_t page_bytes = 0;  // kv_page_bytes(layout, page_size)
  uint8_t* pool = nullptr;
};

// Byte addresses of logical entry `index` of a sequence whose page table is `page_table`.
uint8_t* kv_entry_data(const PagedKv& kv, const int32_t* page_table, int64_t index);
uint8_t* kv_entry_scales(const PagedKv& kv, const int32_t* page_table, int64_t index);

}  // namespace ds::cpu
