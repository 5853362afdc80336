// The DeepSeek-V4 forward over the CPU reference kernels (see forward.h). Token-wise work
// (linears, norms, mHC, MoE) runs once over all tokens of the batch; the attention core runs per
// token with that token's own key set, in parallel over tokens.
//
// bf16 rounding points (reference mode, `round_bf16`; REF keeps these tensors in bf16): the mHC
// pre output u, every RMSNorm output (attn_norm, ffn_norm, q_norm, kv_norm, per-head q norm), the
// outputs of wq_a, wq_b, wkv, the indexer's wq_b and weights_proj, the RoPE'd q and kv, the
// attention output before and after its inverse RoPE, the wo_a and wo_b outputs, the MoE output,
// the mHC post output (the residual streams), the final head collapse and norm, and in the MTP
// layer the enorm / hnorm / e_proj / h_proj outputs and their sum. Inside the kernels:
// compressor_finish_entry, indexer_prepare_query and the MoE experts round where REF does.
#include "model/deepseek_v4/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/compressor.h"
#include "kernels/cpu/indexer.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/output_projection.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ds::dsv4 {

// The tokens of one call, sequences concatenated.
struct Forward::Batch {
  struct Seq {
    SequenceState* state = nullptr;
    int64_t begin = 0;  // first row in the batch
    int64_t count = 0;  // rows
    int64_t start = 0;  // position of the first row
  };
  int64_t num_tokens = 0;
  std::vector<int32_t> ids;        // [num_tokens]
  std::vector<int64_t> positions;  // [num_tokens]
  std::vector<int32_t> seq_of;     // [num_tokens] index into seqs
  std::vector<Seq> seqs;
};

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

}  // namespace

// SequenceState's private members (layer states, positions) are reached through this friend.
class ForwardStateAccess {
 public:
  static LayerState& layer(SequenceState* s, bool mtp, int64_t slot) {
    return mtp ? s->mtp_layers_[size_t(slot)] : s->layers_[size_t(slot)];
  }
  static int64_t& position(SequenceState* s, bool mtp) {
    return mtp ? s->mtp_position_ : s->position_;
  }
};

namespace {
LayerState& layer_state(SequenceState* s, bool mtp, int64_t slot) {
  return ForwardStateAccess::layer(s, mtp, slot);
}
}  // namespace

void Forward::maybe_round(float* x, int64_t n) const {
  if (options_.round_bf16) cpu::round_to_bf16(x, n);
}

