// SafetensorsWriter: writes valid .safetensors files (header padded with spaces to a multiple of
// 8, tensors contiguous in the order added, optional "__metadata__") without holding the data in
// memory: each tensor's bytes come from a fill callback called for consecutive chunks, so
// multi-GB synthetic checkpoints stream straight to disk. write_safetensors_raw is the escape
// hatch the corrupt-file catalogue uses to write deliberately broken files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds {

// Fills `chunk` with the tensor's bytes [offset, offset + chunk.size()). Called for consecutive,
// non-overlapping chunks covering the tensor exactly once, in order.
using SafetensorsFillFn = std::function<void(uint64_t offset, std::span<uint8_t> chunk)>;

class SafetensorsWriter {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t(64) << 20;

  // chunk_bytes: the largest chunk handed to a fill callback (and the write buffer size).
  explicit SafetensorsWriter(size_t chunk_bytes = kDefaultChunkBytes);

  // Adds a "__metadata__" entry (string -> string). The key must be valid UTF-8.
  Status set_metadata(std::string key, std::string value);

  // Adds a tensor whose data comes from `fill`. kInvalidArgument for an empty, over-long, non
  // UTF-8, duplicate or reserved ("__metadata__") name, a rank above 8, a zero-element shape or a
  // byte size that overflows: the writer only produces files the reader accepts.
  Status add(std::string name, DType dtype, std::vector<uint64_t> shape, SafetensorsFillFn fill);
  // Convenience: copies `bytes`, which must be exactly numel * dtype_size bytes.
  Status add(std::string name, DType dtype, std::vector<uint64_t> shape,
             std::span<const uint8_t> bytes);

  // The header JSON text without padding (the catalogue tests edit or re-pad it).
  std::string header_json() const;
  // Total bytes of the data section.
  uint64_t data_bytes() const { return data_bytes_; }

  // Writes the file: first to `path + ".tmp"`, then renamed over `path`, so a failed write never
  // leaves a half-written file under the final name.
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    uint64_t nbytes;
    SafetensorsFillFn fill;
  };
  size_t chunk_bytes_;
  std::vector<Entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// Writes exactly: 8-byte little-endian header.size(), the header text as given (no padding, no
// validation), then `data`. For tests that need malformed files.
Status write_safetensors_raw(const std::string& path, std::string_view header,
                             std::span<const uint8_t> data);
// Same, with an explicit header-length field (which may disagree with header.size()).
Status write_safetensors_raw(const std::string& path, uint64_t header_length_field,
                             std::string_view header, std::span<const uint8_t> data);

}  // namespace ds
