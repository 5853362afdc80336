// `deepserve serve`: the OpenAI-compatible server. Binds the listener first (a bad flag or a taken
// port exits non-zero before any loading), answers 503 while the model loads in the background
// (progress on a terminal, periodic lines otherwise), prints the startup summary and the URL, then
// serves until SIGTERM/SIGINT: the first signal drains (new requests get 503 + Retry-After,
// running ones finish until --shutdown-timeout, then the rest are aborted) and exits 0; a second
// signal aborts everything and exits at once. Without --model it serves the embedded tiny model on
// the CPU. Every flag has a DEEPSERVE_* environment variable; the limits come from the server's
// limits table (src/server/limits.h).
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "commands.h"
#include "deepserve/engine.h"
#include "server/http_server.h"
#include "server/limits.h"

namespace ds::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  int64_t max_model_len = 0;
  std::string kv_cache_dtype = "auto";
  double gpu_memory_utilization = 0.9;
  int64_t num_gpu_blocks_override = 0;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int tensor_parallel_size = 1;
  std::string speculative_config;
  std::string api_key;
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string numerics = "reference";
  double kv_cache_memory_gib = 0;
  int64_t max_queued_requests = 1024;
  int64_t max_queued_tokens = 1 << 22;
  int num_threads = 0;
  bool full_scan = false;
  int http_threads = 0;
  double shutdown_timeout_s = 30;
  server::ServerLimits limits;
};

// Signals are taken by one thread (sigwait) so that nothing runs in a signal handler.
struct SignalState {
  std::mutex mu;
  std::condition_variable cv;
  int count = 0;
  bool loaded = false;
  bool load_failed = false;
};

std::string fmt_eta(double s) {
  char buf[32];
  if (s < 0 || s > 1e6) return "?";
  std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  return buf;
}

// Prints loading progress: one rewritten line on a terminal, a line every 5 s otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}
  void update(const deepserve::LoadProgress& p) {
    std::lock_guard<std::mutex> lock(mu_);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double rate = elapsed > 0 ? p.gib_done / elapsed : 0;
    const double eta = rate > 0 ? (p.gib_total - p.gib_done) / rate : -1;
    char line[256];
    if (p.shards_total > 0 || p.gib_total > 0) {
      std::snprintf(line, sizeof line,
                    "loading: %s shard %lld/%lld, %.2f/%.2f GiB, %.2f GiB/s, ETA %s",
                    p.phase.c_str(), (long long)p.shards_done, (long long)p.shards_total,
                    p.gib_done, p.gib_total, rate, fmt_eta(eta).c_str());
    } else {
      std::snprintf(line, sizeof line, "loading: %s (%.1f s)", p.phase.c_str(), elapsed);
    }
    if (tty_) {
      std::fprintf(stderr, "\r%-100s", line);
      if (p.phase == "ready") std::fprintf(stderr, "\n");
      std::fflush(stderr);
      return;
    }
    if (p.phase != last_phase_ || Clock::now() - last_print_ > std::chrono::seconds(5)) {
      spdlog::info("{}", line);
      last_phase_ = p.phase;
      last_print_ = Clock::now();
    }
  }

 private:
  std::mutex mu_;
  bool tty_;
  Clock::time_point start_, last_print_{};
  std::string last_phase_;
};

