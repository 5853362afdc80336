// CpuOps (see cpu_ops.h): each op calls its reference kernel; the per-sequence ops hold the loops
// that used to live in the forward (the compressor chunk feed, the per-token key-set assembly of
// §7.4, the window-ring update), unchanged, so results are bit-identical to the reference.
#include "model/deepseek_v4/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/indexer.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/output_projection.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant.h"
#include "model/deepseek_v4/state_access.h"

namespace ds::dsv4 {

void* CpuOps::alloc_bytes(int64_t bytes) {
  const int64_t n = std::max<int64_t>((bytes + 3) / 4, 1);
  buffers_.push_back(std::make_unique_for_overwrite<float[]>(size_t(n)));
  return buffers_.back().get();
}

void CpuOps::release(size_t mark) {
  while (buffers_.size() > mark) buffers_.pop_back();
}

void CpuOps::copy_to_host(const float* src, int64_t n, float* dst) {
  std::copy(src, src + n, dst);
}

void CpuOps::copy_from_host(const float* src, int64_t n, float* dst) {
  std::copy(src, src + n, dst);
}

void argmax_rows_host(const float* x, int64_t rows, int64_t n, int32_t* ids, uint8_t* finite) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    int64_t best = 0;
    bool all_finite = true;
    for (int64_t i = 0; i < n; ++i) {
      all_finite = all_finite && std::isfinite(row[i]);
      if (row[i] > row[best] || std::isnan(row[best])) best = i;  // strict: the lowest index
    }
    ids[r] = int32_t(best);
    finite[r] = all_finite ? 1 : 0;
  }
}

void Ops::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids, uint8_t* finite) {
  std::vector<float> row(size_t(std::max<int64_t>(n, 0)));
  for (int64_t r = 0; r < rows; ++r) {
    copy_to_host(x + r * n, n, row.data());
    argmax_rows_host(row.data(), 1, n, ids + r, finite + r);
  }
}

void Ops::sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                      int32_t* ids, uint8_t* finite) {
  std::vector<float> row(size_t(std::max<int64_t>(n, 0)));
  for (int64_t r = 0; r < rows; ++r) {
    copy_to_host(x + r * n, n, row.data());
    cpu::sample_rows(row.data(), 1, n, params + r, ids + r, finite + r);
  }
}

void CpuOps::sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                         int32_t* ids, uint8_t* finite) {
  cpu::sample_rows(x, rows, n, params, ids, finite);
}

void CpuOps::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                         uint8_t* finite) {
  argmax_rows_host(x, rows, n, ids, finite);
}

void CpuOps::embed(const cpu::LinearWeight& table, int64_t copies, float* x) {
  const int64_t D = table.in_features;
  for (int64_t i = 0; i < plan_->num_tokens; ++i) {
    float* row = x + i * copies * D;
    cpu::dequantize_weight_row(table, plan_->ids[size_t(i)], row);
    for (int64_t k = 1; k < copies; ++k) std::copy(row, row + D, row + k * D);
  }
}

void CpuOps::linear(const float* x, int64_t rows, const cpu::LinearWeight& w,
                    bool quantize_activations, float* y, bool round_output) {
  cpu::linear(x, rows, w, quantize_activations, y);
  if (round_output) cpu::round_to_bf16(y, rows * w.out_features);
}

void CpuOps::grouped_output_projection(const float* o, int64_t groups,
                                       const cpu::LinearWeight& wo_a, float* z, bool round_output) {
  // §2: wo_a never quantizes its input.
  cpu::grouped_output_projection(o, plan_->num_tokens, groups, wo_a, false, z);
  if (round_output) cpu::round_to_bf16(z, plan_->num_tokens * wo_a.out_features);
}

void CpuOps::rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      float* y) {
  cpu::rms_norm(x, weight, rows, dim, eps, y);
}

void CpuOps::rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim, float eps) {
  cpu::rms_norm_heads(x, rows, heads, head_dim, eps);
}

void CpuOps::rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim,
                  const float* inv_freq, cpu::RopeDirection direction) {
  for (int64_t i = 0; i < plan_->num_tokens; ++i) {
    cpu::rope_rotate(x + i * heads * head_dim, heads, head_dim, rope_dim, inv_freq,
                     plan_->positions[size_t(i)], direction);
  }
}

void CpuOps::round_bf16(float* x, int64_t n) { cpu::round_to_bf16(x, n); }

void CpuOps::simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) {
  cpu::simulate_fp8_kv_nope(kv, rows, head_dim, rope_dim);
}

void CpuOps::indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                                   const float* inv_freq, bool fp4_simulation, bool round_bf16) {
  for (int64_t i = 0; i < plan_->num_tokens; ++i) {
    cpu::indexer_prepare_query(q + i * heads * head_dim, heads, head_dim, rope_dim, inv_freq,
                               plan_->positions[size_t(i)], fp4_simulation, round_bf16);
  }
}

