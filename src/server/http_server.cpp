// The HTTP server (see http_server.h). cpp-httplib 0.11 facts this relies on (checked against the
// linked library by tests/server): handlers run on the task-queue threads, one connection per
// thread; POST routes use content-reader handlers so the body deadline (read_timeout_s for the
// whole body, not per read) is ours; a chunked content provider is called after the headers are
// sent and a failed sink write means the client is gone; the error handler runs for every answer
// >= 400, so it only fills bodies that are still empty.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "server/auth.h"
#include "server/connection_probe.h"
#include "server/http_error.h"
#include "server/openai_protocol.h"
#include "server/web_ui.h"

namespace ds::server {
namespace {

using Clock = std::chrono::steady_clock;
using deepserve::FinishReason;
using deepserve::RequestEvent;

constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::vector<std::string> header_values(const httplib::Request& req, const char* name) {
  std::vector<std::string> out;
  const size_t n = req.get_header_value_count(name);
  for (size_t i = 0; i < n; ++i) out.push_back(req.get_header_value(name, i));
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          uint64_t(Clock::now().time_since_epoch().count()));
  static const char* kHex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = kHex[rng() & 15];
  return s;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One generation request's timing and totals, for metrics and its log line.
struct RequestTrace {
  std::string id;
  std::string route;
  std::string client;
  std::string model;  // as sent by the client (escaped when logged)
  bool stream = false;
  Clock::time_point arrival = Clock::now();
  Clock::time_point first_token{};
  Clock::time_point last_event{};
  int status = 200;
  deepserve::Usage usage;
  FinishReason finish = FinishReason::kNone;
};

// cpp-httplib 0.11 listens with a backlog of 5 (a compile-time constant of the library build):
// a burst of new connections would wait for SYN retransmits (1 s, 3 s, ...). Calling listen()
// again on the bound socket raises the backlog (Linux); the socket is found by its port.
void raise_listen_backlog(int port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage ss{};
    len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    const int p = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                  : ss.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                      : -1;
    if (p == port) ::listen(fd, 1024);
  }
  closedir(dir);
}

// Closes the server side of every connection to `port` (idle keep-alive connections would
// otherwise hold their worker thread, and so the shutdown, for up to the keep-alive timeout: the
// library's keep-alive wait does not look at the stop flag). Called after the listener is closed
// and the requests have ended.
void shutdown_connections(int port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    const int p =
        local.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port)
        : local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                                      : -1;
    len = sizeof peer;
    if (p != port || getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    ::shutdown(fd, SHUT_RDWR);
  }
  closedir(dir);
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  httplib::Server http;
  ServerMetrics metrics;
  std::thread thread;
  int bound_port = -1;

  mutable std::mutex mu;
  deepserve::Engine* engine = nullptr;
  deepserve::LoadProgress progress;
  std::atomic<ServerState> state{ServerState::kLoading};
  std::atomic<bool> aborting{false};
  int64_t created = unix_now();

  explicit Impl(ServerOptions o) : options(std::move(o)) { setup(); }

  deepserve::Engine* current_engine() {
    std::lock_guard<std::mutex> lock(mu);
    return engine;
  }

  // ---- answers --------------------------------------------------------------------------------

  void send_error(httplib::Response& res, const HttpError& e) {
    res.status = e.status;
    if (e.retry_after) res.set_header("Retry-After", std::to_string(options.limits.retry_after_s));
    if (e.status == 405) res.set_header("Allow", "GET, POST");
    res.set_content(error_body(e), "application/json");
  }

  void send_json(httplib::Response& res, const Json& body, int status = 200) {
    res.status = status;
    res.set_content(dump_json(body), "application/json");
  }

  void log_trace(const RequestTrace& t) {
    const auto end = t.last_event == Clock::time_point{} ? Clock::now() : t.last_event;
    const char* finish = finish_reason_text(t.finish);
    spdlog::info(
        "request id={} route={} status={} stream={} client={} model=\"{}\" prompt_tokens={} "
        "completion_tokens={} finish={} ttft_ms={:.1f} e2e_ms={:.1f}",
        t.id, t.route, t.status, t.stream ? 1 : 0, t.client, log_escape(t.model),
        t.usage.prompt_tokens, t.usage.completion_tokens, finish ? finish : "-",
        t.first_token == Clock::time_point{} ? -1.0
                                             : 1000.0 * seconds_between(t.arrival, t.first_token),
        1000.0 * seconds_between(t.arrival, end));
  }

