// In-process tests of the HTTP server over a FakeEngine: at least 30 malformed or hostile raw
// requests (reliability.md §2: HJ, OP, CX, AU rows), each answered with its status and the OpenAI
// error shape and each followed by a request that succeeds; auth on every route (AU1); health
// while loading (SH1); streaming (ST4, ST8), engine errors mid-stream (ST3), disconnects freeing
// KV (ST1, ST2), overload (KV4) and draining (SH5).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <fstream>
#include <future>
#include <vector>

#include "server_harness.h"

#include <spdlog/spdlog.h>

namespace ds::server::testing {
namespace {

using Json = nlohmann::json;

// The per-request log lines are not what these tests check.
const int kQuiet = (spdlog::set_level(spdlog::level::warn), 0);

const std::string kOkBody = R"({"prompt":"hello","max_tokens":4})";

void ExpectAlive(ServerFixture& f) {
  auto c = f.client();
  auto res = c->Post("/v1/completions", kOkBody, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

void ExpectOpenAIError(const RawResponse& r, const std::string& type = "") {
  ASSERT_FALSE(r.body.empty()) << r.head;
  Json j;
  ASSERT_NO_THROW(j = Json::parse(r.body)) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  const Json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!type.empty()) EXPECT_EQ(e["type"], type) << r.body;
}

struct HostileCase {
  std::string name;  // reliability.md row id + what
  std::string bytes;
  int status;
  std::string param;  // expected error.param ("" = not checked)
};

std::vector<HostileCase> HostileCases() {
  auto chat = [](const std::string& fields) {
    return post_bytes("/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" +
                          (fields.empty() ? "" : "," + fields) + "}");
  };
  auto comp = [](const std::string& body) { return post_bytes("/v1/completions", body); };
  std::vector<HostileCase> c = {
      {"HJ1 empty body", comp(""), 400, ""},
      {"HJ1 truncated JSON", comp(R"({"prompt":"hel)"), 400, ""},
      {"HJ1 trailing garbage", comp(R"({"prompt":"x"} xyz)"), 400, ""},
      {"HJ2 array body", comp("[1,2,3]"), 400, ""},
      {"HJ2 null body", comp("null"), 400, ""},
      {"HJ5 invalid UTF-8", comp("{\"prompt\":\"\xff\xfe\"}"), 400, ""},
      {"HJ5 lone surrogate", comp(R"({"prompt":"\ud800"})"), 400, ""},
      {"HJ5 GBK body", comp("{\"prompt\":\"\xc4\xe3\xba\xc3\"}"), 400, ""},
      {"HJ6 deep nesting", comp("{\"prompt\":" + std::string(100000, '[')), 400, ""},
      {"HJ9 duplicate keys", comp(R"({"prompt":"x","max_tokens":1,"max_tokens":100000})"), 400, ""},
      {"HJ7 max_tokens string", chat(R"("max_tokens":"10")"), 400, "max_tokens"},
      {"HJ7 temperature null", chat(R"("temperature":null)"), 400, "temperature"},
      {"HJ7 n float", chat(R"("n":1.5)"), 400, "n"},
      {"HJ7 stop object", chat(R"("stop":{})"), 400, "stop"},
      {"HJ7 messages string", post_bytes("/v1/chat/completions", R"({"messages":"hi"})"), 400,
       "messages"},
      {"HJ8 max_tokens 1e300", chat(R"("max_tokens":1e300)"), 400, "max_tokens"},
      {"HJ8 n 2^32+1", chat(R"("n":4294967297)"), 400, "n"},
      {"HJ8 seed -1", chat(R"("seed":-1)"), 400, "seed"},
      {"HJ8 NaN literal", chat(R"("temperature":NaN)"), 400, ""},
      {"OP1 max_tokens 0", chat(R"("max_tokens":0)"), 400, "max_tokens"},
      {"OP1 huge max_tokens", chat(R"("max_tokens":1099511627776)"), 400, "max_tokens"},
      {"OP2 top_p 0", chat(R"("top_p":0)"), 400, "top_p"},
      {"OP2 temperature negative", chat(R"("temperature":-1)"), 400, "temperature"},
      {"OP3 n 2", chat(R"("n":2)"), 400, "n"},
      {"OP4 top_logprobs 21", chat(R"("logprobs":true,"top_logprobs":21)"), 400, "top_logprobs"},
      {"OP5 five stop strings", chat(R"("stop":["a","b","c","d","e"])"), 400, "stop"},
      {"OP5 empty stop string", chat(R"("stop":"")"), 400, "stop"},
      {"OP6 logit_bias id out of vocab", chat(R"("logit_bias":{"999999":5})"), 400, "logit_bias"},
      {"OP6 logit_bias value 1e30", chat(R"("logit_bias":{"5":1e30})"), 400, "logit_bias"},
      {"OP7 prompt id out of vocab", comp(R"({"prompt":[5,100000]})"), 400, "prompt"},
      {"OP7 prompt id negative", comp(R"({"prompt":[-1]})"), 400, "prompt"},
      {"OP9 unknown model", chat(R"("model":"gpt-4o")"), 404, "model"},
      {"OP9 response_format json", chat(R"("response_format":{"type":"json_object"})"), 400,
       "response_format"},
      {"OP10 tool_choice undefined tool",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})"),
       400, "tool_choice"},
      {"OP10 tool name with quote",
       chat(R"("tools":[{"type":"function","function":{"name":"a\"b"}}])"), 400, ""},
      {"OP11 image part",
       post_bytes(
           "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]})"),
       400, ""},
      {"OP11 prompt_embeds", comp(R"({"prompt":"x","prompt_embeds":"AAAA"})"), 400,
       "prompt_embeds"},
      {"CX1 prompt over context", comp("{\"prompt\":\"" + std::string(600, 'a') + "\"}"), 400, ""},
      {"CX2 prompt + max_tokens over context",
       comp("{\"prompt\":\"" + std::string(400, 'a') + "\",\"max_tokens\":200}"), 400,
       "max_tokens"},
      {"CX3 empty prompt", comp(R"({"prompt":""})"), 400, "prompt"},
      {"CX3 empty messages", post_bytes("/v1/chat/completions", R"({"messages":[]})"), 400,
       "messages"},
      {"CX3 system only",
       post_bytes("/v1/chat/completions", R"({"messages":[{"role":"system","content":"x"}]})"), 400,
       "messages"},
      {"HJ11 unknown route", post_bytes("/v1/engines", "{}"), 404, ""},
      {"HJ11 wrong method", "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
       405, ""},
      {"HJ11 text/plain body",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
       "text/plain\r\nContent-Length: 2\r\n\r\nhi",
       415, ""},
      {"HJ3 body over the cap", comp("{\"prompt\":\"" + std::string(300000, 'a') + "\"}"), 413, ""},
      {"HJ4 one 1 MB header",
       "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " +
           std::string(1 << 20, 'a') + "\r\n\r\n",
       400, ""},
      {"HJ4 too many headers",
       [] {
         std::string s = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
         for (int i = 0; i < 500; ++i) s += "X-H" + std::to_string(i) + ": v\r\n";
         return s + "\r\n";
       }(),
       431, ""},
      {"HJ1 malformed request line", "GARBAGE\r\n\r\n", 400, ""},
  };
  return c;
}

