// The DeepSeek-V4 forward against the op interface (see forward.h, ops.h). Token-wise work
// (linears, norms, mHC, MoE) runs once over all tokens of the step; the attention core runs per
// token with that token's own key set inside Ops::attend.
//
// bf16 rounding points (reference mode, `round_bf16`; REF keeps these tensors in bf16): the mHC
// pre output u, every RMSNorm output (attn_norm, ffn_norm, q_norm, kv_norm, per-head q norm), the
// outputs of wq_a, wq_b, wkv, the indexer's wq_b and weights_proj, the RoPE'd q and kv, the
// attention output before and after its inverse RoPE, the wo_a and wo_b outputs, the MoE output,
// the mHC post output (the residual streams), the final head collapse and norm, and in the MTP
// layer the enorm / hnorm / e_proj / h_proj outputs and their sum. Inside the kernels:
// compressor_finish_entry, indexer_prepare_query and the MoE experts round where REF does. After
// RMSNorm, RoPE and mHC the rounding is the backend's own when it says so
// (Ops::rounds_elementwise_outputs: CudaOps does it in those kernels), else a round_bf16 call;
// after a linear it is the linear's own (its round_output argument).
#include "model/deepseek_v4/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "model/deepseek_v4/cpu_ops.h"
#include "model/deepseek_v4/state_access.h"

namespace ds::dsv4 {

namespace {

cpu::MhcConfig mhc_config(const DeepSeekV4Config& c) {
  cpu::MhcConfig m;
  m.hc_mult = c.hc_mult;
  m.dim = c.hidden_size;
  m.sinkhorn_iters = c.hc_sinkhorn_iters;
  m.hc_eps = float(c.hc_eps);
  m.norm_eps = float(c.rms_norm_eps);
  return m;
}

// Scratch buffers taken in a scope are given back to the backend's arena when it ends.
class ArenaScope {
 public:
  explicit ArenaScope(Ops* ops) : ops_(ops), mark_(ops->mark()) {}
  ~ArenaScope() { ops_->release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;
  float* operator()(int64_t n) const { return ops_->alloc(n); }

 private:
  Ops* ops_;
  size_t mark_;
};

// The plan's step is open between begin_step and end_step, whatever path leaves the scope.
class StepScope {
 public:
  StepScope(Ops* ops, const StepPlan& plan) : ops_(ops) {
    ops_->component_begin(Component::kStep);
    ops_->begin_step(plan);
    ops_->component_end(Component::kStep);
  }
  ~StepScope() {
    ops_->component_begin(Component::kStep);
    ops_->end_step();
    ops_->component_end(Component::kStep);
  }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Ops* ops_;
};

// Attributes the ops issued in a scope to one model component.
class ComponentScope {
 public:
  ComponentScope(Ops* ops, Component component) : ops_(ops), component_(component) {
    ops_->component_begin(component_);
  }
  ~ComponentScope() { ops_->component_end(component_); }
  ComponentScope(const ComponentScope&) = delete;
  ComponentScope& operator=(const ComponentScope&) = delete;

