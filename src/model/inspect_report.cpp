// Formatting of the inspect report. Counts are shown both rounded (284.3B) and exact.
#include "model/inspect_report.h"

#include <cstdio>
#include <string>

#include "model/model_stats.h"
#include "model/tensor_spec.h"

namespace ds {
namespace {

std::string fmt(const char* format, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// 284332240471 -> "284.3B"; 7403204 -> "7.40M"; 4096 -> "4.10K".
std::string count_short(uint64_t n) {
  double v = double(n);
  if (v >= 1e9) return fmt("%.1fB", v * 1e-9);
  if (v >= 1e6) return fmt("%.2fM", v * 1e-6);
  if (v >= 1e3) return fmt("%.2fK", v * 1e-3);
  return fmt("%llu", (unsigned long long)n);
}

// 284332240471 -> "284,332,240,471"
std::string count_exact(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string bytes_short(double b) {
  if (b >= double(1ull << 30)) return fmt("%.2f GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt("%.2f MiB", b / double(1ull << 20));
  if (b >= 1024.0) return fmt("%.2f KiB", b / 1024.0);
  return fmt("%.0f B", b);
}

}  // namespace

std::string format_inspect_report(const DeepSeekV4Config& c, const InspectOptions& options) {
  const ModelStats s = compute_model_stats(c);
  const KvCacheStats kv = compute_kv_stats(c);
  std::string out;
  out += fmt("architecture: DeepSeek-V4, %lld layers (%lld SWA, %lld CSA ratio 4, %lld HCA ratio 128)"
             " + %lld MTP layer(s)\n",
             (long long)c.num_hidden_layers, (long long)kv.num_swa_layers, (long long)kv.num_csa_layers,
             (long long)kv.num_hca_layers, (long long)c.num_nextn_predict_layers);
  out += fmt("  hidden %lld x %lld mHC streams, %lld heads x %lld (rope %lld), q_lora %lld, "
             "o_groups %lld x %lld, window %lld\n",
             (long long)c.hidden_size, (long long)c.hc_mult, (long long)c.num_attention_heads,
             (long long)c.head_dim, (long long)c.qk_rope_head_dim, (long long)c.q_lora_rank,
             (long long)c.o_groups, (long long)c.o_lora_rank, (long long)c.sliding_window);
  out += fmt("  indexer %lld heads x %lld, top %lld; experts %lld routed (top %lld, %s, intermediate "
             "%lld) + %lld shared; hash routing on %lld layer(s); vocabulary %lld\n",
             (long long)c.index_n_heads, (long long)c.index_head_dim, (long long)c.index_topk,
             (long long)c.n_routed_experts, (long long)c.num_experts_per_tok,
             expert_format_name(c.expert_format), (long long)c.moe_intermediate_size,
             (long long)c.n_shared_experts, (long long)c.num_hash_layers, (long long)c.vocab_size);

  out += fmt("parameters: main model %s (%s), active per token %s (%s), MTP %s (%s)\n",
             count_short(s.main_params).c_str(), count_exact(s.main_params).c_str(),
             count_short(s.active_params_per_token).c_str(),
             count_exact(s.active_params_per_token).c_str(), count_short(s.mtp_params).c_str(),
             count_exact(s.mtp_params).c_str());
  out += fmt("  %-16s %18s %18s %14s\n", "component", "main params", "MTP params", "bytes");
  for (int i = 0; i < kNumTensorComponents; ++i) {
    const uint64_t m = s.main_params_by_component[size_t(i)], t = s.mtp_params_by_component[size_t(i)];
    const uint64_t b = s.main_bytes_by_component[size_t(i)] + s.mtp_bytes_by_component[size_t(i)];
    if (m == 0 && t == 0 && b == 0) continue;
    out += fmt("  %-16s %18s %18s %14s\n", tensor_component_name(TensorComponent(i)),
               count_exact(m).c_str(), count_exact(t).c_str(), bytes_short(double(b)).c_str());
  }
  out += fmt("  (not parameters: %s quantization scale elements, %s tid2eid entries)\n",
             count_exact(s.scale_elements).c_str(), count_exact(s.hash_table_elements).c_str());

  out += "bytes by dtype:";
  for (const auto& [dtype, bytes] : s.bytes_by_dtype)
    out += fmt(" %s %s,", std::string(dtype_name(dtype)).c_str(), bytes_short(double(bytes)).c_str());
  out.back() = '\n';
  out += fmt("resident weights: main model %s (%.1f GB), MTP %s (%.1f GB)\n",
             bytes_short(double(s.main_weight_bytes)).c_str(), double(s.main_weight_bytes) * 1e-9,
             bytes_short(double(s.mtp_weight_bytes)).c_str(), double(s.mtp_weight_bytes) * 1e-9);

  out += fmt("KV cache per context token (amortized; %lld B entries, %lld B indexer keys):\n",
             (long long)kv.entry_bytes, (long long)kv.indexer_entry_bytes);
  out += fmt("  CSA compressed KV  (%2lld layers, 1 entry / 4 tokens)   %10.2f B\n",
             (long long)kv.num_csa_layers, kv.csa_kv_bytes_per_token);
  out += fmt("  CSA indexer keys   (%2lld layers, 1 key / 4 tokens)     %10.2f B\n",
             (long long)kv.num_csa_layers, kv.csa_indexer_bytes_per_token);
  out += fmt("  HCA compressed KV  (%2lld layers, 1 entry / 128 tokens) %10.2f B\n",
             (long long)kv.num_hca_layers, kv.hca_kv_bytes_per_token);
  out += fmt("  total                                                %10.2f B per token\n",
             kv.bytes_per_token);
  out += fmt("  fixed per sequence: SWA rings %s (%lld layers x %lld slots), MTP SWA ring %s, "
             "compressor states %s\n",
             bytes_short(double(kv.swa_ring_bytes)).c_str(),
             (long long)(kv.num_swa_layers + kv.num_csa_layers + kv.num_hca_layers),
             (long long)kv.swa_slots, bytes_short(double(kv.mtp_swa_ring_bytes)).c_str(),
             bytes_short(double(kv.compressor_state_bytes)).c_str());
  out += fmt("  one sequence at %lld tokens: %s\n", (long long)options.context_tokens,
             bytes_short(double(kv_bytes_for_context(c, options.context_tokens))).c_str());

  const uint64_t gpu_bytes = uint64_t(options.gpu_memory_gib * double(1ull << 30));
  auto gpus = gpus_needed_for_weights(s.main_weight_bytes + s.mtp_weight_bytes, gpu_bytes);
  if (gpus.ok()) {
    out += fmt("GPUs of %.0f GiB needed for the weights (main + MTP, %.0f%% kept for KV and "
               "workspace): %lld\n",
               options.gpu_memory_gib, kDefaultGpuReserveFraction * 100, (long long)*gpus);
  }
  return out;
}

}  // namespace ds