TEST(HostileRequests, EachGetsItsStatusAndTheServerStaysAlive) {
  ServerOptions so;
  so.limits.max_body_bytes = 256 * 1024;
  so.limits.read_timeout_s = 2;
  ServerFixture f({}, so);
  const auto cases = HostileCases();
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    for (int attempt = 0; attempt < 2; ++attempt) {  // OP1: the same answer every time
      RawResponse r = raw_exchange(f.port(), c.bytes);
      EXPECT_EQ(r.status, c.status) << r.head << "\n" << r.body.substr(0, 300);
      if (!r.body.empty() || r.status >= 400) ExpectOpenAIError(r);
      if (!c.param.empty() && !r.body.empty()) {
        EXPECT_EQ(Json::parse(r.body)["error"]["param"], c.param) << r.body;
      }
      if (c.status == 400 && !r.body.empty() && r.status == 400) {
        EXPECT_EQ(Json::parse(r.body)["error"]["type"], "invalid_request_error");
      }
    }
    ExpectAlive(f);
  }
  // Context overflow carries OpenAI's wording and the counts.
  RawResponse r = raw_exchange(
      f.port(), post_bytes("/v1/completions", "{\"prompt\":\"" + std::string(600, 'a') + "\"}"));
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(j["error"]["n_prompt_tokens"], 601);
  EXPECT_EQ(j["error"]["n_ctx"], 512);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("maximum context length"),
            std::string::npos);
  // No request leaked KV.
  EXPECT_EQ(f.metric("deepserve:kv_cache_pages_free"), 256);
}

