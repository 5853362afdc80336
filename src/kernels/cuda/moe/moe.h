// Mixture of experts on the GPU (dsv4-model.md §8, §10; issue #8): routing (sqrt-softplus
// scores, bias-corrected top-k or hash routing through tid2eid, renormalization, route scale),
// token grouping by expert (device-side counts, offsets, permutation), the fused gate/up
// projection with the clamped SwiGLU and the route weight, the down projection, the shared expert
// and the combine back to token order. The CPU oracle is ds::cpu::moe_forward
// (src/kernels/cpu/moe.h); the numerics follow it (see NOTES.md for the accumulation order).
//
// Expert weights stay in their checkpoint format (MXFP4, NVFP4 or FP8 128x128 blocks) and are
// dequantized to bf16 in registers (exact: every FP4/FP8 weight times its block scale is a bf16
// value; the NVFP4 global scale multiplies the fp32 accumulator), the products run on the tensor
// cores as bf16 mma.sync (sm_80+, so sm_90/100/120) with fp32 accumulation. In reference numerics
// the activations are FP8-simulated per 128 K-elements first (quantize then dequantize, which is
// exact in bf16), so the GPU sees exactly the operands the CPU reference sees. Decode-size tiles
// of MXFP4 / FP8-block layers in reference numerics run on the FP8 tensor cores instead
// (mma.sync e4m3, sm_89+: e2m1 is exact in e4m3, the block scales multiply fp32 partials; see
// MoeDeviceLayer::fp8_mma and NOTES.md; on sm_90 / sm_100, which lower FP8 mma.sync to f16 HMMAs,
// the same operands run as f16 mma.sync: MoeDeviceLayer::fp8_f16). Prefill-size batches (more
// than 32 rows per expert; 16 on sm_90) run 128 x 128 CTA tiles: on sm_90 on wgmma, each thread
// dequantizing the weights of its own A fragments into registers (MoeDeviceLayer::pf_wgmma),
// elsewhere with the weights dequantized once per tile into shared memory (bf16 mma.sync). Every
// format.
//
// The shared expert runs as one more group of the same grouped launches (every token, weight 1).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/cpu/moe.h"

namespace ds::cuda {

// One expert's three matrices as device pointers (w1 and w3 [inter, dim], w2 [dim, inter]).
struct MoeDeviceExpert {
  const uint8_t* data[3] = {nullptr, nullptr, nullptr};   // w1, w3, w2
  const uint8_t* scale[3] = {nullptr, nullptr, nullptr};  // per format (see cpu::WeightFormat)
  float global_scale[3] = {1.0f, 1.0f, 1.0f};             // NVFP4 only
  uint8_t format[3] = {0, 0, 0};                          // cpu::WeightFormat
};

// A MoE layer prepared once at load time. Built from a cpu::MoeParams whose pointers are device
// addresses (LinearWeight data/scale of the gate, experts and shared expert; router bias and
// tid2eid); the struct itself and the experts array are host memory. create() copies the per-
// expert pointer table to a small device array (the only allocation; none per step).
class MoeDeviceLayer {
 public:
  static Result<MoeDeviceLayer> create(const cpu::MoeParams& device_views);
  MoeDeviceLayer() = default;
  ~MoeDeviceLayer();
  MoeDeviceLayer(MoeDeviceLayer&& other) noexcept;
  MoeDeviceLayer& operator=(MoeDeviceLayer&& other) noexcept;
  MoeDeviceLayer(const MoeDeviceLayer&) = delete;
  MoeDeviceLayer& operator=(const MoeDeviceLayer&) = delete;

