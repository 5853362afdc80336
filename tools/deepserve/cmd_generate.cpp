// `deepserve generate`: runs the DeepSeek-V4 CPU reference forward on a prompt and prints the
// generated token ids (and their text when a tokenizer is available) and tokens/s. The prompt is
// prefilled in one chunk, then each token is decoded on the incremental path (per-sequence state).
// Greedy with --temperature 0 (default); otherwise the engine's sampler (src/scheduler/sampler.h:
// temperature, then top-k, top-p (nucleus) and min-p filtering, then a draw from a generator
// seeded with --seed). Without --model it uses the embedded tiny
// model. Text prompts (--prompt) go through the checkpoint's tokenizer.json or the default
// DeepSeek tokenizer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kernels/cpu/numerics.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/weights.h"
#include "model/embedded_model.h"
#include "runtime/backend.h"
#include "runtime/model_runner.h"
#include "scheduler/sampler.h"
#include "tokenizer/default_tokenizer.h"

namespace ds::cli {

namespace {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      return invalid_argument("--prompt-ids: \"" + item + "\" is not an integer");
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) {
      return invalid_argument("--prompt-ids: \"" + item + "\" is not a token id");
    }
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) return invalid_argument("--prompt-ids: no token ids");
  return ids;
}

}  // namespace

