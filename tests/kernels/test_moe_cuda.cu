// MoE on the GPU (kernels/cuda/moe) against the CPU oracle cpu::moe_forward / cpu::moe_route, at
// the tiny shape (D 256, 8 experts, top-2, inter 128) and the Flash shape (D 4096, 256 experts,
// top-6, inter 2048), T = 1, 16, 64, 512, 4096, uniform and skewed routing (every token to one
// expert through a large bias), empty experts, hash routing, an expert-parallel range without the
// shared expert, hf-style numerics, MXFP4 and NVFP4 routed experts (FP8-block shared expert).
//
// The 128-row prefill tiles run by default wherever more than 32 rows per expert are expected
// (T = 4096 at Flash, T >= 512 at the tiny shape): on wgmma (expert_gemm_wg_kernel) on sm_90,
// else on bf16 mma.sync (expert_gemm_pf_kernel). PrefillPathVariants forces the mma.sync kernel
// elsewhere, WgmmaPrefillPathVariants the wgmma one, KernelVariants / Fp8PathVariants the others.
//
// Weights: random fp32 quantized with the project's FP4 quantizer (cpu::quantize_fp4_blocks =
// MXFP4, e8m0 per 32) or the NVFP4 / FP8-block recipes of model/weight_format.h (re-implemented
// here with core/dtype.h: the kernels-only build has no model library). The Flash shape uses a
// pool of 4 distinct expert weight sets (expert e uses set e % 4; the GPU sees 256 experts with
// their own pointers), and for T >= 512 the oracle runs on a sample of 24 tokens only (the MoE is
// per-token independent): the CPU reference needs ~0.2 s per Flash token.
//
// Tolerance: both sides multiply the same operands (the weights dequantized exactly to bf16, the
// activations FP8-simulated per 128, which is exact in bf16) with fp32 accumulation; the sums run
// in a different order (~1e-6 relative), and an element of the SwiGLU output h that lies next to
// an FP8 (or bf16) rounding boundary can round one step differently (one e4m3 step: 1/16 to 1/8
// of itself, one term of the inter-long w2 sum). Bound: max |gpu - cpu| <= max(1e-2, 0.6 /
// sqrt(inter)) * rms(cpu) + 1e-5, and mean |gpu - cpu| <= 1e-3 * rms(cpu) (5x both in hf
// numerics, see run_case). Measured on H200: MXFP4 ~1e-6 relative (max) without a flip, one flip
// 2.7e-2 at the tiny shape (session 7, prefill path, skewed T = 512: over the earlier bound
// 0.3 / sqrt(inter) = 2.65e-2, which assumed a 1/16 step), NVFP4 up to 1.3e-2 at the tiny shape.
// The routing (experts) must match exactly, except for tokens whose k-th and (k+1)-th biased
// scores are within 1e-5 (fp32 logits summed in another order may swap them); such tokens are
// excluded from the comparison and counted.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/common/div_rn.cuh"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda_test_util.h"

namespace ds {
namespace {

using cpu::LinearWeight;
using cpu::WeightFormat;
using test::DeviceBuffer;

// Deterministic uniform [-1, 1) from a counter (fast enough for ~10^8 Flash weights).
float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) / float(1 << 23) - 1.0f;
}

std::vector<float> random_vec(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = hash_uniform(seed, i) * scale;
  return v;
}

// A quantized matrix on the host and the device.
struct QMatrix {
  WeightFormat format;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> data, scale;
  float global_scale = 1.0f;
  std::unique_ptr<DeviceBuffer<uint8_t>> d_data, d_scale;
  LinearWeight host() const {
    return {format, n, k, data.data(), scale.data(), global_scale};
  }
  LinearWeight device() const {
    return {format, n, k, d_data->get(), d_scale->get(), global_scale};
  }
};

void quantize_nvfp4(const std::vector<float>& w, int64_t n, int64_t k, QMatrix& q) {
  float amax = 0.0f;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  q.global_scale = amax > 0.0f ? amax / (448.0f * 6.0f) : 1.0f;
  q.data.assign(size_t(n * k / 2), 0);
  q.scale.assign(size_t(n * k / 16), 0);
  for (int64_t b = 0; b < n * k / 16; ++b) {
    float bmax = 0.0f;
    for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(w[size_t(b * 16 + i)]));
    const uint8_t sc = float_to_e4m3(bmax / (6.0f * q.global_scale));
    q.scale[size_t(b)] = sc;
    const float s = e4m3_to_float(sc) * q.global_scale;
    for (int i = 0; i < 16; ++i) {
      const int64_t idx = b * 16 + i;
      const uint8_t code = s > 0.0f ? float_to_e2m1(w[size_t(idx)] / s) : 0;
      q.data[size_t(idx / 2)] |= uint8_t((idx % 2 == 0) ? code : (code << 4));
    }
  }
}

void quantize_fp8_block(const std::vector<float>& w, int64_t n, int64_t k, QMatrix& q) {
  const int64_t nb = (n + 127) / 128, kb = (k + 127) / 128;
  q.data.assign(size_t(n * k), 0);
  q.scale.assign(size_t(nb * kb), 0);
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t bj = 0; bj < kb; ++bj) {
      float amax = 0.0f;
      for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); ++r)
        for (int64_t c = bj * 128; c < std::min(k, bj * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(w[size_t(r * k + c)]));
      const uint8_t sc = amax > 0.0f ? e8m0_ceil_pow2(amax / 448.0f) : uint8_t(127);
      q.scale[size_t(bi * kb + bj)] = sc;
      const float s = e8m0_to_float(sc);
      for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); ++r)
        for (int64_t c = bj * 128; c < std::min(k, bj * 128 + 128); ++c)
          q.data[size_t(r * k + c)] =
              float_to_e4m3(std::clamp(w[size_t(r * k + c)] / s, -448.f, 448.f));
    }
  }
}

// mult: a power of two scaling the random weights (MXFP4: the same codes, scale codes + log2 mult).
std::unique_ptr<QMatrix> make_matrix(WeightFormat format, int64_t n, int64_t k, uint64_t seed,
                                     float mult = 1.0f) {
  auto q = std::make_unique<QMatrix>();
  q->format = format;
  q->n = n;
  q->k = k;
  const std::vector<float> w = random_vec(size_t(n * k), seed, mult * 2.0f / std::sqrt(float(k)));
  if (format == WeightFormat::kMxfp4) {
    q->data.resize(size_t(n * k / 2));
    q->scale.resize(size_t(n * k / 32));
    cpu::quantize_fp4_blocks(w.data(), n * k, 32, q->data.data(), q->scale.data(), nullptr);
  } else if (format == WeightFormat::kNvfp4) {
    quantize_nvfp4(w, n, k, *q);
  } else {
    quantize_fp8_block(w, n, k, *q);
  }
  q->d_data = std::make_unique<DeviceBuffer<uint8_t>>(q->data.size());
  q->d_scale = std::make_unique<DeviceBuffer<uint8_t>>(q->scale.size());
  EXPECT_EQ(q->d_data->upload(q->data), cudaSuccess);
  EXPECT_EQ(q->d_scale->upload(q->scale), cudaSuccess);
  return q;
}

struct Shape {
  int64_t dim, inter, experts, topk, pool;
};
constexpr Shape kTiny{256, 128, 8, 2, 8};
constexpr Shape kFlash{4096, 2048, 256, 6, 4};

// Weights of one layer shape and routed format (built once per shape/format, kept for all cases);
// w2_log2 scales the routed w2 matrices by 2^w2_log2.
struct LayerWeights {
  Shape shape;
  WeightFormat format;
  int w2_log2 = 0;
  std::vector<std::unique_ptr<QMatrix>> pool;  // [pool][3]: w1, w3, w2
  std::unique_ptr<QMatrix> shared[3];
  std::vector<float> gate;
  std::unique_ptr<DeviceBuffer<float>> d_gate;
  std::vector<cpu::ExpertWeights> host_experts, device_experts;