void Forward::attention(const LayerWeights& L, bool mtp, int64_t slot, const Batch& batch,
                        const float* h, float* out) const {
  const DeepSeekV4Config& c = config();
  const cpu::NumericsFlags& f = options_.flags;
  const bool actq = f.activation_quantization;
  const int64_t N = batch.num_tokens, D = c.hidden_size, H = c.num_attention_heads;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim, W = c.sliding_window;
  const float eps = float(c.rms_norm_eps);

  // §7.1 query.
  std::vector<float> qr(size_t(N * c.q_lora_rank));  // [N, q_lora_rank]
  cpu::linear(h, N, L.wq_a, actq, qr.data());
  maybe_round(qr.data(), N * c.q_lora_rank);
  cpu::rms_norm(qr.data(), L.q_norm.data(), N, c.q_lora_rank, eps, qr.data());
  maybe_round(qr.data(), N * c.q_lora_rank);
  std::vector<float> q(size_t(N * H * hd));  // [N, H, hd]
  cpu::linear(qr.data(), N, L.wq_b, actq, q.data());
  maybe_round(q.data(), N * H * hd);
  cpu::rms_norm_heads(q.data(), N, H, hd, eps);
  maybe_round(q.data(), N * H * hd);
  for (int64_t i = 0; i < N; ++i) {
    cpu::rope_rotate(q.data() + i * H * hd, H, hd, rd, L.inv_freq.data(),
                     batch.positions[size_t(i)], cpu::RopeDirection::kForward);
  }
  maybe_round(q.data(), N * H * hd);

  // §7.2 key/value (one vector per token).
  std::vector<float> kv(size_t(N * hd));  // [N, hd]
  cpu::linear(h, N, L.wkv, actq, kv.data());
  maybe_round(kv.data(), N * hd);
  cpu::rms_norm(kv.data(), L.kv_norm.data(), N, hd, eps, kv.data());
  maybe_round(kv.data(), N * hd);
  for (int64_t i = 0; i < N; ++i) {
    cpu::rope_rotate(kv.data() + i * hd, 1, hd, rd, L.inv_freq.data(), batch.positions[size_t(i)],
                     cpu::RopeDirection::kForward);
  }
  maybe_round(kv.data(), N * hd);
  if (f.fp8_kv_simulation) cpu::simulate_fp8_kv_nope(kv.data(), N, hd, rd);

  const int64_t ratio = L.compress_ratio;
  const bool csa = L.kind == LayerKind::kCsa;
  const int64_t ihd = c.index_head_dim, ih = c.index_n_heads;

  // §7.7 indexer query and weights (CSA).
  std::vector<float> q_index, w_index;  // [N, ih, ihd], [N, ih]
  if (csa) {
    q_index.resize(size_t(N * ih * ihd));
    cpu::linear(qr.data(), N, L.indexer_wq_b, actq, q_index.data());
    maybe_round(q_index.data(), N * ih * ihd);
    for (int64_t i = 0; i < N; ++i) {
      cpu::indexer_prepare_query(q_index.data() + i * ih * ihd, ih, ihd, rd, L.inv_freq.data(),
                                 batch.positions[size_t(i)], f.indexer_fp4_simulation,
                                 options_.round_bf16);
    }
    w_index.resize(size_t(N * ih));
    cpu::linear(h, N, L.indexer_weights_proj, false, w_index.data());
    maybe_round(w_index.data(), N * ih);
    for (int64_t i = 0; i < N; ++i) {
      cpu::indexer_scale_weights(w_index.data() + i * ih, ih, ihd, w_index.data() + i * ih);
    }
    maybe_round(w_index.data(), N * ih);
  }

  // §7.6 compressors: project every token, then feed each sequence's chunk to its state and
  // finish the emitted entries. Entries are emitted before any query of the chunk attends; a
  // query only sees entries w < floor((t+1)/ratio), so this equals REF's per-token order.
  auto run_compressor = [&](const CompressorWeights& cw, cpu::CompressorKind kind, bool simulate) {
    const int64_t width = cw.config.width(), d = cw.config.head_dim;
    std::vector<float> ckv(size_t(N * width)), cscore(size_t(N * width));  // [N, width]
    cpu::compressor_project(cw.config, cw.wkv, cw.wgate, h, N, ckv.data(), cscore.data());
    cpu::CompressorFinishParams fp;
    fp.kind = kind;
    fp.norm_weight = cw.norm.data();
    fp.inv_freq = L.inv_freq.data();
    fp.norm_eps = eps;
    fp.simulate_quantization = simulate;
    fp.round_bf16 = options_.round_bf16;
    std::vector<float> entries;
    for (const Batch::Seq& s : batch.seqs) {
      LayerState& st = layer_state(s.state, mtp, slot);
      const bool indexer = kind == cpu::CompressorKind::kIndexer;
      cpu::CompressorState* cs = indexer ? &st.indexer_compressor : &st.compressor;
      entries.resize(size_t((s.count / ratio + 1) * d));
      const int64_t n = cpu::compressor_prefill(cw.config, cs, cw.ape, ckv.data() + s.begin * width,
                                                cscore.data() + s.begin * width, s.start, s.count,
                                                entries.data());
      const int64_t first = s.start / ratio;
      std::vector<float>& store = indexer ? st.index_keys : st.compressed;
      int64_t& stored = indexer ? st.num_index_keys : st.num_compressed;
      for (int64_t e = 0; e < n; ++e) {
        cpu::compressor_finish_entry(cw.config, fp, first + e, entries.data() + e * d);
      }
      store.insert(store.end(), entries.begin(), entries.begin() + n * d);
      stored += n;
    }
  };
  if (csa) {
    run_compressor(L.indexer_compressor, cpu::CompressorKind::kIndexer, f.indexer_fp4_simulation);
  }
  if (ratio != 0) {
    run_compressor(L.compressor, cpu::CompressorKind::kAttention, f.fp8_kv_simulation);
  }

  // §7.4/§7.5 per-token sparse attention with sink over window + compressed keys.
  std::vector<float> o(size_t(N * H * hd));  // [N, H, hd]
  const float softmax_scale = float(1.0 / std::sqrt(double(hd)));
  DS_OMP_PARALLEL_FOR_DYNAMIC
  for (int64_t i = 0; i < N; ++i) {
    const Batch::Seq& s = batch.seqs[size_t(batch.seq_of[size_t(i)])];
    LayerState& st = layer_state(s.state, mtp, slot);
    const int64_t t = batch.positions[size_t(i)];
    thread_local std::vector<const float*> keys;
    thread_local std::vector<int32_t> selected;
    keys.clear();
    for (int64_t p = std::max<int64_t>(0, t - W + 1); p <= t; ++p) {
      keys.push_back(p >= s.start ? kv.data() + (s.begin + p - s.start) * hd
                                  : st.window.data() + (p % st.window_slots) * hd);
    }
    if (ratio != 0) {
      const int64_t visible = (t + 1) / ratio;
      if (csa) {
        selected.resize(size_t(std::min<int64_t>(visible, c.index_topk)));
        const int64_t n = cpu::indexer_select(q_index.data() + i * ih * ihd,
                                              w_index.data() + i * ih, st.index_keys.data(),
                                              visible, ih, ihd, c.index_topk, selected.data());
        for (int64_t k = 0; k < n; ++k) {
          keys.push_back(st.compressed.data() + int64_t(selected[size_t(k)]) * hd);
        }
      } else {
        for (int64_t w = 0; w < visible; ++w) keys.push_back(st.compressed.data() + w * hd);
      }
    }
    cpu::SparseAttentionParams p;
    p.q = q.data() + i * H * hd;
    p.keys = keys.data();
    p.num_keys = int64_t(keys.size());
    p.num_heads = H;
    p.head_dim = hd;
    p.softmax_scale = softmax_scale;
    p.sink = L.attn_sink;
    p.out = o.data() + i * H * hd;
    cpu::sparse_attention(p);
  }
  maybe_round(o.data(), N * H * hd);
  for (int64_t i = 0; i < N; ++i) {
    cpu::rope_rotate(o.data() + i * H * hd, H, hd, rd, L.inv_freq.data(),
                     batch.positions[size_t(i)], cpu::RopeDirection::kInverse);
  }
  maybe_round(o.data(), N * H * hd);

  // The chunk's raw kv joins the window rings (after every query of the chunk has read them).
  for (const Batch::Seq& s : batch.seqs) {
    LayerState& st = layer_state(s.state, mtp, slot);
    for (int64_t i = std::max<int64_t>(0, s.count - st.window_slots); i < s.count; ++i) {
      const float* src = kv.data() + (s.begin + i) * hd;
      std::copy(src, src + hd, st.window.data() + ((s.start + i) % st.window_slots) * hd);
    }
  }

  // §7.8 grouped output projection; wo_a never quantizes its input (§2).
  std::vector<float> z(size_t(N * L.wo_a.out_features));  // [N, o_groups * o_lora_rank]
  cpu::grouped_output_projection(o.data(), N, c.o_groups, L.wo_a, false, z.data());
  maybe_round(z.data(), N * L.wo_a.out_features);
  cpu::linear(z.data(), N, L.wo_b, actq, out);
  maybe_round(out, N * D);
}

