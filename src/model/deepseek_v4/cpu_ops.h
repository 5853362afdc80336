// CpuOps: the DeepSeek-V4 op interface (ops.h) over the fp32 reference kernels of
// src/kernels/cpu and the fp32 per-sequence state of state.h. This is the oracle backend: every op
// is one reference function (or the loop the reference runs over tokens), so the forward on
// CpuOps is the reference forward. It lives next to the model rather than in src/runtime because
// it needs nothing but the CPU kernels; device backends (src/runtime) implement the same
// interface. Not thread-safe: one forward call at a time (ops inside a call use OpenMP).
#pragma once

#include <memory>
#include <vector>

#include "model/deepseek_v4/ops.h"

namespace ds::dsv4 {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(const DeepSeekV4Config& config) : config_(config) {}  // config outlives this

  void begin_step(const StepPlan& plan) override { plan_ = &plan; }
  void end_step() override { plan_ = nullptr; }
  void* alloc_bytes(int64_t bytes) override;
  size_t mark() const override { return buffers_.size(); }
  void release(size_t mark) override;
  void copy_to_host(const float* src, int64_t n, float* dst) override;
  void copy_from_host(const float* src, int64_t n, float* dst) override;
  void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                   uint8_t* finite) override;
  void sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                   int32_t* ids, uint8_t* finite) override;

  void embed(const cpu::LinearWeight& table, int64_t copies, float* x) override;
  void linear(const float* x, int64_t rows, const cpu::LinearWeight& w, bool quantize_activations,
              float* y, bool round_output) override;
  void grouped_output_projection(const float* o, int64_t groups, const cpu::LinearWeight& wo_a,
                                 float* z, bool round_output) override;
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                float* y) override;
  void rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim,
                      float eps) override;
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const float* inv_freq,
            cpu::RopeDirection direction) override;
  void round_bf16(float* x, int64_t n) override;
  void simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) override;
  void indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                             const float* inv_freq, bool fp4_simulation,
                             bool round_bf16) override;
  void indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) override;
  void mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights, const float* x,
               int64_t rows, float* u, float* post, float* comb) override;
  void mhc_post(const cpu::MhcConfig& config, const float* o, const float* x, const float* post,
                const float* comb, int64_t rows, float* x_new) override;
  void mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights, const float* x,
                int64_t rows, float* y) override;
  void moe(const MoeSite& site, const float* x, float* y) override;
  void add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim, float* x) override;
  void gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                   float* out) override;

  void compress(int64_t layer_slot, const CompressorWeights& weights, cpu::CompressorKind kind,
                const cpu::CompressorFinishParams& finish, const float* h) override;
  void indexer_select(int64_t layer_slot, const float* q_index, const float* w_index,
                      int32_t* selected) override;
  void attend(const AttendParams& params, const float* q, const float* kv, const int32_t* selected,
              float* o) override;
  void store_window(int64_t layer_slot, const float* kv, int64_t head_dim) override;

  // Speculative checkpoint/rollback over SequenceState's checkpoint data (see ops.h).
  Status checkpoint(SequenceState* state, bool mtp, int64_t position, int64_t max_tokens) override;
  Status rollback(SequenceState* state, bool mtp, int64_t to_position) override;

 private:
  const DeepSeekV4Config& config_;
  const StepPlan* plan_ = nullptr;
  std::vector<std::unique_ptr<float[]>> buffers_;  // the step arena, LIFO (floats: 16-B aligned)
};

}  // namespace ds::dsv4