  LayerWeights(Shape s, WeightFormat f, int w2_log2_) : shape(s), format(f), w2_log2(w2_log2_) {
    const uint64_t seed = 1000 + uint64_t(f) * 100 + uint64_t(s.dim);
    for (int64_t p = 0; p < s.pool; ++p) {
      pool.push_back(make_matrix(f, s.inter, s.dim, seed + 3 * p));
      pool.push_back(make_matrix(f, s.inter, s.dim, seed + 3 * p + 1));
      pool.push_back(make_matrix(f, s.dim, s.inter, seed + 3 * p + 2, std::ldexp(1.0f, w2_log2)));
    }
    shared[0] = make_matrix(WeightFormat::kFp8Block, s.inter, s.dim, seed + 77);
    shared[1] = make_matrix(WeightFormat::kFp8Block, s.inter, s.dim, seed + 78);
    shared[2] = make_matrix(WeightFormat::kFp8Block, s.dim, s.inter, seed + 79);
    gate = random_vec(size_t(s.experts * s.dim), seed + 99, 2.0f / std::sqrt(float(s.dim)));
    d_gate = std::make_unique<DeviceBuffer<float>>(gate.size());
    EXPECT_EQ(d_gate->upload(gate), cudaSuccess);
    for (int64_t e = 0; e < s.experts; ++e) {
      const int64_t p = e % s.pool;
      host_experts.push_back({pool[size_t(3 * p)]->host(), pool[size_t(3 * p + 2)]->host(),
                              pool[size_t(3 * p + 1)]->host()});
      device_experts.push_back({pool[size_t(3 * p)]->device(), pool[size_t(3 * p + 2)]->device(),
                                pool[size_t(3 * p + 1)]->device()});
    }
  }
};

LayerWeights& layer_weights(Shape s, WeightFormat f, int w2_log2 = 0) {
  static std::vector<std::unique_ptr<LayerWeights>> cache;
  for (auto& l : cache)
    if (l->shape.dim == s.dim && l->format == f && l->w2_log2 == w2_log2) return *l;
  cache.push_back(std::make_unique<LayerWeights>(s, f, w2_log2));
  return *cache.back();
}

struct Case {
  std::string name;
  Shape shape;
  WeightFormat format;
  int64_t T;
  bool skew = false;     // every token to expert 3 (bias)
  bool hash = false;     // tid2eid routing
  int64_t begin = 0, end = -1;
  bool add_shared = true;
  bool hf = false;       // quantize_activations off, round_bf16 on, shared clamp, eps 1e-20
  bool gate_bf16 = false;  // router gate stored as bf16 (both sides), else fp32
  int64_t oracle_tokens = 0;  // 0 = all
  cuda::MoeTuning tuning;     // default: the heuristic
  std::string expect_error;   // non-empty: forward must fail with a message containing it
  bool graph = false;  // forward captured in a CUDA graph on its own stream, replayed twice
  // Also runs the forward with the other prefill grid order (tuning.pf_raster flipped) and checks
  // that both give the same y bit for bit (each tile's arithmetic does not depend on the order).
  bool compare_grid_orders = false;
  // Other tunings whose forward must give the same y bit for bit (the wgmma kernel's CTA widths:
  // each output element is the same sequence of wgmmas on the same operands).
  std::vector<cuda::MoeTuning> bit_equal;
  int w2_log2 = 0;  // the routed w2 weights scaled by 2^w2_log2 (LayerWeights)
  // The layer limited to its largest MXFP4 scale code after create(), as CudaOps does
  // (MoeDeviceLayer::limit_to_scale_code); then the wgmma prefill kernel must stay as create() set
  // it (wgmma_kept) or be off.
  bool limit_scale_codes = false;
  bool wgmma_kept = true;
};

