// FP8 KV entry pack/unpack and paged addressing (see kv_entry.h).
#include "kernels/cpu/kv_entry.h"

#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {

int64_t kv_page_bytes(const KvEntryLayout& layout, int64_t page_size) {
  const int64_t raw = page_size * layout.entry_bytes();
  const int64_t unit = layout.data_bytes();
  return (raw + unit - 1) / unit * unit;
}

void pack_kv_entry(const KvEntryLayout& layout, const float* kv, uint8_t* data, uint8_t* scales) {
  const int64_t nope = layout.nope_dim();
  quantize_fp8_blocks(kv, nope, kKvFp8Block, data, scales, nullptr);
  for (int64_t i = 0; i < kKvRopeDim; ++i) {
    const uint16_t bits = float_to_bf16(kv[nope + i]);
    std::memcpy(data + nope + 2 * i, &bits, 2);  // little-endian bf16, as on the GPU
  }
  scales[layout.num_scales()] = 0;  // pad byte
}

void unpack_kv_entry(const KvEntryLayout& layout, const uint8_t* data, const uint8_t* scales,
                     float* out) {
  const int64_t nope = layout.nope_dim();
  for (int64_t i = 0; i < nope; ++i)
    out[i] = e4m3_to_float(data[i]) * e8m0_to_float(scales[i / kKvFp8Block]);
  for (int64_t i = 0; i < kKvRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + nope + 2 * i, 2);
    out[nope + i] = bf16_to_float(bits);
  }
}

namespace {
uint8_t* page_of(const PagedKv& kv, const int32_t* page_table, int64_t index) {
  return kv.pool + int64_t(page_table[index / kv.page_size]) * kv.page_bytes;
}
}  // namespace

uint8_t* kv_entry_data(const PagedKv& kv, const int32_t* page_table, int64_t index) {
  return page_of(kv, page_table, index) + (index % kv.page_size) * kv.layout.data_bytes();
}

uint8_t* kv_entry_scales(const PagedKv& kv, const int32_t* page_table, int64_t index) {
  return page_of(kv, page_table, index) + kv.page_size * kv.layout.data_bytes() +
         (index % kv.page_size) * kv.layout.scale_bytes();
}

}  // namespace ds::cpu