  int64_t dim = 0;          // D
  int64_t inter = 0;        // moe_intermediate_size (shared expert: the same)
  int64_t num_experts = 0;  // E
  int64_t topk = 0;
  float route_scale = 1.5f;
  float renorm_epsilon = 0.0f;
  // Router: gate [E, D] fp32 or bf16 (device), bias [E] nullable, tid2eid [vocab, topk] nullable.
  const void* gate = nullptr;
  bool gate_bf16 = false;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  int64_t vocab_size = 0;
  float swiglu_limit = 10.0f;
  bool shared_expert_clamp = false;
  bool quantize_activations = true;
  bool round_bf16 = false;
  int64_t expert_begin = 0;
  int64_t expert_end = 0;  // resolved (never -1)
  bool add_shared = true;
  // Device array [E + 1]: the routed experts, then the shared expert at index E.
  MoeDeviceExpert* experts = nullptr;
  // Device word (in the experts allocation), 0 between forwards: the arrival counter of the
  // decode-size launch that routes in the router logits kernel's last CTA
  // (MoeTuning::route_launch). So the forwards of one layer must not run concurrently (on two
  // streams) with that launch.
  unsigned* route_done = nullptr;
  // Set by create(): every expert (routed range and shared) is MXFP4 or FP8 block with 4-byte
  // aligned scales, the activations are FP8-simulated and the device has FP8 mma.sync (sm_89+):
  // the decode tiles may use the FP8 tensor-core path (NOTES.md).
  bool fp8_mma = false;
  // Set by create() on sm_90 / sm_100 (no native FP8 mma.sync: ptxas lowers it to f16 HMMAs plus
  // per-mma conversions): the FP8 path then runs its products as f16 mma.sync m16n8k16 on the
  // same exact operands (e2m1 placed into f16 bits, e4m3 converted to f16). sm_89 / sm_120: e4m3.
  bool fp8_f16 = false;
  // Set by create() on sm_90 devices when every MXFP4 / NVFP4 scale array is 4 / 8-byte aligned:
  // the prefill tiles (128 rows) run on wgmma with the weights dequantized into registers
  // (expert_gemm_wg_kernel) instead of the bf16 mma.sync kernel (expert_gemm_pf_kernel).
  bool pf_wgmma = false;
  // Set by create() with pf_wgmma when inter % 128 == 0 and dim % 256 == 0: that kernel runs in
  // CTAs of 256 weight rows by default (MoeTuning::pf_rows), in four warpgroups (pf_wgs).
  bool pf_wide = false;

  // Turns off the kernels whose scale folding the layer's largest MXFP4 e8m0 code
  // (max_mxfp4_scale_code) would overflow: the FP8 path's f16 variant above kMoeF16MaxScaleCode,
  // the FP8 path altogether above kMoeF8MaxScaleCode, the wgmma prefill kernel (pf_wgmma, pf_wide)
  // above kMoeWgMaxScaleCode (the bf16 paths take any code). CudaOps calls it at load.
  void limit_to_scale_code(int max_code);

