// config.json parsing, validation, presets and writing for DeepSeek-V4 (dsv4-model.md §3, §14;
// reliability.md WF11, rule 24). The parser reads only the fields the engine uses; each one is
// type-checked (integers must be JSON integers, floats finite), range-checked, and then the
// relations between fields are checked by validate_config(). nlohmann accesses are guarded by
// type checks, and the whole parse is wrapped so that no exception escapes.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/json.h"
#include "model/tensor_spec.h"

namespace ds {

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwa:
      return "SWA";
    case LayerKind::kCsa:
      return "CSA";
    case LayerKind::kHca:
      return "HCA";
  }
  return "?";
}

const char* expert_format_name(ExpertFormat format) {
  switch (format) {
    case ExpertFormat::kMxfp4:
      return "mxfp4";
    case ExpertFormat::kFp8Block:
      return "fp8-block";
    case ExpertFormat::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

LayerKind DeepSeekV4Config::layer_kind(int64_t i) const {
  if (i < 0 || size_t(i) >= compress_ratios.size()) return LayerKind::kSwa;
  switch (compress_ratios[size_t(i)]) {
    case 4:
      return LayerKind::kCsa;
    case 128:
      return LayerKind::kHca;
    default:
      return LayerKind::kSwa;
  }
}

namespace {

// Error helpers: every message is `<what>: field "<name>": <detail>`.
Status field_error(std::string_view what, std::string_view field, const std::string& detail,
                   StatusCode code = StatusCode::kInvalidArgument) {
  return Status(code, std::string(what) + ": field \"" + std::string(field) + "\": " + detail);
}

std::string json_type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_number_float()) return "a non-integer number";
  if (v.is_number()) return "an integer";
  return "an unsupported value";
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// Reads fields of one JSON object; `prefix` is the dotted path of the object ("" for the root).
class FieldReader {
 public:
  FieldReader(const Json& obj, std::string_view what, std::string prefix)
      : obj_(obj), what_(what), prefix_(std::move(prefix)) {}

  std::string path(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }

  const Json* find(std::string_view key) const {
    auto it = obj_.find(std::string(key));
    return it == obj_.end() ? nullptr : &*it;
  }

  Status missing(std::string_view key) const {
    return field_error(what_, path(key), "missing (required)");
  }

  // An integer in [min, max]. JSON floats (1.5, 1e3, 4096.0) are refused: rule 24.
  Result<int64_t> get_int(std::string_view key, int64_t min, int64_t max) const {
    const Json* v = find(key);
    if (!v) return missing(key);
    return to_int(*v, path(key), min, max);
  }
  Result<int64_t> get_int_or(std::string_view key, int64_t dflt, int64_t min, int64_t max) const {
    const Json* v = find(key);
    if (!v) return dflt;
    return to_int(*v, path(key), min, max);
  }

  Result<int64_t> to_int(const Json& v, const std::string& name, int64_t min, int64_t max) const {
    int64_t value;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max()))
        return field_error(what_, name,
                           std::to_string(u) + " is out of range [" + std::to_string(min) + ", " +
                               std::to_string(max) + "]");
      value = int64_t(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      return field_error(what_, name, "must be an integer, got " + fmt_double(v.get<double>()));
    } else {
      return field_error(what_, name, "must be an integer, got " + json_type_name(v));
    }
    if (value < min || value > max) {
      std::string detail = std::to_string(value) + " is out of range [" + std::to_string(min) +
                           ", " + std::to_string(max) + "]";
      if (value <= 0 && min > 0)
        detail = "must be positive, got " + std::to_string(value);
      else if (value < 0 && min == 0)
        detail = "must not be negative, got " + std::to_string(value);
      return field_error(what_, name, detail, StatusCode::kOutOfRange);
    }
    return value;
  }

  // A finite number; with `positive`, it must be > 0.
  Result<double> get_number(std::string_view key, bool positive) const {
    const Json* v = find(key);
    if (!v) return missing(key);
    return to_number(*v, path(key), positive);
  }

  Result<double> to_number(const Json& v, const std::string& name, bool positive) const {
    if (!v.is_number())
      return field_error(what_, name, "must be a number, got " + json_type_name(v));
    double d = v.get<double>();
    if (!std::isfinite(d)) return field_error(what_, name, "must be a finite number");
    if (positive && !(d > 0.0))
      return field_error(what_, name, "must be positive, got " + fmt_double(d),
                         StatusCode::kOutOfRange);
    return d;
  }

  Result<bool> get_bool_or(std::string_view key, bool dflt) const {
    const Json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean())
      return field_error(what_, path(key), "must be true or false, got " + json_type_name(*v));
    return v->get<bool>();
  }

  Result<std::string> get_string(std::string_view key) const {
    const Json* v = find(key);
    if (!v) return missing(key);
    return to_string(*v, path(key));
  }
  Result<std::string> get_string_or(std::string_view key, std::string_view dflt) const {
    const Json* v = find(key);
    if (!v) return std::string(dflt);
    return to_string(*v, path(key));
  }
  Result<std::string> to_string(const Json& v, const std::string& name) const {
    if (!v.is_string())
      return field_error(what_, name, "must be a string, got " + json_type_name(v));
    return v.get<std::string>();
  }

  // A string that must be one of `allowed` (the only values deepserve implements).
  Status check_one_of(std::string_view key, const std::string& value,
                      std::initializer_list<std::string_view> allowed) const {
    for (auto a : allowed)
      if (value == a) return ok_status();
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
    std::string shown = value.substr(0, 64);
    return field_error(what_, path(key),
                       "\"" + shown + "\" is not supported (expected " + list + ")",
                       StatusCode::kUnimplemented);
  }

  const Json& obj() const { return obj_; }

 private:
  const Json& obj_;
  std::string_view what_;
  std::string prefix_;
};