TEST(HJ3, DeclaredHugeBodyAndTrickledBodyEndWithoutBuffering) {
  ServerOptions so;
  so.limits.max_body_bytes = 64 * 1024;
  so.limits.read_timeout_s = 1;
  ServerFixture f({}, so);
  // Declares 1 GiB, sends 1 KiB: 413 (the linked cpp-httplib answers after its read timeout).
  RawResponse r =
      raw_exchange(f.port(),
                   "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: 1073741824\r\n\r\n" +
                       std::string(1024, 'a'),
                   8000);
  EXPECT_EQ(r.status, 413);
  ExpectAlive(f);
  // A body trickled byte by byte is cut at the whole-body deadline.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(f.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 100\r\n\r\n";
  send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const auto t0 = std::chrono::steady_clock::now();
  std::string in;
  for (int i = 0; i < 40 && in.find("\r\n\r\n") == std::string::npos; ++i) {
    send(fd, "{", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) in.append(buf, size_t(n));
  }
  close(fd);
  EXPECT_EQ(in.rfind("HTTP/1.1 408", 0), 0u) << in;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  ExpectAlive(f);
}

TEST(AU1, EveryRouteButHealthNeedsTheKey) {
  ServerOptions so;
  so.api_key = "sk-secret";
  ServerFixture f({}, so);
  struct Route {
    std::string method, path;
  };
  const std::vector<Route> routes = {
      {"GET", "/"},          {"GET", "/version"},         {"GET", "/metrics"},
      {"GET", "/v1/models"}, {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"},
      {"POST", "/tokenize"}, {"POST", "/detokenize"}};
  for (const auto& r : routes) {
    for (const std::string& auth :
         {std::string(""), std::string("Authorization: Bearer wrong\r\n"),
          std::string("Authorization: Bearer \r\n"), std::string("X-Api-Key: nope\r\n"),
          std::string("Authorization: Bearer sk-secret\r\nAuthorization: Bearer sk-secret\r\n")}) {
      std::string req =
          r.method + " " + r.path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + auth;
      req += r.method == "POST" ? "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                                : "\r\n";
      RawResponse res = raw_exchange(f.port(), req);
      EXPECT_EQ(res.status, 401) << r.path << " with [" << auth << "]";
      ExpectOpenAIError(res, "authentication_error");
    }
  }
  EXPECT_EQ(
      raw_exchange(f.port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status,
      200);
  auto c = f.client("sk-secret");
  auto res = c->Post("/v1/completions", kOkBody, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  httplib::Client x("127.0.0.1", f.port());
  x.set_default_headers({{"X-Api-Key", "sk-secret"}});
  res = x.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(SH1, HealthIs503WhileLoadingThen200) {
  ServerFixture f({}, {}, /*ready=*/false);
  deepserve::LoadProgress p;
  p.phase = "weights";
  p.shards_done = 1;
  p.shards_total = 4;
  f.server().set_load_progress(p);
  auto c = f.client();
  auto res = c->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(Json::parse(res->body)["loading"]["shards_total"], 4);
  EXPECT_EQ(c->Get("/ready")->status, 503);
  res = c->Post("/v1/completions", kOkBody, "application/json");
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(Json::parse(res->body)["error"]["type"], "unavailable_error");
  EXPECT_TRUE(res->has_header("Retry-After"));
  EXPECT_EQ(c->Get("/v1/models")->status, 503);
  f.server().set_engine(&f.engine());
  EXPECT_EQ(c->Get("/health")->status, 200);
  EXPECT_EQ(c->Get("/ready")->status, 200);
  ExpectAlive(f);
}

// Reads an SSE response into its data payloads.
std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

TEST(ST4, StreamTextEqualsNonStreamTextWithStopAcrossTokens) {
  ServerFixture f;
  auto c = f.client();
  // Greedy script: "The quick brown fox ..." shifted by the prompt length; "fox" spans 3 tokens.
  for (const std::string& endpoint :
       {std::string("/v1/completions"), std::string("/v1/chat/completions")}) {
    const bool chat = endpoint == "/v1/chat/completions";
    const std::string base =
        chat ? R"("messages":[{"role":"user","content":"hi"}])" : R"("prompt":"hi")";
    const std::string fields = base + R"(,"temperature":0,"max_tokens":40,"stop":["fox"])";
    auto plain = c->Post(endpoint, "{" + fields + "}", "application/json");
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << plain->body;
    Json pj = Json::parse(plain->body);
    const std::string text = chat ? pj["choices"][0]["message"]["content"].get<std::string>()
                                  : pj["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(pj["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(text.find("fox"), std::string::npos);
    EXPECT_FALSE(text.empty());
    auto streamed = c->Post(
        endpoint, "{" + fields + R"(,"stream":true,"stream_options":{"include_usage":true}})",
        "application/json");
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200);
    EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
    auto events = SseEvents(streamed->body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::string joined;
    std::string id;
    std::string finish;
    Json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      Json e = Json::parse(events[i]);
      if (id.empty()) id = e["id"];
      EXPECT_EQ(e["id"], id);
      if (e["choices"].empty()) {
        usage = e["usage"];
        continue;
      }
      const Json& ch = e["choices"][0];
      if (chat) {
        if (i == 0) EXPECT_EQ(ch["delta"]["role"], "assistant");
        if (ch["delta"].contains("content")) joined += ch["delta"]["content"].get<std::string>();
      } else {
        joined += ch["text"].get<std::string>();
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(joined, text) << endpoint;
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(usage["completion_tokens"], pj["usage"]["completion_tokens"]);
    EXPECT_EQ(usage["prompt_tokens"], pj["usage"]["prompt_tokens"]);
  }
}

TEST(ST3, EngineErrorMidStreamIsAnErrorEventThenDone) {
  ServerFixture f;
  auto c = f.client();
  auto res = c->Post("/v1/completions", R"({"prompt":"FAIL@3","max_tokens":20,"stream":true})",
                     "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  auto events = SseEvents(res->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json err = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(err["error"]["type"], "internal_error");
  res = c->Post("/v1/completions", R"({"prompt":"FAIL@3","max_tokens":20})", "application/json");
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(Json::parse(res->body)["error"]["message"], "the request failed in the engine");
  ExpectAlive(f);
}

void WaitFor(const std::function<bool()>& pred, int ms = 3000) {
  for (int i = 0; i < ms / 10 && !pred(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

TEST(ST1, DisconnectMidStreamFreesKv) {
  FakeEngineOptions eo;
  eo.step_ms = 5;
  ServerFixture f(eo);
  const double baseline = f.metric("deepserve:kv_cache_pages_free");
  ASSERT_EQ(baseline, 256);
  for (int round = 0; round < 3; ++round) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(f.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::string req = post_bytes(
        "/v1/completions", R"({"prompt":"x","max_tokens":400,"ignore_eos":true,"stream":true})");
    send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string in;
    char buf[4096];
    while (std::count(in.begin(), in.end(), '\n') < 12) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0);
      in.append(buf, size_t(n));
    }
    EXPECT_LT(f.metric("deepserve:kv_cache_pages_free"), baseline);
    close(fd);
    WaitFor([&] { return f.engine().idle(); });
    EXPECT_TRUE(f.engine().idle());
    EXPECT_EQ(f.metric("deepserve:kv_cache_pages_free"), baseline);
    EXPECT_EQ(f.metric("deepserve:kv_cache_usage_perc"), 0);
  }
  WaitFor([&] { return f.server().active_generations() == 0; });
  EXPECT_EQ(f.server().active_generations(), 0);
  ExpectAlive(f);
}

TEST(ST2, NonStreamingClientThatLeavesIsAborted) {
  FakeEngineOptions eo;
  eo.step_ms = 5;
  ServerFixture f(eo);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(f.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string req =
      post_bytes("/v1/completions", R"({"prompt":"x","max_tokens":400,"ignore_eos":true})");
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  WaitFor([&] { return !f.engine().idle(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  close(fd);
  // 400 tokens at 5 ms would take 2 s; the abort must come long before.
  WaitFor([&] { return f.engine().idle(); }, 1000);
  EXPECT_TRUE(f.engine().idle());
  EXPECT_EQ(f.metric("deepserve:kv_cache_pages_free"), 256);
  ExpectAlive(f);
}

TEST(KV4, OverloadIs503WithRetryAfter) {
  FakeEngineOptions eo;
  eo.max_running = 1;
  eo.max_queued = 2;
  eo.step_ms = 5;
  ServerFixture f(eo);
  std::vector<std::future<std::pair<int, std::string>>> futures;
  for (int i = 0; i < 10; ++i) {
    futures.push_back(std::async(std::launch::async, [&] {
      auto c = f.client();
      auto res =
          c->Post("/v1/completions", R"({"prompt":"x","max_tokens":20})", "application/json");
      if (!res) return std::make_pair(0, std::string());
      return std::make_pair(res->status, res->get_header_value("Retry-After") + "|" + res->body);
    }));
  }
  int ok = 0, rejected = 0;
  for (auto& fu : futures) {
    auto [status, rest] = fu.get();
    if (status == 200) ++ok;
    if (status == 503) {
      ++rejected;
      EXPECT_EQ(rest.substr(0, 2), "1|") << rest;
      Json j = Json::parse(rest.substr(2));
      EXPECT_EQ(j["error"]["type"], "overloaded_error");
    }
  }
  EXPECT_EQ(ok + rejected, 10);
  EXPECT_GE(ok, 1);
  EXPECT_GE(rejected, 1);
  EXPECT_GE(f.metric("deepserve:http_rejected_total"), rejected);
  ExpectAlive(f);
}

TEST(SH5, DrainLetsStreamsFinishAndRefusesNewRequests) {
  FakeEngineOptions eo;
  eo.step_ms = 5;
  ServerFixture f(eo);
  std::vector<std::future<std::string>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(std::async(std::launch::async, [&] {
      auto c = f.client();
      auto res = c->Post("/v1/completions",
                         R"({"prompt":"x","max_tokens":60,"ignore_eos":true,"stream":true})",
                         "application/json");
      return res ? res->body : std::string();
    }));
  }
  WaitFor([&] { return f.server().active_generations() == 3; });
  f.server().begin_drain();
  f.engine().drain();
  auto c = f.client();
  auto res = c->Post("/v1/completions", kOkBody, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_TRUE(res->has_header("Retry-After"));
  EXPECT_EQ(c->Get("/ready")->status, 503);
  EXPECT_EQ(c->Get("/health")->status, 200);
  for (auto& s : streams) {
    const std::string body = s.get();
    auto events = SseEvents(body);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    Json last = Json::parse(events[events.size() - 2]);
    EXPECT_EQ(last["choices"][0]["finish_reason"], "length") << body.substr(0, 200);
  }
  WaitFor([&] { return f.server().active_generations() == 0; });
  EXPECT_EQ(f.server().active_generations(), 0);
}

TEST(SH6, AbortDuringDrainEndsStreamsWithErrorEvents) {
  FakeEngineOptions eo;
  eo.step_ms = 10;
  ServerFixture f(eo);
  auto fut = std::async(std::launch::async, [&] {
    auto c = f.client();
    auto res = c->Post(
        "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"x"}],"max_tokens":400,"ignore_eos":true,"stream":true})",
        "application/json");
    return res ? res->body : std::string();
  });
  WaitFor([&] { return f.server().active_generations() == 1; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  f.server().begin_drain();
  f.engine().abort_all();
  const std::string body = fut.get();
  auto events = SseEvents(body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["error"]["type"], "unavailable_error");
}

TEST(Routes, ModelsVersionTokenizeMetricsAndUi) {
  ServerFixture f;
  auto c = f.client();
  auto res = c->Get("/v1/models");
  ASSERT_TRUE(res);
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
  EXPECT_EQ(Json::parse(c->Get("/version")->body)["version"], "test");
  res = c->Post("/tokenize", R"({"prompt":"ab"})", "application/json");
  j = Json::parse(res->body);
  EXPECT_EQ(j["tokens"], Json({0, 100, 101}));
  EXPECT_EQ(j["count"], 3);
  res = c->Post("/detokenize", R"({"tokens":[100,101]})", "application/json");
  EXPECT_EQ(Json::parse(res->body)["prompt"], "ab");
  res = c->Post("/detokenize", R"({"tokens":[100,259]})", "application/json");
  EXPECT_EQ(res->status, 400);
  res =
      c->Post("/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})", "application/json");
  EXPECT_EQ(res->status, 200);
  res = c->Get("/");
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("/v1/chat/completions"), std::string::npos);
  ExpectAlive(f);
  res = c->Get("/metrics");
  EXPECT_NE(res->body.find("deepserve:time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_GE(f.metric("deepserve:e2e_request_latency_seconds_count"), 1);
}

TEST(Chat, ThinkingAndToolCalls) {
  ServerFixture f;
  auto c = f.client();
  auto res = c->Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":30,"chat_template_kwargs":{"thinking":true}})",
      "application/json");
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Let me think. ");
  EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
  res = c->Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]})",
      "application/json");
  j = Json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["type"], "function");
}

}  // namespace
}  // namespace ds::server::testing

namespace ds::server::testing {
namespace {

int64_t RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// RE4: the HTTP side keeps no per-request memory: after a warm-up, 2,000 more requests at
// concurrency 64 (half streaming) leave the process RSS within a small margin.
TEST(RE4, NoMemoryGrowthUnderLoad) {
  FakeEngineOptions eo;
  eo.step_ms = 1;
  eo.max_running = 64;
  eo.max_queued = 1024;
  ServerFixture f(eo);
  std::atomic<int> errors{0};
  auto run = [&](int total) {
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 64; ++t) {
      threads.emplace_back([&] {
        auto c = f.client();
        c->set_keep_alive(true);
        for (int i = next++; i < total; i = next++) {
          const bool stream = i % 2 == 1;
          auto res =
              c->Post("/v1/completions",
                      std::string(R"({"prompt":"hello )") + std::to_string(i) +
                          R"(","max_tokens":4,"stream":)" + (stream ? "true" : "false") + "}",
                      "application/json");
          if (!res || res->status != 200) ++errors;
        }
      });
    }
    for (auto& th : threads) th.join();
  };
  run(1000);
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "RSS is not meaningful under ASan (its quarantine holds freed memory)";
#endif
  const int64_t warm = RssKiB();
  run(2000);
  const int64_t after = RssKiB();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_LE(after, warm + 8 * 1024) << "RSS " << warm << " -> " << after << " KiB";
  std::printf("RSS after warm-up %lld KiB, after 2000 more requests %lld KiB\n", (long long)warm,
              (long long)after);
}

}  // namespace
}  // namespace ds::server::testing
