// The roofline calculator behind `deepserve roofline` (dsv4-model.md §13, performance.md "The
// floor of a kernel"): for a DeepSeekV4Config, a GPU, a batch size B and a context length L, the
// bytes and FLOPs of one decode step per component (weights by storage format and component, the
// distinct routed experts hit by the batch under uniform routing, KV bytes by cache kind, attention
// and indexer FLOPs), the floor time max(bytes / BW, FLOPs / peak) and the ideal tokens/s; and a
// prefill estimate for T prompt tokens. Weight bytes come from expected_tensors() and KV entry
// sizes from model_stats.h, so the calculator can never disagree with the loader about shapes.
// Nothing here prints; the CLI formats a RooflineResult.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/model_stats.h"

namespace ds {

// A GPU as the roofline sees it: datasheet HBM bandwidth and dense (not 2:4 sparse) tensor-core
// peaks. Trivially copyable; `name` points to a string literal.
struct GpuSpec {
  const char* name = "custom";
  double bandwidth_tb_s = 0;  // HBM bandwidth, 1e12 B/s
  double bf16_tflops = 0;     // dense BF16 tensor-core peak, 1e12 FLOP/s
  double fp8_tflops = 0;      // dense FP8 e4m3 tensor-core peak, 1e12 FLOP/s
  double memory_gb = 0;       // device memory, 1e9 B (capacity note only; 0 = unknown)
};

// Datasheet values (dense peaks). The RTX PRO 6000 Blackwell bandwidth is the datasheet 1.792
// TB/s; dsv4-model.md §13.4 rounds it to 1.7 for its table.
inline constexpr GpuSpec kGpuPresets[] = {
    {"h200", 4.8, 989.4, 1978.9, 141.0},           // H200 SXM
    {"h100", 3.35, 989.4, 1978.9, 80.0},           // H100 SXM
    {"b200", 8.0, 2250.0, 4500.0, 180.0},          // B200 (HGX)
    {"rtx-pro-6000", 1.792, 503.8, 1007.6, 96.0},  // RTX PRO 6000 Blackwell
};

// The preset named `name` (case-sensitive), or kInvalidArgument listing the known names.
Result<GpuSpec> find_gpu_preset(std::string_view name);
// "h200, h100, b200, rtx-pro-6000"
std::string gpu_preset_names();
// Bandwidth and both peaks must be finite and positive.
Status validate_gpu_spec(const GpuSpec& gpu);

// What one decode step (and the prefill estimate) is asked for.
struct RooflineRequest {
  GpuSpec gpu = kGpuPresets[0];
  int64_t batch = 1;      // B: sequences decoding together, one new token each (without MTP)
  int64_t context = 512;  // L: tokens in each sequence's cache, the new token included
  // T: prompt tokens of the prefill estimate (one sequence, empty cache); 0 = use `context`.
  int64_t prefill_tokens = 0;
  IndexerKeyFormat indexer_format = IndexerKeyFormat::kFp8;  // §11: 132-B FP8 or 68-B FP4 keys
  // §13.2 option: when L/4 <= index_topk every compressed entry is selected anyway, so the indexer
  // can be skipped. Off by default (the §13.2/§13.4 table counts the indexer keys).
  bool skip_short_indexer = false;
  // MTP speculation (§9, §13.4 caveat 3): d draft tokens per sequence and step (0 = off), each
  // accepted with probability `mtp_acceptance` given that the previous one was.
  int64_t mtp_draft_tokens = 0;
  double mtp_acceptance = 0.7;
};

// Which traffic a row counts.
enum class RooflineSection : uint8_t {
  kWeights,  // weight bytes read (scales included)
  kKvCache,  // KV-cache bytes read (decode) or written (prefill)
};
const char* roofline_section_name(RooflineSection section);

// One component of a step.
struct RooflineRow {
  std::string component;  // "attention projections", "routed experts", "KV: SWA ring", ...
  RooflineSection section = RooflineSection::kWeights;
  std::string format;  // storage: "FP8", "BF16", "F32", "MXFP4", "mixed", "KV 584 B", ...
  std::string detail;  // how the bytes were counted, e.g. "U(16) = 80.83 of 256 x 43 layers"
  double bytes = 0;
  double fp8_flops = 0;   // FLOPs on FP8 tensor cores (FP8 and FP4 weights, indexer scores)
  double bf16_flops = 0;  // FLOPs on BF16 tensor cores (BF16/F32 weights, attention over KV)
  double flops() const { return fp8_flops + bf16_flops; }
};

// Bytes, FLOPs and the floor of one step.
struct RooflineEstimate {
  std::vector<RooflineRow> rows;
  double tokens = 0;  // decode: expected tokens emitted per step; prefill: prompt tokens
  double weight_bytes = 0, kv_bytes = 0, bytes = 0;
  double fp8_flops = 0, bf16_flops = 0, flops = 0;
  double memory_time_s = 0;   // bytes / BW
  double compute_time_s = 0;  // fp8_flops / FP8 peak + bf16_flops / BF16 peak
  double floor_s = 0;         // max(memory_time_s, compute_time_s)
  double tokens_per_s = 0;    // tokens / floor_s
  bool memory_bound() const { return memory_time_s >= compute_time_s; }
};

// Weight bytes of a step by storage format ("FP8" = e4m3 weights + their block scales, "MXFP4" =
// packed e2m1 + e8m0 scales, otherwise the stored dtype name).
struct FormatBytes {
  std::string format;
  double bytes = 0;
};

struct RooflineResult {
  RooflineRequest request;
  int64_t num_swa_layers = 0, num_csa_layers = 0, num_hca_layers = 0;  // main model
  RooflineEstimate decode;
  RooflineEstimate prefill;

