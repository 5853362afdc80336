// The embedded default model: the `tiny` synthetic checkpoint (every DeepSeek-V4 feature, real
// 129280-row vocabulary), generated deterministically on first use into a cache directory, so that
// `deepserve` works on a fresh machine with nothing downloaded.
#pragma once

#include <string>

#include "core/status.h"

namespace ds {

// Bumped whenever the generator's output changes, so that stale caches are regenerated.
inline constexpr const char* kEmbeddedModelVersion = "tiny-synthetic-v1";
inline constexpr uint64_t kEmbeddedModelSeed = 0;

// The cache root: $DEEPSERVE_CACHE_DIR, else $XDG_CACHE_HOME/deepserve, else
// $HOME/.cache/deepserve, else ./.cache/deepserve.
std::string cache_root();

// Returns the directory of the embedded model, generating it if it is missing or incomplete.
// Generation writes to a temporary sibling directory and renames it into place, so a crash or a
// concurrent process never leaves a half-written model behind.
Result<std::string> ensure_embedded_model();

}  // namespace ds