 private:
  void release();
};

// The FP8 path adds a power of two to the e8m0 scale code as an fp32 exponent (2^6 for the e4m3
// placement of e2m1, 2^14 for the f16 one): codes up to these stay finite. Real checkpoints'
// codes sit around 110-130.
inline constexpr int kMoeF16MaxScaleCode = 240;
inline constexpr int kMoeF8MaxScaleCode = 248;
// The wgmma prefill kernel multiplies its 2^-126-placed e2m1 values by 2^(code - 9) in bf16
// (2^8 comes back in the epilogue): finite up to this code (weights up to 6 * 2^9).
inline constexpr int kMoeWgMaxScaleCode = 136;

// The largest e8m0 scale code among the MXFP4 matrices of experts[begin, end) and of `shared`
// (nullable), read from host memory; -1 when none of them is MXFP4.
int max_mxfp4_scale_code(const cpu::ExpertWeights* experts, int64_t begin, int64_t end,
                         const cpu::ExpertWeights* shared);

// Kernel choices, 0 = heuristic (benchmarks and tests only).
struct MoeTuning {
  int tile_tokens = 0;  // 8, 16, 32, 64 rows per grouped-GEMM tile, or 128 (the prefill path)
  int k_split = 0;      // warps of a CTA splitting K: 1, 2 or 4 (only with 8 or 16-row tiles)
  // 1: bf16 mma.sync GEMMs (8-64 row tiles); 2: FP8 mma.sync (needs fp8_mma, 8/16-row tiles);
  // 3: the prefill path on bf16 mma.sync (128 x 128 CTA tiles, any weight format); 4: the prefill
  // path on wgmma (needs pf_wgmma; the default for 128-row tiles where it is set)
  int path = 0;
  int ring_kb = 0;      // FP8 path, 8-row tiles: weight ring per warp, 8 (default) or 16 KB
  int mma = 0;          // FP8 path: 0 the device's (fp8_f16), 1 e4m3 mma.sync, 2 f16 mma.sync
  int warps = 0;        // FP8 path: warps per CTA, 4 (default) or 8 (8-row tiles, 8 KB ring)
  // Prefill paths (128-row tiles): 0 launches the N blocks of a tile side by side (its activation
  // rows read from HBM once), 1 the tiles side by side (the order before session 20; NOTES.md).
  int pf_raster = 0;
  // The wgmma prefill kernel's weight rows per CTA: 256 (gate/up: 128 inter columns, down: 256
  // outputs; each activation chunk copied into shared memory feeds twice the MMAs; needs
  // inter % 128 == 0 and dim % 256 == 0) or 128; 0 = the layer's default (pf_wide; NOTES.md,
  // session 21).
  int pf_rows = 0;
  // The 256-row CTAs' warpgroups: 2 (two m64 row groups each) or 4 (one each: 512 threads, 4 warps
  // per scheduler; needs the 256-row CTAs); 0 = 4 for the 256-row CTAs (NOTES.md, session 22).
  int pf_wgs = 0;
  // The wgmma prefill kernel's tile widths (a tile's rows rounded up to a step): 0 = its default
  // (steps of 16 for the FP4 tiles of the four-warpgroup CTAs, 32 otherwise), 8 = steps of 8 for
  // those FP4 tiles (session 25), 32 = steps of 32 everywhere (the width set before session 23).
  // The outputs are the same bits either way.
  int pf_step = 0;
  // The four-warpgroup CTAs' chunk hand-off: 1 = per-slot mbarriers (the warpgroups drift apart by
  // up to about half a chunk; session 24), 2 = a CTA barrier per chunk (the form before session
  // 26); 0 = 1 (measured faster in session 26, NOTES.md). Same outputs either way.
  int pf_sync = 0;
  // 1: every MoE kernel launched as a programmatic dependent of the stream's previous kernel (PDL,
  // sm_90+; each waits for it at its start, so only the launch overlaps; DEEPSERVE_OPS_PDL=0 turns
  // the attribute off); 0: plain launches, the default (no step-level gain: NOTES.md, session 20).
  int pdl = 0;
  // Decode sizes (routing and plan in one launch): 0 = the CTA routes by rank, one thread per
  // (token, expert), where the tokens fill at most half of it (T <= 2 at 256 experts) and the
  // layer does not hash-route (session 26); 1 = a warp per token everywhere (the form before).
  // The same experts and weights either way.
  int route_by_warp = 0;
  // FP8 path (decode tiles), the grouped GEMMs' grid order: 0 = the shared expert's tiles first,
  // then the routed tiles one after another, each tile's column blocks side by side (session 29:
  // 2-9% faster forwards at T = 2-64 on H100); 1 = the order before (the tiles side by side for
  // each column block). The same outputs either way.
  int f8_order = 0;
  // FP8 path: the activation tile's rows in shared memory: 0 = as many as a tile of this forward
  // can hold (T, or T * k with hash routing, at most the tile's 8 or 16: at T = 1 and 2 the
  // smaller shared memory lets four CTAs share an SM instead of three); 1 = always the tile's
  // (the form before session 29). The same outputs either way.
  int f8_act_rows = 0;
  // Decode sizes (T <= 8, with the plan): 1 = the router logits kernel also quantizes x, and its
  // last CTA to finish routes and plans (one launch: router_logits_route_kernel, NOTES.md session
  // 43); 2 = the logits kernel, then route_plan_kernel (two launches, the form before); 0 = 2.
  // The same experts, weights and outputs either way.
  int route_launch = 0;
};

// Runs the MoE forward. Stateless apart from the configuration: all scratch lives in the
// caller's workspace. No allocation, no host synchronization; the launch geometry depends on T
// and the layer's shapes only (counts, offsets and tile lists live on the device), so a forward
// can be captured in a CUDA graph for a fixed T.
class MoeRunner {
 public:
  // Bytes of workspace for up to max_tokens tokens of this layer's shapes (256-byte aligned parts).
  static size_t workspace_bytes(int64_t max_tokens, const MoeDeviceLayer& layer);

  // y = moe(x), equal to cpu::moe_forward up to fp32 accumulation order (NOTES.md).
  //   x         [T, D] fp32, device
  //   token_ids [T] device, needed when the layer hash-routes (else nullable)
  //   y         [T, D] fp32, device (written, not accumulated)
  //   workspace >= workspace_bytes(T, layer), 256-byte aligned
  static Status forward(const MoeDeviceLayer& layer, const float* x, const int32_t* token_ids,
                        int64_t T, float* y, void* workspace, cudaStream_t stream,
                        const MoeTuning& tuning = {});

  // The routing alone (for tests): experts [T, topk] int32, weights [T, topk] fp32, device.
  // pdl: as MoeTuning::pdl.
  static Status route(const MoeDeviceLayer& layer, const float* x, const int32_t* token_ids,
                      int64_t T, int32_t* experts, float* weights, void* workspace,
                      cudaStream_t stream, bool pdl = false);

  // The tokens-per-tile of the grouped GEMMs that forward() picks for T tokens: 8, 16, 32, or
  // 128 (the prefill paths: more than 32 rows per expert expected, or more than 16 where the
  // layer has the wgmma kernel, pf_wgmma).
  static int tile_tokens(int64_t T, const MoeDeviceLayer& layer);
};

}  // namespace ds::cuda
