// DeepSeekV4Config: the hyper-parameters of a DeepSeek-V4 model as read from the Hugging Face
// `config.json` (dsv4-model.md §3, field names as published), the strict parser and validator
// for that file (reliability.md row WF11 and rule 24: every field the engine reads is checked for
// type, range and its relations to other fields; unknown fields are ignored), two presets (the
// tiny test model of §14 and the Flash geometry with a chosen number of layers) and the writer
// that produces an HF-style config.json from a struct.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds {

// What a layer's attention looks like, from its `compress_ratios` entry (dsv4-model.md §3).
enum class LayerKind : uint8_t {
  kSwa,  // ratio 0: sliding-window attention only
  kCsa,  // ratio 4: SWA + overlapping ratio-4 compressed KV + lightning indexer top-k
  kHca,  // ratio 128: SWA + every ratio-128 compressed entry, no indexer
};
const char* layer_kind_name(LayerKind kind);

// How the routed experts are stored (dsv4-model.md §10.1, §10.3, §15 last row).
enum class ExpertFormat : uint8_t {
  kMxfp4,     // expert_dtype "fp4" (default): I8 packed e2m1 [out, in/2] + E8M0 scale per 32
  kFp8Block,  // expert_dtype "fp8" (Flash-Base): E4M3 [out, in] + F32 scale per 128x128 block
  kNvfp4,     // quantization_config.quant_algo "MIXED_PRECISION" (nvidia/...-NVFP4): U8 packed
              // e2m1 + E4M3 scale per 16 + F32 global scale
};
const char* expert_format_name(ExpertFormat format);

// The configuration. Sizes are int64_t so that shape arithmetic never narrows; every value here
// has passed validate_config() when it comes from parse_config_json().
struct DeepSeekV4Config {
  // ---- embedding and stack ----
  int64_t vocab_size = 0;                // rows of embed.weight and head.weight
  int64_t hidden_size = 0;               // D: width of each of the hc_mult residual streams
  int64_t num_hidden_layers = 0;         // main decoder blocks
  int64_t num_nextn_predict_layers = 0;  // MTP blocks (`mtp.{i}.*`), after the main layers

  // ---- attention (§7) ----
  int64_t num_attention_heads = 0;  // query heads
  int64_t num_key_value_heads = 0;  // must be 1: one shared 512-dim K=V vector ("MQA")
  int64_t head_dim = 0;             // per-head width of q, K=V and the output: nope + rope
  int64_t qk_rope_head_dim = 0;     // the trailing rope slice of each head (interleaved pairs)
  int64_t q_lora_rank = 0;          // width of qr = q_norm(h @ wq_a^T); also feeds the indexer
  int64_t o_groups = 0;             // grouped output projection: heads are split in o_groups
  int64_t o_lora_rank = 0;          // per-group width after wo_a (wo_a out = o_groups*o_lora_rank)
  int64_t sliding_window = 0;       // raw-KV window (tokens), the current token included
  // One entry per main layer, then one per MTP layer: 0 = SWA, 4 = CSA, 128 = HCA.
  std::vector<int> compress_ratios;  // [num_hidden_layers + num_nextn_predict_layers]

  // ---- positions (§7.3) ----
  double rope_theta = 0;           // RoPE base of SWA-only layers (no YaRN)
  double compress_rope_theta = 0;  // RoPE base of CSA/HCA layers (YaRN always applied)
  // rope_scaling: YaRN frequency interpolation for compressed layers. `type` and/or `rope_type`
  // in the file; only "yarn" is accepted. The fields below are rope_scaling.{factor,
  // original_max_position_embeddings, beta_fast, beta_slow}.
  double rope_factor = 0;
  int64_t rope_original_max_position_embeddings = 0;
  double rope_beta_fast = 0;
  double rope_beta_slow = 0;
  int64_t max_position_embeddings = 0;  // advertised context limit (tokens)

  // ---- lightning indexer (§7.7), CSA layers only ----
  int64_t index_n_heads = 0;   // indexer query heads
  int64_t index_head_dim = 0;  // indexer key/query width; a power of two (Hadamard)
  int64_t index_topk = 0;      // compressed entries selected per query

  // ---- MoE (§8) ----
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k routed experts per token
  // Shared expert width = n_shared_experts * moe_intermediate_size; 0 = no shared expert.
  int64_t n_shared_experts = 0;
  int64_t moe_intermediate_size = 0;          // routed expert SwiGLU width
  std::string scoring_func = "sqrtsoftplus";  // the only supported router score
  std::string topk_method = "noaux_tc";       // bias-corrected top-k without expert groups
  bool norm_topk_prob = true;                 // renormalize the chosen experts' scores
  double routed_scaling_factor = 0;           // multiplies the renormalized route weights
  int64_t num_hash_layers = 0;  // layers [0, num_hash_layers) route by tid2eid[token id]
  double swiglu_limit = 0;      // routed-expert clamp: min(a, L), clamp(b, -L, L)

