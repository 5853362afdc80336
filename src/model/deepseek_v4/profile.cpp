// `deepserve profile` (see profile.h): decode steps and a prefill timed per component, next to
// the roofline's bytes, FLOPs and floors of the same step.
#include "model/deepseek_v4/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/rng.h"

namespace ds::dsv4 {

void ProfilingOps::component_begin(Component c) {
  ForwardingOps::component_begin(c);
  begin_ = std::chrono::steady_clock::now();
}

void ProfilingOps::component_end(Component c) {
  // The inner backend first: a device backend that synchronizes its ranges does it there.
  ForwardingOps::component_end(c);
  const auto end = std::chrono::steady_clock::now();
  seconds[size_t(c)] += std::chrono::duration<double>(end - begin_).count();
  ++ranges[size_t(c)];
}

void ProfilingOps::reset() {
  seconds.fill(0);
  ranges.fill(0);
  std::array<double, kNumComponents> drop_s{};
  std::array<int64_t, kNumComponents> drop_n{};
  (void)inner()->take_component_times(drop_s, drop_n);
  device_timed = false;
}

bool ProfilingOps::use_device_times() {
  std::array<double, kNumComponents> dev_s{};
  std::array<int64_t, kNumComponents> dev_n{};
  if (!inner()->take_component_times(dev_s, dev_n)) return false;
  for (int c = 0; c < kNumComponents; ++c) {
    if (Component(c) == Component::kStep) continue;  // host work: the host clock's time stays
    seconds[size_t(c)] = dev_s[size_t(c)];
    ranges[size_t(c)] = dev_n[size_t(c)];
  }
  device_timed = true;
  return true;
}

Component component_of_roofline_row(const std::string& row) {
  if (row == "embedding rows") return Component::kEmbed;
  if (row == "attention projections") return Component::kAttentionProjections;
  if (row == "compressors") return Component::kCompressor;
  if (row == "indexer" || row == "KV: indexer keys") return Component::kIndexer;
  if (row == "mHC") return Component::kMhc;
  if (row == "norms") return Component::kNorm;
  if (row == "head" || row == "head (draft passes)") return Component::kHead;
  if (row.rfind("KV:", 0) == 0) return Component::kAttention;
  if (row.rfind("MTP", 0) == 0) return Component::kMtpInput;
  return Component::kMoe;  // gate, hash routing rows, shared expert, routed experts
}

namespace {

using Clock = std::chrono::steady_clock;

double floor_of(double bytes, double fp8, double bf16, const GpuSpec& gpu) {
  const double memory = bytes / (gpu.bandwidth_tb_s * 1e12);
  const double compute = fp8 / (gpu.fp8_tflops * 1e12) + bf16 / (gpu.bf16_tflops * 1e12);
  return std::max(memory, compute);
}

// Component rows of a phase from the timer totals over `steps` steps and the roofline estimate.
PhaseProfile make_phase(const char* phase, int64_t steps, int64_t tokens, double total_step_s,
                        const ProfilingOps& timer, const RooflineEstimate& estimate,
                        const GpuSpec& gpu, int world) {
  PhaseProfile p;
  p.phase = phase;
  p.steps = steps;
  p.tokens = tokens;
  p.step_s = total_step_s / double(steps);
  p.floor_s = estimate.floor_s;
  for (int c = 0; c < kNumComponents; ++c) {
    ComponentProfile cp;
    cp.component = Component(c);
    cp.seconds = timer.seconds[size_t(c)] / double(steps);
    cp.ranges = timer.ranges[size_t(c)] / steps;
    p.components.push_back(cp);
    p.covered_s += cp.seconds;
  }
  for (const RooflineRow& row : estimate.rows) {
    ComponentProfile& cp = p.components[size_t(component_of_roofline_row(row.component))];
    cp.bytes += row.bytes;
    cp.fp8_flops += row.fp8_flops;
    cp.bf16_flops += row.bf16_flops;
  }
  p.floor_s = 0;
  for (ComponentProfile& cp : p.components) {
    // Per rank: the parts split across tensor/expert-parallel ranks (profile.h ProfileTarget).
    if (world > 1 && (cp.component == Component::kAttentionProjections ||
                      cp.component == Component::kMoe)) {
      cp.bytes /= world;
      cp.fp8_flops /= world;
      cp.bf16_flops /= world;
    }
    cp.floor_s = floor_of(cp.bytes, cp.fp8_flops, cp.bf16_flops, gpu);
    p.floor_s += cp.floor_s;
  }
  if (world == 1) p.floor_s = estimate.floor_s;
  return p;
}

// The outputs are reused from call to call, as the engine reuses its own (forward.cpp).
Status run_chunks(const ProfileTarget& target, std::vector<SequenceChunk>& chunks,
                  std::vector<ChunkOutput>* out) {
  return target.run(std::span<SequenceChunk>(chunks), out);
}

}  // namespace

Result<ProfileResult> run_profile(const ModelWeights& weights, const ForwardOptions& options,
                                  Ops* ops, const std::string& backend,
                                  const ProfileRequest& req) {
  ProfilingOps timer(ops);
  const Forward fwd(&weights, options, &timer);
  ProfileTarget target;
  target.new_sequence = [&] { return fwd.new_sequence(); };
  target.run = [&](std::span<SequenceChunk> batch, std::vector<ChunkOutput>* out) {
    return fwd.run(batch, out);
  };
  target.timer = &timer;
  return run_profile(weights.config(), target, backend, req);
}

Result<ProfileResult> run_profile(const DeepSeekV4Config& c, const ProfileTarget& target,
                                  const std::string& backend, const ProfileRequest& req) {
  if (req.batch < 1 || req.batch > 4096) {
    return invalid_argument("profile: --batch must be in [1, 4096]");
  }
  if (req.steps < 1 || req.steps > 100000 || req.warmup_steps < 0 || req.warmup_steps > 100000) {
    return invalid_argument("profile: --steps must be in [1, 100000], --warmup in [0, 100000]");
  }
  const int64_t last_position = req.context + req.warmup_steps + req.steps;
  if (req.context < 1 || last_position > c.max_position_embeddings) {
    return invalid_argument("profile: --context + --warmup + --steps = " +
                            std::to_string(last_position) +
                            " must be in [2, max_position_embeddings = " +
                            std::to_string(c.max_position_embeddings) + "]");
  }
  if (req.prefill_tokens < 0 || req.prefill_tokens > c.max_position_embeddings) {
    return invalid_argument("profile: --prefill-tokens must be in [0, max_position_embeddings]");
  }
  if (target.timer == nullptr || !target.run || !target.new_sequence || target.world_size < 1) {
    return invalid_argument("profile: incomplete target");
  }
  ProfileResult result;
  result.request = req;
  result.backend = backend;
  result.world_size = target.world_size;
  ProfilingOps& timer = *target.timer;
  std::vector<ChunkOutput> outputs;
  Rng rng(req.seed);
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = int32_t(rng.below(uint64_t(c.vocab_size)));
    return ids;
  };