void run_case(const Case& c) {
  const Shape s = c.shape;
  LayerWeights& lw = layer_weights(s, c.format, c.w2_log2);
  const int64_t T = c.T, D = s.dim, E = s.experts, K = s.topk;

  std::vector<float> x = random_vec(size_t(T * D), 7 + uint64_t(T), 1.0f);
  std::vector<float> bias = random_vec(size_t(E), 11, 0.05f);
  if (c.skew) bias[3] = 1000.0f;
  const int64_t vocab = 1000;
  std::vector<int32_t> tid2eid(size_t(vocab * K)), token_ids(static_cast<size_t>(T));
  for (int64_t v = 0; v < vocab; ++v) {
    // k distinct experts per row.
    for (int64_t i = 0; i < K; ++i) tid2eid[size_t(v * K + i)] = int32_t((v * 7 + i * 5) % E);
  }
  for (int64_t t = 0; t < T; ++t) token_ids[size_t(t)] = int32_t((t * 131 + 17) % vocab);

  DeviceBuffer<float> d_x(x.size()), d_bias(bias.size()), d_y(size_t(T * D));
  DeviceBuffer<int32_t> d_tid2eid(tid2eid.size()), d_tok(token_ids.size());
  ASSERT_TRUE(d_x.ok() && d_y.ok());
  DS_CUDA_ASSERT(d_x.upload(x));
  DS_CUDA_ASSERT(d_bias.upload(bias));
  DS_CUDA_ASSERT(d_tid2eid.upload(tid2eid));
  DS_CUDA_ASSERT(d_tok.upload(token_ids));

  // The bf16 gate: the fp32 gate rounded, the same bits on both sides.
  std::vector<uint16_t> gate16;
  DeviceBuffer<uint16_t> d_gate16(c.gate_bf16 ? lw.gate.size() : 1);
  if (c.gate_bf16) {
    for (float v : lw.gate) gate16.push_back(float_to_bf16(v));
    DS_CUDA_ASSERT(d_gate16.upload(gate16));
  }

  cpu::MoeParams hp;
  hp.router_config = {E, K, 1.5f, c.hf ? 1e-20f : 0.0f};
  hp.router.gate = c.gate_bf16
                       ? LinearWeight{WeightFormat::kBF16, E, D, gate16.data(), nullptr, 1.0f}
                       : LinearWeight{WeightFormat::kF32, E, D, lw.gate.data(), nullptr, 1.0f};
  hp.router.bias = c.hash ? nullptr : bias.data();
  hp.router.tid2eid = c.hash ? tid2eid.data() : nullptr;
  hp.router.vocab_size = vocab;
  hp.experts = lw.host_experts.data();
  hp.shared = {lw.shared[0]->host(), lw.shared[2]->host(), lw.shared[1]->host()};
  hp.swiglu_limit = 10.0f;
  hp.shared_expert_clamp = c.hf;
  hp.quantize_activations = !c.hf;
  hp.round_bf16 = c.hf;
  hp.expert_begin = c.begin;
  hp.expert_end = c.end;
  hp.add_shared = c.add_shared;

  cpu::MoeParams dp = hp;
  dp.router.gate.data = c.gate_bf16 ? static_cast<const void*>(d_gate16.get())
                                    : static_cast<const void*>(lw.d_gate->get());
  dp.router.bias = c.hash ? nullptr : d_bias.get();
  dp.router.tid2eid = c.hash ? d_tid2eid.get() : nullptr;
  dp.experts = lw.device_experts.data();
  dp.shared = {lw.shared[0]->device(), lw.shared[2]->device(), lw.shared[1]->device()};

  auto layer = cuda::MoeDeviceLayer::create(dp);
  ASSERT_TRUE(layer.ok()) << layer.status().message();
  if (c.limit_scale_codes) {
    const bool wg = layer->pf_wgmma;
    layer->limit_to_scale_code(cuda::max_mxfp4_scale_code(lw.host_experts.data(), 0, E, &hp.shared));
    EXPECT_EQ(layer->pf_wgmma, c.wgmma_kept && wg);
    std::printf("[%s] wgmma prefill kernel %s\n", c.name.c_str(), layer->pf_wgmma ? "on" : "off");
  }
  if (c.tuning.path == 2 && !layer->fp8_mma) {
    std::printf("[%s] no FP8 mma.sync on this device: FP8 path not run\n", c.name.c_str());
    return;
  }
  if (c.tuning.path == 4 && !layer->pf_wgmma) {
    std::printf("[%s] not an sm_90 device: wgmma prefill path not run\n", c.name.c_str());
    return;
  }
  const size_t ws_bytes = cuda::MoeRunner::workspace_bytes(T, *layer);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  ASSERT_TRUE(ws.ok());
  DS_CUDA_ASSERT(ws.poison());
  DS_CUDA_ASSERT(d_y.poison());
  // c.graph: the launches recorded once (with MoeTuning::pdl, as programmatic-dependency edges),
  // then the graph replayed twice with y poisoned before each replay; the second replay's y is
  // checked. A CUDA error of the capture or a replay comes back as the status's message.
  auto graph_forward = [&]() -> Status {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return invalid_argument(std::string("cuda: ") + cudaGetErrorString(e));
    const Status fst = cuda::MoeRunner::forward(*layer, d_x.get(), d_tok.get(), T, d_y.get(),
                                                ws.get(), stream, c.tuning);
    e = cudaStreamEndCapture(stream, &graph);
    if (fst.ok() && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    for (int rep = 0; rep < 2 && fst.ok() && e == cudaSuccess; ++rep) {
      e = d_y.poison();
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      if (e == cudaSuccess) e = cudaGraphLaunch(exec, stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    }
    const auto keep_first = [&e](cudaError_t d) { e = e == cudaSuccess ? d : e; };
    if (exec) keep_first(cudaGraphExecDestroy(exec));
    if (graph) keep_first(cudaGraphDestroy(graph));
    keep_first(cudaStreamDestroy(stream));
    if (!fst.ok()) return fst;
    if (e != cudaSuccess) return invalid_argument(std::string("cuda: ") + cudaGetErrorString(e));
    return ok_status();
  };
  const Status st = c.graph ? graph_forward()
                            : cuda::MoeRunner::forward(*layer, d_x.get(), d_tok.get(), T,
                                                       d_y.get(), ws.get(), 0, c.tuning);
  if (!c.expect_error.empty()) {
    ASSERT_FALSE(st.ok()) << c.name << ": accepted";
    EXPECT_NE(st.message().find(c.expect_error), std::string::npos) << st.message();
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message();
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> y;
  DS_CUDA_ASSERT(d_y.download(y));
  // Tunings that must give the same y bit for bit.
  std::vector<std::pair<cuda::MoeTuning, std::string>> same;
  if (c.compare_grid_orders) {
    cuda::MoeTuning o = c.tuning;
    o.pf_raster = 1 - o.pf_raster;
    same.emplace_back(o, "pf_raster " + std::to_string(c.tuning.pf_raster) + " and " +
                             std::to_string(o.pf_raster));
  }
  for (const cuda::MoeTuning& o : c.bit_equal) {
    same.emplace_back(o, "the tuning and bit_equal #" + std::to_string(same.size()) +
                             " (pf_rows " + std::to_string(o.pf_rows) + ", f8_order " +
                             std::to_string(o.f8_order) + ", f8_act_rows " +
                             std::to_string(o.f8_act_rows) + ")");
  }
  for (const auto& [other, what] : same) {
    DeviceBuffer<float> d_y2(size_t(T * D));
    ASSERT_TRUE(d_y2.ok());
    DS_CUDA_ASSERT(d_y2.poison());
    DS_CUDA_ASSERT(ws.poison());
    const Status st2 = cuda::MoeRunner::forward(*layer, d_x.get(), d_tok.get(), T, d_y2.get(),
                                                ws.get(), 0, other);
    ASSERT_TRUE(st2.ok()) << st2.message();
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> y2;
    DS_CUDA_ASSERT(d_y2.download(y2));
    ASSERT_EQ(y2.size(), y.size());
    ASSERT_EQ(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)), 0)
        << c.name << ": " << what << " give different outputs";
  }

  // Routing on the GPU vs the CPU for every token.
  DeviceBuffer<int32_t> d_ex(size_t(T * K));
  DeviceBuffer<float> d_w(size_t(T * K));
  DS_CUDA_ASSERT(d_ex.poison());
  const Status rst =
      cuda::MoeRunner::route(*layer, d_x.get(), d_tok.get(), T, d_ex.get(), d_w.get(), ws.get(), 0);
  ASSERT_TRUE(rst.ok()) << rst.message();
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int32_t> g_ex;
  std::vector<float> g_w;
  DS_CUDA_ASSERT(d_ex.download(g_ex));
  DS_CUDA_ASSERT(d_w.download(g_w));
  if (T > 8 && T <= 64) {
    // 8 < T <= 64 computes the router logits in tiles of 4 experts x 16 tokens, T <= 8 in tiles of
    // one expert x 8 tokens, with the same arithmetic per logit: routing the tokens 8 at a time
    // must give the same experts and weights, bit for bit.
    DeviceBuffer<int32_t> d_ex8(size_t(T * K));
    DeviceBuffer<float> d_w8(size_t(T * K));
    DS_CUDA_ASSERT(d_ex8.poison());
    DS_CUDA_ASSERT(d_w8.poison());
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
      const Status s8 = cuda::MoeRunner::route(*layer, d_x.get() + t0 * D, d_tok.get() + t0,
                                               std::min<int64_t>(8, T - t0), d_ex8.get() + t0 * K,
                                               d_w8.get() + t0 * K, ws.get(), 0);
      ASSERT_TRUE(s8.ok()) << s8.message();
    }
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<int32_t> g_ex8;
    std::vector<float> g_w8;
    DS_CUDA_ASSERT(d_ex8.download(g_ex8));
    DS_CUDA_ASSERT(d_w8.download(g_w8));
    for (int64_t i = 0; i < T * K; ++i) {
      ASSERT_EQ(g_ex8[size_t(i)], g_ex[size_t(i)]) << c.name << " T=" << T << " slot " << i;
      ASSERT_EQ(std::memcmp(&g_w8[size_t(i)], &g_w[size_t(i)], 4), 0)
          << c.name << " T=" << T << " slot " << i << ": " << g_w8[size_t(i)] << " vs "
          << g_w[size_t(i)];
    }
  }

  // Oracle tokens: all, or an even sample.
  std::vector<int64_t> tokens;
  const int64_t n_oracle = c.oracle_tokens > 0 ? std::min(c.oracle_tokens, T) : T;
  for (int64_t i = 0; i < n_oracle; ++i) tokens.push_back(i * T / n_oracle);
  std::vector<float> xs(size_t(n_oracle * D));
  std::vector<int32_t> ids(static_cast<size_t>(n_oracle));
  for (int64_t i = 0; i < n_oracle; ++i) {
    std::copy(x.begin() + tokens[size_t(i)] * D, x.begin() + (tokens[size_t(i)] + 1) * D,
              xs.begin() + i * D);
    ids[size_t(i)] = token_ids[size_t(tokens[size_t(i)])];
  }
  std::vector<int32_t> c_ex(size_t(n_oracle * K));
  std::vector<float> c_w(size_t(n_oracle * K));
  cpu::moe_route(hp.router_config, hp.router, xs.data(), ids.data(), n_oracle, c_ex.data(),
                 c_w.data());
  // Near-ties of the k-th and (k+1)-th biased scores.
  std::vector<float> logits(size_t(n_oracle * E));
  cpu::linear(xs.data(), n_oracle, hp.router.gate, false, logits.data());
  std::vector<bool> tie(size_t(n_oracle), false);
  int64_t ties = 0;
  if (!c.hash) {
    for (int64_t i = 0; i < n_oracle; ++i) {
      std::vector<float> b(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        b[size_t(e)] = cpu::sqrt_softplus(logits[size_t(i * E + e)]) + bias[size_t(e)];
      std::sort(b.begin(), b.end(), std::greater<float>());
      const float margin = b[size_t(K - 1)] - b[size_t(K)];
      if (K < E && margin < 1e-5f * std::max(1.0f, std::fabs(b[size_t(K)]))) {
        tie[size_t(i)] = true;
        ++ties;
      }
    }
  }
  for (int64_t i = 0; i < n_oracle; ++i) {
    if (tie[size_t(i)]) continue;
    const int64_t t = tokens[size_t(i)];
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_EQ(g_ex[size_t(t * K + j)], c_ex[size_t(i * K + j)]) << "token " << t << " slot " << j;
      ASSERT_NEAR(g_w[size_t(t * K + j)], c_w[size_t(i * K + j)], 1e-5f) << "token " << t;
    }
  }

  std::vector<float> ref(size_t(n_oracle * D));
  cpu::moe_forward(hp, xs.data(), ids.data(), n_oracle, ref.data());
  double sumsq = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n_oracle; ++i) {
    if (tie[size_t(i)]) continue;
    for (int64_t d = 0; d < D; ++d) {
      sumsq += double(ref[size_t(i * D + d)]) * ref[size_t(i * D + d)];
    }
    counted += D;
  }
  const double rms = counted ? std::sqrt(sumsq / double(counted)) : 0.0;
  double max_err = 0.0, sum_err = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n_oracle; ++i) {
    if (tie[size_t(i)]) continue;
    const int64_t t = tokens[size_t(i)];
    for (int64_t d = 0; d < D; ++d) {
      const double g = y[size_t(t * D + d)], r = ref[size_t(i * D + d)];
      const double err = std::isfinite(g) ? std::fabs(g - r) : 1e30;
      sum_err += err;
      if (err > max_err) {
        max_err = err;
        worst = t * D + d;
      }
    }
  }
  const double mean_err = counted ? sum_err / double(counted) : 0.0;
  std::printf("[%s bt%d ks%d path%d ring%d mma%d w%d fp8_mma%d fp8_f16%d] T=%lld oracle=%lld "
              "ties=%lld rms=%.4g max_err=%.3g (%.2e rel) mean_err=%.3g\n",
              c.name.c_str(), c.tuning.tile_tokens, c.tuning.k_split, c.tuning.path,
              c.tuning.ring_kb, c.tuning.mma, c.tuning.warps, int(layer->fp8_mma),
              int(layer->fp8_f16),
              (long long)T,
              (long long)n_oracle, (long long)ties, rms, max_err,
              rms > 0 ? max_err / rms : 0.0, mean_err);
  EXPECT_LE(ties, std::max<int64_t>(1, n_oracle / 50)) << "too many near-ties to be a tie problem";
  EXPECT_GT(rms, 0.0);
  // One h element rounding one e4m3 step apart (up to 1/8 of itself at the bottom of a binade)
  // moves y by up to ~|h w2| / 8, i.e. ~1/(8 sqrt(inter)) of rms(y) times the outlier factor of
  // |h w2| (~5): the max bound grows as inter shrinks (0.053 rms at inter 128, 0.013 at 2048); the
  // mean bound stays 1e-3 (one flipped h moves one token). hf numerics: the GPU rounds the fp32
  // inputs of every GEMM to bf16 (the CPU keeps fp32; relative error 2^-9 per input) and each
  // bf16 rounding of a, b, h and y can land one bf16 step apart: 5x both bounds.
  const double tol = c.hf ? 5.0 : 1.0;
  const double max_rel = std::max(1e-2, 0.6 / std::sqrt(double(s.inter)));
  EXPECT_LE(max_err, tol * max_rel * rms + 1e-5) << "worst element " << worst;
  EXPECT_LE(mean_err, tol * 1e-3 * rms + 1e-6);
}

