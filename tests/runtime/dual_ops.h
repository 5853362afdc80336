// DualOps: runs every op of a forward on the CUDA backend and on the CPU reference backend side
// by side, each on its own memory and per-sequence state, and measures each op's own error: the
// GPU op's inputs are copied into the CPU op's buffers before the CPU op runs, so an op is
// compared on identical inputs and an error cannot come from an earlier op. The forward sees the
// GPU buffers; the logits are the GPU's. Test-only (tests/runtime/test_cuda_ops.cpp).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/deepseek_v4/cpu_ops.h"
#include "runtime/cuda/cuda_ops.h"

namespace ds::runtime::test {

class DualOps final : public dsv4::Ops {
 public:
  struct OpError {
    double worst = 0;  // max over calls of max|gpu - cpu| / max|cpu|
    int64_t calls = 0;
  };

  DualOps(CudaOps* gpu, const DeepSeekV4Config& config)
      : gpu_(gpu), cpu_(config), config_(config) {}

  std::map<std::string, OpError> errors;

  void begin_step(const dsv4::StepPlan& plan) override {
    plan_rows_ = plan.num_tokens;
    gpu_->begin_step(plan);
    cpu_.begin_step(plan);
  }
  void end_step() override {
    gpu_->end_step();
    cpu_.end_step();
  }
  Status step_status() const override { return gpu_->step_status(); }
  void release_sequence(const dsv4::SequenceState* s) override { gpu_->release_sequence(s); }
  void* alloc_bytes(int64_t bytes) override {
    const size_t gm = gpu_->mark(), cm = cpu_.mark();
    void* d = gpu_->alloc_bytes(bytes);
    void* h = cpu_.alloc_bytes(bytes);
    bufs_.push_back({static_cast<char*>(d), static_cast<char*>(h), bytes, gm, cm});
    return d;
  }
  size_t mark() const override { return bufs_.size(); }
  void release(size_t mark) override {
    // Both arenas are LIFO: rewind each to where it was before the first buffer given back.
    if (mark >= bufs_.size()) return;
    gpu_->release(bufs_[mark].gpu_mark);
    cpu_.release(bufs_[mark].cpu_mark);
    bufs_.resize(mark);
  }
  void copy_to_host(const float* src, int64_t n, float* dst) override {
    gpu_->copy_to_host(src, n, dst);
  }
  void copy_from_host(const float* src, int64_t n, float* dst) override {
    gpu_->copy_from_host(src, n, dst);
    std::memcpy(host(dst), src, size_t(n) * 4);
  }