  // Decode: fill every sequence's cache to `context - 1` tokens, then time one-token steps.
  std::vector<SequenceState> states;
  for (int64_t b = 0; b < req.batch; ++b) states.push_back(target.new_sequence());
  constexpr int64_t kFillChunk = 512;
  for (SequenceState& s : states) {
    const std::vector<int32_t> ids = random_ids(req.context - 1);
    for (int64_t at = 0; at < int64_t(ids.size()); at += kFillChunk) {
      const int64_t n = std::min<int64_t>(kFillChunk, int64_t(ids.size()) - at);
      std::vector<SequenceChunk> one = {
          {&s, std::span<const int32_t>(ids.data() + at, size_t(n)), {}}};
      DS_RETURN_IF_ERROR(run_chunks(target, one, &outputs));
    }
  }
  double decode_s = 0;
  for (int64_t step = 0; step < req.warmup_steps + req.steps; ++step) {
    const std::vector<int32_t> ids = random_ids(req.batch);
    std::vector<SequenceChunk> chunks;
    for (int64_t b = 0; b < req.batch; ++b) {
      // The backend's token, as a serving step takes it (greedy and plain sampled rows): the
      // logits stay where they are (a copy of each row to the host would add ~1 ms at B = 64).
      chunks.push_back({&states[size_t(b)], std::span<const int32_t>(&ids[size_t(b)], 1), {0}});
      chunks.back().argmax_only = true;
    }
    if (step == req.warmup_steps) timer.reset();
    const auto t0 = Clock::now();
    DS_RETURN_IF_ERROR(run_chunks(target, chunks, &outputs));
    if (step >= req.warmup_steps) {
      decode_s += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
  // A backend that times its ranges on the device (also inside CUDA graphs): its times replace
  // the host clock's, and the component rows mean something even when the steps replayed.
  const bool device_timed = timer.use_device_times();
  if (device_timed) {
    result.request.step_time_only = false;
    result.request.component_timing = "device events (per range, inside CUDA graphs too)";
  }
  RooflineRequest rr;
  rr.gpu = req.gpu;
  rr.batch = req.batch;
  rr.context = req.context + req.warmup_steps + (req.steps + 1) / 2;  // mean context timed
  rr.prefill_tokens = std::max<int64_t>(req.prefill_tokens, 1);
  DS_ASSIGN_OR_RETURN(RooflineResult roof, compute_roofline(c, rr));
  result.decode =
      make_phase("decode", req.steps, req.batch, decode_s, timer, roof.decode, req.gpu,
                 target.world_size);

  // Prefill: one sequence, empty cache, logits of the last token (as the roofline counts it).
  if (req.prefill_tokens > 0) {
    SequenceState s = target.new_sequence();
    const std::vector<int32_t> ids = random_ids(req.prefill_tokens);
    std::vector<SequenceChunk> one = {{&s, ids, {req.prefill_tokens - 1}}};
    timer.reset();
    const auto t0 = Clock::now();
    DS_RETURN_IF_ERROR(run_chunks(target, one, &outputs));
    const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (device_timed) (void)timer.use_device_times();
    result.prefill = make_phase("prefill", 1, req.prefill_tokens, prefill_s, timer, roof.prefill,
                                req.gpu, target.world_size);
  }
  return result;
}

namespace {

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

void format_phase(const PhaseProfile& p, bool step_time_only, std::string* out) {
  *out += p.phase + ": " + std::to_string(p.tokens) + " token(s) per step, " +
          std::to_string(p.steps) + " timed step(s)\n";
  if (step_time_only) {
    *out += "step " + human_time(p.step_s) + " measured (components not timed: --graphs); floor " +
            human_time(p.floor_s) +
            " (" + fmt("%.1fx", p.floor_s > 0 ? p.step_s / p.floor_s : 0) + ")\n";
    return;
  }
  *out += pad("component", 24) + pad("time/step", 12) + pad("share", 8) + pad("bytes", 12) +
          pad("FLOPs", 14) + pad("floor", 12) + "time/floor\n";
  for (const ComponentProfile& cp : p.components) {
    if (cp.ranges == 0 && cp.bytes == 0) continue;
    const double share = p.step_s > 0 ? cp.seconds / p.step_s : 0;
    *out += pad(component_name(cp.component), 24) + pad(human_time(cp.seconds), 12) +
            pad(fmt("%.1f%%", 100 * share), 8) + pad(human_bytes(cp.bytes), 12) +
            pad(human_flops(cp.fp8_flops + cp.bf16_flops), 14) + pad(human_time(cp.floor_s), 12) +
            (cp.floor_s > 0 && cp.ranges > 0 ? fmt("%.1fx", cp.seconds / cp.floor_s)
                                             : std::string(cp.ranges > 0 ? "-" : "- (no range)")) +
            "\n";
  }
  const double coverage = p.step_s > 0 ? p.covered_s / p.step_s : 0;
  *out += "step " + human_time(p.step_s) + " measured; components cover " +
          human_time(p.covered_s) + " (" + fmt("%.1f%%", 100 * coverage) + "); floor " +
          human_time(p.floor_s) + " (" + fmt("%.1fx", p.floor_s > 0 ? p.step_s / p.floor_s : 0) +
          ")\n";
}

nlohmann::json phase_json(const PhaseProfile& p, bool step_time_only) {
  nlohmann::json j = {{"phase", p.phase},       {"steps", p.steps},
                      {"tokens_per_step", p.tokens}, {"step_s", p.step_s},
                      {"covered_s", p.covered_s}, {"floor_s", p.floor_s}};
  if (step_time_only) return j;
  nlohmann::json rows = nlohmann::json::array();
  for (const ComponentProfile& cp : p.components) {
    rows.push_back({{"component", component_name(cp.component)},
                    {"seconds_per_step", cp.seconds},
                    {"ranges_per_step", cp.ranges},
                    {"share", p.step_s > 0 ? cp.seconds / p.step_s : 0.0},
                    {"bytes", cp.bytes},
                    {"fp8_flops", cp.fp8_flops},
                    {"bf16_flops", cp.bf16_flops},
                    {"floor_s", cp.floor_s},
                    {"time_over_floor", cp.floor_s > 0 ? cp.seconds / cp.floor_s : 0.0}});
  }
  j["components"] = rows;
  return j;
}

}  // namespace

std::string format_profile_report(const ProfileResult& r, const std::string& model_label) {
  std::string out = "model: " + model_label + "\nbackend: " + r.backend + " (" +
                    (r.request.step_time_only ? std::string("step time only")
                                              : r.request.component_timing) +
                    ")\nfloors: " + r.request.gpu.name + " (" +
                    fmt("%.2f TB/s, ", r.request.gpu.bandwidth_tb_s) +
                    fmt("BF16 %.0f TFLOP/s, ", r.request.gpu.bf16_tflops) +
                    fmt("FP8 %.0f TFLOP/s)", r.request.gpu.fp8_tflops) + "\n";
  if (r.world_size > 1) {
    out += "ranks: " + std::to_string(r.world_size) +
           " (times are rank 0's; floors per rank: attention projections and MoE / " +
           std::to_string(r.world_size) + ", the rest replicated)\n";
  }
  out += "\n";
  out += "decode: batch " + std::to_string(r.request.batch) + ", context " +
         std::to_string(r.request.context) + "\n";
  format_phase(r.decode, r.request.step_time_only, &out);
  if (r.prefill.steps > 0) {
    out += "\n";
    format_phase(r.prefill, r.request.step_time_only, &out);
  }
  return out;
}

std::string profile_to_json(const ProfileResult& r, const std::string& model_label) {
  // Which tree and when (bench/results provenance): DS_COMMIT as the kernel benchmarks read it
  // (the GPU machine's copy of the tree has no .git; scripts/gpu/pack_backend.sh records it).
  const char* commit = std::getenv("DS_COMMIT");
  char date[32] = "unknown";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (gmtime_r(&now, &utc) != nullptr) std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &utc);
  nlohmann::json j = {{"commit", commit != nullptr && *commit != 0 ? commit : "unknown"},
                      {"date", date},
                      {"model", model_label},
                      {"backend", r.backend},
                      {"world_size", r.world_size},
                      {"gpu_for_floors", r.request.gpu.name},
                      {"batch", r.request.batch},
                      {"context", r.request.context},
                      {"components_timed", !r.request.step_time_only},
                      {"component_timing", r.request.step_time_only
                                               ? std::string("none")
                                               : r.request.component_timing},
                      {"decode", phase_json(r.decode, r.request.step_time_only)}};
  if (r.prefill.steps > 0) j["prefill"] = phase_json(r.prefill, r.request.step_time_only);
  return j.dump(2);
}

}  // namespace ds::dsv4
