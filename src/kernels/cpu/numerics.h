// Numerics modes of the engine (dsv4-model.md §2): `reference` (DeepSeek's reference inference
// code, QAT simulations included) and `hf` (huggingface/transformers semantics, for golden
// tests). NumericsFlags spells out the exact list of behaviours that differ; every kernel that
// depends on the mode takes the individual flag, never the mode, so a test can toggle one item.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ds::cpu {

enum class NumericsMode : uint8_t {
  kReference,  // default and the only serving mode
  kHf,         // transformers DeepseekV4: no QAT simulations, clamped shared expert
};

// The rows of the §2 table.
struct NumericsFlags {
  // §7.2 / §7.6: FP8 simulation (e4m3, ue8m0 per 64) of the window KV nope part and of the
  // attention compressor's entries.
  bool fp8_kv_simulation;
  // §7.6 / §7.7: Hadamard rotation + FP4 simulation (e2m1, ue8m0 per 32) of the indexer's
  // queries and keys (both are dropped together in hf mode).
  bool indexer_fp4_simulation;
  // §10.2: FP8 activation quantization (e4m3, ue8m0 per 128) in front of every FP8/FP4 linear.
  bool activation_quantization;
  // §8: SwiGLU clamp on the shared expert (the routed experts are clamped in both modes).
  bool shared_expert_clamp;
  // §8: epsilon added to the router's renormalization denominator.
  float router_renorm_epsilon;
};

constexpr NumericsFlags numerics_flags(NumericsMode mode) {
  if (mode == NumericsMode::kHf) {
    return NumericsFlags{.fp8_kv_simulation = false,
                         .indexer_fp4_simulation = false,
                         .activation_quantization = false,
                         .shared_expert_clamp = true,
                         .router_renorm_epsilon = 1e-20f};
  }
  return NumericsFlags{.fp8_kv_simulation = true,
                       .indexer_fp4_simulation = true,
                       .activation_quantization = true,
                       .shared_expert_clamp = false,
                       .router_renorm_epsilon = 0.0f};
}

constexpr std::string_view numerics_mode_name(NumericsMode mode) {
  return mode == NumericsMode::kHf ? "hf" : "reference";
}

constexpr std::optional<NumericsMode> numerics_mode_from_name(std::string_view name) {
  if (name == "reference") return NumericsMode::kReference;
  if (name == "hf") return NumericsMode::kHf;
  return std::nullopt;
}

}  // namespace ds::cpu