  // ---- decode details (§13.1, §13.2) ----
  double decode_tokens_verified = 0;  // tokens through the main model per step: B * (1 + d)
  double distinct_experts = 0;        // U(B * (1 + d)) per main layer, uniform routing
  double expert_bytes = 0;            // one routed expert of one main layer, scales included
  // Main-model weights read every step whatever the routing: everything except routed experts,
  // the embedding and the hash tables (one row per token each); compressor `ape` tables count one
  // row per token (§7.6). §13.1's "dense" (7.76 GB).
  double dense_weight_bytes = 0;
  double routed_expert_bytes = 0;        // main layers: layers * U * expert_bytes
  double kv_bytes_per_sequence = 0;      // main-model KV read per sequence per step (§13.2)
  double linear_flops_per_token = 0;     // 2 * active parameters (head included), main model
  double attention_flops_per_token = 0;  // attention over KV + indexer scores, main model
  std::vector<FormatBytes> decode_weight_bytes_by_format;

  // ---- prefill details ----
  double prefill_distinct_experts = 0;  // U(T)

  // ---- capacity (§13.4 caveat 1) ----
  double resident_weight_bytes = 0;  // main model as stored (+ MTP when speculating)
};

// U(n) = E * (1 - (1 - k/E)^n): the expected number of distinct experts hit per layer by n tokens
// that each pick k of E experts uniformly at random (§13.1). n may be fractional; U(0) = 0.
double distinct_experts_hit(int64_t num_experts, int64_t top_k, double num_tokens);

// The calculator. `config` must have passed validate_config(). Errors: kInvalidArgument for a
// batch, context, prefill length, MTP setting or GPU spec out of range.
Result<RooflineResult> compute_roofline(const DeepSeekV4Config& config,
                                        const RooflineRequest& request);

// The human-readable report `deepserve roofline` prints: a header (model, GPU), then for decode
// and prefill a table (component, format, bytes, FLOPs, time at BW, share of the bytes, what was
// counted), totals, the floor and the ideal tokens/s; then the capacity note. `model_label` names
// the config ("preset flash", a directory).
std::string format_roofline_report(const DeepSeekV4Config& config, const RooflineResult& result,
                                   std::string_view model_label);
// The same as a JSON document (bytes in B, FLOPs in FLOP, times in s; one object per row).
std::string roofline_to_json(const DeepSeekV4Config& config, const RooflineResult& result,
                             std::string_view model_label);

// Report units shared with `deepserve profile`: decimal bytes ("4.60 GB"), FLOPs ("147.17 GFLOP"),
// times ("958.22 us").
std::string human_bytes(double bytes);
std::string human_flops(double flops);
std::string human_time(double seconds);

// Bounds on the request (a calculator, but no absurd values).
inline constexpr int64_t kMaxRooflineBatch = int64_t(1) << 20;
inline constexpr int64_t kMaxRooflineTokens = int64_t(1) << 32;  // context and prefill length
inline constexpr int64_t kMaxMtpDraftTokens = 16;

}  // namespace ds
