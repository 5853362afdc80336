// `deepserve profile`: time per model component of decode steps (and a prefill) on a backend,
// next to each component's bytes, FLOPs and floor from the roofline model (docs/profile.md). The
// measurement and the report live in src/model/deepseek_v4/profile.h; this file parses flags and
// loads the model.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commands.h"
#include "kernels/cpu/numerics.h"
#include "model/deepseek_v4/profile.h"
#include "model/embedded_model.h"
#include "runtime/backend.h"
#include "runtime/model_runner.h"

namespace ds::cli {

void register_profile(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string model;
    std::string device = "cpu";
    std::string numerics = "reference";
    std::string gpu = "h200";
    dsv4::ProfileRequest request;
    bool json = false;
    std::string output;
    int tensor_parallel_size = 1;
    bool graphs = false;
    bool event_timing = false;
  };
  auto args = std::make_shared<Args>();
  args->request.context = 512;
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Time per model component of decode steps (and a prefill), next to its roofline floor");
  cmd->add_option("--model", args->model, "checkpoint directory (default: the embedded tiny model)")
      ->envname("DEEPSERVE_MODEL");
  cmd->add_option("--device", args->device,
                  "backend: cpu (default) or cuda (component ranges synchronized: device time)")
      ->envname("DEEPSERVE_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--numerics", args->numerics, "reference or hf")
      ->envname("DEEPSERVE_NUMERICS")
      ->check(CLI::IsMember({"reference", "hf"}));
  cmd->add_option("--batch", args->request.batch, "sequences decoding together (default 1)")
      ->envname("DEEPSERVE_PROFILE_BATCH");
  cmd->add_option("--context", args->request.context,
                  "tokens in each sequence's cache at the first timed step (default 512)")
      ->envname("DEEPSERVE_PROFILE_CONTEXT");
  cmd->add_option("--steps", args->request.steps, "timed decode steps (default 8)")
      ->envname("DEEPSERVE_PROFILE_STEPS");
  cmd->add_option("--warmup", args->request.warmup_steps, "untimed decode steps first (default 1)")
      ->envname("DEEPSERVE_PROFILE_WARMUP");
  cmd->add_option("--prefill-tokens", args->request.prefill_tokens,
                  "also time one prefill of this many tokens (default 0 = no)")
      ->envname("DEEPSERVE_PROFILE_PREFILL_TOKENS");
  cmd->add_option("--seed", args->request.seed, "seed of the random prompt tokens")
      ->envname("DEEPSERVE_SEED");
  cmd->add_option("--gpu", args->gpu, "ceilings for the floors: h200, h100, b200, rtx-pro-6000")
      ->envname("DEEPSERVE_GPU");
  cmd->add_option("--tensor-parallel-size,--tp", args->tensor_parallel_size,
                  "ranks (GPUs with --device cuda) the model is split over; times are rank 0's "
                  "and include the all-reduces (component \"collective\")")
      ->envname("DEEPSERVE_TENSOR_PARALLEL_SIZE")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--graphs", args->graphs,
                "cuda: leave the component ranges unsynchronized so that decode steps replay from "
                "CUDA graphs as when serving; reports the step time only")
      ->envname("DEEPSERVE_PROFILE_GRAPHS");
  cmd->add_flag("--event-timing", args->event_timing,
                "cuda: time each component range with CUDA events on the stream instead of "
                "synchronizing (with --graphs: events captured into the replayed decode graphs); "
                "the events separate the kernels at range boundaries, costing a little time")
      ->envname("DEEPSERVE_PROFILE_EVENT_TIMING");
  cmd->add_flag("--json", args->json, "print JSON instead of the table")
      ->envname("DEEPSERVE_PROFILE_JSON");
  cmd->add_option("--output", args->output, "also write the JSON to this file")
      ->envname("DEEPSERVE_PROFILE_OUTPUT");

  cmd->callback([args, run] {
    *run = [args]() -> int {
      auto gpu = find_gpu_preset(args->gpu);
      if (!gpu.ok()) return fail(gpu.status(), 2);
      args->request.gpu = *gpu;
      std::string dir = args->model;
      std::string label = dir;
      if (dir.empty()) {
        auto embedded = ensure_embedded_model();
        if (!embedded.ok()) return fail(embedded.status());
        dir = *embedded;
        label = "embedded tiny model (" + dir + ")";
      }
      auto weights = dsv4::ModelWeights::load(dir);
      if (!weights.ok()) return fail(weights.status());
      const auto mode = *cpu::numerics_mode_from_name(args->numerics);
      const dsv4::ForwardOptions fwd_options = dsv4::ForwardOptions::for_mode(mode);
      const dsv4::ProfileRequest& rq = args->request;
      runtime::BackendLimits limits;
      limits.max_sequences = std::max<int64_t>(rq.batch, 1) + 1;  // + the prefill's sequence
      limits.max_context = rq.context + rq.warmup_steps + rq.steps + 1;
      // The profile fills the caches in chunks of up to 512 tokens.
      limits.max_step_tokens =
          std::max({rq.batch, rq.prefill_tokens, std::min<int64_t>(rq.context, 512), int64_t(1)});
      limits.max_logit_rows = std::max<int64_t>(rq.batch, 1);
      // --event-timing: the backend times its ranges (events); run_profile then reports the
      // components whatever --graphs says.
      limits.synchronous_components = !args->graphs && !args->event_timing;
      limits.component_events = args->event_timing;
      args->request.step_time_only = args->graphs;
      // Every rank's component ranges are timed (so that each synchronizes the same way);
      // the report is rank 0's.
      const int world = args->tensor_parallel_size;
      std::vector<std::unique_ptr<dsv4::ProfilingOps>> timers(static_cast<size_t>(world));
      runtime::ParallelConfig parallel;
      parallel.tensor_parallel_size = world;
      auto runner = runtime::make_model_runner(
          args->device, **weights, fwd_options, limits, parallel,
          [&timers](int rank, dsv4::Ops* backend) -> dsv4::Ops* {
            timers[size_t(rank)] = std::make_unique<dsv4::ProfilingOps>(backend);
            return timers[size_t(rank)].get();
          });
      if (!runner.ok()) return fail(runner.status());
      runtime::ModelRunner& r = **runner;
      dsv4::ProfileTarget target;
      target.new_sequence = [&r] { return r.new_sequence(); };
      target.run = [&r](std::span<dsv4::SequenceChunk> batch,
                        std::vector<dsv4::ChunkOutput>* out) { return r.run(batch, out); };
      target.timer = timers[0].get();
      target.world_size = world;
      const std::string backend_name = world > 1 ? r.describe() : args->device;
      auto result =
          dsv4::run_profile((*weights)->config(), target, backend_name, args->request);
      if (!result.ok()) return fail(result.status(), 2);
      const std::string json = dsv4::profile_to_json(*result, label);
      if (!args->output.empty()) {
        std::ofstream f(args->output);
        f << json << "\n";
        if (!f) return fail(invalid_argument("cannot write --output " + args->output));
      }
      const std::string text = args->json ? json + "\n" : dsv4::format_profile_report(*result, label);
      std::fputs(text.c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace ds::cli
