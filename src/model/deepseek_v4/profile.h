// Per-component profile of the DeepSeek-V4 forward (`deepserve profile`, architecture.md
// "Observability"): runs decode steps (and optionally a prefill) on a backend, times every
// component range the forward opens (ops.h Component) and puts each component's time next to
// its bytes, FLOPs and floor from the roofline model (roofline.h, dsv4-model.md §13) for the
// same config, batch and context. The step time is measured around the whole forward call, so
// the report shows how much of it the component ranges cover.
//
// Timing: ProfilingOps reads a steady clock at each range's begin and end. That is the op time
// on a synchronous backend (CpuOps); a device backend must make its ranges synchronous for the
// numbers to mean the same, or time them itself (Ops::take_component_times: CudaOps records an
// event at each range boundary, inside CUDA graphs too), in which case its device times replace
// the host clock's for every component but the step overhead (host work).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/forwarding_ops.h"
#include "model/roofline.h"

namespace ds::dsv4 {

// Accumulates wall-clock time per component over the steps it sees.
class ProfilingOps final : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;

  void component_begin(Component c) override;
  void component_end(Component c) override;
  // Zeroes the totals, and drops the device times the backend holds (take_component_times).
  void reset();
  // Replaces the totals of the components the backend timed on the device (all but kStep) by
  // the backend's times since the last reset; false (totals untouched) when it does not time.
  bool use_device_times();

  std::array<double, kNumComponents> seconds{};  // total per component
  std::array<int64_t, kNumComponents> ranges{};  // ranges closed per component
  bool device_timed = false;                     // use_device_times() replaced the totals

 private:
  std::chrono::steady_clock::time_point begin_;
};

struct ProfileRequest {
  int64_t batch = 1;           // sequences decoding together, one token each per step
  int64_t context = 512;       // tokens in each sequence's cache at the first timed step
  int64_t steps = 8;           // timed decode steps
  int64_t warmup_steps = 1;    // untimed decode steps before them
  int64_t prefill_tokens = 0;  // > 0: also time one prefill of this many tokens
  uint64_t seed = 0;           // prompt token ids
  // The backend ran unsynchronized (a device backend's decode steps replayed from CUDA graphs):
  // only the step time means anything; the component rows are not reported.
  bool step_time_only = false;
  // How the component rows were timed, for the report and the JSON ("host clock, synchronized
  // ranges" unless the backend timed them on the device: run_profile sets it then).
  std::string component_timing = "host clock, synchronized ranges";
  GpuSpec gpu = kGpuPresets[0];  // ceilings for the floors
};

struct ComponentProfile {
  Component component = Component::kEmbed;
  double seconds = 0;  // per step (mean over the timed steps)
  int64_t ranges = 0;  // ranges per step
  double bytes = 0;    // roofline: bytes per step (weights + KV)
  double fp8_flops = 0, bf16_flops = 0;
  double floor_s = 0;  // max(bytes / BW, fp8 / FP8 peak + bf16 / BF16 peak)
};

struct PhaseProfile {
  std::string phase;     // "decode" or "prefill"
  int64_t steps = 0;     // timed steps
  int64_t tokens = 0;    // tokens per step
  double step_s = 0;     // mean wall-clock of one forward call
  double covered_s = 0;  // sum of the component times per step
  double floor_s = 0;    // roofline floor of the step
  std::vector<ComponentProfile> components;  // in Component order
};

struct ProfileResult {
  ProfileRequest request;
  std::string backend;  // "cpu", "cuda", "cuda x2 (tensor parallel ...)"
  int world_size = 1;   // ranks; the times are rank 0's
  PhaseProfile decode;
  PhaseProfile prefill;  // steps == 0 when not asked
};

// What a profile runs: decode/prefill calls over fresh sequences, and the timer whose component
// times it reports. One rank: a Forward over ProfilingOps around the backend. Tensor-parallel
// ranks (runtime/model_runner.h): every rank runs each call; `timer` wraps rank 0's backend, and
// the floors are per rank: the attention projections' and the MoE's bytes and FLOPs divided by
// world_size (split by heads and experts), the rest replicated (an approximation: wq_a, wkv and
// the router are replicated too, a few percent of those components' bytes).
struct ProfileTarget {
  std::function<SequenceState()> new_sequence;
  std::function<Status(std::span<SequenceChunk>, std::vector<ChunkOutput>*)> run;
  ProfilingOps* timer = nullptr;
  int world_size = 1;
};

// Runs the profile on `target` for the whole model's `config`. Errors: kInvalidArgument for a
// request out of range (batch, context, steps, prefill length beyond max_position_embeddings).
Result<ProfileResult> run_profile(const DeepSeekV4Config& config, const ProfileTarget& target,
                                  const std::string& backend, const ProfileRequest& request);

// One rank: `ops` is the backend (not owned); the forward runs in `options` numerics.
Result<ProfileResult> run_profile(const ModelWeights& weights, const ForwardOptions& options,
                                  Ops* ops, const std::string& backend,
                                  const ProfileRequest& request);

// Which roofline rows a component owns (by RooflineRow::component name).
Component component_of_roofline_row(const std::string& row_component);

std::string format_profile_report(const ProfileResult& result, const std::string& model_label);
std::string profile_to_json(const ProfileResult& result, const std::string& model_label);

}  // namespace ds::dsv4
