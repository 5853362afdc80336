// Benchmark of the op kernels (norm, rope, mHC, compressors, greedy sampling + logprobs, random
// sampling) at DeepSeek-V4-Flash shapes: decode (1, 16, 64 tokens; every launch of a CUDA graph
// works on its own copy of the buffers, the copies together larger than twice the L2, time per
// launch) and prefill (4096 tokens, eager, rotating copies). Both ceilings are measured at start:
// the copy bandwidth (bench_util) and the fp32 FMA peak of the CUDA cores (these kernels use no
// tensor cores). floor = max(bytes / bandwidth, flops / fp32 peak), bytes = each input read once +
// each output written once. The correctness error of the run compares copy 0 with the CPU
// reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/compressor.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/compressor/compressor.h"
#include "kernels/cuda/mhc/mhc.h"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/sampling/sampling.h"

namespace ds {
namespace {

// ---- fp32 FMA ceiling: independent FMA chains, no memory traffic. ----
__global__ void fma_kernel(float* out, int iters) {
  float a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = float(threadIdx.x + i);
  const float b = 1.0000001f, c = 1e-7f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = fmaf(a[i], b, c);
  }
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s += a[i];
  if (s == 12345.0f) out[0] = s;  // keeps the chains alive
}

double measure_fp32_tflops(cudaStream_t stream, int sms) {
  float* out;
  DS_BENCH_CHECK(cudaMalloc(&out, 4));
  const int iters = 4096, blocks = sms * 8, threads = 256;
  double us = bench::time_us(
      [&](cudaStream_t s) { fma_kernel<<<blocks, threads, 0, s>>>(out, iters); }, stream, 20, 3);
  DS_BENCH_CHECK(cudaFree(out));
  return 2.0 * 8.0 * iters * double(blocks) * threads / (us * 1e-6) / 1e12;
}

// ---- helpers ----
template <typename T>
T* dev_alloc(size_t n) {
  T* p;
  DS_BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
template <typename T>
T* dev_copy(const std::vector<T>& h, int copies = 1) {
  T* p = dev_alloc<T>(h.size() * size_t(copies));
  for (int k = 0; k < copies; ++k)
    DS_BENCH_CHECK(cudaMemcpy(p + h.size() * size_t(k), h.data(), h.size() * sizeof(T),
                              cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> h(n);
  DS_BENCH_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
std::vector<float> randn(Rng& rng, size_t n, float scale = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_float(float_to_bf16(mean + rng.normal() * scale));
  return v;
}
double max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double mx = 0, scale = 1e-30;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) mx = std::max(mx, std::fabs(double(got[i]) - want[i]));
  return mx / scale;
}

struct Frees {
  std::vector<void*> ptrs;
  template <typename T>
  T* operator()(T* p) {
    ptrs.push_back(p);
    return p;
  }
  ~Frees() {
    for (void* p : ptrs) cudaFree(p);
  }
};

struct Ctx {
  cudaStream_t stream;
  double copy_gbps, fp32_tflops;
  size_t l2;
  std::vector<bench::Record> records;
};

// Copies of the buffers so that one pass over them moves >= 2x L2 (graph: <= 1024, eager: <= 64).
int copies_for(const Ctx& c, double bytes, bool graph) {
  const double want = std::ceil(2.0 * double(c.l2) / std::max(bytes, 1.0));
  return int(std::clamp(want, 1.0, graph ? 1024.0 : 64.0));
}

void run_case(Ctx& c, const std::string& kernel, const std::string& shape, bool graph, int copies,
              double bytes, double flops, const std::function<void(int, cudaStream_t)>& launch,
              const std::function<double()>& check, const std::string& metric) {
  double us;
  if (graph) {
    us = bench::time_us(
             [&](cudaStream_t s) {
               for (int k = 0; k < copies; ++k) launch(k, s);
             },
             c.stream, 20, 3, true) /
         copies;
  } else {
    int iter = 0;
    us = bench::time_us([&](cudaStream_t s) { launch(iter++ % copies, s); }, c.stream, 30, 3);
  }
  bench::Record r;
  r.kernel = kernel;
  r.shape = shape;
  r.mode = graph ? "graph" : "eager";
  r.bytes = bytes;
  r.flops = flops;
  r.floor_us = std::max(bytes / (c.copy_gbps * 1e9), flops / (c.fp32_tflops * 1e12)) * 1e6;
  r.set_time(us);
  r.max_error = check();
  r.error_metric = metric;
  c.records.push_back(r);
  std::fprintf(stderr, "%-22s %-30s %8.2f us (floor %.2f)\n", kernel.c_str(), shape.c_str(), us,
               r.floor_us);
}

constexpr int64_t kD = 4096, kHc = 4, kHeads = 64, kHd = 512, kRd = 64, kVocab = 129280;

void bench_norm(Ctx& c, int64_t n) {
  const bool graph = n <= 64;
  Rng rng{uint64_t(n)};
  std::vector<float> x = randn(rng, size_t(n * kD), 2.0f), w = randn(rng, size_t(kD), 0.2f, 1.0f);
  const double bytes = double(n * kD) * 8 + kD * 4;
  const int copies = copies_for(c, bytes, graph);
  Frees f;
  float* dx = f(dev_copy(x, copies));
  float* dw = f(dev_copy(w, copies));
  float* dy = f(dev_alloc<float>(static_cast<size_t>(n * kD) * copies));
  auto launch = [&](int k, cudaStream_t s) {
    cuda::RmsNormParams p;
    p.x = dx + size_t(k) * n * kD;
    p.weight = dw + size_t(k) * kD;
    p.y = dy + size_t(k) * n * kD;
    p.num_rows = n;
    p.dim = kD;
    p.x_stride = p.y_stride = kD;
    p.round_bf16 = true;
    cuda::launch_rms_norm(p, s);
  };
  auto check = [&] {
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    const int64_t rows = std::min<int64_t>(n, 4);
    std::vector<float> want(static_cast<size_t>(rows * kD));
    cpu::rms_norm(x.data(), w.data(), rows, kD, 1e-6f, want.data());
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
    return max_rel_err(host_copy(dy, want.size()), want);
  };
  run_case(c, "rms_norm", std::to_string(n) + "x4096 round", graph, copies, bytes, 3.0 * n * kD,
           launch, check, "max rel err vs CPU (4 rows)");
}

void bench_norm_heads(Ctx& c, int64_t n) {
  const bool graph = n <= 64;
  Rng rng(uint64_t(n) + 1);
  const int64_t elems = n * kHeads * kHd;
  std::vector<float> x = randn(rng, size_t(elems));
  const double bytes = double(elems) * 8;
  const int copies = copies_for(c, bytes, graph);
  Frees f;
  float* dx = f(dev_copy(x, copies));
  auto launch = [&](int k, cudaStream_t s) {
    cuda::RmsNormHeadsParams p;
    p.x = dx + size_t(k) * elems;
    p.num_tokens = n;
    p.num_heads = kHeads;
    p.head_dim = kHd;
    p.token_stride = kHeads * kHd;
    cuda::launch_rms_norm_heads(p, s);
  };
  auto check = [&] {
    DS_BENCH_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    const int64_t tokens = std::min<int64_t>(n, 2);
    std::vector<float> want(x.begin(), x.begin() + tokens * kHeads * kHd);
    cpu::rms_norm_heads(want.data(), tokens, kHeads, kHd, 1e-6f);
    return max_rel_err(host_copy(dx, want.size()), want);
  };
  run_case(c, "rms_norm_heads", std::to_string(n) + "x64x512", graph, copies, bytes,
           3.0 * double(elems), launch, check, "max rel err vs CPU (2 tokens)");
}

void bench_rope(Ctx& c, int64_t n) {
  const bool graph = n <= 64;
  Rng rng(uint64_t(n) + 2);
  const int64_t elems = n * kHeads * kHd;
  std::vector<float> x = randn(rng, size_t(elems)), inv(32);
  cpu::rope_inv_freq(cpu::rope_config_for_layer(4, 64, 1e4, 160000, 16, 65536, 32, 1), inv.data());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (auto& p : pos) p = int64_t(rng.below(1 << 20));
  const double bytes = double(n * kHeads * kRd) * 8 + double(n) * 8;
  const int copies = copies_for(c, bytes, graph);
  Frees f;
  float* dx = f(dev_copy(x, copies));
  float* df = f(dev_copy(inv));
  int64_t* dp = f(dev_copy(pos));
  auto launch = [&](int k, cudaStream_t s) {
    cuda::RopeParams p{dx + size_t(k) * elems, df,    dp,  n, kHeads, kHd, kRd,
                       kHeads * kHd,           false, true};
    cuda::launch_rope(p, s);
  };
  auto check = [&] {
    DS_BENCH_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    const int64_t tokens = std::min<int64_t>(n, 2);
    std::vector<float> want(x.begin(), x.begin() + tokens * kHeads * kHd);
    for (int64_t t = 0; t < tokens; ++t)
      cpu::rope_rotate(want.data() + t * kHeads * kHd, kHeads, kHd, kRd, inv.data(), pos[size_t(t)],
                       cpu::RopeDirection::kForward);
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
    return max_rel_err(host_copy(dx, want.size()), want);
  };
  run_case(c, "rope_q", std::to_string(n) + "x64x512 rope64", graph, copies, bytes,
           6.0 * double(n * kHeads * kRd / 2), launch, check, "max rel err vs CPU (2 tokens)");
}

// The RMSNorm kernel with its RoPE (+ FP8) epilogue (RmsNormParams::rope_dim): the query heads
// (unweighted, 64 x 512) and the kv vector (weighted, 512, FP8-simulated nope dims), one launch
// each instead of rms_norm_heads + rope_q (2) and rms_norm + rope + simulate_fp8_kv (3).
void bench_norm_rope(Ctx& c, int64_t n) {
  const bool graph = n <= 64;
  for (bool kv : {false, true}) {
    Rng rng(uint64_t(n) + (kv ? 5 : 4));
    const int64_t heads = kv ? 1 : kHeads, elems = n * heads * kHd;
    std::vector<float> x = randn(rng, size_t(elems), 2.0f), w = randn(rng, size_t(kHd), 0.2f, 1.0f);
    std::vector<float> inv(32);
    cpu::rope_inv_freq(cpu::rope_config_for_layer(4, 64, 1e4, 160000, 16, 65536, 32, 1),
                       inv.data());
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (auto& p : pos) p = int64_t(rng.below(1 << 20));
    const double bytes = double(elems) * 8 + double(n) * 8;
    const int copies = copies_for(c, bytes, graph);
    Frees f;
    float* dx = f(dev_copy(x, copies));
    float* dw = f(dev_copy(w));
    float* df = f(dev_copy(inv));
    int64_t* dp = f(dev_copy(pos));
    auto launch = [&](int k, cudaStream_t s) {
      if (kv) {
        cuda::RmsNormParams p;
        p.x = p.y = dx + size_t(k) * elems;
        p.weight = dw;
        p.num_rows = n;
        p.dim = kHd;
        p.x_stride = p.y_stride = kHd;
        p.round_bf16 = true;
        p.rope_dim = kRd;
        p.inv_freq = df;
        p.positions = dp;
        p.simulate_fp8_kv = true;
        cuda::launch_rms_norm(p, s);
      } else {
        cuda::RmsNormHeadsParams p;
        p.x = dx + size_t(k) * elems;
        p.num_tokens = n;
        p.num_heads = kHeads;
        p.head_dim = kHd;
        p.token_stride = kHeads * kHd;
        p.round_bf16 = true;
        p.rope_dim = kRd;
        p.inv_freq = df;
        p.positions = dp;
        cuda::launch_rms_norm_heads(p, s);
      }
    };
    auto check = [&] {
      DS_BENCH_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      launch(0, c.stream);
      DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
      const int64_t tokens = std::min<int64_t>(n, 2);
      std::vector<float> want(x.begin(), x.begin() + tokens * heads * kHd);
      if (kv)
        cpu::rms_norm(want.data(), w.data(), tokens, kHd, 1e-6f, want.data());
      else
        cpu::rms_norm_heads(want.data(), tokens, kHeads, kHd, 1e-6f);
      for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
      for (int64_t t = 0; t < tokens; ++t)
        cpu::rope_rotate(want.data() + t * heads * kHd, heads, kHd, kRd, inv.data(), pos[size_t(t)],
                         cpu::RopeDirection::kForward);
      for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
      if (kv) cpu::simulate_fp8_kv_nope(want.data(), tokens, kHd, kRd);
      return max_rel_err(host_copy(dx, want.size()), want);
    };
    run_case(c, kv ? "norm_rope_kv" : "norm_rope_q",
             std::to_string(n) + (kv ? "x512 weighted rope64 fp8" : "x64x512 rope64"), graph,
             copies, bytes, 9.0 * double(elems), launch, check, "max rel err vs CPU (2 tokens)");
  }
}

void bench_mhc(Ctx& c, int64_t n) {
  const bool graph = n <= 64;
  Rng rng(uint64_t(n) + 3);
  const int64_t mixes = 24, hcd = kHc * kD;
  std::vector<float> x = randn(rng, size_t(n * hcd), 1.5f),
                     fn = randn(rng, size_t(mixes * hcd), 0.03f);
  std::vector<float> base = randn(rng, size_t(mixes), 0.5f), scale = {0.8f, 1.1f, 0.9f};
  std::vector<float> o = randn(rng, size_t(n * kD));
  Frees f;
  // mhc_pre: the default path and, at decode sizes, the split-K kernels it replaces (A/B), and
  // (variant 2, diagnostic) the default path with one Sinkhorn round instead of 20: what the
  // rest of the launch costs.
  for (int variant : {0, 1, 2}) {
    const int path = variant == 2 ? 0 : variant;
    if (variant != 0 && n > 64) break;
    const double bytes =
        double(n * hcd) * 4 + double(mixes * hcd) * 4 + double(n * kD) * 4 + n * 80.0;
    const int copies = copies_for(c, bytes, graph);
    float* dx = f(dev_copy(x, copies));
    float* dfn = f(dev_copy(fn, copies));
    float* db = f(dev_copy(base));
    float* ds = f(dev_copy(scale));
    float* du = f(dev_alloc<float>(static_cast<size_t>(n * kD) * copies));
    float* dpost = f(dev_alloc<float>(static_cast<size_t>(n * kHc) * copies));
    float* dcomb = f(dev_alloc<float>(static_cast<size_t>(n * 16) * copies));
    const int64_t wsf = cuda::mhc_workspace_floats(n, kD);
    float* dws = f(dev_alloc<float>(static_cast<size_t>(wsf) * copies));
    auto launch = [&](int k, cudaStream_t s) {
      cuda::MhcPreParams p;
      p.x = dx + size_t(k) * n * hcd;
      p.fn = dfn + size_t(k) * mixes * hcd;
      p.base = db;
      p.scale = ds;
      p.u = du + size_t(k) * n * kD;
      p.post = dpost + size_t(k) * n * kHc;
      p.comb = dcomb + size_t(k) * n * 16;
      p.workspace = dws + size_t(k) * wsf;
      p.num_tokens = n;
      p.dim = kD;
      p.round_bf16 = true;
      p.path = path;
      if (variant == 2) p.sinkhorn_iters = 1;
      cuda::launch_mhc_pre(p, s);
    };
    auto check = [&] {
      launch(0, c.stream);
      DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
      const int64_t tokens = std::min<int64_t>(n, 2);
      cpu::MhcConfig cfg;
      cfg.dim = kD;
      if (variant == 2) cfg.sinkhorn_iters = 1;
      std::vector<float> u(static_cast<size_t>(tokens * kD)), post(static_cast<size_t>(tokens * 4)),
          comb(static_cast<size_t>(tokens * 16));
      cpu::mhc_pre(cfg, {fn.data(), base.data(), scale.data()}, x.data(), tokens, u.data(),
                   post.data(), comb.data());
      return max_rel_err(host_copy(dcomb, comb.size()), comb);
    };
    run_case(c,
             variant == 0   ? "mhc_pre"
             : variant == 1 ? "mhc_pre split-K"
                            : "mhc_pre 1 Sinkhorn round",
             std::to_string(n) + "x4x4096 (24 mixes)", graph, copies, bytes,
             2.0 * double(n) * double(mixes + 1) * hcd + 2.0 * double(n * hcd), launch, check,
             "max rel err of comb vs CPU (2 tokens)");
  }
  // mhc_post
  {
    const double bytes = double(n * kD) * 4 + double(n * hcd) * 8 + n * 80.0;
    const int copies = copies_for(c, bytes, graph);
    std::vector<float> post(static_cast<size_t>(n * 4), 1.2f),
        comb(static_cast<size_t>(n * 16), 0.25f);
    float* dox = f(dev_copy(o, copies));
    float* dx = f(dev_copy(x, copies));
    float* dpost = f(dev_copy(post, copies));
    float* dcomb = f(dev_copy(comb, copies));
    float* dy = f(dev_alloc<float>(static_cast<size_t>(n * hcd) * copies));
    auto launch = [&](int k, cudaStream_t s) {
      cuda::MhcPostParams p{dox + size_t(k) * n * kD,
                            dx + size_t(k) * n * hcd,
                            dpost + size_t(k) * n * 4,
                            dcomb + size_t(k) * n * 16,
                            dy + size_t(k) * n * hcd,
                            n,
                            kD,
                            true};
      cuda::launch_mhc_post(p, s);
    };
    auto check = [&] {
      launch(0, c.stream);
      DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
      const int64_t tokens = std::min<int64_t>(n, 2);
      cpu::MhcConfig cfg;
      cfg.dim = kD;
      std::vector<float> want(static_cast<size_t>(tokens * hcd));
      cpu::mhc_post(cfg, o.data(), x.data(), post.data(), comb.data(), tokens, want.data());
      for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
      return max_rel_err(host_copy(dy, want.size()), want);
    };
    run_case(c, "mhc_post", std::to_string(n) + "x4x4096", graph, copies, bytes,
             10.0 * double(n * hcd), launch, check, "max rel err vs CPU (2 tokens)");
  }
  // mhc_head (logit rows): default path and the split-K kernels.
  for (int path : {0, 1}) {
    if (n > 64) break;
    const double bytes = double(n * hcd) * 4 + double(4 * hcd) * 4 + double(n * kD) * 4;
    const int copies = copies_for(c, bytes, graph);
    std::vector<float> hfn(fn.begin(), fn.begin() + 4 * hcd), hbase(base.begin(), base.begin() + 4);
    float* dx = f(dev_copy(x, copies));
    float* dfn = f(dev_copy(hfn, copies));
    float* db = f(dev_copy(hbase));
    float* ds = f(dev_copy(scale));
    float* dy = f(dev_alloc<float>(static_cast<size_t>(n * kD) * copies));
    const int64_t wsf = cuda::mhc_workspace_floats(n, kD);
    float* dws = f(dev_alloc<float>(static_cast<size_t>(wsf) * copies));
    auto launch = [&](int k, cudaStream_t s) {
      cuda::MhcHeadParams p;
      p.x = dx + size_t(k) * n * hcd;
      p.fn = dfn + size_t(k) * 4 * hcd;
      p.base = db;
      p.scale = ds;
      p.y = dy + size_t(k) * n * kD;
      p.workspace = dws + size_t(k) * wsf;
      p.num_tokens = n;
      p.dim = kD;
      p.path = path;
      cuda::launch_mhc_head(p, s);
    };
    auto check = [&] {
      launch(0, c.stream);
      DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
      const int64_t tokens = std::min<int64_t>(n, 2);
      cpu::MhcConfig cfg;
      cfg.dim = kD;
      std::vector<float> want(static_cast<size_t>(tokens * kD));
      cpu::mhc_head(cfg, {hfn.data(), hbase.data(), scale.data()}, x.data(), tokens, want.data());
      return max_rel_err(host_copy(dy, want.size()), want);
    };
    run_case(c, path == 0 ? "mhc_head" : "mhc_head split-K", std::to_string(n) + "x4x4096",
             graph, copies, bytes,
             2.0 * double(n) * 5 * hcd + 2.0 * double(n * hcd), launch, check,
             "max rel err vs CPU (2 tokens)");
  }
}

// Compressor: `seqs` sequences with `count` tokens each at start positions `start0 + 7 i`.
void bench_compressor(Ctx& c, const char* label, int64_t ratio, int64_t d,
                      cuda::CompressorEntryKind kind, int64_t seqs, int64_t count, int64_t start0) {
  const bool graph = count == 1;
  const int64_t width = (ratio == 4 ? 2 : 1) * d, rows = seqs * count;
  Rng rng{uint64_t(rows * 7 + ratio)};
  std::vector<float> kv = randn(rng, size_t(rows * width)),
                     score = randn(rng, size_t(rows * width), 2.0f);
  std::vector<float> ape = randn(rng, size_t(ratio * width), 0.5f),
                     nw = randn(rng, size_t(d), 0.2f, 1.0f);
  std::vector<float> inv(32);
  cpu::rope_inv_freq(cpu::rope_config_for_layer(ratio, 64, 1e4, 160000, 16, 65536, 32, 1),
                     inv.data());
  const int64_t state_floats = cuda::compressor_state_floats(ratio, d);
  std::vector<cuda::CompressorSeq> host_seqs(static_cast<size_t>(seqs));
  int64_t entries = 0, ring_rows_read = 0;
  for (int64_t i = 0; i < seqs; ++i) {
    const int64_t start = start0 + 7 * i;
    const int64_t n = (start + count) / ratio - start / ratio;
    host_seqs[size_t(i)] = {i * count, count, start, entries, nullptr};
    entries += n;
    // Ring rows a pooled entry reads (positions before `start`), bounded by the slots.
    if (n > 0)
      ring_rows_read +=
          std::min<int64_t>((ratio == 4 ? 8 : ratio), start - (start / ratio - 1) * ratio);
  }
  // Bytes: kv + score in, entries out, ring rows read by entries, ring rows written (each new
  // token of the open window, plus the 4 previous-window rows on CSA emission), 2 arrays each.
  const double bytes = double(rows * width) * 8 + double(entries * d) * 4 +
                       double(ring_rows_read) * d * 8 +
                       double(std::min<int64_t>(rows, seqs * ratio)) * width * 8 +
                       (ratio == 4 ? double(entries) * 4 * width * 8 : 0.0);
  const double flops = double(entries) * d * (ratio == 4 ? 8 : ratio) * 6;
  const int copies = copies_for(c, bytes, graph);
  Frees f;
  float* dkv = f(dev_copy(kv, copies));
  float* dsc = f(dev_copy(score, copies));
  float* dape = f(dev_copy(ape));
  float* dnw = f(dev_copy(nw));
  float* dinv = f(dev_copy(inv));
  float* dstate = f(dev_alloc<float>(static_cast<size_t>(state_floats * seqs) * copies));
  float* dent =
      f(dev_alloc<float>(static_cast<size_t>(std::max<int64_t>(entries, 1) * d) * copies));
  std::vector<cuda::CompressorSeq> all(static_cast<size_t>(seqs * copies));
  for (int k = 0; k < copies; ++k)
    for (int64_t i = 0; i < seqs; ++i) {
      cuda::CompressorSeq sq = host_seqs[size_t(i)];
      sq.state = dstate + (static_cast<size_t>(k) * seqs + size_t(i)) * state_floats;
      all[size_t(k * seqs + i)] = sq;
    }
  cuda::CompressorSeq* dseqs = f(dev_copy(all));
  cuda::launch_compressor_state_reset(dseqs, seqs * copies, ratio, d, c.stream);
  auto launch = [&](int k, cudaStream_t s) {
    cuda::CompressorParams p;
    p.kv = dkv + size_t(k) * rows * width;
    p.score = dsc + size_t(k) * rows * width;
    p.ape = dape;
    p.seqs = dseqs + size_t(k) * seqs;
    p.num_seqs = seqs;
    p.max_count = count;
    p.ratio = ratio;
    p.head_dim = d;
    p.entries = dent + size_t(k) * std::max<int64_t>(entries, 1) * d;
    p.kind = kind;
    p.norm_weight = dnw;
    p.inv_freq = dinv;
    cuda::launch_compressor(p, s);
  };
  auto check = [&]() -> double {
    cuda::launch_compressor_state_reset(dseqs, seqs, ratio, d, c.stream);
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    if (entries == 0) return 0.0;
    cpu::CompressorConfig cfg;
    cfg.ratio = ratio;
    cfg.head_dim = d;
    cpu::CompressorFinishParams fp;
    fp.kind = kind == cuda::CompressorEntryKind::kIndexer ? cpu::CompressorKind::kIndexer
                                                          : cpu::CompressorKind::kAttention;
    fp.norm_weight = nw.data();
    fp.inv_freq = inv.data();
    std::vector<float> want;
    for (int64_t i = 0; i < std::min<int64_t>(seqs, 8); ++i) {
      cpu::CompressorState st;
      cpu::compressor_state_reset(cfg, &st);
      const cuda::CompressorSeq& sq = host_seqs[size_t(i)];
      std::vector<float> e(static_cast<size_t>((count / ratio + 1) * d));
      const int64_t n =
          cpu::compressor_prefill(cfg, &st, ape.data(), kv.data() + sq.row * width,
                                  score.data() + sq.row * width, sq.start, count, e.data());
      for (int64_t j = 0; j < n; ++j)
        cpu::compressor_finish_entry(cfg, fp, sq.start / ratio + j, e.data() + j * d);
      want.insert(want.end(), e.begin(), e.begin() + n * d);
    }
    return max_rel_err(host_copy(dent, want.size()), want);
  };
  run_case(c, label,
           std::to_string(seqs) + " seq x " + std::to_string(count) + " tok, " +
               std::to_string(entries) + " entries",
           graph, copies, bytes, flops, launch, check,
           "max rel err of finished entries vs CPU (first 8 seqs)");
}

void bench_sampling(Ctx& c, int64_t rows) {
  Rng rng(uint64_t(rows) + 5);
  std::vector<float> logits = randn(rng, size_t(rows * kVocab), 3.0f);
  const double bytes = double(rows * kVocab) * 4;
  const int copies = copies_for(c, bytes, true);
  Frees f;
  float* dl = f(dev_copy(logits, copies));
  const int64_t wsf = cuda::sampling_workspace_floats(rows, kVocab);
  float* dws = f(dev_alloc<float>(static_cast<size_t>(wsf) * copies));
  int32_t* darg = f(dev_alloc<int32_t>(static_cast<size_t>(rows) * copies));
  int32_t* dids = f(dev_alloc<int32_t>(static_cast<size_t>(rows) * 20 * copies));
  float* dlp = f(dev_alloc<float>(static_cast<size_t>(rows) * 20 * copies));
  float* dtok = f(dev_alloc<float>(static_cast<size_t>(rows) * copies));
  auto launch = [&](int k, cudaStream_t s) {
    cuda::SampleParams p;
    p.logits = dl + size_t(k) * rows * kVocab;
    p.rows = rows;
    p.vocab = p.stride = kVocab;
    p.argmax = darg + size_t(k) * rows;
    p.top_k = 20;
    p.top_logprobs = dlp + size_t(k) * rows * 20;
    p.top_ids = dids + size_t(k) * rows * 20;
    p.token_logprobs = dtok + size_t(k) * rows;
    p.workspace = dws + size_t(k) * wsf;
    cuda::launch_sample_greedy(p, s);
  };
  auto check = [&] {
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    std::vector<int32_t> arg = host_copy(darg, size_t(rows));
    double wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data() + r * kVocab;
      wrong += arg[size_t(r)] != int32_t(std::max_element(x, x + kVocab) - x);
    }
    return wrong;
  };
  run_case(c, "sample_greedy_top20", std::to_string(rows) + "x129280", true, copies, bytes,
           3.0 * double(rows * kVocab), launch, check, "rows whose argmax differs from the host");
}

// launch_sample_rows (the backend's random draws): per row a plain draw (T = 1: the id-order
// scan), top-p 0.9 (two radix selections) or top-k 50 + top-p 0.95 + min-p 0.01 (four). The
// floor is one read of the logits; the kernel reads each row 3 (plain) to ~22 times (from L2).
void bench_sample_rows(Ctx& c, int64_t rows, const char* label, cpu::RowSampling draw) {
  Rng rng(uint64_t(rows) + 9);
  std::vector<float> logits = randn(rng, size_t(rows * kVocab), 3.0f);
  const double bytes = double(rows * kVocab) * 4;
  const int copies = copies_for(c, bytes, true);
  std::vector<cpu::RowSampling> params(static_cast<size_t>(rows), draw);
  for (int64_t r = 0; r < rows; ++r) params[size_t(r)].uniform = double((r * 37) % 101) / 101.0;
  Frees f;
  float* dl = f(dev_copy(logits, copies));
  cpu::RowSampling* dp = f(dev_alloc<cpu::RowSampling>(params.size()));
  DS_BENCH_CHECK(cudaMemcpy(dp, params.data(), params.size() * sizeof(cpu::RowSampling),
                            cudaMemcpyHostToDevice));
  int32_t* dids = f(dev_alloc<int32_t>(static_cast<size_t>(rows) * copies));
  uint8_t* dfin = f(dev_alloc<uint8_t>(static_cast<size_t>(rows) * copies));
  auto launch = [&](int k, cudaStream_t s) {
    cuda::SampleRowsParams p;
    p.logits = dl + size_t(k) * rows * kVocab;
    p.rows = rows;
    p.vocab = p.stride = kVocab;
    p.params = dp;
    p.ids = dids + size_t(k) * rows;
    p.finite = dfin + size_t(k) * rows;
    cuda::launch_sample_rows(p, s);
  };
  auto check = [&] {
    launch(0, c.stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(c.stream));
    const std::vector<int32_t> ids = host_copy(dids, size_t(rows));
    double wrong = 0;
    for (int64_t r = 0; r < std::min<int64_t>(rows, 4); ++r) {
      int32_t want = -1;
      uint8_t fin = 0;
      cpu::sample_rows(logits.data() + r * kVocab, 1, kVocab, &params[size_t(r)], &want, &fin);
      wrong += ids[size_t(r)] != want;
    }
    return wrong;
  };
  run_case(c, label, std::to_string(rows) + "x129280", true, copies, bytes,
           3.0 * double(rows * kVocab), launch, check,
           "rows (of the first 4) whose token differs from cpu::sample_rows");
}

}  // namespace
}  // namespace ds

