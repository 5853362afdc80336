// Synthetic checkpoints and the checkpoint-level rules (reliability.md §3.6 rules 20-23): a
// generated tiny checkpoint loads back with every tensor as dsv4-model.md §10 says, is
// deterministic, has sensible values; and a catalogue of semantically broken checkpoints (built
// by rewriting a valid one) is refused with a specific error naming the tensor and the rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/synthetic.h"
#include "model/tensor_spec.h"
#include "model/weight_format.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& tag) {
  fs::path p = fs::temp_directory_path() /
               ("ds_ckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

// A tiny config with a small vocabulary so that every rewrite is quick.
DeepSeekV4Config small_tiny() {
  DeepSeekV4Config c = tiny_config();
  c.vocab_size = 1024;
  return c;
}

struct TensorData {
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};
using TensorMap = std::map<std::string, TensorData>;

TensorMap read_all(const std::string& dir) {
  TensorMap out;
  auto files = CheckpointFiles::open(dir);
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  if (!files.ok()) return out;
  for (const std::string& name : files->names()) {
    auto ref = files->find(name);
    TensorData t{ref->info->dtype, ref->info->shape, std::vector<uint8_t>(ref->info->nbytes)};
    EXPECT_TRUE(files->read(name, t.bytes).ok());
    out[name] = std::move(t);
  }
  return out;
}

// Writes `tensors` as a one-shard checkpoint with index.json and the given config.json text.
void write_checkpoint(const fs::path& dir, const TensorMap& tensors, const std::string& config_json) {
  fs::create_directories(dir);
  SafetensorsWriter w;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(w.add(name, t.dtype, t.shape, t.bytes).ok()) << name;
    map[name] = "model-00001-of-00001.safetensors";
  }
  ASSERT_TRUE(w.write((dir / "model-00001-of-00001.safetensors").string()).ok());
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  std::ofstream(dir / "config.json") << config_json;
}

class CheckpointSemantics : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = new fs::path(temp_dir("base"));
    SyntheticOptions opt;
    opt.seed = 7;
    ASSERT_TRUE(write_synthetic_checkpoint(small_tiny(), opt, base_->string()).ok());
    tensors_ = new TensorMap(read_all(base_->string()));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*base_);
    delete base_;
    delete tensors_;
  }

  // Rewrites the base checkpoint with `mutate` applied and returns the open_checkpoint status.
  Status mutated(const std::function<void(TensorMap&)>& mutate, bool full_scan = false) {
    TensorMap copy = *tensors_;
    mutate(copy);
    fs::path dir = temp_dir("mut");
    write_checkpoint(dir, copy, to_config_json(small_tiny()));
    CheckpointValidateOptions opt;
    opt.full_scan = full_scan;
    auto r = open_checkpoint(dir.string(), opt);
    fs::remove_all(dir);
    return r.ok() ? ok_status() : r.status();
  }

  static fs::path* base_;
  static TensorMap* tensors_;
};
fs::path* CheckpointSemantics::base_ = nullptr;
TensorMap* CheckpointSemantics::tensors_ = nullptr;

void expect_error(const Status& s, const std::string& a, const std::string& b) {
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(a), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(b), std::string::npos) << s.message();
}