 private:
  Ops* ops_;
  Component component_;
};

}  // namespace

const char* component_name(Component component) {
  switch (component) {
    case Component::kEmbed: return "embedding";
    case Component::kMhc: return "mhc";
    case Component::kNorm: return "norm";
    case Component::kAttentionProjections: return "attention projections";
    case Component::kCompressor: return "compressor";
    case Component::kIndexer: return "indexer";
    case Component::kAttention: return "sparse attention";
    case Component::kMoe: return "moe";
    case Component::kHead: return "head";
    case Component::kMtpInput: return "mtp input";
    case Component::kCollective: return "collectives";
    case Component::kStep: return "step overhead";
  }
  return "?";
}

Forward::Forward(const ModelWeights* weights, ForwardOptions options)
    : weights_(weights),
      options_(options),
      owned_ops_(std::make_unique<CpuOps>(weights->config())),
      ops_(owned_ops_.get()) {}

Forward::Forward(const ModelWeights* weights, ForwardOptions options, Ops* ops)
    : weights_(weights), options_(options), ops_(ops) {}

Forward::Forward(Forward&&) noexcept = default;
Forward::~Forward() = default;

void Forward::maybe_round(float* x, int64_t n) const {
  if (options_.round_bf16) ops_->round_bf16(x, n);
}

void Forward::round_elementwise_output(float* x, int64_t n) const {
  if (options_.round_bf16 && !ops_->rounds_elementwise_outputs()) ops_->round_bf16(x, n);
}

void Forward::attention(const LayerWeights& L, int64_t slot, int64_t N, const float* h,
                        float* out) const {
  const DeepSeekV4Config& c = config();
  const cpu::NumericsFlags& f = options_.flags;
  const bool actq = f.activation_quantization;
  const int64_t H = c.num_attention_heads;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim;
  const float eps = float(c.rms_norm_eps);
  Ops& ops = *ops_;
  ArenaScope alloc(ops_);
  auto alloc_i32 = [&](int64_t n) { return ops_->alloc_i32(n); };

  // §7.1 query, §7.2 key/value (one vector per token).
  float* qr = alloc(N * c.q_lora_rank);  // [N, q_lora_rank]
  float* q = alloc(N * H * hd);          // [N, H, hd]
  float* kv = alloc(N * hd);             // [N, hd]
  {
    ComponentScope scope(ops_, Component::kAttentionProjections);
    const bool pair = ops.fuses_linear_pair();  // wq_a and wkv as one GEMM (same input h)
    if (pair)
      ops.linear_pair(h, N, L.wq_a, L.wkv, actq, qr, kv, options_.round_bf16);
    else
      ops.linear(h, N, L.wq_a, actq, qr, options_.round_bf16);
    ops.rms_norm(qr, L.q_norm.data(), N, c.q_lora_rank, eps, qr);
    round_elementwise_output(qr, N * c.q_lora_rank);
    ops.linear(qr, N, L.wq_b, actq, q, options_.round_bf16);
    // norm + RoPE (+ FP8 simulation of kv) as one op only for a fusing backend: the others keep
    // the op order of the separate calls.
    const bool fused_norm_rope = ops.fuses_norm_rope();
    if (fused_norm_rope) {
      ops.norm_rope(q, nullptr, N, H, hd, eps, rd, L.inv_freq.data(), false, options_.round_bf16);
    } else {
      ops.rms_norm_heads(q, N, H, hd, eps);
      round_elementwise_output(q, N * H * hd);
      ops.rope(q, H, hd, rd, L.inv_freq.data(), cpu::RopeDirection::kForward);
      round_elementwise_output(q, N * H * hd);
    }

    if (!pair) ops.linear(h, N, L.wkv, actq, kv, options_.round_bf16);
    if (fused_norm_rope) {
      ops.norm_rope(kv, L.kv_norm.data(), N, 1, hd, eps, rd, L.inv_freq.data(), f.fp8_kv_simulation,
                    options_.round_bf16);
    } else {
      ops.rms_norm(kv, L.kv_norm.data(), N, hd, eps, kv);
      round_elementwise_output(kv, N * hd);
      ops.rope(kv, 1, hd, rd, L.inv_freq.data(), cpu::RopeDirection::kForward);
      round_elementwise_output(kv, N * hd);
      if (f.fp8_kv_simulation) ops.simulate_fp8_kv(kv, N, hd, rd);
    }
  }

  const bool csa = L.kind == LayerKind::kCsa;
  const int64_t ihd = c.index_head_dim, ih = c.index_n_heads;

  // §7.7 indexer query and weights (CSA).
  float* q_index = nullptr;  // [N, ih, ihd]
  float* w_index = nullptr;  // [N, ih]
  if (csa) {
    ComponentScope scope(ops_, Component::kIndexer);
    q_index = alloc(N * ih * ihd);
    ops.linear(qr, N, L.indexer_wq_b, actq, q_index, options_.round_bf16);
    ops.indexer_prepare_query(q_index, ih, ihd, rd, L.inv_freq.data(), f.indexer_fp4_simulation,
                              options_.round_bf16);
    w_index = alloc(N * ih);
    ops.linear(h, N, L.indexer_weights_proj, false, w_index, options_.round_bf16);
    ops.indexer_scale_weights(w_index, ih, ihd);
    round_elementwise_output(w_index, N * ih);
  }

  // §7.6 compressors: entries are emitted before any query of the step attends.
  if (L.compress_ratio != 0) {
    ComponentScope scope(ops_, Component::kCompressor);
    auto finish = [&](const CompressorWeights& cw, cpu::CompressorKind kind, bool simulate) {
      cpu::CompressorFinishParams fp;
      fp.kind = kind;
      fp.norm_weight = cw.norm.data();
      fp.inv_freq = L.inv_freq.data();
      fp.norm_eps = eps;
      fp.simulate_quantization = simulate;
      fp.round_bf16 = options_.round_bf16;
      return fp;
    };
    const cpu::CompressorFinishParams index_fp = finish(
        L.indexer_compressor, cpu::CompressorKind::kIndexer, f.indexer_fp4_simulation);
    const cpu::CompressorFinishParams attn_fp =
        finish(L.compressor, cpu::CompressorKind::kAttention, f.fp8_kv_simulation);
    ops.compress_layer(slot, csa ? &L.indexer_compressor : nullptr, csa ? &index_fp : nullptr,
                       L.compressor, attn_fp, h);
  }

  // §7.7 top-k selection over the keys just updated.
  int32_t* selected = nullptr;  // [N, index_topk]
  if (csa) {
    ComponentScope scope(ops_, Component::kIndexer);
    selected = alloc_i32(N * c.index_topk);
    ops.indexer_select(slot, q_index, w_index, selected);
  }

  // §7.4/§7.5 sparse attention with sink over window + compressed keys; then the step's raw kv
  // joins the window rings (after every query of the step has read them).
  float* o = alloc(N * H * hd);  // [N, H, hd]
  {
    ComponentScope scope(ops_, Component::kAttention);
    AttendParams ap;
    ap.layer_slot = slot;
    ap.layer = &L;
    ap.softmax_scale = float(1.0 / std::sqrt(double(hd)));
    ap.inverse_rope_output = ops.fuses_attend_inverse_rope();
    ops.attend(ap, q, kv, selected, o);
    round_elementwise_output(o, N * H * hd);
    ops.store_window(slot, kv, hd);
  }

  // Inverse RoPE of the output (unless attend did it), §7.8 grouped output projection; wo_a never
  // quantizes its input.
  {
    ComponentScope scope(ops_, Component::kAttentionProjections);
    if (!ops.fuses_attend_inverse_rope()) {
      ops.rope(o, H, hd, rd, L.inv_freq.data(), cpu::RopeDirection::kInverse);
      round_elementwise_output(o, N * H * hd);
    }
    float* z = alloc(N * L.wo_a.out_features);  // [N, o_groups * o_lora_rank]
    ops.grouped_output_projection(o, c.o_groups, L.wo_a, z, options_.round_bf16);
    // Tensor parallel: each rank's wo_b saw only its groups' columns (sharding.h); the rounding
    // point is after their sum.
    ops.linear(z, N, L.wo_b, actq, out, options_.round_bf16 && !weights_->shard.tensor_parallel);
  }
  if (weights_->shard.tensor_parallel) {
    {
      ComponentScope scope(ops_, Component::kCollective);
      ops.all_reduce_sum(out, N * c.hidden_size);
    }
    ComponentScope scope(ops_, Component::kAttentionProjections);
    maybe_round(out, N * c.hidden_size);
  }
}

MoeSite moe_site(const ModelWeights& weights, const LayerWeights& L,
                 const ForwardOptions& options) {
  const DeepSeekV4Config& c = weights.config();
  const cpu::NumericsFlags& f = options.flags;
  MoeSite mp;
  mp.router_config.num_experts = c.n_routed_experts;
  mp.router_config.topk = c.num_experts_per_tok;
  mp.router_config.route_scale = float(c.routed_scaling_factor);
  mp.router_config.renorm_epsilon = f.router_renorm_epsilon;
  mp.router.gate = L.gate;
  mp.router.bias = L.gate_bias;
  mp.router.tid2eid = L.hash_routing ? L.tid2eid.data() : nullptr;
  mp.router.vocab_size = c.vocab_size;
  mp.experts = L.experts.data();
  mp.shared = L.shared;
  mp.swiglu_limit = float(c.swiglu_limit);
  mp.shared_expert_clamp = f.shared_expert_clamp;
  mp.quantize_activations = f.activation_quantization;
  mp.round_bf16 = options.round_bf16;
  mp.expert_begin = weights.shard.expert_begin;
  mp.expert_end = weights.shard.expert_end;
  mp.add_shared = weights.shard.shared_expert;
  return mp;
}

void Forward::block(const LayerWeights& L, int64_t slot, int64_t N, float* x) const {
  const DeepSeekV4Config& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  const float eps = float(c.rms_norm_eps);
  const cpu::MhcConfig mc = mhc_config(c);
  Ops& ops = *ops_;
  ArenaScope alloc(ops_);
  float* u = alloc(N * D);             // [N, D]
  float* post = alloc(N * hc);         // [N, hc]
  float* comb = alloc(N * hc * hc);    // [N, hc, hc]
  float* branch = alloc(N * D);        // [N, D]
  float* x_new = alloc(N * hc * D);    // [N, hc, D]

  // §6 attention site.
  auto mhc_pre = [&](const cpu::MhcSiteWeights& site, const float* streams, const float* norm) {
    if (ops.fuses_mhc_pre_norm()) {
      ComponentScope scope(ops_, Component::kMhc);
      ops.mhc_pre_norm(mc, site, streams, N, norm, eps, options_.round_bf16, u, post, comb);
      return;
    }
    {
      ComponentScope scope(ops_, Component::kMhc);
      ops.mhc_pre(mc, site, streams, N, u, post, comb);
      round_elementwise_output(u, N * D);
    }
    ComponentScope scope(ops_, Component::kNorm);
    ops.rms_norm(u, norm, N, D, eps, u);
    round_elementwise_output(u, N * D);
  };
  auto mhc_post = [&](const float* streams, float* streams_new) {
    ComponentScope scope(ops_, Component::kMhc);
    ops.mhc_post(mc, branch, streams, post, comb, N, streams_new);
    round_elementwise_output(streams_new, N * hc * D);
  };
  mhc_pre(L.hc_attn, x, L.attn_norm.data());
  attention(L, slot, N, u, branch);
  mhc_post(x, x_new);

  // §6/§8 MoE site (x_new holds the streams now; the result goes back into x).
  mhc_pre(L.hc_ffn, x_new, L.ffn_norm.data());
  {
    ComponentScope scope(ops_, Component::kMoe);
    ops.moe(moe_site(*weights_, L, options_), u, branch);
  }
  // Expert parallel: each rank's output holds its experts' (and shared-expert part's) sum.
  if (weights_->shard.moe_partial()) {
    ComponentScope scope(ops_, Component::kCollective);
    ops.all_reduce_sum(branch, N * D);
  }
  {
    ComponentScope scope(ops_, Component::kMoe);
    maybe_round(branch, N * D);
  }
  mhc_post(x_new, x);
}

void Forward::head(const float* x, const std::vector<int64_t>& rows,
                   const cpu::MhcHeadWeights& hc_head, const std::vector<float>& norm,
                   std::span<const HeadDestination> destinations) const {
  const DeepSeekV4Config& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, R = int64_t(rows.size());
  Ops& ops = *ops_;
  ArenaScope alloc(ops_);
  ComponentScope scope(ops_, Component::kHead);
  float* xs = alloc(R * hc * D);  // [R, hc, D]
  ops.gather_rows(x, hc * D, rows, xs);
  float* y = alloc(R * D);  // [R, D]
  ops.mhc_head(mhc_config(c), hc_head, xs, R, y);
  round_elementwise_output(y, R * D);
  ops.rms_norm(y, norm.data(), R, D, float(c.rms_norm_eps), y);
  round_elementwise_output(y, R * D);
  // §4: fp32 logits; the head is a bf16 linear (input never quantized).
  float* out = alloc(R * c.vocab_size);  // [R, vocab]
  ops.linear(y, R, weights_->head, false, out, false);
  std::vector<Ops::HostCopy> copies;
  bool any_argmax = false;
  int64_t done = 0;
  for (const HeadDestination& d : destinations) {
    if (d.logits != nullptr) {
      copies.push_back({out + done * c.vocab_size, d.rows * c.vocab_size, d.logits});
    }
    any_argmax = any_argmax || d.argmax != nullptr;
    done += d.rows;
  }
  if (!copies.empty()) ops.copy_many_to_host(copies);
  if (!any_argmax) return;
  // One pass over every row (a few microseconds on a device), scattered to the argmax chunks.
  std::vector<int32_t> ids(static_cast<size_t>(done));
  std::vector<uint8_t> finite(static_cast<size_t>(done));
  // The argmax rows alone take the greedy kernel; with a random draw among them every token row
  // goes through sample_rows (its temperature-0 rows are the same argmax).
  std::vector<cpu::RowSampling> params;
  bool any_draw = false;
  for (const HeadDestination& d : destinations) {
    any_draw = any_draw || (d.argmax != nullptr && d.sampling.temperature > 0);
  }
  if (any_draw) {
    for (const HeadDestination& d : destinations) {
      params.insert(params.end(), size_t(d.rows), d.sampling);
    }
    ops.sample_rows(out, done, c.vocab_size, params.data(), ids.data(), finite.data());
  } else {
    ops.argmax_rows(out, done, c.vocab_size, ids.data(), finite.data());
  }
  done = 0;
  for (const HeadDestination& d : destinations) {
    if (d.argmax != nullptr) {
      std::copy_n(ids.begin() + done, d.rows, d.argmax);
      std::copy_n(finite.begin() + done, d.rows, d.finite);
    }
    done += d.rows;
  }
}

// Fills one ChunkOutput per chunk with the logits (or, for backend_tokens[i], the backend's tokens
// and finite flags) and the pre-head streams of its requested rows.
void Forward::outputs_for(std::span<const std::vector<int64_t>> logit_rows,
                          std::span<const std::optional<cpu::RowSampling>> backend_tokens,
                          const StepPlan& plan, const float* x, const cpu::MhcHeadWeights& hc_head,
                          const std::vector<float>& norm, bool want_streams,
                          std::vector<ChunkOutput>* outputs) const {
  const DeepSeekV4Config& c = config();
  const int64_t width = c.hc_mult * c.hidden_size;
  // One head call for the requested rows of every chunk (each row is computed independently, so
  // this equals one call per chunk bit for bit, but reads the [vocab, hidden] head once per step
  // instead of once per sequence); its logits go straight into each chunk's output.
  std::vector<int64_t> all_rows;  // plan rows, chunk after chunk
  std::vector<HeadDestination> destinations;
  {
    // The host buffers: a caller that passes the previous step's outputs again keeps their
    // capacity (no allocation, no page faults); every element is overwritten below.
    // The logits come from the backend's host memory (page-locked on a GPU), so their copy runs
    // at the link's speed; a buffer from another source is replaced once.
    ComponentScope scope(ops_, Component::kStep);
    const std::shared_ptr<HostMemorySource> host = ops_->host_memory();
    outputs->resize(logit_rows.size());
    for (size_t i = 0; i < logit_rows.size(); ++i) {
      for (int64_t r : logit_rows[i]) all_rows.push_back(plan.seqs[i].begin + r);
      ChunkOutput& o = (*outputs)[i];
      o.streams.clear();
      o.row_streams.clear();
      const int64_t n = int64_t(logit_rows[i].size());
      const bool only_argmax = i < backend_tokens.size() && backend_tokens[i].has_value();
      o.argmax.resize(only_argmax ? size_t(n) : 0);
      o.finite.resize(only_argmax ? size_t(n) : 0);
      HostVector<float>& l = o.logits;
      if (l.get_allocator().source() != host) l = HostVector<float>(HostAllocator<float>(host));
      l.resize(only_argmax ? 0 : size_t(n * c.vocab_size));
      if (n == 0) continue;
      destinations.push_back(only_argmax ? HeadDestination{n, nullptr, o.argmax.data(),
                                                           o.finite.data(), *backend_tokens[i]}
                                         : HeadDestination{n, l.data(), nullptr, nullptr, {}});
    }
  }
  if (!all_rows.empty()) head(x, all_rows, hc_head, norm, destinations);
  for (size_t i = 0; i < logit_rows.size(); ++i) {
    std::vector<int64_t> rows;  // plan rows
    for (int64_t r : logit_rows[i]) rows.push_back(plan.seqs[i].begin + r);
    const int64_t R = int64_t(rows.size());
    ChunkOutput& out = (*outputs)[i];
    if (want_streams) {
      ArenaScope alloc(ops_);
      ComponentScope scope(ops_, Component::kHead);
      float* xs = alloc(R * width);
      ops_->gather_rows(x, width, rows, xs);
      out.streams.resize(size_t(R * width));
      ops_->copy_to_host(xs, R * width, out.streams.data());
    }
  }
}

namespace {

// Validates a batch; `ids_of(i)` reads chunk i's token ids.
template <typename Chunk>
Status check_chunks(const DeepSeekV4Config& c, std::span<Chunk> batch, bool mtp,
                    std::span<const int32_t> (*ids_of)(const Chunk&)) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const Chunk& ch = batch[i];
    const std::string what = "forward: sequence " + std::to_string(i);
    if (ch.state == nullptr) return invalid_argument(what + ": no state");
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].state == ch.state) return invalid_argument(what + ": state used twice");
    }
    const size_t layers = StateAccess::num_layers(ch.state, mtp);
    if (layers != size_t(mtp ? c.num_nextn_predict_layers : c.num_hidden_layers) ||
        layers == 0) {
      return invalid_argument("forward: a sequence state was not made for this model");
    }
    std::span<const int32_t> ids = ids_of(ch);
    for (int32_t id : ids) {
      if (id < 0 || id >= c.vocab_size) {
        return invalid_argument(what + ": token id " + std::to_string(id) +
                                " is outside [0, vocab_size = " + std::to_string(c.vocab_size) +
                                ")");
      }
    }
    const int64_t start = StateAccess::position(ch.state, mtp);
    if (start + int64_t(ids.size()) > c.max_position_embeddings) {
      return out_of_range(
          what + ": positions up to " + std::to_string(start + ids.size()) +
          " exceed max_position_embeddings = " + std::to_string(c.max_position_embeddings));
    }
    for (int64_t r : ch.logit_rows) {
      if (r < 0 || r >= int64_t(ids.size())) {
        return invalid_argument(what + ": logit row " + std::to_string(r) + " outside the chunk");
      }
    }
    if constexpr (requires { ch.backend_sample; }) {
      if (ch.backend_sample.has_value()) {
        const cpu::RowSampling& b = *ch.backend_sample;
        if (ch.argmax_only) return invalid_argument(what + ": argmax_only and backend_sample");
        if (!(b.temperature >= 0 && b.temperature <= 100) || !(b.top_p > 0 && b.top_p <= 1) ||
            !(b.min_p >= 0 && b.min_p <= 1) || !(b.uniform >= 0 && b.uniform < 1)) {
          return invalid_argument(what +
                                  ": backend_sample needs temperature in [0, 100], top_p in "
                                  "(0, 1], min_p in [0, 1] and a uniform draw in [0, 1)");
        }
      }
    }
    if constexpr (requires { ch.stream_rows; }) {
      for (int64_t r : ch.stream_rows) {
        if (r < 0 || r >= int64_t(ids.size())) {
          return invalid_argument(what + ": stream row " + std::to_string(r) +
                                  " outside the chunk");
        }
      }
    }
    // A checkpointed state may not advance past what its checkpoint can undo.
    const SequenceCheckpoint& cp = ch.state->checkpoint(mtp);
    if (cp.armed && start + int64_t(ids.size()) > cp.position + cp.max_tokens) {
      return failed_precondition(what + ": the speculative checkpoint at position " +
                                 std::to_string(cp.position) + " covers " +
                                 std::to_string(cp.max_tokens) + " positions only");
    }
  }
  return ok_status();
}

