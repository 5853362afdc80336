// Fuzz target: config.json (reliability.md rule 24, row WF11) through ds::parse_config_json. An
// accepted config must pass validate_config() again, must write back (to_config_json) to text
// that parses to the same config, and the code that trusts it must run: expected_tensors(),
// compute_model_stats(), compute_kv_stats() and kv_bytes_for_context(). Validation bounds
// layers * experts (kMaxExpertLayerProduct) but the expected tensor list still has ~6 entries per
// expert per layer, so configs above kMaxFuzzExpertLayers are not expanded (too slow to fuzz,
// not a bug); DeepSeek-V4-Flash (44 layers x 256 experts) stays below the cap.
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "model/config.h"
#include "model/model_stats.h"
#include "model/tensor_spec.h"

namespace {
constexpr int64_t kMaxFuzzExpertLayers = int64_t(1) << 14;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = ds::parse_config_json(text, "fuzz config.json");
  ds::fuzz::note_result(parsed.status());
  if (!parsed.ok()) {
    DS_FUZZ_CHECK(!parsed.status().message().empty(), "an error without a message");
    return 0;
  }
  const ds::DeepSeekV4Config& config = *parsed;
  ds::Status valid = ds::validate_config(config, "fuzz");
  DS_FUZZ_CHECK(valid.ok(),
                "parse accepted a config that validate_config refuses: " + valid.to_string());
  DS_FUZZ_CHECK(config.compress_ratios.size() == size_t(config.num_layers_total()),
                "compress_ratios length is not the layer count");

  // The writer's promise: to_config_json(config) parses back to config.
  std::string written = ds::to_config_json(config);
  auto reparsed = ds::parse_config_json(written, "fuzz to_config_json");
  DS_FUZZ_CHECK(reparsed.ok(),
                "to_config_json output is refused: " + reparsed.status().to_string());
  DS_FUZZ_CHECK(*reparsed == config, "to_config_json output parses to a different config");

  for (int64_t i = 0; i < config.num_layers_total(); ++i) (void)config.layer_kind(i);
  if (config.num_layers_total() * config.n_routed_experts > kMaxFuzzExpertLayers) return 0;

  std::vector<ds::TensorSpec> tensors = ds::expected_tensors(config);
  DS_FUZZ_CHECK(!tensors.empty(), "no expected tensors");
  auto index = ds::index_tensor_specs(tensors);
  DS_FUZZ_CHECK(index.size() == tensors.size(), "expected_tensors has duplicate names");
  ds::ModelStats stats = ds::compute_model_stats(config, tensors);
  DS_FUZZ_CHECK(stats.num_tensors == tensors.size(), "num_tensors differs from the tensor list");
  for (auto format : {ds::IndexerKeyFormat::kFp8, ds::IndexerKeyFormat::kFp4}) {
    ds::KvCacheStats kv = ds::compute_kv_stats(config, format, 0);
    (void)ds::compute_kv_stats(config, format, 3);
    (void)ds::kv_bytes_for_context(config, config.max_position_embeddings, format);
    (void)ds::format_model_summary(config, stats, kv);
  }
  return 0;
}
