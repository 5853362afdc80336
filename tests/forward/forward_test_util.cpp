// Helpers of the forward tests (see forward_test_util.h).
#include "forward_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "model/deepseek_v4/cpu_ops.h"
#include "model/deepseek_v4/forwarding_ops.h"
#include "model/synthetic.h"

namespace ds::dsv4::test {

DeepSeekV4Config tiny_small_vocab_config() {
  DeepSeekV4Config c = tiny_config();
  c.vocab_size = kTinyVocab;
  return c;
}

Status write_tiny_checkpoint(const std::string& dir) {
  SyntheticOptions options;
  options.preset = SyntheticPreset::kTiny;
  options.seed = kTinySeed;
  return write_synthetic_checkpoint(tiny_small_vocab_config(), options, dir);
}

const ModelWeights& tiny_model() {
  static std::unique_ptr<ModelWeights> model = [] {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("ds_test_forward_" + std::to_string(::getpid())))
            .string();
    std::filesystem::remove_all(dir);
    Status st = write_tiny_checkpoint(dir);
    if (!st.ok()) {
      ADD_FAILURE() << st.to_string();
      std::abort();
    }
    auto loaded = ModelWeights::load(dir);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().to_string();
      std::abort();
    }
    // The mapping keeps the files' pages; the directory entries can go.
    std::filesystem::remove_all(dir);
    return std::move(loaded).value();
  }();
  return *model;
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (auto& t : out) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    t = int32_t(2 + s % uint64_t(vocab - 2));
  }
  return out;
}

std::vector<float> run_chunked(const Forward& fwd, const std::vector<int32_t>& tokens,
                               const std::vector<int64_t>& chunk_sizes) {
  const int64_t vocab = fwd.config().vocab_size;
  SequenceState state = fwd.new_sequence();
  std::vector<float> logits;
  logits.reserve(tokens.size() * size_t(vocab));
  size_t k = 0;
  for (int64_t pos = 0; pos < int64_t(tokens.size());) {
    const int64_t n =
        std::min<int64_t>(chunk_sizes[k++ % chunk_sizes.size()], int64_t(tokens.size()) - pos);
    SequenceChunk chunk;
    chunk.state = &state;
    chunk.tokens = std::span<const int32_t>(tokens.data() + pos, size_t(n));
    for (int64_t r = 0; r < n; ++r) chunk.logit_rows.push_back(r);
    std::vector<ChunkOutput> out;
    Status st = fwd.run(std::span<SequenceChunk>(&chunk, 1), &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return {};
    logits.insert(logits.end(), out[0].logits.begin(), out[0].logits.end());
    pos += n;
  }
  return logits;
}

namespace {

// The CPU backend lives in a base constructed before ForwardingOps, which points at it.
struct CpuOpsHolder {
  explicit CpuOpsHolder(const DeepSeekV4Config& config) : cpu_(config) {}
  CpuOps cpu_;
};

class UlpPerturbedOps final : private CpuOpsHolder, public ForwardingOps {
 public:
  UlpPerturbedOps(const DeepSeekV4Config& config, uint64_t seed)
      : CpuOpsHolder(config), ForwardingOps(&cpu_), state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  void linear(const float* x, int64_t rows, const cpu::LinearWeight& w, bool q, float* y,
              bool round_output) override {
    cpu_.linear(x, rows, w, q, y, false);
    for (int64_t i = 0; i < rows * w.out_features; ++i) {
      state_ ^= state_ << 13;
      state_ ^= state_ >> 7;
      state_ ^= state_ << 17;
      y[i] = std::nextafter(y[i], (state_ & 1) ? INFINITY : -INFINITY);
    }
    if (round_output) cpu_.round_bf16(y, rows * w.out_features);  // after, as the forward did
  }

 private:
  uint64_t state_;
};

}  // namespace

std::unique_ptr<Ops> make_ulp_perturbed_cpu_ops(const DeepSeekV4Config& config, uint64_t seed) {
  return std::make_unique<UlpPerturbedOps>(config, seed);
}

Divergence divergence(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  Divergence d;
  const int64_t rows = int64_t(b.size()) / vocab;
  if (rows == 0 || a.size() != b.size()) return {INFINITY, 0};
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    double diff = 0, scale = 1e-6;
    for (int64_t v = 0; v < vocab; ++v) {
      diff = std::isfinite(x[v]) ? std::max(diff, double(std::fabs(x[v] - y[v]))) : INFINITY;
      scale = std::max(scale, double(std::fabs(y[v])));
    }
    d.mean_rel += diff / scale / double(rows);
    same += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
  }
  d.argmax = double(same) / double(rows);
  return d;
}

}  // namespace ds::dsv4::test
