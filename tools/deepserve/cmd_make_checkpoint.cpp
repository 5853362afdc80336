// `deepserve make-checkpoint`: writes a DeepSeek-V4 checkpoint in the published format, either
// synthetic (random weights) or from trained master weights (--from). `deepserve eval-checkpoint`
// (registered here too, it serves the trained tiny model's export check, docs/tiny_model.md):
// held-out perplexity, MTP acceptance and an optional logits dump of the CPU reference forward.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "kernels/cpu/numerics.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/weights.h"
#include "model/synthetic.h"
#include "runtime/backend.h"

namespace ds::cli {

namespace {

void register_eval_checkpoint(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string model;
    std::string tokens;
    int64_t seq_len = 256;
    int64_t num_seqs = 8;
    int64_t offset = 0;
    std::string numerics = "reference";
    std::string device = "cpu";
    std::string dump_logits;
    std::string json_out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval-checkpoint",
      "Held-out perplexity, MTP acceptance and a logits dump of the forward (CPU reference or "
      "CUDA backend) on a uint32 token file (consecutive sequences, each a fresh prefill from "
      "position 0)");
  cmd->add_option("--model", args->model, "checkpoint directory")->required();
  cmd->add_option("--tokens", args->tokens, "token ids, little-endian uint32")->required();
  cmd->add_option("--seq-len", args->seq_len, "tokens per sequence")->check(CLI::Range(3, 4096));
  cmd->add_option("--num-seqs", args->num_seqs, "sequences to evaluate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--offset", args->offset, "first token of the first sequence");
  cmd->add_option("--numerics", args->numerics, "reference (default) or hf")
      ->check(CLI::IsMember({"reference", "hf"}));
  cmd->add_option("--device", args->device, "cpu (default) or cuda");
  cmd->add_option("--dump-logits", args->dump_logits,
                  "write fp32 main logits [seqs*seq_len, vocab] then MTP logits "
                  "[seqs*(seq_len-1), vocab] (MTP row t predicts token t+2)");
  cmd->add_option("--json", args->json_out, "write the results as JSON to this file");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      std::ifstream f(args->tokens, std::ios::binary);
      if (!f) return fail(io_error(args->tokens + ": cannot open"));
      const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
      std::vector<int32_t> ids(bytes.size() / 4);
      std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
      const int64_t T = args->seq_len;
      const int64_t S = std::min<int64_t>(args->num_seqs, (int64_t(ids.size()) - args->offset) / T);
      if (S < 1) return fail(invalid_argument("eval-checkpoint: not enough tokens"));
      auto weights = dsv4::ModelWeights::load(args->model);
      if (!weights.ok()) return fail(weights.status());
      const auto& config = (*weights)->config();
      const int64_t V = config.vocab_size;
      const auto mode = *cpu::numerics_mode_from_name(args->numerics);
      const dsv4::ForwardOptions options = dsv4::ForwardOptions::for_mode(mode);
      runtime::BackendLimits limits;
      limits.max_sequences = 1;
      limits.max_context = T;
      limits.max_step_tokens = T;
      auto backend = runtime::make_backend(args->device, **weights, options, limits);
      if (!backend.ok()) return fail(backend.status());
      dsv4::Forward forward(weights->get(), options, backend->get());
      const bool mtp = config.num_nextn_predict_layers > 0;
      std::FILE* dump = nullptr;
      if (!args->dump_logits.empty()) {
        dump = std::fopen(args->dump_logits.c_str(), "wb");
        if (!dump) return fail(io_error(args->dump_logits + ": cannot create"));
      }
      std::vector<float> mtp_dump;
      // log p(target) from a logits row.
      auto nll_of = [&](const float* row, int32_t target, int32_t* argmax) {
        float m = -std::numeric_limits<float>::infinity();
        int32_t best = 0;
        for (int64_t v = 0; v < V; ++v) {
          if (row[v] > m) {
            m = row[v];
            best = int32_t(v);
          }
        }
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - m);
        *argmax = best;
        return -(double(row[target]) - m - std::log(sum));
      };
      double main_nll = 0, mtp_nll = 0;
      int64_t main_n = 0, mtp_n = 0, main_hit = 0, mtp_hit = 0, mtp_agree = 0;
      for (int64_t s = 0; s < S; ++s) {
        const int32_t* seq = ids.data() + args->offset + s * T;
        for (int64_t i = 0; i < T; ++i) {
          if (seq[i] < 0 || seq[i] >= V) return fail(invalid_argument("token id out of range"));
        }
        dsv4::SequenceState state = forward.new_sequence();
        dsv4::SequenceChunk chunk;
        chunk.state = &state;
        chunk.tokens = std::span<const int32_t>(seq, size_t(T));
        for (int64_t i = 0; i < T; ++i) chunk.logit_rows.push_back(i);
        std::vector<dsv4::ChunkOutput> out;
        if (Status st = forward.run(std::span<dsv4::SequenceChunk>(&chunk, 1), &out, mtp); !st.ok())
          return fail(st);
        std::vector<int32_t> main_argmax(static_cast<size_t>(T));
        for (int64_t i = 0; i < T; ++i) {
          int32_t am;
          const double nll = nll_of(out[0].logits.data() + i * V, i + 1 < T ? seq[i + 1] : 0, &am);
          main_argmax[size_t(i)] = am;
          if (i + 1 < T) {
            main_nll += nll;
            ++main_n;
            main_hit += am == seq[i + 1];
          }
        }
        if (dump) std::fwrite(out[0].logits.data(), sizeof(float), out[0].logits.size(), dump);
        if (!mtp) {
          forward.ops()->release_sequence(&state);
          continue;
        }
        dsv4::MtpChunk m;
        m.state = &state;
        const int64_t n = T - 1;
        m.streams = std::span<const float>(out[0].streams.data(),
                                           size_t(n * config.hc_mult * config.hidden_size));
        m.next_tokens = std::span<const int32_t>(seq + 1, size_t(n));
        for (int64_t i = 0; i < n; ++i) m.logit_rows.push_back(i);
        std::vector<dsv4::ChunkOutput> draft;
        if (Status st = forward.run_mtp(std::span<dsv4::MtpChunk>(&m, 1), &draft); !st.ok())
          return fail(st);
        for (int64_t i = 0; i + 1 < n; ++i) {
          int32_t am;
          mtp_nll += nll_of(draft[0].logits.data() + i * V, seq[i + 2], &am);
          ++mtp_n;
          mtp_hit += am == seq[i + 2];
          mtp_agree += am == main_argmax[size_t(i + 1)];
        }
        if (dump) mtp_dump.insert(mtp_dump.end(), draft[0].logits.begin(), draft[0].logits.end());
        forward.ops()->release_sequence(&state);
      }
      if (dump) {
        std::fwrite(mtp_dump.data(), sizeof(float), mtp_dump.size(), dump);
        std::fclose(dump);
      }
      nlohmann::json j = {{"model", args->model},
                          {"numerics", args->numerics},
                          {"device", args->device},
                          {"sequences", S},
                          {"seq_len", T},
                          {"main_tokens", main_n},
                          {"main_nll", main_nll / double(main_n)},
                          {"main_ppl", std::exp(main_nll / double(main_n))},
                          {"main_top1", double(main_hit) / double(main_n)}};
      if (mtp && mtp_n > 0) {
        j["mtp_tokens"] = mtp_n;
        j["mtp_nll"] = mtp_nll / double(mtp_n);
        j["mtp_ppl"] = std::exp(mtp_nll / double(mtp_n));
        j["mtp_top1_vs_text"] = double(mtp_hit) / double(mtp_n);
        j["mtp_accept_vs_main_greedy"] = double(mtp_agree) / double(mtp_n);
      }
      std::printf("%s\n", j.dump(2).c_str());
      if (!args->json_out.empty()) {
        std::ofstream o(args->json_out);
        o << j.dump(2) << "\n";
        if (!o) return fail(io_error(args->json_out + ": cannot write"));
      }
      return 0;
    };
  });
}

}  // namespace

