// Model statistics against the totals quoted in dsv4-model.md §3 (284.3B / 13.3B / 6.6B MTP),
// §10 (145.3 GiB resident, MTP 3.6 GB), §11 (584-B entries, ~3.85 KB/token, 3.2 MB SWA rings),
// §13.1 (per-component bytes) and §14 (tiny: ~7.4M parameters, 3.4M active, 194-B entries).
#include <gtest/gtest.h>

#include <cstdio>

#include "model/config.h"
#include "model/model_stats.h"

namespace ds {
namespace {

constexpr double kGiB = double(1ull << 30);
double comp(const std::array<uint64_t, kNumTensorComponents>& a, TensorComponent c) {
  return double(a[size_t(c)]);
}

TEST(ModelStats, FlashParameters) {
  auto cfg = load_config_file(std::string(DS_SOURCE_DIR) + "/tests/fixtures/deepseek_v4_flash");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const ModelStats s = compute_model_stats(*cfg);
  EXPECT_NEAR(double(s.main_params) * 1e-9, 284.3, 0.05);
  EXPECT_NEAR(double(s.main_routed_expert_params) * 1e-9, 277.0, 0.05);
  EXPECT_NEAR(double(s.active_params_per_token) * 1e-9, 13.3, 0.05);
  EXPECT_NEAR(double(s.mtp_params) * 1e-9, 6.6, 0.05);
  EXPECT_EQ(s.params_per_routed_expert, 3u * 2048u * 4096u);
  // Exact values of the formula, so that a change to the tensor table shows up here.
  EXPECT_EQ(s.main_params, 284332240471u);
  EXPECT_EQ(s.active_params_per_token, 13270101591u);
  EXPECT_EQ(s.mtp_params, 6610048891u);
  // Components (§13.1): attention projections 106.95M per layer, shared expert 25.17M per layer.
  EXPECT_NEAR(comp(s.main_params_by_component, TensorComponent::kEmbed), 129280.0 * 4096, 0.5);
  EXPECT_NEAR(comp(s.main_params_by_component, TensorComponent::kSharedExpert) / 43, 25165824, 0.5);
  EXPECT_NEAR(comp(s.main_params_by_component, TensorComponent::kAttention) / 43 * 1e-6, 106.96,
              0.01);  // + sink, q_norm, kv_norm
  EXPECT_EQ(s.hash_table_elements, 3u * 129280u * 6u);
  EXPECT_GT(s.scale_elements, 0u);
}

TEST(ModelStats, FlashBytes) {
  const DeepSeekV4Config c = flash_config(43);
  const ModelStats s = compute_model_stats(c);
  // §10: resident main model ≈ 156.0 GB (145.3 GiB); MTP ≈ 3.6 GB.
  EXPECT_NEAR(double(s.main_weight_bytes) / kGiB, 145.3, 0.2);
  EXPECT_NEAR(double(s.main_weight_bytes) * 1e-9, 156.0, 0.1);
  EXPECT_NEAR(double(s.mtp_weight_bytes) * 1e-9, 3.6, 0.1);
  // §13.1: routed experts 147.2 GB in total, one expert 13.37 MB (MXFP4 0.53125 B/param).
  EXPECT_NEAR(double(s.main_routed_expert_bytes) * 1e-9, 147.2, 0.05);
  EXPECT_NEAR(double(s.main_routed_expert_bytes) / (43 * 256) * 1e-6, 13.37, 0.005);
  // §13.1 dense per step: attention 4.60 GB, shared 1.08, compressors/indexers 0.80, head 1.06,
  // gate 0.09, mHC 0.14.
  auto gb = [&](TensorComponent t) { return comp(s.main_bytes_by_component, t) * 1e-9; };
  EXPECT_NEAR(gb(TensorComponent::kAttention), 4.60, 0.01);
  EXPECT_NEAR(gb(TensorComponent::kSharedExpert), 1.08, 0.01);
  EXPECT_NEAR(gb(TensorComponent::kCompressor) + gb(TensorComponent::kIndexer), 0.80, 0.01);
  EXPECT_NEAR(gb(TensorComponent::kHead), 1.06, 0.01);
  EXPECT_NEAR(gb(TensorComponent::kGate), 0.09, 0.005);
  EXPECT_NEAR(gb(TensorComponent::kMhc), 0.14, 0.005);
  // Stored bytes by dtype add up to the total.
  uint64_t sum = 0;
  for (const auto& [dt, b] : s.bytes_by_dtype) sum += b;
  EXPECT_EQ(sum, s.main_weight_bytes + s.mtp_weight_bytes);
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kI64), 3u * 129280u * 6u * 8u);  // tid2eid
  EXPECT_EQ(s.bytes_by_dtype.count(DType::kU8), 0u);
  // 156 GB do not fit one 141 GB H200 with a 10% reserve: 2 GPUs; 4 RTX PRO 6000 (96 GB) would
  // leave nothing for the KV cache, so 2 x 96 GB is not enough either.
  EXPECT_EQ(*gpus_needed_for_weights(s.main_weight_bytes, 141'000'000'000ull), 2);
  EXPECT_EQ(*gpus_needed_for_weights(s.main_weight_bytes, 96'000'000'000ull), 2);
  EXPECT_EQ(*gpus_needed_for_weights(s.main_weight_bytes, 96'000'000'000ull, 0.5), 4);
  EXPECT_EQ(*gpus_needed_for_weights(s.main_weight_bytes, 80'000'000'000ull, 0.0), 2);
  EXPECT_FALSE(gpus_needed_for_weights(1, 0).ok());
  EXPECT_FALSE(gpus_needed_for_weights(1, 100, 1.0).ok());
  EXPECT_FALSE(gpus_needed_for_weights(1, 100, -0.1).ok());
}

TEST(ModelStats, FlashKvCache) {
  const DeepSeekV4Config c = flash_config(43);
  EXPECT_EQ(kv_entry_bytes(c), 584);  // 448 + 128 + 7 + 1 pad
  EXPECT_EQ(indexer_key_bytes(c, IndexerKeyFormat::kFp8), 132);
  EXPECT_EQ(indexer_key_bytes(c, IndexerKeyFormat::kFp4), 68);
  const KvCacheStats k = compute_kv_stats(c);
  EXPECT_EQ(k.num_swa_layers, 2);
  EXPECT_EQ(k.num_csa_layers, 21);
  EXPECT_EQ(k.num_hca_layers, 20);
  // §11: CSA 146 B x 21 + indexer 33 B x 21 + HCA 4.5625 B x 20 = 3850.25 B per token.
  EXPECT_DOUBLE_EQ(k.csa_kv_bytes_per_token, 146.0 * 21);
  EXPECT_DOUBLE_EQ(k.csa_indexer_bytes_per_token, 33.0 * 21);
  EXPECT_DOUBLE_EQ(k.hca_kv_bytes_per_token, 4.5625 * 20);
  EXPECT_DOUBLE_EQ(k.bytes_per_token, 3850.25);
  EXPECT_EQ(k.swa_ring_bytes, 43u * 128u * 584u);  // 3.21 MB
  EXPECT_NEAR(double(k.swa_ring_bytes) * 1e-6, 3.2, 0.05);
  EXPECT_EQ(k.mtp_swa_ring_bytes, 128u * 584u);
  // Compressor state (§11): CSA 64 KiB + 16 KiB, HCA 512 KiB per layer.
  EXPECT_EQ(k.compressor_state_bytes, 21u * (64u + 16u) * 1024u + 20u * 512u * 1024u);
  const KvCacheStats spec = compute_kv_stats(c, IndexerKeyFormat::kFp4, 2);
  EXPECT_EQ(spec.swa_slots, 129);
  EXPECT_EQ(spec.compressor_state_bytes, 2 * k.compressor_state_bytes);
  EXPECT_DOUBLE_EQ(spec.csa_indexer_bytes_per_token, 17.0 * 21);
  // Exact bytes for a 32K sequence: 126 MB + 3.2 MB (§11).
  const uint64_t b = kv_bytes_for_context(c, 32768);
  EXPECT_EQ(b, 43ull * 128 * 584 + 21ull * 8192 * (584 + 132) + 20ull * 256 * 584);
  EXPECT_NEAR(double(b) * 1e-6, 126.2 + 3.2, 0.5);
  EXPECT_EQ(kv_bytes_for_context(c, 0), 0u);
  EXPECT_EQ(kv_bytes_for_context(c, 3), 43ull * 3 * 584);  // no compressed entry yet
}

TEST(ModelStats, TinyPreset) {
  // §14 with vocab 1024: 6,068,349 main + 1,334,855 MTP = 7,403,204 ≈ 7.4M (the spec's figure
  // counts the MTP layer), 3,446,909 active. tiny_config() uses vocab 129280, which adds
  // (129280 - 1024) x 256 = 32.8M to each of embed and head: +65,667,072 main parameters. The
  // spec's "33 M extra" counts one of the two tables; tid2eid ([129280, 2] I64 x 2 layers) is not
  // a parameter. Active grows by the head only (+32.8M): the embedding is a row gather.
  DeepSeekV4Config small = tiny_config();
  small.vocab_size = 1024;
  const ModelStats s = compute_model_stats(small);
  EXPECT_EQ(s.main_params, 6068349u);
  EXPECT_EQ(s.mtp_params, 1334855u);
  EXPECT_NEAR(double(s.main_params + s.mtp_params) * 1e-6, 7.4, 0.05);
  EXPECT_EQ(s.active_params_per_token, 3446909u);
  const ModelStats t = compute_model_stats(tiny_config());
  EXPECT_EQ(t.main_params - s.main_params, 2u * (129280u - 1024u) * 256u);
  EXPECT_EQ(t.main_params, 71735421u);
  EXPECT_EQ(t.mtp_params, s.mtp_params);
  EXPECT_EQ(t.active_params_per_token, 3446909u + (129280u - 1024u) * 256u);
  EXPECT_EQ(t.hash_table_elements, 2u * 129280u * 2u);
  EXPECT_EQ(kv_entry_bytes(small), 194);  // 64 + 128 + 1 + 1 pad (§14)
  EXPECT_EQ(indexer_key_bytes(small, IndexerKeyFormat::kFp8), 132);
  const KvCacheStats k = compute_kv_stats(small);
  EXPECT_EQ(k.num_csa_layers, 2);
  EXPECT_EQ(k.num_hca_layers, 1);
  EXPECT_EQ(k.swa_ring_bytes, 4u * 16u * 194u);
}

TEST(ModelStats, SummaryMentionsTheNumbers) {
  const DeepSeekV4Config c = flash_config(43);
  const ModelStats s = compute_model_stats(c);
  const KvCacheStats k = compute_kv_stats(c);
  const std::string text = format_model_summary(c, s, k);
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("284.33B main"), std::string::npos) << text;
  EXPECT_NE(text.find("13.27B active"), std::string::npos) << text;
  EXPECT_NE(text.find("43 layers (2 SWA, 21 CSA, 20 HCA) + 1 MTP"), std::string::npos) << text;
}

}  // namespace
}  // namespace ds
