// `deepserve inspect [DIR]`: architecture, parameter counts by component, bytes by dtype, resident
// weight memory, KV bytes per token and GPUs needed, from config.json alone; when weights are
// present, every shard header is validated and the tensor set checked against the config.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "commands.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/embedded_model.h"
#include "model/inspect_report.h"

namespace ds::cli {
namespace fs = std::filesystem;

namespace {

bool has_weights(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

}  // namespace

void register_inspect(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string dir;
    double gpu_memory_gib = 141.0;
    bool full_scan = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Describe a DeepSeek-V4 checkpoint directory (config.json alone is enough) and "
                 "validate its weights when present");
  cmd->add_option("dir", args->dir, "checkpoint directory (default: the embedded tiny model)")
      ->envname("DEEPSERVE_MODEL");
  cmd->add_option("--gpu-memory-gib", args->gpu_memory_gib,
                  "memory of one GPU in GiB, for the GPU count (default 141: H200)")
      ->envname("DEEPSERVE_GPU_MEMORY_GIB")->check(CLI::Range(1.0, 100000.0));
  cmd->add_flag("--full-scan", args->full_scan,
                "also read every weight and refuse NaN/Inf values and NaN scale codes")
      ->envname("DEEPSERVE_FULL_SCAN");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      std::string dir = args->dir;
      if (dir.empty()) {
        auto embedded = ensure_embedded_model();
        if (!embedded.ok()) return fail(embedded.status());
        dir = *embedded;
      }
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) return fail(not_found(dir + ": not a directory"));
      auto config = load_config_file(fs::path(dir) / "config.json");
      if (!config.ok()) return fail(config.status());
      InspectOptions report;
      report.gpu_memory_gib = args->gpu_memory_gib;
      std::printf("%s\n%s", dir.c_str(), format_inspect_report(*config, report).c_str());
      if (!has_weights(dir)) {
        std::printf("weights: none in this directory (config.json only)\n");
        return 0;
      }
      auto files = CheckpointFiles::open(dir);
      if (!files.ok()) return fail(files.status());
      CheckpointValidateOptions options;
      options.full_scan = args->full_scan;
      uint64_t last_report = 0;
      options.on_scan_progress = [&last_report](uint64_t done, uint64_t total) {
        if (done - last_report >= (uint64_t(1) << 30) || done == total) {
          spdlog::info("scanned {:.1f} / {:.1f} GiB", double(done) / double(1 << 30), double(total) / double(1 << 30));
          last_report = done;
        }
      };
      if (auto s = validate_checkpoint(*files, *config, options); !s.ok()) return fail(s);
      std::printf("weights: %zu tensors in %zu shards, %.2f GiB; headers and tensor set valid%s\n",
                  files->num_tensors(), files->num_shards(),
                  double(files->total_bytes()) / double(uint64_t(1) << 30),
                  args->full_scan ? "; every value finite" : "");
      return 0;
    };
  });
}

}  // namespace ds::cli