  // Timing of one event into the histograms (engine clock = steady clock).
  void observe_event(RequestTrace* t, const RequestEvent& ev) {
    Clock::time_point when = ev.time == Clock::time_point{} ? Clock::now() : ev.time;
    if (!ev.tokens.empty()) {
      if (t->first_token == Clock::time_point{}) {
        t->first_token = when;
        metrics.time_to_first_token.observe(seconds_between(t->arrival, when));
      } else if (t->last_event != Clock::time_point{}) {
        metrics.inter_token_latency.observe(seconds_between(t->last_event, when));
      }
      t->last_event = when;
    }
    if (ev.finished) {
      t->last_event = when;
      t->usage = ev.usage;
      t->finish = ev.finish_reason;
      metrics.e2e_request_latency.observe(seconds_between(t->arrival, when));
      metrics.count_finished(ev.finish_reason);
    }
  }

  // ---- the gate every route passes ------------------------------------------------------------

  // Header count, API key and state checks. Returns false after answering.
  bool gate(const httplib::Request& req, httplib::Response& res, bool is_public,
            bool needs_engine) {
    if (int64_t(req.headers.size()) > options.limits.max_header_count) {
      HttpError e = bad_request("too many request headers (limit " +
                                std::to_string(options.limits.max_header_count) + ")");
      e.status = 431;
      send_error(res, e);
      return false;
    }
    if (!is_public && !api_key_matches(options.api_key, header_values(req, "Authorization"),
                                       header_values(req, "X-Api-Key"))) {
      HttpError e;
      e.status = 401;
      e.type = "authentication_error";
      e.message = "invalid or missing API key (send Authorization: Bearer <key> or X-Api-Key)";
      e.code = "invalid_api_key";
      send_error(res, e);
      return false;
    }
    if (needs_engine && state.load() == ServerState::kLoading) {
      send_error(res, unavailable("the model is loading; retry later"));
      return false;
    }
    return true;
  }

  // Content type + body (read with a whole-body deadline) + JSON object.
  bool read_json(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader, Json* body) {
    const std::string ct = req.get_header_value("Content-Type");
    std::string media = ct.substr(0, ct.find(';'));
    while (!media.empty() && media.back() == ' ') media.pop_back();
    for (auto& c : media) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (!ct.empty() && media != "application/json") {
      HttpError e =
          bad_request("Content-Type must be application/json", "", "unsupported_media_type");
      e.status = 415;
      send_error(res, e);
      // Read (and drop) the body so the connection stays in step.
    }
    const auto deadline = Clock::now() + std::chrono::seconds(options.limits.read_timeout_s);
    std::string data;
    bool too_big = false, too_slow = false;
    const bool ok = reader([&](const char* p, size_t n) {
      if (int64_t(data.size() + n) > options.limits.max_body_bytes) {
        too_big = true;
        return false;
      }
      if (Clock::now() > deadline) {
        too_slow = true;
        return false;
      }
      data.append(p, n);
      return true;
    });
    if (res.status == 415) return false;
    // The library refuses a declared Content-Length over the cap before calling the receiver.
    if (!ok && !too_slow && req.has_header("Content-Length")) {
      const std::string cl = req.get_header_value("Content-Length");
      too_big = cl.size() > 18 ||
                (!cl.empty() && std::stoll("0" + cl.substr(0, cl.find_first_not_of("0123456789"))) >
                                    options.limits.max_body_bytes);
    }
    if (too_big) {
      HttpError e = bad_request("request body larger than " +
                                std::to_string(options.limits.max_body_bytes) + " bytes");
      e.status = 413;
      send_error(res, e);
      return false;
    }
    if (too_slow) {
      HttpError e = bad_request("request body not received within " +
                                std::to_string(options.limits.read_timeout_s) + " s");
      e.status = 408;
      send_error(res, e);
      return false;
    }
    if (!ok) {
      send_error(res, bad_request("the request body could not be read"));
      return false;
    }
    if (auto e = parse_json_body(data, options.limits, body)) {
      send_error(res, *e);
      return false;
    }
    return true;
  }

  ModelContext model_context(deepserve::Engine* eng) {
    const auto& info = eng->model_info();
    return ModelContext{info.id, info.vocab_size, info.max_model_len};
  }

