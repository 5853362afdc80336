// The expected tensor set of a DeepSeek-V4 checkpoint: every tensor name with its stored dtype and
// shape, derived from a DeepSeekV4Config exactly as the table in dsv4-model.md §10 lays it out
// (global tensors; per-layer sets by layer kind SWA/CSA/HCA; tid2eid in hash layers, gate.bias in
// learned layers; routed experts as MXFP4, FP8-block or NVFP4; the MTP set `mtp.{i}.*`). The
// checkpoint loader compares the shard headers with this list (reliability.md §3.6 rules 20-21);
// the synthetic checkpoint writer and the model statistics are built from it too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace ds {

// Which part of the model a tensor belongs to (for statistics, logs and profiling labels).
enum class TensorComponent : uint8_t {
  kEmbed,         // embed.weight
  kHead,          // head.weight (shared by the MTP layers)
  kFinalNorm,     // norm.weight, mtp.{i}.norm.weight
  kHcHead,        // hc_head_{fn,base,scale}, also per MTP layer (§5.3)
  kMhc,           // hc_{attn,ffn}_{fn,base,scale} of a block (§5.1)
  kNorm,          // attn_norm, ffn_norm, mtp enorm/hnorm
  kAttention,     // attn.{attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b}
  kCompressor,    // attn.compressor.* (CSA and HCA)
  kIndexer,       // attn.indexer.* including its own compressor (CSA)
  kGate,          // ffn.gate.weight, ffn.gate.bias
  kHashTable,     // ffn.gate.tid2eid: token -> experts, not a parameter (hash layers)
  kRoutedExpert,  // ffn.experts.{e}.*
  kSharedExpert,  // ffn.shared_experts.*
  kMtpProj,       // mtp.{i}.e_proj, mtp.{i}.h_proj
};
inline constexpr int kNumTensorComponents = 14;
const char* tensor_component_name(TensorComponent component);

// How a tensor's bytes are to be read (dsv4-model.md §10, §10.1, §10.3).
enum class QuantRole : uint8_t {
  kPlain,             // BF16/F32/I64 values as stored
  kFp8Weight,         // F8_E4M3 [out, in] with a 128x128 block scale sibling `.scale`
  kFp8Scale,          // F8_E8M0 [ceil(out/128), ceil(in/128)] (power-of-two, multiplied in)
  kFp8ScaleF32,       // F32 [ceil(out/128), ceil(in/128)]: FP8-block experts (expert_dtype fp8)
  kMxfp4Weight,       // I8 [out, in/2], e2m1 low nibble first, with `.scale`
  kMxfp4Scale,        // F8_E8M0 [out, in/32]
  kNvfp4Weight,       // U8 [out, in/2], e2m1 low nibble first, with `.weight_scale(_2)`
  kNvfp4Scale,        // F8_E4M3 [out, in/16]
  kNvfp4GlobalScale,  // F32 [] (weight_scale_2, multiplied in)
  kNvfp4InputScale,   // F32 [] (input_scale, optional; activation calibration, unused)
};
const char* quant_role_name(QuantRole role);

struct TensorSpec {
  std::string name;              // checkpoint key, e.g. "layers.3.attn.wq_b.scale"
  DType dtype = DType::kBF16;    // stored dtype
  std::vector<int64_t> shape;    // stored shape (packed FP4: [out, in/2]); [] for a scalar
  std::vector<int64_t> logical;  // element shape (packed FP4: [out, in]); equals shape otherwise
  TensorComponent component = TensorComponent::kEmbed;
  // -1 for global tensors; l for main layer l; num_hidden_layers + i for MTP layer i (the index
  // into compress_ratios).
  int32_t layer = -1;
  int32_t mtp_index = -1;  // i for `mtp.{i}.*`, -1 otherwise
  int32_t expert = -1;     // e for `ffn.experts.{e}.*`, -1 otherwise
  bool is_scale = false;   // a quantization scale (not a model parameter)
  bool optional = false;   // may be absent (NVFP4 input_scale)
  QuantRole role = QuantRole::kPlain;
  // For a quantized weight, the name of its scale (`.scale` / `.weight_scale`); for a scale, the
  // weight it belongs to. Empty for plain tensors.
  std::string pair;

  bool is_mtp() const { return mtp_index >= 0; }
  // Model parameters are the logical elements of weights; scales and the tid2eid table are not.
  bool is_parameter() const { return !is_scale && component != TensorComponent::kHashTable; }
  int64_t numel() const;          // logical elements
  uint64_t stored_bytes() const;  // product(shape) * dtype_size(dtype)
};

// The expected tensors for `config` in checkpoint order: global tensors, then layers 0..L-1, then
// the MTP layers. Every FP8 weight is directly followed by its scale, every FP4 weight by its
// scale(s). `config` must have passed validate_config().
std::vector<TensorSpec> expected_tensors(const DeepSeekV4Config& config);

// Names a checkpoint may contain that the engine does not read and that are therefore not an
// "unexpected tensor" error (reliability.md rule 20): `mtp.{i}.emb.*` and `mtp.{i}.head.*`
// (embed and head are shared with the main model; REF convert.py drops them, SGL maps them if
// present, §10).
inline constexpr std::string_view kIgnoredTensorPatterns[] = {"mtp.{i}.emb.*", "mtp.{i}.head.*"};
bool is_ignored_tensor(std::string_view name);

// name -> index into `specs`.
std::unordered_map<std::string, size_t> index_tensor_specs(const std::vector<TensorSpec>& specs);

// "layers.3.attn.wq_b.scale F8_E8M0[256, 8]" (+ " logical [..]" for packed FP4).
std::string describe(const TensorSpec& spec);
// "[256, 8]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace ds
