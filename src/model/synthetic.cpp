// Synthetic checkpoint writer: walks the expected tensor list of a config (tensor_spec.h), assigns
// tensors to shards (a weight and its scales stay in one shard), and streams each shard through
// SafetensorsWriter with per-tensor deterministic generators.
#include "model/synthetic.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/rng.h"
#include "model/checkpoint_files.h"
#include "model/safetensors_writer.h"
#include "model/tensor_spec.h"
#include "model/weight_format.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

// FNV-1a of the name mixed with the seed: each tensor's stream is independent of shard layout.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Approximately standard normal from one 64-bit draw: Irwin-Hall sum of four 16-bit uniforms,
// centred and scaled to unit variance (range ±3.46).
inline float fast_normal(Rng& rng) {
  uint64_t r = rng.next_u64();
  float s = float(r & 0xFFFF) + float((r >> 16) & 0xFFFF) + float((r >> 32) & 0xFFFF) +
            float(r >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a plain (unquantized) tensor is filled: value = mean + stddev * N(0, 1).
struct PlainRecipe {
  float mean = 0.0f;
  float stddev = 0.02f;
};

PlainRecipe plain_recipe(const TensorSpec& t) {
  const std::string& n = t.name;
  if (ends_with(n, "norm.weight")) return {1.0f, 0.05f};
  if (ends_with(n, "_fn")) {
    int64_t fan_in = t.shape.empty() ? 1 : t.shape.back();
    return {0.0f, 0.5f / std::sqrt(float(std::max<int64_t>(fan_in, 1)))};
  }
  if (ends_with(n, "_base")) return {0.0f, 0.1f};
  if (ends_with(n, "_scale") && t.dtype == DType::kF32 && t.component != TensorComponent::kRoutedExpert)
    return {1.0f, 0.1f};  // mHC scale
  if (ends_with(n, "attn_sink")) return {0.0f, 0.5f};
  if (ends_with(n, ".ape")) return {0.0f, 0.1f};
  if (ends_with(n, "gate.bias")) return {0.0f, 0.01f};
  return {0.0f, 0.02f};
}

// Fills plain floating-point tensors chunk by chunk (the writer calls it with consecutive offsets).
class PlainFiller {
 public:
  PlainFiller(const TensorSpec& t, uint64_t seed) : dtype_(t.dtype), recipe_(plain_recipe(t)), rng_(seed) {}
  void operator()(uint64_t offset, std::span<uint8_t> chunk) {
    (void)offset;
    size_t esize = dtype_size(dtype_);
    size_t n = chunk.size() / esize;
    for (size_t i = 0; i < n; ++i) {
      float v = recipe_.mean + recipe_.stddev * fast_normal(rng_);
      if (dtype_ == DType::kBF16) {
        uint16_t b = float_to_bf16(v);
        std::memcpy(chunk.data() + i * 2, &b, 2);
      } else {
        std::memcpy(chunk.data() + i * 4, &v, 4);
      }
    }
  }

 private:
  DType dtype_;
  PlainRecipe recipe_;
  Rng rng_;
};

// Streams random bytes (e2m1 code pairs of MXFP4/NVFP4 expert weights: every byte is valid).
class RandomBytesFiller {
 public:
  explicit RandomBytesFiller(uint64_t seed) : rng_(seed) {}
  void operator()(uint64_t, std::span<uint8_t> chunk) {
    for (size_t i = 0; i < chunk.size(); i += 8) {
      uint64_t r = rng_.next_u64();
      std::memcpy(chunk.data() + i, &r, std::min<size_t>(8, chunk.size() - i));
    }
  }

 private:
  Rng rng_;
};

// MXFP4 scales: e8m0 around 2^-7 (uniform codes have RMS 2.93, so the weight RMS is ~0.023),
// jittered by one binade so that every scale byte matters. NVFP4 per-16 scales: e4m3 in [0.5, 2).
class ScaleFiller {
 public:
  ScaleFiller(QuantRole role, uint64_t seed) : role_(role), rng_(seed) {}
  void operator()(uint64_t, std::span<uint8_t> chunk) {
    for (auto& b : chunk) {
      if (role_ == QuantRole::kMxfp4Scale) b = uint8_t(127 - 7 - 1 + int(rng_.below(3)));
      else b = float_to_e4m3(std::ldexp(1.0f + float(rng_.uniform()), -1 + int(rng_.below(2))));
    }
  }

 private:
  QuantRole role_;
  Rng rng_;
};

// An FP8 block weight ~N(0, 0.02) and its scale, computed together on first use (the scale
// depends on the block maxima) and released once both have been written.
struct Fp8Pair {
  std::vector<uint8_t> codes, scales;
  bool ready = false;
  Status status;  // a quantizer failure (only possible on a bug: shapes come from the spec)
  void ensure(const TensorSpec& w, const TensorSpec& s, uint64_t seed) {
    if (ready) return;
    const int64_t rows = w.shape[0], cols = w.shape[1];
    std::vector<float> values(size_t(rows * cols));
    Rng rng(seed);
    for (float& v : values) v = 0.02f * fast_normal(rng);
    codes.resize(size_t(rows * cols));
    scales.resize(s.stored_bytes());
    if (s.dtype == DType::kF32) {
      std::vector<float> f32(scales.size() / 4);
      status = quantize_fp8_block_f32(values.data(), rows, cols, codes.data(), f32.data());
      std::memcpy(scales.data(), f32.data(), scales.size());
    } else {
      status = quantize_fp8_block(values.data(), rows, cols, codes.data(), scales.data());
    }
    ready = true;
  }
};

// tid2eid [vocab, k] int64: each row k distinct experts.
std::vector<uint8_t> make_tid2eid(const TensorSpec& t, int64_t num_experts, uint64_t seed) {
  const int64_t rows = t.shape[0], k = t.shape[1];
  std::vector<int64_t> ids(size_t(rows * k));
  Rng rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      int64_t e;
      bool dup;
      do {
        e = int64_t(rng.below(uint64_t(num_experts)));
        dup = false;
        for (int64_t q = 0; q < j; ++q) dup |= ids[size_t(r * k + q)] == e;
      } while (dup);
      ids[size_t(r * k + j)] = e;
    }
  }
  std::vector<uint8_t> out(ids.size() * 8);
  std::memcpy(out.data(), ids.data(), out.size());
  return out;
}

