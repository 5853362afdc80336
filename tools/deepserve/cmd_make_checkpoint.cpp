// `deepserve make-checkpoint`: writes a synthetic DeepSeek-V4 checkpoint in the published format.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

#include "commands.h"
#include "model/checkpoint.h"
#include "model/synthetic.h"

namespace ds::cli {

void register_make_checkpoint(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string preset = "tiny";
    int layers = -1;
    uint64_t seed = 0;
    std::string out;
    double shard_gib = 0;
    bool verify = true;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint",
      "Write a synthetic DeepSeek-V4 checkpoint (published names, dtypes, shapes and quantized "
      "formats; random weights)");
  cmd->add_option("--preset", args->preset, "tiny (every feature, small) or flash (DeepSeek-V4-Flash geometry)")
      ->envname("DEEPSERVE_PRESET")->check(CLI::IsMember({"tiny", "flash"}));
  cmd->add_option("--layers", args->layers, "main decoder layers (default: tiny 4, flash 43)")
      ->envname("DEEPSERVE_LAYERS")->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", args->seed, "random seed")->envname("DEEPSERVE_SEED");
  cmd->add_option("--out", args->out, "output directory (must not hold a checkpoint)")
      ->required()->envname("DEEPSERVE_OUT");
  cmd->add_option("--shard-gib", args->shard_gib, "maximum shard size in GiB (default: tiny 0.047, flash 4)")
      ->envname("DEEPSERVE_SHARD_GIB")->check(CLI::Range(0.001, 1024.0));
  cmd->add_flag("!--no-verify", args->verify, "skip loading the result back and validating it");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      SyntheticOptions options;
      auto preset = parse_synthetic_preset(args->preset);
      if (!preset.ok()) return fail(preset.status(), 2);
      options.preset = *preset;
      options.num_layers = args->layers;
      options.seed = args->seed;
      options.max_shard_bytes = uint64_t(args->shard_gib * double(uint64_t(1) << 30));
      options.on_progress = [](const SyntheticProgress& p) {
        spdlog::info("wrote shard {}/{} ({:.2f} / {:.2f} GiB)", p.shard, p.num_shards,
                     double(p.bytes_done) / double(1 << 30), double(p.bytes_total) / double(1 << 30));
      };
      auto config = synthetic_config(options);
      if (!config.ok()) return fail(config.status(), 2);
      if (auto s = write_synthetic_checkpoint(*config, options, args->out); !s.ok()) return fail(s);
      if (args->verify) {
        auto ckpt = open_checkpoint(args->out);
        if (!ckpt.ok()) {
          std::fprintf(stderr, "error: the written checkpoint does not validate: %s\n",
                       ckpt.status().message().c_str());
          return 1;
        }
        spdlog::info("{}: {} tensors in {} shards, validated", args->out, ckpt->files.num_tensors(),
                     ckpt->files.num_shards());
      }
      return 0;
    };
  });
}

}  // namespace ds::cli
