// Binding of checkpoint tensors to kernel views (see weights.h). Every lookup goes through the
// expected tensor list of the config (tensor_spec.h), which says how each tensor is stored; the
// checkpoint loader has already checked every dtype and shape against that list.
#include "model/deepseek_v4/weights.h"

#include <cstring>
#include <unordered_map>

#include "core/dtype.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"
#include "model/tensor_spec.h"

namespace ds::dsv4 {

class WeightBinder {
 public:
  explicit WeightBinder(ModelWeights* model)
      : model_(model),
        specs_(expected_tensors(model->checkpoint_.config)),
        index_(index_tensor_specs(specs_)) {}

  // The mapped bytes of `name`, checked to be present in the spec list.
  Result<std::span<const uint8_t>> bytes(const std::string& name, const TensorSpec** spec_out) {
    auto it = index_.find(name);
    if (it == index_.end()) return internal_error("weights: no spec for tensor " + name);
    if (spec_out) *spec_out = &specs_[it->second];
    auto span = model_->checkpoint_.files.map(name);
    if (!span.ok()) return span.status().with_context("weights: " + name);
    if (span->size() != specs_[it->second].stored_bytes()) {
      return corrupt("weights: tensor " + name + " has an unexpected byte size");
    }
    return span;
  }

  // A pointer to the bytes aligned for `alignment`; copies them when the mapping is not.
  const void* aligned(std::span<const uint8_t> span, size_t alignment) {
    if (reinterpret_cast<uintptr_t>(span.data()) % alignment == 0) return span.data();
    auto copy = std::make_unique<std::vector<uint8_t>>(span.begin(), span.end());
    // std::vector<uint8_t> storage comes from operator new: aligned for any fundamental type.
    const void* p = copy->data();
    model_->owned_.push_back(std::move(copy));
    return p;
  }

  Result<const float*> f32(const std::string& name) {
    const TensorSpec* spec = nullptr;
    DS_ASSIGN_OR_RETURN(auto span, bytes(name, &spec));
    if (spec->dtype != DType::kF32) return internal_error("weights: " + name + " is not F32");
    return static_cast<const float*>(aligned(span, alignof(float)));
  }

