// The text report of `deepserve inspect`: architecture, parameters by component, bytes by dtype,
// resident weight memory, KV-cache bytes per token by cache kind and the GPUs the weights need,
// all computed from config.json (model_stats.h).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace ds {

struct InspectOptions {
  double gpu_memory_gib = 141.0;  // one GPU's memory, for the GPU count (H200)
  int64_t context_tokens = 32768; // a context length to show the per-sequence KV bytes at
};

std::string format_inspect_report(const DeepSeekV4Config& config, const InspectOptions& options);

}  // namespace ds
