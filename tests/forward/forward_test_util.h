// Shared helpers of the forward tests: the tiny model of dsv4-model.md §14 with a 1024-token
// vocabulary (written once per test binary into a temporary directory by the synthetic
// checkpoint generator), deterministic token sequences, and whole-sequence runners.
#pragma once

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/weights.h"
#include "runtime/host_communicator.h"

namespace ds::dsv4::test {

inline constexpr uint64_t kTinySeed = 0;
inline constexpr int64_t kTinyVocab = 1024;

// The tiny config with vocab_size 1024 (what the goldens use too).
DeepSeekV4Config tiny_small_vocab_config();

// Writes the checkpoint (seed kTinySeed) to `dir`.
Status write_tiny_checkpoint(const std::string& dir);

// The shared model of this test binary (loaded on first use; aborts the test on failure).
const ModelWeights& tiny_model();

// `n` token ids in [2, vocab) from a fixed-seed generator.
std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t vocab = kTinyVocab);

// Runs `tokens` through a fresh sequence with the given chunk sizes (cycled; the last chunk is
// cut to fit) and returns the logits of every position [n, vocab].
// Runs two sequences (prefills of 37 and 50 tokens, then 6 decode steps together) three times on
// `fwd`: with every row's logits, with SequenceChunk::argmax_only, and with
// SequenceChunk::backend_sample (plain, top-p, top-k, min-p and combined draws, temperature 0),
// each on sequence 0 in every step and on sequence 1 in odd steps (batches mixing both kinds of
// output in even steps). Expects each token output to hold no logits, finite = 1 and the token of
// the same row's logits in the first run (the lowest-index argmax; cpu::sample_row's draw), and
// the other outputs the first run's logits bit for bit.
void expect_backend_tokens_like_logits(const Forward& fwd);

std::vector<float> run_chunked(const Forward& fwd, const std::vector<int32_t>& tokens,
                               const std::vector<int64_t>& chunk_sizes);

}  // namespace ds::dsv4::test

namespace ds::dsv4::test {

// A CPU backend whose linear outputs are nudged by one fp32 ulp in a random direction (a fixed
// seed): the size of the difference a different summation order makes. Reference numerics
// amplify such differences (FP8 requantization of every linear input, bf16 rounding points,
// top-k routing and selection), so the logits of this backend vs the plain CPU backend measure
// how far two correct implementations can drift apart: the baseline for comparing backends.
std::unique_ptr<Ops> make_ulp_perturbed_cpu_ops(const DeepSeekV4Config& config, uint64_t seed);

// How far logits `a` are from `b` (both [rows, vocab]): the mean over rows of
// max|a - b| / max|b|, and the fraction of rows with the same argmax. Sizes that differ or no
// rows: {inf, 0}.
struct Divergence {
  double mean_rel = 0;
  double argmax = 0;
};
Divergence divergence(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab);

// All-reduce among tensor/expert-parallel ranks that are threads, through host memory.
using runtime::HostCommunicator;

}  // namespace ds::dsv4::test