class MoeCuda : public ::testing::Test {
 protected:
  void SetUp() override { DS_REQUIRE_GPU(); }
};

TEST_F(MoeCuda, TinyUniformMxfp4) {
  for (int64_t T : {1, 16, 64, 512, 4096}) run_case({"tiny mxfp4", kTiny, WeightFormat::kMxfp4, T});
}
TEST_F(MoeCuda, TinyUniformNvfp4) {
  for (int64_t T : {1, 16, 64, 512, 4096}) run_case({"tiny nvfp4", kTiny, WeightFormat::kNvfp4, T});
}
TEST_F(MoeCuda, TinySkewed) {
  // Every token picks expert 3 (+ one more): one huge group, the other experts (nearly) empty.
  for (int64_t T : {1, 64, 512}) {
    run_case({"tiny skew mxfp4", kTiny, WeightFormat::kMxfp4, T, true});
    run_case({"tiny skew nvfp4", kTiny, WeightFormat::kNvfp4, T, true});
  }
}
TEST_F(MoeCuda, TinyHashRouting) {
  for (int64_t T : {1, 16, 512}) {
    run_case({"tiny hash", kTiny, WeightFormat::kMxfp4, T, false, true});
  }
}
TEST_F(MoeCuda, TinyExpertRangeNoShared) {
  // Expert parallelism: experts [2, 6) only, no shared expert; some tokens get no expert at all.
  for (int64_t T : {1, 64}) {
    Case c{"tiny range", kTiny, WeightFormat::kNvfp4, T};
    c.begin = 2;
    c.end = 6;
    c.add_shared = false;
    run_case(c);
  }
}
TEST_F(MoeCuda, TinyHfNumerics) {
  for (int64_t T : {16, 512}) {
    Case c{"tiny hf", kTiny, WeightFormat::kMxfp4, T};
    c.hf = true;
    run_case(c);
  }
}
TEST_F(MoeCuda, FlashMxfp4) {
  for (int64_t T : {1, 16, 64}) run_case({"flash mxfp4", kFlash, WeightFormat::kMxfp4, T});
  for (int64_t T : {512, 4096}) {
    Case c{"flash mxfp4", kFlash, WeightFormat::kMxfp4, T};
    c.oracle_tokens = 24;
    run_case(c);
  }
}
TEST_F(MoeCuda, FlashNvfp4) {
  run_case({"flash nvfp4", kFlash, WeightFormat::kNvfp4, 16});
  Case c{"flash nvfp4", kFlash, WeightFormat::kNvfp4, 4096};
  c.oracle_tokens = 24;
  run_case(c);
}
TEST_F(MoeCuda, FlashSkewedAndHash) {
  Case skew{"flash skew", kFlash, WeightFormat::kMxfp4, 512, true};
  skew.oracle_tokens = 24;
  run_case(skew);
  run_case({"flash hash", kFlash, WeightFormat::kMxfp4, 16, false, true});
}

TEST_F(MoeCuda, KernelVariants) {
  // Every instantiated (tile rows, K split) pair of the grouped GEMMs, at both shapes.
  const int variants[][2] = {{8, 1}, {8, 2}, {8, 4}, {16, 1}, {16, 2}, {32, 1}, {64, 1}};
  for (const auto& v : variants) {
    Case tiny{"tiny nvfp4 variant", kTiny, WeightFormat::kNvfp4, 64};
    tiny.tuning = {v[0], v[1]};
    run_case(tiny);
    Case flash{"flash mxfp4 variant", kFlash, WeightFormat::kMxfp4, 64};
    flash.tuning = {v[0], v[1]};
    run_case(flash);
  }
}

// The FP8 tensor-core path (MXFP4 routed experts, FP8-block shared expert, reference numerics:
// chosen by default for 8/16-row tiles on sm_89+) forced for every (tile, K split) pair, and the
// bf16 path forced on the same weights. Same operands as the oracle (e2m1 -> e4m3 and the FP8
// activations are exact), so the same tolerance applies.
TEST_F(MoeCuda, Fp8PathVariants) {
  // Both MMAs of the FP8 path: e4m3 mma.sync (mma 1) and f16 mma.sync on the exactly converted
  // operands (mma 2: e2m1 placed into f16 bits, the default on sm_90 / sm_100).
  const int variants[][2] = {{8, 1}, {8, 2}, {8, 4}, {16, 1}, {16, 2}, {16, 4}};
  for (int mma : {1, 2}) {
    for (const auto& v : variants) {
      for (int64_t T : {1, 64}) {
        Case tiny{mma == 1 ? "tiny mxfp4 fp8 e4m3" : "tiny mxfp4 fp8 f16", kTiny,
                  WeightFormat::kMxfp4, T};
        tiny.tuning = {v[0], v[1], 2, 0, mma};
        run_case(tiny);
        Case flash{mma == 1 ? "flash mxfp4 fp8 e4m3" : "flash mxfp4 fp8 f16", kFlash,
                   WeightFormat::kMxfp4, T};
        flash.tuning = {v[0], v[1], 2, 0, mma};
        flash.oracle_tokens = 8;  // the CPU oracle costs ~0.2 s per Flash token
        run_case(flash);
      }
    }
    // 8 warps per CTA (8-row tiles, 8 KB ring: 16 warps per SM), every K split.
    for (int ks : {1, 2, 4}) {
      for (int64_t T : {1, 64}) {
        Case tiny{mma == 1 ? "tiny mxfp4 fp8 w8 e4m3" : "tiny mxfp4 fp8 w8 f16", kTiny,
                  WeightFormat::kMxfp4, T};
        tiny.tuning = {8, ks, 2, 0, mma, 8};
        run_case(tiny);
        Case flash{mma == 1 ? "flash mxfp4 fp8 w8 e4m3" : "flash mxfp4 fp8 w8 f16", kFlash,
                   WeightFormat::kMxfp4, T};
        flash.tuning = {8, ks, 2, 0, mma, 8};
        flash.oracle_tokens = 8;
        run_case(flash);
      }
    }
    for (int64_t T : {1, 64}) {
      // The 16 KB ring per warp (8 FP4 / 4 FP8 stages; 8 KB is the default).
      for (int ks : {2, 4}) {
        Case ring{mma == 1 ? "flash mxfp4 fp8 ring16 e4m3" : "flash mxfp4 fp8 ring16 f16",
                  kFlash, WeightFormat::kMxfp4, T};
        ring.tuning = {8, ks, 2, 16, mma};
        ring.oracle_tokens = 8;
        run_case(ring);
      }
    }
  }
  Case skew{"tiny skew mxfp4 fp8", kTiny, WeightFormat::kMxfp4, 64, true};
  skew.tuning = {16, 2, 2};
  run_case(skew);
  Case range{"tiny range mxfp4 fp8", kTiny, WeightFormat::kMxfp4, 64};
  range.begin = 2;
  range.end = 6;
  range.add_shared = false;
  range.tuning = {8, 2, 2};
  run_case(range);
  Case hash{"flash hash fp8", kFlash, WeightFormat::kMxfp4, 16, false, true};
  hash.tuning = {8, 4, 2};
  run_case(hash);
  // The f16 MMA on the skewed tiny case (every token to one expert: full 16-row tiles).
  Case skew16{"tiny skew mxfp4 fp8 f16", kTiny, WeightFormat::kMxfp4, 64, true};
  skew16.tuning = {16, 2, 2, 0, 2};
  run_case(skew16);
  Case skew8{"tiny skew mxfp4 fp8 w8 f16", kTiny, WeightFormat::kMxfp4, 64, true};
  skew8.tuning = {8, 2, 2, 0, 2, 8};
  run_case(skew8);
  Case hash8{"flash hash fp8 w8", kFlash, WeightFormat::kMxfp4, 16, false, true};
  hash8.tuning = {8, 4, 2, 0, 0, 8};
  run_case(hash8);
}