void register_make_checkpoint(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string preset = "tiny";
    int layers = -1;
    uint64_t seed = 0;
    std::string out;
    std::string from;
    double shard_gib = 0;
    bool verify = true;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint",
      "Write a DeepSeek-V4 checkpoint (published names, dtypes, shapes and quantized formats): "
      "random weights, or trained master weights with --from");
  cmd->add_option("--preset", args->preset, "tiny (every feature, small) or flash (DeepSeek-V4-Flash geometry)")
      ->envname("DEEPSERVE_PRESET")->check(CLI::IsMember({"tiny", "flash"}));
  cmd->add_option("--layers", args->layers, "main decoder layers (default: tiny 4, flash 43)")
      ->envname("DEEPSERVE_LAYERS")->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", args->seed, "random seed")->envname("DEEPSERVE_SEED");
  cmd->add_option("--out", args->out, "output directory (must not hold a checkpoint)")
      ->required()->envname("DEEPSERVE_OUT");
  cmd->add_option("--from", args->from,
                  "trained master weights (one safetensors file, published names; F32/BF16 are "
                  "quantized to FP8 block / MXFP4 / bf16 here; docs/tiny_model.md)")
      ->envname("DEEPSERVE_FROM");
  cmd->add_option("--shard-gib", args->shard_gib, "maximum shard size in GiB (default: tiny 0.047, flash 4)")
      ->envname("DEEPSERVE_SHARD_GIB")->check(CLI::Range(0.001, 1024.0));
  cmd->add_flag("!--no-verify", args->verify, "skip loading the result back and validating it");
  cmd->callback([args, run] {
    *run = [args]() -> int {
      SyntheticOptions options;
      auto preset = parse_synthetic_preset(args->preset);
      if (!preset.ok()) return fail(preset.status(), 2);
      options.preset = *preset;
      options.num_layers = args->layers;
      options.seed = args->seed;
      options.max_shard_bytes = uint64_t(args->shard_gib * double(uint64_t(1) << 30));
      options.on_progress = [](const SyntheticProgress& p) {
        spdlog::info("wrote shard {}/{} ({:.2f} / {:.2f} GiB)", p.shard, p.num_shards,
                     double(p.bytes_done) / double(1 << 30), double(p.bytes_total) / double(1 << 30));
      };
      auto config = synthetic_config(options);
      if (!config.ok()) return fail(config.status(), 2);
      const Status s = args->from.empty()
                           ? write_synthetic_checkpoint(*config, options, args->out)
                           : write_checkpoint_from_weights(*config, args->from, args->out);
      if (!s.ok()) return fail(s);
      if (args->verify) {
        auto ckpt = open_checkpoint(args->out);
        if (!ckpt.ok()) {
          std::fprintf(stderr, "error: the written checkpoint does not validate: %s\n",
                       ckpt.status().message().c_str());
          return 1;
        }
        spdlog::info("{}: {} tensors in {} shards, validated", args->out, ckpt->files.num_tensors(),
                     ckpt->files.num_shards());
      }
      return 0;
    };
  });
  register_eval_checkpoint(app, run);
}

}  // namespace ds::cli