  void embed(const cpu::LinearWeight& t, int64_t copies, float* x) override {
    gpu_->embed(t, copies, x);
    cpu_.embed(t, copies, host(x));
    compare("embed", x, rows() * copies * t.in_features);
  }
  void linear(const float* x, int64_t r, const cpu::LinearWeight& w, bool q, float* y,
              bool round) override {
    sync(x, r * w.in_features);
    gpu_->linear(x, r, w, q, y, round);
    cpu_.linear(host(x), r, w, q, host(y), round);
    compare("linear " + std::to_string(w.out_features) + "x" + std::to_string(w.in_features), y,
            r * w.out_features);
  }
  // The GPU's pair (one GEMM over the concatenated weights at decode sizes) against two CPU
  // linears.
  void linear_pair(const float* x, int64_t r, const cpu::LinearWeight& w0,
                   const cpu::LinearWeight& w1, bool q, float* y0, float* y1,
                   bool round) override {
    sync(x, r * w0.in_features);
    gpu_->linear_pair(x, r, w0, w1, q, y0, y1, round);
    cpu_.linear_pair(host(x), r, w0, w1, q, host(y0), host(y1), round);
    compare("linear_pair first", y0, r * w0.out_features);
    compare("linear_pair second", y1, r * w1.out_features);
  }
  bool fuses_linear_pair() const override { return gpu_->fuses_linear_pair(); }
  void grouped_output_projection(const float* o, int64_t g, const cpu::LinearWeight& w, float* z,
                                 bool round) override {
    sync(o, rows() * w.in_features * g);
    gpu_->grouped_output_projection(o, g, w, z, round);
    cpu_.grouped_output_projection(host(o), g, w, host(z), round);
    compare("grouped_output_projection", z, rows() * w.out_features);
  }
  void rms_norm(const float* x, const float* w, int64_t r, int64_t d, float eps,
                float* y) override {
    sync(x, r * d);
    gpu_->rms_norm(x, w, r, d, eps, y);
    cpu_.rms_norm(host(x), w, r, d, eps, host(y));
    cpu_round(y, r * d);
    compare("rms_norm", y, r * d);
  }
  void rms_norm_heads(float* x, int64_t r, int64_t h, int64_t hd, float eps) override {
    sync(x, r * h * hd);
    gpu_->rms_norm_heads(x, r, h, hd, eps);
    cpu_.rms_norm_heads(host(x), r, h, hd, eps);
    cpu_round(x, r * h * hd);
    compare("rms_norm_heads", x, r * h * hd);
  }
  void rope(float* x, int64_t h, int64_t hd, int64_t rd, const float* f,
            cpu::RopeDirection dir) override {
    sync(x, rows() * h * hd);
    gpu_->rope(x, h, hd, rd, f, dir);
    cpu_.rope(host(x), h, hd, rd, f, dir);
    cpu_round(x, rows() * h * hd);
    compare("rope", x, rows() * h * hd);
  }
  // The GPU rounds these ops' outputs in their kernels: the CPU side rounds after its op, as the
  // forward would have (one comparison per op either way).
  bool rounds_elementwise_outputs() const override { return gpu_->rounds_elementwise_outputs(); }
  void round_bf16(float* x, int64_t n) override {
    sync(x, n);
    gpu_->round_bf16(x, n);
    cpu_.round_bf16(host(x), n);
    compare("round_bf16", x, n);
  }
  void simulate_fp8_kv(float* kv, int64_t r, int64_t hd, int64_t rd) override {
    sync(kv, r * hd);
    gpu_->simulate_fp8_kv(kv, r, hd, rd);
    cpu_.simulate_fp8_kv(host(kv), r, hd, rd);
    compare("simulate_fp8_kv", kv, r * hd);
  }
  // The GPU's fused op against the CPU's separate ops (Ops' default with the roundings).
  void norm_rope(float* x, const float* w, int64_t r, int64_t h, int64_t hd, float eps, int64_t rd,
                 const float* f, bool fp8, bool round) override {
    sync(x, r * h * hd);
    gpu_->norm_rope(x, w, r, h, hd, eps, rd, f, fp8, round);
    cpu_.norm_rope(host(x), w, r, h, hd, eps, rd, f, fp8, round);
    compare("norm_rope", x, r * h * hd);
  }
  bool fuses_norm_rope() const override { return gpu_->fuses_norm_rope(); }
  void indexer_prepare_query(float* q, int64_t h, int64_t hd, int64_t rd, const float* f, bool fp4,
                             bool rb) override {
    sync(q, rows() * h * hd);
    gpu_->indexer_prepare_query(q, h, hd, rd, f, fp4, rb);
    cpu_.indexer_prepare_query(host(q), h, hd, rd, f, fp4, rb);
    compare("indexer_prepare_query", q, rows() * h * hd);
  }
  void indexer_scale_weights(float* w, int64_t h, int64_t hd) override {
    sync(w, rows() * h);
    gpu_->indexer_scale_weights(w, h, hd);
    cpu_.indexer_scale_weights(host(w), h, hd);
    cpu_round(w, rows() * h);
    compare("indexer_scale_weights", w, rows() * h);
  }
  void mhc_pre(const cpu::MhcConfig& c, const cpu::MhcSiteWeights& w, const float* x, int64_t r,
               float* u, float* post, float* comb) override {
    sync(x, r * c.hc_mult * c.dim);
    gpu_->mhc_pre(c, w, x, r, u, post, comb);
    cpu_.mhc_pre(c, w, host(x), r, host(u), host(post), host(comb));
    cpu_round(u, r * c.dim);
    compare("mhc_pre u", u, r * c.dim);
    compare("mhc_pre post", post, r * c.hc_mult);
    compare("mhc_pre comb", comb, r * c.hc_mult * c.hc_mult);
  }
  // The GPU's fused op against the CPU's two ops (Ops' default: mhc_pre, rms_norm, the roundings).
  void mhc_pre_norm(const cpu::MhcConfig& c, const cpu::MhcSiteWeights& w, const float* x,
                    int64_t r, const float* norm, float eps, bool round, float* u, float* post,
                    float* comb) override {
    sync(x, r * c.hc_mult * c.dim);
    gpu_->mhc_pre_norm(c, w, x, r, norm, eps, round, u, post, comb);
    cpu_.mhc_pre_norm(c, w, host(x), r, norm, eps, round, host(u), host(post), host(comb));
    compare("mhc_pre_norm u", u, r * c.dim);
    compare("mhc_pre_norm post", post, r * c.hc_mult);
    compare("mhc_pre_norm comb", comb, r * c.hc_mult * c.hc_mult);
  }
  bool fuses_mhc_pre_norm() const override { return gpu_->fuses_mhc_pre_norm(); }
  void mhc_post(const cpu::MhcConfig& c, const float* o, const float* x, const float* post,
                const float* comb, int64_t r, float* x_new) override {
    sync(o, r * c.dim);
    sync(x, r * c.hc_mult * c.dim);
    sync(post, r * c.hc_mult);
    sync(comb, r * c.hc_mult * c.hc_mult);
    gpu_->mhc_post(c, o, x, post, comb, r, x_new);
    cpu_.mhc_post(c, host(o), host(x), host(post), host(comb), r, host(x_new));
    cpu_round(x_new, r * c.hc_mult * c.dim);
    compare("mhc_post", x_new, r * c.hc_mult * c.dim);
  }
  void mhc_head(const cpu::MhcConfig& c, const cpu::MhcHeadWeights& w, const float* x, int64_t r,
                float* y) override {
    sync(x, r * c.hc_mult * c.dim);
    gpu_->mhc_head(c, w, x, r, y);
    cpu_.mhc_head(c, w, host(x), r, host(y));
    cpu_round(y, r * c.dim);
    compare("mhc_head", y, r * c.dim);
  }
  void moe(const dsv4::MoeSite& site, const float* x, float* y) override {
    const int64_t d = site.router.gate.in_features;
    sync(x, rows() * d);
    gpu_->moe(site, x, y);
    cpu_.moe(site, host(x), host(y));
    compare("moe", y, rows() * d);
  }
  void add_broadcast(const float* e, const float* h, int64_t hc, int64_t d, float* x) override {
    sync(e, rows() * d);
    sync(h, rows() * hc * d);
    gpu_->add_broadcast(e, h, hc, d, x);
    cpu_.add_broadcast(host(e), host(h), hc, d, host(x));
    compare("add_broadcast", x, rows() * hc * d);
  }
  void gather_rows(const float* x, int64_t width, const std::vector<int64_t>& r,
                   float* out) override {
    int64_t n = 0;
    for (int64_t i : r) n = std::max(n, i + 1);
    sync(x, n * width);
    gpu_->gather_rows(x, width, r, out);
    cpu_.gather_rows(host(x), width, r, host(out));
    compare("gather_rows", out, int64_t(r.size()) * width);
  }
  void compress(int64_t slot, const dsv4::CompressorWeights& w, cpu::CompressorKind kind,
                const cpu::CompressorFinishParams& f, const float* h) override {
    sync(h, rows() * w.wkv.in_features);
    gpu_->compress(slot, w, kind, f, h);
    cpu_.compress(slot, w, kind, f, host(h));
  }
  void compress_layer(int64_t slot, const dsv4::CompressorWeights* iw,
                      const cpu::CompressorFinishParams* ifp, const dsv4::CompressorWeights& w,
                      const cpu::CompressorFinishParams& f, const float* h) override {
    sync(h, rows() * w.wkv.in_features);
    gpu_->compress_layer(slot, iw, ifp, w, f, h);  // CudaOps: one GEMM for both (decode sizes)
    cpu_.compress_layer(slot, iw, ifp, w, f, host(h));
  }
  void indexer_select(int64_t slot, const float* q, const float* w, int32_t* sel) override {
    // Selected sets are compared through the attention output (attend), not index by index:
    // near-tied scores may pick different entries on the two backends.
    const DeepSeekV4Config& c = cpu_config();
    sync(q, rows() * c.index_n_heads * c.index_head_dim);
    sync(w, rows() * c.index_n_heads);
    gpu_->indexer_select(slot, q, w, sel);
    cpu_.indexer_select(slot, host(q), host(w), reinterpret_cast<int32_t*>(host_of(sel)));
  }
  void attend(const dsv4::AttendParams& p, const float* q, const float* kv, const int32_t* sel,
              float* o) override {
    const DeepSeekV4Config& c = cpu_config();
    const int64_t hd = c.head_dim, H = c.num_attention_heads;
    sync(q, rows() * H * hd);
    sync(kv, rows() * hd);
    gpu_->attend(p, q, kv, sel, o);
    cpu_.attend(p, host(q), host(kv),
                sel != nullptr ? reinterpret_cast<const int32_t*>(host_of(sel)) : nullptr, host(o));
    cpu_round(o, rows() * H * hd);
    compare(sel != nullptr ? "attend (CSA)" : "attend", o, rows() * H * hd);
  }
  void store_window(int64_t slot, const float* kv, int64_t hd) override {
    gpu_->store_window(slot, kv, hd);
    cpu_.store_window(slot, host(kv), hd);
  }