// The FP8 path's decode forms of session 29 against the forms before, each alone and both: the
// grid order (MoeTuning::f8_order 0: the shared expert's tiles first, then tile by tile; 1: the
// order before) and the activation tile's rows (f8_act_rows 0: at most T, or T * k with hash
// routing; 1: the whole tile): y bit for bit, and the oracle. Tiles of 8 and 16 rows, every K
// split, 1-64 tokens, skewed routing (one expert's full tiles), hash routing (T * k rows), 8-warp
// CTAs, a graph replay with programmatic launches, and an expert range without the shared expert
// (the order before, whatever f8_order says). Bad values are refused.
TEST_F(MoeCuda, Fp8DecodeFormsGiveTheSameBits) {
  auto both_orders = [&](Case c) {
    cuda::MoeTuning old_order = c.tuning, full_tile = c.tuning;
    old_order.f8_order = 1;
    full_tile.f8_act_rows = 1;
    cuda::MoeTuning before = full_tile;
    before.f8_order = 1;
    c.bit_equal = {old_order, full_tile, before};
    run_case(c);
  };
  for (int64_t T : {1, 2, 3, 4, 16, 64}) {
    both_orders({"tiny mxfp4 fp8 order", kTiny, WeightFormat::kMxfp4, T});
    Case flash{"flash mxfp4 fp8 order", kFlash, WeightFormat::kMxfp4, T};
    flash.oracle_tokens = 4;
    both_orders(flash);
  }
  const int variants[][2] = {{8, 1}, {8, 2}, {8, 4}, {16, 1}, {16, 2}, {16, 4}};
  for (const auto& v : variants) {
    Case c{"flash mxfp4 fp8 order variant", kFlash, WeightFormat::kMxfp4, 16};
    c.tuning = {v[0], v[1], 2};
    c.oracle_tokens = 4;
    both_orders(c);
    Case t{"tiny mxfp4 fp8 order variant", kTiny, WeightFormat::kMxfp4, 37};
    t.tuning = {v[0], v[1], 2};
    both_orders(t);
  }
  Case w8{"flash mxfp4 fp8 order w8", kFlash, WeightFormat::kMxfp4, 4};
  w8.tuning = {8, 2, 2, 0, 0, 8};
  w8.oracle_tokens = 4;
  both_orders(w8);
  both_orders({"tiny skew fp8 order", kTiny, WeightFormat::kMxfp4, 64, true});
  Case skew{"flash skew fp8 order", kFlash, WeightFormat::kMxfp4, 16, true};
  skew.oracle_tokens = 4;
  both_orders(skew);
  both_orders({"tiny hash fp8 order", kTiny, WeightFormat::kMxfp4, 16, false, true});
  for (int64_t T : {1, 2}) {
    Case hash{"flash hash fp8 order", kFlash, WeightFormat::kMxfp4, T, false, true};
    hash.oracle_tokens = 2;
    both_orders(hash);
  }
  Case g{"flash fp8 order graph pdl", kFlash, WeightFormat::kMxfp4, 2};
  g.graph = true;
  g.tuning.pdl = 1;
  g.oracle_tokens = 2;
  both_orders(g);
  Case range{"tiny range fp8 no shared", kTiny, WeightFormat::kMxfp4, 16};
  range.begin = 2;
  range.end = 6;
  range.add_shared = false;
  both_orders(range);
  Case bad{"tiny bad f8_order", kTiny, WeightFormat::kMxfp4, 4};
  bad.tuning.f8_order = 2;
  bad.expect_error = "f8_order must be 0 or 1";
  run_case(bad);
  Case bad_rows{"tiny bad f8_act_rows", kTiny, WeightFormat::kMxfp4, 4};
  bad_rows.tuning.f8_act_rows = -1;
  bad_rows.expect_error = "f8_act_rows must be 0 or 1";
  run_case(bad_rows);
}

// Router logits: T <= 64 take a CTA per expert and 8 tokens, larger T the 64 x 64 tiled SIMT GEMM
// (partial tiles: T = 100, tiny E = 8 < 64); fp32 and bf16 gates.
TEST_F(MoeCuda, RouterGateFormats) {
  for (bool bf16 : {false, true}) {
    for (int64_t T : {1, 3, 8, 9, 17, 37, 64, 100}) {
      Case c{bf16 ? "tiny gate bf16" : "tiny gate f32", kTiny, WeightFormat::kMxfp4, T};
      c.gate_bf16 = bf16;
      run_case(c);
    }
    for (int64_t T : {1, 8, 16, 37, 64}) {
      Case c{bf16 ? "flash gate bf16" : "flash gate f32", kFlash, WeightFormat::kMxfp4, T};
      c.gate_bf16 = bf16;
      run_case(c);
    }
  }
}

// The cases both prefill kernels are forced on (`tuning`, names tagged with `tag`): the tiny shape
// at each T of `tiny_ts` with MXFP4 and NVFP4 routed experts (the FP8-block shared expert), one
// expert holding every token (many tiles of one group, the other experts empty), an expert range
// without the shared expert, hf numerics, hash routing; Flash with every token to expert 3 at
// T = 4096 (32 full tiles of one group), NVFP4 at T = 512 (2 rows per expert; the shared expert's
// 4 full tiles) and MXFP4 at each T of `flash_ts`. Same operands as the oracle (bf16 weights
// dequantized exactly, FP8-simulated activations), so the same tolerance applies.
void run_prefill_variants(const cuda::MoeTuning& tuning, const std::string& tag,
                          std::initializer_list<int64_t> tiny_ts,
                          std::initializer_list<int64_t> flash_ts) {
  auto run = [&](Case c, int64_t oracle_tokens = 0) {
    c.name += " " + tag;
    c.tuning = tuning;
    c.oracle_tokens = oracle_tokens;
    run_case(c);
  };
  for (int64_t T : tiny_ts) {
    run({"tiny mxfp4", kTiny, WeightFormat::kMxfp4, T});
    run({"tiny nvfp4", kTiny, WeightFormat::kNvfp4, T});
  }
  run({"tiny skew nvfp4", kTiny, WeightFormat::kNvfp4, 4096, true});
  run({"tiny skew mxfp4", kTiny, WeightFormat::kMxfp4, 4096, true});
  Case range{"tiny range mxfp4", kTiny, WeightFormat::kMxfp4, 512};
  range.begin = 2;
  range.end = 6;
  range.add_shared = false;
  run(range);
  Case hf{"tiny hf nvfp4", kTiny, WeightFormat::kNvfp4, 512};
  hf.hf = true;
  run(hf);
  Case hf_mx{"tiny hf mxfp4", kTiny, WeightFormat::kMxfp4, 350};
  hf_mx.hf = true;
  run(hf_mx);
  run({"tiny hash", kTiny, WeightFormat::kMxfp4, 512, false, true});
  run({"flash skew", kFlash, WeightFormat::kMxfp4, 4096, true}, 12);
  run({"flash nvfp4", kFlash, WeightFormat::kNvfp4, 512}, 12);
  for (int64_t T : flash_ts) run({"flash mxfp4", kFlash, WeightFormat::kMxfp4, T}, 12);
}

