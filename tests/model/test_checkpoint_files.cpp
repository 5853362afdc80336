// Checkpoint directories: sharded round trips through model.safetensors.index.json, the
// single-file fallbacks, expect() messages, and the shard-map catalogue of reliability.md §4.2
// (rule 19: a bad map, a missing shard, path escapes textual and by symlink, tensors in two
// shards or missing from the map, map entries missing from their shard).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "core/rng.h"
#include "model/checkpoint_files.h"
#include "model/safetensors_writer.h"

namespace ds {
namespace {

using test::TempDir;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
};

class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest() : rng_(uint64_t(::time(nullptr)) ^ (uint64_t(::getpid()) << 32)) {}

  // Writes a shard with random data and records the bytes for later comparison.
  void write_shard(const std::string& path, const std::vector<Spec>& specs) {
    SafetensorsWriter writer(/*chunk_bytes=*/64);
    for (const Spec& s : specs) {
      uint64_t n = dtype_size(s.dtype);
      for (uint64_t d : s.shape) n *= d;
      std::vector<uint8_t> bytes(n);
      for (auto& b : bytes) b = uint8_t(rng_.next_u64());
      ASSERT_TRUE(writer.add(s.name, s.dtype, s.shape, bytes).ok());
      bytes_[s.name] = std::move(bytes);
    }
    ASSERT_TRUE(writer.write(path).ok());
  }

  void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }

  // An index mapping each tensor to its shard.
  void write_index(const std::map<std::string, std::string>& map) {
    std::string text = "{\"metadata\":{\"total_size\":123},\"weight_map\":{";
    bool first = true;
    for (const auto& [t, s] : map) {
      if (!first) text += ",";
      first = false;
      text += "\"" + t + "\":\"" + s + "\"";
    }
    text += "}}";
    write_text(dir_.file("model.safetensors.index.json"), text);
  }

  // Two shards, three tensors, and a matching index.
  void write_valid_sharded() {
    write_shard(dir_.file("model-00001-of-00002.safetensors"),
                {{"embed.weight", DType::kBF16, {16, 8}}, {"norm.weight", DType::kBF16, {8}}});
    write_shard(dir_.file("model-00002-of-00002.safetensors"),
                {{"layers.0.attn.wq_a.weight", DType::kF8E4M3, {32, 8}},
                 {"layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 1}}});
    map_ = {{"embed.weight", "model-00001-of-00002.safetensors"},
            {"norm.weight", "model-00001-of-00002.safetensors"},
            {"layers.0.attn.wq_a.weight", "model-00002-of-00002.safetensors"},
            {"layers.0.attn.wq_a.scale", "model-00002-of-00002.safetensors"}};
    write_index(map_);
  }

  void expect_error(const Status& s, StatusCode code,
                    std::initializer_list<std::string> fragments) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const std::string& f : fragments)
      EXPECT_NE(s.message().find(f), std::string::npos)
          << "missing '" << f << "' in " << s.message();
  }

  void check_all_tensors(CheckpointFiles& ck) {
    ASSERT_EQ(ck.num_tensors(), bytes_.size());
    std::vector<std::string> names = ck.names();
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    uint64_t total = 0;
    for (const auto& [name, want] : bytes_) {
      auto ref = ck.find(name);
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      EXPECT_EQ(ref->info->name, name);
      total += ref->info->nbytes;
      std::vector<uint8_t> got(want.size());
      ASSERT_TRUE(ck.read(name, got).ok());
      EXPECT_EQ(got, want) << name;
      auto m = ck.map(name);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      EXPECT_TRUE(std::equal(m->begin(), m->end(), want.begin(), want.end())) << name;
    }
    EXPECT_EQ(ck.total_bytes(), total);
  }

  TempDir dir_;
  Rng rng_;
  std::map<std::string, std::vector<uint8_t>> bytes_;
  std::map<std::string, std::string> map_;
};

// ---- valid directories ------------------------------------------------------------------------

