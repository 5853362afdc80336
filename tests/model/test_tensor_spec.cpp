// The expected tensor set against the table of dsv4-model.md §10, written out here independently
// with the Flash numbers (not computed from config fields), plus the variants (FP8-block and NVFP4
// experts), the pairing rules of reliability.md rule 21 and the ignore list.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "model/config.h"
#include "model/tensor_spec.h"

namespace ds {
namespace {

using Shape = std::vector<int64_t>;

struct Want {
  std::string dtype;
  Shape shape;
  Shape logical;  // empty = same as shape
};

std::map<std::string, Want> actual_map(const std::vector<TensorSpec>& specs) {
  std::map<std::string, Want> m;
  for (const auto& t : specs) {
    Want w{std::string(dtype_name(t.dtype)), t.shape, t.logical == t.shape ? Shape{} : t.logical};
    EXPECT_TRUE(m.emplace(t.name, w).second) << "duplicate " << t.name;
  }
  return m;
}

// §10 for DeepSeek-V4-Flash, table by table.
std::map<std::string, Want> flash_table() {
  std::map<std::string, Want> m;
  auto add = [&](const std::string& n, const char* dt, Shape s, Shape logical = {}) {
    m[n] = Want{dt, std::move(s), std::move(logical)};
  };
  auto fp8 = [&](const std::string& n, Shape w, Shape s) {
    add(n + ".weight", "F8_E4M3", std::move(w));
    add(n + ".scale", "F8_E8M0", std::move(s));
  };
  add("embed.weight", "BF16", {129280, 4096});
  add("head.weight", "BF16", {129280, 4096});
  add("norm.weight", "BF16", {4096});
  add("hc_head_fn", "F32", {4, 16384});
  add("hc_head_base", "F32", {4});
  add("hc_head_scale", "F32", {1});
  const std::vector<int> ratios = [] {
    std::vector<int> r = {0, 0};
    for (int i = 0; i < 20; ++i) r.insert(r.end(), {4, 128});
    r.push_back(4);
    return r;
  }();
  auto block = [&](const std::string& p, int ratio, bool hash) {
    for (const char* site : {"attn", "ffn"}) {
      add(p + "hc_" + site + "_fn", "F32", {24, 16384});
      add(p + "hc_" + site + "_base", "F32", {24});
      add(p + "hc_" + site + "_scale", "F32", {3});
    }
    add(p + "attn_norm.weight", "BF16", {4096});
    add(p + "ffn_norm.weight", "BF16", {4096});
    add(p + "attn.attn_sink", "F32", {64});
    fp8(p + "attn.wq_a", {1024, 4096}, {8, 32});
    add(p + "attn.q_norm.weight", "BF16", {1024});
    fp8(p + "attn.wq_b", {32768, 1024}, {256, 8});
    fp8(p + "attn.wkv", {512, 4096}, {4, 32});
    add(p + "attn.kv_norm.weight", "BF16", {512});
    fp8(p + "attn.wo_a", {8192, 4096}, {64, 32});
    fp8(p + "attn.wo_b", {4096, 8192}, {32, 64});
    if (ratio == 4) {
      add(p + "attn.compressor.ape", "F32", {4, 1024});
      add(p + "attn.compressor.wkv.weight", "BF16", {1024, 4096});
      add(p + "attn.compressor.wgate.weight", "BF16", {1024, 4096});
      add(p + "attn.compressor.norm.weight", "BF16", {512});
      fp8(p + "attn.indexer.wq_b", {8192, 1024}, {64, 8});
      add(p + "attn.indexer.weights_proj.weight", "BF16", {64, 4096});
      add(p + "attn.indexer.compressor.ape", "F32", {4, 256});
      add(p + "attn.indexer.compressor.wkv.weight", "BF16", {256, 4096});
      add(p + "attn.indexer.compressor.wgate.weight", "BF16", {256, 4096});
      add(p + "attn.indexer.compressor.norm.weight", "BF16", {128});
    } else if (ratio == 128) {
      add(p + "attn.compressor.ape", "F32", {128, 512});
      add(p + "attn.compressor.wkv.weight", "BF16", {512, 4096});
      add(p + "attn.compressor.wgate.weight", "BF16", {512, 4096});
      add(p + "attn.compressor.norm.weight", "BF16", {512});
    }
    add(p + "ffn.gate.weight", "BF16", {256, 4096});
    if (hash)
      add(p + "ffn.gate.tid2eid", "I64", {129280, 6});
    else
      add(p + "ffn.gate.bias", "F32", {256});
    for (int e = 0; e < 256; ++e) {
      const std::string x = p + "ffn.experts." + std::to_string(e) + ".";
      add(x + "w1.weight", "I8", {2048, 2048}, {2048, 4096});
      add(x + "w1.scale", "F8_E8M0", {2048, 128});
      add(x + "w3.weight", "I8", {2048, 2048}, {2048, 4096});
      add(x + "w3.scale", "F8_E8M0", {2048, 128});
      add(x + "w2.weight", "I8", {4096, 1024}, {4096, 2048});
      add(x + "w2.scale", "F8_E8M0", {4096, 64});
    }
    fp8(p + "ffn.shared_experts.w1", {2048, 4096}, {16, 32});
    fp8(p + "ffn.shared_experts.w3", {2048, 4096}, {16, 32});
    fp8(p + "ffn.shared_experts.w2", {4096, 2048}, {32, 16});
  };
  for (int l = 0; l < 43; ++l) block("layers." + std::to_string(l) + ".", ratios[size_t(l)], l < 3);
  block("mtp.0.", 0, false);
  fp8("mtp.0.e_proj", {4096, 4096}, {32, 32});
  fp8("mtp.0.h_proj", {4096, 4096}, {32, 32});
  add("mtp.0.enorm.weight", "BF16", {4096});
  add("mtp.0.hnorm.weight", "BF16", {4096});
  add("mtp.0.norm.weight", "BF16", {4096});
  add("mtp.0.hc_head_fn", "F32", {4, 16384});
  add("mtp.0.hc_head_base", "F32", {4});
  add("mtp.0.hc_head_scale", "F32", {1});
  return m;
}

TEST(TensorSpec, FlashMatchesSpecTableExactly) {
  const auto specs = expected_tensors(flash_config(43));
  // 6 global + 43 layers x 1565 (SWA base set with 256 x 6 expert tensors) + 21 CSA x 11 extra +
  // 20 HCA x 4 extra + MTP 1565 + 10.
  EXPECT_EQ(specs.size(), 69187u);
  const auto got = actual_map(specs);
  const auto want = flash_table();
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    EXPECT_EQ(it->second.dtype, w.dtype) << name;
    EXPECT_EQ(it->second.shape, w.shape) << name;
    EXPECT_EQ(it->second.logical, w.logical) << name;
  }
  for (const auto& [name, w] : got) EXPECT_TRUE(want.count(name)) << "unexpected " << name;
}

TEST(TensorSpec, FlashSpotChecksAndMetadata) {
  const DeepSeekV4Config c = flash_config(43);
  const auto specs = expected_tensors(c);
  const auto idx = index_tensor_specs(specs);
  auto get = [&](const std::string& n) -> const TensorSpec& {
    auto it = idx.find(n);
    EXPECT_NE(it, idx.end()) << n;
    return specs[it == idx.end() ? 0 : it->second];
  };
  EXPECT_EQ(get("layers.5.attn.wq_b.scale").shape, (Shape{256, 8}));
  EXPECT_EQ(get("layers.5.attn.wq_b.scale").role, QuantRole::kFp8Scale);
  EXPECT_TRUE(get("layers.5.attn.wq_b.scale").is_scale);
  EXPECT_EQ(get("layers.5.attn.wq_b.scale").pair, "layers.5.attn.wq_b.weight");
  EXPECT_EQ(get("layers.5.attn.wq_b.weight").pair, "layers.5.attn.wq_b.scale");
  const TensorSpec& w2 = get("layers.7.ffn.experts.200.w2.weight");
  EXPECT_EQ(w2.shape, (Shape{4096, 1024}));
  EXPECT_EQ(w2.logical, (Shape{4096, 2048}));
  EXPECT_EQ(w2.numel(), 4096 * 2048);
  EXPECT_EQ(w2.stored_bytes(), 4096u * 1024u);
  EXPECT_EQ(w2.role, QuantRole::kMxfp4Weight);
  EXPECT_EQ(w2.expert, 200);
  EXPECT_EQ(w2.layer, 7);
  EXPECT_EQ(w2.component, TensorComponent::kRoutedExpert);
  EXPECT_EQ(get("layers.7.ffn.experts.200.w2.scale").role, QuantRole::kMxfp4Scale);
  EXPECT_EQ(get("layers.2.attn.compressor.ape").shape, (Shape{4, 1024}));
  EXPECT_EQ(get("layers.3.attn.compressor.ape").shape, (Shape{128, 512}));
  EXPECT_EQ(get("layers.2.attn.indexer.wq_b.weight").component, TensorComponent::kIndexer);
  EXPECT_EQ(get("layers.2.attn.compressor.wkv.weight").component, TensorComponent::kCompressor);
  EXPECT_EQ(get("layers.0.ffn.gate.tid2eid").component, TensorComponent::kHashTable);
  EXPECT_FALSE(get("layers.0.ffn.gate.tid2eid").is_parameter());
  EXPECT_EQ(get("embed.weight").layer, -1);
  EXPECT_EQ(get("embed.weight").component, TensorComponent::kEmbed);
  EXPECT_EQ(get("hc_head_fn").component, TensorComponent::kHcHead);
  const TensorSpec& mtp = get("mtp.0.ffn.experts.3.w1.weight");
  EXPECT_TRUE(mtp.is_mtp());
  EXPECT_EQ(mtp.mtp_index, 0);
  EXPECT_EQ(mtp.layer, 43);
  EXPECT_EQ(get("mtp.0.e_proj.weight").component, TensorComponent::kMtpProj);
  EXPECT_FALSE(get("layers.42.attn.wq_a.weight").is_mtp());

  // The indexer only in CSA layers; a compressor only in CSA/HCA layers; tid2eid only in hash
  // layers; gate.bias only in learned ones.
  for (int64_t l = 0; l < c.num_layers_total(); ++l) {
    const std::string p = c.is_mtp_layer(l) ? "mtp.0." : "layers." + std::to_string(l) + ".";
    const LayerKind k = c.layer_kind(l);
    EXPECT_EQ(idx.count(p + "attn.indexer.wq_b.weight"), k == LayerKind::kCsa ? 1u : 0u) << l;
    EXPECT_EQ(idx.count(p + "attn.compressor.ape"), k == LayerKind::kSwa ? 0u : 1u) << l;
    EXPECT_EQ(idx.count(p + "ffn.gate.tid2eid"), l < 3 ? 1u : 0u) << l;
    EXPECT_EQ(idx.count(p + "ffn.gate.bias"), l < 3 ? 0u : 1u) << l;
  }
}

TEST(TensorSpec, PairingRules) {
  // reliability.md rule 21: every F8_E4M3 weight is followed by its E8M0 scale
  // [ceil(out/128), ceil(in/128)]; every packed FP4 weight by an E8M0 [out, K/32] scale.
  for (const auto& c : {flash_config(5), tiny_config()}) {
    const auto specs = expected_tensors(c);
    int fp8 = 0, fp4 = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& t = specs[i];
      if (t.role == QuantRole::kFp8Weight) {
        ++fp8;
        ASSERT_LT(i + 1, specs.size());
        const TensorSpec& s = specs[i + 1];
        EXPECT_EQ(t.dtype, DType::kF8E4M3);
        EXPECT_EQ(s.dtype, DType::kF8E8M0) << s.name;
        EXPECT_EQ(s.name, t.name.substr(0, t.name.size() - 7) + ".scale");
        EXPECT_EQ(s.shape, (Shape{(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128})) << s.name;
        EXPECT_EQ(t.shape[0] % 128, 0) << t.name;  // the config rules make blocks exact
        EXPECT_EQ(t.shape[1] % 128, 0) << t.name;
      }
      if (t.role == QuantRole::kMxfp4Weight) {
        ++fp4;
        const TensorSpec& s = specs[i + 1];
        EXPECT_EQ(t.dtype, DType::kI8);
        EXPECT_EQ(t.shape, (Shape{t.logical[0], t.logical[1] / 2}));
        EXPECT_EQ(s.shape, (Shape{t.logical[0], t.logical[1] / 32}));
        EXPECT_EQ(s.dtype, DType::kF8E8M0);
      }
    }
    EXPECT_GT(fp8, 0);
    EXPECT_EQ(fp4, int(c.num_layers_total() * c.n_routed_experts * 3));
  }
}

TEST(TensorSpec, TinyConfigSet) {
  const DeepSeekV4Config c = tiny_config();
  const auto specs = expected_tensors(c);
  const auto idx = index_tensor_specs(specs);
  EXPECT_EQ(idx.size(), specs.size());  // names are unique
  // 6 global; per layer 6 mhc + 2 norms + 13 attention + 2 gate + 8 x 6 experts + 6 shared = 77;
  // CSA +11, HCA +4; MTP +10.
  EXPECT_EQ(specs.size(), size_t(6 + 5 * 77 + 2 * 11 + 4 + 10));
  auto shape = [&](const std::string& n) { return specs[idx.at(n)].shape; };
  EXPECT_EQ(shape("embed.weight"), (Shape{129280, 256}));
  EXPECT_EQ(shape("layers.0.attn.wq_b.weight"), (Shape{512, 128}));
  EXPECT_EQ(shape("layers.0.attn.wo_a.weight"), (Shape{256, 256}));
  EXPECT_EQ(shape("layers.0.attn.wo_b.weight"), (Shape{256, 256}));
  EXPECT_EQ(shape("layers.0.ffn.gate.tid2eid"), (Shape{129280, 2}));
  EXPECT_EQ(shape("layers.1.ffn.gate.tid2eid"), (Shape{129280, 2}));
  EXPECT_EQ(idx.count("layers.2.ffn.gate.tid2eid"), 0u);
  EXPECT_EQ(shape("layers.2.ffn.gate.bias"), (Shape{8}));
  EXPECT_EQ(shape("layers.1.attn.compressor.ape"), (Shape{4, 256}));
  EXPECT_EQ(shape("layers.2.attn.compressor.ape"), (Shape{128, 128}));
  EXPECT_EQ(shape("layers.3.attn.indexer.compressor.ape"), (Shape{4, 256}));
  EXPECT_EQ(shape("layers.3.attn.indexer.wq_b.weight"), (Shape{512, 128}));
  EXPECT_EQ(shape("layers.3.attn.indexer.wq_b.scale"), (Shape{4, 1}));
  EXPECT_EQ(shape("layers.0.ffn.experts.7.w2.weight"), (Shape{256, 64}));
  EXPECT_EQ(shape("layers.0.ffn.experts.7.w2.scale"), (Shape{256, 4}));
  EXPECT_EQ(shape("layers.0.hc_attn_fn"), (Shape{24, 1024}));
  EXPECT_EQ(shape("mtp.0.e_proj.scale"), (Shape{2, 2}));
  EXPECT_EQ(idx.count("mtp.0.attn.compressor.ape"), 0u);
}

TEST(TensorSpec, ExpertFormatVariants) {
  DeepSeekV4Config c = tiny_config();
  c.expert_format = ExpertFormat::kFp8Block;  // Flash-Base: FP8 experts with fp32 block scales
  {
    const auto specs = expected_tensors(c);
    const auto idx = index_tensor_specs(specs);
    const TensorSpec& w = specs[idx.at("layers.0.ffn.experts.1.w1.weight")];
    const TensorSpec& s = specs[idx.at("layers.0.ffn.experts.1.w1.scale")];
    EXPECT_EQ(w.dtype, DType::kF8E4M3);
    EXPECT_EQ(w.shape, (Shape{128, 256}));
    EXPECT_EQ(s.dtype, DType::kF32);
    EXPECT_EQ(s.shape, (Shape{1, 2}));
    EXPECT_EQ(s.role, QuantRole::kFp8ScaleF32);
  }
  c.expert_format = ExpertFormat::kNvfp4;  // §10.3
  {
    const auto specs = expected_tensors(c);
    const auto idx = index_tensor_specs(specs);
    const std::string p = "layers.2.ffn.experts.5.w2.";
    EXPECT_EQ(idx.count(p + "scale"), 0u);
    const TensorSpec& w = specs[idx.at(p + "weight")];
    const TensorSpec& s = specs[idx.at(p + "weight_scale")];
    const TensorSpec& g = specs[idx.at(p + "weight_scale_2")];
    const TensorSpec& in = specs[idx.at(p + "input_scale")];
    EXPECT_EQ(w.dtype, DType::kU8);
    EXPECT_EQ(w.shape, (Shape{256, 64}));
    EXPECT_EQ(w.logical, (Shape{256, 128}));
    EXPECT_EQ(s.dtype, DType::kF8E4M3);
    EXPECT_EQ(s.shape, (Shape{256, 8}));
    EXPECT_EQ(g.dtype, DType::kF32);
    EXPECT_EQ(g.shape, Shape{});
    EXPECT_EQ(g.role, QuantRole::kNvfp4GlobalScale);
    EXPECT_TRUE(in.optional);
    EXPECT_FALSE(w.optional);
    // Attention and shared experts stay FP8 (§10.3).
    EXPECT_EQ(specs[idx.at("layers.2.ffn.shared_experts.w2.weight")].dtype, DType::kF8E4M3);
    EXPECT_EQ(specs[idx.at("layers.2.ffn.shared_experts.w2.scale")].dtype, DType::kF8E8M0);
  }
}

TEST(TensorSpec, IgnoreList) {
  EXPECT_TRUE(is_ignored_tensor("mtp.0.emb.tok_emb.weight"));
  EXPECT_TRUE(is_ignored_tensor("mtp.0.head.weight"));
  EXPECT_TRUE(is_ignored_tensor("mtp.12.emb.weight"));
  EXPECT_FALSE(is_ignored_tensor("mtp.0.norm.weight"));
  EXPECT_FALSE(is_ignored_tensor("mtp.0.hc_head_fn"));
  EXPECT_FALSE(is_ignored_tensor("mtp.0.emb"));
  EXPECT_FALSE(is_ignored_tensor("mtp.0.head."));
  EXPECT_FALSE(is_ignored_tensor("mtp..emb.x"));
  EXPECT_FALSE(is_ignored_tensor("mtp.a.emb.x"));
  EXPECT_FALSE(is_ignored_tensor("layers.0.emb.x"));
  EXPECT_FALSE(is_ignored_tensor("head.weight"));
  EXPECT_FALSE(is_ignored_tensor("embed.weight"));
  // Nothing in the expected set is on the ignore list.
  for (const auto& t : expected_tensors(tiny_config())) EXPECT_FALSE(is_ignored_tensor(t.name));
}

TEST(TensorSpec, Describe) {
  const auto specs = expected_tensors(tiny_config());
  const auto idx = index_tensor_specs(specs);
  EXPECT_EQ(describe(specs[idx.at("layers.0.attn.wq_b.scale")]),
            "layers.0.attn.wq_b.scale F8_E8M0[4, 1]");
  EXPECT_EQ(describe(specs[idx.at("layers.0.ffn.experts.0.w1.weight")]),
            "layers.0.ffn.experts.0.w1.weight I8[128, 128] logical [128, 256]");
  EXPECT_STREQ(tensor_component_name(TensorComponent::kRoutedExpert), "routed_expert");
  EXPECT_STREQ(quant_role_name(QuantRole::kNvfp4GlobalScale), "nvfp4_global_scale");
}

}  // namespace
}  // namespace ds
