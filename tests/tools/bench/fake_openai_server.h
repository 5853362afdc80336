// A scripted OpenAI-compatible server for testing `deepserve bench` (in-process in the gtests,
// and as the bench_fake_server executable for the CLI test and the README example). It streams
// completions and chat completions with known delays: the first text chunk `ttft_ms` after the
// request arrives, then one chunk per token every `itl_ms` (scheduled from the arrival time, so
// delays do not drift), then - `tail_ms` later - the usage chunk and [DONE]. Chat streams start
// with a role-only chunk at once (it carries no text, so it must not count as the first token).
// A prompt "fake:ttft=40,itl=10,n=5,tail=0,status=200,usage=1" overrides the defaults for one
// request (n = tokens to send; default max_tokens). GET /v1/models lists "fake-model"; GET
// /metrics exposes speculative-decoding counters that grow by 10 drafts, 20 draft tokens and
// 15 accepted tokens per finished request.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::bench::testing {

struct FakeScript {
  int ttft_ms = 50;
  int itl_ms = 20;
  int tail_ms = 0;
  int n = -1;  // tokens to send; -1 = max_tokens
  int status = 200;
  bool usage = true;
};

inline FakeScript parse_fake_script(const std::string& prompt, FakeScript s) {
  if (prompt.rfind("fake:", 0) != 0) return s;
  std::string rest = prompt.substr(5);
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    const std::string kv = rest.substr(pos, comma - pos);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) {
      const std::string k = kv.substr(0, eq);
      const int v = std::atoi(kv.substr(eq + 1).c_str());
      if (k == "ttft")
        s.ttft_ms = v;
      else if (k == "itl")
        s.itl_ms = v;
      else if (k == "tail")
        s.tail_ms = v;
      else if (k == "n")
        s.n = v;
      else if (k == "status")
        s.status = v;
      else if (k == "usage")
        s.usage = v != 0;
    }
    pos = comma + 1;
  }
  return s;
}

// When the server saw a request and wrote each of its text chunks (steady clock).
struct ServedTimeline {
  std::chrono::steady_clock::time_point arrived;
  std::vector<std::chrono::steady_clock::time_point> chunks_written;  // just before each write
};