void CpuOps::indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) {
  for (int64_t i = 0; i < plan_->num_tokens; ++i) {
    cpu::indexer_scale_weights(w + i * heads, heads, head_dim, w + i * heads);
  }
}

void CpuOps::mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                     const float* x, int64_t rows, float* u, float* post, float* comb) {
  cpu::mhc_pre(config, weights, x, rows, u, post, comb);
}

void CpuOps::mhc_post(const cpu::MhcConfig& config, const float* o, const float* x,
                      const float* post, const float* comb, int64_t rows, float* x_new) {
  cpu::mhc_post(config, o, x, post, comb, rows, x_new);
}

void CpuOps::mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights,
                      const float* x, int64_t rows, float* y) {
  cpu::mhc_head(config, weights, x, rows, y);
}

void CpuOps::moe(const MoeSite& site, const float* x, float* y) {
  cpu::moe_forward(site, x, plan_->ids.data(), plan_->num_tokens, y);
}

void CpuOps::add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim, float* x) {
  for (int64_t i = 0; i < plan_->num_tokens; ++i) {
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < dim; ++d) {
        x[(i * hc + k) * dim + d] = e[i * dim + d] + h[(i * hc + k) * dim + d];
      }
    }
  }
}

void CpuOps::gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                         float* out) {
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* src = x + rows[r] * width;
    std::copy(src, src + width, out + int64_t(r) * width);
  }
}

// §7.6: emitted entries are finished and appended before any query of the chunk attends; a query
// only sees entries w < floor((t+1)/ratio), so this equals REF's per-token order.
void CpuOps::compress(int64_t slot, const CompressorWeights& cw, cpu::CompressorKind kind,
                      const cpu::CompressorFinishParams& finish, const float* h) {
  const int64_t N = plan_->num_tokens, ratio = cw.config.ratio;
  const int64_t width = cw.config.width(), d = cw.config.head_dim;
  std::vector<float> ckv(size_t(N * width)), cscore(size_t(N * width));  // [N, width]
  cpu::compressor_project(cw.config, cw.wkv, cw.wgate, h, N, ckv.data(), cscore.data());
  const bool indexer = kind == cpu::CompressorKind::kIndexer;
  std::vector<float> entries;
  for (const StepPlan::Seq& s : plan_->seqs) {
    LayerState& st = StateAccess::layer(s.state, plan_->mtp, slot);
    cpu::CompressorState* cs = indexer ? &st.indexer_compressor : &st.compressor;
    entries.resize(size_t((s.count / ratio + 1) * d));
    const int64_t n =
        cpu::compressor_prefill(cw.config, cs, cw.ape, ckv.data() + s.begin * width,
                                cscore.data() + s.begin * width, s.start, s.count, entries.data());
    // An armed speculative checkpoint logs the rows it will replay on rollback (see ops.h).
    SequenceCheckpoint& cp = s.state->checkpoints_[plan_->mtp ? 1 : 0];
    if (cp.armed) {
      LayerCheckpoint& lc = cp.layers[size_t(slot)];
      CompressorCheckpoint& cc = indexer ? lc.indexer_compressor : lc.compressor;
      cc.ape = cw.ape;
      cc.log_kv.insert(cc.log_kv.end(), ckv.begin() + s.begin * width,
                       ckv.begin() + (s.begin + s.count) * width);
      cc.log_score.insert(cc.log_score.end(), cscore.begin() + s.begin * width,
                          cscore.begin() + (s.begin + s.count) * width);
    }
    const int64_t first = s.start / ratio;
    std::vector<float>& store = indexer ? st.index_keys : st.compressed;
    int64_t& stored = indexer ? st.num_index_keys : st.num_compressed;
    for (int64_t e = 0; e < n; ++e) {
      cpu::compressor_finish_entry(cw.config, finish, first + e, entries.data() + e * d);
    }
    store.insert(store.end(), entries.begin(), entries.begin() + n * d);
    stored += n;
  }
}

void CpuOps::indexer_select(int64_t slot, const float* q_index, const float* w_index,
                            int32_t* selected) {
  const DeepSeekV4Config& c = config_;
  const int64_t N = plan_->num_tokens, ih = c.index_n_heads, ihd = c.index_head_dim;
  const int64_t k = c.index_topk, ratio = 4;  // CSA layers only
  const StepPlan& plan = *plan_;
  DS_OMP_PARALLEL_FOR_DYNAMIC_IF(N >= 8)  // per-token work is small: only batches fan out
  for (int64_t i = 0; i < N; ++i) {
    const StepPlan::Seq& s = plan.seqs[size_t(plan.seq_of[size_t(i)])];
    LayerState& st = StateAccess::layer(s.state, plan.mtp, slot);
    const int64_t visible = (plan.positions[size_t(i)] + 1) / ratio;
    int32_t* out = selected + i * k;
    const int64_t n = cpu::indexer_select(q_index + i * ih * ihd, w_index + i * ih,
                                          st.index_keys.data(), visible, ih, ihd, k, out);
    std::fill(out + n, out + k, -1);
  }
}

