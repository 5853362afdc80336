// Backend selection for the tools and the engine: `--device cpu` runs the CPU reference backend
// (CpuOps), `--device cuda` the CUDA backend (runtime/cuda/cuda_ops.h) when this build has it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/ops.h"

namespace ds::runtime {

// Limits a device backend sizes its memory for (ignored by the CPU backend).
struct BackendLimits {
  int64_t max_sequences = 8;            // live sequences
  int64_t max_context = 0;              // tokens per sequence; 0 = the model's maximum
  int64_t max_step_tokens = 512;        // tokens of one forward call
  int64_t max_logit_rows = 0;           // 0 = max_step_tokens
  bool synchronous_components = false;  // profiling: component ranges measure device time
  int64_t max_checkpoint_tokens = 0;    // speculative decoding: 1 + k; 0 = no speculation
  // CUDA: the fraction of the GPU's memory to fill; the sequence slots are what fits after the
  // weights and the step arena, at most max_sequences (0 = exactly max_sequences).
  double gpu_memory_utilization = 0;
};

// True when this binary was built with the CUDA backend.
bool cuda_backend_available();

// "cpu" or "cuda". Errors: kInvalidArgument for another name or for "cuda" in a build without
// CUDA; whatever the CUDA backend's creation returns (no GPU, out of memory, hf numerics).
Result<std::unique_ptr<dsv4::Ops>> make_backend(const std::string& device,
                                                const dsv4::ModelWeights& weights,
                                                const dsv4::ForwardOptions& options,
                                                const BackendLimits& limits);

// Live sequences the backend holds state for: the CUDA backend's slots (possibly fewer than
// BackendLimits::max_sequences, from gpu_memory_utilization); -1 for the CPU backend (no limit).
int64_t backend_max_sequences(const dsv4::Ops& ops);

// One line for logs: "cpu" or "cuda (NVIDIA H200, weights 1.2 GiB, state ..., arena ...)".
std::string describe_backend(const dsv4::Ops& ops);

}  // namespace ds::runtime
