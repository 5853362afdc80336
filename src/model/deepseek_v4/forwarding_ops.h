// ForwardingOps: an Ops that passes every call to an inner backend, calling before_op(name) first.
// Decorators derive from it: the per-component profiler (timing the component ranges) and the
// tests that check how the forward uses the interface (every op inside one component range).
#pragma once

#include "model/deepseek_v4/ops.h"

namespace ds::dsv4 {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(Ops* inner) : inner_(inner) {}

  void begin_step(const StepPlan& plan) override { inner_->begin_step(plan); }
  void end_step() override { inner_->end_step(); }
  Status step_status() const override { return inner_->step_status(); }
  void release_sequence(const SequenceState* state) override { inner_->release_sequence(state); }
  Status checkpoint(SequenceState* state, bool mtp, int64_t position, int64_t max_tokens) override {
    return inner_->checkpoint(state, mtp, position, max_tokens);
  }
  Status rollback(SequenceState* state, bool mtp, int64_t to_position) override {
    return inner_->rollback(state, mtp, to_position);
  }
  void* alloc_bytes(int64_t bytes) override { return inner_->alloc_bytes(bytes); }
  size_t mark() const override { return inner_->mark(); }
  void release(size_t mark) override { inner_->release(mark); }
  void component_begin(Component component) override { inner_->component_begin(component); }
  void component_end(Component component) override { inner_->component_end(component); }
  bool take_component_times(std::span<double> seconds, std::span<int64_t> ranges) override {
    return inner_->take_component_times(seconds, ranges);
  }
  void copy_to_host(const float* src, int64_t n, float* dst) override {
    before_op("copy_to_host");
    inner_->copy_to_host(src, n, dst);
  }
  void copy_many_to_host(std::span<const HostCopy> copies) override {
    before_op("copy_to_host");
    inner_->copy_many_to_host(copies);
  }
  void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                   uint8_t* finite) override {
    before_op("argmax_rows");
    inner_->argmax_rows(x, rows, n, ids, finite);
  }
  void sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                   int32_t* ids, uint8_t* finite) override {
    before_op("sample_rows");
    inner_->sample_rows(x, rows, n, params, ids, finite);
  }
  bool prefers_backend_sampling() const override { return inner_->prefers_backend_sampling(); }
  std::shared_ptr<HostMemorySource> host_memory() const override { return inner_->host_memory(); }
  void copy_from_host(const float* src, int64_t n, float* dst) override {
    before_op("copy_from_host");
    inner_->copy_from_host(src, n, dst);
  }
  void embed(const cpu::LinearWeight& table, int64_t copies, float* x) override {
    before_op("embed");
    inner_->embed(table, copies, x);
  }
  void linear(const float* x, int64_t rows, const cpu::LinearWeight& w, bool quantize_activations,
              float* y, bool round_output) override {
    before_op("linear");
    inner_->linear(x, rows, w, quantize_activations, y, round_output);
  }
  void linear_pair(const float* x, int64_t rows, const cpu::LinearWeight& w0,
                   const cpu::LinearWeight& w1, bool quantize_activations, float* y0, float* y1,
                   bool round_output) override {
    before_op("linear_pair");
    inner_->linear_pair(x, rows, w0, w1, quantize_activations, y0, y1, round_output);
  }
  // The inner backend's fusions pass through: a decorator that changes linear (or mhc_pre /
  // rms_norm, or the norms / rope / simulate_fp8_kv) over a fusing backend must override
  // linear_pair (mhc_pre_norm, norm_rope) too.
  bool fuses_linear_pair() const override { return inner_->fuses_linear_pair(); }
  void grouped_output_projection(const float* o, int64_t groups, const cpu::LinearWeight& wo_a,
                                 float* z, bool round_output) override {
    before_op("grouped_output_projection");
    inner_->grouped_output_projection(o, groups, wo_a, z, round_output);
  }
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                float* y) override {
    before_op("rms_norm");
    inner_->rms_norm(x, weight, rows, dim, eps, y);
  }
  void rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim,
                      float eps) override {
    before_op("rms_norm_heads");
    inner_->rms_norm_heads(x, rows, heads, head_dim, eps);
  }
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const float* inv_freq,
            cpu::RopeDirection direction) override {
    before_op("rope");
    inner_->rope(x, heads, head_dim, rope_dim, inv_freq, direction);
  }
  void round_bf16(float* x, int64_t n) override {
    before_op("round_bf16");
    inner_->round_bf16(x, n);
  }
  bool rounds_elementwise_outputs() const override { return inner_->rounds_elementwise_outputs(); }
  void simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) override {
    before_op("simulate_fp8_kv");
    inner_->simulate_fp8_kv(kv, rows, head_dim, rope_dim);
  }
  void norm_rope(float* x, const float* weight, int64_t rows, int64_t heads, int64_t head_dim,
                 float eps, int64_t rope_dim, const float* inv_freq, bool simulate_fp8,
                 bool round) override {
    before_op("norm_rope");
    inner_->norm_rope(x, weight, rows, heads, head_dim, eps, rope_dim, inv_freq, simulate_fp8,
                      round);
  }
  bool fuses_norm_rope() const override { return inner_->fuses_norm_rope(); }
  bool fuses_attend_inverse_rope() const override { return inner_->fuses_attend_inverse_rope(); }
  void indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                             const float* inv_freq, bool fp4_simulation,
                             bool round_bf16) override {
    before_op("indexer_prepare_query");
    inner_->indexer_prepare_query(q, heads, head_dim, rope_dim, inv_freq, fp4_simulation,
                                  round_bf16);
  }
  void indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) override {
    before_op("indexer_scale_weights");
    inner_->indexer_scale_weights(w, heads, head_dim);
  }
  void mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights, const float* x,
               int64_t rows, float* u, float* post, float* comb) override {
    before_op("mhc_pre");
    inner_->mhc_pre(config, weights, x, rows, u, post, comb);
  }
  void mhc_pre_norm(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                    const float* x, int64_t rows, const float* norm_weight, float eps, bool round,
                    float* u, float* post, float* comb) override {
    before_op("mhc_pre_norm");
    inner_->mhc_pre_norm(config, weights, x, rows, norm_weight, eps, round, u, post, comb);
  }
  bool fuses_mhc_pre_norm() const override { return inner_->fuses_mhc_pre_norm(); }
  void mhc_post(const cpu::MhcConfig& config, const float* o, const float* x, const float* post,
                const float* comb, int64_t rows, float* x_new) override {
    before_op("mhc_post");
    inner_->mhc_post(config, o, x, post, comb, rows, x_new);
  }
  void mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights, const float* x,
                int64_t rows, float* y) override {
    before_op("mhc_head");
    inner_->mhc_head(config, weights, x, rows, y);
  }
  void moe(const MoeSite& site, const float* x, float* y) override {
    before_op("moe");
    inner_->moe(site, x, y);
  }
  void add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim, float* x) override {
    before_op("add_broadcast");
    inner_->add_broadcast(e, h, hc, dim, x);
  }
  void gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                   float* out) override {
    before_op("gather_rows");
    inner_->gather_rows(x, width, rows, out);
  }
  void compress(int64_t layer_slot, const CompressorWeights& weights, cpu::CompressorKind kind,
                const cpu::CompressorFinishParams& finish, const float* h) override {
    before_op("compress");
    inner_->compress(layer_slot, weights, kind, finish, h);
  }
  // Passes through as one call, so that a fusing inner backend projects both compressors at once
  // (a decorator that changes compress must override this too).
  void compress_layer(int64_t layer_slot, const CompressorWeights* indexer,
                      const cpu::CompressorFinishParams* indexer_finish,
                      const CompressorWeights& attention,
                      const cpu::CompressorFinishParams& attention_finish,
                      const float* h) override {
    before_op("compress");
    inner_->compress_layer(layer_slot, indexer, indexer_finish, attention, attention_finish, h);
  }
  void indexer_select(int64_t layer_slot, const float* q_index, const float* w_index,
                      int32_t* selected) override {
    before_op("indexer_select");
    inner_->indexer_select(layer_slot, q_index, w_index, selected);
  }
  void attend(const AttendParams& params, const float* q, const float* kv, const int32_t* selected,
              float* o) override {
    before_op("attend");
    inner_->attend(params, q, kv, selected, o);
  }
  void all_reduce_sum(float* x, int64_t n) override {
    before_op("all_reduce_sum");
    inner_->all_reduce_sum(x, n);
  }
  void store_window(int64_t layer_slot, const float* kv, int64_t head_dim) override {
    before_op("store_window");
    inner_->store_window(layer_slot, kv, head_dim);
  }

 protected:
  // Called before every compute or copy op with the op's name (a string literal).
  virtual void before_op(const char* name) {}
  Ops* inner() const { return inner_; }

 private:
  Ops* inner_;
};

}  // namespace ds::dsv4