Status Forward::block(const LayerWeights& L, bool mtp, int64_t slot, const Batch& batch,
                      std::vector<float>* x) const {
  const DeepSeekV4Config& c = config();
  const cpu::NumericsFlags& f = options_.flags;
  const int64_t N = batch.num_tokens, D = c.hidden_size, hc = c.hc_mult;
  const float eps = float(c.rms_norm_eps);
  const cpu::MhcConfig mc = mhc_config(c);
  std::vector<float> u(size_t(N * D)), post(size_t(N * hc)), comb(size_t(N * hc * hc));
  std::vector<float> branch(size_t(N * D)), x_new(size_t(N * hc * D));

  // §6 attention site.
  cpu::mhc_pre(mc, L.hc_attn, x->data(), N, u.data(), post.data(), comb.data());
  maybe_round(u.data(), N * D);
  cpu::rms_norm(u.data(), L.attn_norm.data(), N, D, eps, u.data());
  maybe_round(u.data(), N * D);
  attention(L, mtp, slot, batch, u.data(), branch.data());
  cpu::mhc_post(mc, branch.data(), x->data(), post.data(), comb.data(), N, x_new.data());
  maybe_round(x_new.data(), N * hc * D);
  x->swap(x_new);

  // §6/§8 MoE site.
  cpu::mhc_pre(mc, L.hc_ffn, x->data(), N, u.data(), post.data(), comb.data());
  maybe_round(u.data(), N * D);
  cpu::rms_norm(u.data(), L.ffn_norm.data(), N, D, eps, u.data());
  maybe_round(u.data(), N * D);
  cpu::MoeParams mp;
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
  mp.round_bf16 = options_.round_bf16;
  cpu::moe_forward(mp, u.data(), batch.ids.data(), N, branch.data());
  maybe_round(branch.data(), N * D);
  cpu::mhc_post(mc, branch.data(), x->data(), post.data(), comb.data(), N, x_new.data());
  maybe_round(x_new.data(), N * hc * D);
  x->swap(x_new);
  return ok_status();
}

