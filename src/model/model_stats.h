// Model statistics computed from a DeepSeekV4Config and its expected tensor set (tensor_spec.h):
// parameter counts by component (main model and MTP), active parameters per token, stored bytes by
// dtype and resident weight bytes, KV-cache bytes per token by cache kind (dsv4-model.md §11,
// §13.2) and the number of GPUs the weights need. Used by the loading summary, `deepserve
// roofline` and capacity planning.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/tensor_spec.h"

namespace ds {

struct ModelStats {
  // Parameters = logical elements of weight tensors (a packed FP4 byte holds two). Quantization
  // scales and the tid2eid table are counted separately and are not parameters.
  std::array<uint64_t, kNumTensorComponents> main_params_by_component{};  // by TensorComponent
  std::array<uint64_t, kNumTensorComponents> mtp_params_by_component{};
  uint64_t main_params = 0;                // main model (embed and head included)
  uint64_t mtp_params = 0;                 // all mtp.{i}.* (embed/head are shared, not counted)
  uint64_t main_routed_expert_params = 0;  // routed experts of the main layers
  uint64_t params_per_routed_expert = 0;   // one expert of one layer: 3 * inter * hidden
  // Active per token in the main model: everything except the routed experts and the embedding
  // (a row gather), plus num_experts_per_tok routed experts in every main layer. Head included.
  uint64_t active_params_per_token = 0;
  uint64_t scale_elements = 0;       // all quantization scales (main + MTP)
  uint64_t hash_table_elements = 0;  // all tid2eid entries

  // Bytes as stored in the checkpoint (= resident if loaded as stored), scales and tid2eid
  // included.
  std::map<DType, uint64_t> bytes_by_dtype;                              // main + MTP
  std::array<uint64_t, kNumTensorComponents> main_bytes_by_component{};  // scales included
  std::array<uint64_t, kNumTensorComponents> mtp_bytes_by_component{};
  uint64_t main_weight_bytes = 0;
  uint64_t mtp_weight_bytes = 0;
  uint64_t main_routed_expert_bytes = 0;  // weights + scales of the main layers' routed experts
  uint64_t main_scale_bytes = 0;
  uint64_t num_tensors = 0;  // expected tensors (optional ones included)
};

ModelStats compute_model_stats(const DeepSeekV4Config& config);
// The same from an already-built expected_tensors(config).
ModelStats compute_model_stats(const DeepSeekV4Config& config,
                               const std::vector<TensorSpec>& tensors);

// ---- KV cache (§11) ----------------------------------------------------------------------------

enum class IndexerKeyFormat : uint8_t {
  kFp8,  // index_head_dim e4m3 + one fp32 scale per 128 (132 B for Flash)
  kFp4,  // index_head_dim/2 packed e2m1 + one ue8m0 per 32 (68 B for Flash)
};

// Bytes of one KV entry (raw window token or compressed entry) in the FlashMLA-style layout:
// nope e4m3 bytes + rope bf16 bytes + one ue8m0 scale byte per 64 nope values, padded to an even
// size so that the bf16 rope of a packed array of entries stays 2-byte aligned. Flash: 448 + 128 +
// 7 + 1 pad = 584; tiny (§14): 64 + 128 + 1 + 1 pad = 194.
int64_t kv_entry_bytes(const DeepSeekV4Config& config);
// Bytes of one indexer key entry.
int64_t indexer_key_bytes(const DeepSeekV4Config& config, IndexerKeyFormat format);

struct KvCacheStats {
  int64_t entry_bytes = 0;          // kv_entry_bytes()
  int64_t indexer_entry_bytes = 0;  // indexer_key_bytes()
  int64_t swa_slots = 0;            // sliding_window (+ draft_tokens - 1 when speculating)
  int64_t num_swa_layers = 0, num_csa_layers = 0, num_hca_layers = 0;  // main model
  // Amortized bytes per context token of one sequence, main model (entry / ratio per layer).
  double csa_kv_bytes_per_token = 0;       // CSA layers * entry / 4
  double csa_indexer_bytes_per_token = 0;  // CSA layers * indexer entry / 4
  double hca_kv_bytes_per_token = 0;       // HCA layers * entry / 128
  double bytes_per_token = 0;              // the sum of the three
  // Fixed bytes per sequence.
  uint64_t swa_ring_bytes = 0;          // main layers * swa_slots * entry
  uint64_t mtp_swa_ring_bytes = 0;      // MTP layers * swa_slots * entry
  uint64_t compressor_state_bytes = 0;  // fp32 kv+score rings of every compressor (main)
};

// `draft_tokens` > 0 (speculative decoding with that many draft tokens per step) grows the SWA ring
// to sliding_window + draft_tokens - 1 slots and doubles the compressor state rings (§9, §11).
KvCacheStats compute_kv_stats(const DeepSeekV4Config& config,
                              IndexerKeyFormat indexer_format = IndexerKeyFormat::kFp8,
                              int64_t draft_tokens = 0);

// Exact KV bytes of one sequence holding `context_tokens` tokens (main model): SWA ring
// (min(context, swa_slots) entries per layer), floor(context/4) CSA entries and indexer keys per
// CSA layer, floor(context/128) entries per HCA layer. Compressor state excluded.
uint64_t kv_bytes_for_context(const DeepSeekV4Config& config, int64_t context_tokens,
                              IndexerKeyFormat indexer_format = IndexerKeyFormat::kFp8);

// ---- capacity ----------------------------------------------------------------------------------

// Memory kept free on every GPU for the KV cache, activations, workspaces and the CUDA context
// when only the weights are placed.
inline constexpr double kDefaultGpuReserveFraction = 0.10;

// The number of GPUs of `gpu_memory_bytes` each that hold `weight_bytes` of weights when a
// fraction `reserve_fraction` (in [0, 1)) of each GPU is kept free: ceil(weight / (mem * (1 -
// reserve))). Assumes weights split evenly (tensor/expert parallel).
Result<int64_t> gpus_needed_for_weights(uint64_t weight_bytes, uint64_t gpu_memory_bytes,
                                        double reserve_fraction = kDefaultGpuReserveFraction);

// A few lines for the loading summary: parameters (total/active/MTP), bytes by dtype, resident
// GiB, KV bytes per token.
std::string format_model_summary(const DeepSeekV4Config& config, const ModelStats& stats,
                                 const KvCacheStats& kv);

}  // namespace ds