TEST_F(CheckpointTest, WF6_ShardedRoundTrip) {
  write_valid_sharded();
  // A stray file the index does not name is ignored.
  write_text(dir_.file("stray.safetensors"), "not a safetensors file");
  auto ck = CheckpointFiles::open(dir_.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->num_shards(), 2u);
  check_all_tensors(*ck);
  // Moving the checkpoint keeps the references valid.
  CheckpointFiles moved = std::move(ck).value();
  check_all_tensors(moved);
}

TEST_F(CheckpointTest, WF6_SingleModelSafetensors) {
  write_shard(dir_.file("model.safetensors"),
              {{"a", DType::kF32, {3, 5}}, {"b", DType::kI64, {2}}, {"c", DType::kU8, {}}});
  write_shard(dir_.file("other.safetensors"), {{"x", DType::kF32, {1}}});
  bytes_.erase("x");  // model.safetensors wins over other files
  auto ck = CheckpointFiles::open(dir_.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->num_shards(), 1u);
  check_all_tensors(*ck);
  EXPECT_EQ(ck->find("x").status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, WF6_OnlySafetensorsFileWithoutIndex) {
  write_shard(dir_.file("weights.safetensors"), {{"w", DType::kBF16, {4, 4}}});
  write_text(dir_.file("config.json"), "{}");
  auto ck = CheckpointFiles::open(dir_.path() + "/");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  check_all_tensors(*ck);
}

TEST_F(CheckpointTest, WF6_SeveralFilesWithoutIndexRefused) {
  write_shard(dir_.file("a.safetensors"), {{"a", DType::kU8, {1}}});
  write_shard(dir_.file("b.safetensors"), {{"b", DType::kU8, {1}}});
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kInvalidArgument,
               {"2 *.safetensors files", "model.safetensors.index.json"});
}

TEST_F(CheckpointTest, WF6_EmptyOrMissingDirectory) {
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kNotFound,
               {"no model.safetensors.index.json"});
  expect_error(CheckpointFiles::open(dir_.file("nope")).status(), StatusCode::kNotFound,
               {"no such directory"});
  write_text(dir_.file("plain"), "x");
  EXPECT_FALSE(CheckpointFiles::open(dir_.file("plain")).ok());
}

TEST_F(CheckpointTest, WF6_SymlinkInsideDirectoryAllowed) {
  write_shard(dir_.file("real.safetensors"), {{"t", DType::kF32, {2}}});
  ASSERT_EQ(::symlink("real.safetensors", dir_.file("model.safetensors").c_str()), 0);
  auto ck = CheckpointFiles::open(dir_.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  check_all_tensors(*ck);
}

TEST_F(CheckpointTest, WF6_ExpectNamesTensorAndTypes) {
  write_valid_sharded();
  auto ck = CheckpointFiles::open(dir_.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto ok = ck->expect("embed.weight", DType::kBF16, {16, 8});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->info->nbytes, 16u * 8 * 2);
  expect_error(ck->expect("embed.weight", DType::kF32, {16, 8}).status(), StatusCode::kCorrupt,
               {"tensor 'embed.weight'", "expected F32[16, 8] but the checkpoint has BF16[16, 8]"});
  expect_error(ck->expect("embed.weight", DType::kBF16, {8, 16}).status(), StatusCode::kCorrupt,
               {"tensor 'embed.weight'", "expected BF16[8, 16]"});
  expect_error(ck->expect("embed.weight", DType::kBF16, {16, 8, 1}).status(), StatusCode::kCorrupt,
               {"expected BF16[16, 8, 1]"});
  expect_error(ck->expect("head.weight", DType::kBF16, {16, 8}).status(), StatusCode::kNotFound,
               {"tensor 'head.weight'"});
  std::vector<uint8_t> wrong(3);
  EXPECT_EQ(ck->read("norm.weight", wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ck->read("nope", wrong).code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, WF6_CorruptShardHeaderNamesTheShard) {
  write_valid_sharded();
  std::string shard = dir_.file("model-00002-of-00002.safetensors");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"model-00002-of-00002.safetensors", "rule 13:"});
}

// ---- shard-map catalogue (rule 19) -------------------------------------------------------------

TEST_F(CheckpointTest, Catalogue_WF6_IndexNotAnObject) {
  write_valid_sharded();
  write_text(dir_.file("model.safetensors.index.json"), "[\"weight_map\"]");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"model.safetensors.index.json", "rule 19:", "not a JSON object"});
  write_text(dir_.file("model.safetensors.index.json"), "{\"weight_map\":");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt, {"rule 19:"});
  write_text(dir_.file("model.safetensors.index.json"), "{\"weight_map\":[]}");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "'weight_map' is not an object"});
  write_text(dir_.file("model.safetensors.index.json"), "{\"metadata\":{}}");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "missing 'weight_map'"});
  write_text(dir_.file("model.safetensors.index.json"),
             std::string("{\"weight_map\":{}}\0{\"weight_map\":[]}", 35));
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "NUL"});
  write_text(dir_.file("model.safetensors.index.json"),
             "{\"weight_map\":{\"a\":\"x.safetensors\",\"a\":\"y.safetensors\"}}");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "duplicate key"});
}

