// Tensor/expert-parallel sharding of DeepSeek-V4 weights (see sharding.h).
#include "model/deepseek_v4/sharding.h"

#include <cstring>
#include <regex>
#include <vector>


namespace ds::dsv4 {

const char* shard_rule_name(ShardRule rule) {
  switch (rule) {
    case ShardRule::kReplicated: return "replicated";
    case ShardRule::kHeadRows: return "rows by head";
    case ShardRule::kGroupRows: return "rows by output group";
    case ShardRule::kInputColumns: return "input columns by output group";
    case ShardRule::kSharedRows: return "shared expert rows";
    case ShardRule::kSharedColumns: return "shared expert input columns";
    case ShardRule::kExpert: return "expert parallel";
  }
  return "?";
}

Result<ShardRule> shard_rule(std::string_view name) {
  // <prefix>.<rest> where prefix is "layers.<n>" or "mtp.<n>", or a top-level tensor.
  static const std::regex kTop(
      R"((embed\.weight|head\.weight|norm\.weight|hc_head_(fn|base|scale)))");
  static const std::regex kBlock(R"((layers|mtp)\.\d+\.(.+))");
  std::cmatch m;
  const std::string s(name);
  if (std::regex_match(s.c_str(), m, kTop)) return ShardRule::kReplicated;
  if (!std::regex_match(s.c_str(), m, kBlock)) {
    return invalid_argument("sharding: '" + s + "' is not a DeepSeek-V4 tensor");
  }
  const std::string rest = m[2].str();
  static const std::regex kHead(R"(attn\.wq_b\.(weight|scale)|attn\.attn_sink)");
  static const std::regex kGroupRows(R"(attn\.wo_a\.(weight|scale))");
  static const std::regex kColumns(R"(attn\.wo_b\.(weight|scale))");
  static const std::regex kSharedRows(R"(ffn\.shared_experts\.w[13]\.(weight|scale))");
  static const std::regex kSharedCols(R"(ffn\.shared_experts\.w2\.(weight|scale))");
  static const std::regex kExpert(R"(ffn\.experts\.\d+\.w[123]\.(weight|scale))");
  static const std::regex kReplicatedBlock(
      R"((attn\.(wq_a|wkv)\.(weight|scale))|(attn\.(q_norm|kv_norm)\.weight)|)"
      R"((attn\.(indexer\.)?compressor\.(ape|norm\.weight|wgate\.weight|wkv\.weight))|)"
      R"((attn\.indexer\.(weights_proj\.weight|wq_b\.(weight|scale)))|)"
      R"(((attn_norm|ffn_norm|enorm|hnorm|norm)\.weight)|(hc_(attn|ffn|head)_(fn|base|scale))|)"
      R"((ffn\.gate\.(weight|bias|tid2eid))|((e_proj|h_proj)\.(weight|scale))|)"
      R"(((emb|head)\.(weight)))");
  if (std::regex_match(rest, kHead)) return ShardRule::kHeadRows;
  if (std::regex_match(rest, kGroupRows)) return ShardRule::kGroupRows;
  if (std::regex_match(rest, kColumns)) return ShardRule::kInputColumns;
  if (std::regex_match(rest, kSharedRows)) return ShardRule::kSharedRows;
  if (std::regex_match(rest, kSharedCols)) return ShardRule::kSharedColumns;
  if (std::regex_match(rest, kExpert)) return ShardRule::kExpert;
  if (std::regex_match(rest, kReplicatedBlock)) return ShardRule::kReplicated;
  return invalid_argument("sharding: '" + s + "' is not a DeepSeek-V4 tensor");
}

namespace {

constexpr int64_t kBlock = cpu::kFp8WeightBlock;

bool shared_expert_splits(const DeepSeekV4Config& c, const ShardSpec& spec) {
  const int64_t inter = c.moe_intermediate_size * c.n_shared_experts;
  return spec.tensor_parallel && spec.split_shared_expert && spec.world_size > 1 &&
         inter % (spec.world_size * kBlock) == 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Columns [k0, k0 + kn) of W as a copy owned by `owner` (FP8 blocks must stay whole).
Result<cpu::LinearWeight> slice_columns(const cpu::LinearWeight& w, int64_t k0, int64_t kn,
                                        ModelWeights* owner) {
  cpu::LinearWeight s = w;
  s.in_features = kn;
  const int64_t n = w.out_features, k = w.in_features;
  auto copy_rows = [&](const uint8_t* src, int64_t row_bytes, int64_t rows, int64_t off,
                       int64_t len) {
    std::vector<uint8_t> out(size_t(rows * len));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(out.data() + r * len, src + r * row_bytes + off, size_t(len));
    }
    return owner->own_bytes(std::move(out));
  };
  switch (w.format) {
    case cpu::WeightFormat::kFp8Block: {
      if (k0 % kBlock != 0 || (kn % kBlock != 0 && k0 + kn != k)) {
        return invalid_argument("sharding: an FP8 column slice must keep 128-column blocks whole");
      }
      const int64_t kb = ceil_div(k, kBlock), nb = ceil_div(n, kBlock);
      s.data = copy_rows(static_cast<const uint8_t*>(w.data), k, n, k0, kn);
      s.scale = static_cast<const uint8_t*>(
          copy_rows(w.scale, kb, nb, k0 / kBlock, ceil_div(kn, kBlock)));
      return s;
    }
    case cpu::WeightFormat::kBF16:
      s.data = copy_rows(static_cast<const uint8_t*>(w.data), k * 2, n, k0 * 2, kn * 2);
      return s;
    case cpu::WeightFormat::kF32:
      s.data = copy_rows(static_cast<const uint8_t*>(w.data), k * 4, n, k0 * 4, kn * 4);
      return s;
    default:
      return invalid_argument("sharding: column slices of packed FP4 weights are not supported");
  }
}

}  // namespace

Status check_shardable(const DeepSeekV4Config& c, const ShardSpec& spec) {
  const int64_t w = spec.world_size;
  if (w < 1 || spec.rank < 0 || spec.rank >= w) {
    return invalid_argument("sharding: rank " + std::to_string(spec.rank) +
                            " is outside a world of " + std::to_string(w));
  }
  if (w == 1) return ok_status();
  if (spec.tensor_parallel) {
    if (c.num_attention_heads % w != 0 || c.o_groups % w != 0) {
      return invalid_argument("sharding: num_attention_heads = " +
                              std::to_string(c.num_attention_heads) + " and o_groups = " +
                              std::to_string(c.o_groups) + " must both divide by " +
                              std::to_string(w) + " ranks");
    }
    if ((c.num_attention_heads / w) * c.head_dim % kBlock != 0 ||
        (c.o_groups / w) * c.o_lora_rank % kBlock != 0) {
      return invalid_argument(
          "sharding: a rank's heads (head_dim) and output groups (o_lora_rank) must span whole "
          "128-row FP8 blocks");
    }
  }
  if (spec.expert_parallel && c.n_routed_experts % w != 0) {
    return invalid_argument("sharding: n_routed_experts = " + std::to_string(c.n_routed_experts) +
                            " must divide by " + std::to_string(w) + " ranks");
  }
  return ok_status();
}

Result<std::unique_ptr<ModelWeights>> shard_model(const ModelWeights& full, const ShardSpec& spec) {
  const DeepSeekV4Config& c = full.config();
  DS_RETURN_IF_ERROR(check_shardable(c, spec));
  const int64_t w = spec.world_size, r = spec.rank;
  const bool tp = spec.tensor_parallel && w > 1;
  DeepSeekV4Config local = c;
  if (tp) {
    local.num_attention_heads = c.num_attention_heads / w;
    local.o_groups = c.o_groups / w;
  }
  DS_ASSIGN_OR_RETURN(auto model, make_shard_model(full, local));
  ModelWeights* m = model.get();

  ShardInfo info;
  info.world_size = spec.world_size;
  info.rank = spec.rank;
  info.tensor_parallel = tp;
  if (w > 1) {
    if (spec.expert_parallel) {
      info.expert_begin = r * (c.n_routed_experts / w);
      info.expert_end = (r + 1) * (c.n_routed_experts / w);
    } else {  // every routed expert on rank 0
      info.expert_begin = 0;
      info.expert_end = r == 0 ? c.n_routed_experts : 0;
    }
    info.shared_expert = shared_expert_splits(c, spec) || r == 0;
  }
  m->shard = info;

  const int64_t heads = local.num_attention_heads, hd = c.head_dim;
  const int64_t groups = local.o_groups, rank_rows = groups * c.o_lora_rank;
  const int64_t inter = c.moe_intermediate_size * c.n_shared_experts;
  auto shard_block = [&](LayerWeights& L) -> Status {
    if (tp) {
      L.wq_b = cpu::slice_rows(L.wq_b, r * heads * hd, heads * hd);
      L.attn_sink += r * heads;
      L.wo_a = cpu::slice_rows(L.wo_a, r * rank_rows, rank_rows);
      DS_ASSIGN_OR_RETURN(L.wo_b, slice_columns(L.wo_b, r * rank_rows, rank_rows, m));
    }
    if (shared_expert_splits(c, spec)) {
      const int64_t part = inter / w;
      L.shared.w1 = cpu::slice_rows(L.shared.w1, r * part, part);
      L.shared.w3 = cpu::slice_rows(L.shared.w3, r * part, part);
      DS_ASSIGN_OR_RETURN(L.shared.w2, slice_columns(L.shared.w2, r * part, part, m));
    }
    return ok_status();
  };
  for (LayerWeights& L : m->layers) DS_RETURN_IF_ERROR(shard_block(L));
  for (MtpWeights& M : m->mtp) DS_RETURN_IF_ERROR(shard_block(M.block));
  return model;
}

}  // namespace ds::dsv4
