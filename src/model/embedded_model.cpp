// Embedded default model: cache location and first-use generation.
#include "model/embedded_model.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/synthetic.h"

namespace ds {
namespace fs = std::filesystem;

std::string cache_root() {
  if (const char* d = std::getenv("DEEPSERVE_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "deepserve").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "deepserve").string();
  return (fs::current_path() / ".cache" / "deepserve").string();
}

Result<std::string> ensure_embedded_model() {
  const fs::path dir = fs::path(cache_root()) / kEmbeddedModelVersion;
  const fs::path marker = dir / ".complete";
  if (fs::exists(marker)) return dir.string();

  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  if (ec) return io_error(dir.parent_path().string() + ": cannot create cache directory: " + ec.message());
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  spdlog::info("generating the embedded tiny model into {} (first use only)", dir.string());
  SyntheticOptions options;
  options.preset = SyntheticPreset::kTiny;
  options.seed = kEmbeddedModelSeed;
  DS_ASSIGN_OR_RETURN(DeepSeekV4Config config, synthetic_config(options));
  DS_RETURN_IF_ERROR(write_synthetic_checkpoint(config, options, tmp.string()));
  std::ofstream(tmp / ".complete") << kEmbeddedModelVersion << "\n";
  fs::remove_all(dir, ec);  // an incomplete earlier attempt
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Another process may have finished first; use its copy when it is complete.
    fs::remove_all(tmp);
    if (fs::exists(marker)) return dir.string();
    return io_error(dir.string() + ": cannot move the generated model into place: " + ec.message());
  }
  return dir.string();
}

}  // namespace ds