// Lays the chunks out as one step.
template <typename Chunk>
StepPlan make_plan(std::span<Chunk> chunks, bool mtp,
                   std::span<const int32_t> (*ids_of)(const Chunk&)) {
  StepPlan plan;
  plan.mtp = mtp;
  for (size_t i = 0; i < chunks.size(); ++i) {
    StepPlan::Seq s;
    s.state = chunks[i].state;
    s.begin = plan.num_tokens;
    std::span<const int32_t> ids = ids_of(chunks[i]);
    s.count = int64_t(ids.size());
    s.start = StateAccess::position(s.state, mtp);
    for (int64_t j = 0; j < s.count; ++j) {
      plan.ids.push_back(ids[size_t(j)]);
      plan.positions.push_back(s.start + j);
      plan.seq_of.push_back(int32_t(i));
    }
    plan.num_tokens += s.count;
    plan.seqs.push_back(s);
  }
  return plan;
}

}  // namespace

Status Forward::run(std::span<SequenceChunk> chunks, std::vector<ChunkOutput>* outputs,
                    bool want_streams) const {
  const DeepSeekV4Config& c = config();
  auto ids_of = [](const SequenceChunk& ch) { return ch.tokens; };
  DS_RETURN_IF_ERROR(check_chunks<SequenceChunk>(c, chunks, false, ids_of));
  const StepPlan plan = make_plan<SequenceChunk>(chunks, false, ids_of);
  const int64_t N = plan.num_tokens, D = c.hidden_size, hc = c.hc_mult;
  StepScope step(ops_, plan);
  ArenaScope alloc(ops_);

  // §4 embedding, repeated into the hc streams.
  float* x = alloc(N * hc * D);  // [N, hc, D]
  {
    ComponentScope scope(ops_, Component::kEmbed);
    ops_->embed(weights_->embed, hc, x);
  }
  for (size_t l = 0; l < weights_->layers.size(); ++l) {
    block(weights_->layers[l], int64_t(l), N, x);
  }
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::optional<cpu::RowSampling>> backend_tokens;
  for (const SequenceChunk& ch : chunks) {
    rows.push_back(ch.logit_rows);
    backend_tokens.push_back(ch.argmax_only ? std::optional<cpu::RowSampling>(cpu::RowSampling{})
                                            : ch.backend_sample);
  }
  outputs_for(rows, backend_tokens, plan, x, weights_->hc_head, weights_->norm, want_streams,
              outputs);
  const int64_t width = hc * D;
  for (size_t i = 0; i < chunks.size(); ++i) {  // speculative decoding: streams for the MTP
    const std::vector<int64_t>& sr = chunks[i].stream_rows;
    if (sr.empty()) continue;
    std::vector<int64_t> plan_rows;
    for (int64_t r : sr) plan_rows.push_back(plan.seqs[i].begin + r);
    ArenaScope scratch(ops_);
    ComponentScope scope(ops_, Component::kHead);
    float* xs = scratch(int64_t(sr.size()) * width);
    ops_->gather_rows(x, width, plan_rows, xs);
    (*outputs)[i].row_streams.resize(sr.size() * size_t(width));
    ops_->copy_to_host(xs, int64_t(sr.size()) * width, (*outputs)[i].row_streams.data());
  }
  DS_RETURN_IF_ERROR(ops_->step_status());
  for (const StepPlan::Seq& s : plan.seqs) StateAccess::position(s.state, false) += s.count;
  return ok_status();
}

