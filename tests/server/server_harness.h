// Test harness: an in-process HttpServer on 127.0.0.1 (free port) over a FakeEngine, raw-socket
// and httplib clients, and /metrics sampling.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "fake_engine.h"
#include "server/http_server.h"

namespace ds::server::testing {

struct RawResponse {
  int status = 0;  // 0 = no answer (connection closed or timed out)
  std::string head;
  std::string body;
};

// Sends `bytes` on a fresh connection and reads until the peer closes or `timeout_ms` passes.
inline RawResponse raw_exchange(int port, const std::string& bytes, int timeout_ms = 5000) {
  RawResponse r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string in;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, size_t(n));
    // Stop after one complete response with Content-Length.
    size_t he = in.find("\r\n\r\n");
    if (he != std::string::npos) {
      std::string head = in.substr(0, he);
      size_t cl = head.find("Content-Length: ");
      if (cl != std::string::npos) {
        size_t len = std::stoul(head.substr(cl + 16));
        if (in.size() >= he + 4 + len) break;
      }
    }
  }
  close(fd);
  size_t he = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.1 ", 0) != 0 || he == std::string::npos) return r;
  r.status = std::stoi(in.substr(9, 3));
  r.head = in.substr(0, he);
  r.body = in.substr(he + 4);
  return r;
}

inline std::string post_bytes(const std::string& path, const std::string& body,
                              const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
         "Content-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

class ServerFixture {
 public:
  explicit ServerFixture(FakeEngineOptions eo = {}, ServerOptions so = {}, bool ready = true) {
    so.host = "127.0.0.1";
    so.port = 0;
    so.version = "test";
    engine_ = std::make_unique<FakeEngine>(eo);
    server_ = std::make_unique<HttpServer>(so);
    auto st = server_->bind();
    if (!st.ok()) throw std::runtime_error(st.message());
    server_->start();
    if (ready) server_->set_engine(engine_.get());
    // Wait until the listener answers.
    for (int i = 0; i < 200; ++i) {
      httplib::Client c("127.0.0.1", server_->port());
      if (c.Get("/health")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServerFixture() {
    engine_->abort_all();
    server_->abort_requests();
    for (int i = 0; i < 200 && server_->active_generations() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    server_->stop();
  }
  int port() const { return server_->port(); }
  HttpServer& server() { return *server_; }
  FakeEngine& engine() { return *engine_; }
  std::unique_ptr<httplib::Client> client(const std::string& key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(30, 0);
    if (!key.empty()) c->set_default_headers({{"Authorization", "Bearer " + key}});
    return c;
  }

  // One metric sample (exact series name with labels) from /metrics.
  double metric(const std::string& series, const std::string& key = "") const {
    auto c = client(key);
    auto res = c->Get("/metrics");
    if (!res || res->status != 200) return -1;
    std::istringstream in(res->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(series + "{", 0) == 0 || line.rfind(series + " ", 0) == 0) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return -1;
  }

 private:
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace ds::server::testing