TEST_F(CheckpointTest, Catalogue_WF6_WeightMapValueNotString) {
  write_valid_sharded();
  write_text(dir_.file("model.safetensors.index.json"), "{\"weight_map\":{\"embed.weight\":1}}");
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'embed.weight'", "not a string"});
}

TEST_F(CheckpointTest, Catalogue_WF6_MissingShard) {
  write_valid_sharded();
  std::filesystem::remove(dir_.file("model-00002-of-00002.safetensors"));
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kNotFound,
               {"model-00002-of-00002.safetensors", "does not exist"});
}

TEST_F(CheckpointTest, Catalogue_WF10_DotDotInShardName) {
  write_valid_sharded();
  map_["norm.weight"] = "../model-00001-of-00002.safetensors";
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'norm.weight'", "'..'"});
  map_["norm.weight"] = "sub/model-00001-of-00002.safetensors";
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "path separator"});
  map_["norm.weight"] = "";
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "empty"});
}

TEST_F(CheckpointTest, Catalogue_WF10_AbsoluteShardName) {
  write_valid_sharded();
  map_["norm.weight"] = dir_.file("model-00001-of-00002.safetensors");
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "absolute path"});
}

TEST_F(CheckpointTest, Catalogue_WF10_SymlinkEscape) {
  TempDir outside;
  write_shard(outside.file("evil.safetensors"), {{"evil", DType::kU8, {4}}});
  write_valid_sharded();
  ASSERT_EQ(::symlink(outside.file("evil.safetensors").c_str(),
                      dir_.file("model-00003-of-00003.safetensors").c_str()),
            0);
  map_["evil"] = "model-00003-of-00003.safetensors";
  write_index(map_);
  expect_error(
      CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
      {"model-00003-of-00003.safetensors", "rule 19:", "outside the checkpoint directory"});
  // A symlink to a system file is refused the same way (before anything reads it).
  std::filesystem::remove(dir_.file("model-00003-of-00003.safetensors"));
  ASSERT_EQ(::symlink("/etc/passwd", dir_.file("model-00003-of-00003.safetensors").c_str()), 0);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"outside the checkpoint directory"});
}

