// Tensor and expert parallelism for DeepSeek-V4 (issue "Multi-GPU"): which part of every
// checkpoint tensor a rank holds, and the rank-local model the forward runs on each rank.
//
// Rules (one per tensor, shard_rule()):
// - attention, tensor parallel over heads: wq_b rows and attn_sink by head; wo_a rows by output
//   group (a group's heads live on one rank); wo_b by input columns (each rank multiplies its
//   groups' part; the partial outputs are summed by an all-reduce).
// - shared expert, tensor parallel over the intermediate dimension: w1/w3 rows, w2 input columns
//   (partial outputs summed) - when the intermediate size splits on FP8 128-blocks, else the whole
//   shared expert runs on rank 0.
// - routed experts, expert parallel: rank r runs experts [r*E/W, (r+1)*E/W); the MoE output is
//   summed over the ranks with the same all-reduce as the shared expert's.
// - everything else is replicated: embedding, head, norms, mHC, wq_a, wkv, compressors, indexer,
//   router (gate, bias, tid2eid), MTP projections. Replicated work gives every rank the same bits
//   (the all-reduce sums in rank order), so per-sequence state (window ring, compressed entries,
//   indexer keys) stays identical on every rank.
// Only two all-reduces per block: after wo_b and after the MoE. With tensor parallelism off the
// attention is replicated; with expert parallelism off every routed expert runs on rank 0.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "model/deepseek_v4/weights.h"

namespace ds::dsv4 {

struct ShardSpec {
  int world_size = 1;
  int rank = 0;
  bool tensor_parallel = true;  // attention heads and the shared expert split across the ranks
  bool expert_parallel = true;  // routed experts split across the ranks
  // With tensor_parallel: the shared expert's intermediate rows split across the ranks too;
  // false runs it whole on rank 0 (the CUDA MoE kernels need the shared expert as wide as the
  // routed experts: model_runner.cpp).
  bool split_shared_expert = true;
};

enum class ShardRule {
  kReplicated,
  kHeadRows,       // wq_b (.weight/.scale), attn_sink: the rank's heads
  kGroupRows,      // wo_a: the rank's output groups
  kInputColumns,   // wo_b: the columns of the rank's groups
  kSharedRows,     // shared expert w1/w3: the rank's intermediate rows
  kSharedColumns,  // shared expert w2: the rank's intermediate columns
  kExpert,         // routed expert tensors: whole experts, on the rank that owns them
};
const char* shard_rule_name(ShardRule rule);

// The rule for a checkpoint tensor name ("layers.3.attn.wq_b.weight", "mtp.0.ffn.experts.7.w2.scale",
// ...). kInvalidArgument for a name that is not a DeepSeek-V4 tensor.
Result<ShardRule> shard_rule(std::string_view tensor_name);

// Whether `config` splits over `spec` (heads and output groups divisible by the world size with
// the FP8 128-row blocks intact, experts divisible); the message names the field that does not.
Status check_shardable(const DeepSeekV4Config& config, const ShardSpec& spec);

// The rank-local model: its config has num_attention_heads / W heads and o_groups / W groups
// (tensor parallel), its views point into `full` (which must outlive it) or into copies it owns
// (column slices), and ModelWeights::shard says which experts and which shared-expert part it runs.
Result<std::unique_ptr<ModelWeights>> shard_model(const ModelWeights& full, const ShardSpec& spec);

}  // namespace ds::dsv4
