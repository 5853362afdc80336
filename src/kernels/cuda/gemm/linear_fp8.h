// Linear layers y = x @ W^T on the GPU (dsv4-model.md §10, §10.2): FP8 e4m3 weights with e8m0
// 128x128 block scales (the attention projections, the shared expert, the indexer wq_b, the MTP
// projections) and BF16 weights (compressor wkv/wgate, indexer weights_proj, gate, head).
//
// FP8 paths:
//  - small M (<= 64 tokens, decode; GemmRunner sends the decode batches of the two 32 MB
//    projections where cuBLASLt measured faster to cuBLASLt: fp8_linear_uses_cublaslt):
//    launch_fp8_linear_small_m, our own bandwidth-bound
//    kernels. They read each weight byte and its block scale once, run the products on the tensor
//    cores (FP8 mma.sync when the activations are FP8-quantized, BF16 mma.sync on in-register
//    dequantized weights otherwise), apply the scales per 128-K block in fp32 and reduce split-K
//    partials inside a thread-block cluster (deterministic, one launch, graph-capturable). On
//    compute capability 9.0 GemmRunner sends the decode batches of the >= 16 MB weights where it
//    measured faster to kWgmma (fp8_linear_uses_wgmma): the same contract on sm_90a wgmma, all
//    M <= 64 tokens in one pass over the weights.
//  - large M (prefill): cuBLASLt FP8 GEMM with 1x128 activation / 128x128 weight block scaling
//    (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F, cuBLAS >= 12.9, sm_90).
// Reference numerics (§2) quantize the input to e4m3 per 128 K-elements first, with the kernel of
// kernels/cuda/quant (bit-exact with ds::cpu::quantize_fp8_blocks); hf numerics use the bf16
// input as is (large M then runs the small-M kernel over 64-token chunks: correct, not fast).
// The CPU oracle is ds::cpu::linear (src/kernels/cpu/linear.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "core/status.h"