  // A bf16 (or f32) vector tensor as owned fp32 values (norm weights).
  Result<std::vector<float>> vector_f32(const std::string& name) {
    const TensorSpec* spec = nullptr;
    DS_ASSIGN_OR_RETURN(auto span, bytes(name, &spec));
    const int64_t n = spec->numel();
    std::vector<float> out(static_cast<size_t>(n));
    if (spec->dtype == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, span.data() + 2 * i, 2);
        out[size_t(i)] = bf16_to_float(bits);
      }
    } else if (spec->dtype == DType::kF32) {
      std::memcpy(out.data(), span.data(), size_t(n) * 4);
    } else {
      return internal_error("weights: " + name + " is neither BF16 nor F32");
    }
    return out;
  }

  // A linear layer `base` (.weight plus its scales), any stored format.
  Result<cpu::LinearWeight> linear(const std::string& base) {
    const TensorSpec* spec = nullptr;
    const std::string wname = base + ".weight";
    DS_ASSIGN_OR_RETURN(auto span, bytes(wname, &spec));
    cpu::LinearWeight w;
    w.out_features = spec->logical.at(0);
    w.in_features = spec->logical.at(1);
    switch (spec->role) {
      case QuantRole::kPlain:
        if (spec->dtype == DType::kBF16) {
          w.format = cpu::WeightFormat::kBF16;
          w.data = aligned(span, alignof(uint16_t));
        } else if (spec->dtype == DType::kF32) {
          w.format = cpu::WeightFormat::kF32;
          w.data = aligned(span, alignof(float));
        } else {
          return unimplemented("weights: " + wname + " has an unsupported plain dtype");
        }
        return w;
      case QuantRole::kFp8Weight: {
        DS_ASSIGN_OR_RETURN(auto scale, bytes(spec->pair, nullptr));
        w.format = cpu::WeightFormat::kFp8Block;
        w.data = span.data();
        w.scale = scale.data();
        return w;
      }
      case QuantRole::kMxfp4Weight: {
        DS_ASSIGN_OR_RETURN(auto scale, bytes(spec->pair, nullptr));
        w.format = cpu::WeightFormat::kMxfp4;
        w.data = span.data();
        w.scale = scale.data();
        return w;
      }
      case QuantRole::kNvfp4Weight: {
        DS_ASSIGN_OR_RETURN(auto scale, bytes(spec->pair, nullptr));
        DS_ASSIGN_OR_RETURN(auto global, bytes(base + ".weight_scale_2", nullptr));
        w.format = cpu::WeightFormat::kNvfp4;
        w.data = span.data();
        w.scale = scale.data();
        std::memcpy(&w.global_scale, global.data(), sizeof(float));
        return w;
      }
      default:
        // FP8-block experts with fp32 scales (expert_dtype "fp8", Flash-Base) have no kernel view.
        return unimplemented("weights: " + wname + " is stored as " +
                             std::string(quant_role_name(spec->role)) +
                             ", which the CPU reference forward does not support");
    }
  }

  Result<CompressorWeights> compressor(const std::string& base, int64_t ratio, int64_t d,
                                       int64_t rope_dim) {
    CompressorWeights c;
    c.config.ratio = ratio;
    c.config.head_dim = d;
    c.config.rope_dim = rope_dim;
    DS_ASSIGN_OR_RETURN(c.wkv, linear(base + ".wkv"));
    DS_ASSIGN_OR_RETURN(c.wgate, linear(base + ".wgate"));
    DS_ASSIGN_OR_RETURN(c.ape, f32(base + ".ape"));
    DS_ASSIGN_OR_RETURN(c.norm, vector_f32(base + ".norm.weight"));
    return c;
  }

  Result<cpu::MhcSiteWeights> mhc_site(const std::string& prefix) {
    cpu::MhcSiteWeights s{};
    DS_ASSIGN_OR_RETURN(s.fn, f32(prefix + "_fn"));
    DS_ASSIGN_OR_RETURN(s.base, f32(prefix + "_base"));
    DS_ASSIGN_OR_RETURN(s.scale, f32(prefix + "_scale"));
    return s;
  }

  Result<cpu::MhcHeadWeights> mhc_head(const std::string& prefix) {
    cpu::MhcHeadWeights h{};
    DS_ASSIGN_OR_RETURN(h.fn, f32(prefix + "hc_head_fn"));
    DS_ASSIGN_OR_RETURN(h.base, f32(prefix + "hc_head_base"));
    DS_ASSIGN_OR_RETURN(h.scale, f32(prefix + "hc_head_scale"));
    return h;
  }

  // A block whose tensors are named `prefix` + checkpoint-relative name; `layer` indexes
  // compress_ratios.
  Result<LayerWeights> block(const std::string& prefix, int64_t layer) {
    const DeepSeekV4Config& c = model_->checkpoint_.config;
    LayerWeights L;
    L.index = layer;
    L.kind = c.layer_kind(layer);
    L.compress_ratio = c.compress_ratios.at(size_t(layer));
    L.hash_routing = c.is_hash_layer(layer);
    DS_ASSIGN_OR_RETURN(L.hc_attn, mhc_site(prefix + "hc_attn"));
    DS_ASSIGN_OR_RETURN(L.hc_ffn, mhc_site(prefix + "hc_ffn"));
    DS_ASSIGN_OR_RETURN(L.attn_norm, vector_f32(prefix + "attn_norm.weight"));
    DS_ASSIGN_OR_RETURN(L.ffn_norm, vector_f32(prefix + "ffn_norm.weight"));

    const std::string a = prefix + "attn.";
    DS_ASSIGN_OR_RETURN(L.attn_sink, f32(a + "attn_sink"));
    DS_ASSIGN_OR_RETURN(L.wq_a, linear(a + "wq_a"));
    DS_ASSIGN_OR_RETURN(L.q_norm, vector_f32(a + "q_norm.weight"));
    DS_ASSIGN_OR_RETURN(L.wq_b, linear(a + "wq_b"));
    DS_ASSIGN_OR_RETURN(L.wkv, linear(a + "wkv"));
    DS_ASSIGN_OR_RETURN(L.kv_norm, vector_f32(a + "kv_norm.weight"));
    DS_ASSIGN_OR_RETURN(L.wo_a, linear(a + "wo_a"));
    DS_ASSIGN_OR_RETURN(L.wo_b, linear(a + "wo_b"));
    // wo_a is block-diagonal by group: its stored in_features is one group's width.
    if (L.wo_a.in_features * c.o_groups != c.num_attention_heads * c.head_dim) {
      return corrupt("weights: " + a + "wo_a.weight has in_features " +
                     std::to_string(L.wo_a.in_features) +
                     ", expected num_heads * head_dim / o_groups");
    }

    const cpu::RopeConfig rope = cpu::rope_config_for_layer(
        L.compress_ratio, c.qk_rope_head_dim, c.rope_theta, c.compress_rope_theta, c.rope_factor,
        c.rope_original_max_position_embeddings, c.rope_beta_fast, c.rope_beta_slow);
    L.inv_freq.resize(size_t(c.qk_rope_head_dim / 2));
    cpu::rope_inv_freq(rope, L.inv_freq.data());

    if (L.compress_ratio != 0) {
      DS_ASSIGN_OR_RETURN(L.compressor, compressor(a + "compressor", L.compress_ratio, c.head_dim,
                                                   c.qk_rope_head_dim));
    }
    if (L.kind == LayerKind::kCsa) {
      DS_ASSIGN_OR_RETURN(L.indexer_compressor,
                          compressor(a + "indexer.compressor", L.compress_ratio, c.index_head_dim,
                                     c.qk_rope_head_dim));
      DS_ASSIGN_OR_RETURN(L.indexer_wq_b, linear(a + "indexer.wq_b"));
      DS_ASSIGN_OR_RETURN(L.indexer_weights_proj, linear(a + "indexer.weights_proj"));
    }

    const std::string f = prefix + "ffn.";
    DS_ASSIGN_OR_RETURN(L.gate, linear(f + "gate"));
    if (L.hash_routing) {
      const TensorSpec* spec = nullptr;
      DS_ASSIGN_OR_RETURN(auto span, bytes(f + "gate.tid2eid", &spec));
      const int64_t n = spec->numel();
      L.tid2eid.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, span.data() + 8 * i, 8);
        if (v < 0 || v >= c.n_routed_experts) {
          return corrupt("weights: " + f + "gate.tid2eid holds expert " + std::to_string(v) +
                         ", outside [0, n_routed_experts)");
        }
        L.tid2eid[size_t(i)] = int32_t(v);
      }
    } else {
      DS_ASSIGN_OR_RETURN(L.gate_bias, f32(f + "gate.bias"));
    }
    L.experts.resize(size_t(c.n_routed_experts));
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string base = f + "experts." + std::to_string(e);
      DS_ASSIGN_OR_RETURN(L.experts[size_t(e)].w1, linear(base + ".w1"));
      DS_ASSIGN_OR_RETURN(L.experts[size_t(e)].w2, linear(base + ".w2"));
      DS_ASSIGN_OR_RETURN(L.experts[size_t(e)].w3, linear(base + ".w3"));
    }
    if (c.n_shared_experts == 0) {
      return unimplemented("weights: a model without a shared expert is not supported");
    }
    DS_ASSIGN_OR_RETURN(L.shared.w1, linear(f + "shared_experts.w1"));
    DS_ASSIGN_OR_RETURN(L.shared.w2, linear(f + "shared_experts.w2"));
    DS_ASSIGN_OR_RETURN(L.shared.w3, linear(f + "shared_experts.w3"));
    return L;
  }

  Status bind_all() {
    const DeepSeekV4Config& c = model_->checkpoint_.config;
    if (c.num_key_value_heads != 1) return unimplemented("weights: num_key_value_heads must be 1");
    DS_ASSIGN_OR_RETURN(model_->embed, linear("embed"));
    DS_ASSIGN_OR_RETURN(model_->head, linear("head"));
    DS_ASSIGN_OR_RETURN(model_->norm, vector_f32("norm.weight"));
    DS_ASSIGN_OR_RETURN(model_->hc_head, mhc_head(""));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      DS_ASSIGN_OR_RETURN(auto layer, block("layers." + std::to_string(l) + ".", l));
      model_->layers.push_back(std::move(layer));
    }
    for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
      const std::string p = "mtp." + std::to_string(i) + ".";
      MtpWeights m;
      DS_ASSIGN_OR_RETURN(m.block, block(p, c.num_hidden_layers + i));
      DS_ASSIGN_OR_RETURN(m.e_proj, linear(p + "e_proj"));
      DS_ASSIGN_OR_RETURN(m.h_proj, linear(p + "h_proj"));
      DS_ASSIGN_OR_RETURN(m.enorm, vector_f32(p + "enorm.weight"));
      DS_ASSIGN_OR_RETURN(m.hnorm, vector_f32(p + "hnorm.weight"));
      DS_ASSIGN_OR_RETURN(m.norm, vector_f32(p + "norm.weight"));
      DS_ASSIGN_OR_RETURN(m.hc_head, mhc_head(p));
      model_->mtp.push_back(std::move(m));
    }
    return ok_status();
  }

 private:
  ModelWeights* model_;
  std::vector<TensorSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
};

const void* ModelWeights::own_bytes(std::vector<uint8_t> bytes) {
  owned_.push_back(std::make_unique<std::vector<uint8_t>>(std::move(bytes)));
  return owned_.back()->data();
}

// A ModelWeights with `config` and a copy of every view of `full` (sharding.cpp adjusts them).
Result<std::unique_ptr<ModelWeights>> make_shard_model(const ModelWeights& full,
                                                       const DeepSeekV4Config& config) {
  auto model = std::unique_ptr<ModelWeights>(new ModelWeights());
  model->checkpoint_.config = config;
  model->embed = full.embed;
  model->head = full.head;
  model->norm = full.norm;
  model->hc_head = full.hc_head;
  model->layers = full.layers;
  model->mtp = full.mtp;
  return model;
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::load(const std::string& dir) {
  auto checkpoint = open_checkpoint(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  auto model = std::unique_ptr<ModelWeights>(new ModelWeights());
  model->checkpoint_ = std::move(checkpoint).value();
  WeightBinder binder(model.get());
  DS_RETURN_IF_ERROR(binder.bind_all());
  return model;
}

}  // namespace ds::dsv4