  // ---- manifold hyper-connections (§5) ----
  int64_t hc_mult = 0;            // number of residual streams
  int64_t hc_sinkhorn_iters = 0;  // Sinkhorn normalization rounds
  double hc_eps = 0;              // added in sigmoid/softmax/normalization steps

  // ---- misc ----
  double rms_norm_eps = 0;
  std::string hidden_act = "silu";   // the only supported activation
  bool tie_word_embeddings = false;  // must be false: embed and head are separate tensors
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  std::string torch_dtype = "bfloat16";  // dtype of the unquantized tensors; only bfloat16

  // ---- quantization_config (§10): fp8, e4m3, ue8m0, 128x128 blocks, dynamic activations ----
  std::string quant_method = "fp8";
  std::string quant_fmt = "e4m3";
  std::string quant_scale_fmt = "ue8m0";
  int64_t weight_block_rows = 128;  // weight_block_size[0]; must be 128
  int64_t weight_block_cols = 128;  // weight_block_size[1]; must be 128
  std::string activation_scheme = "dynamic";

  // Routed-expert storage: from `expert_dtype` (top level or inside quantization_config; "fp4"
  // when absent, as in the April-2026 Flash release) and quantization_config.quant_algo.
  ExpertFormat expert_format = ExpertFormat::kMxfp4;

  // ---- derived helpers ----
  int64_t num_layers_total() const { return num_hidden_layers + num_nextn_predict_layers; }
  // Layer index i in [0, num_layers_total()); MTP layer j is num_hidden_layers + j.
  bool is_mtp_layer(int64_t i) const { return i >= num_hidden_layers; }
  LayerKind layer_kind(int64_t i) const;
  // Hash routing (tid2eid, no gate.bias) in main layers < num_hash_layers; MTP is learned.
  bool is_hash_layer(int64_t i) const { return i < num_hash_layers && i < num_hidden_layers; }
  int64_t nope_head_dim() const { return head_dim - qk_rope_head_dim; }
  int64_t shared_intermediate_size() const { return n_shared_experts * moe_intermediate_size; }

  bool operator==(const DeepSeekV4Config&) const = default;
};

// Sanity bounds that keep a hostile config from requesting absurd allocations (the expected
// tensor list alone has about 6 tensors per routed expert per layer).
inline constexpr int64_t kMaxConfigDim = int64_t(1) << 20;  // any width
inline constexpr int64_t kMaxVocabSize = int64_t(1) << 24;
inline constexpr int64_t kMaxLayers = 1024;  // main layers
inline constexpr int64_t kMaxNextnLayers = 8;
inline constexpr int64_t kMaxRoutedExperts = 4096;
inline constexpr int64_t kMaxExpertLayerProduct = int64_t(1) << 18;  // layers * experts
inline constexpr int64_t kMaxPositions = int64_t(1) << 32;
inline constexpr int64_t kMaxHcMult = 16;
inline constexpr int64_t kMaxSinkhornIters = 1000;
// Largest config.json load_config_file() reads (the real one is about 2 KB).
inline constexpr uint64_t kMaxConfigFileBytes = 16u << 20;

// Parses and validates config.json text. `what` prefixes every error message; messages name the
// field, e.g. `config.json: field "compress_ratios": has 43 entries, expected
// num_hidden_layers + num_nextn_predict_layers = 44`.
Result<DeepSeekV4Config> parse_config_json(std::string_view text,
                                           std::string_view what = "config.json");
// Reads `path` (a config.json file, or a directory holding one) and parses it.
Result<DeepSeekV4Config> load_config_file(const std::filesystem::path& path);

// Checks ranges and the relations between fields (WF11). parse_config_json() calls it; tests and
// tools that build configs by hand call it too. Errors are prefixed with `what`.
Status validate_config(const DeepSeekV4Config& config, std::string_view what = "config.json");

// The tiny configuration of dsv4-model.md §14 with vocab_size 129280 (the real tokenizer's
// embedding rows) instead of 1024; max_position_embeddings 4096 as given there.
DeepSeekV4Config tiny_config();
// DeepSeek-V4-Flash (§3) with `num_layers` main layers (clamped to [1, kMaxLayers]): the
// compress_ratios are the first num_layers entries of the Flash schedule (0, 0, then 4/128
// alternating; extended by the same rule past 43) plus the MTP entry 0; num_hash_layers =
// min(3, num_layers). flash_config(43) is the published model.
DeepSeekV4Config flash_config(int num_layers = 43);

// An HF-style config.json (architectures, model_type, every field above; expert_dtype written
// for fp4/fp8 experts, quant_algo "MIXED_PRECISION" for NVFP4) that parses back to `config`.
std::string to_config_json(const DeepSeekV4Config& config);

}  // namespace ds
