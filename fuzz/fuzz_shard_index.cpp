// Fuzz target: the shard map model.safetensors.index.json (reliability.md rule 19). The input
// bytes become the index file of a scratch checkpoint directory, made once per process, which
// holds two small valid shards (model-00001-of-00002.safetensors: tensors a, b;
// model-00002-of-00002.safetensors: c), a shard that repeats tensor a (dup.safetensors), a file
// that is not a safetensors file (notes.safetensors), a subdirectory with a shard
// (sub/model.safetensors) and a symlink to a valid shard outside the directory
// (link.safetensors -> ../outside.safetensors), so that duplicates, separators and symlink
// escapes are all reachable. ds::CheckpointFiles::open must then either refuse or give a
// checkpoint whose every tensor can be found, read and mapped, and is named by exactly one shard.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/checkpoint_files.h"
#include "model/safetensors_writer.h"

namespace {

void write_shard(const std::string& path, const std::vector<std::string>& names) {
  ds::SafetensorsWriter w;
  uint8_t seed = 1;
  for (const auto& name : names) {
    std::vector<uint8_t> bytes(8);
    for (auto& b : bytes) b = seed++;
    ds::Status st = w.add(name, ds::DType::kBF16, {2, 2}, bytes);
    DS_FUZZ_CHECK(st.ok(), st.to_string());
  }
  ds::Status st = w.write(path);
  DS_FUZZ_CHECK(st.ok(), st.to_string());
}

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string root = ds::fuzz::scratch_dir();
    const std::string d = root + "/ckpt";
    fs::create_directories(d + "/sub");
    write_shard(d + "/model-00001-of-00002.safetensors", {"a", "b"});
    write_shard(d + "/model-00002-of-00002.safetensors", {"c"});
    write_shard(d + "/dup.safetensors", {"a"});
    write_shard(d + "/sub/model.safetensors", {"s"});
    write_shard(root + "/outside.safetensors", {"o"});
    ds::fuzz::write_file(d + "/notes.safetensors", "not a safetensors file");
    DS_FUZZ_CHECK(::symlink("../outside.safetensors", (d + "/link.safetensors").c_str()) == 0,
                  "symlink");
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  const std::string& dir = checkpoint_dir();
  ds::fuzz::write_file(dir + "/" + std::string(ds::kShardIndexFileName),
                       std::string_view(reinterpret_cast<const char*>(data), size));

  auto opened = ds::CheckpointFiles::open(dir);
  ds::fuzz::note_result(opened.status());
  if (!opened.ok()) {
    DS_FUZZ_CHECK(!opened.status().message().empty(), "an error without a message");
    return 0;
  }
  ds::CheckpointFiles& ckpt = *opened;
  const std::vector<std::string> names = ckpt.names();
  DS_FUZZ_CHECK(names.size() == ckpt.num_tensors(), "names() and num_tensors() disagree");
  for (const std::string& n : names) {
    DS_FUZZ_CHECK(n != "o" && n != "s", "a shard outside the directory was opened: " + n);
  }
  uint64_t total = 0;
  size_t tensors_in_shards = 0;
  for (size_t i = 0; i < ckpt.num_shards(); ++i)
    tensors_in_shards += ckpt.shard(i).tensors().size();
  DS_FUZZ_CHECK(tensors_in_shards == names.size(), "a tensor is missing from the map or doubled");
  for (const std::string& n : names) {
    auto ref = ckpt.find(n);
    DS_FUZZ_CHECK(ref.ok() && ref->info != nullptr && ref->shard != nullptr, "find() failed: " + n);
    total += ref->info->nbytes;
    std::vector<uint8_t> copy(ref->info->nbytes);
    ds::Status st = ckpt.read(n, copy);
    DS_FUZZ_CHECK(st.ok(), "read() failed: " + st.to_string());
    auto mapped = ckpt.map(n);
    DS_FUZZ_CHECK(mapped.ok(), "map() failed: " + mapped.status().to_string());
    DS_FUZZ_CHECK(mapped->size() == copy.size() &&
                      (copy.empty() || std::memcmp(mapped->data(), copy.data(), copy.size()) == 0),
                  "read() and map() disagree: " + n);
    auto expected = ckpt.expect(n, ref->info->dtype, ref->info->shape);
    DS_FUZZ_CHECK(expected.ok(), "expect() with the tensor's own type failed: " + n);
  }
  DS_FUZZ_CHECK(total == ckpt.total_bytes(), "total_bytes() is not the sum of the tensors");
  DS_FUZZ_CHECK(!ckpt.find("no such tensor").ok(), "find() of a missing name succeeded");
  return 0;
}