int run_serve(const ServeArgs& a) {
  // ---- flags that must fail before anything starts (SH10) ----
  if (!a.model.empty()) {
    struct stat st {};
    if (stat(a.model.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        access(a.model.c_str(), R_OK | X_OK) != 0) {
      return fail(invalid_argument("--model: " + a.model + " is not a readable directory"), 2);
    }
  }
  deepserve::SpeculativeConfig speculative;
  if (!a.speculative_config.empty()) {
    std::string error;
    if (!deepserve::parse_speculative_config(a.speculative_config, &speculative, &error)) {
      return fail(invalid_argument(error), 2);
    }
  }
  if (a.kv_cache_dtype != "auto") {
    return fail(unimplemented("--kv-cache-dtype: only \"auto\" is supported by this build"), 2);
  }

  // Block the shutdown signals in every thread started from here; one thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto sig = std::make_shared<SignalState>();
  std::thread([sig, set] {
    for (;;) {
      int s = 0;
      if (sigwait(&set, &s) != 0) continue;
      {
        std::lock_guard<std::mutex> lock(sig->mu);
        ++sig->count;
      }
      sig->cv.notify_all();
    }
  }).detach();

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.limits = a.limits;
  so.http_threads = a.http_threads > 0
                        ? a.http_threads
                        : int(std::clamp<int64_t>(2 * a.max_num_seqs + 16, 32, 1024));
  so.version = DS_SERVER_VERSION;
  auto server = std::make_unique<server::HttpServer>(so);
  if (Status st = server->bind(); !st.ok()) return fail(st, 1);
  server->start();
  std::printf("deepserve: listening on %s (loading the model)\n", server->url().c_str());
  std::fflush(stdout);

  // ---- load in the background; /health answers 503 meanwhile (SH1) ----
  deepserve::EngineConfig config;
  config.model_dir = a.model;
  config.served_model_name = a.served_model_name;
  config.device = a.device;
  config.numerics = a.numerics;
  config.max_model_len = a.max_model_len;
  config.max_num_seqs = a.max_num_seqs;
  config.max_num_batched_tokens = a.max_num_batched_tokens;
  config.max_queued_requests = a.max_queued_requests;
  config.max_queued_tokens = a.max_queued_tokens;
  config.kv_cache_memory_gib = a.kv_cache_memory_gib;
  config.gpu_memory_utilization = a.gpu_memory_utilization;
  config.num_gpu_blocks_override = a.num_gpu_blocks_override;
  config.tensor_parallel_size = a.tensor_parallel_size;
  config.seed = a.seed;
  config.num_threads = a.num_threads;
  config.full_scan = a.full_scan;
  config.speculative = speculative;
  auto printer = std::make_shared<ProgressPrinter>();
  server::HttpServer* srv = server.get();
  config.on_progress = [printer, srv](const deepserve::LoadProgress& p) {
    srv->set_load_progress(p);
    printer->update(p);
  };
  auto engine_slot = std::make_shared<std::unique_ptr<deepserve::Engine>>();
  auto load_error = std::make_shared<deepserve::ApiError>();
  const auto load_start = Clock::now();
  std::thread loader([config, engine_slot, load_error, sig] {
    *engine_slot = deepserve::Engine::create(config, load_error.get());
    {
      std::lock_guard<std::mutex> lock(sig->mu);
      sig->loaded = true;
      sig->load_failed = *engine_slot == nullptr;
    }
    sig->cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(sig->mu);
    sig->cv.wait(lock, [&] { return sig->loaded || sig->count > 0; });
    if (!sig->loaded) {
      // SH7: a signal during the load exits at once (the loader cannot be interrupted).
      std::fprintf(stderr, "deepserve: signal received while loading; exiting\n");
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(0);
    }
  }
  loader.join();
  if (!*engine_slot) {
    server->stop();
    std::fprintf(stderr, "error: cannot load the model: %s\n", load_error->message.c_str());
    return 1;
  }
  deepserve::Engine* engine = engine_slot->get();
  spdlog::info("model loaded in {:.1f} s",
               std::chrono::duration<double>(Clock::now() - load_start).count());
  for (const std::string& line : engine->summary()) spdlog::info("{}", line);
  server->set_engine(engine);
  std::printf("deepserve: ready on %s (model %s, max_model_len %lld)\n", server->url().c_str(),
              engine->model_info().id.c_str(), (long long)engine->model_info().max_model_len);
  std::fflush(stdout);

  // ---- serve until a signal, or until the engine dies (promise 7) ----
  int exit_code = 0;
  {
    std::unique_lock<std::mutex> lock(sig->mu);
    while (sig->count == 0) {
      sig->cv.wait_for(lock, std::chrono::milliseconds(200));
      if (engine->health().dead) {
        spdlog::error("engine failed ({}); exiting", engine->health().reason);
        exit_code = 3;
        break;
      }
    }
  }
  if (exit_code == 0) {
    // First signal: drain (SH5, SH8: queued requests run within the timeout too).
    spdlog::info("shutdown: draining (up to {:.0f} s); a second signal aborts",
                 a.shutdown_timeout_s);
    server->begin_drain();
    engine->drain();
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(int64_t(a.shutdown_timeout_s * 1000));
    bool second = false;
    {
      std::unique_lock<std::mutex> lock(sig->mu);
      while (Clock::now() < deadline) {
        if (sig->count > 1) {
          second = true;
          break;
        }
        if (server->active_generations() == 0 && engine->idle()) break;
        sig->cv.wait_for(lock, std::chrono::milliseconds(20));
      }
    }
    if (second || server->active_generations() > 0 || !engine->idle()) {
      spdlog::info(second ? "shutdown: second signal, aborting requests"
                          : "shutdown: timeout, aborting requests");
    }
  }
  // Anything still running gets an error event / 503 (SH5 timeout, SH6).
  engine->abort_all();
  server->abort_requests();
  const auto hard_deadline = Clock::now() + std::chrono::seconds(2);
  while (server->active_generations() > 0 && Clock::now() < hard_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server->stop();
  server.reset();
  engine_slot->reset();
  spdlog::info("shutdown: done");
  std::fflush(stdout);
  return exit_code;
}

}  // namespace

void register_serve(CLI::App& app, CommandFn* run) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible server (default: the embedded tiny model on the CPU)");
  const char* kModel = "Model";
  const char* kServer = "Server";
  const char* kEngine = "Engine";
  const char* kLimits = "Limits";
  cmd->add_option("--model", a->model, "checkpoint directory (default: the embedded tiny model)")
      ->envname("DEEPSERVE_MODEL")
      ->group(kModel);
  cmd->add_option("--served-model-name", a->served_model_name,
                  "model name in the API (default: the directory's base name)")
      ->envname("DEEPSERVE_SERVED_MODEL_NAME")
      ->group(kModel);
  cmd->add_option("--max-model-len", a->max_model_len,
                  "context length (0 = what the model and the KV cache allow)")
      ->capture_default_str()
      ->envname("DEEPSERVE_MAX_MODEL_LEN")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->group(kModel);
  cmd->add_option("--numerics", a->numerics, "reference (default) or hf")
      ->capture_default_str()
      ->envname("DEEPSERVE_NUMERICS")
      ->check(CLI::IsMember({"reference", "hf"}))
      ->group(kModel);
  cmd->add_flag("--full-scan", a->full_scan, "check every weight value at load")
      ->envname("DEEPSERVE_FULL_SCAN")
      ->group(kModel);
  cmd->add_option("--host", a->host, "address to listen on")
      ->capture_default_str()
      ->envname("DEEPSERVE_HOST")
      ->group(kServer);
  cmd->add_option("--port", a->port, "port (0 = a free port; the URL is printed)")
      ->capture_default_str()
      ->envname("DEEPSERVE_PORT")
      ->check(CLI::Range(0, 65535))
      ->group(kServer);
  cmd->add_option(
         "--api-key", a->api_key,
         "require this key (Authorization: Bearer or X-Api-Key) on every route but /health, /ready")
      ->capture_default_str()
      ->envname("DEEPSERVE_API_KEY")
      ->group(kServer);
  cmd->add_option("--http-threads", a->http_threads,
                  "HTTP worker threads = concurrent connections (0 = 2 x max-num-seqs + 16)")
      ->capture_default_str()
      ->envname("DEEPSERVE_HTTP_THREADS")
      ->check(CLI::Range(0, 4096))
      ->group(kServer);
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout_s,
                  "seconds running requests may take after SIGTERM before they are aborted")
      ->capture_default_str()
      ->envname("DEEPSERVE_SHUTDOWN_TIMEOUT")
      ->check(CLI::Range(0.0, 86400.0))
      ->group(kServer);
  cmd->add_option("--device", a->device, "cpu (reference backend) or cuda (one GPU)")
      ->capture_default_str()
      ->envname("DEEPSERVE_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->group(kEngine);
  cmd->add_option("--max-num-seqs", a->max_num_seqs, "running sequences per step")
      ->capture_default_str()
      ->envname("DEEPSERVE_MAX_NUM_SEQS")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->group(kEngine);
  cmd->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "tokens per step")
      ->capture_default_str()
      ->envname("DEEPSERVE_MAX_NUM_BATCHED_TOKENS")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->group(kEngine);
  cmd->add_option("--max-queued-requests", a->max_queued_requests,
                  "waiting requests before 503 + Retry-After")
      ->capture_default_str()
      ->envname("DEEPSERVE_MAX_QUEUED_REQUESTS")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->group(kEngine);
  cmd->add_option("--max-queued-tokens", a->max_queued_tokens,
                  "waiting prompt tokens before 503 + Retry-After")
      ->capture_default_str()
      ->envname("DEEPSERVE_MAX_QUEUED_TOKENS")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->group(kEngine);
  cmd->add_option("--kv-cache-memory-gib", a->kv_cache_memory_gib,
                  "KV cache size in GiB: the CPU pool (0 = a default from max-num-seqs); with "
                  "--device cuda, the GPU's KV pages instead of what --gpu-memory-utilization "
                  "leaves")
      ->capture_default_str()
      ->envname("DEEPSERVE_KV_CACHE_MEMORY_GIB")
      ->check(CLI::Range(0.0, 1e6))
      ->group(kEngine);
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype, "auto")
      ->capture_default_str()
      ->envname("DEEPSERVE_KV_CACHE_DTYPE")
      ->group(kEngine);
  cmd->add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                  "fraction of the GPU's memory to fill (CUDA backend): after the weights and "
                  "the step buffers, --max-num-seqs sequence slots (fewer if they would leave no "
                  "room for one --max-model-len sequence) and as many KV pages of 256 tokens as "
                  "fit")
      ->capture_default_str()
      ->envname("DEEPSERVE_GPU_MEMORY_UTILIZATION")
      ->check(CLI::Range(0.01, 1.0))
      ->group(kEngine);
  cmd->add_option("--num-gpu-blocks-override", a->num_gpu_blocks_override,
                  "CUDA backend: exactly this many KV pages of 256 tokens (0 = from the memory "
                  "budget; for tests and capacity experiments)")
      ->capture_default_str()
      ->envname("DEEPSERVE_NUM_GPU_BLOCKS_OVERRIDE")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->group(kEngine);
  cmd->add_option("--tensor-parallel-size,--tp", a->tensor_parallel_size,
                  "ranks the model is split over (one GPU each, GPUs 0..N-1; NCCL): attention "
                  "heads and the shared expert by tensor parallelism, routed experts by expert "
                  "parallelism (docs/parallelism.md)")
      ->capture_default_str()
      ->envname("DEEPSERVE_TENSOR_PARALLEL_SIZE")
      ->check(CLI::Range(1, 64))
      ->group(kEngine);
  cmd->add_option("--speculative-config", a->speculative_config,
                  "speculative decoding as JSON, e.g. "
                  "'{\"method\":\"mtp\",\"num_speculative_tokens\":2}' (optional \"adaptive\": "
                  "false keeps k fixed; see docs/speculative.md)")
      ->envname("DEEPSERVE_SPECULATIVE_CONFIG")
      ->group(kEngine);
  cmd->add_option("--seed", a->seed, "default seed of requests without one")
      ->capture_default_str()
      ->envname("DEEPSERVE_SEED")
      ->group(kEngine);
  cmd->add_option("--num-threads", a->num_threads, "CPU compute threads (0 = all cores)")
      ->capture_default_str()
      ->envname("DEEPSERVE_NUM_THREADS")
      ->check(CLI::Range(0, 4096))
      ->group(kEngine);
  for (const server::LimitSpec& spec : server::limit_table()) {
    int64_t* field = &(a->limits.*(spec.field));
    cmd->add_option(spec.flag, *field, spec.help)
        ->envname(spec.env)
        ->check(CLI::Range(spec.min_value, spec.max_value))
        ->capture_default_str()
        ->group(kLimits);
  }
  cmd->callback([a, run] { *run = [a]() -> int { return run_serve(*a); }; });
}

}  // namespace ds::cli