void register_generate(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string model;
    std::string prompt;
    std::string prompt_ids;
    int max_tokens = 32;
    SamplingParams sampling;
    uint64_t seed = 0;
    std::string numerics = "reference";
    bool ignore_eos = false;
    std::string device = "cpu";
    int tensor_parallel_size = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate tokens for one prompt (prefill, then decode) on the CPU or a GPU");
  cmd->add_option("--model", args->model, "checkpoint directory (default: the embedded tiny model)")
      ->envname("DEEPSERVE_MODEL");
  cmd->add_option("--prompt", args->prompt, "prompt text (encoded with the model's tokenizer)")
      ->envname("DEEPSERVE_PROMPT");
  cmd->add_option("--prompt-ids", args->prompt_ids,
                  "prompt as comma-separated token ids, e.g. 0,1,2")
      ->envname("DEEPSERVE_PROMPT_IDS");
  cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate")
      ->envname("DEEPSERVE_MAX_TOKENS")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->sampling.temperature, "0 = greedy (default)")
      ->envname("DEEPSERVE_TEMPERATURE")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", args->sampling.top_p, "nucleus sampling mass (1 = off)")
      ->envname("DEEPSERVE_TOP_P")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", args->sampling.top_k, "keep the k most likely tokens (0 = off)")
      ->envname("DEEPSERVE_TOP_K")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--min-p", args->sampling.min_p, "drop tokens below min_p * p(top) (0 = off)")
      ->envname("DEEPSERVE_MIN_P")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "sampling seed")->envname("DEEPSERVE_SEED");
  cmd->add_option("--numerics", args->numerics, "reference (default) or hf")
      ->envname("DEEPSERVE_NUMERICS")
      ->check(CLI::IsMember({"reference", "hf"}));
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating after the EOS token")
      ->envname("DEEPSERVE_IGNORE_EOS");
  cmd->add_option("--device", args->device, "cpu (reference backend, default) or cuda")
      ->envname("DEEPSERVE_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--tensor-parallel-size,--tp", args->tensor_parallel_size,
                  "ranks the model is split over (one GPU each with --device cuda; "
                  "docs/parallelism.md)")
      ->envname("DEEPSERVE_TENSOR_PARALLEL_SIZE")
      ->check(CLI::Range(1, 64));
  cmd->callback([args, run] {
    *run = [args]() -> int {
      if (args->prompt.empty() == args->prompt_ids.empty()) {
        return fail(invalid_argument("give exactly one of --prompt and --prompt-ids"));
      }
      std::string dir = args->model;
      if (dir.empty()) {
        auto embedded = ensure_embedded_model();
        if (!embedded.ok()) return fail(embedded.status());
        dir = *embedded;
      }
      const auto load_start = std::chrono::steady_clock::now();
      auto weights = dsv4::ModelWeights::load(dir);
      if (!weights.ok()) return fail(weights.status());
      const double load_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
      const DeepSeekV4Config& config = (*weights)->config();

      // A tokenizer for text prompts and for printing text (optional for --prompt-ids).
      std::unique_ptr<tok::Tokenizer> tokenizer;
      {
        auto t = tok::load_checkpoint_tokenizer(dir);
        if (t.ok()) {
          tokenizer = std::make_unique<tok::Tokenizer>(std::move(t).value());
        } else if (!args->prompt.empty()) {
          return fail(t.status().with_context("--prompt needs a tokenizer"));
        }
      }
      std::vector<int32_t> prompt;
      if (!args->prompt.empty()) {
        auto ids = tokenizer->encode(args->prompt);
        if (!ids.ok()) return fail(ids.status());
        prompt.assign(ids->begin(), ids->end());
        if (prompt.empty()) return fail(invalid_argument("--prompt encodes to no tokens"));
      } else {
        auto ids = parse_ids(args->prompt_ids);
        if (!ids.ok()) return fail(ids.status());
        prompt = std::move(ids).value();
      }
      for (int32_t id : prompt) {
        if (id >= config.vocab_size) {
          return fail(
              invalid_argument("prompt token id " + std::to_string(id) +
                               " is not below vocab_size = " + std::to_string(config.vocab_size)));
        }
      }
      if (int64_t(prompt.size()) + args->max_tokens > config.max_position_embeddings) {
        return fail(invalid_argument("prompt + max tokens exceed max_position_embeddings = " +
                                     std::to_string(config.max_position_embeddings)));
      }

      const auto mode = *cpu::numerics_mode_from_name(args->numerics);
      const dsv4::ForwardOptions fwd_options = dsv4::ForwardOptions::for_mode(mode);
      runtime::BackendLimits limits;
      limits.max_sequences = 1;
      limits.max_context = int64_t(prompt.size()) + args->max_tokens;
      limits.max_step_tokens = std::max<int64_t>(int64_t(prompt.size()), 1);
      limits.max_logit_rows = 1;
      runtime::ParallelConfig parallel;
      parallel.tensor_parallel_size = args->tensor_parallel_size;
      auto runner =
          runtime::make_model_runner(args->device, **weights, fwd_options, limits, parallel);
      if (!runner.ok()) return fail(runner.status());
      runtime::ModelRunner& forward = **runner;
      dsv4::SequenceState state = forward.new_sequence();
      deepserve::SamplingParams sp;
      sp.temperature = args->sampling.temperature;
      sp.top_k = args->sampling.top_k;
      sp.top_p = std::max(double(args->sampling.top_p), 1e-9);  // 0 keeps the top token
      sp.min_p = args->sampling.min_p;
      sp.ignore_eos = args->ignore_eos;
      sched::Sampler sampler(sp, args->seed, config.vocab_size, int32_t(config.eos_token_id),
                             std::span<const int32_t>(prompt));
      std::vector<int32_t> generated;
      std::vector<int32_t> next = prompt;
      double prefill_s = 0, decode_s = 0;
      for (int step = 0; step < args->max_tokens; ++step) {
        dsv4::SequenceChunk chunk;
        chunk.state = &state;
        chunk.tokens = next;
        chunk.logit_rows = {int64_t(next.size()) - 1};
        std::vector<dsv4::ChunkOutput> out;
        const auto t0 = std::chrono::steady_clock::now();
        Status st = forward.run(std::span<dsv4::SequenceChunk>(&chunk, 1), &out);
        if (!st.ok()) return fail(st);
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (step == 0 ? prefill_s : decode_s) += dt;
        const int32_t id = sampler.sample(out[0].logits.data());
        sampler.accept(id);
        generated.push_back(id);
        if (id == config.eos_token_id && !args->ignore_eos) break;
        next = {id};
      }

      std::printf("model: %s (%s numerics), loaded in %.2f s\n", dir.c_str(),
                  args->numerics.c_str(), load_s);
      std::printf("device: %s\n", forward.describe().c_str());
      std::printf("prompt: %zu tokens\n", prompt.size());
      std::printf("generated ids:");
      for (int32_t id : generated) std::printf(" %d", id);
      std::printf("\n");
      if (tokenizer) {
        std::vector<tok::TokenId> ids(generated.begin(), generated.end());
        std::printf("generated text: %s\n", tokenizer->decode(ids).c_str());
      }
      const size_t decoded = generated.size() - 1;
      std::printf("prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), prefill_s,
                  double(prompt.size()) / std::max(prefill_s, 1e-9));
      if (decoded > 0) {
        std::printf("decode: %zu tokens in %.3f s (%.1f tokens/s)\n", decoded, decode_s,
                    double(decoded) / std::max(decode_s, 1e-9));
      }
      return 0;
    };
  });
}

}  // namespace ds::cli
