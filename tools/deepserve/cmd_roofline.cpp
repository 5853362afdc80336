// `deepserve roofline`: the ideal cost of a decode step and of a prefill for a DeepSeek-V4 config
// (a checkpoint directory or a built-in preset) on a GPU (a preset or custom peaks): bytes and
// FLOPs per component, the floor max(bytes/BW, FLOPs/peak) and the ideal tokens/s
// (dsv4-model.md §13, docs/roofline.md). The arithmetic and the report live in
// src/model/roofline.h; this file only parses flags.
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "commands.h"
#include "model/config.h"
#include "model/roofline.h"

namespace ds::cli {

void register_roofline(CLI::App& app, CommandFn* run) {
  constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();
  struct Args {
    std::string model;
    std::string preset;
    std::string gpu = "h200";
    double bandwidth_tb_s = kUnset, bf16_tflops = kUnset, fp8_tflops = kUnset, memory_gb = kUnset;
    int64_t batch = 1;
    int64_t context = 512;
    int64_t prefill_tokens = 0;
    std::string indexer_keys = "fp8";
    bool skip_short_indexer = false;
    int64_t mtp_draft_tokens = 0;
    double mtp_acceptance = 0.7;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "roofline",
      "Ideal bytes, FLOPs, floor time and tokens/s of a decode step and a prefill "
      "(dsv4-model.md §13) for a config on a GPU");
  cmd->add_option("--model", args->model, "checkpoint directory or config.json (not with --preset)")
      ->envname("DEEPSERVE_MODEL");
  cmd->add_option("--preset", args->preset, "built-in config: flash or tiny (default flash)")
      ->envname("DEEPSERVE_ROOFLINE_PRESET");
  cmd->add_option("--gpu", args->gpu,
                  "h200, h100, b200, rtx-pro-6000, or custom (then give the three peaks)")
      ->envname("DEEPSERVE_GPU");
  cmd->add_option("--bandwidth-tbs", args->bandwidth_tb_s, "memory bandwidth in TB/s (overrides)")
      ->envname("DEEPSERVE_GPU_BANDWIDTH_TBS");
  cmd->add_option("--bf16-tflops", args->bf16_tflops, "dense BF16 peak in TFLOP/s (overrides)")
      ->envname("DEEPSERVE_GPU_BF16_TFLOPS");
  cmd->add_option("--fp8-tflops", args->fp8_tflops, "dense FP8 peak in TFLOP/s (overrides)")
      ->envname("DEEPSERVE_GPU_FP8_TFLOPS");
  cmd->add_option("--memory-gb", args->memory_gb, "GPU memory in GB, for the capacity note")
      ->envname("DEEPSERVE_GPU_MEMORY_GB");
  cmd->add_option("--batch", args->batch, "sequences decoding together (default 1)")
      ->envname("DEEPSERVE_ROOFLINE_BATCH");
  cmd->add_option("--context", args->context, "tokens in each sequence's cache (default 512)")
      ->envname("DEEPSERVE_ROOFLINE_CONTEXT");
  cmd->add_option("--prefill-tokens", args->prefill_tokens,
                  "prompt tokens of the prefill estimate (default: --context)")
      ->envname("DEEPSERVE_ROOFLINE_PREFILL_TOKENS");
  cmd->add_option("--indexer-keys", args->indexer_keys, "indexer key format: fp8 (132 B) or fp4")
      ->envname("DEEPSERVE_ROOFLINE_INDEXER_KEYS");
  cmd->add_flag("--skip-short-indexer", args->skip_short_indexer,
                "skip the indexer when context/4 <= index_topk (all entries selected)")
      ->envname("DEEPSERVE_ROOFLINE_SKIP_SHORT_INDEXER");
  cmd->add_option("--mtp-draft-tokens", args->mtp_draft_tokens,
                  "MTP speculation: draft tokens per step (default 0 = off)")
      ->envname("DEEPSERVE_ROOFLINE_MTP_DRAFT_TOKENS");
  cmd->add_option("--mtp-acceptance", args->mtp_acceptance,
                  "MTP: probability each draft is accepted (default 0.7)")
      ->envname("DEEPSERVE_ROOFLINE_MTP_ACCEPTANCE");
  cmd->add_flag("--json", args->json, "print JSON instead of the table")
      ->envname("DEEPSERVE_ROOFLINE_JSON");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      // ---- config ----
      DeepSeekV4Config config;
      std::string label;
      if (!args->model.empty() && !args->preset.empty())
        return fail(invalid_argument("give --model (or DEEPSERVE_MODEL) or --preset, not both"), 2);
      if (!args->model.empty()) {
        auto loaded = load_config_file(args->model);
        if (!loaded.ok()) return fail(loaded.status(), 1);
        config = *loaded;
        label = args->model;
      } else {
        const std::string preset = args->preset.empty() ? "flash" : args->preset;
        if (preset == "flash")
          config = flash_config(43);
        else if (preset == "tiny")
          config = tiny_config();
        else
          return fail(invalid_argument("unknown preset \"" + preset + "\" (known: flash, tiny)"),
                      2);
        label = "preset " + preset;
      }

      // ---- GPU ----
      GpuSpec gpu;
      const bool custom = args->gpu == "custom";
      if (custom) {
        if (std::isnan(args->bandwidth_tb_s) || std::isnan(args->bf16_tflops) ||
            std::isnan(args->fp8_tflops))
          return fail(invalid_argument("--gpu custom needs --bandwidth-tbs, --bf16-tflops and "
                                       "--fp8-tflops"),
                      2);
        gpu.memory_gb = 0;
      } else {
        auto preset = find_gpu_preset(args->gpu);
        if (!preset.ok()) return fail(preset.status(), 2);
        gpu = *preset;
      }
      if (!std::isnan(args->bandwidth_tb_s)) gpu.bandwidth_tb_s = args->bandwidth_tb_s;
      if (!std::isnan(args->bf16_tflops)) gpu.bf16_tflops = args->bf16_tflops;
      if (!std::isnan(args->fp8_tflops)) gpu.fp8_tflops = args->fp8_tflops;
      if (!std::isnan(args->memory_gb)) gpu.memory_gb = args->memory_gb;

      // ---- request ----
      RooflineRequest req;
      req.gpu = gpu;
      req.batch = args->batch;
      req.context = args->context;
      req.prefill_tokens = args->prefill_tokens;
      if (args->indexer_keys == "fp8")
        req.indexer_format = IndexerKeyFormat::kFp8;
      else if (args->indexer_keys == "fp4")
        req.indexer_format = IndexerKeyFormat::kFp4;
      else
        return fail(invalid_argument("--indexer-keys must be fp8 or fp4, got \"" +
                                     args->indexer_keys + "\""),
                    2);
      req.skip_short_indexer = args->skip_short_indexer;
      req.mtp_draft_tokens = args->mtp_draft_tokens;
      req.mtp_acceptance = args->mtp_acceptance;

      auto result = compute_roofline(config, req);
      if (!result.ok()) return fail(result.status(), 2);
      const std::string text = args->json ? roofline_to_json(config, *result, label)
                                          : format_roofline_report(config, *result, label);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    };
  });
}

}  // namespace ds::cli