// The bf16 mma.sync prefill kernel (expert_gemm_pf_kernel: the default for 128-row tiles off
// sm_90) forced on every device, also where the heuristic picks other tiles: partial tiles (1,
// 16, 100 rows: token groups past the valid rows are skipped), Flash MXFP4 at T = 64 (1-2 rows per
// expert: mostly empty tiles).
TEST_F(MoeCuda, PrefillPathVariants) {
  run_prefill_variants({0, 0, 3, 0}, "pf", {1, 16, 100, 512}, {64});
}

// The sm_90a prefill kernel (expert_gemm_wg_kernel: wgmma with the weights dequantized into the
// A fragments, the default for 128-row tiles on sm_90, so the T = 4096 Flash cases above run it
// there, in CTAs of 256 weight rows) forced in CTAs of 128 weight rows (pf_rows 128; the 256-row
// ones, whose FP4 tiles take widths in steps of 16: WgmmaWidePrefillVariants), with token counts
// whose tiles take each wgmma width (valid rows rounded up to 32 in these CTAs: T = 16 at the tiny
// shape has ~4 rows per expert (n32), T = 200 ~50 (n64), T = 350 ~88 (n96), T = 512 128 +- a few
// (n128 and a second, small tile); Flash T = 1024 24 rows per expert, T = 2048 48). The
// activations reach it in its permuted K order (quant_rows_kernel's permute); a wrong order or
// fragment layout would be O(1) wrong, far outside the tolerance. Skipped (printed) off sm_90.
TEST_F(MoeCuda, WgmmaPrefillPathVariants) {
  cuda::MoeTuning t{0, 0, 4, 0};
  t.pf_rows = 128;
  run_prefill_variants(t, "wg", {1, 16, 100, 200, 350, 512}, {1024, 2048});
}

// Every MoE kernel launched as a programmatic dependent of the previous one (MoeTuning::pdl), eager
// and inside a CUDA graph (the engine's decode form), on each kernel family: the FP8 decode path
// (T = 1, 16, 64 at the Flash shape, T = 1 hash-routed at the tiny shape), the bf16 tiles, the
// prefill tiles (wgmma on sm_90, else mma.sync). A kernel that read its
// predecessor's output before pdl_begin() would read the poisoned or stale workspace.
TEST_F(MoeCuda, ProgrammaticDependentLaunch) {
  for (bool graph : {false, true}) {
    const std::string g = graph ? " pdl graph" : " pdl";
    auto pdl_case = [&](Case c, cuda::MoeTuning t = {}) {
      c.name += g;
      c.tuning = t;
      c.tuning.pdl = 1;
      c.graph = graph;
      run_case(c);
    };
    for (int64_t T : {1, 16, 64}) {
      Case c{"flash mxfp4", kFlash, WeightFormat::kMxfp4, T};
      c.oracle_tokens = 8;
      pdl_case(c);
    }
    pdl_case({"tiny hash", kTiny, WeightFormat::kMxfp4, 1, false, true});
    pdl_case({"tiny nvfp4 bf16 tiles", kTiny, WeightFormat::kNvfp4, 64}, {32, 1, 1, 0});
    pdl_case({"tiny mxfp4 prefill", kTiny, WeightFormat::kMxfp4, 512}, {0, 0, 3, 0});
    pdl_case({"tiny mxfp4 default", kTiny, WeightFormat::kMxfp4, 512});
    pdl_case({"tiny nvfp4 wgmma", kTiny, WeightFormat::kNvfp4, 350}, {0, 0, 4, 0});
  }
  Case bad{"tiny bad pdl", kTiny, WeightFormat::kMxfp4, 16};
  bad.tuning.pdl = 2;
  bad.expect_error = "pdl must be 0 or 1";
  run_case(bad);
}

// Decode-size routing by rank over the CTA (the default where the tokens fill at most half of it)
// against a warp per token (MoeTuning::route_by_warp 1): the forward's y bit for bit (a different
// expert or a weight one ulp off would change it) and the oracle, at the Flash shape (E = 256: by
// rank at T = 1 and 2; T >= 4 take the warps either way), skewed routing (the bias makes expert 3
// win every token; T = 2), the tiny shape (E = 8: by rank up to 16 tokens), NVFP4, and a
// hash-routed layer (always the warps). A bad value is refused.
TEST_F(MoeCuda, RouteByRankGivesTheWarpRouting) {
  cuda::MoeTuning warp;
  warp.route_by_warp = 1;
  auto rank_case = [&](Case c) {
    c.name += " route by rank";
    c.bit_equal = {warp};
    run_case(c);
  };
  for (int64_t T : {1, 2, 4, 5, 8, 16}) {
    Case c{"flash mxfp4", kFlash, WeightFormat::kMxfp4, T};
    c.oracle_tokens = 4;
    rank_case(c);
  }
  Case skew{"flash mxfp4 skew", kFlash, WeightFormat::kMxfp4, 2, true};
  skew.oracle_tokens = 4;
  rank_case(skew);
  for (int64_t T : {1, 7, 16, 32}) rank_case({"tiny mxfp4", kTiny, WeightFormat::kMxfp4, T});
  rank_case({"tiny skew mxfp4", kTiny, WeightFormat::kMxfp4, 16, true});
  rank_case({"tiny nvfp4", kTiny, WeightFormat::kNvfp4, 3});
  rank_case({"tiny hash", kTiny, WeightFormat::kMxfp4, 4, false, true});
  Case bad{"tiny bad route", kTiny, WeightFormat::kMxfp4, 4};
  bad.tuning.route_by_warp = 2;
  bad.expect_error = "route_by_warp must be 0 or 1";
  run_case(bad);
}

// The router logits kernel that also routes and plans in its last CTA (MoeTuning::route_launch 1,
// T <= 8) against the two launches (route_launch 2): y bit for bit and the oracle. Each fused
// forward is followed by another one on the same layer (bit_equal, with PDL), so a counter left
// non-zero by the first would break the second. Flash shape (128 CTAs of two experts) at T = 1-8
// and 16 (past the fused sizes: the two launches either way), skewed routing, hash routing (the
// last CTA routes a warp per token), the bf16 gate, an expert range without the shared expert, and
// the graph with PDL (two replays). The tiny shape's cases are in TinyRouteInLogitsKernel (the
// memcheck filter). A bad value is refused.
void route_launch_case(Case c) {
  cuda::MoeTuning two = c.tuning, again = c.tuning;
  two.route_launch = 2;
  again.route_launch = 1;
  again.pdl = 1;
  c.name += " route in logits";
  c.tuning.route_launch = 1;
  c.bit_equal = {two, again};
  run_case(c);
}

TEST_F(MoeCuda, RouteInLogitsKernelGivesTheSameBits) {
  for (int64_t T : {1, 2, 3, 5, 8, 16}) {
    Case c{"flash mxfp4", kFlash, WeightFormat::kMxfp4, T};
    c.oracle_tokens = 4;
    route_launch_case(c);
  }
  Case skew{"flash mxfp4 skew", kFlash, WeightFormat::kMxfp4, 2, true};
  skew.oracle_tokens = 2;
  route_launch_case(skew);
  Case hash{"flash mxfp4 hash", kFlash, WeightFormat::kMxfp4, 4, false, true};
  hash.oracle_tokens = 2;
  route_launch_case(hash);
  Case bf{"flash mxfp4 bf16 gate", kFlash, WeightFormat::kMxfp4, 1};
  bf.gate_bf16 = true;
  route_launch_case(bf);
  Case range{"flash mxfp4 range", kFlash, WeightFormat::kMxfp4, 2};
  range.begin = 64;
  range.end = 192;
  range.add_shared = false;
  range.oracle_tokens = 2;
  route_launch_case(range);
  for (int64_t T : {1, 2}) {
    Case g{"flash mxfp4 graph pdl", kFlash, WeightFormat::kMxfp4, T};
    g.graph = true;
    g.tuning.pdl = 1;
    g.oracle_tokens = 2;
    route_launch_case(g);
  }
  Case bad{"tiny bad route launch", kTiny, WeightFormat::kMxfp4, 4};
  bad.tuning.route_launch = 3;
  bad.expect_error = "route_launch must be 0, 1 or 2";
  run_case(bad);
}

