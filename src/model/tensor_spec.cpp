// Builds the expected tensor list of dsv4-model.md §10 from a config. Shapes are written in terms
// of the config fields (Flash values in the comments) so that a reader can check them against the
// §10 table line by line.
#include "model/tensor_spec.h"

#include <algorithm>

namespace ds {

const char* tensor_component_name(TensorComponent c) {
  switch (c) {
    case TensorComponent::kEmbed:
      return "embed";
    case TensorComponent::kHead:
      return "head";
    case TensorComponent::kFinalNorm:
      return "final_norm";
    case TensorComponent::kHcHead:
      return "hc_head";
    case TensorComponent::kMhc:
      return "mhc";
    case TensorComponent::kNorm:
      return "norm";
    case TensorComponent::kAttention:
      return "attention";
    case TensorComponent::kCompressor:
      return "compressor";
    case TensorComponent::kIndexer:
      return "indexer";
    case TensorComponent::kGate:
      return "gate";
    case TensorComponent::kHashTable:
      return "hash_table";
    case TensorComponent::kRoutedExpert:
      return "routed_expert";
    case TensorComponent::kSharedExpert:
      return "shared_expert";
    case TensorComponent::kMtpProj:
      return "mtp_proj";
  }
  return "?";
}

const char* quant_role_name(QuantRole r) {
  switch (r) {
    case QuantRole::kPlain:
      return "plain";
    case QuantRole::kFp8Weight:
      return "fp8_weight";
    case QuantRole::kFp8Scale:
      return "fp8_scale";
    case QuantRole::kFp8ScaleF32:
      return "fp8_scale_f32";
    case QuantRole::kMxfp4Weight:
      return "mxfp4_weight";
    case QuantRole::kMxfp4Scale:
      return "mxfp4_scale";
    case QuantRole::kNvfp4Weight:
      return "nvfp4_weight";
    case QuantRole::kNvfp4Scale:
      return "nvfp4_scale";
    case QuantRole::kNvfp4GlobalScale:
      return "nvfp4_global_scale";
    case QuantRole::kNvfp4InputScale:
      return "nvfp4_input_scale";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : logical) n *= d;
  return n;
}

uint64_t TensorSpec::stored_bytes() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n * dtype_size(dtype);
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Appends tensors for one "scope" (global, a layer or an MTP layer) with common fields filled.
class Builder {
 public:
  Builder(std::vector<TensorSpec>& out, const DeepSeekV4Config& c) : out_(out), c_(c) {}

  void scope(std::string prefix, int32_t layer, int32_t mtp_index) {
    prefix_ = std::move(prefix);
    layer_ = layer;
    mtp_index_ = mtp_index;
  }

  TensorSpec& plain(const std::string& name, DType dtype, std::vector<int64_t> shape,
                    TensorComponent comp, int32_t expert = -1) {
    TensorSpec t;
    t.name = prefix_ + name;
    t.dtype = dtype;
    t.logical = shape;
    t.shape = std::move(shape);
    t.component = comp;
    t.layer = layer_;
    t.mtp_index = mtp_index_;
    t.expert = expert;
    out_.push_back(std::move(t));
    return out_.back();
  }

  // An FP8 linear `base`: base.weight F8_E4M3 [out, in] + base.scale F8_E8M0
  // [ceil(out/128), ceil(in/128)] (§10).
  void fp8(const std::string& base, int64_t out, int64_t in, TensorComponent comp,
           int32_t expert = -1, DType scale_dtype = DType::kF8E8M0) {
    const std::string w = base + ".weight", s = base + ".scale";
    TensorSpec& tw = plain(w, DType::kF8E4M3, {out, in}, comp, expert);
    tw.role = QuantRole::kFp8Weight;
    tw.pair = prefix_ + s;
    TensorSpec& ts = plain(s, scale_dtype, {ceil_div(out, 128), ceil_div(in, 128)}, comp, expert);
    ts.role = scale_dtype == DType::kF32 ? QuantRole::kFp8ScaleF32 : QuantRole::kFp8Scale;
    ts.is_scale = true;
    ts.pair = prefix_ + w;
  }

