// Backend selection for the tools and the engine: `--device cpu` runs the CPU reference backend
// (CpuOps), `--device cuda` the CUDA backend (runtime/cuda/cuda_ops.h) when this build has it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // Profiling (CUDA): time the component ranges with events on the stream, graphs included
  // (CudaOpsOptions::component_events; Ops::take_component_times reads them).
  bool component_events = false;
  int64_t max_checkpoint_tokens = 0;    // speculative decoding: 1 + k; 0 = no speculation
  // CUDA: the fraction of the GPU's memory to fill; the sequence slots (at most max_sequences)
  // and the KV pages are what fits after the weights and the step arena (0 = max_sequences slots
  // with room for max_context tokens each).
  double gpu_memory_utilization = 0;
  // CUDA: > 0: the KV pages fill this many bytes instead (the engine's kv_cache_memory_gib).
  uint64_t kv_cache_bytes = 0;
  // CUDA: > 0: exactly this many KV pages (vLLM's --num-gpu-blocks-override; before the above).
  int64_t kv_pages = 0;
  // CUDA: the GPU (tensor-parallel rank r runs on GPU r: model_runner.h).
  int device_index = 0;
};

// True when this binary was built with the CUDA backend.
bool cuda_backend_available();

// "cpu" or "cuda". Errors: kInvalidArgument for another name or for "cuda" in a build without
// CUDA; whatever the CUDA backend's creation returns (no GPU, out of memory, hf numerics).
Result<std::unique_ptr<dsv4::Ops>> make_backend(const std::string& device,
                                                const dsv4::ModelWeights& weights,
                                                const dsv4::ForwardOptions& options,
                                                const BackendLimits& limits);

// What a device backend holds per-sequence state for, fixed at its creation: sequence slots
// (possibly fewer than BackendLimits::max_sequences, from gpu_memory_utilization), KV pages of
// kPageTokens (runtime/kv_cache.h) positions shared by the sequences, and the longest sequence.
// The engine sizes its KvCacheManager from it, so that its accounting admits exactly what the
// device can hold. The CPU backend stores each sequence's state in growable host vectors and
// has no fixed capacity: nullopt.
struct DeviceKvCapacity {
  int64_t slots = 0;
  int64_t pages = 0;
  int64_t max_context = 0;
};
std::optional<DeviceKvCapacity> device_kv_capacity(const dsv4::Ops& ops);

// One line for logs: "cpu" or "cuda (NVIDIA H200, weights 1.2 GiB, state ..., arena ...)".
std::string describe_backend(const dsv4::Ops& ops);

}  // namespace ds::runtime