int main(int argc, char** argv) {
  using namespace ds;
  std::string out = argc > 1 ? argv[1] : "bench/results/ops.json";
  Ctx c;
  DS_BENCH_CHECK(cudaStreamCreate(&c.stream));
  bench::DeviceInfo dev = bench::device_info();
  c.l2 = dev.l2_bytes;
  c.copy_gbps = bench::measure_copy_bandwidth_gbps(c.stream);
  c.fp32_tflops = measure_fp32_tflops(c.stream, dev.sm_count);
  std::fprintf(stderr, "copy %.0f GB/s, fp32 FMA %.1f TFLOP/s\n", c.copy_gbps, c.fp32_tflops);
  // "sampling": only the sampling kernels (a short device call).
  const bool only_sampling = argc > 2 && std::string(argv[2]) == "sampling";
  for (int64_t n : {1, 16, 64, 4096}) {
    if (only_sampling) break;
    bench_norm(c, n);
    bench_norm_heads(c, n);
    bench_rope(c, n);
    bench_norm_rope(c, n);
    bench_mhc(c, n);
  }
  using Kind = cuda::CompressorEntryKind;
  for (int64_t b : {1, 16, 64}) {
    if (only_sampling) break;
    bench_compressor(c, "compressor_csa_attn", 4, 512, Kind::kAttention, b, 1, 1003);
    bench_compressor(c, "compressor_csa_index", 4, 128, Kind::kIndexer, b, 1, 1003);
    bench_compressor(c, "compressor_hca", 128, 512, Kind::kAttention, b, 1, 1023);
  }
  if (!only_sampling) {
    bench_compressor(c, "compressor_csa_attn", 4, 512, Kind::kAttention, 1, 4096, 0);
    bench_compressor(c, "compressor_csa_index", 4, 128, Kind::kIndexer, 1, 4096, 0);
    bench_compressor(c, "compressor_hca", 128, 512, Kind::kAttention, 1, 4096, 0);
  }
  for (int64_t r : {1, 16, 64}) bench_sampling(c, r);
  for (int64_t r : {1, 16, 64}) {
    bench_sample_rows(c, r, "sample_rows_plain", {1.0, 0, 1.0, 0.0, 0.0});
    bench_sample_rows(c, r, "sample_rows_top_p", {1.0, 0, 0.9, 0.0, 0.0});
    bench_sample_rows(c, r, "sample_rows_k_p_min", {0.8, 50, 0.95, 0.01, 0.0});
  }
  bench::write_results(out, "ops", dev, c.copy_gbps, c.records);
  // bench_util writes the copy ceiling only; add the fp32 FMA ceiling next to it.
  {
    std::ifstream in(out);
    std::stringstream buf;
    buf << in.rdbuf();
    std::string js = buf.str();
    const std::string key = "\"ceilings\": {\"copy_gbps\": ";
    const size_t at = js.find(key);
    if (at != std::string::npos) {
      const size_t close = js.find('}', at);
      js.insert(close, ", \"fp32_fma_tflops\": " + std::to_string(c.fp32_tflops));
      std::ofstream(out) << js;
    }
  }
  std::printf("fp32 FMA ceiling %.1f TFLOP/s (floor = max(bytes / copy, flops / fp32))\n",
              c.fp32_tflops);
  return 0;
}