  // A routed-expert linear in the configured expert format (§10.1, §10.3, §15).
  void expert_linear(const std::string& base, int64_t out, int64_t in, int32_t e) {
    const auto comp = TensorComponent::kRoutedExpert;
    switch (c_.expert_format) {
      case ExpertFormat::kMxfp4: {
        const std::string w = base + ".weight", s = base + ".scale";
        TensorSpec& tw = plain(w, DType::kI8, {out, in / 2}, comp, e);
        tw.logical = {out, in};
        tw.role = QuantRole::kMxfp4Weight;
        tw.pair = prefix_ + s;
        TensorSpec& ts = plain(s, DType::kF8E8M0, {out, in / 32}, comp, e);
        ts.role = QuantRole::kMxfp4Scale;
        ts.is_scale = true;
        ts.pair = prefix_ + w;
        break;
      }
      case ExpertFormat::kFp8Block:
        fp8(base, out, in, comp, e, DType::kF32);
        break;
      case ExpertFormat::kNvfp4: {
        const std::string w = base + ".weight", s = base + ".weight_scale",
                          s2 = base + ".weight_scale_2", si = base + ".input_scale";
        TensorSpec& tw = plain(w, DType::kU8, {out, in / 2}, comp, e);
        tw.logical = {out, in};
        tw.role = QuantRole::kNvfp4Weight;
        tw.pair = prefix_ + s;
        TensorSpec& ts = plain(s, DType::kF8E4M3, {out, in / 16}, comp, e);
        ts.role = QuantRole::kNvfp4Scale;
        ts.is_scale = true;
        ts.pair = prefix_ + w;
        TensorSpec& tg = plain(s2, DType::kF32, {}, comp, e);
        tg.role = QuantRole::kNvfp4GlobalScale;
        tg.is_scale = true;
        tg.pair = prefix_ + w;
        TensorSpec& ti = plain(si, DType::kF32, {}, comp, e);
        ti.role = QuantRole::kNvfp4InputScale;
        ti.is_scale = true;
        ti.optional = true;  // §10.3: "optionally .input_scale"
        ti.pair = prefix_ + w;
        break;
      }
    }
  }

  // hc_{site}_fn [(2+hc)*hc, hc*D], hc_{site}_base [(2+hc)*hc], hc_{site}_scale [3] (§5.1).
  void mhc_site(const std::string& site) {
    const int64_t hc = c_.hc_mult, mix = (2 + hc) * hc;
    plain("hc_" + site + "_fn", DType::kF32, {mix, hc * c_.hidden_size}, TensorComponent::kMhc);
    plain("hc_" + site + "_base", DType::kF32, {mix}, TensorComponent::kMhc);
    plain("hc_" + site + "_scale", DType::kF32, {3}, TensorComponent::kMhc);
  }

  // hc_head_fn [hc, hc*D], hc_head_base [hc], hc_head_scale [1] (§5.3).
  void hc_head() {
    const int64_t hc = c_.hc_mult;
    plain("hc_head_fn", DType::kF32, {hc, hc * c_.hidden_size}, TensorComponent::kHcHead);
    plain("hc_head_base", DType::kF32, {hc}, TensorComponent::kHcHead);
    plain("hc_head_scale", DType::kF32, {1}, TensorComponent::kHcHead);
  }

  // A compressor with head width d and ratio r (§7.6): overlap c = 2 when r == 4.
  void compressor(const std::string& base, int64_t d, int ratio, TensorComponent comp) {
    const int64_t cd = (ratio == 4 ? 2 : 1) * d, D = c_.hidden_size;
    plain(base + ".ape", DType::kF32, {ratio, cd}, comp);
    plain(base + ".wkv.weight", DType::kBF16, {cd, D}, comp);
    plain(base + ".wgate.weight", DType::kBF16, {cd, D}, comp);
    plain(base + ".norm.weight", DType::kBF16, {d}, comp);
  }

