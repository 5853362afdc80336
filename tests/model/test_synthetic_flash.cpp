// A generated 2-layer DeepSeek-V4-Flash checkpoint (about 12.6 GB: every routed expert of two
// layers and the MTP layer) loads back with every tensor's name, dtype, shape and byte count as
// dsv4-model.md §10 gives them. Separate from the unit suite's ASan run because of its size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/synthetic.h"
#include "model/tensor_spec.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

TEST(SyntheticFlash, TwoLayerCheckpointLoadsBackAsPublished) {
  fs::path dir = fs::temp_directory_path() / ("ds_flash2_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::error_code ec;
  auto space = fs::space(fs::temp_directory_path(), ec);
  if (!ec && space.available < (uint64_t(20) << 30)) {
    GTEST_SKIP() << "needs 20 GiB free in " << fs::temp_directory_path() << ", have "
                 << (space.available >> 30) << " GiB";
  }
  SyntheticOptions opt;
  opt.preset = SyntheticPreset::kFlash;
  opt.num_layers = 2;
  opt.seed = 1;
  auto config = synthetic_config(opt);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ASSERT_TRUE(write_synthetic_checkpoint(*config, opt, dir.string()).ok());
  auto ckpt = open_checkpoint(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_GE(ckpt->files.num_shards(), 3u);  // 4 GiB shards

  struct Expect {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
  };
  // dsv4-model.md §10, written out by hand.
  std::vector<Expect> expect = {
      {"embed.weight", DType::kBF16, {129280, 4096}},
      {"head.weight", DType::kBF16, {129280, 4096}},
      {"norm.weight", DType::kBF16, {4096}},
      {"hc_head_fn", DType::kF32, {4, 16384}},
      {"hc_head_base", DType::kF32, {4}},
      {"hc_head_scale", DType::kF32, {1}},
  };
  for (std::string p : {std::string("layers.0."), std::string("layers.1."), std::string("mtp.0.")}) {
    std::vector<Expect> layer = {
        {p + "hc_attn_fn", DType::kF32, {24, 16384}},
        {p + "hc_ffn_base", DType::kF32, {24}},
        {p + "hc_attn_scale", DType::kF32, {3}},
        {p + "attn_norm.weight", DType::kBF16, {4096}},
        {p + "attn.attn_sink", DType::kF32, {64}},
        {p + "attn.wq_a.weight", DType::kF8E4M3, {1024, 4096}},
        {p + "attn.wq_a.scale", DType::kF8E8M0, {8, 32}},
        {p + "attn.q_norm.weight", DType::kBF16, {1024}},
        {p + "attn.wq_b.weight", DType::kF8E4M3, {32768, 1024}},
        {p + "attn.wq_b.scale", DType::kF8E8M0, {256, 8}},
        {p + "attn.wkv.weight", DType::kF8E4M3, {512, 4096}},
        {p + "attn.wkv.scale", DType::kF8E8M0, {4, 32}},
        {p + "attn.kv_norm.weight", DType::kBF16, {512}},
        {p + "attn.wo_a.weight", DType::kF8E4M3, {8192, 4096}},
        {p + "attn.wo_a.scale", DType::kF8E8M0, {64, 32}},
        {p + "attn.wo_b.weight", DType::kF8E4M3, {4096, 8192}},
        {p + "attn.wo_b.scale", DType::kF8E8M0, {32, 64}},
        {p + "ffn.gate.weight", DType::kBF16, {256, 4096}},
        {p + "ffn.experts.0.w1.weight", DType::kI8, {2048, 2048}},
        {p + "ffn.experts.0.w1.scale", DType::kF8E8M0, {2048, 128}},
        {p + "ffn.experts.255.w3.weight", DType::kI8, {2048, 2048}},
        {p + "ffn.experts.255.w2.weight", DType::kI8, {4096, 1024}},
        {p + "ffn.experts.255.w2.scale", DType::kF8E8M0, {4096, 64}},
        {p + "ffn.shared_experts.w1.weight", DType::kF8E4M3, {2048, 4096}},
        {p + "ffn.shared_experts.w1.scale", DType::kF8E8M0, {16, 32}},
        {p + "ffn.shared_experts.w2.weight", DType::kF8E4M3, {4096, 2048}},
        {p + "ffn.shared_experts.w2.scale", DType::kF8E8M0, {32, 16}},
    };
    expect.insert(expect.end(), layer.begin(), layer.end());
  }
  expect.push_back({"layers.0.ffn.gate.tid2eid", DType::kI64, {129280, 6}});
  expect.push_back({"layers.1.ffn.gate.tid2eid", DType::kI64, {129280, 6}});
  expect.push_back({"mtp.0.ffn.gate.bias", DType::kF32, {256}});
  expect.push_back({"mtp.0.e_proj.weight", DType::kF8E4M3, {4096, 4096}});
  expect.push_back({"mtp.0.h_proj.scale", DType::kF8E8M0, {32, 32}});
  expect.push_back({"mtp.0.enorm.weight", DType::kBF16, {4096}});
  expect.push_back({"mtp.0.hnorm.weight", DType::kBF16, {4096}});
  expect.push_back({"mtp.0.norm.weight", DType::kBF16, {4096}});
  expect.push_back({"mtp.0.hc_head_fn", DType::kF32, {4, 16384}});
  for (const Expect& e : expect) {
    auto ref = ckpt->files.find(e.name);
    ASSERT_TRUE(ref.ok()) << e.name;
    EXPECT_EQ(ref->info->dtype, e.dtype) << e.name;
    EXPECT_EQ(ref->info->shape, e.shape) << e.name;
    uint64_t n = dtype_size(e.dtype);
    for (uint64_t d : e.shape) n *= d;
    EXPECT_EQ(ref->info->nbytes, n) << e.name;
  }
  // Layers 0-1 are SWA with hash routing in Flash: no compressor, no indexer, no gate bias.
  EXPECT_FALSE(ckpt->files.find("layers.0.attn.compressor.ape").ok());
  EXPECT_FALSE(ckpt->files.find("layers.1.ffn.gate.bias").ok());
  // Tensor count: 2 layers + MTP, each with 256 experts x 3 weights x 2 (weight + scale).
  size_t per_expert_tensors = 256 * 6;
  EXPECT_GT(ckpt->files.num_tensors(), 3 * per_expert_tensors);
  EXPECT_EQ(ckpt->files.num_tensors(), expected_tensors(*config).size());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ds