  // ---- generation -----------------------------------------------------------------------------

  void handle_generate(const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader, Endpoint endpoint) {
    auto trace = std::make_shared<RequestTrace>();
    trace->route = req.path;
    trace->client = req.remote_addr + ":" + std::to_string(req.remote_port);
    trace->id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    auto finish_with_error = [&](const HttpError& e) {
      send_error(res, e);
      trace->status = e.status;
      log_trace(*trace);
    };
    if (!gate(req, res, false, true)) {
      trace->status = res.status;
      // The body is still unread: drop it so the next request on this connection parses cleanly
      // (bounded by max_body_bytes and the read timeout).
      reader([](const char*, size_t) { return true; });
      log_trace(*trace);
      return;
    }
    Json body;
    if (!read_json(req, res, reader, &body)) {
      trace->status = res.status;
      log_trace(*trace);
      return;
    }
    if (state.load() == ServerState::kDraining) {
      return finish_with_error(unavailable("the server is shutting down"));
    }
    deepserve::Engine* eng = current_engine();
    const ModelContext mc = model_context(eng);
    auto parsed = std::make_shared<ParsedRequest>();
    auto err = endpoint == Endpoint::kChat
                   ? parse_chat_request(body, options.limits, mc, parsed.get())
                   : parse_completion_request(body, options.limits, mc, parsed.get());
    trace->model = parsed->model;
    trace->stream = parsed->stream;
    if (err) return finish_with_error(*err);

    // Tokenize (the byte cap already bounds the work).
    deepserve::GenerateRequest greq;
    greq.request_id = trace->id;
    deepserve::ApiError aerr;
    bool tok_ok = true;
    if (endpoint == Endpoint::kChat) {
      tok_ok = eng->encode_chat(parsed->chat, &greq.prompt_ids, &aerr);
    } else if (parsed->prompt_is_ids) {
      greq.prompt_ids = parsed->prompt_ids;
    } else {
      tok_ok =
          eng->tokenize(parsed->prompt_text, parsed->add_special_tokens, &greq.prompt_ids, &aerr);
    }
    if (!tok_ok) {
      if (aerr.kind == deepserve::ErrorKind::kInternal) {
        spdlog::error("request {}: tokenization failed: {}", trace->id,
                      log_escape(aerr.message, 200));
      }
      return finish_with_error(from_api_error(aerr));
    }
    if (greq.prompt_ids.empty()) {
      return finish_with_error(bad_request("the prompt encodes to no tokens", "prompt"));
    }
    if (auto e = check_context(int64_t(greq.prompt_ids.size()), parsed->sampling.max_tokens,
                               mc.max_model_len)) {
      return finish_with_error(*e);
    }
    greq.sampling = parsed->sampling;
    greq.output_mode = parsed->output_mode;
    greq.timeout = std::chrono::milliseconds(options.limits.request_timeout_s * 1000);
    std::unique_ptr<deepserve::RequestStream> stream = eng->submit(std::move(greq), &aerr);
    if (!stream) {
      if (aerr.kind == deepserve::ErrorKind::kInternal) {
        spdlog::error("request {}: submit failed: {}", trace->id, log_escape(aerr.message, 200));
      }
      return finish_with_error(from_api_error(aerr));
    }
    const ResponseMeta meta{trace->id, unix_now(), mc.served_model_name};
    metrics.active_generations.fetch_add(1);
    if (!parsed->stream) {
      serve_blocking(req, res, std::move(stream), *parsed, meta, trace);
    } else {
      serve_stream(req, res, std::move(stream), parsed, meta, trace);
    }
  }