// The tiny shape's fused-routing cases (E = 8: four CTAs; by rank up to 16 tokens), named Tiny*
// for the device script's compute-sanitizer filter: T = 1, 7, 8, skewed, NVFP4, hash routing, and
// the graph with PDL.
TEST_F(MoeCuda, TinyRouteInLogitsKernel) {
  for (int64_t T : {1, 7, 8}) route_launch_case({"tiny mxfp4", kTiny, WeightFormat::kMxfp4, T});
  route_launch_case({"tiny skew mxfp4", kTiny, WeightFormat::kMxfp4, 5, true});
  route_launch_case({"tiny nvfp4", kTiny, WeightFormat::kNvfp4, 3});
  route_launch_case({"tiny hash", kTiny, WeightFormat::kMxfp4, 4, false, true});
  Case g{"tiny graph pdl", kTiny, WeightFormat::kMxfp4, 2};
  g.graph = true;
  g.tuning.pdl = 1;
  route_launch_case(g);
}

// The wgmma prefill kernel's scale folding at its limit: the routed w2 weights scaled so that the
// layer's largest MXFP4 code is kMoeWgMaxScaleCode (the kernel's bf16 multiplier is then 2^127, the
// largest finite power of two; sm_90 runs it), then one above (limit_to_scale_code turns the kernel
// off and the mma.sync prefill kernel takes the layer; unlimited, it would give NaN).
TEST_F(MoeCuda, TinyWgmmaScaleCodeLimit) {
  const LayerWeights& base = layer_weights(kTiny, WeightFormat::kMxfp4);
  int w2_max = 0;
  for (int64_t p = 0; p < kTiny.pool; ++p) {
    const std::vector<uint8_t>& sc = base.pool[size_t(3 * p + 2)]->scale;
    w2_max = std::max(w2_max, int(*std::max_element(sc.begin(), sc.end())));
  }
  ASSERT_GT(w2_max, 100);
  ASSERT_LT(w2_max, cuda::kMoeWgMaxScaleCode);
  for (int over : {0, 1}) {
    Case c{over ? "tiny mxfp4 code above the wgmma limit" : "tiny mxfp4 code at the wgmma limit",
           kTiny, WeightFormat::kMxfp4, 512};
    c.w2_log2 = cuda::kMoeWgMaxScaleCode + over - w2_max;
    const LayerWeights& lw = layer_weights(kTiny, WeightFormat::kMxfp4, c.w2_log2);
    ASSERT_EQ(cuda::max_mxfp4_scale_code(lw.host_experts.data(), 0, kTiny.experts, nullptr),
              cuda::kMoeWgMaxScaleCode + over);
    c.limit_scale_codes = true;
    c.wgmma_kept = over == 0;
    run_case(c);
  }
}

// Tiny-shape cases of the PDL launches, named Tiny* so that the device script's compute-sanitizer
// memcheck (filter MoeCuda.Tiny*) covers them.
TEST_F(MoeCuda, TinyPdl) {
  for (int64_t T : {1, 16, 512}) {
    Case c{"tiny pdl", kTiny, WeightFormat::kMxfp4, T};
    c.tuning.pdl = 1;
    run_case(c);
  }
}

// The prefill grids' two orders (MoeTuning::pf_raster: 0, the default, the N blocks of a tile side
// by side; 1 the tiles side by side) on both prefill kernels: each case is checked against the
// oracle in the default order and bit for bit against the other order. Tiny shapes (in the memcheck
// filter): many tiles of many groups (T = 512), one group of 32 full tiles (skewed T = 4096), NVFP4
// with ~88 rows per expert (T = 350); a bad order value is refused. Off sm_90 the wgmma cases are
// skipped.
TEST_F(MoeCuda, TinyPrefillGridOrders) {
  for (int path : {3, 4}) {
    for (Case c : {Case{"tiny mxfp4 grid order", kTiny, WeightFormat::kMxfp4, 512},
                   Case{"tiny skew nvfp4 grid order", kTiny, WeightFormat::kNvfp4, 4096, true},
                   Case{"tiny nvfp4 grid order", kTiny, WeightFormat::kNvfp4, 350}}) {
      c.name += " path" + std::to_string(path);
      c.tuning = {0, 0, path, 0};
      c.compare_grid_orders = true;
      run_case(c);
    }
  }
  Case bad{"tiny bad grid order", kTiny, WeightFormat::kMxfp4, 512};
  bad.tuning = {0, 0, 3, 0};
  bad.tuning.pf_raster = 2;
  bad.expect_error = "pf_raster must be 0 or 1";
  run_case(bad);
}

// The wgmma kernel's CTAs of 256 weight rows (MoeTuning::pf_rows = 256; the tiny shape's inter 128
// and dim 256 are one wide N block each) on run_prefill_variants' cases against the oracle; the
// tiny ones are also compared bit for bit with the 128-row CTAs in TinyWidePrefillCtas below, and
// Flash T = 4096 here (~96 rows per expert: n96 / n128 tiles, the shared expert's 32 FP8 tiles),
// also against the four-warpgroup CTAs' CTA barrier per chunk (MoeTuning::pf_sync 2; the default
// hands chunks over through per-slot mbarriers) and their widths in steps of 8 (pf_step 8).
TEST_F(MoeCuda, WgmmaWidePrefillVariants) {
  cuda::MoeTuning t{0, 0, 4, 0};
  t.pf_rows = 256;
  run_prefill_variants(t, "wg256", {1, 16, 100, 200, 350, 512}, {1024, 2048});
  Case c{"flash mxfp4 wide", kFlash, WeightFormat::kMxfp4, 4096};
  c.tuning = t;
  c.oracle_tokens = 12;
  c.bit_equal = {t, t, t, t, t};
  c.bit_equal[0].pf_rows = 128;
  c.bit_equal[1].pf_wgs = 2;
  c.bit_equal[2].pf_step = 32;
  c.bit_equal[3].pf_sync = 2;
  c.bit_equal[4].pf_step = 8;
  run_case(c);
}

// The 256-row CTAs as two warpgroups of two row groups each (MoeTuning::pf_wgs = 2; the default
// is four warpgroups of one, 512 threads) on run_prefill_variants' cases against the oracle; bit
// for bit against the four-warpgroup CTAs in WgmmaWidePrefillVariants (Flash T = 4096) and
// TinyWidePrefillCtas.
TEST_F(MoeCuda, WgmmaTwoWarpgroupPrefillVariants) {
  cuda::MoeTuning t{0, 0, 4, 0};
  t.pf_rows = 256;
  t.pf_wgs = 2;
  run_prefill_variants(t, "wg256x2", {1, 16, 100, 200, 350, 512}, {1024, 2048});
}

// 256-row CTAs (four warpgroups) bit for bit against 128-row ones, against two-warpgroup 256-row
// ones, against their own tiles in widths of steps of 32 and of 8 (MoeTuning::pf_step; the default
// steps are 16), against their CTA barrier per chunk (pf_sync 2; the default hands chunks over
// through per-slot mbarriers), and the oracle (tiny shapes, in the memcheck filter): many groups
// (T = 512, with the FP8-block shared expert's tiles: three slots, one chunk ahead), one group of
// 32 full tiles (skewed T = 4096), NVFP4 at ~88 rows per expert, both grid orders; bad widths, a
// bad width step, a bad hand-off and a width or hand-off on the wrong CTAs are refused. Skipped
// (printed) off sm_90.
TEST_F(MoeCuda, TinyWidePrefillCtas) {
  for (Case c : {Case{"tiny mxfp4 wide", kTiny, WeightFormat::kMxfp4, 512},
                 Case{"tiny skew mxfp4 wide", kTiny, WeightFormat::kMxfp4, 4096, true},
                 Case{"tiny nvfp4 wide", kTiny, WeightFormat::kNvfp4, 350}}) {
    c.tuning = {0, 0, 4, 0};
    c.tuning.pf_rows = 256;
    c.bit_equal = {c.tuning, c.tuning, c.tuning, c.tuning, c.tuning};
    c.bit_equal[0].pf_rows = 128;
    c.bit_equal[1].pf_wgs = 2;
    c.bit_equal[2].pf_step = 32;
    c.bit_equal[3].pf_sync = 2;
    c.bit_equal[4].pf_step = 8;
    run_case(c);
    c.name += " tiles first";
    c.tuning.pf_raster = 1;
    for (cuda::MoeTuning& t : c.bit_equal) t.pf_raster = 1;
    run_case(c);
  }
  // Refused tunings: MoeTuning::path, pf_rows, pf_wgs, pf_step, pf_sync and the error.
  struct Refused {
    const char* name;
    int path, rows, wgs, step, sync;
    const char* error;
  };
  for (const Refused& r :
       {Refused{"tiny bad cta rows", 4, 64, 0, 0, 0, "pf_rows must be 0, 128 or 256"},
        Refused{"tiny wide cta on mma.sync", 3, 256, 0, 0, 0,
                "256-row prefill CTAs need the wgmma prefill path"},
        Refused{"tiny bad warpgroup count", 4, 0, 3, 0, 0, "pf_wgs must be 0, 2 or 4"},
        Refused{"tiny four warpgroups in 128-row ctas", 4, 128, 4, 0, 0,
                "four-warpgroup prefill CTAs need the 256-row CTAs"},
        Refused{"tiny bad width step", 4, 0, 0, 16, 0, "pf_step must be 0, 8 or 32"},
        Refused{"tiny bad hand-off", 4, 0, 0, 0, 3, "pf_sync must be 0, 1 or 2"},
        Refused{"tiny mbarriers in two-warpgroup ctas", 4, 256, 2, 0, 1,
                "pf_sync 1 / 2 needs the four-warpgroup prefill CTAs"},
        Refused{"tiny cta barrier in 128-row ctas", 4, 128, 0, 0, 2,
                "pf_sync 1 / 2 needs the four-warpgroup prefill CTAs"}}) {
    Case bad{r.name, kTiny, WeightFormat::kMxfp4, 512};
    bad.tuning = {0, 0, r.path, 0};
    bad.tuning.pf_rows = r.rows;
    bad.tuning.pf_wgs = r.wgs;
    bad.tuning.pf_step = r.step;
    bad.tuning.pf_sync = r.sync;
    bad.expect_error = r.error;
    run_case(bad);
  }
}

