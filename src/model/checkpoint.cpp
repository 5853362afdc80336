// Checkpoint binding and the semantic checks of reliability.md §3.6.
#include "model/checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "model/tensor_spec.h"

namespace ds {
namespace {

std::string shape_str(std::span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Rule 22: hash-routing table entries index the expert arrays.
Status check_tid2eid(CheckpointFiles& files, const TensorSpec& spec, int64_t num_experts) {
  std::vector<uint8_t> bytes(spec.stored_bytes());
  DS_RETURN_IF_ERROR(files.read(spec.name, bytes));
  const size_t n = bytes.size() / 8;
  for (size_t i = 0; i < n; ++i) {
    int64_t e;
    std::memcpy(&e, bytes.data() + i * 8, 8);
    if (e < 0 || e >= num_experts) {
      return corrupt("tensor '" + spec.name + "': rule 22: entry " + std::to_string(i) + " (row " +
                     std::to_string(i / size_t(spec.shape[1])) + ") is " + std::to_string(e) +
                     ", outside [0, n_routed_experts = " + std::to_string(num_experts) + ")");
    }
  }
  return ok_status();
}

// Rule 23 on one tensor, in chunks.
Status scan_values(CheckpointFiles& files, const TensorSpec& spec, uint64_t* done, uint64_t total,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
  const uint64_t nbytes = spec.stored_bytes();
  const uint64_t chunk = uint64_t(16) << 20;
  std::vector<uint8_t> buf(size_t(std::min(nbytes, chunk)));
  DS_ASSIGN_OR_RETURN(TensorRef ref, files.find(spec.name));
  const size_t esize = dtype_size(spec.dtype);
  for (uint64_t off = 0; off < nbytes; off += chunk) {
    std::span<uint8_t> part(buf.data(), size_t(std::min(chunk, nbytes - off)));
    DS_RETURN_IF_ERROR(ref.shard->read(*ref.info, off, part));
    for (size_t i = 0; i < part.size(); i += esize) {
      bool bad = false;
      const char* what = "";
      switch (spec.dtype) {
        case DType::kBF16: {
          uint16_t b;
          std::memcpy(&b, &part[i], 2);
          bad = !std::isfinite(bf16_to_float(b));
          what = "a NaN or infinite BF16 value";
          break;
        }
        case DType::kF32: {
          float f;
          std::memcpy(&f, &part[i], 4);
          bad = !std::isfinite(f);
          what = "a NaN or infinite F32 value";
          break;
        }
        case DType::kF8E8M0:
          bad = part[i] == kE8M0Nan;
          what = "the E8M0 NaN code 0xFF";
          break;
        case DType::kF8E4M3:
          bad = (part[i] & 0x7F) == 0x7F;
          what = "an e4m3 NaN code";
          break;
        default:
          break;
      }
      if (bad) {
        return corrupt("tensor '" + spec.name + "': rule 23: holds " + what + " at element " +
                       std::to_string((off + i) / esize));
      }
    }
    *done += part.size();
    if (progress) progress(*done, total);
  }
  return ok_status();
}

}  // namespace

Status validate_checkpoint(CheckpointFiles& files, const DeepSeekV4Config& config,
                           const CheckpointValidateOptions& options) {
  std::vector<TensorSpec> specs = expected_tensors(config);
  std::set<std::string, std::less<>> expected;
  // Rule 20: every expected tensor, with its dtype and shape.
  for (const TensorSpec& spec : specs) {
    expected.insert(spec.name);
    auto found = files.find(spec.name);
    if (!found.ok()) {
      if (spec.optional) continue;
      return corrupt("tensor '" + spec.name + "': rule 20: missing from the checkpoint (expected " +
                     describe(spec) + ")");
    }
    std::vector<uint64_t> shape(spec.shape.begin(), spec.shape.end());
    auto ok = files.expect(spec.name, spec.dtype, shape);
    if (!ok.ok()) return ok.status().with_context("rule 20");
  }
  // Rule 20: nothing unexpected, apart from the documented ignore list.
  for (const std::string& name : files.names()) {
    if (expected.count(name) || is_ignored_tensor(name)) continue;
    auto ref = files.find(name);
    std::string type = ref.ok() ? std::string(dtype_name(ref->info->dtype)) + shape_str(ref->info->shape) : "";
    return corrupt("tensor '" + name + "' " + type +
                   ": rule 20: not part of a DeepSeek-V4 checkpoint with this config.json");
  }
  // Rule 22: values used as indices.
  for (const TensorSpec& spec : specs) {
    if (spec.component == TensorComponent::kHashTable)
      DS_RETURN_IF_ERROR(check_tid2eid(files, spec, config.n_routed_experts));
  }
  // Rule 23 (optional): every value finite, no NaN scale codes.
  if (options.full_scan) {
    uint64_t total = 0, done = 0;
    for (const TensorSpec& spec : specs)
      if (files.find(spec.name).ok()) total += spec.stored_bytes();
    for (const TensorSpec& spec : specs) {
      if (!files.find(spec.name).ok()) continue;
      DS_RETURN_IF_ERROR(scan_values(files, spec, &done, total, options.on_scan_progress));
    }
  }
  return ok_status();
}

Result<Checkpoint> open_checkpoint(const std::string& dir, const CheckpointValidateOptions& options) {
  DS_ASSIGN_OR_RETURN(DeepSeekV4Config config,
                      load_config_file(std::filesystem::path(dir) / "config.json"));
  DS_ASSIGN_OR_RETURN(CheckpointFiles files, CheckpointFiles::open(dir));
  DS_RETURN_IF_ERROR(validate_checkpoint(files, config, options));
  return Checkpoint{std::move(config), std::move(files)};
}

}  // namespace ds