Result<DeepSeekV4Config> parse_object(const Json& root, std::string_view what) {
  if (!root.is_object()) return invalid_argument(std::string(what) + ": not a JSON object");
  FieldReader r(root, what, "");
  DeepSeekV4Config c;

  // Sizes: positive, bounded. Counts that may be zero say so.
  DS_ASSIGN_OR_RETURN(c.vocab_size, r.get_int("vocab_size", 1, kMaxVocabSize));
  DS_ASSIGN_OR_RETURN(c.hidden_size, r.get_int("hidden_size", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.num_hidden_layers, r.get_int("num_hidden_layers", 1, kMaxLayers));
  DS_ASSIGN_OR_RETURN(c.num_nextn_predict_layers,
                      r.get_int("num_nextn_predict_layers", 0, kMaxNextnLayers));
  DS_ASSIGN_OR_RETURN(c.num_attention_heads, r.get_int("num_attention_heads", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.num_key_value_heads, r.get_int("num_key_value_heads", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.head_dim, r.get_int("head_dim", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.qk_rope_head_dim, r.get_int("qk_rope_head_dim", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.q_lora_rank, r.get_int("q_lora_rank", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.o_groups, r.get_int("o_groups", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.o_lora_rank, r.get_int("o_lora_rank", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.sliding_window, r.get_int("sliding_window", 1, kMaxConfigDim));

  // compress_ratios: an array of integers; the length and values are checked in
  // validate_config() against the layer counts.
  {
    const Json* v = r.find("compress_ratios");
    if (!v) return r.missing("compress_ratios");
    if (!v->is_array())
      return field_error(what, "compress_ratios", "must be an array, got " + json_type_name(*v));
    if (v->size() > size_t(kMaxLayers + kMaxNextnLayers))
      return field_error(what, "compress_ratios",
                         "has " + std::to_string(v->size()) + " entries, more than the supported " +
                             std::to_string(kMaxLayers + kMaxNextnLayers));
    for (size_t i = 0; i < v->size(); ++i) {
      DS_ASSIGN_OR_RETURN(
          int64_t ratio,
          r.to_int((*v)[i], "compress_ratios[" + std::to_string(i) + "]", 0, 1 << 20));
      c.compress_ratios.push_back(int(ratio));
    }
  }

  DS_ASSIGN_OR_RETURN(c.rope_theta, r.get_number("rope_theta", true));
  DS_ASSIGN_OR_RETURN(c.compress_rope_theta, r.get_number("compress_rope_theta", true));
  {
    const Json* v = r.find("rope_scaling");
    if (!v) return r.missing("rope_scaling");
    if (!v->is_object())
      return field_error(what, "rope_scaling", "must be an object, got " + json_type_name(*v));
    FieldReader rs(*v, what, "rope_scaling");
    // HF writes `type` (older) or `rope_type` (newer); accept either, require agreement.
    const Json* type = rs.find("type");
    const Json* rope_type = rs.find("rope_type");
    if (!type && !rope_type) return rs.missing("type");
    std::string type_value;
    if (type) {
      DS_ASSIGN_OR_RETURN(type_value, rs.to_string(*type, rs.path("type")));
      DS_RETURN_IF_ERROR(rs.check_one_of("type", type_value, {"yarn"}));
    }
    if (rope_type) {
      DS_ASSIGN_OR_RETURN(std::string rt, rs.to_string(*rope_type, rs.path("rope_type")));
      DS_RETURN_IF_ERROR(rs.check_one_of("rope_type", rt, {"yarn"}));
    }
    DS_ASSIGN_OR_RETURN(c.rope_factor, rs.get_number("factor", true));
    DS_ASSIGN_OR_RETURN(c.rope_original_max_position_embeddings,
                        rs.get_int("original_max_position_embeddings", 1, kMaxPositions));
    DS_ASSIGN_OR_RETURN(c.rope_beta_fast, rs.get_number("beta_fast", true));
    DS_ASSIGN_OR_RETURN(c.rope_beta_slow, rs.get_number("beta_slow", true));
  }
  DS_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      r.get_int("max_position_embeddings", 1, kMaxPositions));

  DS_ASSIGN_OR_RETURN(c.index_n_heads, r.get_int("index_n_heads", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.index_head_dim, r.get_int("index_head_dim", 1, kMaxConfigDim));
  DS_ASSIGN_OR_RETURN(c.index_topk, r.get_int("index_topk", 1, kMaxPositions));

  DS_ASSIGN_OR_RETURN(c.n_routed_experts, r.get_int("n_routed_experts", 1, kMaxRoutedExperts));
  DS_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                      r.get_int("num_experts_per_tok", 1, kMaxRoutedExperts));
  DS_ASSIGN_OR_RETURN(c.n_shared_experts, r.get_int("n_shared_experts", 0, 64));
  DS_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                      r.get_int("moe_intermediate_size", 1, kMaxConfigDim));
  // Fields that only restate what the engine implements are optional (the §14 tiny config omits
  // them) but must name the implemented variant when present.
  DS_ASSIGN_OR_RETURN(c.scoring_func, r.get_string_or("scoring_func", "sqrtsoftplus"));
  DS_RETURN_IF_ERROR(r.check_one_of("scoring_func", c.scoring_func, {"sqrtsoftplus"}));
  DS_ASSIGN_OR_RETURN(c.topk_method, r.get_string_or("topk_method", "noaux_tc"));
  DS_RETURN_IF_ERROR(r.check_one_of("topk_method", c.topk_method, {"noaux_tc"}));
  DS_ASSIGN_OR_RETURN(c.norm_topk_prob, r.get_bool_or("norm_topk_prob", true));
  DS_ASSIGN_OR_RETURN(c.routed_scaling_factor, r.get_number("routed_scaling_factor", true));
  DS_ASSIGN_OR_RETURN(c.num_hash_layers, r.get_int("num_hash_layers", 0, kMaxLayers));
  DS_ASSIGN_OR_RETURN(c.swiglu_limit, r.get_number("swiglu_limit", true));

  DS_ASSIGN_OR_RETURN(c.hc_mult, r.get_int("hc_mult", 1, kMaxHcMult));
  DS_ASSIGN_OR_RETURN(c.hc_sinkhorn_iters, r.get_int("hc_sinkhorn_iters", 1, kMaxSinkhornIters));
  DS_ASSIGN_OR_RETURN(c.hc_eps, r.get_number("hc_eps", true));

  DS_ASSIGN_OR_RETURN(c.rms_norm_eps, r.get_number("rms_norm_eps", true));
  DS_ASSIGN_OR_RETURN(c.hidden_act, r.get_string_or("hidden_act", "silu"));
  DS_RETURN_IF_ERROR(r.check_one_of("hidden_act", c.hidden_act, {"silu"}));
  DS_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.get_bool_or("tie_word_embeddings", false));
  DS_ASSIGN_OR_RETURN(c.bos_token_id, r.get_int("bos_token_id", 0, kMaxVocabSize));
  DS_ASSIGN_OR_RETURN(c.eos_token_id, r.get_int("eos_token_id", 0, kMaxVocabSize));
  DS_ASSIGN_OR_RETURN(c.torch_dtype, r.get_string_or("torch_dtype", "bfloat16"));
  DS_RETURN_IF_ERROR(r.check_one_of("torch_dtype", c.torch_dtype, {"bfloat16"}));

  // quantization_config (§10): required, FP8 e4m3 with ue8m0 128x128 block scales.
  std::string expert_dtype;  // "" when given nowhere
  {
    const Json* v = r.find("quantization_config");
    if (!v) return r.missing("quantization_config");
    if (!v->is_object())
      return field_error(what, "quantization_config",
                         "must be an object, got " + json_type_name(*v));
    FieldReader q(*v, what, "quantization_config");
    DS_ASSIGN_OR_RETURN(c.quant_method, q.get_string("quant_method"));
    DS_RETURN_IF_ERROR(q.check_one_of("quant_method", c.quant_method, {"fp8"}));
    DS_ASSIGN_OR_RETURN(c.quant_fmt, q.get_string("fmt"));
    DS_RETURN_IF_ERROR(q.check_one_of("fmt", c.quant_fmt, {"e4m3"}));
    DS_ASSIGN_OR_RETURN(c.quant_scale_fmt, q.get_string("scale_fmt"));
    DS_RETURN_IF_ERROR(q.check_one_of("scale_fmt", c.quant_scale_fmt, {"ue8m0"}));
    DS_ASSIGN_OR_RETURN(c.activation_scheme, q.get_string("activation_scheme"));
    DS_RETURN_IF_ERROR(q.check_one_of("activation_scheme", c.activation_scheme, {"dynamic"}));
    const Json* bs = q.find("weight_block_size");
    if (!bs) return q.missing("weight_block_size");
    if (!bs->is_array() || bs->size() != 2)
      return field_error(
          what, "quantization_config.weight_block_size",
          "must be an array of two integers, got " + json_type_name(*bs) +
              (bs->is_array() ? " of " + std::to_string(bs->size()) + " entries" : std::string()));
    DS_ASSIGN_OR_RETURN(c.weight_block_rows,
                        q.to_int((*bs)[0], "quantization_config.weight_block_size[0]", 1, 1 << 20));
    DS_ASSIGN_OR_RETURN(c.weight_block_cols,
                        q.to_int((*bs)[1], "quantization_config.weight_block_size[1]", 1, 1 << 20));
    if (c.weight_block_rows != 128 || c.weight_block_cols != 128)
      return field_error(what, "quantization_config.weight_block_size",
                         "[" + std::to_string(c.weight_block_rows) + ", " +
                             std::to_string(c.weight_block_cols) +
                             "] is not supported (expected [128, 128])",
                         StatusCode::kUnimplemented);
    if (const Json* ed = q.find("expert_dtype")) {
      DS_ASSIGN_OR_RETURN(expert_dtype, q.to_string(*ed, q.path("expert_dtype")));
      DS_RETURN_IF_ERROR(q.check_one_of("expert_dtype", expert_dtype, {"fp4", "fp8"}));
    }
    // NVFP4 checkpoints (ModelOpt, §10.3) keep the fields above and add quant_algo.
    if (const Json* qa = q.find("quant_algo")) {
      DS_ASSIGN_OR_RETURN(std::string algo, q.to_string(*qa, q.path("quant_algo")));
      DS_RETURN_IF_ERROR(q.check_one_of("quant_algo", algo, {"MIXED_PRECISION"}));
      c.expert_format = ExpertFormat::kNvfp4;
    }
  }
  if (const Json* ed = r.find("expert_dtype")) {
    DS_ASSIGN_OR_RETURN(std::string top, r.to_string(*ed, "expert_dtype"));
    DS_RETURN_IF_ERROR(r.check_one_of("expert_dtype", top, {"fp4", "fp8"}));
    if (!expert_dtype.empty() && expert_dtype != top)
      return field_error(
          what, "expert_dtype",
          "\"" + top + "\" contradicts quantization_config.expert_dtype \"" + expert_dtype + "\"");
    expert_dtype = top;
  }
  if (c.expert_format == ExpertFormat::kNvfp4) {
    if (expert_dtype == "fp8")
      return field_error(what, "expert_dtype",
                         "\"fp8\" contradicts quantization_config.quant_algo \"MIXED_PRECISION\" "
                         "(NVFP4 experts)");
  } else {
    c.expert_format = expert_dtype == "fp8" ? ExpertFormat::kFp8Block : ExpertFormat::kMxfp4;
  }

  DS_RETURN_IF_ERROR(validate_config(c, what));
  return c;
}

bool is_power_of_two(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

}  // namespace

Status validate_config(const DeepSeekV4Config& c, std::string_view what) {
  auto err = [&](std::string_view field, const std::string& detail,
                 StatusCode code = StatusCode::kInvalidArgument) {
    return field_error(what, field, detail, code);
  };
  auto s = [](int64_t v) { return std::to_string(v); };
  // Ranges (repeated here for hand-built configs; the parser already bounded them).
  struct Bound {
    const char* name;
    int64_t value, min, max;
  };
  const Bound bounds[] = {
      {"vocab_size", c.vocab_size, 1, kMaxVocabSize},
      {"hidden_size", c.hidden_size, 1, kMaxConfigDim},
      {"num_hidden_layers", c.num_hidden_layers, 1, kMaxLayers},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers, 0, kMaxNextnLayers},
      {"num_attention_heads", c.num_attention_heads, 1, kMaxConfigDim},
      {"num_key_value_heads", c.num_key_value_heads, 1, kMaxConfigDim},
      {"head_dim", c.head_dim, 1, kMaxConfigDim},
      {"qk_rope_head_dim", c.qk_rope_head_dim, 1, kMaxConfigDim},
      {"q_lora_rank", c.q_lora_rank, 1, kMaxConfigDim},
      {"o_groups", c.o_groups, 1, kMaxConfigDim},
      {"o_lora_rank", c.o_lora_rank, 1, kMaxConfigDim},
      {"sliding_window", c.sliding_window, 1, kMaxConfigDim},
      {"rope_scaling.original_max_position_embeddings", c.rope_original_max_position_embeddings, 1,
       kMaxPositions},
      {"max_position_embeddings", c.max_position_embeddings, 1, kMaxPositions},
      {"index_n_heads", c.index_n_heads, 1, kMaxConfigDim},
      {"index_head_dim", c.index_head_dim, 1, kMaxConfigDim},
      {"index_topk", c.index_topk, 1, kMaxPositions},
      {"n_routed_experts", c.n_routed_experts, 1, kMaxRoutedExperts},
      {"num_experts_per_tok", c.num_experts_per_tok, 1, kMaxRoutedExperts},
      {"n_shared_experts", c.n_shared_experts, 0, 64},
      {"moe_intermediate_size", c.moe_intermediate_size, 1, kMaxConfigDim},
      {"num_hash_layers", c.num_hash_layers, 0, kMaxLayers},
      {"hc_mult", c.hc_mult, 1, kMaxHcMult},
      {"hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1, kMaxSinkhornIters},
      {"bos_token_id", c.bos_token_id, 0, kMaxVocabSize},
      {"eos_token_id", c.eos_token_id, 0, kMaxVocabSize},
  };
  for (const auto& b : bounds) {
    if (b.value < b.min || b.value > b.max) {
      std::string detail =
          (b.min > 0 && b.value <= 0) ? "must be positive, got " + s(b.value)
          : (b.value < 0)             ? "must not be negative, got " + s(b.value)
                          : s(b.value) + " is out of range [" + s(b.min) + ", " + s(b.max) + "]";
      return err(b.name, detail, StatusCode::kOutOfRange);
    }
  }
  struct FBound {
    const char* name;
    double value;
  };
  const FBound positive[] = {
      {"rope_theta", c.rope_theta},
      {"compress_rope_theta", c.compress_rope_theta},
      {"rope_scaling.factor", c.rope_factor},
      {"rope_scaling.beta_fast", c.rope_beta_fast},
      {"rope_scaling.beta_slow", c.rope_beta_slow},
      {"routed_scaling_factor", c.routed_scaling_factor},
      {"swiglu_limit", c.swiglu_limit},
      {"hc_eps", c.hc_eps},
      {"rms_norm_eps", c.rms_norm_eps},
  };
  for (const auto& f : positive) {
    if (!std::isfinite(f.value)) return err(f.name, "must be a finite number");
    if (!(f.value > 0.0))
      return err(f.name, "must be positive, got " + fmt_double(f.value), StatusCode::kOutOfRange);
  }

  // Layer schedule (§3).
  const int64_t total = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (int64_t(c.compress_ratios.size()) != total)
    return err("compress_ratios",
               "has " + s(int64_t(c.compress_ratios.size())) +
                   " entries, expected num_hidden_layers + num_nextn_predict_layers = " + s(total));
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128)
      return err("compress_ratios", "entry " + std::to_string(i) + " is " + std::to_string(r) +
                                        ", expected 0 (SWA), 4 (CSA) or 128 (HCA)");
    // The MTP tensor set of §10 is an SWA-only layer (no compressor, no indexer).
    if (int64_t(i) >= c.num_hidden_layers && r != 0)
      return err("compress_ratios",
                 "entry " + std::to_string(i) + " (MTP layer " +
                     s(int64_t(i) - c.num_hidden_layers) + ") is " + std::to_string(r) +
                     ", but MTP layers are sliding-window only (0)",
                 StatusCode::kUnimplemented);
  }
  if (total * c.n_routed_experts > kMaxExpertLayerProduct)
    return err("n_routed_experts",
               "(num_hidden_layers + num_nextn_predict_layers) * n_routed_experts = " +
                   s(total * c.n_routed_experts) + " exceeds the supported " +
                   s(kMaxExpertLayerProduct));

  // Attention geometry (§7).
  if (c.num_key_value_heads != 1)
    return err("num_key_value_heads",
               s(c.num_key_value_heads) +
                   " is not supported (DeepSeek-V4 uses one shared K=V "
                   "vector: 1)",
               StatusCode::kUnimplemented);
  if (c.qk_rope_head_dim >= c.head_dim)
    return err("qk_rope_head_dim",
               s(c.qk_rope_head_dim) + " must be smaller than head_dim = " + s(c.head_dim));
  if (c.qk_rope_head_dim % 2 != 0)
    return err("qk_rope_head_dim",
               s(c.qk_rope_head_dim) + " must be even (interleaved RoPE pairs)");
  // The nope part is FP8-simulated / stored in blocks of 64 (§7.2, §11).
  if (c.nope_head_dim() % 64 != 0)
    return err("head_dim", "head_dim - qk_rope_head_dim = " + s(c.nope_head_dim()) +
                               " is not a multiple of 64 (FP8 KV blocks of 64, §7.2)");
  if (c.num_attention_heads % c.o_groups != 0)
    return err("o_groups", "num_attention_heads = " + s(c.num_attention_heads) +
                               " is not divisible by o_groups = " + s(c.o_groups));
  if (!is_power_of_two(c.index_head_dim))
    return err("index_head_dim",
               s(c.index_head_dim) + " is not a power of two (Hadamard rotation, §7.7)");
  if (c.index_head_dim <= c.qk_rope_head_dim)
    return err("index_head_dim", s(c.index_head_dim) + " must be larger than qk_rope_head_dim = " +
                                     s(c.qk_rope_head_dim) + " (indexer RoPE slice, §7.7)");
  if (c.index_head_dim % 32 != 0)
    return err("index_head_dim",
               s(c.index_head_dim) + " is not a multiple of 32 (FP4 indexer blocks, §7.7)");

  // FP8 linears (§10): every in/out dimension is a multiple of the 128x128 block. One check per
  // field that feeds a dimension: wq_a [q_lora_rank, hidden], wq_b [heads*head_dim, q_lora_rank],
  // wkv [head_dim, hidden], wo_a [o_groups*o_lora_rank, heads*head_dim/o_groups],
  // wo_b [hidden, o_groups*o_lora_rank], indexer.wq_b [index_heads*index_head_dim, q_lora_rank],
  // shared experts [n_shared*inter, hidden] / [hidden, n_shared*inter], mtp e_proj/h_proj
  // [hidden, hidden]. o_lora_rank itself must be a multiple of 128 so that wo_a's row blocks
  // align with its groups (§7.8).
  auto mult128 = [&](std::string_view field, std::string_view expr, int64_t v) -> Status {
    if (v % 128 == 0) return ok_status();
    const std::string what_value = field == expr ? s(v) : std::string(expr) + " = " + s(v);
    return err(field, what_value + " is not a multiple of 128 (FP8 weight blocks of 128x128, §10)");
  };
  DS_RETURN_IF_ERROR(mult128("hidden_size", "hidden_size", c.hidden_size));
  DS_RETURN_IF_ERROR(mult128("q_lora_rank", "q_lora_rank", c.q_lora_rank));
  DS_RETURN_IF_ERROR(mult128("head_dim", "head_dim", c.head_dim));
  DS_RETURN_IF_ERROR(mult128("o_lora_rank", "o_lora_rank", c.o_lora_rank));
  DS_RETURN_IF_ERROR(mult128("o_groups", "num_attention_heads * head_dim / o_groups",
                             c.num_attention_heads * c.head_dim / c.o_groups));
  DS_RETURN_IF_ERROR(mult128("index_n_heads", "index_n_heads * index_head_dim",
                             c.index_n_heads * c.index_head_dim));
  // The expert K dimensions (hidden for w1/w3, moe_intermediate_size for w2) are FP4 blocks of 32
  // (MXFP4) or 16 (NVFP4) and FP8 activation blocks of 128 (§10.2); moe_intermediate_size is also
  // an FP8 dimension of the shared expert and the FP8-block experts.
  if (c.moe_intermediate_size % 32 != 0)
    return err(
        "moe_intermediate_size",
        s(c.moe_intermediate_size) + " is not a multiple of 32 (FP4 expert K blocks of 32, §10.1)");
  DS_RETURN_IF_ERROR(
      mult128("moe_intermediate_size", "moe_intermediate_size", c.moe_intermediate_size));

  // Routing (§8).
  if (c.num_experts_per_tok > c.n_routed_experts)
    return err(
        "num_experts_per_tok",
        s(c.num_experts_per_tok) + " is larger than n_routed_experts = " + s(c.n_routed_experts));
  if (c.num_hash_layers > c.num_hidden_layers)
    return err("num_hash_layers", s(c.num_hash_layers) + " is larger than num_hidden_layers = " +
                                      s(c.num_hidden_layers));

  // Tokens.
  if (c.bos_token_id >= c.vocab_size)
    return err("bos_token_id", s(c.bos_token_id) + " is not below vocab_size = " + s(c.vocab_size));
  if (c.eos_token_id >= c.vocab_size)
    return err("eos_token_id", s(c.eos_token_id) + " is not below vocab_size = " + s(c.vocab_size));
  if (c.tie_word_embeddings)
    return err("tie_word_embeddings",
               "true is not supported (DeepSeek-V4 stores separate embed and head tensors)",
               StatusCode::kUnimplemented);
  // Strings (for hand-built configs; the parser already checked them).
  struct SCheck {
    const char* name;
    const std::string& value;
    const char* expected;
  };
  const SCheck strings[] = {
      {"scoring_func", c.scoring_func, "sqrtsoftplus"},
      {"topk_method", c.topk_method, "noaux_tc"},
      {"hidden_act", c.hidden_act, "silu"},
      {"torch_dtype", c.torch_dtype, "bfloat16"},
      {"quantization_config.quant_method", c.quant_method, "fp8"},
      {"quantization_config.fmt", c.quant_fmt, "e4m3"},
      {"quantization_config.scale_fmt", c.quant_scale_fmt, "ue8m0"},
      {"quantization_config.activation_scheme", c.activation_scheme, "dynamic"},
  };
  for (const auto& sc : strings)
    if (sc.value != sc.expected)
      return err(
          sc.name,
          "\"" + sc.value.substr(0, 64) + "\" is not supported (expected \"" + sc.expected + "\")",
          StatusCode::kUnimplemented);
  if (c.weight_block_rows != 128 || c.weight_block_cols != 128)
    return err("quantization_config.weight_block_size", "must be [128, 128]",
               StatusCode::kUnimplemented);

  // Safety net: derive every quantized linear from the tensor table itself (with one routed
  // expert, whose shapes are those of all of them) and check its block grid, so that a shape added
  // to the table later cannot slip past the per-field checks above.
  DeepSeekV4Config probe = c;
  probe.n_routed_experts = 1;
  probe.num_experts_per_tok = 1;
  for (const TensorSpec& t : expected_tensors(probe)) {
    int64_t row_block = 0, col_block = 0;
    switch (t.role) {
      case QuantRole::kFp8Weight:
        row_block = col_block = 128;
        break;
      case QuantRole::kMxfp4Weight:
        row_block = 1;
        col_block = 32;
        break;
      case QuantRole::kNvfp4Weight:
        row_block = 1;
        col_block = 16;
        break;
      default:
        continue;
    }
    if (t.logical.size() != 2 || t.logical[0] % row_block != 0 || t.logical[1] % col_block != 0)
      return invalid_argument(std::string(what) + ": the config gives tensor " + t.name + " " +
                              shape_to_string(t.logical) + ", which is not made of whole " +
                              std::to_string(row_block) + "x" + std::to_string(col_block) +
                              " quantization blocks (§10)");
  }
  return ok_status();
}

Result<DeepSeekV4Config> parse_config_json(std::string_view text, std::string_view what) {
  try {
    JsonLimits limits;
    limits.max_depth = 16;
    limits.max_values = 4'000'000;
    limits.max_string_bytes = 1 << 20;
    DS_ASSIGN_OR_RETURN(Json root, parse_json_strict(text, limits, what));
    return parse_object(root, what);
  } catch (const std::exception& e) {
    // Unreachable by design (every access is type-checked first); kept so nothing escapes.
    return internal_error(std::string(what) + ": unexpected error while reading: " + e.what());
  } catch (...) {
    return internal_error(std::string(what) + ": unexpected error while reading");
  }
}

Result<DeepSeekV4Config> load_config_file(const std::filesystem::path& path_in) {
  std::error_code ec;
  std::filesystem::path path = path_in;
  if (std::filesystem::is_directory(path, ec)) path /= "config.json";
  const std::string name = path.string();
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return not_found(name + ": cannot read: " + ec.message());
  if (size > kMaxConfigFileBytes)
    return invalid_argument(name + ": " + std::to_string(size) + " bytes, more than the " +
                            std::to_string(kMaxConfigFileBytes) + "-byte limit for config.json");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(name + ": cannot open");
  std::string text(size, '\0');
  in.read(text.data(), std::streamsize(size));
  if (in.gcount() != std::streamsize(size)) return io_error(name + ": short read");
  return parse_config_json(text, name);
}

DeepSeekV4Config tiny_config() {
  DeepSeekV4Config c;
  c.vocab_size = 129280;
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.num_nextn_predict_layers = 1;
  c.compress_ratios = {0, 4, 128, 4, 0};
  c.num_hash_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 128;
  c.sliding_window = 16;
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 8;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 128;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_factor = 16;
  c.rope_original_max_position_embeddings = 65536;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  // §14 gives 4096, below original_max_position_embeddings: YaRN in compressed layers is static
  // (§7.3), so the two are independent and no relation between them is enforced.
  c.max_position_embeddings = 4096;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.tie_word_embeddings = false;
  c.expert_format = ExpertFormat::kMxfp4;
  return c;
}

DeepSeekV4Config flash_config(int num_layers) {
  num_layers = std::clamp(num_layers, 1, int(kMaxLayers));
  DeepSeekV4Config c;
  c.vocab_size = 129280;
  c.hidden_size = 4096;
  c.num_hidden_layers = num_layers;
  c.num_nextn_predict_layers = 1;
  // Flash schedule (§3): [0, 0] + [4, 128] * 20 + [4], then the MTP entry 0.
  for (int i = 0; i < num_layers; ++i)
    c.compress_ratios.push_back(i < 2 ? 0 : (i % 2 == 0 ? 4 : 128));
  c.compress_ratios.push_back(0);
  c.num_attention_heads = 64;
  c.num_key_value_heads = 1;
  c.head_dim = 512;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.compress_rope_theta = 160000;
  c.rope_theta = 10000;
  c.rope_factor = 16;
  c.rope_original_max_position_embeddings = 65536;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  c.max_position_embeddings = 1048576;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 2048;
  c.routed_scaling_factor = 1.5;
  c.num_hash_layers = std::min(3, num_layers);
  c.swiglu_limit = 10.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.expert_format = ExpertFormat::kMxfp4;
  return c;
}

std::string to_config_json(const DeepSeekV4Config& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["compress_ratios"] = c.compress_ratios;
  j["compress_rope_theta"] = c.compress_rope_theta;
  j["rope_theta"] = c.rope_theta;
  nlohmann::ordered_json rs;
  rs["type"] = "yarn";
  rs["factor"] = c.rope_factor;
  rs["original_max_position_embeddings"] = c.rope_original_max_position_embeddings;
  rs["beta_fast"] = c.rope_beta_fast;
  rs["beta_slow"] = c.rope_beta_slow;
  j["rope_scaling"] = rs;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_shared_experts"] = c.n_shared_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["scoring_func"] = c.scoring_func;
  j["topk_method"] = c.topk_method;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["num_hash_layers"] = c.num_hash_layers;
  j["swiglu_limit"] = c.swiglu_limit;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = c.hidden_act;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  if (c.expert_format != ExpertFormat::kNvfp4)
    j["expert_dtype"] = c.expert_format == ExpertFormat::kFp8Block ? "fp8" : "fp4";
  nlohmann::ordered_json q;
  q["quant_method"] = c.quant_method;
  q["fmt"] = c.quant_fmt;
  q["scale_fmt"] = c.quant_scale_fmt;
  q["weight_block_size"] = {c.weight_block_rows, c.weight_block_cols};
  q["activation_scheme"] = c.activation_scheme;
  if (c.expert_format == ExpertFormat::kNvfp4) {
    q["expert_dtype"] = "fp4";
    q["quant_algo"] = "MIXED_PRECISION";
  }
  j["quantization_config"] = q;
  return j.dump(2) + "\n";
}

}  // namespace ds