void CpuOps::attend(const AttendParams& params, const float* q, const float* kv,
                    const int32_t* selected, float* o) {
  const DeepSeekV4Config& c = config_;
  const LayerWeights& L = *params.layer;
  const int64_t N = plan_->num_tokens, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t W = c.sliding_window, ratio = L.compress_ratio, topk = c.index_topk;
  const bool csa = L.kind == LayerKind::kCsa;
  const StepPlan& plan = *plan_;
  DS_OMP_PARALLEL_FOR_DYNAMIC_IF(N >= 8)  // per-token work is small: only batches fan out
  for (int64_t i = 0; i < N; ++i) {
    const StepPlan::Seq& s = plan.seqs[size_t(plan.seq_of[size_t(i)])];
    LayerState& st = StateAccess::layer(s.state, plan.mtp, params.layer_slot);
    const int64_t t = plan.positions[size_t(i)];
    thread_local std::vector<const float*> keys;
    keys.clear();
    for (int64_t p = std::max<int64_t>(0, t - W + 1); p <= t; ++p) {
      keys.push_back(p >= s.start ? kv + (s.begin + p - s.start) * hd
                                  : st.window.data() + (p % st.window_slots) * hd);
    }
    if (csa) {
      for (int64_t j = 0; j < topk; ++j) {
        const int32_t w = selected[i * topk + j];
        if (w >= 0) keys.push_back(st.compressed.data() + int64_t(w) * hd);
      }
    } else if (ratio != 0) {
      const int64_t visible = (t + 1) / ratio;
      for (int64_t w = 0; w < visible; ++w) keys.push_back(st.compressed.data() + w * hd);
    }
    cpu::SparseAttentionParams p;
    p.q = q + i * H * hd;
    p.keys = keys.data();
    p.num_keys = int64_t(keys.size());
    p.num_heads = H;
    p.head_dim = hd;
    p.softmax_scale = params.softmax_scale;
    p.sink = L.attn_sink;
    p.out = o + i * H * hd;
    cpu::sparse_attention(p);
  }
}

void CpuOps::store_window(int64_t slot, const float* kv, int64_t hd) {
  for (const StepPlan::Seq& s : plan_->seqs) {
    LayerState& st = StateAccess::layer(s.state, plan_->mtp, slot);
    for (int64_t i = std::max<int64_t>(0, s.count - st.window_slots); i < s.count; ++i) {
      const float* src = kv + (s.begin + i) * hd;
      std::copy(src, src + hd, st.window.data() + ((s.start + i) % st.window_slots) * hd);
    }
  }
}

namespace {

// The ring rows that positions [position, position + n) may write: CSA (overlap) shifts the whole
// ring when a window finishes, HCA writes row p % ratio only.
std::vector<int64_t> rows_touched(const cpu::CompressorConfig& cc, int64_t position, int64_t n) {
  std::vector<int64_t> rows;
  if (cc.overlap() || n >= cc.ratio) {
    for (int64_t r = 0; r < cc.state_rows(); ++r) rows.push_back(r);
    return rows;
  }
  for (int64_t i = 0; i < n; ++i) rows.push_back((position + i) % cc.ratio);
  return rows;
}

void save_rows(const cpu::CompressorConfig& cc, const cpu::CompressorState& st,
               std::vector<int64_t> rows, CompressorCheckpoint* cp) {
  const int64_t width = cc.width();
  cp->rows = std::move(rows);
  cp->kv.resize(cp->rows.size() * size_t(width));
  cp->score.resize(cp->rows.size() * size_t(width));
  for (size_t i = 0; i < cp->rows.size(); ++i) {
    const size_t src = size_t(cp->rows[i] * width), dst = i * size_t(width);
    std::copy(st.kv.begin() + src, st.kv.begin() + src + width, cp->kv.begin() + dst);
    std::copy(st.score.begin() + src, st.score.begin() + src + width, cp->score.begin() + dst);
  }
  cp->log_kv.clear();
  cp->log_score.clear();
}

// Restores the saved rows, then pushes the logged tokens of positions [p0, q) again; the entries
// they emit were stored already and are discarded here.
void restore_and_replay(const cpu::CompressorConfig& cc, const CompressorCheckpoint& cp,
                        int64_t p0, int64_t q,
                        cpu::CompressorState* st) {
  const int64_t width = cc.width();
  for (size_t i = 0; i < cp.rows.size(); ++i) {
    const size_t dst = size_t(cp.rows[i] * width), src = i * size_t(width);
    std::copy(cp.kv.begin() + src, cp.kv.begin() + src + width, st->kv.begin() + dst);
    std::copy(cp.score.begin() + src, cp.score.begin() + src + width, st->score.begin() + dst);
  }
  std::vector<float> entry(size_t(cc.head_dim));
  for (int64_t p = p0; p < q; ++p) {
    const int64_t i = p - p0;
    cpu::compressor_push(cc, st, cp.ape, cp.log_kv.data() + i * width,
                         cp.log_score.data() + i * width, p, entry.data());
  }
}

}  // namespace