struct ShardPlan {
  std::vector<size_t> tensors;  // indices into specs
  uint64_t bytes = 0;
};

}  // namespace

Result<SyntheticPreset> parse_synthetic_preset(std::string_view name) {
  if (name == "tiny") return SyntheticPreset::kTiny;
  if (name == "flash") return SyntheticPreset::kFlash;
  return invalid_argument("unknown preset '" + std::string(name) + "' (expected tiny or flash)");
}

Result<DeepSeekV4Config> synthetic_config(const SyntheticOptions& options) {
  DeepSeekV4Config config;
  if (options.preset == SyntheticPreset::kTiny) {
    config = tiny_config();
    if (options.num_layers >= 0 && options.num_layers != config.num_hidden_layers) {
      if (options.num_layers < 1) return invalid_argument("--layers must be at least 1");
      // Keep the tiny schedule's pattern: SWA first, then alternating CSA/HCA, MTP last.
      config.num_hidden_layers = options.num_layers;
      config.compress_ratios.clear();
      for (int l = 0; l < options.num_layers; ++l)
        config.compress_ratios.push_back(l == 0 ? 0 : (l % 2 == 1 ? 4 : 128));
      config.compress_ratios.push_back(0);
      config.num_hash_layers = std::min<int64_t>(config.num_hash_layers, options.num_layers);
    }
  } else {
    int layers = options.num_layers < 0 ? 43 : options.num_layers;
    if (layers < 1) return invalid_argument("--layers must be at least 1");
    config = flash_config(layers);
  }
  DS_RETURN_IF_ERROR(validate_config(config, "synthetic config"));
  return config;
}