  // The per-layer set of §10 for layer index `li` (MTP layers included: they are SWA-only).
  void block(int64_t li) {
    const auto& c = c_;
    const int64_t D = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim;
    const LayerKind kind = c.layer_kind(li);
    mhc_site("attn");
    mhc_site("ffn");
    plain("attn_norm.weight", DType::kBF16, {D}, TensorComponent::kNorm);
    plain("ffn_norm.weight", DType::kBF16, {D}, TensorComponent::kNorm);

    const auto A = TensorComponent::kAttention;
    plain("attn.attn_sink", DType::kF32, {nh}, A);
    fp8("attn.wq_a", c.q_lora_rank, D, A);  // [1024, 4096]
    plain("attn.q_norm.weight", DType::kBF16, {c.q_lora_rank}, A);
    fp8("attn.wq_b", nh * hd, c.q_lora_rank, A);  // [32768, 1024]
    fp8("attn.wkv", hd, D, A);                    // [512, 4096]
    plain("attn.kv_norm.weight", DType::kBF16, {hd}, A);
    fp8("attn.wo_a", c.o_groups * c.o_lora_rank, nh * hd / c.o_groups, A);  // [8192, 4096]
    fp8("attn.wo_b", D, c.o_groups * c.o_lora_rank, A);                     // [4096, 8192]
    if (kind == LayerKind::kCsa) {
      compressor("attn.compressor", hd, 4, TensorComponent::kCompressor);  // ape [4, 1024]
      const auto I = TensorComponent::kIndexer;
      fp8("attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, I);
      plain("attn.indexer.weights_proj.weight", DType::kBF16, {c.index_n_heads, D}, I);
      compressor("attn.indexer.compressor", c.index_head_dim, 4, I);  // ape [4, 256]
    } else if (kind == LayerKind::kHca) {
      compressor("attn.compressor", hd, 128, TensorComponent::kCompressor);  // ape [128, 512]
    }

    const auto G = TensorComponent::kGate;
    plain("ffn.gate.weight", DType::kBF16, {c.n_routed_experts, D}, G);
    if (c.is_hash_layer(li)) {
      // [vocab, top-k] int64 (§8); values are expert ids, checked by the loader (rule 22).
      plain("ffn.gate.tid2eid", DType::kI64, {c.vocab_size, c.num_experts_per_tok},
            TensorComponent::kHashTable);
    } else {
      plain("ffn.gate.bias", DType::kF32, {c.n_routed_experts}, G);
    }
    const int64_t I = c.moe_intermediate_size;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string base = "ffn.experts." + std::to_string(e);
      expert_linear(base + ".w1", I, D, int32_t(e));  // logical [2048, 4096]
      expert_linear(base + ".w2", D, I, int32_t(e));  // logical [4096, 2048]
      expert_linear(base + ".w3", I, D, int32_t(e));
    }
    if (c.n_shared_experts > 0) {
      const int64_t SI = c.shared_intermediate_size();
      const auto S = TensorComponent::kSharedExpert;
      fp8("ffn.shared_experts.w1", SI, D, S);
      fp8("ffn.shared_experts.w2", D, SI, S);
      fp8("ffn.shared_experts.w3", SI, D, S);
    }
  }

 private:
  std::vector<TensorSpec>& out_;
  const DeepSeekV4Config& c_;
  std::string prefix_;
  int32_t layer_ = -1;
  int32_t mtp_index_ = -1;
};

}  // namespace

std::vector<TensorSpec> expected_tensors(const DeepSeekV4Config& c) {
  std::vector<TensorSpec> out;
  const int64_t per_expert = c.expert_format == ExpertFormat::kNvfp4 ? 12 : 6;
  out.reserve(size_t(16 + c.num_layers_total() * (60 + per_expert * c.n_routed_experts)));
  Builder b(out, c);
  const int64_t D = c.hidden_size;

  b.scope("", -1, -1);
  b.plain("embed.weight", DType::kBF16, {c.vocab_size, D}, TensorComponent::kEmbed);
  b.plain("head.weight", DType::kBF16, {c.vocab_size, D}, TensorComponent::kHead);
  b.plain("norm.weight", DType::kBF16, {D}, TensorComponent::kFinalNorm);
  b.hc_head();

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    b.scope("layers." + std::to_string(l) + ".", int32_t(l), -1);
    b.block(l);
  }

  // MTP `mtp.{i}.` (§10): a full SWA-only, learned-routing block plus the projections that mix
  // the next token's embedding with the main model's streams (§9), its own final norm and hc head.
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t li = c.num_hidden_layers + i;
    b.scope("mtp." + std::to_string(i) + ".", int32_t(li), int32_t(i));
    b.block(li);
    b.fp8("e_proj", D, D, TensorComponent::kMtpProj);
    b.fp8("h_proj", D, D, TensorComponent::kMtpProj);
    b.plain("enorm.weight", DType::kBF16, {D}, TensorComponent::kNorm);
    b.plain("hnorm.weight", DType::kBF16, {D}, TensorComponent::kNorm);
    b.plain("norm.weight", DType::kBF16, {D}, TensorComponent::kFinalNorm);
    b.hc_head();
  }
  return out;
}

bool is_ignored_tensor(std::string_view name) {
  // mtp.{digits}.emb.* or mtp.{digits}.head.*
  constexpr std::string_view kMtp = "mtp.";
  if (name.substr(0, kMtp.size()) != kMtp) return false;
  size_t i = kMtp.size(), start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == start || i - start > 6 || i >= name.size() || name[i] != '.') return false;
  std::string_view rest = name.substr(i + 1);
  for (std::string_view p : {std::string_view("emb."), std::string_view("head.")})
    if (rest.size() > p.size() && rest.substr(0, p.size()) == p) return true;
  return false;
}

std::unordered_map<std::string, size_t> index_tensor_specs(const std::vector<TensorSpec>& specs) {
  std::unordered_map<std::string, size_t> m;
  m.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) m.emplace(specs[i].name, i);
  return m;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string describe(const TensorSpec& t) {
  std::string s = t.name + " " + std::string(dtype_name(t.dtype)) + shape_to_string(t.shape);
  if (t.logical != t.shape) s += " logical " + shape_to_string(t.logical);
  return s;
}

}  // namespace ds