void Forward::head(const float* x, int64_t rows, const cpu::MhcHeadWeights& hc_head,
                   const std::vector<float>& norm, float* logits) const {
  const DeepSeekV4Config& c = config();
  const int64_t D = c.hidden_size;
  std::vector<float> y(size_t(rows * D));  // [rows, D]
  cpu::mhc_head(mhc_config(c), hc_head, x, rows, y.data());
  maybe_round(y.data(), rows * D);
  cpu::rms_norm(y.data(), norm.data(), rows, D, float(c.rms_norm_eps), y.data());
  maybe_round(y.data(), rows * D);
  // §4: fp32 logits; the head is a bf16 linear (input never quantized).
  cpu::linear(y.data(), rows, weights_->head, false, logits);
}

namespace {

// Validates a batch and lays it out; `count_of(i)` / `ids_of(i)` read chunk i.
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
    std::span<const int32_t> ids = ids_of(ch);
    for (int32_t id : ids) {
      if (id < 0 || id >= c.vocab_size) {
        return invalid_argument(what + ": token id " + std::to_string(id) +
                                " is outside [0, vocab_size = " + std::to_string(c.vocab_size) +
                                ")");
      }
    }
    const int64_t start = ForwardStateAccess::position(ch.state, mtp);
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
  }
  return ok_status();
}

}  // namespace

Status Forward::run(std::span<SequenceChunk> chunks, std::vector<ChunkOutput>* outputs,
                    bool want_streams) const {
  const DeepSeekV4Config& c = config();
  DS_RETURN_IF_ERROR(check_chunks<SequenceChunk>(
      c, chunks, false, [](const SequenceChunk& ch) { return ch.tokens; }));
  for (const SequenceChunk& ch : chunks) {
    if (ch.state->layers_.size() != size_t(c.num_hidden_layers)) {
      return invalid_argument("forward: a sequence state was not made for this model");
    }
  }
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  Batch batch;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Batch::Seq s;
    s.state = chunks[i].state;
    s.begin = batch.num_tokens;
    s.count = int64_t(chunks[i].tokens.size());
    s.start = s.state->position_;
    for (int64_t j = 0; j < s.count; ++j) {
      batch.ids.push_back(chunks[i].tokens[size_t(j)]);
      batch.positions.push_back(s.start + j);
      batch.seq_of.push_back(int32_t(i));
    }
    batch.num_tokens += s.count;
    batch.seqs.push_back(s);
  }
  const int64_t N = batch.num_tokens;

  // §4 embedding, repeated into the hc streams.
  std::vector<float> x(size_t(N * hc * D));  // [N, hc, D]
  for (int64_t i = 0; i < N; ++i) {
    float* row = x.data() + i * hc * D;
    cpu::dequantize_weight_row(weights_->embed, batch.ids[size_t(i)], row);
    for (int64_t k = 1; k < hc; ++k) std::copy(row, row + D, row + k * D);
  }
  for (size_t l = 0; l < weights_->layers.size(); ++l) {
    DS_RETURN_IF_ERROR(block(weights_->layers[l], false, int64_t(l), batch, &x));
  }

  outputs->assign(chunks.size(), ChunkOutput{});
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& rows = chunks[i].logit_rows;
    const int64_t R = int64_t(rows.size());
    std::vector<float> xs(size_t(R * hc * D));  // [R, hc, D]
    for (int64_t r = 0; r < R; ++r) {
      const float* src = x.data() + (batch.seqs[i].begin + rows[size_t(r)]) * hc * D;
      std::copy(src, src + hc * D, xs.data() + r * hc * D);
    }
    ChunkOutput& out = (*outputs)[i];
    out.logits.resize(size_t(R * c.vocab_size));
    if (R > 0) head(xs.data(), R, weights_->hc_head, weights_->norm, out.logits.data());
    if (want_streams) out.streams = std::move(xs);
  }
  for (const Batch::Seq& s : batch.seqs) s.state->position_ += s.count;
  return ok_status();
}