// cpp-httplib 0.11.4 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the
// Debian library): a burst of new connections (a benchmark starting 64 streams at once) overflows
// it and some clients fail with a read error. Linux lets listen() be called again on a listening
// socket to raise the backlog; the socket is found among this process's descriptors by its port.
inline bool raise_listen_backlog(int port, int backlog = 1024) {
  bool raised = false;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      const int fd = std::atoi(e->d_name);
      if (fd <= 2) continue;
      int listening = 0;
      socklen_t len = sizeof listening;
      if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
      sockaddr_storage addr{};
      socklen_t alen = sizeof addr;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
      int p = -1;
      if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
      if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
      if (p == port && ::listen(fd, backlog) == 0) raised = true;
    }
    closedir(dir);
  }
  return raised;
}

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeScript defaults = {}) : defaults_(defaults) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.set_tcp_nodelay(true);  // each SSE chunk leaves at once (no Nagle delay)
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const long long n = finished_.load();
      res.set_content(
          "# TYPE deepserve:spec_decode_num_drafts_total counter\n"
          "deepserve:spec_decode_num_drafts_total " +
              std::to_string(10 * n) + "\n" +
              "deepserve:spec_decode_num_draft_tokens_total{model=\"fake\"} " +
              std::to_string(20 * n) + "\n" + "deepserve:spec_decode_num_accepted_tokens_total " +
              std::to_string(15 * n) + "\n",
          "text/plain");
    });
    auto handler = [this](bool chat) {
      return [this, chat](const httplib::Request& req, httplib::Response& res) {
        serve(req, res, chat);
      };
    };
    server_.Post("/v1/completions", handler(false));
    server_.Post("/v1/chat/completions", handler(true));
  }
  ~FakeOpenAiServer() { stop(); }

  // Binds 127.0.0.1 on a free port and serves on a thread; returns the port (0 on failure).
  int start() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) return 0;
    raise_listen_backlog(port_);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return port_;
  }
  // Blocks serving on `port` (0 = any) of `host`; prints the URL first (the executable).
  bool run_forever(const std::string& host, int port) {
    port_ =
        port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) return false;
    raise_listen_backlog(port_);
    std::printf("listening on http://%s:%d\n", host.c_str(), port_);
    std::fflush(stdout);
    return server_.listen_after_bind();
  }
  void stop() {
    if (server_.is_running()) server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  long long finished() const { return finished_.load(); }
  // The timeline of the request whose prompt was `prompt` (the last one, if repeated).
  ServedTimeline timeline(const std::string& prompt) {
    std::lock_guard<std::mutex> lock(mu_);
    return timelines_[prompt];
  }

 private:
  void serve(const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto t0 = std::chrono::steady_clock::now();
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"bad json"}})", "application/json");
      return;
    }
    std::string prompt;
    if (chat && body.contains("messages") && body["messages"].is_array() &&
        !body["messages"].empty())
      prompt = body["messages"][0].value("content", "");
    else
      prompt = body.value("prompt", "");
    const FakeScript s = parse_fake_script(prompt, defaults_);
    if (s.status != 200) {
      res.status = s.status;
      res.set_content(R"({"error":{"message":"scripted failure"}})", "application/json");
      return;
    }
    const int max_tokens = body.value("max_tokens", 16);
    const int n = s.n >= 0 ? s.n : max_tokens;
    const long long prompt_tokens = 7;
    {
      std::lock_guard<std::mutex> lock(mu_);
      timelines_[prompt] = ServedTimeline{t0, {}};
    }
    res.set_chunked_content_provider("text/event-stream", [this, s, n, chat, t0, prompt_tokens,
                                                           prompt](size_t,
                                                                   httplib::DataSink& sink) {
      auto send = [&](const std::string& data) {
        const std::string event = "data: " + data + "\n\n";
        return sink.write(event.data(), event.size());
      };
      auto at = [&](long long ms) {
        std::this_thread::sleep_until(t0 + std::chrono::milliseconds(ms));
      };
      if (chat &&
          !send(
              R"({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"))
        return false;
      for (int i = 0; i < n; ++i) {
        at(s.ttft_ms + (long long)i * s.itl_ms);
        nlohmann::json chunk;
        if (chat)
          chunk = {{"id", "c"},
                   {"object", "chat.completion.chunk"},
                   {"choices", {{{"index", 0}, {"delta", {{"content", " tok"}}}}}}};
        else
          chunk = {{"id", "c"},
                   {"object", "text_completion"},
                   {"choices", {{{"index", 0}, {"text", " tok"}}}}};
        const std::string data = chunk.dump();
        {
          std::lock_guard<std::mutex> lock(mu_);
          timelines_[prompt].chunks_written.push_back(std::chrono::steady_clock::now());
        }
        if (!send(data)) return false;
      }
      at(s.ttft_ms + (long long)(n > 0 ? n - 1 : 0) * s.itl_ms + s.tail_ms);
      if (s.usage) {
        nlohmann::json u = {{"id", "c"},
                            {"choices", nlohmann::json::array()},
                            {"usage",
                             {{"prompt_tokens", prompt_tokens},
                              {"completion_tokens", n},
                              {"total_tokens", prompt_tokens + n}}}};
        if (!send(u.dump())) return false;
      }
      send("[DONE]");
      finished_.fetch_add(1);
      sink.done();
      return true;
    });
  }

  FakeScript defaults_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<long long> finished_{0};
  std::mutex mu_;
  std::map<std::string, ServedTimeline> timelines_;
};

}  // namespace ds::bench::testing
