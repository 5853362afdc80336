// The embedded default model: the `tiny` DeepSeek-V4 geometry (every DeepSeek-V4 feature, real
// 129280-row vocabulary) with weights trained on the Brown corpus (models/tiny-brown, issue #13,
// docs/tiny_model.md). The compact weight artifact is linked into the binary and expanded on first
// use into a cache directory in the published checkpoint format, so that `deepserve` works on a
// fresh machine with nothing downloaded.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace ds {

// Bumped whenever the embedded weights or the checkpoint writer's output change, so that stale
// caches are regenerated.
inline constexpr const char* kEmbeddedModelVersion = "tiny-brown-v1";

// The linked-in weight artifact (a safetensors file for write_checkpoint_from_weights) and its
// SHA-256 as hex.
std::span<const uint8_t> embedded_weights();
const char* embedded_weights_sha256();

// The cache root: $DEEPSERVE_CACHE_DIR, else $XDG_CACHE_HOME/deepserve, else
// $HOME/.cache/deepserve, else ./.cache/deepserve.
std::string cache_root();

// Returns the directory of the embedded model, generating it if it is missing or incomplete.
// Generation writes to a temporary sibling directory and renames it into place, so a crash or a
// concurrent process never leaves a half-written model behind.
Result<std::string> ensure_embedded_model();

}  // namespace ds
