// CheckpointFiles: the set of safetensors shards that make up one checkpoint directory, with the
// shard map (model.safetensors.index.json) validated per reliability.md rule 19 and every shard
// header validated on open. Lookup by tensor name, reads by pread, fstat-guarded mappings, and
// expect() for checking a tensor's dtype and shape against what the model needs (rule 20).
//
// Which files form the checkpoint:
//   1. model.safetensors.index.json present: exactly the shards its weight_map names.
//   2. otherwise model.safetensors, if present;
//   3. otherwise the one *.safetensors file in the directory, if there is exactly one
//      (several without an index is an error: it is unknown which belong together).
// In every case each shard must be a regular file that, after realpath() canonicalization, lies
// inside the (canonical) checkpoint directory; a symlink out of it is refused, which also refuses
// Hugging Face cache snapshot directories whose files link to ../../blobs (copy or point at the
// real files instead). *.safetensors files that the index does not name are ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/safetensors.h"

namespace ds {

inline constexpr std::string_view kShardIndexFileName = "model.safetensors.index.json";
inline constexpr uint64_t kShardIndexMaxBytes = uint64_t(64) << 20;

// A tensor located in its shard. Pointers stay valid for the lifetime of the CheckpointFiles
// (moving it keeps them valid too).
struct TensorRef {
  SafetensorsFile* shard = nullptr;
  const TensorInfo* info = nullptr;
};

class CheckpointFiles {
 public:
  // Opens `dir`: kNotFound when it (or a shard it needs) does not exist, kCorrupt for a bad index
  // or shard (the message names the file, tensor and rule), kIoError for OS errors. Reads only the
  // index and the shard headers, never tensor data.
  static Result<CheckpointFiles> open(const std::string& dir);

  const std::string& dir() const { return dir_; }  // canonical path
  // The shards in a fixed order (the index's shard names sorted, or the single file).
  size_t num_shards() const { return shards_.size(); }
  SafetensorsFile& shard(size_t i) { return *shards_[i]; }
  const SafetensorsFile& shard(size_t i) const { return *shards_[i]; }
  size_t num_tensors() const { return index_.size(); }
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  // Sum of all tensors' bytes.
  uint64_t total_bytes() const;

  // kNotFound naming the tensor when absent.
  Result<TensorRef> find(std::string_view name) const;
  // Copies the whole tensor; dst.size() must equal its byte size.
  Status read(std::string_view name, std::span<uint8_t> dst) const;
  // The tensor's bytes through its shard's mapping (SafetensorsFile::map_tensor).
  Result<std::span<const uint8_t>> map(std::string_view name);
  // find() plus a check that the tensor has exactly this dtype and shape; the error names the
  // tensor and the expected and actual types ("expected BF16[4096] but the checkpoint has ...").
  Result<TensorRef> expect(std::string_view name, DType dtype,
                           std::span<const uint64_t> shape) const;
  Result<TensorRef> expect(std::string_view name, DType dtype,
                           std::initializer_list<uint64_t> shape) const {
    return expect(name, dtype, std::span<const uint64_t>(shape.begin(), shape.size()));
  }

 private:
  struct Location {
    uint32_t shard;
    const TensorInfo* info;
  };
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, Location, std::less<>> index_;
};

}  // namespace ds