Status Forward::run_mtp(std::span<MtpChunk> chunks, std::vector<ChunkOutput>* outputs,
                        bool want_streams) const {
  const DeepSeekV4Config& c = config();
  if (weights_->mtp.empty()) return failed_precondition("forward: the model has no MTP layer");
  auto ids_of = [](const MtpChunk& ch) { return ch.next_tokens; };
  DS_RETURN_IF_ERROR(check_chunks<MtpChunk>(c, chunks, true, ids_of));
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  for (const MtpChunk& ch : chunks) {
    if (ch.streams.size() != ch.next_tokens.size() * size_t(hc * D)) {
      return invalid_argument("forward: MTP streams must be [num_tokens, hc_mult, hidden]");
    }
  }
  const MtpWeights& M = weights_->mtp[0];
  const StepPlan plan = make_plan<MtpChunk>(chunks, true, ids_of);
  const int64_t N = plan.num_tokens;
  const bool actq = options_.flags.activation_quantization;
  const float eps = float(c.rms_norm_eps);
  Ops& ops = *ops_;
  StepScope step(ops_, plan);
  ArenaScope alloc(ops_);

  // The main model's streams (host) into the backend's memory.
  float* streams = alloc(N * hc * D);  // [N, hc, D]
  {
    ComponentScope scope(ops_, Component::kMtpInput);
    std::vector<float> host;
    host.reserve(size_t(N * hc * D));
    for (const MtpChunk& ch : chunks) host.insert(host.end(), ch.streams.begin(), ch.streams.end());
    ops.copy_from_host(host.data(), N * hc * D, streams);
  }

  // §9: X = e_proj(enorm(embed[next])) broadcast + h_proj(hnorm(Xm)) per stream.
  float* x = alloc(N * hc * D);
  {
    ComponentScope scope(ops_, Component::kMtpInput);
    float* e = alloc(N * D);
    float* ep = alloc(N * D);
    ops.embed(weights_->embed, 1, e);
    ops.rms_norm(e, M.enorm.data(), N, D, eps, e);
    round_elementwise_output(e, N * D);
    ops.linear(e, N, M.e_proj, actq, ep, options_.round_bf16);
    float* hp = alloc(N * hc * D);
    ops.rms_norm(streams, M.hnorm.data(), N * hc, D, eps, streams);
    round_elementwise_output(streams, N * hc * D);
    ops.linear(streams, N * hc, M.h_proj, actq, hp, options_.round_bf16);
    ops.add_broadcast(ep, hp, hc, D, x);
    maybe_round(x, N * hc * D);
  }
  block(M.block, 0, N, x);

  std::vector<std::vector<int64_t>> rows;
  for (const MtpChunk& ch : chunks) rows.push_back(ch.logit_rows);
  outputs_for(rows, {}, plan, x, M.hc_head, M.norm, want_streams, outputs);
  DS_RETURN_IF_ERROR(ops_->step_status());
  for (const StepPlan::Seq& s : plan.seqs) StateAccess::position(s.state, true) += s.count;
  return ok_status();
}