TEST_F(CheckpointSemantics, GeneratedTinyLoadsBackAsTheSpecSays) {
  CheckpointValidateOptions opt;
  opt.full_scan = true;
  auto ckpt = open_checkpoint(base_->string(), opt);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_GT(ckpt->files.num_shards(), 0u);
  // Every expected tensor with the spec's dtype, shape and byte count.
  for (const TensorSpec& spec : expected_tensors(small_tiny())) {
    if (spec.optional) continue;
    auto ref = ckpt->files.find(spec.name);
    ASSERT_TRUE(ref.ok()) << spec.name;
    EXPECT_EQ(ref->info->dtype, spec.dtype) << spec.name;
    EXPECT_EQ(ref->info->shape, std::vector<uint64_t>(spec.shape.begin(), spec.shape.end()));
    EXPECT_EQ(ref->info->nbytes, spec.stored_bytes()) << spec.name;
  }
  // Hand-checked entries of dsv4-model.md §10 for the tiny geometry (§14): hidden 256, 4 heads x
  // 128, q_lora 128, o_groups 2 x 128, 8 experts of 128, layers SWA/CSA/HCA/CSA + MTP.
  struct Expect {
    const char* name;
    DType dtype;
    std::vector<uint64_t> shape;
  };
  const std::vector<Expect> expect = {
      {"embed.weight", DType::kBF16, {1024, 256}},
      {"head.weight", DType::kBF16, {1024, 256}},
      {"hc_head_fn", DType::kF32, {4, 1024}},
      {"layers.0.hc_attn_fn", DType::kF32, {24, 1024}},
      {"layers.0.attn.wq_a.weight", DType::kF8E4M3, {128, 256}},
      {"layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 2}},
      {"layers.0.attn.wq_b.weight", DType::kF8E4M3, {512, 128}},
      {"layers.0.attn.wkv.weight", DType::kF8E4M3, {128, 256}},
      {"layers.0.attn.wo_a.weight", DType::kF8E4M3, {256, 256}},
      {"layers.0.attn.wo_b.weight", DType::kF8E4M3, {256, 256}},
      {"layers.0.attn.attn_sink", DType::kF32, {4}},
      {"layers.0.ffn.gate.tid2eid", DType::kI64, {1024, 2}},
      {"layers.1.attn.compressor.ape", DType::kF32, {4, 256}},
      {"layers.1.attn.compressor.wkv.weight", DType::kBF16, {256, 256}},
      {"layers.1.attn.indexer.wq_b.weight", DType::kF8E4M3, {512, 128}},
      {"layers.1.attn.indexer.weights_proj.weight", DType::kBF16, {4, 256}},
      {"layers.1.attn.indexer.compressor.ape", DType::kF32, {4, 256}},
      {"layers.2.attn.compressor.ape", DType::kF32, {128, 128}},
      {"layers.2.ffn.gate.bias", DType::kF32, {8}},
      {"layers.3.ffn.experts.7.w1.weight", DType::kI8, {128, 128}},
      {"layers.3.ffn.experts.7.w1.scale", DType::kF8E8M0, {128, 8}},
      {"layers.3.ffn.experts.7.w2.weight", DType::kI8, {256, 64}},
      {"layers.3.ffn.shared_experts.w2.weight", DType::kF8E4M3, {256, 128}},
      {"mtp.0.e_proj.weight", DType::kF8E4M3, {256, 256}},
      {"mtp.0.hc_head_fn", DType::kF32, {4, 1024}},
      {"mtp.0.ffn.gate.bias", DType::kF32, {8}},
  };
  for (const Expect& e : expect) {
    auto ref = ckpt->files.find(e.name);
    ASSERT_TRUE(ref.ok()) << e.name;
    EXPECT_EQ(ref->info->dtype, e.dtype) << e.name;
    EXPECT_EQ(ref->info->shape, e.shape) << e.name;
  }
  EXPECT_FALSE(ckpt->files.find("layers.0.attn.compressor.ape").ok());  // SWA layer
  EXPECT_FALSE(ckpt->files.find("layers.2.attn.indexer.wq_b.weight").ok());  // HCA layer
  EXPECT_FALSE(ckpt->files.find("layers.2.ffn.gate.tid2eid").ok());  // learned routing
  EXPECT_FALSE(ckpt->files.find("layers.1.ffn.gate.bias").ok());     // hash routing
}

TEST_F(CheckpointSemantics, GenerationIsDeterministicAndSeeded) {
  fs::path again = temp_dir("again"), other = temp_dir("other");
  SyntheticOptions opt;
  opt.seed = 7;
  ASSERT_TRUE(write_synthetic_checkpoint(small_tiny(), opt, again.string()).ok());
  opt.seed = 8;
  ASSERT_TRUE(write_synthetic_checkpoint(small_tiny(), opt, other.string()).ok());
  TensorMap a = read_all(again.string()), b = read_all(other.string());
  ASSERT_EQ(a.size(), tensors_->size());
  for (const auto& [name, t] : *tensors_) {
    EXPECT_EQ(a[name].bytes, t.bytes) << name;
    // A new seed changes every tensor except the e8m0 scales of FP8 weights: those are block
    // maxima of N(0, 0.02) samples, which land in the same power of two for any seed.
    const std::string weight = name.substr(0, name.size() - 6) + ".weight";
    bool fp8_scale = name.ends_with(".scale") && tensors_->count(weight) &&
                     tensors_->at(weight).dtype == DType::kF8E4M3;
    if (!fp8_scale) EXPECT_NE(b[name].bytes, t.bytes) << name;
  }
  fs::remove_all(again);
  fs::remove_all(other);
}

TEST_F(CheckpointSemantics, ValuesHaveSensibleScales) {
  // An FP8 weight dequantizes to ~N(0, 0.02).
  const auto& w = tensors_->at("layers.0.attn.wq_b.weight");
  const auto& s = tensors_->at("layers.0.attn.wq_b.scale");
  std::vector<float> f(512 * 128);
  ASSERT_TRUE(dequantize_fp8_block(Fp8BlockWeight{w.bytes.data(), s.bytes.data(), 512, 128}, f.data()).ok());
  double sum = 0, sq = 0;
  for (float v : f) sum += v, sq += double(v) * v;
  EXPECT_NEAR(sum / double(f.size()), 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / double(f.size())), 0.02, 0.003);
  // An MXFP4 expert weight has RMS ~0.02-0.03.
  const auto& e = tensors_->at("layers.2.ffn.experts.3.w1.weight");
  const auto& es = tensors_->at("layers.2.ffn.experts.3.w1.scale");
  std::vector<float> g(128 * 256);
  ASSERT_TRUE(dequantize_mxfp4(Mxfp4Weight{e.bytes.data(), es.bytes.data(), 128, 256}, g.data()).ok());
  sq = 0;
  for (float v : g) sq += double(v) * v;
  double rms = std::sqrt(sq / double(g.size()));
  EXPECT_GT(rms, 0.012);
  EXPECT_LT(rms, 0.04);
  // Norm weights are near one, bf16.
  const auto& n = tensors_->at("layers.1.attn_norm.weight");
  double mean = 0;
  for (size_t i = 0; i < n.bytes.size(); i += 2) {
    uint16_t b;
    std::memcpy(&b, &n.bytes[i], 2);
    mean += bf16_to_float(b);
  }
  EXPECT_NEAR(mean / double(n.bytes.size() / 2), 1.0, 0.02);
  // tid2eid rows hold distinct experts in range.
  const auto& h = tensors_->at("layers.0.ffn.gate.tid2eid");
  for (size_t r = 0; r < 1024; ++r) {
    int64_t a, b;
    std::memcpy(&a, &h.bytes[r * 16], 8);
    std::memcpy(&b, &h.bytes[r * 16 + 8], 8);
    ASSERT_NE(a, b);
    ASSERT_TRUE(a >= 0 && a < 8 && b >= 0 && b < 8);
  }
}