namespace ds::cuda {

inline constexpr int kFp8GemmBlock = 128;    // weight blocks 128x128, activation blocks 1x128
inline constexpr int kSmallMMaxTokens = 64;  // launch_fp8_linear dispatches M <= 64 to small-M

// An FP8 block-scaled weight in device memory (non-owning). A grouped weight (wo_a, §7.8) is
// block-diagonal: group g owns rows [g*N, (g+1)*N) and reads input columns [g*K, (g+1)*K).
struct Fp8WeightView {
  const uint8_t* data = nullptr;     // [G*N, K] e4m3, row-major, 16-byte aligned
  const uint8_t* scale = nullptr;    // [G*N/128, K/128] e8m0 (rows rounded up when G == 1)
  const float* scale_f32 = nullptr;  // the same grid as fp32 2^(e-127) (launch_e8m0_to_f32, once at
                                     // load); needed only by the cuBLASLt path, nullable
  int64_t out_features = 0;          // N per group; a multiple of 16 (of 128 when G > 1)
  int64_t in_features = 0;           // K per group; a multiple of 128
  int num_groups = 1;                // G
  // Optional: the same codes in the small-M tile order (fp8_tile_offset; launch_fp8_weight_to_tiles
  // once at load), 16-byte aligned, nullable. kStream and kBulk then read each 128-K block of 16
  // rows as 2 KB of contiguous memory instead of 16 row pieces of 128 bytes (NOTES.md, session 12);
  // at M <= 8 only (fp8_small_m_plan decides; larger M reads `data`).
  const uint8_t* tiled = nullptr;
};

// kF32Bf16: fp32 elements holding the output rounded to bf16 (round to nearest even, NaN kept):
// what an fp32 output followed by launch_round_bf16 holds, in one pass (the small-M kernels round
// in their epilogue; the cuBLASLt paths write fp32 and round the rows after).
enum class OutType : uint8_t { kBF16, kF32, kF32Bf16 };
inline bool out_is_f32(OutType t) {
  return t != OutType::kBF16;
}

// Activations for an FP8 linear: either bf16 (quantized on the fly in reference numerics, or used
// as is in hf numerics) or already FP8-quantized (the output of launch_quantize_fp8_blocks; lets
// several linears share one quantization of the same input, e.g. wq_a and wkv on h).
struct Fp8Activations {
  const uint16_t* bf16 = nullptr;   // [M, x_row_stride] bf16 bits, 16-byte aligned rows
  int64_t x_row_stride = 0;         // elements, >= G*K, a multiple of 8
  const uint8_t* codes = nullptr;   // [M, G*K] e4m3 (contiguous rows), or nullptr
  const uint8_t* scales = nullptr;  // [M, G*K/128] e8m0, or nullptr
  // Reference numerics only, instead of bf16: fp32 values [M, x_row_stride], 16-byte aligned,
  // quantized as their bf16 roundings would be (QuantFp8Params::x_f32; no bf16 copy needed).
  const float* f32 = nullptr;
};

// ---- small M: our own kernels ------------------------------------------------------------------

// The small-M tile order of an FP8 weight [R, K] (R = G*N rows, a multiple of 16; K a multiple of
// 128): byte (r, c) of the row-major weight lives at this offset. Tile t = r / 16 and block
// b = c / 128 own the 2 KB at (t * K/128 + b) * 2048; inside it, 16-byte piece i * 32 + l is what
// lane l of a warp loads as its i-th fragment word quad: rows t*16 + l/4 + 8*(i/2), columns
// b*128 + (i%2)*64 + (l%4)*16 .. +15.
inline int64_t fp8_tile_offset(int64_t r, int64_t c, int64_t k) {
  const int64_t t = r / 16, rr = r % 16, b = c / 128, cc = c % 128;
  const int64_t i = (rr / 8) * 2 + cc / 64, lane = (rr % 8) * 4 + (cc % 64) / 16;
  return (t * (k / 128) + b) * 2048 + (i * 32 + lane) * 16 + cc % 16;
}

// tiled[fp8_tile_offset(r, c, k)] = w[r * k + c] for a [rows, k] weight (rows % 16 == 0,
// k % 128 == 0, both pointers 16-byte aligned, distinct). Graph-capturable; meant for load time.
Status launch_fp8_weight_to_tiles(const uint8_t* w, uint8_t* tiled, int64_t rows, int64_t k,
                                  cudaStream_t stream);

// Which small-M kernel runs (NOTES.md):
//  - kMma: 8-warp CTAs, one work item per CTA (or a capped grid looping over items), any M (in
//    chunks of up to 64 tokens), both numerics.
//  - kStream: 4-warp CTAs, one item each, x fragments and scales prefetched in the same register
//    ring as the weights, sector-contiguous weight loads. FP8 activations, M <= 16 per chunk
//    (larger M runs 16-token chunks, re-reading the weights). max_ctas does not apply.
//  - kBulk (sm_90+; elsewhere it runs kStream): kStream's arithmetic and work items, but a
//    producer warp streams the weights with TMA bulk copies (cp.async.bulk) into a ring of
//    `stages` shared-memory slots read by 4 consumer warps. FP8 activations, <= 16 tokens per item.
//  - kAuto: for FP8 activations with M <= kSmallMMaxTokens and no max_ctas, kBulk at M <= 8 on
//    sm_90+ when each CTA streams >= 32 K blocks of its rows (wo_a, wo_b), else kStream; kMma
//    otherwise (kStream in 16-token chunks still beats kMma's single pass at M = 64: NOTES.md).
//    With a tile-ordered copy (Fp8WeightView::tiled) on sm_90+: kBulk on the copy at M <= 2, and
//    at M <= 8 where the row-major rule would not pick kBulk (wq_b; NOTES.md, session 12) or
//    where its K split of 2 runs as 2 K partitions per CTA (wo_b; session 13).
//  - kWgmma (compute capability 9.0 only: sm_90a wgmma): FP8 activations, M <= 64 in one pass
//    (every weight byte read once for all tokens): warpgroups of 64 weight rows x all tokens,
//    wgmma e4m3 from a cp.async ring of `stages` (4 or 6) 128-K stages in shared memory; row_warps
//    = warpgroups per CTA (1 or 2), k_split = CTAs per cluster along K (NOTES.md, session 27).
enum class SmallMKernel : uint8_t { kAuto, kMma, kStream, kBulk, kWgmma };
inline constexpr int64_t kStreamMaxTokens = 16;  // kStream: tokens per work item (chunk)

struct Fp8SmallMParams {
  Fp8WeightView w;
  int64_t num_tokens = 0;  // M (any; > 64 runs 64-token chunks)
  // Input: FP8 codes + scales when quantized (reference numerics), else bf16 (hf numerics).
  const uint8_t* x_codes = nullptr;   // [M, G*K] e4m3, rows G*K apart, 16-byte aligned
  const uint8_t* x_scales = nullptr;  // [M, G*K/128] e8m0
  const uint16_t* x_bf16 = nullptr;   // [M, x_row_stride] bf16 bits (used when x_codes is null)
  int64_t x_row_stride = 0;           // elements (bf16 input only)
  void* y = nullptr;                  // [M, y_row_stride], G*N columns written
  OutType y_type = OutType::kBF16;
  int64_t y_row_stride = 0;  // elements, >= G*N (>= split_features with a split)
  // Split output (two linears that share their input as one GEMM over their concatenated
  // weights; one group): output features [split_features, N) go to y2 instead, as its columns
  // 0 .. N - split_features - 1, and y gets [0, split_features). 0 = no split.
  void* y2 = nullptr;
  int64_t y2_row_stride = 0;  // elements, >= N - split_features
  int64_t split_features = 0;
  // Tuning, 0 = heuristic: warps per CTA along rows (kMma: 1, 2, 4, 8 of 8 warps; kStream and
  // kBulk: 1, 2, 4 of 4 (consumer) warps; the other warps of the CTA split K) and CTAs per cluster
  // along K (1, 2, 4, 8).
  SmallMKernel kernel = SmallMKernel::kAuto;
  int row_warps = 0;
  int k_split = 0;
  // Programmatic dependent launch: the kernel starts streaming its weights before the previous
  // kernel in the stream has finished and waits for it (griddepcontrol.wait) before reading x.
  bool pdl = false;
  // CTAs in the grid (0 = one per work item); with a cap each CTA (cluster) loops over items.
  int max_ctas = 0;
  // kBulk: shared-memory ring slots per CTA, 2..8; kWgmma: 4 or 6 (0 = heuristic).
  int stages = 0;
  // kBulk at M <= 8: K partitions inside a CTA, 1 or 2 (0 = heuristic). Each partition has its
  // own producer warp, ring of `stages` slots and 4 consumer warps and takes the K range that
  // a cluster rank of k_split * k_parts would; the CTA sums them in the same order, so k_parts 2
  // with k_split 1 gives exactly the outputs of k_split 2 without a cluster.
  int k_parts = 0;
};

// The kMma configuration launch_fp8_linear_small_m would choose (row_warps, k_split).
std::pair<int, int> fp8_small_m_config(const Fp8SmallMParams& p, int num_sms);

// The kernel and layout launch_fp8_linear_small_m would run for p (p.kernel, p.row_warps and
// p.k_split override the heuristic where set).
struct Fp8SmallMPlan {
  SmallMKernel kernel = SmallMKernel::kMma;
  int row_warps = 1;
  int k_split = 1;
  int stages = 0;  // kBulk and kWgmma only
  int k_parts = 1;  // kBulk only: K partitions per CTA (Fp8SmallMParams::k_parts)
  bool tiled = false;  // kStream / kBulk read p.w.tiled (the tile-ordered copy; M <= 8 only)
};
Fp8SmallMPlan fp8_small_m_plan(const Fp8SmallMParams& p, int num_sms);

// No allocation, no host synchronization, graph-capturable.
Status launch_fp8_linear_small_m(const Fp8SmallMParams& p, cudaStream_t stream);

// ---- helpers ----------------------------------------------------------------------------------

// e8m0 bytes to fp32 2^(e-127) (255 -> NaN). out [n]
Status launch_e8m0_to_f32(const uint8_t* in, float* out, int64_t n, cudaStream_t stream);

// ---- the linear entry points (cuBLASLt-backed) -------------------------------------------------

struct Fp8LinearParams {
  Fp8WeightView w;
  int64_t num_tokens = 0;  // M
  Fp8Activations x;
  bool quantize_activations = true;  // reference numerics (§10.2); false = hf numerics
  void* y = nullptr;                 // [M, y_row_stride]
  OutType y_type = OutType::kBF16;
  int64_t y_row_stride = 0;
  // Split output as Fp8SmallMParams (small-M path only: an error where cuBLASLt would run).
  void* y2 = nullptr;
  int64_t y2_row_stride = 0;
  int64_t split_features = 0;
  bool pdl = false;  // small-M path: programmatic dependent launch (see above)
  // kWgmma where fp8_linear_uses_wgmma (false: the small-M kernels and cuBLASLt as before).
  bool wgmma = true;
};

struct Bf16LinearParams {
  const uint16_t* w = nullptr;  // [N, K] bf16 bits, row-major
  int64_t out_features = 0;     // N, a multiple of 8
  int64_t in_features = 0;      // K, a multiple of 8
  int64_t num_tokens = 0;       // M
  const uint16_t* x = nullptr;  // [M, x_row_stride] bf16 bits
  int64_t x_row_stride = 0;
  void* y = nullptr;  // [M, y_row_stride]
  OutType y_type = OutType::kF32;
  int64_t y_row_stride = 0;
};

// Whether GemmRunner::linear_fp8 runs the FP8 block-scaled GEMM for m tokens of w on cuBLASLt in
// reference numerics (else the small-M kernels), unless fp8_linear_uses_wgmma takes the case first:
// M > 64, and the decode batch sizes where cuBLASLt
// measured faster on the H200 (run h-gemm7-1, NOTES.md v6): a single-group weight of >= 16 MB
// (wq_b, wo_b) at M > 16, or at M > 8 when K <= 1024 (wq_b). Needs N % 128 == 0, K % 512 == 0
// and fp32 weight scales (w.scale_f32), else the small-M kernels run.
bool fp8_linear_uses_cublaslt(const Fp8WeightView& w, int64_t m);

// Whether GemmRunner::linear_fp8 runs m tokens of w on kWgmma, in place of the small-M kernels
// and cuBLASLt (fp8_linear_uses_cublaslt is then not asked): a compute capability 9.0 device, a
// weight of >= 16 MB and the token counts where kWgmma measured faster than both (H100, session
// 27, kernels/cuda/gemm/NOTES.md). Quantized activations (reference numerics): one group with
// K <= 1024 (wq_b) at M <= 32, one group with larger K (wo_b) at 9 <= M <= 32, grouped weights
// (wo_a) at 9 <= M <= 64 (9 <= M <= 32 under 32 MB: wo_a's slice under tensor parallelism of 2).
// bf16 activations (quantized false: wo_a in the engine, hf numerics): grouped weights or
// K <= 1024 of >= 32 MB at M >= 16.
bool fp8_linear_uses_wgmma(const Fp8WeightView& w, int64_t m, bool quantized = true);

// Owns a cuBLASLt handle and carves a caller-provided device workspace into the quantized
// activations and the cuBLASLt workspace. One instance per stream (the workspace is reused by
// every call). No device allocation per call; graph-capturable once each shape has been seen
// (the first call of a shape queries cuBLASLt's heuristic on the host).
class GemmRunner {
 public:
  // Workspace bytes for inputs of up to max_tokens x max_in_columns (G*K) elements.
  static size_t workspace_bytes(int64_t max_tokens, int64_t max_in_columns);
  static Result<std::unique_ptr<GemmRunner>> create(void* workspace, size_t workspace_bytes,
                                                    int64_t max_tokens, int64_t max_in_columns);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // y = x @ W^T for an FP8 block-scaled W. cuBLASLt where fp8_linear_uses_cublaslt (reference
  // numerics; M > 64 or the large decode shapes above), else the small-M kernels (in chunks).
  Status linear_fp8(const Fp8LinearParams& p, cudaStream_t stream);
  // The cuBLASLt FP8 block-scaled GEMM alone, on pre-quantized activations (p.x.codes/scales).
  Status linear_fp8_cublaslt(const Fp8LinearParams& p, cudaStream_t stream);
  // y = x @ W^T for a bf16 W (fp32 accumulation, cuBLASLt).
  Status linear_bf16(const Bf16LinearParams& p, cudaStream_t stream);