 private:
  struct Buf {
    char* d;
    char* h;
    int64_t bytes;
    size_t gpu_mark, cpu_mark;
  };
  int64_t rows() const { return plan_rows_; }
  const DeepSeekV4Config& cpu_config() const { return config_; }
  char* host_of(const void* d) {
    const char* p = static_cast<const char*>(d);
    for (auto it = bufs_.rbegin(); it != bufs_.rend(); ++it) {
      if (p >= it->d && p < it->d + it->bytes) return it->h + (p - it->d);
    }
    return nullptr;
  }
  template <typename T>
  T* host(const T* d) {
    return reinterpret_cast<T*>(host_of(d));
  }
  void sync(const float* d, int64_t n) {
    if (n <= 0) return;
    cudaStreamSynchronize(gpu_->stream());
    cudaMemcpy(host(d), d, size_t(n) * 4, cudaMemcpyDeviceToHost);
  }
  // The CPU copy of the GPU buffer d gets the rounding the GPU op did in its kernel.
  void cpu_round(const float* d, int64_t n) {
    if (gpu_->rounds_elementwise_outputs() && n > 0) cpu_.round_bf16(host(d), n);
  }
  void compare(const std::string& op, const float* d, int64_t n) {
    if (n <= 0) return;
    cudaStreamSynchronize(gpu_->stream());
    std::vector<float> g(static_cast<size_t>(n));
    cudaMemcpy(g.data(), d, size_t(n) * 4, cudaMemcpyDeviceToHost);
    const float* c = host(d);
    double diff = 0, scale = 1e-20;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::fabs(double(g[size_t(i)]) - double(c[i]));
      diff = std::isfinite(e) ? std::max(diff, e) : INFINITY;
      scale = std::max(scale, double(std::fabs(c[i])));
    }
    OpError& err = errors[op];
    err.worst = std::max(err.worst, diff / scale);
    ++err.calls;
  }

  CudaOps* gpu_;
  dsv4::CpuOps cpu_;
  DeepSeekV4Config config_;
  std::vector<Buf> bufs_;
  int64_t plan_rows_ = 0;
};

}  // namespace ds::runtime::test
