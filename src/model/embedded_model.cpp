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
  spdlog::info("expanding the embedded tiny model into {} (first use only)", dir.string());
  SyntheticOptions options;
  options.preset = SyntheticPreset::kTiny;
  DS_ASSIGN_OR_RETURN(DeepSeekV4Config config, synthetic_config(options));
  // The checkpoint writer reads a file: the linked-in artifact goes next to the temporary
  // directory first.
  const fs::path artifact = tmp.string() + ".weights.safetensors";
  {
    const std::span<const uint8_t> bytes = embedded_weights();
    std::ofstream out(artifact, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    out.close();
    if (!out) {
      fs::remove(artifact, ec);
      return io_error(artifact.string() + ": cannot write the embedded weights");
    }
  }
  const Status written = write_checkpoint_from_weights(config, artifact.string(), tmp.string());
  fs::remove(artifact, ec);
  if (!written.ok()) {
    fs::remove_all(tmp, ec);
    return written;
  }
  std::ofstream(tmp / ".complete") << kEmbeddedModelVersion << "\n";
  // Another process (tests run in parallel) may have finished first: a complete copy in place is
  // used as it is, never removed, since that process may be reading it. Only an incomplete
  // leftover of a crashed attempt is replaced.
  for (int attempt = 0; attempt < 2; ++attempt) {
    fs::rename(tmp, dir, ec);
    if (!ec) return dir.string();
    if (fs::exists(marker)) {
      fs::remove_all(tmp, ec);
      return dir.string();
    }
    fs::remove_all(dir, ec);
  }
  fs::remove_all(tmp, ec);
  return io_error(dir.string() + ": cannot move the expanded model into place");
}

}  // namespace ds