Status CpuOps::checkpoint(SequenceState* state, bool mtp, int64_t position, int64_t max_tokens) {
  SequenceCheckpoint& cp = state->checkpoints_[mtp ? 1 : 0];
  const size_t layers = StateAccess::num_layers(state, mtp);
  cp.layers.resize(layers);
  for (size_t l = 0; l < layers; ++l) {
    const LayerState& st = StateAccess::layer(state, mtp, int64_t(l));
    LayerCheckpoint& lc = cp.layers[l];
    const int64_t hd = int64_t(st.window.size()) / std::max<int64_t>(1, st.window_slots);
    if (max_tokens > st.window_slots) {
      return invalid_argument("checkpoint: " + std::to_string(max_tokens) +
                              " speculative positions exceed the window ring of " +
                              std::to_string(st.window_slots));
    }
    lc.window.resize(size_t(max_tokens * hd));
    for (int64_t i = 0; i < max_tokens; ++i) {
      const int64_t slot = (position + i) % st.window_slots;
      std::copy(st.window.begin() + slot * hd, st.window.begin() + (slot + 1) * hd,
                lc.window.begin() + i * hd);
    }
    lc.num_compressed = st.num_compressed;
    lc.num_index_keys = st.num_index_keys;
    const int64_t layer = mtp ? config_.num_hidden_layers + int64_t(l) : int64_t(l);
    const LayerKind kind = config_.layer_kind(layer);
    cpu::CompressorConfig cc;
    cc.ratio = config_.compress_ratios[size_t(layer)];
    cc.rope_dim = config_.qk_rope_head_dim;
    if (kind != LayerKind::kSwa) {
      cc.head_dim = config_.head_dim;
      save_rows(cc, st.compressor, rows_touched(cc, position, max_tokens), &lc.compressor);
    }
    if (kind == LayerKind::kCsa) {
      cc.head_dim = config_.index_head_dim;
      save_rows(cc, st.indexer_compressor, rows_touched(cc, position, max_tokens),
                &lc.indexer_compressor);
    }
  }
  return ok_status();
}

Status CpuOps::rollback(SequenceState* state, bool mtp, int64_t q) {
  SequenceCheckpoint& cp = state->checkpoints_[mtp ? 1 : 0];
  const int64_t p0 = cp.position;
  const int64_t end = StateAccess::position(state, mtp);
  for (size_t l = 0; l < cp.layers.size(); ++l) {
    LayerState& st = StateAccess::layer(state, mtp, int64_t(l));
    const LayerCheckpoint& lc = cp.layers[l];
    const int64_t hd = int64_t(st.window.size()) / std::max<int64_t>(1, st.window_slots);
    for (int64_t p = q; p < end; ++p) {
      const int64_t slot = p % st.window_slots;
      std::copy(lc.window.begin() + (p - p0) * hd, lc.window.begin() + (p - p0 + 1) * hd,
                st.window.begin() + slot * hd);
    }
    const int64_t layer = mtp ? config_.num_hidden_layers + int64_t(l) : int64_t(l);
    const LayerKind kind = config_.layer_kind(layer);
    if (kind == LayerKind::kSwa) continue;
    cpu::CompressorConfig cc;
    cc.ratio = config_.compress_ratios[size_t(layer)];
    cc.rope_dim = config_.qk_rope_head_dim;
    cc.head_dim = config_.head_dim;
    const int64_t logged = int64_t(lc.compressor.log_kv.size()) / cc.width();
    if (logged < q - p0) return internal_error("rollback: the compressor log is incomplete");
    restore_and_replay(cc, lc.compressor, p0, q, &st.compressor);
    st.num_compressed = q / cc.ratio;
    st.compressed.resize(size_t(st.num_compressed * cc.head_dim));
    if (kind == LayerKind::kCsa) {
      cc.head_dim = config_.index_head_dim;
      restore_and_replay(cc, lc.indexer_compressor, p0, q, &st.indexer_compressor);
      st.num_index_keys = q / cc.ratio;
      st.index_keys.resize(size_t(st.num_index_keys * cc.head_dim));
    }
  }
  cp.armed = false;  // the layers' buffers stay allocated for the next checkpoint
  return ok_status();
}

}  // namespace ds::dsv4