// ---- catalogue: one entry per broken rule -----------------------------------------------------

TEST_F(CheckpointSemantics, Rule20_MissingTensor) {
  expect_error(mutated([](TensorMap& m) { m.erase("layers.2.attn.compressor.norm.weight"); }),
               "layers.2.attn.compressor.norm.weight", "rule 20: missing");
}

TEST_F(CheckpointSemantics, Rule20_UnexpectedTensor) {
  expect_error(mutated([](TensorMap& m) {
                 m["layers.0.attn.compressor.ape"] = TensorData{DType::kF32, {4, 256}, std::vector<uint8_t>(4096)};
               }),
               "layers.0.attn.compressor.ape", "rule 20: not part");
}

TEST_F(CheckpointSemantics, Rule20_IgnoredMtpEmbeddingIsAccepted) {
  EXPECT_TRUE(mutated([](TensorMap& m) { m["mtp.0.emb.tok_emb.weight"] = m.at("embed.weight"); }).ok());
}

TEST_F(CheckpointSemantics, Rule20_WrongDtype) {
  expect_error(mutated([](TensorMap& m) {
                 m["layers.1.attn.attn_sink"] = TensorData{DType::kBF16, {4}, std::vector<uint8_t>(8, 0x3F)};
               }),
               "layers.1.attn.attn_sink", "BF16");
}

TEST_F(CheckpointSemantics, Rule20_WrongShape) {
  expect_error(mutated([](TensorMap& m) {
                 auto& t = m.at("layers.1.attn.wkv.weight");
                 t.shape = {256, 128};  // transposed: same bytes, wrong shape
               }),
               "layers.1.attn.wkv.weight", "rule 20");
}

TEST_F(CheckpointSemantics, Rule21_MissingScale) {
  expect_error(mutated([](TensorMap& m) { m.erase("layers.3.attn.wo_b.scale"); }),
               "layers.3.attn.wo_b.scale", "missing");
}

TEST_F(CheckpointSemantics, Rule21_MisshapedScale) {
  expect_error(mutated([](TensorMap& m) {
                 m.at("layers.3.attn.wq_b.scale") = TensorData{DType::kF8E8M0, {1, 4}, std::vector<uint8_t>(4, 120)};
               }),
               "layers.3.attn.wq_b.scale", "rule 20");
}

TEST_F(CheckpointSemantics, Rule21_FloatScaleInsteadOfE8M0) {
  expect_error(mutated([](TensorMap& m) {
                 m.at("layers.0.attn.wq_a.scale") = TensorData{DType::kF32, {1, 2}, std::vector<uint8_t>(8, 0)};
               }),
               "layers.0.attn.wq_a.scale", "F32");
}

