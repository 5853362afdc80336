// SafetensorsFile: a validating reader for one .safetensors file. The header is treated as hostile
// input and checked, in the order of reliability.md §3 (rules 1-18), before any tensor byte is
// touched; every error names the file, the tensor (if any) and the rule number. Tensor data is
// then read with pread in chunks (a file that shrinks gives an error, never SIGBUS) or through a
// read-only memory map that is re-checked with fstat before each use (rule 17).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds {

// Structural limits on a safetensors header (reliability.md rules 2 and 7).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // reference MAX_HEADER_SIZE
inline constexpr size_t kSafetensorsMaxTensors = 1 << 18;            // ~4x all of DeepSeek-V4-Flash
inline constexpr size_t kSafetensorsMaxNameBytes = 1024;
inline constexpr size_t kSafetensorsMaxRank = 8;
// Any string in the header (a metadata value, or a key before the name check runs).
inline constexpr size_t kSafetensorsMaxStringBytes = 256 * 1024;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;  // [rank], rank <= 8
  uint64_t numel = 0;           // product of shape, > 0
  uint64_t data_offset = 0;     // relative to the start of the data section (8 + header bytes)
  uint64_t nbytes = 0;          // numel * dtype_size(dtype)
};

// "BF16[10, 10]"
std::string describe_tensor_type(DType dtype, std::span<const uint64_t> shape);

class SafetensorsFile {
 public:
  // Opens and validates `path`. kNotFound when it does not exist, kIoError for other OS errors,
  // kCorrupt for any format violation. Reads only the 8-byte prefix and the header.
  static Result<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N
  uint64_t data_start() const { return 8 + header_bytes_; }
  uint64_t data_bytes() const { return file_size_ - data_start(); }

  // All tensors, sorted by data_offset (file order, which is also the best order to read them).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when there is no tensor of that name.
  const TensorInfo* find(std::string_view name) const;
  // The optional "__metadata__" object (string -> string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies bytes [offset_in_tensor, offset_in_tensor + dst.size()) of `tensor` into dst with
  // pread in chunks. `tensor` must come from this file. Thread-safe. A short read (the file shrank
  // after validation) is kIoError naming the file.
  Status read(const TensorInfo& tensor, uint64_t offset_in_tensor, std::span<uint8_t> dst) const;

  // The tensor's bytes through a read-only mapping of the whole file (created on first use). The
  // file is fstat()ed again on every call; if its size changed since validation the call fails
  // instead of handing out a mapping that could fault (rule 17). The span's address may be
  // unaligned (rule 15): copy typed values out with memcpy. Valid until unmap() or destruction;
  // not thread-safe with itself or unmap().
  Result<std::span<const uint8_t>> map_tensor(const TensorInfo& tensor);
  // Drops the mapping (call when loading ends so the mapping is no longer read).
  void unmap();

 private:
  SafetensorsFile() = default;
  Status check_tensor_range(const TensorInfo& tensor, uint64_t offset, uint64_t size) const;
  void close_all();

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;  // sorted by data_offset
  std::vector<uint32_t> by_name_;    // indices into tensors_, sorted by name
  std::map<std::string, std::string> metadata_;
  void* map_addr_ = nullptr;
  size_t map_len_ = 0;
};

}  // namespace ds