Status write_synthetic_checkpoint(const DeepSeekV4Config& config, const SyntheticOptions& options,
                                  const std::string& out_dir) {
  DS_RETURN_IF_ERROR(validate_config(config, "synthetic config"));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error(out_dir + ": cannot create directory: " + ec.message());
  if (fs::exists(fs::path(out_dir) / kShardIndexFileName) ||
      fs::exists(fs::path(out_dir) / "config.json"))
    return failed_precondition(out_dir + ": already holds a checkpoint; choose an empty directory");

  std::vector<TensorSpec> specs = expected_tensors(config);
  specs.erase(std::remove_if(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.optional; }),
              specs.end());

  // Group each quantized weight with its scale siblings (they are listed right after it).
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].is_scale && !groups.empty()) groups.back().push_back(i);
    else groups.push_back({i});
  }
  uint64_t max_shard = options.max_shard_bytes;
  if (max_shard == 0)
    max_shard = options.preset == SyntheticPreset::kTiny ? (uint64_t(48) << 20) : (uint64_t(4) << 30);
  std::vector<ShardPlan> shards(1);
  for (const auto& grp : groups) {
    uint64_t bytes = 0;
    for (size_t i : grp) bytes += specs[i].stored_bytes();
    if (shards.back().bytes > 0 && shards.back().bytes + bytes > max_shard) shards.emplace_back();
    for (size_t i : grp) shards.back().tensors.push_back(i);
    shards.back().bytes += bytes;
  }
  uint64_t total = 0;
  for (const auto& s : shards) total += s.bytes;

  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t done = 0;
  const int num_shards = int(shards.size());
  for (int si = 0; si < num_shards; ++si) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", si + 1, num_shards);
    SafetensorsWriter writer;
    DS_RETURN_IF_ERROR(writer.set_metadata("format", "pt"));
    std::shared_ptr<Fp8Pair> pending_fp8;
    std::vector<std::shared_ptr<Fp8Pair>> fp8_pairs;
    TensorSpec pending_fp8_weight;
    uint64_t pending_fp8_seed = 0;
    for (size_t idx : shards[size_t(si)].tensors) {
      const TensorSpec& t = specs[idx];
      weight_map[t.name] = fname;
      const uint64_t seed = tensor_seed(options.seed, t.name);
      std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      SafetensorsFillFn fill;
      switch (t.role) {
        case QuantRole::kPlain:
          if (t.dtype == DType::kI64) {
            auto bytes = std::make_shared<std::vector<uint8_t>>();
            int64_t experts = config.n_routed_experts;
            TensorSpec spec = t;
            fill = [bytes, spec, experts, seed](uint64_t off, std::span<uint8_t> c) {
              if (bytes->empty()) *bytes = make_tid2eid(spec, experts, seed);
              std::memcpy(c.data(), bytes->data() + off, c.size());
            };
          } else if (t.dtype == DType::kBF16 || t.dtype == DType::kF32) {
            auto filler = std::make_shared<PlainFiller>(t, seed);
            fill = [filler](uint64_t off, std::span<uint8_t> c) { (*filler)(off, c); };
          }
          break;
        case QuantRole::kMxfp4Weight:
        case QuantRole::kNvfp4Weight: {
          auto filler = std::make_shared<RandomBytesFiller>(seed);
          fill = [filler](uint64_t off, std::span<uint8_t> c) { (*filler)(off, c); };
          break;
        }
        case QuantRole::kMxfp4Scale:
        case QuantRole::kNvfp4Scale: {
          auto filler = std::make_shared<ScaleFiller>(t.role, seed);
          fill = [filler](uint64_t off, std::span<uint8_t> c) { (*filler)(off, c); };
          break;
        }
        case QuantRole::kNvfp4GlobalScale:
        case QuantRole::kNvfp4InputScale: {
          float v = t.role == QuantRole::kNvfp4GlobalScale ? 0.02f / 2.93f : 1.0f;
          fill = [v](uint64_t, std::span<uint8_t> c) { std::memcpy(c.data(), &v, 4); };
          break;
        }
        case QuantRole::kFp8Weight: {
          // The scale tensor is listed right after its weight (tensor_spec.h).
          if (idx + 1 >= specs.size() || !specs[idx + 1].is_scale)
            return internal_error("synthetic: no scale after " + t.name);
          pending_fp8 = std::make_shared<Fp8Pair>();
          fp8_pairs.push_back(pending_fp8);
          auto pair = pending_fp8;
          TensorSpec w = t, sc = specs[idx + 1];
          fill = [pair, w, sc, seed](uint64_t off, std::span<uint8_t> c) {
            pair->ensure(w, sc, seed);
            std::memcpy(c.data(), pair->codes.data() + off, c.size());
          };
          pending_fp8_weight = t;
          pending_fp8_seed = seed;
          break;
        }
        case QuantRole::kFp8Scale:
        case QuantRole::kFp8ScaleF32: {
          if (!pending_fp8) return internal_error("synthetic: scale without weight: " + t.name);
          auto pair = pending_fp8;
          TensorSpec w = pending_fp8_weight, sc = t;
          uint64_t wseed = pending_fp8_seed;
          fill = [pair, w, sc, wseed](uint64_t off, std::span<uint8_t> c) {
            pair->ensure(w, sc, wseed);
            std::memcpy(c.data(), pair->scales.data() + off, c.size());
            if (off + c.size() == pair->scales.size()) {  // both written: free the memory
              std::vector<uint8_t>().swap(pair->codes);
              std::vector<uint8_t>().swap(pair->scales);
            }
          };
          pending_fp8.reset();
          break;
        }
      }
      if (!fill) return internal_error("synthetic: no generator for " + describe(t));
      DS_RETURN_IF_ERROR(writer.add(t.name, t.dtype, shape, std::move(fill)));
    }
    DS_RETURN_IF_ERROR(writer.write((fs::path(out_dir) / fname).string()));
    for (const auto& pair : fp8_pairs) DS_RETURN_IF_ERROR(pair->status);
    done += shards[size_t(si)].bytes;
    if (options.on_progress) options.on_progress({si + 1, num_shards, done, total});
  }

  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  {
    std::ofstream f(fs::path(out_dir) / kShardIndexFileName);
    f << index.dump(2) << "\n";
    if (!f) return io_error(out_dir + ": cannot write " + std::string(kShardIndexFileName));
  }
  {
    std::ofstream f(fs::path(out_dir) / "config.json");
    f << to_config_json(config);
    if (!f) return io_error(out_dir + ": cannot write config.json");
  }
  return ok_status();
}

}  // namespace ds