  void serve_blocking(const httplib::Request& req, httplib::Response& res,
                      std::unique_ptr<deepserve::RequestStream> stream, const ParsedRequest& parsed,
                      const ResponseMeta& meta, const std::shared_ptr<RequestTrace>& trace) {
    ConnectionProbe probe(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    GenerationResult result;
    bool client_gone = false;
    auto next_check = Clock::now() + kPollInterval;
    for (;;) {
      RequestEvent ev;
      if (stream->next(&ev, kPollInterval)) {
        observe_event(trace.get(), ev);
        result.add(ev);
        if (ev.finished) {
          if (ev.finish_reason == FinishReason::kError && ev.error) {
            spdlog::error("request {}: engine error: {}", trace->id,
                          log_escape(ev.error->message, 200));
          }
          break;
        }
      }
      // Every poll interval, whether or not events flow: has the client left (ST2)?
      if (Clock::now() < next_check) continue;
      next_check = Clock::now() + kPollInterval;
      if (!client_gone && probe.closed()) {
        client_gone = true;
        stream->abort();
      } else if (aborting.load()) {
        stream->abort();
      }
    }
    stream.reset();
    metrics.active_generations.fetch_sub(1);
    trace->usage = result.usage;
    if (client_gone) {
      trace->status = 499;
      res.status = 499;
      log_trace(*trace);
      return;
    }
    if (result.finish_reason == FinishReason::kError) {
      HttpError e;
      e.status = 500;
      e.type = "internal_error";
      e.message = "the request failed in the engine";
      send_error(res, e);
    } else if (result.finish_reason == FinishReason::kAbort) {
      send_error(res, unavailable("the request was aborted (server shutting down)"));
    } else {
      send_json(res, parsed.endpoint == Endpoint::kChat
                         ? chat_response(meta, result, parsed)
                         : completion_response(meta, result, parsed));
    }
    trace->status = res.status;
    log_trace(*trace);
  }

  struct StreamState {
    std::unique_ptr<deepserve::RequestStream> stream;
    std::shared_ptr<ParsedRequest> parsed;
    ResponseMeta meta;
    std::shared_ptr<RequestTrace> trace;
    std::unique_ptr<ConnectionProbe> probe;
    bool first = true;
    bool finished = false;
    int tool_call_index = 0;
    int64_t text_offset = 0;
    Clock::time_point next_check = Clock::now() + kPollInterval;
  };

  void serve_stream(const httplib::Request& req, httplib::Response& res,
                    std::unique_ptr<deepserve::RequestStream> stream,
                    const std::shared_ptr<ParsedRequest>& parsed, const ResponseMeta& meta,
                    const std::shared_ptr<RequestTrace>& trace) {
    auto st = std::make_shared<StreamState>();
    st->stream = std::move(stream);
    st->parsed = parsed;
    st->meta = meta;
    st->trace = trace;
    st->probe = std::make_unique<ConnectionProbe>(req.remote_addr, req.remote_port, req.local_addr,
                                                  req.local_port);
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) -> bool { return pump(st.get(), sink); },
        [this, st](bool) { finish_stream(st.get()); });
  }

  // One step of a stream: wait for an event (up to the poll interval) and write its chunks.
  // Returns false to end the response (client gone).
  bool pump(StreamState* st, httplib::DataSink& sink) {
    if (st->finished) return false;
    RequestEvent ev;
    const bool got = st->stream->next(&ev, kPollInterval);
    if (Clock::now() >= st->next_check) {
      // ST1: the client may leave while nothing is written (queued, prefill, held-back text).
      st->next_check = Clock::now() + kPollInterval;
      if (st->probe->closed()) {
        st->stream->abort();
        return false;
      }
      if (aborting.load()) st->stream->abort();
    }
    if (!got) return true;
    observe_event(st->trace.get(), ev);
    std::string out;
    const ParsedRequest& p = *st->parsed;
    const bool failed = ev.finished && (ev.finish_reason == FinishReason::kError ||
                                        ev.finish_reason == FinishReason::kAbort);
    if (ev.finished && failed) {
      // ST3 / SH5: text already produced is sent, then an error event, then [DONE].
      RequestEvent partial = ev;
      partial.finished = false;
      auto chunk = p.endpoint == Endpoint::kChat
                       ? chat_chunk(st->meta, partial, p, st->first, &st->tool_call_index)
                       : completion_chunk(st->meta, partial, p, st->text_offset);
      if (chunk) out += sse_data(*chunk);
      HttpError e;
      if (ev.finish_reason == FinishReason::kError) {
        if (ev.error) {
          spdlog::error("request {}: engine error: {}", st->meta.id,
                        log_escape(ev.error->message, 200));
        }
        e.status = 500;
        e.type = "internal_error";
        e.message = "the request failed in the engine";
      } else {
        e = unavailable("the request was aborted (server shutting down)");
      }
      out += sse_data(error_json(e));
      out += sse_done();
    } else {
      auto chunk = p.endpoint == Endpoint::kChat
                       ? chat_chunk(st->meta, ev, p, st->first, &st->tool_call_index)
                       : completion_chunk(st->meta, ev, p, st->text_offset);
      if (chunk) {
        out += sse_data(*chunk);
        st->first = false;
      }
      st->text_offset += int64_t(ev.text.size());
      if (ev.finished) {
        if (p.include_usage) out += sse_data(usage_chunk(st->meta, p, ev.usage));
        out += sse_done();
      }
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      st->stream->abort();  // the client is gone
      return false;
    }
    if (ev.finished) {
      st->finished = true;
      st->trace->status = failed ? (ev.finish_reason == FinishReason::kError ? 500 : 503) : 200;
      sink.done();
    }
    return true;
  }

  // The response is over (finished, client gone or server stopping): free the request.
  void finish_stream(StreamState* st) {
    if (!st->stream) return;
    if (!st->finished) {
      st->stream->abort();
      st->trace->status = 499;
      if (st->trace->finish == FinishReason::kNone) {
        st->trace->finish = FinishReason::kAbort;
        metrics.count_finished(FinishReason::kAbort);
      }
    }
    st->stream.reset();
    metrics.active_generations.fetch_sub(1);
    log_trace(*st->trace);
  }

  // ---- other routes ---------------------------------------------------------------------------

  void handle_tokenize(const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader) {
    if (!gate(req, res, false, true)) {
      reader([](const char*, size_t) { return true; });
      return;
    }
    Json body;
    if (!read_json(req, res, reader, &body)) return;
    if (state.load() == ServerState::kDraining) {
      return send_error(res, unavailable("the server is shutting down"));
    }
    deepserve::Engine* eng = current_engine();
    const ModelContext mc = model_context(eng);
    std::vector<int32_t> ids;
    deepserve::ApiError aerr;
    bool ok = true;
    if (body.contains("messages")) {
      ParsedRequest parsed;
      if (auto e = parse_chat_request(body, options.limits, mc, &parsed))
        return send_error(res, *e);
      ok = eng->encode_chat(parsed.chat, &ids, &aerr);
    } else {
      auto it = body.find("prompt");
      if (it == body.end() || !it->is_string()) {
        return send_error(res,
                          bad_request("'prompt' must be a string (or send 'messages')", "prompt"));
      }
      if (auto e = check_model(body.value("model", std::string()), mc)) {
        return send_error(res, *e);
      }
      bool add_special = true;
      if (auto a = body.find("add_special_tokens"); a != body.end()) {
        if (!a->is_boolean()) {
          return send_error(
              res, bad_request("'add_special_tokens' must be a boolean", "add_special_tokens"));
        }
        add_special = a->get<bool>();
      }
      ok = eng->tokenize(it->get<std::string>(), add_special, &ids, &aerr);
    }
    if (!ok) return send_error(res, from_api_error(aerr));
    send_json(res,
              Json{{"count", ids.size()}, {"max_model_len", mc.max_model_len}, {"tokens", ids}});
  }

  void handle_detokenize(const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& reader) {
    if (!gate(req, res, false, true)) {
      reader([](const char*, size_t) { return true; });
      return;
    }
    Json body;
    if (!read_json(req, res, reader, &body)) return;
    deepserve::Engine* eng = current_engine();
    const ModelContext mc = model_context(eng);
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) {
      return send_error(res, bad_request("'tokens' must be an array of token ids", "tokens"));
    }
    if (int64_t(it->size()) > options.limits.max_prompt_token_ids) {
      return send_error(
          res, bad_request("'tokens' has more than " +
                               std::to_string(options.limits.max_prompt_token_ids) + " entries",
                           "tokens"));
    }
    std::vector<int32_t> ids;
    for (const Json& e : *it) {
      if (!e.is_number_unsigned() || e.get<uint64_t>() >= uint64_t(mc.vocab_size)) {
        return send_error(res, bad_request("'tokens' entries must be token ids in [0, " +
                                               std::to_string(mc.vocab_size) + ")",
                                           "tokens", "out_of_vocabulary"));
      }
      ids.push_back(int32_t(e.get<uint64_t>()));
    }
    std::string text;
    deepserve::ApiError aerr;
    if (!eng->detokenize(ids, &text, &aerr)) return send_error(res, from_api_error(aerr));
    send_json(res, Json{{"prompt", text}});
  }

  void handle_models(const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res, false, true)) return;
    const auto& info = current_engine()->model_info();
    Json model = {{"id", info.id},
                  {"object", "model"},
                  {"created", created},
                  {"owned_by", "deepserve"},
                  {"root", info.id},
                  {"parent", nullptr},
                  {"max_model_len", info.max_model_len}};
    send_json(res, Json{{"object", "list"}, {"data", Json::array({model})}});
  }

  void handle_health(const httplib::Request& req, httplib::Response& res, bool readiness) {
    if (!gate(req, res, true, false)) return;
    const ServerState s = state.load();
    if (s == ServerState::kLoading) {
      deepserve::LoadProgress p;
      {
        std::lock_guard<std::mutex> lock(mu);
        p = progress;
      }
      HttpError e = unavailable("the model is loading");
      Json body = error_json(e);
      body["loading"] = {{"phase", p.phase},
                         {"shards_done", p.shards_done},
                         {"shards_total", p.shards_total},
                         {"gib_done", p.gib_done},
                         {"gib_total", p.gib_total}};
      res.set_header("Retry-After", std::to_string(options.limits.retry_after_s));
      return send_json(res, body, 503);
    }
    // Liveness (SH3, SH4): a dead engine, or one with work that has not stepped for the stall
    // timeout, is unhealthy; an idle engine is healthy.
    if (deepserve::Engine* eng = current_engine()) {
      const deepserve::Engine::Health h = eng->health();
      if (h.dead) {
        HttpError e;
        e.status = 503;
        e.type = "unavailable_error";
        e.message = "the engine has failed: " + log_escape(h.reason, 200);
        return send_error(res, e);
      }
      if (h.active > 0 && h.last_step != Clock::time_point{} &&
          Clock::now() - h.last_step > std::chrono::seconds(options.limits.stall_timeout_s)) {
        HttpError e;
        e.status = 503;
        e.type = "unavailable_error";
        e.message = "the engine loop has not stepped for " +
                    std::to_string(options.limits.stall_timeout_s) + " s with requests active";
        return send_error(res, e);
      }
    }
    if (readiness && s == ServerState::kDraining) {
      return send_error(res, unavailable("the server is shutting down"));
    }
    send_json(res, Json{{"status", s == ServerState::kDraining ? "draining" : "ok"}});
  }

  void handle_metrics(const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res, false, false)) return;
    deepserve::Engine* eng = current_engine();
    std::string name;
    std::optional<deepserve::EngineMetrics> m;
    if (eng) {
      m = eng->metrics();
      name = eng->model_info().id;
    }
    res.status = 200;
    res.set_content(metrics.render(m ? &*m : nullptr, name), "text/plain; version=0.0.4");
  }

  // ---- setup ----------------------------------------------------------------------------------

  struct RouteInfo {
    const char* method;
    const char* path;
  };
  static const std::vector<RouteInfo>& routes() {
    static const std::vector<RouteInfo> r = {{"GET", "/"},
                                             {"GET", "/health"},
                                             {"GET", "/ready"},
                                             {"GET", "/version"},
                                             {"GET", "/metrics"},
                                             {"GET", "/v1/models"},
                                             {"POST", "/v1/completions"},
                                             {"POST", "/v1/chat/completions"},
                                             {"POST", "/tokenize"},
                                             {"POST", "/detokenize"}};
    return r;
  }

  void setup() {
    const ServerLimits& l = options.limits;
    const int threads = std::max(4, options.http_threads);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    http.set_payload_max_length(size_t(l.max_body_bytes));
    http.set_read_timeout(time_t(l.read_timeout_s), 0);
    http.set_write_timeout(time_t(l.write_timeout_s), 0);
    http.set_keep_alive_timeout(time_t(l.keep_alive_timeout_s));
    http.set_keep_alive_max_count(10000);
    http.set_tcp_nodelay(true);

    http.Get("/", [this](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res, false, false)) return;
      res.set_content(web_ui_html(), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      handle_health(req, res, false);
    });
    http.Get("/ready", [this](const httplib::Request& req, httplib::Response& res) {
      handle_health(req, res, true);
    });
    http.Get("/version", [this](const httplib::Request& req, httplib::Response& res) {
      if (!gate(req, res, false, false)) return;
      send_json(res, Json{{"version", options.version}});
    });
    http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      handle_metrics(req, res);
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      handle_models(req, res);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
      handle_generate(req, res, reader, Endpoint::kCompletions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                             const httplib::ContentReader& reader) {
      handle_generate(req, res, reader, Endpoint::kChat);
    });
    http.Post("/tokenize",
              [this](const httplib::Request& req, httplib::Response& res,
                     const httplib::ContentReader& reader) { handle_tokenize(req, res, reader); });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& reader) {
      handle_detokenize(req, res, reader);
    });

    // Errors raised by the library (404, 400 for a malformed request, 413, 414) get the OpenAI
    // body; a known path with the wrong method is a 405.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.status == 499) return;
      HttpError e = bad_request("");
      e.status = res.status;
      switch (res.status) {
        case 404: {
          bool known = false;
          for (const auto& r : routes()) known = known || req.path == r.path;
          if (known) {
            e.status = 405;
            e.message =
                "method " +
                std::string(req.method == "GET" || req.method == "POST" || req.method == "PUT" ||
                                    req.method == "DELETE" || req.method == "PATCH" ||
                                    req.method == "OPTIONS" || req.method == "HEAD"
                                ? req.method
                                : "?") +
                " is not allowed on this route";
            e.code = "method_not_allowed";
          } else {
            e.type = "not_found_error";
            e.message = "no such route";
            e.code = "not_found";
          }
          break;
        }
        case 413:
          e.message = "request body larger than " + std::to_string(options.limits.max_body_bytes) +
                      " bytes";
          break;
        case 414:
          e.message = "request URI too long";
          break;
        case 431:
          e.message = "request header fields too large";
          break;
        default:
          e.message = "malformed HTTP request";
          break;
      }
      send_error(res, e);
    });
    http.set_exception_handler(
        [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& ex) {
            what = ex.what();
          } catch (...) {
          }
          spdlog::error("internal error on {}: {}", log_escape(req.path), log_escape(what, 200));
          HttpError e;
          e.status = 500;
          e.type = "internal_error";
          e.message = "internal error";
          send_error(res, e);
        });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.count_http(res.status);
      if (req.path != "/v1/completions" && req.path != "/v1/chat/completions") {
        spdlog::debug("http {} {} status={} client={}:{}", log_escape(req.method, 16),
                      log_escape(req.path), res.status, req.remote_addr, req.remote_port);
      }
    });
  }
};

