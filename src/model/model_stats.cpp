// Parameter, byte and KV-cache arithmetic for DeepSeek-V4 (dsv4-model.md §3 totals, §11, §13).
// Everything is derived from the expected tensor set so that the statistics and the loader can
// never disagree about what a checkpoint holds.
#include "model/model_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ds {

ModelStats compute_model_stats(const DeepSeekV4Config& config) {
  return compute_model_stats(config, expected_tensors(config));
}

ModelStats compute_model_stats(const DeepSeekV4Config& c, const std::vector<TensorSpec>& tensors) {
  ModelStats s;
  s.num_tensors = tensors.size();
  uint64_t embed_params = 0;
  for (const TensorSpec& t : tensors) {
    const uint64_t bytes = t.stored_bytes();
    const uint64_t n = uint64_t(t.numel());
    s.bytes_by_dtype[t.dtype] += bytes;
    const size_t ci = size_t(t.component);
    if (t.is_mtp()) {
      s.mtp_weight_bytes += bytes;
      s.mtp_bytes_by_component[ci] += bytes;
    } else {
      s.main_weight_bytes += bytes;
      s.main_bytes_by_component[ci] += bytes;
      if (t.is_scale) s.main_scale_bytes += bytes;
      if (t.component == TensorComponent::kRoutedExpert) s.main_routed_expert_bytes += bytes;
    }
    if (t.is_scale) {
      s.scale_elements += n;
      continue;
    }
    if (t.component == TensorComponent::kHashTable) {
      s.hash_table_elements += n;
      continue;
    }
    if (t.is_mtp()) {
      s.mtp_params_by_component[ci] += n;
      s.mtp_params += n;
    } else {
      s.main_params_by_component[ci] += n;
      s.main_params += n;
      if (t.component == TensorComponent::kRoutedExpert) s.main_routed_expert_params += n;
      if (t.component == TensorComponent::kEmbed) embed_params += n;
    }
  }
  s.params_per_routed_expert =
      3 * uint64_t(c.moe_intermediate_size) * uint64_t(c.hidden_size);  // w1, w2, w3
  s.active_params_per_token =
      s.main_params - s.main_routed_expert_params - embed_params +
      uint64_t(c.num_hidden_layers) * uint64_t(c.num_experts_per_tok) * s.params_per_routed_expert;
  return s;
}

int64_t kv_entry_bytes(const DeepSeekV4Config& c) {
  const int64_t nope = c.nope_head_dim();
  const int64_t raw = nope /* e4m3 */ + 2 * c.qk_rope_head_dim /* bf16 */ + (nope + 63) / 64;
  return (raw + 1) / 2 * 2;
}

int64_t indexer_key_bytes(const DeepSeekV4Config& c, IndexerKeyFormat format) {
  const int64_t d = c.index_head_dim;
  if (format == IndexerKeyFormat::kFp4) return d / 2 + (d + 31) / 32;  // e2m1 + ue8m0 per 32
  return d + 4 * ((d + 127) / 128);                                    // e4m3 + fp32 per 128
}

KvCacheStats compute_kv_stats(const DeepSeekV4Config& c, IndexerKeyFormat indexer_format,
                              int64_t draft_tokens) {
  KvCacheStats k;
  k.entry_bytes = kv_entry_bytes(c);
  k.indexer_entry_bytes = indexer_key_bytes(c, indexer_format);
  k.swa_slots = c.sliding_window + (draft_tokens > 0 ? draft_tokens - 1 : 0);
  const int64_t ring_mult = draft_tokens > 0 ? 2 : 1;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    switch (c.layer_kind(l)) {
      case LayerKind::kSwa:
        ++k.num_swa_layers;
        break;
      case LayerKind::kCsa:
        ++k.num_csa_layers;
        break;
      case LayerKind::kHca:
        ++k.num_hca_layers;
        break;
    }
  }
  k.csa_kv_bytes_per_token = double(k.num_csa_layers) * double(k.entry_bytes) / 4.0;
  k.csa_indexer_bytes_per_token = double(k.num_csa_layers) * double(k.indexer_entry_bytes) / 4.0;
  k.hca_kv_bytes_per_token = double(k.num_hca_layers) * double(k.entry_bytes) / 128.0;
  k.bytes_per_token =
      k.csa_kv_bytes_per_token + k.csa_indexer_bytes_per_token + k.hca_kv_bytes_per_token;
  const uint64_t ring = uint64_t(k.swa_slots) * uint64_t(k.entry_bytes);
  k.swa_ring_bytes = uint64_t(c.num_hidden_layers) * ring;
  k.mtp_swa_ring_bytes = uint64_t(c.num_nextn_predict_layers) * ring;
  // Compressor state rings (§7.6, §11), fp32 kv + score rows: CSA 8 rows x 2 x (2d), HCA 128 rows
  // x 2 x d, for the attention compressor (d = head_dim) and the CSA indexer (d = index_head_dim).
  const uint64_t f = 4;
  const uint64_t csa_attn = 8 * 2 * 2 * uint64_t(c.head_dim) * f;
  const uint64_t csa_index = 8 * 2 * 2 * uint64_t(c.index_head_dim) * f;
  const uint64_t hca = 128 * 2 * uint64_t(c.head_dim) * f;
  k.compressor_state_bytes =
      uint64_t(ring_mult) *
      (uint64_t(k.num_csa_layers) * (csa_attn + csa_index) + uint64_t(k.num_hca_layers) * hca);
  return k;
}

