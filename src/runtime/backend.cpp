// Backend selection (see backend.h).
#include "runtime/backend.h"

#include <cstdio>

#include "model/deepseek_v4/cpu_ops.h"
#if DS_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_ops.h"
#include "runtime/kv_cache.h"
#endif

namespace ds::runtime {

bool cuda_backend_available() {
  return DS_HAVE_CUDA_BACKEND != 0;
}

Result<std::unique_ptr<dsv4::Ops>> make_backend(const std::string& device,
                                                const dsv4::ModelWeights& weights,
                                                const dsv4::ForwardOptions& options,
                                                const BackendLimits& limits) {
  if (device == "cpu") {
    return std::unique_ptr<dsv4::Ops>(std::make_unique<dsv4::CpuOps>(weights.config()));
  }
  if (device != "cuda") {
    return invalid_argument("unknown device \"" + device + "\" (expected cpu or cuda)");
  }
#if DS_HAVE_CUDA_BACKEND
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return failed_precondition("--device cuda: no CUDA GPU is visible to this process");
  }
  if (limits.device_index < 0 || limits.device_index >= n) {
    return invalid_argument("--device cuda: GPU " + std::to_string(limits.device_index) +
                            " is not visible (" + std::to_string(n) + " visible)");
  }
  CudaOpsOptions o;
  o.device = limits.device_index;
  o.max_sequences = limits.max_sequences;
  o.max_context = limits.max_context;
  o.max_step_tokens = limits.max_step_tokens;
  o.max_logit_rows = limits.max_logit_rows;
  o.synchronous_components = limits.synchronous_components;
  o.component_events = limits.component_events;
  o.max_checkpoint_tokens = limits.max_checkpoint_tokens;
  o.gpu_memory_utilization = limits.gpu_memory_utilization;
  o.kv_cache_bytes = limits.kv_cache_bytes;
  o.kv_pages = limits.kv_pages;
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CudaOps> ops, CudaOps::create(weights, options, o));
  return std::unique_ptr<dsv4::Ops>(std::move(ops));
#else
  return invalid_argument(
      "--device cuda: this deepserve was built without CUDA (configure with the cuda-release "
      "preset on a machine with the CUDA toolkit)");
#endif
}

std::optional<DeviceKvCapacity> device_kv_capacity(const dsv4::Ops& ops) {
#if DS_HAVE_CUDA_BACKEND
  if (const auto* cuda = dynamic_cast<const CudaOps*>(&ops)) {
    return DeviceKvCapacity{cuda->options().max_sequences, cuda->kv_pages_total(),
                            cuda->options().max_context};
  }
#endif
  (void)ops;
  return std::nullopt;
}

std::string describe_backend(const dsv4::Ops& ops) {
#if DS_HAVE_CUDA_BACKEND
  if (const auto* cuda = dynamic_cast<const CudaOps*>(&ops)) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, cuda->options().device) != cudaSuccess) prop.name[0] = 0;
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "cuda (%s; weights %.2f GiB, sequence state %.2f GiB: %lld KV pages of "
                  "%lld tokens and %lld sequence slots, up to %lld tokens per sequence; step "
                  "arena %.2f GiB)",
                  prop.name, double(cuda->weight_bytes()) / (1 << 30),
                  double(cuda->state_bytes()) / (1 << 30), (long long)cuda->kv_pages_total(),
                  (long long)kPageTokens, (long long)cuda->options().max_sequences,
                  (long long)cuda->options().max_context, double(cuda->arena_bytes()) / (1 << 30));
    return buf;
  }
#endif
  return "cpu";
}

}  // namespace ds::runtime