HttpServer::HttpServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  signal(SIGPIPE, SIG_IGN);  // a write to a closed socket returns EPIPE instead of killing us
}

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::bind() {
  const auto& o = impl_->options;
  if (o.port == 0) {
    impl_->bound_port = impl_->http.bind_to_any_port(o.host);
  } else {
    impl_->bound_port = impl_->http.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (impl_->bound_port <= 0) {
    return io_error("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                    " (address in use, not local, or not permitted)");
  }
  raise_listen_backlog(impl_->bound_port);
  return ok_status();
}

int HttpServer::port() const {
  return impl_->bound_port;
}

std::string HttpServer::url() const {
  const std::string& h = impl_->options.host;
  const std::string host = h.find(':') != std::string::npos ? "[" + h + "]" : h;
  return "http://" + host + ":" + std::to_string(port());
}

void HttpServer::start() {
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
}

void HttpServer::set_load_progress(const deepserve::LoadProgress& progress) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->progress = progress;
}

void HttpServer::set_engine(deepserve::Engine* engine) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->engine = engine;
  }
  ServerState expected = ServerState::kLoading;
  impl_->state.compare_exchange_strong(expected, ServerState::kReady);
}

void HttpServer::begin_drain() {
  ServerState s = impl_->state.load();
  if (s == ServerState::kReady) impl_->state.store(ServerState::kDraining);
}

void HttpServer::abort_requests() {
  impl_->aborting.store(true);
}

int64_t HttpServer::active_generations() const {
  return impl_->metrics.active_generations.load();
}

ServerState HttpServer::state() const {
  return impl_->state.load();
}

void HttpServer::stop() {
  if (impl_->thread.joinable()) {
    impl_->http.stop();
    shutdown_connections(impl_->bound_port);
    impl_->thread.join();
  }
}

ServerMetrics& HttpServer::metrics() {
  return impl_->metrics;
}

}  // namespace ds::server