uint64_t kv_bytes_for_context(const DeepSeekV4Config& c, int64_t context_tokens,
                              IndexerKeyFormat indexer_format) {
  if (context_tokens <= 0) return 0;
  const uint64_t entry = uint64_t(kv_entry_bytes(c));
  const uint64_t index_entry = uint64_t(indexer_key_bytes(c, indexer_format));
  const uint64_t L = uint64_t(context_tokens);
  const uint64_t window = std::min<uint64_t>(L, uint64_t(c.sliding_window));
  uint64_t total = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += window * entry;
    switch (c.layer_kind(l)) {
      case LayerKind::kSwa:
        break;
      case LayerKind::kCsa:
        total += (L / 4) * (entry + index_entry);
        break;
      case LayerKind::kHca:
        total += (L / 128) * entry;
        break;
    }
  }
  return total;
}

Result<int64_t> gpus_needed_for_weights(uint64_t weight_bytes, uint64_t gpu_memory_bytes,
                                        double reserve_fraction) {
  if (!(reserve_fraction >= 0.0 && reserve_fraction < 1.0))
    return invalid_argument("reserve fraction must be in [0, 1), got " +
                            std::to_string(reserve_fraction));
  const double usable = std::floor(double(gpu_memory_bytes) * (1.0 - reserve_fraction));
  if (!(usable >= 1.0)) return invalid_argument("GPU memory size must be positive");
  return int64_t(std::ceil(double(weight_bytes) / usable));
}

std::string format_model_summary(const DeepSeekV4Config& c, const ModelStats& s,
                                 const KvCacheStats& k) {
  char buf[1024];
  std::string out;
  auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
  std::snprintf(buf, sizeof buf,
                "DeepSeek-V4: %lld layers (%lld SWA, %lld CSA, %lld HCA) + %lld MTP, hidden %lld, "
                "%lld routed experts (top-%lld, %s)\n",
                (long long)c.num_hidden_layers, (long long)k.num_swa_layers,
                (long long)k.num_csa_layers, (long long)k.num_hca_layers,
                (long long)c.num_nextn_predict_layers, (long long)c.hidden_size,
                (long long)c.n_routed_experts, (long long)c.num_experts_per_tok,
                expert_format_name(c.expert_format));
  out += buf;
  std::snprintf(buf, sizeof buf, "parameters: %.2fB main (%.2fB active per token), %.2fB MTP\n",
                double(s.main_params) * 1e-9, double(s.active_params_per_token) * 1e-9,
                double(s.mtp_params) * 1e-9);
  out += buf;
  out += "bytes by dtype:";
  for (const auto& [dtype, bytes] : s.bytes_by_dtype) {
    std::snprintf(buf, sizeof buf, " %s %.2f GiB", std::string(dtype_name(dtype)).c_str(),
                  gib(bytes));
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "\nweights: %.2f GiB main + %.2f GiB MTP\n"
                "KV: %.0f B per context token (amortized) + %.2f MiB fixed SWA ring per sequence\n",
                gib(s.main_weight_bytes), gib(s.mtp_weight_bytes), k.bytes_per_token,
                double(k.swa_ring_bytes) / double(1 << 20));
  out += buf;
  return out;
}

}  // namespace ds