// The same at the Flash shape (32 N blocks per tile in both GEMMs, ~48 rows per expert at
// T = 2048) and with every token to one expert (T = 4096: 32 full tiles of one group).
TEST_F(MoeCuda, PrefillGridOrdersFlash) {
  for (int path : {3, 4}) {
    for (Case c : {Case{"flash mxfp4 grid order", kFlash, WeightFormat::kMxfp4, 2048},
                   Case{"flash skew mxfp4 grid order", kFlash, WeightFormat::kMxfp4, 4096, true}}) {
      c.name += " path" + std::to_string(path);
      c.tuning = {0, 0, path, 0};
      c.oracle_tokens = 12;
      c.compare_grid_orders = true;
      run_case(c);
    }
  }
}

TEST_F(MoeCuda, Bf16PathMxfp4) {
  for (int64_t T : {1, 64}) {
    Case c{"flash mxfp4 bf16 path", kFlash, WeightFormat::kMxfp4, T};
    c.tuning = {8, 2, 1};
    c.oracle_tokens = 8;
    run_case(c);
  }
}

}  // namespace
}  // namespace ds

namespace ds {
namespace {

// Host only (runs without a GPU too): the largest MXFP4 scale code of a layer and the FP8-path
// and wgmma prefill variants it leaves on. Codes are planted at random places of fresh random
// scale arrays; FP8 block matrices (whose scales are no e8m0 exponent the path folds) are not
// counted.
TEST(MoeScaleCodes, LargestMxfp4CodeDecidesTheFp8Variants) {
  constexpr int64_t kInter = 64, kDim = 128;
  Rng rng(77);
  std::vector<std::vector<uint8_t>> scales;
  auto mxfp4 = [&](int64_t out, int64_t in) {
    std::vector<uint8_t> s(size_t(out * in / 32));
    for (uint8_t& v : s) v = uint8_t(110 + rng.below(20));
    scales.push_back(std::move(s));
    cpu::LinearWeight w;
    w.format = WeightFormat::kMxfp4;
    w.out_features = out;
    w.in_features = in;
    w.scale = scales.back().data();
    return w;
  };
  scales.reserve(16);
  std::vector<cpu::ExpertWeights> experts(4);
  for (auto& e : experts) e = {mxfp4(kInter, kDim), mxfp4(kDim, kInter), mxfp4(kInter, kDim)};
  cpu::ExpertWeights shared = {mxfp4(kInter, kDim), mxfp4(kDim, kInter), mxfp4(kInter, kDim)};
  const int base = cuda::max_mxfp4_scale_code(experts.data(), 0, 4, &shared);
  EXPECT_GE(base, 110);
  EXPECT_LT(base, 130);
  // A large code in expert 3's w2, last byte: seen only when expert 3 is in the range.
  auto& last = scales[size_t(3 * 3 + 1)];
  last.back() = 245;
  EXPECT_EQ(cuda::max_mxfp4_scale_code(experts.data(), 0, 4, &shared), 245);
  EXPECT_LT(cuda::max_mxfp4_scale_code(experts.data(), 0, 3, &shared), 130);
  // In the shared expert's w3: seen only with the shared expert.
  scales.back()[size_t(rng.below(scales.back().size()))] = 250;
  EXPECT_EQ(cuda::max_mxfp4_scale_code(experts.data(), 0, 3, &shared), 250);
  EXPECT_LT(cuda::max_mxfp4_scale_code(experts.data(), 0, 3, nullptr), 130);
  // FP8 block weights carry no e8m0 code of this kind.
  std::vector<cpu::ExpertWeights> fp8(1);
  fp8[0].w1.format = fp8[0].w2.format = fp8[0].w3.format = WeightFormat::kFp8Block;
  EXPECT_EQ(cuda::max_mxfp4_scale_code(fp8.data(), 0, 1, nullptr), -1);

  // (fp8_mma, fp8_f16, pf_wgmma, pf_wide) left on by the code.
  auto variants = [](int code) {
    cuda::MoeDeviceLayer l;
    l.fp8_mma = l.fp8_f16 = l.pf_wgmma = l.pf_wide = true;
    l.limit_to_scale_code(code);
    return std::vector<bool>{l.fp8_mma, l.fp8_f16, l.pf_wgmma, l.pf_wide};
  };
  using V = std::vector<bool>;
  EXPECT_EQ(variants(127), V({true, true, true, true}));
  EXPECT_EQ(variants(cuda::kMoeWgMaxScaleCode), V({true, true, true, true}));
  EXPECT_EQ(variants(cuda::kMoeWgMaxScaleCode + 1), V({true, true, false, false}));
  EXPECT_EQ(variants(cuda::kMoeF16MaxScaleCode), V({true, true, false, false}));
  EXPECT_EQ(variants(cuda::kMoeF16MaxScaleCode + 1), V({true, false, false, false}));
  EXPECT_EQ(variants(cuda::kMoeF8MaxScaleCode), V({true, false, false, false}));
  EXPECT_EQ(variants(cuda::kMoeF8MaxScaleCode + 1), V({false, false, false, false}));
}

// The gate/up epilogue's silu divides through div_rn_ge1 (no slow-path CALL); it must give the bits
// of `x / (1 + expf(-x))` for every fp32 x: all 2^32 patterns (denormals, infinities and NaNs
// included; any NaN matches any NaN), against the `/` operator compiled in the same kernel. The
// first mismatching inputs are reported.
__global__ void silu_div_mismatches(unsigned long long* count, uint32_t* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const float x = __uint_as_float(uint32_t(i));
    const float want = x / (1.0f + expf(-x)), got = cuda::silu_dev(x);
    const bool same = __float_as_uint(want) == __float_as_uint(got) || (want != want && got != got);
    if (!same && atomicAdd(count, 1ull) < 4) first[atomicAdd(first + 4, 1u) & 3] = uint32_t(i);
  }
}

TEST(MoeSiluDivision, DivRnGe1MatchesIeeeDivisionForSilu) {
  DS_REQUIRE_GPU();
  DeviceBuffer<unsigned long long> count(1);
  DeviceBuffer<uint32_t> first(5);
  ASSERT_TRUE(count.ok() && first.ok());
  DS_CUDA_ASSERT(cudaMemset(count.get(), 0, count.bytes()));
  DS_CUDA_ASSERT(first.poison());
  DS_CUDA_ASSERT(cudaMemset(first.get() + 4, 0, sizeof(uint32_t)));
  silu_div_mismatches<<<1024, 256>>>(count.get(), first.get());
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<unsigned long long> n;
  std::vector<uint32_t> bad;
  DS_CUDA_ASSERT(count.download(n));
  DS_CUDA_ASSERT(first.download(bad));
  EXPECT_EQ(n[0], 0ull) << "first mismatching inputs (bits, up to 4): " << std::hex << bad[0]
                        << " " << bad[1] << " " << bad[2] << " " << bad[3];
}

}  // namespace
}  // namespace ds
