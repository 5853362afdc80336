// Synthetic checkpoint writer: walks the expected tensor list of a config (tensor_spec.h), assigns
// tensors to shards (a weight and its scales stay in one shard), and streams each shard through
// SafetensorsWriter with per-tensor deterministic generators.
#include "model/synthetic.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/rng.h"
#include "model/checkpoint_files.h"
#include "model/safetensors.h"
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
  const int num_shards = int(shards.size());
  auto shard_name = [num_shards](int si) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", si + 1, num_shards);
    return std::string(fname);
  };
  for (int si = 0; si < num_shards; ++si) {
    for (size_t idx : shards[size_t(si)].tensors) weight_map[specs[idx].name] = shard_name(si);
  }
  // Shards are independent (each tensor's values depend only on the seed and its name), so they
  // are generated and written in parallel, one shard per thread at a time.
  std::mutex progress_mu;
  uint64_t done = 0;
  int shards_done = 0;
  auto write_shard = [&](int si) -> Status {
    const std::string fname = shard_name(si);
    SafetensorsWriter writer;
    DS_RETURN_IF_ERROR(writer.set_metadata("format", "pt"));
    std::shared_ptr<Fp8Pair> pending_fp8;
    std::vector<std::shared_ptr<Fp8Pair>> fp8_pairs;
    TensorSpec pending_fp8_weight;
    uint64_t pending_fp8_seed = 0;
    for (size_t idx : shards[size_t(si)].tensors) {
      const TensorSpec& t = specs[idx];
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
    std::lock_guard<std::mutex> lock(progress_mu);
    done += shards[size_t(si)].bytes;
    ++shards_done;
    if (options.on_progress) options.on_progress({shards_done, num_shards, done, total});
    return ok_status();
  };
  const int threads = std::clamp(options.threads > 0 ? options.threads
                                                     : int(std::thread::hardware_concurrency()),
                                 1, num_shards);
  std::atomic<int> next{0};
  std::vector<Status> results(static_cast<size_t>(num_shards));
  auto worker = [&] {
    for (int si = next++; si < num_shards; si = next++) results[size_t(si)] = write_shard(si);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const Status& st : results) DS_RETURN_IF_ERROR(st);

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

namespace {

// Master weights of `make-checkpoint --from` (see synthetic.h).
class MasterWeights {
 public:
  explicit MasterWeights(SafetensorsFile file) : file_(std::move(file)) {}

  const TensorInfo* find(const std::string& name) const { return file_.find(name); }

  Result<std::vector<uint8_t>> bytes(const TensorInfo& t) const {
    std::vector<uint8_t> out(t.nbytes);
    DS_RETURN_IF_ERROR(file_.read(t, 0, out));
    return out;
  }

  // The tensor `name` as fp32 values of shape [rows, cols] (F32, BF16, or F8_E4M3 with a 128x128
  // block `.scale`).
  Result<std::vector<float>> f32(const std::string& name, int64_t rows, int64_t cols) const {
    const TensorInfo* t = find(name);
    if (!t) return not_found("--from: no tensor " + name);
    if (int64_t(t->numel) != rows * cols)
      return invalid_argument("--from: " + name + " has " + std::to_string(t->numel) +
                              " elements, expected " + std::to_string(rows * cols));
    DS_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, bytes(*t));
    std::vector<float> out(size_t(rows * cols));
    switch (t->dtype) {
      case DType::kF32:
        std::memcpy(out.data(), raw.data(), raw.size());
        break;
      case DType::kBF16:
        for (size_t i = 0; i < out.size(); ++i) {
          uint16_t b;
          std::memcpy(&b, raw.data() + 2 * i, 2);
          out[i] = bf16_to_float(b);
        }
        break;
      case DType::kF8E4M3: {
        const std::string sname = name.substr(0, name.size() - std::string(".weight").size()) +
                                  ".scale";
        const TensorInfo* st = find(sname);
        if (!ends_with(name, ".weight") || !st || st->dtype != DType::kF8E8M0)
          return invalid_argument("--from: " + name + " is F8_E4M3 without an F8_E8M0 " + sname);
        DS_ASSIGN_OR_RETURN(std::vector<uint8_t> scales, bytes(*st));
        const int64_t want = ((rows + 127) / 128) * ((cols + 127) / 128);
        if (int64_t(scales.size()) != want)
          return invalid_argument("--from: " + sname + " has the wrong size");
        Fp8BlockWeight w{raw.data(), scales.data(), rows, cols};
        DS_RETURN_IF_ERROR(dequantize_fp8_block(w, out.data()));
        break;
      }
      default:
        return invalid_argument("--from: " + name + " must be F32, BF16 or F8_E4M3");
    }
    return out;
  }

 private:
  SafetensorsFile file_;
};

// Reads the vocab_ids tensor (empty when absent).
Result<std::vector<int64_t>> read_vocab_ids(const MasterWeights& m, int64_t vocab) {
  std::vector<int64_t> ids;
  const TensorInfo* t = m.find("vocab_ids");
  if (!t) return ids;
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, m.bytes(*t));
  for (uint64_t i = 0; i < t->numel; ++i) {
    int64_t v;
    if (t->dtype == DType::kU32) {
      uint32_t u;
      std::memcpy(&u, raw.data() + 4 * i, 4);
      v = u;
    } else if (t->dtype == DType::kI64) {
      std::memcpy(&v, raw.data() + 8 * i, 8);
    } else {
      return invalid_argument("--from: vocab_ids must be U32 or I64");
    }
    if (v < 0 || v >= vocab || (!ids.empty() && v <= ids.back()))
      return invalid_argument("--from: vocab_ids must be ascending ids below vocab_size");
    ids.push_back(v);
  }
  return ids;
}

}  // namespace

