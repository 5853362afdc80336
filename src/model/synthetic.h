// Synthetic DeepSeek-V4 checkpoints (`deepserve make-checkpoint`): a directory in the published
// Hugging Face layout (config.json, model.safetensors.index.json, sharded safetensors with the
// checkpoint's names, dtypes, shapes and quantized formats) filled with deterministic random
// weights at sensible scales. Used for tests, benchmarks at real shapes, and the embedded default
// model. Nothing is downloaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "model/config.h"

namespace ds {

enum class SyntheticPreset : uint8_t {
  kTiny,   // dsv4-model.md §14 with the real 129280-row vocabulary
  kFlash,  // DeepSeek-V4-Flash geometry with any number of layers
};

struct SyntheticProgress {
  int shard = 0;            // 1-based
  int num_shards = 0;
  uint64_t bytes_done = 0;  // over all shards
  uint64_t bytes_total = 0;
};

struct SyntheticOptions {
  SyntheticPreset preset = SyntheticPreset::kTiny;
  int num_layers = -1;           // main layers; -1 = the preset's (tiny 4, flash 43)
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 0;  // 0 = the preset's (tiny 48 MiB so it is sharded, flash 4 GiB)
  int threads = 0;               // shards written in parallel; 0 = one per core
  // Called after each shard is written (shard = shards written so far; from the writing
  // threads, one call at a time).
  std::function<void(const SyntheticProgress&)> on_progress;
};

// Parses "tiny" / "flash".
Result<SyntheticPreset> parse_synthetic_preset(std::string_view name);

// The config a preset produces (validated).
Result<DeepSeekV4Config> synthetic_config(const SyntheticOptions& options);

// Writes a checkpoint for `config` into `out_dir` (created if missing; must not already hold a
// checkpoint). Deterministic: the same config, seed and shard size give the same bytes, and each
// tensor's values depend only on the seed and the tensor name.
//
// Value scales: linear weights ~N(0, 0.02) (then quantized to FP8 blocks / MXFP4 / NVFP4),
// norms 1 + N(0, 0.05), mHC `fn` N(0, 0.5/sqrt(fan_in)), `base` N(0, 0.1), `scale` 1 + N(0, 0.1),
// `attn_sink` N(0, 0.5), compressor `ape` N(0, 0.1), gate bias N(0, 0.01), tid2eid rows of
// distinct random experts. Small non-zero values (where HF's init uses exact zeros or ones) make
// every parameter observable in tests. Normal samples use a fast Irwin-Hall approximation (sum of
// four uniforms, variance-normalized) so that a 10 GB checkpoint is generated in seconds.
Status write_synthetic_checkpoint(const DeepSeekV4Config& config, const SyntheticOptions& options,
                                  const std::string& out_dir);

// Writes a checkpoint for `config` from trained master weights (`make-checkpoint --from`, the
// embedded model; docs/tiny_model.md). `weights_path` is one safetensors file keyed by the
// published names. For each expected tensor, in this order of preference:
//   - the file holds it with the stored dtype and shape: its bytes are copied (an FP8/MXFP4 weight
//     then must come with its stored scale);
//   - the file holds the weight as F32 or BF16 with the logical shape, or as F8_E4M3 with an
//     F8_E8M0 128x128 block `.scale` sibling: it is converted / quantized here with the
//     checkpoint's own quantizers (FP8 block, MXFP4, bf16 round to nearest even);
//   - `gate.tid2eid` may be U8 instead of I64.
// With a `vocab_ids` tensor (U32/I64 [V'] ascending token ids), `embed.weight` and `head.weight`
// hold those V' rows and optionally one more, last row that every other id gets (without it,
// every other row is exact zeros).
Status write_checkpoint_from_weights(const DeepSeekV4Config& config,
                                     const std::string& weights_path, const std::string& out_dir);

}  // namespace ds
