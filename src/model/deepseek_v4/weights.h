// DeepSeek-V4 weights bound to kernel views (dsv4-model.md §10): every checkpoint tensor is looked
// up by its checkpoint name and wrapped, without copying, in the view the CPU reference kernels
// take (cpu::LinearWeight over the mapped FP8 / MXFP4 / NVFP4 / bf16 bytes, raw fp32 pointers for
// the mHC and compressor parameters). Only small tensors are converted into owned fp32/int32
// copies: the bf16 norm weights (the kernels take fp32 norm weights), the tid2eid tables (int64 in
// the file, int32 in the router) and any fp32/bf16 tensor whose mapped address is not aligned for
// its type (safetensors only guarantees byte alignment). The mapping stays alive as long as the
// ModelWeights that owns the Checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/compressor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace ds::dsv4 {

// One KV compressor (§7.6): `attn.compressor.*` or `attn.indexer.compressor.*`.
struct CompressorWeights {
  cpu::CompressorConfig config;  // ratio, head_dim d, rope_dim
  cpu::LinearWeight wkv;         // [coff * d, hidden] bf16
  cpu::LinearWeight wgate;       // [coff * d, hidden] bf16
  const float* ape = nullptr;    // [ratio, coff * d] fp32
  std::vector<float> norm;       // [d] (norm.weight as fp32)
};

// One decoder block (a main layer or an MTP layer's block), §6-§8.
struct LayerWeights {
  int64_t index = 0;  // index into compress_ratios (MTP layer j: num_hidden_layers + j)
  LayerKind kind = LayerKind::kSwa;
  int64_t compress_ratio = 0;  // 0, 4 or 128
  bool hash_routing = false;   // ffn.gate.tid2eid instead of ffn.gate.bias

  cpu::MhcSiteWeights hc_attn{};  // fn [24, hc*D], base [24], scale [3]
  cpu::MhcSiteWeights hc_ffn{};
  std::vector<float> attn_norm;  // [D]
  std::vector<float> ffn_norm;   // [D]

  // Attention (§7.1, §7.2, §7.5, §7.8).
  const float* attn_sink = nullptr;  // [num_heads]
  cpu::LinearWeight wq_a;            // [q_lora_rank, D] FP8
  std::vector<float> q_norm;         // [q_lora_rank]
  cpu::LinearWeight wq_b;            // [num_heads * head_dim, q_lora_rank] FP8
  cpu::LinearWeight wkv;             // [head_dim, D] FP8
  std::vector<float> kv_norm;        // [head_dim]
  cpu::LinearWeight wo_a;            // [o_groups * o_lora_rank, num_heads * head_dim / o_groups]
  cpu::LinearWeight wo_b;            // [D, o_groups * o_lora_rank] FP8
  std::vector<float> inv_freq;       // [rope_dim / 2], this layer's RoPE table (§7.3)

  // CSA / HCA: the attention compressor (d = head_dim).
  CompressorWeights compressor;
  // CSA only: the lightning indexer (§7.7).
  CompressorWeights indexer_compressor;    // d = index_head_dim
  cpu::LinearWeight indexer_wq_b;          // [index_n_heads * index_head_dim, q_lora_rank] FP8
  cpu::LinearWeight indexer_weights_proj;  // [index_n_heads, D] bf16

  // MoE (§8).
  cpu::LinearWeight gate;                   // [n_routed_experts, D] bf16
  const float* gate_bias = nullptr;         // [n_routed_experts], learned layers only
  std::vector<int32_t> tid2eid;             // [vocab_size, topk], hash layers only
  std::vector<cpu::ExpertWeights> experts;  // [n_routed_experts]
  cpu::ExpertWeights shared{};
};

// The MTP (NextN) layer (§9): its block plus the input projections and its own head collapse.
struct MtpWeights {
  LayerWeights block;
  cpu::LinearWeight e_proj;       // [D, D] FP8
  cpu::LinearWeight h_proj;       // [D, D] FP8
  std::vector<float> enorm;       // [D]
  std::vector<float> hnorm;       // [D]
  std::vector<float> norm;        // [D]
  cpu::MhcHeadWeights hc_head{};  // fn [hc, hc*D], base [hc], scale [1]
};

// What part of a tensor/expert-parallel model a ModelWeights holds (sharding.h). The defaults are
// the whole model on one rank.
struct ShardInfo {
  int world_size = 1;
  int rank = 0;
  bool tensor_parallel = false;  // attention split by heads: all-reduce after wo_b
  int64_t expert_begin = 0;      // routed experts run here: [expert_begin, expert_end)
  int64_t expert_end = -1;       // -1 = all
  bool shared_expert = true;     // this rank runs (its part of) the shared expert
  // The MoE output is a partial sum to be all-reduced (world_size > 1).
  bool moe_partial() const { return world_size > 1; }
};

// The whole model. Movable, not copyable (the views point into `checkpoint`'s mappings and into
// `owned_`).
class ModelWeights {
 public:
  // Opens `dir` (open_checkpoint: validated config and shards) and binds every tensor.
  static Result<std::unique_ptr<ModelWeights>> load(const std::string& dir);

  const DeepSeekV4Config& config() const { return checkpoint_.config; }
  ShardInfo shard;  // set by shard_model()
  // Keeps `bytes` alive as long as this model (tensors built at load: sharding's column slices).
  const void* own_bytes(std::vector<uint8_t> bytes);

  cpu::LinearWeight embed;           // [vocab, D] bf16 (rows are gathered, never multiplied)
  cpu::LinearWeight head;            // [vocab, D] bf16 (shared with the MTP layers)
  std::vector<float> norm;           // [D]
  cpu::MhcHeadWeights hc_head{};     // fn [hc, hc*D], base [hc], scale [1]
  std::vector<LayerWeights> layers;  // [num_hidden_layers]
  std::vector<MtpWeights> mtp;       // [num_nextn_predict_layers]

 private:
  friend class WeightBinder;
  friend Result<std::unique_ptr<ModelWeights>> make_shard_model(const ModelWeights& full,
                                                                 const DeepSeekV4Config& config);

  Checkpoint checkpoint_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned_;  // realigned copies
};

// For sharding.cpp: a ModelWeights with `config` whose views are copies of `full`'s.
Result<std::unique_ptr<ModelWeights>> make_shard_model(const ModelWeights& full,
                                                       const DeepSeekV4Config& config);

}  // namespace ds::dsv4