Status Forward::checkpoint(SequenceState* state, bool mtp, int64_t max_tokens) const {
  const DeepSeekV4Config& c = config();
  if (state == nullptr) return invalid_argument("checkpoint: no state");
  if (StateAccess::num_layers(state, mtp) !=
      size_t(mtp ? c.num_nextn_predict_layers : c.num_hidden_layers)) {
    return invalid_argument("checkpoint: the sequence state was not made for this model");
  }
  if (max_tokens < 1 || max_tokens > c.sliding_window) {
    return invalid_argument("checkpoint: max_tokens must be in [1, sliding_window = " +
                            std::to_string(c.sliding_window) + "]");
  }
  SequenceCheckpoint& cp = state->checkpoints_[mtp ? 1 : 0];
  cp.armed = false;
  const int64_t position = StateAccess::position(state, mtp);
  cp.position = position;
  cp.max_tokens = max_tokens;
  DS_RETURN_IF_ERROR(ops_->checkpoint(state, mtp, position, max_tokens));
  cp.armed = true;
  return ok_status();
}

Status Forward::rollback(SequenceState* state, bool mtp, int64_t to_position) const {
  if (state == nullptr) return invalid_argument("rollback: no state");
  SequenceCheckpoint& cp = state->checkpoints_[mtp ? 1 : 0];
  if (!cp.armed) return failed_precondition("rollback: the state has no checkpoint");
  const int64_t position = StateAccess::position(state, mtp);
  if (to_position < cp.position || to_position > position) {
    return invalid_argument("rollback: position " + std::to_string(to_position) +
                            " is outside [checkpoint " + std::to_string(cp.position) +
                            ", current " + std::to_string(position) + "]");
  }
  DS_RETURN_IF_ERROR(ops_->rollback(state, mtp, to_position));
  StateAccess::position(state, mtp) = to_position;
  cp.armed = false;
  return ok_status();
}

}  // namespace ds::dsv4