// A Hugging Face hub cache snapshot (models--<org>--<name>/snapshots/<rev>/ whose files are
// symlinks to ../../blobs/<hash>) loads as published; a link into any other directory, another
// repository's blobs included, is still an escape.
TEST_F(CheckpointTest, WF10_HfCacheSnapshotResolvesIntoItsOwnBlobs) {
  const std::string repo = dir_.file("models--deepseek-ai--DeepSeek-V4-Tiny");
  const std::string other = dir_.file("models--someone--else");
  for (const std::string& d : {repo + "/blobs", repo + "/snapshots/abc123", other + "/blobs"}) {
    std::filesystem::create_directories(d);
  }
  write_shard(repo + "/blobs/3f2a", {{"t", DType::kF32, {2}}});
  const std::string snap = repo + "/snapshots/abc123";
  ASSERT_EQ(::symlink("../../blobs/3f2a", (snap + "/model.safetensors").c_str()), 0);
  auto ck = CheckpointFiles::open(snap);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  check_all_tensors(*ck);

  // Into another repository's blobs: refused.
  write_shard(other + "/blobs/9e9e", {{"t", DType::kF32, {2}}});
  std::filesystem::remove(snap + "/model.safetensors");
  ASSERT_EQ(::symlink("../../../models--someone--else/blobs/9e9e",
                      (snap + "/model.safetensors").c_str()),
            0);
  expect_error(CheckpointFiles::open(snap).status(), StatusCode::kCorrupt,
               {"rule 19:", "outside the checkpoint directory"});

  // The same layout without the models-- repository folder is not a hub cache: refused.
  const std::string fake = dir_.file("plain/snapshots/r1");
  std::filesystem::create_directories(fake);
  std::filesystem::create_directories(dir_.file("plain/blobs"));
  write_shard(dir_.file("plain/blobs/aa"), {{"t", DType::kF32, {2}}});
  ASSERT_EQ(::symlink("../../blobs/aa", (fake + "/model.safetensors").c_str()), 0);
  expect_error(CheckpointFiles::open(fake).status(), StatusCode::kCorrupt,
               {"rule 19:", "outside the checkpoint directory"});

  // A sibling whose name only starts like "blobs" is not the blobs directory.
  std::filesystem::create_directories(repo + "/blobsX");
  write_shard(repo + "/blobsX/bb", {{"t", DType::kF32, {2}}});
  std::filesystem::remove(snap + "/model.safetensors");
  ASSERT_EQ(::symlink("../../blobsX/bb", (snap + "/model.safetensors").c_str()), 0);
  expect_error(CheckpointFiles::open(snap).status(), StatusCode::kCorrupt,
               {"rule 19:", "outside the checkpoint directory"});
}

TEST_F(CheckpointTest, Catalogue_WF10_SymlinkEscapeWithoutIndex) {
  TempDir outside;
  write_shard(outside.file("evil.safetensors"), {{"evil", DType::kU8, {4}}});
  ASSERT_EQ(
      ::symlink(outside.file("evil.safetensors").c_str(), dir_.file("model.safetensors").c_str()),
      0);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "outside the checkpoint directory"});
}

TEST_F(CheckpointTest, Catalogue_WF6_TensorInTwoShards) {
  write_shard(dir_.file("s1.safetensors"), {{"dup", DType::kF32, {2}}, {"a", DType::kU8, {1}}});
  write_shard(dir_.file("s2.safetensors"), {{"dup", DType::kF32, {2}}, {"b", DType::kU8, {1}}});
  write_index({{"dup", "s1.safetensors"}, {"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'dup'", "two shards", "s1.safetensors", "s2.safetensors"});
}

TEST_F(CheckpointTest, Catalogue_WF6_TensorMissingFromMap) {
  write_valid_sharded();
  map_.erase("norm.weight");
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'norm.weight'", "missing from weight_map"});
}

TEST_F(CheckpointTest, Catalogue_WF6_MapEntryMissingFromShard) {
  write_valid_sharded();
  map_["head.weight"] = "model-00001-of-00002.safetensors";
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'head.weight'", "no such tensor"});
}

TEST_F(CheckpointTest, Catalogue_WF6_MapEntryNamesTheWrongShard) {
  write_valid_sharded();
  map_["norm.weight"] = "model-00002-of-00002.safetensors";
  write_index(map_);
  expect_error(CheckpointFiles::open(dir_.path()).status(), StatusCode::kCorrupt,
               {"rule 19:", "tensor 'norm.weight'", "but it is in 'model-00001-of-00002"});
}

}  // namespace
}  // namespace ds