Status write_checkpoint_from_weights(const DeepSeekV4Config& config,
                                     const std::string& weights_path, const std::string& out_dir) {
  DS_RETURN_IF_ERROR(validate_config(config, "checkpoint config"));
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(weights_path));
  MasterWeights master(std::move(file));
  DS_ASSIGN_OR_RETURN(std::vector<int64_t> vocab_ids, read_vocab_ids(master, config.vocab_size));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error(out_dir + ": cannot create directory: " + ec.message());
  if (fs::exists(fs::path(out_dir) / kShardIndexFileName) ||
      fs::exists(fs::path(out_dir) / "config.json"))
    return failed_precondition(out_dir + ": already holds a checkpoint; choose an empty directory");

  std::vector<TensorSpec> specs = expected_tensors(config);
  specs.erase(std::remove_if(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.optional; }),
              specs.end());
  const std::string fname = "model-00001-of-00001.safetensors";
  SafetensorsWriter writer;
  DS_RETURN_IF_ERROR(writer.set_metadata("format", "pt"));
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  std::map<std::string, std::vector<uint8_t>> pending_scales;  // scale name -> bytes
  for (const TensorSpec& t : specs) {
    std::vector<uint8_t> out;
    const TensorInfo* stored = master.find(t.name);
    const bool stored_as_is =
        stored && stored->dtype == t.dtype &&
        std::equal(stored->shape.begin(), stored->shape.end(), t.shape.begin(), t.shape.end());
    if (t.is_scale && pending_scales.count(t.name)) {
      out = std::move(pending_scales[t.name]);
      pending_scales.erase(t.name);
    } else if (stored_as_is) {
      DS_ASSIGN_OR_RETURN(out, master.bytes(*stored));
    } else if (t.dtype == DType::kI64) {  // tid2eid
      if (!stored || stored->dtype != DType::kU8 || stored->numel != uint64_t(t.numel()))
        return invalid_argument("--from: " + t.name + " must be I64 or U8 " +
                                describe(t));
      DS_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, master.bytes(*stored));
      out.resize(raw.size() * 8);
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] >= config.n_routed_experts)
          return invalid_argument("--from: " + t.name + " names an expert out of range");
        const int64_t v = raw[i];
        std::memcpy(out.data() + 8 * i, &v, 8);
      }
    } else if (t.role == QuantRole::kPlain || t.role == QuantRole::kFp8Weight ||
               t.role == QuantRole::kMxfp4Weight) {
      const int64_t rows = t.logical.size() == 2 ? t.logical[0] : 1;
      const int64_t cols = t.logical.empty() ? 1 : t.logical.back();
      std::vector<float> values;
      const bool row_subset =
          !vocab_ids.empty() && (t.name == "embed.weight" || t.name == "head.weight");
      if (row_subset) {
        // n rows (others zero) or n + 1 (the last fills every id not in vocab_ids).
        const TensorInfo* info = master.find(t.name);
        const int64_t n = int64_t(vocab_ids.size());
        const bool shared_row = info && !info->shape.empty() && int64_t(info->shape[0]) == n + 1;
        DS_ASSIGN_OR_RETURN(std::vector<float> sub, master.f32(t.name, n + shared_row, cols));
        values.assign(size_t(rows * cols), 0.0f);
        if (shared_row) {
          for (int64_t r = 0; r < rows; ++r)
            std::copy(sub.end() - cols, sub.end(), values.begin() + r * cols);
        }
        for (size_t r = 0; r < vocab_ids.size(); ++r)
          std::copy(sub.begin() + int64_t(r) * cols, sub.begin() + int64_t(r + 1) * cols,
                    values.begin() + vocab_ids[r] * cols);
      } else {
        DS_ASSIGN_OR_RETURN(values, master.f32(t.name, rows, cols));
      }
      if (t.role == QuantRole::kFp8Weight) {
        out.resize(size_t(rows * cols));
        std::vector<uint8_t> scales(size_t(((rows + 127) / 128) * ((cols + 127) / 128)));
        DS_RETURN_IF_ERROR(quantize_fp8_block(values.data(), rows, cols, out.data(), scales.data()));
        pending_scales[t.pair] = std::move(scales);
      } else if (t.role == QuantRole::kMxfp4Weight) {
        out.resize(size_t(rows * cols / 2));
        std::vector<uint8_t> scales(size_t(rows * cols / kMxfp4Block));
        DS_RETURN_IF_ERROR(quantize_mxfp4(values.data(), rows, cols, out.data(), scales.data()));
        pending_scales[t.pair] = std::move(scales);
      } else if (t.dtype == DType::kBF16) {
        out.resize(values.size() * 2);
        for (size_t i = 0; i < values.size(); ++i) {
          const uint16_t b = float_to_bf16(values[i]);
          std::memcpy(out.data() + 2 * i, &b, 2);
        }
      } else if (t.dtype == DType::kF32) {
        out.resize(values.size() * 4);
        std::memcpy(out.data(), values.data(), out.size());
      } else {
        return invalid_argument("--from: cannot produce " + describe(t));
      }
    } else {
      return invalid_argument("--from: no source for " + describe(t));
    }
    if (out.size() != t.stored_bytes())
      return internal_error("--from: " + t.name + " produced the wrong byte size");
    std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
    total += out.size();
    weight_map[t.name] = fname;
    DS_RETURN_IF_ERROR(writer.add(t.name, t.dtype, shape, std::span<const uint8_t>(out)));
  }
  DS_RETURN_IF_ERROR(writer.write((fs::path(out_dir) / fname).string()));
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
