// The OpenAI-compatible HTTP server (cpp-httplib): routes, auth, limits, health and readiness,
// streaming over SSE, per-request log lines, metrics, and the states of a server's life:
// loading (listener up, API answers 503) -> ready -> draining (new generation requests get 503 +
// Retry-After while running ones finish) -> stopped. It talks to the engine only through
// include/deepserve/engine.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "deepserve/engine.h"
#include "server/limits.h"
#include "server/metrics.h"

namespace ds::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0 = a free port (see HttpServer::port())
  std::string api_key;  // "" = no authentication
  ServerLimits limits;
  int http_threads = 64;  // worker threads = concurrent connections served
  std::string version = "0.0.0";
};

enum class ServerState { kLoading, kReady, kDraining };

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket. Fails (naming the address) when the port is taken.
  Status bind();
  int port() const;
  std::string url() const;

  // Serves on a background thread. Until set_engine() the API answers 503 "loading".
  void start();
  // Loading progress shown by /health while loading.
  void set_load_progress(const deepserve::LoadProgress& progress);
  // The engine is loaded: the server becomes ready. The engine must outlive stop().
  void set_engine(deepserve::Engine* engine);

  // SIGTERM: new generation requests get 503 + Retry-After, /ready 503; running ones continue.
  void begin_drain();
  // Second signal / shutdown timeout: every request still running ends at its next poll with an
  // error event (streams) or 503 (non-streaming).
  void abort_requests();
  // Generation requests still being served (streams count until their last byte is written).
  int64_t active_generations() const;
  ServerState state() const;

  // Closes the listener and joins the HTTP threads (call after the requests have ended).
  void stop();

  ServerMetrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::server