  // cuBLASLt autotuning, off by default (opt-in): the first FP8 block-scaled GEMM of a shape
  // class (weight shape, output, M rounded to a power of two) outside stream capture times
  // cuBLASLt's heuristic candidates of both orientations (and their split-K variants) once,
  // host-synchronously, and keeps the fastest if >= 3% faster than cuBLASLt's first answer. Off
  // (or under capture): cuBLASLt's first answer. Off by default because on the H200 its picks,
  // timed on L2-warm operands, were 4-14% slower in the benchmark at 4 of 20 prefill shapes and
  // won nothing beyond noise (NOTES.md, v5).
  void set_autotune(bool on) { autotune_ = on; }

  // Device buffers of the quantized activations (for tests).
  const uint8_t* act_codes() const { return codes_; }
  const uint8_t* act_scales() const { return scales_; }

 private:
  GemmRunner() = default;
  struct Plan;
  Status run_fp8_cublaslt(const Fp8WeightView& w, int64_t m, const uint8_t* codes,
                          const float* scales_t, void* y, OutType y_type, int64_t y_row_stride,
                          cudaStream_t stream);
  Status make_fp8_plan(const Fp8WeightView& w, int64_t m, const float* scales_t, OutType y_type,
                       int64_t y_row_stride, int orient, std::shared_ptr<Plan>* out);
  Status run_fp8_group(const Plan& plan, const Fp8WeightView& w, int64_t m, int g,
                       const uint8_t* codes, const float* scales_t, void* y, OutType y_type,
                       cudaStream_t stream);

  void* lt_ = nullptr;  // cublasLtHandle_t
  uint8_t* codes_ = nullptr;
  uint8_t* scales_ = nullptr;
  float* scales_t_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_bytes_ = 0;
  int64_t max_tokens_ = 0, max_in_columns_ = 0;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int>, std::shared_ptr<Plan>>
      plans_;
  bool autotune_ = false;
  // Tuned plan per shape class (M bits, N, K, G*K, y row stride, y type).
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int>, std::shared_ptr<Plan>> tuned_;
};

}  // namespace ds::cuda
