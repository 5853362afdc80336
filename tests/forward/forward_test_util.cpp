// Helpers of the forward tests (see forward_test_util.h).
#include "forward_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "kernels/cpu/sampling.h"
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

void expect_backend_tokens_like_logits(const Forward& fwd) {
  const std::vector<int32_t> p0 = random_tokens(37, 81), p1 = random_tokens(50, 82);
  const std::vector<int32_t> next = random_tokens(12, 83);
  struct Row {
    std::vector<float> logits;
    std::vector<int32_t> argmax;
    std::vector<uint8_t> finite;
  };
  constexpr int kSteps = 7;  // the prefills, then 6 decode steps
  enum Mode { kLogits, kArgmax, kSample };
  auto token_wanted = [](int step, int seq) { return seq == 0 || step % 2 == 1; };
  // Sequence 0's draws: plain, top-p, top-k, min-p, all three, temperature 0, a large top-k.
  auto draw = [](int step, int seq) {
    cpu::RowSampling s;
    s.temperature = step == 5 ? 0.0 : 0.6 + 0.15 * step;
    s.top_p = step == 1 || step == 4 ? 0.85 : 1.0;
    s.top_k = step == 2 || step == 4 ? 7 : step == 6 ? 5000 : 0;
    s.min_p = step == 3 || step == 4 ? 0.02 : 0.0;
    s.uniform = double((step * 7 + seq * 3) % 11) / 11.0 + 0.031;
    return s;
  };
  auto run = [&](Mode mode) {
    std::vector<Row> rows;  // step-major, 2 per step
    SequenceState s[2] = {fwd.new_sequence(), fwd.new_sequence()};
    for (int step = 0; step < kSteps; ++step) {
      std::vector<SequenceChunk> batch(2);
      for (int q = 0; q < 2; ++q) {
        const std::vector<int32_t>& prompt = q == 0 ? p0 : p1;
        SequenceChunk& ch = batch[size_t(q)];
        ch.state = &s[q];
        ch.tokens = step == 0 ? std::span<const int32_t>(prompt)
                              : std::span<const int32_t>(next.data() + 2 * (step - 1) + q, 1);
        ch.logit_rows = {int64_t(ch.tokens.size()) - 1};
        if (token_wanted(step, q) && mode == kArgmax) ch.argmax_only = true;
        if (token_wanted(step, q) && mode == kSample) ch.backend_sample = draw(step, q);
      }
      std::vector<ChunkOutput> out;
      const Status st = fwd.run(batch, &out);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok() || out.size() != 2) break;
      for (const ChunkOutput& o : out) {
        rows.push_back({std::vector<float>(o.logits.begin(), o.logits.end()), o.argmax, o.finite});
      }
    }
    for (SequenceState& st : s) fwd.ops()->release_sequence(&st);
    return rows;
  };
  const std::vector<Row> full = run(kLogits), am = run(kArgmax), sm = run(kSample);
  ASSERT_EQ(full.size(), size_t(2 * kSteps));
  ASSERT_EQ(am.size(), full.size());
  ASSERT_EQ(sm.size(), full.size());
  const int64_t vocab = fwd.config().vocab_size;
  int draws_off_argmax = 0;
  for (size_t k = 0; k < full.size(); ++k) {
    const int step = int(k / 2), seq = int(k % 2);
    SCOPED_TRACE("step " + std::to_string(step) + " sequence " + std::to_string(seq));
    ASSERT_EQ(full[k].logits.size(), size_t(vocab));
    EXPECT_TRUE(full[k].argmax.empty());
    if (!token_wanted(step, seq)) {
      EXPECT_TRUE(am[k].argmax.empty());
      EXPECT_EQ(am[k].logits, full[k].logits);
      EXPECT_TRUE(sm[k].argmax.empty());
      EXPECT_EQ(sm[k].logits, full[k].logits);
      continue;
    }
    const std::vector<float>& l = full[k].logits;
    for (const Row* r : {&am[k], &sm[k]}) {
      EXPECT_TRUE(r->logits.empty());
      ASSERT_EQ(r->argmax.size(), 1u);
      ASSERT_EQ(r->finite.size(), 1u);
      EXPECT_EQ(r->finite[0], 1);
    }
    const int32_t first_max = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(am[k].argmax[0], first_max);
    int32_t want = -1;
    ASSERT_TRUE(cpu::sample_row(l.data(), vocab, draw(step, seq), &want));
    EXPECT_EQ(sm[k].argmax[0], want);
    draws_off_argmax += want != first_max ? 1 : 0;
  }
  // The draws are not all the argmax (else the comparison above could not tell them apart).
  EXPECT_GE(draws_off_argmax, 2);
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