TEST_F(CheckpointSemantics, Rule21_MisshapedFp4Expert) {
  expect_error(mutated([](TensorMap& m) {
                 auto& t = m.at("layers.2.ffn.experts.0.w1.weight");
                 t.shape = {128, 256};  // logical K, not K/2
                 t.bytes.resize(128 * 256);
               }),
               "layers.2.ffn.experts.0.w1.weight", "rule 20");
}

void set_tid2eid(TensorMap& m, size_t entry, int64_t value) {
  std::memcpy(&m.at("layers.1.ffn.gate.tid2eid").bytes[entry * 8], &value, 8);
}

TEST_F(CheckpointSemantics, Rule22_Tid2eidNegative) {
  expect_error(mutated([](TensorMap& m) { set_tid2eid(m, 5, -1); }), "layers.1.ffn.gate.tid2eid",
               "rule 22: entry 5 (row 2) is -1");
}

TEST_F(CheckpointSemantics, Rule22_Tid2eidEqualToExpertCount) {
  expect_error(mutated([](TensorMap& m) { set_tid2eid(m, 2047, 8); }), "layers.1.ffn.gate.tid2eid",
               "is 8, outside [0, n_routed_experts = 8)");
}

TEST_F(CheckpointSemantics, Rule22_Tid2eidInt64Max) {
  expect_error(mutated([](TensorMap& m) { set_tid2eid(m, 0, std::numeric_limits<int64_t>::max()); }),
               "layers.1.ffn.gate.tid2eid", "rule 22");
}

TEST_F(CheckpointSemantics, Rule22_DuplicateExpertsInARowAreAccepted) {
  EXPECT_TRUE(mutated([](TensorMap& m) {
                int64_t e;
                std::memcpy(&e, &m.at("layers.1.ffn.gate.tid2eid").bytes[0], 8);
                set_tid2eid(m, 1, e);
              }).ok());
}

TEST_F(CheckpointSemantics, SP8_MtpTensorsMissing) {
  expect_error(mutated([](TensorMap& m) {
                 for (auto it = m.begin(); it != m.end();) it = it->first.rfind("mtp.", 0) == 0 ? m.erase(it) : std::next(it);
               }),
               "mtp.0.", "rule 20: missing");
}

TEST_F(CheckpointSemantics, Rule23_NanInNormWeightRefusedByFullScan) {
  auto poison = [](TensorMap& m) {
    uint16_t nan = 0x7FC0;
    std::memcpy(&m.at("layers.2.ffn_norm.weight").bytes[20], &nan, 2);
  };
  EXPECT_TRUE(mutated(poison, /*full_scan=*/false).ok());  // without the scan it loads
  expect_error(mutated(poison, /*full_scan=*/true), "layers.2.ffn_norm.weight",
               "rule 23: holds a NaN or infinite BF16 value at element 10");
}

TEST_F(CheckpointSemantics, Rule23_E8M0NanCodeRefusedByFullScan) {
  expect_error(mutated([](TensorMap& m) { m.at("layers.3.ffn.experts.5.w2.scale").bytes[77] = 0xFF; }, true),
               "layers.3.ffn.experts.5.w2.scale", "E8M0 NaN code 0xFF at element 77");
}

TEST_F(CheckpointSemantics, Rule23_InfInF32Refused) {
  expect_error(mutated([](TensorMap& m) {
                 float inf = std::numeric_limits<float>::infinity();
                 std::memcpy(&m.at("layers.0.hc_ffn_base").bytes[4], &inf, 4);
               }, true),
               "layers.0.hc_ffn_base", "rule 23");
}

TEST_F(CheckpointSemantics, ConfigMismatchWithWeightsIsRefused) {
  // The weights of the small-vocabulary tiny model under a config that claims 2048 rows.
  TensorMap copy = *tensors_;
  fs::path dir = temp_dir("cfg");
  DeepSeekV4Config c = small_tiny();
  c.vocab_size = 2048;
  write_checkpoint(dir, copy, to_config_json(c));
  auto r = open_checkpoint(dir.string());
  fs::remove_all(dir);
  expect_error(r.ok() ? ok_status() : r.status(), "embed.weight", "rule 20");
}

TEST_F(CheckpointSemantics, WriterRefusesNonEmptyDirectory) {
  SyntheticOptions opt;
  Status s = write_synthetic_checkpoint(small_tiny(), opt, base_->string());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ds