Status Forward::run_mtp(std::span<MtpChunk> chunks, std::vector<ChunkOutput>* outputs,
                        bool want_streams) const {
  const DeepSeekV4Config& c = config();
  if (weights_->mtp.empty()) return failed_precondition("forward: the model has no MTP layer");
  DS_RETURN_IF_ERROR(
      check_chunks<MtpChunk>(c, chunks, true, [](const MtpChunk& ch) { return ch.next_tokens; }));
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  for (const MtpChunk& ch : chunks) {
    if (ch.state->mtp_layers_.empty()) {
      return invalid_argument("forward: a sequence state was not made for this model");
    }
    if (ch.streams.size() != ch.next_tokens.size() * size_t(hc * D)) {
      return invalid_argument("forward: MTP streams must be [num_tokens, hc_mult, hidden]");
    }
  }
  const MtpWeights& M = weights_->mtp[0];
  Batch batch;
  std::vector<float> streams;  // [N, hc, D]
  for (size_t i = 0; i < chunks.size(); ++i) {
    Batch::Seq s;
    s.state = chunks[i].state;
    s.begin = batch.num_tokens;
    s.count = int64_t(chunks[i].next_tokens.size());
    s.start = s.state->mtp_position_;
    for (int64_t j = 0; j < s.count; ++j) {
      batch.ids.push_back(chunks[i].next_tokens[size_t(j)]);
      batch.positions.push_back(s.start + j);
      batch.seq_of.push_back(int32_t(i));
    }
    streams.insert(streams.end(), chunks[i].streams.begin(), chunks[i].streams.end());
    batch.num_tokens += s.count;
    batch.seqs.push_back(s);
  }
  const int64_t N = batch.num_tokens;
  const bool actq = options_.flags.activation_quantization;
  const float eps = float(c.rms_norm_eps);

  // §9: X = e_proj(enorm(embed[next])) broadcast + h_proj(hnorm(Xm)) per stream.
  std::vector<float> e(size_t(N * D)), ep(size_t(N * D));
  for (int64_t i = 0; i < N; ++i) {
    cpu::dequantize_weight_row(weights_->embed, batch.ids[size_t(i)], e.data() + i * D);
  }
  cpu::rms_norm(e.data(), M.enorm.data(), N, D, eps, e.data());
  maybe_round(e.data(), N * D);
  cpu::linear(e.data(), N, M.e_proj, actq, ep.data());
  maybe_round(ep.data(), N * D);
  std::vector<float> hp(size_t(N * hc * D));
  cpu::rms_norm(streams.data(), M.hnorm.data(), N * hc, D, eps, streams.data());
  maybe_round(streams.data(), N * hc * D);
  cpu::linear(streams.data(), N * hc, M.h_proj, actq, hp.data());
  maybe_round(hp.data(), N * hc * D);
  std::vector<float> x(size_t(N * hc * D));
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < D; ++d) {
        x[size_t((i * hc + k) * D + d)] = ep[size_t(i * D + d)] + hp[size_t((i * hc + k) * D + d)];
      }
    }
  }
  maybe_round(x.data(), N * hc * D);
  DS_RETURN_IF_ERROR(block(M.block, true, 0, batch, &x));

  outputs->assign(chunks.size(), ChunkOutput{});
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& rows = chunks[i].logit_rows;
    const int64_t R = int64_t(rows.size());
    std::vector<float> xs(size_t(R * hc * D));
    for (int64_t r = 0; r < R; ++r) {
      const float* src = x.data() + (batch.seqs[i].begin + rows[size_t(r)]) * hc * D;
      std::copy(src, src + hc * D, xs.data() + r * hc * D);
    }
    ChunkOutput& out = (*outputs)[i];
    out.logits.resize(size_t(R * c.vocab_size));
    if (R > 0) head(xs.data(), R, M.hc_head, M.norm, out.logits.data());
    if (want_streams) out.streams = std::move(xs);
  }
  for (const Batch::Seq& s : batch.seqs) s.state->mtp_position_ += s.count;
  return ok_status();
}

}  // namespace ds::dsv4
